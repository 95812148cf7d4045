//! Instructions per call, counted by `valgrind --tool=callgrind` when it is
//! installed: the benchmark runs itself (`--profile-only`) under callgrind,
//! collecting only inside [`measured_loop`](crate::run::profile::measured_loop), once per
//! side of each comparison. Instruction counts do not move with the machine's
//! load, so they show differences of a few percent that wall-clock runs on a
//! busy two-core machine cannot.

use std::path::PathBuf;
use std::process::Command;

use crate::error::BenchError;
use crate::run::profile::{comparisons, side_name};
use crate::vocabulary::{report_name, Backend, Case, Strategy};

/// One comparison on one backend.
#[derive(Debug, Clone)]
pub struct CallgrindRow {
    /// The backend.
    pub backend: Backend,
    /// What is compared.
    pub name: &'static str,
    /// What the other side is.
    pub other_title: &'static str,
    /// Client instructions per lockkit call.
    pub lockkit: f64,
    /// Client instructions per call of the other side.
    pub other: f64,
}

/// `valgrind`, if it is on the `PATH`.
pub fn valgrind() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("valgrind"))
        .find(|p| p.is_file())
}

/// The comparisons worth counting on `backend` (all of them on SQLite; the
/// servers skip the ones whose client side is the same code).
fn wanted(backend: Backend, lockkit: &Case) -> bool {
    backend == Backend::Sqlite
        || matches!(
            (lockkit.strategy, lockkit.batch),
            (Strategy::Versioned, _)
                | (Strategy::WithLock, _)
                | (Strategy::Atomic, _)
                | (Strategy::Claim, 10)
                | (Strategy::LockAll, _)
                | (Strategy::Adaptive, _)
        )
}

/// Instructions per call of one side.
fn count(valgrind: &PathBuf, backend: Backend, case: &Case, ops: u64) -> Result<f64, BenchError> {
    let exe = std::env::current_exe()?;
    let output = Command::new(valgrind)
        .args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--collect-atstart=no",
            "--toggle-collect=*measured_loop*",
        ])
        .arg(&exe)
        .args([
            "--backends",
            backend.name(),
            "--profile-only",
            &side_name(case),
            "--ops",
            &ops.to_string(),
        ])
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let collected = stderr
        .lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok());
    match (output.status.success(), collected) {
        (true, Some(n)) => Ok(n / ops as f64),
        _ => Err(BenchError::Other(format!(
            "callgrind run of {} on {} failed: {stderr}",
            side_name(case),
            report_name(backend)
        ))),
    }
}

/// Counts every wanted comparison on `backends`.
pub fn run_all(backends: &[Backend], ops: u64) -> Result<Vec<CallgrindRow>, BenchError> {
    let Some(valgrind) = valgrind() else {
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    for &backend in backends {
        for (name, lockkit, other, other_title) in comparisons() {
            if !wanted(backend, &lockkit) {
                continue;
            }
            let l = count(&valgrind, backend, &lockkit, ops)?;
            let o = count(&valgrind, backend, &other, ops)?;
            eprintln!(
                "callgrind {:<10} {name:<26} lockkit {l:>9.0} | {other_title} {o:>9.0} instructions/call ({:+.1}%)",
                report_name(backend),
                (l / o - 1.0) * 100.0
            );
            rows.push(CallgrindRow {
                backend,
                name,
                other_title,
                lockkit: l,
                other: o,
            });
        }
    }
    Ok(rows)
}
