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
//! Side by side, in the same run: the same SQL written by hand with plain Diesel,
//! as users write it, the same SQL through `pgbench` (the ratio is how close
//! lockkit gets to the server's own limit), and the retry waste of
//! `RetryPolicy::default()` against `RetryPolicy::immediate(n)`. The ratio to
//! hand-written Diesel is lockkit's overhead and statement caching together:
//! Diesel parses and plans each hand-written `UPDATE` again on every execution,
//! while lockkit's statements are prepared once per connection.
//!
//! # The pipeline
//!
//! Each stage is a module and imports only from the stages before it:
//!
//! 1. [`vocabulary`]: the words: backends, workloads, strategies, a case, the
//!    tables;
//! 2. [`plan`]: what runs, how long and how often ([`plan::Settings`], the
//!    cases);
//! 3. [`run`]: the measurements: the worker runs ([`run::runner`]) of the
//!    operations, one file per strategy ([`run::ops`]), next to pgbench
//!    ([`run::pgbench`]) and the client-cost profile ([`run::profile`]); all of
//!    it gathered in [`run::results::Results`];
//! 4. [`analysis`]: medians and summaries ([`analysis::statistics`]), lockkit's
//!    ratios to hand-written Diesel and to pgbench ([`analysis::ratios`]);
//! 5. [`report`]: `BENCHMARKS.md`, one file per section, and the charts.
//!
//! Beside them: [`error`] (the error that stops the benchmark) and [`db`] (the
//! backends and a fresh database per run).

pub mod analysis;
pub mod db;
pub mod error;
pub mod plan;
pub mod report;
pub mod run;
pub mod vocabulary;
