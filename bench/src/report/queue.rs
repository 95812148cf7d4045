//! Section 3, the queue drain: `queue::claim` in batches of 1 and 10 next to
//! its hand-written twin.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{outcome_cells, pair_cells, rate};
use crate::analysis::ratios::overhead;
use crate::plan::QUEUE_WORKERS;
use crate::vocabulary::{report_name, Backend, Case, Strategy, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let results = report.results;
    let get = |b: Backend, c: &Case| report.get(b, c);
    let bs = report.backends.as_slice();
    let settings = &results.settings;
    writeln!(w, "## 3. Queue drain\n")?;
    writeln!(
        w,
        "{QUEUE_WORKERS} workers drain a `jobs` table ({} jobs per run) with \
         `lockkit::queue::claim(conn, jobs.filter(done.eq(false)).order(id).select(id), n)` \
         (`LIMIT n FOR UPDATE SKIP LOCKED`) inside `lockkit::locked_transaction`, and mark each \
         claimed job done by primary key, one `UPDATE` per job, before the commit. The \
         hand-written twin is `.limit(n).for_update().skip_locked()` in a plain transaction \
         (SQLite: `BEGIN IMMEDIATE`, no lock clause). \"No job twice\" is checked from the ids \
         every worker claimed and the table's `done` count.\n",
        rate(f64::from(settings.pair_limits.jobs))
    )?;
    writeln!(
        w,
        "| backend | batch | lockkit jobs/s | hand-written jobs/s | lockkit / hand | p50 ms | p99 ms | attempts / success | deadlocks | correctness |"
    )?;
    writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for &b in bs {
        for batch in [1, 10] {
            let case = Case::new(Workload::Queue, Strategy::Claim, QUEUE_WORKERS).batch(batch);
            if let (Some(l), Some(h)) = (get(b, &case), get(b, &case.hand())) {
                let r = overhead(results, b, &case).map_or(f64::NAN, |r| r.0);
                writeln!(
                    w,
                    "| {} | {batch} | {} | {} |",
                    report_name(b),
                    pair_cells(l, h, r),
                    outcome_cells(l)
                )?;
            }
        }
    }
    writeln!(w, "\nLatency is per claimed batch.\n")?;
    Ok(())
}
