//! What the `async_*` tests share: one module per backend with the blocking
//! and the async connection types, bb8 and deadpool pools on a fresh test
//! database, the reads of item 1 and the read-modify-write that loses its
//! updates, tasks run side by side, a task holding item 1's row lock, and the
//! wait for a lock a dropped future left.

#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::AsyncConnection;
use lockkit::asynchronous::lockable::AsyncLockRow;
use lockkit::asynchronous::work::AsyncAttempt;
use lockkit::asynchronous::AsyncLockingConnection;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;

/// Session settings every async connection of the suite gets, as the
/// blocking harness's `on_acquire` does (SQLite: wait up to 10 s for the
/// write lock).
pub fn setup_sql(backend: &str) -> &'static str {
    match backend {
        "sqlite" => "PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON;",
        _ => "",
    }
}

/// A new async connection to `url` with the suite's session settings.
pub async fn connect<A: AsyncConnection + 'static>(url: &str, backend: &str) -> A {
    let mut conn = A::establish(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    let setup = setup_sql(backend);
    if !setup.is_empty() {
        conn.batch_execute(setup).await.expect("session settings");
    }
    conn
}

/// A database of its own for test `name` (`TestDb::new`), holding the items
/// `rows` (id, stock).
pub fn seeded<S: lockkit_tests::db::TestBackend>(
    name: &str,
    rows: &[(i32, i32)],
) -> lockkit_tests::TestDb<S> {
    let db = lockkit_tests::TestDb::<S>::new(name);
    lockkit_tests::seed_items(&mut *db.conn(), rows);
    db
}

/// A PostgreSQL database of its own for test `name` holding the items `rows`
/// ([`seeded`]), and an async connection to it.
#[cfg(feature = "postgres")]
pub async fn seeded_pg(
    name: &str,
    rows: &[(i32, i32)],
) -> (
    lockkit_tests::TestDb<diesel::PgConnection>,
    diesel_async::AsyncPgConnection,
) {
    let db = seeded::<diesel::PgConnection>(name, rows);
    let conn = connect(&db.url, "postgres").await;
    (db, conn)
}

/// The id the server knows a connection's session by, where there is a
/// server to ask: on SQLite, `None`.
#[allow(dead_code, async_fn_in_trait)]
pub trait ServerSession {
    async fn server_session(&mut self) -> Option<i64>;
}

/// [`ServerSession`] for `$conn`, a connection lockkit's lock monitor knows
/// (`lock_waits::session_id`), when `$feature` is on.
macro_rules! server_session_by_lockkit {
    ($feature:literal, $conn:ty) => {
        #[cfg(feature = $feature)]
        impl ServerSession for $conn {
            async fn server_session(&mut self) -> Option<i64> {
                Some(
                    lockkit::asynchronous::lock_waits::session_id(self)
                        .await
                        .unwrap(),
                )
            }
        }
    };
}

server_session_by_lockkit!("postgres", diesel_async::AsyncPgConnection);
server_session_by_lockkit!("mysql", diesel_async::AsyncMysqlConnection);

#[cfg(feature = "sqlite")]
impl ServerSession
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
{
    async fn server_session(&mut self) -> Option<i64> {
        None
    }
}

/// A bb8 pool of up to `size` async connections to `url`.
pub async fn bb8_pool<A>(
    url: &str,
    backend: &'static str,
    size: u32,
) -> bb8::Pool<AsyncDieselConnectionManager<A>>
where
    A: AsyncConnection + diesel_async::pooled_connection::PoolableConnection + 'static,
    diesel_async::pooled_connection::AsyncDieselConnectionManager<A>: bb8::ManageConnection,
{
    bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(Duration::from_secs(30))
        .build(manager(url, backend))
        .await
        .expect("bb8 pool")
}

/// A deadpool pool of up to `size` async connections to `url`.
pub fn deadpool_pool<A>(
    url: &str,
    backend: &'static str,
    size: usize,
) -> diesel_async::pooled_connection::deadpool::Pool<A>
where
    A: AsyncConnection + diesel_async::pooled_connection::PoolableConnection + 'static,
    diesel_async::pooled_connection::AsyncDieselConnectionManager<A>:
        deadpool::managed::Manager<Type = A, Error = diesel_async::pooled_connection::PoolError>,
{
    diesel_async::pooled_connection::deadpool::Pool::builder(manager(url, backend))
        .max_size(size)
        .build()
        .expect("deadpool pool")
}

/// The pools' connection manager: each new connection gets the suite's
/// session settings.
fn manager<A>(url: &str, backend: &'static str) -> AsyncDieselConnectionManager<A>
where
    A: AsyncConnection + 'static,
{
    let mut config = ManagerConfig::default();
    config.custom_setup = Box::new(move |url| {
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = A::establish(&url).await?;
            let setup = setup_sql(backend);
            if !setup.is_empty() {
                conn.batch_execute(setup)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            }
            Ok(conn)
        })
    });
    AsyncDieselConnectionManager::<A>::new_with_config(url, config)
}

/// Writes each test once for every backend, as `postgres::name`, `mysql::name`
/// and `sqlite::name`: `Sync` is the blocking connection (for the harness's
/// `TestDb`), `Async` the diesel-async one, `BACKEND` the name.
#[macro_export]
macro_rules! async_backend_tests {
    (@backend $feature:literal, $module:ident, $sync:ty, $async:ty; $($(#[$meta:meta])* async fn $name:ident($db:ident) $body:block)*) => {
        #[cfg(feature = $feature)]
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            #[allow(dead_code)]
            type Sync = $sync;
            #[allow(dead_code)]
            type Async = $async;
            #[allow(dead_code)]
            const BACKEND: &str = $feature;
            $(
                $(#[$meta])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let $db = lockkit_tests::TestDb::<Sync>::new(concat!("async_", stringify!($name)));
                    $body
                }
            )*
        }
    };
    ($($tests:tt)*) => {
        $crate::async_backend_tests!(@backend "postgres", postgres, diesel::PgConnection, diesel_async::AsyncPgConnection; $($tests)*);
        $crate::async_backend_tests!(@backend "mysql", mysql, diesel::MysqlConnection, diesel_async::AsyncMysqlConnection; $($tests)*);
        $crate::async_backend_tests!(@backend "sqlite", sqlite, diesel::SqliteConnection, diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>; $($tests)*);
    };
}

/// [`async_backend_tests!`] on the servers only, as `postgres::name` and
/// `mysql::name`: for what SQLite lacks (advisory locks, lock waits).
#[macro_export]
macro_rules! async_server_tests {
    ($($tests:tt)*) => {
        $crate::async_backend_tests!(@backend "postgres", postgres, diesel::PgConnection, diesel_async::AsyncPgConnection; $($tests)*);
        $crate::async_backend_tests!(@backend "mysql", mysql, diesel::MysqlConnection, diesel_async::AsyncMysqlConnection; $($tests)*);
    };
}

/// Records order line `id` (no item, one unit) as the caller's own code does
/// in its transaction, as `lockkit_tests::aborts::order_line` on a blocking
/// connection: the write whose fate an abort decides, its error classified.
pub async fn order_line<A>(conn: &mut A, id: u32) -> Result<(), Error>
where
    A: diesel_async::SimpleAsyncConnection + Send,
{
    let sql = format!("INSERT INTO orders (id, item_id, qty) VALUES ({id}, NULL, 1)");
    Ok(conn.batch_execute(&sql).await?)
}

/// `$body` in diesel-async's own transaction on `$conn`, which first records
/// order line 1: the outer transaction whose fate a deadlock inside `$body`
/// decides (the blocking side's `after_order_line_1`). Inside `$body`, `$conn`
/// names the transaction's connection.
#[allow(unused_macros)]
macro_rules! after_order_line_1 {
    ($conn:ident, $body:block) => {
        $conn
            .transaction(async |$conn| {
                $crate::async_common::order_line($conn, 1).await?;
                $body
            })
            .await
    };
}

/// Request `order-1` of tenant `tenant-1` (fingerprint `f`) run on `conn`
/// under `keys`, with `work`: the request the key-keeping tests send, and the
/// client's retry of it.
pub async fn run_order_1<C, F>(
    keys: &lockkit::idempotency::Idempotency,
    conn: &mut C,
    work: F,
) -> Result<lockkit::idempotency::Outcome<String>, Error>
where
    C: lockkit::asynchronous::idempotency::AsyncIdempotencyStore,
    F: lockkit::asynchronous::work::ConnWork<C, String, Error>,
{
    lockkit::asynchronous::idempotency::run(keys, conn, "tenant-1", "order-1", "f", work).await
}

/// The client's retry of [`run_order_1`] with `work`, after a run whose work
/// wrote after the database ended its transaction: refused, the key kept
/// running, and `work` not run. `context` leads the failure message.
pub async fn assert_retry_in_progress<C, F>(
    keys: &lockkit::idempotency::Idempotency,
    conn: &mut C,
    context: &str,
    work: F,
) where
    C: lockkit::asynchronous::idempotency::AsyncIdempotencyStore,
    F: lockkit::asynchronous::work::ConnWork<C, String, Error>,
{
    let again = run_order_1(keys, conn, work).await;
    assert!(
        matches!(again, Err(Error::IdempotencyInProgress)),
        "{context} {again:?}"
    );
}

/// Sells one unit of item 2 on `$conn`, in whatever transaction it is in (in
/// autocommit once the database ended the work's): a `QueryResult` of the
/// rows, as [`item_columns!`].
#[allow(unused_macros)]
macro_rules! sell_item_2 {
    ($conn:expr) => {
        diesel::update(lockkit_tests::schema::items::table.find(2))
            .set(lockkit_tests::schema::items::stock.eq(lockkit_tests::schema::items::stock - 1))
            .execute($conn)
            .await
    };
}

/// A patient retry policy for tests that contend on purpose.
pub fn patient() -> lockkit::RetryPolicy {
    lockkit::RetryPolicy::default()
        .max_attempts(10_000)
        .base_delay(std::time::Duration::from_millis(1))
        .max_delay(std::time::Duration::from_millis(20))
}

/// Whether `conn` is inside a transaction, by diesel-async's books.
pub fn in_transaction<A: AsyncConnection>(conn: &mut A) -> bool {
    use diesel_async::TransactionManager;
    matches!(
        A::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}

/// The session's lock timeout on `conn`, read with the blocking tests' query
/// ([`lock_timeout_query`](lockkit_tests::settings::lock_timeout_query)).
pub async fn lock_timeout<A>(conn: &mut A, backend: &str) -> i64
where
    A: AsyncConnection,
    diesel::query_builder::SqlQuery:
        diesel_async::methods::LoadQuery<'static, A, lockkit_tests::settings::Setting>,
{
    use diesel_async::RunQueryDsl;
    use lockkit_tests::settings::{lock_timeout_query, Setting};
    let setting = lock_timeout_query(backend)
        .get_result::<Setting>(conn)
        .await;
    setting.unwrap().value
}

/// Runs `task(i)` for each `i` in `0..n`, each on a task of its own, and
/// waits for them all: their results, in order (a task's panic fails the
/// test).
pub async fn on_tasks<T, Fut>(n: usize, task: impl FnMut(usize) -> Fut) -> Vec<T>
where
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = (0..n).map(task).map(tokio::spawn).collect();
    let mut results = Vec::with_capacity(n);
    for task in tasks {
        results.push(task.await.expect("task"));
    }
    results
}

/// Runs `round` `rounds` times on each of `tasks` tasks, each time on a
/// connection checked out of `pool` for that round. `round` captures nothing:
/// an `async` closure that does cannot run more than once.
pub async fn rounds_on_tasks<A, F>(
    pool: &bb8::Pool<AsyncDieselConnectionManager<A>>,
    tasks: usize,
    rounds: usize,
    round: F,
) where
    A: AsyncConnection + diesel_async::pooled_connection::PoolableConnection + 'static,
    AsyncDieselConnectionManager<A>: bb8::ManageConnection<Connection = A>,
    F: for<'r> AsyncAttempt<&'r mut A, (), Fut: Send> + Clone + Send + 'static,
{
    on_tasks(tasks, |_| {
        let (pool, mut round) = (pool.clone(), round.clone());
        async move {
            for _ in 0..rounds {
                let mut conn = pool.get().await.expect("pooled connection");
                round(&mut *conn).await;
            }
        }
    })
    .await;
}

/// A task holding item 1's row lock (`with_lock`) on a connection of its own
/// until released.
pub struct RowHolder {
    release: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl RowHolder {
    /// Takes item 1's lock on `conn`, in a task; returns once it holds it.
    pub async fn lock<A>(mut conn: A) -> Self
    where
        A: AsyncLockingConnection,
        Item: AsyncLockRow<A>,
    {
        let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            lockkit::asynchronous::with_lock(
                &mut conn,
                1,
                LockOptions::default(),
                async |_conn, _item: Item| {
                    locked_tx.send(()).unwrap();
                    let _ = release_rx.await;
                    Ok::<_, Error>(())
                },
            )
            .await
            .unwrap();
        });
        locked_rx.await.expect("the holder took the lock");
        Self { release, task }
    }

    /// Ends the holder's transaction and waits for its task.
    pub async fn release(self) {
        self.release.send(()).unwrap();
        self.task.await.unwrap();
    }
}

/// How long a server may take to notice a closed connection and free the
/// locks it held.
pub const FREED_WITHIN: Duration = Duration::from_secs(10);

/// A lockkit call on `conn` given up on in its work (as a timeout firing
/// there would): its transaction stays open on the server, and the
/// connection is marked broken. The work says when it has begun; the call
/// is dropped then, however long it took to get there.
#[allow(dead_code)]
pub async fn drop_a_call_in_its_work<A: AsyncLockingConnection>(conn: &mut A) {
    let in_its_work = tokio::sync::Notify::new();
    let call = lockkit::asynchronous::locked_transaction(
        conn,
        LockOptions::default(),
        async |_conn: &mut A| {
            in_its_work.notify_one();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, Error>(())
        },
    );
    drop_once_reached(&in_its_work, call, "in its work").await;
}

/// Spawns `then`, to run `after` the returned signal is notified (from the
/// work under test, once it has reached its point), however late that is.
#[allow(dead_code)]
pub fn once_signalled<F>(
    after: Duration,
    then: F,
) -> (
    std::sync::Arc<tokio::sync::Notify>,
    tokio::task::JoinHandle<F::Output>,
)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let signal = std::sync::Arc::new(tokio::sync::Notify::new());
    let task = tokio::spawn({
        let signal = signal.clone();
        async move {
            signal.notified().await;
            tokio::time::sleep(after).await;
            then.await
        }
    });
    (signal, task)
}

/// Your own `transaction` around a call given up on while it waited for a
/// lock, awaited: its outcome, which must come within 20 s, without waiting
/// for the dropped call (`what`) as a commit sent behind it would.
pub async fn ended_without_waiting_for<F: Future>(transaction: F, what: &str) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), transaction)
        .await
        .unwrap_or_else(|e| {
            panic!("the transaction ended without waiting for the dropped {what}: {e:?}")
        })
}

/// Polls `call` until it notifies `reached` (from inside it: its work, the
/// lock it took), then drops it there, as a timeout firing at that point
/// would, however long it took to get there. Fails the test if `call`
/// returns first, or has not got there after 30 s; `point` names the place
/// in those messages.
#[allow(dead_code)]
pub async fn drop_once_reached<F>(reached: &tokio::sync::Notify, call: F, point: &str)
where
    F: Future,
    F::Output: std::fmt::Debug,
{
    let raced = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            () = reached.notified() => {} // drops the call at `point`
            outcome = call => panic!("the call returned {outcome:?} before it was dropped {point}"),
        }
    });
    raced
        .await
        .unwrap_or_else(|_| panic!("the call was not {point} after 30 s"));
}

/// A count the server reports, read with `diesel::sql_query` (`SELECT
/// COUNT(*) AS n ..`).
#[derive(diesel::QueryableByName)]
pub struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// Reads `$sql` (a `SELECT COUNT(*) AS n ..` with session id `$id` bound as
/// its one parameter) on `$conn` every 5 ms until it counts a row. Fails the
/// test after 10 s, naming `$what` it waited to see (before the 20 s and
/// 30 s bounds of the calls it races can fire). A macro: the connection
/// types differ, and the read is awaited in the caller's future.
#[allow(unused_macros)]
macro_rules! until_counted {
    ($conn:expr, $sql:expr, $id:expr, $what:expr) => {{
        let id: i64 = $id;
        let started = std::time::Instant::now();
        loop {
            let counted: $crate::async_common::Count = diesel::sql_query($sql)
                .bind::<diesel::sql_types::BigInt, _>(id)
                .get_result($conn)
                .await
                .unwrap();
            if counted.n > 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "session {id}: {} not seen after 10 s",
                $what
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }};
}

/// Asks `free` every 5 ms until it says the lock is free; how long that took.
/// Fails the test when `what` is still held after [`FREED_WITHIN`].
pub async fn freed(what: &str, mut free: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !free().await {
        assert!(
            started.elapsed() < FREED_WITHIN,
            "{what} is still held {FREED_WITHIN:?} after the future was dropped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[allow(unused_macros)]
/// Item `id` as stored, read on an async connection.
macro_rules! item {
    ($conn:expr, $id:expr) => {{
        use diesel::QueryDsl;
        use diesel_async::RunQueryDsl;
        lockkit_tests::schema::items::table
            .find($id)
            .first::<lockkit_tests::models::Item>($conn)
            .await
            .expect("read item")
    }};
}

/// B reads item 1 on `$b_conn`, writes its 7 and commits; A's struct `$a`,
/// holding the number a rolled-back write left, writes again on `$a_conn`: it
/// must be stale, and B's 7 stay. `$what` names what might have made the
/// journal forget A's rollback.
#[allow(unused_macros)]
macro_rules! b_commits_then_a_is_stale {
    ($a_conn:expr, $b_conn:expr, $a:expr, $what:literal) => {{
        let mut b = item!($b_conn, 1);
        b.stock = 7;
        b.update_versioned($b_conn).await.unwrap();
        $a.stock = 3;
        let again = $a.update_versioned($a_conn).await;
        let stock = item!($b_conn, 1).stock;
        assert!(
            matches!(again, Err(lockkit::Error::Stale(_))) && stock == 7,
            "A's rolled-back version 1 matched B's committed 1 once {}: {again:?}, \
             stock {stock} (B's 7 lost)",
            $what
        );
    }};
}

/// Item `$id`'s `$columns` (columns of `items`, one or a tuple) as a `$row`,
/// read on `$conn` (each `async_*` test file that uses it has diesel's and
/// diesel-async's query methods in scope). A macro: diesel-async checks the
/// query per connection type.
#[allow(unused_macros)]
macro_rules! item_columns {
    ($conn:expr, $id:expr, $columns:expr, $row:ty) => {
        lockkit_tests::schema::items::table
            .find($id)
            .select($columns)
            .get_result::<$row>($conn)
            .await
            .expect("read item")
    };
}

/// Every item's stock, by id, read on `$conn`.
#[allow(unused_macros)]
macro_rules! stocks {
    ($conn:expr) => {{
        lockkit_tests::schema::items::table
            .order(lockkit_tests::schema::items::id)
            .select(lockkit_tests::schema::items::stock)
            .load::<i32>($conn)
            .await
            .unwrap()
    }};
}

/// Item 1's stock, read on `$conn`, as [`item_columns!`].
#[allow(unused_macros)]
macro_rules! stock {
    ($conn:expr) => {
        item_columns!($conn, 1, lockkit_tests::schema::items::stock, i32)
    };
}

/// Item `$id`'s stock (item 1 when omitted) and the number of order lines,
/// read on `$conn`, as [`item_columns!`]: what a sale left.
#[allow(unused_macros)]
macro_rules! stock_and_lines {
    ($conn:expr) => {
        stock_and_lines!($conn, 1)
    };
    ($conn:expr, $id:expr) => {{
        let stock = item_columns!(&mut *$conn, $id, lockkit_tests::schema::items::stock, i32);
        let lines = lockkit_tests::schema::orders::table
            .count()
            .get_result::<i64>($conn)
            .await
            .expect("count order lines");
        (stock, lines)
    }};
}

/// Every item's `$column` (an `Integer` column of `items`), in id order, read
/// on `$conn`, as [`item_columns!`].
#[allow(unused_macros)]
macro_rules! each_item {
    ($conn:expr, $column:ident) => {
        lockkit_tests::schema::items::table
            .order(lockkit_tests::schema::items::id)
            .select(lockkit_tests::schema::items::$column)
            .load::<i32>($conn)
            .await
            .expect("read every item")
    };
}

/// Item 1's stock and version, read on `$conn`, as [`item_columns!`].
#[allow(unused_macros)]
macro_rules! stock_and_version {
    ($conn:expr) => {
        item_columns!(
            $conn,
            1,
            (
                lockkit_tests::schema::items::stock,
                lockkit_tests::schema::items::lock_version,
            ),
            (i32, i32)
        )
    };
}

/// Reads item 1's stock on `$conn`, awaits `$between`, then writes the stock
/// back one less: a read-modify-write that loses updates unless something
/// serializes it. A future of a `QueryResult<()>`, as [`item_columns!`].
#[allow(unused_macros)]
macro_rules! read_modify_write {
    ($conn:expr, $between:expr) => {
        async {
            let stock: i32 = lockkit_tests::schema::items::table
                .find(1)
                .select(lockkit_tests::schema::items::stock)
                .get_result(&mut *$conn)
                .await?;
            $between.await;
            diesel::update(lockkit_tests::schema::items::table.find(1))
                .set(lockkit_tests::schema::items::stock.eq(stock - 1))
                .execute(&mut *$conn)
                .await?;
            Ok::<_, diesel::result::Error>(())
        }
    };
}

/// Runs `$body` on `$tasks` tasks, each with `$conn`, a connection of
/// `$pool`, and `$all`, a barrier every task reaches: awaited between a read
/// and its write, it forces the interleaving in which every task reads before
/// any writes. A macro, as [`read_modify_write!`].
#[allow(unused_macros)]
macro_rules! all_at_once {
    ($pool:expr, $tasks:expr, |$conn:ident, $all:ident| $body:expr) => {{
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new($tasks));
        async_common::on_tasks($tasks, |_| {
            let (pool, $all) = ($pool.clone(), barrier.clone());
            async move {
                let mut $conn = pool.get().await.unwrap();
                $body
            }
        })
        .await
    }};
}

/// `future`'s output, or the panic of one of its polls: `catch_unwind` for a
/// future, so that a test goes on after a call whose work panicked.
pub async fn caught_panic<F: Future>(future: F) -> std::thread::Result<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await
}
