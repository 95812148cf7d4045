//! The consumer's half: apply each message once, however often it arrives.

use std::time::Duration;

use super::{valid_name, OutboxStore};
use crate::clock::now_millis;
use crate::error::Error;
use crate::pessimistic::connection::AsLockingConnection;
use crate::pessimistic::lockable::locked_transaction;
use crate::pessimistic::options::LockOptions;

/// What [`Inbox::receive`] did with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Received<T> {
    /// First delivery: the effect ran and committed with the message's id.
    Applied(T),
    /// The id was already recorded: a redelivery; the effect did not run. Ack it.
    Duplicate,
}

/// A consumer's inbox: the message ids it has applied, in `lockkit_inbox`,
/// under its name (one table serves many consumers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    consumer: String,
}

impl Inbox {
    /// The inbox of the consumer called `consumer`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when `consumer` is empty, longer than 255
    /// characters or contains NUL.
    pub fn new(consumer: &str) -> Result<Self, Error> {
        if !valid_name(consumer) {
            return Err(Error::InvalidInput(
                "inbox consumer names are 1 to 255 characters, without NUL",
            ));
        }
        Ok(Inbox {
            consumer: consumer.to_owned(),
        })
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Applies a message's effect once: in one transaction, records
    /// `message_id` and, if it was not recorded before, runs `apply`.
    ///
    /// Ack the message to the broker after this returns `Ok`, whichever the
    /// variant. Concurrent deliveries of one message (two consumers, a
    /// redelivery while the first is still running) meet at the inbox row's
    /// key: the later one waits for the earlier one's transaction and then
    /// sees [`Received::Duplicate`], or applies the message if the earlier one
    /// rolled back. On SQLite the transaction is `BEGIN IMMEDIATE`, so deliveries
    /// take turns. Nested in an open transaction it runs in a savepoint, and the
    /// record commits with the outer transaction: ack only once that one has
    /// committed (if it rolls back, so do the effect and the record, and the
    /// redelivery must apply the message again).
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidInput`] when `message_id` is empty, longer than 255
    ///   characters or contains NUL; nothing is sent.
    /// * whatever `apply` returns, untouched; the transaction is rolled back,
    ///   the id with it, so a redelivery applies the message again.
    /// * lockkit's errors converted into `E`: [`Error::Busy`] on SQLite,
    ///   [`Error::Deadlock`] (MySQL can pick one of several waiting duplicates;
    ///   don't ack, the redelivery is recognised), or another classified database
    ///   error ([`classify`](crate::classify())).
    pub fn receive<C, T, E, F>(
        &self,
        conn: &mut C,
        message_id: &str,
        apply: F,
    ) -> Result<Received<T>, E>
    where
        C: AsLockingConnection,
        C::Conn: OutboxStore,
        E: From<Error>,
        F: FnOnce(&mut C::Conn) -> Result<T, E>,
    {
        check_message_id(message_id)?;
        locked_transaction(conn, LockOptions::default(), |conn| {
            if !C::Conn::record_received(conn, &self.consumer, message_id, now_millis())? {
                return Ok(Received::Duplicate);
            }
            apply(conn).map(Received::Applied)
        })
    }

    /// Deletes this consumer's ids recorded `age` ago or earlier (to the
    /// millisecond; with `Duration::ZERO`, every one recorded so far); returns
    /// how many.
    /// Keep them longer than the broker may redeliver (its retention and retry
    /// limits), and longer than a producer's relay may publish a message
    /// again: a publish that failed unconfirmed (the broker stored it, its ack
    /// was lost) is retried after its backoff, or, as a dead letter, when you
    /// [`requeue`](crate::outbox::requeue) it, perhaps days later. A message
    /// older than its record would be applied again. Both times come from
    /// the clock of the machine that runs the call (a consumer's when it
    /// records, the purging job's here): keep `age` longer by the largest
    /// difference between those clocks, or a consumer whose clock runs behind
    /// has its records purged early.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use std::time::Duration;
    /// use diesel::connection::SimpleConnection;
    /// use diesel::prelude::*;
    /// use lockkit::outbox::{self, Dialect, Inbox, Received};
    ///
    /// let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// conn.batch_execute(outbox::up_sql(Dialect::Sqlite)).unwrap();
    /// let inbox = Inbox::new("stock").unwrap();
    /// let apply = |_conn: &mut SqliteConnection| Ok::<_, lockkit::Error>(());
    /// inbox.receive(&mut conn, "orders/7", apply).unwrap();
    /// assert_eq!(inbox.receive(&mut conn, "orders/7", apply).unwrap(), Received::Duplicate);
    ///
    /// // From a periodic job: a week is longer than the broker redelivers here.
    /// assert_eq!(inbox.purge_older_than(&mut conn, Duration::from_secs(7 * 24 * 3600)).unwrap(), 0);
    /// // Purged, the id is forgotten: a delivery now would be applied again.
    /// assert_eq!(inbox.purge_older_than(&mut conn, Duration::ZERO).unwrap(), 1);
    /// assert_eq!(inbox.receive(&mut conn, "orders/7", apply).unwrap(), Received::Applied(()));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A classified database error; see [`classify`](crate::classify()).
    pub fn purge_older_than<C>(&self, conn: &mut C, age: Duration) -> Result<usize, Error>
    where
        C: AsLockingConnection,
        C::Conn: OutboxStore,
    {
        C::Conn::purge_received(
            conn.locking_connection(),
            &self.consumer,
            super::older_than(age),
        )
    }
}

/// Checks a message id before anything is sent.
pub(crate) fn check_message_id(message_id: &str) -> Result<(), Error> {
    match valid_name(message_id) {
        true => Ok(()),
        false => Err(Error::InvalidInput(
            "message ids are 1 to 255 characters, without NUL",
        )),
    }
}
