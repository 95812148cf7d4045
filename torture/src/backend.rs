//! The statements, written once and instantiated for each connection type.
//!
//! Diesel checks queries per backend, so [`torture_backend!`] holds the code and is
//! instantiated for `PgConnection`, `MysqlConnection` and `SqliteConnection`; the
//! runner is generic over [`TortureConnection`].

use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection};
use diesel::QueryResult;
use lockkit::Error;

use crate::config::Config;
use crate::stats::{Done, Op, Outcome};

pub type Pooled<C> = PooledConnection<ConnectionManager<C>>;

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

/// A connection type the torture runs on.
pub trait TortureConnection: R2D2Connection + 'static {
    /// `postgres`, `mysql` or `sqlite`.
    const NAME: &'static str;
    /// Session settings for every connection.
    fn session(conn: &mut Self) -> QueryResult<()>;
    /// Drops and creates the tables, installs the version trigger (`--bump
    /// trigger`), seeds the items and the queue.
    fn setup(conn: &mut Self, config: &Config) -> Result<(), Error>;
    /// One attempt at `op`, in its own transaction.
    fn run_op(conn: &mut Pooled<Self>, op: &Op) -> Result<Outcome, Error>;
    /// After a lost connection: whether `op` committed, and what it wrote.
    fn committed(conn: &mut Self, op: &Op) -> Result<Option<Done>, Error>;
    /// Reads the tables.
    fn audit(conn: &mut Self) -> Result<Audit, Error>;
}

/// SQLite: writers queue for up to 10 s (the busy handler) instead of failing at
/// once; WAL lets readers go on while one connection writes.
fn sqlite_session(conn: &mut diesel::SqliteConnection) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL;")
}

fn sqlite_prepare(conn: &mut diesel::SqliteConnection) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    conn.batch_execute("PRAGMA journal_mode = WAL;")
}

fn no_session<C>(_conn: &mut C) -> QueryResult<()> {
    Ok(())
}

macro_rules! torture_backend {
    (
        mod $module:ident {
            connection: $conn:ty,
            name: $name:literal,
            dialect: $dialect:expr,
            session: $session:path,
            prepare: $prepare:path $(,)?
        }
    ) => {
        mod $module {
            use diesel::connection::SimpleConnection;
            use diesel::prelude::*;
            use lockkit::prelude::*;
            use lockkit::{Error, LockOptions};

            use super::{Audit, Pooled, TortureConnection};
            use crate::config::{Bump, Config};
            use crate::model::Item;
            use crate::schema::*;
            use crate::stats::{Done, Op, Outcome, Strategy};

            type Conn = $conn;

            /// Rows per `INSERT` when seeding the queue.
            const CHUNK: usize = 500;

            /// The order's lines and, for a sale, its shipment job: in the
            /// caller's transaction, with the stock change.
            fn record(conn: &mut Conn, op: &Op) -> QueryResult<Done> {
                for (line_no, (item, qty)) in op.lines.iter().enumerate() {
                    diesel::insert_into(torture_order_lines::table)
                        .values((
                            torture_order_lines::op_id.eq(op.id),
                            torture_order_lines::line_no.eq(line_no as i32),
                            torture_order_lines::item_id.eq(*item),
                            torture_order_lines::qty.eq(*qty),
                            torture_order_lines::strategy.eq(op.strategy.name()),
                        ))
                        .execute(conn)?;
                }
                let jobs_created = if op.strategy.sells() {
                    diesel::insert_into(torture_jobs::table)
                        .values((torture_jobs::id.eq(op.id), torture_jobs::done.eq(false)))
                        .execute(conn)?;
                    1
                } else {
                    0
                };
                Ok(Done {
                    lines: op.lines.len() as u64,
                    jobs_created,
                    ..Done::NOTHING
                })
            }

            /// A plain write of the stock (the row is locked), bumping the
            /// version itself only with `--bump explicit` (lockkit's lock already
            /// did).
            fn set_stock(conn: &mut Conn, id: i32, stock: i32, bump: Bump) -> QueryResult<usize> {
                let row = torture_items::table.find(id);
                match bump {
                    Bump::Explicit => diesel::update(row)
                        .set((
                            torture_items::stock.eq(stock),
                            torture_items::lock_version.eq(torture_items::lock_version + 1),
                        ))
                        .execute(conn),
                    Bump::Trigger | Bump::Lockkit | Bump::None => diesel::update(row)
                        .set(torture_items::stock.eq(stock))
                        .execute(conn),
                }
            }

            /// A committed write and the stock it left.
            fn written(done: Done, stock: i32) -> Outcome {
                Outcome::Done(Done {
                    lowest_stock: i64::from(stock),
                    ..done
                })
            }

            fn read_item(conn: &mut Conn, id: i32) -> QueryResult<Item> {
                torture_items::table
                    .find(id)
                    .select(Item::as_select())
                    .first(conn)
            }

            impl TortureConnection for Conn {
                const NAME: &'static str = $name;

                fn session(conn: &mut Self) -> QueryResult<()> {
                    $session(conn)
                }

                fn setup(conn: &mut Self, config: &Config) -> Result<(), Error> {
                    $prepare(conn)?;
                    conn.batch_execute(crate::schema::CREATE_TABLES)?;
                    if config.bump == Bump::Trigger {
                        let sql = lockkit::version_trigger::up_sql(
                            $dialect,
                            "torture_items",
                            "lock_version",
                        )
                        .expect("plain identifiers");
                        conn.batch_execute(&sql)?;
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
                            diesel::insert_into(torture_jobs::table)
                                .values(chunk)
                                .execute(conn)?;
                        }
                        Ok(())
                    })
                }

                fn run_op(pooled: &mut Pooled<Self>, op: &Op) -> Result<Outcome, Error> {
                    match op.strategy {
                        Strategy::Optimistic => {
                            let conn: &mut Conn = pooled;
                            conn.transaction(|conn| {
                                let (id, qty) = op.lines[0];
                                let mut item = read_item(conn, id)?;
                                if item.stock < qty {
                                    return Ok(Outcome::OutOfStock);
                                }
                                item.stock -= qty;
                                item.update_versioned(conn)?;
                                Ok(written(record(conn, op)?, item.stock))
                            })
                        }
                        Strategy::Adaptive => {
                            let conn: &mut Conn = pooled;
                            // In the operation's transaction, as `Optimistic`: the
                            // order line commits with the stock (the locked path
                            // nests as a savepoint).
                            conn.transaction(|conn| {
                                let (id, qty) = op.lines[0];
                                match crate::adaptive::sell(conn, id, qty)? {
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
                                let stock_of = |id: i32| {
                                    rows.iter()
                                        .find(|row| row.id == id)
                                        .map(|row| row.stock)
                                        .ok_or(Error::NotFound)
                                };
                                for (id, qty) in &op.lines {
                                    if stock_of(*id)? < *qty {
                                        return Ok(Outcome::OutOfStock);
                                    }
                                }
                                let mut lowest = i32::MAX;
                                for (id, qty) in &op.lines {
                                    let stock = stock_of(*id)? - qty;
                                    set_stock(conn, *id, stock, op.bump)?;
                                    lowest = lowest.min(stock);
                                }
                                Ok(written(record(conn, op)?, lowest))
                            })
                        }
                        Strategy::Atomic => {
                            let conn: &mut Conn = pooled;
                            conn.transaction(|conn| {
                                let (id, qty) = op.lines[0];
                                let target = torture_items::table
                                    .find(id)
                                    .filter(torture_items::stock.ge(qty));
                                let written = match op.bump {
                                    Bump::Explicit => lockkit::atomic::update_if(
                                        conn,
                                        diesel::update(target).set((
                                            torture_items::stock.eq(torture_items::stock - qty),
                                            torture_items::lock_version
                                                .eq(torture_items::lock_version + 1),
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
                                        diesel::update(target).set(
                                            torture_items::stock.eq(torture_items::stock - qty),
                                        ),
                                    ),
                                };
                                match written {
                                    Ok(_) => Ok(Outcome::Done(record(conn, op)?)),
                                    Err(Error::NoRowMatched) => Ok(Outcome::OutOfStock),
                                    Err(err) => Err(err),
                                }
                            })
                        }
                        Strategy::ByVersion => {
                            let conn: &mut Conn = pooled;
                            conn.transaction(|conn| {
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
                                        Error::NoRowMatched => Error::InvalidInput(
                                            "a claimed job was already done: claimed twice",
                                        ),
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

                fn committed(conn: &mut Self, op: &Op) -> Result<Option<Done>, Error> {
                    if op.strategy == Strategy::SkipLocked {
                        let runs: i64 = torture_job_runs::table
                            .filter(torture_job_runs::op_id.eq(op.id))
                            .count()
                            .get_result(conn)?;
                        return Ok((runs > 0).then_some(Done {
                            jobs_claimed: runs as u64,
                            ..Done::NOTHING
                        }));
                    }
                    let lines: i64 = torture_order_lines::table
                        .filter(torture_order_lines::op_id.eq(op.id))
                        .count()
                        .get_result(conn)?;
                    Ok((lines > 0).then_some(Done {
                        lines: lines as u64,
                        jobs_created: u64::from(op.strategy.sells()),
                        ..Done::NOTHING
                    }))
                }

                fn audit(conn: &mut Self) -> Result<Audit, Error> {
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
            }
        }
    };
}

torture_backend! {
    mod postgres {
        connection: diesel::PgConnection,
        name: "postgres",
        dialect: lockkit::version_trigger::Dialect::Postgres,
        session: super::no_session,
        prepare: super::no_session,
    }
}

torture_backend! {
    mod mysql {
        connection: diesel::MysqlConnection,
        name: "mysql",
        dialect: lockkit::version_trigger::Dialect::Mysql,
        session: super::no_session,
        prepare: super::no_session,
    }
}

torture_backend! {
    mod sqlite {
        connection: diesel::SqliteConnection,
        name: "sqlite",
        dialect: lockkit::version_trigger::Dialect::Sqlite,
        session: super::sqlite_session,
        prepare: super::sqlite_prepare,
    }
}
