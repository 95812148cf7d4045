//! What the benchmark will run: the settings (how long, how often, which
//! backends) and the cases, in the order they run.
//!
//! Repetitions are the outer loop (every case once per repetition, backend by
//! backend), so a slow minute on the machine spreads over all cases instead of
//! hitting one. lockkit-versus-hand-written pairs ([`paired_cases`]) run
//! `a b b a` within a repetition; the other cases ([`single_cases`]) run once.
//! The diesel-async cases ([`async_paired_cases`]) follow the blocking ones of
//! the same backend.

use std::path::PathBuf;
use std::time::Duration;

use crate::vocabulary::{Backend, Case, Flavor, Limits, Retry, Strategy, Workload};

/// Everything that sets how long the benchmark runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--quick`: one short repetition.
    pub quick: bool,
    /// Repetitions of every case.
    pub reps: usize,
    /// Bounds of one run.
    pub limits: Limits,
    /// Bounds of a pair's slices.
    pub pair_limits: Limits,
    /// Rounds of `a b b a` per pair and repetition.
    pub pair_rounds: usize,
    /// Rounds of `a b b a` per diesel-async pair and repetition.
    pub async_rounds: usize,
    /// `pgbench -T`.
    pub pgbench_secs: u32,
    /// Jobs in the queue for a pgbench queue run.
    pub pgbench_jobs: i32,
    /// Whether to run pgbench.
    pub pgbench: bool,
    /// The backends to run.
    pub backends: Vec<Backend>,
    /// `--durable`: PostgreSQL sessions keep `synchronous_commit = on`.
    pub durable: bool,
    /// Calls per measurement in the client-cost profile (0: skip it).
    pub profile_ops: u64,
    /// Calls per callgrind count (0: skip callgrind).
    pub callgrind_ops: u64,
    /// Where BENCHMARKS.md and the charts go.
    pub out_dir: PathBuf,
    /// `--only TEXT`: run only the cases whose label contains it (development).
    pub only: Option<String>,
}

impl Settings {
    /// Whether `--only` lets the case labelled `label` run.
    pub fn wants(&self, label: &str) -> bool {
        self.only.as_deref().is_none_or(|o| label.contains(o))
    }

    /// The full run: 3 repetitions of 0.8 s runs (about 9 minutes).
    pub fn full() -> Settings {
        Settings {
            quick: false,
            reps: 3,
            limits: Limits {
                run: Duration::from_millis(800),
                max_ops_per_worker: 1_000_000,
                jobs: 50_000,
            },
            pair_limits: Limits {
                run: Duration::from_millis(250),
                max_ops_per_worker: 1_000_000,
                jobs: 30_000,
            },
            pair_rounds: 2,
            async_rounds: 1,
            pgbench_secs: 1,
            pgbench_jobs: 50_000,
            pgbench: true,
            backends: Backend::ALL.to_vec(),
            durable: false,
            profile_ops: 10_000,
            callgrind_ops: 300,
            out_dir: default_out_dir(),
            only: None,
        }
    }

    /// `--quick`: one repetition of short runs (about a minute).
    pub fn quick() -> Settings {
        Settings {
            quick: true,
            reps: 1,
            limits: Limits {
                run: Duration::from_millis(300),
                max_ops_per_worker: 1_000_000,
                jobs: 15_000,
            },
            pair_limits: Limits {
                run: Duration::from_millis(150),
                max_ops_per_worker: 1_000_000,
                jobs: 8_000,
            },
            pair_rounds: 1,
            pgbench_secs: 1,
            pgbench_jobs: 50_000,
            profile_ops: 3_000,
            callgrind_ops: 0,
            ..Settings::full()
        }
    }
}

/// `docs/` at the workspace root.
pub fn default_out_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.join(".."), PathBuf::from)
        .join("docs")
}

/// The hot row's worker counts.
pub const HOT_WORKERS: [usize; 4] = [1, 4, 16, 32];
/// Workers of the uncontended workload.
pub const UNCONTENDED_WORKERS: [usize; 2] = [1, 4];
/// Workers draining the queue (pgbench uses as many clients).
pub const QUEUE_WORKERS: usize = 16;
/// Workers placing multi-row orders.
pub const ORDER_WORKERS: usize = 8;
/// The worker count of the retry-waste comparison.
pub const RETRY_WORKERS: usize = 16;
/// The `RetryPolicy::immediate(n)` values compared with the default.
pub const IMMEDIATE: [u32; 2] = [5, 20];

/// Workers of the diesel-async cases: tasks on one runtime, over one pool.
pub const ASYNC_WORKERS: usize = 16;
/// The tokio runtime's worker threads in the diesel-async cases (pgbench's `-j`).
pub const ASYNC_THREADS: usize = 2;

/// The lockkit cases that run next to a hand-written twin.
pub fn paired_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for w in UNCONTENDED_WORKERS {
        cases.push(Case::new(Workload::Uncontended, Strategy::Versioned, w));
    }
    for s in [Strategy::Optimistic, Strategy::WithLock, Strategy::Atomic] {
        for w in [1, 16] {
            cases.push(Case::new(Workload::HotRow, s, w));
        }
    }
    for batch in [1, 10] {
        cases.push(Case::new(Workload::Queue, Strategy::Claim, QUEUE_WORKERS).batch(batch));
    }
    cases
}

/// The other twins of the uncontended versioned update, run alone: the
/// hand-written update that binds the next version, and the peer crate.
pub const UNCONTENDED_TWINS: [Flavor; 2] = [Flavor::HandNext, Flavor::Peer];

/// The cases that run alone.
pub fn single_cases() -> Vec<Case> {
    let paired = paired_cases();
    let mut cases = Vec::new();
    for w in UNCONTENDED_WORKERS {
        for flavor in UNCONTENDED_TWINS {
            cases.push(Case {
                flavor,
                ..Case::new(Workload::Uncontended, Strategy::Versioned, w)
            });
        }
    }
    for s in Strategy::HOT_ROW {
        for w in HOT_WORKERS {
            let case = Case::new(Workload::HotRow, s, w);
            if !paired.contains(&case) {
                cases.push(case);
            }
        }
    }
    for n in IMMEDIATE {
        cases.push(
            Case::new(Workload::HotRow, Strategy::Optimistic, RETRY_WORKERS)
                .retry(Retry::Immediate(n)),
        );
    }
    for s in [Strategy::NaiveOrder, Strategy::LockAll] {
        cases.push(Case::new(Workload::Orders, s, ORDER_WORKERS));
    }
    // The blocking twin of the diesel-async uncontended case.
    cases.push(Case::new(
        Workload::Uncontended,
        Strategy::Versioned,
        ASYNC_WORKERS,
    ));
    cases
}

/// The diesel-async cases of `backend` that run next to a hand-written
/// diesel-async twin: uncontended `update_versioned`, hot-row `with_lock` and
/// atomic `update_if`, and
/// on PostgreSQL the queue drain in batches of 1 and 10, each with
/// [`ASYNC_WORKERS`] tasks. Their blocking twins are among the cases above.
/// MariaDB and SQLite run no async queue: refilling it for every slice takes
/// longer there than the slices themselves, more than the full run can spend.
pub fn async_paired_cases(backend: Backend) -> Vec<Case> {
    let mut cases = vec![
        Case::new(Workload::Uncontended, Strategy::Versioned, ASYNC_WORKERS).tasks(),
        Case::new(Workload::HotRow, Strategy::WithLock, ASYNC_WORKERS).tasks(),
        Case::new(Workload::HotRow, Strategy::Atomic, ASYNC_WORKERS).tasks(),
    ];
    if backend == Backend::Postgres {
        for batch in [1, 10] {
            cases.push(
                Case::new(Workload::Queue, Strategy::Claim, ASYNC_WORKERS)
                    .batch(batch)
                    .tasks(),
            );
        }
    }
    cases
}

/// The adaptive strategy next to the fixed ones it chooses between, on own
/// rows and on the hot row, at every hot-row worker count: one group of
/// [`Strategy::ADAPTIVE`] per cell, run back to back so that the ratio compares
/// runs made a second apart, not minutes (the hot row's fixed strategies run
/// again here, apart from the hot-row section's runs).
pub fn adaptive_groups() -> Vec<[Case; 3]> {
    let mut groups = Vec::new();
    for workload in [Workload::OwnRows, Workload::HotRow] {
        for w in HOT_WORKERS {
            groups.push(Strategy::ADAPTIVE.map(|s| Case::new(workload, s, w)));
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::Client;

    #[test]
    fn every_async_case_has_its_blocking_row() {
        let blocking: Vec<Case> = paired_cases()
            .into_iter()
            .flat_map(|c| [c, c.hand()])
            .chain(single_cases())
            .collect();
        for case in async_paired_cases(Backend::Postgres) {
            assert_eq!(case.client, Client::Tasks);
            let twin = Case {
                client: Client::Threads,
                ..case
            };
            assert!(blocking.contains(&twin), "{}", twin.label());
        }
    }
}
