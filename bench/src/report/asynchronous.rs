//! Section 5, on diesel-async: the async cases next to their hand-written
//! diesel-async twins and to the blocking rows, then (PostgreSQL) next to
//! pgbench on the same SQL, and where the remaining gap is.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{below, check_cell, ms, rate, ratio, us};
use crate::analysis::ratios::{overhead, pgbench_summaries, PgbenchSummary, PGBENCH_TARGET};
use crate::analysis::statistics::Summary;
use crate::plan::{async_paired_cases, ASYNC_THREADS, ASYNC_WORKERS};
use crate::run::pgbench::{self, Mode};
use crate::vocabulary::{report_name, Backend, Case, Client, Flavor, Workload};

/// The async cases in report order (PostgreSQL's, the most), each as lockkit
/// runs it.
fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = async_paired_cases(Backend::Postgres);
    cases.sort_by_key(|c| (c.workload, c.strategy, c.batch));
    cases
}

fn title(case: &Case) -> String {
    match case.workload {
        Workload::Queue => format!("queue, claim batch {}", case.batch),
        Workload::Uncontended => format!("uncontended {}", case.strategy.title()),
        _ => format!("hot row, {}", case.strategy.title()),
    }
}

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    let ran = |c: &Case| report.sums.keys().any(|(_, k)| k == c);
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| ran(c) || ran(&c.hand()))
        .collect();
    let pg: Vec<PgbenchSummary> = pgbench_summaries(results)
        .into_iter()
        .filter(|s| s.tasks.is_some())
        .collect();
    if cases.is_empty() && pg.is_empty() {
        return Ok(());
    }
    writeln!(w, "## 5. On diesel-async\n")?;
    writeln!(
        w,
        "The same workloads on diesel-async 0.9: {ASYNC_WORKERS} workers as tasks on a tokio \
         runtime of {ASYNC_THREADS} threads (as pgbench's `-j {ASYNC_THREADS}`), each task with a \
         connection of one bb8 pool, next to the same statements written by hand with \
         diesel-async, run alternately ({} × `lockkit, hand, hand, lockkit`, {:.2} s each), and \
         next to the blocking rows above ({ASYNC_WORKERS} threads on r2d2). lockkit's calls: \
         `AsyncVersioned::update_versioned`; `lockkit::asynchronous::with_lock`; \
         `lockkit::asynchronous::atomic::update_if`; for the queue, \
         `lockkit::asynchronous::queue::claim` in `locked_transaction`. SQLite runs diesel-async's \
         `SyncConnectionWrapper<SqliteConnection>` (each call on tokio's blocking pool) and \
         `BEGIN IMMEDIATE` for the hand-written transactions. The async queue runs on \
         PostgreSQL only (refilling it for every slice costs MariaDB and SQLite more than the \
         slices).\n",
        results.settings.async_rounds,
        results.settings.pair_limits.run.as_secs_f64(),
    )?;
    if !cases.is_empty() {
        table(w, report, &cases)?;
    }
    if !pg.is_empty() {
        pgbench_table(w, &pg)?;
        gap(w, &pg)?;
    }
    Ok(())
}

/// The async cases next to their hand-written twins and the blocking rows.
fn table(w: &mut String, report: &Report, cases: &[Case]) -> fmt::Result {
    let results = report.results;
    writeln!(
        w,
        "| backend | case | lockkit async /s | hand-written async /s | lockkit / hand | blocking /s | async / blocking | p99 ms: async · blocking | correctness (async) |"
    )?;
    writeln!(
        w,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for &b in &report.backends {
        for case in cases {
            let lockkit = report.get(b, case);
            let hand = report.get(b, &case.hand());
            // The blocking row of the same flavor as the async one shown.
            let shown: Option<&Summary> = lockkit.or(hand);
            let Some(shown) = shown else { continue };
            let blocking = report.get(
                b,
                &Case {
                    client: Client::Threads,
                    ..shown.case
                },
            );
            writeln!(
                w,
                "| {} | {}{} | {} | {} | {} | {} | {} | {} · {} | {} |",
                report_name(b),
                title(case),
                if shown.case.flavor == Flavor::Hand {
                    " (hand-written on both sides)"
                } else {
                    ""
                },
                lockkit.map_or("–".into(), |s| rate(s.throughput)),
                hand.map_or("–".into(), |s| rate(s.throughput)),
                ratio(overhead(results, b, case).map_or(f64::NAN, |r| r.0)),
                blocking.map_or("–".into(), |s| rate(s.throughput)),
                ratio(blocking.map_or(f64::NAN, |s| shown.throughput / s.throughput)),
                ms(shown.p99_ms),
                blocking.map_or("–".into(), |s| ms(s.p99_ms)),
                check_cell(shown)
            )?;
        }
    }
    writeln!(w)?;
    Ok(())
}

fn pgbench_table(w: &mut String, pg: &[PgbenchSummary]) -> fmt::Result {
    writeln!(
        w,
        "### diesel-async / pgbench (PostgreSQL, the same SQL, {} clients) — target {PGBENCH_TARGET:.2} or better\n",
        pgbench::CLIENTS
    )?;
    writeln!(
        w,
        "In the pgbench comparison of the headline, each repetition also runs the diesel-async \
         case once, between pgbench's modes and their mirror, on the same queue size and run \
         length: lockkit's calls. CPU is µs per update (or job), as above.\n"
    )?;
    writeln!(
        w,
        "| script | diesel-async /s | pgbench `-M prepared -j 2` /s | **diesel-async / server limit** | blocking lockkit /s | blocking / server limit | client CPU µs: async · blocking · pgbench | server CPU µs: async · blocking · prepared · extended | correctness |"
    )?;
    writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for s in pg {
        let Some(t) = &s.tasks else { continue };
        writeln!(
            w,
            "| {}{} | {} | {} | **{} ({}–{})** | {} | {} | {} · {} · {} | {} · {} · {} · {} | {} |",
            s.script.title(),
            if t.case.flavor == Flavor::Hand {
                " (hand-written diesel-async)"
            } else {
                ""
            },
            rate(t.rate),
            rate(s.rate(Mode::Prepared)),
            ratio(t.ratio.0),
            ratio(t.ratio.1),
            ratio(t.ratio.2),
            rate(s.lockkit),
            ratio(s.ratio(Mode::Prepared).0),
            us(t.client_cpu),
            us(s.client_cpu.0),
            us(s.client_cpu.1),
            us(t.server_cpu),
            us(s.server_cpu.0),
            us(s.server_cpu.1),
            us(s.server_cpu.2),
            if t.ok { "✅" } else { "❌" }
        )?;
    }
    writeln!(w)?;
    Ok(())
}

/// Where the remaining gap to the server's own limit is, from the numbers.
fn gap(w: &mut String, pg: &[PgbenchSummary]) -> fmt::Result {
    let rows: Vec<(&PgbenchSummary, f64)> = pg
        .iter()
        .filter_map(|s| s.tasks.as_ref().map(|t| (s, t.ratio.0)))
        .collect();
    let list = |f: &dyn Fn(&PgbenchSummary) -> String| {
        rows.iter()
            .map(|(s, _)| f(s))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let tasks = |s: &PgbenchSummary| s.tasks.clone().expect("filtered");
    let below = rows
        .iter()
        .filter(|(_, r)| below(*r, PGBENCH_TARGET))
        .count();
    let cheaper = rows
        .iter()
        .filter(|(s, _)| tasks(s).client_cpu < s.client_cpu.0)
        .count();
    let faster = rows
        .iter()
        .filter(|(s, r)| *r > s.ratio(Mode::Prepared).0)
        .count();
    write!(
        w,
        "**Where the remaining gap is.** Against the server's own limit diesel-async reaches {} \
         (table order), the blocking threads {}; {} of {} scripts below {PGBENCH_TARGET:.2}, \
         diesel-async ahead of the threads on {faster}. ",
        list(&|s| ratio(tasks(s).ratio.0)),
        list(&|s| ratio(s.ratio(Mode::Prepared).0)),
        below,
        rows.len(),
    )?;
    let n = rows.len();
    let cpu = list(&|s| format!("{} · {}", us(tasks(s).client_cpu), us(s.client_cpu.0)));
    if below == 0 {
        return writeln!(
            w,
            "Every script reaches the target on diesel-async: with {} tasks on {ASYNC_THREADS} \
             threads, as pgbench multiplexes its connections, what the blocking rows miss is the \
             cost of their threads (client CPU µs per unit, async · blocking: {cpu}; pgbench {}).\n",
            pgbench::CLIENTS,
            list(&|s| us(s.client_cpu.1)),
        );
    }
    if cheaper == n {
        write!(
            w,
            "Tasks on {ASYNC_THREADS} threads make the client cheaper on every script (client \
             CPU µs per unit, async · blocking: {cpu}; pgbench {}): the thread-per-connection \
             part of the blocking gap is gone, and what remains is not the client's CPU. ",
            list(&|s| us(s.client_cpu.1)),
        )?;
    } else if cheaper == 0 {
        write!(
            w,
            "Tasks on {ASYNC_THREADS} threads do not make the client cheaper on any script \
             (client CPU µs per unit, async · blocking: {cpu}; pgbench {}). The runtime's \
             scheduling and diesel-async's own work per statement cost more than the threads' \
             switches saved, so moving to tasks alone does not close the gap. ",
            list(&|s| us(s.client_cpu.1)),
        )?;
    } else {
        write!(
            w,
            "Tasks on {ASYNC_THREADS} threads make the client cheaper on {cheaper} of {n} \
             scripts, not on the other {} (client CPU µs per unit, async · blocking: {cpu}; \
             pgbench {}): where they do not, the runtime's scheduling and diesel-async's own \
             work per statement cost more than the threads' switches saved. ",
            n - cheaper,
            list(&|s| us(s.client_cpu.1)),
        )?;
    }
    writeln!(
        w,
        "What remains is the statements and their round trips. The server spends {} µs per unit \
         under diesel-async, {} under pgbench `-M prepared` and {} under `-M extended` (table \
         order). lockkit's own `UPDATE`s go out prepared once per connection \
         (`lockkit::atomic::update` and the versioned `UPDATE`), as pgbench `-M prepared` sends \
         them; Diesel's own `UPDATE` is parsed and planned again each time, and diesel-async 0.9 \
         sends such an uncached statement in two round trips (tokio-postgres' `prepare_typed`, \
         then bind and execute): the user's `diesel::update` in `with_lock`'s closure (inside \
         the row lock) and the queue's mark-done do, on both sides of the pair. `with_lock` on a `Versioned` model also advances the version as it locks (on PostgreSQL \
         inside the locking statement, `UPDATE .. WHERE EXISTS (SELECT .. FOR UPDATE) RETURNING ..`), \
         as pgbench's script does too.\n",
        list(&|s| us(tasks(s).server_cpu)),
        list(&|s| us(s.server_cpu.1)),
        list(&|s| us(s.server_cpu.2)),
    )?;
    Ok(())
}
