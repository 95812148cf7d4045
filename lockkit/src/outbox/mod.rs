//! The transactional outbox and the consumer's inbox (feature `outbox`): a
//! database change and the message that announces it, delivered at least once,
//! applied exactly once.
//!
//! Writing to the database and then publishing to a broker is two writes that
//! can part ways: a crash between them loses the message, or publishes one for a
//! change that was rolled back. The outbox makes it one write:
//!
//! 1. **Enqueue** ([`enqueue`]): the message is a row of `lockkit_outbox`,
//!    inserted in the transaction of the change. Both commit or neither does.
//! 2. **Relay** ([`Relay::publish_batch`]): a relay process claims a batch of
//!    unpublished rows with `FOR UPDATE SKIP LOCKED` ([`queue::claim`](crate::queue::claim)), hands
//!    them to your broker client, and marks each one published only once the
//!    broker has confirmed it (publisher confirms, JetStream acks). Several
//!    relays claim disjoint batches. A failed publish is retried later with
//!    exponential backoff (`attempts`, `next_attempt_at`, `last_error`); with
//!    [`Relay::max_attempts`], a message that failed that often becomes a
//!    **dead letter**, out of the relays' way until [`requeue`]d
//!    ([`dead_letters`] lists them).
//! 3. **Inbox** ([`Inbox::receive`]): the consumer records the message id in
//!    `lockkit_inbox` in the transaction of the message's effect. A redelivered
//!    message finds its id there and is skipped ([`Received::Duplicate`]).
//!
//! Delivery is **at least once**: a relay that dies after the broker confirmed
//! but before its transaction commits leaves the rows unpublished, and the next
//! relay publishes them again; a consumer that dies after its commit but before
//! its ack gets the message again. The inbox turns at-least-once delivery into
//! an exactly-once *effect*.
//!
//! | step | statement (PostgreSQL; the others alike) |
//! | --- | --- |
//! | enqueue | `INSERT INTO lockkit_outbox (topic, payload, created_at, next_attempt_at) VALUES ($1, $2, $3, $4)`, then the new id |
//! | claim | `SELECT .. FROM lockkit_outbox WHERE published_at IS NULL AND next_attempt_at <= $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED` |
//! | confirmed | `UPDATE lockkit_outbox SET published_at = $1 WHERE id = $2 AND published_at IS NULL` |
//! | failed | `UPDATE lockkit_outbox SET attempts = attempts + 1, next_attempt_at = $1, last_error = $2 WHERE id = $3` (a dead letter: `next_attempt_at` = `i64::MAX`, never due) |
//! | dead letters | `SELECT .. FROM lockkit_outbox WHERE published_at IS NULL AND next_attempt_at = $1 ORDER BY id LIMIT $2` |
//! | requeue | `UPDATE lockkit_outbox SET attempts = $1, next_attempt_at = $2 WHERE id = $3 AND published_at IS NULL AND next_attempt_at = $4` |
//! | receive | `INSERT .. INTO lockkit_inbox .. ON CONFLICT DO NOTHING` (MySQL, SQLite: `INSERT IGNORE` / `INSERT OR IGNORE`); the effect runs only if a row was inserted |
//!
//! The relay holds its claimed rows locked (a transaction open) while the broker
//! confirms; keep batches small. On SQLite, which has no row locks, relays take
//! turns (`BEGIN IMMEDIATE`), as [`queue`](crate::queue) explains, and every
//! other writer of the database waits for the broker too.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::connection::SimpleConnection;
//! use diesel::prelude::*;
//! use lockkit::outbox::{self, Dialect, Inbox, Received, Relay};
//!
//! let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! conn.batch_execute(outbox::up_sql(Dialect::Sqlite)).unwrap();
//!
//! // The order service: the order and its message in one transaction.
//! let id = conn
//!     .transaction(|conn| {
//!         // .. insert the order ..
//!         outbox::enqueue(conn, "orders", r#"{"order":7,"qty":2}"#)
//!     })
//!     .unwrap();
//!
//! // The relay: publish, and report what the broker confirmed.
//! let mut broker = Vec::new();
//! let relayed = Relay::default()
//!     .publish_batch(&mut conn, 10, |batch| {
//!         broker.extend(batch.iter().map(|m| (m.id, m.payload.clone())));
//!         Ok::<_, lockkit::Error>(vec![Ok(()); batch.len()]) // every message confirmed
//!     })
//!     .unwrap();
//! assert_eq!((relayed.claimed, relayed.published), (1, 1));
//!
//! // The consumer: the effect and the message id commit together; a
//! // redelivery is recognised and skipped.
//! let inbox = Inbox::new("stock").unwrap();
//! // The id names its outbox: a consumer of two services' messages meets two 7s.
//! let message_id = format!("orders/{id}");
//! for _delivery in 0..2 {
//!     let received = inbox.receive(&mut conn, &message_id, |_conn| {
//!         // .. reserve the stock ..
//!         Ok::<_, lockkit::Error>("reserved")
//!     });
//!     println!("{:?}", received.unwrap()); // Applied("reserved"), then Duplicate
//! }
//! # }
//! ```
//!
//! The tables' SQL comes as plain strings, [`up_sql`] and [`down_sql`] per
//! [`Dialect`], to copy into your own migrations. With the feature
//! `outbox-migrations` it also ships as a Diesel migration:
//! `conn.run_pending_migrations(lockkit::outbox::POSTGRES_MIGRATIONS)` (or
//! `MYSQL_MIGRATIONS`, `SQLITE_MIGRATIONS`); [`schema`] has the tables for
//! queries of your own (the backlog, what keeps failing and why). Times are the application's clock
//! in Unix milliseconds: a message is due from its writer's clock, and a relay
//! claims it once its own clock has passed that time, so a writer whose clock
//! runs ahead of the relays' delays its messages by as much (nothing is lost,
//! nor reported). Topics, consumer names and message ids are 1 to 255
//! characters without NUL, payloads any text without NUL; everything travels as
//! bound parameters.

// Without a backend feature nothing implements the store: the feature still builds.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, unused_imports)
)]

pub(crate) mod inbox;
pub(crate) mod store;

use std::time::Duration;

use crate::clock::{millis, now_millis};
use crate::error::Error;
use crate::migrations::Words;
use crate::pessimistic::connection::AsLockingConnection;
use crate::pessimistic::lockable::locked_transaction;
use crate::pessimistic::options::LockOptions;
use crate::retry::RetryPolicy;
use crate::transaction::require_transaction_on;

pub use crate::optimistic::version_trigger::Dialect;
pub use inbox::{Inbox, Received};
pub use store::OutboxStore;

/// `CREATE TABLE lockkit_outbox` and `lockkit_inbox` in the words of one
/// dialect, with the index of the pending messages, which the claim reads in id
/// order: MySQL declares it in the table, PostgreSQL indexes the pending rows
/// alone.
fn outbox_tables(dialect: Dialect, words: &Words) -> String {
    let Words {
        key,
        text,
        serial,
        end,
        ..
    } = words;
    let (in_table, after_table) = match dialect {
        Dialect::Mysql => (
            r#",
    -- The claim reads unpublished rows in id order and stops at its LIMIT. An
    -- index MySQL had to sort would lock every pending row, and SKIP LOCKED
    -- would then leave the other relays nothing.
    INDEX lockkit_outbox_pending (published_at, id)"#,
            "",
        ),
        Dialect::Postgres => (
            "",
            "CREATE INDEX lockkit_outbox_pending ON lockkit_outbox (id) WHERE published_at IS NULL;\n",
        ),
        Dialect::Sqlite => (
            "",
            "CREATE INDEX lockkit_outbox_pending ON lockkit_outbox (published_at, id);\n",
        ),
    };
    format!(
        r#"-- lockkit transactional outbox and inbox (see lockkit::outbox).
-- The outbox: one row per message, written in the transaction of the change it
-- announces; a relay publishes it and sets published_at.
CREATE TABLE lockkit_outbox (
    id {serial},
    topic VARCHAR(255) NOT NULL,
    payload {text} NOT NULL,
    created_at BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error {text},
    published_at BIGINT{in_table}
{end};
{after_table}-- The inbox: one row per message a consumer has applied, written in the
-- transaction of the message's effect. Names are compared byte for byte.
CREATE TABLE lockkit_inbox (
    consumer {key} NOT NULL,
    message_id {key} NOT NULL,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
{end};
"#
    )
}

crate::migrations::shipped_tables! {
    /// `CREATE TABLE lockkit_outbox` and `lockkit_inbox` for `dialect`: put it in a
    /// migration.
    ///
    /// ```
    /// use lockkit::outbox::{up_sql, Dialect};
    /// assert!(up_sql(Dialect::Mysql).contains("CREATE TABLE lockkit_outbox"));
    /// assert!(up_sql(Dialect::Mysql).contains("CREATE TABLE lockkit_inbox"));
    /// ```
    tables: "the outbox tables",
    feature: "outbox-migrations",
    migration: "2026-12-01-000200_lockkit_outbox",
    up: outbox_tables,
    down: "DROP TABLE lockkit_inbox;\nDROP TABLE lockkit_outbox;\n",
}

/// The tables as Diesel sees them, for queries of your own: messages waiting
/// out a backoff (`attempts`, `last_error`), the backlog, the inbox's size.
pub mod schema {
    diesel::table! {
        /// The outbox: one row per message.
        lockkit_outbox (id) {
            /// Increasing; the message's id.
            id -> BigInt,
            /// Where to publish it.
            topic -> Text,
            /// The message body.
            payload -> Text,
            /// When it was enqueued (Unix milliseconds).
            created_at -> BigInt,
            /// Failed publish attempts so far.
            attempts -> Integer,
            /// When a relay may claim it (again).
            next_attempt_at -> BigInt,
            /// Why the last attempt failed.
            last_error -> Nullable<Text>,
            /// When the broker confirmed it; `NULL` until then.
            published_at -> Nullable<BigInt>,
        }
    }

    diesel::table! {
        /// The inbox: one row per message a consumer has applied.
        lockkit_inbox (consumer, message_id) {
            /// The consumer's name.
            consumer -> Text,
            /// The message's id.
            message_id -> Text,
            /// When it was applied (Unix milliseconds).
            received_at -> BigInt,
        }
    }
}

/// The longest topic, consumer name or message id, in characters.
const MAX_NAME: usize = 255;
/// How much of a broker's failure reason is kept in `last_error`, in characters.
const MAX_REASON: usize = 1000;

/// Whether `name` is a valid topic, consumer name or message id.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().count() <= MAX_NAME && !name.contains('\0')
}

/// The `next_attempt_at` of a dead letter: never due, so the relays' claim
/// (`next_attempt_at <= now`) passes it over with no change to its SQL or to
/// the tables.
pub(crate) const DEAD: i64 = i64::MAX;

/// A message the relay gave up on ([`Relay::max_attempts`]), as
/// [`dead_letters`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, diesel::Queryable)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The outbox row's id.
    pub id: i64,
    /// Where it was to be published.
    pub topic: String,
    /// The message body.
    pub payload: String,
    /// Failed publish attempts.
    pub attempts: i32,
    /// When it was enqueued (Unix milliseconds).
    pub created_at: i64,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
}

/// Up to `limit` dead letters, oldest first: messages whose publish failed
/// [`Relay::max_attempts`] times, which no relay claims until they are
/// [`requeue`]d.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use lockkit::outbox::{self, Dialect, Relay};
///
/// let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// conn.batch_execute(outbox::up_sql(Dialect::Sqlite)).unwrap();
/// conn.transaction(|conn| outbox::enqueue(conn, "orders", "{}")).unwrap();
///
/// // A relay that gives up after one failed publish.
/// let relay = Relay { max_attempts: Some(1), ..Relay::default() };
/// let relayed = relay
///     .publish_batch(&mut conn, 10, |batch| {
///         Ok::<_, lockkit::Error>(vec![Err("no route to orders".to_owned()); batch.len()])
///     })
///     .unwrap();
/// assert_eq!(relayed.dead, 1);
///
/// // The dead letters, with why they failed; put one back once the cause is fixed.
/// let dead = outbox::dead_letters(&mut conn, 10).unwrap();
/// assert_eq!(dead[0].last_error.as_deref(), Some("no route to orders"));
/// assert!(outbox::requeue(&mut conn, dead[0].id).unwrap());
/// assert!(outbox::dead_letters(&mut conn, 10).unwrap().is_empty());
///
/// // Due again at once, with its attempts reset.
/// let relayed = relay
///     .publish_batch(&mut conn, 10, |batch| Ok::<_, lockkit::Error>(vec![Ok(()); batch.len()]))
///     .unwrap();
/// assert_eq!(relayed.published, 1);
/// # }
/// ```
///
/// # Errors
///
/// [`Error::InvalidInput`] when `limit` is negative (nothing is sent), or a
/// classified database error; see [`classify`](crate::classify()).
pub fn dead_letters<C>(conn: &mut C, limit: i64) -> Result<Vec<DeadLetter>, Error>
where
    C: AsLockingConnection,
    C::Conn: OutboxStore,
{
    check_dead_letter_limit(limit)?;
    C::Conn::dead_letters(conn.locking_connection(), DEAD, limit)
}

/// A [`dead_letters`] limit, checked before anything is sent: SQLite and
/// MySQL/MariaDB read a negative one as none, PostgreSQL refuses it.
pub(crate) fn check_dead_letter_limit(limit: i64) -> Result<(), Error> {
    match limit < 0 {
        true => Err(Error::InvalidInput("a dead-letter limit is 0 or more")),
        false => Ok(()),
    }
}

/// Puts the dead letter `id` back in the relays' way: due now, with no failed
/// attempts (so it gets [`Relay::max_attempts`] anew); `last_error` is kept.
/// A failed publish may have reached the broker (its confirmation lost): a
/// consumer whose [`Inbox`] has purged the message's record since applies it
/// again ([`Inbox::purge_older_than`]).
/// `false` if `id` is not a dead letter (published, pending, or unknown).
///
/// # Errors
///
/// A classified database error; see [`classify`](crate::classify()).
pub fn requeue<C>(conn: &mut C, id: i64) -> Result<bool, Error>
where
    C: AsLockingConnection,
    C::Conn: OutboxStore,
{
    C::Conn::requeue(conn.locking_connection(), id, DEAD, now_millis())
}

/// A message as the relay claims it.
#[derive(Debug, Clone, PartialEq, Eq, diesel::Queryable)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// The outbox row's id, increasing in commit order per connection: give it to
    /// the broker as the message id, for the consumer's [`Inbox`], with the name
    /// of its outbox (`format!("orders/{id}")`) where a consumer reads from more
    /// than one: two services' outboxes both have a message 7, and the inbox
    /// would take the second for a redelivery of the first. Ids are unique
    /// while the table lives: a table created again, or a database restored
    /// from a backup (its sequence or `AUTO_INCREMENT` set back), issues them
    /// again, and consumers' inboxes drop the new messages as duplicates; name
    /// the outbox's incarnation in the message id then (`orders.2/{id}`).
    /// Relays publish in id order within a batch, but retries, backoff and
    /// several relays reorder delivery: consumers must not rely on it.
    pub id: i64,
    /// Where to publish it (a subject, routing key, topic).
    pub topic: String,
    /// The message body.
    pub payload: String,
    /// Failed publish attempts so far.
    pub attempts: i32,
    /// When it was enqueued (Unix milliseconds).
    pub created_at: i64,
}

/// Writes a message to the outbox in the open transaction, the one that makes
/// the change the message announces; returns its id.
///
/// # Errors
///
/// * [`Error::NotInTransaction`] outside a transaction: the message must commit
///   with its change (wrap both in `conn.transaction(..)`); nothing is sent.
/// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
///   transaction manager is broken (a dropped call's transaction may still be
///   open on the server); nothing is sent.
/// * [`Error::InvalidInput`] when `topic` is empty, longer than 255 characters
///   or contains NUL, or `payload` contains NUL; nothing is sent.
/// * a classified database error; see [`classify`](crate::classify()).
pub fn enqueue<C>(conn: &mut C, topic: &str, payload: &str) -> Result<i64, Error>
where
    C: AsLockingConnection,
    C::Conn: OutboxStore,
{
    let conn = conn.locking_connection();
    check_message(topic, payload)?;
    require_transaction_on(conn)?;
    crate::transaction::require_live(conn)?;
    C::Conn::insert_message(conn, topic, payload, now_millis())
}

/// Checks what [`enqueue`] is asked for, before anything is sent.
pub(crate) fn check_message(topic: &str, payload: &str) -> Result<(), Error> {
    if !valid_name(topic) || payload.contains('\0') {
        return Err(Error::InvalidInput(
            "outbox topics are 1 to 255 characters and payloads any text, without NUL",
        ));
    }
    Ok(())
}

/// The newest time a purge of rows `age` old deletes (to the millisecond).
pub(crate) fn older_than(age: Duration) -> i64 {
    now_millis() - millis(age)
}

/// Checks a relay's batch size, before anything is sent.
pub(crate) fn check_limit(limit: i64) -> Result<(), Error> {
    match limit < 1 {
        true => Err(Error::InvalidInput(
            "a relay claims at least one message per batch",
        )),
        false => Ok(()),
    }
}

/// What the relay writes for one claimed message, as `publish` reported it.
pub(crate) enum Mark {
    /// The broker confirmed it.
    Published(i64),
    /// It failed: its next attempt (or never: `dead`), and why.
    Failed {
        id: i64,
        next_attempt_at: i64,
        reason: String,
        dead: bool,
    },
}

impl Relayed {
    /// Counts one mark written.
    pub(crate) fn count(&mut self, mark: &Mark) {
        match mark {
            Mark::Published(_) => self.published += 1,
            Mark::Failed { dead, .. } => {
                self.failed += 1;
                self.dead += usize::from(*dead);
            }
        }
    }
}

/// Claims up to `limit` messages that are due (unpublished, and past their
/// backoff) and that no other relay holds, oldest first, locking them until the
/// transaction ends: [`queue::claim`](crate::queue::claim) on `lockkit_outbox`. For a relay of your
/// own; [`Relay::publish_batch`] does claim, publish and mark in one call.
///
/// A relay of your own: claim, publish, mark each message in the claiming
/// transaction ([`mark_published`], [`Relay::mark_failed`]), and purge what was
/// published ([`purge_published`]) from a periodic job:
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use lockkit::outbox::{self, Dialect, Relay};
/// use lockkit::{locked_transaction, LockOptions};
///
/// let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// conn.batch_execute(outbox::up_sql(Dialect::Sqlite)).unwrap();
/// conn.transaction(|conn| {
///     outbox::enqueue(conn, "orders", r#"{"order":7}"#)?;
///     outbox::enqueue(conn, "orders", r#"{"order":8}"#)
/// })
/// .unwrap();
///
/// let relay = Relay::default();
/// let retried = locked_transaction(&mut conn, LockOptions::default(), |conn| {
///     let batch = outbox::claim(conn, 10)?;
///     assert_eq!(batch.len(), 2);
///     // The broker confirmed the first and refused the second.
///     assert!(outbox::mark_published(conn, batch[0].id)?);
///     let dead = relay.mark_failed(conn, &batch[1], "broker refused")?;
///     Ok::<_, lockkit::Error>(!dead)
/// })
/// .unwrap();
/// assert!(retried); // the second waits out its backoff, then is claimed again
///
/// // Later, from a periodic job: delete what was published.
/// assert_eq!(outbox::purge_published(&mut conn, Duration::ZERO).unwrap(), 1);
/// # }
/// ```
///
/// Run it in a transaction of its own, as `publish_batch` does: inside one that
/// enqueues, it sees that transaction's uncommitted messages. On MySQL/MariaDB
/// open it at `READ COMMITTED`, as `publish_batch` does: under InnoDB's
/// `REPEATABLE READ` the claim locks the gap where new messages go, and
/// `enqueue`s wait for your relay's broker.
///
/// # Errors
///
/// As [`queue::claim`](crate::queue::claim): [`Error::InvalidInput`] for a
/// negative `limit`, [`Error::NotInTransaction`] outside a transaction,
/// [`Error::Busy`] on SQLite, or a classified database error.
pub fn claim<C>(conn: &mut C, limit: i64) -> Result<Vec<OutboxMessage>, Error>
where
    C: AsLockingConnection,
    C::Conn: OutboxStore,
{
    C::Conn::claim_due(conn.locking_connection(), limit, now_millis())
}

/// Marks a claimed message published (the broker confirmed it); `false` if it
/// already was. Run it in the claiming transaction.
///
/// # Errors
///
/// A classified database error; see [`classify`](crate::classify()).
pub fn mark_published<C>(conn: &mut C, id: i64) -> Result<bool, Error>
where
    C: AsLockingConnection,
    C::Conn: OutboxStore,
{
    C::Conn::mark_published(conn.locking_connection(), id, now_millis())
}

/// Deletes messages published `age` ago or earlier (to the millisecond; with
/// `Duration::ZERO`, every published one); returns how many. Run it from a
/// periodic job.
///
/// # Errors
///
/// A classified database error; see [`classify`](crate::classify()).
pub fn purge_published<C>(conn: &mut C, age: Duration) -> Result<usize, Error>
where
    C: AsLockingConnection,
    C::Conn: OutboxStore,
{
    C::Conn::purge_published(conn.locking_connection(), older_than(age))
}

/// What one [`Relay::publish_batch`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Relayed {
    /// Messages claimed (0: nothing due that no other relay holds).
    pub claimed: usize,
    /// Messages the broker confirmed, now marked published.
    pub published: usize,
    /// Messages that failed, now waiting out their backoff or dead letters.
    pub failed: usize,
    /// Of the failed messages, those that became dead letters
    /// ([`Relay::max_attempts`]).
    pub dead: usize,
}

/// The relay's settings: the backoff after a failed publish.
///
/// After failed attempt `n` a message waits up to `base_delay * 2^(n-1)`, capped
/// at `max_delay`, with full jitter ([`RetryPolicy::delay_after`]), and is then
/// claimed again. By default messages are retried for as long as they fail
/// (watch `attempts` and `last_error`); with `max_attempts`, a message whose
/// publish failed that many times becomes a dead letter instead: no relay
/// claims it again until [`requeue`] puts it back ([`dead_letters`] lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Relay {
    /// The first backoff ceiling. Default 1 s.
    pub base_delay: Duration,
    /// The largest backoff ceiling. Default 5 min.
    pub max_delay: Duration,
    /// After this many failed publishes a message is a dead letter. Default
    /// `None`: retried for ever.
    pub max_attempts: Option<u32>,
}

impl Default for Relay {
    fn default() -> Self {
        Relay {
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            max_attempts: None,
        }
    }
}

impl Relay {
    /// Claims up to `limit` due messages ([`claim`]), hands them to `publish`,
    /// and marks each one as `publish` reports, in one transaction.
    ///
    /// `publish` sends the batch to the broker and waits for its confirmations;
    /// it returns one outcome per message, in the batch's order: `Ok(())`, the
    /// broker confirmed it (it is marked published), or `Err(reason)`, it was
    /// refused or not confirmed (it gets an attempt and a backoff; `reason` is
    /// kept in `last_error`). A message without an outcome (a short list)
    /// counts as failed. If `publish` returns `Err(e)` instead, the
    /// transaction rolls back and nothing is marked: the batch is claimable
    /// again at once, and may have reached the broker (at least once).
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidInput`] when `limit` is below 1; nothing is sent.
    /// * [`Error::AlreadyInTransaction`] inside a transaction; nothing is sent.
    ///   Its claim would see that transaction's own messages, uncommitted, and
    ///   publish them although the transaction may roll back: the relay runs
    ///   in a transaction of its own.
    /// * whatever `publish` returns, untouched (the transaction rolled back).
    /// * lockkit's errors converted into `E`: [`Error::Busy`] on SQLite, a
    ///   classified database error ([`classify`](crate::classify())).
    pub fn publish_batch<C, E, F>(&self, conn: &mut C, limit: i64, publish: F) -> Result<Relayed, E>
    where
        C: AsLockingConnection,
        C::Conn: OutboxStore,
        E: From<Error>,
        F: FnOnce(&[OutboxMessage]) -> Result<Vec<Result<(), String>>, E>,
    {
        check_limit(limit)?;
        let inner = conn.locking_connection();
        crate::transaction::refuse_transaction_or_broken(inner)?;
        C::Conn::before_relay(inner)?;
        locked_transaction(conn, LockOptions::default(), |conn| {
            let batch = C::Conn::claim_due(conn, limit, now_millis())?;
            let mut relayed = Relayed {
                claimed: batch.len(),
                ..Relayed::default()
            };
            if batch.is_empty() {
                return Ok(relayed);
            }
            for mark in self.marks(&batch, publish(&batch)?) {
                write_mark(conn, &mark)?;
                relayed.count(&mark);
            }
            Ok(relayed)
        })
    }

    /// What to write for each claimed message, from `publish`'s outcomes in
    /// the batch's order: a message without one (a short list) failed.
    pub(crate) fn marks(
        &self,
        batch: &[OutboxMessage],
        outcomes: Vec<Result<(), String>>,
    ) -> Vec<Mark> {
        let mut outcomes = outcomes.into_iter();
        batch
            .iter()
            .map(|message| match outcomes.next() {
                Some(Ok(())) => Mark::Published(message.id),
                Some(Err(reason)) => self.failure(message, &reason),
                None => self.failure(message, "no outcome reported"),
            })
            .collect()
    }

    /// Records a failed publish of a claimed message: one more attempt, the next
    /// one after the backoff (or never: a dead letter, once `max_attempts` are
    /// used up), `reason` (its first 1000 characters, NUL dropped) in
    /// `last_error`. Run it in the claiming transaction. `true` when the message
    /// became a dead letter.
    ///
    /// # Errors
    ///
    /// A classified database error; see [`classify`](crate::classify()).
    pub fn mark_failed<C>(
        &self,
        conn: &mut C,
        message: &OutboxMessage,
        reason: &str,
    ) -> Result<bool, Error>
    where
        C: AsLockingConnection,
        C::Conn: OutboxStore,
    {
        self.fail(conn.locking_connection(), message, reason)
    }

    fn fail<S: OutboxStore>(
        &self,
        conn: &mut S,
        message: &OutboxMessage,
        reason: &str,
    ) -> Result<bool, Error> {
        let mark = self.failure(message, reason);
        write_mark(conn, &mark)?;
        Ok(matches!(mark, Mark::Failed { dead: true, .. }))
    }

    /// A failed publish of `message`: one more attempt, the next one after the
    /// backoff (or never, a dead letter, once `max_attempts` are used up), and
    /// `reason`'s first 1000 characters, NUL dropped.
    pub(crate) fn failure(&self, message: &OutboxMessage, reason: &str) -> Mark {
        let attempt = u32::try_from(message.attempts)
            .unwrap_or(0)
            .saturating_add(1);
        let dead = self.max_attempts.is_some_and(|max| attempt >= max);
        let next_attempt_at = if dead {
            DEAD
        } else {
            let delay = RetryPolicy::default()
                .base_delay(self.base_delay)
                .max_delay(self.max_delay)
                .delay_after(attempt);
            now_millis().saturating_add(millis(delay))
        };
        let reason: String = reason
            .chars()
            .filter(|&c| c != '\0')
            .take(MAX_REASON)
            .collect();
        Mark::Failed {
            id: message.id,
            next_attempt_at,
            reason,
            dead,
        }
    }
}

/// Writes one relay mark in the claiming transaction.
fn write_mark<S: OutboxStore>(conn: &mut S, mark: &Mark) -> Result<(), Error> {
    match mark {
        Mark::Published(id) => S::mark_published(conn, *id, now_millis()).map(drop),
        Mark::Failed {
            id,
            next_attempt_at,
            reason,
            ..
        } => S::mark_failed(conn, *id, *next_attempt_at, reason),
    }
}
