//! `job_queue`: job workers and outbox relays claiming rows with
//! `FOR UPDATE SKIP LOCKED`, on SQLite, PostgreSQL or MySQL/MariaDB.
//! Run `job_queue --help` for the roles and options.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use job_queue::{Backend, Claim, JobQueueError, RelayConfig, WorkerConfig};
use lockkit_tests::support::{database_url, exit_code};

/// What `--help` prints after the options.
const AFTER_HELP: &str = "\
USAGE BY ROLE:
    job_queue --role workers [--workers N] [--jobs M] [--batch N] [--think-ms N] [--unsafe]
    job_queue --role seed-outbox [--count M]
    job_queue --role relay [--name NAME] [--batch N] [--think-ms N]
    job_queue --role outbox-report

DATABASE_URL=postgres://... (or postgresql://) runs on PostgreSQL,
DATABASE_URL=mysql://... on MySQL/MariaDB (build with `--features postgres` or
`--features mysql`); the tables are created there if missing. Without it,
job_queue uses the SQLite file. On PostgreSQL and MySQL workers run in parallel
and never wait (a lock wait over 1 s fails the run); on SQLite they take turns
(BEGIN IMMEDIATE), and one may do all the work.
";

/// job_queue: exactly-once job workers and outbox relays with FOR UPDATE SKIP LOCKED
#[derive(Debug, Parser)]
#[command(name = "job_queue", after_help = AFTER_HELP)]
struct Cli {
    /// What to do
    #[arg(long, value_enum, default_value_t = Role::Workers)]
    role: Role,
    /// Worker threads
    #[arg(long, value_name = "N", default_value_t = WorkerConfig::default().workers)]
    workers: usize,
    /// Jobs to enqueue
    #[arg(long, value_name = "M", default_value_t = WorkerConfig::default().jobs)]
    jobs: u32,
    /// Outbox messages to write
    #[arg(long, value_name = "M", default_value_t = 1000)]
    count: u32,
    /// Rows claimed per transaction (LIMIT) [default: 10]
    #[arg(long, value_name = "N")]
    batch: Option<i64>,
    /// Time spent on each claimed batch, in ms [default: 1 for workers, 0 for relays]
    #[arg(long, value_name = "N")]
    think_ms: Option<u64>,
    /// Workers read jobs without locking (duplicates!)
    #[arg(long = "unsafe")]
    naive: bool,
    /// Relay name, recorded in `published` [default: relay-<pid>]
    #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    name: Option<String>,
    /// SQLite database
    #[arg(long, value_name = "PATH", default_value = "job_queue.sqlite")]
    sqlite_file: PathBuf,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Enqueue M jobs, drain them with N worker threads, report
    Workers,
    /// Empty the outbox and write M unsent messages
    SeedOutbox,
    /// Publish unsent outbox messages until none is left; run several of these
    /// processes at once against the same database
    Relay,
    /// Count what the outbox and the broker table hold
    OutboxReport,
}

/// The parsed command line.
#[derive(Debug)]
struct Options {
    role: Role,
    workers: WorkerConfig,
    relay: RelayConfig,
    count: u32,
    sqlite_file: PathBuf,
}

impl From<Cli> for Options {
    fn from(cli: Cli) -> Self {
        let mut workers = WorkerConfig {
            workers: cli.workers,
            jobs: cli.jobs,
            ..WorkerConfig::default()
        };
        let mut relay = RelayConfig {
            name: cli
                .name
                .unwrap_or_else(|| format!("relay-{}", std::process::id())),
            ..RelayConfig::default()
        };
        if cli.naive {
            workers.claim = Claim::Naive;
        }
        if let Some(batch) = cli.batch {
            workers.batch_size = batch;
            relay.batch_size = batch;
        }
        if let Some(think) = cli.think_ms.map(Duration::from_millis) {
            workers.think = think;
            relay.think = think;
        }
        Options {
            role: cli.role,
            workers,
            relay,
            count: cli.count,
            sqlite_file: cli.sqlite_file,
        }
    }
}

fn main() -> ExitCode {
    exit_code("job_queue", play(&Options::from(Cli::parse())))
}

/// Runs the role; `Ok(false)` if a safe run processed a job twice or left one.
fn play(options: &Options) -> Result<bool, JobQueueError> {
    let (url, shown) = database_url(&options.sqlite_file);
    let backend = Backend::from_url(&url);
    match options.role {
        Role::Workers => {
            let config = &options.workers;
            println!(
                "job_queue workers on {backend} ({shown}): {} workers, {} jobs, batches of {}, {} ms per batch, claim: {}{}\n",
                config.workers,
                config.jobs,
                config.batch_size,
                config.think.as_millis(),
                config.claim,
                if backend.has_row_locks() {
                    ""
                } else {
                    " (SQLite: workers take turns)"
                },
            );
            let report = job_queue::run_workers(&url, config)?;
            print!("{report}");
            let audit = &report.audit;
            if audit.is_exactly_once() {
                return Ok(true);
            }
            if config.claim == Claim::Naive {
                println!(
                    "\nnaive claim: {} duplicate executions; workers that read before the other's commit ran the same jobs",
                    audit.duplicates()
                );
                Ok(true)
            } else {
                println!("\nBUG: every job must run exactly once");
                Ok(false)
            }
        }
        Role::SeedOutbox => {
            job_queue::seed_outbox(&url, options.count)?;
            println!(
                "seeded {} outbox messages on {backend} ({shown})",
                options.count
            );
            Ok(true)
        }
        Role::Relay => {
            let report = job_queue::run_relay(&url, &options.relay)?;
            print!("{report}");
            Ok(true)
        }
        Role::OutboxReport => {
            let audit = job_queue::outbox_audit(&url)?;
            print!("{audit}");
            Ok(audit.is_exactly_once())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        let args = std::iter::once("job_queue").chain(args.iter().copied());
        Cli::try_parse_from(args).map(Options::from)
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let options = parse(&[]).unwrap();
        assert_eq!(options.role, Role::Workers);
        assert_eq!(options.workers, WorkerConfig::default());
        assert_eq!(options.relay.batch_size, 10);
        assert!(options.relay.name.starts_with("relay-"));
        assert_eq!(options.sqlite_file, PathBuf::from("job_queue.sqlite"));
        assert_eq!(
            parse(&["-h"]).unwrap_err().kind(),
            clap::error::ErrorKind::DisplayHelp
        );
    }

    #[test]
    fn workers_and_relay_options() {
        let options = parse(&[
            "--role",
            "workers",
            "--workers",
            "3",
            "--jobs=300",
            "--batch",
            "1",
            "--think-ms",
            "0",
            "--unsafe",
        ])
        .unwrap();
        let w = &options.workers;
        assert_eq!((w.workers, w.jobs, w.batch_size), (3, 300, 1));
        assert_eq!((w.think, w.claim), (Duration::ZERO, Claim::Naive));

        let options = parse(&[
            "--role",
            "relay",
            "--name",
            "r1",
            "--batch=5",
            "--think-ms=20",
        ])
        .unwrap();
        assert_eq!(options.role, Role::Relay);
        assert_eq!(options.relay.name, "r1");
        assert_eq!(options.relay.batch_size, 5);
        assert_eq!(options.relay.think, Duration::from_millis(20));

        let options = parse(&["--role", "seed-outbox", "--count", "7"]).unwrap();
        assert_eq!((options.role, options.count), (Role::SeedOutbox, 7));
    }

    #[test]
    fn bad_options() {
        assert!(parse(&["--role", "boss"]).is_err());
        assert!(parse(&["--workers"]).is_err());
        assert!(parse(&["--jobs", "-3"]).is_err());
        assert!(parse(&["--name", ""]).is_err());
        assert!(parse(&["--frobnicate", "1"]).is_err());
    }
}
