//! `SERIALIZABLE` transactions, retried; see [`serializable`].

#[allow(unused_imports)] // doc links
use crate::error::Error;
use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
use crate::retry::RetryPolicy;
use crate::retry::{may_retry, retry_while, RetryableError, Spent};

/// `SERIALIZABLE` transactions, retried.
///
/// Row locks protect the rows you lock. Some invariants span rows nobody locks:
/// "at least one doctor stays on call" is broken when two doctors each see the
/// other on call and both go off duty (write skew). A `SERIALIZABLE` transaction
/// makes the database detect that interleaving and abort one side with a
/// serialization failure (PostgreSQL) or a deadlock (InnoDB); [`serializable`]
/// retries it, and the retry sees the other's commit.
///
/// | backend | how |
/// | --- | --- |
/// | PostgreSQL | `BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE` (SSI) |
/// | MySQL/MariaDB | `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION READ WRITE` (reads take shared locks) |
/// | SQLite | `BEGIN IMMEDIATE` (one writer at a time is serializable) |
///
/// # Running `f`
///
/// Runs `f` in a `SERIALIZABLE` transaction, retrying serialization failures and
/// deadlocks (and the other [retryable](Error::is_retryable) errors) with `policy`.
///
/// `f` may run several times: keep side effects outside the database out of it.
/// It cannot be nested in another transaction ([`Error::AlreadyInTransaction`]).
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] when a transaction is already open; nothing
///   is sent.
/// * when every attempt failed with a [retryable](RetryableError::is_retryable)
///   error ([`Error::SerializationFailure`], [`Error::Deadlock`], ..): the last
///   one, through [`RetryableError::retries_exhausted`]
///   ([`Error::RetriesExhausted`] for lockkit's own error type, whose `last` is
///   the final one).
/// * the first non-retryable error, at once: `f`'s own, or a classified
///   database error (e.g. [`Error::ConnectionLost`]).
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// let answer = lockkit::serializable(&mut conn, &lockkit::RetryPolicy::default(), |_conn| Ok::<_, lockkit::Error>(42)).unwrap();
/// assert_eq!(answer, 42);
/// ```
///
/// On diesel-async: `lockkit::asynchronous::serializable` (feature `async`).
pub fn serializable<C, T, E, F>(conn: &mut C, policy: &RetryPolicy, mut f: F) -> Result<T, E>
where
    C: AsLockingConnection,
    E: RetryableError,
    F: FnMut(&mut C::Conn) -> Result<T, E>,
{
    let conn = conn.locking_connection();
    retry_while(
        policy,
        |_| conn.serializable_transaction(&mut f),
        |err, attempt| may_retry(err, false, attempt),
        Spent::Exhausted,
    )
}
