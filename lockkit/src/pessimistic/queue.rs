//! Work queues with `FOR UPDATE SKIP LOCKED`.
//!
//! Many workers claim rows from one table without waiting on each other: each
//! claims up to `n` rows that nobody else holds, processes them, marks them done
//! and commits. A crashed worker's transaction rolls back and its rows become
//! claimable again. Every row is marked done exactly once as long as "mark
//! done" happens in the claiming transaction; what the processing does outside
//! the database (an email, a call to another service) is done at least once: a
//! worker that crashes after it, before its `COMMIT`, leaves the row for the
//! next worker.
//!
//! ```sql
//! BEGIN;
//! SELECT ... FROM jobs WHERE jobs.done = false ORDER BY jobs.id LIMIT $1 FOR UPDATE SKIP LOCKED;
//! -- process, then, for each claimed row: UPDATE jobs SET done = true WHERE id = $1
//! COMMIT;
//! ```
//!
//! On MySQL/MariaDB, run the workers' transactions at READ COMMITTED (`SET
//! SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED` on each worker's
//! connection). Under InnoDB's default REPEATABLE READ a claim that reaches the
//! end of the pending rows also locks the gap after them, where every new row
//! is inserted: a producer's `INSERT` waits for the worker's whole batch (and
//! fails after `innodb_lock_wait_timeout`), and two workers that both enqueue
//! follow-up work may deadlock. PostgreSQL takes no such locks. (MySQL refuses
//! writes to InnoDB tables at READ COMMITTED when its binary log is in
//! `STATEMENT` format: use `ROW` or `MIXED`, the defaults of MySQL and MariaDB.)
//!
//! `SKIP LOCKED` needs PostgreSQL 9.5, MySQL 8.0 or MariaDB 10.6 or later; an
//! older server refuses the statement (a syntax error, [`Error::Database`]).
//!
//! Mark the claimed rows one primary key at a time (`WHERE id = ?`), as below. On
//! MySQL/MariaDB an `UPDATE ... WHERE id IN (..)` over a small table may be run as
//! a full scan, which under REPEATABLE READ locks every row it reads, including
//! rows another worker claimed: the workers then wait on or deadlock with each
//! other.
//!
//! A claim is a locked read: on a versioned table (`#[derive(Versioned)]`) it
//! leaves the version alone, unlike `with_lock` and `lock_all`. Mark claimed
//! rows of such a table with the model's versioned writes (`update_versioned`,
//! `update_by_version`): a plain `diesel::update` there is overwritten by a
//! struct read before the claim, whose version still matches.
//!
//! On SQLite, which has no row locks, the claim takes the database's write lock
//! ([`LockingConnection::take_write_lock`]) before it reads, so workers take turns,
//! which keeps exactly-once (without the parallelism), even in a plain deferred
//! `conn.transaction`. [`locked_transaction`](crate::locked_transaction) is the
//! transaction to use: its `BEGIN IMMEDIATE` takes the lock at once (and a
//! deferred transaction that read before claiming may find the lock taken by a
//! writer it cannot wait for: [`Error::Busy`]). In a deferred transaction the
//! lock taken is the `main` database's: workers whose connections have
//! different `main` files and claim from a table of an `ATTACH`ed database
//! take turns only in `locked_transaction`, whose `BEGIN IMMEDIATE` locks
//! every database attached.
//!
//! On diesel-async (feature `async`): `lockkit::asynchronous::queue::claim`, the
//! same statement.
//!
//! ```sql
//! PRAGMA incremental_vacuum(1);  -- SQLite only: takes the write lock, changes no data
//! SELECT ... FROM jobs WHERE jobs.done = false ORDER BY jobs.id LIMIT ?;
//! ```
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::{locked_transaction, queue, LockOptions};
//! # diesel::table! { jobs (id) { id -> Integer, done -> Bool } }
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE jobs (id INTEGER PRIMARY KEY, done BOOLEAN NOT NULL)").execute(&mut conn).unwrap();
//! # diesel::sql_query("INSERT INTO jobs VALUES (1, false), (2, false), (3, false)").execute(&mut conn).unwrap();
//! let done = locked_transaction(&mut conn, LockOptions::default(), |conn| {
//!     let ids: Vec<i32> = queue::claim(
//!         conn,
//!         jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id),
//!         2,
//!     )?;
//!     for id in &ids {
//!         diesel::update(jobs::table.find(id)).set(jobs::done.eq(true)).execute(conn)?;
//!     }
//!     Ok::<_, lockkit::Error>(ids)
//! })
//! .unwrap();
//! assert_eq!(done, vec![1, 2]);
//! ```

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

use diesel::dsl::Limit;
use diesel::query_dsl::methods::{LimitDsl, LockingDsl};
use diesel::query_dsl::LoadQuery;
use diesel::RunQueryDsl;

use crate::error::classification::classify;
use crate::error::Error;
use crate::metrics::LockWait;
use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
use crate::pessimistic::row_lock::ForUpdateSkipLocked;
use crate::transaction::{require_live, require_transaction_on};

/// Claims up to `limit` rows of `query` that no other transaction holds, locking
/// them until the current transaction ends (`LIMIT n FOR UPDATE SKIP LOCKED`).
///
/// Must run in a transaction: [`Error::NotInTransaction`] otherwise. Give `query`
/// an `ORDER BY` so that the oldest work goes first. The claimed rows count as
/// locks of table `queue` in the [`metrics`](crate::metrics).
///
/// # Errors
///
/// * [`Error::InvalidInput`] when `limit` is negative (SQLite would read it as
///   no limit); nothing is sent.
/// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
/// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
///   transaction manager is broken (a dropped call's transaction may still be
///   open on the server); nothing is sent.
/// * [`Error::TransactionAborted`] when a statement whose error the work let go
///   has ended the transaction (a deadlock on MySQL/MariaDB, seen by lockkit's
///   journal); nothing is sent, and later writes are kept out of autocommit.
/// * [`Error::Busy`] on SQLite when another connection holds the database's
///   write lock past the busy timeout.
/// * any other classified database error ([`Error::Deadlock`],
///   [`Error::ConnectionLost`], .., else [`Error::Database`]); see
///   [`classify`](crate::classify()).
pub fn claim<M, C, Q>(conn: &mut C, query: Q, limit: i64) -> Result<Vec<M>, Error>
where
    C: AsLockingConnection,
    Q: ClaimQuery<C::Conn, M>,
{
    check_limit(limit)?;
    let conn = conn.locking_connection();
    require_transaction_on(conn)?;
    // A statement that ended the transaction (a deadlock the caller let go,
    // MySQL/MariaDB): the claim would run in autocommit and hold nothing.
    require_live(conn)?;
    let waited = LockWait::start();
    conn.take_write_lock()?;
    // lockkit's own read, whose answer lockkit sees (SQLite's journal).
    let rows = crate::transaction::journal::own(conn, |conn| query.load_claimed(conn, limit))
        .map_err(classify)?;
    waited.acquired("queue", rows.len());
    Ok(rows)
}

/// A claim's `limit`, checked before anything is sent, blocking or async:
/// [`Error::InvalidInput`] when negative (SQLite reads a negative `LIMIT` as
/// none: one worker would claim the whole queue).
pub(crate) fn check_limit(limit: i64) -> Result<(), Error> {
    if limit < 0 {
        return Err(Error::InvalidInput("a claim limit is 0 or more"));
    }
    Ok(())
}

/// A query [`claim`] can run on `Conn`, loading `M`s: any Diesel query that
/// takes `.limit(n)` and a row-lock clause. Implemented for every such query on
/// each connection lockkit locks rows on; name it only in `where` clauses
/// ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "`queue::claim` cannot load `{M}` rows from this query on `{Conn}`",
    label = "not a query `queue::claim` can lock on this connection",
    note = "`claim` takes a Diesel select query (a table, `filter`, `order`, `select`) without `limit` or a lock clause of its own, whose rows load as the claimed type"
)]
pub trait ClaimQuery<Conn, M> {
    /// `<query> LIMIT $1 FOR UPDATE SKIP LOCKED`, loaded.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_claimed(self, conn: &mut Conn, limit: i64) -> diesel::QueryResult<Vec<M>>;
}

macro_rules! claim_query_on {
    ($($conn:ty: $feature:literal),*) => {$(
        #[cfg(feature = $feature)]
        impl<Q, M> ClaimQuery<$conn, M> for Q
        where
            Q: LimitDsl,
            Limit<Q>: LockingDsl<ForUpdateSkipLocked>,
            <$conn as LockingConnection>::Locked<Limit<Q>, ForUpdateSkipLocked>:
                for<'q> LoadQuery<'q, $conn, M>,
        {
            fn load_claimed(self, conn: &mut $conn, limit: i64) -> diesel::QueryResult<Vec<M>> {
                <$conn>::apply_lock(self.limit(limit), ForUpdateSkipLocked).load(conn)
            }
        }
    )*};
}

claim_query_on!(
    diesel::PgConnection: "postgres",
    diesel::MysqlConnection: "mysql",
    diesel::SqliteConnection: "sqlite"
);
