//! Advisory locks on diesel-async: one job, cron run or migration at a time
//! across many app instances, without a row to lock. The statements, keys and
//! scopes are the blocking side's ([`lockkit::advisory`](crate::advisory)):
//!
//! | | PostgreSQL | MySQL / MariaDB |
//! | --- | --- | --- |
//! | [`with_lock`] / [`try_with_lock`] outside a transaction: session lock, released when the closure returns | `pg_advisory_lock($1)` / `pg_try_advisory_lock($1)`, then `pg_advisory_unlock($1)` | `GET_LOCK(?, ?)` / `GET_LOCK(?, 0)`, then `RELEASE_LOCK(?)` |
//! | [`with_lock`] / [`try_with_lock`] inside a transaction | transaction lock: `pg_advisory_xact_lock($1)` / `pg_try_advisory_xact_lock($1)`, released when the transaction ends (not taken at `REPEATABLE READ`: [why](crate::advisory)) | refused: [`Error::AlreadyInTransaction`], nothing is sent; take the lock before the transaction ([why](crate::advisory)) |
//! | [`xact_lock`] / [`try_xact_lock`] (released at `COMMIT` or `ROLLBACK`) | `pg_advisory_xact_lock($1)`, `pg_try_advisory_xact_lock($1)` (not taken at `REPEATABLE READ`) | — |
//!
//! SQLite has no advisory locks; these functions do not compile for it.
//!
//! # No guard: a closure
//!
//! The blocking side hands out a guard that unlocks when it drops. An async
//! guard cannot: `Drop` cannot await the unlock. So the lock is held for the
//! length of a closure: [`with_lock`] takes it, runs `f`, and releases it
//! whether `f` returned `Ok` or `Err`. The transaction locks ([`xact_lock`])
//! need no release at all: `COMMIT` or `ROLLBACK` ends them.
//!
//! # Cancellation
//!
//! A [`with_lock`] future dropped before it finishes (`tokio::time::timeout`
//! fired, the task was aborted, a client went away) cannot send the unlock. A
//! PostgreSQL or MySQL session lock then stays held by the connection until the
//! connection closes; and a connection with no open transaction is exactly what
//! diesel-async's bb8 and deadpool pools hand to the next user (they ask only
//! whether a transaction is open or the transaction manager is broken). The
//! next user would hold a lock it never asked for, and every other instance
//! would wait for it forever.
//!
//! So from the moment the lock statement is sent until the unlock has
//! answered, a dropped `with_lock` marks the connection's transaction manager
//! broken. The pools discard a broken connection instead of handing it out;
//! closing it ends the server session, and the server frees the lock with it.
//! The same happens when the unlock itself fails (the error is logged, `f`'s
//! result is returned). `tests/tests/async_advisory.rs` drops the future while it
//! holds the lock and takes the lock from another connection at once.
//!
//! A connection held without a pool is not closed for you: after a dropped
//! `with_lock` it may still hold the lock, and its transaction manager refuses
//! every later transaction and advisory lock (`BrokenTransactionManager`),
//! as it does after any lockkit call dropped there. Drop it.
//!
//! The transaction locks are cancellation-safe by themselves: a dropped future
//! leaves the transaction open, the pools discard such a connection (see
//! [cancellation](super::connection#cancellation)), and the server ends the
//! transaction and its locks.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(pool: diesel_async::pooled_connection::bb8::Pool<diesel_async::AsyncPgConnection>) -> Result<(), lockkit::Error> {
//! use lockkit::asynchronous::advisory::{self, AdvisoryKey};
//! let mut conn = pool.get().await.map_err(|_| lockkit::Error::ConnectionLost)?;
//! let ran = advisory::try_with_lock(&mut *conn, AdvisoryKey::from_name("nightly-report"), async |conn| {
//!     // only one instance gets here
//!     Ok::<_, lockkit::Error>(())
//! })
//! .await?;
//! if ran.is_none() {
//!     // another instance holds it
//! }
//! # Ok(()) }
//! ```

use std::future::Future;

use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use super::work::ConnWork;
use crate::error::classification::classify;
use crate::error::Error;
use crate::pessimistic::advisory::{gave_up, scope_for, AdvisoryBackend, Statement};
pub use crate::pessimistic::advisory::{AdvisoryKey, Scope};

/// A diesel-async connection with advisory locks: `AsyncPgConnection`,
/// `AsyncMysqlConnection` (a pooled one as `&mut *conn`). Sealed; name it only
/// in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "advisory locks need PostgreSQL or MySQL/MariaDB; `{Self}` has none",
    label = "no advisory locks on this connection's backend",
    note = "on SQLite, whose writers take turns on the database's write lock, run the work in `lockkit::asynchronous::locked_transaction` (`BEGIN IMMEDIATE`) instead"
)]
pub trait AsyncAdvisory:
    AsyncConnection<Backend: AdvisoryBackend> + Send + crate::sealed::Sealed
{
    /// Sends one of the blocking side's lock statements; its `locked` column.
    #[doc(hidden)]
    fn run(
        conn: &mut Self,
        statement: Statement<Self::Backend>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Sends the blocking side's lock statement; whether the lock was taken.
    #[doc(hidden)]
    fn acquire(
        &mut self,
        key: AdvisoryKey,
        scope: Scope,
        wait: bool,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        Self::run(self, Self::Backend::acquire_statement(key, scope, wait))
    }

    /// Sends the blocking side's unlock; whether this session held the lock.
    #[doc(hidden)]
    fn release(&mut self, key: AdvisoryKey) -> impl Future<Output = QueryResult<bool>> + Send {
        Self::run(self, Self::Backend::release_statement(key))
    }
}

macro_rules! async_advisory {
    ($($conn:ty: $feature:literal),*) => {$(
        #[cfg(feature = $feature)]
        impl AsyncAdvisory for $conn {
            async fn run(conn: &mut Self, statement: Statement<Self::Backend>) -> QueryResult<bool> {
                use diesel_async::RunQueryDsl;
                use crate::pessimistic::advisory::Locked;
                Locked::answer(statement.get_result::<Locked>(conn).await)
            }
        }
    )*};
}

async_advisory!(
    diesel_async::AsyncPgConnection: "postgres",
    diesel_async::AsyncMysqlConnection: "mysql"
);

/// Waits for the advisory lock `key`, runs `f`, and releases the lock, also
/// when `f` fails: a session lock, or inside a transaction on PostgreSQL a
/// transaction lock, released when that transaction ends (see the [module
/// docs](self), also for what a dropped future leaves).
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] on MySQL/MariaDB inside a transaction:
///   the session lock would be released before `COMMIT`, so the next holder
///   would read what `f` wrote as it was before. Run the transaction inside
///   `f` instead. Nothing is sent.
/// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
///   transaction manager is broken (a dropped call's transaction may still be
///   open on the server). Nothing is sent.
/// * [`Error::Database`], not retryable, on PostgreSQL inside a transaction at
///   `REPEATABLE READ`, whose snapshot predates the wait; nothing is locked
///   ([why](crate::advisory)), and `f` does not run.
/// * [`Error::LockTimeout`] when the wait ran out: PostgreSQL's
///   `lock_timeout`, or MySQL/MariaDB's `GET_LOCK` giving up.
/// * [`Error::Deadlock`] when the server broke a deadlock with this session.
/// * any other classified database error from the lock statement; see
///   [`classify`](crate::classify()).
/// * whatever `f` returns. A failed unlock is logged, not returned: `f`'s work
///   is done, and the connection is marked broken so that the lock goes with
///   it.
///
/// # Example
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), lockkit::Error> {
/// use lockkit::asynchronous::advisory;
/// let n = advisory::with_lock(conn, "rebuild-index", async |conn| {
///     // one instance at a time
///     Ok::<_, lockkit::Error>(1)
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn with_lock<C, T, E, F>(conn: &mut C, key: impl Into<AdvisoryKey>, f: F) -> Result<T, E>
where
    C: AsyncAdvisory,
    E: From<Error> + Send,
    T: Send,
    F: ConnWork<C, T, E>,
{
    match locked(conn, key.into(), true, f).await? {
        Some(value) => Ok(value),
        None => Err(E::from(gave_up())),
    }
}

/// Takes the advisory lock `key` if it is free, runs `f`, and releases the
/// lock (scoped as by [`with_lock`]). `Ok(None)` when another session holds
/// it; `f` did not run.
///
/// # Errors
///
/// [`Error::AlreadyInTransaction`] on MySQL/MariaDB inside a transaction,
/// `BrokenTransactionManager` on a broken connection, and the refusal at
/// `REPEATABLE READ` on PostgreSQL, as [`with_lock`]; a
/// classified database error from the lock statement, or whatever `f` returns
/// (the lock is released either way).
pub async fn try_with_lock<C, T, E, F>(
    conn: &mut C,
    key: impl Into<AdvisoryKey>,
    f: F,
) -> Result<Option<T>, E>
where
    C: AsyncAdvisory,
    E: From<Error> + Send,
    T: Send,
    F: ConnWork<C, T, E>,
{
    locked(conn, key.into(), false, f).await
}

/// The connection while a session lock may be held on it: dropped armed (the
/// future was dropped, or the unlock failed), it marks the connection's
/// transaction manager broken, so that a pool closes the connection and the
/// server frees the lock.
struct Held<'c, C: AsyncConnection> {
    conn: &'c mut C,
    key: AdvisoryKey,
    armed: bool,
}

impl<C: AsyncConnection> Drop for Held<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            super::connection::condemn(self.conn);
            tracing::warn!(
                target: "lockkit",
                key = self.key.0,
                "advisory session lock left held: the connection is marked broken, for its pool to close"
            );
        }
    }
}

/// Takes the lock (or not), runs `f`, releases a session lock.
async fn locked<C, T, E, F>(
    conn: &mut C,
    key: AdvisoryKey,
    wait: bool,
    f: F,
) -> Result<Option<T>, E>
where
    C: AsyncAdvisory,
    E: From<Error> + Send,
    T: Send,
    F: ConnWork<C, T, E>,
{
    let status = <C as AsyncConnection>::TransactionManager::transaction_manager_status_mut(conn);
    let scope = scope_for(C::Backend::TRANSACTION_LOCKS, status).map_err(E::from)?;
    // Armed before the statement is sent: a future dropped while it waits
    // does not know whether the server granted the lock.
    let mut held = Held {
        conn,
        key,
        armed: scope == Scope::Session,
    };
    match held.conn.acquire(key, scope, wait).await {
        Ok(true) => {}
        Ok(false) => {
            held.armed = false;
            return Ok(None);
        }
        Err(err) => {
            held.armed = false;
            return Err(E::from(classify(err)));
        }
    }
    let result = f(&mut *held.conn).await;
    if scope == Scope::Session {
        match held.conn.release(key).await {
            Ok(released) => {
                held.armed = false;
                if !released {
                    crate::pessimistic::advisory::not_held_at_unlock(key);
                }
            }
            // Left armed: the connection is marked broken when `held` drops.
            Err(err) => {
                tracing::warn!(target: "lockkit", key = key.0, error = %crate::error::Chain(&err), "advisory unlock failed")
            }
        }
    }
    result.map(Some)
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::AsyncPgConnection;

    use super::*;
    use crate::asynchronous::connection::require_transaction;

    /// PostgreSQL: waits for the transaction-level advisory lock `key`, held
    /// until the transaction ends (`COMMIT` or `ROLLBACK`; a dropped future's
    /// transaction ends when its pool discards the connection). As
    /// [`lockkit::advisory::xact_lock`](crate::advisory::xact_lock).
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
    /// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
    ///   transaction manager is broken (a dropped call's transaction may still be
    ///   open on the server); nothing is sent.
    /// * [`Error::Database`], not retryable, in a transaction at
    ///   `REPEATABLE READ`, whose snapshot predates the wait; nothing is locked
    ///   ([why](crate::advisory)).
    /// * [`Error::LockTimeout`] when the wait ran past `lock_timeout`.
    /// * [`Error::Deadlock`] when the server broke a deadlock with this session.
    /// * any other classified database error; see [`classify`](crate::classify()).
    ///
    /// In a lockkit transaction (or diesel-async's own), waiting for one lock
    /// and trying another ([`try_xact_lock`]):
    ///
    /// ```no_run
    /// # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), lockkit::Error> {
    /// use lockkit::asynchronous::{advisory, locked_transaction};
    /// use lockkit::LockOptions;
    /// let ran = locked_transaction(conn, LockOptions::default(), async |conn| {
    ///     advisory::xact_lock(conn, "invoice-numbers").await?; // waits for the holder's COMMIT
    ///     if !advisory::try_xact_lock(conn, "nightly-report").await? {
    ///         return Ok(false); // another instance is running it
    ///     }
    ///     // ... both held until this transaction ends ...
    ///     Ok::<_, lockkit::Error>(true)
    /// })
    /// .await?;
    /// # let _ = ran;
    /// # Ok(()) }
    /// ```
    pub async fn xact_lock(
        conn: &mut AsyncPgConnection,
        key: impl Into<AdvisoryKey>,
    ) -> Result<(), Error> {
        require_transaction(conn)?;
        conn.acquire(key.into(), Scope::Transaction, true)
            .await
            .map(drop)
            .map_err(classify)
    }

    /// PostgreSQL: takes the transaction-level advisory lock `key` if it is
    /// free. `Ok(false)` when another session holds it. As
    /// [`lockkit::advisory::try_xact_lock`](crate::advisory::try_xact_lock);
    /// [`xact_lock`]'s example takes both.
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
    /// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
    ///   transaction manager is broken (a dropped call's transaction may still be
    ///   open on the server); nothing is sent.
    /// * [`Error::Database`], not retryable, in a transaction at
    ///   `REPEATABLE READ`, whose snapshot predates the wait; nothing is locked
    ///   ([why](crate::advisory)).
    /// * a classified database error; see [`classify`](crate::classify()).
    pub async fn try_xact_lock(
        conn: &mut AsyncPgConnection,
        key: impl Into<AdvisoryKey>,
    ) -> Result<bool, Error> {
        require_transaction(conn)?;
        conn.acquire(key.into(), Scope::Transaction, false)
            .await
            .map_err(classify)
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{try_xact_lock, xact_lock};
