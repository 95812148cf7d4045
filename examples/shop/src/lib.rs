//! # shop: the overselling problem, and its cures
//!
//! A shop has limited stock. Several buyers (threads sharing an r2d2 pool) buy
//! random quantities at the same time. Each purchase checks that enough is left,
//! writes the new stock and inserts an order row, in one transaction.
//!
//! ## One item
//!
//! Item [`ITEM_ID`] starts with [`Config::stock`] units; buyers order 1 to 3 units.
//! `qty`, `$id`, `$read` and `$fresh` stand for bound values; every strategy
//! pauses for [`Config::think`] once per purchase, so the timings compare. Every
//! order is `INSERT INTO orders (item_id, qty, basket_id) VALUES ($id, qty,
//! DEFAULT)` (SQLite leaves `basket_id` out), written `INSERT INTO orders ...`
//! below.
//!
//! * [`Strategy::Naive`] reads, thinks, and writes what it computed. Two buyers
//!   who read the same stock both write, one write is lost, and the shop sells
//!   more units than it ever had.
//!   ```sql
//!   SELECT stock FROM items WHERE id = $id;                 -- think
//!   BEGIN; UPDATE items SET stock = $read - qty WHERE id = $id;
//!          INSERT INTO orders ...; COMMIT;
//!   ```
//! * [`Strategy::Optimistic`] does the same with a `#[derive(Versioned)]` model:
//!   the write checks the version it read, a lost race is `lockkit::Error::Stale`,
//!   and [`lockkit::retry()`] re-reads and tries again.
//!   ```sql
//!   SELECT id, name, stock, lock_version FROM items WHERE id = $id;   -- think
//!   BEGIN; UPDATE items SET name = $name, stock = $read - qty,
//!                  lock_version = lock_version + 1
//!            WHERE id = $id AND lock_version = $version;       -- 0 rows: Stale, retry
//!          INSERT INTO orders ...; COMMIT;
//!   ```
//! * [`Strategy::Pessimistic`] calls
//!   [`item.with_lock`](lockkit::Lockable::with_lock), which locks the row, hands
//!   the closure the *fresh* row, and commits when the closure returns. Buyers of
//!   the same item queue at the lock; the check, the think and the write happen
//!   while holding it. The first read is the buyer's (possibly stale) view of the
//!   item; `with_lock` only takes its key.
//!   ```sql
//!   SELECT id, name, stock, lock_version FROM items WHERE id = $id;   -- the buyer's view
//!   BEGIN;                                                  -- SQLite: BEGIN IMMEDIATE
//!   SELECT id, name, stock, lock_version FROM items WHERE id = $id
//!      FOR UPDATE;                                          -- SQLite: no clause
//!   UPDATE items SET lock_version = lock_version + 1
//!      WHERE id = $id AND lock_version = $fresh_version;    -- the lock moves the version
//!   -- (PostgreSQL: the two as one UPDATE .. RETURNING; docs/SQL.md)
//!   -- check, think
//!   UPDATE items SET stock = $fresh - qty WHERE id = $id; INSERT INTO orders ...; COMMIT;
//!   ```
//! * [`Strategy::Atomic`] lets the database do the check and the arithmetic in
//!   one statement, through [`Versioned::update_if`](lockkit::Versioned::update_if)
//!   (which also moves the version, as `items` is versioned); no read before the write, so
//!   nothing can change in between. In the order's transaction lockkit then reads
//!   the row's new version (under the lock the `UPDATE` holds), so that a struct
//!   read later in a transaction that rolls back is never taken for current.
//!   Zero rows matched is
//!   `lockkit::Error::NoRowMatched`: not enough stock (only then is the stock read,
//!   to tell "sold out" from "not enough"). The think pause comes before the
//!   transaction.
//!   ```sql
//!   -- think
//!   BEGIN; UPDATE items SET stock = stock - qty, lock_version = lock_version + 1
//!            WHERE id = $id AND stock >= qty;
//!          SELECT lock_version FROM items WHERE id = $id;   -- lockkit's record
//!          INSERT INTO orders ...; COMMIT;
//!   ```
//! * [`Strategy::Nowait`] is pessimistic with
//!   `LockOptions::default().nowait()`: a row someone else holds is
//!   `lockkit::Error::Busy` at once instead of a wait (MariaDB reports it as a
//!   lock wait timeout, which `with_lock` with `nowait()` also turns into `Busy`), and
//!   [`lockkit::retry()`] backs off and tries again. Busy rows are the report's
//!   conflicts.
//!   ```sql
//!   SELECT id, name, stock, lock_version FROM items WHERE id = $id;   -- the buyer's view
//!   BEGIN;                                      -- SQLite: BEGIN IMMEDIATE, busy_timeout 0
//!   SELECT ... FROM items WHERE id = $id FOR UPDATE NOWAIT;  -- locked: Busy, retry
//!   UPDATE items SET lock_version = lock_version + 1 WHERE id = $id AND lock_version = $v;
//!   -- check, think
//!   UPDATE items SET stock = $fresh - qty WHERE id = $id; INSERT INTO orders ...; COMMIT;
//!   ```
//!
//! ## Baskets: several items per order
//!
//! The shop has [`Config::items`] items, each with [`Config::stock`] units. A
//! buyer orders a basket of 2 or 3 distinct items, in random order, with 1 to 3
//! units of each; the basket is bought whole or not at all. Its lines are order
//! rows that share a `basket_id`. Both basket strategies hold every row of the
//! basket locked while they check, think, and write, so neither oversells; they
//! differ in how they take the locks. Both retry deadlocks with
//! [`lockkit::retry()`] and count them.
//!
//! Both first look at the shelf without locking, `SELECT ... FROM items WHERE id
//! IN (..)`: the stock only goes down, so a basket that does not fit now never
//! will, and it is refused without taking a lock. A basket refused under the
//! locks reads `SELECT COUNT(*) FROM items WHERE stock > 0` to know whether the
//! shop is sold out (the buyer then goes home).
//!
//! * [`Strategy::BasketNaive`] locks the items one at a time, in the buyer's
//!   order, and thinks after the first lock. Buyer A holds item 1 and waits for
//!   item 2 while buyer B holds item 2 and waits for item 1: a **deadlock**. The
//!   server aborts one of them (`lockkit::Error::Deadlock`), which
//!   [`lockkit::retry()`] runs again; the report counts the deadlocks.
//!   PostgreSQL only looks for deadlocks after a lock wait of `deadlock_timeout`
//!   (1 s by default), so there every deadlock also costs that long; the basket
//!   runs set it to [`Config::deadlock_timeout`] (20 ms) where the role may.
//!   ```sql
//!   BEGIN;                                                     -- SQLite: BEGIN IMMEDIATE
//!   SELECT ... FROM items WHERE id = $first FOR UPDATE;        -- think
//!   SELECT ... FROM items WHERE id = $second FOR UPDATE;       -- may deadlock: retry
//!   SELECT ... FROM items WHERE id = $third FOR UPDATE;
//!   -- check
//!   UPDATE items SET stock = $fresh - qty, lock_version = lock_version + 1
//!      WHERE id = $each AND lock_version = $fresh_version;     -- per line
//!   INSERT INTO orders ...;                                    -- per line, basket_id = $basket
//!   COMMIT;
//!   ```
//! * [`Strategy::BasketLockAll`] takes all the locks in one statement,
//!   [`Lockable::lock_all`](lockkit::Lockable::lock_all) inside
//!   [`lockkit::locked_transaction`], which locks in primary-key order. Two
//!   buyers then always lock their common items in the same order, and a cycle
//!   of waits cannot form: no deadlocks, no retries.
//!   ```sql
//!   BEGIN;                                                     -- SQLite: BEGIN IMMEDIATE
//!   SELECT ... FROM items WHERE id = ANY($ids) ORDER BY id FOR UPDATE;  -- MySQL: id IN (?, ?, ?)
//!   UPDATE items SET lock_version = lock_version + 1
//!      WHERE id = $each AND lock_version = $locked_version;    -- per row: the lock moves the version
//!   -- check, think
//!   UPDATE items SET stock = $fresh - qty, lock_version = lock_version + 1
//!      WHERE id = $each AND lock_version = $fresh_version;     -- per line
//!   INSERT INTO orders ...; COMMIT;
//!   ```
//!
//! Every strategy but the naive one moves the version of each item it sells, so
//! that a versioned writer that read the item before (an edit form) is refused
//! instead of writing the old stock back. The locking ones move it when they
//! lock the row, also where the buyer then buys nothing (not enough stock),
//! and `basket-lock-all` moves it again with its versioned write: twice per line.
//!
//! SQLite has no `FOR UPDATE` and no row locks. There both basket strategies run
//! in [`lockkit::locked_transaction`], whose `BEGIN IMMEDIATE` takes the whole
//! database's write lock before the first read: writers run one after another, so
//! SQLite cannot deadlock, and `basket-naive` reports no deadlocks there.
//!
//! ## Running it
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
pub use lockkit_tests::support::Backend;
pub use report::{format_table, Report, Tally};

/// The primary key of the one item on sale in the single-item strategies (the
/// basket strategies sell items `1..=`[`Config::items`]).
pub const ITEM_ID: i32 = 1;

/// How buyers make a purchase; the [crate docs](crate) show the SQL of each.
/// Adding a strategy means one variant here (and in [`Strategy::ALL`]), one
/// function in `strategies.rs`, and one arm in its `match`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Read the stock, check it, write `stock = read - qty`: loses updates.
    Naive,
    /// `#[derive(Versioned)]` + `update_versioned` inside `lockkit::retry`.
    Optimistic,
    /// `item.with_lock(..)`: `SELECT .. FOR UPDATE`, check, write, commit.
    Pessimistic,
    /// `lockkit::atomic::update_if`: `UPDATE .. SET stock = stock - qty WHERE stock >= qty`.
    Atomic,
    /// `lockkit::with_lock(.., LockOptions::default().nowait(), ..)` inside `lockkit::retry`.
    Nowait,
    /// Baskets: `FOR UPDATE` one item at a time in the buyer's order; deadlocks,
    /// retried by `lockkit::retry`.
    BasketNaive,
    /// Baskets: `Item::lock_all` in `locked_transaction`, in key order; no deadlocks.
    BasketLockAll,
}

impl Strategy {
    /// Every strategy, in the order the program runs them.
    pub const ALL: &'static [Strategy] = &[
        Strategy::Naive,
        Strategy::Optimistic,
        Strategy::Pessimistic,
        Strategy::Atomic,
        Strategy::Nowait,
        Strategy::BasketNaive,
        Strategy::BasketLockAll,
    ];

    /// The strategy's name, as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::Optimistic => "optimistic",
            Strategy::Pessimistic => "pessimistic",
            Strategy::Atomic => "atomic",
            Strategy::Nowait => "nowait",
            Strategy::BasketNaive => "basket-naive",
            Strategy::BasketLockAll => "basket-lock-all",
        }
    }

    /// Whether this strategy is meant to prevent lost updates (all but `naive`;
    /// `basket-naive` is naive about deadlocks, not about lost updates).
    pub fn is_safe(self) -> bool {
        !matches!(self, Strategy::Naive)
    }

    /// Whether buyers order baskets of several items ([`Config::items`]) rather
    /// than one item.
    pub fn is_basket(self) -> bool {
        matches!(self, Strategy::BasketNaive | Strategy::BasketLockAll)
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

/// The knobs of one run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of buyer threads (each holds one pooled connection).
    pub buyers: usize,
    /// Units in stock at the start, of each item.
    pub stock: i32,
    /// Items on sale in the basket strategies (at least 2); the single-item
    /// strategies sell one.
    pub items: usize,
    /// Purchases each buyer tries before going home (a buyer stops earlier when
    /// the item is sold out).
    pub attempts: u32,
    /// Time between reading the stock and writing it: widens the race window so
    /// the naive strategy reliably loses updates. Every strategy waits the same,
    /// once per purchase (`basket-naive` between its first and second lock, which
    /// makes its deadlocks reliable).
    pub think: Duration,
    /// The retry policy of the strategies that retry (`optimistic`, `nowait`,
    /// and the basket strategies).
    pub retry: RetryPolicy,
    /// PostgreSQL only, basket strategies only: `deadlock_timeout` for the run's
    /// sessions. PostgreSQL looks for a deadlock only after a lock wait this long
    /// (1 s by default), so every `basket-naive` deadlock costs at least that much.
    /// Setting it needs a superuser or `GRANT SET ON PARAMETER deadlock_timeout`;
    /// when the server refuses, the run keeps the server's value and
    /// [`Report::note`] says so. `None` keeps the server's value.
    pub deadlock_timeout: Option<Duration>,
}

impl Default for Config {
    /// 8 buyers, 100 units (of each item), 4 items in the basket strategies, 50
    /// purchases per buyer, 5 ms think time, `RetryPolicy::default()`, a 20 ms
    /// `deadlock_timeout` on PostgreSQL.
    fn default() -> Self {
        Config {
            buyers: 8,
            stock: 100,
            items: 4,
            attempts: 50,
            think: Duration::from_millis(5),
            retry: RetryPolicy::default(),
            deadlock_timeout: Some(Duration::from_millis(20)),
        }
    }
}

/// Plays `strategy` on the database at `url`: applies the migrations, resets the
/// tables (one item with `config.stock` units, or `config.items` items for a
/// basket strategy; no orders), lets `config.buyers` threads buy until the stock
/// is sold out or their attempts are used up, and reports what the database holds.
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
    if strategy.is_basket() && config.items < 2 {
        return Err(ShopError::Usage(format!(
            "{strategy} needs at least 2 items, not {}",
            config.items
        )));
    }
    if i32::try_from(config.items).is_err() {
        return Err(ShopError::Usage(format!(
            "too many items: {}",
            config.items
        )));
    }
    runner::run_on(url, strategy, config)
}

/// Removes a SQLite database file and its companions, so that the next [`run`]
/// starts from an empty file.
pub use lockkit_tests::support::remove_sqlite_files;
