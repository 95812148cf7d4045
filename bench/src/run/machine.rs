//! What the numbers were measured on: the machine, and the servers' versions and
//! settings, queried.

use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::error::BenchError;
use crate::vocabulary::Backend;

/// The machine.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// Logical CPUs (`nproc`).
    pub cpus: usize,
    /// `MemTotal` from `/proc/meminfo`.
    pub memory: String,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// `/proc/loadavg` before the run.
    pub load_before: String,
    /// `/proc/loadavg` after the run.
    pub load_after: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The first three fields of `/proc/loadavg`.
pub fn loadavg() -> String {
    read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

impl Machine {
    /// Reads `/proc`.
    pub fn read() -> Machine {
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        let mem_kib: Option<u64> = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok());
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory: mem_kib
                .map(|k| format!("{:.1} GiB", k as f64 / 1024.0 / 1024.0))
                .unwrap_or_else(|| "unknown".into()),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_else(|| "unknown".into()),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            load_before: loadavg(),
            load_after: String::new(),
        }
    }
}

/// A server's version and the settings that matter here.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// Which backend.
    pub backend: Backend,
    /// Its version string.
    pub version: String,
    /// (setting, value) pairs, as queried.
    pub settings: Vec<(String, String)>,
}

#[derive(QueryableByName)]
struct Value {
    #[diesel(sql_type = Text)]
    value: String,
}

/// The text a query returns as `value`.
fn value<C: Connection>(conn: &mut C, sql: &str) -> QueryResult<String>
where
    diesel::query_builder::SqlQuery: for<'a> diesel::query_dsl::LoadQuery<'a, C, Value>,
{
    diesel::sql_query(sql)
        .get_result::<Value>(conn)
        .map(|v| v.value)
}

/// A setting's value, or `n/a` where the server does not have it.
fn setting<C: Connection>(conn: &mut C, sql: &str) -> String
where
    diesel::query_builder::SqlQuery: for<'a> diesel::query_dsl::LoadQuery<'a, C, Value>,
{
    value(conn, sql).unwrap_or_else(|_| "n/a".into())
}

/// `(name, value)` of each of `names`, `query` selecting its value (`n/a` where
/// the server does not have it).
fn settings<C: Connection>(
    conn: &mut C,
    names: &[&str],
    query: impl Fn(&str) -> String,
) -> Vec<(String, String)>
where
    diesel::query_builder::SqlQuery: for<'a> diesel::query_dsl::LoadQuery<'a, C, Value>,
{
    names
        .iter()
        .map(|name| (name.to_string(), setting(conn, &query(name))))
        .collect()
}

#[derive(QueryableByName)]
struct PgSetting {
    #[diesel(sql_type = Text)]
    value: String,
    #[diesel(sql_type = Text)]
    setting: String,
    #[diesel(sql_type = Text)]
    reset: String,
    #[diesel(sql_type = Text)]
    unit: String,
}

impl ServerInfo {
    /// PostgreSQL: `version()`, server settings, and this benchmark's session values.
    pub fn postgres(conn: &mut PgConnection) -> Result<ServerInfo, BenchError> {
        let version = value(conn, "SELECT version() AS value")?;
        let mut settings = Vec::new();
        for name in [
            "max_connections",
            "shared_buffers",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "deadlock_timeout",
            "default_transaction_isolation",
            "autovacuum",
            "lock_timeout",
        ] {
            let row = diesel::sql_query(format!(
                "SELECT current_setting('{name}') AS value, setting, \
                 COALESCE(reset_val, '') AS reset, COALESCE(unit, '') AS unit \
                 FROM pg_settings WHERE name = '{name}'"
            ))
            .get_result::<PgSetting>(conn)?;
            if row.setting != row.reset {
                let unit = if row.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", row.unit)
                };
                settings.push((
                    name.to_owned(),
                    format!(
                        "{} in the benchmark's sessions (server: {}{unit})",
                        row.value, row.reset
                    ),
                ));
            } else {
                settings.push((name.to_owned(), row.value));
            }
        }
        Ok(ServerInfo {
            backend: Backend::Postgres,
            version,
            settings,
        })
    }

    /// MariaDB/MySQL: `VERSION()` and global variables.
    pub fn mysql(conn: &mut MysqlConnection) -> Result<ServerInfo, BenchError> {
        let version = value(conn, "SELECT VERSION() AS value")?;
        let mut settings = settings(
            conn,
            &[
                "max_connections",
                "innodb_buffer_pool_size",
                "innodb_flush_log_at_trx_commit",
                "innodb_flush_method",
                "sync_binlog",
                "log_bin",
                "innodb_deadlock_detect",
                "tx_isolation",
            ],
            |name| format!("SELECT CAST(@@GLOBAL.{name} AS CHAR) AS value"),
        );
        let timeout = |scope: &str| {
            format!("SELECT CAST(@@{scope}.innodb_lock_wait_timeout AS CHAR) AS value")
        };
        let session = value(conn, &timeout("SESSION"))?;
        let global = value(conn, &timeout("GLOBAL"))?;
        settings.push((
            "innodb_lock_wait_timeout".into(),
            format!("{session} s in the benchmark's sessions (server: {global} s)"),
        ));
        Ok(ServerInfo {
            backend: Backend::Mysql,
            version,
            settings,
        })
    }

    /// SQLite: `sqlite_version()` and the session's pragmas.
    pub fn sqlite(conn: &mut SqliteConnection) -> Result<ServerInfo, BenchError> {
        let version = value(conn, "SELECT sqlite_version() AS value")?;
        let mut settings = settings(conn, &["journal_mode", "synchronous"], |name| {
            format!("SELECT CAST({name} AS TEXT) AS value FROM pragma_{name}")
        });
        // `synchronous` is a number: its name too.
        if let Some((_, level)) = settings.iter_mut().find(|(name, _)| name == "synchronous") {
            let mode = level
                .parse()
                .ok()
                .and_then(|n: usize| ["OFF", "NORMAL", "FULL"].get(n));
            if let Some(mode) = mode {
                *level = format!("{level} ({mode})");
            }
        }
        #[derive(QueryableByName)]
        struct Timeout {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            timeout: i32,
        }
        let timeout = diesel::sql_query("PRAGMA busy_timeout")
            .get_result::<Timeout>(conn)
            .map_or("n/a".into(), |t| format!("{} ms", t.timeout));
        settings.push(("busy_timeout".into(), timeout));
        settings.push((
            "file".into(),
            "in the temp directory (bundled SQLite, compiled into the benchmark)".into(),
        ));
        Ok(ServerInfo {
            backend: Backend::Sqlite,
            version: format!("SQLite {version}"),
            settings,
        })
    }
}
