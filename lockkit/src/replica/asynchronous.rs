//! Read-your-writes on diesel-async (features `replica` and `async`):
//! [`commit_lsn`], [`replayed_lsn`] and [`route`] on an `AsyncPgConnection`,
//! and [`Router`] over a primary and a replica pool of bb8 (feature `bb8`) or
//! deadpool (feature `deadpool`).
//!
//! The blocking functions' twins: the same statements, the same [`Policy`],
//! the same [`Route`] values and the same errors, decided by the same code;
//! only the execution differs. A waiting [`route`] pauses with tokio's timer
//! (1 to 20 ms between two looks at the replica), never blocking the thread,
//! so other tasks run while a read waits for the replica. Connections of
//! diesel-async's bb8 and deadpool pools are passed as `&mut *conn`.
//!
//! ```no_run
//! use std::time::Duration;
//! use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
//! use lockkit::replica::asynchronous as replica;
//! use lockkit::replica::{Lsn, Policy};
//!
//! # async fn handler() -> Result<(), Box<dyn std::error::Error>> {
//! let mut primary = AsyncPgConnection::establish("postgres://app@primary/shop").await?;
//! let mut standby = AsyncPgConnection::establish("postgres://app@replica/shop").await?;
//!
//! // The write, committed; then its position, for the client.
//! diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1")
//!     .execute(&mut primary)
//!     .await?;
//! let token = replica::commit_lsn(&mut primary).await?.to_string();
//!
//! // The client's next request brings the token back.
//! let written = token.parse::<Lsn>().ok();
//! let policy = Policy::WaitThenPrimary(Duration::from_millis(100));
//! let route = replica::route(&mut standby, written, policy).await?;
//! let conn = if route.is_replica() { &mut standby } else { &mut primary };
//! # let _ = conn;
//! # Ok(())
//! # }
//! ```
//!
//! # Cancellation
//!
//! None of the three opens a transaction: a dropped [`route`] future (a
//! `tokio::time::timeout` around it) leaves no transaction open on the
//! connection, and the pause it was in ends with it.

use std::future::Future;
use std::ops::{Deref, DerefMut};

use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::position::{Position, COMMIT_LSN, REPLAYED_LSN};
use super::route::{skips_the_replica, Routing, Step};
use super::{Lsn, Policy, Route};
use crate::asynchronous::locked_transaction;
use crate::asynchronous::work::ConnWork;
use crate::error::{Error, Result};
use crate::pessimistic::options::LockOptions;

/// The position on the primary a replica must have replayed to show everything
/// committed on `primary` so far: call it right after the write's transaction
/// committed. The async twin of [`replica::commit_lsn`](super::commit_lsn),
/// which says which position it takes and why.
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] when a transaction is open on `primary`;
///   [`Error::Database`]`(BrokenTransactionManager)` when it is marked broken.
/// * [`Error::Database`] when `primary` is a standby itself.
pub async fn commit_lsn(primary: &mut AsyncPgConnection) -> Result<Lsn> {
    crate::asynchronous::connection::refuse_transaction_or_broken(primary)?;
    diesel::sql_query(COMMIT_LSN)
        .get_result::<Position>(primary)
        .await?
        .committed()
}

/// How far `replica` has replayed the primary's WAL; `None` when it is not a
/// standby. The async twin of [`replica::replayed_lsn`](super::replayed_lsn),
/// whose example compares it with a write's position
/// (`replayed_lsn(&mut replica).await` here).
pub async fn replayed_lsn(replica: &mut AsyncPgConnection) -> Result<Option<Lsn>> {
    diesel::sql_query(REPLAYED_LSN)
        .get_result::<Position>(replica)
        .await?
        .replayed()
}

/// Decides where a read that must see everything up to `written` goes, asking
/// `replica` how far it has replayed and waiting as `policy` allows, with
/// `tokio::time::sleep` between two looks. The async twin of
/// [`replica::route`](super::route()): the same steps, the same answers.
///
/// Needs a tokio runtime with its timer enabled (`enable_time`, which
/// `#[tokio::main]` turns on) when it waits.
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] when a transaction is open on `replica`
///   and the replica is to be looked at, as [`replica::route`](super::route());
///   nothing is sent. `BrokenTransactionManager` when it is marked broken (a
///   call dropped in a transaction there).
/// * [`Error::ReplicaBehind`] when the wait of [`Policy::WaitOrFail`] ran out.
/// * the errors of the replica's connection.
pub async fn route(
    replica: &mut AsyncPgConnection,
    written: Option<Lsn>,
    policy: Policy,
) -> Result<Route> {
    let mut routing = match Routing::start(written, policy) {
        Ok(routing) => routing,
        Err(route) => return Ok(route),
    };
    crate::asynchronous::connection::refuse_transaction_or_broken(replica)?;
    loop {
        match routing.look(replayed_lsn(replica).await?) {
            Step::Done(decided) => return decided,
            Step::Pause(pause) => tokio::time::sleep(pause).await,
        }
    }
}

/// A diesel-async pool of `AsyncPgConnection`s that a [`Router`] takes
/// connections from: diesel-async's bb8 `Pool` (feature `bb8`) and deadpool
/// `Pool` (feature `deadpool`).
///
/// Sealed; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "the async replica `Router` does not take connections from `{Self}`",
    label = "not a diesel-async pool of `AsyncPgConnection`s",
    note = "the async `Router` takes diesel-async's bb8 `Pool<AsyncPgConnection>` (feature `bb8`) or deadpool `Pool<AsyncPgConnection>` (feature `deadpool`)"
)]
pub trait AsyncPgPool: Clone + Send + Sync + crate::sealed::Sealed + 'static {
    /// The pool's connection, used as an `AsyncPgConnection` (`&mut *conn`);
    /// dropping it gives it back.
    type Connection: DerefMut<Target = AsyncPgConnection> + Send + 'static;

    /// A connection from the pool.
    ///
    /// # Errors
    ///
    /// [`Error::AsyncPool`] when the pool has none to give (its timeout ran
    /// out, or the server could not be reached).
    fn connection(&self) -> impl Future<Output = Result<Self::Connection>> + Send;
}

#[cfg(feature = "bb8")]
impl crate::sealed::Sealed for diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection> {}

#[cfg(feature = "bb8")]
#[cfg_attr(docsrs, doc(cfg(feature = "bb8")))]
impl AsyncPgPool for diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection> {
    type Connection =
        diesel_async::pooled_connection::bb8::PooledConnection<'static, AsyncPgConnection>;

    async fn connection(&self) -> Result<Self::Connection> {
        self.get_owned()
            .await
            .map_err(|err| Error::AsyncPool(Box::new(err)))
    }
}

#[cfg(feature = "deadpool")]
impl crate::sealed::Sealed for diesel_async::pooled_connection::deadpool::Pool<AsyncPgConnection> {}

#[cfg(feature = "deadpool")]
#[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
impl AsyncPgPool for diesel_async::pooled_connection::deadpool::Pool<AsyncPgConnection> {
    type Connection = diesel_async::pooled_connection::deadpool::Object<AsyncPgConnection>;

    async fn connection(&self) -> Result<Self::Connection> {
        self.get()
            .await
            .map_err(|err| Error::AsyncPool(Box::new(err)))
    }
}

/// Read-your-writes over a primary and a replica pool of diesel-async: the
/// async twin of the r2d2 [`Router`](super::Router), with the same decisions
/// (which reads skip the replica, [`route`] for the others). [`write`](Router::write)
/// runs on the primary and returns the commit's position, [`read`](Router::read)
/// takes a connection to the replica or the primary as the [`Policy`] decides
/// for that position. Over bb8 (feature `bb8`) or deadpool (feature
/// `deadpool`) pools; cheap to clone (the pools are).
///
/// ```no_run
/// # #[cfg(feature = "bb8")]
/// # async fn handler() -> Result<(), lockkit::Error> {
/// use std::time::Duration;
/// use diesel_async::pooled_connection::bb8::Pool;
/// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
/// use diesel_async::{AsyncPgConnection, RunQueryDsl};
/// use lockkit::replica::asynchronous::Router;
/// use lockkit::replica::{Lsn, Policy};
///
/// let pool = |url: &str| {
///     Pool::builder().build_unchecked(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url))
/// };
/// let router = Router::new(
///     pool("postgres://app@primary/shop"),
///     pool("postgres://app@replica/shop"),
///     Policy::WaitThenPrimary(Duration::from_millis(200)),
/// );
///
/// // A request that writes: hand the position to the client (a cookie, a header).
/// let ((), written) = router
///     .write(async |conn| {
///         diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(conn).await?;
///         Ok::<_, lockkit::Error>(())
///     })
///     .await?;
/// let cookie = written.to_string();
///
/// // The client's next request: it sees its own write, wherever it reads.
/// let written: Option<Lsn> = cookie.parse().ok(); // a bad cookie: no position
/// let mut conn = router.read(written).await?; // conn.route() says where and why
/// diesel::sql_query("SELECT 1").execute(&mut *conn).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Router<P> {
    primary: P,
    replica: P,
    policy: Policy,
}

impl<P: AsyncPgPool> Router<P> {
    /// A router over these pools that applies `policy` to reads that carry a
    /// position.
    pub fn new(primary: P, replica: P, policy: Policy) -> Self {
        Router {
            primary,
            replica,
            policy,
        }
    }

    /// The policy reads follow.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// A connection to the primary: for writes whose position you take
    /// yourself ([`commit_lsn`] after the commit), and for every read that locks
    /// (`with_lock`, `lock_all`, `FOR UPDATE`), which a standby refuses
    /// ([`Error::ReadOnly`]).
    ///
    /// # Errors
    ///
    /// [`Error::AsyncPool`] when the pool has no connection to give.
    pub async fn primary(&self) -> Result<P::Connection> {
        self.primary.connection().await
    }

    /// Runs `work` in a transaction on the primary, commits it, and returns
    /// its result with the commit's position ([`commit_lsn`]): pass the
    /// position to the reads that must see this write. A rolled-back `work`
    /// returns its error and no position. `work` is an `async` closure.
    ///
    /// # Errors
    ///
    /// * whatever `work` returns; [`Error::AsyncPool`]; a classified error
    ///   from `BEGIN`, or the server's refusal of `COMMIT`: nothing was
    ///   written. [`Error::ConnectionLost`] at `COMMIT` is the exception, as
    ///   everywhere: the write may have committed, and no position comes with
    ///   it. Re-read on the primary before running `work` again.
    /// * a classified error from the position's read, after the write
    ///   committed: where `work`'s connection cannot read it, another
    ///   connection to the primary does (any position read after the `COMMIT`
    ///   covers it), and this is that one's error too. Do not run `work` again.
    pub async fn write<T, E, F>(&self, work: F) -> std::result::Result<(T, Lsn), E>
    where
        E: From<Error> + Send,
        T: Send,
        F: ConnWork<AsyncPgConnection, T, E>,
    {
        let mut pooled = self.primary().await.map_err(E::from)?;
        let conn: &mut AsyncPgConnection = &mut pooled;
        let out = locked_transaction(conn, LockOptions::default(), work).await?;
        let written = match commit_lsn(conn).await {
            Ok(written) => written,
            Err(err) if !super::position::committed_elsewhere(&err) => return Err(E::from(err)),
            Err(err) => {
                // Given back to the pool, which discards it (a pool of one
                // has no other, and this one cannot read the position).
                use diesel_async::{AsyncConnection, TransactionManager};
                <AsyncPgConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(conn)
                    .set_in_error();
                drop(pooled);
                let other = match self.primary().await {
                    Ok(mut other) => commit_lsn(&mut other).await,
                    Err(pool) => Err(pool),
                };
                super::position::read_elsewhere(err, || other)?
            }
        };
        Ok((out, written))
    }

    /// A connection for a read that must see everything up to `written` (the
    /// position of this client's last write; `None` if it has none): the
    /// replica when it has replayed that far, else as the [`Policy`] says (see
    /// [`route`]). The [`RoutedConnection`] tells where it went.
    ///
    /// # Errors
    ///
    /// [`Error::ReplicaBehind`] from [`Policy::WaitOrFail`]; [`Error::AsyncPool`]
    /// when a pool has no connection to give; the replica's connection errors.
    pub async fn read(&self, written: Option<Lsn>) -> Result<RoutedConnection<P::Connection>> {
        if let Some(route) = skips_the_replica(written, self.policy) {
            return Ok(RoutedConnection {
                conn: self.primary().await?,
                route,
            });
        }
        let mut replica = self.replica.connection().await?;
        let route = route(&mut replica, written, self.policy).await?;
        let conn = if route.is_replica() {
            replica
        } else {
            drop(replica);
            self.primary().await?
        };
        Ok(RoutedConnection { conn, route })
    }
}

/// A pooled connection chosen by [`Router::read`]: use it as an
/// `AsyncPgConnection` (`&mut *conn`); [`route`](RoutedConnection::route)
/// tells where it goes.
pub struct RoutedConnection<C> {
    conn: C,
    route: Route,
}

impl<C> RoutedConnection<C> {
    /// Where the read goes, and why.
    pub fn route(&self) -> Route {
        self.route
    }
}

impl<C: DerefMut<Target = AsyncPgConnection>> Deref for RoutedConnection<C> {
    type Target = AsyncPgConnection;

    fn deref(&self) -> &AsyncPgConnection {
        &self.conn
    }
}

impl<C: DerefMut<Target = AsyncPgConnection>> DerefMut for RoutedConnection<C> {
    fn deref_mut(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }
}
