//! One measured run: reset the tables, start the workers together, let each loop
//! until its count or the time limit runs out, then read the tables back and check
//! that nothing was lost. Generic over the backend; the per-backend parts are
//! [`BenchConnection`]'s methods.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
use hdrhistogram::Histogram;
use lockkit::adaptive::AdaptivePolicy;

use super::check::Check;
use super::cpu;
use super::ops::{BenchConnection, Session};
use super::sample::Sample;
use super::worker::{Counts, OpError, WorkerState};
use crate::error::BenchError;
use crate::vocabulary::{Case, Limits, Strategy, Workload};

/// The pool every run of one backend uses.
pub type BenchPool<C> = Pool<ConnectionManager<C>>;

/// A worker's connection.
pub type Pooled<C> = PooledConnection<ConnectionManager<C>>;

/// Applies the backend's session settings to every connection the pool opens.
#[derive(Debug)]
struct ApplySession(Session);

impl<C: BenchConnection> CustomizeConnection<C, diesel::r2d2::Error> for ApplySession {
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        conn.configure_session(self.0)
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// A pool of `size` connections to `url` with the session settings.
pub fn pool<C: BenchConnection>(
    url: &str,
    size: u32,
    session: Session,
) -> Result<BenchPool<C>, BenchError> {
    Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(30))
        .connection_customizer(Box::new(ApplySession(session)))
        .build(ConnectionManager::<C>::new(url))
        .map_err(|e| BenchError::Pool(e.to_string()))
}

/// A new histogram: 1 µs to 10 min, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Stop a worker after this many errors in a row (a broken connection).
const MAX_CONSECUTIVE_ERRORS: u32 = 100;

/// What a worker hands back: its state, its latencies, its first error.
pub(crate) struct WorkerOut {
    state: WorkerState,
    hist: Histogram<u64>,
    first_error: Option<String>,
    /// A queue worker that found the queue empty.
    drained: bool,
    /// When it finished its last unit of work.
    last_unit: Option<Instant>,
}

/// One worker's loop, whoever runs it (a thread or a task): bounded by the
/// run's time and the count per worker, stopped early by a drained queue or
/// too many errors in a row.
pub(crate) struct WorkerLoop {
    /// What the operations read and count.
    pub(crate) state: WorkerState,
    hist: Histogram<u64>,
    first_error: Option<String>,
    deadline: Instant,
    ops: u64,
    consecutive_errors: u32,
    last_unit: Option<Instant>,
    drained: bool,
}

impl WorkerLoop {
    /// Worker `index` of `case`, before the start line.
    pub(crate) fn new(index: usize, case: &Case, adaptive: Arc<AdaptivePolicy>) -> Self {
        WorkerLoop {
            state: WorkerState::new(index, case.retry.policy(), adaptive),
            hist: histogram(),
            first_error: None,
            deadline: Instant::now(),
            ops: 0,
            consecutive_errors: 0,
            last_unit: None,
            drained: false,
        }
    }

    /// Crosses the start line: the run's time starts now.
    pub(crate) fn start(&mut self, limits: &Limits) {
        self.deadline = Instant::now() + limits.run;
    }

    /// Whether to run another operation.
    pub(crate) fn go_on(&self, limits: &Limits) -> bool {
        self.ops < limits.max_ops_per_worker && Instant::now() < self.deadline
    }

    /// Records one operation that began at `started`; `false` to stop.
    pub(crate) fn record(
        &mut self,
        case: &Case,
        started: Instant,
        result: Result<usize, OpError>,
    ) -> bool {
        self.ops += 1;
        match result {
            Ok(0) if case.workload == Workload::Queue => {
                self.drained = true;
                return false;
            }
            Ok(units) => {
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.hist.saturating_record(micros.max(1));
                self.state.counts.successes += 1;
                self.state.counts.units += units as u64;
                self.last_unit = Some(Instant::now());
                if Instant::now() > self.deadline {
                    self.state.counts.late_successes += 1;
                    self.state.counts.late_units += units as u64;
                }
                self.consecutive_errors = 0;
            }
            Err(OpError::GaveUp) => self.state.counts.gave_up += 1,
            Err(err) => {
                self.state.counts.errors += 1;
                if self.first_error.is_none() {
                    self.first_error = Some(err.to_string());
                }
                self.consecutive_errors += 1;
                if self.consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                    return false;
                }
            }
        }
        true
    }

    /// The worker's results.
    pub(crate) fn finish(self) -> WorkerOut {
        WorkerOut {
            drained: self.drained,
            last_unit: self.last_unit,
            state: self.state,
            hist: self.hist,
            first_error: self.first_error,
        }
    }
}

/// Resets the tables `case` works on, through `pool`.
pub(crate) fn reset<C: BenchConnection>(
    pool: &BenchPool<C>,
    case: &Case,
    limits: &Limits,
) -> Result<(), BenchError> {
    let mut setup = pool.get()?;
    setup.reset_items()?;
    if case.workload == Workload::Queue {
        setup.reset_jobs(limits.jobs)?;
    }
    Ok(())
}

/// The sample of a run that started at `started` and took `elapsed`: the
/// workers' counts and latencies merged, the tables read back through `pool`
/// and checked.
pub(crate) fn sample<C: BenchConnection>(
    pool: &BenchPool<C>,
    case: &Case,
    outs: Vec<Result<WorkerOut, BenchError>>,
    (started, elapsed): (Instant, Duration),
    limits: &Limits,
    cpu: cpu::Cpu,
    adaptive: &AdaptivePolicy,
) -> Result<Sample, BenchError> {
    let mut counts = Counts::default();
    let mut hist = histogram();
    let mut claimed = Vec::new();
    let mut first_error = None;
    // Every worker of a queue run found it empty: the run took until the last
    // job was done, not until the last empty claim returned.
    let mut drained = true;
    let mut last_unit = None;
    for out in outs {
        let out = out?;
        drained &= out.drained;
        last_unit = last_unit.max(out.last_unit);
        counts.add(&out.state.counts);
        hist.add(&out.hist).expect("same histogram bounds");
        claimed.extend_from_slice(&out.state.claimed);
        if first_error.is_none() {
            first_error = out.first_error;
        }
    }
    if case.strategy == Strategy::Adaptive {
        let stats = adaptive.stats();
        counts.stale += stats.conflicts;
        counts.locked += stats.locked_writes;
    }
    let tally = pool.get()?.tally()?;
    let check = Check::of(case, &counts, &tally, &claimed);
    Ok(Sample {
        backend: C::BACKEND,
        case: *case,
        elapsed,
        // The workers stop starting operations at the run's time; the last
        // ones still finish (a backoff, a lock queue), while the others idle.
        window: last_unit
            .filter(|_| drained)
            .map(|at| at.saturating_duration_since(started))
            .filter(|drain| !drain.is_zero())
            .unwrap_or(elapsed)
            .min(limits.run),
        counts,
        hist,
        check,
        first_error,
        cpu,
    })
}

/// Runs `case` once on a fresh set of rows and checks the result.
pub fn run_case<C: BenchConnection>(
    pool: &BenchPool<C>,
    case: &Case,
    limits: &Limits,
) -> Result<Sample, BenchError> {
    reset(pool, case, limits)?;

    // Every worker gets its connection before the start line, so a pool failure is
    // an error here and not a thread stuck at the barrier.
    let conns = (0..case.workers)
        .map(|_| pool.get())
        .collect::<Result<Vec<_>, _>>()?;
    let start_line = Barrier::new(case.workers + 1);
    // Each run starts calm: what the policy learnt in one run does not carry over.
    let adaptive = Arc::new(AdaptivePolicy::new());
    let (outs, started, elapsed, cpu) = thread::scope(|scope| {
        let workers: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let start_line = &start_line;
                let adaptive = Arc::clone(&adaptive);
                scope.spawn(move || worker::<C>(conn, index, case, limits, start_line, adaptive))
            })
            .collect();
        let cpu_before = cpu::snapshot(C::BACKEND);
        start_line.wait();
        let started = Instant::now();
        let outs: Vec<_> = workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(BenchError::Other(format!(
                        "a worker panicked in {}",
                        case.label()
                    )))
                })
            })
            .collect();
        let elapsed = started.elapsed();
        (
            outs,
            started,
            elapsed,
            cpu_before.until(&cpu::snapshot(C::BACKEND)),
        )
    });
    sample(pool, case, outs, (started, elapsed), limits, cpu, &adaptive)
}

fn worker<C: BenchConnection>(
    mut conn: Pooled<C>,
    index: usize,
    case: &Case,
    limits: &Limits,
    start_line: &Barrier,
    adaptive: Arc<AdaptivePolicy>,
) -> Result<WorkerOut, BenchError> {
    let mut run = WorkerLoop::new(index, case, adaptive);
    let prepared = C::prepare_worker(&mut conn, case, &mut run.state);
    start_line.wait();
    prepared?;

    run.start(limits);
    while run.go_on(limits) {
        let started = Instant::now();
        let result = C::op(&mut conn, case, &mut run.state);
        if !run.record(case, started, result) {
            break;
        }
    }
    Ok(run.finish())
}

/// Runs `a` and `b` alternately, `rounds` times `a b b a`, each slice for
/// `limits.run`, and returns each one's slices merged: slow drift (a build
/// starting next door) then hits both alike.
pub fn run_pair<C: BenchConnection>(
    pool: &BenchPool<C>,
    a: &Case,
    b: &Case,
    limits: &Limits,
    rounds: usize,
) -> Result<(Sample, Sample), BenchError> {
    alternate(a, b, rounds, |case| run_case(pool, case, limits))
}

/// Runs `a` and `b` with `run`, `rounds` times `a b b a`, and returns each
/// one's runs merged.
pub fn alternate(
    a: &Case,
    b: &Case,
    rounds: usize,
    mut run: impl FnMut(&Case) -> Result<Sample, BenchError>,
) -> Result<(Sample, Sample), BenchError> {
    let mut merged: [Option<Sample>; 2] = [None, None];
    for _ in 0..rounds.max(1) {
        for side in [0, 1, 1, 0] {
            let sample = run(if side == 0 { a } else { b })?;
            match &mut merged[side] {
                Some(m) => m.merge(&sample),
                slot => *slot = Some(sample),
            }
        }
    }
    let [a, b] = merged;
    Ok((a.expect("ran"), b.expect("ran")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Limits of an hour-long run of at most 10 operations a worker, `jobs` queued.
    fn hour_limits(jobs: i32) -> Limits {
        Limits {
            run: Duration::from_secs(3600),
            max_ops_per_worker: 10,
            jobs,
        }
    }

    /// Worker 0 of `case`, started under `limits`.
    fn started(case: &Case, limits: &Limits) -> WorkerLoop {
        let mut run = WorkerLoop::new(0, case, Arc::new(AdaptivePolicy::new()));
        run.start(limits);
        run
    }

    #[test]
    fn an_operation_ending_after_the_run_counts_for_the_check_not_the_throughput() {
        let case = Case::new(Workload::HotRow, Strategy::Versioned, 1);
        let limits = hour_limits(0);
        let mut run = started(&case, &limits);
        assert!(run.record(&case, Instant::now(), Ok(1)));
        // The run's time is up while the next operation is under way.
        run.deadline = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(run.record(&case, Instant::now(), Ok(1)));
        assert!(!run.go_on(&limits));
        let counts = run.finish().state.counts;
        assert_eq!((counts.successes, counts.units), (2, 2));
        assert_eq!((counts.late_successes, counts.late_units), (1, 1));
    }

    #[test]
    fn a_drained_queue_worker_reports_when_its_last_job_was_done() {
        // The empty claim that tells the worker the queue is empty may take
        // long (SQLite's busy handler): the drain ended with the last job.
        let case = Case::new(Workload::Queue, Strategy::Claim, 1).batch(10);
        let limits = hour_limits(10);
        let mut run = started(&case, &limits);
        assert!(run.record(&case, Instant::now(), Ok(10)));
        let last_job = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!run.record(&case, Instant::now(), Ok(0)));
        let out = run.finish();
        assert!(out.drained);
        let at = out.last_unit.expect("a job was done");
        assert!(at <= last_job, "{:?}", at.duration_since(last_job));
        // A worker stopped by the run's time did not drain the queue.
        let mut run = started(&case, &limits);
        assert!(run.record(&case, Instant::now(), Ok(10)));
        assert!(!run.finish().drained);
    }
}
