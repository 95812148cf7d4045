//! "Which strategy when": the advice, each point drawn from the numbers below it
//! in the report.

use std::fmt::{self, Write as _};

use super::context::{hot, Report};
use super::format::{below, ms, num, rate, ratio};
use crate::analysis::ratios::{overhead, OVERHEAD_TARGET};
use crate::plan::{IMMEDIATE, ORDER_WORKERS, QUEUE_WORKERS, RETRY_WORKERS};
use crate::run::sample::Sample;
use crate::vocabulary::{report_name, Backend, Case, Flavor, Retry, Strategy, Workload};

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
    // Whether every run of the hot-row `strategy` at 16 workers on `b` took one
    // attempt per operation (`None`: it did not run).
    let one_attempt = |b: Backend, strategy: Strategy| {
        one_attempt_each(
            &results
                .samples
                .iter()
                .filter(|s| s.backend == b && s.case == hot(strategy, 16))
                .collect::<Vec<_>>(),
        )
    };
    let with_lock_runs: Vec<(Backend, bool)> = bs
        .iter()
        .filter_map(|&b| one_attempt(b, Strategy::WithLock).map(|once| (b, once)))
        .collect();
    writeln!(
        w,
        "* **Read, decide, write a row that many write → `with_lock` when every operation must \
         go through, optimistic + retry when throughput matters more.** `with_lock` waits for \
         the row lock instead of retrying{} and holds it across its round trips: {}. Optimistic \
         + retry holds no lock while it reads and pays in retries and give-ups instead: {}. \
         `nowait` + retry: {}.",
        attempts_clause(&with_lock_runs),
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
    let uncontended = Case::new(Workload::Uncontended, Strategy::Versioned, 4);
    let versioned_ratios: Vec<(Backend, f64)> = bs
        .iter()
        .filter_map(|&b| overhead(results, b, &uncontended).map(|r| (b, r.0)))
        .collect();
    writeln!(
        w,
        "* **Conflicts are rare, or the edit spans a user's think time → `update_versioned`.** \
         {} (lockkit / hand-written at 4 workers: {}{}; lockkit's `UPDATE` is prepared once \
         per connection, the hand-written one planned again each time) and holds no lock \
         between read and write. Under contention every loser re-reads and retries: {} \
         attempts per success at 16 workers, {} at 32.",
        target_clause(&versioned_ratios),
        per_backend(&|b| versioned_ratios
            .iter()
            .find(|r| r.0 == b)
            .map(|r| ratio(r.1))),
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
    let claims: Vec<&Sample> = results
        .all_samples()
        .filter(|s| s.case.strategy == Strategy::Claim && s.case.flavor == Flavor::Lockkit)
        .collect();
    writeln!(
        w,
        "* **A work queue → `queue::claim`, in batches.** {}Batches of 10 drain {} the jobs per \
         second of batches of 1.",
        queue_clause(
            claims.len(),
            claims.iter().filter(|s| !s.check.ok).count(),
            claims.iter().map(|s| s.check.lost.max(0)).sum()
        ),
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
    let naive_lost: Vec<(Backend, f64)> = bs
        .iter()
        .filter_map(|&b| get(b, &hot(Strategy::Naive, 16)).map(|x| (b, x.lost)))
        .collect();
    if !naive_lost.is_empty() {
        writeln!(
            w,
            "* **Never the naive read-modify-write.** {}",
            naive_clause(&naive_lost)
        )?;
    }
    if bs.contains(&Backend::Sqlite) {
        let once: Vec<String> = Strategy::HOT_ROW
            .into_iter()
            .filter(|s| s.is_safe() && one_attempt(Backend::Sqlite, *s) == Some(true))
            .map(|s| format!("`{}`", s.title()))
            .collect();
        writeln!(
            w,
            "* **SQLite** has one writer at a time, so every safe strategy serializes writers \
             (`with_lock` is `BEGIN IMMEDIATE`); {}.",
            if once.is_empty() {
                "at 16 workers every safe strategy took more than one attempt for some \
                 operation"
                    .to_owned()
            } else {
                format!(
                    "at 16 workers one attempt per operation in every run: {}",
                    once.join(", ")
                )
            }
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

/// Whether every one of `runs` completed something and took one attempt per
/// operation (`None`: no runs).
fn one_attempt_each(runs: &[&Sample]) -> Option<bool> {
    if runs.is_empty() {
        return None;
    }
    Some(
        runs.iter()
            .all(|s| s.counts.successes > 0 && s.counts.attempts == s.counts.successes),
    )
}

/// What the runs of `with_lock` (per backend: one attempt per operation in
/// every run?) say about its attempts, as a clause after "instead of
/// retrying".
fn attempts_clause(runs: &[(Backend, bool)]) -> String {
    let not: Vec<&str> = runs
        .iter()
        .filter(|r| !r.1)
        .map(|r| report_name(r.0))
        .collect();
    if runs.is_empty() {
        String::new()
    } else if not.is_empty() {
        " (one attempt per operation in every run)".to_owned()
    } else {
        format!(
            " (yet some attempts failed on {}: see the attempts per success)",
            not.join(", ")
        )
    }
}

/// Where `update_versioned` uncontended stands against the target, from its
/// lockkit / hand-written ratios per backend.
fn target_clause(ratios: &[(Backend, f64)]) -> String {
    let below: Vec<&str> = ratios
        .iter()
        .filter(|r| r.1.is_nan() || below(r.1, OVERHEAD_TARGET))
        .map(|r| report_name(r.0))
        .collect();
    if ratios.is_empty() {
        "Uncontended it was not paired with the hand-written `UPDATE` in this run".to_owned()
    } else if below.is_empty() {
        format!(
            "Uncontended it reaches the {OVERHEAD_TARGET:.2} target against the same \
             hand-written `UPDATE` on every backend"
        )
    } else {
        format!(
            "Uncontended it stays below the {OVERHEAD_TARGET:.2} target against the same \
             hand-written `UPDATE` on {}",
            below.join(", ")
        )
    }
}

/// What the queue's checks found: `runs` runs of `queue::claim`, `failed` of
/// them unbalanced, `twice` jobs run twice in all.
fn queue_clause(runs: usize, failed: usize, twice: i64) -> String {
    match (runs, failed) {
        (0, _) => String::new(),
        (n, 0) => format!("No job ran twice in any of its {n} runs. "),
        (n, f) => format!(
            "**{f} of its {n} runs did not balance their books** ({twice} jobs run twice). "
        ),
    }
}

/// What the naive read-modify-write lost (per backend, per run at 16 workers).
fn naive_clause(lost: &[(Backend, f64)]) -> String {
    let losing: Vec<String> = lost
        .iter()
        .filter(|x| x.1 > 0.0)
        .map(|x| format!("{} {}", report_name(x.0), num(x.1)))
        .collect();
    let none: Vec<&str> = lost
        .iter()
        .filter(|x| x.1.is_nan() || x.1 <= 0.0)
        .map(|x| report_name(x.0))
        .collect();
    if losing.is_empty() {
        return "It lost no update at 16 workers in these runs, but nothing in it stops two \
                writers from writing over each other's read."
            .to_owned();
    }
    format!(
        "It loses updates: {} lost per run at 16 workers{}.",
        losing.join("; "),
        if none.is_empty() {
            String::new()
        } else {
            format!(" (none on {} in these runs)", none.join(", "))
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claims_follow_the_numbers() {
        let (pg, my) = (Backend::Postgres, Backend::Mysql);
        // with_lock: one attempt each only when every run says so.
        assert!(attempts_clause(&[(pg, true), (my, true)]).contains("one attempt"));
        let some_failed = attempts_clause(&[(pg, true), (my, false)]);
        assert!(some_failed.contains("failed on MariaDB"), "{some_failed}");
        assert_eq!(attempts_clause(&[]), "");
        // update_versioned: at the target, or below it where it is.
        assert!(target_clause(&[(pg, 1.01), (my, 0.97)]).contains("reaches"));
        let below = target_clause(&[(pg, 1.01), (my, 0.90)]);
        assert!(
            below.contains("below") && below.contains("MariaDB"),
            "{below}"
        );
        assert!(!below.contains("PostgreSQL"), "{below}");
        // The queue: no job twice only when every check passed.
        assert!(queue_clause(6, 0, 0).starts_with("No job ran twice in any of its 6 runs"));
        let twice = queue_clause(6, 1, 3);
        assert!(
            twice.contains("1 of its 6 runs") && twice.contains("3 jobs"),
            "{twice}"
        );
        assert!(!twice.contains("No job"), "{twice}");
        assert_eq!(queue_clause(0, 0, 0), "");
        // Naive: what it lost, and never "lost" when it did not.
        let lost = naive_clause(&[(pg, 120.0), (my, 0.0)]);
        assert!(
            lost.contains("PostgreSQL 120") && lost.contains("none on MariaDB"),
            "{lost}"
        );
        let none = naive_clause(&[(pg, 0.0)]);
        assert!(
            none.contains("lost no update") && !none.contains("loses"),
            "{none}"
        );
    }
}
