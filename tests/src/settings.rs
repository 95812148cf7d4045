//! What a session's settings are, read back from the server.

use diesel::connection::LoadConnection;
use diesel::query_builder::SqlQuery;
use diesel::query_dsl::LoadQuery;
use diesel::RunQueryDsl;

/// A setting read as text.
#[derive(diesel::QueryableByName)]
pub struct Setting {
    /// The setting's value.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub value: String,
}

/// SQLite's `PRAGMA busy_timeout`.
#[derive(diesel::QueryableByName)]
pub struct BusyTimeout {
    /// The busy timeout in ms.
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub timeout: i32,
}

/// The session's lock timeout as the server holds it: PostgreSQL's
/// `lock_timeout` in ms, MySQL's `innodb_lock_wait_timeout` in s, SQLite's
/// `busy_timeout` in ms. `backend` is the backend's name (`BACKEND` in
/// [`backend_tests!`](crate::backend_tests)).
pub fn lock_timeout<C>(conn: &mut C, backend: &str) -> i64
where
    C: LoadConnection,
    SqlQuery: LoadQuery<'static, C, Setting> + LoadQuery<'static, C, BusyTimeout>,
{
    let sql = match backend {
        "postgres" => "SELECT setting AS value FROM pg_settings WHERE name = 'lock_timeout'",
        "mysql" => "SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS CHAR) AS value",
        _ => {
            let row = diesel::sql_query("PRAGMA busy_timeout").get_result::<BusyTimeout>(conn);
            return i64::from(row.unwrap().timeout);
        }
    };
    let row = diesel::sql_query(sql).get_result::<Setting>(conn);
    row.unwrap().value.parse().unwrap()
}
