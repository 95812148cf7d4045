//! The short torture run, part of the normal test command: for each backend, 2
//! processes x 4 threads mix every strategy on 4 hot rows for 3 seconds, then
//! the run checks its invariants exactly. Each server run gets a fresh database
//! (created and dropped by the suite's harness); an unreachable server fails.
//! The long run is a command: see "Guarantees and the tests behind them" in the README.

use std::process::Command;

use diesel::{MysqlConnection, PgConnection, SqliteConnection};
use lockkit_tests::TestDb;

/// Runs the binary; `(exit success, stdout + stderr)`.
fn torture(url: &str, extra: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lockkit-torture"))
        .args(["--url", url, "--processes", "2", "--threads", "4"])
        .args(["--seconds", "3", "--seed", "20260509"])
        .args(extra)
        .output()
        .expect("run lockkit-torture");
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Every invariant held and every strategy did real work.
fn assert_clean_run(url: &str, extra: &[&str]) -> String {
    let (ok, out) = torture(url, extra);
    assert!(ok, "the torture run failed:\n{out}");
    // `--async` adds one: no pooled connection left in a transaction or holding a lock.
    let invariants = if extra.contains(&"--async") { 23 } else { 22 };
    assert!(
        out.contains(&format!("all {invariants} invariants hold")),
        "{out}"
    );
    assert!(!out.contains("FAIL"), "{out}");
    assert!(
        !out.contains("committed no operation"),
        "a strategy never committed:\n{out}"
    );
    println!("{out}");
    out
}

/// One clean run per test: `name: connection, extra arguments;`.
macro_rules! clean_runs {
    ($($(#[$meta:meta])* $name:ident: $conn:ty, $extra:expr;)*) => {
        $(
            $(#[$meta])*
            #[test]
            fn $name() {
                let db = TestDb::<$conn>::new(concat!("torture_", stringify!($name)));
                assert_clean_run(&db.url, $extra);
            }
        )*
    };
}

clean_runs! {
    sqlite_file: SqliteConnection, &[];
    postgres: PgConnection, &[];
    mysql: MysqlConnection, &[];
    /// No version trigger: with_lock, lock_all and the versioned conditional
    /// update keep the optimistic writers honest by themselves (issue: a write
    /// under a lock must advance the version). On the servers, where the
    /// writers race; on SQLite the blocking strategies all run in `BEGIN
    /// IMMEDIATE` and take turns, so its run shows only that nothing else
    /// breaks without the trigger.
    sqlite_file_without_a_trigger: SqliteConnection, &["--bump", "lockkit"];
    postgres_without_a_trigger: PgConnection, &["--bump", "lockkit"];
    mysql_without_a_trigger: MysqlConnection, &["--bump", "lockkit"];
}

/// `--async`: the strategies of `lockkit::asynchronous` as tasks on tokio over
/// a bb8 pool, a fifth of their futures dropped at random points, by a
/// `tokio::time::timeout` or `JoinHandle::abort`; the invariants hold exactly
/// and every pooled connection is clean at the end. Both attacks must have
/// dropped futures, or the run proved nothing about them.
macro_rules! async_runs {
    ($($name:ident: $conn:ty;)*) => {
        $(
            #[test]
            fn $name() {
                let db = TestDb::<$conn>::new(concat!("torture_", stringify!($name)));
                let out = assert_clean_run(&db.url, &["--async"]);
                let dropped = |by: &str| -> u64 {
                    let (_, after) = out.split_once("futures dropped (").expect("the cancellation line");
                    let (before, _) = after.split_once(by).expect(by);
                    before.rsplit(' ').nth(1).and_then(|n| n.parse().ok()).expect("a count")
                };
                assert!(dropped("by tokio::time::timeout") > 0, "no future dropped by a timeout:\n{out}");
                assert!(dropped("by JoinHandle::abort") > 0, "no task aborted:\n{out}");
            }
        )*
    };
}

async_runs! {
    sqlite_file_async: SqliteConnection;
    postgres_async: PgConnection;
    mysql_async: MysqlConnection;
}

/// The pool check is not vacuous: a transaction holding a row lock, opened with
/// raw SQL that diesel-async's transaction manager does not see, goes back to
/// the pool as a healthy connection; the server's word must catch it.
macro_rules! hidden_transactions_are_caught {
    ($($name:ident: $conn:ty;)*) => {
        $(
            #[test]
            fn $name() {
                let db = TestDb::<$conn>::new(concat!("torture_", stringify!($name)));
                let (ok, out) = torture(&db.url, &["--async", "--leave-open", "--seconds", "1"]);
                assert!(!ok, "the hidden transaction went unnoticed:\n{out}");
                assert!(
                    out.contains("FAIL  after the dropped futures, no pooled connection"),
                    "{out}"
                );
                assert!(out.contains("the server: in a transaction true"), "{out}");
            }
        )*
    };
}

hidden_transactions_are_caught! {
    sqlite_file_async_hidden_transaction: SqliteConnection;
    postgres_async_hidden_transaction: PgConnection;
    mysql_async_hidden_transaction: MysqlConnection;
}

/// The attack is not vacuous: with bb8's check-out ping (`SELECT 1`, bb8's
/// default), a future dropped during the ping leaves a MySQL connection with an
/// unread reply that diesel-async's `is_broken` does not see, and bb8 hands it
/// to the next task, which reads the wrong replies; the run must fail.
#[test]
fn mysql_async_with_the_pool_ping_fails() {
    let db = TestDb::<MysqlConnection>::new("torture_mysql_async_ping");
    // Many drops, for longer: the run must meet a drop inside a ping however
    // fast the machine is.
    let (ok, out) = torture(
        &db.url,
        &["--async", "--pool-ping", "--cancel", "60", "--seconds", "5"],
    );
    assert!(!ok, "dropped pings went unnoticed:\n{out}");
    assert!(out.contains("VIOLATION"), "{out}");
    assert!(out.contains("FAIL  workers"), "{out}");
}

/// The audit is not vacuous: when the atomic writer neither checks nor bumps the
/// version (plain `atomic::update_if`, no trigger), optimistic writers overwrite
/// its changes, and the run must fail on `stock + sold = initial`.
#[test]
fn lost_updates_are_caught_when_writers_do_not_bump_the_version() {
    let db = TestDb::<PgConnection>::new("torture_no_bump");
    let (ok, out) = torture(&db.url, &["--bump", "none", "--seconds", "2"]);
    assert!(!ok, "lost updates went unnoticed:\n{out}");
    assert!(out.contains("VIOLATION"), "{out}");
    assert!(out.contains("FAIL  item "), "{out}");
}

/// An unreachable server fails the run at once, with the URL it tried.
#[test]
fn an_unreachable_server_fails() {
    for url in [
        "postgres://postgres@127.0.0.1:1/nowhere",
        "mysql://root@127.0.0.1:1/nowhere",
    ] {
        let started = std::time::Instant::now();
        let (ok, out) = torture(url, &[]);
        assert!(!ok, "{out}");
        assert!(out.contains("cannot run on"), "{out}");
        assert!(out.contains("127.0.0.1:1"), "{out}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{out}"
        );
    }
}

#[test]
fn a_bad_command_line_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_lockkit-torture"))
        .args(["--url", "x.sqlite", "--processes", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--processes"));
}

/// The long run goes again and again on one database (CONTRIBUTING): a second
/// run's setup replaces the first's tables and version trigger. On PostgreSQL
/// dropping the table leaves the trigger's function, which a second install
/// must not meet.
#[test]
fn a_second_run_on_the_same_postgres_database() {
    let db = TestDb::<PgConnection>::new("torture_twice");
    for run in 1..=2 {
        let (ok, out) = torture(&db.url, &["--seconds", "1"]);
        assert!(ok, "run {run}:\n{out}");
    }
}
