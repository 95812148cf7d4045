//! What [`Error::TransactionAborted`](super::Error::TransactionAborted) carries.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::Error;

/// A transaction the server rolled back as a whole under a lockkit call (InnoDB
/// does on a deadlock), while it was still open in Diesel's books: the cause,
/// and whether the code that opened the transaction has ended it since.
///
/// While the transaction is open, nothing more may run in it, and a retry
/// around the lockkit call would run in autocommit: the error is not
/// retryable. Once its owner rolled it back (returning the error from Diesel's
/// `transaction`, say), the abort is *settled*, and the error is retryable like
/// its cause, so that a [`retry`](crate::retry()) around the whole transaction
/// runs it again. lockkit's journal, watching the connection, settles it; on a
/// connection with instrumentation of its own that is not wrapped in
/// [`Journal::wrap`](crate::journal::Journal::wrap) it stays unsettled.
///
/// It reads as its cause: [`Deref`](std::ops::Deref) to it, and `Debug` and
/// `Display` print it.
///
/// What a call nested in your transaction may return, and what it says (made
/// by hand here: it takes a server that aborts the whole transaction, such as
/// InnoDB choosing a deadlock's victim):
///
/// ```
/// use lockkit::{Aborted, Error};
///
/// let err = Error::TransactionAborted(Aborted::new(Error::Deadlock));
/// if let Error::TransactionAborted(aborted) = &err {
///     assert!(matches!(aborted.cause(), Error::Deadlock));
///     // Still open in Diesel's books: roll it back (return the error from
///     // the transaction's closure) before anything runs again.
///     assert!(!aborted.is_settled());
///     assert!(!err.is_retryable());
/// }
/// // The cause by value, to report or to match on.
/// let Error::TransactionAborted(aborted) = err else { unreachable!() };
/// assert!(matches!(aborted.into_cause(), Error::Deadlock));
/// ```
pub struct Aborted {
    cause: Box<Error>,
    settled: Arc<AtomicBool>,
}

impl Aborted {
    /// An abort caused by `cause`, not settled yet.
    pub fn new(cause: Error) -> Self {
        Aborted {
            cause: Box::new(cause),
            settled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What ended the transaction (a deadlock, a lost connection).
    pub fn cause(&self) -> &Error {
        &self.cause
    }

    /// The cause, by value.
    pub fn into_cause(self) -> Error {
        *self.cause
    }

    /// Whether the transaction's owner has ended it since (rolled it back or
    /// committed): then a new transaction may begin, and the error is
    /// retryable like its cause.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// What lockkit's journal keeps, to settle the abort when the connection's
    /// outermost transaction ends.
    pub(crate) fn settler(&self) -> Settler {
        Settler(Arc::clone(&self.settled))
    }
}

/// Settles an [`Aborted`] from the connection's side.
#[derive(Debug)]
pub(crate) struct Settler(Arc<AtomicBool>);

impl Settler {
    /// The owner ended the transaction.
    pub(crate) fn settle(self) {
        self.0.store(true, Ordering::Release);
    }
}

impl std::ops::Deref for Aborted {
    type Target = Error;

    fn deref(&self) -> &Error {
        &self.cause
    }
}

impl fmt::Debug for Aborted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.cause, f)
    }
}

impl fmt::Display for Aborted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.cause, f)
    }
}
