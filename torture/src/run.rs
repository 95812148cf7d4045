//! The parent (setup, workers, drain, audit) and the worker processes.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};
use lockkit::Error;

use lockkit_tests::support::AnyConnection;

use crate::backend;
use crate::config::Config;
use crate::report;
use crate::stats::{op_id, Op, Outcome, Stats, Strategy};

/// Whether `err` is a retry policy that every attempt of lost a conflict, on a
/// cluster (`--tolerate-outages`): then the operation is run again, as after an
/// outage, until `--grace` ends. A Galera node that holds a connection it
/// stopped answering (see `scripts/galera.sh`) was seen to answer plain reads
/// with a row's previous version while writes found the new one, until it
/// dropped that connection: one operation's versioned write then lost 500
/// attempts in a row (in 2 of about 80 runs, each with connections lost). Such
/// a run is slow, not wrong; the report counts these rounds.
fn is_starved(config: &Config, err: &Error) -> bool {
    config.tolerate_outages && matches!(err, Error::RetriesExhausted { .. })
}

/// The workers' session settings; `read_only`: `--read-only-sessions`.
#[derive(Debug)]
struct Session {
    read_only: bool,
}

impl CustomizeConnection<AnyConnection, diesel::r2d2::Error> for Session {
    fn on_acquire(&self, conn: &mut AnyConnection) -> Result<(), diesel::r2d2::Error> {
        backend::session(conn).map_err(diesel::r2d2::Error::QueryError)?;
        if self.read_only {
            backend::read_only_session(conn).map_err(|err| {
                diesel::r2d2::Error::QueryError(diesel::result::Error::QueryBuilderError(Box::new(
                    err,
                )))
            })?;
        }
        Ok(())
    }
}

fn pool(config: &Config, size: u32) -> Pool<ConnectionManager<AnyConnection>> {
    // Checked-out connections are tested first (r2d2's default): a connection
    // the server dropped is replaced by a fresh one.
    Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .test_on_check_out(true)
        .connection_timeout(if config.tolerate_outages {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(30)
        })
        .connection_customizer(Box::new(Session {
            read_only: config.read_only_sessions,
        }))
        .build_unchecked(ConnectionManager::<AnyConnection>::new(
            crate::nodes::connection_url(config),
        ))
}

/// A dedicated connection; waits for the server up to `--grace` with
/// `--tolerate-outages`.
fn connect(config: &Config) -> Result<AnyConnection, String> {
    let until = Instant::now()
        + if config.tolerate_outages {
            config.grace_time()
        } else {
            Duration::ZERO
        };
    loop {
        let attempt = AnyConnection::open(crate::nodes::connection_url(config))
            .map_err(|e| e.to_string())
            .and_then(|mut conn| {
                backend::session(&mut conn).map_err(|e| e.to_string())?;
                Ok(conn)
            });
        match attempt {
            Ok(conn) => return Ok(conn),
            Err(_) if Instant::now() < until => thread::sleep(Duration::from_millis(200)),
            Err(err) => return Err(err),
        }
    }
}

/// A lost connection or a server error while the server goes away or comes
/// back: with `--tolerate-outages` the operation is retried on a fresh pooled
/// connection. Constraint violations and decoding errors are never an outage.
fn is_outage(err: &Error) -> bool {
    use diesel::result::{DatabaseErrorKind as Kind, Error as Diesel};
    match err {
        Error::ConnectionLost => true,
        Error::Database(Diesel::DatabaseError(kind, _)) => !matches!(
            kind,
            Kind::UniqueViolation
                | Kind::ForeignKeyViolation
                | Kind::NotNullViolation
                | Kind::CheckViolation
                | Kind::ReadOnlyTransaction
        ),
        Error::Database(Diesel::BrokenTransactionManager)
        | Error::Database(Diesel::RollbackErrorOnCommit { .. }) => true,
        _ => false,
    }
}

fn note_outage(stats: &mut Stats, err: &Error) {
    stats.outage_errors += 1;
    let kind = match err {
        Error::ConnectionLost => "Error::ConnectionLost".to_owned(),
        other => format!("Error::Database: {other}"),
    };
    *stats.outages.entry(kind).or_default() += 1;
}

fn describe(err: &Error) -> String {
    format!("{err} ({err:?})")
}

/// Runs `op` to completion: conflicts through `lockkit::retry`, outages (with
/// `--tolerate-outages`) on a fresh pooled connection, after finding out whether
/// the interrupted attempt committed (then it is not run again).
fn perform(
    pool: &Pool<ConnectionManager<AnyConnection>>,
    op: &Op,
    config: &Config,
    give_up: Instant,
    stats: &mut Stats,
) -> Result<Outcome, String> {
    let policy = crate::plan::retry_policy();
    let mut interrupted = false;
    let mut outages = 0;
    loop {
        if Instant::now() > give_up {
            return Err(format!(
                "the database was still unreachable {} s after the end of the run (--grace)",
                config.grace
            ));
        }
        let mut conn = match pool.get() {
            Ok(conn) => conn,
            Err(_) if config.tolerate_outages => {
                stats.pool_errors += 1;
                thread::sleep(Duration::from_millis(100));
                continue;
            }
            Err(err) => return Err(format!("no connection from the pool: {err}")),
        };
        if interrupted {
            match backend::committed(&mut conn, op) {
                Ok(Some(done)) => {
                    stats.confirmed += 1;
                    return Ok(Outcome::Done(done));
                }
                // Rolled back: run it again (`interrupted` is set anew if
                // this attempt is interrupted too).
                Ok(None) => stats.redone += 1,
                Err(err) if is_outage(&err) => {
                    note_outage(stats, &err);
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(err) => return Err(describe(&err)),
            }
        }
        let mut attempts = 0;
        let result = lockkit::retry(&policy, |attempt| {
            attempts = attempt;
            backend::run_op(&mut conn, op)
        });
        stats.per[op.strategy.index()].retries += u64::from(attempts.saturating_sub(1));
        match result {
            Ok(outcome) => return Ok(outcome),
            Err(err) if is_starved(config, &err) => {
                // Nothing committed: every attempt lost a conflict.
                if Instant::now() > give_up {
                    return Err(describe(&err));
                }
                stats.starved += 1;
                drop(conn);
                thread::sleep(Duration::from_millis(50));
            }
            Err(err) if config.tolerate_outages && is_outage(&err) => {
                note_outage(stats, &err);
                outages += 1;
                if outages > 1000 {
                    return Err(format!(
                        "1000 outage errors in a row, last: {}",
                        describe(&err)
                    ));
                }
                // The attempt may have committed just before the connection went.
                interrupted = true;
                drop(conn);
                thread::sleep(Duration::from_millis(50));
            }
            Err(err) => return Err(describe(&err)),
        }
    }
}

fn worker_thread(
    pool: &Pool<ConnectionManager<AnyConnection>>,
    config: &Config,
    process: u32,
    thread: u32,
    deadline: Instant,
) -> Stats {
    let mut stats = Stats {
        threads: 1,
        ..Stats::default()
    };
    let mut rng = crate::plan::thread_rng(config, thread);
    let worker = format!("p{process}t{thread}");
    let give_up = deadline + config.grace_time();
    let mut seq: u32 = 0;
    while Instant::now() < deadline && u64::from(seq) < config.ops && seq < u32::MAX {
        seq += 1;
        let op = crate::plan::next_op(&mut rng, config, op_id(process, thread, seq), &worker);
        match perform(pool, &op, config, give_up, &mut stats) {
            Ok(outcome) => {
                stats.record(op.strategy, outcome);
                let after_outage = stats.outage_errors + stats.pool_errors > 0;
                if after_outage && matches!(outcome, Outcome::Done(_)) {
                    stats.recovered_ops += 1;
                }
            }
            Err(failure) => {
                stats.failures.push(op.failure(failure));
                break;
            }
        }
    }
    stats
}

/// A worker process: a pool, `--threads` threads (with `--async`, tasks: see
/// [`crate::asynchronous`]), a report on stdout.
pub fn worker(config: &Config, process: u32) -> bool {
    if let Err(err) = connect(config)
        .and_then(|mut conn| crate::nodes::catch_up(&mut conn, config).map_err(|e| e.to_string()))
    {
        let mut stats = Stats::default();
        stats
            .failures
            .push(format!("p{process}: the node never had the tables: {err}"));
        print!("{}", stats.to_report());
        return false;
    }
    let deadline = Instant::now() + config.run_time();
    if config.asynchronous {
        let total = crate::asynchronous::worker(config, process, deadline);
        print!("{}", total.to_report());
        return total.failures.is_empty();
    }
    let pool = pool(config, config.threads + 1);
    let mut total = Stats::default();
    thread::scope(|s| {
        let threads: Vec<_> = (0..config.threads)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || worker_thread(pool, config, process, t, deadline))
            })
            .collect();
        for (t, handle) in threads.into_iter().enumerate() {
            match handle.join() {
                Ok(stats) => total.merge(&stats),
                Err(_) => total
                    .failures
                    .push(format!("p{process}t{t}: thread panicked")),
            }
        }
    });
    print!("{}", total.to_report());
    total.failures.is_empty()
}

/// Reads a child's stdout on a thread, so that a full pipe never blocks it.
fn collect_stdout(child: &mut Child) -> thread::JoinHandle<String> {
    let mut stdout = child.stdout.take().expect("piped stdout");
    thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    })
}

/// The parent: setup, workers, drain, audit, report. `true` when everything holds.
pub fn parent(config: &Config) -> bool {
    report::print_header(config.backend().name(), config);
    let setup = connect(config).and_then(|mut conn| {
        backend::setup(&mut conn, config).map_err(|e| format!("setting up the tables: {e}"))
    });
    if let Err(err) = setup {
        eprintln!(
            "lockkit-torture: cannot run on {}: {err}",
            config.display_url()
        );
        return false;
    }

    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("lockkit-torture: cannot find my own executable: {err}");
            return false;
        }
    };
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut children = Vec::new();
    for n in 1..=config.processes {
        let spawned = Command::new(&exe)
            .args(config.worker_args(n))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let reader = collect_stdout(&mut child);
                children.push((n, child, reader));
            }
            Err(err) => failures.push(format!("cannot start worker {n}: {err}")),
        }
    }

    // Every worker stops by itself at --seconds (plus --grace through an
    // outage); one that does not is killed.
    let limit = config.run_time() + config.grace_time() + Duration::from_secs(30);
    let mut statuses = vec![None; children.len()];
    loop {
        for (i, (_, child, _)) in children.iter_mut().enumerate() {
            if statuses[i].is_none() {
                if let Ok(Some(status)) = child.try_wait() {
                    statuses[i] = Some(status);
                }
            }
        }
        if statuses.iter().all(Option::is_some) {
            break;
        }
        if started.elapsed() > limit {
            for (i, (n, child, _)) in children.iter_mut().enumerate() {
                if statuses[i].is_none() {
                    failures.push(format!(
                        "worker {n} did not stop within {} s; killed",
                        limit.as_secs()
                    ));
                    let _ = child.kill();
                    statuses[i] = child.wait().ok();
                }
            }
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();

    let mut total = Stats::default();
    for ((n, _, reader), status) in children.into_iter().zip(statuses) {
        let text = reader.join().unwrap_or_default();
        match Stats::parse_report(&text) {
            Ok(stats) => {
                if stats.failures.is_empty() && !status.is_some_and(|s| s.success()) {
                    failures.push(format!("worker {n} exited with {status:?}"));
                }
                total.merge(&stats);
            }
            Err(err) => failures.push(format!(
                "worker {n} ({status:?}) gave no report ({err}); it printed: {}",
                text.trim()
            )),
        }
    }

    // What is left in the queue is drained by the parent, through the same
    // claim, so that at the end every job must have run exactly once.
    let drain_pool = pool(config, 1);
    let mut drained = 0;
    let mut drain_stats = Stats::default();
    let give_up = Instant::now() + config.grace_time();
    for seq in 1.. {
        let op = Op {
            id: op_id(0, 0, seq),
            strategy: Strategy::SkipLocked,
            lines: Vec::new(),
            batch: 200,
            worker: "drain".to_owned(),
            bump: config.bump,
        };
        match perform(&drain_pool, &op, config, give_up, &mut drain_stats) {
            Ok(Outcome::Done(done)) => drained += done.jobs_claimed,
            Ok(_) => break,
            Err(err) => {
                failures.push(format!("draining the queue: {err}"));
                break;
            }
        }
    }
    drop(drain_pool);

    let audit = match connect(config).and_then(|mut conn| {
        crate::nodes::catch_up(&mut conn, config).map_err(|e| e.to_string())?;
        backend::audit(&mut conn).map_err(|e| format!("reading the tables: {e}"))
    }) {
        Ok(audit) => audit,
        Err(err) => {
            eprintln!("lockkit-torture: audit failed: {err}");
            return false;
        }
    };
    failures.extend(total.failures.iter().cloned());
    report::print_run(config, &total, elapsed, drained);
    let checks = report::check(config, &total, drained, &audit, &failures);
    report::print_checks(&checks)
}
