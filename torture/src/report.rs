//! What the parent prints, and the invariants it checks against the tables.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::backend::Audit;
use crate::config::Config;
use crate::stats::{Stats, Strategy, FIRST_WORKER_OP};

pub fn print_header(backend: &str, config: &Config) {
    println!("lockkit-torture on {backend} ({})", config.display_url());
    println!(
        "  {} processes x {} threads, {} s or {} operations per thread; {} items of stock {}; \
         {} jobs queued; version bumps by {}{}; seed {}",
        config.processes,
        config.threads,
        config.seconds,
        config.ops,
        config.items,
        config.stock,
        config.jobs,
        config.bump.name(),
        if config.tolerate_outages {
            "; outages tolerated"
        } else {
            ""
        },
        config.seed
    );
    if config.asynchronous {
        println!(
            "  async: lockkit::asynchronous on diesel-async, tasks on a multi-threaded tokio \
             runtime over a bb8 pool per process; {}% of the operations' futures dropped at a \
             random point{}",
            config.cancel,
            if config.pool_ping {
                "; bb8 pings each connection before handing it out"
            } else {
                ""
            }
        );
    }
}

pub fn print_run(config: &Config, total: &Stats, elapsed: Duration, drained: u64) {
    println!();
    println!(
        "{:<12} {:<48} {:>9} {:>8} {:>8} {:>9}",
        "strategy", "lockkit calls", "committed", "lines", "idle*", "retries"
    );
    for &strategy in Strategy::of_run(config.asynchronous) {
        let p = &total.per[strategy.index()];
        println!(
            "{:<12} {:<48} {:>9} {:>8} {:>8} {:>9}",
            strategy.name(),
            strategy.calls(),
            p.ops,
            if strategy == Strategy::SkipLocked {
                format!("{} jobs", p.jobs_claimed)
            } else {
                p.lines.to_string()
            },
            p.idle,
            p.retries
        );
    }
    let secs = elapsed.as_secs_f64().max(1e-3);
    println!("* idle: refused for lack of stock (nothing written), or no job left to claim");
    println!(
        "total: {} operations committed in {:.1} s ({:.0}/s) by {} threads; {} retries after conflicts; \
         {} jobs left in the queue drained by the parent",
        total.ops(),
        secs,
        total.ops() as f64 / secs,
        total.threads,
        total.per.iter().map(|p| p.retries).sum::<u64>(),
        drained
    );
    if config.tolerate_outages || total.outage_errors > 0 {
        println!(
            "outages: {} errors retried on a fresh connection, {} pool waits, {} interrupted \
             operations found committed, {} found rolled back and run again, {} operations \
             committed after the first outage",
            total.outage_errors,
            total.pool_errors,
            total.confirmed,
            total.redone,
            total.recovered_ops
        );
        for (message, n) in &total.outages {
            println!("  {n:>6} x {message}");
        }
        if total.starved > 0 {
            println!(
                "  {:>6} x every attempt of a retry lost a conflict: run again",
                total.starved
            );
        }
    }
    if config.asynchronous {
        println!(
            "cancelled: {} futures dropped ({} by tokio::time::timeout, {} by JoinHandle::abort), \
             {} of them found committed, the others rolled back",
            total.cancelled_timeout + total.cancelled_abort,
            total.cancelled_timeout,
            total.cancelled_abort,
            total.cancelled_committed
        );
    }
    for &strategy in Strategy::of_run(config.asynchronous) {
        if total.per[strategy.index()].ops == 0 {
            println!("warning: {} committed no operation", strategy.name());
        }
    }
}

/// One invariant and whether it holds.
#[derive(Debug)]
pub struct Check {
    pub ok: bool,
    pub text: String,
}

/// Every invariant, computed exactly from the tables and the workers' reports.
pub fn check(
    config: &Config,
    total: &Stats,
    drained: u64,
    audit: &Audit,
    failures: &[String],
) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |ok: bool, text: String| checks.push(Check { ok, text });

    // Items: none lost, none added; stock + sold = initial; never below zero.
    let ids: Vec<i32> = audit.items.iter().map(|(id, _)| *id).collect();
    add(
        ids == (1..=config.items).collect::<Vec<_>>(),
        format!(
            "items: {} rows, ids 1..={} (none lost, none added)",
            ids.len(),
            config.items
        ),
    );
    let mut sold: BTreeMap<i32, i64> = BTreeMap::new();
    for (_, item, qty, _) in &audit.lines {
        *sold.entry(*item).or_default() += i64::from(*qty);
    }
    for (id, stock) in &audit.items {
        let sold = sold.get(id).copied().unwrap_or(0);
        add(
            i64::from(*stock) + sold == i64::from(config.stock),
            format!(
                "item {id}: stock {stock} + sold {sold} (sum of its order lines) = initial {}",
                config.stock
            ),
        );
    }
    let unknown: Vec<&i32> = sold.keys().filter(|id| !ids.contains(id)).collect();
    add(
        unknown.is_empty(),
        format!("every order line names an existing item (unknown: {unknown:?})"),
    );
    let lowest = audit.items.iter().map(|(_, s)| *s).min().unwrap_or(0);
    add(
        lowest >= 0,
        format!("no item below zero at the end (lowest stock: {lowest})"),
    );
    add(
        total.lowest_stock >= 0,
        format!(
            "no committed operation wrote a stock below zero (lowest written: {})",
            if total.lowest_stock == i64::MAX {
                "none".to_owned()
            } else {
                total.lowest_stock.to_string()
            }
        ),
    );

    // Order lines: each one reported, each one in the table, per strategy.
    add(
        audit.lines.len() as u64 == total.lines(),
        format!(
            "order lines: {} in the table = {} reported by the workers",
            audit.lines.len(),
            total.lines()
        ),
    );
    let mut lines_per_op: BTreeMap<(&str, i64), usize> = BTreeMap::new();
    for (op, _, _, strategy) in &audit.lines {
        *lines_per_op.entry((strategy.as_str(), *op)).or_default() += 1;
    }
    for strategy in Strategy::ALL {
        if strategy == Strategy::SkipLocked {
            continue;
        }
        let name = strategy.name();
        let ops = lines_per_op.keys().filter(|(s, _)| *s == name).count() as u64;
        let lines: u64 = lines_per_op
            .iter()
            .filter(|((s, _), _)| *s == name)
            .map(|(_, n)| *n as u64)
            .sum();
        let p = &total.per[strategy.index()];
        add(
            ops == p.ops && lines == p.lines,
            format!(
                "{name}: {ops} operations with {lines} lines in the table = {} with {} reported",
                p.ops, p.lines
            ),
        );
    }
    let known: BTreeSet<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
    let lock_all_lines = 2.min(config.items as usize)..=3.min(config.items as usize);
    let partial: Vec<&(&str, i64)> = lines_per_op
        .iter()
        .filter(|((strategy, _), n)| match *strategy {
            "lock_all" => !lock_all_lines.contains(*n),
            s => !known.contains(s) || **n != 1,
        })
        .map(|(key, _)| key)
        .collect();
    add(
        partial.is_empty(),
        format!(
            "no partial order: every lock_all order has {}..={} lines, every other one 1 \
             (exceptions: {partial:?})",
            lock_all_lines.start(),
            lock_all_lines.end()
        ),
    );

    // Jobs: one per order, plus the seeded ones; each done exactly once.
    let created: u64 = total.per.iter().map(|p| p.jobs_created).sum();
    add(
        audit.jobs.len() as u64 == config.jobs as u64 + created,
        format!(
            "jobs: {} in the table = {} seeded + {} enqueued by orders (reported)",
            audit.jobs.len(),
            config.jobs,
            created
        ),
    );
    let selling: BTreeSet<&str> = Strategy::ALL
        .iter()
        .filter(|s| s.sells())
        .map(|s| s.name())
        .collect();
    let orders: BTreeSet<i64> = lines_per_op
        .keys()
        .filter(|(s, _)| selling.contains(s))
        .map(|(_, op)| *op)
        .collect();
    // A job's id is the op that created it: a worker's order, or the seed.
    let (order_jobs, seeded): (BTreeSet<i64>, BTreeSet<i64>) = audit
        .jobs
        .iter()
        .map(|(id, _)| *id)
        .partition(|id| *id >= FIRST_WORKER_OP);
    add(
        orders == order_jobs && seeded == (1..=config.jobs).collect(),
        format!(
            "every order has its shipment job and every job its order or the seed \
             ({} orders, {} order jobs, {} seeded jobs)",
            orders.len(),
            order_jobs.len(),
            seeded.len()
        ),
    );
    let job_ids: BTreeSet<i64> = audit.jobs.iter().map(|(id, _)| *id).collect();
    let done = audit.jobs.iter().filter(|(_, done)| *done).count();
    let run_jobs: BTreeSet<i64> = audit.runs.iter().map(|(job, _)| *job).collect();
    add(
        done == audit.jobs.len()
            && audit.runs.len() == audit.jobs.len()
            && run_jobs.len() == audit.runs.len()
            && run_jobs == job_ids,
        format!(
            "every job done exactly once: {} jobs, {} done, {} runs of {} distinct jobs, \
             none of an unknown job",
            audit.jobs.len(),
            done,
            audit.runs.len(),
            run_jobs.len()
        ),
    );
    let worker_runs = audit
        .runs
        .iter()
        .filter(|(_, op)| *op >= FIRST_WORKER_OP)
        .count() as u64;
    let claims: BTreeSet<i64> = audit
        .runs
        .iter()
        .map(|(_, op)| *op)
        .filter(|op| *op >= FIRST_WORKER_OP)
        .collect();
    let parent_runs = audit.runs.len() as u64 - worker_runs;
    let p = &total.per[Strategy::SkipLocked.index()];
    add(
        worker_runs == p.jobs_claimed && claims.len() as u64 == p.ops && parent_runs == drained,
        format!(
            "job runs: {worker_runs} by the workers in {} claims = {} in {} reported; \
             {parent_runs} by the parent's drain = {drained}",
            claims.len(),
            p.jobs_claimed,
            p.ops
        ),
    );

    let mut text = format!(
        "workers: {} threads in {} processes, no unexpected error",
        total.threads, config.processes
    );
    for failure in failures {
        text.push_str("\n          ");
        text.push_str(failure);
    }
    add(
        failures.is_empty() && total.threads == u64::from(config.processes * config.threads),
        text,
    );
    if config.asynchronous {
        let pooled = u64::from(config.processes) * u64::from(config.pool_size());
        add(
            total.pool_dirty == 0 && total.pool_clean == pooled,
            format!(
                "after the dropped futures, no pooled connection in a transaction or holding a \
                 lock (the server's word): {} of {pooled} clean, {} not",
                total.pool_clean, total.pool_dirty
            ),
        );
    }
    checks
}

/// Prints the checks; `true` when all hold.
pub fn print_checks(checks: &[Check]) -> bool {
    println!();
    println!("invariants:");
    for check in checks {
        println!(
            "  {}  {}",
            if check.ok { "ok  " } else { "FAIL" },
            check.text
        );
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed == 0 {
        println!("all {} invariants hold", checks.len());
        true
    } else {
        println!(
            "VIOLATION: {failed} of {} invariants do not hold",
            checks.len()
        );
        false
    }
}
