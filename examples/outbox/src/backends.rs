//! The processes' database work: generic over [`AppConnection`], whose few
//! backend-specific statements [`app_backend!`] writes once per connection type
//! (Diesel checks query types per backend).

use std::time::{Duration, Instant};

use diesel::Connection;
use lockkit::bounds::OutboxStore;
use lockkit::outbox::{self, Inbox, Received, Relay};

use crate::broker::{Broker, Delivery};
use crate::{
    Audit, ConsumerOptions, ConsumerReport, OrderCreated, OutboxError, RelayOptions, RelayReport,
    CRASH_EXIT,
};

/// A connection the example runs on; implemented by [`app_backend!`].
pub(crate) trait AppConnection:
    Connection + OutboxStore + lockkit::AsLockingConnection<Conn = Self> + 'static
{
    /// Opens a connection with the session settings.
    fn open(url: &str) -> Result<Self, OutboxError>;
    /// Applies the example's and lockkit's migrations.
    fn migrate(&mut self) -> Result<(), OutboxError>;
    /// Empties every table and stocks `items` items.
    fn reset(&mut self, items: i32) -> Result<(), OutboxError>;
    /// The highest order id, 0 when there is none.
    fn last_order(&mut self) -> Result<i32, OutboxError>;
    /// How many items are stocked.
    fn items(&mut self) -> Result<i64, OutboxError>;
    /// Inserts the order row (inside the caller's transaction).
    fn insert_order(&mut self, order: &OrderCreated) -> Result<(), OutboxError>;
    /// The effect of a message: reserve the stock (inside the inbox's transaction).
    fn reserve(&mut self, order: &OrderCreated) -> Result<(), OutboxError>;
    /// Outbox messages not published yet.
    fn unpublished(&mut self) -> Result<i64, OutboxError>;
    /// Everything [`Audit`] reads from the database.
    fn audit(&mut self) -> Result<Audit, OutboxError>;
}

pub(crate) fn setup<C: AppConnection>(url: &str, items: i32) -> Result<(), OutboxError> {
    let mut conn = C::open(url)?;
    conn.migrate()?;
    conn.reset(items)
}

pub(crate) fn place_orders<C: AppConnection>(
    url: &str,
    subject: &str,
    count: u32,
) -> Result<Vec<i32>, OutboxError> {
    let mut conn = C::open(url)?;
    let items = i32::try_from(conn.items()?.max(1)).unwrap_or(1);
    let first = conn.last_order()? + 1;
    let mut ids = Vec::new();
    for n in 0..i32::try_from(count).unwrap_or(i32::MAX) {
        let order = OrderCreated {
            order: first + n,
            item: n % items + 1,
            qty: n % 3 + 1,
        };
        let payload =
            serde_json::to_string(&order).map_err(|e| OutboxError::Usage(e.to_string()))?;
        // The order and its message: one transaction, both or neither.
        conn.transaction(|conn| -> Result<(), OutboxError> {
            conn.insert_order(&order)?;
            outbox::enqueue(conn, subject, &payload)?;
            Ok(())
        })?;
        ids.push(order.order);
    }
    Ok(ids)
}

pub(crate) fn run_relay<C: AppConnection>(
    url: &str,
    broker: &Broker,
    options: &RelayOptions,
) -> Result<RelayReport, OutboxError> {
    let mut conn = C::open(url)?;
    let mut report = RelayReport::default();
    loop {
        let relayed = Relay::default().publish_batch(&mut conn, options.batch, |batch| {
            let outcomes = broker.publish_confirmed(batch);
            if options.crash_after_publish == Some(report.batches as u32 + 1) {
                // JetStream acked the batch; the marks are not committed: the
                // next relay publishes it again.
                eprintln!(
                    "relay {}: crashing after publishing batch {} ({} messages)",
                    options.name,
                    report.batches + 1,
                    batch.len()
                );
                std::process::exit(CRASH_EXIT);
            }
            Ok::<_, OutboxError>(outcomes)
        })?;
        if relayed.claimed > 0 {
            report.batches += 1;
            report.published += relayed.published as u64;
            report.failed += relayed.failed as u64;
            std::thread::sleep(options.pause);
        } else if conn.unpublished()? == 0 {
            return Ok(report);
        } else {
            // Held by another relay, or waiting out a backoff.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub(crate) fn run_consumer<C: AppConnection>(
    url: &str,
    broker: &Broker,
    options: &ConsumerOptions,
) -> Result<ConsumerReport, OutboxError> {
    let mut conn = C::open(url)?;
    let inbox = Inbox::new(&options.name)?;
    let mut report = ConsumerReport::default();
    let mut quiet_since = Instant::now();
    loop {
        let deliveries = broker.fetch(&options.name, 10, Duration::from_millis(300))?;
        if deliveries.is_empty() {
            if quiet_since.elapsed() >= options.idle && broker.drained(&options.name)? {
                return Ok(report);
            }
            continue;
        }
        quiet_since = Instant::now();
        for delivery in &deliveries {
            report.delivered += 1;
            report.redelivered += u64::from(delivery.delivered > 1);
            match apply(&mut conn, &inbox, delivery)? {
                Received::Applied(()) => {
                    report.applied += 1;
                    if options.crash_after_effect == Some(report.applied as u32) {
                        eprintln!(
                            "consumer {}: crashing after the effect of {}, before its ack",
                            options.name, delivery.message_id
                        );
                        std::process::exit(CRASH_EXIT);
                    }
                }
                Received::Duplicate => report.absorbed += 1,
                _ => {}
            }
            broker.ack(delivery)?;
        }
    }
}

/// The message's effect, through the inbox: applied once per message id.
fn apply<C: AppConnection>(
    conn: &mut C,
    inbox: &Inbox,
    delivery: &Delivery,
) -> Result<Received<()>, OutboxError> {
    let order: OrderCreated =
        serde_json::from_slice(&delivery.payload).map_err(|e| OutboxError::BadMessage {
            id: delivery.message_id.clone(),
            reason: e.to_string(),
        })?;
    inbox.receive(conn, &delivery.message_id, |conn| conn.reserve(&order))
}

pub(crate) fn audit<C: AppConnection>(url: &str) -> Result<Audit, OutboxError> {
    C::open(url)?.audit()
}

/// Writes [`AppConnection`] for one connection type.
macro_rules! app_backend {
    ($(#[$meta:meta])* mod $module:ident { connection: $conn:ty, migrations: $migrations:tt, outbox: $outbox:path, session: $session:path $(,)? }) => {
        $(#[$meta])*
        mod $module {
            use diesel::dsl::count_star;
            use diesel::prelude::*;
            use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

            use super::AppConnection;
            use crate::{Audit, OrderCreated, OutboxError};

            diesel::table! { orders (id) { id -> Integer, item_id -> Integer, qty -> Integer } }
            diesel::table! { stock (item_id) { item_id -> Integer, reserved -> Integer } }
            diesel::table! { reservations (id) { id -> Integer, order_id -> Integer, qty -> Integer } }
            use lockkit::outbox::schema::{lockkit_inbox, lockkit_outbox};

            const MIGRATIONS: EmbeddedMigrations = diesel_migrations::embed_migrations!($migrations);

            impl AppConnection for $conn {
                fn open(url: &str) -> Result<Self, OutboxError> {
                    let mut conn = <$conn>::establish(url)?;
                    $session(&mut conn)?;
                    Ok(conn)
                }

                fn migrate(&mut self) -> Result<(), OutboxError> {
                    for migrations in [$outbox, MIGRATIONS] {
                        self.run_pending_migrations(migrations)
                            .map_err(|e| OutboxError::Migration(e.to_string()))?;
                    }
                    Ok(())
                }

                fn reset(&mut self, items: i32) -> Result<(), OutboxError> {
                    self.transaction(|conn| -> QueryResult<()> {
                        diesel::delete(reservations::table).execute(conn)?;
                        diesel::delete(stock::table).execute(conn)?;
                        diesel::delete(orders::table).execute(conn)?;
                        diesel::delete(lockkit_inbox::table).execute(conn)?;
                        diesel::delete(lockkit_outbox::table).execute(conn)?;
                        let rows: Vec<_> = (1..=items).map(|item| (stock::item_id.eq(item), stock::reserved.eq(0))).collect();
                        diesel::insert_into(stock::table).values(rows).execute(conn)?;
                        Ok(())
                    })?;
                    Ok(())
                }

                fn last_order(&mut self) -> Result<i32, OutboxError> {
                    Ok(orders::table.select(diesel::dsl::max(orders::id)).first::<Option<i32>>(self)?.unwrap_or(0))
                }

                fn items(&mut self) -> Result<i64, OutboxError> {
                    Ok(stock::table.count().get_result(self)?)
                }

                fn insert_order(&mut self, order: &OrderCreated) -> Result<(), OutboxError> {
                    diesel::insert_into(orders::table)
                        .values((orders::id.eq(order.order), orders::item_id.eq(order.item), orders::qty.eq(order.qty)))
                        .execute(self)?;
                    Ok(())
                }

                fn reserve(&mut self, order: &OrderCreated) -> Result<(), OutboxError> {
                    diesel::update(stock::table.find(order.item))
                        .set(stock::reserved.eq(stock::reserved + order.qty))
                        .execute(self)?;
                    diesel::insert_into(reservations::table)
                        .values((reservations::order_id.eq(order.order), reservations::qty.eq(order.qty)))
                        .execute(self)?;
                    Ok(())
                }

                fn unpublished(&mut self) -> Result<i64, OutboxError> {
                    Ok(lockkit_outbox::table.filter(lockkit_outbox::published_at.is_null()).count().get_result(self)?)
                }

                fn audit(&mut self) -> Result<Audit, OutboxError> {
                    let per_order: Vec<(i32, i64)> = reservations::table
                        .group_by(reservations::order_id)
                        .select((reservations::order_id, count_star()))
                        .load(self)?;
                    let order_ids: Vec<i32> = orders::table.select(orders::id).load(self)?;
                    let mut not_once: Vec<(i32, i64)> = per_order.iter().copied().filter(|&(_, n)| n != 1).collect();
                    not_once.extend(order_ids.iter().filter(|id| !per_order.iter().any(|(o, _)| o == *id)).map(|&id| (id, 0)));
                    not_once.sort_unstable();
                    // Summed here: MySQL's SUM of an integer is a DECIMAL.
                    let ordered: Vec<i32> = orders::table.select(orders::qty).load(self)?;
                    let reserved: Vec<i32> = stock::table.select(stock::reserved).load(self)?;
                    Ok(Audit {
                        orders: order_ids.len() as i64,
                        unpublished: self.unpublished()?,
                        stream_messages: 0,
                        inbox: lockkit_inbox::table.count().get_result(self)?,
                        reservations: reservations::table.count().get_result(self)?,
                        not_once,
                        ordered_qty: ordered.into_iter().map(i64::from).sum(),
                        reserved_qty: reserved.into_iter().map(i64::from).sum(),
                    })
                }
            }
        }
    };
}

app_backend! {
    #[cfg(feature = "postgres")]
    mod postgres {
        connection: diesel::PgConnection,
        migrations: "migrations/postgres",
        outbox: lockkit::outbox::POSTGRES_MIGRATIONS,
        session: lockkit_tests::support::no_session_settings,
    }
}

app_backend! {
    #[cfg(feature = "mysql")]
    mod mysql {
        connection: diesel::MysqlConnection,
        migrations: "migrations/mysql",
        outbox: lockkit::outbox::MYSQL_MIGRATIONS,
        session: lockkit_tests::support::no_session_settings,
    }
}

app_backend! {
    #[cfg(feature = "sqlite")]
    mod sqlite {
        connection: diesel::SqliteConnection,
        migrations: "migrations/sqlite",
        outbox: lockkit::outbox::SQLITE_MIGRATIONS,
        session: lockkit_tests::support::sqlite_session_settings,
    }
}
