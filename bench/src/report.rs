//! `docs/BENCHMARKS.md`: written from the measured numbers, nothing by hand.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::run::profile::callgrind::CallgrindRow;
use crate::run::pgbench::{self, Mode, Script};
use crate::run::sample::Sample;
use crate::stats::{median, Summary};
use crate::plan::{
    self, HOT_WORKERS, IMMEDIATE, ORDER_WORKERS, QUEUE_WORKERS, RETRY_WORKERS,
    UNCONTENDED_WORKERS,
};
use crate::run::results::Results;
use crate::{Backend, Case, Retry, Strategy, Workload, INITIAL_STOCK, ORDER_ITEMS};

/// The overhead target: lockkit / hand-written.
pub const OVERHEAD_TARGET: f64 = 0.97;
/// The pgbench target: lockkit / pgbench.
pub const PGBENCH_TARGET: f64 = 0.85;

/// The summaries of every (backend, case).
pub fn summaries(results: &Results) -> BTreeMap<(Backend, Case), Summary> {
    let mut groups: BTreeMap<(Backend, Case), Vec<&Sample>> = BTreeMap::new();
    for s in &results.samples {
        groups.entry((s.backend, s.case)).or_default().push(s);
    }
    groups
        .into_iter()
        .filter_map(|(k, v)| Summary::of(&v).map(|s| (k, s)))
        .collect()
}

/// Median, min and max of the per-repetition lockkit/hand-written ratios of `case`.
pub fn overhead(results: &Results, backend: Backend, case: &Case) -> Option<(f64, f64, f64)> {
    let ratios: Vec<f64> = results
        .pairs
        .iter()
        .filter(|p| p.lockkit.backend == backend && p.lockkit.case == *case)
        .map(|p| p.ratio())
        .collect();
    if ratios.is_empty() {
        return None;
    }
    Some((
        median(&ratios),
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    ))
}

/// The pgbench comparison of one script, over the repetitions.
#[derive(Debug, Clone)]
pub struct PgbenchSummary {
    /// The script.
    pub script: Script,
    /// lockkit's median rate.
    pub lockkit: f64,
    /// Per pgbench mode: its median rate, and the median, min and max of the
    /// per-repetition ratios lockkit / pgbench.
    pub modes: Vec<(Mode, f64, (f64, f64, f64))>,
    /// Client CPU µs per unit: lockkit, pgbench `-M prepared`.
    pub client_cpu: (f64, f64),
    /// Server CPU µs per unit: with lockkit, with `-M prepared`, with `-M extended`.
    pub server_cpu: (f64, f64, f64),
    /// lockkit's p99 latency, ms.
    pub p99_ms: f64,
    /// Whether a pgbench queue ran dry.
    pub ran_dry: bool,
    /// Whether lockkit's books balanced in every run.
    pub ok: bool,
}

impl PgbenchSummary {
    /// pgbench's median rate in `mode`.
    pub fn rate(&self, mode: Mode) -> f64 {
        self.modes
            .iter()
            .find(|m| m.0 == mode)
            .map_or(f64::NAN, |m| m.1)
    }

    /// lockkit / pgbench in `mode`: median, min, max.
    pub fn ratio(&self, mode: Mode) -> (f64, f64, f64) {
        self.modes
            .iter()
            .find(|m| m.0 == mode)
            .map_or((f64::NAN, f64::NAN, f64::NAN), |m| m.2)
    }
}

fn spread(values: &[f64]) -> (f64, f64, f64) {
    (
        median(values),
        values.iter().copied().fold(f64::INFINITY, f64::min),
        values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// One [`PgbenchSummary`] per script measured.
pub fn pgbench_summaries(results: &Results) -> Vec<PgbenchSummary> {
    Script::ALL
        .iter()
        .filter_map(|&script| {
            let pairs: Vec<_> = results
                .pgbench
                .iter()
                .filter(|p| p.script == script)
                .collect();
            if pairs.is_empty() {
                return None;
            }
            let runs = |mode: Mode| -> Vec<&crate::run::pgbench::PgbenchRun> {
                pairs
                    .iter()
                    .flat_map(|p| p.pgbench.iter())
                    .filter(|r| r.mode == mode)
                    .collect()
            };
            let lockkit_med = |f: &dyn Fn(&Sample) -> f64| {
                median(&pairs.iter().map(|p| f(&p.lockkit)).collect::<Vec<_>>())
            };
            let run_med = |mode: Mode, f: &dyn Fn(&crate::run::pgbench::PgbenchRun) -> f64| {
                median(&runs(mode).iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            Some(PgbenchSummary {
                script,
                lockkit: lockkit_med(&|s| s.throughput()),
                modes: Mode::ALL
                    .iter()
                    .map(|&mode| {
                        let rate = median(
                            &pairs
                                .iter()
                                .map(|p| p.pgbench_rate(mode))
                                .collect::<Vec<_>>(),
                        );
                        let ratios: Vec<f64> = pairs.iter().map(|p| p.ratio(mode)).collect();
                        (mode, rate, spread(&ratios))
                    })
                    .collect(),
                client_cpu: (
                    lockkit_med(&|s| s.client_cpu_us()),
                    run_med(Mode::Prepared, &|r| r.client_cpu_us()),
                ),
                server_cpu: (
                    lockkit_med(&|s| s.server_cpu_us()),
                    run_med(Mode::Prepared, &|r| r.server_cpu_us()),
                    run_med(Mode::Extended, &|r| r.server_cpu_us()),
                ),
                p99_ms: lockkit_med(&|s| s.latency_ms(0.99)),
                ran_dry: pairs
                    .iter()
                    .flat_map(|p| p.pgbench.iter())
                    .any(|r| r.ran_dry),
                ok: pairs.iter().all(|p| p.lockkit.check.ok),
            })
        })
        .collect()
}

/// `12,345`.
pub fn rate(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let n = v.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// Milliseconds with sensible precision.
pub fn ms(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v < 1.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "–".into()
    }
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v == v.round() {
        rate(v)
    } else {
        format!("{v:.1}")
    }
}

fn us(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        "–".into()
    }
}

/// The correctness cell of a summary.
fn check_cell(s: &Summary) -> String {
    if s.checks_ok == s.runs {
        format!(
            "✅ {}{}",
            s.detail,
            if s.slices > s.runs {
                format!(" (one of {} checked runs)", s.slices)
            } else {
                String::new()
            }
        )
    } else if !s.case.strategy.is_safe() {
        format!("❌ {} lost updates per run ({})", num(s.lost), s.detail)
    } else {
        format!(
            "❌ FAILED in {} of {} runs: {}",
            s.runs - s.checks_ok,
            s.runs,
            s.detail
        )
    }
}

fn backends(results: &Results) -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| results.settings.backends.contains(b))
        .collect()
}

fn hot(strategy: Strategy, workers: usize) -> Case {
    Case::new(Workload::HotRow, strategy, workers)
}

/// The Markdown report.
pub fn markdown(results: &Results) -> String {
    let sums = summaries(results);
    let get = |b: Backend, c: &Case| sums.get(&(b, *c));
    let bs = backends(results);
    let settings = &results.settings;
    let mut md = String::new();
    let w = &mut md;

    // --- title ---------------------------------------------------------------
    let _ = writeln!(w, "# lockkit benchmarks\n");
    let _ = writeln!(
        w,
        "Generated by `cargo run --release -p lockkit-bench{}` in {:.0} s: {}. \
         Do not edit by hand; run it again to update this file and the charts.\n",
        if settings.quick { " -- --quick" } else { "" },
        results.wall.as_secs_f64(),
        if settings.reps == 1 {
            format!(
                "one repetition of {:.1} s runs (`--quick`: development numbers, not for quoting)",
                settings.limits.run.as_secs_f64()
            )
        } else {
            format!(
                "every number is the **median of {} repetitions** ({:.1} s runs)",
                settings.reps,
                settings.limits.run.as_secs_f64()
            )
        }
    );

    which_strategy_when(w, results, &sums, &bs);
    headline(w, results, &sums, &bs);
    machine(w, results);
    method(w, results);

    // --- 1. uncontended -------------------------------------------------------
    let _ = writeln!(w, "## 1. Uncontended versioned update\n");
    let _ = writeln!(
        w,
        "Each worker updates its own row with `item.update_versioned(&mut conn)` (one \
         `UPDATE .. WHERE id = ? AND lock_version = ?`), next to the same statement written \
         by hand with plain Diesel and its own row-count check. No conflicts: this is the \
         price of the version check itself.\n"
    );
    let _ = writeln!(
        w,
        "| backend | workers | lockkit /s | hand-written /s | lockkit / hand | p50 ms | p99 ms | attempts / success | deadlocks | correctness |"
    );
    let _ = writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for &b in &bs {
        for workers in UNCONTENDED_WORKERS {
            let case = Case::new(Workload::Uncontended, Strategy::Versioned, workers);
            if let (Some(l), Some(h)) = (get(b, &case), get(b, &case.hand())) {
                let r = overhead(results, b, &case).map_or(f64::NAN, |r| r.0);
                let _ = writeln!(
                    w,
                    "| {b} | {workers} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                    rate(l.throughput),
                    rate(h.throughput),
                    ratio(r),
                    ms(l.p50_ms),
                    ms(l.p99_ms),
                    l.attempts_per_success,
                    num(l.deadlocks),
                    check_cell(l)
                );
            }
        }
    }
    let _ = writeln!(w);

    // --- 2. hot row -----------------------------------------------------------
    let _ = writeln!(w, "## 2. Hot row\n");
    let _ = writeln!(
        w,
        "All workers take one unit from the same row (stock {}), as fast as they can:\n\n\
         * **naive**: read the stock, write `stock = <read> - 1`. No lockkit; loses updates.\n\
         * **optimistic + retry**: read the `Versioned` row, `update_versioned`, \
         `lockkit::retry(&RetryPolicy::default(), ..)` on `Stale`.\n\
         * **with_lock**: `lockkit::with_lock(conn, id, |conn, item| ..)`: `SELECT .. FOR UPDATE`, \
         `UPDATE`, commit (SQLite: `BEGIN IMMEDIATE`).\n\
         * **nowait + retry**: `with_lock_opts(.., LockOptions::default().nowait(), ..)` inside \
         `lockkit::retry`; a held row is `Busy` at once.\n\
         * **atomic update_if**: `lockkit::atomic::update_if(conn, UPDATE .. SET stock = stock - 1 \
         WHERE id = ? AND stock >= 1)`, no transaction.\n",
        rate(f64::from(INITIAL_STOCK))
    );
    let _ = writeln!(w, "![hot row throughput](hot_row.svg)\n");
    for &b in &bs {
        let _ = writeln!(w, "### {b}\n");
        let _ = write!(w, "| strategy |");
        for n in HOT_WORKERS {
            let _ = write!(w, " {n} worker{} /s |", if n == 1 { "" } else { "s" });
        }
        let _ = writeln!(w);
        let _ = writeln!(w, "| --- |{}", " ---: |".repeat(HOT_WORKERS.len()));
        for s in Strategy::HOT_ROW {
            let _ = write!(w, "| {} |", s.title());
            for n in HOT_WORKERS {
                let _ = write!(
                    w,
                    " {} |",
                    get(b, &hot(s, n)).map_or("–".into(), |x| rate(x.throughput))
                );
            }
            let _ = writeln!(w);
        }
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "| strategy | workers | p50 ms | p99 ms | attempts / success | conflicts per run | deadlocks per run | gave up per run | correctness |"
        );
        let _ = writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for s in Strategy::HOT_ROW {
            for n in HOT_WORKERS {
                if let Some(x) = get(b, &hot(s, n)) {
                    let _ = writeln!(
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
                    );
                }
            }
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(
        w,
        "Conflicts are `Stale` writes (optimistic), `Busy` rows (nowait) and lock timeouts. \"Gave up\" counts operations whose retries ran out (`RetriesExhausted`); they \
         sold nothing and are not in the throughput.\n"
    );

    // --- 3. queue ---------------------------------------------------------------
    let _ = writeln!(w, "## 3. Queue drain\n");
    let _ = writeln!(
        w,
        "{QUEUE_WORKERS} workers drain a `jobs` table ({} jobs per run) with \
         `lockkit::queue::claim(conn, jobs.filter(done.eq(false)).order(id).select(id), n)` \
         (`LIMIT n FOR UPDATE SKIP LOCKED`) inside `lockkit::locked_transaction`, and mark each \
         claimed job done by primary key, one `UPDATE` per job, before the commit. The \
         hand-written twin is `.limit(n).for_update().skip_locked()` in a plain transaction \
         (SQLite: `BEGIN IMMEDIATE`, no lock clause). \"No job twice\" is checked from the ids \
         every worker claimed and the table's `done` count.\n",
        rate(f64::from(settings.limits.jobs))
    );
    let _ = writeln!(
        w,
        "| backend | batch | lockkit jobs/s | hand-written jobs/s | lockkit / hand | p50 ms | p99 ms | attempts / success | deadlocks | correctness |"
    );
    let _ = writeln!(
        w,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for &b in &bs {
        for batch in [1, 10] {
            let case = Case::new(Workload::Queue, Strategy::Claim, QUEUE_WORKERS).batch(batch);
            if let (Some(l), Some(h)) = (get(b, &case), get(b, &case.hand())) {
                let r = overhead(results, b, &case).map_or(f64::NAN, |r| r.0);
                let _ = writeln!(
                    w,
                    "| {b} | {batch} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                    rate(l.throughput),
                    rate(h.throughput),
                    ratio(r),
                    ms(l.p50_ms),
                    ms(l.p99_ms),
                    l.attempts_per_success,
                    num(l.deadlocks),
                    check_cell(l)
                );
            }
        }
    }
    let _ = writeln!(w, "\nLatency is per claimed batch.\n");

    // --- 4. orders --------------------------------------------------------------
    let _ = writeln!(w, "## 4. Multi-row orders\n");
    let _ = writeln!(
        w,
        "{ORDER_WORKERS} workers place orders of 2 or 3 distinct items out of {ORDER_ITEMS}, \
         in random order, one unit each, all or nothing, inside `lockkit::locked_transaction` \
         and `lockkit::retry(&RetryPolicy::default(), ..)`:\n\n\
         * **row by row + retry**: `items.find(id).for_update()` one row at a time in the \
         buyer's order. Two buyers holding each other's next row deadlock; the server aborts \
         one (`Error::Deadlock`) and `retry` runs it again.\n\
         * **lock_all**: `Item::lock_all(conn, &ids)`: one `SELECT .. ORDER BY id FOR UPDATE`, \
         rows locked in key order, so no cycle of waits can form.\n"
    );
    let _ = writeln!(
        w,
        "| backend | strategy | orders/s | p50 ms | p99 ms | attempts / success | deadlocks per run | gave up per run | correctness |"
    );
    let _ = writeln!(
        w,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for &b in &bs {
        for s in [Strategy::NaiveOrder, Strategy::LockAll] {
            if let Some(x) = get(b, &Case::new(Workload::Orders, s, ORDER_WORKERS)) {
                let _ = writeln!(
                    w,
                    "| {b} | {} | {} | {} | {} | {:.2} | {} | {} | {} |",
                    s.title(),
                    rate(x.throughput),
                    ms(x.p50_ms),
                    ms(x.p99_ms),
                    x.attempts_per_success,
                    num(x.deadlocks),
                    num(x.gave_up),
                    check_cell(x)
                );
            }
        }
    }
    let _ = writeln!(
        w,
        "\nPostgreSQL looks for deadlocks only after a lock wait of `deadlock_timeout` (see the \
         settings above), so there every deadlock also costs that long; MariaDB detects them at \
         once. SQLite has no row locks: `BEGIN IMMEDIATE` makes writers take turns, and it \
         cannot deadlock.\n"
    );

    client_cost(w, results);
    reproduce(w);
    md
}

fn which_strategy_when(
    w: &mut String,
    results: &Results,
    sums: &BTreeMap<(Backend, Case), Summary>,
    bs: &[Backend],
) {
    let get = |b: Backend, c: &Case| sums.get(&(b, *c));
    let _ = writeln!(w, "## Which strategy when\n");
    let _ = writeln!(
        w,
        "Drawn from the numbers below (hot row at 16 workers unless said otherwise).\n"
    );
    let tp = |b: Backend, s: Strategy, n: usize| get(b, &hot(s, n)).map(|x| x.throughput);
    let per_backend = |f: &dyn Fn(Backend) -> Option<String>| -> String {
        bs.iter()
            .filter_map(|&b| f(b).map(|t| format!("{b} {t}")))
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
    let _ = writeln!(
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
    );
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
    let _ = writeln!(
        w,
        "* **Read, decide, write a row that many write → `with_lock` when every operation must \
         go through, optimistic + retry when throughput matters more.** `with_lock` never \
         retries but holds the row lock across its round trips: {}. Optimistic + retry holds no \
         lock while it reads and pays in retries and give-ups instead: {}. `nowait` + retry: {}.",
        describe(Strategy::WithLock),
        describe(Strategy::Optimistic),
        describe(Strategy::Nowait),
    );
    let cg = |name: &str| {
        bs.iter()
            .filter_map(|&b| {
                results
                    .callgrind
                    .iter()
                    .find(|r| r.name == name && r.backend == b && r.other_title == "hand-written")
                    .map(|r| format!("{b} {:+.1}%", (r.lockkit / r.other - 1.0) * 100.0))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let versioned_cg = cg("update_versioned");
    let _ = writeln!(
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
    );
    let order = |b: Backend, s: Strategy| get(b, &Case::new(Workload::Orders, s, ORDER_WORKERS));
    let deadlocking: Vec<Backend> = bs
        .iter()
        .copied()
        .filter(|&b| order(b, Strategy::NaiveOrder).is_some_and(|x| x.deadlocks > 0.0))
        .collect();
    let per = |list: &[Backend], f: &dyn Fn(Backend) -> Option<String>| -> String {
        list.iter()
            .filter_map(|&b| f(b).map(|t| format!("{b} {t}")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    if !deadlocking.is_empty() {
        let _ =
            writeln!(
            w,
            "* **Several rows in one transaction → `lock_all`.** Locking them one at a time in \
             the buyer's order deadlocked {} times per run ({} orders/s); `lock_all` locks in \
             key order and deadlocked {} times ({} orders/s).{}",
            per(&deadlocking, &|b| order(b, Strategy::NaiveOrder).map(|x| num(x.deadlocks))),
            per(&deadlocking, &|b| order(b, Strategy::NaiveOrder).map(|x| rate(x.throughput))),
            per(&deadlocking, &|b| order(b, Strategy::LockAll).map(|x| num(x.deadlocks))),
            per(&deadlocking, &|b| order(b, Strategy::LockAll).map(|x| rate(x.throughput))),
            if bs.contains(&Backend::Sqlite) && !deadlocking.contains(&Backend::Sqlite) {
                " On SQLite, where writers take turns and nothing deadlocks, it is insurance \
                 only, and row by row is faster there (cached statements; `lock_all`'s \
                 `IN (..)` list is prepared anew on every call)."
            } else {
                ""
            }
        );
    }
    let queue = |b: Backend, n: i64| {
        get(
            b,
            &Case::new(Workload::Queue, Strategy::Claim, QUEUE_WORKERS).batch(n),
        )
    };
    let _ = writeln!(
        w,
        "* **A work queue → `queue::claim`, in batches.** No job ran twice in any run; batches \
         of 10 drain {} the jobs per second of batches of 1.",
        per_backend(&|b| {
            let ten = queue(b, 10)?.throughput;
            let one = queue(b, 1)?.throughput;
            Some(format!("{:.1}×", ten / one))
        })
    );
    let retry_row =
        |b: Backend, r: Retry| get(b, &hot(Strategy::Optimistic, RETRY_WORKERS).retry(r));
    let _ = writeln!(
        w,
        "* **Keep the default backoff.** `RetryPolicy::immediate({n})` on the hot row needs {} \
         attempts per success where `RetryPolicy::default()` needs {}.",
        per_backend(&|b| retry_row(b, Retry::Immediate(IMMEDIATE[0]))
            .map(|x| format!("{:.2}", x.attempts_per_success))),
        per_backend(
            &|b| retry_row(b, Retry::Default).map(|x| format!("{:.2}", x.attempts_per_success))
        ),
        n = IMMEDIATE[0],
    );
    let _ = writeln!(
        w,
        "* **Never the naive read-modify-write.** It is fast because it is wrong: {} updates \
         lost per run at 16 workers.",
        per_backend(&|b| get(b, &hot(Strategy::Naive, 16)).map(|x| num(x.lost))),
    );
    if bs.contains(&Backend::Sqlite) {
        let _ = writeln!(
            w,
            "* **SQLite** has one writer at a time, so every safe strategy serializes writers \
             (`with_lock` is `BEGIN IMMEDIATE`); `atomic::update_if` and `with_lock` are the \
             ones that never retry."
        );
    }
    let _ = writeln!(w);
}

fn headline(
    w: &mut String,
    results: &Results,
    sums: &BTreeMap<(Backend, Case), Summary>,
    bs: &[Backend],
) {
    let _ = writeln!(w, "## Headline\n");
    let _ = writeln!(
        w,
        "### lockkit / hand-written Diesel (the same SQL) — target {OVERHEAD_TARGET:.2} or better\n"
    );
    let _ = writeln!(
        w,
        "Throughput through lockkit divided by the same statements written with plain Diesel, \
         run alternately ({} × `lockkit, hand, hand, lockkit`, {:.2} s each) in every \
         repetition; median of the repetitions, (min–max) in brackets. 1.00 means no overhead; \
         the spread shows what this machine's noise is worth.\n",
        results.settings.pair_rounds,
        results.settings.pair_limits.run.as_secs_f64()
    );
    let _ = write!(w, "| case |");
    for b in bs {
        let _ = write!(w, " {b} |");
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "| --- |{}", " ---: |".repeat(bs.len()));
    let mut all = Vec::new();
    for case in plan::paired_cases() {
        let _ = write!(w, "| {} |", short_label(&case));
        for &b in bs {
            match overhead(results, b, &case) {
                Some((m, lo, hi)) => {
                    all.push(m);
                    let _ = write!(w, " **{}** ({}–{}) |", ratio(m), ratio(lo), ratio(hi));
                }
                None => {
                    let _ = write!(w, " – |");
                }
            }
        }
        let _ = writeln!(w);
    }
    let below: Vec<f64> = all
        .iter()
        .copied()
        .filter(|r| *r < OVERHEAD_TARGET)
        .collect();
    let _ = writeln!(
        w,
        "\nMedian of all {} cells: **{}**; {} below {OVERHEAD_TARGET:.2}. ![lockkit / hand-written](overhead.svg)\n",
        all.len(),
        ratio(median(&all)),
        if below.is_empty() {
            "none".to_owned()
        } else {
            format!("{} ({})", below.len(), below.iter().map(|r| ratio(*r)).collect::<Vec<_>>().join(", "))
        }
    );
    if !results.callgrind.is_empty() {
        callgrind_table(w, &results.callgrind);
    }

    let pg = pgbench_summaries(results);
    if !pg.is_empty() {
        let _ = writeln!(
            w,
            "### lockkit / pgbench (the same SQL, {} clients) — target {PGBENCH_TARGET:.2} or better\n",
            pgbench::CLIENTS
        );
        let _ = writeln!(
            w,
            "PostgreSQL only. pgbench runs the statements lockkit sends, with bound parameters \
             (`-c {} -T {}`, scripts in [method](#how-it-was-measured)), in three ways: \
             `-M prepared -j 2`, every statement prepared once per connection and 16 connections \
             on 2 threads, **the server's own limit**; `-M extended -j 2`, every statement parsed \
             and planned again on each execution, which is how Diesel sends every `UPDATE`; and \
             `-M extended -j 16`, that with one thread per connection, as the benchmark's workers \
             have. In every repetition lockkit ({} workers) runs first and last, pgbench in \
             between (each mode twice, in mirrored order). CPU is µs per update (or job) from \
             `/proc`: the client (the benchmark, or pgbench) and the server (every `postgres` \
             process).\n",
            pgbench::CLIENTS,
            results.settings.pgbench_secs,
            pgbench::CLIENTS
        );
        let _ = writeln!(
            w,
            "| script | lockkit /s | pgbench `-M prepared -j 2` /s | **lockkit / server limit** | `-M extended -j 2` /s | lockkit / that | `-M extended -j 16` /s | lockkit / that | client CPU µs: lockkit · pgbench | server CPU µs: lockkit · prepared · extended | correctness |"
        );
        let _ = writeln!(
            w,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        );
        for s in &pg {
            let r = |m: Mode| {
                let (med, lo, hi) = s.ratio(m);
                format!("{} ({}–{})", ratio(med), ratio(lo), ratio(hi))
            };
            let _ = writeln!(
                w,
                "| {}{} | {} | {} | **{}** | {} | {} | {} | {} | {} · {} | {} · {} · {} | {} |",
                s.script.title(),
                if s.ran_dry {
                    " (a pgbench queue ran dry: its rate is a lower bound)"
                } else {
                    ""
                },
                rate(s.lockkit),
                rate(s.rate(Mode::Prepared)),
                r(Mode::Prepared),
                rate(s.rate(Mode::Extended)),
                r(Mode::Extended),
                rate(s.rate(Mode::ExtendedThreads)),
                r(Mode::ExtendedThreads),
                us(s.client_cpu.0),
                us(s.client_cpu.1),
                us(s.server_cpu.0),
                us(s.server_cpu.1),
                us(s.server_cpu.2),
                if s.ok { "✅" } else { "❌" }
            );
        }
        let _ = writeln!(w, "\n![lockkit and pgbench](pgbench.svg)\n");
        pgbench_reading(w, &pg);
    }

    let _ = writeln!(
        w,
        "### Retry waste: optimistic + retry on the hot row, {RETRY_WORKERS} workers\n"
    );
    let _ = writeln!(
        w,
        "`RetryPolicy::default()` (5 attempts, full-jitter backoff from 10 ms) against \
         `RetryPolicy::immediate(n)` (n attempts, no wait). Each cell: attempts per success · \
         updates/s · operations given up per run.\n"
    );
    let _ = write!(w, "| policy |");
    for b in bs {
        let _ = write!(w, " {b} |");
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "| --- |{}", " ---: |".repeat(bs.len()));
    let mut policies = vec![Retry::Default];
    policies.extend(IMMEDIATE.iter().map(|&n| Retry::Immediate(n)));
    for p in policies {
        let _ = write!(w, "| `{}` |", p.title());
        for &b in bs {
            let case = hot(Strategy::Optimistic, RETRY_WORKERS).retry(p);
            match sums.get(&(b, case)) {
                Some(x) => {
                    let _ = write!(
                        w,
                        " **{:.2}** · {} · {} |",
                        x.attempts_per_success,
                        rate(x.throughput),
                        num(x.gave_up)
                    );
                }
                None => {
                    let _ = write!(w, " – |");
                }
            }
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w);
}

fn short_label(case: &Case) -> String {
    match case.workload {
        Workload::Uncontended => {
            format!("uncontended `update_versioned`, {} worker(s)", case.workers)
        }
        Workload::HotRow => format!(
            "hot row, {}, {} worker(s)",
            case.strategy.title(),
            case.workers
        ),
        Workload::Queue => format!(
            "queue, `claim` batch {}, {} workers",
            case.batch, case.workers
        ),
        Workload::Orders => format!(
            "orders, {}, {} workers",
            case.strategy.title(),
            case.workers
        ),
    }
}

fn callgrind_table(w: &mut String, rows: &[CallgrindRow]) {
    let _ = writeln!(
        w,
        "Client instructions per call (`valgrind --tool=callgrind`, counted inside the measured \
         loop only, one connection; the wait for the server costs no instructions). Unlike \
         wall-clock time these do not move with the machine's load:\n"
    );
    let _ = writeln!(
        w,
        "| call | backend | lockkit | compared with | instructions | lockkit / compared |"
    );
    let _ = writeln!(w, "| --- | --- | ---: | --- | ---: | ---: |");
    for r in rows {
        let _ = writeln!(
            w,
            "| `{}` | {} | {} | {} | {} | {:.3} |",
            r.name,
            r.backend,
            rate(r.lockkit),
            r.other_title,
            rate(r.other),
            r.lockkit / r.other
        );
    }
    let _ = writeln!(w, "\nWhere the extra instructions go is in [What lockkit itself costs](#what-lockkit-itself-costs).\n");
}

fn pgbench_reading(w: &mut String, pg: &[PgbenchSummary]) {
    // Values in the table's row order.
    let list =
        |f: &dyn Fn(&PgbenchSummary) -> String| pg.iter().map(f).collect::<Vec<_>>().join(", ");
    let loss = |from: Mode, to: Mode| {
        list(&|s| format!("{:.0}%", (1.0 - s.rate(to) / s.rate(from)) * 100.0))
    };
    let below: Vec<&PgbenchSummary> = pg
        .iter()
        .filter(|s| s.ratio(Mode::Prepared).0 < PGBENCH_TARGET)
        .collect();
    if below.is_empty() {
        let _ = writeln!(
            w,
            "Every script reaches the target against the server's own limit.\n"
        );
        return;
    }
    let _ = writeln!(
        w,
        "Below target against the server's own limit: {}. The gap is Diesel's, not lockkit's: \
         the hand-written Diesel twins run as fast as lockkit (table above), and against pgbench \
         sending its statements the way Diesel does, lockkit reaches {} (`-M extended -j 2`, in \
         the table's order) and {} (`-M extended -j 16`). Two things make up the gap:\n",
        below
            .iter()
            .map(|s| format!(
                "**{}** at {}",
                s.script.title(),
                ratio(s.ratio(Mode::Prepared).0)
            ))
            .collect::<Vec<_>>()
            .join(", "),
        list(&|s| ratio(s.ratio(Mode::Extended).0)),
        list(&|s| ratio(s.ratio(Mode::ExtendedThreads).0)),
    );
    let _ = writeln!(
        w,
        "* **Diesel never caches an `UPDATE`.** Diesel 2.3 marks every `UpdateStatement` unsafe \
         to cache (an `Option` in a changeset would change its SQL), so each `UPDATE` goes out as \
         an unnamed statement that the server parses and plans again; its `SELECT`s are prepared \
         once. pgbench itself loses {} (table order) going from `-M prepared` to `-M extended`, \
         and the server CPU column shows where it goes. In `with_lock` and the queue the `UPDATE` \
         runs while the row lock is held, so its parse and plan lengthen every holder's turn.",
        loss(Mode::Prepared, Mode::Extended),
    );
    let _ = writeln!(
        w,
        "* **One thread per connection.** The benchmark's 16 workers each block in a synchronous \
         Diesel call; pgbench multiplexes 16 connections on 2 threads. On 2 cores shared with the \
         server, every µs of client CPU is taken from the server (client CPU column), and a lock \
         holder whose thread waits for a core holds the lock longer. pgbench loses {} going from \
         `-j 2` to `-j 16`.\n",
        loss(Mode::Extended, Mode::ExtendedThreads),
    );
}

fn machine(w: &mut String, results: &Results) {
    let m = &results.machine;
    let _ = writeln!(w, "## Machine and servers\n");
    let _ = writeln!(
        w,
        "* **Machine**: {} CPUs (`nproc`), {} memory, {}, Linux {}.",
        m.cpus, m.memory, m.cpu_model, m.kernel
    );
    let _ = writeln!(
        w,
        "* **Load average** (1, 5, 15 min) before the run: {}; after: {}. Other work on the \
         machine shows up here; the interleaved pairs and medians are there to absorb it.",
        m.load_before, m.load_after
    );
    let _ = writeln!(
        w,
        "* **Client**: this benchmark, release build, Diesel 2.3 (libpq, libmariadb, bundled SQLite), r2d2 pool of {} connections, one thread per worker.\n",
        crate::MAX_WORKERS
    );
    for s in &results.servers {
        let _ = writeln!(w, "**{}**: {}\n", s.backend, s.version.trim());
        let _ = writeln!(w, "| setting | value |");
        let _ = writeln!(w, "| --- | --- |");
        for (k, v) in &s.settings {
            let _ = writeln!(w, "| `{k}` | {v} |");
        }
        let _ = writeln!(w);
    }
}

fn method(w: &mut String, results: &Results) {
    let s = &results.settings;
    let _ = writeln!(w, "## How it was measured\n");
    let _ = writeln!(
        w,
        "* One command: `cargo run --release -p lockkit-bench` (`-- --quick` for one short \
         repetition). It creates a database `lkbench_<pid>_*` on each server (SQLite: a file in \
         the temp directory), runs everything, and drops it.\n\
         * Repetitions are the outer loop: each repetition runs every case once, backend by \
         backend, so a busy minute spreads over all cases. The tables quote the median of the \
         repetitions; each run's p50/p99 come from an HdrHistogram of every completed \
         operation (retries included in its latency), and the table quotes their medians.\n\
         * Every worker loop is bounded twice: {} per run and {} operations per worker; a \
         queue run also stops when the queue is empty. Lock waits are bounded by the session's \
         lock timeout (PostgreSQL `lock_timeout = 10s`, MariaDB `innodb_lock_wait_timeout = 10`, \
         SQLite `busy_timeout = 5000`).\n\
         * Before every run the tables are reset: `items` gets fresh rows with stock {} \
         (enough never to run out) and version 0; the queue gets {} fresh jobs.\n\
         * All workers take their pooled connection, wait at a barrier, and start together; \
         throughput is completed operations (queue: jobs) over the time from the start until \
         the last worker stopped.\n\
         * The correctness line is checked after every run against the database: units sold + \
         final stock = initial stock (hot row); Σ stock taken = Σ versions = updates \
         (uncontended); Σ stock taken = order lines (orders); jobs claimed = distinct jobs = \
         jobs marked done (queue). \"Units sold\" are the operations the workers saw commit.\n\
         * lockkit / hand-written pairs run `a b b a` ({} × per repetition) with {:.2} s slices. The hand-written twins \
         send the same SQL: the version-checked `UPDATE` with its own row-count check, `SELECT .. \
         FOR UPDATE` in a transaction, the conditional `UPDATE`, `LIMIT n FOR UPDATE SKIP \
         LOCKED`. The hand-written optimistic retry uses the same backoff schedule. One \
         difference by design: after a stale write lockkit reads the row's current version for \
         its error report (one `SELECT` per conflict); the hand-written loop does not.\n\
         * pgbench: `{}`. The with_lock script is `BEGIN; SELECT .. FOR UPDATE \\gset; UPDATE .. \
         SET stock = :left; COMMIT`; the atomic script is the single conditional `UPDATE`; the \
         queue with batch 1 is `SELECT id .. LIMIT 1 FOR UPDATE SKIP LOCKED \\gset` and one \
         `UPDATE`; with batch 10 the claim is wrapped in `array_agg` (pgbench has no loop) and \
         followed by ten `UPDATE`s by key. Both sides drain a queue of {} jobs.\n\
         * PostgreSQL sessions (the benchmark's and pgbench's) run with `synchronous_commit = {}`. \
         {}\n\
         * Client-side cost per call: the same operations on one in-memory SQLite connection, \
         single-threaded, {} calls per measurement, best of three alternating rounds; \
         allocations counted by a counting global allocator.\n",
        humantime(s.limits.run),
        rate(s.limits.max_ops_per_worker as f64),
        rate(f64::from(INITIAL_STOCK)),
        rate(f64::from(s.limits.jobs)),
        s.pair_rounds,
        s.pair_limits.run.as_secs_f64(),
        results
            .pgbench
            .first()
            .map_or("not run".to_owned(), |p| {
                p.pgbench
                    .iter()
                    .map(|r| r.command.clone())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join("`, `")
            }),
        rate(f64::from(s.pgbench_jobs)),
        if s.durable { "on" } else { "off" },
        if s.durable {
            "Every commit waits for the WAL flush (`--durable`)."
        } else {
            "The server's disk takes milliseconds per fsync, which would make every PostgreSQL \
             number a disk benchmark; asynchronous commit (the session's choice, not the \
             server's; `--durable` turns it back on) leaves the locking. MariaDB runs with the \
             server's own `innodb_flush_log_at_trx_commit` (above)."
        },
        rate(s.profile_ops as f64),
    );
    for note in &results.notes {
        let _ = writeln!(w, "* **Skipped**: {note}");
    }
    if !results.notes.is_empty() {
        let _ = writeln!(w);
    }
}

fn humantime(d: std::time::Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

fn client_cost(w: &mut String, results: &Results) {
    if results.profile.is_empty() && results.callgrind.is_empty() {
        return;
    }
    let _ = writeln!(w, "## What lockkit itself costs\n");
    if !results.profile.is_empty() {
        let _ = writeln!(
            w,
            "Each call and its twin on one in-memory SQLite connection, one thread: no network \
             and no disk to hide the library's own time.\n"
        );
        let _ = writeln!(
            w,
            "| call | lockkit ns | compared with | ns | lockkit / other time | lockkit allocations | other allocations |"
        );
        let _ = writeln!(w, "| --- | ---: | --- | ---: | ---: | ---: | ---: |");
        for r in &results.profile {
            let _ = writeln!(
                w,
                "| `{}` | {} | {} | {} | {:.2} | {:.1} | {:.1} |",
                r.name,
                rate(r.lockkit_ns),
                r.other_title,
                rate(r.other_ns),
                r.lockkit_ns / r.other_ns,
                r.lockkit_allocs,
                r.other_allocs
            );
        }
        let _ = writeln!(w);
    }
    let extra = |name: &str, backend: Backend| {
        results
            .callgrind
            .iter()
            .find(|r| r.name == name && r.backend == backend && r.other_title == "hand-written")
            .map(|r| (r.lockkit - r.other, (r.lockkit / r.other - 1.0) * 100.0))
    };
    let mut notes = Vec::new();
    let cacheable_profile = results
        .profile
        .iter()
        .find(|r| r.other.flavor == crate::Flavor::HandCached);
    let cacheable_cg: Vec<String> = results
        .callgrind
        .iter()
        .filter(|r| r.other_title == "hand-written, cacheable")
        .map(|r| format!("{} {} → {}", r.backend, rate(r.lockkit), rate(r.other)))
        .collect();
    if let Some(p) = cacheable_profile {
        notes.push(format!(
            "* **Every `UPDATE` is prepared anew — lockkit's and hand-written alike.** Diesel 2.3 \
             marks every `UpdateStatement` unsafe to cache (a changeset with `Option` fields \
             changes its SQL between calls), so SQLite compiles each `UPDATE` again, PostgreSQL \
             parses and plans it again (unnamed statement) and MySQL spends a prepare round trip \
             on it. The same versioned `UPDATE` as a hand-built statement that Diesel may cache \
             (`CacheableVersionedUpdate` in `bench/src/ops.rs`) takes {} ns and {:.0} allocations \
             where `update_versioned` takes {} ns and {:.0}{}. This is the largest saving \
             available to lockkit, and the one place where it could beat hand-written Diesel: \
             build the versioned `UPDATE` as lockkit's own `QueryFragment` (`UPDATE` + the \
             table + `SET` changeset and bump + the `WHERE` of `IntoUpdateTarget`, all public \
             Diesel pieces) with a static `QueryId` and without `unsafe_to_cache_prepared()`, \
             whenever the derive knows the changeset's SQL cannot vary (no `Option` field \
             skipped when `None`); `touch_versioned`'s bump-only changeset always qualifies.",
            rate(p.other_ns),
            p.other_allocs,
            rate(p.lockkit_ns),
            p.lockkit_allocs,
            if cacheable_cg.is_empty() {
                String::new()
            } else {
                format!(
                    "; client instructions per call, lockkit → cacheable: {}",
                    cacheable_cg.join(", ")
                )
            }
        ));
    }
    let nested: Vec<String> = [Backend::Postgres, Backend::Mysql, Backend::Sqlite]
        .iter()
        .filter_map(|&b| {
            extra("update_versioned", b)
                .filter(|(d, _)| *d > 200.0)
                .map(|(d, p)| format!("{b} {} ({p:+.1}%)", rate(d)))
        })
        .collect();
    if !nested.is_empty() {
        notes.push(format!(
            "* **`update_versioned` against the same hand-written `UPDATE`: {} more \
             instructions per call.** lockkit sets `(changeset, bump)`, a tuple nested in a \
             tuple. Diesel's tuple `QueryFragment` asks every element `is_noop()` before writing \
             a separating comma, and for an inner tuple that is a walk of its own, so the \
             model's fields are walked once more on each of Diesel's passes over the statement \
             (the hand-written `UPDATE` written with the same nested tuple counts the same as \
             lockkit's). Fix in lockkit: let `#[derive(Versioned)]` emit, for \
             `update_versioned`, one flat tuple with the bump as its last element.",
            nested.join(", ")
        ));
    }
    let lock_extra: Vec<String> = [Backend::Postgres, Backend::Mysql]
        .iter()
        .filter_map(|&b| extra("with_lock", b).map(|(d, p)| format!("{b} {} ({p:+.1}%)", rate(d))))
        .collect();
    if !lock_extra.is_empty() {
        notes.push(format!(
            "* **`with_lock`, `lock_all`, `queue::claim` on the servers: {} more instructions \
             per call.** The lock clause is lockkit's run-time `RowLock`, whose `QueryId` is not \
             static, so Diesel keys its prepared-statement cache by the SQL text: every call \
             builds the whole `SELECT .. FOR UPDATE` string (identifier quoting included) and \
             hashes it to find the cached statement. Diesel's own `.for_update()` has a static \
             id and skips all of that. Fix in lockkit: give the common clauses (`FOR UPDATE`, \
             `FOR UPDATE NOWAIT`, `FOR UPDATE SKIP LOCKED`, ...) zero-sized types with static \
             `QueryId`s and pick one with a `match` on the `RowLock` inside `load_locked` / \
             `load_all_locked` / `claim`, keeping the run-time clause as the fallback.",
            lock_extra.join(", ")
        ));
    }
    let stale: Vec<(Backend, f64, f64)> = [Backend::Postgres, Backend::Mysql]
        .iter()
        .filter_map(|&b| {
            let case = Case::new(Workload::HotRow, Strategy::Optimistic, 16);
            let (r, _, _) = overhead(results, b, &case)?;
            let per_success: Vec<f64> = results
                .samples
                .iter()
                .filter(|s| s.backend == b && s.case == case && s.counts.successes > 0)
                .map(|s| s.counts.stale as f64 / s.counts.successes as f64)
                .collect();
            Some((b, r, median(&per_success)))
        })
        .collect();
    if stale.iter().any(|(_, r, _)| *r < 0.98) {
        notes.push(format!(
            "* **After a stale write lockkit reads the row's current version for its error \
             report** (`version_check::execute` → `load_current_version`): one more round trip \
             per conflict, the one statement lockkit sends that its hand-written twin does not, \
             and the likely reason why optimistic + retry at 16 workers trails its twin ({}). \
             Fix in lockkit: make that read lazy (keep the key in `StaleObjectError` and read \
             the current state on demand), or skip it while `retry` will try again anyway.",
            stale
                .iter()
                .map(|(b, r, c)| format!(
                    "{b}: lockkit / hand-written {}, {c:.2} conflicts per update",
                    ratio(*r)
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if let Some(r) = results
        .profile
        .iter()
        .find(|r| r.lockkit.strategy == Strategy::LockAll)
    {
        if r.lockkit_ns > r.other_ns * 1.2 {
            notes.push(format!(
                "* **`lock_all` on SQLite and MySQL: {:.1}× the time of locking the same rows one \
                 by one (in-memory SQLite).** Diesel renders `eq_any` as `IN (?, ?, ..)` there and \
                 marks it unsafe to cache, so every `lock_all` is prepared anew (a compile on \
                 SQLite, a prepare round trip on MySQL); PostgreSQL's `= ANY($1)` is cached. Fix \
                 in lockkit: render the key list with its own fragment (`IN (` binds `)` with a \
                 non-static `QueryId` and no `unsafe_to_cache_prepared()`), so Diesel caches one \
                 statement per key count by its SQL text.",
                r.lockkit_ns / r.other_ns
            ));
        }
    }
    if let Some(r) = results
        .profile
        .iter()
        .find(|r| r.lockkit.strategy == Strategy::Nowait)
    {
        if r.lockkit_ns > r.other_ns * 1.1 {
            notes.push(format!(
                "* **`with_lock_opts(nowait)` on SQLite: {:.0}% slower than `with_lock` and {:.0} \
                 more allocations.** SQLite has no `NOWAIT`, so `locked_transaction` reads \
                 `PRAGMA busy_timeout`, sets it to 0 and restores it afterwards: three extra \
                 statements per transaction. (The MySQL timeout path does the same with \
                 `innodb_lock_wait_timeout`, in three round trips.)",
                (r.lockkit_ns / r.other_ns - 1.0) * 100.0,
                r.lockkit_allocs - r.other_allocs
            ));
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(
            w,
            "Where lockkit's extra client work goes (callgrind, `--profile-only`):\n"
        );
        for n in notes {
            let _ = writeln!(w, "{n}");
        }
        let _ = writeln!(
            w,
            "\nThe first changes the server's work too (a parse and plan per `UPDATE` on \
             PostgreSQL, a prepare round trip on MySQL); the others are client CPU, a few µs per \
             call: within this machine's noise on the throughput ratios above, visible when the \
             client's CPU is the limit.\n"
        );
    }
}

fn reproduce(w: &mut String) {
    let _ = writeln!(w, "## Reproduce\n");
    let _ = writeln!(
        w,
        "```sh\n\
         cargo run --release -p lockkit-bench                 # full run, ~9 minutes, writes docs/\n\
         cargo run --release -p lockkit-bench -- --quick      # one short repetition\n\
         cargo run --release -p lockkit-bench -- --help       # backends, --durable, --only, ...\n\
         # one side of the client-cost profile under callgrind:\n\
         valgrind --tool=callgrind --collect-atstart=no '--toggle-collect=*measured_loop*' \\\n    \
         target/release/lockkit-bench --backends postgres --profile-only withlock-lockkit --ops 1000\n\
         ```\n\n\
         Servers: `PG_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), \
         `MYSQL_DATABASE_URL` (default `mysql://root@127.0.0.1:3306/test`); pgbench from the \
         `PATH`, `/usr/lib/postgresql/*/bin` or `PGBENCH`."
    );
}
