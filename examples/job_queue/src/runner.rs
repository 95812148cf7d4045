//! Runs: connections, the worker pool and threads, the relay loop.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::QueryResult;
use lockkit_tests::support::{worker_connections, AnyConnection, AnyPooled, SessionSettings};

use crate::backends;
use crate::{
    Backend, JobAudit, JobQueueError, OutboxAudit, RelayConfig, RelayReport, WorkerConfig,
    WorkerReport, WorkerStats,
};

/// One direct connection with the session settings. An unreachable server fails
/// here at once with its own message, not after a pool's connection timeout.
fn connect(url: &str) -> Result<AnyConnection, JobQueueError> {
    let mut conn = AnyConnection::open(url)?;
    configure_session(&mut conn)?;
    Ok(conn)
}

/// The session settings of every connection: the shared ones, and on
/// MySQL/MariaDB transactions at READ COMMITTED. Under InnoDB's REPEATABLE
/// READ a claim that reaches the end of the pending rows also locks the gap
/// after them, where every new job (or message) is inserted: a producer would
/// wait for a worker's whole batch (see `lockkit::queue`).
fn configure_session(conn: &mut AnyConnection) -> QueryResult<()> {
    conn.configure_session()?;
    if conn.backend() == Backend::Mysql {
        conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
    }
    Ok(())
}

pub(crate) fn run_workers(url: &str, config: &WorkerConfig) -> Result<WorkerReport, JobQueueError> {
    let size = u32::try_from(config.workers)
        .map_err(|_| JobQueueError::Usage(format!("too many workers: {}", config.workers)))?;

    let mut setup = connect(url)?;
    setup.migrate(backends::MIGRATIONS)?;
    backends::enqueue_jobs(&mut setup, config.jobs)?;
    let backend = setup.backend();
    drop(setup);

    let (pool, conns) = worker_connections(url, size, SessionSettings(configure_session))?;
    let start_line = Barrier::new(config.workers + 1);
    let (results, elapsed) = thread::scope(|scope| {
        let workers: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(n, conn)| {
                let start_line = &start_line;
                let name = format!("w{}", n + 1);
                scope.spawn(move || worker(name, conn, start_line, config))
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

    let audit = backends::job_audit(&mut *pool.get()?)?;
    Ok(WorkerReport {
        backend,
        config: config.clone(),
        workers,
        audit,
        elapsed,
    })
}

/// One worker: waits for the start, then claims batches until a claim is empty.
fn worker(
    name: String,
    mut conn: AnyPooled,
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
        let ran = backends::work_batch(&mut conn, &stats.worker, config)?;
        if ran == 0 {
            return Ok(stats);
        }
        stats.jobs += ran as u64;
        stats.batches += 1;
    }
}

pub(crate) fn job_audit(url: &str) -> Result<JobAudit, JobQueueError> {
    backends::job_audit(&mut connect(url)?)
}

pub(crate) fn seed_outbox(url: &str, count: u32) -> Result<(), JobQueueError> {
    let mut conn = connect(url)?;
    conn.migrate(backends::MIGRATIONS)?;
    backends::fill_outbox(&mut conn, count)
}

pub(crate) fn run_relay(url: &str, config: &RelayConfig) -> Result<RelayReport, JobQueueError> {
    let started = Instant::now();
    let mut conn = connect(url)?;
    let mut report = RelayReport {
        name: config.name.clone(),
        backend: conn.backend(),
        published: 0,
        batches: 0,
        elapsed: Duration::ZERO,
    };
    loop {
        let relayed = backends::relay_batch(&mut conn, config)?;
        if relayed == 0 {
            break;
        }
        report.published += relayed as u64;
        report.batches += 1;
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

pub(crate) fn outbox_audit(url: &str) -> Result<OutboxAudit, JobQueueError> {
    backends::outbox_audit(&mut connect(url)?)
}
