//! The processes' database work, written once: every statement runs on
//! [`AnyConnection`], Diesel's `#[derive(MultiConnection)]` over the backends
//! whose cargo feature is on; lockkit takes it as it takes a `PgConnection`,
//! its outbox and inbox statements included.

use std::time::{Duration, Instant};

use diesel::dsl::count_star;
use diesel::prelude::*;
use lockkit::outbox::schema::{lockkit_inbox, lockkit_outbox};
use lockkit::outbox::{self, Inbox, Received, Relay};
use lockkit_tests::support::{AnyConnection, Backend, Migrations};

use crate::broker::{Broker, Delivery, MESSAGE_ID_HEADER};
use crate::{
    Audit, ConsumerOptions, ConsumerReport, OrderCreated, OutboxError, RelayOptions, RelayReport,
    CRASH_EXIT,
};

diesel::table! { orders (id) { id -> Integer, item_id -> Integer, qty -> Integer } }
diesel::table! { stock (item_id) { item_id -> Integer, reserved -> Integer } }
diesel::table! { reservations (id) { id -> Integer, order_id -> Integer, qty -> Integer } }

/// The example's tables, per backend.
const MIGRATIONS: Migrations = Migrations {
    postgres: Some(diesel_migrations::embed_migrations!("migrations/postgres")),
    mysql: Some(diesel_migrations::embed_migrations!("migrations/mysql")),
    sqlite: Some(diesel_migrations::embed_migrations!("migrations/sqlite")),
};

/// lockkit's outbox and inbox tables, per backend feature.
const OUTBOX_MIGRATIONS: Migrations<lockkit::migrations::ShippedMigration> = Migrations {
    #[cfg(feature = "postgres")]
    postgres: Some(lockkit::outbox::POSTGRES_MIGRATIONS),
    #[cfg(not(feature = "postgres"))]
    postgres: None,
    #[cfg(feature = "mysql")]
    mysql: Some(lockkit::outbox::MYSQL_MIGRATIONS),
    #[cfg(not(feature = "mysql"))]
    mysql: None,
    #[cfg(feature = "sqlite")]
    sqlite: Some(lockkit::outbox::SQLITE_MIGRATIONS),
    #[cfg(not(feature = "sqlite"))]
    sqlite: None,
};

/// Opens a connection with the session settings.
fn open(url: &str) -> Result<AnyConnection, OutboxError> {
    let mut conn = AnyConnection::open(url)?;
    conn.configure_session()?;
    Ok(conn)
}

pub(crate) fn setup(url: &str, items: i32) -> Result<(), OutboxError> {
    let mut conn = open(url)?;
    conn.migrate(OUTBOX_MIGRATIONS)?;
    conn.migrate(MIGRATIONS)?;
    reset(&mut conn, items)
}

pub(crate) fn place_orders(url: &str, subject: &str, count: u32) -> Result<Vec<i32>, OutboxError> {
    let mut conn = open(url)?;
    let items = i32::try_from(items(&mut conn)?.max(1)).unwrap_or(1);
    let mut ids = Vec::new();
    for n in 0..i32::try_from(count).unwrap_or(i32::MAX) {
        let (item, qty) = (n % items + 1, n % 3 + 1);
        // The order and its message: one transaction, both or neither.
        let id = conn.transaction(|conn| -> Result<i32, OutboxError> {
            let order = OrderCreated {
                order: insert_order(conn, item, qty)?,
                item,
                qty,
            };
            let payload =
                serde_json::to_string(&order).map_err(|e| OutboxError::Usage(e.to_string()))?;
            outbox::enqueue(conn, subject, &payload)?;
            Ok(order.order)
        })?;
        ids.push(id);
    }
    Ok(ids)
}

pub(crate) fn run_relay(
    url: &str,
    broker: &Broker,
    options: &RelayOptions,
) -> Result<RelayReport, OutboxError> {
    let mut conn = open(url)?;
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
        } else if unpublished(&mut conn)? == 0 {
            return Ok(report);
        } else {
            // Held by another relay, or waiting out a backoff.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub(crate) fn run_consumer(
    url: &str,
    broker: &Broker,
    options: &ConsumerOptions,
) -> Result<ConsumerReport, OutboxError> {
    let mut conn = open(url)?;
    let inbox = Inbox::new(&options.name)?;
    let mut report = ConsumerReport::default();
    let mut quiet_since = Instant::now();
    let mut outage = Outage::default();
    loop {
        let deliveries = match broker.fetch(&options.name, 10, Duration::from_millis(300)) {
            Ok(deliveries) => deliveries,
            Err(err) => {
                outage.wait_out(&options.name, err)?;
                continue;
            }
        };
        if deliveries.is_empty() {
            if quiet_since.elapsed() >= options.idle {
                match broker.drained(&options.name) {
                    Ok(true) => return Ok(report),
                    Ok(false) => {}
                    Err(err) => outage.wait_out(&options.name, err)?,
                }
            }
            continue;
        }
        outage = Outage::default();
        quiet_since = Instant::now();
        for delivery in &deliveries {
            report.delivered += 1;
            report.redelivered += u64::from(delivery.delivered > 1);
            let received = match apply(&mut conn, &inbox, delivery) {
                Ok(received) => received,
                // No delivery of it can ever be applied, and an unacked message
                // comes back for ever: terminate it, so that JetStream delivers
                // it no more, and go on with the rest.
                Err(err @ OutboxError::BadMessage { .. }) => {
                    report.rejected += 1;
                    eprintln!("consumer {}: rejected: {err}", options.name);
                    if let Err(err) = broker.reject(delivery) {
                        outage.wait_out(&options.name, err)?;
                    }
                    continue;
                }
                // Caused by another transaction, and rolled back with the id:
                // not acked, the message comes again, and the inbox tells a
                // redelivery of an applied one (lockkit's `Inbox::receive`).
                Err(err) if err.is_retryable() => {
                    report.retried += 1;
                    eprintln!(
                        "consumer {}: {err}; {} comes again",
                        options.name, delivery.message_id
                    );
                    if let Err(err) = broker.retry_later(delivery) {
                        outage.wait_out(&options.name, err)?;
                    }
                    continue;
                }
                Err(err) => return Err(err),
            };
            match received {
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
            // An ack lost with the connection is a redelivery later, which
            // the inbox absorbs.
            if let Err(err) = broker.ack(delivery) {
                outage.wait_out(&options.name, err)?;
            }
        }
    }
}

/// How long a consumer rides out a broker it cannot reach (a restart, a
/// dropped connection) before it gives up with the broker's error.
const OUTAGE_LIMIT: Duration = Duration::from_secs(60);

/// The broker errors in a row: the client reconnects on its own; the consumer
/// waits and tries again, up to [`OUTAGE_LIMIT`].
#[derive(Default)]
struct Outage(Option<Instant>);

impl Outage {
    fn wait_out(&mut self, consumer: &str, err: OutboxError) -> Result<(), OutboxError> {
        let since = *self.0.get_or_insert_with(Instant::now);
        if since.elapsed() > OUTAGE_LIMIT {
            return Err(err);
        }
        eprintln!("consumer {consumer}: {err}; trying again");
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    }
}

/// The message's effect, through the inbox: applied once per message id.
/// [`OutboxError::BadMessage`] for a message that can never be applied: its
/// body is not an order, its `Outbox-Id` header is missing (or not an id the
/// inbox takes), or its item has no stock.
fn apply(
    conn: &mut AnyConnection,
    inbox: &Inbox,
    delivery: &Delivery,
) -> Result<Received<()>, OutboxError> {
    let bad = |reason: String| OutboxError::BadMessage {
        id: delivery.message_id.clone(),
        reason,
    };
    if delivery.message_id.is_empty() {
        return Err(bad(format!("no {MESSAGE_ID_HEADER} header")));
    }
    let order: OrderCreated =
        serde_json::from_slice(&delivery.payload).map_err(|e| bad(e.to_string()))?;
    inbox
        .receive(conn, &delivery.message_id, |conn| reserve(conn, &order))
        .map_err(|err| match err {
            // The id itself (too long, a NUL), refused before anything was sent.
            OutboxError::Lockkit(lockkit::Error::InvalidInput(reason)) => bad(reason.into()),
            OutboxError::BadMessage { reason, .. } => bad(reason),
            other => other,
        })
}

pub(crate) fn audit(url: &str) -> Result<Audit, OutboxError> {
    audit_tables(&mut open(url)?)
}

/// Empties every table and stocks `items` items.
fn reset(conn: &mut AnyConnection, items: i32) -> Result<(), OutboxError> {
    conn.transaction(|conn| -> QueryResult<()> {
        diesel::delete(reservations::table).execute(conn)?;
        diesel::delete(stock::table).execute(conn)?;
        diesel::delete(orders::table).execute(conn)?;
        diesel::delete(lockkit_inbox::table).execute(conn)?;
        diesel::delete(lockkit_outbox::table).execute(conn)?;
        let rows: Vec<_> = (1..=items)
            .map(|item| (stock::item_id.eq(item), stock::reserved.eq(0)))
            .collect();
        // A batch `INSERT`: the enum cannot send one.
        lockkit_tests::on_inner!(conn, |inner| diesel::insert_into(stock::table)
            .values(rows)
            .execute(inner))?;
        Ok(())
    })?;
    Ok(())
}

/// How many items are stocked.
fn items(conn: &mut AnyConnection) -> Result<i64, OutboxError> {
    Ok(stock::table.count().get_result(conn)?)
}

/// Inserts an order row (inside the caller's transaction) and returns the id
/// the database gave it. The database, not `MAX(id) + 1`: two order services
/// reading the same maximum would insert the same id, and one would fail.
/// The id is read back on the connection that inserted it, before the
/// message's insert (whose id `LAST_INSERT_ID()` and `last_insert_rowid()`
/// would give next): `RETURNING` is not on every backend the enum covers.
fn insert_order(conn: &mut AnyConnection, item: i32, qty: i32) -> Result<i32, OutboxError> {
    diesel::insert_into(orders::table)
        .values((orders::item_id.eq(item), orders::qty.eq(qty)))
        .execute(conn)?;
    let last_id = match conn.backend() {
        Backend::Postgres => "currval(pg_get_serial_sequence('orders', 'id'))",
        Backend::Mysql => "CAST(LAST_INSERT_ID() AS SIGNED)",
        Backend::Sqlite => "last_insert_rowid()",
    };
    let id: i64 =
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(last_id)).get_result(conn)?;
    i32::try_from(id).map_err(|e| diesel::result::Error::DeserializationError(e.into()).into())
}

/// The effect of a message: reserve the stock (inside the inbox's transaction).
/// An item without a `stock` row is [`OutboxError::BadMessage`]: the error
/// rolls the transaction back, the inbox's record of the id with it, so the
/// order is not taken for applied; a redelivery would find no row either.
/// Database errors are classified, so that a deadlock here is retried.
fn reserve(conn: &mut AnyConnection, order: &OrderCreated) -> Result<(), OutboxError> {
    let stocked = diesel::update(stock::table.find(order.item))
        .set(stock::reserved.eq(stock::reserved + order.qty))
        .execute(conn)
        .map_err(lockkit::classify)?;
    if stocked == 0 {
        return Err(OutboxError::BadMessage {
            id: String::new(), // `apply` names the message
            reason: format!("no stock row for item {}", order.item),
        });
    }
    diesel::insert_into(reservations::table)
        .values((
            reservations::order_id.eq(order.order),
            reservations::qty.eq(order.qty),
        ))
        .execute(conn)
        .map_err(lockkit::classify)?;
    Ok(())
}

/// Outbox messages not published yet.
fn unpublished(conn: &mut AnyConnection) -> Result<i64, OutboxError> {
    Ok(lockkit_outbox::table
        .filter(lockkit_outbox::published_at.is_null())
        .count()
        .get_result(conn)?)
}

/// Everything [`Audit`] reads from the database.
fn audit_tables(conn: &mut AnyConnection) -> Result<Audit, OutboxError> {
    let per_order: Vec<(i32, i64)> = reservations::table
        .group_by(reservations::order_id)
        .select((reservations::order_id, count_star()))
        .load(conn)?;
    let order_ids: Vec<i32> = orders::table.select(orders::id).load(conn)?;
    let mut not_once: Vec<(i32, i64)> =
        per_order.iter().copied().filter(|&(_, n)| n != 1).collect();
    not_once.extend(
        order_ids
            .iter()
            .filter(|id| !per_order.iter().any(|(o, _)| o == *id))
            .map(|&id| (id, 0)),
    );
    not_once.sort_unstable();
    // Summed here: MySQL's SUM of an integer is a DECIMAL.
    let ordered: Vec<i32> = orders::table.select(orders::qty).load(conn)?;
    let reserved: Vec<i32> = stock::table.select(stock::reserved).load(conn)?;
    Ok(Audit {
        orders: order_ids.len() as i64,
        unpublished: unpublished(conn)?,
        stream_messages: 0,
        inbox: lockkit_inbox::table.count().get_result(conn)?,
        reservations: reservations::table.count().get_result(conn)?,
        not_once,
        ordered_qty: ordered.into_iter().map(i64::from).sum(),
        reserved_qty: reserved.into_iter().map(i64::from).sum(),
    })
}
