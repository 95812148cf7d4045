//! `SERIALIZABLE` transactions, retried, on diesel-async: [`serializable`],
//! the async twin of [`lockkit::serializable`](crate::serializable()), with its
//! statements and its retry decision:
//!
//! | backend | how |
//! | --- | --- |
//! | PostgreSQL | `BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE` (SSI) |
//! | MySQL/MariaDB | `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION READ WRITE` (reads take shared locks) |
//! | SQLite | `BEGIN IMMEDIATE` (one writer at a time is serializable) |
//!
//! A future dropped during an attempt leaves its transaction open: see
//! [cancellation](super::connection#cancellation).

use diesel_async::TransactionManager;

use super::connection::{in_transaction, AsyncLockingConnection, Unsettled};
use super::retry::again;
use super::work::ConnAttempt;
use crate::error::classification::classify;
#[allow(unused_imports)] // doc links
use crate::error::Error;
use crate::retry::{may_retry, Spent};
use crate::retry::{RetryPolicy, RetryableError};
use crate::transaction::Began;

/// Runs `f` in a `SERIALIZABLE` transaction, retrying serialization failures
/// and deadlocks (and the other [retryable](Error::is_retryable) errors, also
/// when the server reports them at `COMMIT`) with `policy`, sleeping with
/// tokio's timer between attempts.
///
/// `f` is an `async` closure that may run several times: keep side effects
/// outside the database out of it. It cannot be nested in another transaction.
///
/// # Errors
///
/// As [`lockkit::serializable`](crate::serializable()):
/// [`Error::AlreadyInTransaction`] when a transaction is already open (nothing
/// is sent); when every attempt failed with a retryable error, the last one
/// through [`RetryableError::retries_exhausted`]
/// ([`Error::RetriesExhausted`] for lockkit's own error type); else the first
/// error that is not retryable.
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # async fn run() {
/// # use diesel_async::AsyncConnection;
/// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
/// let policy = lockkit::RetryPolicy::default();
/// let answer = lockkit::asynchronous::serializable(&mut conn, &policy, async |_conn| {
///     Ok::<_, lockkit::Error>(42)
/// })
/// .await;
/// assert_eq!(answer.unwrap(), 42);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(run());
/// ```
pub async fn serializable<C, T, E, F>(conn: &mut C, policy: &RetryPolicy, mut f: F) -> Result<T, E>
where
    C: AsyncLockingConnection,
    E: RetryableError + Send,
    T: Send,
    F: ConnAttempt<C, T, E>,
{
    super::connection::watch(conn);
    super::connection::refuse_if_ended_on_sqlite(conn)
        .await
        .map_err(E::from)?;
    super::connection::refuse_transaction_or_broken(conn).map_err(E::from)?;
    let mut attempt = 1;
    loop {
        let begun = {
            // As every async lockkit call's `BEGIN`: dropped in flight, the
            // connection is marked broken.
            let mut unsettled = Unsettled::armed(&mut *conn);
            let begun = unsettled.conn.begin_serializable().await;
            unsettled.settled();
            begun
        };
        let result = match begun {
            Ok(()) => super::transaction::attempt(conn, Began::with_work(false), &mut f).await,
            Err(err) => {
                // A failed `BEGIN` may have left diesel-async's bookkeeping
                // behind the server's: end whatever is open.
                if in_transaction(conn) {
                    let _ = C::TransactionManager::rollback_transaction(conn).await;
                }
                Err(E::from(classify(err)))
            }
        };
        let err = match result {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        attempt = again(policy, attempt, err, Spent::Exhausted, move |err| {
            may_retry(err, false, attempt)
        })
        .await?;
    }
}
