//! Client-side cost per call: each lockkit call and its hand-written twin, one
//! thread, on an in-memory SQLite database, so that no network or disk hides what
//! the library itself costs. Reports nanoseconds and heap allocations per call
//! (the binary counts allocations with [`crate::run::profile::alloc::Counting`]).
//!
//! `lockkit-bench --profile-only NAME [--ops N]` runs one side alone, for
//! `valgrind --tool=callgrind`.

pub mod alloc;
pub mod callgrind;

use std::time::Instant;

use diesel::{Connection, SqliteConnection};

use crate::db::BenchDb;
use crate::error::BenchError;
use crate::run::ops::{BenchConnection, Session};
use crate::run::profile::alloc::{allocated_bytes, allocations};
use crate::run::worker::{OpError, WorkerState};
use crate::vocabulary::{Backend, Case, Flavor, Strategy, Workload};

/// One compared call.
#[derive(Debug, Clone)]
pub struct ProfileRow {
    /// What is compared.
    pub name: &'static str,
    /// The lockkit side.
    pub lockkit: Case,
    /// What it is compared with.
    pub other: Case,
    /// What the other side is.
    pub other_title: &'static str,
    /// Nanoseconds per call, lockkit (best of the rounds).
    pub lockkit_ns: f64,
    /// Nanoseconds per call, the other side.
    pub other_ns: f64,
    /// Allocations per call, lockkit.
    pub lockkit_allocs: f64,
    /// Allocations per call, the other side.
    pub other_allocs: f64,
    /// Bytes allocated per call, lockkit.
    pub lockkit_bytes: f64,
    /// Bytes allocated per call, the other side.
    pub other_bytes: f64,
}

/// The comparisons: (name, lockkit case, other case, what the other is).
pub fn comparisons() -> Vec<(&'static str, Case, Case, &'static str)> {
    let hot = |s| Case::new(Workload::HotRow, s, 1);
    let own = Case::new(Workload::Uncontended, Strategy::Versioned, 1);
    let mut v = vec![
        ("update_versioned", own, own.hand(), "hand-written"),
        (
            "update_versioned",
            own,
            Case {
                flavor: Flavor::HandCached,
                ..own
            },
            "hand-written, cacheable",
        ),
        (
            "update_versioned",
            own,
            Case {
                flavor: Flavor::HandNext,
                ..own
            },
            "hand-written, binds the next version",
        ),
        (
            "update_versioned",
            own,
            Case {
                flavor: Flavor::Peer,
                ..own
            },
            "diesel_versioning 0.1.1",
        ),
        (
            "read + update_versioned",
            hot(Strategy::Optimistic),
            hot(Strategy::Optimistic).hand(),
            "hand-written",
        ),
        (
            "with_lock",
            hot(Strategy::WithLock),
            hot(Strategy::WithLock).hand(),
            "hand-written",
        ),
        (
            "atomic::update_if",
            hot(Strategy::Atomic),
            hot(Strategy::Atomic).hand(),
            "hand-written",
        ),
    ];
    for batch in [1, 10] {
        let claim = Case::new(Workload::Queue, Strategy::Claim, 1).batch(batch);
        v.push((
            if batch == 1 {
                "queue::claim (batch 1)"
            } else {
                "queue::claim (batch 10)"
            },
            claim,
            claim.hand(),
            "hand-written",
        ));
    }
    v.push((
        "lock_all (2-3 rows)",
        Case::new(Workload::Orders, Strategy::LockAll, 1),
        Case::new(Workload::Orders, Strategy::NaiveOrder, 1),
        "row by row",
    ));
    v.push((
        "adaptive (calm row)",
        hot(Strategy::Adaptive),
        hot(Strategy::Optimistic),
        "lockkit read + update_versioned",
    ));
    v.push((
        "with_lock(nowait)",
        hot(Strategy::Nowait),
        hot(Strategy::WithLock),
        "lockkit with_lock",
    ));
    v
}

/// The name `--profile-only` takes for one side of a comparison.
pub fn side_name(case: &Case) -> String {
    let strategy = format!("{:?}", case.strategy).to_lowercase();
    let flavor = match case.flavor {
        Flavor::Lockkit => "lockkit",
        Flavor::Hand => "hand",
        Flavor::HandCached => "cacheable",
        Flavor::HandNext => "handnext",
        Flavor::Peer => "peer",
    };
    match case.workload {
        Workload::Queue => format!("{strategy}{}-{flavor}", case.batch),
        _ => format!("{strategy}-{flavor}"),
    }
}

/// Every side `--profile-only` accepts.
pub fn side_names() -> Vec<String> {
    let mut names: Vec<String> = comparisons()
        .iter()
        .flat_map(|(_, a, b, _)| [side_name(a), side_name(b)])
        .collect();
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// A fresh in-memory database with the benchmark's tables.
fn memory_db() -> Result<SqliteConnection, BenchError> {
    let mut conn = SqliteConnection::establish(":memory:")?;
    conn.configure_session(Session::default())?;
    conn.create_schema()?;
    Ok(conn)
}

/// Nanoseconds, allocations and bytes per call of `ops` calls of `case`.
pub fn measure<C: BenchConnection>(
    conn: &mut C,
    case: &Case,
    ops: u64,
) -> Result<(f64, f64, f64), BenchError> {
    let warmup = (ops / 10).clamp(10, 500);
    conn.reset_items()?;
    if case.workload == Workload::Queue {
        let jobs = (ops + warmup + 1) * case.batch as u64;
        conn.reset_jobs(i32::try_from(jobs).unwrap_or(i32::MAX))?;
    }
    let mut st = WorkerState::new(0, case.retry.policy(), Default::default());
    conn.prepare_worker(case, &mut st)?;
    for _ in 0..warmup {
        // Not `measured_loop`: callgrind must not count the warm-up.
        conn.op(case, &mut st)
            .map_err(|e| BenchError::Other(format!("warm-up: {e}")))?;
    }
    let (allocs, bytes) = (allocations(), allocated_bytes());
    let started = Instant::now();
    measured_loop(conn, case, &mut st, ops)?;
    let elapsed = started.elapsed();
    let n = ops as f64;
    Ok((
        elapsed.as_nanos() as f64 / n,
        (allocations() - allocs) as f64 / n,
        (allocated_bytes() - bytes) as f64 / n,
    ))
}

/// `ops` calls of `case`. Never inlined: callgrind collects inside it only
/// (`--toggle-collect=*measured_loop*`), so setup and warm-up are not counted.
#[inline(never)]
pub fn measured_loop<C: BenchConnection>(
    conn: &mut C,
    case: &Case,
    st: &mut WorkerState,
    ops: u64,
) -> Result<(), BenchError> {
    for _ in 0..ops {
        match conn.op(case, st) {
            Ok(n) if n > 0 => {}
            Ok(_) => return Err(BenchError::Other("the profile's queue ran dry".into())),
            Err(OpError::Lockkit(e)) => return Err(e.into()),
            Err(e) => return Err(BenchError::Other(e.to_string())),
        }
    }
    Ok(())
}

/// Runs every comparison: three rounds, alternating sides; the best time of each.
pub fn run_all(ops: u64) -> Result<Vec<ProfileRow>, BenchError> {
    let mut conn = memory_db()?;
    let mut rows = Vec::new();
    for (name, lockkit, other, other_title) in comparisons() {
        let mut best = [(f64::INFINITY, 0.0, 0.0); 2];
        for round in 0..3 {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                let case = if side == 0 { &lockkit } else { &other };
                let m = measure(&mut conn, case, ops)?;
                if m.0 < best[side].0 {
                    best[side] = m;
                }
            }
        }
        eprintln!(
            "profile {name:<26} lockkit {:>8.0} ns {:>5.1} allocs | {other_title} {:>8.0} ns {:>5.1} allocs",
            best[0].0, best[0].1, best[1].0, best[1].1
        );
        rows.push(ProfileRow {
            name,
            lockkit,
            other,
            other_title,
            lockkit_ns: best[0].0,
            other_ns: best[1].0,
            lockkit_allocs: best[0].1,
            other_allocs: best[1].1,
            lockkit_bytes: best[0].2,
            other_bytes: best[1].2,
        });
    }
    Ok(rows)
}

/// Runs one side alone (`--profile-only`), for an external profiler: on an
/// in-memory SQLite database, or over one connection to a fresh database on a
/// server (the client's instructions are the same; the wait is not counted).
pub fn run_one(
    name: &str,
    ops: u64,
    backend: Backend,
    session: Session,
) -> Result<(f64, f64, f64), BenchError> {
    let case = comparisons()
        .into_iter()
        .flat_map(|(_, a, b, _)| [a, b])
        .find(|c| side_name(c) == name)
        .ok_or_else(|| {
            BenchError::Other(format!(
                "unknown profile case {name}; one of: {}",
                side_names().join(", ")
            ))
        })?;
    fn on<C: BenchConnection>(
        backend: Backend,
        session: Session,
        case: &Case,
        ops: u64,
    ) -> Result<(f64, f64, f64), BenchError> {
        let db = BenchDb::create(backend, "profile")?;
        let mut conn = C::establish(&db.url)?;
        conn.configure_session(session)?;
        conn.create_schema()?;
        let result = measure(&mut conn, case, ops);
        drop(conn);
        drop(db);
        result
    }
    match backend {
        Backend::Sqlite => measure(&mut memory_db()?, &case, ops),
        Backend::Postgres => on::<diesel::PgConnection>(backend, session, &case, ops),
        Backend::Mysql => on::<diesel::MysqlConnection>(backend, session, &case, ops),
    }
}
