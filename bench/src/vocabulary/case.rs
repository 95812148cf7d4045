//! One measured configuration, and the bounds of a run.

use std::time::Duration;

use super::strategy::{Client, Flavor, Retry, Strategy};
use super::workload::Workload;

/// One measured configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Case {
    /// The workload.
    pub workload: Workload,
    /// The strategy.
    pub strategy: Strategy,
    /// lockkit or hand-written.
    pub flavor: Flavor,
    /// Workers (threads or tasks, one pooled connection each).
    pub workers: usize,
    /// Jobs claimed per transaction (queue only, else 1).
    pub batch: i64,
    /// The retry policy (strategies that retry).
    pub retry: Retry,
    /// Threads on blocking Diesel, or tasks on diesel-async.
    pub client: Client,
}

impl Case {
    /// A lockkit case with the default retry policy and batch 1.
    pub fn new(workload: Workload, strategy: Strategy, workers: usize) -> Case {
        Case {
            workload,
            strategy,
            flavor: Flavor::Lockkit,
            workers,
            batch: 1,
            retry: Retry::Default,
            client: Client::Threads,
        }
    }

    /// The same case on diesel-async: a task per worker.
    pub fn tasks(self) -> Case {
        Case {
            client: Client::Tasks,
            ..self
        }
    }

    /// The same case, hand-written.
    pub fn hand(self) -> Case {
        Case {
            flavor: Flavor::Hand,
            ..self
        }
    }

    /// The same case with another batch size.
    pub fn batch(self, batch: i64) -> Case {
        Case { batch, ..self }
    }

    /// The same case with another retry policy.
    pub fn retry(self, retry: Retry) -> Case {
        Case { retry, ..self }
    }

    /// The same case through lockkit.
    pub fn lockkit(self) -> Case {
        Case {
            flavor: Flavor::Lockkit,
            ..self
        }
    }

    /// A one-line description.
    pub fn label(&self) -> String {
        let flavor = if self.strategy == Strategy::Naive {
            "plain Diesel"
        } else {
            self.flavor.title()
        };
        let mut s = format!(
            "{} / {} / {} / {} workers",
            self.workload.title(),
            self.strategy.title(),
            flavor,
            self.workers
        );
        if self.workload == Workload::Queue {
            s.push_str(&format!(" / batch {}", self.batch));
        }
        if self.retry != Retry::Default {
            s.push_str(&format!(" / {}", self.retry.title()));
        }
        if self.client == Client::Tasks {
            s.push_str(" / diesel-async tasks");
        }
        s
    }
}

/// How long and how much: every worker loop stops at whichever bound comes first.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time limit of one measured run.
    pub run: Duration,
    /// Count limit: operations per worker in one run.
    pub max_ops_per_worker: u64,
    /// Jobs in the queue at the start of a queue run (also its count limit).
    pub jobs: i32,
}
