//! Idempotency keys on diesel-async (features `async` and `idempotency`):
//! [`run`] and [`purge_expired`], the async twins of [`Idempotency::run`] and
//! [`Idempotency::purge_expired`], with the same table, the same statements
//! (built by the blocking side), the same reading of a stored key and the same
//! errors; see [`lockkit::idempotency`](crate::idempotency). A repeat that
//! waits for a running key ([`Idempotency::wait_while_running`]) sleeps with
//! tokio, holding no transaction.
//!
//! # Cancellation
//!
//! A dropped [`run`] future leaves the key as a crashed process leaves it.
//! Dropped before the key was inserted: nothing was written. Dropped while
//! `work` runs (or before its `COMMIT`): the key stays `running`, and the
//! work's transaction is still open on the connection, which diesel-async's
//! pools discard ([cancellation](super::connection#cancellation)), so the work
//! is rolled back. Repeats are refused with
//! [`Error::IdempotencyInProgress`] (or wait) until the key's
//! [`lease`](Idempotency::lease) runs out; the next repeat then takes the key
//! over and runs the work, exactly as after a crash. Keep the lease short
//! enough for your clients' retries.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use lockkit::asynchronous::idempotency;
//! use lockkit::idempotency::{fingerprint, up_sql, Dialect, Idempotency, Outcome};
//! # async fn demo() -> Result<(), lockkit::Error> {
//! let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await.unwrap();
//! conn.batch_execute(up_sql(Dialect::Sqlite)).await?;
//! let keys = Idempotency::default();
//! let request = fingerprint("POST", "/orders", br#"{"qty":1}"#);
//! let first = idempotency::run(&keys, &mut conn, "tenant-1", "order-42", &request, async |_conn| {
//!     Ok::<_, lockkit::Error>("201 order 7".to_owned())
//! })
//! .await?;
//! assert_eq!(first, Outcome::Ran("201 order 7".to_owned()));
//! let again = idempotency::run(&keys, &mut conn, "tenant-1", "order-42", &request, async |_conn| {
//!     Ok::<_, lockkit::Error>("never".to_owned())
//! })
//! .await?;
//! assert_eq!(again, Outcome::Replayed("201 order 7".to_owned()));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
//! # }
//! ```

use std::future::Future;
use std::ops::ControlFlow;

use diesel_async::TransactionManager;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::connection::{ended_by_statement, AsyncLockingConnection, Level, Restore};
use super::transaction::{end, Panicked};
use super::work::ConnWork;
use crate::clock::now_millis;
use crate::error::Error;
use crate::http::idempotency::{
    finished, replayed, stored, unsure_end, Idempotency, Outcome, PurgeBefore, RunError, Scoped,
    Start, StoredKey, Write,
};
use crate::transaction::{journal, Failure};

/// Runs `work` at most once for `key` of `principal`:
/// [`Idempotency::run`] on diesel-async, with its arguments, table and errors.
///
/// `work` is an `async` closure that gets the connection, in the transaction
/// that also marks the key completed; it returns the response to store and
/// replay (any `Serialize + DeserializeOwned` value, stored as JSON), or your
/// own error type. See [cancellation](self#cancellation) for a dropped future.
///
/// # Errors
///
/// As [`Idempotency::run`].
///
/// # Example
///
/// See the [module docs](self).
pub async fn run<C, R, E, F>(
    keys: &Idempotency,
    conn: &mut C,
    principal: &str,
    key: &str,
    fingerprint: &str,
    work: F,
) -> Result<Outcome<R>, E>
where
    C: AsyncIdempotencyStore,
    R: Serialize + DeserializeOwned + Send,
    E: From<Error> + Send,
    F: ConnWork<C, R, E>,
{
    let key = Scoped::checked(principal, key, fingerprint)?;
    // Taking the key: its statements are sent before the run's level opens.
    let mut unsettled = super::connection::Unsettled::until_replied(&mut *conn);
    let started = match super::connection::require_live(unsettled.conn).await {
        Ok(()) => start(keys, unsettled.conn, key, fingerprint).await,
        Err(err) => Err(err),
    };
    unsettled.settled();
    drop(unsettled);
    let started_at = match started? {
        Start::Replay(stored) => return Ok(Outcome::Replayed(replayed(&stored)?)),
        Start::Owned { started_at } => started_at,
    };
    // A savepoint when one is open, as on the blocking side.
    let began = super::connection::began(conn).await.map_err(E::from)?;
    super::connection::begin_transaction(conn).await?;
    // A panic of the work is caught only to roll back and release the key (a
    // retry must run the work again), then goes on.
    let mut level = Level::opened(&mut *conn);
    let worked = Panicked::catch(work(&mut *level)).await;
    // Work that failed or panicked: an end the journal is not sure of asked
    // first, as on the blocking side.
    let watched = &mut journal::AsyncWatched(&mut *level);
    let (ends, ended_by) = (journal::Watched::ends(watched), journal::ended_by(watched));
    let failed = !matches!(worked, Ok(Ok(_)));
    if failed && unsure_end(ends, ended_by) {
        let _ = ended_by_statement(&mut *level).await;
    }
    // SQLite, where the work wrote after a statement failed: as on the
    // blocking side.
    let sqlite_own = failed
        && journal::wrote_after_failed(&mut journal::AsyncWatched(&mut *level))
        && super::connection::ended_on_sqlite(&mut *level)
            .await
            .is_some();
    // Statements of the work that ran after its transaction ended, in
    // autocommit, or that a statement committing implicitly took with it (a
    // nested call reported it): they committed, and the key is kept, also
    // when the work then panicked.
    let committed_on_own =
        sqlite_own || journal::committed_on_own(&mut journal::AsyncWatched(&mut *level));
    let worked = match worked {
        Ok(worked) => worked,
        Err(panic) => {
            let panic = panic.end(level, began, Restore::Nothing).await;
            if !committed_on_own {
                release(conn, key, started_at).await;
            }
            panic.resume();
        }
    };
    let result = match worked {
        // A nested call the work gave up on left its savepoint: rolled back
        // before lockkit's own statements, which would otherwise run in it.
        Ok(response) => match super::connection::roll_back_unused_drop(&mut *level).await {
            Err(err) => Err(err),
            // The work let a statement end the transaction: as on the blocking side.
            Ok(_) => match (ended_by_statement(&mut *level).await, stored(&response)) {
                (Some(cause), _) => Err(crate::transaction::ended_under_work(
                    &mut journal::AsyncWatched(&mut *level),
                    cause,
                )),
                (None, Err(err)) => Err(err),
                (None, Ok(stored)) => {
                    let finish = Write::Finish {
                        started_at,
                        response: &stored,
                        now: now_millis(),
                    };
                    match C::write(&mut *level, key, finish).await {
                        Ok(matched) => finished(matched).map(|()| response),
                        Err(err) => Err(err),
                    }
                }
            },
        }
        .map_err(Failure::Lockkit),
        Err(err) => Err(Failure::Closure(RunError::Work(err))),
    };
    let result = end(level, began, Restore::Nothing, result).await;
    let (result, kept) = RunError::settle(result, committed_on_own);
    if result.is_err() && !kept {
        release(conn, key, started_at).await;
    }
    result.map(Outcome::Ran)
}

/// Releases the key of a run that failed, so that a retry runs the work
/// again; a no-op when another request took it over (its `started_at` is not
/// ours). Sent after the run's level ended, as the take was sent before it
/// opened: a run dropped with the release's reply unread marks the
/// connection broken, as one dropped while taking the key does.
async fn release<C: AsyncIdempotencyStore>(conn: &mut C, key: Scoped<'_>, started_at: i64) {
    // Not in a transaction a dropped call left open: it would never commit,
    // and would keep the key's row locked. The key waits out its lease.
    if super::connection::refuse_broken(conn).is_err() {
        return;
    }
    let mut unsettled = super::connection::Unsettled::until_replied(conn);
    let _ = C::write(unsettled.conn, key, Write::Release { started_at }).await;
    unsettled.settled();
}

/// Takes the key or finds what to replay, as the blocking side does, the
/// stored row read by [`Idempotency`]'s own rules; the pauses are tokio's.
async fn start<C: AsyncIdempotencyStore>(
    keys: &Idempotency,
    conn: &mut C,
    key: Scoped<'_>,
    fingerprint: &str,
) -> Result<Start, Error> {
    let mut looks = keys.looks();
    loop {
        let now = now_millis();
        let taken = match C::insert_running(conn, key, fingerprint, now).await? {
            true => Start::Owned { started_at: now },
            false => {
                let row = <C as AsyncIdempotencyStore>::load(conn, key).await?;
                let seen = keys.decide(row, fingerprint, now)?;
                let matched = match seen.write(now) {
                    Some(write) => C::write(conn, key, write).await?,
                    None => false,
                };
                match looks.after(seen, matched, now)? {
                    ControlFlow::Break(start) => start,
                    ControlFlow::Continue(pause) => {
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                        continue;
                    }
                }
            }
        };
        let taken_at = match taken {
            Start::Owned { started_at } => started_at,
            replay => return Ok(replay),
        };
        let now = now_millis();
        let Some(write) = keys.stamp_again(taken_at, now) else {
            return Ok(taken);
        };
        match C::write(conn, key, write).await {
            Ok(true) => return Ok(Start::Owned { started_at: now }),
            // Taken over meanwhile: look again.
            Ok(false) => {}
            Err(err) => {
                // The key is this request's: give it up, as on the blocking side.
                release(conn, key, taken_at).await;
                return Err(err);
            }
        }
    }
}

/// Deletes completed keys older than the retention, and running keys long
/// abandoned; returns how many: [`Idempotency::purge_expired`] on
/// diesel-async (its example shows what goes), called as
/// `purge_expired(&keys, &mut conn).await`.
///
/// # Errors
///
/// [`Error::Database`] with `BrokenTransactionManager` when a dropped call
/// left `conn` in its transaction (nothing is sent), or a classified database
/// error; see [`classify`](crate::classify()).
pub async fn purge_expired<C: AsyncIdempotencyStore>(
    keys: &Idempotency,
    conn: &mut C,
) -> Result<usize, Error> {
    super::connection::refuse_broken(conn)?;
    C::purge(conn, keys.purge_before()).await
}

/// The statements behind [`run`] on a diesel-async connection: the blocking
/// side's ([`IdempotencyStore`](crate::idempotency::IdempotencyStore)), awaited.
///
/// Sealed: implemented for `AsyncPgConnection`, `AsyncMysqlConnection` and
/// `SyncConnectionWrapper<SqliteConnection>`; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit's async idempotency keys do not support `{Self}`",
    label = "not a diesel-async connection lockkit's idempotency keys support",
    note = "lockkit supports `AsyncPgConnection`, `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (feature `async` with `postgres`, `mysql`, `sqlite`); pass a pooled connection as `&mut *conn`"
)]
pub trait AsyncIdempotencyStore: AsyncLockingConnection {
    #[doc(hidden)]
    fn insert_running(
        conn: &mut Self,
        key: Scoped<'_>,
        fingerprint: &str,
        now: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    #[doc(hidden)]
    fn load(
        conn: &mut Self,
        key: Scoped<'_>,
    ) -> impl Future<Output = Result<Option<StoredKey>, Error>> + Send;
    /// Runs `write` on `key`'s row: whether it matched.
    #[doc(hidden)]
    fn write(
        conn: &mut Self,
        key: Scoped<'_>,
        write: Write<'_>,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    #[doc(hidden)]
    fn purge(
        conn: &mut Self,
        before: PurgeBefore,
    ) -> impl Future<Output = Result<usize, Error>> + Send;
}

#[allow(unused_macros)] // used once per enabled backend
macro_rules! async_idempotency_store {
    ($conn:ty) => {
        #[diagnostic::do_not_recommend]
        impl AsyncIdempotencyStore for $conn {
            async fn insert_running(
                conn: &mut Self,
                key: Scoped<'_>,
                fingerprint: &str,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel_async::RunQueryDsl;
                // A savepoint when nested: a failed INSERT must not poison the
                // caller's transaction.
                super::connection::begin_transaction(conn).await?;
                // Dropped before its end, as any lockkit transaction's.
                let mut level = super::connection::Level::opened(conn);
                let inserted =
                    statements::insert_running(key.principal, key.key, fingerprint, now)
                        .execute(&mut *level)
                        .await;
                level.ending();
                let ended = match inserted {
                    // Begun marked on a read-only session: committed so too.
                    Ok(_) => match AsyncLockingConnection::commit_marked(&mut *level).await {
                        Ok(()) => {
                            <Self as diesel_async::AsyncConnection>::TransactionManager::commit_transaction(&mut *level).await
                        }
                        Err(err) => {
                            let _ = <Self as diesel_async::AsyncConnection>::TransactionManager::rollback_transaction(&mut *level).await;
                            Err(err)
                        }
                    },
                    Err(_) => {
                        <Self as diesel_async::AsyncConnection>::TransactionManager::rollback_transaction(&mut *level).await
                    }
                };
                level.closed();
                let inserted = crate::http::idempotency::inserted(inserted)?;
                ended?;
                Ok(inserted)
            }

            async fn load(conn: &mut Self, key: Scoped<'_>) -> Result<Option<StoredKey>, Error> {
                use diesel::OptionalExtension;
                use diesel_async::RunQueryDsl;
                Ok(statements::load(key.principal, key.key)
                    .first::<StoredKey>(conn)
                    .await
                    .optional()?)
            }

            async fn write(conn: &mut Self, key: Scoped<'_>, write: Write<'_>) -> Result<bool, Error> {
                use diesel_async::RunQueryDsl;
                let Scoped { principal, key } = key;
                let rows = match write {
                    Write::TakeOver { seen_started_at, now } => {
                        statements::take_over(principal, key, seen_started_at, now)
                            .execute(conn)
                            .await
                    }
                    Write::Finish { started_at, response, now } => {
                        statements::finish(principal, key, started_at, response, now)
                            .execute(conn)
                            .await
                    }
                    Write::Release { started_at } => {
                        statements::release(principal, key, started_at)
                            .execute(conn)
                            .await
                    }
                    Write::DeleteIfAsSeen { started_at, state } => {
                        statements::delete_if_as_seen(principal, key, started_at, state)
                            .execute(conn)
                            .await
                    }
                };
                Ok(rows? == 1)
            }

            async fn purge(conn: &mut Self, before: PurgeBefore) -> Result<usize, Error> {
                use diesel_async::RunQueryDsl;
                Ok(statements::purge(before.finished, before.started)
                    .execute(conn)
                    .await?)
            }
        }
    };
}

#[allow(unused_imports)] // without a backend feature
use crate::http::idempotency::statements;

#[cfg(feature = "postgres")]
async_idempotency_store!(diesel_async::AsyncPgConnection);
#[cfg(feature = "mysql")]
async_idempotency_store!(diesel_async::AsyncMysqlConnection);
#[cfg(feature = "sqlite")]
async_idempotency_store!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);
