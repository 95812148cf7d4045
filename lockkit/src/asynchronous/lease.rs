//! Database leases and fenced writes on diesel-async (features `async` and
//! `lease`): [`acquire`], [`with_lease`] and [`fenced`], the async twins of
//! [`lease::acquire`](crate::lease::acquire),
//! [`lease::with_lease`](crate::lease::with_lease) and
//! [`lease::fenced`](crate::lease::fenced), with the same tables, the same
//! statements (the blocking side's), the same checks and the same errors; see
//! [`lockkit::lease`](crate::lease). The Redis store stays blocking.
//!
//! # Cancellation and release
//!
//! An [`AsyncLease`] cannot give its lease up when it is dropped (nothing can
//! be awaited in a drop): call [`AsyncLease::release`], or use [`with_lease`],
//! which releases on `Ok` and on `Err`. A lease that is dropped unreleased (a
//! dropped future included) is logged (`tracing`, target `lockkit`) and runs
//! out after its TTL, as a crashed holder's does; its fence stays valid for
//! writes until a newer holder writes, which is what fencing is for. A dropped
//! [`acquire`] may have granted the lease before it could read the fence: that
//! grant is nobody's, and runs out after its TTL too. On MySQL/MariaDB, an
//! [`acquire`], [`AsyncLease::renew`] or [`AsyncLease::release`] dropped with
//! a statement in flight (or dropped at all, on a connection with
//! instrumentation of its own that lockkit cannot watch) marks the connection
//! broken (the reply is left unread), for its pool to close. A dropped [`fenced`]
//! leaves its transaction open on the connection, which diesel-async's pools
//! discard ([cancellation](super::connection#cancellation)): neither the fence
//! nor the work is recorded.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use std::time::Duration;
//! use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use lockkit::asynchronous::lease;
//! use lockkit::lease::{up_sql, Dialect, Fence};
//! # async fn demo() -> Result<(), lockkit::Error> {
//! let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await.unwrap();
//! conn.batch_execute(up_sql(Dialect::Sqlite)).await?;
//! conn.batch_execute("CREATE TABLE report (id INTEGER PRIMARY KEY, body TEXT NOT NULL)").await?;
//!
//! let held = lease::acquire(&mut conn, "nightly-report", Duration::from_secs(30)).await?;
//! let fence = held.fence();
//! held.release().await?;
//! lease::fenced(&mut conn, "report", fence, async |conn| {
//!     diesel::sql_query("INSERT INTO report (id, body) VALUES (1, 'done')").execute(conn).await?;
//!     Ok::<_, lockkit::Error>(())
//! })
//! .await?;
//! // An older fence is refused once a newer one wrote.
//! let stale = lease::fenced(&mut conn, "report", Fence(fence.0 - 1), async |_conn| Ok::<_, lockkit::Error>(())).await;
//! assert!(matches!(stale, Err(lockkit::Error::Fenced { .. })));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use super::connection::{refuse_broken, AsyncLockingConnection, Level, Restore, Unsettled};
use super::transaction::{end_caught, Panicked};
use super::work::{AsyncWork, ConnWork};
use crate::error::Error;
use crate::lease::fence::admitted;
use crate::lease::{
    check_acquire, check_name, check_own_commit, lease_guard, new_token, released, renewed, Fence,
    Grant,
};
use crate::transaction::Failure;

/// A held database lease on a diesel-async connection: [`Lease`](crate::lease::Lease)'s
/// twin. Derefs to the connection. Release it with [`release`](Self::release)
/// (see [cancellation](self#cancellation-and-release)).
#[must_use = "release the lease with `release().await`; a dropped one runs out after its TTL"]
pub struct AsyncLease<'c, C: AsyncLeaseStore> {
    store: &'c mut C,
    grant: Grant,
    held: bool,
}

lease_guard!(AsyncLease, AsyncLeaseStore);

impl<C: AsyncLeaseStore> AsyncLease<'_, C> {
    /// Extends the lease by its TTL from now (the server's clock), keeping the
    /// fence: [`Lease::renew`](crate::lease::Lease::renew), whose example
    /// renews a held lease and one that ran out (`lease.renew().await` here).
    ///
    /// # Errors
    ///
    /// As [`Lease::renew`](crate::lease::Lease::renew).
    pub async fn renew(&mut self) -> Result<(), Error> {
        check_own_commit(may_be_in_transaction(self.store))?;
        let grant = &self.grant;
        let mut unsettled = Unsettled::until_replied(&mut *self.store);
        let extended = C::extend(unsettled.conn, &grant.name, &grant.token, grant.ttl_ms).await;
        unsettled.settled();
        drop(unsettled);
        let extended = extended?;
        let renewed = renewed(extended);
        self.held = renewed.is_ok();
        renewed
    }

    /// Gives the lease up now, only if this holder still has it:
    /// [`Lease::release`](crate::lease::Lease::release).
    ///
    /// # Errors
    ///
    /// As [`Lease::release`](crate::lease::Lease::release), and
    /// [`Error::Database`] with `BrokenTransactionManager` when a dropped call
    /// left the connection in its transaction: that transaction never
    /// commits, so nothing is sent, and the lease runs out after its TTL.
    pub async fn release(mut self) -> Result<(), Error> {
        // A transaction a dropped call left open (the connection marked
        // broken) never commits: a release sent there would not count, and
        // would keep the lease's row locked while the connection lives.
        if let Err(err) = refuse_broken(self.store) {
            self.held = false;
            return Err(err);
        }
        let mut unsettled = Unsettled::until_replied(&mut *self.store);
        let revoked = C::revoke(unsettled.conn, &self.grant.name, &self.grant.token).await;
        unsettled.settled();
        drop(unsettled);
        // Not before: a release dropped with its statement in flight is
        // logged as a lease dropped unreleased.
        self.held = false;
        released(revoked?)
    }
}

impl<C: AsyncLeaseStore> Drop for AsyncLease<'_, C> {
    fn drop(&mut self) {
        if self.held {
            tracing::warn!(target: "lockkit", lease = %self.grant.name, fence = self.grant.fence.0, "an async lease was dropped unreleased; it runs out after its TTL");
        }
    }
}

/// Whether a grant on `conn` could be undone with an open transaction
/// ([`crate::transaction::may_be_in_transaction`]).
fn may_be_in_transaction<C: diesel_async::AsyncConnection>(conn: &mut C) -> bool {
    use diesel_async::TransactionManager;
    crate::transaction::may_be_in_transaction(
        C::TransactionManager::transaction_manager_status_mut(conn),
    )
}

/// Takes the lease `name` for `ttl` if nobody holds it:
/// [`lease::acquire`](crate::lease::acquire) on diesel-async. It does not
/// wait: wrap it in [`retry()`](super::retry()) to wait with backoff.
///
/// # Errors
///
/// As [`lease::acquire`](crate::lease::acquire): [`Error::Busy`],
/// [`Error::InvalidInput`], [`Error::AlreadyInTransaction`], or a classified
/// database error.
pub async fn acquire<'c, C: AsyncLeaseStore>(
    conn: &'c mut C,
    name: &str,
    ttl: Duration,
) -> Result<AsyncLease<'c, C>, Error> {
    let ttl_ms = check_acquire(name, ttl, may_be_in_transaction(conn))?;
    let token = new_token();
    // Three statements: a call dropped with one in flight marks the
    // connection broken.
    let mut unsettled = Unsettled::until_replied(&mut *conn);
    let fence = C::grant(unsettled.conn, name, &token, ttl_ms).await;
    unsettled.settled();
    drop(unsettled);
    let fence = fence?;
    Ok(AsyncLease {
        grant: Grant::new(name, token, ttl_ms, fence)?,
        store: conn,
        held: true,
    })
}

/// Runs `work` under the lease `name` and releases it afterwards, on `Ok` and
/// on `Err`: [`lease::with_lease`](crate::lease::with_lease) on diesel-async.
/// A release that finds the lease already lost is logged, not returned.
///
/// # Errors
///
/// Those of [`acquire`] (converted into `E`), or `work`'s own error, untouched.
pub async fn with_lease<C, T, E, F>(
    conn: &mut C,
    name: &str,
    ttl: Duration,
    work: F,
) -> Result<T, E>
where
    C: AsyncLeaseStore,
    T: Send,
    E: From<Error> + Send,
    for<'r, 'c> F: AsyncWork<&'r mut AsyncLease<'c, C>, Result<T, E>, Fut: Send> + Send,
{
    let mut lease = acquire(conn, name, ttl).await?;
    let result = work(&mut lease).await;
    let (name, fence) = (lease.grant.name.clone(), lease.grant.fence);
    if let Err(err) = lease.release().await {
        tracing::warn!(target: "lockkit", lease = %name, fence = fence.0, error = %crate::error::Chain(&err), "lease release failed");
    }
    result
}

/// Runs `work` in a transaction (a savepoint inside one) that first records
/// `fence` for `resource`, and refuses it when a newer fence was recorded:
/// [`lease::fenced`](crate::lease::fenced) on diesel-async.
///
/// # Errors
///
/// As [`lease::fenced`](crate::lease::fenced): [`Error::Fenced`] (`work` did
/// not run), [`Error::InvalidInput`], whatever `work` returns, or a classified
/// database error.
pub async fn fenced<C, T, E, F>(conn: &mut C, resource: &str, fence: Fence, work: F) -> Result<T, E>
where
    C: AsyncFenceStore,
    T: Send,
    E: From<Error> + Send,
    F: ConnWork<C, T, E>,
{
    check_name(resource)?;
    let began = super::connection::began(conn).await.map_err(E::from)?;
    super::connection::begin_transaction(conn).await?;
    let mut level = Level::opened(conn);
    let conn = &mut *level;
    let fenced = async {
        match C::raise(conn, resource, fence.0).await {
            Ok(newer) => match admitted(resource, fence, newer) {
                Ok(()) => work(conn).await.map_err(Failure::Closure),
                Err(err) => Err(Failure::Lockkit(err)),
            },
            Err(err) => Err(Failure::Lockkit(err)),
        }
    };
    let worked = Panicked::catch(fenced).await;
    let ended = end_caught(level, began, Restore::Nothing, worked).await;
    ended.unwrap_or_else(|panicked| panicked.resume())
}

/// The database lease store on a diesel-async connection: the blocking side's
/// statements ([`LeaseStore`](crate::lease::LeaseStore)), awaited.
///
/// Sealed: implemented for `AsyncPgConnection`, `AsyncMysqlConnection` and
/// `SyncConnectionWrapper<SqliteConnection>`; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not store lockkit leases on diesel-async",
    label = "not an async lease store",
    note = "lockkit's async lease stores are `AsyncPgConnection`, `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (feature `async` with `postgres`, `mysql`, `sqlite`); pass a pooled connection as `&mut *conn`"
)]
pub trait AsyncLeaseStore: AsyncLockingConnection {
    /// Grants `name` to `token` for `ttl_ms` if nobody holds it; the new fence.
    #[doc(hidden)]
    fn grant(
        conn: &mut Self,
        name: &str,
        token: &str,
        ttl_ms: i64,
    ) -> impl Future<Output = Result<Option<i64>, Error>> + Send;
    /// Extends `name` by `ttl_ms` from now if `token` still holds it.
    #[doc(hidden)]
    fn extend(
        conn: &mut Self,
        name: &str,
        token: &str,
        ttl_ms: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    /// Releases `name` if `token` still holds it.
    #[doc(hidden)]
    fn revoke(
        conn: &mut Self,
        name: &str,
        token: &str,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
}

/// The statements behind [`fenced`] on a diesel-async connection: the blocking
/// side's ([`FenceStore`](crate::lease::FenceStore)), awaited. Sealed; name it
/// only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit's async fenced writes do not support `{Self}`",
    label = "not a connection lockkit's async fenced writes support",
    note = "lockkit supports `AsyncPgConnection`, `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (feature `async` with `postgres`, `mysql`, `sqlite`); pass a pooled connection as `&mut *conn`"
)]
pub trait AsyncFenceStore: AsyncLockingConnection {
    /// Raises the recorded fence of `resource` to `fence`; `Some(newer)` when
    /// it had seen a larger one (then nothing changed).
    #[doc(hidden)]
    fn raise(
        conn: &mut Self,
        resource: &str,
        fence: i64,
    ) -> impl Future<Output = Result<Option<i64>, Error>> + Send;
}

#[allow(unused_macros)] // used once per enabled backend
macro_rules! async_lease_store {
    ($conn:ty, $sql:ident) => {
        #[diagnostic::do_not_recommend]
        impl AsyncLeaseStore for $conn {
            async fn grant(
                conn: &mut Self,
                name: &str,
                token: &str,
                ttl_ms: i64,
            ) -> Result<Option<i64>, Error> {
                use diesel::OptionalExtension;
                use diesel_async::RunQueryDsl;
                let sql = &crate::lease::database::$sql;
                sql.ensure(name).execute(conn).await?;
                let granted = sql.grant(name, token, ttl_ms).execute(conn).await?;
                if granted == 0 {
                    return Ok(None);
                }
                Ok(sql
                    .read_fence(name, token)
                    .get_result::<crate::lease::database::FenceRow>(conn)
                    .await
                    .optional()?
                    .map(|row| row.fence))
            }

            async fn extend(
                conn: &mut Self,
                name: &str,
                token: &str,
                ttl_ms: i64,
            ) -> Result<bool, Error> {
                use diesel::OptionalExtension;
                use diesel_async::RunQueryDsl;
                let sql = &crate::lease::database::$sql;
                let rows = sql.extend(name, token, ttl_ms).execute(conn).await?;
                if rows == 1 {
                    return Ok(true);
                }
                // No row changed: lost, or (on a connection that reports
                // changed rows) renewed in the millisecond of the last renew.
                Ok(sql
                    .held(name, token)
                    .get_result::<crate::lease::database::FenceRow>(conn)
                    .await
                    .optional()?
                    .is_some())
            }

            async fn revoke(conn: &mut Self, name: &str, token: &str) -> Result<bool, Error> {
                use diesel_async::RunQueryDsl;
                let sql = &crate::lease::database::$sql;
                let rows = sql.revoke(name, token).execute(conn).await?;
                Ok(rows == 1)
            }
        }

        #[diagnostic::do_not_recommend]
        impl AsyncFenceStore for $conn {
            async fn raise(
                conn: &mut Self,
                resource: &str,
                fence: i64,
            ) -> Result<Option<i64>, Error> {
                use diesel_async::RunQueryDsl;
                let sql = &crate::lease::database::$sql;
                let (create, raise) = sql.raise(resource, fence);
                if let Some(create) = create {
                    create.execute(conn).await?;
                }
                if raise.execute(conn).await? == 1 {
                    return Ok(None);
                }
                let current = sql
                    .current_fence(resource)
                    .get_result::<crate::lease::database::FenceRow>(conn)
                    .await?;
                Ok(crate::lease::database::newer(current.fence, fence))
            }
        }
    };
}

#[cfg(feature = "postgres")]
async_lease_store!(diesel_async::AsyncPgConnection, POSTGRES);
#[cfg(feature = "mysql")]
async_lease_store!(diesel_async::AsyncMysqlConnection, MYSQL);
#[cfg(feature = "sqlite")]
async_lease_store!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    SQLITE
);
