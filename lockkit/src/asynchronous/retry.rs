//! Bounded retry on diesel-async: [`retry`] and [`transaction_with_retry`],
//! the async twins of [`lockkit::retry`](crate::retry()) and
//! [`lockkit::transaction_with_retry`](crate::transaction_with_retry), with
//! the same [`RetryPolicy`], the same decision of what is retried
//! ([`RetryableError`]: serialization failures, deadlocks, lock timeouts,
//! `Busy`, stale writes; also when the server reports them at `COMMIT`) and
//! the same metrics. The backoff sleeps with `tokio::time::sleep`, so the
//! executor thread serves other tasks meanwhile.

use super::connection::{in_transaction, AsyncLockingConnection};
use super::work::ConnAttempt;
use crate::retry::{after_failure, may_retry, Next, Spent};
use crate::retry::{RetryPolicy, RetryableError};

/// Runs `op` until it succeeds, fails with an error that is not retryable, or
/// has run `policy.attempts()` times, sleeping (asynchronously) with backoff
/// and jitter between attempts. `op` gets the attempt number, from 1.
///
/// Put it around a transaction, never inside one: it sees no connection, and
/// a task moves between threads, so unlike the blocking
/// [`retry`](crate::retry()) it cannot tell that a statement of `op` ended the
/// open transaction (a deadlock's victim on MySQL/MariaDB, whose next attempt
/// would run in autocommit). [`transaction_with_retry`](super::transaction_with_retry)
/// asks the server.
///
/// # Errors
///
/// The first error that is not retryable, or the last one through
/// [`RetryableError::retries_exhausted`] (for `E = lockkit::Error`,
/// [`Error::RetriesExhausted`](crate::Error::RetriesExhausted) holding it).
///
/// # Example
///
/// ```
/// # async fn run() {
/// use lockkit::RetryPolicy;
/// let mut runs = 0;
/// let result = lockkit::asynchronous::retry(&RetryPolicy::immediate(3), |attempt| {
///     runs += 1;
///     async move {
///         if attempt < 3 { Err(lockkit::Error::Deadlock) } else { Ok(attempt) }
///     }
/// })
/// .await;
/// assert_eq!(result.unwrap(), 3);
/// assert_eq!(runs, 3);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(run());
/// ```
pub async fn retry<T, E, F, Fut>(policy: &RetryPolicy, mut op: F) -> Result<T, E>
where
    E: RetryableError,
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        let err = match op(attempt).await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        attempt = again(policy, attempt, err, Spent::Exhausted, E::is_retryable).await?;
    }
}

/// After attempt `attempt` failed with `err`: the blocking loops' decision
/// ([`after_failure`], `spent` as there), then the wait. `Err`: give up with
/// this error; `Ok`: the number of the next attempt, once its delay has
/// passed. Shared by the async retry loops.
pub(crate) async fn again<E: RetryableError>(
    policy: &RetryPolicy,
    attempt: u32,
    err: E,
    spent: Spent,
    retryable: impl Fn(&E) -> bool,
) -> Result<u32, E> {
    match after_failure(policy, attempt, err, spent, retryable) {
        Next::GiveUp(err) => Err(err),
        Next::RetryAfter(delay) => {
            back_off(delay).await;
            Ok(attempt + 1)
        }
    }
}

/// The wait of the async retry loops before the next attempt: no timer at all
/// for a zero delay ([`RetryPolicy::immediate`]).
pub(crate) async fn back_off(delay: std::time::Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// Runs `op` in a transaction, and again in a new one when it fails with a
/// retryable error: [`lockkit::transaction_with_retry`](crate::transaction_with_retry)
/// on diesel-async. Each attempt commits on `Ok` and rolls back on `Err`; a
/// serialization failure or deadlock reported at `COMMIT` is retried like one
/// reported by a statement.
///
/// Nested in an open transaction, each attempt is a savepoint, retried as on
/// the blocking side unless the server ended the whole transaction (InnoDB does
/// on a deadlock): that is [`Error::TransactionAborted`](crate::Error::TransactionAborted),
/// for the owner of the outermost transaction to run again, and a deadlock on
/// any attempt but the first is [`Error::Deadlock`](crate::Error::Deadlock),
/// for the owner too (see the blocking side). Nested in a
/// transaction that a statement the caller let go has already ended (a
/// deadlock on MariaDB), it sends nothing and returns `TransactionAborted`, as
/// the other async lockkit transactions do, instead of running `op` in
/// autocommit.
///
/// `op` is an `async` closure that may run more than once.
///
/// # Errors
///
/// As [`retry`]; nested, also [`Error::Deadlock`](crate::Error::Deadlock) from
/// a deadlock on any attempt but the first (above), and, once every attempt
/// failed, a last `Stale` or `Busy` as it is, for the owner of the outermost
/// transaction (as on the blocking side).
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # use diesel_async::RunQueryDsl;
/// use lockkit::asynchronous::prelude::*;
/// use lockkit::RetryPolicy;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
/// # #[derive(Queryable, Selectable, Versioned)]
/// # #[diesel(table_name = items)]
/// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
/// # async fn run() -> Result<(), lockkit::Error> {
/// use diesel_async::{AsyncConnection, SimpleAsyncConnection};
/// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
/// # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); INSERT INTO items VALUES (1, 10, 0)").await?;
/// // Read, change, write; a stale write reloads and tries again.
/// let left = lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::default(), async |conn| {
///     let mut item = items::table.find(1).first::<Item>(conn).await?;
///     item.stock -= 1;
///     item.update_versioned(conn).await?;
///     Ok::<_, lockkit::Error>(item.stock)
/// })
/// .await?;
/// assert_eq!(left, 9);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(run()).unwrap();
/// ```
pub async fn transaction_with_retry<C, T, E, F>(
    conn: &mut C,
    policy: &RetryPolicy,
    mut op: F,
) -> Result<T, E>
where
    C: AsyncLockingConnection,
    E: RetryableError + Send,
    T: Send,
    F: ConnAttempt<C, T, E>,
{
    let nested = in_transaction(conn);
    let mut attempt = 1;
    loop {
        // As every async lockkit transaction: nested in a transaction that a
        // statement the caller let go has ended, `TransactionAborted` before
        // anything is sent that MySQL/MariaDB would run in autocommit.
        let result = match super::connection::began(conn).await {
            Ok(began) => match super::connection::begin_transaction(conn).await {
                Ok(()) => super::transaction::attempt(conn, began, &mut op).await,
                Err(err) => Err(E::from(err)),
            },
            Err(err) => Err(E::from(err)),
        };
        let err = match result {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let spent = Spent::for_transaction(nested);
        attempt = again(policy, attempt, err, spent, move |err| {
            may_retry(err, nested, attempt)
        })
        .await?;
    }
}
