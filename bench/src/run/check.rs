//! Whether a run's books balance: what the tables hold afterwards ([`Tally`])
//! against what the workers say they did ([`Check`]).

use super::worker::Counts;
use crate::vocabulary::schema::Item;
use crate::vocabulary::{
    Case, Workload, HOT_ID, INITIAL_STOCK, ORDER_ITEMS, ORDER_ITEM_BASE, OWN_BASE,
};

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
            Workload::Uncontended | Workload::OwnRows => {
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
