//! # lockkit-bench: what lockkit's strategies cost, measured
//!
//! `cargo run --release -p lockkit-bench -- [--quick]` drives real PostgreSQL,
//! MariaDB/MySQL and SQLite through r2d2 pools with worker threads and writes
//! `docs/BENCHMARKS.md` and the charts `docs/*.svg`.
//!
//! Four workloads, each on each backend:
//!
//! 1. **uncontended**: every worker updates its own row with `update_versioned`;
//! 2. **hot row**: every worker decrements one row's stock: naive
//!    read-modify-write, optimistic + retry, `with_lock`, `NOWAIT` + retry and
//!    `atomic::update_if`, at 1, 4, 16 and 32 workers;
//! 3. **queue drain**: workers claim jobs with `queue::claim` (`SKIP LOCKED`),
//!    batches of 1 and 10;
//! 4. **orders**: multi-row orders, locked one row at a time in the buyer's order
//!    (deadlocks, retried) or with `Item::lock_all` (key order).
//!
//! Side by side, in the same run: the same SQL written by hand with plain Diesel
//! (the ratio is lockkit's overhead), the same SQL through `pgbench` (the ratio is
//! how close lockkit gets to the server's own limit), and the retry waste of
//! `RetryPolicy::default()` against `RetryPolicy::immediate(n)`.
//!
//! The per-backend code is written once in a macro and instantiated per connection
//! type ([`ops`]); the runner ([`runner`]) is generic over the backend.

pub mod alloc;
pub mod callgrind;
pub mod charts;
pub mod cpu;
pub mod db;
pub mod error;
pub mod machine;
pub mod ops;
pub mod pgbench;
pub mod profile;
pub mod report;
pub mod runner;
pub mod schema;
pub mod stats;
pub mod suite;

use std::time::Duration;

pub use db::Backend;
pub use error::BenchError;

/// The four workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Each worker updates its own row (`update_versioned`).
    Uncontended,
    /// All workers decrement one row's stock.
    HotRow,
    /// Workers drain a job table with `SKIP LOCKED`.
    Queue,
    /// Multi-row orders that deadlock when locked in arbitrary order.
    Orders,
}

impl Workload {
    /// The name shown in the report.
    pub fn title(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended versioned update",
            Workload::HotRow => "hot row",
            Workload::Queue => "queue drain",
            Workload::Orders => "multi-row orders",
        }
    }
}

/// How one operation is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// Uncontended: write the worker's own row with a version check.
    Versioned,
    /// Hot row: read, then `stock = <read> - 1`. Loses updates.
    Naive,
    /// Hot row: read, `update_versioned`, retry on `Stale`.
    Optimistic,
    /// Hot row: `with_lock` (`SELECT .. FOR UPDATE` in a transaction).
    WithLock,
    /// Hot row: `with_lock_opts(.., nowait())`, retry on `Busy`.
    Nowait,
    /// Hot row: `atomic::update_if` (`UPDATE .. WHERE stock >= 1`).
    Atomic,
    /// Queue: `queue::claim` (`LIMIT n FOR UPDATE SKIP LOCKED`).
    Claim,
    /// Orders: `FOR UPDATE` one row at a time in the buyer's order, retry.
    NaiveOrder,
    /// Orders: `Item::lock_all` (one statement, key order).
    LockAll,
}

impl Strategy {
    /// The name shown in the report.
    pub fn title(self) -> &'static str {
        match self {
            Strategy::Versioned => "update_versioned",
            Strategy::Naive => "naive",
            Strategy::Optimistic => "optimistic + retry",
            Strategy::WithLock => "with_lock",
            Strategy::Nowait => "nowait + retry",
            Strategy::Atomic => "atomic update_if",
            Strategy::Claim => "queue::claim",
            Strategy::NaiveOrder => "row by row + retry",
            Strategy::LockAll => "lock_all",
        }
    }

    /// Whether the strategy is meant to lose nothing (all but naive).
    pub fn is_safe(self) -> bool {
        self != Strategy::Naive
    }

    /// The hot-row strategies, in report order.
    pub const HOT_ROW: [Strategy; 5] = [
        Strategy::Naive,
        Strategy::Optimistic,
        Strategy::WithLock,
        Strategy::Nowait,
        Strategy::Atomic,
    ];
}

/// Through lockkit, or the same SQL written by hand with plain Diesel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flavor {
    /// lockkit's API.
    Lockkit,
    /// Plain Diesel, no lockkit.
    Hand,
    /// Plain Diesel with a hand-built statement that Diesel may cache (the
    /// client-cost profile only; see `ops::CacheableVersionedUpdate`).
    HandCached,
}

impl Flavor {
    /// The name shown in the report.
    pub fn title(self) -> &'static str {
        match self {
            Flavor::Lockkit => "lockkit",
            Flavor::Hand => "hand-written",
            Flavor::HandCached => "hand-written, cacheable",
        }
    }
}

/// The retry policy of the strategies that retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Retry {
    /// `RetryPolicy::default()`: 5 attempts, 10 ms doubling to 1 s, full jitter.
    Default,
    /// `RetryPolicy::immediate(n)`: n attempts, no wait.
    Immediate(u32),
}

impl Retry {
    /// The lockkit policy.
    pub fn policy(self) -> lockkit::RetryPolicy {
        match self {
            Retry::Default => lockkit::RetryPolicy::default(),
            Retry::Immediate(n) => lockkit::RetryPolicy::immediate(n),
        }
    }

    /// The name shown in the report.
    pub fn title(self) -> String {
        match self {
            Retry::Default => "RetryPolicy::default()".to_owned(),
            Retry::Immediate(n) => format!("RetryPolicy::immediate({n})"),
        }
    }
}

/// One measured configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Case {
    /// The workload.
    pub workload: Workload,
    /// The strategy.
    pub strategy: Strategy,
    /// lockkit or hand-written.
    pub flavor: Flavor,
    /// Worker threads (one pooled connection each).
    pub workers: usize,
    /// Jobs claimed per transaction (queue only, else 1).
    pub batch: i64,
    /// The retry policy (strategies that retry).
    pub retry: Retry,
}

impl Case {
    /// A lockkit case with the default retry policy and batch 1.
    pub fn new(workload: Workload, strategy: Strategy, workers: usize) -> Case {
        Case {
            workload,
            strategy,
            flavor: Flavor::Lockkit,
            workers,
            batch: 1,
            retry: Retry::Default,
        }
    }

    /// The same case, hand-written.
    pub fn hand(self) -> Case {
        Case {
            flavor: Flavor::Hand,
            ..self
        }
    }

    /// The same case with another batch size.
    pub fn batch(self, batch: i64) -> Case {
        Case { batch, ..self }
    }

    /// The same case with another retry policy.
    pub fn retry(self, retry: Retry) -> Case {
        Case { retry, ..self }
    }

    /// The same case through lockkit.
    pub fn lockkit(self) -> Case {
        Case {
            flavor: Flavor::Lockkit,
            ..self
        }
    }

    /// A one-line description.
    pub fn label(&self) -> String {
        let flavor = if self.strategy == Strategy::Naive {
            "plain Diesel"
        } else {
            self.flavor.title()
        };
        let mut s = format!(
            "{} / {} / {} / {} workers",
            self.workload.title(),
            self.strategy.title(),
            flavor,
            self.workers
        );
        if self.workload == Workload::Queue {
            s.push_str(&format!(" / batch {}", self.batch));
        }
        if self.retry != Retry::Default {
            s.push_str(&format!(" / {}", self.retry.title()));
        }
        s
    }
}

/// How long and how much: every worker loop stops at whichever bound comes first.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time limit of one measured run.
    pub run: Duration,
    /// Count limit: operations per worker in one run.
    pub max_ops_per_worker: u64,
    /// Jobs in the queue at the start of a queue run (also its count limit).
    pub jobs: i32,
}

/// The initial stock of every item: large enough never to run out.
pub const INITIAL_STOCK: i32 = 1_000_000_000;
/// The primary key of the hot row.
pub const HOT_ID: i32 = 1;
/// The first of the order items (`ORDER_ITEMS` rows from here).
pub const ORDER_ITEM_BASE: i32 = 201;
/// How many items the multi-row orders choose from.
pub const ORDER_ITEMS: i32 = 6;
/// The first worker-owned row of the uncontended workload (one per worker from here).
pub const OWN_BASE: i32 = 1001;
/// The most workers any case uses (the pool's size).
pub const MAX_WORKERS: usize = 32;
