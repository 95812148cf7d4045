//! The shop on every backend: the naive strategy loses updates, every other one
//! never does; `basket-naive` deadlocks on the servers (and is retried), and
//! `basket-lock-all` never does.
//!
//! SQLite runs on a temporary file. PostgreSQL and MySQL/MariaDB run on the
//! servers named by `PG_DATABASE_URL` and `MYSQL_DATABASE_URL` (defaults:
//! `postgres://postgres@127.0.0.1:5432/test`, `mysql://root@127.0.0.1:3306/test`),
//! each test in a database of its own, `shop_<pid>_<n>`, dropped at the end. A
//! server that cannot be reached fails the test; nothing is skipped.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::sync::atomic::{AtomicUsize, Ordering};

use shop::{Backend, Config, Report, Strategy};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// `shop_<pid>_<n>`: unique across the threads and processes of concurrent runs.
fn unique_name() -> String {
    format!(
        "shop_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Plays `strategies` on `url` one after the other (so each run also checks that
/// the tables are reset) and prints the table.
fn play(url: &str, strategies: &[Strategy], config: &Config) -> (Vec<Report>, String) {
    let reports: Vec<Report> = strategies
        .iter()
        .map(|&strategy| {
            shop::run(url, strategy, config).unwrap_or_else(|e| panic!("{strategy} on {url}: {e}"))
        })
        .collect();
    let table = shop::format_table(&reports);
    eprintln!("{url}\n{table}");
    for report in &reports {
        assert_eq!(report.note, None, "{table}");
    }
    (reports, table)
}

/// The single-item strategies: naive oversells; optimistic, pessimistic, atomic
/// and nowait sell exactly the stock.
fn one_item(url: &str) {
    let (reports, table) = play(
        url,
        &[
            Strategy::Naive,
            Strategy::Optimistic,
            Strategy::Pessimistic,
            Strategy::Atomic,
            Strategy::Nowait,
        ],
        &Config::default(),
    );
    let [naive, optimistic, pessimistic, atomic, nowait] = &reports[..] else {
        unreachable!()
    };

    assert!(
        naive.oversold() > 0,
        "8 buyers with a 5 ms race window must lose updates:\n{table}"
    );
    assert!(
        naive.units_sold > naive.initial_stock - naive.final_stock,
        "{table}"
    );

    for report in [optimistic, pessimistic, atomic, nowait] {
        check_consistent(report, &table);
        assert_eq!(report.items, 1, "{table}");
        assert_eq!(report.deadlocks, 0, "{table}");
    }

    assert!(
        optimistic.conflicts > 0,
        "the race must have happened:\n{table}"
    );
    assert!(
        optimistic.conflicts <= optimistic.retries + optimistic.exhausted,
        "every stale write is retried or ends in exhaustion:\n{table}"
    );

    // Waiting for the lock (or letting the database check) leaves nothing to retry.
    for report in [pessimistic, atomic] {
        assert_eq!(
            (report.conflicts, report.retries, report.exhausted),
            (0, 0, 0),
            "{table}"
        );
        assert_eq!(report.final_stock, 0, "the stock sells out:\n{table}");
    }

    assert!(
        nowait.conflicts > 0,
        "8 buyers on one row must find it locked:\n{table}"
    );
    assert!(
        nowait.conflicts <= nowait.retries + nowait.exhausted,
        "every busy row is retried or ends in exhaustion:\n{table}"
    );
}

/// The basket strategies: neither oversells any item; `basket-lock-all` never
/// deadlocks, `basket-naive` deadlocks on PostgreSQL and MySQL (SQLite serializes
/// writers and cannot).
fn baskets(url: &str) {
    let config = Config {
        buyers: 6,
        stock: 40,
        items: 4,
        attempts: 40,
        ..Config::default()
    };
    let (reports, table) = play(
        url,
        &[Strategy::BasketNaive, Strategy::BasketLockAll],
        &config,
    );
    let [naive, lock_all] = &reports[..] else {
        unreachable!()
    };
    for report in [naive, lock_all] {
        check_consistent(report, &table);
        assert_eq!(report.items, 4, "{table}");
        assert_eq!(report.initial_stock, 4 * 40, "{table}");
        assert_eq!(report.conflicts, 0, "{table}");
        assert!(
            report.units_sold >= 2 * report.orders,
            "every basket holds at least 2 units:\n{table}"
        );
    }

    assert_eq!(
        (lock_all.deadlocks, lock_all.retries, lock_all.exhausted),
        (0, 0, 0),
        "locking in key order cannot deadlock:\n{table}"
    );

    if Backend::from_url(url) == Backend::Sqlite {
        assert_eq!(
            naive.deadlocks, 0,
            "BEGIN IMMEDIATE serializes writers:\n{table}"
        );
        assert_eq!(naive.retries, 0, "{table}");
    } else {
        assert!(
            naive.deadlocks > 0,
            "6 buyers locking 2-3 of 4 items in random order, with a pause after the \
             first lock, must deadlock:\n{table}"
        );
        assert!(
            naive.deadlocks <= naive.retries + naive.exhausted,
            "every deadlock is retried or ends in exhaustion:\n{table}"
        );
    }
}

fn check_consistent(report: &Report, table: &str) {
    assert_eq!(report.oversold(), 0, "{table}");
    assert_eq!(
        report.units_sold + report.final_stock,
        report.initial_stock,
        "{table}"
    );
    assert!(report.final_stock >= 0, "{table}");
    assert!(
        report.lowest_stock >= 0,
        "no item may go below zero:\n{table}"
    );
    assert!(report.is_consistent(), "{table}");
    assert!(report.orders > 0, "{table}");
}

#[cfg(feature = "sqlite")]
mod sqlite {
    /// A temporary database file, removed with its companions even when the test
    /// fails.
    struct Files(std::path::PathBuf);

    impl Files {
        fn new() -> Files {
            let files =
                Files(std::env::temp_dir().join(format!("{}.sqlite", super::unique_name())));
            shop::remove_sqlite_files(&files.0).expect("remove old files");
            files
        }

        fn url(&self) -> String {
            self.0.display().to_string()
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = shop::remove_sqlite_files(&self.0);
        }
    }

    #[test]
    fn one_item() {
        super::one_item(&Files::new().url());
    }

    #[test]
    fn baskets() {
        super::baskets(&Files::new().url());
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    fn database() -> super::server::Database<diesel::PgConnection> {
        super::server::Database::create(
            "PG_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/test",
            "WITH (FORCE)",
        )
    }

    #[test]
    fn one_item() {
        super::one_item(&database().url);
    }

    #[test]
    fn baskets() {
        super::baskets(&database().url);
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    fn database() -> super::server::Database<diesel::MysqlConnection> {
        super::server::Database::create(
            "MYSQL_DATABASE_URL",
            "mysql://root@127.0.0.1:3306/test",
            "",
        )
    }

    #[test]
    fn one_item() {
        super::one_item(&database().url);
    }

    #[test]
    fn baskets() {
        super::baskets(&database().url);
    }
}

/// A basket strategy needs at least two items; the check comes before any
/// connection is made.
#[test]
fn baskets_need_two_items() {
    let config = Config {
        items: 1,
        ..Config::default()
    };
    let err = shop::run("unused.sqlite", Strategy::BasketLockAll, &config).unwrap_err();
    assert!(matches!(err, shop::ShopError::Usage(_)), "{err}");
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
