//! `--async`: a worker process on diesel-async. `--threads` tasks on a
//! multi-threaded tokio runtime share a bb8 pool and run the strategies
//! `lockkit::asynchronous` has ([`Strategy::ASYNC`](crate::stats::Strategy::ASYNC)) with the statements of
//! [`crate::statements`], so that the parent's audit (the same tables, the same
//! invariants) holds them to the same account as the blocking workers.
//!
//! The async-only attack: `--cancel` percent of the operations have their
//! future dropped at a random point, half by a `tokio::time::timeout` with a
//! deadline of a few milliseconds, half by `JoinHandle::abort` on the task
//! that runs them. A dropped operation may have committed (the drop came after
//! its `COMMIT` reached the server) or not; the task finds out under the
//! operation's own row locks (which wait for the abandoned transaction to end
//! on the server), and counts what it committed, so the audit stays exact.
//! At the end the worker takes every connection of its pool at once and asks
//! the server that none of them is in a transaction or holds a lock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig, PoolError};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, AsyncPgConnection, TransactionManager};
use lockkit::asynchronous::AsyncLockingConnection;
use lockkit::{Error, RetryableError};

use crate::backend;
use crate::config::{Backend, Config};
use crate::stats::{op_id, Done, Op, Outcome, Stats};

/// The worker's pool.
pub type Pool<C> = bb8::Pool<AsyncDieselConnectionManager<C>>;

/// How an async operation failed: lockkit's error, or no connection from the pool.
#[derive(Debug)]
pub enum Failed {
    Lockkit(Error),
    Pool(String),
}

impl From<Error> for Failed {
    fn from(err: Error) -> Self {
        Failed::Lockkit(err)
    }
}

impl From<diesel::result::Error> for Failed {
    fn from(err: diesel::result::Error) -> Self {
        Failed::Lockkit(Error::from(err))
    }
}

impl RetryableError for Failed {
    fn lockkit_error(&self) -> Option<&Error> {
        match self {
            Failed::Lockkit(err) => Some(err),
            Failed::Pool(_) => None,
        }
    }

    fn retries_exhausted(self, attempts: u32) -> Self {
        match self {
            Failed::Lockkit(err) => Failed::Lockkit(err.retries_exhausted(attempts)),
            other => other,
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Lockkit(err) => write!(f, "{err} ({err:?})"),
            Failed::Pool(err) => write!(f, "no connection from the pool: {err}"),
        }
    }
}

/// A diesel-async connection the torture runs on: the operations (written once,
/// in `ops!`, for each connection type) and the server's word on a session.
pub trait TortureConnection:
    AsyncLockingConnection + diesel_async::pooled_connection::PoolableConnection + Sized
where
    AsyncDieselConnectionManager<Self>: bb8::ManageConnection<Connection = Self, Error = PoolError>,
{
    /// `op` to completion, retrying conflicts: its outcome and how many attempts it took.
    fn run_op(
        pool: &Pool<Self>,
        op: &Op,
    ) -> impl std::future::Future<Output = Result<(Outcome, u32), Failed>> + Send;

    /// After `op`'s future was dropped: whether it committed, and what it
    /// wrote. Asked under the row locks of `op`'s items, which wait until the
    /// abandoned transaction ended on the server.
    fn committed(
        pool: &Pool<Self>,
        op: &Op,
    ) -> impl std::future::Future<Output = Result<Option<Done>, Failed>> + Send;

    /// The server's id of this session (`None` on SQLite: no server).
    /// `nonce` must come back with it: a connection whose replies are out of
    /// step with its queries answers something else.
    fn session_id(
        &mut self,
        nonce: i64,
    ) -> impl std::future::Future<Output = diesel::QueryResult<Session>> + Send;

    /// The server's word on this session itself: inside a transaction?
    fn says_in_transaction(
        &mut self,
    ) -> impl std::future::Future<Output = diesel::QueryResult<bool>> + Send;

    /// The server's word on another session, asked from this one: what it
    /// holds (a transaction, locks), if anything.
    fn says_busy(
        &mut self,
        session: i64,
    ) -> impl std::future::Future<Output = diesel::QueryResult<Option<String>>> + Send;
}

/// A count from the server.
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// A session's id on the server (0 on SQLite) and the nonce it echoed.
#[derive(diesel::QueryableByName)]
pub struct Session {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    echo: i64,
}

/// What the server says a session holds.
#[derive(diesel::QueryableByName)]
struct Held {
    #[diesel(sql_type = diesel::sql_types::Text)]
    what: String,
}

fn described(held: Vec<Held>) -> Option<String> {
    (!held.is_empty()).then(|| {
        held.into_iter()
            .map(|held| held.what)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The operations on one diesel-async connection type: the same strategies as
/// [`backend::run_op`], through `lockkit::asynchronous`.
macro_rules! ops {
    ($conn:ty) => {
        use diesel::ExpressionMethods as _;
        use diesel_async::RunQueryDsl as _;
        use lockkit::asynchronous::prelude::*;
        use lockkit::LockOptions;

        use super::{Failed, Pool};
        use crate::backend::{lock_all_stocks, written};
        use crate::model::Item;
        use crate::schema::torture_items;
        use crate::statements::{self, SetStock};
        use crate::stats::{Done, Op, Outcome, Strategy};

        type Conn = $conn;

        async fn connection(
            pool: &Pool<Conn>,
        ) -> Result<
            bb8::PooledConnection<
                '_,
                diesel_async::pooled_connection::AsyncDieselConnectionManager<Conn>,
            >,
            Failed,
        > {
            pool.get()
                .await
                .map_err(|err| Failed::Pool(err.to_string()))
        }

        async fn record(conn: &mut Conn, op: &Op) -> diesel::QueryResult<Done> {
            for line in statements::order_lines(op) {
                line.execute(conn).await?;
            }
            if let Some(job) = statements::shipment_job(op) {
                job.execute(conn).await?;
            }
            Ok(Done::recorded(op))
        }

        async fn set_stock(
            conn: &mut Conn,
            id: i32,
            stock: i32,
            op: &Op,
        ) -> diesel::QueryResult<usize> {
            match statements::set_stock(id, stock, op.bump) {
                SetStock::Explicit(update) => update.execute(conn).await,
                SetStock::Plain(update) => update.execute(conn).await,
            }
        }

        /// Read, change, write in `transaction_with_retry`: optimistic and by_version.
        async fn versioned(pool: &Pool<Conn>, op: &Op) -> Result<(Outcome, u32), Failed> {
            let mut conn = connection(pool).await?;
            let attempts = AtomicU32::new(0);
            let policy = crate::plan::retry_policy();
            let (id, qty) = op.lines[0];
            let outcome = lockkit::asynchronous::transaction_with_retry(
                &mut *conn,
                &policy,
                async |conn: &mut Conn| {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    let mut item: Item = statements::read_item(id).get_result(conn).await?;
                    if op.strategy == Strategy::ByVersion {
                        // The version a client would send back in If-Match.
                        Item::update_by_version(
                            conn,
                            id,
                            item.lock_version,
                            torture_items::stock.eq(item.stock - qty),
                        )
                        .await?;
                        return Ok(written(record(conn, op).await?, item.stock - qty));
                    }
                    if item.stock < qty {
                        return Ok(Outcome::OutOfStock);
                    }
                    item.stock -= qty;
                    item.update_versioned(conn).await?;
                    Ok::<_, Error>(written(record(conn, op).await?, item.stock))
                },
            )
            .await?;
            Ok((outcome, AtomicU32::load(&attempts, Ordering::Relaxed)))
        }

        /// `with_lock` (waiting or NOWAIT), or `lock_all` in a
        /// `locked_transaction`, each attempt on a connection from the pool,
        /// under `lockkit::asynchronous::retry`.
        async fn locked(pool: &Pool<Conn>, op: &Op) -> Result<(Outcome, u32), Failed> {
            let attempts = AtomicU32::new(0);
            let attempts = &attempts;
            let policy = crate::plan::retry_policy();
            let outcome = lockkit::asynchronous::retry(&policy, move |attempt| async move {
                attempts.store(attempt, Ordering::Relaxed);
                let mut conn = connection(pool).await?;
                if op.strategy == Strategy::LockAll {
                    return lockkit::asynchronous::locked_transaction(
                        &mut *conn,
                        LockOptions::default(),
                        async |conn: &mut Conn| {
                            // In random order: lock_all sorts them.
                            let keys: Vec<i32> = op.lines.iter().map(|(id, _)| *id).collect();
                            let rows: Vec<Item> =
                                lockkit::asynchronous::lock_all(conn, &keys).await?;
                            let Some(stocks) = lock_all_stocks(op, &rows)? else {
                                return Ok(Outcome::OutOfStock);
                            };
                            let mut lowest = i32::MAX;
                            for (id, stock) in stocks {
                                set_stock(conn, id, stock, op).await?;
                                lowest = lowest.min(stock);
                            }
                            Ok::<_, Failed>(written(record(conn, op).await?, lowest))
                        },
                    )
                    .await;
                }
                let (id, qty) = op.lines[0];
                let options = match op.strategy {
                    Strategy::NoWait => LockOptions::default().nowait(),
                    _ => LockOptions::default(),
                };
                lockkit::asynchronous::with_lock(
                    &mut *conn,
                    id,
                    options,
                    async |conn: &mut Conn, item: Item| {
                        if item.stock < qty {
                            return Ok(Outcome::OutOfStock);
                        }
                        set_stock(conn, id, item.stock - qty, op).await?;
                        Ok::<_, Failed>(written(record(conn, op).await?, item.stock - qty))
                    },
                )
                .await
            })
            .await?;
            Ok((outcome, AtomicU32::load(&attempts, Ordering::Relaxed)))
        }

        pub async fn run_op(pool: &Pool<Conn>, op: &Op) -> Result<(Outcome, u32), Failed> {
            match op.strategy {
                Strategy::Optimistic | Strategy::ByVersion => versioned(pool, op).await,
                Strategy::WithLock | Strategy::NoWait | Strategy::LockAll => locked(pool, op).await,
                other => Err(Failed::Lockkit(Error::InvalidInput(match other {
                    Strategy::Atomic => "atomic: not in lockkit::asynchronous",
                    Strategy::SkipLocked => "skip_locked: not in lockkit::asynchronous",
                    _ => "adaptive: not in lockkit::asynchronous",
                }))),
            }
        }

        pub async fn committed(pool: &Pool<Conn>, op: &Op) -> Result<Option<Done>, Failed> {
            let policy = crate::plan::retry_policy();
            lockkit::asynchronous::retry(&policy, move |_| async move {
                let mut conn = connection(pool).await?;
                lockkit::asynchronous::locked_transaction(
                    &mut *conn,
                    LockOptions::default(),
                    async |conn: &mut Conn| {
                        let keys: Vec<i32> = op.lines.iter().map(|(id, _)| *id).collect();
                        let _: Vec<Item> = lockkit::asynchronous::lock_all(conn, &keys).await?;
                        let lines: i64 = statements::lines_of(op.id).get_result(conn).await?;
                        Ok::<_, Failed>(Done::committed(op, lines))
                    },
                )
                .await
            })
            .await
        }
    };
}

/// Implements [`TortureConnection`] for `$conn` with `ops!` and the
/// backend's own look at a session: `$session_id` selects the session's id `AS
/// id` and echoes the nonce bound to it `AS echo`.
macro_rules! torture_connection {
    ($module:ident, $conn:ty, session_id: $session_id:expr, { $($session:tt)* }) => {
        mod $module {
            use super::*;
            ops!($conn);
        }

        impl TortureConnection for $conn {
            async fn run_op(pool: &Pool<Self>, op: &Op) -> Result<(Outcome, u32), Failed> {
                $module::run_op(pool, op).await
            }

            async fn committed(pool: &Pool<Self>, op: &Op) -> Result<Option<Done>, Failed> {
                $module::committed(pool, op).await
            }

            async fn session_id(&mut self, nonce: i64) -> diesel::QueryResult<Session> {
                use diesel_async::RunQueryDsl;
                diesel::sql_query($session_id)
                    .bind::<diesel::sql_types::BigInt, _>(nonce)
                    .get_result::<Session>(self)
                    .await
            }

            $($session)*
        }
    };
}

torture_connection!(postgres, AsyncPgConnection, session_id: "SELECT pg_backend_pid()::bigint AS id, $1 AS echo", {
    async fn says_in_transaction(&mut self) -> diesel::QueryResult<bool> {
        use diesel_async::SimpleAsyncConnection;
        // PostgreSQL refuses a SAVEPOINT outside a transaction block.
        Ok(self.batch_execute("SAVEPOINT torture_probe").await.is_ok())
    }

    async fn says_busy(&mut self, session: i64) -> diesel::QueryResult<Option<String>> {
        use diesel::sql_types::BigInt;
        use diesel_async::RunQueryDsl;
        diesel::sql_query(
            "SELECT 'state ' || COALESCE(state, '?') || ', xid ' \
             || COALESCE(backend_xid::text, 'none') AS what \
             FROM pg_stat_activity WHERE pid = $1 AND (state <> 'idle' OR backend_xid IS NOT NULL) \
             UNION ALL SELECT 'lock ' || locktype || ' ' || mode FROM pg_locks WHERE pid = $1 \
             AND locktype IN ('transactionid', 'tuple', 'advisory')",
        )
        .bind::<BigInt, _>(session)
        .load::<Held>(self)
        .await
        .map(described)
    }
});

torture_connection!(mysql, AsyncMysqlConnection, session_id: "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id, ? AS echo", {
    async fn says_in_transaction(&mut self) -> diesel::QueryResult<bool> {
        use diesel_async::RunQueryDsl;
        diesel::sql_query("SELECT CAST(@@in_transaction AS SIGNED) AS n")
            .get_result::<Count>(self)
            .await
            .map(|open| open.n != 0)
    }

    async fn says_busy(&mut self, session: i64) -> diesel::QueryResult<Option<String>> {
        use diesel::sql_types::BigInt;
        use diesel_async::RunQueryDsl;
        diesel::sql_query(
            "SELECT CONCAT('InnoDB transaction ', trx_state, ' since ', trx_started, ', ', \
             trx_rows_locked, ' rows locked, ', trx_lock_structs, ' lock structs, isolation ', \
             trx_isolation_level, ', query ', COALESCE(trx_query, 'none')) AS what \
             FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?",
        )
        .bind::<BigInt, _>(session)
        .load::<Held>(self)
        .await
        .map(described)
    }
});

torture_connection!(sqlite, SyncConnectionWrapper<diesel::SqliteConnection>, session_id: "SELECT 0 AS id, ? AS echo", {
    async fn says_in_transaction(&mut self) -> diesel::QueryResult<bool> {
        use diesel_async::SimpleAsyncConnection;
        // SQLite refuses a BEGIN inside a transaction; a connection outside
        // one holds no lock of the database.
        Ok(self.batch_execute("BEGIN; ROLLBACK;").await.is_err())
    }

    async fn says_busy(&mut self, _session: i64) -> diesel::QueryResult<Option<String>> {
        Ok(None)
    }
});

/// A worker process with `--async`: its tasks, then the check of its pool.
pub fn worker(config: &Config, process: u32, deadline: Instant) -> Stats {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads.clamp(2, 4) as usize)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => return failed(format!("p{process}: no tokio runtime: {err}")),
    };
    match config.backend() {
        Backend::Postgres => runtime.block_on(run::<AsyncPgConnection>(config, process, deadline)),
        Backend::Mysql => runtime.block_on(run::<AsyncMysqlConnection>(config, process, deadline)),
        Backend::Sqlite => runtime.block_on(
            run::<SyncConnectionWrapper<diesel::SqliteConnection>>(config, process, deadline),
        ),
    }
}

fn failed(failure: String) -> Stats {
    Stats {
        failures: vec![failure],
        ..Stats::default()
    }
}

async fn pool<C>(config: &Config) -> Result<Pool<C>, String>
where
    C: TortureConnection,
    AsyncDieselConnectionManager<C>: bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    let session = backend::session_sql(config.backend());
    let mut manager = ManagerConfig::default();
    manager.custom_setup = Box::new(move |url| {
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = C::establish(&url).await?;
            if !session.is_empty() {
                conn.batch_execute(session)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            }
            Ok(conn)
        })
    });
    bb8::Pool::builder()
        .max_size(config.pool_size())
        // bb8 pings a connection before handing it out (`SELECT 1`) unless
        // told not to. On MySQL a future dropped during that ping leaves
        // mysql_async's connection with an unread reply, and diesel-async's
        // `is_broken` (which looks at transactions only) lets bb8 hand it out:
        // the next user reads the wrong replies (measured: `NotFound` for a
        // row that exists, "Connection to the server is closed").
        // `--pool-ping` turns the ping back on to show it.
        .test_on_check_out(config.pool_ping)
        .connection_timeout(Duration::from_secs(30))
        .build(AsyncDieselConnectionManager::<C>::new_with_config(
            crate::nodes::connection_url(config),
            manager,
        ))
        .await
        .map_err(|err| err.to_string())
}

async fn run<C>(config: &Config, process: u32, deadline: Instant) -> Stats
where
    C: TortureConnection,
    AsyncDieselConnectionManager<C>: bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    let pool = match pool::<C>(config).await {
        Ok(pool) => pool,
        Err(err) => return failed(format!("p{process}: no pool: {err}")),
    };
    let tasks: Vec<_> = (0..config.threads)
        .map(|t| {
            tokio::spawn(task::<C>(
                pool.clone(),
                config.clone(),
                process,
                t,
                deadline,
            ))
        })
        .collect();
    let mut total = Stats::default();
    for (t, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(stats) => total.merge(&stats),
            Err(err) => total
                .failures
                .push(format!("p{process}t{t}: task failed: {err}")),
        }
    }
    if config.leave_open {
        leave_open(&pool, config, process, &mut total).await;
    }
    check_pool(&pool, config, process, &mut total).await;
    total
}

/// `--leave-open`: a transaction holding a row lock, opened with raw SQL behind
/// diesel-async's back (its transaction manager does not see it), on a
/// connection that goes back to the pool. The pool check must catch it.
async fn leave_open<C>(pool: &Pool<C>, config: &Config, process: u32, total: &mut Stats)
where
    C: TortureConnection,
    AsyncDieselConnectionManager<C>: bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    let sql = match config.backend() {
        Backend::Sqlite => "BEGIN IMMEDIATE",
        Backend::Postgres | Backend::Mysql => {
            "BEGIN; SELECT id FROM torture_items WHERE id = 1 FOR UPDATE"
        }
    };
    let left = match pool.get().await {
        Ok(mut conn) => conn.batch_execute(sql).await.map_err(|err| err.to_string()),
        Err(err) => Err(err.to_string()),
    };
    if let Err(err) = left {
        total
            .failures
            .push(format!("p{process}: --leave-open: {err}"));
    }
}

/// How a dropped operation is dropped.
enum Attack {
    None,
    Timeout(Duration),
    Abort(Duration),
}

/// One worker task: operations until the deadline, `--cancel` percent of them attacked.
async fn task<C>(
    pool: Pool<C>,
    config: Config,
    process: u32,
    thread: u32,
    deadline: Instant,
) -> Stats
where
    C: TortureConnection,
    AsyncDieselConnectionManager<C>: bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    let mut stats = Stats {
        threads: 1,
        ..Stats::default()
    };
    let mut rng = crate::plan::thread_rng(&config, thread);
    let worker = format!("p{process}t{thread}");
    let mut seq: u32 = 0;
    while Instant::now() < deadline && u64::from(seq) < config.ops && seq < u32::MAX {
        seq += 1;
        let op = crate::plan::next_op(&mut rng, &config, op_id(process, thread, seq), &worker);
        let attack = if rng.u32(0..100) < config.cancel {
            // Up to a few ms: before, inside and after the transaction.
            let after = Duration::from_micros(rng.u64(0..=6_000));
            if rng.bool() {
                Attack::Timeout(after)
            } else {
                Attack::Abort(after)
            }
        } else {
            Attack::None
        };
        let result = match attack {
            Attack::None => C::run_op(&pool, &op).await.map(Some),
            Attack::Timeout(after) => {
                match tokio::time::timeout(after, C::run_op(&pool, &op)).await {
                    Ok(result) => result.map(Some),
                    Err(_) => {
                        stats.cancelled_timeout += 1;
                        Ok(None)
                    }
                }
            }
            Attack::Abort(after) => {
                let handle = tokio::spawn({
                    let (pool, op) = (pool.clone(), op.clone());
                    async move { C::run_op(&pool, &op).await }
                });
                tokio::time::sleep(after).await;
                handle.abort();
                match handle.await {
                    Ok(result) => result.map(Some),
                    Err(err) if err.is_cancelled() => {
                        stats.cancelled_abort += 1;
                        Ok(None)
                    }
                    Err(err) => Err(Failed::Pool(format!("the operation's task failed: {err}"))),
                }
            }
        };
        let result = match result {
            Ok(Some((outcome, attempts))) => {
                stats.per[op.strategy.index()].retries += u64::from(attempts.saturating_sub(1));
                Ok(outcome)
            }
            // Dropped: committed or not, decided under the rows' locks.
            Ok(None) => match C::committed(&pool, &op).await {
                Ok(Some(done)) => {
                    stats.cancelled_committed += 1;
                    Ok(Outcome::Done(done))
                }
                Ok(None) => Ok(Outcome::Dropped),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        match result {
            Ok(outcome) => stats.record(op.strategy, outcome),
            Err(failure) => {
                stats.failures.push(op.failure(failure));
                break;
            }
        }
    }
    stats
}

/// Every connection of the pool at once (those the pool would hand out next):
/// none may be in a transaction or hold a lock, by diesel-async's account and
/// by the server's.
async fn check_pool<C>(pool: &Pool<C>, config: &Config, process: u32, total: &mut Stats)
where
    C: TortureConnection,
    AsyncDieselConnectionManager<C>: bb8::ManageConnection<Connection = C, Error = PoolError>,
{
    let mut held = Vec::new();
    for _ in 0..config.pool_size() {
        match pool.get().await {
            Ok(conn) => held.push(conn),
            Err(err) => {
                total.failures.push(format!(
                    "p{process}: checking the pool: no connection: {err}"
                ));
                return;
            }
        }
    }
    // Per connection: its session id (`None` on SQLite), or `Err` when it is dirty.
    let mut sessions: Vec<Result<Option<i64>, ()>> = Vec::new();
    for conn in &mut held {
        let conn = &mut **conn;
        let client = matches!(
            C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
            Ok(Some(_))
        );
        let nonce = fastrand::i64(1..i64::MAX);
        match (
            conn.says_in_transaction().await,
            conn.session_id(nonce).await,
        ) {
            (Ok(server), Ok(session)) => {
                if client || server || session.echo != nonce {
                    total.pool_dirty += 1;
                    total.failures.push(format!(
                        "p{process}: a pooled connection is inside a transaction or out of step \
                         (diesel-async: in a transaction {client}; the server: in a transaction \
                         {server}, echoed {} for {nonce})",
                        session.echo
                    ));
                    sessions.push(Err(()));
                } else {
                    sessions.push(Ok((session.id != 0).then_some(session.id)));
                }
            }
            (Err(err), _) | (_, Err(err)) => {
                total.pool_dirty += 1;
                total
                    .failures
                    .push(format!("p{process}: checking a pooled connection: {err}"));
                sessions.push(Err(()));
            }
        }
    }
    // Each session as the next connection of the pool sees it (a dirty one
    // is counted already).
    let n = held.len();
    for (i, session) in sessions.iter().enumerate() {
        let id = match session {
            Err(()) => continue,
            Ok(None) => {
                total.pool_clean += 1;
                continue;
            }
            Ok(Some(id)) => *id,
        };
        // InnoDB's information_schema tables are a cache the server refreshes
        // at most every 100 ms: a session busy just before the tasks ended may
        // still be listed. Held means held in three looks 200 ms apart.
        let mut said = Ok(None);
        for look in 0..3 {
            if look > 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            said = held[(i + 1) % n].says_busy(id).await;
            if !matches!(said, Ok(Some(_))) {
                break;
            }
        }
        match said {
            Ok(None) => total.pool_clean += 1,
            Ok(Some(what)) => {
                total.pool_dirty += 1;
                total.failures.push(format!(
                    "p{process}: the server says pooled session {id} holds: {what}"
                ));
            }
            Err(err) => {
                total
                    .failures
                    .push(format!("p{process}: checking the pool: {err}"));
                return;
            }
        }
    }
}
