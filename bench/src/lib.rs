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

pub mod analysis;
pub mod db;
pub mod error;
pub mod plan;
pub mod report;
pub mod run;
pub mod vocabulary;

pub use db::Backend;
pub use error::BenchError;
pub use vocabulary::{
    Case, Flavor, Limits, Retry, Strategy, Workload, HOT_ID, INITIAL_STOCK, MAX_WORKERS,
    ORDER_ITEMS, ORDER_ITEM_BASE, OWN_BASE,
};
