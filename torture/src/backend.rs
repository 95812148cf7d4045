//! The statements, written once: every one runs on [`AnyConnection`], Diesel's
//! `#[derive(MultiConnection)]` over the three backends, and lockkit takes it
//! (and a pooled connection to it) as it takes a `PgConnection`.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::version_trigger::Dialect;
use lockkit::{Error, LockOptions};
use lockkit_tests::support::{AnyConnection, AnyPooled, Backend};

use crate::config::{Bump, Config};
use crate::model::Item;
use crate::schema::*;
use crate::statements::{self, SetStock};
use crate::stats::{Done, Op, Outcome, Strategy};

/// Rows per `INSERT` when seeding the queue.
const CHUNK: usize = 500;

/// Everything in the tables at the end of a run.
#[derive(Debug, Default)]
pub struct Audit {
    /// `(id, stock)`, by id.
    pub items: Vec<(i32, i32)>,
    /// `(op_id, item_id, qty, strategy)`.
    pub lines: Vec<(i64, i32, i32, String)>,
    /// `(id, done)`.
    pub jobs: Vec<(i64, bool)>,
    /// `(job_id, op_id)`.
    pub runs: Vec<(i64, i64)>,
}

/// Session settings for every connection. SQLite: writers queue for up to 10 s
/// (the busy handler) instead of failing at once; WAL ([`setup`] turns it on
/// for the database file) lets readers go on while one connection writes.
pub fn session_sql(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL;",
        Backend::Postgres | Backend::Mysql => "",
    }
}

/// [`session_sql`] on a blocking connection.
pub fn session(conn: &mut AnyConnection) -> QueryResult<()> {
    match session_sql(conn.backend()) {
        "" => Ok(()),
        sql => conn.batch_execute(sql),
    }
}

/// `--read-only-sessions` (MySQL/MariaDB): the session refuses writes outside
/// lockkit's transactions, which begin `READ WRITE`. On a Galera node that
/// ends a transaction for another node's write without failing a statement
/// (README, "Galera"), the operation's later writes would otherwise run in
/// autocommit and commit on their own: an order line without its stock
/// change. They fail instead, and lockkit reports the end as a retryable
/// `Error::Deadlock` (nothing of the transaction committed).
pub fn read_only_session(conn: &mut AnyConnection) -> Result<(), Error> {
    match conn {
        AnyConnection::Mysql(conn) => lockkit::read_only_outside_transactions(conn),
        _ => Ok(()),
    }
}

/// The version trigger's SQL dialect of `backend`.
fn dialect(backend: Backend) -> Dialect {
    match backend {
        Backend::Postgres => Dialect::Postgres,
        Backend::Mysql => Dialect::Mysql,
        Backend::Sqlite => Dialect::Sqlite,
    }
}

/// The order's lines and, for a sale, its shipment job: in the
/// caller's transaction, with the stock change.
fn record(conn: &mut AnyConnection, op: &Op) -> QueryResult<Done> {
    for line in statements::order_lines(op) {
        line.execute(conn)?;
    }
    if let Some(job) = statements::shipment_job(op) {
        job.execute(conn)?;
    }
    Ok(Done::recorded(op))
}

/// A plain write of the stock (the row is locked): [`statements::set_stock`].
fn set_stock(conn: &mut AnyConnection, id: i32, stock: i32, bump: Bump) -> QueryResult<usize> {
    match statements::set_stock(id, stock, bump) {
        SetStock::Explicit(update) => update.execute(conn),
        SetStock::Plain(update) => update.execute(conn),
    }
}

/// A committed write and the stock it left.
pub fn written(done: Done, stock: i32) -> Outcome {
    Outcome::Done(Done {
        lowest_stock: i64::from(stock),
        ..done
    })
}

fn read_item(conn: &mut AnyConnection, id: i32) -> QueryResult<Item> {
    statements::read_item(id).first(conn)
}

/// Drops and creates the tables, installs the version trigger (`--bump
/// trigger`), seeds the items and the queue.
pub fn setup(conn: &mut AnyConnection, config: &Config) -> Result<(), Error> {
    if conn.backend() == Backend::Sqlite {
        conn.batch_execute("PRAGMA journal_mode = WAL;")?;
    }
    use lockkit::version_trigger::{down_sql, up_sql};
    let dialect = dialect(conn.backend());
    // The trigger of an earlier run first: on PostgreSQL dropping the table
    // leaves the trigger's function, which `up_sql` would then not replace.
    let down = down_sql(dialect, "torture_items", "lock_version").expect("plain identifiers");
    conn.batch_execute(&down)?;
    conn.batch_execute(crate::schema::CREATE_TABLES)?;
    if config.bump == Bump::Trigger {
        let up = up_sql(dialect, "torture_items", "lock_version").expect("plain identifiers");
        conn.batch_execute(&up)?;
    }
    conn.transaction(|conn| {
        for id in 1..=config.items {
            diesel::insert_into(torture_items::table)
                .values((
                    torture_items::id.eq(id),
                    torture_items::name.eq(format!("item {id}")),
                    torture_items::stock.eq(config.stock),
                    torture_items::lock_version.eq(0),
                ))
                .execute(conn)?;
        }
        let jobs: Vec<_> = (1..=config.jobs)
            .map(|id| (torture_jobs::id.eq(id), torture_jobs::done.eq(false)))
            .collect();
        for chunk in jobs.chunks(CHUNK) {
            // A batch `INSERT`: the enum cannot send one.
            lockkit_tests::on_inner!(conn, |inner| diesel::insert_into(torture_jobs::table)
                .values(chunk)
                .execute(inner))?;
        }
        Ok(())
    })
}

/// The operation's own transaction around lockkit's calls, as an application
/// opens it. lockkit's rather than Diesel's `conn.transaction`: a ROLLBACK that
/// Galera refuses after ending the transaction itself then does not leave the
/// connection's transaction manager broken. A nested lockkit call whose whole
/// transaction the server ended (InnoDB on a deadlock, Galera on a conflict)
/// reports `TransactionAborted`, meant for the owner of the outermost
/// transaction: this is it, so the operation is retried like the cause.
fn transaction<T>(
    pooled: &mut AnyPooled,
    f: impl FnOnce(&mut AnyConnection) -> Result<T, Error>,
) -> Result<T, Error> {
    lockkit::locked_transaction(pooled, LockOptions::default(), f).map_err(|err| match err {
        Error::TransactionAborted(aborted) => aborted.into_cause(),
        other => other,
    })
}

/// One attempt at `op`, in its own transaction.
pub fn run_op(pooled: &mut AnyPooled, op: &Op) -> Result<Outcome, Error> {
    match op.strategy {
        Strategy::Optimistic => transaction(pooled, |conn| {
            let (id, qty) = op.lines[0];
            let mut item = read_item(conn, id)?;
            if item.stock < qty {
                return Ok(Outcome::OutOfStock);
            }
            item.stock -= qty;
            item.update_versioned(conn)?;
            Ok(written(record(conn, op)?, item.stock))
        }),
        Strategy::Adaptive => {
            // In the operation's transaction, as `Optimistic`: the order line
            // commits with the stock (the locked path nests as a savepoint).
            // lockkit::adaptive takes the connection inside the enum.
            transaction(pooled, |conn| {
                let (id, qty) = op.lines[0];
                let sold =
                    lockkit_tests::on_inner!(conn, |inner| crate::adaptive::sell(inner, id, qty))?;
                match sold {
                    Some(item) => Ok(written(record(conn, op)?, item.stock)),
                    None => Ok(Outcome::OutOfStock),
                }
            })
        }
        Strategy::WithLock | Strategy::NoWait => {
            let (id, qty) = op.lines[0];
            let options = match op.strategy {
                Strategy::NoWait => LockOptions::default().nowait(),
                _ => LockOptions::default(),
            };
            // The pooled connection as the workers hold it.
            lockkit::with_lock(pooled, id, options, |conn, item: Item| {
                if item.stock < qty {
                    return Ok(Outcome::OutOfStock);
                }
                set_stock(conn, id, item.stock - qty, op.bump)?;
                Ok(written(record(conn, op)?, item.stock - qty))
            })
        }
        Strategy::LockAll => {
            lockkit::locked_transaction(pooled, LockOptions::default(), |conn| {
                // In random order: lock_all sorts them.
                let keys: Vec<i32> = op.lines.iter().map(|(id, _)| *id).collect();
                let rows = Item::lock_all(conn, &keys)?;
                let Some(stocks) = lock_all_stocks(op, &rows)? else {
                    return Ok(Outcome::OutOfStock);
                };
                let mut lowest = i32::MAX;
                for (id, stock) in stocks {
                    set_stock(conn, id, stock, op.bump)?;
                    lowest = lowest.min(stock);
                }
                Ok(written(record(conn, op)?, lowest))
            })
        }
        Strategy::Atomic => transaction(pooled, |conn| {
            let (id, qty) = op.lines[0];
            let target = torture_items::table
                .find(id)
                .filter(torture_items::stock.ge(qty));
            let written = match op.bump {
                Bump::Explicit => lockkit::atomic::update_if(
                    conn,
                    diesel::update(target).set((
                        torture_items::stock.eq(torture_items::stock - qty),
                        torture_items::lock_version.eq(torture_items::lock_version + 1),
                    )),
                ),
                Bump::Lockkit => Item::update_if(
                    conn,
                    id,
                    torture_items::stock.ge(qty),
                    torture_items::stock.eq(torture_items::stock - qty),
                )
                .map(|()| 1),
                Bump::Trigger | Bump::None => lockkit::atomic::update_if(
                    conn,
                    diesel::update(target).set(torture_items::stock.eq(torture_items::stock - qty)),
                ),
            };
            match written {
                Ok(_) => Ok(Outcome::Done(record(conn, op)?)),
                Err(Error::NoRowMatched) => Ok(Outcome::OutOfStock),
                Err(err) => Err(err),
            }
        }),
        Strategy::ByVersion => {
            transaction(pooled, |conn| {
                let (id, qty) = op.lines[0];
                // The version a client would send back in If-Match.
                let item = read_item(conn, id)?;
                Item::update_by_version(
                    conn,
                    id,
                    item.lock_version,
                    torture_items::stock.eq(item.stock - qty),
                )?;
                Ok(written(record(conn, op)?, item.stock - qty))
            })
        }
        Strategy::SkipLocked => {
            lockkit::locked_transaction(pooled, LockOptions::default(), |conn| {
                let ids: Vec<i64> = lockkit::queue::claim(
                    conn,
                    torture_jobs::table
                        .filter(torture_jobs::done.eq(false))
                        .order(torture_jobs::id)
                        .select(torture_jobs::id),
                    op.batch,
                )?;
                if ids.is_empty() {
                    return Ok(Outcome::QueueEmpty);
                }
                // One primary key at a time (see lockkit::queue).
                for job in &ids {
                    lockkit::atomic::update_if(
                        conn,
                        diesel::update(
                            torture_jobs::table
                                .find(*job)
                                .filter(torture_jobs::done.eq(false)),
                        )
                        .set(torture_jobs::done.eq(true)),
                    )
                    .map_err(|err| match err {
                        Error::NoRowMatched => {
                            Error::InvalidInput("a claimed job was already done: claimed twice")
                        }
                        other => other,
                    })?;
                    diesel::insert_into(torture_job_runs::table)
                        .values((
                            torture_job_runs::job_id.eq(*job),
                            torture_job_runs::op_id.eq(op.id),
                            torture_job_runs::worker.eq(&op.worker),
                        ))
                        .execute(conn)?;
                }
                Ok(Outcome::Done(Done {
                    jobs_claimed: ids.len() as u64,
                    ..Done::NOTHING
                }))
            })
        }
    }
}

/// A `lock_all` order on its locked `rows`: each item's new stock, or `None`
/// when one of them holds less than the order takes (nothing is written).
pub fn lock_all_stocks(op: &Op, rows: &[Item]) -> Result<Option<Vec<(i32, i32)>>, Error> {
    let mut stocks = Vec::with_capacity(op.lines.len());
    for (id, qty) in &op.lines {
        let stock = rows
            .iter()
            .find(|row| row.id == *id)
            .map(|row| row.stock)
            .ok_or(Error::NotFound)?;
        if stock < *qty {
            return Ok(None);
        }
        stocks.push((*id, stock - qty));
    }
    Ok(Some(stocks))
}

/// After a lost connection: whether `op` committed, and what it wrote.
pub fn committed(conn: &mut AnyConnection, op: &Op) -> Result<Option<Done>, Error> {
    let rows: i64 = if op.strategy == Strategy::SkipLocked {
        statements::runs_of(op.id).get_result(conn)?
    } else {
        statements::lines_of(op.id).get_result(conn)?
    };
    Ok(Done::committed(op, rows))
}

/// Reads the tables.
pub fn audit(conn: &mut AnyConnection) -> Result<Audit, Error> {
    Ok(Audit {
        items: torture_items::table
            .order(torture_items::id)
            .select((torture_items::id, torture_items::stock))
            .load(conn)?,
        lines: torture_order_lines::table
            .select((
                torture_order_lines::op_id,
                torture_order_lines::item_id,
                torture_order_lines::qty,
                torture_order_lines::strategy,
            ))
            .load(conn)?,
        jobs: torture_jobs::table
            .select((torture_jobs::id, torture_jobs::done))
            .load(conn)?,
        runs: torture_job_runs::table
            .select((torture_job_runs::job_id, torture_job_runs::op_id))
            .load(conn)?,
    })
}
