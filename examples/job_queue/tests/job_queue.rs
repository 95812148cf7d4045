//! The job queue on every backend: `SKIP LOCKED` workers and relays process every
//! row exactly once, and a naive claim does not.
//!
//! Each test runs in an empty database of its own from
//! [`lockkit_tests::TestDb::empty`]: a temporary SQLite file (passed to the relay
//! processes as `--sqlite-file`), or a database on the PostgreSQL and
//! MySQL/MariaDB servers named by `PG_DATABASE_URL` and `MYSQL_DATABASE_URL`,
//! removed at the end. A server that cannot be reached fails the test; nothing is
//! skipped.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use job_queue::{Backend, Claim, OutboxAudit, WorkerConfig, WorkerReport};

const JOBS: u32 = 300;

fn run_workers(url: &str, config: &WorkerConfig) -> WorkerReport {
    let report = job_queue::run_workers(url, config)
        .unwrap_or_else(|e| panic!("{} workers on {url}: {e}", config.claim));
    eprintln!("{url}: {config:?}\n{report}");
    report
}

/// 4 workers drain 300 jobs with batches of 1, then of 10 (which also checks
/// that the queue is reset between runs): every job runs exactly once, and on
/// servers with row locks the work is shared.
fn workers_run_every_job_exactly_once(url: &str) {
    for batch_size in [1, 10] {
        let config = WorkerConfig {
            workers: 4,
            jobs: JOBS,
            batch_size,
            think: Duration::from_millis(1),
            claim: Claim::SkipLocked,
        };
        let report = run_workers(url, &config);
        let audit = &report.audit;

        assert_eq!(audit.jobs, i64::from(JOBS), "{report}");
        assert_eq!(audit.done, i64::from(JOBS), "every job is done:\n{report}");
        // SELECT job_id, COUNT(*) FROM job_runs GROUP BY job_id: 300 groups of 1.
        assert_eq!(audit.runs_per_job.len(), JOBS as usize, "{report}");
        let twice: Vec<_> = audit.runs_per_job.iter().filter(|(_, &n)| n != 1).collect();
        assert!(
            twice.is_empty(),
            "{} jobs ran more than once; the first (job, runs): {:?}\n{report}",
            twice.len(),
            &twice[..twice.len().min(10)]
        );
        assert_eq!(audit.runs, i64::from(JOBS), "{report}");
        assert_eq!(audit.duplicates(), 0, "{report}");
        assert!(audit.is_exactly_once(), "{report}");

        // The workers' own counts agree with job_runs.
        let counted: u64 = report.workers.iter().map(|w| w.jobs).sum();
        assert_eq!(counted, u64::from(JOBS), "{report}");
        for worker in &report.workers {
            let runs = audit
                .runs_per_worker
                .get(&worker.worker)
                .copied()
                .unwrap_or(0);
            assert_eq!(runs, worker.jobs as i64, "{report}");
            assert!(
                worker.batches * batch_size as u64 >= worker.jobs,
                "{report}"
            );
        }

        if report.backend.has_row_locks() {
            assert!(
                report.busy_workers() > 1,
                "SKIP LOCKED lets workers run in parallel; only one did any work:\n{report}"
            );
        }
    }
}

/// Two workers read the same pending jobs without a lock, both "run" them for
/// 50 ms and both record them: duplicates. The start barrier and the pause make
/// the overlap certain (both reads happen before either write). The same setup
/// with `SKIP LOCKED` is the control: no duplicate.
fn naive_claim_runs_jobs_twice(url: &str) {
    let naive = WorkerConfig {
        workers: 2,
        jobs: 40,
        batch_size: 5,
        think: Duration::from_millis(50),
        claim: Claim::Naive,
    };
    let report = run_workers(url, &naive);
    assert!(
        report.audit.duplicates() > 0,
        "two unlocked workers with a 50 ms window must run some job twice:\n{report}"
    );
    assert!(report.audit.jobs_run_twice() > 0, "{report}");
    assert!(!report.audit.is_exactly_once(), "{report}");
    assert_eq!(report.audit.done, 40, "{report}");

    let safe = WorkerConfig {
        claim: Claim::SkipLocked,
        ..naive
    };
    let report = run_workers(url, &safe);
    assert_eq!(report.audit.duplicates(), 0, "{report}");
    assert!(report.audit.is_exactly_once(), "{report}");
}

/// `job_queue --role relay` against `url`: the server URL in `DATABASE_URL`, or
/// the SQLite file in `--sqlite-file`.
fn relay_command(url: &str, name: &str, relay: &Relays) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_job_queue"));
    command.args(["--role", "relay", "--name", name]);
    command.args(["--batch", &relay.batch.to_string()]);
    command.args(["--think-ms", &relay.think_ms.to_string()]);
    lockkit_tests::support::point_at_database(&mut command, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits for every relay; returns (success, stdout, stderr) per relay.
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<(bool, String, String)> {
    lockkit_tests::support::wait_all(children, limit)
        .into_iter()
        .map(|(status, stdout, stderr)| (status.success(), stdout, stderr))
        .collect()
}

/// The count in `relay r1 on postgres: published 150 messages in …`.
fn published_count(stdout: &str) -> i64 {
    stdout
        .split("published ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in relay output: {stdout:?}"))
}

/// A relay scenario: messages in the outbox, and the options of both relays.
struct Relays {
    messages: u32,
    batch: i64,
    think_ms: u64,
}

/// 300 messages, batches of 5, 10 ms per batch: about 30 batches each.
const MANY: Relays = Relays {
    messages: 300,
    batch: 5,
    think_ms: 10,
};

/// 20 messages, batches of 10, 200 ms per batch: each relay claims half of the
/// table at once. On MySQL/MariaDB an `UPDATE … WHERE id IN (…)` over half of a
/// small table is a full scan that locks the other relay's rows too; the relays
/// then deadlock. Marking rows sent one by primary key keeps this passing.
const FEW: Relays = Relays {
    messages: 20,
    batch: 10,
    think_ms: 200,
};

/// Two relay *processes* started together: every message is published exactly
/// once and marked sent, and on servers with row locks both relays publish.
fn two_relay_processes_publish_every_message_once(url: &str, relays: &Relays) {
    let messages = relays.messages;
    job_queue::seed_outbox(url, messages).unwrap_or_else(|e| panic!("seed {url}: {e}"));
    let seeded = job_queue::outbox_audit(url).unwrap();
    assert_eq!(
        (seeded.outbox_ids.len(), seeded.sent),
        (messages as usize, 0)
    );
    assert!(seeded.published_ids.is_empty());

    let names = ["r1", "r2"];
    let children = names
        .iter()
        .map(|name| {
            relay_command(url, name, relays)
                .spawn()
                .expect("spawn the job_queue binary")
        })
        .collect();
    let outputs = wait_all(children, Duration::from_secs(120));
    for (name, (ok, stdout, stderr)) in names.iter().zip(&outputs) {
        eprintln!("{name}: {stdout}{stderr}");
        assert!(ok, "relay {name} failed:\n{stdout}{stderr}");
    }

    let audit: OutboxAudit = job_queue::outbox_audit(url).unwrap();
    eprintln!("{url}: {audit}");
    assert_eq!(audit.outbox_ids.len(), messages as usize, "{audit}");
    assert_eq!(
        audit.published_ids.len(),
        messages as usize,
        "published has one row per message: {audit}"
    );
    let published: Vec<i32> = audit.published_ids.clone();
    let outbox: Vec<i32> = audit.outbox_ids.iter().copied().collect();
    assert_eq!(published, outbox, "one publication per outbox id");
    assert_eq!(
        audit.sent,
        i64::from(messages),
        "every message is marked sent: {audit}"
    );
    assert_eq!(audit.unpublished(), 0, "{audit}");
    assert!(audit.is_exactly_once(), "{audit}");

    // Each relay's own report agrees with the broker table.
    for (name, (_, stdout, _)) in names.iter().zip(&outputs) {
        let in_db = audit.per_relay.get(*name).copied().unwrap_or(0);
        assert_eq!(published_count(stdout), in_db, "{name}: {stdout}{audit}");
    }
    assert_eq!(
        audit.per_relay.values().sum::<i64>(),
        i64::from(messages),
        "{audit}"
    );
    if Backend::from_url(url).has_row_locks() {
        for name in names {
            assert!(
                audit.per_relay.get(name).copied().unwrap_or(0) > 0,
                "both relays run in parallel with SKIP LOCKED; {name} published nothing: {audit}"
            );
        }
    }
}

lockkit_tests::url_tests! {
    fn workers_run_every_job_exactly_once(url) {
        super::workers_run_every_job_exactly_once(url)
    }
    fn two_relay_processes_publish_every_message_once(url) {
        super::two_relay_processes_publish_every_message_once(url, &super::MANY)
    }
    fn two_relay_processes_share_a_small_outbox(url) {
        super::two_relay_processes_publish_every_message_once(url, &super::FEW)
    }
    fn naive_claim_runs_jobs_twice(url) {
        super::naive_claim_runs_jobs_twice(url)
    }
}
