//! What a run left in the database, and the table the program prints.

use std::time::Duration;

use crate::{Backend, Strategy};

/// The result of one [`run`](crate::run). Orders, units sold and final stock are
/// counted from the database after all buyers finished; conflicts, retries and
/// exhaustions are what the buyers saw on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The strategy played.
    pub strategy: Strategy,
    /// The backend it ran on.
    pub backend: Backend,
    /// Number of buyer threads.
    pub buyers: usize,
    /// Stock at the start.
    pub initial_stock: i64,
    /// Accepted orders (rows in `orders`).
    pub orders: i64,
    /// Units sold (sum of `orders.qty`).
    pub units_sold: i64,
    /// Stock left at the end.
    pub final_stock: i64,
    /// Version-checked writes refused as stale.
    pub conflicts: u64,
    /// Attempts after the first, made by `lockkit::retry`.
    pub retries: u64,
    /// Purchases abandoned because the retries ran out.
    pub exhausted: u64,
    /// Wall-clock time from the start signal to the last buyer's return.
    pub elapsed: Duration,
}

impl Report {
    /// Units sold that were never in stock: `units_sold + final_stock -
    /// initial_stock`. Every lost update adds the quantity it overwrote; 0 means the
    /// stock and the orders agree.
    pub fn oversold(&self) -> i64 {
        self.units_sold + self.final_stock - self.initial_stock
    }

    /// Whether stock and orders agree (`oversold() == 0`).
    pub fn is_consistent(&self) -> bool {
        self.oversold() == 0
    }
}

const HEADERS: [&str; 9] = [
    "strategy",
    "orders",
    "sold",
    "final stock",
    "oversold",
    "conflicts",
    "retries",
    "exhausted",
    "elapsed",
];

/// The reports as an aligned text table, one row per report, with a header and
/// a rule under it; every line ends with `\n`.
pub fn format_table(reports: &[Report]) -> String {
    let rows: Vec<[String; 9]> = reports
        .iter()
        .map(|r| {
            [
                r.strategy.to_string(),
                r.orders.to_string(),
                r.units_sold.to_string(),
                r.final_stock.to_string(),
                r.oversold().to_string(),
                r.conflicts.to_string(),
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
            initial_stock: 100,
            orders: sold / 2,
            units_sold: sold,
            final_stock: left,
            conflicts: 12,
            retries: 10,
            exhausted: 2,
            elapsed: Duration::from_millis(1234),
        }
    }

    #[test]
    fn oversold_counts_units_sold_twice() {
        assert_eq!(report(Strategy::Naive, 130, 0).oversold(), 30);
        assert_eq!(report(Strategy::Naive, 90, 25).oversold(), 15);
        assert!(report(Strategy::Optimistic, 100, 0).is_consistent());
        assert!(report(Strategy::Optimistic, 97, 3).is_consistent());
    }

    #[test]
    fn the_table_is_aligned() {
        let table = format_table(&[
            report(Strategy::Naive, 130, 0),
            report(Strategy::Optimistic, 100, 0),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("strategy    orders"), "{table}");
        assert!(lines[1].chars().all(|c| c == '-'), "{table}");
        assert!(lines[2].starts_with("naive "), "{table}");
        assert!(lines[3].ends_with("1.234 s"), "{table}");
        let width = lines[0].len();
        assert!(lines.iter().all(|l| l.len() == width), "{table}");
    }
}
