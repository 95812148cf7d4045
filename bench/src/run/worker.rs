//! What one worker carries through its operations: its state, what it counted,
//! and why an operation failed.

use std::sync::Arc;

use lockkit::adaptive::AdaptivePolicy;

use crate::vocabulary::schema::Item;

/// What the operations saw, counted per worker and summed per run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Operations that completed.
    pub successes: u64,
    /// Units they completed: updates, jobs, order lines.
    pub units: u64,
    /// Attempts, retries included.
    pub attempts: u64,
    /// Version-checked writes that matched no row.
    pub stale: u64,
    /// `NOWAIT` found the row locked (SQLite: the database).
    pub busy: u64,
    /// Transactions the server aborted to break a deadlock.
    pub deadlocks: u64,
    /// Lock waits that ran into the lock timeout.
    pub lock_timeouts: u64,
    /// Operations abandoned because the retries ran out.
    pub gave_up: u64,
    /// Operations that failed otherwise.
    pub errors: u64,
    /// Writes the adaptive strategy made under the row lock.
    pub locked: u64,
    /// Of `successes` and `units`, those completed after the run's time was
    /// up: the correctness checks count them, the throughput does not.
    pub late_successes: u64,
    /// See `late_successes`.
    pub late_units: u64,
}

impl Counts {
    /// Counts a failed attempt by what it was.
    pub fn saw(&mut self, err: &lockkit::Error) {
        match err {
            lockkit::Error::Stale(_) => self.stale += 1,
            lockkit::Error::Busy => self.busy += 1,
            lockkit::Error::Deadlock => self.deadlocks += 1,
            lockkit::Error::LockTimeout => self.lock_timeouts += 1,
            _ => {}
        }
    }

    /// Adds another worker's (or run's) counts.
    pub fn add(&mut self, o: &Counts) {
        self.successes += o.successes;
        self.units += o.units;
        self.attempts += o.attempts;
        self.stale += o.stale;
        self.busy += o.busy;
        self.deadlocks += o.deadlocks;
        self.lock_timeouts += o.lock_timeouts;
        self.gave_up += o.gave_up;
        self.errors += o.errors;
        self.locked += o.locked;
        self.late_successes += o.late_successes;
        self.late_units += o.late_units;
    }
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// A lockkit error.
    #[error(transparent)]
    Lockkit(lockkit::Error),
    /// A Diesel error (hand-written code).
    #[error(transparent)]
    Diesel(#[from] diesel::result::Error),
    /// The retries ran out.
    #[error("retries exhausted")]
    GaveUp,
    /// Anything else (a hand-written check).
    #[error("{0}")]
    Other(String),
}

impl From<lockkit::Error> for OpError {
    fn from(e: lockkit::Error) -> Self {
        match e {
            lockkit::Error::RetriesExhausted { .. } => OpError::GaveUp,
            e => OpError::Lockkit(e),
        }
    }
}

/// One worker's state, handed to every operation.
#[derive(Debug)]
pub struct WorkerState {
    /// The worker's number, from 0.
    pub index: usize,
    /// Its random numbers (baskets, hand-written backoff).
    pub rng: fastrand::Rng,
    /// Its own row (uncontended workload).
    pub own: Option<Item>,
    /// The retry policy of the case.
    pub policy: lockkit::RetryPolicy,
    /// What it saw.
    pub counts: Counts,
    /// The jobs it claimed (queue workload).
    pub claimed: Vec<i32>,
    /// The adaptive strategy's policy, shared by the workers of one run.
    pub adaptive: Arc<AdaptivePolicy>,
}

impl WorkerState {
    /// A fresh state for worker `index`.
    pub fn new(index: usize, policy: lockkit::RetryPolicy, adaptive: Arc<AdaptivePolicy>) -> Self {
        WorkerState {
            index,
            rng: fastrand::Rng::with_seed(0x5eed_0000 + index as u64),
            own: None,
            policy,
            counts: Counts::default(),
            claimed: Vec::new(),
            adaptive,
        }
    }

    /// Counts one attempt of a lockkit call and, if it failed, what it saw;
    /// hands its result on.
    pub fn counted<T>(&mut self, result: Result<T, lockkit::Error>) -> Result<T, lockkit::Error> {
        self.counts.attempts += 1;
        if let Err(err) = &result {
            self.counts.saw(err);
        }
        result
    }
}
