//! What every section reads: the results, their summaries per (backend, case),
//! and the backends that ran, in report order.

use std::collections::BTreeMap;

use crate::analysis::statistics::{summaries, summarize, Summary};
use crate::run::results::Results;
use crate::vocabulary::{Backend, Case, Strategy, Workload};

/// The input of every section.
pub(super) struct Report<'a> {
    /// Everything the run measured.
    pub(super) results: &'a Results,
    /// The summary of every (backend, case) that ran.
    pub(super) sums: BTreeMap<(Backend, Case), Summary>,
    /// The same for the adaptive groups' runs.
    pub(super) adaptive: BTreeMap<(Backend, Case), Summary>,
    /// The backends that ran, in report order.
    pub(super) backends: Vec<Backend>,
}

impl<'a> Report<'a> {
    /// Summarises `results` once for all sections.
    pub(super) fn new(results: &'a Results) -> Self {
        Report {
            results,
            sums: summaries(results),
            adaptive: summarize(&results.adaptive),
            backends: Backend::ALL
                .into_iter()
                .filter(|b| results.settings.backends.contains(b))
                .collect(),
        }
    }

    /// The summary of `case` on `backend`, if it ran.
    pub(super) fn get(&self, backend: Backend, case: &Case) -> Option<&Summary> {
        self.sums.get(&(backend, *case))
    }
}

/// The hot-row case of `strategy` with `workers` workers.
pub(super) fn hot(strategy: Strategy, workers: usize) -> Case {
    Case::new(Workload::HotRow, strategy, workers)
}
