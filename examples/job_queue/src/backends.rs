//! The queue's statements, written once and instantiated per backend.
//!
//! Diesel checks query types per backend, and generic functions over the
//! connection would need a `where` clause per statement. As in the `shop` example,
//! [`queue_backend!`] holds the code and is instantiated for each connection type
//! (`PgConnection`, `MysqlConnection`, `SqliteConnection`) whose cargo feature is
//! on; inside it, `Conn` is that type. The runner is generic over
//! [`QueueConnection`], which every instantiation implements.

use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection};
use diesel::QueryResult;

use crate::{Backend, JobAudit, JobQueueError, OutboxAudit, RelayConfig, WorkerConfig};

/// Rows inserted per `INSERT` when seeding (well under every backend's limit on
/// bound parameters).
const SEED_CHUNK: usize = 500;

/// A connection type the queue runs on; implemented by [`queue_backend!`].
pub(crate) trait QueueConnection: R2D2Connection + 'static {
    /// Which backend this is.
    const BACKEND: Backend;
    /// Session settings for every connection (pooled or not).
    fn configure_session(&mut self) -> QueryResult<()>;
    /// Applies the embedded migrations of this backend.
    fn migrate(&mut self) -> Result<(), JobQueueError>;
    /// Empties `job_runs` and `jobs`, then enqueues `count` jobs.
    fn enqueue_jobs(&mut self, count: u32) -> Result<(), JobQueueError>;
    /// Claims and runs one batch as `worker`; returns how many jobs ran (0: the
    /// queue is drained). Takes the pooled connection as the workers hold it:
    /// lockkit accepts it as it is.
    fn work_batch(
        conn: &mut PooledConnection<ConnectionManager<Self>>,
        worker: &str,
        config: &WorkerConfig,
    ) -> Result<usize, JobQueueError>;
    /// Counts jobs, executions, executions per job and per worker.
    fn job_audit(&mut self) -> Result<JobAudit, JobQueueError>;
    /// Empties `published` and `outbox`, then writes `count` unsent messages.
    fn fill_outbox(&mut self, count: u32) -> Result<(), JobQueueError>;
    /// Claims, publishes and marks sent one batch; returns its size (0: nothing
    /// left that nobody holds).
    fn relay_batch(&mut self, config: &RelayConfig) -> Result<usize, JobQueueError>;
    /// Reads the outbox ids, the published ids and the count per relay.
    fn outbox_audit(&mut self) -> Result<OutboxAudit, JobQueueError>;
}

/// Writes the queue for one connection type. See the [module docs](self).
macro_rules! queue_backend {
    (
        $(#[$meta:meta])*
        mod $module:ident {
            connection: $conn:ty,
            backend: $backend:expr,
            migrations: $migrations:tt,
            session: $session:path $(,)?
        }
    ) => {
        $(#[$meta])*
        mod $module {
            use std::thread;
            use std::time::Duration;

            use diesel::dsl::count_star;
            use diesel::prelude::*;
            use diesel::r2d2::{ConnectionManager, PooledConnection};
            use diesel_migrations::{EmbeddedMigrations, MigrationHarness};
            use lockkit::queue;

            use super::{QueueConnection, SEED_CHUNK};
            use crate::models::{
                Job, NewJob, NewJobRun, NewOutboxMessage, NewPublication, OutboxMessage,
            };
            use crate::schema::{job_runs, jobs, outbox, published};
            use crate::{
                lock_options, Backend, Claim, JobAudit, JobQueueError, OutboxAudit,
                RelayConfig, WorkerConfig,
            };

            /// The connection type of this instantiation.
            type Conn = $conn;
            /// What the workers hold.
            type Pooled = PooledConnection<ConnectionManager<Conn>>;

            const MIGRATIONS: EmbeddedMigrations = diesel_migrations::embed_migrations!($migrations);

            impl QueueConnection for Conn {
                const BACKEND: Backend = $backend;

                fn configure_session(&mut self) -> QueryResult<()> {
                    $session(self)
                }

                fn migrate(&mut self) -> Result<(), JobQueueError> {
                    self.run_pending_migrations(MIGRATIONS)
                        .map(drop)
                        .map_err(|e| JobQueueError::Migration(e.to_string()))
                }

                fn enqueue_jobs(&mut self, count: u32) -> Result<(), JobQueueError> {
                    let new: Vec<NewJob> = (1..=count)
                        .map(|n| NewJob { payload: format!("job #{n}"), done: false })
                        .collect();
                    self.transaction(|conn| {
                        diesel::delete(job_runs::table).execute(conn)?;
                        diesel::delete(jobs::table).execute(conn)?;
                        for chunk in new.chunks(SEED_CHUNK) {
                            diesel::insert_into(jobs::table).values(chunk).execute(conn)?;
                        }
                        Ok(())
                    })
                }

                fn work_batch(
                    conn: &mut Pooled,
                    worker: &str,
                    config: &WorkerConfig,
                ) -> Result<usize, JobQueueError> {
                    match config.claim {
                        Claim::SkipLocked => skip_locked(conn, worker, config),
                        Claim::Naive => naive(conn, worker, config),
                    }
                }

                fn job_audit(&mut self) -> Result<JobAudit, JobQueueError> {
                    let jobs: i64 = jobs::table.count().get_result(self)?;
                    let done: i64 =
                        jobs::table.filter(jobs::done.eq(true)).count().get_result(self)?;
                    let runs: i64 = job_runs::table.count().get_result(self)?;
                    let runs_per_job: Vec<(i32, i64)> = job_runs::table
                        .group_by(job_runs::job_id)
                        .select((job_runs::job_id, count_star()))
                        .load(self)?;
                    let runs_per_worker: Vec<(String, i64)> = job_runs::table
                        .group_by(job_runs::worker)
                        .select((job_runs::worker, count_star()))
                        .load(self)?;
                    Ok(JobAudit {
                        jobs,
                        done,
                        runs,
                        runs_per_job: runs_per_job.into_iter().collect(),
                        runs_per_worker: runs_per_worker.into_iter().collect(),
                    })
                }

                fn fill_outbox(&mut self, count: u32) -> Result<(), JobQueueError> {
                    let new: Vec<NewOutboxMessage> = (1..=count)
                        .map(|n| NewOutboxMessage {
                            topic: "orders".into(),
                            payload: format!("{{\"order\":{n},\"event\":\"created\"}}"),
                            sent: false,
                        })
                        .collect();
                    self.transaction(|conn| {
                        diesel::delete(published::table).execute(conn)?;
                        diesel::delete(outbox::table).execute(conn)?;
                        for chunk in new.chunks(SEED_CHUNK) {
                            diesel::insert_into(outbox::table).values(chunk).execute(conn)?;
                        }
                        Ok(())
                    })
                }

                fn relay_batch(&mut self, config: &RelayConfig) -> Result<usize, JobQueueError> {
                    let relayed = lockkit::locked_transaction(self, lock_options($backend), |conn| -> Result<usize, JobQueueError> {
                        let batch: Vec<OutboxMessage> = queue::claim(
                            conn,
                            outbox::table
                                .filter(outbox::sent.eq(false))
                                .order(outbox::id)
                                .select(OutboxMessage::as_select()),
                            config.batch_size,
                        )?;
                        if batch.is_empty() {
                            return Ok(0);
                        }
                        for message in &batch {
                            diesel::insert_into(published::table)
                                .values(NewPublication {
                                    outbox_id: message.id,
                                    relay: &config.name,
                                })
                                .execute(conn)?;
                        }
                        // The broker round trip, while the batch is claimed.
                        pause(config.think);
                        for message in &batch {
                            // One row by primary key: see `finish`.
                            diesel::update(outbox::table.find(message.id))
                                .set(outbox::sent.eq(true))
                                .execute(conn)?;
                        }
                        Ok(batch.len())
                    })?;
                    Ok(relayed)
                }

                fn outbox_audit(&mut self) -> Result<OutboxAudit, JobQueueError> {
                    let outbox_ids: Vec<i32> = outbox::table.select(outbox::id).load(self)?;
                    let sent: i64 =
                        outbox::table.filter(outbox::sent.eq(true)).count().get_result(self)?;
                    let published_ids: Vec<i32> = published::table
                        .select(published::outbox_id)
                        .order(published::outbox_id)
                        .load(self)?;
                    let per_relay: Vec<(String, i64)> = published::table
                        .group_by(published::relay)
                        .select((published::relay, count_star()))
                        .load(self)?;
                    Ok(OutboxAudit {
                        outbox_ids: outbox_ids.into_iter().collect(),
                        sent,
                        published_ids,
                        per_relay: per_relay.into_iter().collect(),
                    })
                }
            }

            /// The safe claim: `LIMIT n FOR UPDATE SKIP LOCKED` in a locking
            /// transaction; run, record and mark done before the commit.
            fn skip_locked(
                conn: &mut Pooled,
                worker: &str,
                config: &WorkerConfig,
            ) -> Result<usize, JobQueueError> {
                let ran = lockkit::locked_transaction(conn, lock_options($backend), |conn| -> Result<usize, JobQueueError> {
                    let batch: Vec<Job> = queue::claim(
                        conn,
                        jobs::table
                            .filter(jobs::done.eq(false))
                            .order(jobs::id)
                            .select(Job::as_select()),
                        config.batch_size,
                    )?;
                    if batch.is_empty() {
                        return Ok(0);
                    }
                    pause(config.think);
                    finish(conn, worker, &batch)?;
                    Ok(batch.len())
                })?;
                Ok(ran)
            }

            /// The unsafe claim: read pending jobs without a lock, run them, then
            /// record and mark them done. Whoever reads before this commit gets
            /// the same jobs.
            fn naive(
                conn: &mut Pooled,
                worker: &str,
                config: &WorkerConfig,
            ) -> Result<usize, JobQueueError> {
                let conn: &mut Conn = conn;
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
            /// One `UPDATE … WHERE id = ?` per row, never `WHERE id IN (…)`: on a
            /// small table MySQL/MariaDB may run the `IN` form as a full scan, and
            /// under REPEATABLE READ that scan locks every row it reads, including
            /// rows another worker has claimed. Workers would then wait for each
            /// other and deadlock, which is what `SKIP LOCKED` is meant to avoid.
            /// A primary-key lookup locks the one row.
            ///
            /// The `UPDATE` comes before the `INSERT`: each `job_runs` insert takes a
            /// shared lock on its `jobs` row on MySQL (foreign-key check), and two
            /// naive workers holding shared locks on the same row would deadlock
            /// upgrading them. Updating first makes the second naive worker wait
            /// for the first instead. (With `SKIP LOCKED` the rows are already
            /// exclusively ours and the order does not matter.)
            fn finish(conn: &mut Conn, worker: &str, batch: &[Job]) -> QueryResult<()> {
                for job in batch {
                    diesel::update(jobs::table.find(job.id))
                        .set(jobs::done.eq(true))
                        .execute(conn)?;
                    diesel::insert_into(job_runs::table)
                        .values(NewJobRun { job_id: job.id, worker })
                        .execute(conn)?;
                }
                Ok(())
            }

            fn pause(think: Duration) {
                if !think.is_zero() {
                    thread::sleep(think);
                }
            }
        }
    };
}

queue_backend! {
    #[cfg(feature = "postgres")]
    mod postgres {
        connection: diesel::PgConnection,
        backend: Backend::Postgres,
        migrations: "migrations/postgres",
        session: lockkit_tests::support::no_session_settings,
    }
}

queue_backend! {
    #[cfg(feature = "mysql")]
    mod mysql {
        connection: diesel::MysqlConnection,
        backend: Backend::Mysql,
        migrations: "migrations/mysql",
        session: lockkit_tests::support::no_session_settings,
    }
}

queue_backend! {
    #[cfg(feature = "sqlite")]
    mod sqlite {
        connection: diesel::SqliteConnection,
        backend: Backend::Sqlite,
        migrations: "migrations/sqlite",
        session: lockkit_tests::support::sqlite_session_settings,
    }
}
