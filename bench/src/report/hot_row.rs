//! Section 2, the hot row: every hot-row strategy at every worker count, per
//! backend, with its latencies, conflicts and correctness.

use std::fmt::{self, Write as _};

use super::context::{hot, Report};
use super::format::{check_cell, ms, num, rate, table_head};
use crate::plan::HOT_WORKERS;
use crate::vocabulary::{report_name, Backend, Case, Strategy, INITIAL_STOCK};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let get = |b: Backend, c: &Case| report.get(b, c);
    let bs = report.backends.as_slice();
    writeln!(w, "## 2. Hot row\n")?;
    writeln!(
        w,
        "All workers take one unit from the same row (stock {}), as fast as they can:\n\n\
         * **naive**: read the stock, write `stock = <read> - 1`. No lockkit; loses updates.\n\
         * **optimistic + retry**: read the `Versioned` row, `update_versioned`, \
         `lockkit::retry(&RetryPolicy::default(), ..)` on `Stale`.\n\
         * **with_lock**: `lockkit::with_lock(conn, id, |conn, item| ..)`: the locked read, \
         `UPDATE`, commit. On the `Versioned` item the locked read also advances the version: \
         PostgreSQL in one statement (`UPDATE .. WHERE EXISTS (SELECT .. FOR UPDATE) RETURNING ..`), \
         MariaDB `SELECT .. FOR UPDATE` and a version `UPDATE`, SQLite the same in `BEGIN IMMEDIATE`.\n\
         * **nowait + retry**: `with_lock(.., LockOptions::default().nowait(), ..)` inside \
         `lockkit::retry`; a held row is `Busy` at once.\n\
         * **atomic update_if**: `lockkit::atomic::update_if(conn, UPDATE .. SET stock = stock - 1 \
         WHERE id = ? AND stock >= 1)`, no transaction.\n",
        rate(f64::from(INITIAL_STOCK))
    )?;
    writeln!(w, "![hot row throughput](hot_row.svg)\n")?;
    for &b in bs {
        writeln!(w, "### {}\n", report_name(b))?;
        let workers =
            HOT_WORKERS.map(|n| format!("{n} worker{} /s", if n == 1 { "" } else { "s" }));
        table_head(w, "strategy", workers.iter())?;
        for s in Strategy::HOT_ROW {
            write!(w, "| {} |", s.title())?;
            for n in HOT_WORKERS {
                write!(
                    w,
                    " {} |",
                    get(b, &hot(s, n)).map_or("–".into(), |x| rate(x.throughput))
                )?;
            }
            writeln!(w)?;
        }
        writeln!(w)?;
        writeln!(
            w,
            "| strategy | workers | p50 ms | p99 ms | attempts / success | conflicts per run | deadlocks per run | gave up per run | correctness |"
        )?;
        writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        )?;
        for s in Strategy::HOT_ROW {
            for n in HOT_WORKERS {
                if let Some(x) = get(b, &hot(s, n)) {
                    writeln!(
                        w,
                        "| {} | {n} | {} | {} | {:.2} | {} | {} | {} | {} |",
                        s.title(),
                        ms(x.p50_ms),
                        ms(x.p99_ms),
                        x.attempts_per_success,
                        num(x.stale + x.busy + x.lock_timeouts),
                        num(x.deadlocks),
                        num(x.gave_up),
                        check_cell(x)
                    )?;
                }
            }
        }
        writeln!(w)?;
    }
    writeln!(
        w,
        "Conflicts are `Stale` writes (optimistic), `Busy` rows (nowait) and lock timeouts. \"Gave up\" counts operations whose retries ran out (`RetriesExhausted`); they \
         sold nothing and are not in the throughput.\n"
    )?;
    Ok(())
}
