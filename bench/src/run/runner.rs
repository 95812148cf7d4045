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

struct WorkerOut {
    state: WorkerState,
    hist: Histogram<u64>,
    first_error: Option<String>,
}

/// Runs `case` once on a fresh set of rows and checks the result.
pub fn run_case<C: BenchConnection>(
    pool: &BenchPool<C>,
    case: &Case,
    limits: &Limits,
) -> Result<Sample, BenchError> {
    {
        let mut setup = pool.get()?;
        setup.reset_items()?;
        if case.workload == Workload::Queue {
            setup.reset_jobs(limits.jobs)?;
        }
    }

    // Every worker gets its connection before the start line, so a pool failure is
    // an error here and not a thread stuck at the barrier.
    let conns = (0..case.workers)
        .map(|_| pool.get())
        .collect::<Result<Vec<_>, _>>()?;
    let start_line = Barrier::new(case.workers + 1);
    // Each run starts calm: what the policy learnt in one run does not carry over.
    let adaptive = Arc::new(AdaptivePolicy::new());
    let (outs, elapsed, cpu) = thread::scope(|scope| {
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
        let outs: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        let elapsed = started.elapsed();
        (outs, elapsed, cpu_before.until(&cpu::snapshot(C::BACKEND)))
    });

    let mut counts = Counts::default();
    let mut hist = histogram();
    let mut claimed = Vec::new();
    let mut first_error = None;
    for out in outs {
        let out =
            out.map_err(|_| BenchError::Other(format!("a worker panicked in {}", case.label())))??;
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
        counts,
        hist,
        check,
        first_error,
        cpu,
    })
}

fn worker<C: BenchConnection>(
    mut conn: Pooled<C>,
    index: usize,
    case: &Case,
    limits: &Limits,
    start_line: &Barrier,
    adaptive: Arc<AdaptivePolicy>,
) -> Result<WorkerOut, BenchError> {
    let mut state = WorkerState::new(index, case.retry.policy(), adaptive);
    let mut hist = histogram();
    let mut first_error = None;
    let prepared = C::prepare_worker(&mut conn, case, &mut state);
    start_line.wait();
    prepared?;

    let deadline = Instant::now() + limits.run;
    let mut ops = 0;
    let mut consecutive_errors = 0;
    while ops < limits.max_ops_per_worker && Instant::now() < deadline {
        ops += 1;
        let started = Instant::now();
        match C::op(&mut conn, case, &mut state) {
            Ok(0) if case.workload == Workload::Queue => break, // drained
            Ok(units) => {
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                hist.saturating_record(micros.max(1));
                state.counts.successes += 1;
                state.counts.units += units as u64;
                consecutive_errors = 0;
            }
            Err(OpError::GaveUp) => state.counts.gave_up += 1,
            Err(err) => {
                state.counts.errors += 1;
                if first_error.is_none() {
                    first_error = Some(err.to_string());
                }
                consecutive_errors += 1;
                if consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                    break;
                }
            }
        }
    }
    Ok(WorkerOut {
        state,
        hist,
        first_error,
    })
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
    let mut merged: [Option<Sample>; 2] = [None, None];
    for _ in 0..rounds.max(1) {
        for side in [0, 1, 1, 0] {
            let sample = run_case(pool, if side == 0 { a } else { b }, limits)?;
            match &mut merged[side] {
                Some(m) => m.merge(&sample),
                slot => *slot = Some(sample),
            }
        }
    }
    let [a, b] = merged;
    Ok((a.expect("ran"), b.expect("ran")))
}
