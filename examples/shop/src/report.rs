//! What a run left in the database, and the table the program prints.

use std::time::Duration;

use crate::{Backend, Strategy};

/// The result of one [`run`](crate::run). Orders, units sold and the stock left
/// are counted from the database after all buyers finished; conflicts, deadlocks,
/// retries and exhaustions are what the buyers saw on the way.
///
/// Stock figures are totals over every item on sale: one item for the single-item
/// strategies, [`Config::items`](crate::Config::items) for the basket ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The strategy played.
    pub strategy: Strategy,
    /// The backend it ran on.
    pub backend: Backend,
    /// Number of buyer threads.
    pub buyers: usize,
    /// Number of items on sale.
    pub items: usize,
    /// Stock at the start, all items together.
    pub initial_stock: i64,
    /// What the database holds after the run.
    pub tally: Tally,
    /// Writes that lost a race and were refused: stale version-checked writes
    /// (`optimistic`) or rows found locked under `NOWAIT` (`nowait`).
    pub conflicts: u64,
    /// Transactions the server aborted to break a deadlock (`basket-naive`).
    pub deadlocks: u64,
    /// Attempts after the first, made by `lockkit::retry`.
    pub retries: u64,
    /// Purchases abandoned because the retries ran out.
    pub exhausted: u64,
    /// Wall-clock time from the start signal to the last buyer's return.
    pub elapsed: Duration,
    /// Something about the run the table does not show (e.g. a setting the
    /// server refused).
    pub note: Option<String>,
}

/// What the database holds after a [`run`](crate::run), counted once all
/// buyers finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Accepted orders: rows in `orders` for a single-item strategy, distinct
    /// `basket_id`s (whole baskets) for a basket strategy.
    pub orders: i64,
    /// Units sold (sum of `orders.qty`).
    pub units_sold: i64,
    /// Stock left at the end, all items together.
    pub final_stock: i64,
    /// The smallest stock left of any one item (negative would be a bug).
    pub lowest_stock: i64,
    /// Rows in `orders`: one per item sold (a basket has one per line).
    pub order_lines: i64,
    /// How often the items' versions moved (sum of `lock_version`). Every
    /// strategy but `naive` moves the version of each item it sells, so that
    /// a versioned writer that read the item before (an edit form) is refused
    /// instead of writing the old stock back.
    pub version_moves: i64,
}

impl Report {
    /// Units sold that were never in stock: `units_sold + final_stock -
    /// initial_stock`. Every lost update adds the quantity it overwrote; 0 means the
    /// stock and the orders agree.
    pub fn oversold(&self) -> i64 {
        self.tally.units_sold + self.tally.final_stock - self.initial_stock
    }

    /// Whether stock and orders agree (`oversold() == 0`) and no item's stock is
    /// negative.
    pub fn is_consistent(&self) -> bool {
        self.oversold() == 0 && self.tally.lowest_stock >= 0
    }
}

const HEADERS: [&str; 12] = [
    "strategy",
    "items",
    "orders",
    "initial",
    "sold",
    "final stock",
    "oversold",
    "conflicts",
    "deadlocks",
    "retries",
    "exhausted",
    "elapsed",
];

/// The reports as an aligned text table, one row per report, with a header and
/// a rule under it; every line ends with `\n`.
///
/// `orders` are whole baskets for the basket strategies; `initial`, `sold` and
/// `final stock` are units summed over all items; `conflicts` are stale writes
/// (`optimistic`) or busy rows (`nowait`); `deadlocks` are transactions the
/// server aborted (`basket-naive`).
pub fn format_table(reports: &[Report]) -> String {
    let rows: Vec<[String; 12]> = reports
        .iter()
        .map(|r| {
            [
                r.strategy.to_string(),
                r.items.to_string(),
                r.tally.orders.to_string(),
                r.initial_stock.to_string(),
                r.tally.units_sold.to_string(),
                r.tally.final_stock.to_string(),
                r.oversold().to_string(),
                r.conflicts.to_string(),
                r.deadlocks.to_string(),
                r.retries.to_string(),
                r.exhausted.to_string(),
                format!("{:.3} s", r.elapsed.as_secs_f64()),
            ]
        })
        .collect();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }

    let mut out = String::new();
    let header = HEADERS.map(String::from);
    for (n, row) in std::iter::once(&header).chain(&rows).enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, width))| {
                if i == 0 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if n == 0 {
            let total = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(strategy: Strategy, sold: i64, left: i64) -> Report {
        Report {
            strategy,
            backend: Backend::Sqlite,
            buyers: 8,
            items: 1,
            initial_stock: 100,
            tally: Tally {
                orders: sold / 2,
                units_sold: sold,
                final_stock: left,
                lowest_stock: left,
                order_lines: sold / 2,
                version_moves: sold / 2,
            },
            conflicts: 12,
            deadlocks: 0,
            retries: 10,
            exhausted: 2,
            elapsed: Duration::from_millis(1234),
            note: None,
        }
    }

    #[test]
    fn oversold_counts_units_sold_twice() {
        assert_eq!(report(Strategy::Naive, 130, 0).oversold(), 30);
        assert_eq!(report(Strategy::Naive, 90, 25).oversold(), 15);
        assert!(report(Strategy::Optimistic, 100, 0).is_consistent());
        assert!(report(Strategy::Optimistic, 97, 3).is_consistent());
        let mut negative = report(Strategy::BasketLockAll, 100, 0);
        negative.tally.lowest_stock = -2;
        assert!(!negative.is_consistent());
    }

    #[test]
    fn the_table_is_aligned() {
        let table = format_table(&[
            report(Strategy::Naive, 130, 0),
            report(Strategy::Optimistic, 100, 0),
            report(Strategy::BasketLockAll, 100, 0),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5, "{table}");
        assert!(
            lines[0].starts_with("strategy         items  orders"),
            "{table}"
        );
        assert!(lines[0].contains("  deadlocks  retries"), "{table}");
        assert!(lines[1].chars().all(|c| c == '-'), "{table}");
        assert!(lines[2].starts_with("naive "), "{table}");
        assert!(lines[4].starts_with("basket-lock-all "), "{table}");
        assert!(lines[3].ends_with("1.234 s"), "{table}");
        let width = lines[0].len();
        assert!(lines.iter().all(|l| l.len() == width), "{table}");
    }
}
