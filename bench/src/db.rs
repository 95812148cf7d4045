//! The backends, and a fresh database per backend for one benchmark run,
//! removed at the end.
//!
//! [`Backend`], [`admin_url`] and [`with_database`] are the workspace's shared
//! ones; [`report_name`] names a backend as the report does (MariaDB, the
//! server the benchmark measures).
//!
//! PostgreSQL and MariaDB/MySQL are found through `PG_DATABASE_URL` and
//! `MYSQL_DATABASE_URL` (defaults: `postgres://postgres@127.0.0.1:5432/test`,
//! `mysql://root@127.0.0.1:3306/test`); the benchmark creates `lkbench_<pid>` next
//! to that database and drops it when done. Databases left by a benchmark process
//! that no longer runs are dropped first. SQLite is a file in the temp directory.

pub use lockkit_tests::support::{admin_url, with_database, Backend};
use lockkit_tests::support::{
    admin_url_var, drop_database_sql, drop_orphans, remove_sqlite_files, DatabaseName,
};

use diesel::connection::SimpleConnection;
use diesel::Connection;

use crate::error::BenchError;

/// The name the report gives `backend`: the server the benchmark measures
/// (`MariaDB`, where [`Backend::title`] says `MySQL/MariaDB`).
pub fn report_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Mysql => "MariaDB",
        Backend::Postgres | Backend::Sqlite => backend.title(),
    }
}

/// A database made for this run; dropped (or its files removed) on drop.
#[derive(Debug)]
pub struct BenchDb {
    /// Which backend.
    pub backend: Backend,
    /// The URL (SQLite: the file path).
    pub url: String,
    /// The database's name.
    pub name: String,
    admin_url: String,
}

/// The pid inside `lkbench_<pid>_<tag>`, if the name is ours.
fn owner_pid(database: &str) -> Option<u32> {
    database
        .strip_prefix("lkbench_")?
        .split('_')
        .next()?
        .parse()
        .ok()
}

/// On a server, through a connection to `admin_url`: drops the databases of
/// benchmark processes that no longer run, then creates `name` afresh; returns
/// its URL.
fn create_on_server<C>(backend: Backend, admin_url: &str, name: &str) -> Result<String, BenchError>
where
    C: Connection,
    diesel::query_builder::SqlQuery: for<'a> diesel::query_dsl::LoadQuery<'a, C, DatabaseName>,
{
    let mut admin = C::establish(admin_url).map_err(|e| {
        BenchError::Other(format!(
            "cannot reach {} at {admin_url} ({e}); set {}",
            backend.title(),
            admin_url_var(backend).unwrap_or_default()
        ))
    })?;
    drop_orphans(&mut admin, backend, "lkbench_", owner_pid)?;
    admin.batch_execute(&drop_database_sql(backend, name))?;
    admin.batch_execute(&format!("CREATE DATABASE {name}"))?;
    Ok(with_database(admin_url, name))
}

impl BenchDb {
    /// Creates an empty database `lkbench_<pid>_<tag>` on the backend's server.
    pub fn create(backend: Backend, tag: &str) -> Result<BenchDb, BenchError> {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("lkbench_{}_{tag}{n}", std::process::id());
        // Empty for SQLite, which has no server.
        let admin_url = admin_url(backend).unwrap_or_default();
        let url = match backend {
            Backend::Postgres => {
                create_on_server::<diesel::PgConnection>(backend, &admin_url, &name)?
            }
            Backend::Mysql => {
                create_on_server::<diesel::MysqlConnection>(backend, &admin_url, &name)?
            }
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.sqlite"));
                let url = path.display().to_string();
                let _ = remove_sqlite_files(&path);
                let mut conn = diesel::SqliteConnection::establish(&url)?;
                conn.batch_execute("PRAGMA journal_mode = WAL;")?;
                url
            }
        };
        Ok(BenchDb {
            backend,
            url,
            name,
            admin_url,
        })
    }
}

/// Drops `name` on a server, if it can be reached.
fn drop_on_server<C: Connection>(backend: Backend, admin_url: &str, name: &str) {
    if let Ok(mut admin) = C::establish(admin_url) {
        let _ = admin.batch_execute(&drop_database_sql(backend, name));
    }
}

impl Drop for BenchDb {
    fn drop(&mut self) {
        let (backend, url, name) = (self.backend, &self.admin_url, &self.name);
        match backend {
            Backend::Postgres => drop_on_server::<diesel::PgConnection>(backend, url, name),
            Backend::Mysql => drop_on_server::<diesel::MysqlConnection>(backend, url, name),
            Backend::Sqlite => {
                let _ = remove_sqlite_files(std::path::Path::new(&self.url));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_recognised_by_pid() {
        assert_eq!(owner_pid("lkbench_123_run"), Some(123));
        assert_eq!(owner_pid("lk_test_1_2"), None);
    }
}
