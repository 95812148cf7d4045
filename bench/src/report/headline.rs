//! "Headline": lockkit / hand-written Diesel per paired case, with the
//! instruction counts when callgrind ran; then the pgbench comparison
//! ([`super::pgbench`]) and the retry waste ([`super::retry_waste`]).

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{below, rate, ratio, table_head};
use crate::analysis::ratios::{overhead, OVERHEAD_TARGET};
use crate::analysis::statistics::median;
use crate::plan;
use crate::run::profile::callgrind::CallgrindRow;
use crate::run::results::{Pair, Results};
use crate::run::sample::Sample;
use crate::vocabulary::{report_name, Backend, Case, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let (results, bs) = (report.results, report.backends.as_slice());
    writeln!(w, "## Headline\n")?;
    writeln!(
        w,
        "### lockkit / hand-written Diesel — target {OVERHEAD_TARGET:.2} or better\n"
    )?;
    writeln!(
        w,
        "Throughput through lockkit divided by the same work written by hand with plain Diesel, \
         run alternately ({} × `lockkit, hand, hand, lockkit`, {:.2} s each) in every \
         repetition; median of the repetitions, (min–max) in brackets; the spread shows what \
         this machine's noise is worth. The two sides send the same SQL, but not the same way, \
         with two exceptions by design (see the method): `with_lock` on the `Versioned` item \
         also advances its version as it locks (one more statement on MariaDB and SQLite), and \
         after a stale write lockkit reads the row's version for its report. The hand-written \
         side is written as users write it: Diesel parses and plans each of its `UPDATE`s \
         again on every execution. lockkit's own statements (and the `UPDATE`s it builds with \
         `lockkit::atomic::update`) are prepared once per connection. So part of each ratio is \
         statement caching, not lockkit's own cost, and 1.00 does not mean no overhead. The \
         write inside `with_lock`'s closure and the queue's mark-done are user code, the same \
         `diesel::update` on both sides.\n",
        results.settings.pair_rounds,
        results.settings.pair_limits.run.as_secs_f64()
    )?;
    table_head(w, "case", bs.iter().map(|&b| report_name(b)))?;
    let mut all = Vec::new();
    let mut marked = 0;
    for case in plan::paired_cases() {
        write!(w, "| {} |", short_label(&case))?;
        for &b in bs {
            match overhead(results, b, &case) {
                Some((m, lo, hi)) => {
                    all.push(m);
                    let mark = failed_mark(results, b, &case);
                    marked += usize::from(!mark.is_empty());
                    write!(w, " **{}** ({}–{}){mark} |", ratio(m), ratio(lo), ratio(hi))?;
                }
                None => {
                    write!(w, " – |")?;
                }
            }
        }
        writeln!(w)?;
    }
    let below: Vec<f64> = all
        .iter()
        .copied()
        .filter(|r| below(*r, OVERHEAD_TARGET))
        .collect();
    writeln!(
        w,
        "\nMedian of all {} cells: **{}**; {} below {OVERHEAD_TARGET:.2}. ![lockkit / hand-written](overhead.svg)\n",
        all.len(),
        ratio(median(&all)),
        if below.is_empty() {
            "none".to_owned()
        } else {
            format!("{} ({})", below.len(), below.iter().map(|r| ratio(*r)).collect::<Vec<_>>().join(", "))
        }
    )?;
    if marked > 0 {
        writeln!(
            w,
            "**{marked} cell(s) marked ❌: a run of that pair did not balance its books** (its \
             correctness line is in the sections below); its ratio compares a wrong result, and \
             the benchmark exited with an error.\n"
        )?;
    }
    if !results.callgrind.is_empty() {
        callgrind_table(w, &results.callgrind)?;
    }
    super::pgbench::section(w, report)?;
    super::retry_waste::section(w, report)?;
    Ok(())
}

/// The mark of a headline cell whose pair had a run that did not balance its
/// books, saying which side; empty when every run balanced.
fn failed_mark(results: &Results, backend: Backend, case: &Case) -> String {
    let pairs: Vec<&Pair> = results
        .pairs
        .iter()
        .filter(|p| p.lockkit.backend == backend && p.lockkit.case == *case)
        .collect();
    let failed = |side: &dyn Fn(&Pair) -> &Sample| {
        pairs
            .iter()
            .map(|p| &side(p).check)
            .filter(|c| !c.ok)
            .collect::<Vec<_>>()
    };
    let (lockkit, hand) = (failed(&|p| &p.lockkit), failed(&|p| &p.hand));
    let side = match (lockkit.is_empty(), hand.is_empty()) {
        (true, true) => return String::new(),
        (false, true) => "lockkit",
        (true, false) => "hand-written",
        (false, false) => "both sides",
    };
    let what = if lockkit.iter().chain(&hand).all(|c| c.lost > 0) {
        match case.workload {
            Workload::Queue => "JOBS RUN TWICE",
            _ => "LOST UPDATES",
        }
    } else {
        "BOOKS DO NOT BALANCE"
    };
    format!(" ❌ ({what}, {side})")
}

fn short_label(case: &Case) -> String {
    let (strategy, workers) = (case.strategy.title(), case.workers);
    match case.workload {
        Workload::Uncontended => format!("uncontended `update_versioned`, {workers} worker(s)"),
        Workload::HotRow => format!("hot row, {strategy}, {workers} worker(s)"),
        Workload::Queue => format!("queue, `claim` batch {}, {workers} workers", case.batch),
        Workload::Orders => format!("orders, {strategy}, {workers} workers"),
        Workload::OwnRows => format!("own rows, {strategy}, {workers} worker(s)"),
    }
}

fn callgrind_table(w: &mut String, rows: &[CallgrindRow]) -> fmt::Result {
    writeln!(
        w,
        "Client instructions per call (`valgrind --tool=callgrind`, counted inside the measured \
         loop only, one connection; the wait for the server costs no instructions). Unlike \
         wall-clock time these do not move with the machine's load:\n"
    )?;
    writeln!(
        w,
        "| call | backend | lockkit | compared with | instructions | lockkit / compared |"
    )?;
    writeln!(w, "| --- | --- | ---: | --- | ---: | ---: |")?;
    for r in rows {
        writeln!(
            w,
            "| `{}` | {} | {} | {} | {} | {:.3} |",
            r.name,
            report_name(r.backend),
            rate(r.lockkit),
            r.other_title,
            rate(r.other),
            r.lockkit / r.other
        )?;
    }
    writeln!(w, "\nWhere the extra instructions go is in [What lockkit itself costs](#what-lockkit-itself-costs).\n")?;
    Ok(())
}
