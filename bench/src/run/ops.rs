//! Every operation of every workload, written once and instantiated per backend.
//!
//! Diesel checks query types per backend, so (as in `examples/shop`) the code is
//! a macro, [`bench_backend!`], instantiated for `PgConnection`,
//! `MysqlConnection` and `SqliteConnection`; inside it `Conn` is that type. The
//! only per-backend differences are the DDL, the session settings and, for the
//! hand-written SQL, whether the backend has row locks: SQLite has none, so its
//! hand-written "lock" is `BEGIN IMMEDIATE` (which is what lockkit does there).
//!
//! Each operation counts what it saw (attempts, stale writes, busy rows,
//! deadlocks) in the worker's [`WorkerState`] and returns how many units it
//! completed: 1 for an update, the number of jobs for a queue claim (0: drained),
//! the number of order lines for an order.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::r2d2::R2D2Connection;
use diesel::QueryResult;

use crate::run::check::Tally;
use crate::run::worker::{OpError, WorkerState};
use crate::{Backend, Case};

/// A connection type the benchmark runs on; implemented by [`bench_backend!`].
pub trait BenchConnection: R2D2Connection + SimpleConnection + Send + 'static {
    /// Which backend this is.
    const BACKEND: Backend;
    /// Session settings for every connection.
    fn configure_session(&mut self, session: Session) -> QueryResult<()>;
    /// Creates the tables.
    fn create_schema(&mut self) -> QueryResult<()>;
    /// Empties `items` and inserts the hot row, the workers' rows and the order
    /// items, each with [`INITIAL_STOCK`](crate::INITIAL_STOCK).
    fn reset_items(&mut self) -> QueryResult<()>;
    /// Empties `jobs` and enqueues `count` jobs (ids `1..=count`). No `ANALYZE`:
    /// with every job pending, statistics make `done = ?` look unselective, and the
    /// planners then walk the primary key past every finished job on each claim
    /// instead of using `jobs_pending (done, id)`.
    fn reset_jobs(&mut self, count: i32) -> QueryResult<()>;
    /// Per-worker setup before the start line (loads the worker's own row).
    fn prepare_worker(&mut self, case: &Case, st: &mut WorkerState) -> QueryResult<()>;
    /// One operation of `case`; see the [module docs](self).
    fn op(&mut self, case: &Case, st: &mut WorkerState) -> Result<usize, OpError>;
    /// What the tables hold now.
    fn tally(&mut self) -> QueryResult<Tally>;
}

/// The backoff of the hand-written retry loop: the same schedule as
/// `RetryPolicy::default()` (full jitter, 10 ms doubling up to 1 s), written
/// without lockkit.
pub fn hand_backoff(rng: &mut fastrand::Rng, failed_attempt: u32) -> Duration {
    let ceiling = Duration::from_millis(10)
        .saturating_mul(1u32 << failed_attempt.saturating_sub(1).min(31))
        .min(Duration::from_secs(1));
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..=nanos))
}

/// The versioned `UPDATE` as a hand-built statement that Diesel may cache.
///
/// Diesel 2.3 marks every `UpdateStatement` unsafe to cache (a changeset with
/// `Option` fields changes its SQL from call to call), so each `UPDATE` it runs,
/// lockkit's and hand-written alike, is prepared anew: SQLite compiles it again,
/// PostgreSQL parses and plans it again (unnamed statement), MySQL spends a
/// prepare round trip on it. This fragment renders the same statement with a static
/// query id and no such mark, to measure what caching would save.
#[derive(Debug, Clone, diesel::query_builder::QueryId)]
pub struct CacheableVersionedUpdate {
    /// New name.
    pub name: String,
    /// New stock.
    pub stock: i32,
    /// Primary key.
    pub id: i32,
    /// The version read.
    pub version: i32,
}

impl<DB> diesel::query_builder::QueryFragment<DB> for CacheableVersionedUpdate
where
    DB: diesel::backend::Backend
        + diesel::sql_types::HasSqlType<diesel::sql_types::Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Integer>,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
    i32: diesel::serialize::ToSql<diesel::sql_types::Integer, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Integer, Text};
        out.push_sql("UPDATE items SET name = ");
        out.push_bind_param::<Text, _>(&self.name)?;
        out.push_sql(", stock = ");
        out.push_bind_param::<Integer, _>(&self.stock)?;
        out.push_sql(", lock_version = lock_version + 1 WHERE id = ");
        out.push_bind_param::<Integer, _>(&self.id)?;
        out.push_sql(" AND lock_version = ");
        out.push_bind_param::<Integer, _>(&self.version)?;
        Ok(())
    }
}

/// The hand-written retry loop's attempts: those of `RetryPolicy::default()`.
pub const HAND_ATTEMPTS: u32 = 5;

/// What the session settings of every benchmark connection depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    /// `--durable`: PostgreSQL sessions commit durably (`synchronous_commit = on`).
    pub durable: bool,
}

/// PostgreSQL: asynchronous commit unless `--durable` (the server's own setting is
/// reported), and a lock timeout as a safety bound.
fn postgres_session(conn: &mut diesel::PgConnection, session: Session) -> QueryResult<()> {
    let commit = if session.durable { "on" } else { "off" };
    conn.batch_execute(&format!(
        "SET synchronous_commit = {commit}; SET lock_timeout = '10s';"
    ))
}

/// MariaDB/MySQL: a lock wait timeout as a safety bound.
fn mysql_session(conn: &mut diesel::MysqlConnection, _: Session) -> QueryResult<()> {
    conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 10;")
}

/// SQLite: writers wait for the write lock (up to 5 s) instead of failing at
/// once; WAL with `synchronous = NORMAL` (no fsync per commit).
fn sqlite_session(conn: &mut diesel::SqliteConnection, _: Session) -> QueryResult<()> {
    conn.batch_execute("PRAGMA busy_timeout = 5000; PRAGMA synchronous = NORMAL;")
}

/// `q.for_update()` where the backend has row locks; SQLite: `q`.
macro_rules! for_update {
    (yes, $q:expr) => {
        $q.for_update()
    };
    (no, $q:expr) => {
        $q
    };
}

/// `q.for_update().skip_locked()` where the backend has row locks; SQLite: `q`.
macro_rules! skip_locked {
    (yes, $q:expr) => {
        $q.for_update().skip_locked()
    };
    (no, $q:expr) => {
        $q
    };
}

/// A transaction fit for a write: `BEGIN` on the servers, `BEGIN IMMEDIATE` on
/// SQLite (which takes the write lock first, as lockkit does).
macro_rules! write_transaction {
    (yes, $conn:expr, $f:expr) => {
        $conn.transaction($f)
    };
    (no, $conn:expr, $f:expr) => {
        $conn.immediate_transaction($f)
    };
}

/// Writes the workloads for one connection type. See the [module docs](self).
macro_rules! bench_backend {
    (
        $(#[$meta:meta])*
        mod $module:ident {
            connection: $conn:ty,
            backend: $backend:expr,
            row_locks: $locks:tt,
            session: $session:path,
            schema: $schema:expr,
            truncate_items: $truncate_items:expr,
            truncate_jobs: $truncate_jobs:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        mod $module {
            use diesel::connection::SimpleConnection;
            use diesel::prelude::*;
            use lockkit::prelude::*;
            use lockkit::LockOptions;

            use super::{hand_backoff, BenchConnection, HAND_ATTEMPTS};
            use crate::run::check::Tally;
            use crate::run::worker::{OpError, WorkerState};
            use crate::vocabulary::schema::{items, jobs, Item, NewItem, NewJob};
            use crate::{
                Backend, Case, Flavor, Strategy, Workload, HOT_ID, INITIAL_STOCK, MAX_WORKERS,
                ORDER_ITEMS, ORDER_ITEM_BASE, OWN_BASE,
            };

            /// The connection type of this instantiation.
            type Conn = $conn;

            impl BenchConnection for Conn {
                const BACKEND: Backend = $backend;

                fn configure_session(&mut self, session: super::Session) -> QueryResult<()> {
                    $session(self, session)
                }

                fn create_schema(&mut self) -> QueryResult<()> {
                    self.batch_execute($schema)
                }

                fn reset_items(&mut self) -> QueryResult<()> {
                    self.batch_execute($truncate_items)?;
                    let item = |id: i32| NewItem {
                        id,
                        name: format!("item {id}"),
                        stock: INITIAL_STOCK,
                        lock_version: 0,
                    };
                    let mut rows = vec![item(HOT_ID)];
                    rows.extend((0..ORDER_ITEMS).map(|i| item(ORDER_ITEM_BASE + i)));
                    rows.extend((0..MAX_WORKERS as i32).map(|i| item(OWN_BASE + i)));
                    diesel::insert_into(items::table).values(&rows).execute(self)?;
                    Ok(())
                }

                fn reset_jobs(&mut self, count: i32) -> QueryResult<()> {
                    self.batch_execute($truncate_jobs)?;
                    let all: Vec<NewJob> =
                        (1..=count).map(|id| NewJob { id, done: false }).collect();
                    self.transaction(|conn| {
                        for chunk in all.chunks(1000) {
                            diesel::insert_into(jobs::table).values(chunk).execute(conn)?;
                        }
                        Ok::<_, diesel::result::Error>(())
                    })
                }

                fn prepare_worker(&mut self, case: &Case, st: &mut WorkerState) -> QueryResult<()> {
                    if case.workload == Workload::Uncontended {
                        let id = OWN_BASE + st.index as i32;
                        st.own = Some(
                            items::table.find(id).select(Item::as_select()).get_result(self)?,
                        );
                    }
                    Ok(())
                }

                fn op(&mut self, case: &Case, st: &mut WorkerState) -> Result<usize, OpError> {
                    match (case.strategy, case.flavor) {
                        (Strategy::Versioned, Flavor::Lockkit) => versioned(self, st),
                        (Strategy::Versioned, Flavor::Hand) => versioned_hand(self, st),
                        (Strategy::Versioned, Flavor::HandCached) => versioned_cacheable(self, st),
                        (Strategy::Naive, _) => naive(self, st),
                        (_, Flavor::HandCached) => Err(OpError::Other(
                            "no cacheable twin for this strategy".into(),
                        )),
                        (Strategy::Optimistic, Flavor::Lockkit) => optimistic(self, st),
                        (Strategy::Optimistic, Flavor::Hand) => optimistic_hand(self, st),
                        (Strategy::WithLock, Flavor::Lockkit) => with_lock(self, st),
                        (Strategy::WithLock, Flavor::Hand) => with_lock_hand(self, st),
                        (Strategy::Nowait, _) => nowait(self, st),
                        (Strategy::Atomic, Flavor::Lockkit) => atomic(self, st),
                        (Strategy::Atomic, Flavor::Hand) => atomic_hand(self, st),
                        (Strategy::Claim, Flavor::Lockkit) => claim(self, case.batch, st),
                        (Strategy::Claim, Flavor::Hand) => claim_hand(self, case.batch, st),
                        (Strategy::NaiveOrder, _) => naive_order(self, st),
                        (Strategy::LockAll, _) => lock_all(self, st),
                    }
                }

                fn tally(&mut self) -> QueryResult<Tally> {
                    let rows: Vec<Item> =
                        items::table.order(items::id).select(Item::as_select()).load(self)?;
                    let jobs_done: i64 =
                        jobs::table.filter(jobs::done.eq(true)).count().get_result(self)?;
                    Ok(Tally::from_rows(&rows, jobs_done))
                }
            }

            /// Runs one attempt of a lockkit operation and counts what it saw.
            fn attempt<T>(
                st: &mut WorkerState,
                f: impl FnOnce(&mut WorkerState) -> Result<T, lockkit::Error>,
            ) -> Result<T, lockkit::Error> {
                st.counts.attempts += 1;
                let result = f(st);
                if let Err(err) = &result {
                    st.counts.saw(err);
                }
                result
            }

            // --- 1. uncontended ------------------------------------------------

            /// `item.update_versioned(conn)` on the worker's own row.
            fn versioned(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let item = st.own.as_mut().expect("own row loaded");
                item.stock -= 1;
                if let Err(err) = item.update_versioned(conn) {
                    item.stock += 1;
                    st.counts.saw(&err);
                    return Err(OpError::Lockkit(err));
                }
                Ok(1)
            }

            /// The same statement by hand: `UPDATE .. SET name, stock,
            /// lock_version = lock_version + 1 WHERE id = ? AND lock_version = ?`,
            /// with its own row-count check.
            fn versioned_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let item = st.own.as_mut().expect("own row loaded");
                let rows = diesel::update(
                    items::table
                        .filter(items::id.eq(item.id))
                        .filter(items::lock_version.eq(item.lock_version)),
                )
                .set((
                    items::name.eq(&item.name),
                    items::stock.eq(item.stock - 1),
                    items::lock_version.eq(items::lock_version + 1),
                ))
                .execute(conn)?;
                if rows != 1 {
                    st.counts.stale += 1;
                    return Err(OpError::Other("stale write".into()));
                }
                item.stock -= 1;
                item.lock_version += 1;
                Ok(1)
            }

            /// The same statement as [`CacheableVersionedUpdate`](super::CacheableVersionedUpdate),
            /// which Diesel caches.
            fn versioned_cacheable(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let item = st.own.as_mut().expect("own row loaded");
                let statement = super::CacheableVersionedUpdate {
                    name: item.name.clone(),
                    stock: item.stock - 1,
                    id: item.id,
                    version: item.lock_version,
                };
                let rows = diesel::query_dsl::methods::ExecuteDsl::execute(statement, conn)?;
                if rows != 1 {
                    st.counts.stale += 1;
                    return Err(OpError::Other("stale write".into()));
                }
                item.stock -= 1;
                item.lock_version += 1;
                Ok(1)
            }

            // --- 2. hot row ----------------------------------------------------

            /// Read, then write what was read minus one: loses updates.
            fn naive(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let stock: i32 = items::table
                    .find(HOT_ID)
                    .select(items::stock)
                    .get_result(conn)?;
                diesel::update(items::table.find(HOT_ID))
                    .set(items::stock.eq(stock - 1))
                    .execute(conn)?;
                Ok(1)
            }

            /// Read, `update_versioned`, `lockkit::retry` on `Stale`.
            fn optimistic(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let policy = st.policy.clone();
                lockkit::retry(&policy, |_| {
                    attempt(st, |_| {
                        let mut item: Item = items::table
                            .find(HOT_ID)
                            .select(Item::as_select())
                            .get_result(conn)?;
                        item.stock -= 1;
                        item.update_versioned(conn)
                    })
                })?;
                Ok(1)
            }

            /// The same by hand: read, version-checked `UPDATE` with its own
            /// row-count check, and a retry loop with the same backoff.
            fn optimistic_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let mut failed = 0;
                loop {
                    st.counts.attempts += 1;
                    let item: Item = items::table
                        .find(HOT_ID)
                        .select(Item::as_select())
                        .get_result(conn)?;
                    let rows = diesel::update(
                        items::table
                            .filter(items::id.eq(item.id))
                            .filter(items::lock_version.eq(item.lock_version)),
                    )
                    .set((
                        items::name.eq(&item.name),
                        items::stock.eq(item.stock - 1),
                        items::lock_version.eq(items::lock_version + 1),
                    ))
                    .execute(conn)?;
                    if rows == 1 {
                        return Ok(1);
                    }
                    st.counts.stale += 1;
                    failed += 1;
                    if failed >= HAND_ATTEMPTS {
                        return Err(OpError::GaveUp);
                    }
                    std::thread::sleep(hand_backoff(&mut st.rng, failed));
                }
            }

            /// `lockkit::with_lock`: `SELECT .. FOR UPDATE`, write, commit.
            fn with_lock(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                attempt(st, |_| {
                    lockkit::with_lock(conn, HOT_ID, |conn, item: Item| {
                        diesel::update(items::table.find(item.id))
                            .set(items::stock.eq(item.stock - 1))
                            .execute(conn)?;
                        Ok(())
                    })
                })?;
                Ok(1)
            }

            /// The same by hand: a transaction, `SELECT .. FOR UPDATE`, write.
            fn with_lock_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                write_transaction!($locks, conn, |conn: &mut Conn| {
                    let item: Item = for_update!(
                        $locks,
                        items::table.find(HOT_ID).select(Item::as_select())
                    )
                    .get_result(conn)?;
                    diesel::update(items::table.find(item.id))
                        .set(items::stock.eq(item.stock - 1))
                        .execute(conn)?;
                    Ok::<_, diesel::result::Error>(())
                })?;
                Ok(1)
            }

            /// `with_lock_opts(.., nowait())` inside `lockkit::retry`.
            fn nowait(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let policy = st.policy.clone();
                lockkit::retry(&policy, |_| {
                    attempt(st, |_| {
                        lockkit::with_lock_opts(
                            conn,
                            HOT_ID,
                            LockOptions::default().nowait(),
                            |conn, item: Item| {
                                diesel::update(items::table.find(item.id))
                                    .set(items::stock.eq(item.stock - 1))
                                    .execute(conn)?;
                                Ok(())
                            },
                        )
                    })
                })?;
                Ok(1)
            }

            /// `atomic::update_if`: `UPDATE .. SET stock = stock - 1 WHERE id = ? AND stock >= 1`.
            fn atomic(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                attempt(st, |_| {
                    lockkit::atomic::update_if(
                        conn,
                        diesel::update(items::table.find(HOT_ID).filter(items::stock.ge(1)))
                            .set(items::stock.eq(items::stock - 1)),
                    )
                })?;
                Ok(1)
            }

            /// The same statement by hand, with its own row-count check.
            fn atomic_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let rows = diesel::update(items::table.find(HOT_ID).filter(items::stock.ge(1)))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(conn)?;
                if rows == 0 {
                    return Err(OpError::Other("sold out".into()));
                }
                Ok(1)
            }

            // --- 3. queue ------------------------------------------------------

            /// `queue::claim` in `locked_transaction`; mark each job done by key.
            fn claim(conn: &mut Conn, batch: i64, st: &mut WorkerState) -> Result<usize, OpError> {
                let ids = attempt(st, |_| {
                    lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                        let ids: Vec<i32> = lockkit::queue::claim(
                            conn,
                            jobs::table
                                .filter(jobs::done.eq(false))
                                .order(jobs::id)
                                .select(jobs::id),
                            batch,
                        )?;
                        // One row by primary key at a time: MySQL may scan and
                        // lock other workers' rows for `WHERE id IN (..)`.
                        for id in &ids {
                            diesel::update(jobs::table.find(id))
                                .set(jobs::done.eq(true))
                                .execute(conn)?;
                        }
                        Ok(ids)
                    })
                })?;
                st.claimed.extend_from_slice(&ids);
                Ok(ids.len())
            }

            /// The same by hand: `LIMIT n FOR UPDATE SKIP LOCKED` in a transaction.
            fn claim_hand(
                conn: &mut Conn,
                batch: i64,
                st: &mut WorkerState,
            ) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let ids = write_transaction!($locks, conn, |conn: &mut Conn| {
                    let ids: Vec<i32> = skip_locked!(
                        $locks,
                        jobs::table
                            .filter(jobs::done.eq(false))
                            .order(jobs::id)
                            .select(jobs::id)
                            .limit(batch)
                    )
                    .load(conn)?;
                    for id in &ids {
                        diesel::update(jobs::table.find(id))
                            .set(jobs::done.eq(true))
                            .execute(conn)?;
                    }
                    Ok::<_, diesel::result::Error>(ids)
                })?;
                st.claimed.extend_from_slice(&ids);
                Ok(ids.len())
            }

            // --- 4. multi-row orders -------------------------------------------

            /// Two or three distinct order items, in random order.
            fn basket(st: &mut WorkerState) -> Vec<i32> {
                let mut ids: Vec<i32> = (0..ORDER_ITEMS).map(|i| ORDER_ITEM_BASE + i).collect();
                st.rng.shuffle(&mut ids);
                ids.truncate(st.rng.usize(2..=3));
                ids
            }

            /// `FOR UPDATE` one row at a time, in the buyer's order: deadlocks,
            /// retried by `lockkit::retry`.
            fn naive_order(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let ids = basket(st);
                let policy = st.policy.clone();
                lockkit::retry(&policy, |_| {
                    attempt(st, |_| {
                        lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                            let mut rows = Vec::with_capacity(ids.len());
                            for id in &ids {
                                let row: Item = for_update!(
                                    $locks,
                                    items::table.find(id).select(Item::as_select())
                                )
                                .get_result(conn)?;
                                rows.push(row);
                            }
                            for row in &rows {
                                diesel::update(items::table.find(row.id))
                                    .set(items::stock.eq(row.stock - 1))
                                    .execute(conn)?;
                            }
                            Ok(())
                        })
                    })
                })?;
                Ok(ids.len())
            }

            /// `Item::lock_all` (one statement, key order) in `locked_transaction`.
            fn lock_all(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let ids = basket(st);
                let policy = st.policy.clone();
                lockkit::retry(&policy, |_| {
                    attempt(st, |_| {
                        lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                            let rows = Item::lock_all(conn, &ids)?;
                            for row in &rows {
                                diesel::update(items::table.find(row.id))
                                    .set(items::stock.eq(row.stock - 1))
                                    .execute(conn)?;
                            }
                            Ok(())
                        })
                    })
                })?;
                Ok(ids.len())
            }
        }
    };
}

bench_backend! {
    mod postgres {
        connection: diesel::PgConnection,
        backend: Backend::Postgres,
        row_locks: yes,
        session: super::postgres_session,
        schema: "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, \
                 stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0); \
                 CREATE TABLE jobs (id INTEGER PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE); \
                 CREATE INDEX jobs_pending ON jobs (done, id);",
        truncate_items: "TRUNCATE items;",
        truncate_jobs: "TRUNCATE jobs;",
    }
}

bench_backend! {
    mod mysql {
        connection: diesel::MysqlConnection,
        backend: Backend::Mysql,
        row_locks: yes,
        session: super::mysql_session,
        schema: "CREATE TABLE items (id INTEGER PRIMARY KEY, name VARCHAR(255) NOT NULL, \
                 stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0) ENGINE = InnoDB; \
                 CREATE TABLE jobs (id INTEGER PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE) ENGINE = InnoDB; \
                 CREATE INDEX jobs_pending ON jobs (done, id);",
        truncate_items: "TRUNCATE TABLE items;",
        truncate_jobs: "TRUNCATE TABLE jobs;",
    }
}

bench_backend! {
    mod sqlite {
        connection: diesel::SqliteConnection,
        backend: Backend::Sqlite,
        row_locks: no,
        session: super::sqlite_session,
        schema: "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, \
                 stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0); \
                 CREATE TABLE jobs (id INTEGER PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE); \
                 CREATE INDEX jobs_pending ON jobs (done, id);",
        truncate_items: "DELETE FROM items;",
        truncate_jobs: "DELETE FROM jobs;",
    }
}
