//! How an operation is done: the strategy, through lockkit or by hand, the
//! retry policy, and the client that runs the workers.

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
    /// Hot row: `with_lock(.., nowait(), ..)`, retry on `Busy`.
    Nowait,
    /// Hot row: `atomic::update_if` (`UPDATE .. WHERE stock >= 1`).
    Atomic,
    /// Queue: `queue::claim` (`LIMIT n FOR UPDATE SKIP LOCKED`).
    Claim,
    /// Orders: `FOR UPDATE` one row at a time in the buyer's order, retry.
    NaiveOrder,
    /// Orders: `Item::lock_all` (one statement, key order).
    LockAll,
    /// Hot row and own rows: `AdaptivePolicy::update`, optimistic while the
    /// row is calm, `FOR UPDATE` while it is hot.
    Adaptive,
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
            Strategy::Adaptive => "adaptive",
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

    /// The strategies the adaptive one is measured against, then itself.
    pub const ADAPTIVE: [Strategy; 3] =
        [Strategy::Optimistic, Strategy::WithLock, Strategy::Adaptive];
}

/// Through lockkit, or the same SQL written by hand with plain Diesel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flavor {
    /// lockkit's API.
    Lockkit,
    /// Plain Diesel, no lockkit.
    Hand,
    /// Plain Diesel with a hand-built statement that Diesel may cache (the
    /// client-cost profile only; see `run::ops::versioned::CacheableVersionedUpdate`).
    HandCached,
    /// Plain Diesel that binds the next version (`SET lock_version = ?`), as
    /// users write it (uncontended versioned update only).
    HandNext,
    /// The peer crate `diesel_versioning` 0.1.1 (uncontended versioned update only).
    Peer,
}

impl Flavor {
    /// The name shown in the report.
    pub fn title(self) -> &'static str {
        match self {
            Flavor::Lockkit => "lockkit",
            Flavor::Hand => "hand-written",
            Flavor::HandCached => "hand-written, cacheable",
            Flavor::HandNext => "hand-written, binds the next version",
            Flavor::Peer => "diesel_versioning 0.1.1",
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

/// What runs the workers: blocking Diesel on threads, or diesel-async on tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Client {
    /// Blocking Diesel: one thread per worker, each with a pooled connection
    /// (r2d2).
    Threads,
    /// diesel-async: one task per worker on a multi-threaded tokio runtime,
    /// each task with a connection of one bb8 pool.
    Tasks,
}

impl Client {
    /// The name shown in the report.
    pub fn title(self) -> &'static str {
        match self {
            Client::Threads => "blocking Diesel, a thread per worker",
            Client::Tasks => "diesel-async, a task per worker",
        }
    }
}
