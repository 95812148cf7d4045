//! The shop on every backend: the naive strategy loses updates, every other one
//! never does; `basket-naive` deadlocks on the servers (and is retried), and
//! `basket-lock-all` never does.
//!
//! Each test runs in an empty database of its own from
//! [`lockkit_tests::TestDb::empty`]: a temporary SQLite file, or a database on the
//! PostgreSQL and MySQL/MariaDB servers named by `PG_DATABASE_URL` and
//! `MYSQL_DATABASE_URL`, removed at the end. A server that cannot be reached fails
//! the test; nothing is skipped.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use shop::{Backend, Config, Report, Strategy};

/// Plays `strategies` on `url` one after the other (so each run also checks that
/// the tables are reset) and prints the table.
fn play(url: &str, strategies: &[Strategy], config: &Config) -> (Vec<Report>, String) {
    let reports: Vec<Report> = strategies
        .iter()
        .map(|&strategy| {
            shop::run(url, strategy, config).unwrap_or_else(|e| panic!("{strategy} on {url}: {e}"))
        })
        .collect();
    let table = shop::format_table(&reports);
    eprintln!("{url}\n{table}");
    for report in &reports {
        assert_eq!(report.note, None, "{table}");
    }
    (reports, table)
}

/// The single-item strategies: naive oversells; optimistic, pessimistic, atomic
/// and nowait sell exactly the stock.
fn one_item(url: &str) {
    let (reports, table) = play(
        url,
        &[
            Strategy::Naive,
            Strategy::Optimistic,
            Strategy::Pessimistic,
            Strategy::Atomic,
            Strategy::Nowait,
        ],
        &Config::default(),
    );
    let [naive, optimistic, pessimistic, atomic, nowait] = &reports[..] else {
        unreachable!()
    };

    assert!(
        naive.oversold() > 0,
        "8 buyers with a 5 ms race window must lose updates:\n{table}"
    );
    assert!(
        naive.tally.units_sold > naive.initial_stock - naive.tally.final_stock,
        "{table}"
    );

    for report in [optimistic, pessimistic, atomic, nowait] {
        check_consistent(report, &table);
        assert_eq!(report.items, 1, "{table}");
        assert_eq!(report.deadlocks, 0, "{table}");
    }

    // Waiting for the lock (or letting the database check) leaves nothing to retry.
    for report in [pessimistic, atomic] {
        assert_eq!(
            (report.conflicts, report.retries, report.exhausted),
            (0, 0, 0),
            "{table}"
        );
        assert_eq!(report.tally.final_stock, 0, "the stock sells out:\n{table}");
    }

    // Racing for the row, the strategies that retry meet conflicts.
    for (report, why, conflict) in [
        (optimistic, "the race must have happened", "stale write"),
        (
            nowait,
            "8 buyers on one row must find it locked",
            "busy row",
        ),
    ] {
        assert!(report.conflicts > 0, "{why}:\n{table}");
        assert!(
            report.conflicts <= report.retries + report.exhausted,
            "every {conflict} is retried or ends in exhaustion:\n{table}"
        );
    }
}

/// The basket strategies: neither oversells any item; `basket-lock-all` never
/// deadlocks, `basket-naive` deadlocks on PostgreSQL and MySQL (SQLite serializes
/// writers and cannot).
fn baskets(url: &str) {
    let config = Config {
        buyers: 6,
        stock: 40,
        items: 4,
        attempts: 40,
        ..Config::default()
    };
    let (reports, table) = play(
        url,
        &[Strategy::BasketNaive, Strategy::BasketLockAll],
        &config,
    );
    let [naive, lock_all] = &reports[..] else {
        unreachable!()
    };
    for report in [naive, lock_all] {
        check_consistent(report, &table);
        assert_eq!(report.items, 4, "{table}");
        assert_eq!(report.initial_stock, 4 * 40, "{table}");
        assert_eq!(report.conflicts, 0, "{table}");
        assert!(
            report.tally.units_sold >= 2 * report.tally.orders,
            "every basket holds at least 2 units:\n{table}"
        );
    }

    assert_eq!(
        (lock_all.deadlocks, lock_all.retries, lock_all.exhausted),
        (0, 0, 0),
        "locking in key order cannot deadlock:\n{table}"
    );

    if Backend::from_url(url) == Backend::Sqlite {
        assert_eq!(
            naive.deadlocks, 0,
            "BEGIN IMMEDIATE serializes writers:\n{table}"
        );
        assert_eq!(naive.retries, 0, "{table}");
    } else {
        assert!(
            naive.deadlocks > 0,
            "6 buyers locking 2-3 of 4 items in random order, with a pause after the \
             first lock, must deadlock:\n{table}"
        );
        assert!(
            naive.deadlocks <= naive.retries + naive.exhausted,
            "every deadlock is retried or ends in exhaustion:\n{table}"
        );
    }
}

fn check_consistent(report: &Report, table: &str) {
    assert_eq!(report.oversold(), 0, "{table}");
    assert_eq!(
        report.tally.units_sold + report.tally.final_stock,
        report.initial_stock,
        "{table}"
    );
    assert!(report.tally.final_stock >= 0, "{table}");
    assert!(
        report.tally.lowest_stock >= 0,
        "no item may go below zero:\n{table}"
    );
    assert!(report.is_consistent(), "{table}");
    assert!(report.tally.orders > 0, "{table}");
    // Each sale moved its item's version: an edit form (a versioned writer)
    // that read the item before it is refused, and cannot put the old stock
    // back.
    assert!(
        report.tally.version_moves >= report.tally.order_lines,
        "{}: {} of {} sales left the version where it was:\n{table}",
        report.strategy,
        report.tally.order_lines - report.tally.version_moves,
        report.tally.order_lines
    );
}

lockkit_tests::url_tests! {
    fn one_item(url) { super::one_item(url) }
    fn baskets(url) { super::baskets(url) }
}

/// A basket strategy needs at least two items; the check comes before any
/// connection is made.
#[test]
fn baskets_need_two_items() {
    let config = Config {
        items: 1,
        ..Config::default()
    };
    let err = shop::run("unused.sqlite", Strategy::BasketLockAll, &config).unwrap_err();
    assert!(matches!(err, shop::ShopError::Usage(_)), "{err}");
}
