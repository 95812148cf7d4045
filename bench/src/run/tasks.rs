//! One measured run of a diesel-async case: the same reset, start line, worker
//! loop and check as [`super::runner`], with the workers as tasks on a tokio
//! runtime of [`ASYNC_THREADS`] threads, each with a connection of one bb8 pool
//! ([`Tasks`]). The tables are reset and read back through the backend's
//! blocking pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel_async::pooled_connection::ManagerConfig;
use lockkit::adaptive::AdaptivePolicy;

use super::cpu;
use super::ops::asynchronous::AsyncBenchConnection;
use super::ops::{session_sql, BenchConnection, Session};
use super::runner::{alternate, reset, sample, BenchPool, WorkerLoop, WorkerOut};
use super::sample::Sample;
use crate::error::BenchError;
use crate::plan::ASYNC_THREADS;
use crate::vocabulary::{Case, Limits};

/// The bb8 pool of the diesel-async cases.
pub type AsyncPool<A> = bb8::Pool<<A as AsyncBenchConnection>::Manager>;

/// The runtime the tasks run on and the pool they take their connections from,
/// for one backend.
pub struct Tasks<A: AsyncBenchConnection> {
    // Fields drop in order: the connections close before their runtime stops.
    pool: AsyncPool<A>,
    runtime: tokio::runtime::Runtime,
}

impl<A: AsyncBenchConnection> Tasks<A> {
    /// A runtime of [`ASYNC_THREADS`] threads and a pool of up to `size`
    /// connections to `url`, each with the session settings.
    pub fn open(url: &str, size: u32, session: Session) -> Result<Self, BenchError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(ASYNC_THREADS)
            .enable_all()
            .build()?;
        let mut config = ManagerConfig::default();
        config.custom_setup = Box::new(move |url| {
            let url = url.to_owned();
            Box::pin(async move {
                let mut conn = A::establish(&url).await?;
                conn.batch_execute(&session_sql(A::Blocking::BACKEND, session))
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        let manager = A::manager(url, config);
        let pool = runtime
            .block_on(
                bb8::Pool::builder()
                    .max_size(size)
                    .connection_timeout(Duration::from_secs(30))
                    .build(manager),
            )
            .map_err(|e| BenchError::Pool(format!("{e:?}")))?;
        Ok(Tasks { pool, runtime })
    }
}

/// Runs the diesel-async `case` once on a fresh set of rows (reset and checked
/// through `blocking`) and checks the result.
pub fn run_case<A: AsyncBenchConnection>(
    tasks: &Tasks<A>,
    blocking: &BenchPool<A::Blocking>,
    case: &Case,
    limits: &Limits,
) -> Result<Sample, BenchError> {
    reset(blocking, case, limits)?;
    // Each run starts calm, as the blocking runs do.
    let adaptive = Arc::new(AdaptivePolicy::new());
    let (outs, started, elapsed, cpu) = tasks.runtime.block_on(async {
        // Every task gets its connection before the start line.
        let mut conns = Vec::with_capacity(case.workers);
        for _ in 0..case.workers {
            conns.push(
                tasks
                    .pool
                    .get_owned()
                    .await
                    .map_err(|e| BenchError::Pool(format!("{e:?}")))?,
            );
        }
        let start_line = Arc::new(tokio::sync::Barrier::new(case.workers + 1));
        let workers: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let (case, limits) = (*case, *limits);
                let start_line = Arc::clone(&start_line);
                let adaptive = Arc::clone(&adaptive);
                tokio::spawn(async move {
                    worker::<A>(conn, index, &case, &limits, &start_line, adaptive).await
                })
            })
            .collect();
        let cpu_before = cpu::snapshot(A::Blocking::BACKEND);
        start_line.wait().await;
        let started = Instant::now();
        let mut outs = Vec::with_capacity(workers.len());
        for w in workers {
            outs.push(w.await.unwrap_or_else(|_| {
                Err(BenchError::Other(format!(
                    "a task panicked in {}",
                    case.label()
                )))
            }));
        }
        let elapsed = started.elapsed();
        let cpu = cpu_before.until(&cpu::snapshot(A::Blocking::BACKEND));
        Ok::<_, BenchError>((outs, started, elapsed, cpu))
    })?;
    sample(
        blocking,
        case,
        outs,
        (started, elapsed),
        limits,
        cpu,
        &adaptive,
    )
}

async fn worker<A: AsyncBenchConnection>(
    mut conn: bb8::PooledConnection<'static, A::Manager>,
    index: usize,
    case: &Case,
    limits: &Limits,
    start_line: &tokio::sync::Barrier,
    adaptive: Arc<AdaptivePolicy>,
) -> Result<WorkerOut, BenchError> {
    let mut run = WorkerLoop::new(index, case, adaptive);
    let prepared = A::prepare_worker(&mut conn, case, &mut run.state).await;
    start_line.wait().await;
    prepared?;

    run.start(limits);
    while run.go_on(limits) {
        let started = Instant::now();
        let result = A::op(&mut conn, case, &mut run.state).await;
        if !run.record(case, started, result) {
            break;
        }
    }
    Ok(run.finish())
}

/// Runs the diesel-async cases `a` and `b` alternately, `rounds` times `a b b
/// a`, as [`super::runner::run_pair`] does the blocking ones.
pub fn run_pair<A: AsyncBenchConnection>(
    tasks: &Tasks<A>,
    blocking: &BenchPool<A::Blocking>,
    a: &Case,
    b: &Case,
    limits: &Limits,
    rounds: usize,
) -> Result<(Sample, Sample), BenchError> {
    alternate(a, b, rounds, |case| run_case(tasks, blocking, case, limits))
}
