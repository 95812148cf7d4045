//! The four workloads, and where their rows are.

/// The four workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Each worker updates its own row (`update_versioned`).
    Uncontended,
    /// All workers decrement one row's stock.
    HotRow,
    /// Workers drain a job table with `SKIP LOCKED`.
    Queue,
    /// Multi-row orders that deadlock when locked in arbitrary order.
    Orders,
    /// Each worker reads and decrements its own row, as the hot row does
    /// (the adaptive strategy's calm case).
    OwnRows,
}

impl Workload {
    /// The name shown in the report.
    pub fn title(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended versioned update",
            Workload::HotRow => "hot row",
            Workload::Queue => "queue drain",
            Workload::Orders => "multi-row orders",
            Workload::OwnRows => "own rows",
        }
    }
}

/// The initial stock of every item: large enough never to run out.
pub const INITIAL_STOCK: i32 = 1_000_000_000;
/// The primary key of the hot row.
pub const HOT_ID: i32 = 1;
/// The first of the order items (`ORDER_ITEMS` rows from here).
pub const ORDER_ITEM_BASE: i32 = 201;
/// How many items the multi-row orders choose from.
pub const ORDER_ITEMS: i32 = 6;
/// The first worker-owned row of the uncontended workload (one per worker from here).
pub const OWN_BASE: i32 = 1001;
/// The most workers any case uses (the pool's size).
pub const MAX_WORKERS: usize = 32;
