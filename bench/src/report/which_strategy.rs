//! "Which strategy when": the advice, each point drawn from the numbers below it
//! in the report.

use std::fmt::{self, Write as _};

use super::context::{hot, Report};
use super::format::{ms, num, rate, ratio};
use crate::analysis::ratios::overhead;
use crate::plan::{IMMEDIATE, ORDER_WORKERS, QUEUE_WORKERS, RETRY_WORKERS};
use crate::vocabulary::{report_name, Backend, Case, Retry, Strategy, Workload};

pub(super) fn section(w: &mut String, report: &Report) -> fmt::Result {
    let (results, sums, bs) = (report.results, &report.sums, report.backends.as_slice());
    let get = |b: Backend, c: &Case| sums.get(&(b, *c));
    writeln!(w, "## Which strategy when\n")?;
    writeln!(
        w,
        "Drawn from the numbers below (hot row at 16 workers unless said otherwise).\n"
    )?;
    let tp = |b: Backend, s: Strategy, n: usize| get(b, &hot(s, n)).map(|x| x.throughput);
    let per_backend = |f: &dyn Fn(Backend) -> Option<String>| -> String {
        bs.iter()
            .filter_map(|&b| f(b).map(|t| format!("{} {t}", report_name(b))))
            .collect::<Vec<_>>()
            .join("; ")
    };

    // Fastest safe strategy per backend.
    let safe = [
        Strategy::Optimistic,
        Strategy::WithLock,
        Strategy::Nowait,
        Strategy::Atomic,
    ];
    let best: Vec<(Backend, Strategy)> = bs
        .iter()
        .filter_map(|&b| {
            safe.iter()
                .filter_map(|&s| tp(b, s, 16).map(|t| (s, t)))
                .max_by(|x, y| x.1.total_cmp(&y.1))
                .map(|(s, _)| (b, s))
        })
        .collect();
    let atomic_best = best.iter().filter(|(_, s)| *s == Strategy::Atomic).count();
    writeln!(
        w,
        "* **The change fits in one `UPDATE` → `atomic::update_if`.** {} No read, no lock held \
         across a round trip, no retries ({}).",
        if atomic_best == best.len() && !best.is_empty() {
            "The fastest safe strategy on the hot row on every backend.".to_owned()
        } else {
            format!(
                "Fastest safe strategy on {} of {} backends.",
                atomic_best,
                best.len()
            )
        },
        per_backend(&|b| {
            let a = tp(b, Strategy::Atomic, 16)?;
            let l = tp(b, Strategy::WithLock, 16)?;
            Some(format!("{}/s, {:.1}× with_lock", rate(a), a / l))
        })
    )?;
    let hot16 = |b: Backend, st: Strategy| get(b, &hot(st, 16));
    let describe = |st: Strategy| {
        per_backend(&|b| {
            hot16(b, st).map(|x| {
                format!(
                    "{}/s, {:.2} attempts per success, {} given up per run, p99 {} ms",
                    rate(x.throughput),
                    x.attempts_per_success,
                    num(x.gave_up + x.errors),
                    ms(x.p99_ms)
                )
            })
        })
    };
    writeln!(
        w,
        "* **Read, decide, write a row that many write → `with_lock` when every operation must \
         go through, optimistic + retry when throughput matters more.** `with_lock` never \
         retries but holds the row lock across its round trips: {}. Optimistic + retry holds no \
         lock while it reads and pays in retries and give-ups instead: {}. `nowait` + retry: {}.",
        describe(Strategy::WithLock),
        describe(Strategy::Optimistic),
        describe(Strategy::Nowait),
    )?;
    let cg = |name: &str| {
        bs.iter()
            .filter_map(|&b| {
                results
                    .callgrind
                    .iter()
                    .find(|r| r.name == name && r.backend == b && r.other_title == "hand-written")
                    .map(|r| {
                        format!(
                            "{} {:+.1}%",
                            report_name(b),
                            (r.lockkit / r.other - 1.0) * 100.0
                        )
                    })
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let versioned_cg = cg("update_versioned");
    writeln!(
        w,
        "* **Conflicts are rare, or the edit spans a user's think time → `update_versioned`.** \
         Uncontended it runs at the speed of the same hand-written `UPDATE` (lockkit / \
         hand-written at 4 workers: {}{}) and holds no lock between read and write. Under \
         contention every loser re-reads and retries: {} attempts per success at 16 workers, \
         {} at 32.",
        per_backend(&|b| overhead(
            results,
            b,
            &Case::new(Workload::Uncontended, Strategy::Versioned, 4)
        )
        .map(|r| ratio(r.0))),
        if versioned_cg.is_empty() {
            String::new()
        } else {
            format!("; client instructions per call: {versioned_cg}")
        },
        per_backend(&|b| get(b, &hot(Strategy::Optimistic, 16))
            .map(|x| format!("{:.2}", x.attempts_per_success))),
        per_backend(&|b| get(b, &hot(Strategy::Optimistic, 32))
            .map(|x| format!("{:.2}", x.attempts_per_success))),
    )?;
    let order = |b: Backend, s: Strategy| get(b, &Case::new(Workload::Orders, s, ORDER_WORKERS));
    let deadlocking: Vec<Backend> = bs
        .iter()
        .copied()
        .filter(|&b| order(b, Strategy::NaiveOrder).is_some_and(|x| x.deadlocks > 0.0))
        .collect();
    let per = |list: &[Backend], f: &dyn Fn(Backend) -> Option<String>| -> String {
        list.iter()
            .filter_map(|&b| f(b).map(|t| format!("{} {t}", report_name(b))))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if !deadlocking.is_empty() {
        writeln!(
            w,
            "* **Several rows in one transaction → `lock_all`.** Locking them one at a time in \
             the buyer's order deadlocked {} times per run ({} orders/s); `lock_all` locks in \
             key order and deadlocked {} times ({} orders/s).{}",
            per(&deadlocking, &|b| order(b, Strategy::NaiveOrder)
                .map(|x| num(x.deadlocks))),
            per(&deadlocking, &|b| order(b, Strategy::NaiveOrder)
                .map(|x| rate(x.throughput))),
            per(&deadlocking, &|b| order(b, Strategy::LockAll)
                .map(|x| num(x.deadlocks))),
            per(&deadlocking, &|b| order(b, Strategy::LockAll)
                .map(|x| rate(x.throughput))),
            if bs.contains(&Backend::Sqlite) && !deadlocking.contains(&Backend::Sqlite) {
                sqlite_orders(
                    order(Backend::Sqlite, Strategy::NaiveOrder).map(|x| x.throughput),
                    order(Backend::Sqlite, Strategy::LockAll).map(|x| x.throughput),
                )
            } else {
                String::new()
            }
        )?;
    }
    let queue = |b: Backend, n: i64| {
        get(
            b,
            &Case::new(Workload::Queue, Strategy::Claim, QUEUE_WORKERS).batch(n),
        )
    };
    writeln!(
        w,
        "* **A work queue → `queue::claim`, in batches.** No job ran twice in any run; batches \
         of 10 drain {} the jobs per second of batches of 1.",
        per_backend(&|b| {
            let ten = queue(b, 10)?.throughput;
            let one = queue(b, 1)?.throughput;
            Some(format!("{:.1}×", ten / one))
        })
    )?;
    let retry_row =
        |b: Backend, r: Retry| get(b, &hot(Strategy::Optimistic, RETRY_WORKERS).retry(r));
    writeln!(
        w,
        "* **Keep the default backoff.** `RetryPolicy::immediate({n})` on the hot row needs {} \
         attempts per success where `RetryPolicy::default()` needs {}.",
        per_backend(&|b| retry_row(b, Retry::Immediate(IMMEDIATE[0]))
            .map(|x| format!("{:.2}", x.attempts_per_success))),
        per_backend(
            &|b| retry_row(b, Retry::Default).map(|x| format!("{:.2}", x.attempts_per_success))
        ),
        n = IMMEDIATE[0],
    )?;
    writeln!(
        w,
        "* **Never the naive read-modify-write.** It is fast because it is wrong: {} updates \
         lost per run at 16 workers.",
        per_backend(&|b| get(b, &hot(Strategy::Naive, 16)).map(|x| num(x.lost))),
    )?;
    if bs.contains(&Backend::Sqlite) {
        writeln!(
            w,
            "* **SQLite** has one writer at a time, so every safe strategy serializes writers \
             (`with_lock` is `BEGIN IMMEDIATE`); `atomic::update_if` and `with_lock` are the \
             ones that never retry."
        )?;
    }
    writeln!(w)?;
    Ok(())
}

/// `lock_all` on SQLite, where nothing deadlocks: what the numbers say about
/// it against row by row (orders per second of each).
fn sqlite_orders(row_by_row: Option<f64>, lock_all: Option<f64>) -> String {
    let (Some(row_by_row), Some(lock_all)) = (row_by_row, lock_all) else {
        return String::new();
    };
    let speed = if row_by_row > lock_all * 1.1 {
        format!(
            "row by row is faster there ({} against {} orders/s): `lock_all` also advances the \
             version of every row it locks (`Item` is `Versioned`: one more `UPDATE` per row), \
             where the row-by-row read only reads",
            rate(row_by_row),
            rate(lock_all)
        )
    } else {
        format!(
            "it costs about what row by row costs there ({} against {} orders/s)",
            rate(lock_all),
            rate(row_by_row)
        )
    };
    format!(
        " On SQLite, where writers take turns and nothing deadlocks, it is insurance only, and \
         {speed}. Its `IN (..)` list is padded to 1, 2, 4, .. keys, so each length is one \
         statement that the connection prepares once and caches."
    )
}
