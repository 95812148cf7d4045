//! The words of the benchmark: the backends, the workloads, the strategies, a
//! case (one measured configuration) and the tables they run on. Every later
//! stage (plan, run, analysis, report) speaks in these; this module needs none
//! of them.
//!
//! [`Backend`] is the workspace's (`lockkit_tests::support::Backend`), through
//! [`crate::db`]; [`report_name`] is the name the report gives it.

pub mod case;
pub mod schema;
pub mod strategy;
pub mod workload;

pub use crate::db::{report_name, Backend};
pub use case::{Case, Limits};
pub use strategy::{Client, Flavor, Retry, Strategy};
pub use workload::{
    Workload, HOT_ID, INITIAL_STOCK, MAX_WORKERS, ORDER_ITEMS, ORDER_ITEM_BASE, OWN_BASE,
};
