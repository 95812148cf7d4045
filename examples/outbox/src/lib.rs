//! # outbox: at-least-once delivery, exactly-once effect
//!
//! An order service, relays and a consumer, each a process of its own, with
//! lockkit providing the database halves ([`lockkit::outbox`]) and NATS
//! JetStream as the broker ([`broker`]):
//!
//! * **Order service** ([`place_orders`]): each order and its `orders.created`
//!   message are written in one transaction (`outbox::enqueue`).
//! * **Relay** ([`run_relay`], one or more processes): claims batches of
//!   unpublished messages with `FOR UPDATE SKIP LOCKED`, publishes them to
//!   JetStream, waits for JetStream's ack of each one, and only then marks them
//!   published (`Relay::publish_batch`). Runs until the outbox is empty.
//! * **Consumer** ([`run_consumer`]): pulls messages, applies each one's effect
//!   (reserve the stock: `stock.reserved += qty` and a `reservations` row) in
//!   the transaction that records its id in the inbox (`Inbox::receive`), then
//!   acks. A redelivered message is recognised and only acked. A message that
//!   can never be applied (not an order, no `Outbox-Id` header, an item without
//!   stock) is rejected: terminated, so that JetStream delivers it no more, and
//!   counted; one that a deadlock or a busy database stopped is handed back
//!   unacked, to come again. Neither stops the consumer.
//!
//! Both crash windows of at-least-once delivery can be hit on purpose:
//! `--crash-after-publish N` makes a relay exit after JetStream acked its N-th
//! batch but before the marks commit (the batch is published again), and
//! `--crash-after-effect N` makes the consumer exit after its N-th effect
//! committed but before the ack (JetStream redelivers it after [`broker::ACK_WAIT`]).
//! [`audit`] then checks that every order was applied exactly once.
//!
//! The backend follows the URL: `postgres://` or `postgresql://` is
//! PostgreSQL, `mysql://` is MySQL/MariaDB, anything else is a SQLite file path.

#![warn(missing_docs)]

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod backends;
pub mod broker;
mod error;
mod report;

use std::time::Duration;

pub use error::OutboxError;
pub use lockkit_tests::support::Backend;
pub use report::{Audit, ConsumerReport, RelayReport};

/// The exit status of a process that crashed on purpose (`--crash-after-..`).
pub const CRASH_EXIT: i32 = 42;

/// Where the broker is: the NATS server and the stream (its subjects are
/// `<stream>.>`; orders go to `<stream>.created`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// The NATS server, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The JetStream stream: letters, digits, `_` and `-`.
    pub stream: String,
    /// Whether [`setup`] creates the stream on disk, so that it outlives a
    /// restart of the server; else in memory (the default: faster, and the
    /// tests that need no restart leave nothing behind).
    pub on_disk: bool,
}

impl Default for BrokerConfig {
    /// `NATS_URL` or `nats://127.0.0.1:4222`, stream `ORDERS`.
    fn default() -> Self {
        BrokerConfig {
            url: std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
            stream: "ORDERS".into(),
            on_disk: false,
        }
    }
}

impl BrokerConfig {
    /// Connects to the NATS server, for the stream.
    fn connect(&self) -> Result<broker::Broker, OutboxError> {
        broker::Broker::connect(&self.url, &self.stream)
    }
}

/// One relay process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayOptions {
    /// Its name in reports.
    pub name: String,
    /// Messages claimed per transaction.
    pub batch: i64,
    /// Exit (status [`CRASH_EXIT`]) after JetStream acked batch number `n`,
    /// before the marks commit.
    pub crash_after_publish: Option<u32>,
    /// A pause after each batch (outside the transaction), so that relays
    /// started together all get batches.
    pub pause: Duration,
}

/// One consumer process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerOptions {
    /// The durable consumer's and the inbox's name.
    pub name: String,
    /// Exit (status [`CRASH_EXIT`]) after effect number `n` committed, before its ack.
    pub crash_after_effect: Option<u32>,
    /// Stop once the consumer has nothing pending and nothing arrived for this long.
    pub idle: Duration,
}

impl Default for ConsumerOptions {
    /// Consumer `stock`, no crash, stops after 2 s idle.
    fn default() -> Self {
        ConsumerOptions {
            name: "stock".into(),
            crash_after_effect: None,
            idle: Duration::from_secs(2),
        }
    }
}

/// The message an order sends: `{"order":7,"item":2,"qty":3}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrderCreated {
    /// The order's id.
    pub order: i32,
    /// The item ordered.
    pub item: i32,
    /// How many.
    pub qty: i32,
}

/// Migrates (the example's tables and lockkit's outbox tables), empties every
/// table, stocks `items` items, and creates the stream anew.
pub fn setup(url: &str, broker: &BrokerConfig, items: i32) -> Result<(), OutboxError> {
    let nats = broker.connect()?;
    backends::setup(url, items)?;
    nats.reset_stream(broker.on_disk)
}

/// The order service: writes `count` orders, each with its message in the
/// same transaction; returns their ids.
pub fn place_orders(url: &str, broker: &BrokerConfig, count: u32) -> Result<Vec<i32>, OutboxError> {
    let subject = broker::Broker::subject(&broker.stream);
    backends::place_orders(url, &subject, count)
}

/// A relay: publishes until the outbox has no unpublished message left (an
/// empty claim while another relay still holds rows waits and claims again).
pub fn run_relay(
    url: &str,
    broker: &BrokerConfig,
    options: &RelayOptions,
) -> Result<RelayReport, OutboxError> {
    if options.batch < 1 {
        return Err(OutboxError::Usage(
            "the batch size must be at least 1".into(),
        ));
    }
    let nats = broker.connect()?;
    backends::run_relay(url, &nats, options)
}

/// The consumer: applies messages through the inbox until it has been idle
/// for `options.idle` with nothing pending.
pub fn run_consumer(
    url: &str,
    broker: &BrokerConfig,
    options: &ConsumerOptions,
) -> Result<ConsumerReport, OutboxError> {
    let nats = broker.connect()?;
    backends::run_consumer(url, &nats, options)
}

/// Reads what the tables and the stream hold.
pub fn audit(url: &str, broker: &BrokerConfig) -> Result<Audit, OutboxError> {
    let nats = broker.connect()?;
    let mut audit = backends::audit(url)?;
    audit.stream_messages = nats.stream_messages()?;
    Ok(audit)
}

/// Deletes the stream.
pub fn delete_stream(broker: &BrokerConfig) -> Result<(), OutboxError> {
    broker.connect()?.delete_stream()
}
