//! Work queues with `FOR UPDATE SKIP LOCKED` on diesel-async: [`claim`], the
//! async twin of [`lockkit::queue::claim`](crate::queue::claim), with its
//! statement and its semantics (see [`lockkit::queue`](crate::queue)):
//!
//! ```sql
//! BEGIN;                                  -- SQLite: BEGIN IMMEDIATE
//! SELECT ... FROM jobs WHERE jobs.done = false ORDER BY jobs.id
//!  LIMIT $1 FOR UPDATE SKIP LOCKED;       -- SQLite: no clause
//! UPDATE jobs SET done = true WHERE id = $1; -- yours, one key at a time
//! COMMIT;
//! ```
//!
//! The claim belongs to the caller's transaction, typically
//! [`locked_transaction`](super::locked_transaction): mark the rows done in it,
//! and every row is processed exactly once. Outside a transaction `claim`
//! sends nothing and returns [`Error::NotInTransaction`]: in autocommit the
//! locks would end with the `SELECT`, before the work. On SQLite, which has no
//! row locks, the claim takes the database's write lock (`PRAGMA
//! incremental_vacuum(1)`) before it reads, so workers take turns.
//!
//! A future dropped mid-claim leaves its transaction open, like any other:
//! diesel-async's pools discard such a connection, closing the session, and
//! the rows become claimable again ([cancellation](super::connection#cancellation)).
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::LockOptions;
//! use lockkit::asynchronous::{locked_transaction, queue};
//! use diesel_async::RunQueryDsl;
//! # diesel::table! { jobs (id) { id -> Integer, done -> Bool } }
//! # async fn run() -> Result<(), lockkit::Error> {
//! # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
//! # conn.batch_execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, done BOOLEAN NOT NULL); INSERT INTO jobs VALUES (1, false), (2, false), (3, false)").await?;
//! let done = locked_transaction(&mut conn, LockOptions::default(), async |conn| {
//!     let ids: Vec<i32> = queue::claim(
//!         conn,
//!         jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id),
//!         2,
//!     )
//!     .await?;
//!     for id in &ids {
//!         diesel::update(jobs::table.find(id)).set(jobs::done.eq(true)).execute(conn).await?;
//!     }
//!     Ok::<_, lockkit::Error>(ids)
//! })
//! .await?;
//! assert_eq!(done, vec![1, 2]);
//!
//! let outside = queue::claim::<i32, _, _>(&mut conn, jobs::table.select(jobs::id), 1).await;
//! assert!(matches!(outside, Err(lockkit::Error::NotInTransaction)));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
//! ```

use diesel::dsl::Limit;
use diesel::query_dsl::methods::{LimitDsl, LockingDsl};
use diesel_async::methods::LoadQuery;
use diesel_async::RunQueryDsl;

use super::connection::{require_transaction, AsyncLockingConnection, Unsettled};
use crate::error::classification::classify;
use crate::error::Error;
use crate::metrics::LockWait;
use crate::pessimistic::row_lock::ForUpdateSkipLocked;
use crate::transaction::journal;

/// Claims up to `limit` rows of `query` that no other transaction holds, locking
/// them until the current transaction ends (`LIMIT n FOR UPDATE SKIP LOCKED`):
/// [`lockkit::queue::claim`](crate::queue::claim) on diesel-async.
///
/// Must run in a transaction. Give `query` an `ORDER BY` so that the oldest
/// work goes first. The claimed rows count as locks of table `queue` in the
/// [`metrics`](crate::metrics).
///
/// # Errors
///
/// As [`lockkit::queue::claim`](crate::queue::claim):
///
/// * [`Error::InvalidInput`] when `limit` is negative; nothing is sent.
/// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
/// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
///   transaction manager is broken (a dropped call's transaction may still be
///   open on the server); nothing is sent.
/// * [`Error::TransactionAborted`] when a statement you let go (a MariaDB
///   deadlock) has ended the transaction; nothing is sent, which on
///   MySQL/MariaDB would claim in autocommit and hold nothing.
/// * [`Error::Busy`] on SQLite when another connection holds the database's
///   write lock past the busy timeout.
/// * any other classified database error; see [`classify`](crate::classify()).
pub async fn claim<M, C, Q>(conn: &mut C, query: Q, limit: i64) -> Result<Vec<M>, Error>
where
    C: AsyncLockingConnection,
    Q: AsyncClaimQuery<C, M>,
    M: Send,
{
    crate::pessimistic::queue::check_limit(limit)?;
    require_transaction(conn)?;
    // As `lock_all`: no level of its own, so a claim dropped with a statement
    // in flight on MySQL/MariaDB marks the connection broken.
    let mut unsettled = Unsettled::until_replied(conn);
    let conn = &mut *unsettled.conn;
    let claimed = async {
        super::connection::require_live(conn).await?;
        // The claim is a read of lockkit's own: once it answered, the journal
        // is as sure as `require_live` left it.
        let before = journal::own_read(&mut journal::AsyncWatched(&mut *conn));
        let waited = LockWait::start();
        conn.take_write_lock().await?;
        let rows: Vec<M> = query
            .claim_statement(limit)
            .load(conn)
            .await
            .map_err(classify)?;
        journal::own_read_done(&mut journal::AsyncWatched(&mut *conn), before);
        waited.acquired("queue", rows.len());
        Ok(rows)
    }
    .await;
    unsettled.settled();
    claimed
}

/// A query [`claim`] can run on `Conn`, loading `M`s: any Diesel query that
/// takes `.limit(n)` and a row-lock clause, as on the blocking side
/// ([`ClaimQuery`](crate::queue::ClaimQuery)). Name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`queue::claim` cannot load `{M}` rows from this query on `{Conn}`",
    label = "not a query `queue::claim` can lock on this connection",
    note = "`claim` takes a Diesel select query (a table, `filter`, `order`, `select`) without `limit` or a lock clause of its own, whose rows load as the claimed type"
)]
pub trait AsyncClaimQuery<Conn: AsyncLockingConnection, M>: Sized {
    /// `<query> LIMIT $1 FOR UPDATE SKIP LOCKED` (SQLite: without the clause).
    type Claim: for<'q> LoadQuery<'q, Conn, M> + Send;

    /// Builds the claim's statement.
    fn claim_statement(self, limit: i64) -> Self::Claim;
}

impl<Q, M, C> AsyncClaimQuery<C, M> for Q
where
    C: AsyncLockingConnection,
    Q: LimitDsl,
    Limit<Q>: LockingDsl<ForUpdateSkipLocked>,
    C::Locked<Limit<Q>, ForUpdateSkipLocked>: for<'q> LoadQuery<'q, C, M> + Send,
{
    type Claim = C::Locked<Limit<Q>, ForUpdateSkipLocked>;

    fn claim_statement(self, limit: i64) -> Self::Claim {
        C::apply_lock(self.limit(limit), ForUpdateSkipLocked)
    }
}
