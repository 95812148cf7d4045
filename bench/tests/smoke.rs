//! The benchmark's code, exercised by `cargo test`: a fraction of a second of a
//! few workloads on SQLite (no server needed), with their correctness lines;
//! and the naive baseline on PostgreSQL (`PG_DATABASE_URL`), where it must lose.

use std::time::Duration;

use lockkit_bench::run::sample::Sample;
use lockkit_bench::vocabulary::{Backend, Case, Client, Limits, Strategy, Workload};

fn limits() -> Limits {
    Limits {
        run: Duration::from_millis(150),
        max_ops_per_worker: 2_000,
        jobs: 500,
    }
}

/// Runs `case` on SQLite within [`limits`].
fn run_on_sqlite(case: &Case) -> Sample {
    lockkit_bench::run::one(Backend::Sqlite, case, &limits()).expect("run")
}

/// Runs `case` on SQLite: it completes operations and its books balance.
fn assert_sells_and_balances(case: &Case) {
    let sample = run_on_sqlite(case);
    assert!(sample.counts.successes > 0, "{}", case.label());
    assert!(sample.check.ok, "{}: {}", case.label(), sample.check.detail);
}

#[test]
fn hot_row_with_lock_loses_nothing() {
    let case = Case::new(Workload::HotRow, Strategy::WithLock, 4);
    let sample = run_on_sqlite(&case);
    assert!(sample.counts.successes > 0, "{sample:?}");
    assert!(sample.check.ok, "{}", sample.check.detail);
    assert_eq!(sample.check.lost, 0);
    assert!(sample.throughput() > 0.0);
    assert!(sample.latency_ms(0.99) > 0.0);
}

#[test]
fn optimistic_and_atomic_balance_the_books() {
    for (strategy, flavor_hand) in [
        (Strategy::Optimistic, false),
        (Strategy::Optimistic, true),
        (Strategy::Atomic, false),
        (Strategy::Atomic, true),
    ] {
        let mut case = Case::new(Workload::HotRow, strategy, 3);
        if flavor_hand {
            case = case.hand();
        }
        assert_sells_and_balances(&case);
    }
}

#[test]
fn queue_runs_no_job_twice() {
    let case = Case::new(Workload::Queue, Strategy::Claim, 4).batch(10);
    let sample = run_on_sqlite(&case);
    assert!(sample.counts.successes > 0, "{sample:?}");
    assert!(sample.check.ok, "{}", sample.check.detail);
    assert!(sample.counts.units > 0);
    // The queue is small: it drains before the time limit, and every job ran once.
    assert_eq!(sample.counts.units, 500, "{}", sample.check.detail);
}

#[test]
fn orders_and_uncontended_updates_balance() {
    for case in [
        Case::new(Workload::Orders, Strategy::LockAll, 2),
        Case::new(Workload::Uncontended, Strategy::Versioned, 2),
        Case::new(Workload::Uncontended, Strategy::Versioned, 2).hand(),
    ] {
        assert_sells_and_balances(&case);
    }
}

#[test]
fn async_cases_balance_the_books_on_tasks() {
    // Every diesel-async case, lockkit's and hand-written, as 4 tasks on the
    // 2-thread runtime over one pool (SQLite: one writer at a time).
    let mut cases = Vec::new();
    // PostgreSQL's cases, the most (the queue too), here on SQLite.
    for case in lockkit_bench::plan::async_paired_cases(Backend::Postgres) {
        cases.push(Case { workers: 4, ..case });
        cases.push(Case { workers: 4, ..case }.hand());
    }
    assert_eq!(cases.len(), 10);
    for case in cases {
        assert_eq!(case.client, Client::Tasks, "{}", case.label());
        // A small queue, and time to drain it: then every job ran once.
        let limits = match case.workload {
            Workload::Queue => Limits {
                run: Duration::from_secs(10),
                jobs: 100,
                ..limits()
            },
            _ => limits(),
        };
        let sample = lockkit_bench::run::one(Backend::Sqlite, &case, &limits).expect("run");
        assert!(
            sample.counts.successes > 0,
            "{}: {:?}",
            case.label(),
            sample.first_error
        );
        assert_eq!(
            sample.counts.errors,
            0,
            "{}: {:?}",
            case.label(),
            sample.first_error
        );
        assert!(sample.check.ok, "{}: {}", case.label(), sample.check.detail);
        if case.workload == Workload::Queue {
            assert_eq!(sample.counts.units, 100, "{}", sample.check.detail);
        }
    }
}

#[test]
fn naive_loses_updates_and_the_check_counts_them() {
    // 16 workers reading and writing one row on PostgreSQL: within a short run
    // two of them read the same stock and one write is lost. A few runs, so
    // that a quiet one does not fail the test.
    let case = Case::new(Workload::HotRow, Strategy::Naive, 16);
    let mut quiet = Vec::new();
    for _ in 0..5 {
        let sample = lockkit_bench::run::one(Backend::Postgres, &case, &limits()).expect("run");
        assert!(
            sample.counts.successes > 0,
            "{}: {:?}",
            sample.check.detail,
            sample.first_error
        );
        if sample.check.lost > 0 {
            assert!(!sample.check.ok, "{}", sample.check.detail);
            return;
        }
        quiet.push(sample.check.detail);
    }
    panic!("naive lost no update in {} runs: {quiet:?}", quiet.len());
}

#[test]
fn the_whole_pipeline_writes_the_report_and_charts() {
    use lockkit_bench::plan::Settings;
    let out = std::env::temp_dir().join(format!("lkbench_smoke_{}", std::process::id()));
    let mut settings = Settings::quick();
    settings.backends = vec![Backend::Sqlite];
    settings.pgbench = false;
    settings.callgrind_ops = 0;
    settings.profile_ops = 50;
    settings.limits.run = Duration::from_millis(40);
    settings.limits.jobs = 300;
    settings.pair_limits.run = Duration::from_millis(20);
    settings.pair_limits.jobs = 200;
    settings.out_dir = out.clone();
    let results = lockkit_bench::run::all(settings).expect("suite");
    std::fs::create_dir_all(&out).expect("out dir");
    let charts = lockkit_bench::report::charts::write_all(&results, &out).expect("charts");
    assert!(charts.contains(&"hot_row.svg".to_owned()), "{charts:?}");
    let md = lockkit_bench::report::markdown(&results);
    for section in [
        "## Which strategy when",
        "## Headline",
        "## Machine and servers",
        "## 2. Hot row",
        "## 4. Multi-row orders",
        "## 5. On diesel-async",
        "## What lockkit itself costs",
    ] {
        assert!(md.contains(section), "missing {section}");
    }
    // Every safe strategy completed operations and balanced its books in every
    // run (the adaptive groups' runs too).
    for s in results.all_samples().filter(|s| s.case.strategy.is_safe()) {
        assert!(
            s.counts.successes > 0,
            "{}: {:?}",
            s.case.label(),
            s.first_error
        );
        assert!(s.check.ok, "{}: {}", s.case.label(), s.check.detail);
    }
    assert!(results.failed_checks().is_empty());
    let svg = std::fs::read_to_string(out.join("hot_row.svg")).expect("svg");
    assert!(svg.contains("<text"), "the chart has text");
    let _ = std::fs::remove_dir_all(&out);
}
