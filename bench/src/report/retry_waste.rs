//! The headline's retry waste: `RetryPolicy::default()` against
//! `RetryPolicy::immediate(n)` on the hot row.

use std::fmt::{self, Write as _};

use super::context::{hot, Report};
use super::format::{num, rate, table_head};
use crate::plan::{IMMEDIATE, RETRY_WORKERS};
use crate::vocabulary::{report_name, Retry, Strategy};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let (sums, bs) = (&report.sums, report.backends.as_slice());
    writeln!(
        w,
        "### Retry waste: optimistic + retry on the hot row, {RETRY_WORKERS} workers\n"
    )?;
    writeln!(
        w,
        "`RetryPolicy::default()` (5 attempts, full-jitter backoff from 10 ms) against \
         `RetryPolicy::immediate(n)` (n attempts, no wait). Each cell: attempts per success · \
         updates/s · operations given up per run.\n"
    )?;
    table_head(w, "policy", bs.iter().map(|&b| report_name(b)))?;
    let mut policies = vec![Retry::Default];
    policies.extend(IMMEDIATE.iter().map(|&n| Retry::Immediate(n)));
    for p in policies {
        write!(w, "| `{}` |", p.title())?;
        for &b in bs {
            let case = hot(Strategy::Optimistic, RETRY_WORKERS).retry(p);
            match sums.get(&(b, case)) {
                Some(x) => {
                    write!(
                        w,
                        " **{:.2}** · {} · {} |",
                        x.attempts_per_success,
                        rate(x.throughput),
                        num(x.gave_up)
                    )?;
                }
                None => {
                    write!(w, " – |")?;
                }
            }
        }
        writeln!(w)?;
    }
    writeln!(w)?;
    Ok(())
}
