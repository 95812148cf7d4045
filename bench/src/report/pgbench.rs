//! The headline's pgbench comparison (PostgreSQL only): lockkit against
//! pgbench sending the same SQL four ways, and what makes up the gap.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{below, rate, ratio, us};
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
             (`-c {} -T {}`, scripts in [method](#how-it-was-measured)), in four ways: \
             `-M prepared -j 2`, every statement prepared once per connection and 16 connections \
             on 2 threads, **the server's own limit**; `-M prepared -j 16`, that with one thread \
             per connection, as the benchmark's workers have; `-M extended`, every statement \
             parsed and planned again on each execution, which is how Diesel sends each `UPDATE` \
             of its own, on 2 and on 16 threads. lockkit sends its own statements and \
             `lockkit::atomic::update`'s prepared; the `UPDATE` inside `with_lock`'s closure and \
             the queue's mark-done are the user's `diesel::update`, sent as `-M extended` sends \
             them, so no one mode of pgbench matches the with_lock and queue scripts statement \
             for statement. In every repetition lockkit ({} workers) runs first and last, pgbench in \
             between (each mode twice, in mirrored order). CPU is µs per update (or job) from \
             `/proc`: the client (the benchmark, or pgbench) and the server (every `postgres` \
             process).\n",
            pgbench::CLIENTS,
            results.settings.pgbench_secs,
            pgbench::CLIENTS
        )?;
        writeln!(
            w,
            "| script | lockkit /s | pgbench `-M prepared -j 2` /s | **lockkit / server limit** | `-M prepared -j 16` /s | lockkit / that | `-M extended -j 2` /s | lockkit / that | `-M extended -j 16` /s | lockkit / that | client CPU µs: lockkit · pgbench | server CPU µs: lockkit · prepared · extended | correctness |"
        )?;
        writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        )?;
        for s in &pg {
            let r = |m: Mode| {
                let (med, lo, hi) = s.ratio(m);
                format!("{} ({}–{})", ratio(med), ratio(lo), ratio(hi))
            };
            writeln!(
                w,
                "| {}{} | {} | {} | **{}** | {} | {} | {} | {} | {} | {} | {} · {} | {} · {} · {} | {} |",
                s.script.title(),
                if s.ran_dry {
                    " (a pgbench queue ran dry: its rate is a lower bound)"
                } else {
                    ""
                },
                rate(s.lockkit),
                rate(s.rate(Mode::Prepared)),
                r(Mode::Prepared),
                rate(s.rate(Mode::PreparedThreads)),
                r(Mode::PreparedThreads),
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
        .filter(|s| below(s.ratio(Mode::Prepared).0, PGBENCH_TARGET))
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
        "Below target against the server's own limit: {}. lockkit sends its own statements \
         prepared once per connection, as `-M prepared` does (its `UPDATE`s through \
         `lockkit::atomic::update`), but not the `UPDATE` in `with_lock`'s closure nor the \
         queue's mark-done: those are the user's `diesel::update`, parsed and planned on every \
         execution, as `-M extended` does (which costs pgbench {} in table order). Against pgbench prepared on one \
         thread per connection (`-M prepared -j 16`), as the benchmark's workers are, lockkit \
         reaches {}. What is left is the client's:\n",
        below
            .iter()
            .map(|s| format!(
                "**{}** at {}",
                s.script.title(),
                ratio(s.ratio(Mode::Prepared).0)
            ))
            .collect::<Vec<_>>()
            .join(", "),
        loss(Mode::Prepared, Mode::Extended),
        list(&|s| ratio(s.ratio(Mode::PreparedThreads).0)),
    )?;
    writeln!(
        w,
        "* **One thread per connection.** The benchmark's 16 workers each block in a synchronous \
         Diesel call; pgbench multiplexes 16 connections on 2 threads. On 2 cores shared with the \
         server, a lock holder whose thread waits for a core holds the lock longer. pgbench \
         itself loses {} going from `-j 2` to `-j 16` (table order).",
        loss(Mode::Prepared, Mode::PreparedThreads),
    )?;
    writeln!(
        w,
        "* **Diesel's work on the client.** Diesel builds, binds and reads each statement in the \
         worker's thread: {} µs of client CPU per update or job against pgbench's {} (client CPU \
         column), each µs taken from the server on 2 shared cores.\n",
        list(&|s| us(s.client_cpu.0)),
        list(&|s| us(s.client_cpu.1)),
    )?;
    Ok(())
}
