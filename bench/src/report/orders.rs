//! Section 4, multi-row orders: row by row (deadlocks, retried) against
//! `lock_all` (key order).

use std::fmt::{self, Write as _};

use super::context::Report;
use super::format::{check_cell, ms, num, rate};
use crate::plan::ORDER_WORKERS;
use crate::vocabulary::{report_name, Backend, Case, Strategy, Workload, ORDER_ITEMS};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let get = |b: Backend, c: &Case| report.get(b, c);
    let bs = report.backends.as_slice();
    writeln!(w, "## 4. Multi-row orders\n")?;
    writeln!(
        w,
        "{ORDER_WORKERS} workers place orders of 2 or 3 distinct items out of {ORDER_ITEMS}, \
         in random order, one unit each, all or nothing, inside `lockkit::locked_transaction` \
         and `lockkit::retry(&RetryPolicy::default(), ..)`:\n\n\
         * **row by row + retry**: `items.find(id).for_update()` one row at a time in the \
         buyer's order. Two buyers holding each other's next row deadlock; the server aborts \
         one (`Error::Deadlock`) and `retry` runs it again.\n\
         * **lock_all**: `Item::lock_all(conn, &ids)`: one `SELECT .. ORDER BY id FOR UPDATE`, \
         rows locked in key order, so no cycle of waits can form.\n"
    )?;
    writeln!(
        w,
        "| backend | strategy | orders/s | p50 ms | p99 ms | attempts / success | deadlocks per run | gave up per run | correctness |"
    )?;
    writeln!(
        w,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    )?;
    for &b in bs {
        for s in [Strategy::NaiveOrder, Strategy::LockAll] {
            if let Some(x) = get(b, &Case::new(Workload::Orders, s, ORDER_WORKERS)) {
                writeln!(
                    w,
                    "| {} | {} | {} | {} | {} | {:.2} | {} | {} | {} |",
                    report_name(b),
                    s.title(),
                    rate(x.throughput),
                    ms(x.p50_ms),
                    ms(x.p99_ms),
                    x.attempts_per_success,
                    num(x.deadlocks),
                    num(x.gave_up),
                    check_cell(x)
                )?;
            }
        }
    }
    writeln!(
        w,
        "\nPostgreSQL looks for deadlocks only after a lock wait of `deadlock_timeout` (see the \
         settings above), so there every deadlock also costs that long; MariaDB detects them at \
         once. SQLite has no row locks: `BEGIN IMMEDIATE` makes writers take turns, and it \
         cannot deadlock.\n"
    )?;
    Ok(())
}
