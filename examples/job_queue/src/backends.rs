//! The queue's statements, written once: every one runs on
//! [`AnyConnection`](lockkit_tests::support::AnyConnection), Diesel's
//! `#[derive(MultiConnection)]` over the backends whose cargo feature is on, and
//! lockkit takes it as it takes a `PgConnection`.

use std::thread;
use std::time::Duration;

use diesel::dsl::count_star;
use diesel::prelude::*;
use lockkit::bounds::ClaimQuery;
use lockkit::queue;
use lockkit_tests::support::{AnyConnection, Migrations};

use crate::models::{Job, NewJob, NewJobRun, NewOutboxMessage, NewPublication, OutboxMessage};
use crate::schema::{job_runs, jobs, outbox, published};
use crate::{lock_options, Claim, JobAudit, JobQueueError, OutboxAudit, RelayConfig, WorkerConfig};

/// Rows inserted per `INSERT` when seeding (well under every backend's limit on
/// bound parameters).
const SEED_CHUNK: usize = 500;

/// In one transaction, empties `$child`, then `$table` (whose rows `$child`
/// references), and inserts `$count` rows into `$table`, `$row(1)` to
/// `$row($count)`, [`SEED_CHUNK`] per `INSERT`. A macro: the batch `INSERT` runs
/// on the connection inside the enum (which cannot send one), of another type on
/// each backend.
macro_rules! refill {
    ($conn:expr, $child:expr, $table:expr, $count:expr, $row:expr) => {{
        let rows: Vec<_> = (1..=$count).map($row).collect();
        $conn.transaction(|conn| {
            diesel::delete($child).execute(conn)?;
            diesel::delete($table).execute(conn)?;
            for chunk in rows.chunks(SEED_CHUNK) {
                lockkit_tests::on_inner!(conn, |inner| diesel::insert_into($table)
                    .values(chunk)
                    .execute(inner))?;
            }
            Ok(())
        })
    }};
}

/// `SELECT $column, COUNT(*) FROM $table GROUP BY $column` on `$conn`: each
/// value of the column with its number of rows, collected into a map.
macro_rules! count_per {
    ($conn:expr, $table:ident :: $column:ident) => {
        $table::table
            .group_by($table::$column)
            .select(($table::$column, count_star()))
            .load($conn)
            .map(|rows: Vec<_>| rows.into_iter().collect())
    };
}

/// The queue's tables, per backend.
pub(crate) const MIGRATIONS: Migrations = Migrations {
    postgres: Some(diesel_migrations::embed_migrations!("migrations/postgres")),
    mysql: Some(diesel_migrations::embed_migrations!("migrations/mysql")),
    sqlite: Some(diesel_migrations::embed_migrations!("migrations/sqlite")),
};

/// Empties `job_runs` and `jobs`, then enqueues `count` jobs.
pub(crate) fn enqueue_jobs(conn: &mut AnyConnection, count: u32) -> Result<(), JobQueueError> {
    refill!(conn, job_runs::table, jobs::table, count, |n| NewJob {
        payload: format!("job #{n}"),
        done: false,
    })
}

/// Claims and runs one batch as `worker`; returns how many jobs ran (0: the
/// queue is drained).
pub(crate) fn work_batch(
    conn: &mut AnyConnection,
    worker: &str,
    config: &WorkerConfig,
) -> Result<usize, JobQueueError> {
    match config.claim {
        Claim::SkipLocked => skip_locked(conn, worker, config),
        Claim::Naive => naive(conn, worker, config),
    }
}

/// Counts jobs, executions, executions per job and per worker.
pub(crate) fn job_audit(conn: &mut AnyConnection) -> Result<JobAudit, JobQueueError> {
    let jobs: i64 = jobs::table.count().get_result(conn)?;
    let done: i64 = jobs::table
        .filter(jobs::done.eq(true))
        .count()
        .get_result(conn)?;
    let runs: i64 = job_runs::table.count().get_result(conn)?;
    Ok(JobAudit {
        jobs,
        done,
        runs,
        runs_per_job: count_per!(conn, job_runs::job_id)?,
        runs_per_worker: count_per!(conn, job_runs::worker)?,
    })
}

/// Empties `published` and `outbox`, then writes `count` unsent messages.
pub(crate) fn fill_outbox(conn: &mut AnyConnection, count: u32) -> Result<(), JobQueueError> {
    refill!(conn, published::table, outbox::table, count, |n| {
        NewOutboxMessage {
            topic: "orders".into(),
            payload: format!("{{\"order\":{n},\"event\":\"created\"}}"),
            sent: false,
        }
    })
}

/// Claims, publishes and marks sent one batch; returns its size (0: nothing
/// left that nobody holds).
pub(crate) fn relay_batch(
    conn: &mut AnyConnection,
    config: &RelayConfig,
) -> Result<usize, JobQueueError> {
    // The columns, not `OutboxMessage::as_select()`: the claim runs on the
    // connection inside the enum, and `as_select()` names the enum's backend.
    let unsent = outbox::table
        .filter(outbox::sent.eq(false))
        .order(outbox::id)
        .select((outbox::id, outbox::topic, outbox::payload, outbox::sent));
    claim_batch(
        conn,
        unsent,
        config.batch_size,
        |conn, batch: &[OutboxMessage]| {
            for message in batch {
                diesel::insert_into(published::table)
                    .values(NewPublication {
                        outbox_id: message.id,
                        relay: &config.name,
                    })
                    .execute(conn)?;
            }
            // The broker round trip, while the batch is claimed.
            pause(config.think);
            for message in batch {
                // One row by primary key: see `finish`.
                diesel::update(outbox::table.find(message.id))
                    .set(outbox::sent.eq(true))
                    .execute(conn)?;
            }
            Ok(())
        },
    )
}

/// Reads the outbox ids, the published ids and the count per relay.
pub(crate) fn outbox_audit(conn: &mut AnyConnection) -> Result<OutboxAudit, JobQueueError> {
    let outbox_ids: Vec<i32> = outbox::table.select(outbox::id).load(conn)?;
    let sent: i64 = outbox::table
        .filter(outbox::sent.eq(true))
        .count()
        .get_result(conn)?;
    let published_ids: Vec<i32> = published::table
        .select(published::outbox_id)
        .order(published::outbox_id)
        .load(conn)?;
    Ok(OutboxAudit {
        outbox_ids: outbox_ids.into_iter().collect(),
        sent,
        published_ids,
        per_relay: count_per!(conn, published::relay)?,
    })
}

/// The safe claim: `LIMIT n FOR UPDATE SKIP LOCKED` in a locking transaction;
/// run, record and mark done before the commit.
fn skip_locked(
    conn: &mut AnyConnection,
    worker: &str,
    config: &WorkerConfig,
) -> Result<usize, JobQueueError> {
    // The columns, not `Job::as_select()`: see `relay_batch`.
    let pending = jobs::table
        .filter(jobs::done.eq(false))
        .order(jobs::id)
        .select((jobs::id, jobs::payload, jobs::done));
    claim_batch(conn, pending, config.batch_size, |conn, batch: &[Job]| {
        pause(config.think);
        finish(conn, worker, batch)?;
        Ok(())
    })
}

/// In a locking transaction, claims up to `batch_size` rows of `query` with
/// `queue::claim` (`LIMIT n FOR UPDATE SKIP LOCKED`) and, if there are any,
/// lets `work` run on them before the commit. Returns how many it claimed (0:
/// none that nobody holds).
fn claim_batch<M, Q>(
    conn: &mut AnyConnection,
    query: Q,
    batch_size: i64,
    work: impl FnOnce(&mut AnyConnection, &[M]) -> Result<(), JobQueueError>,
) -> Result<usize, JobQueueError>
where
    Q: ClaimQuery<AnyConnection, M>,
{
    let options = lock_options(conn.backend());
    lockkit::locked_transaction(conn, options, |conn| -> Result<usize, JobQueueError> {
        let batch: Vec<M> = queue::claim(conn, query, batch_size)?;
        if batch.is_empty() {
            return Ok(0);
        }
        work(conn, &batch)?;
        Ok(batch.len())
    })
}

/// The unsafe claim: read pending jobs without a lock, run them, then record
/// and mark them done. Whoever reads before this commit gets the same jobs.
fn naive(
    conn: &mut AnyConnection,
    worker: &str,
    config: &WorkerConfig,
) -> Result<usize, JobQueueError> {
    let batch: Vec<Job> = jobs::table
        .filter(jobs::done.eq(false))
        .order(jobs::id)
        .limit(config.batch_size)
        .select(Job::as_select())
        .load(conn)?;
    if batch.is_empty() {
        return Ok(0);
    }
    pause(config.think);
    conn.transaction(|conn| finish(conn, worker, &batch))?;
    Ok(batch.len())
}

/// Marks each job done and records its execution.
///
/// One `UPDATE … WHERE id = ?` per row, never `WHERE id IN (…)`: on a small
/// table MySQL/MariaDB may run the `IN` form as a full scan, and under
/// REPEATABLE READ that scan locks every row it reads, including rows another
/// worker has claimed. Workers would then wait for each other and deadlock,
/// which is what `SKIP LOCKED` is meant to avoid. A primary-key lookup locks the
/// one row.
///
/// The `UPDATE` comes before the `INSERT`: each `job_runs` insert takes a shared
/// lock on its `jobs` row on MySQL (foreign-key check), and two naive workers
/// holding shared locks on the same row would deadlock upgrading them. Updating
/// first makes the second naive worker wait for the first instead. (With `SKIP
/// LOCKED` the rows are already exclusively ours and the order does not matter.)
fn finish(conn: &mut AnyConnection, worker: &str, batch: &[Job]) -> QueryResult<()> {
    for job in batch {
        diesel::update(jobs::table.find(job.id))
            .set(jobs::done.eq(true))
            .execute(conn)?;
        diesel::insert_into(job_runs::table)
            .values(NewJobRun {
                job_id: job.id,
                worker,
            })
            .execute(conn)?;
    }
    Ok(())
}

fn pause(think: Duration) {
    if !think.is_zero() {
        thread::sleep(think);
    }
}
