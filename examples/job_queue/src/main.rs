//! `job_queue`: job workers and outbox relays claiming rows with
//! `FOR UPDATE SKIP LOCKED`, on SQLite, PostgreSQL or MySQL/MariaDB.
//! Run `job_queue --help` for the roles and options.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use job_queue::{Backend, Claim, JobQueueError, RelayConfig, WorkerConfig};

const USAGE: &str = "\
job_queue: exactly-once job workers and outbox relays with FOR UPDATE SKIP LOCKED

USAGE:
    job_queue --role workers [--workers N] [--jobs M] [--batch N] [--think-ms N] [--unsafe]
    job_queue --role seed-outbox [--count M]
    job_queue --role relay [--name NAME] [--batch N] [--think-ms N]
    job_queue --role outbox-report

ROLES:
    workers        enqueue M jobs, drain them with N worker threads, report
    seed-outbox    empty the outbox and write M unsent messages
    relay          publish unsent outbox messages until none is left; run several
                   of these processes at once against the same database
    outbox-report  count what the outbox and the broker table hold

OPTIONS:
    --role ROLE         see above                                   [default: workers]
    --workers N         worker threads                              [default: 4]
    --jobs M            jobs to enqueue                             [default: 1000]
    --count M           outbox messages to write                    [default: 1000]
    --batch N           rows claimed per transaction (LIMIT)        [default: 10]
    --think-ms N        time spent on each claimed batch, in ms     [default: 1 for
                        workers, 0 for relays]
    --unsafe            workers read jobs without locking (duplicates!)
    --name NAME         relay name, recorded in `published`         [default: relay-<pid>]
    --sqlite-file PATH  SQLite database                             [default: job_queue.sqlite]
    -h, --help          this text

DATABASE_URL=postgres://... (or postgresql://) runs on PostgreSQL,
DATABASE_URL=mysql://... on MySQL/MariaDB; the tables are created there if
missing. Without it, job_queue uses the SQLite file. On PostgreSQL and MySQL
workers run in parallel and never wait (a lock wait over 1 s fails the run);
on SQLite they take turns (BEGIN IMMEDIATE), and one may do all the work.
";

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Workers,
    SeedOutbox,
    Relay,
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

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Options>, JobQueueError> {
    let mut options = Options {
        role: Role::Workers,
        workers: WorkerConfig::default(),
        relay: RelayConfig {
            name: format!("relay-{}", std::process::id()),
            ..RelayConfig::default()
        },
        count: 1000,
        sqlite_file: PathBuf::from("job_queue.sqlite"),
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--unsafe" => {
                options.workers.claim = Claim::Naive;
                continue;
            }
            _ => {}
        }
        let value = match inline.or_else(|| args.next()) {
            Some(value) => value,
            None => return Err(JobQueueError::Usage(format!("{flag} needs a value"))),
        };
        match flag.as_str() {
            "--role" => {
                options.role = match value.as_str() {
                    "workers" => Role::Workers,
                    "seed-outbox" => Role::SeedOutbox,
                    "relay" => Role::Relay,
                    "outbox-report" => Role::OutboxReport,
                    _ => return Err(JobQueueError::Usage(format!("unknown role `{value}`"))),
                }
            }
            "--workers" => options.workers.workers = number(&flag, &value)?,
            "--jobs" => options.workers.jobs = number(&flag, &value)?,
            "--count" => options.count = number(&flag, &value)?,
            "--batch" => {
                let batch = number(&flag, &value)?;
                options.workers.batch_size = batch;
                options.relay.batch_size = batch;
            }
            "--think-ms" => {
                let think = Duration::from_millis(number(&flag, &value)?);
                options.workers.think = think;
                options.relay.think = think;
            }
            "--name" if value.is_empty() => {
                return Err(JobQueueError::Usage("--name cannot be empty".into()))
            }
            "--name" => options.relay.name = value,
            "--sqlite-file" => options.sqlite_file = PathBuf::from(value),
            _ => return Err(JobQueueError::Usage(format!("unknown option `{flag}`"))),
        }
    }
    Ok(Some(options))
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, JobQueueError> {
    value
        .parse()
        .map_err(|_| JobQueueError::Usage(format!("{flag}: `{value}` is not a valid number")))
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("job_queue: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match play(&options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("job_queue: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the role; `Ok(false)` if a safe run processed a job twice or left one.
fn play(options: &Options) -> Result<bool, JobQueueError> {
    let (url, shown) = match std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| Backend::from_url(url) != Backend::Sqlite)
    {
        Some(url) => {
            let shown = redact(&url);
            (url, shown)
        }
        None => {
            let path = options.sqlite_file.display().to_string();
            (path.clone(), path)
        }
    };
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

/// The URL without its password, for printing.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _password)) => {
                format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Options>, JobQueueError> {
        parse_args(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn defaults() {
        let options = parse(&[]).unwrap().unwrap();
        assert_eq!(options.role, Role::Workers);
        assert_eq!(options.workers, WorkerConfig::default());
        assert_eq!(options.relay.batch_size, 10);
        assert!(options.relay.name.starts_with("relay-"));
        assert_eq!(options.sqlite_file, PathBuf::from("job_queue.sqlite"));
        assert!(parse(&["-h"]).unwrap().is_none());
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
        .unwrap()
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
        .unwrap()
        .unwrap();
        assert_eq!(options.role, Role::Relay);
        assert_eq!(options.relay.name, "r1");
        assert_eq!(options.relay.batch_size, 5);
        assert_eq!(options.relay.think, Duration::from_millis(20));

        let options = parse(&["--role", "seed-outbox", "--count", "7"])
            .unwrap()
            .unwrap();
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

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(redact("job_queue.sqlite"), "job_queue.sqlite");
    }
}
