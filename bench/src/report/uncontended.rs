//! Section 1, the uncontended versioned update: lockkit next to the same
//! hand-written `UPDATE`, per backend and worker count.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{outcome_cells, pair_cells, rate, ratio};
use crate::analysis::ratios::overhead;
use crate::plan::{UNCONTENDED_TWINS, UNCONTENDED_WORKERS};
use crate::vocabulary::{report_name, Backend, Case, Strategy, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    let get = |b: Backend, c: &Case| report.get(b, c);
    let bs = report.backends.as_slice();
    writeln!(w, "## 1. Uncontended versioned update\n")?;
    writeln!(
        w,
        "Each worker updates its own row with `item.update_versioned(&mut conn)` (one \
         `UPDATE .. WHERE id = ? AND lock_version = ?`), next to the same statement written \
         by hand with plain Diesel and its own row-count check. No conflicts: this is the \
         price of the version check itself. Two more twins run alone: the hand-written \
         update that binds the next version (`SET lock_version = ?`, as users write it) and \
         the peer crate `diesel_versioning` 0.1.1 (which sends that statement).\n"
    )?;
    writeln!(
        w,
        "| backend | workers | lockkit /s | hand-written /s | lockkit / hand | binds next /s | lockkit / it | diesel_versioning /s | lockkit / it | p50 ms | p99 ms | attempts / success | deadlocks | correctness |"
    )?;
    writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for &b in bs {
        for workers in UNCONTENDED_WORKERS {
            let case = Case::new(Workload::Uncontended, Strategy::Versioned, workers);
            if let (Some(l), Some(h)) = (get(b, &case), get(b, &case.hand())) {
                let r = overhead(results, b, &case).map_or(f64::NAN, |r| r.0);
                let twins = UNCONTENDED_TWINS.map(|flavor| {
                    get(b, &Case { flavor, ..case }).map_or((f64::NAN, f64::NAN), |t| {
                        (t.throughput, l.throughput / t.throughput)
                    })
                });
                writeln!(
                    w,
                    "| {} | {workers} | {} | {} | {} | {} | {} | {} |",
                    report_name(b),
                    pair_cells(l, h, r),
                    rate(twins[0].0),
                    ratio(twins[0].1),
                    rate(twins[1].0),
                    ratio(twins[1].1),
                    outcome_cells(l)
                )?;
            }
        }
    }
    writeln!(w)?;
    Ok(())
}
