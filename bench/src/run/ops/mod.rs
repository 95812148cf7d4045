//! Every operation of every workload, written once and instantiated per backend.
//!
//! Diesel checks query types per backend, and the benchmark measures each
//! backend's own connection type, as users write against it (the examples'
//! `#[derive(MultiConnection)]` enum would add its dispatch to both sides of
//! every ratio), so the code is a macro, `bench_backend!`, instantiated for
//! `PgConnection`, `MysqlConnection` and `SqliteConnection`; inside it `Conn`
//! is that type. The
//! only per-backend differences are the DDL, the session settings and, for the
//! hand-written SQL, whether the backend has row locks: SQLite has none, so its
//! hand-written "lock" is `BEGIN IMMEDIATE` (which is what lockkit does there).
//!
//! This file holds the connection's setup (schema, session, reset, tally) and
//! the dispatch from a [`Case`] to its operation. The setup that is SQL text
//! ([`session_sql`], [`schema_sql`], [`empty_table_sql`]) is written once for
//! every backend; what runs Diesel statements on the connection stays in
//! `bench_backend!` with the operations. The operations themselves are
//! in one file per [`Strategy`](crate::vocabulary::Strategy), the lockkit call next to its
//! hand-written twin: `versioned.rs`, `naive.rs`, `optimistic.rs`,
//! `with_lock.rs`, `nowait.rs`, `atomic.rs`, `claim.rs`, `naive_order.rs`,
//! `lock_all.rs`, `adaptive.rs`. Each writes its functions with a macro that
//! `bench_backend!` expands. The statements the hand-written twins and the
//! closures send are built in one place, `statements.rs`, for these and for the
//! diesel-async operations ([`asynchronous`]), which only execute them
//! differently; `bench_backend!` expands those too, for the backend's async
//! connection.
//!
//! Each operation counts what it saw (attempts, stale writes, busy rows,
//! deadlocks) in the worker's [`WorkerState`] and returns how many units it
//! completed: 1 for an update, the number of jobs for a queue claim (0: drained),
//! the number of order lines for an order.

mod adaptive;
mod atomic;
mod claim;
mod lock_all;
mod naive;
mod naive_order;
mod nowait;
mod optimistic;
mod statements;
mod versioned;
mod with_lock;

use diesel::connection::SimpleConnection;
use diesel::r2d2::R2D2Connection;
use diesel::QueryResult;

use crate::run::check::Tally;
use crate::run::worker::{OpError, WorkerState};
use crate::vocabulary::{Backend, Case};

/// A connection type the benchmark runs on; implemented by `bench_backend!`.
pub trait BenchConnection: R2D2Connection + SimpleConnection + Send + 'static {
    /// Which backend this is.
    const BACKEND: Backend;
    /// The diesel-async connection of the same backend.
    type Async: asynchronous::AsyncBenchConnection<Blocking = Self>;
    /// Session settings for every connection ([`session_sql`]).
    fn configure_session(&mut self, session: Session) -> QueryResult<()> {
        self.batch_execute(&session_sql(Self::BACKEND, session))
    }
    /// Creates the tables ([`schema_sql`]).
    fn create_schema(&mut self) -> QueryResult<()> {
        self.batch_execute(&schema_sql(Self::BACKEND))
    }
    /// Empties `items` and inserts the hot row, the workers' rows and the order
    /// items, each with [`INITIAL_STOCK`](crate::vocabulary::INITIAL_STOCK).
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

/// What the session settings of every benchmark connection depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    /// `--durable`: PostgreSQL sessions commit durably (`synchronous_commit = on`).
    pub durable: bool,
}

/// The session settings of every benchmark connection, blocking or async, as
/// SQL:
///
/// * PostgreSQL: asynchronous commit unless `--durable` (the server's own
///   setting is reported), and a lock timeout as a safety bound;
/// * MariaDB/MySQL: a lock wait timeout as a safety bound;
/// * SQLite: writers wait for the write lock (up to 5 s) instead of failing at
///   once; WAL with `synchronous = NORMAL` (no fsync per commit).
pub fn session_sql(backend: Backend, session: Session) -> String {
    match backend {
        Backend::Postgres => {
            let commit = if session.durable { "on" } else { "off" };
            format!("SET synchronous_commit = {commit}; SET lock_timeout = '10s';")
        }
        Backend::Mysql => "SET SESSION innodb_lock_wait_timeout = 10;".to_owned(),
        Backend::Sqlite => "PRAGMA busy_timeout = 5000; PRAGMA synchronous = NORMAL;".to_owned(),
    }
}

/// The benchmark's tables as DDL. The same on every backend but for MariaDB/MySQL's
/// `VARCHAR(255)` name and InnoDB tables.
pub fn schema_sql(backend: Backend) -> String {
    let (name, engine) = match backend {
        Backend::Mysql => ("VARCHAR(255)", " ENGINE = InnoDB"),
        Backend::Postgres | Backend::Sqlite => ("TEXT", ""),
    };
    format!(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name {name} NOT NULL, \
         stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0){engine}; \
         CREATE TABLE jobs (id INTEGER PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE){engine}; \
         CREATE INDEX jobs_pending ON jobs (done, id);"
    )
}

/// Empties `table`: `TRUNCATE` on the servers, `DELETE` on SQLite (which has no
/// `TRUNCATE`).
pub fn empty_table_sql(backend: Backend, table: &str) -> String {
    match backend {
        Backend::Postgres => format!("TRUNCATE {table};"),
        Backend::Mysql => format!("TRUNCATE TABLE {table};"),
        Backend::Sqlite => format!("DELETE FROM {table};"),
    }
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

// After the macros above, which it uses too.
pub mod asynchronous;

/// Writes the workloads for one connection type. See the [module docs](self).
macro_rules! bench_backend {
    (
        $(#[$meta:meta])*
        mod $module:ident {
            connection: $conn:ty,
            async_connection: $async_conn:ty,
            backend: $backend:expr,
            row_locks: $locks:tt $(,)?
        }
    ) => {
        $(#[$meta])*
        mod $module {
            use diesel::connection::SimpleConnection;
            use diesel::prelude::*;
            use lockkit::prelude::*;
            use lockkit::LockOptions;

            use super::BenchConnection;
            use crate::run::check::Tally;
            use crate::run::worker::{OpError, WorkerState};
            use crate::vocabulary::schema::{items, jobs, Item, NewItem, NewJob};
            use crate::vocabulary::{
                Backend, Case, Flavor, Strategy, Workload, HOT_ID, INITIAL_STOCK, MAX_WORKERS,
                ORDER_ITEMS, ORDER_ITEM_BASE, OWN_BASE,
            };

            /// The connection type of this instantiation.
            type Conn = $conn;

            impl BenchConnection for Conn {
                const BACKEND: Backend = $backend;
                type Async = $async_conn;

                fn reset_items(&mut self) -> QueryResult<()> {
                    self.batch_execute(&super::empty_table_sql(Self::BACKEND, "items"))?;
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
                    self.batch_execute(&super::empty_table_sql(Self::BACKEND, "jobs"))?;
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
                        (Strategy::Versioned, Flavor::HandNext) => versioned_hand_next(self, st),
                        (Strategy::Versioned, Flavor::Peer) => versioned_peer(self, st),
                        (Strategy::Naive, _) => naive(self, st),
                        (_, Flavor::HandCached | Flavor::HandNext | Flavor::Peer) => Err(OpError::Other(
                            "only the uncontended versioned update has this twin".into(),
                        )),
                        (Strategy::Optimistic, Flavor::Lockkit) => optimistic(self, st, row(case, st)),
                        (Strategy::Optimistic, Flavor::Hand) => optimistic_hand(self, st, row(case, st)),
                        (Strategy::WithLock, Flavor::Lockkit) => with_lock(self, st, row(case, st)),
                        (Strategy::WithLock, Flavor::Hand) => with_lock_hand(self, st, row(case, st)),
                        (Strategy::Adaptive, _) => adaptive(self, st, row(case, st)),
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

            /// The row a read-modify-write case works on: the hot row, or
            /// (own rows) the worker's own.
            fn row(case: &Case, st: &WorkerState) -> i32 {
                match case.workload {
                    Workload::OwnRows => OWN_BASE + st.index as i32,
                    _ => HOT_ID,
                }
            }

            /// Runs one attempt of a lockkit operation and counts what it saw.
            fn attempt<T>(
                st: &mut WorkerState,
                f: impl FnOnce(&mut WorkerState) -> Result<T, lockkit::Error>,
            ) -> Result<T, lockkit::Error> {
                let result = f(st);
                st.counted(result)
            }

            /// Two or three distinct order items, in random order.
            fn basket(st: &mut WorkerState) -> Vec<i32> {
                let mut ids: Vec<i32> = (0..ORDER_ITEMS).map(|i| ORDER_ITEM_BASE + i).collect();
                st.rng.shuffle(&mut ids);
                ids.truncate(st.rng.usize(2..=3));
                ids
            }

            /// One order of a [`basket`]: in `locked_transaction`, inside
            /// `lockkit::retry`, `lock` locks the rows (its way), then each is
            /// written down by one; the units are the order's lines.
            fn order(
                conn: &mut Conn,
                st: &mut WorkerState,
                lock: impl Fn(&mut Conn, &[i32]) -> Result<Vec<Item>, lockkit::Error>,
            ) -> Result<usize, OpError> {
                let ids = basket(st);
                let policy = st.policy.clone();
                lockkit::retry(&policy, |_| {
                    attempt(st, |_| {
                        lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                            for row in lock(conn, &ids)? {
                                super::statements::set_stock(row.id, row.stock - 1).execute(conn)?;
                            }
                            Ok(())
                        })
                    })
                })?;
                Ok(ids.len())
            }

            super::versioned::versioned_ops!($locks);
            super::naive::naive_ops!($locks);
            super::optimistic::optimistic_ops!($locks);
            super::with_lock::with_lock_ops!($locks);
            super::nowait::nowait_ops!($locks);
            super::atomic::atomic_ops!($locks);
            super::claim::claim_ops!($locks);
            super::naive_order::naive_order_ops!($locks);
            super::lock_all::lock_all_ops!($locks);
            super::adaptive::adaptive_ops!($locks);

            super::asynchronous::async_backend! {
                connection: $async_conn,
                blocking: $conn,
                row_locks: $locks
            }
        }
    };
}

bench_backend! {
    mod postgres {
        connection: diesel::PgConnection,
        async_connection: diesel_async::AsyncPgConnection,
        backend: Backend::Postgres,
        row_locks: yes,
    }
}

bench_backend! {
    mod mysql {
        connection: diesel::MysqlConnection,
        async_connection: diesel_async::AsyncMysqlConnection,
        backend: Backend::Mysql,
        row_locks: yes,
    }
}

bench_backend! {
    mod sqlite {
        connection: diesel::SqliteConnection,
        async_connection: diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
        backend: Backend::Sqlite,
        row_locks: no,
    }
}
