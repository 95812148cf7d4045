//! The ground floor: what every lockkit transaction does the same way, whatever
//! it locks. Nothing here is public; the strategies above build on it.
//!
//! Every transaction lockkit opens for a closure (`with_lock`,
//! `locked_transaction`, `serializable`, `transaction_with_retry`, idempotency
//! keys) runs the closure behind the [`PanicGuard`] and ends in [`finish`], which
//! decides, once, what the caller gets back:
//!
//! * the closure's own error, untouched, in the caller's error type;
//! * lockkit's own failures (`BEGIN`, a setting, the locked read, `COMMIT`)
//!   classified into [`Error`] and converted with `From`;
//! * a nested transaction (a savepoint) whose whole transaction the server ended
//!   (InnoDB does on a deadlock): [`Error::TransactionAborted`], not retryable,
//!   for the owner of the outermost transaction; see
//!   [`connection`](crate::pessimistic::connection#when-the-server-aborts-the-whole-transaction).
//!
//! While the closure runs, the transaction's [`scope`] gathers the work queued
//! with [`after_commit`] and the locks taken, so that [`finish`] can run the one
//! after `COMMIT` and measure how long the others were held.

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

mod after_commit;
mod panic_guard;
pub(crate) mod scope;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::connection::AnsiTransactionManager;
use diesel::connection::TransactionManager;
use diesel::Connection;

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::multi::Reach;

pub use after_commit::after_commit;
pub(crate) use panic_guard::PanicGuard;

use crate::Error;

/// A lockkit transaction's failure on its way to the caller.
pub(crate) enum Failure<E> {
    /// From Diesel's transaction statements (`BEGIN`, `SAVEPOINT`, `COMMIT`,
    /// `ROLLBACK`), not classified yet: which statement failed decides how.
    Diesel(diesel::result::Error),
    /// From one of lockkit's own steps inside the transaction.
    Lockkit(Error),
    /// The closure's own error, handed back untouched.
    Closure(E),
}

impl<E> From<diesel::result::Error> for Failure<E> {
    fn from(err: diesel::result::Error) -> Self {
        Failure::Diesel(err)
    }
}

impl<E> From<Error> for Failure<E> {
    fn from(err: Error) -> Self {
        Failure::Lockkit(err)
    }
}

/// What the transaction plumbing asks of a connection. Implemented for the
/// connections lockkit supports and for [`Dispatch`](crate::multi::Dispatch)
/// enums over them, and only by lockkit: it seals
/// [`LockingConnection`](crate::LockingConnection).
pub trait Control: Connection + Sized {
    /// After a nested transaction failed (with `cause` when lockkit can see it):
    /// whether the server has ended the whole transaction, and why. Asked on
    /// error paths only. The default: only a lost connection does.
    fn transaction_ended(&mut self, cause: Option<&Error>) -> Option<Error> {
        matches!(cause, Some(Error::ConnectionLost)).then_some(Error::ConnectionLost)
    }

    /// After an outermost transaction failed: puts Diesel's transaction manager
    /// back in order when it gave up on the connection although the server has
    /// no transaction open. The default: nothing.
    fn repair(&mut self) {}
}

/// Runs `f` in a transaction (a savepoint when one is open) behind the panic
/// guard, and ends it as [`finish`] decides.
pub(crate) fn run<C, T, E, F>(conn: &mut C, f: F) -> Result<T, E>
where
    C: Control,
    E: From<Error>,
    F: FnOnce(&mut C) -> Result<T, Failure<E>>,
{
    let nested = in_transaction(conn);
    let mut guard = PanicGuard::default();
    let result = conn.transaction(|conn| guard.call(conn, f));
    finish(conn, nested, guard, result, None, crate::classify)
}

/// Diesel's `Connection::transaction` with a `BEGIN` of its own (`BEGIN
/// IMMEDIATE`, an isolation level), sent to the backend connection `I` that
/// `conn` is or holds; `COMMIT` and `ROLLBACK` go through `conn`'s transaction
/// manager, which for a [`Dispatch`](crate::multi::Dispatch) enum is `I`'s.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn transaction_sql<I, H, T, E>(
    conn: &mut H,
    begin: &str,
    f: impl FnOnce(&mut H) -> Result<T, E>,
) -> Result<T, E>
where
    I: Connection<TransactionManager = AnsiTransactionManager>,
    H: Connection + Reach<I>,
    E: From<diesel::result::Error>,
{
    AnsiTransactionManager::begin_transaction_sql(conn.reach()?, begin)?;
    match f(conn) {
        Ok(value) => {
            H::TransactionManager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(err) => match H::TransactionManager::rollback_transaction(conn) {
            // A broken transaction manager says less than the error behind it.
            Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(err),
            Err(rollback) => Err(rollback.into()),
        },
    }
}

/// The end of every lockkit transaction, decided here once: `result` is how
/// the transaction went, `restored` how putting back a session setting changed
/// for it went (reported only when the work itself succeeded), `classify` how to
/// read a failure of Diesel's own transaction statements. A panic in the work goes
/// on here, after the rollback and the restore.
pub(crate) fn finish<C, T, E>(
    conn: &mut C,
    nested: bool,
    guard: PanicGuard,
    result: Result<T, Failure<E>>,
    restored: Option<diesel::QueryResult<()>>,
    classify: impl FnOnce(diesel::result::Error) -> Error,
) -> Result<T, E>
where
    C: Control,
    E: From<Error>,
{
    // Committed (or the savepoint released) as soon as the work succeeded: a
    // failure to put a session setting back afterwards undoes nothing.
    guard.resume(result.is_ok());
    let failure = match (result, restored) {
        (Ok(value), None | Some(Ok(()))) => return Ok(value),
        (Ok(_), Some(Err(err))) => Failure::Lockkit(crate::classify(err)),
        (Err(failure), _) => failure,
    };
    if !nested {
        conn.repair();
    }
    Err(match failure {
        Failure::Closure(err) if !nested => err,
        // The closure's error is the caller's; lockkit cannot look inside it, so
        // it asks the server instead.
        Failure::Closure(err) => match conn.transaction_ended(None) {
            Some(reason) => E::from(Error::TransactionAborted(Box::new(reason))),
            None => err,
        },
        Failure::Diesel(err) => E::from(ended(conn, nested, classify(err))),
        Failure::Lockkit(err) => E::from(ended(conn, nested, err)),
    })
}

/// lockkit's own failure of a transaction: a nested one whose whole transaction
/// the server ended becomes [`Error::TransactionAborted`]; an outermost one hands
/// on the cause of such an error, since the transaction is gone and a new one may
/// begin.
fn ended<C: Control>(conn: &mut C, nested: bool, error: Error) -> Error {
    match error {
        Error::TransactionAborted(cause) if !nested => *cause,
        Error::TransactionAborted(_) => error,
        _ if nested && conn.transaction_ended(Some(&error)).is_some() => {
            Error::TransactionAborted(Box::new(error))
        }
        _ => error,
    }
}

/// Whether a transaction is open on `conn`, for any connection type (pooled ones
/// included): Diesel's transaction manager knows its depth.
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    transaction_depth(conn) > 0
}

/// [`Error::NotInTransaction`] unless a transaction is open (`open`): the calls
/// that lock inside the caller's transaction send nothing outside one.
pub(crate) fn require_transaction(open: bool) -> Result<(), Error> {
    if open {
        Ok(())
    } else {
        Err(Error::NotInTransaction)
    }
}

/// How many transactions (the outermost one and its savepoints) are open on
/// `conn`: 0 when none is, or when Diesel's transaction manager is broken.
pub(crate) fn transaction_depth<C: Connection>(conn: &mut C) -> u32 {
    depth_of(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// [`transaction_depth`] read off a transaction manager's status (also the
/// async connections').
pub(crate) fn depth_of(status: &mut diesel::connection::TransactionManagerStatus) -> u32 {
    match status.transaction_depth() {
        Ok(Some(depth)) => depth.get(),
        _ => 0,
    }
}
