//! # job_queue: many workers, one table, every row exactly once
//!
//! Two classic uses of `FOR UPDATE SKIP LOCKED`, built on
//! [`lockkit::queue::claim`] and [`lockkit::locked_transaction`]:
//!
//! * **Job workers** ([`run_workers`]): `N` threads on an r2d2 pool drain a `jobs`
//!   table. Each loop is one transaction:
//!
//!   ```sql
//!   BEGIN;                                   -- SQLite: BEGIN IMMEDIATE
//!   SELECT set_config('lock_timeout', '1000ms', true); -- PostgreSQL; MySQL: innodb_lock_wait_timeout = 1
//!   SELECT id, payload, done FROM jobs WHERE done = false
//!     ORDER BY id LIMIT $batch FOR UPDATE SKIP LOCKED;
//!   UPDATE jobs SET done = true WHERE id = ..;          -- once per job,
//!   INSERT INTO job_runs (job_id, worker) VALUES (..);  -- which it "runs"
//!   COMMIT;
//!   ```
//!
//!   A worker stops when its claim comes back empty. Every execution is logged in
//!   `job_runs`, so [`JobAudit::duplicates`] counts jobs that ran more than once.
//!
//! * **Outbox relay** ([`run_relay`]): the transactional-outbox pattern. Messages
//!   sit in `outbox`; a relay claims a batch the same way, "publishes" each message
//!   (a row in `published`, whose primary key is the outbox id, standing in for a
//!   broker), marks the batch sent and commits. Several relay *processes* can run
//!   against one database at once; [`seed_outbox`] fills the outbox and
//!   [`outbox_audit`] checks the result.
//!
//!   Each message is published exactly once here only because the stand-in
//!   broker is a table written in the claim's own transaction: the publish
//!   commits or rolls back with the claim. A real broker's publish is not part
//!   of the transaction: a relay that crashes after the publish and before the
//!   `COMMIT` publishes again, so delivery is at least once, and the consumer
//!   must recognise a message it has applied. `examples/outbox` does it with a
//!   real broker (NATS JetStream) and lockkit's `outbox::Inbox`.
//!
//! ## Waiting, per backend
//!
//! On **PostgreSQL** and **MySQL/MariaDB** the workers never wait for each other:
//! `SKIP LOCKED` leaves rows that another transaction holds out of the result
//! instead of waiting for them. The transactions run with
//! `LockOptions::default().timeout(1 s)` ([`lock_options`]), so any lock wait
//! longer than a second would fail the run with `lockkit::Error::LockTimeout`
//! rather than go unnoticed.
//!
//! On MySQL/MariaDB every connection runs its transactions at READ COMMITTED.
//! Under InnoDB's default REPEATABLE READ, a claim that reaches the end of the
//! pending rows also locks the gap after them, where every new job goes: a
//! producer's insert would wait for a worker's whole batch.
//!
//! Rows are marked done (or sent) one `UPDATE … WHERE id = ?` at a time. On a
//! small table MySQL/MariaDB may run `WHERE id IN (…)` as a full scan, which under
//! REPEATABLE READ locks every row it reads, including rows other workers have
//! claimed. The workers then wait for each other and can deadlock. A
//! primary-key lookup locks only its row, under either level (this example's
//! connections run at READ COMMITTED, above).
//!
//! **SQLite** has no row locks: `locked_transaction` is `BEGIN IMMEDIATE`, which
//! takes the database's write lock up front, so workers (and relay processes)
//! **take turns**, one transaction at a time. Every row is still processed exactly
//! once, but there is no parallelism; a waiting worker queues on SQLite's busy
//! timeout (10 s, set on every connection) instead of a lock timeout. The turns
//! are not fair: a waiting connection polls, so the one that just committed
//! usually takes the lock again, and one worker or relay may well do all the work.
//!
//! ## Without locking
//!
//! [`Claim::Naive`] reads the pending rows without a lock, processes them and
//! then marks them done, as many hand-written queues do. Two workers that read at
//! the same time get the same rows and both run them: duplicates, on every backend.
//!
//! ```no_run
//! use job_queue::{Claim, WorkerConfig};
//! let config = WorkerConfig { workers: 4, jobs: 300, batch_size: 10, ..WorkerConfig::default() };
//! let report = job_queue::run_workers("job_queue.sqlite", &config)?;
//! assert_eq!(report.audit.duplicates(), 0);
//! print!("{report}");
//! # Ok::<(), job_queue::JobQueueError>(())
//! ```
//!
//! The backend follows the URL: `postgres://` or `postgresql://` is PostgreSQL,
//! `mysql://` is MySQL/MariaDB, anything else is a SQLite file path.

#![warn(missing_docs)]

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod backends;
mod error;
pub mod models;
mod report;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod runner;
pub mod schema;

use std::fmt;
use std::time::Duration;

use lockkit::LockOptions;

pub use error::JobQueueError;
pub use lockkit_tests::support::Backend;
pub use report::{JobAudit, OutboxAudit, RelayReport, WorkerReport, WorkerStats};

/// The lock timeout of every worker and relay transaction on PostgreSQL and MySQL.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// The lock options of the worker and relay transactions on `backend`.
///
/// PostgreSQL and MySQL: `LockOptions::default().timeout(`[`LOCK_TIMEOUT`]`)`.
/// `SKIP LOCKED` never waits, so the timeout only fires if something else makes a
/// worker wait, and then the run fails with `lockkit::Error::LockTimeout`.
///
/// SQLite: `LockOptions::default()`. Workers wait for the write lock by design
/// and do so up to the connection's busy timeout (10 s).
pub fn lock_options(backend: Backend) -> LockOptions {
    match backend {
        Backend::Postgres | Backend::Mysql => LockOptions::default().timeout(LOCK_TIMEOUT),
        Backend::Sqlite => LockOptions::default(),
    }
}

/// How workers take jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Claim {
    /// `lockkit::queue::claim` in `lockkit::locked_transaction`:
    /// `LIMIT n FOR UPDATE SKIP LOCKED` (SQLite: `BEGIN IMMEDIATE`). Exactly
    /// once for work that is the claim transaction's own writes, as here; work
    /// outside the database (an email, an HTTP call) runs at least once, again
    /// after a worker died before its `COMMIT`.
    #[default]
    SkipLocked,
    /// Read `LIMIT n` pending rows without a lock, process them, then mark them
    /// done in a transaction. Concurrent workers run the same jobs.
    Naive,
}

impl Claim {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Claim::SkipLocked => "skip-locked",
            Claim::Naive => "naive (unsafe)",
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The knobs of a worker run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Worker threads, each with its own pooled connection, named `w1`, `w2`, ….
    pub workers: usize,
    /// Jobs enqueued before the workers start.
    pub jobs: u32,
    /// Jobs claimed per transaction (`LIMIT`).
    pub batch_size: i64,
    /// Time spent "running" each batch, while it is claimed (inside the
    /// transaction; for [`Claim::Naive`], between the read and the write).
    pub think: Duration,
    /// How jobs are claimed.
    pub claim: Claim,
}

impl Default for WorkerConfig {
    /// 4 workers, 1000 jobs, batches of 10, 1 ms per batch, [`Claim::SkipLocked`].
    fn default() -> Self {
        WorkerConfig {
            workers: 4,
            jobs: 1000,
            batch_size: 10,
            think: Duration::from_millis(1),
            claim: Claim::SkipLocked,
        }
    }
}

/// The knobs of one relay instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// This instance's name, recorded with every message it publishes.
    pub name: String,
    /// Messages claimed per transaction (`LIMIT`).
    pub batch_size: i64,
    /// Time spent "talking to the broker" per batch, inside the transaction.
    pub think: Duration,
}

impl Default for RelayConfig {
    /// Named `relay`, batches of 10, no pause.
    fn default() -> Self {
        RelayConfig {
            name: "relay".into(),
            batch_size: 10,
            think: Duration::ZERO,
        }
    }
}

/// Applies the migrations, empties `jobs` and `job_runs`, enqueues `config.jobs`
/// jobs, lets `config.workers` threads drain the queue, and audits `job_runs`.
///
/// The URL selects the backend (see [`Backend::from_url`]); a backend whose cargo
/// feature is off is a [`JobQueueError::Unsupported`]. A worker error (for example
/// `lockkit::Error::LockTimeout`) fails the run.
pub fn run_workers(url: &str, config: &WorkerConfig) -> Result<WorkerReport, JobQueueError> {
    if config.workers == 0 {
        return Err(JobQueueError::Usage("at least one worker is needed".into()));
    }
    if config.batch_size < 1 {
        return Err(JobQueueError::Usage(
            "the batch size must be at least 1".into(),
        ));
    }
    runner::run_workers(url, config)
}

/// Applies the migrations, empties `outbox` and `published`, and writes `count`
/// unsent messages. Run it before starting relays: relays do not migrate, so that
/// several of them can start at once.
pub fn seed_outbox(url: &str, count: u32) -> Result<(), JobQueueError> {
    runner::seed_outbox(url, count)
}

/// One relay instance: claims unsent outbox messages in batches with `SKIP
/// LOCKED`, publishes them and marks them sent, until a claim comes back empty.
///
/// Meant to run in several processes at once (`job_queue --role relay`). An empty
/// claim means that nothing is left *that nobody else holds*: batches in flight in
/// another relay are that relay's to finish.
pub fn run_relay(url: &str, config: &RelayConfig) -> Result<RelayReport, JobQueueError> {
    if config.batch_size < 1 {
        return Err(JobQueueError::Usage(
            "the batch size must be at least 1".into(),
        ));
    }
    runner::run_relay(url, config)
}

/// Reads what the outbox and the "broker" hold.
pub fn outbox_audit(url: &str) -> Result<OutboxAudit, JobQueueError> {
    runner::outbox_audit(url)
}

/// Reads what `jobs` and `job_runs` hold.
pub fn job_audit(url: &str) -> Result<JobAudit, JobQueueError> {
    runner::job_audit(url)
}
