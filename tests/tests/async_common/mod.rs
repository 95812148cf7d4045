//! What the `async_*` tests share: one module per backend with the blocking
//! and the async connection types, and a bb8 pool on a fresh test database.

#![allow(dead_code)]

use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::AsyncConnection;

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
    let manager = AsyncDieselConnectionManager::<A>::new_with_config(url, config);
    bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(std::time::Duration::from_secs(30))
        .build(manager)
        .await
        .expect("bb8 pool")
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

/// A patient retry policy for tests that contend on purpose.
pub fn patient() -> lockkit::RetryPolicy {
    lockkit::RetryPolicy::default()
        .max_attempts(10_000)
        .base_delay(std::time::Duration::from_millis(1))
        .max_delay(std::time::Duration::from_millis(20))
}

/// Inserts item 1 with `stock`, version 0 (each `async_*` test file that
/// uses it has diesel's and diesel-async's methods in scope).
#[allow(unused_macros)]
macro_rules! insert_item {
    ($conn:expr, $stock:expr) => {
        diesel::insert_into(lockkit_tests::schema::items::table)
            .values((
                lockkit_tests::schema::items::id.eq(1),
                lockkit_tests::schema::items::name.eq("widget"),
                lockkit_tests::schema::items::stock.eq($stock),
                lockkit_tests::schema::items::lock_version.eq(0),
            ))
            .execute($conn)
            .await
            .expect("insert")
    };
}
