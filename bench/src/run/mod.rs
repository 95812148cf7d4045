//! The measurements: [`all`] runs the whole benchmark as [`crate::plan`] says
//! (repetitions outermost, backend by backend; lockkit-versus-hand-written
//! pairs `a b b a` within a repetition, [`run_pair`]) and hands on
//! [`results::Results`].
//!
//! * [`runner`]: one measured run of a case: reset the tables, start the
//!   workers together, stop them, check the books;
//! * [`tasks`]: the same for the diesel-async cases, with the workers as tasks
//!   on a 2-thread tokio runtime over one bb8 pool;
//! * [`ops`]: what a worker does, one file per strategy, per backend;
//! * [`worker`], [`check`], [`sample`]: what a worker counts, whether a run's
//!   books balance, and what one run yields;
//! * [`pgbench`]: the same SQL through `pgbench`;
//! * [`profile`]: client-side cost per call, and instructions by callgrind;
//! * [`cpu`], [`machine`]: where the CPU went, and what it ran on.

pub mod check;
pub mod cpu;
pub mod machine;
pub mod ops;
pub mod pgbench;
pub mod profile;
pub mod results;
pub mod runner;
pub mod sample;
pub mod tasks;
pub mod worker;

use std::time::{Duration, Instant};

use diesel::{MysqlConnection, PgConnection, SqliteConnection};

use crate::db::BenchDb;
use crate::error::BenchError;
use crate::plan::{adaptive_groups, async_paired_cases, paired_cases, single_cases, Settings};
use crate::vocabulary::{report_name, Backend, Case, Client, Limits, MAX_WORKERS};
use machine::{Machine, ServerInfo};
use ops::{BenchConnection, Session};
use pgbench::{Mode, Script};
use results::{Pair, PgbenchPair, Results};
use runner::{pool, run_case, run_pair, BenchPool};
use sample::Sample;
use tasks::Tasks;

struct BackendRun<C: BenchConnection> {
    // Fields drop in order: the pools' connections close before the database goes.
    tasks: Tasks<C::Async>,
    pool: BenchPool<C>,
    db: BenchDb,
}

impl<C: BenchConnection> BackendRun<C> {
    fn open(backend: Backend, session: Session) -> Result<Self, BenchError> {
        let db = BenchDb::create(backend, "run")?;
        let mut conn = C::establish(&db.url)?;
        conn.configure_session(session)?;
        conn.create_schema()?;
        drop(conn);
        let pool = pool::<C>(&db.url, MAX_WORKERS as u32, session)?;
        let tasks = Tasks::open(&db.url, MAX_WORKERS as u32, session)?;
        Ok(BackendRun { tasks, pool, db })
    }

    /// Runs `case` once, on threads or on tasks as it says.
    fn run_case(&self, case: &Case, limits: &Limits) -> Result<Sample, BenchError> {
        match case.client {
            Client::Threads => run_case(&self.pool, case, limits),
            Client::Tasks => tasks::run_case(&self.tasks, &self.pool, case, limits),
        }
    }
}

fn progress(rep: usize, reps: usize, sample: &Sample) {
    eprintln!(
        "[{}/{}] {:<10} {:<70} {:>9.0}/s  p99 {:>8.2} ms  att/ok {:>5.2}  cpu/op {:>5.0}+{:<5}µs {}{}",
        rep + 1,
        reps,
        report_name(sample.backend),
        sample.case.label(),
        sample.throughput(),
        sample.latency_ms(0.99),
        sample.attempts_per_success(),
        sample.client_cpu_us(),
        match sample.server_cpu_us() {
            v if v.is_finite() => format!("{v:.0}"),
            _ => "-".to_owned(),
        },
        if sample.check.ok {
            "ok".to_owned()
        } else {
            format!("LOST {}", sample.check.lost)
        },
        sample
            .first_error
            .as_deref()
            .map(|e| format!("  error: {e}"))
            .unwrap_or_default(),
    );
}

/// Reports a lockkit-versus-hand-written pair and keeps it: both samples, and
/// the pair.
fn record_pair(
    rep: usize,
    settings: &Settings,
    results: &mut Results,
    (lockkit, hand): (Sample, Sample),
) {
    progress(rep, settings.reps, &lockkit);
    progress(rep, settings.reps, &hand);
    results.samples.push(lockkit.clone());
    results.samples.push(hand.clone());
    results.pairs.push(Pair { rep, lockkit, hand });
}

fn run_backend<C: BenchConnection>(
    run: &BackendRun<C>,
    rep: usize,
    settings: &Settings,
    results: &mut Results,
) -> Result<(), BenchError> {
    let wanted = |case: &Case| settings.wants(&case.label());
    for case in paired_cases().into_iter().filter(wanted) {
        let pair = run_pair(
            &run.pool,
            &case,
            &case.hand(),
            &settings.pair_limits,
            settings.pair_rounds,
        )?;
        record_pair(rep, settings, results, pair);
    }
    for case in single_cases().into_iter().filter(wanted) {
        let sample = run_case(&run.pool, &case, &settings.limits)?;
        progress(rep, settings.reps, &sample);
        results.samples.push(sample);
    }
    for (i, group) in adaptive_groups().into_iter().enumerate() {
        if !group.iter().any(wanted) {
            continue;
        }
        // `a b c c b a`, the first turning with the repetition and the group:
        // each strategy runs once in each half and never always right after
        // the same one (a 32-worker `with_lock` run slows the run after it).
        // The two runs of each are merged.
        let n = group.len();
        let mut merged: Vec<Option<Sample>> = (0..n).map(|_| None).collect();
        for k in (0..n).chain((0..n).rev()) {
            let j = (rep + i + k) % n;
            let sample = run_case(&run.pool, &group[j], &settings.limits)?;
            progress(rep, settings.reps, &sample);
            match &mut merged[j] {
                Some(first) => first.merge(&sample),
                empty => *empty = Some(sample),
            }
        }
        results.adaptive.extend(merged.into_iter().flatten());
    }
    for case in async_paired_cases(C::BACKEND).into_iter().filter(wanted) {
        let pair = tasks::run_pair(
            &run.tasks,
            &run.pool,
            &case,
            &case.hand(),
            &settings.pair_limits,
            settings.async_rounds,
        )?;
        record_pair(rep, settings, results, pair);
    }
    Ok(())
}

fn run_pgbench(
    run: &BackendRun<PgConnection>,
    rep: usize,
    settings: &Settings,
    results: &mut Results,
) -> Result<(), BenchError> {
    // lockkit, each pgbench mode, the diesel-async case, each mode again in
    // reverse, lockkit: both clients' runs sit symmetrically around pgbench's.
    let limits = Limits {
        run: Duration::from_secs(u64::from(settings.pgbench_secs)),
        jobs: settings.pgbench_jobs,
        ..settings.limits
    };
    for script in Script::ALL {
        if !settings.wants(&format!("pgbench {}", script.title())) {
            continue;
        }
        let mut lockkit = run_case(&run.pool, &script.case(), &limits)?;
        let mut runs = Vec::new();
        let mut tasks = None;
        for (i, mode) in Mode::ALL
            .iter()
            .chain(Mode::ALL.iter().rev())
            .copied()
            .enumerate()
        {
            if i == Mode::ALL.len() {
                let sample = run.run_case(&script.async_case(), &limits)?;
                progress(rep, settings.reps, &sample);
                tasks = Some(sample);
            }
            let r = pgbench::run(&run.db.url, &run.pool, script, mode, settings)?;
            eprintln!(
                "[{}/{}] PostgreSQL pgbench {:<28} {:<22} {:>9.0}/s  (tps {:.0}, failed {})  cpu/op {:>5.0}+{:<5.0}µs{}",
                rep + 1,
                settings.reps,
                script.title(),
                mode.title(),
                r.units_per_s,
                r.tps,
                r.failed,
                r.client_cpu_us(),
                r.server_cpu_us(),
                if r.ran_dry { "  (queue ran dry)" } else { "" }
            );
            runs.push(r);
        }
        lockkit.merge(&run_case(&run.pool, &script.case(), &limits)?);
        progress(rep, settings.reps, &lockkit);
        results.pgbench.push(PgbenchPair {
            rep,
            script,
            lockkit,
            tasks,
            pgbench: runs,
        });
    }
    Ok(())
}

/// Runs everything `settings` asks for.
pub fn all(settings: Settings) -> Result<Results, BenchError> {
    let started = Instant::now();
    let session = Session {
        durable: settings.durable,
    };
    let mut results = Results {
        machine: Machine::read(),
        settings: settings.clone(),
        samples: Vec::new(),
        pairs: Vec::new(),
        adaptive: Vec::new(),
        pgbench: Vec::new(),
        servers: Vec::new(),
        profile: Vec::new(),
        callgrind: Vec::new(),
        wall: Duration::ZERO,
        notes: Vec::new(),
    };
    let mut settings = settings;
    if settings.pgbench && pgbench::binary().is_none() {
        let note = "pgbench was not found (PATH, /usr/lib/postgresql/*/bin, PGBENCH): \
                    the pgbench comparison was skipped.";
        eprintln!("lockkit-bench: {note}");
        results.notes.push(note.to_owned());
        settings.pgbench = false;
    }
    if settings.callgrind_ops > 0 && profile::callgrind::valgrind().is_none() {
        let note = "valgrind was not found: the instruction counts were skipped \
                    (apt-get install valgrind).";
        eprintln!("lockkit-bench: {note}");
        results.notes.push(note.to_owned());
        settings.callgrind_ops = 0;
    }
    results.settings = settings.clone();
    let has = |b| settings.backends.contains(&b);
    let pg = has(Backend::Postgres)
        .then(|| BackendRun::<PgConnection>::open(Backend::Postgres, session))
        .transpose()?;
    let my = has(Backend::Mysql)
        .then(|| BackendRun::<MysqlConnection>::open(Backend::Mysql, session))
        .transpose()?;
    let lite = has(Backend::Sqlite)
        .then(|| BackendRun::<SqliteConnection>::open(Backend::Sqlite, session))
        .transpose()?;
    if let Some(r) = &pg {
        results
            .servers
            .push(ServerInfo::postgres(&mut *r.pool.get()?)?);
    }
    if let Some(r) = &my {
        results
            .servers
            .push(ServerInfo::mysql(&mut *r.pool.get()?)?);
    }
    if let Some(r) = &lite {
        results
            .servers
            .push(ServerInfo::sqlite(&mut *r.pool.get()?)?);
    }

    for rep in 0..settings.reps {
        if let Some(r) = &pg {
            run_backend(r, rep, &settings, &mut results)?;
            if settings.pgbench {
                run_pgbench(r, rep, &settings, &mut results)?;
            }
        }
        if let Some(r) = &my {
            run_backend(r, rep, &settings, &mut results)?;
        }
        if let Some(r) = &lite {
            run_backend(r, rep, &settings, &mut results)?;
        }
    }
    drop((pg, my, lite));

    if settings.profile_ops > 0 {
        results.profile = profile::run_all(settings.profile_ops)?;
    }
    if settings.callgrind_ops > 0 && settings.only.is_none() {
        results.callgrind =
            profile::callgrind::run_all(&settings.backends, settings.callgrind_ops)?;
    }
    results.machine.load_after = machine::loadavg();
    results.wall = started.elapsed();
    Ok(results)
}

/// Runs one case once on a fresh database of `backend`, with the default
/// session settings, on threads or tasks as the case says (the smoke test's
/// entry).
pub fn one(backend: Backend, case: &Case, limits: &Limits) -> Result<Sample, BenchError> {
    fn go<C: BenchConnection>(
        backend: Backend,
        case: &Case,
        limits: &Limits,
    ) -> Result<Sample, BenchError> {
        BackendRun::<C>::open(backend, Session::default())?.run_case(case, limits)
    }
    match backend {
        Backend::Postgres => go::<PgConnection>(backend, case, limits),
        Backend::Mysql => go::<MysqlConnection>(backend, case, limits),
        Backend::Sqlite => go::<SqliteConnection>(backend, case, limits),
    }
}
