//! What a session's settings are, read back from the server.

use diesel::connection::LoadConnection;
use diesel::query_builder::SqlQuery;
use diesel::query_dsl::LoadQuery;
use diesel::RunQueryDsl;

/// A setting read as a number (the query names its column `value`).
#[derive(diesel::QueryableByName)]
pub struct Setting {
    /// The setting's value.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub value: i64,
}

/// The query that reads the session's lock timeout as the server holds it, as a
/// [`Setting`]: PostgreSQL's `lock_timeout` in ms, MySQL's
/// `innodb_lock_wait_timeout` in s, SQLite's `busy_timeout` in ms. `backend` is
/// the backend's name (`BACKEND` in [`backend_tests!`](crate::backend_tests)).
/// Run it on a blocking connection with [`lock_timeout`], or on an async one.
pub fn lock_timeout_query(backend: &str) -> SqlQuery {
    diesel::sql_query(match backend {
        "postgres" => {
            "SELECT CAST(setting AS BIGINT) AS value FROM pg_settings WHERE name = 'lock_timeout'"
        }
        "mysql" => "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED) AS value",
        _ => "SELECT timeout AS value FROM pragma_busy_timeout",
    })
}

/// The session's lock timeout on `conn`: [`lock_timeout_query`]'s answer.
pub fn lock_timeout<C>(conn: &mut C, backend: &str) -> i64
where
    C: LoadConnection,
    SqlQuery: LoadQuery<'static, C, Setting>,
{
    let row = lock_timeout_query(backend).get_result::<Setting>(conn);
    row.unwrap().value
}

/// A server's version string (the query names its column `version`).
#[derive(diesel::QueryableByName)]
pub struct Version {
    /// `VERSION()`'s answer.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub version: String,
}

/// Whether the server behind `conn` is MariaDB, whose settings differ from
/// MySQL's under the one `mysql` backend: `backend` (as [`lock_timeout_query`]
/// takes it) is `mysql` and the server's `VERSION()` says so.
pub fn is_mariadb<C>(conn: &mut C, backend: &str) -> bool
where
    C: LoadConnection,
    SqlQuery: LoadQuery<'static, C, Version>,
{
    backend == "mysql"
        && diesel::sql_query("SELECT VERSION() AS version")
            .get_result::<Version>(conn)
            .unwrap()
            .version
            .contains("MariaDB")
}
