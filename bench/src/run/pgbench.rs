//! The same SQL through `pgbench`: the server's own limit at the same client count.
//!
//! Each script sends what lockkit sends, statement for statement, with the values
//! bound as parameters, from 16 clients (`-c 16 -T n`): prepared once on 2 threads
//! (`-M prepared -j 2`, the server's own limit) and on one thread per connection,
//! and the way Diesel sends its own `UPDATE`s, on 2 threads and on one thread per
//! connection ([`Mode`]). The one difference is the queue with batches of 10:
//! pgbench has no loop, so the claim is wrapped in `array_agg` (one row for
//! `\gset`) and the ten updates are written out; the locking is the same.
//! pgbench sends a whole script one way, where lockkit's `with_lock` sends its
//! locking statement prepared and the closure's `UPDATE` (the user's
//! `diesel::update`) the way Diesel sends its own.

use std::path::PathBuf;
use std::process::Command;

use diesel::prelude::*;
use diesel::PgConnection;

use crate::error::BenchError;
use crate::plan::Settings;
use crate::run::cpu::{self, Cpu};
use crate::run::ops::BenchConnection;
use crate::run::runner::BenchPool;
use crate::vocabulary::schema::jobs;
use crate::vocabulary::{Backend, Case, Strategy, Workload, HOT_ID};

/// Clients of every pgbench run.
pub const CLIENTS: usize = 16;

/// How pgbench sends its statements, and on how many threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// `-M prepared -j 2`: every statement prepared once per connection, 16
    /// connections multiplexed on 2 threads. The server's own limit.
    Prepared,
    /// `-M prepared -j 16`: that, with one thread per connection, as the
    /// benchmark's workers have.
    PreparedThreads,
    /// `-M extended -j 2`: every statement parsed and planned again on every
    /// execution (an unnamed statement), which is how Diesel 2.3 sends each
    /// `UPDATE` of its own: the one in `with_lock`'s closure too (lockkit's own
    /// statements and `lockkit::atomic::update`'s are prepared).
    Extended,
    /// `-M extended -j 16`: that, with one thread per connection, as the
    /// benchmark's workers have.
    ExtendedThreads,
}

impl Mode {
    /// Every mode, in report order.
    pub const ALL: [Mode; 4] = [
        Mode::Prepared,
        Mode::PreparedThreads,
        Mode::Extended,
        Mode::ExtendedThreads,
    ];

    /// `-M`.
    pub fn protocol(self) -> &'static str {
        match self {
            Mode::Prepared | Mode::PreparedThreads => "prepared",
            Mode::Extended | Mode::ExtendedThreads => "extended",
        }
    }

    /// `-j`.
    pub fn threads(self) -> usize {
        match self {
            Mode::Prepared | Mode::Extended => 2,
            Mode::PreparedThreads | Mode::ExtendedThreads => CLIENTS,
        }
    }

    /// `-M x -j n`.
    pub fn title(self) -> String {
        format!("-M {} -j {}", self.protocol(), self.threads())
    }
}

/// A pgbench script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Script {
    /// `with_lock` on the hot row.
    WithLock,
    /// `atomic::update_if` on the hot row.
    Atomic,
    /// `queue::claim` with this batch size.
    Queue(i64),
}

impl Script {
    /// Every script, in report order.
    pub const ALL: [Script; 4] = [
        Script::WithLock,
        Script::Atomic,
        Script::Queue(1),
        Script::Queue(10),
    ];

    /// The name shown in the report.
    pub fn title(self) -> String {
        match self {
            Script::WithLock => "hot row, with_lock".to_owned(),
            Script::Atomic => "hot row, atomic update_if".to_owned(),
            Script::Queue(n) => format!("queue drain, batch {n}"),
        }
    }

    /// The lockkit case it mirrors.
    pub fn case(self) -> Case {
        match self {
            Script::WithLock => Case::new(Workload::HotRow, Strategy::WithLock, CLIENTS),
            Script::Atomic => Case::new(Workload::HotRow, Strategy::Atomic, CLIENTS),
            Script::Queue(n) => Case::new(Workload::Queue, Strategy::Claim, CLIENTS).batch(n),
        }
    }

    /// The diesel-async case on the same SQL, with as many tasks as pgbench has
    /// clients: lockkit's.
    pub fn async_case(self) -> Case {
        self.case().tasks()
    }

    /// Units (updates or jobs) per transaction when the queue is full.
    pub fn units(self) -> i64 {
        match self {
            Script::Queue(n) => n,
            _ => 1,
        }
    }

    /// The script's text.
    pub fn text(self) -> String {
        match self {
            Script::WithLock => format!(
                "\\set id {HOT_ID}\n\
                 BEGIN;\n\
                 UPDATE items SET lock_version = lock_version + 1 WHERE id = :id \
                 AND lock_version < 2147483647 AND EXISTS (SELECT id, name, stock, lock_version \
                 FROM items WHERE id = :id FOR UPDATE) RETURNING id, name, stock, lock_version \\gset\n\
                 \\set left :stock - 1\n\
                 UPDATE items SET stock = :left WHERE id = :id;\n\
                 COMMIT;\n"
            ),
            Script::Atomic => format!(
                "\\set id {HOT_ID}\n\
                 \\set qty 1\n\
                 UPDATE items SET stock = stock - :qty WHERE id = :id AND stock >= :qty;\n"
            ),
            Script::Queue(1) => "\\set n 1\n\
                 BEGIN;\n\
                 SELECT id FROM jobs WHERE done = false ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED \\gset\n\
                 UPDATE jobs SET done = true WHERE id = :id;\n\
                 COMMIT;\n"
                .to_owned(),
            Script::Queue(n) => {
                let mut s = format!(
                    "\\set n {n}\n\
                     BEGIN;\n\
                     SELECT array_agg(id) AS ids FROM (SELECT id FROM jobs WHERE done = false \
                     ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED) AS claimed \\gset\n"
                );
                for i in 1..=n {
                    s.push_str(&format!(
                        "UPDATE jobs SET done = true WHERE id = (:ids::int[])[{i}];\n"
                    ));
                }
                s.push_str("COMMIT;\n");
                s
            }
        }
    }
}

/// One pgbench run.
#[derive(Debug, Clone)]
pub struct PgbenchRun {
    /// The script.
    pub script: Script,
    /// How pgbench sent it.
    pub mode: Mode,
    /// Transactions per second (pgbench's, without connection time).
    pub tps: f64,
    /// Updates (or jobs) per second.
    pub units_per_s: f64,
    /// pgbench's average latency, ms.
    pub latency_ms: f64,
    /// Transactions processed.
    pub transactions: u64,
    /// Failed transactions.
    pub failed: u64,
    /// The queue emptied before the time was up (the rate is then a lower bound).
    pub ran_dry: bool,
    /// The command line, for the report.
    pub command: String,
    /// CPU used by pgbench (`children`) and the server.
    pub cpu: Cpu,
    /// Units done (updates or jobs).
    pub done: f64,
}

impl PgbenchRun {
    /// pgbench's CPU per unit, µs.
    pub fn client_cpu_us(&self) -> f64 {
        cpu::micros_per(self.cpu.children, self.done)
    }

    /// The server's CPU per unit, µs.
    pub fn server_cpu_us(&self) -> f64 {
        cpu::micros_per(self.cpu.server, self.done)
    }
}

/// The pgbench binary: `$PGBENCH`, `pgbench` on the `PATH`, or the newest under
/// `/usr/lib/postgresql/*/bin`.
pub fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGBENCH") {
        return Some(PathBuf::from(p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("pgbench");
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin/pgbench"))
        .filter(|p| p.is_file())
        .collect();
    found.sort_by_key(|p| {
        p.iter()
            .rev()
            .nth(2)
            .and_then(|v| v.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop()
}

fn field<'a>(out: &'a str, prefix: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .map(str::trim)
}

fn number(text: Option<&str>) -> f64 {
    text.and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Runs `script` against the benchmark database at `url`, after resetting it
/// through `pool`.
pub fn run(
    url: &str,
    pool: &BenchPool<PgConnection>,
    script: Script,
    mode: Mode,
    settings: &Settings,
) -> Result<PgbenchRun, BenchError> {
    let bin = binary().ok_or_else(|| {
        BenchError::Other("pgbench not found (set PGBENCH or put it on the PATH)".into())
    })?;
    let jobs_seeded = i64::from(settings.pgbench_jobs);
    {
        let mut conn = pool.get()?;
        conn.reset_items()?;
        if let Script::Queue(_) = script {
            conn.reset_jobs(settings.pgbench_jobs)?;
        }
    }
    let file = std::env::temp_dir().join(format!(
        "lkbench_{}_{}.sql",
        std::process::id(),
        match script {
            Script::WithLock => "with_lock".to_owned(),
            Script::Atomic => "atomic".to_owned(),
            Script::Queue(n) => format!("queue{n}"),
        }
    ));
    std::fs::write(&file, script.text())?;
    let secs = settings.pgbench_secs.to_string();
    let args = [
        "-n",
        "-M",
        mode.protocol(),
        "-c",
        &CLIENTS.to_string(),
        "-j",
        &mode.threads().to_string(),
        "-T",
        &secs,
        "-f",
        &file.display().to_string(),
        url,
    ]
    .map(|s| s.to_owned());
    // The same session settings as the benchmark's own connections.
    let commit = if settings.durable { "on" } else { "off" };
    let pgoptions = format!("-c synchronous_commit={commit} -c lock_timeout=10s");
    let before = cpu::snapshot(Backend::Postgres);
    let output = Command::new(&bin)
        .args(&args)
        .env("PGOPTIONS", &pgoptions)
        .output()?;
    let used = before.until(&cpu::snapshot(Backend::Postgres));
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() && field(&stdout, "tps =").is_none() {
        return Err(BenchError::Other(format!(
            "pgbench failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let tps = number(field(&stdout, "tps ="));
    let transactions = number(field(&stdout, "number of transactions actually processed:"));
    let failed = number(field(&stdout, "number of failed transactions:"));
    let latency_ms = number(field(&stdout, "latency average ="));
    let (units_per_s, ran_dry, done) = match script {
        Script::Queue(_) => {
            let done: i64 = jobs::table
                .filter(jobs::done.eq(true))
                .count()
                .get_result(&mut *pool.get()?)?;
            // Jobs per transaction as it happened, times transactions per second.
            let per_tx = done as f64 / transactions.max(1.0);
            (tps * per_tx, done >= jobs_seeded, done as f64)
        }
        _ => (tps * script.units() as f64, false, transactions),
    };
    Ok(PgbenchRun {
        script,
        mode,
        tps,
        units_per_s,
        latency_ms,
        transactions: if transactions.is_nan() { 0 } else { transactions as u64 },
        failed: if failed.is_nan() { 0 } else { failed as u64 },
        ran_dry,
        command: format!(
            "PGOPTIONS='{pgoptions}' pgbench -n -M {} -c {CLIENTS} -j {} -T {secs} -f <script> <db>",
            mode.protocol(),
            mode.threads()
        ),
        cpu: used,
        done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_scripts_update_every_claimed_row() {
        let text = Script::Queue(10).text();
        assert_eq!(text.matches("UPDATE jobs").count(), 10);
        assert!(text.contains("(:ids::int[])[10]"));
        assert!(Script::Queue(1).text().contains("WHERE id = :id"));
    }

    #[test]
    fn the_async_cases_have_as_many_tasks_as_pgbench_clients() {
        assert_eq!(crate::plan::ASYNC_WORKERS, CLIENTS);
        for script in Script::ALL {
            let case = script.async_case();
            assert_eq!(case.client, crate::vocabulary::Client::Tasks);
            assert_eq!(case.workers, CLIENTS);
            assert_eq!(case.hand(), script.case().tasks().hand());
        }
    }

    #[test]
    fn output_is_parsed() {
        let out = "number of transactions actually processed: 1234\n\
                   number of failed transactions: 0 (0.000%)\n\
                   latency average = 12.5 ms\n\
                   tps = 617.2 (without initial connection time)\n";
        assert_eq!(number(field(out, "tps =")), 617.2);
        assert_eq!(
            number(field(out, "number of transactions actually processed:")),
            1234.0
        );
        assert_eq!(number(field(out, "latency average =")), 12.5);
    }
}
