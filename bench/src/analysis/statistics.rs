//! Medians over repeated runs: the median and spread of a list, and one
//! [`Summary`] per (backend, case).

use std::collections::BTreeMap;

use crate::run::results::Results;
use crate::run::sample::Sample;
use crate::vocabulary::{Backend, Case};

/// The median of some numbers (NaN when there are none); NaNs are ignored.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One case on one backend, summarised over its runs (each value is the median
/// of the per-run values).
#[derive(Debug, Clone)]
pub struct Summary {
    /// The backend.
    pub backend: Backend,
    /// The case.
    pub case: Case,
    /// How many runs.
    pub runs: usize,
    /// Operations (queue: jobs) per second.
    pub throughput: f64,
    /// Smallest and largest per-run throughput.
    pub spread: (f64, f64),
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Attempts per completed operation.
    pub attempts_per_success: f64,
    /// Stale writes per run.
    pub stale: f64,
    /// Busy rows per run.
    pub busy: f64,
    /// Deadlocks per run.
    pub deadlocks: f64,
    /// Lock timeouts per run.
    pub lock_timeouts: f64,
    /// Operations given up per run.
    pub gave_up: f64,
    /// Other errors per run.
    pub errors: f64,
    /// The share of the adaptive strategy's writes made under the row lock.
    pub locked_share: f64,
    /// Runs whose books balanced.
    pub checks_ok: usize,
    /// Lost updates (or jobs run twice) per run.
    pub lost: f64,
    /// The correctness line of the median run.
    pub detail: String,
    /// Runs checked, merged slices of pairs counted one by one.
    pub slices: usize,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

impl Summary {
    /// Summarises the samples of one (backend, case); `None` if there are none.
    pub fn of(samples: &[&Sample]) -> Option<Summary> {
        let first = samples.first()?;
        let per =
            |f: &dyn Fn(&Sample) -> f64| median(&samples.iter().map(|s| f(s)).collect::<Vec<_>>());
        let tps: Vec<f64> = samples.iter().map(|s| s.throughput()).collect();
        let throughput = median(&tps);
        let mid = samples
            .iter()
            .min_by(|a, b| {
                (a.throughput() - throughput)
                    .abs()
                    .total_cmp(&(b.throughput() - throughput).abs())
            })
            .expect("non-empty");
        Some(Summary {
            backend: first.backend,
            case: first.case,
            runs: samples.len(),
            throughput,
            spread: (
                tps.iter().copied().fold(f64::INFINITY, f64::min),
                tps.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ),
            p50_ms: per(&|s| s.latency_ms(0.5)),
            p99_ms: per(&|s| s.latency_ms(0.99)),
            attempts_per_success: per(&|s| s.attempts_per_success()),
            stale: per(&|s| s.counts.stale as f64),
            busy: per(&|s| s.counts.busy as f64),
            deadlocks: per(&|s| s.counts.deadlocks as f64),
            lock_timeouts: per(&|s| s.counts.lock_timeouts as f64),
            gave_up: per(&|s| s.counts.gave_up as f64),
            errors: per(&|s| s.counts.errors as f64),
            locked_share: per(&|s| s.counts.locked as f64 / (s.counts.successes as f64).max(1.0)),
            checks_ok: samples.iter().filter(|s| s.check.ok).count(),
            lost: per(&|s| s.check.lost as f64),
            detail: mid.check.detail.clone(),
            slices: samples.iter().map(|s| s.check.slices).sum(),
            first_error: samples.iter().find_map(|s| s.first_error.clone()),
        })
    }
}

/// Median, min and max of some numbers.
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    (
        median(values),
        values.iter().copied().fold(f64::INFINITY, f64::min),
        values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// The summaries of every (backend, case).
pub fn summaries(results: &Results) -> BTreeMap<(Backend, Case), Summary> {
    summarize(&results.samples)
}

/// The summary of every (backend, case) among `samples`.
pub fn summarize(samples: &[Sample]) -> BTreeMap<(Backend, Case), Summary> {
    let mut groups: BTreeMap<(Backend, Case), Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        groups.entry((s.backend, s.case)).or_default().push(s);
    }
    groups
        .into_iter()
        .filter_map(|(k, v)| Summary::of(&v).map(|s| (k, s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
    }
}
