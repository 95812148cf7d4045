//! The purchase strategies, written once and instantiated per backend.
//!
//! Diesel's query types are checked per backend, and writing the strategies as
//! generic functions would need a wall of `where` clauses for every statement.
//! Instead [`shop_backend!`] holds the strategy code and is instantiated for each
//! concrete connection type (`PgConnection`, `MysqlConnection`,
//! `SqliteConnection`) whose cargo feature is on. Inside the macro, `Conn` is
//! that connection type.
//!
//! To add a strategy: a variant of [`Strategy`](crate::Strategy), a function
//! `fn name(conn, purchase, config, counters) -> Result<Outcome, ShopError>` in the
//! macro, and an arm in `buy`'s `match`.

use std::ops::AddAssign;

use diesel::r2d2::R2D2Connection;
use diesel::QueryResult;

use crate::models::NewOrder;
use crate::{Backend, Config, ShopError, Strategy};

/// What one purchase attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The order was accepted and the stock written.
    Bought,
    /// Fewer units are left than the buyer wanted; a smaller order may still work.
    NotEnough,
    /// Nothing is left: the buyer goes home.
    SoldOut,
    /// The strategy gave up (retries exhausted); the buyer may try again.
    GaveUp,
}

impl Outcome {
    /// `Some` when `stock` cannot serve `qty`.
    pub(crate) fn refuse(stock: i32, qty: i32) -> Option<Outcome> {
        if stock <= 0 {
            Some(Outcome::SoldOut)
        } else if stock < qty {
            Some(Outcome::NotEnough)
        } else {
            None
        }
    }
}

/// What a buyer saw on the way, summed over all buyers for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Version-checked writes refused as stale (`lockkit::Error::Stale`).
    pub conflicts: u64,
    /// Attempts after the first, made by `lockkit::retry`.
    pub retries: u64,
    /// Purchases abandoned because the retries ran out.
    pub exhausted: u64,
}

impl AddAssign for Counters {
    fn add_assign(&mut self, other: Counters) {
        self.conflicts += other.conflicts;
        self.retries += other.retries;
        self.exhausted += other.exhausted;
    }
}

/// What the database holds after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Rows in `orders`.
    pub orders: i64,
    /// Sum of `orders.qty`.
    pub units_sold: i64,
    /// `items.stock` of the item.
    pub final_stock: i64,
}

/// A connection type the shop runs on; implemented by [`shop_backend!`].
pub(crate) trait ShopConnection: R2D2Connection + 'static {
    /// Which backend this is.
    const BACKEND: Backend;
    /// Session settings for every pooled connection.
    fn configure_session(&mut self) -> QueryResult<()>;
    /// Applies the embedded migrations of this backend.
    fn migrate(&mut self) -> Result<(), ShopError>;
    /// One purchase with `strategy`.
    fn buy(
        &mut self,
        strategy: Strategy,
        purchase: NewOrder,
        config: &Config,
        counters: &mut Counters,
    ) -> Result<Outcome, ShopError>;
    /// Counts orders, units sold and the stock left of [`ITEM_ID`](crate::ITEM_ID).
    fn tally(&mut self) -> Result<Tally, ShopError>;
}

/// No session settings (PostgreSQL, MySQL).
#[allow(dead_code)]
fn no_session_settings<C>(_conn: &mut C) -> QueryResult<()> {
    Ok(())
}

/// SQLite: writers queue for up to 10 s instead of failing with `SQLITE_BUSY`,
/// and WAL lets readers run while one connection writes.
#[cfg(feature = "sqlite")]
fn sqlite_session_settings(conn: &mut diesel::SqliteConnection) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    conn.batch_execute(
        "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )
}

/// Writes the strategies for one connection type. See the [module docs](self).
macro_rules! shop_backend {
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
            use diesel::prelude::*;
            use diesel_migrations::{EmbeddedMigrations, MigrationHarness};
            use lockkit::prelude::*;

            use super::{Counters, Outcome, ShopConnection, Tally};
            use crate::models::{Item, NewOrder};
            use crate::schema::{items, orders};
            use crate::{Backend, Config, ShopError, Strategy, ITEM_ID};

            /// The connection type of this instantiation.
            type Conn = $conn;

            const MIGRATIONS: EmbeddedMigrations = diesel_migrations::embed_migrations!($migrations);

            impl ShopConnection for Conn {
                const BACKEND: Backend = $backend;

                fn configure_session(&mut self) -> QueryResult<()> {
                    $session(self)
                }

                fn migrate(&mut self) -> Result<(), ShopError> {
                    self.run_pending_migrations(MIGRATIONS)
                        .map(drop)
                        .map_err(|e| ShopError::Migration(e.to_string()))
                }

                fn buy(
                    &mut self,
                    strategy: Strategy,
                    purchase: NewOrder,
                    config: &Config,
                    counters: &mut Counters,
                ) -> Result<Outcome, ShopError> {
                    match strategy {
                        Strategy::Naive => naive(self, purchase, config, counters),
                        Strategy::Optimistic => optimistic(self, purchase, config, counters),
                    }
                }

                fn tally(&mut self) -> Result<Tally, ShopError> {
                    let final_stock: i32 = items::table
                        .find(ITEM_ID)
                        .select(items::stock)
                        .first(self)?;
                    // Summed here: SUM(INTEGER) has a different SQL type on every backend.
                    let quantities: Vec<i32> = orders::table
                        .filter(orders::item_id.eq(ITEM_ID))
                        .select(orders::qty)
                        .load(self)?;
                    Ok(Tally {
                        orders: quantities.len() as i64,
                        units_sold: quantities.iter().map(|&q| i64::from(q)).sum(),
                        final_stock: i64::from(final_stock),
                    })
                }
            }

            /// Records the order; the caller's transaction makes it atomic with the
            /// stock write.
            fn insert_order(conn: &mut Conn, purchase: NewOrder) -> QueryResult<()> {
                diesel::insert_into(orders::table)
                    .values(&purchase)
                    .execute(conn)
                    .map(drop)
            }

            /// Read, check, think, write `stock = <what I read> - qty`. Whoever
            /// writes between the read and the write is overwritten: a lost update,
            /// and units sold twice.
            fn naive(
                conn: &mut Conn,
                purchase: NewOrder,
                config: &Config,
                _counters: &mut Counters,
            ) -> Result<Outcome, ShopError> {
                let stock: i32 = items::table
                    .find(purchase.item_id)
                    .select(items::stock)
                    .first(conn)?;
                if let Some(refused) = Outcome::refuse(stock, purchase.qty) {
                    return Ok(refused);
                }
                std::thread::sleep(config.think);
                conn.transaction(|conn| {
                    diesel::update(items::table.find(purchase.item_id))
                        .set(items::stock.eq(stock - purchase.qty))
                        .execute(conn)?;
                    insert_order(conn, purchase)
                })?;
                Ok(Outcome::Bought)
            }

            /// Reload, check, think, `update_versioned` (and the order) in a
            /// transaction, all inside `lockkit::retry`. A write that lost the race
            /// is `Error::Stale`, writes nothing, and is retried from the reload.
            ///
            /// The read is outside the transaction: no lock is held while thinking,
            /// and on SQLite the transaction starts with its write.
            fn optimistic(
                conn: &mut Conn,
                purchase: NewOrder,
                config: &Config,
                counters: &mut Counters,
            ) -> Result<Outcome, ShopError> {
                let result = lockkit::retry(&config.retry, |attempt| {
                    if attempt > 1 {
                        counters.retries += 1;
                    }
                    let mut item = items::table
                        .find(purchase.item_id)
                        .select(Item::as_select())
                        .first(conn)?;
                    if let Some(refused) = Outcome::refuse(item.stock, purchase.qty) {
                        return Ok(refused);
                    }
                    std::thread::sleep(config.think);
                    item.stock -= purchase.qty;
                    let written = conn.transaction(|conn| {
                        item.update_versioned(conn)?;
                        insert_order(conn, purchase)?;
                        Ok::<_, lockkit::Error>(())
                    });
                    if matches!(written, Err(lockkit::Error::Stale(_))) {
                        counters.conflicts += 1;
                    }
                    written.map(|()| Outcome::Bought)
                });
                match result {
                    Err(lockkit::Error::RetriesExhausted { .. }) => {
                        counters.exhausted += 1;
                        Ok(Outcome::GaveUp)
                    }
                    other => Ok(other?),
                }
            }
        }
    };
}

shop_backend! {
    #[cfg(feature = "postgres")]
    mod postgres {
        connection: diesel::PgConnection,
        backend: Backend::Postgres,
        migrations: "migrations/postgres",
        session: super::no_session_settings,
    }
}

shop_backend! {
    #[cfg(feature = "mysql")]
    mod mysql {
        connection: diesel::MysqlConnection,
        backend: Backend::Mysql,
        migrations: "migrations/mysql",
        session: super::no_session_settings,
    }
}

shop_backend! {
    #[cfg(feature = "sqlite")]
    mod sqlite {
        connection: diesel::SqliteConnection,
        backend: Backend::Sqlite,
        migrations: "migrations/sqlite",
        session: super::sqlite_session_settings,
    }
}
