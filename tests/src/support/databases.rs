//! Databases a process creates for itself on a server, next to the database
//! of [`admin_url`](super::admin_url), and drops when it is done: the suite's
//! `lk_…` (one per test) and the benchmark's `lkbench_…`. Each name carries its
//! process's pid; a database whose process no longer runs (killed before it
//! could drop it) is an orphan, and the next process drops it.

use diesel::query_builder::SqlQuery;
use diesel::query_dsl::LoadQuery;
use diesel::{Connection, QueryResult, RunQueryDsl};

use super::Backend;

/// A database's name, as [`drop_orphans`] lists them.
#[derive(Debug, diesel::QueryableByName)]
pub struct DatabaseName {
    /// The name.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub name: String,
}

/// `DROP DATABASE IF EXISTS name` on a server; PostgreSQL's `WITH (FORCE)`
/// closes the sessions still connected to it.
pub fn drop_database_sql(backend: Backend, name: &str) -> String {
    match backend {
        Backend::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        Backend::Mysql | Backend::Sqlite => format!("DROP DATABASE IF EXISTS {name}"),
    }
}

/// The server's databases whose names start with `prefix`, `AS name`.
fn list_sql(backend: Backend, prefix: &str) -> String {
    // `_` matches any one character in `LIKE`; the prefix means its own.
    let pattern = prefix.replace('_', "\\_");
    match backend {
        Backend::Postgres => {
            format!("SELECT datname AS name FROM pg_database WHERE datname LIKE '{pattern}%'")
        }
        Backend::Mysql | Backend::Sqlite => format!(
            "SELECT SCHEMA_NAME AS name FROM information_schema.SCHEMATA \
             WHERE SCHEMA_NAME LIKE '{pattern}%'"
        ),
    }
}

/// Whether the process `pid` has ended: it is not this one and has no
/// `/proc/<pid>`.
fn has_ended(pid: u32) -> bool {
    pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Drops, through the admin connection `admin`, the databases named
/// `<prefix>…` whose process has ended: `owner_pid` reads the pid from a name
/// (`None`: not one of ours). Every orphan is tried; the first error, if any,
/// is returned.
pub fn drop_orphans<C>(
    admin: &mut C,
    backend: Backend,
    prefix: &str,
    owner_pid: impl Fn(&str) -> Option<u32>,
) -> QueryResult<()>
where
    C: Connection,
    for<'a> SqlQuery: LoadQuery<'a, C, DatabaseName>,
{
    let names = diesel::sql_query(list_sql(backend, prefix)).load::<DatabaseName>(admin)?;
    let mut outcome = Ok(());
    for db in names {
        if owner_pid(&db.name).is_some_and(has_ended) {
            let dropped = admin.batch_execute(&drop_database_sql(backend, &db.name));
            if outcome.is_ok() {
                outcome = dropped;
            }
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_matched_literally() {
        assert_eq!(
            list_sql(Backend::Postgres, "lk_"),
            "SELECT datname AS name FROM pg_database WHERE datname LIKE 'lk\\_%'"
        );
        assert_eq!(
            list_sql(Backend::Mysql, "lkbench_"),
            "SELECT SCHEMA_NAME AS name FROM information_schema.SCHEMATA \
             WHERE SCHEMA_NAME LIKE 'lkbench\\_%'"
        );
    }

    #[test]
    fn this_process_has_not_ended() {
        assert!(!has_ended(std::process::id()));
    }
}
