//! The headline's pgbench comparison (PostgreSQL only): lockkit against
//! pgbench sending the same SQL three ways, and what makes up the gap.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{rate, ratio, us};
use crate::analysis::ratios::{pgbench_summaries, PgbenchSummary, PGBENCH_TARGET};
use crate::run::pgbench::{self, Mode};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    let pg = pgbench_summaries(results);
    if !pg.is_empty() {
        writeln!(
            w,
            "### lockkit / pgbench (the same SQL, {} clients) — target {PGBENCH_TARGET:.2} or better\n",
            pgbench::CLIENTS
        )?;
        writeln!(
            w,
            "PostgreSQL only. pgbench runs the statements lockkit sends, with bound parameters \
             (`-c {} -T {}`, scripts in [method](#how-it-was-measured)), in three ways: \
             `-M prepared -j 2`, every statement prepared once per connection and 16 connections \
             on 2 threads, **the server's own limit**; `-M extended -j 2`, every statement parsed \
             and planned again on each execution, which is how Diesel sends every `UPDATE`; and \
             `-M extended -j 16`, that with one thread per connection, as the benchmark's workers \
             have. In every repetition lockkit ({} workers) runs first and last, pgbench in \
             between (each mode twice, in mirrored order). CPU is µs per update (or job) from \
             `/proc`: the client (the benchmark, or pgbench) and the server (every `postgres` \
             process).\n",
            pgbench::CLIENTS,
            results.settings.pgbench_secs,
            pgbench::CLIENTS
        )?;
        writeln!(
            w,
            "| script | lockkit /s | pgbench `-M prepared -j 2` /s | **lockkit / server limit** | `-M extended -j 2` /s | lockkit / that | `-M extended -j 16` /s | lockkit / that | client CPU µs: lockkit · pgbench | server CPU µs: lockkit · prepared · extended | correctness |"
        )?;
        writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        )?;
        for s in &pg {
            let r = |m: Mode| {
                let (med, lo, hi) = s.ratio(m);
                format!("{} ({}–{})", ratio(med), ratio(lo), ratio(hi))
            };
            writeln!(
                w,
                "| {}{} | {} | {} | **{}** | {} | {} | {} | {} | {} · {} | {} · {} · {} | {} |",
                s.script.title(),
                if s.ran_dry {
                    " (a pgbench queue ran dry: its rate is a lower bound)"
                } else {
                    ""
                },
                rate(s.lockkit),
                rate(s.rate(Mode::Prepared)),
                r(Mode::Prepared),
                rate(s.rate(Mode::Extended)),
                r(Mode::Extended),
                rate(s.rate(Mode::ExtendedThreads)),
                r(Mode::ExtendedThreads),
                us(s.client_cpu.0),
                us(s.client_cpu.1),
                us(s.server_cpu.0),
                us(s.server_cpu.1),
                us(s.server_cpu.2),
                if s.ok { "✅" } else { "❌" }
            )?;
        }
        writeln!(w, "\n![lockkit and pgbench](pgbench.svg)\n")?;
        pgbench_reading(w, &pg)?;
    }
    Ok(())
}

fn pgbench_reading(w: &mut String, pg: &[PgbenchSummary]) -> fmt::Result {
    // Values in the table's row order.
    let list =
        |f: &dyn Fn(&PgbenchSummary) -> String| pg.iter().map(f).collect::<Vec<_>>().join(", ");
    let loss = |from: Mode, to: Mode| {
        list(&|s| format!("{:.0}%", (1.0 - s.rate(to) / s.rate(from)) * 100.0))
    };
    let below: Vec<&PgbenchSummary> = pg
        .iter()
        .filter(|s| s.ratio(Mode::Prepared).0 < PGBENCH_TARGET)
        .collect();
    if below.is_empty() {
        writeln!(
            w,
            "Every script reaches the target against the server's own limit.\n"
        )?;
        return Ok(());
    }
    writeln!(
        w,
        "Below target against the server's own limit: {}. The gap is Diesel's, not lockkit's: \
         the hand-written Diesel twins run as fast as lockkit (table above), and against pgbench \
         sending its statements the way Diesel does, lockkit reaches {} (`-M extended -j 2`, in \
         the table's order) and {} (`-M extended -j 16`). Two things make up the gap:\n",
        below
            .iter()
            .map(|s| format!(
                "**{}** at {}",
                s.script.title(),
                ratio(s.ratio(Mode::Prepared).0)
            ))
            .collect::<Vec<_>>()
            .join(", "),
        list(&|s| ratio(s.ratio(Mode::Extended).0)),
        list(&|s| ratio(s.ratio(Mode::ExtendedThreads).0)),
    )?;
    writeln!(
        w,
        "* **Diesel never caches an `UPDATE`.** Diesel 2.3 marks every `UpdateStatement` unsafe \
         to cache (an `Option` in a changeset would change its SQL), so each `UPDATE` goes out as \
         an unnamed statement that the server parses and plans again; its `SELECT`s are prepared \
         once. pgbench itself loses {} (table order) going from `-M prepared` to `-M extended`, \
         and the server CPU column shows where it goes. In `with_lock` and the queue the `UPDATE` \
         runs while the row lock is held, so its parse and plan lengthen every holder's turn.",
        loss(Mode::Prepared, Mode::Extended),
    )?;
    writeln!(
        w,
        "* **One thread per connection.** The benchmark's 16 workers each block in a synchronous \
         Diesel call; pgbench multiplexes 16 connections on 2 threads. On 2 cores shared with the \
         server, every µs of client CPU is taken from the server (client CPU column), and a lock \
         holder whose thread waits for a core holds the lock longer. pgbench loses {} going from \
         `-j 2` to `-j 16`.\n",
        loss(Mode::Extended, Mode::ExtendedThreads),
    )?;
    Ok(())
}
