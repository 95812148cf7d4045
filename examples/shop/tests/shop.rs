//! The shop on every backend: the naive strategy loses updates, the optimistic
//! one never does.
//!
//! SQLite runs on a temporary file. PostgreSQL and MySQL/MariaDB run on the
//! servers named by `PG_DATABASE_URL` and `MYSQL_DATABASE_URL` (defaults:
//! `postgres://postgres@127.0.0.1:5432/test`, `mysql://root@127.0.0.1:3306/test`),
//! each test in a database of its own, `shop_<pid>_<n>`, dropped at the end. A
//! server that cannot be reached fails the test; nothing is skipped.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::sync::atomic::{AtomicUsize, Ordering};

use shop::{Config, Report, Strategy};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// `shop_<pid>_<n>`: unique across the threads and processes of concurrent runs.
fn unique_name() -> String {
    format!(
        "shop_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs both strategies on `url`, one after the other (so the second also checks
/// that the tables are reset), and checks what the database holds.
fn naive_loses_updates_and_optimistic_does_not(url: &str) {
    let config = Config::default();
    let run = |strategy| {
        shop::run(url, strategy, &config).unwrap_or_else(|e| panic!("{strategy} on {url}: {e}"))
    };
    let naive = run(Strategy::Naive);
    let optimistic = run(Strategy::Optimistic);
    let table = shop::format_table(&[naive.clone(), optimistic.clone()]);
    eprintln!("{url}\n{table}");

    assert!(
        naive.oversold() > 0,
        "8 buyers with a 5 ms race window must lose updates:\n{table}"
    );
    assert!(
        naive.units_sold > naive.initial_stock - naive.final_stock,
        "{table}"
    );

    check_consistent(&optimistic, &table);
    assert!(
        optimistic.conflicts > 0,
        "the race must have happened:\n{table}"
    );
    assert!(
        optimistic.conflicts <= optimistic.retries + optimistic.exhausted,
        "every stale write is retried or ends in exhaustion:\n{table}"
    );
}

fn check_consistent(report: &Report, table: &str) {
    assert_eq!(report.oversold(), 0, "{table}");
    assert_eq!(
        report.units_sold + report.final_stock,
        report.initial_stock,
        "{table}"
    );
    assert!(report.final_stock >= 0, "{table}");
    assert!(report.orders > 0, "{table}");
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite() {
    /// Removes the database files, even when the test fails.
    struct Files(std::path::PathBuf);
    impl Drop for Files {
        fn drop(&mut self) {
            let _ = shop::remove_sqlite_files(&self.0);
        }
    }

    let files = Files(std::env::temp_dir().join(format!("{}.sqlite", unique_name())));
    shop::remove_sqlite_files(&files.0).expect("remove old files");
    naive_loses_updates_and_optimistic_does_not(&files.0.display().to_string());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres() {
    let db = server::Database::<diesel::PgConnection>::create(
        "PG_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
        "WITH (FORCE)",
    );
    naive_loses_updates_and_optimistic_does_not(&db.url);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql() {
    let db = server::Database::<diesel::MysqlConnection>::create(
        "MYSQL_DATABASE_URL",
        "mysql://root@127.0.0.1:3306/test",
        "",
    );
    naive_loses_updates_and_optimistic_does_not(&db.url);
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod server {
    use std::marker::PhantomData;

    use diesel::Connection;

    /// A database of its own on a server, dropped when this value is.
    pub struct Database<C: Connection> {
        /// The database's URL.
        pub url: String,
        admin_url: String,
        drop_statement: String,
        backend: PhantomData<C>,
    }

    impl<C: Connection> Database<C> {
        /// Creates `shop_<pid>_<n>` on the server that `var` (or `default`) names.
        /// Panics, failing the test, when the server cannot be reached.
        pub fn create(var: &str, default: &str, drop_options: &str) -> Self {
            let admin_url = std::env::var(var)
                .ok()
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| default.to_owned());
            let mut admin = C::establish(&admin_url).unwrap_or_else(|e| {
                panic!("cannot reach the server at {admin_url} ({e}); set {var} to a reachable one")
            });
            let name = super::unique_name();
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {admin_url}: {e}"));
            Database {
                url: with_database(&admin_url, &name),
                drop_statement: format!("DROP DATABASE IF EXISTS {name} {drop_options}"),
                admin_url,
                backend: PhantomData,
            }
        }
    }

    impl<C: Connection> Drop for Database<C> {
        fn drop(&mut self) {
            let dropped = C::establish(&self.admin_url)
                .map_err(|e| e.to_string())
                .and_then(|mut admin| {
                    admin
                        .batch_execute(&self.drop_statement)
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = dropped {
                eprintln!("{}: {e}", self.drop_statement);
            }
        }
    }

    /// Replaces the database name (the URL's path) of a server URL.
    fn with_database(url: &str, database: &str) -> String {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (url, None),
        };
        let scheme_end = base.find("://").map_or(0, |i| i + 3);
        let host_end = base[scheme_end..]
            .find('/')
            .map_or(base.len(), |i| scheme_end + i);
        let mut out = format!("{}/{database}", &base[..host_end]);
        if let Some(query) = query {
            out.push('?');
            out.push_str(query);
        }
        out
    }

    #[test]
    fn urls_get_the_database_replaced() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "shop_1_0"),
            "postgres://postgres@127.0.0.1:5432/shop_1_0"
        );
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306", "shop_1_0"),
            "mysql://root@127.0.0.1:3306/shop_1_0"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "shop_1_0"),
            "postgres://u:p@h/shop_1_0?sslmode=disable"
        );
    }
}
