//! [`Router`]: read-your-writes over two r2d2 pools, a primary and a replica.

use std::ops::{Deref, DerefMut};

use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use diesel::PgConnection;

use super::route::skips_the_replica;
use super::{commit_lsn, route, Lsn, Policy, Route};
use crate::error::Error;
use crate::pessimistic::options::LockOptions;

/// An r2d2 pool of PostgreSQL connections.
pub type PgPool = Pool<ConnectionManager<PgConnection>>;
/// A connection from a [`PgPool`].
pub type PgPooled = PooledConnection<ConnectionManager<PgConnection>>;

/// Read-your-writes over a primary and a replica pool: [`write`](Router::write)
/// runs on the primary and returns the commit's position, [`read`](Router::read)
/// takes a connection to the replica or the primary as the [`Policy`] decides for
/// that position. Cheap to clone (the pools are).
///
/// ```no_run
/// use diesel::prelude::*;
/// use diesel::r2d2::{ConnectionManager, Pool};
/// use lockkit::replica::{Lsn, Policy, Router};
/// use std::time::Duration;
///
/// let pool = |url: &str| Pool::new(ConnectionManager::<PgConnection>::new(url)).unwrap();
/// let router = Router::new(
///     pool("postgres://app@primary/shop"),
///     pool("postgres://app@replica/shop"),
///     Policy::WaitThenPrimary(Duration::from_millis(200)),
/// );
///
/// // A request that writes: hand the position to the client (a cookie, a header).
/// let ((), written) = router
///     .write(|conn| {
///         diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(conn)?;
///         Ok::<_, lockkit::Error>(())
///     })
///     .unwrap();
/// let cookie = written.to_string();
///
/// // The client's next request: it sees its own write, wherever it reads.
/// let written: Option<Lsn> = cookie.parse().ok(); // a bad cookie: no position
/// let mut conn = router.read(written).unwrap();
/// let rows = diesel::sql_query("SELECT 1").execute(&mut *conn).unwrap();
/// # let _ = rows;
/// ```
#[derive(Clone)]
pub struct Router {
    primary: PgPool,
    replica: PgPool,
    policy: Policy,
}

impl Router {
    /// A router over these pools that applies `policy` to reads that carry a
    /// position.
    pub fn new(primary: PgPool, replica: PgPool, policy: Policy) -> Self {
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

    /// A connection to the primary: for writes whose position you take yourself
    /// ([`commit_lsn`] after the commit), and for every read that locks
    /// (`with_lock`, `lock_all`, `FOR UPDATE`), which a standby refuses
    /// ([`Error::ReadOnly`]).
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] when the pool has no connection to give.
    pub fn primary(&self) -> Result<PgPooled, Error> {
        Ok(self.primary.get()?)
    }

    /// Runs `work` in a transaction on the primary, commits it, and returns its
    /// result with the commit's position ([`commit_lsn`]): pass the position to
    /// the reads that must see this write. A rolled-back `work` returns its error
    /// and no position. The transaction is lockkit's
    /// ([`locked_transaction`](crate::locked_transaction)): a panic in `work`
    /// rolls it back, and a transaction the server aborted (a statement failed
    /// and `work` let the error go, so PostgreSQL answers `COMMIT` with
    /// `ROLLBACK`) is an error, not a position for a write that never happened.
    ///
    /// # Errors
    ///
    /// * whatever `work` returns; [`Error::Pool`]; a classified error from
    ///   `BEGIN`, or the server's refusal of `COMMIT`: nothing was written.
    ///   [`Error::ConnectionLost`] at `COMMIT` is the exception, as everywhere:
    ///   the write may have committed, and no position comes with it. Re-read
    ///   on the primary before running `work` again, or make it idempotent
    ///   (idempotency keys, feature `idempotency`).
    /// * a classified error from the position's read, after the write
    ///   committed: where `work`'s connection cannot read it, another
    ///   connection to the primary does (any position read after the `COMMIT`
    ///   covers it), and this is that one's error too. Do not run `work` again.
    pub fn write<T, E>(
        &self,
        work: impl FnOnce(&mut PgConnection) -> Result<T, E>,
    ) -> Result<(T, Lsn), E>
    where
        E: From<Error>,
    {
        let mut pooled = self.primary().map_err(E::from)?;
        let conn: &mut PgConnection = &mut pooled;
        let out = crate::locked_transaction(conn, LockOptions::default(), work)?;
        let written = match commit_lsn(conn) {
            Ok(written) => written,
            Err(err) if !super::position::committed_elsewhere(&err) => return Err(E::from(err)),
            Err(err) => {
                // Given back to the pool, which discards it (a pool of one
                // has no other, and this one cannot read the position).
                use diesel::connection::{Connection, TransactionManager};
                <PgConnection as Connection>::TransactionManager::transaction_manager_status_mut(
                    conn,
                )
                .set_in_error();
                drop(pooled);
                super::position::read_elsewhere(err, || {
                    self.primary().and_then(|mut other| commit_lsn(&mut other))
                })?
            }
        };
        Ok((out, written))
    }

    /// A connection for a read that must see everything up to `written` (the
    /// position of this client's last write; `None` if it has none): the replica
    /// when it has replayed that far, else as the [`Policy`] says (see [`route`]).
    /// The [`RoutedConnection`] tells where it went.
    ///
    /// # Errors
    ///
    /// [`Error::ReplicaBehind`] from [`Policy::WaitOrFail`]; [`Error::Pool`] when
    /// a pool has no connection to give; the replica's connection errors.
    pub fn read(&self, written: Option<Lsn>) -> Result<RoutedConnection, Error> {
        if let Some(route) = skips_the_replica(written, self.policy) {
            return Ok(RoutedConnection {
                conn: self.primary()?,
                route,
            });
        }
        let mut replica = self.replica.get()?;
        let route = route(&mut replica, written, self.policy)?;
        let conn = if route.is_replica() {
            replica
        } else {
            drop(replica);
            self.primary()?
        };
        Ok(RoutedConnection { conn, route })
    }
}

/// A pooled connection chosen by [`Router::read`]: use it as a `PgConnection`
/// (`&mut *conn`); [`route`](RoutedConnection::route) tells where it goes.
pub struct RoutedConnection {
    conn: PgPooled,
    route: Route,
}

impl RoutedConnection {
    /// Where the read goes, and why.
    pub fn route(&self) -> Route {
        self.route
    }
}

impl Deref for RoutedConnection {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl DerefMut for RoutedConnection {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}
