//! lockkit's test harness: a fresh, isolated database per test on real
//! PostgreSQL, MySQL/MariaDB and SQLite, and a macro that writes a test once and
//! runs it on every backend.
//!
//! Servers are found through `PG_DATABASE_URL`, `MYSQL_DATABASE_URL` and
//! `REDIS_URL` (defaults: `postgres://postgres@127.0.0.1:5432/test`,
//! `mysql://root@127.0.0.1:3306/test`, `redis://127.0.0.1:6379/`); the replica
//! tests' primary and standby through `PG_PRIMARY_URL` and `PG_STANDBY_URL`
//! ([`replica`]). A server
//! that cannot be reached fails the test with the URL it tried; nothing is
//! skipped. `scripts/test.sh` finds, starts or installs the servers before
//! running the suite.
//!
//! The harness is the `harness` feature (on by default). [`support`], [`schema`]
//! and [`models`] are always there: what the example programs, the torture test
//! and the benchmark share (the programs' `items` table and `Item` model are the
//! suite's).

#[cfg(feature = "harness")]
pub mod aborts;
#[cfg(feature = "harness")]
pub mod db;
#[cfg(feature = "harness")]
pub mod failed_work;
#[cfg(all(feature = "harness", any(feature = "postgres", feature = "mysql")))]
pub mod lock_waits;
pub mod models;
#[cfg(feature = "harness")]
pub mod observe;
pub mod oracles;
#[cfg(feature = "harness")]
pub mod redis;
#[cfg(all(feature = "harness", feature = "postgres"))]
pub mod replica;
#[cfg(all(feature = "harness", feature = "postgres"))]
pub mod row_2_replaced;
pub mod schema;
#[cfg(feature = "harness")]
pub mod settings;
pub mod support;

#[cfg(feature = "harness")]
pub use db::TestDb;
#[cfg(feature = "harness")]
pub use redis::TestRedis;
#[cfg(all(feature = "harness", feature = "postgres"))]
pub use replica::TestReplicas;

/// Writes each test once and instantiates it for every enabled backend, as
/// `postgres::name`, `mysql::name` and `sqlite::name`. Inside a test, `Conn` is the
/// backend's connection type, `Backend` its `diesel::backend::Backend`, and
/// `BACKEND` its name; the argument is a fresh [`TestDb`].
#[cfg(feature = "harness")]
#[macro_export]
macro_rules! backend_tests {
    (@backend $feature:literal, $module:ident, $conn:ident, $($backend:ident)::+; $($(#[$meta:meta])* fn $name:ident($db:ident) $body:block)*) => {
        #[cfg(feature = $feature)]
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            #[allow(dead_code)]
            type Conn = ::diesel::$conn;
            #[allow(dead_code)]
            type Backend = ::diesel::$($backend)::+;
            #[allow(dead_code)]
            const BACKEND: &str = $feature;
            $(
                $(#[$meta])*
                #[test]
                fn $name() {
                    let $db = $crate::TestDb::<Conn>::new(stringify!($name));
                    $body
                }
            )*
        }
    };
    ($($tests:tt)*) => {
        $crate::backend_tests!(@backend "postgres", postgres, PgConnection, pg::Pg; $($tests)*);
        $crate::backend_tests!(@backend "mysql", mysql, MysqlConnection, mysql::Mysql; $($tests)*);
        $crate::backend_tests!(@backend "sqlite", sqlite, SqliteConnection, sqlite::Sqlite; $($tests)*);
    };
}

/// [`backend_tests!`] for the servers with row locks only: PostgreSQL and
/// MySQL/MariaDB.
#[cfg(feature = "harness")]
#[macro_export]
macro_rules! server_tests {
    ($($tests:tt)*) => {
        $crate::backend_tests!(@backend "postgres", postgres, PgConnection, pg::Pg; $($tests)*);
        $crate::backend_tests!(@backend "mysql", mysql, MysqlConnection, mysql::Mysql; $($tests)*);
    };
}

/// [`backend_tests!`] for a program that brings its own schema (the examples):
/// each test gets an empty database of its own ([`TestDb::empty`]), removed at
/// the end, and is handed its URL as `&str`. The tests of a backend whose cargo
/// feature is off in the calling crate are not compiled.
///
/// ```ignore
/// lockkit_tests::url_tests! {
///     fn one_item(url) { super::one_item(url) }
/// }
/// ```
#[cfg(feature = "harness")]
#[macro_export]
macro_rules! url_tests {
    (@backend $feature:literal, $module:ident, $conn:ident; $($(#[$meta:meta])* fn $name:ident($url:ident) $body:block)*) => {
        #[cfg(feature = $feature)]
        mod $module {
            $(
                $(#[$meta])*
                #[test]
                fn $name() {
                    let db = $crate::TestDb::<::diesel::$conn>::empty(stringify!($name));
                    let $url: &str = &db.url;
                    $body
                }
            )*
        }
    };
    ($($tests:tt)*) => {
        $crate::url_tests!(@backend "postgres", postgres, PgConnection; $($tests)*);
        $crate::url_tests!(@backend "mysql", mysql, MysqlConnection; $($tests)*);
        $crate::url_tests!(@backend "sqlite", sqlite, SqliteConnection; $($tests)*);
    };
}

/// The `items` row `$id` as an [`Item`](crate::models::Item), read on `$conn`.
/// A macro, not a function: Diesel checks the query per backend.
#[cfg(feature = "harness")]
#[macro_export]
macro_rules! item {
    ($conn:expr, $id:expr) => {{
        use ::diesel::prelude::*;
        $crate::schema::items::table
            .find($id)
            .first::<$crate::models::Item>($conn)
            .unwrap()
    }};
}

/// `$row`'s versioned write (its stock set to `$stock`) in a transaction on
/// `$conn` that rolls back: `$row` then holds the rolled-back number.
#[macro_export]
macro_rules! write_rolled_back {
    ($conn:expr, $row:ident, $stock:expr) => {{
        let rolled_back: Result<(), ::lockkit::Error> = ($conn).transaction(|c| {
            $row.stock = $stock;
            $row.update_versioned(c)?;
            Err(::lockkit::Error::NoRowMatched)
        });
        assert!(rolled_back.is_err());
    }};
}

/// One row reached through two connections: A's versioned write of the row
/// `$load` reads rolls back on `$one`; B reads it, writes its 7 and commits on
/// `$two`; A writes again on `$two` from its rolled-back number. A must be
/// stale, and B's 7 stay, however the two connections name the row's server
/// (`$how`).
#[macro_export]
macro_rules! rolled_back_on_one_retried_on_the_other {
    ($one:expr, $two:expr, $load:expr, $how:literal) => {{
        let load = $load;
        let mut a = load($one);
        $crate::write_rolled_back!($one, a, 5);
        let mut b = load($two);
        b.stock = 7;
        b.update_versioned($two).unwrap();
        a.stock = 3;
        let again = a.update_versioned($two);
        let stock = load($two).stock;
        assert!(
            matches!(again, Err(::lockkit::Error::Stale(_))) && stock == 7,
            "A's rolled-back 1, retried through {}, matched B's committed 1: {again:?}, \
             stock {stock} (B's 7 lost)",
            $how
        );
    }};
}

/// B reads item 1 on `$b_conn`, writes its 7 and commits; A's struct `$a`,
/// holding the number a rolled-back write left, writes again on `$a_conn`: it
/// must be stale, and B's 7 stay. `$what` names what might have made the
/// journal forget A's rollback. The async tests' `b_commits_then_a_is_stale!`
/// is the same on diesel-async.
#[cfg(feature = "harness")]
#[macro_export]
macro_rules! b_commits_then_a_is_stale {
    ($a_conn:expr, $b_conn:expr, $a:expr, $what:expr) => {{
        let mut b = $crate::item!($b_conn, 1);
        b.stock = 7;
        b.update_versioned($b_conn).unwrap();
        $a.stock = 3;
        let again = $a.update_versioned($a_conn);
        let stock = $crate::stock_of!($b_conn);
        assert!(
            matches!(again, Err(::lockkit::Error::Stale(_))) && stock == 7,
            "A's rolled-back version 1 matched B's committed 1 once {}: {again:?}, \
             stock {stock} (B's 7 lost)",
            $what
        );
    }};
}

/// The stock of `items` row `$id` (row 1 when omitted), read on `$conn`. A
/// macro, not a function: Diesel checks the query per backend.
#[cfg(feature = "harness")]
#[macro_export]
macro_rules! stock_of {
    ($conn:expr) => {
        $crate::stock_of!($conn, 1)
    };
    ($conn:expr, $id:expr) => {{
        use ::diesel::QueryDsl;
        // A blocking read, also where diesel-async's `RunQueryDsl` is in scope.
        ::diesel::RunQueryDsl::first::<i32>(
            $crate::schema::items::table
                .find($id)
                .select($crate::schema::items::stock),
            $conn,
        )
        .unwrap()
    }};
}

/// The migration of lockkit's idempotency table for `backend`
/// (`postgres`, `mysql` or `sqlite`).
#[cfg(feature = "harness")]
pub fn idempotency_migrations(backend: &str) -> lockkit::migrations::ShippedMigration {
    match backend {
        "postgres" => lockkit::idempotency::POSTGRES_MIGRATIONS,
        "mysql" => lockkit::idempotency::MYSQL_MIGRATIONS,
        _ => lockkit::idempotency::SQLITE_MIGRATIONS,
    }
}

/// Inserts the idempotency key `abandoned` of `tenant-1` for `POST /orders`,
/// running since 1970: its lease long over, so the next take of it is a
/// take-over. Needs [`idempotency_migrations`].
#[cfg(feature = "harness")]
pub fn insert_abandoned_key<C: diesel::Connection>(conn: &mut C) {
    exec(
        conn,
        "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, started_at) \
         VALUES ('tenant-1', 'abandoned', 'POST /orders', 'running', 0)",
    );
}

/// A fresh `orders.id`, unique in the process (the column has no default).
#[cfg(feature = "harness")]
pub fn next_order_id() -> i32 {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The answers clients got for idempotency keys: (key, outcome).
#[cfg(feature = "harness")]
pub type KeyAnswers = Vec<(i32, lockkit::idempotency::Outcome<String>)>;

/// The audit of sales sent with the idempotency keys `0..keys`, each key by
/// two clients, whose work sells one unit of an item that started at
/// `initial` and writes one order with `qty` = the key: `stock` and the
/// orders' `qty`s add up (nothing lost), each key's work is applied exactly
/// once, both clients of each key got an answer, and at most one of them ran
/// the work (exactly one where `one_ran`: no client gave up on a run that
/// committed); every answer is `order for key {k}`.
#[cfg(feature = "harness")]
pub fn audit_idempotent_sales(
    initial: i32,
    keys: i32,
    stock: i32,
    orders: &[i32],
    outcomes: &[(i32, lockkit::idempotency::Outcome<String>)],
    one_ran: bool,
) {
    use lockkit::idempotency::Outcome;
    assert_eq!(
        stock + orders.len() as i32,
        initial,
        "stock + sold must equal the initial stock"
    );
    for k in 0..keys {
        let applied = orders.iter().filter(|q| **q == k).count();
        assert_eq!(applied, 1, "key {k}'s work must be applied exactly once");
        let of_key: Vec<_> = outcomes.iter().filter(|(key, _)| *key == k).collect();
        assert_eq!(of_key.len(), 2, "both clients of key {k} got an answer");
        let ran = of_key
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Ran(_)))
            .count();
        match one_ran {
            true => assert_eq!(
                ran, 1,
                "key {k}: exactly one client ran the work: {of_key:?}"
            ),
            false => assert!(ran <= 1, "key {k}: two clients ran the work: {of_key:?}"),
        }
        for (_, outcome) in &of_key {
            assert_eq!(outcome.clone().into_inner(), format!("order for key {k}"));
        }
    }
}

/// The audit of `clients` clients that each sent one key several times at
/// once (`outcomes`: each request's client and answer), under principals of
/// their own: each client's work ran exactly once, and each of its repeats
/// got its response (`201 for client-{c}`) or was refused while it ran,
/// never another client's.
#[cfg(feature = "harness")]
pub fn audit_clients_sharing_a_key(
    clients: usize,
    outcomes: &[(
        usize,
        Result<lockkit::idempotency::Outcome<String>, lockkit::Error>,
    )],
) {
    use lockkit::idempotency::Outcome;
    for client in 0..clients {
        let mine: Vec<_> = outcomes
            .iter()
            .filter(|(c, _)| *c == client)
            .map(|(_, o)| o)
            .collect();
        let ran = mine
            .iter()
            .filter(|o| matches!(o, Ok(Outcome::Ran(_))))
            .count();
        assert_eq!(ran, 1, "client-{client}: {mine:?}");
        for outcome in mine {
            match outcome {
                Ok(response) => assert_eq!(
                    response.clone().into_inner(),
                    format!("201 for client-{client}")
                ),
                Err(err) => assert!(
                    matches!(err, lockkit::Error::IdempotencyInProgress),
                    "{err}"
                ),
            }
        }
    }
}

/// The migration of lockkit's lease and fence tables for `backend`.
#[cfg(feature = "harness")]
pub fn lease_migrations(backend: &str) -> lockkit::migrations::ShippedMigration {
    match backend {
        "postgres" => lockkit::lease::POSTGRES_MIGRATIONS,
        "mysql" => lockkit::lease::MYSQL_MIGRATIONS,
        _ => lockkit::lease::SQLITE_MIGRATIONS,
    }
}

/// Creates [`docs`](schema::docs) with its row 1 (`'initial'`, counter 0,
/// fence 0), in the same SQL on every backend.
#[cfg(feature = "harness")]
pub fn create_docs<C: diesel::Connection>(conn: &mut C) {
    exec(
        conn,
        "CREATE TABLE docs (id INTEGER PRIMARY KEY, body VARCHAR(100) NOT NULL, \
         counter INTEGER NOT NULL, last_fence BIGINT NOT NULL)",
    );
    exec(
        conn,
        "INSERT INTO docs (id, body, counter, last_fence) VALUES (1, 'initial', 0, 0)",
    );
}

/// The migration of lockkit's outbox and inbox tables for `backend`
/// (`postgres`, `mysql` or `sqlite`).
#[cfg(feature = "harness")]
pub fn outbox_migrations(backend: &str) -> lockkit::migrations::ShippedMigration {
    match backend {
        "postgres" => lockkit::outbox::POSTGRES_MIGRATIONS,
        "mysql" => lockkit::outbox::MYSQL_MIGRATIONS,
        _ => lockkit::outbox::SQLITE_MIGRATIONS,
    }
}

/// The count of the outbox messages not marked published: the query, for
/// `get_result::<i64>` on a blocking or a diesel-async connection.
#[cfg(feature = "harness")]
pub fn unpublished_count() -> UnpublishedCount {
    use diesel::prelude::*;
    use lockkit::outbox::schema::lockkit_outbox;
    lockkit_outbox::table
        .filter(lockkit_outbox::published_at.is_null())
        .count()
}

/// The query of [`unpublished_count`].
#[cfg(feature = "harness")]
pub type UnpublishedCount = diesel::dsl::Count<
    diesel::dsl::Filter<
        lockkit::outbox::schema::lockkit_outbox::table,
        diesel::dsl::IsNull<lockkit::outbox::schema::lockkit_outbox::published_at>,
    >,
>;

/// A caller's own error type, as an application writes it: a `thiserror` enum
/// with a `#[from] lockkit::Error` variant, returned from the closures of
/// lockkit's calls, which roll back on it and ask it whether an attempt is worth
/// retrying.
#[cfg(feature = "harness")]
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// The caller's refusal: only this many left.
    #[error("only {0} left")]
    NotEnough(i32),
    /// lockkit's error, or Diesel's.
    #[error(transparent)]
    Lock(#[from] lockkit::Error),
}

#[cfg(feature = "harness")]
impl From<diesel::result::Error> for ShopError {
    fn from(err: diesel::result::Error) -> Self {
        ShopError::Lock(err.into())
    }
}

#[cfg(feature = "harness")]
impl lockkit::RetryableError for ShopError {
    fn lockkit_error(&self) -> Option<&lockkit::Error> {
        match self {
            ShopError::Lock(err) => Some(err),
            ShopError::NotEnough(_) => None,
        }
    }
}

/// The response a handler gives a refused [`ShopError`]: the caller's refusal
/// as a `409`, lockkit's error as lockkit renders it.
#[cfg(feature = "harness")]
impl From<ShopError> for lockkit::etag::Problem {
    fn from(err: ShopError) -> Self {
        match err {
            ShopError::NotEnough(_) => {
                lockkit::etag::Problem::new(409, "Conflict", err.to_string())
            }
            ShopError::Lock(err) => err.into(),
        }
    }
}

/// Inserts `items` rows `(id, stock)` with version 0 (the same SQL on every backend).
#[cfg(feature = "harness")]
pub fn seed_items<C: diesel::Connection>(conn: &mut C, rows: &[(i32, i32)]) {
    for (id, stock) in rows {
        conn.batch_execute(&format!(
            "INSERT INTO items (id, name, stock, lock_version) VALUES ({id}, 'item {id}', {stock}, 0)"
        ))
        .expect("seed items");
    }
}

/// SQLite: a trigger that answers an update of an `items` row below zero stock
/// by rolling back the whole transaction (`RAISE(ROLLBACK, ..)`), for the tests
/// of a statement that ends the transaction it runs in.
pub const SQLITE_OUT_OF_STOCK_ROLLS_BACK: &str =
    "CREATE TRIGGER out_of_stock BEFORE UPDATE OF stock ON items \
     WHEN NEW.stock < 0 BEGIN SELECT RAISE(ROLLBACK, 'out of stock'); END";

/// Opens a transaction that replaces item 2 (stock 7) by deleting it and
/// inserting it again, and leaves it open: a locking read of item 2 waits
/// for it.
pub const REPLACE_ITEM_2_UNCOMMITTED: &str = "BEGIN; DELETE FROM items WHERE id = 2; \
     INSERT INTO items (id, name, stock, lock_version) VALUES (2, 'again', 7, 0)";

/// One unit of item 2 sold, the stock left returned (`RETURNING`: PostgreSQL,
/// SQLite 3.35+), read as [`Stock`].
pub const SELL_ITEM_2_RETURNING: &str =
    "UPDATE items SET stock = stock - 1 WHERE id = 2 RETURNING stock";

/// The `stock` column of a raw query's row.
#[derive(Debug, diesel::QueryableByName)]
pub struct Stock {
    /// The stock.
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub stock: i32,
}

/// Seeds `sku_codes` with 899 fillers and the row `K`, and returns the keys
/// that lock them across two chunks of 900: the fillers, then `K` and `k`,
/// which a case-insensitive collation (MySQL's default) holds equal.
#[cfg(feature = "harness")]
pub fn seed_codes_across_chunks<C: diesel::Connection>(conn: &mut C) -> Vec<String> {
    let fillers: Vec<String> = (0..899).map(|i| format!("A{i:03}")).collect();
    let values: Vec<String> = fillers
        .iter()
        .chain([&"K".to_owned()])
        .map(|k| format!("('{k}', 1)"))
        .collect();
    let insert = format!(
        "INSERT INTO sku_codes (code, stock) VALUES {}",
        values.join(",")
    );
    exec(conn, &insert);
    let mut keys = fillers;
    keys.extend(["K".to_owned(), "k".to_owned()]);
    keys
}

/// Creates the empty `notes` table of [`models::Note`], its `updated_at` in
/// `backend`'s timestamp type.
#[cfg(feature = "harness")]
pub fn create_notes<C: diesel::Connection>(conn: &mut C, backend: &str) {
    let timestamp = match backend {
        "postgres" => "TIMESTAMP",
        "mysql" => "DATETIME",
        _ => "TEXT",
    };
    exec(
        conn,
        &format!(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, body VARCHAR(100) NOT NULL, \
             updated_at {timestamp} NULL, lock_version INTEGER NOT NULL)"
        ),
    );
}

/// The SQL that creates `lockkit_archive.items` of [`models::Archived`] (no
/// key constraint) with the one row `(id, 'archived', 10, 0)`, seen by the
/// connection that runs it: on PostgreSQL a schema of the test's database, on
/// SQLite an in-memory database attached to that connection alone, on
/// MySQL/MariaDB a database the server's tests share (so each test writes
/// rows of a key of its own).
#[cfg(feature = "harness")]
pub fn archive_sql(backend: &str, id: i32) -> String {
    let schema = match backend {
        "postgres" => "CREATE SCHEMA IF NOT EXISTS lockkit_archive",
        "mysql" => "CREATE DATABASE IF NOT EXISTS lockkit_archive",
        _ => "ATTACH DATABASE ':memory:' AS lockkit_archive",
    };
    format!(
        "{schema}; CREATE TABLE IF NOT EXISTS lockkit_archive.items (id INTEGER NOT NULL, \
         name VARCHAR(100) NOT NULL, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); \
         DELETE FROM lockkit_archive.items WHERE id = {id}; \
         INSERT INTO lockkit_archive.items VALUES ({id}, 'archived', 10, 0)"
    )
}

/// The `(name, lock_version)` of the `lockkit_archive.items` rows of key
/// `id`, by name: what a refused write must leave there.
#[cfg(feature = "harness")]
#[allow(clippy::type_complexity)]
pub fn archived(
    id: i32,
) -> diesel::dsl::Select<
    diesel::dsl::Order<
        diesel::dsl::Filter<
            schema::archive::items::table,
            diesel::dsl::Eq<schema::archive::items::id, i32>,
        >,
        schema::archive::items::name,
    >,
    (
        schema::archive::items::name,
        schema::archive::items::lock_version,
    ),
> {
    use diesel::prelude::*;
    use schema::archive::items;
    items::table
        .filter(items::id.eq(id))
        .order(items::name)
        .select((items::name, items::lock_version))
}

/// Ends session `session` from the server side, on `admin` (another
/// connection): `pg_terminate_backend` on PostgreSQL, `KILL` on MySQL/MariaDB.
#[cfg(feature = "harness")]
pub fn kill_session<C: diesel::Connection>(admin: &mut C, backend: &str, session: i64) {
    // `session` is an integer read from the server, never text.
    let sql = match backend {
        "postgres" => format!("SELECT pg_terminate_backend({session})"),
        _ => format!("KILL {session}"),
    };
    exec(admin, &sql);
}

/// Runs the same SQL on every backend (test fixtures only, never outside input).
#[cfg(feature = "harness")]
pub fn exec<C: diesel::Connection>(conn: &mut C, sql: &str) {
    conn.batch_execute(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
