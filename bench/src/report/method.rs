//! "How it was measured": the method, with this run's settings.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::rate;
use crate::vocabulary::INITIAL_STOCK;

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    let s = &results.settings;
    writeln!(w, "## How it was measured\n")?;
    writeln!(
        w,
        "* One command: `cargo run --release -p lockkit-bench` (`-- --quick` for one short \
         repetition). It creates a database `lkbench_<pid>_*` on each server (SQLite: a file in \
         the temp directory), runs everything, and drops it.\n\
         * Repetitions are the outer loop: each repetition runs every case once, backend by \
         backend, so a busy minute spreads over all cases. The tables quote the median of the \
         repetitions; each run's p50/p99 come from an HdrHistogram of every completed \
         operation (retries included in its latency), and the table quotes their medians.\n\
         * Every worker loop is bounded twice: {} per run and {} operations per worker; a \
         queue run also stops when the queue is empty. Lock waits are bounded by the session's \
         lock timeout (PostgreSQL `lock_timeout = 10s`, MariaDB `innodb_lock_wait_timeout = 10`, \
         SQLite `busy_timeout = 5000`).\n\
         * Before every run the tables are reset: `items` gets fresh rows with stock {} \
         (enough never to run out) and version 0; the queue gets {} fresh jobs ({} in the paired \
         slices). A queue run's time ends with the last job it marked done, once every worker found the \
         queue empty: the empty claims of the end, which on SQLite may sleep in the busy handler, are not \
         the drain's rate.\n\
         * All workers take their pooled connection, wait at a barrier, and start together; \
         throughput is the operations (queue: jobs) completed within the run's time, over that \
         time. An operation that runs past it still finishes and counts for the correctness \
         line, not for the throughput: the last one to finish (a worker asleep in a backoff, at \
         the end of a lock queue) says how long one operation can take, not how many the \
         server writes per second, and the others idle meanwhile. (Until this run the time \
         ran until the last worker stopped, which put up to a backoff's wait on every \
         contended run.)\n\
         * The correctness line is checked after every run against the database: units sold + \
         final stock = initial stock (hot row); Σ stock taken = Σ versions = updates \
         (uncontended); Σ stock taken = order lines (orders); jobs claimed = distinct jobs = \
         jobs marked done (queue). \"Units sold\" are the operations the workers saw commit.\n\
         * lockkit / hand-written pairs run `a b b a` ({} × per repetition) with {:.2} s slices. The hand-written twins \
         send the same SQL: the version-checked `UPDATE` with its own row-count check, `SELECT .. \
         FOR UPDATE` in a transaction, the conditional `UPDATE`, `LIMIT n FOR UPDATE SKIP \
         LOCKED`; lockkit's side writes the atomic `UPDATE` with `lockkit::atomic::update` \
         (prepared once per connection), the hand-written side with `diesel::update` (Diesel \
         parses and plans its own `UPDATE` again each time). The write inside `with_lock`'s \
         closure and the queue's mark-done are user code: the same `diesel::update` on both \
         sides. \
         The hand-written optimistic retry uses the \
         same backoff schedule. Two \
         differences by design: after a stale write lockkit reads the row's current version for \
         its error report (one `SELECT` per conflict), and on the `Versioned` item `with_lock` \
         advances the version as it locks (PostgreSQL: in the locking statement, \
         `UPDATE .. WHERE EXISTS (SELECT .. FOR UPDATE) RETURNING ..`; MariaDB and SQLite: one more \
         `UPDATE`); the hand-written twins do neither.\n\
         * pgbench: `{}`. The with_lock script is lockkit's: `BEGIN; UPDATE .. SET lock_version = \
         lock_version + 1 WHERE .. AND EXISTS (SELECT .. FOR UPDATE) RETURNING .. \\gset; UPDATE \
         .. SET stock = :left; COMMIT` (the locking read of a `Versioned` row advances its \
         version; lockkit sends that statement prepared and the closure's `UPDATE` as Diesel \
         does, pgbench both in its one mode); the atomic script is the single conditional `UPDATE`; the \
         queue with batch 1 is `SELECT id .. LIMIT 1 FOR UPDATE SKIP LOCKED \\gset` and one \
         `UPDATE` (the user's mark-done, which lockkit's side sends as Diesel does); with batch 10 the claim is wrapped in `array_agg` (pgbench has no loop) and \
         followed by ten `UPDATE`s by key. Both sides drain a queue of {} jobs.\n\
         * PostgreSQL sessions (the benchmark's and pgbench's) run with `synchronous_commit = {}`. \
         {}\n\
         * Client-side cost per call: the same operations on one in-memory SQLite connection, \
         single-threaded, {} calls per measurement, best of three alternating rounds; \
         allocations counted by a counting global allocator.\n",
        humantime(s.limits.run),
        rate(s.limits.max_ops_per_worker as f64),
        rate(f64::from(INITIAL_STOCK)),
        rate(f64::from(s.limits.jobs)),
        rate(f64::from(s.pair_limits.jobs)),
        s.pair_rounds,
        s.pair_limits.run.as_secs_f64(),
        results
            .pgbench
            .first()
            .map_or("not run".to_owned(), |p| {
                p.pgbench
                    .iter()
                    .map(|r| r.command.clone())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join("`, `")
            }),
        rate(f64::from(s.pgbench_jobs)),
        if s.durable { "on" } else { "off" },
        if s.durable {
            "Every commit waits for the WAL flush (`--durable`)."
        } else {
            "The server's disk takes milliseconds per fsync, which would make every PostgreSQL \
             number a disk benchmark; asynchronous commit (the session's choice, not the \
             server's; `--durable` turns it back on) leaves the locking. MariaDB runs with the \
             server's own `innodb_flush_log_at_trx_commit` (above)."
        },
        rate(s.profile_ops as f64),
    )?;
    for note in &results.notes {
        writeln!(w, "* **Skipped**: {note}")?;
    }
    if !results.notes.is_empty() {
        writeln!(w)?;
    }
    Ok(())
}

fn humantime(d: std::time::Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}
