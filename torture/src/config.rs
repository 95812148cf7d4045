//! The command line.

use std::time::Duration;

use lockkit_tests::support::redact;
pub use lockkit_tests::support::Backend;

pub const USAGE: &str = "\
lockkit-torture: every lockkit strategy at once on a few hot rows, from several
processes, then an exact audit of the database

USAGE:
    lockkit-torture --url URL [OPTIONS]

OPTIONS:
    --url URL            postgres://..., mysql://..., or a SQLite file (path or sqlite://path);
                         for a multi-primary cluster (MariaDB Galera), the nodes' URLs,
                         comma-separated: worker process N writes through node N
    --processes N        worker processes, each with its own connection pool   [default: 2]
    --threads N          worker threads per process                             [default: 4]
    --seconds S          stop starting operations after S seconds               [default: 10]
    --ops N              and after N operations per thread                      [default: 1000000]
    --items N            hot rows                                               [default: 4]
    --stock N            initial stock of each item                             [default: 50]
    --jobs N             jobs in the queue before the run                       [default: 50]
    --bump MODE          how writers that do not check the version bump it:
                           trigger   lockkit::version_trigger on the items table [default]
                           explicit  lock_version = lock_version + 1 in their UPDATE
                           lockkit   nothing but lockkit's tools: its row locks bump the
                                     version, the atomic write is Versioned::update_if
                           none      the atomic write does not (plain atomic::update_if):
                                     optimistic writers then lose updates (the audit
                                     must catch it)
    --tolerate-outages   treat lost connections and server errors as an outage: retry
                         with a fresh pooled connection (until --seconds + --grace), and
                         find out whether the interrupted transaction committed
    --grace S            how long past --seconds an outage may last                [default: 60]
    --read-only-sessions MySQL/MariaDB: the workers' sessions are read-only outside
                         lockkit's transactions (SET SESSION TRANSACTION READ ONLY), so a
                         write the server runs after it ended a transaction without an
                         error (Galera) fails instead of committing on its own
    --seed N             random seed                                            [default: from the clock]
    --async              the workers run lockkit::asynchronous on diesel-async: --threads
                         tasks on a multi-threaded tokio runtime over a bb8 pool, with the
                         strategies the async API has (optimistic, with_lock, nowait,
                         lock_all, by_version; the parent drains the queue); and attacks
                         them: futures dropped at random points (tokio::time::timeout with
                         a tiny deadline, JoinHandle::abort). Each worker then checks on the
                         server that no connection of its pool is in a transaction or holds
                         a lock
    --cancel PCT         with --async: the share of operations attacked          [default: 20]
    --pool-ping          with --async: bb8 pings each connection before handing it out
                         (its default, off here): on MySQL a future dropped during the
                         ping leaves the connection out of step with the server, and the
                         run fails
    --leave-open         with --async: at the end each worker leaves a transaction that
                         holds a row lock, opened with raw SQL the pool cannot see, on a
                         pooled connection: the pool check must fail (a test of the check)
    -h, --help           this text

Exit status: 0 when every worker finished without an unexpected error and every
invariant holds; 1 otherwise; 2 for a bad command line.
";

/// How writers that do not check the version (with_lock, lock_all, atomic)
/// keep optimistic writers honest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bump {
    Trigger,
    Explicit,
    /// No trigger, no explicit bump: lockkit's own tools only (its locks bump
    /// the version, the conditional update is `Versioned::update_if`).
    Lockkit,
    None,
}

impl Bump {
    pub fn name(self) -> &'static str {
        match self {
            Bump::Trigger => "trigger",
            Bump::Explicit => "explicit",
            Bump::Lockkit => "lockkit",
            Bump::None => "none",
        }
    }
}

/// The parent (orchestrates and audits) or worker number N (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Parent,
    Worker(u32),
}

#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub processes: u32,
    pub threads: u32,
    pub seconds: f64,
    pub ops: u64,
    pub items: i32,
    pub stock: i32,
    pub jobs: i64,
    pub bump: Bump,
    pub tolerate_outages: bool,
    /// `--read-only-sessions`: see [`crate::backend::session`].
    pub read_only_sessions: bool,
    pub grace: f64,
    pub seed: u64,
    /// `--async`: the workers run on diesel-async.
    pub asynchronous: bool,
    /// `--cancel`: the percentage of async operations whose future is dropped
    /// at a random point.
    pub cancel: u32,
    /// `--pool-ping`: bb8's `test_on_check_out`.
    pub pool_ping: bool,
    /// `--leave-open`: a hidden open transaction for the pool check to catch.
    pub leave_open: bool,
    pub role: Role,
}

impl Config {
    /// `Ok(None)` for `--help`.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Config>, String> {
        let mut config = Config {
            url: String::new(),
            processes: 2,
            threads: 4,
            seconds: 10.0,
            ops: 1_000_000,
            items: 4,
            stock: 50,
            jobs: 50,
            bump: Bump::Trigger,
            tolerate_outages: false,
            read_only_sessions: false,
            grace: 60.0,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
            asynchronous: false,
            cancel: 20,
            pool_ping: false,
            leave_open: false,
            role: Role::Parent,
        };
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    (flag.to_owned(), Some(value.to_owned()))
                }
                _ => (arg.clone(), None),
            };
            let mut value = |name: &str| {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--url" => config.url = value("--url")?,
                "--processes" => config.processes = number(&flag, &value(&flag)?, 1, 64)?,
                "--threads" => config.threads = number(&flag, &value(&flag)?, 1, 256)?,
                "--seconds" => config.seconds = seconds(&flag, &value(&flag)?)?,
                "--ops" => config.ops = number(&flag, &value(&flag)?, 1, u64::MAX)?,
                "--items" => config.items = number(&flag, &value(&flag)?, 1, 1000)?,
                "--stock" => config.stock = number(&flag, &value(&flag)?, 0, 1_000_000_000)?,
                "--jobs" => config.jobs = number(&flag, &value(&flag)?, 0, 10_000_000)?,
                "--bump" => {
                    config.bump = match value(&flag)?.as_str() {
                        "trigger" => Bump::Trigger,
                        "explicit" => Bump::Explicit,
                        "lockkit" => Bump::Lockkit,
                        "none" => Bump::None,
                        other => {
                            return Err(format!(
                                "--bump {other}: trigger, explicit, lockkit or none"
                            ))
                        }
                    }
                }
                "--tolerate-outages" => config.tolerate_outages = true,
                "--read-only-sessions" => config.read_only_sessions = true,
                "--grace" => config.grace = seconds(&flag, &value(&flag)?)?,
                "--seed" => config.seed = number(&flag, &value(&flag)?, 0, u64::MAX)?,
                "--async" => config.asynchronous = true,
                "--cancel" => config.cancel = number(&flag, &value(&flag)?, 0, 100)?,
                "--pool-ping" => config.pool_ping = true,
                "--leave-open" => config.leave_open = true,
                // Internal: how the parent starts its workers.
                "--worker" => config.role = Role::Worker(number(&flag, &value(&flag)?, 1, 64)?),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        if config.url.is_empty() {
            return Err("--url is required".into());
        }
        if config.asynchronous && config.read_only_sessions {
            return Err("--async does not take --read-only-sessions".into());
        }
        if config.asynchronous && config.tolerate_outages {
            return Err("--async does not take --tolerate-outages (yet)".into());
        }
        Ok(Some(config))
    }

    pub fn backend(&self) -> Backend {
        Backend::from_url(&self.url)
    }

    /// Connections per async worker pool: one per task and one more, as the
    /// blocking workers' r2d2 pools.
    pub fn pool_size(&self) -> u32 {
        self.threads + 1
    }

    /// The arguments that start worker `n` with this configuration.
    pub fn worker_args(&self, n: u32) -> Vec<String> {
        let mut args = vec![
            "--worker".to_owned(),
            n.to_string(),
            "--url".to_owned(),
            self.url.clone(),
            "--threads".to_owned(),
            self.threads.to_string(),
            "--seconds".to_owned(),
            self.seconds.to_string(),
            "--ops".to_owned(),
            self.ops.to_string(),
            "--items".to_owned(),
            self.items.to_string(),
            "--bump".to_owned(),
            self.bump.name().to_owned(),
            "--grace".to_owned(),
            self.grace.to_string(),
            "--seed".to_owned(),
            self.seed
                .wrapping_add(u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .to_string(),
        ];
        if self.tolerate_outages {
            args.push("--tolerate-outages".to_owned());
        }
        if self.read_only_sessions {
            args.push("--read-only-sessions".to_owned());
        }
        if self.asynchronous {
            args.push("--async".to_owned());
            args.push("--cancel".to_owned());
            args.push(self.cancel.to_string());
            if self.pool_ping {
                args.push("--pool-ping".to_owned());
            }
            if self.leave_open {
                args.push("--leave-open".to_owned());
            }
        }
        args
    }

    pub fn run_time(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    pub fn grace_time(&self) -> Duration {
        Duration::from_secs_f64(self.grace)
    }

    /// The URL without a password, for printing.
    pub fn display_url(&self) -> String {
        redact(&self.url)
    }
}

fn number<T>(flag: &str, value: &str, min: T, max: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match value.parse::<T>() {
        Ok(n) if n >= min && n <= max => Ok(n),
        _ => Err(format!(
            "{flag} {value}: expected a number from {min} to {max}"
        )),
    }
}

fn seconds(flag: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 7.0 * 24.0 * 3600.0 => Ok(s),
        _ => Err(format!("{flag} {value}: expected seconds, more than 0")),
    }
}
