//! Runs: connections, the worker pool and threads, the relay loop. Generic over
//! the backend; the per-backend statements are [`QueueConnection`]'s methods.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use lockkit_tests::support::SessionSettings;

use crate::backends::QueueConnection;
use crate::{
    JobAudit, JobQueueError, OutboxAudit, RelayConfig, RelayReport, WorkerConfig, WorkerReport,
    WorkerStats,
};

/// One direct connection with the session settings. An unreachable server fails
/// here at once with its own message, not after a pool's connection timeout.
fn connect<C: QueueConnection>(url: &str) -> Result<C, JobQueueError> {
    let mut conn = C::establish(url)?;
    conn.configure_session()?;
    Ok(conn)
}

pub(crate) fn run_workers<C: QueueConnection>(
    url: &str,
    config: &WorkerConfig,
) -> Result<WorkerReport, JobQueueError> {
    let size = u32::try_from(config.workers)
        .map_err(|_| JobQueueError::Usage(format!("too many workers: {}", config.workers)))?;

    let mut setup = connect::<C>(url)?;
    setup.migrate()?;
    setup.enqueue_jobs(config.jobs)?;
    drop(setup);

    let pool = Pool::builder()
        .max_size(size)
        .connection_timeout(Duration::from_secs(30))
        .connection_customizer(Box::new(SessionSettings(C::configure_session)))
        .build(ConnectionManager::<C>::new(url))?;
    // Every worker gets its connection before the start, so a pool failure is an
    // error here and not a thread stuck at the barrier.
    let conns = (0..config.workers)
        .map(|_| pool.get())
        .collect::<Result<Vec<_>, _>>()?;
    let start_line = Barrier::new(config.workers + 1);
    let (results, elapsed) = thread::scope(|scope| {
        let workers: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(n, conn)| {
                let start_line = &start_line;
                let name = format!("w{}", n + 1);
                scope.spawn(move || worker::<C>(name, conn, start_line, config))
            })
            .collect();
        start_line.wait();
        let started = Instant::now();
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        (results, started.elapsed())
    });
    let workers = results
        .into_iter()
        .map(|result| result.map_err(|_| JobQueueError::Panicked("worker"))?)
        .collect::<Result<Vec<_>, _>>()?;

    let audit = pool.get()?.job_audit()?;
    Ok(WorkerReport {
        backend: C::BACKEND,
        config: config.clone(),
        workers,
        audit,
        elapsed,
    })
}

/// One worker: waits for the start, then claims batches until a claim is empty.
fn worker<C: QueueConnection>(
    name: String,
    mut conn: PooledConnection<ConnectionManager<C>>,
    start_line: &Barrier,
    config: &WorkerConfig,
) -> Result<WorkerStats, JobQueueError> {
    let mut stats = WorkerStats {
        worker: name,
        jobs: 0,
        batches: 0,
    };
    start_line.wait();
    loop {
        let ran = C::work_batch(&mut conn, &stats.worker, config)?;
        if ran == 0 {
            return Ok(stats);
        }
        stats.jobs += ran as u64;
        stats.batches += 1;
    }
}

pub(crate) fn job_audit<C: QueueConnection>(url: &str) -> Result<JobAudit, JobQueueError> {
    connect::<C>(url)?.job_audit()
}

pub(crate) fn seed_outbox<C: QueueConnection>(url: &str, count: u32) -> Result<(), JobQueueError> {
    let mut conn = connect::<C>(url)?;
    conn.migrate()?;
    conn.fill_outbox(count)
}

pub(crate) fn run_relay<C: QueueConnection>(
    url: &str,
    config: &RelayConfig,
) -> Result<RelayReport, JobQueueError> {
    let started = Instant::now();
    let mut conn = connect::<C>(url)?;
    let mut report = RelayReport {
        name: config.name.clone(),
        backend: C::BACKEND,
        published: 0,
        batches: 0,
        elapsed: Duration::ZERO,
    };
    loop {
        let relayed = conn.relay_batch(config)?;
        if relayed == 0 {
            break;
        }
        report.published += relayed as u64;
        report.batches += 1;
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

pub(crate) fn outbox_audit<C: QueueConnection>(url: &str) -> Result<OutboxAudit, JobQueueError> {
    connect::<C>(url)?.outbox_audit()
}
