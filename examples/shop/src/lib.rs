//! # shop: the overselling problem, and its cure
//!
//! A shop has one item with limited stock. Several buyers (threads sharing an
//! r2d2 pool) buy random quantities at the same time. Each purchase reads the
//! stock, checks that enough is left, and writes the new stock plus an order row.
//!
//! * [`Strategy::Naive`] reads, thinks, and writes `stock = <what I read> - qty`.
//!   Two buyers who read the same stock both write, one write is lost, and the
//!   shop sells more units than it ever had.
//! * [`Strategy::Optimistic`] does the same with a `#[derive(Versioned)]` model:
//!   the write checks the version it read, a lost race is `lockkit::Error::Stale`,
//!   and [`lockkit::retry()`] re-reads and tries again.
//!
//! [`run`] plays one strategy on a fresh `items`/`orders` schema and counts, from
//! the database, what was sold and what is left; [`Report::oversold`] is the
//! number of units sold that were never in stock.
//!
//! ```no_run
//! let report = shop::run("shop.sqlite", shop::Strategy::Optimistic, &shop::Config::default())?;
//! assert_eq!(report.oversold(), 0);
//! print!("{}", shop::format_table(&[report]));
//! # Ok::<(), shop::ShopError>(())
//! ```
//!
//! The backend follows the URL: `postgres://` or `postgresql://` is PostgreSQL,
//! `mysql://` is MySQL/MariaDB, anything else is a SQLite file path.

#![warn(missing_docs)]

mod error;
pub mod models;
mod report;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod runner;
pub mod schema;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod strategies;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lockkit::RetryPolicy;

pub use error::ShopError;
pub use report::{format_table, Report};

/// The primary key of the one item on sale.
pub const ITEM_ID: i32 = 1;

/// How buyers make a purchase. Adding a strategy means one variant here, one
/// function in `strategies.rs`, and one arm in its `match`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Read the stock, check it, write `stock = read - qty`: loses updates.
    Naive,
    /// `#[derive(Versioned)]` + `update_versioned` inside `lockkit::retry`.
    Optimistic,
}

impl Strategy {
    /// Every strategy, in the order the program runs them.
    pub const ALL: &'static [Strategy] = &[Strategy::Naive, Strategy::Optimistic];

    /// The strategy's name, as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::Optimistic => "optimistic",
        }
    }

    /// Whether this strategy is meant to prevent lost updates (all but `naive`).
    pub fn is_safe(self) -> bool {
        !matches!(self, Strategy::Naive)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = ShopError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .iter()
            .copied()
            .find(|strategy| strategy.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ShopError::Usage(format!("unknown strategy `{s}`")))
    }
}

/// The database server a URL points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `postgres://…` or `postgresql://…`.
    Postgres,
    /// `mysql://…` (MySQL or MariaDB).
    Mysql,
    /// Anything else: a SQLite file path (an optional `sqlite://` prefix is removed).
    Sqlite,
}

impl Backend {
    /// The backend a database URL selects.
    pub fn from_url(url: &str) -> Backend {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("mysql://") {
            Backend::Mysql
        } else {
            Backend::Sqlite
        }
    }

    /// The backend's short name.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The knobs of one run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of buyer threads (each holds one pooled connection).
    pub buyers: usize,
    /// Units in stock at the start.
    pub stock: i32,
    /// Purchases each buyer tries before going home (a buyer stops earlier when
    /// the item is sold out).
    pub attempts: u32,
    /// Time between reading the stock and writing it: widens the race window so
    /// the naive strategy reliably loses updates. Every strategy waits the same.
    pub think: Duration,
    /// The retry policy of the optimistic strategy.
    pub retry: RetryPolicy,
}

impl Default for Config {
    /// 8 buyers, 100 units, 50 purchases per buyer, 5 ms think time,
    /// `RetryPolicy::default()`.
    fn default() -> Self {
        Config {
            buyers: 8,
            stock: 100,
            attempts: 50,
            think: Duration::from_millis(5),
            retry: RetryPolicy::default(),
        }
    }
}

/// Plays `strategy` on the database at `url`: applies the migrations, resets the
/// tables (one item with `config.stock` units, no orders), lets `config.buyers`
/// threads buy until the item is sold out, and reports what the database holds.
///
/// The URL selects the backend (see [`Backend::from_url`]); a backend whose cargo
/// feature is off is a [`ShopError::Unsupported`].
pub fn run(url: &str, strategy: Strategy, config: &Config) -> Result<Report, ShopError> {
    if config.buyers == 0 {
        return Err(ShopError::Usage("at least one buyer is needed".into()));
    }
    if config.stock < 0 {
        return Err(ShopError::Usage("the stock cannot be negative".into()));
    }
    match Backend::from_url(url) {
        #[cfg(feature = "postgres")]
        Backend::Postgres => runner::run_on::<diesel::PgConnection>(url, strategy, config),
        #[cfg(feature = "mysql")]
        Backend::Mysql => runner::run_on::<diesel::MysqlConnection>(url, strategy, config),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            runner::run_on::<diesel::SqliteConnection>(path, strategy, config)
        }
        #[allow(unreachable_patterns)]
        backend => {
            let _ = (strategy, config);
            Err(ShopError::Unsupported(backend))
        }
    }
}

/// Removes a SQLite database file and its `-wal`, `-shm` and `-journal` companions,
/// so the next [`run`] starts from an empty file. Missing files are fine.
pub fn remove_sqlite_files(path: &std::path::Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}
