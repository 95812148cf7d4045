//! One measured run: reset the tables, start the workers together, let each loop
//! until its count or the time limit runs out, then read the tables back and check
//! that nothing was lost. Generic over the backend; the per-backend parts are
//! [`BenchConnection`]'s methods.

use std::fmt;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
use hdrhistogram::Histogram;

use crate::run::cpu::{self, micros_per, Cpu};
use crate::run::ops::BenchConnection;
use crate::vocabulary::schema::Item;
use crate::{
    Backend, BenchError, Case, Limits, Workload, HOT_ID, INITIAL_STOCK, ORDER_ITEMS,
    ORDER_ITEM_BASE, OWN_BASE,
};

/// The pool every run of one backend uses.
pub type BenchPool<C> = Pool<ConnectionManager<C>>;

/// A worker's connection.
pub type Pooled<C> = PooledConnection<ConnectionManager<C>>;

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

    fn add(&mut self, o: &Counts) {
        self.successes += o.successes;
        self.units += o.units;
        self.attempts += o.attempts;
        self.stale += o.stale;
        self.busy += o.busy;
        self.deadlocks += o.deadlocks;
        self.lock_timeouts += o.lock_timeouts;
        self.gave_up += o.gave_up;
        self.errors += o.errors;
    }
}

/// Why an operation failed.
#[derive(Debug)]
pub enum OpError {
    /// A lockkit error.
    Lockkit(lockkit::Error),
    /// A Diesel error (hand-written code).
    Diesel(diesel::result::Error),
    /// The retries ran out.
    GaveUp,
    /// Anything else (a hand-written check).
    Other(String),
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::Lockkit(e) => write!(f, "{e}"),
            OpError::Diesel(e) => write!(f, "{e}"),
            OpError::GaveUp => f.write_str("retries exhausted"),
            OpError::Other(e) => f.write_str(e),
        }
    }
}

impl From<lockkit::Error> for OpError {
    fn from(e: lockkit::Error) -> Self {
        match e {
            lockkit::Error::RetriesExhausted { .. } => OpError::GaveUp,
            e => OpError::Lockkit(e),
        }
    }
}

impl From<diesel::result::Error> for OpError {
    fn from(e: diesel::result::Error) -> Self {
        OpError::Diesel(e)
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
}

impl WorkerState {
    /// A fresh state for worker `index`.
    pub fn new(index: usize, policy: lockkit::RetryPolicy) -> Self {
        WorkerState {
            index,
            rng: fastrand::Rng::with_seed(0x5eed_0000 + index as u64),
            own: None,
            policy,
            counts: Counts::default(),
            claimed: Vec::new(),
        }
    }
}

/// What the tables hold after a run.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// The hot row's stock.
    pub hot_stock: i64,
    /// Units taken from the order items.
    pub orders_taken: i64,
    /// Per worker-owned row: (id, units taken, version).
    pub own: Vec<(i32, i64, i64)>,
    /// Jobs marked done.
    pub jobs_done: i64,
}

impl Tally {
    /// Builds the tally from every item row and the count of done jobs.
    pub fn from_rows(rows: &[Item], jobs_done: i64) -> Tally {
        let mut tally = Tally {
            jobs_done,
            ..Tally::default()
        };
        let taken = |row: &Item| i64::from(INITIAL_STOCK) - i64::from(row.stock);
        for row in rows {
            if row.id == HOT_ID {
                tally.hot_stock = i64::from(row.stock);
            } else if (ORDER_ITEM_BASE..ORDER_ITEM_BASE + ORDER_ITEMS).contains(&row.id) {
                tally.orders_taken += taken(row);
            } else if row.id >= OWN_BASE {
                tally
                    .own
                    .push((row.id, taken(row), i64::from(row.lock_version)));
            }
        }
        tally
    }
}

/// The correctness line of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Whether the books balance.
    pub ok: bool,
    /// Updates lost (hot row) or jobs run twice (queue); 0 when `ok`.
    pub lost: i64,
    /// The line, with its numbers (of the first slice, when merged).
    pub detail: String,
    /// How many runs were checked (merged slices of a pair).
    pub slices: usize,
}

impl Check {
    /// Checks a run's tally against what the workers say they did.
    pub fn of(case: &Case, counts: &Counts, tally: &Tally, claimed: &[i32]) -> Check {
        let units = counts.units as i64;
        match case.workload {
            Workload::Uncontended => {
                let rows = &tally.own[..case.workers.min(tally.own.len())];
                let taken: i64 = rows.iter().map(|r| r.1).sum();
                let versions: i64 = rows.iter().map(|r| r.2).sum();
                let ok = taken == units && versions == units;
                Check {
                    ok,
                    lost: units - taken,
                    detail: format!("{units} updates = stock taken {taken} = versions {versions}"),
                    slices: 1,
                }
            }
            Workload::HotRow => {
                let stock = tally.hot_stock;
                let initial = i64::from(INITIAL_STOCK);
                let lost = stock - (initial - units);
                Check {
                    ok: lost == 0,
                    lost,
                    detail: format!(
                        "sold {units} + stock {stock} = {} (initial {initial})",
                        units + stock
                    ),
                    slices: 1,
                }
            }
            Workload::Queue => {
                let mut ids = claimed.to_vec();
                ids.sort_unstable();
                let claimed_count = ids.len() as i64;
                ids.dedup();
                let distinct = ids.len() as i64;
                let ok = claimed_count == distinct && distinct == tally.jobs_done;
                Check {
                    ok,
                    lost: claimed_count - distinct,
                    detail: format!(
                        "{claimed_count} jobs run, {distinct} distinct, {} marked done",
                        tally.jobs_done
                    ),
                    slices: 1,
                }
            }
            Workload::Orders => {
                let taken = tally.orders_taken;
                Check {
                    ok: taken == units,
                    lost: units - taken,
                    detail: format!("{units} order lines = stock taken {taken}"),
                    slices: 1,
                }
            }
        }
    }
}

/// One measured run (or the merge of a few slices of the same case).
#[derive(Debug, Clone)]
pub struct Sample {
    /// The backend.
    pub backend: Backend,
    /// The case.
    pub case: Case,
    /// Wall time from the start line until the last worker stopped.
    pub elapsed: Duration,
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
        match self.case.workload {
            Workload::Queue => self.counts.units as f64,
            _ => self.counts.successes as f64,
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

    /// Completed operations per second (queue: jobs per second).
    pub fn throughput(&self) -> f64 {
        self.done() / self.elapsed.as_secs_f64().max(1e-9)
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

/// Applies the backend's session settings to every connection the pool opens.
#[derive(Debug)]
struct Session;

impl<C: BenchConnection> CustomizeConnection<C, diesel::r2d2::Error> for Session {
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        conn.configure_session()
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// A pool of `size` connections to `url` with the session settings.
pub fn pool<C: BenchConnection>(url: &str, size: u32) -> Result<BenchPool<C>, BenchError> {
    Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(30))
        .connection_customizer(Box::new(Session))
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
    let (outs, elapsed, cpu) = thread::scope(|scope| {
        let workers: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let start_line = &start_line;
                scope.spawn(move || worker::<C>(conn, index, case, limits, start_line))
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
) -> Result<WorkerOut, BenchError> {
    let mut state = WorkerState::new(index, case.retry.policy());
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
