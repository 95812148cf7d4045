//! What one measured run yields: time, counts, latencies, CPU and its check.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::check::Check;
use super::cpu::{micros_per, Cpu};
use super::worker::Counts;
use crate::vocabulary::{Backend, Case, Workload};

/// One measured run (or the merge of a few slices of the same case).
#[derive(Debug, Clone)]
pub struct Sample {
    /// The backend.
    pub backend: Backend,
    /// The case.
    pub case: Case,
    /// Wall time from the start line until the last worker stopped.
    pub elapsed: Duration,
    /// The time the throughput is counted in: the run's length (less when
    /// every worker stopped earlier, e.g. on a drained queue). Operations that
    /// complete after it, while the other workers have stopped, count for the
    /// checks but not for the throughput: how long the slowest last operation
    /// takes (a worker asleep in a backoff, one at the end of a lock queue)
    /// is not a rate.
    pub window: Duration,
    /// What the workers counted.
    pub counts: Counts,
    /// Latency of the operations that completed, in microseconds.
    pub hist: Histogram<u64>,
    /// The correctness line.
    pub check: Check,
    /// The first error other than a conflict, if any.
    pub first_error: Option<String>,
    /// CPU used by the client and the server during the run.
    pub cpu: Cpu,
}

impl Sample {
    /// Work done: operations, or jobs for the queue.
    pub fn done(&self) -> f64 {
        self.done_and_late().0
    }

    /// Work done, and the part of it completed after the run's time.
    fn done_and_late(&self) -> (f64, f64) {
        let c = &self.counts;
        match self.case.workload {
            Workload::Queue => (c.units as f64, c.late_units as f64),
            _ => (c.successes as f64, c.late_successes as f64),
        }
    }

    /// Client CPU per unit of work, µs.
    pub fn client_cpu_us(&self) -> f64 {
        micros_per(self.cpu.client, self.done())
    }

    /// Server CPU per unit of work, µs (NaN for SQLite).
    pub fn server_cpu_us(&self) -> f64 {
        match self.backend {
            Backend::Sqlite => f64::NAN,
            _ => micros_per(self.cpu.server, self.done()),
        }
    }

    /// Operations completed within the run's time, per second (queue: jobs
    /// per second); see [`Sample::window`].
    pub fn throughput(&self) -> f64 {
        let (done, late) = self.done_and_late();
        (done - late) / self.window.as_secs_f64().max(1e-9)
    }

    /// Attempts per completed operation.
    pub fn attempts_per_success(&self) -> f64 {
        self.counts.attempts as f64 / (self.counts.successes.max(1)) as f64
    }

    /// A latency percentile in milliseconds.
    pub fn latency_ms(&self, quantile: f64) -> f64 {
        if self.hist.is_empty() {
            return f64::NAN;
        }
        self.hist.value_at_quantile(quantile) as f64 / 1000.0
    }

    /// Adds another slice of the same case.
    pub fn merge(&mut self, other: &Sample) {
        self.elapsed += other.elapsed;
        self.window += other.window;
        self.counts.add(&other.counts);
        self.cpu = Cpu {
            client: self.cpu.client + other.cpu.client,
            children: self.cpu.children + other.cpu.children,
            server: self.cpu.server + other.cpu.server,
        };
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.check = Check {
            ok: self.check.ok && other.check.ok,
            lost: self.check.lost + other.check.lost,
            detail: self.check.detail.clone(),
            slices: self.check.slices + other.check.slices,
        };
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}
