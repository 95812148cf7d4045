//! Everything one benchmark run measured, as the run hands it to the analysis.

use std::time::Duration;

use super::machine::{Machine, ServerInfo};
use super::pgbench::{PgbenchRun, Script};
use super::profile::callgrind::CallgrindRow;
use super::profile::ProfileRow;
use super::sample::Sample;
use crate::plan::Settings;

/// A lockkit-versus-hand-written pair from one repetition.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The repetition.
    pub rep: usize,
    /// Through lockkit.
    pub lockkit: Sample,
    /// Hand-written.
    pub hand: Sample,
}

/// lockkit and pgbench on the same SQL, from one repetition.
#[derive(Debug, Clone)]
pub struct PgbenchPair {
    /// The repetition.
    pub rep: usize,
    /// The script.
    pub script: Script,
    /// lockkit (two runs, merged).
    pub lockkit: Sample,
    /// The diesel-async case of the script ([`Script::async_case`]), run once
    /// between pgbench's modes; `None` when it did not run.
    pub tasks: Option<Sample>,
    /// pgbench (two runs per mode).
    pub pgbench: Vec<PgbenchRun>,
}

/// Everything one benchmark run measured.
#[derive(Debug)]
pub struct Results {
    /// How it ran.
    pub settings: Settings,
    /// Every measured run (the lockkit and hand-written halves of pairs too).
    pub samples: Vec<Sample>,
    /// The pairs.
    pub pairs: Vec<Pair>,
    /// The adaptive strategy's groups: its runs and those of the fixed
    /// strategies beside it, kept apart from `samples`.
    pub adaptive: Vec<Sample>,
    /// The pgbench comparisons.
    pub pgbench: Vec<PgbenchPair>,
    /// The machine.
    pub machine: Machine,
    /// The servers' versions and settings.
    pub servers: Vec<ServerInfo>,
    /// Client-side cost per call (SQLite in memory).
    pub profile: Vec<ProfileRow>,
    /// Client instructions per call, by callgrind.
    pub callgrind: Vec<CallgrindRow>,
    /// Wall time of the whole run.
    pub wall: Duration,
    /// What was skipped, and why.
    pub notes: Vec<String>,
}

impl Results {
    /// Every measured run: `samples`, the adaptive groups' runs, and the
    /// lockkit and diesel-async runs beside pgbench.
    pub fn all_samples(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter().chain(&self.adaptive).chain(
            self.pgbench
                .iter()
                .flat_map(|p| std::iter::once(&p.lockkit).chain(&p.tasks)),
        )
    }

    /// The runs of strategies meant to lose nothing (all but naive; lockkit's
    /// and hand-written) whose books did not balance.
    pub fn failed_checks(&self) -> Vec<&Sample> {
        self.all_samples()
            .filter(|s| s.case.strategy.is_safe() && !s.check.ok)
            .collect()
    }
}
