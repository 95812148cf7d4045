//! The adaptive strategy next to the fixed strategies it chooses between, on
//! own rows and on the hot row: its throughput as a ratio of the best fixed one
//! in the same run.

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{check_cell, rate, ratio};
use crate::analysis::statistics::Summary;
use crate::plan::HOT_WORKERS;
use crate::vocabulary::{report_name, Backend, Case, Strategy, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    writeln!(w, "## Adaptive: optimistic while calm, locked while hot\n")?;
    writeln!(
        w,
        "`lockkit::adaptive::AdaptivePolicy::update(conn, id, |item| item.stock -= 1)` with \
         `AdaptivePolicy::new()`: the row read fresh, changed and written version-checked, \
         optimistically (backing off as `RetryPolicy::default()` capped at 80 ms between \
         lost races; a call that loses 8 races in a row takes the lock) while few of its recent optimistic writes lose the race; once 3/4 of them do (after \
         100 ms of optimistic writes at least), the row is locked (`FOR UPDATE`; SQLite: `BEGIN IMMEDIATE`) for a 100 ms trial, and \
         stays locked for a second only if the trial wrote the row more often per second \
         than the optimistic writes before it (a lost trial makes the next wait 1 s, \
         doubling). Each run starts with a fresh policy, so \
         its learning is inside the numbers. **Own rows**: each worker reads and decrements \
         its own row (no contention); **hot row**: every worker the same row. The fixed \
         strategies do the same read-modify-write: optimistic + retry \
         (`RetryPolicy::default()`: 5 attempts, then the call gives up and is not counted) \
         and `with_lock`. The three run back to back in every \
         repetition, `a b c c b a` (the first turning from one repetition to the next; each \
         strategy's two runs merged), apart from the hot-row section's runs. **adaptive / best** is the adaptive \
         throughput over the better fixed one (target ≥ 0.9); **locked** is \
         the share of adaptive writes made under the lock.\n"
    )?;
    let mut misses = Vec::new();
    for &b in &report.backends {
        writeln!(w, "### {}\n", report_name(b))?;
        writeln!(
            w,
            "| workload | workers | optimistic + retry /s | with_lock /s | adaptive /s | adaptive / best | locked | correctness |"
        )?;
        writeln!(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")?;
        for workload in [Workload::OwnRows, Workload::HotRow] {
            for n in HOT_WORKERS {
                let get = |s| report.adaptive.get(&(b, Case::new(workload, s, n)));
                let Some(adaptive) = get(Strategy::Adaptive) else {
                    continue;
                };
                let fixed = |s| get(s).map(|x| x.throughput);
                let best = [Strategy::Optimistic, Strategy::WithLock]
                    .into_iter()
                    .filter_map(fixed)
                    .fold(f64::NAN, f64::max);
                let cell = |s| fixed(s).map_or("–".into(), rate);
                if adaptive.throughput < TARGET * best {
                    misses.push(miss(
                        b,
                        workload,
                        n,
                        adaptive,
                        best,
                        fixed(Strategy::Optimistic),
                    ));
                }
                writeln!(
                    w,
                    "| {} | {n} | {} | {} | {} | {} | {:.0}% | {} |",
                    workload.title(),
                    cell(Strategy::Optimistic),
                    cell(Strategy::WithLock),
                    rate(adaptive.throughput),
                    if best.is_finite() {
                        ratio(adaptive.throughput / best)
                    } else {
                        "–".into()
                    },
                    100.0 * adaptive.locked_share,
                    check_cell(adaptive)
                )?;
            }
        }
        writeln!(w)?;
    }
    if misses.is_empty() {
        writeln!(w, "Every cell is at {TARGET} or better.\n")?;
    } else {
        writeln!(w, "Below {TARGET}: {}.\n", misses.join("; "))?;
    }
    Ok(())
}

/// adaptive / best fixed strategy, the target of every cell.
const TARGET: f64 = 0.9;

/// What the report says of a cell below [`TARGET`]: its numbers, and, where
/// the adaptive runs lost no race, why the rule could not have done better.
fn miss(
    b: Backend,
    workload: Workload,
    n: usize,
    adaptive: &Summary,
    best: f64,
    optimistic: Option<f64>,
) -> String {
    let mut s = format!(
        "{} {} at {n} workers, {} ({:.0}% of the writes locked, {:.1} races lost per run",
        report_name(b),
        workload.title(),
        ratio(adaptive.throughput / best),
        100.0 * adaptive.locked_share,
        adaptive.stale
    );
    if let Some(optimistic) = optimistic {
        s.push_str(&format!(
            "; {} of optimistic + retry",
            ratio(adaptive.throughput / optimistic)
        ));
    }
    s.push(')');
    if adaptive.stale == 0.0 && adaptive.locked_share == 0.0 {
        s.push_str(if optimistic.is_some_and(|o| o < best) {
            ": no race was lost, and the rule learns from lost races, so the row stayed \
             optimistic while `with_lock` was the faster fixed strategy"
        } else {
            ": no race lost and no write locked, so the adaptive calls sent what optimistic + \
             retry sends, plus the bookkeeping measured under [What lockkit itself \
             costs](#what-lockkit-itself-costs): the rest is the spread of the runs"
        });
    }
    s
}
