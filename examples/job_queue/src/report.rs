//! What a run did and what the database holds afterwards, and how it is printed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use crate::{Backend, WorkerConfig};

/// What one worker thread did, by its own count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStats {
    /// The worker's name (`w1`, `w2`, …), as recorded in `job_runs.worker`.
    pub worker: String,
    /// Jobs it ran.
    pub jobs: u64,
    /// Non-empty batches it claimed (transactions that ran jobs).
    pub batches: u64,
}

/// What `jobs` and `job_runs` hold, counted by the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobAudit {
    /// Rows in `jobs`.
    pub jobs: i64,
    /// Rows in `jobs` with `done`.
    pub done: i64,
    /// Rows in `job_runs`: executions.
    pub runs: i64,
    /// `SELECT job_id, COUNT(*) FROM job_runs GROUP BY job_id`.
    pub runs_per_job: BTreeMap<i32, i64>,
    /// `SELECT worker, COUNT(*) FROM job_runs GROUP BY worker`.
    pub runs_per_worker: BTreeMap<String, i64>,
}

impl JobAudit {
    /// Executions beyond the first: `job_runs` rows minus distinct job ids.
    pub fn duplicates(&self) -> i64 {
        self.runs - self.runs_per_job.len() as i64
    }

    /// Jobs that ran more than once.
    pub fn jobs_run_twice(&self) -> usize {
        self.runs_per_job.values().filter(|&&n| n > 1).count()
    }

    /// Every job done and run exactly once.
    pub fn is_exactly_once(&self) -> bool {
        self.done == self.jobs
            && self.runs == self.jobs
            && self.runs_per_job.len() as i64 == self.jobs
            && self.runs_per_job.values().all(|&n| n == 1)
    }
}

/// The result of [`run_workers`](crate::run_workers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerReport {
    /// The backend it ran on.
    pub backend: Backend,
    /// The configuration it ran with.
    pub config: WorkerConfig,
    /// Per worker, in name order.
    pub workers: Vec<WorkerStats>,
    /// The database's account, read after all workers returned.
    pub audit: JobAudit,
    /// From the start signal to the last worker's return.
    pub elapsed: Duration,
}

impl WorkerReport {
    /// Workers that ran at least one job.
    pub fn busy_workers(&self) -> usize {
        self.workers.iter().filter(|w| w.jobs > 0).count()
    }
}

impl fmt::Display for WorkerReport {
    /// A per-worker table (jobs counted by the worker and by `job_runs`), then
    /// the totals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .workers
            .iter()
            .map(|w| w.worker.len())
            .chain([6])
            .max()
            .unwrap_or(6);
        writeln!(
            f,
            "{:<width$}  {:>7}  {:>8}  {:>9}",
            "worker", "batches", "jobs", "job_runs"
        )?;
        writeln!(f, "{}", "-".repeat(width + 32))?;
        for w in &self.workers {
            let runs = self
                .audit
                .runs_per_worker
                .get(&w.worker)
                .copied()
                .unwrap_or(0);
            writeln!(
                f,
                "{:<width$}  {:>7}  {:>8}  {:>9}",
                w.worker, w.batches, w.jobs, runs
            )?;
        }
        let batches: u64 = self.workers.iter().map(|w| w.batches).sum();
        let jobs: u64 = self.workers.iter().map(|w| w.jobs).sum();
        writeln!(
            f,
            "{:<width$}  {:>7}  {:>8}  {:>9}",
            "total", batches, jobs, self.audit.runs
        )?;
        writeln!(
            f,
            "\njobs done {}/{}, executions {}, distinct jobs run {}, duplicates {} ({} jobs ran more than once), elapsed {:.3} s",
            self.audit.done,
            self.audit.jobs,
            self.audit.runs,
            self.audit.runs_per_job.len(),
            self.audit.duplicates(),
            self.audit.jobs_run_twice(),
            self.elapsed.as_secs_f64()
        )
    }
}

/// The result of one [`run_relay`](crate::run_relay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayReport {
    /// The instance's name.
    pub name: String,
    /// The backend it ran on.
    pub backend: Backend,
    /// Messages this instance published.
    pub published: u64,
    /// Non-empty batches it claimed.
    pub batches: u64,
    /// From connecting to the empty claim.
    pub elapsed: Duration,
}

impl fmt::Display for RelayReport {
    /// One line: `relay r1 on postgres: published 150 messages in 30 batches, 0.412 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "relay {} on {}: published {} messages in {} batches, {:.3} s",
            self.name,
            self.backend,
            self.published,
            self.batches,
            self.elapsed.as_secs_f64()
        )
    }
}

/// What `outbox` and `published` hold, counted by the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxAudit {
    /// Ids of all outbox rows.
    pub outbox_ids: BTreeSet<i32>,
    /// Outbox rows with `sent`.
    pub sent: i64,
    /// `published.outbox_id` of every row, ascending.
    pub published_ids: Vec<i32>,
    /// `SELECT relay, COUNT(*) FROM published GROUP BY relay`.
    pub per_relay: BTreeMap<String, i64>,
}

impl OutboxAudit {
    /// Outbox rows never published.
    pub fn unpublished(&self) -> usize {
        let published: BTreeSet<i32> = self.published_ids.iter().copied().collect();
        self.outbox_ids.difference(&published).count()
    }

    /// Every outbox row published once and marked sent, and nothing else published.
    pub fn is_exactly_once(&self) -> bool {
        let published: BTreeSet<i32> = self.published_ids.iter().copied().collect();
        published.len() == self.published_ids.len()
            && published == self.outbox_ids
            && self.sent == self.outbox_ids.len() as i64
    }
}

impl fmt::Display for OutboxAudit {
    /// `outbox 300 rows, 300 sent, 0 unpublished; published 300: r1 151, r2 149`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "outbox {} rows, {} sent, {} unpublished; published {}",
            self.outbox_ids.len(),
            self.sent,
            self.unpublished(),
            self.published_ids.len()
        )?;
        for (n, (relay, count)) in self.per_relay.iter().enumerate() {
            write!(f, "{} {relay} {count}", if n == 0 { ":" } else { "," })?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit(runs: &[(i32, i64)]) -> JobAudit {
        JobAudit {
            jobs: 3,
            done: 3,
            runs: runs.iter().map(|r| r.1).sum(),
            runs_per_job: runs.iter().copied().collect(),
            runs_per_worker: [("w1".to_string(), 2), ("w2".to_string(), 2)].into(),
        }
    }

    #[test]
    fn duplicates_are_runs_minus_distinct_jobs() {
        let once = audit(&[(1, 1), (2, 1), (3, 1)]);
        assert_eq!(once.duplicates(), 0);
        assert!(once.is_exactly_once());
        let twice = audit(&[(1, 2), (2, 1), (3, 1)]);
        assert_eq!((twice.duplicates(), twice.jobs_run_twice()), (1, 1));
        assert!(!twice.is_exactly_once());
        let missing = audit(&[(1, 2), (2, 1)]);
        assert_eq!(missing.duplicates(), 1);
        assert!(!missing.is_exactly_once());
    }

    #[test]
    fn outbox_exactly_once() {
        let mut audit = OutboxAudit {
            outbox_ids: [1, 2, 3].into(),
            sent: 3,
            published_ids: vec![1, 2, 3],
            per_relay: [("r1".to_string(), 2), ("r2".to_string(), 1)].into(),
        };
        assert!(audit.is_exactly_once());
        assert_eq!(
            audit.to_string(),
            "outbox 3 rows, 3 sent, 0 unpublished; published 3: r1 2, r2 1\n"
        );
        audit.published_ids = vec![1, 2];
        assert_eq!(audit.unpublished(), 1);
        assert!(!audit.is_exactly_once());
    }

    #[test]
    fn worker_table() {
        let report = WorkerReport {
            backend: Backend::Postgres,
            config: WorkerConfig::default(),
            workers: vec![
                WorkerStats {
                    worker: "w1".into(),
                    jobs: 2,
                    batches: 1,
                },
                WorkerStats {
                    worker: "w2".into(),
                    jobs: 1,
                    batches: 1,
                },
            ],
            audit: audit(&[(1, 1), (2, 1), (3, 1)]),
            elapsed: Duration::from_millis(1500),
        };
        let text = report.to_string();
        assert!(
            text.starts_with("worker  batches      jobs   job_runs\n"),
            "{text}"
        );
        assert!(
            text.contains("\nw1            1         2          2\n"),
            "{text}"
        );
        assert!(
            text.contains("\ntotal         2         3          3\n"),
            "{text}"
        );
        assert!(
            text.contains("duplicates 0 (0 jobs ran more than once), elapsed 1.500 s"),
            "{text}"
        );
        assert_eq!(report.busy_workers(), 2);
    }
}
