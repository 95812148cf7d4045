//! The words of the benchmark: the backends, the workloads, the strategies, a
//! case (one measured configuration) and the tables they run on. Every later
//! stage (plan, run, analysis, report) speaks in these; this module needs none
//! of them.
//!
//! [`Backend`] is defined in [`crate::db`], with the other helpers that have
//! twins in the workspace's other crates.

pub mod case;
pub mod schema;
pub mod strategy;
pub mod workload;

pub use crate::db::Backend;
pub use case::{Case, Limits};
pub use strategy::{Client, Flavor, Retry, Strategy};
pub use workload::{
    Workload, HOT_ID, INITIAL_STOCK, MAX_WORKERS, ORDER_ITEMS, ORDER_ITEM_BASE, OWN_BASE,
};
