//! lockkit against its yardsticks: the same SQL written by hand with plain
//! Diesel ([`overhead`]), and the same SQL through pgbench
//! ([`pgbench_summaries`]), each with its target.

use super::statistics::{median, spread};
use crate::run::pgbench::{Mode, PgbenchRun, Script};
use crate::run::results::{Pair, PgbenchPair, Results};
use crate::run::sample::Sample;
use crate::vocabulary::{Backend, Case};

/// The overhead target: lockkit / hand-written.
pub const OVERHEAD_TARGET: f64 = 0.97;
/// The pgbench target: lockkit / pgbench.
pub const PGBENCH_TARGET: f64 = 0.85;

impl Pair {
    /// lockkit's throughput over the hand-written one's.
    pub fn ratio(&self) -> f64 {
        self.lockkit.throughput() / self.hand.throughput()
    }
}

impl PgbenchPair {
    /// pgbench's mean rate in `mode` (units per second).
    pub fn pgbench_rate(&self, mode: Mode) -> f64 {
        let rates: Vec<f64> = self
            .pgbench
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| r.units_per_s)
            .collect();
        rates.iter().sum::<f64>() / rates.len().max(1) as f64
    }

    /// lockkit's rate over pgbench's in `mode`.
    pub fn ratio(&self, mode: Mode) -> f64 {
        self.lockkit.throughput() / self.pgbench_rate(mode)
    }

    /// The diesel-async case's rate over pgbench's in `mode` (NaN if it did
    /// not run).
    pub fn tasks_ratio(&self, mode: Mode) -> f64 {
        self.tasks
            .as_ref()
            .map_or(f64::NAN, |t| t.throughput() / self.pgbench_rate(mode))
    }
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
    Some(spread(&ratios))
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
    /// The diesel-async case next to pgbench, if it ran.
    pub tasks: Option<TasksSummary>,
}

/// The diesel-async case of one pgbench script, over the repetitions.
#[derive(Debug, Clone)]
pub struct TasksSummary {
    /// The case (lockkit's, or hand-written where lockkit has no async call).
    pub case: Case,
    /// Its median rate.
    pub rate: f64,
    /// Median, min and max of the per-repetition ratios to `-M prepared -j 2`.
    pub ratio: (f64, f64, f64),
    /// Client CPU µs per unit.
    pub client_cpu: f64,
    /// Server CPU µs per unit.
    pub server_cpu: f64,
    /// Whether its books balanced in every run.
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
            let runs = |mode: Mode| -> Vec<&PgbenchRun> {
                pairs
                    .iter()
                    .flat_map(|p| p.pgbench.iter())
                    .filter(|r| r.mode == mode)
                    .collect()
            };
            let lockkit_med = |f: &dyn Fn(&Sample) -> f64| {
                median(&pairs.iter().map(|p| f(&p.lockkit)).collect::<Vec<_>>())
            };
            let run_med = |mode: Mode, f: &dyn Fn(&PgbenchRun) -> f64| {
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
                tasks: tasks_summary(&pairs),
            })
        })
        .collect()
}

/// The diesel-async side of one script's pgbench pairs, if it ran.
fn tasks_summary(pairs: &[&PgbenchPair]) -> Option<TasksSummary> {
    let runs: Vec<(&PgbenchPair, &Sample)> = pairs
        .iter()
        .filter_map(|p| p.tasks.as_ref().map(|t| (*p, t)))
        .collect();
    let first = runs.first()?;
    let med = |f: &dyn Fn(&Sample) -> f64| median(&runs.iter().map(|r| f(r.1)).collect::<Vec<_>>());
    let ratios: Vec<f64> = runs
        .iter()
        .map(|(p, _)| p.tasks_ratio(Mode::Prepared))
        .collect();
    Some(TasksSummary {
        case: first.1.case,
        rate: med(&|s| s.throughput()),
        ratio: spread(&ratios),
        client_cpu: med(&|s| s.client_cpu_us()),
        server_cpu: med(&|s| s.server_cpu_us()),
        ok: runs.iter().all(|r| r.1.check.ok),
    })
}
