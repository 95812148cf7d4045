//! "Headline": lockkit / hand-written Diesel per paired case, with the
//! instruction counts when callgrind ran; then the pgbench comparison
//! ([`super::pgbench`]) and the retry waste ([`super::retry_waste`]).

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{rate, ratio, table_head};
use crate::analysis::ratios::{overhead, OVERHEAD_TARGET};
use crate::analysis::statistics::median;
use crate::plan;
use crate::run::profile::callgrind::CallgrindRow;
use crate::vocabulary::{report_name, Case, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let (results, bs) = (report.results, report.backends.as_slice());
    writeln!(w, "## Headline\n")?;
    writeln!(
        w,
        "### lockkit / hand-written Diesel (the same SQL) — target {OVERHEAD_TARGET:.2} or better\n"
    )?;
    writeln!(
        w,
        "Throughput through lockkit divided by the same statements written with plain Diesel, \
         run alternately ({} × `lockkit, hand, hand, lockkit`, {:.2} s each) in every \
         repetition; median of the repetitions, (min–max) in brackets. 1.00 means no overhead; \
         the spread shows what this machine's noise is worth.\n",
        results.settings.pair_rounds,
        results.settings.pair_limits.run.as_secs_f64()
    )?;
    table_head(w, "case", bs.iter().map(|&b| report_name(b)))?;
    let mut all = Vec::new();
    for case in plan::paired_cases() {
        write!(w, "| {} |", short_label(&case))?;
        for &b in bs {
            match overhead(results, b, &case) {
                Some((m, lo, hi)) => {
                    all.push(m);
                    write!(w, " **{}** ({}–{}) |", ratio(m), ratio(lo), ratio(hi))?;
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
        .filter(|r| *r < OVERHEAD_TARGET)
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
    if !results.callgrind.is_empty() {
        callgrind_table(w, &results.callgrind)?;
    }
    super::pgbench::section(w, report)?;
    super::retry_waste::section(w, report)?;
    Ok(())
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
