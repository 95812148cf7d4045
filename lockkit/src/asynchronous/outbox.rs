//! The transactional outbox and the inbox on diesel-async (features `async` and
//! `outbox`): the async twins of [`lockkit::outbox`](crate::outbox)'s calls,
//! with its tables, its statements (built by the blocking side), its checks,
//! its backoff and dead letters, and its errors.
//!
//! | call | blocking twin |
//! | --- | --- |
//! | [`enqueue`] | [`outbox::enqueue`](crate::outbox::enqueue) |
//! | [`publish_batch`] | [`Relay::publish_batch`] |
//! | [`claim`], [`mark_published`], [`mark_failed`] | [`outbox::claim`](crate::outbox::claim), [`outbox::mark_published`](crate::outbox::mark_published), [`Relay::mark_failed`] |
//! | [`dead_letters`], [`requeue`], [`purge_published`] | [`outbox::dead_letters`](crate::outbox::dead_letters), [`outbox::requeue`](crate::outbox::requeue), [`outbox::purge_published`](crate::outbox::purge_published) |
//! | [`receive`], [`purge_received`] | [`Inbox::receive`], [`Inbox::purge_older_than`] |
//!
//! # Cancellation
//!
//! Every step that writes runs in a transaction that a dropped future leaves
//! open on its connection; diesel-async's pools discard such a connection
//! ([cancellation](super::connection#cancellation)), and the server rolls the
//! transaction back. A dropped [`enqueue`] goes with its caller's transaction.
//! A dropped [`publish_batch`] marks nothing: its messages are claimable again
//! and may have reached the broker, so they are published again (at least
//! once, as after a relay's crash). A dropped [`receive`] records nothing: the
//! redelivery applies the message, once. Neither loses a message nor applies
//! one twice.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use lockkit::asynchronous::outbox;
//! use lockkit::outbox::{up_sql, Dialect, Inbox, Received, Relay};
//! use lockkit::LockOptions;
//! # async fn demo() -> Result<(), lockkit::Error> {
//! let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await.unwrap();
//! conn.batch_execute(up_sql(Dialect::Sqlite)).await?;
//!
//! // The order and its message in one transaction.
//! let id = lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |conn| {
//!     // .. insert the order ..
//!     outbox::enqueue(conn, "orders", r#"{"order":7}"#).await
//! })
//! .await?;
//!
//! // The relay: publish, and report what the broker confirmed.
//! let relayed = outbox::publish_batch(&Relay::default(), &mut conn, 10, async |batch| {
//!     Ok::<_, lockkit::Error>(vec![Ok(()); batch.len()])
//! })
//! .await?;
//! assert_eq!((relayed.claimed, relayed.published), (1, 1));
//!
//! // The consumer: a redelivery is recognised and skipped.
//! let inbox = Inbox::new("stock")?;
//! let first = outbox::receive(&inbox, &mut conn, &id.to_string(), async |_conn| Ok::<_, lockkit::Error>("reserved")).await?;
//! let again = outbox::receive(&inbox, &mut conn, &id.to_string(), async |_conn| Ok::<_, lockkit::Error>("reserved")).await?;
//! assert_eq!((first, again), (Received::Applied("reserved"), Received::Duplicate));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use super::connection::{open_locked, refuse_broken, AsyncLockingConnection, Level, Unsettled};
use super::transaction::{end_caught, Panicked};
use super::work::{AsyncWork, ConnWork};
use crate::clock::now_millis;
use crate::error::Error;
use crate::outbox::inbox::check_message_id;
use crate::outbox::{
    check_limit, check_message, older_than, DeadLetter, Inbox, Mark, OutboxMessage, Received,
    Relay, Relayed, DEAD,
};
use crate::pessimistic::options::LockOptions;
use crate::transaction::Failure;

/// Writes a message to the outbox in the open transaction, the one that makes
/// the change the message announces; returns its id:
/// [`outbox::enqueue`](crate::outbox::enqueue) on diesel-async.
///
/// # Errors
///
/// As [`outbox::enqueue`](crate::outbox::enqueue): [`Error::NotInTransaction`]
/// outside a transaction, `BrokenTransactionManager` on a broken connection,
/// [`Error::InvalidInput`], or a classified database error.
pub async fn enqueue<C: AsyncOutboxStore>(
    conn: &mut C,
    topic: &str,
    payload: &str,
) -> Result<i64, Error> {
    check_message(topic, payload)?;
    super::connection::require_transaction(conn)?;
    // As `lock_all`: no level of its own, so a call dropped with a statement
    // in flight on MySQL/MariaDB marks the connection broken.
    let mut unsettled = Unsettled::until_replied(conn);
    let conn = &mut *unsettled.conn;
    let inserted = match super::connection::require_live(conn).await {
        Ok(()) => C::insert_message(conn, topic, payload, now_millis()).await,
        Err(err) => Err(err),
    };
    unsettled.settled();
    inserted
}

/// Claims up to `limit` due messages that no other relay holds, oldest first,
/// locking them until the transaction ends:
/// [`outbox::claim`](crate::outbox::claim) on diesel-async.
///
/// # Errors
///
/// As [`outbox::claim`](crate::outbox::claim) (the checks are
/// [`queue::claim`](super::queue::claim)'s, in its order): [`Error::InvalidInput`]
/// for a negative `limit`, [`Error::NotInTransaction`], [`Error::Busy`] on
/// SQLite, or a classified database error.
///
/// A relay of your own, as in the blocking twin's example: claim, mark each
/// message in the claiming transaction ([`mark_published`], [`mark_failed`]),
/// and purge what was published ([`purge_published`]):
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use diesel_async::{AsyncConnection, SimpleAsyncConnection};
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use lockkit::asynchronous::{locked_transaction, outbox};
/// use lockkit::outbox::{up_sql, Dialect, Relay};
/// use lockkit::LockOptions;
/// # async fn demo() -> Result<(), lockkit::Error> {
/// let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await.unwrap();
/// conn.batch_execute(up_sql(Dialect::Sqlite)).await?;
/// locked_transaction(&mut conn, LockOptions::default(), async |conn| {
///     outbox::enqueue(conn, "orders", r#"{"order":7}"#).await?;
///     outbox::enqueue(conn, "orders", r#"{"order":8}"#).await
/// })
/// .await?;
///
/// let relay = Relay::default();
/// let dead = locked_transaction(&mut conn, LockOptions::default(), async |conn| {
///     let batch = outbox::claim(conn, 10).await?;
///     assert_eq!(batch.len(), 2);
///     // The broker confirmed the first and refused the second.
///     assert!(outbox::mark_published(conn, batch[0].id).await?);
///     outbox::mark_failed(&relay, conn, &batch[1], "broker refused").await
/// })
/// .await?;
/// assert!(!dead); // the second waits out its backoff
/// assert_eq!(outbox::purge_published(&mut conn, Duration::ZERO).await?, 1);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
/// # }
/// ```
pub async fn claim<C: AsyncOutboxStore>(
    conn: &mut C,
    limit: i64,
) -> Result<Vec<OutboxMessage>, Error> {
    C::claim_due(conn, limit, now_millis()).await
}

/// Marks a claimed message published; `false` if it already was:
/// [`outbox::mark_published`](crate::outbox::mark_published) on diesel-async.
///
/// # Errors
///
/// A classified database error.
pub async fn mark_published<C: AsyncOutboxStore>(conn: &mut C, id: i64) -> Result<bool, Error> {
    C::mark_published(conn, id, now_millis()).await
}

/// Records a failed publish of a claimed message (its backoff, or a dead
/// letter); `true` when it became a dead letter:
/// [`Relay::mark_failed`] on diesel-async.
///
/// # Errors
///
/// A classified database error.
pub async fn mark_failed<C: AsyncOutboxStore>(
    relay: &Relay,
    conn: &mut C,
    message: &OutboxMessage,
    reason: &str,
) -> Result<bool, Error> {
    let mark = relay.failure(message, reason);
    write_mark(conn, &mark).await?;
    Ok(matches!(mark, Mark::Failed { dead: true, .. }))
}

/// Deletes messages published `age` ago or earlier; returns how many:
/// [`outbox::purge_published`](crate::outbox::purge_published) on diesel-async.
///
/// # Errors
///
/// [`Error::Database`] with `BrokenTransactionManager` when a dropped call
/// left `conn` in its transaction (nothing is sent), or a classified database
/// error.
pub async fn purge_published<C: AsyncOutboxStore>(
    conn: &mut C,
    age: Duration,
) -> Result<usize, Error> {
    refuse_broken(conn)?;
    C::purge_published(conn, older_than(age)).await
}

/// Up to `limit` dead letters, oldest first:
/// [`outbox::dead_letters`](crate::outbox::dead_letters) on diesel-async.
///
/// # Errors
///
/// As [`outbox::dead_letters`](crate::outbox::dead_letters):
/// [`Error::InvalidInput`] for a negative `limit`, or a classified database
/// error.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel_async::{AsyncConnection, SimpleAsyncConnection};
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use lockkit::asynchronous::{locked_transaction, outbox};
/// use lockkit::outbox::{up_sql, Dialect, Relay};
/// use lockkit::LockOptions;
/// # async fn demo() -> Result<(), lockkit::Error> {
/// let mut conn = SyncConnectionWrapper::<diesel::SqliteConnection>::establish(":memory:").await.unwrap();
/// conn.batch_execute(up_sql(Dialect::Sqlite)).await?;
/// locked_transaction(&mut conn, LockOptions::default(), async |conn| {
///     outbox::enqueue(conn, "orders", "{}").await
/// })
/// .await?;
///
/// // A relay that gives up after one failed publish.
/// let relay = Relay { max_attempts: Some(1), ..Relay::default() };
/// let relayed = outbox::publish_batch(&relay, &mut conn, 10, async |batch| {
///     Ok::<_, lockkit::Error>(vec![Err("no route to orders".to_owned()); batch.len()])
/// })
/// .await?;
/// assert_eq!(relayed.dead, 1);
///
/// let dead = outbox::dead_letters(&mut conn, 10).await?;
/// assert_eq!(dead[0].last_error.as_deref(), Some("no route to orders"));
/// assert!(outbox::requeue(&mut conn, dead[0].id).await?); // due again, attempts reset
/// assert!(outbox::dead_letters(&mut conn, 10).await?.is_empty());
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
/// # }
/// ```
pub async fn dead_letters<C: AsyncOutboxStore>(
    conn: &mut C,
    limit: i64,
) -> Result<Vec<DeadLetter>, Error> {
    crate::outbox::check_dead_letter_limit(limit)?;
    C::dead_letters(conn, DEAD, limit).await
}

/// Puts the dead letter `id` back in the relays' way; `false` if it is not
/// one: [`outbox::requeue`](crate::outbox::requeue) on diesel-async.
///
/// # Errors
///
/// [`Error::Database`] with `BrokenTransactionManager` when a dropped call
/// left `conn` in its transaction (nothing is sent), or a classified database
/// error.
pub async fn requeue<C: AsyncOutboxStore>(conn: &mut C, id: i64) -> Result<bool, Error> {
    refuse_broken(conn)?;
    C::requeue(conn, id, DEAD, now_millis()).await
}

/// Claims up to `limit` due messages, hands them to `publish`, and marks each
/// one as `publish` reports, in one transaction: [`Relay::publish_batch`] on
/// diesel-async, with its outcomes, backoff and errors. `publish` is an
/// `async` closure that sends the batch and waits for the broker's
/// confirmations; see [cancellation](self#cancellation) for a dropped future.
///
/// # Errors
///
/// As [`Relay::publish_batch`].
pub async fn publish_batch<C, E, F>(
    relay: &Relay,
    conn: &mut C,
    limit: i64,
    publish: F,
) -> Result<Relayed, E>
where
    C: AsyncOutboxStore,
    E: From<Error> + Send,
    for<'b> F: AsyncWork<&'b [OutboxMessage], Result<Vec<Result<(), String>>, E>, Fut: Send> + Send,
{
    check_limit(limit)?;
    // Before `began`, which inside a transaction may already ask the server.
    super::connection::refuse_transaction_or_broken(conn)?;
    let began = super::connection::began(conn).await.map_err(E::from)?;
    // For the relay's transaction only, so sent outside any: a step dropped
    // before its `BEGIN` is in diesel-async's books (with the statement's
    // reply unread, or the setting pending for the next user's transaction)
    // marks the connection broken, as `serializable` does for its own.
    {
        let mut unsettled = Unsettled::armed(&mut *conn);
        let set = C::before_relay(unsettled.conn).await;
        unsettled.settled();
        set?;
    }
    let (mut unsettled, restore) = open_locked(conn, &LockOptions::default()).await?;
    let mut level = Level::opened(&mut *unsettled.conn);
    let conn = &mut *level;
    let work = async {
        let batch = C::claim_due(conn, limit, now_millis()).await?;
        let mut relayed = Relayed {
            claimed: batch.len(),
            ..Relayed::default()
        };
        if batch.is_empty() {
            return Ok(relayed);
        }
        let outcomes = publish(&batch).await.map_err(Failure::Closure)?;
        for mark in relay.marks(&batch, outcomes) {
            write_mark(conn, &mark).await?;
            relayed.count(&mark);
        }
        Ok(relayed)
    };
    let worked = Panicked::catch(work).await;
    let ended = end_caught(level, began, restore, worked).await;
    unsettled.settled();
    ended.unwrap_or_else(|panicked| panicked.resume())
}

/// Writes one relay mark in the claiming transaction.
async fn write_mark<C: AsyncOutboxStore>(conn: &mut C, mark: &Mark) -> Result<(), Error> {
    match mark {
        Mark::Published(id) => C::mark_published(conn, *id, now_millis()).await.map(drop),
        Mark::Failed {
            id,
            next_attempt_at,
            reason,
            ..
        } => C::mark_failed(conn, *id, *next_attempt_at, reason).await,
    }
}

/// Applies a message's effect once: in one transaction, records `message_id`
/// in `inbox` and, if it was not recorded before, runs `apply`:
/// [`Inbox::receive`] on diesel-async, with its transaction (`BEGIN IMMEDIATE`
/// on SQLite), its meeting of concurrent deliveries at the inbox row, and its
/// errors.
///
/// # Errors
///
/// As [`Inbox::receive`].
pub async fn receive<C, T, E, F>(
    inbox: &Inbox,
    conn: &mut C,
    message_id: &str,
    apply: F,
) -> Result<Received<T>, E>
where
    C: AsyncOutboxStore,
    T: Send,
    E: From<Error> + Send,
    F: ConnWork<C, T, E>,
{
    check_message_id(message_id)?;
    let began = super::connection::began(conn).await.map_err(E::from)?;
    let (mut unsettled, restore) = open_locked(conn, &LockOptions::default()).await?;
    let mut level = Level::opened(&mut *unsettled.conn);
    let conn = &mut *level;
    let work = async {
        match C::record_received(conn, inbox.consumer(), message_id, now_millis()).await {
            Ok(true) => apply(conn)
                .await
                .map(Received::Applied)
                .map_err(Failure::Closure),
            Ok(false) => Ok(Received::Duplicate),
            Err(err) => Err(Failure::Lockkit(err)),
        }
    };
    let worked = Panicked::catch(work).await;
    let ended = end_caught(level, began, restore, worked).await;
    unsettled.settled();
    ended.unwrap_or_else(|panicked| panicked.resume())
}

/// Deletes `inbox`'s ids recorded `age` ago or earlier; returns how many:
/// [`Inbox::purge_older_than`] on diesel-async (its example shows what a purge
/// forgets), called as `purge_received(&inbox, &mut conn, age).await`.
///
/// # Errors
///
/// [`Error::Database`] with `BrokenTransactionManager` when a dropped call
/// left `conn` in its transaction (nothing is sent), or a classified database
/// error.
pub async fn purge_received<C: AsyncOutboxStore>(
    inbox: &Inbox,
    conn: &mut C,
    age: Duration,
) -> Result<usize, Error> {
    refuse_broken(conn)?;
    C::purge_received(conn, inbox.consumer(), older_than(age)).await
}

/// The statements behind the outbox and the inbox on a diesel-async
/// connection: the blocking side's ([`OutboxStore`](crate::outbox::OutboxStore)),
/// awaited.
///
/// Sealed: implemented for `AsyncPgConnection`, `AsyncMysqlConnection` and
/// `SyncConnectionWrapper<SqliteConnection>`; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit's async outbox does not support `{Self}`",
    label = "not a diesel-async connection lockkit's outbox supports",
    note = "lockkit supports `AsyncPgConnection`, `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (feature `async` with `postgres`, `mysql`, `sqlite`); pass a pooled connection as `&mut *conn`"
)]
pub trait AsyncOutboxStore: AsyncLockingConnection {
    #[doc(hidden)]
    fn insert_message(
        conn: &mut Self,
        topic: &str,
        payload: &str,
        now: i64,
    ) -> impl Future<Output = Result<i64, Error>> + Send;
    #[doc(hidden)]
    fn before_relay(conn: &mut Self) -> impl Future<Output = Result<(), Error>> + Send;
    #[doc(hidden)]
    fn claim_due(
        conn: &mut Self,
        limit: i64,
        now: i64,
    ) -> impl Future<Output = Result<Vec<OutboxMessage>, Error>> + Send;
    #[doc(hidden)]
    fn mark_published(
        conn: &mut Self,
        id: i64,
        now: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    #[doc(hidden)]
    fn mark_failed(
        conn: &mut Self,
        id: i64,
        next_attempt_at: i64,
        reason: &str,
    ) -> impl Future<Output = Result<(), Error>> + Send;
    #[doc(hidden)]
    fn purge_published(
        conn: &mut Self,
        published_until: i64,
    ) -> impl Future<Output = Result<usize, Error>> + Send;
    #[doc(hidden)]
    fn dead_letters(
        conn: &mut Self,
        dead: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;
    #[doc(hidden)]
    fn requeue(
        conn: &mut Self,
        id: i64,
        dead: i64,
        now: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    #[doc(hidden)]
    fn record_received(
        conn: &mut Self,
        consumer: &str,
        message_id: &str,
        now: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    #[doc(hidden)]
    fn purge_received(
        conn: &mut Self,
        consumer: &str,
        received_until: i64,
    ) -> impl Future<Output = Result<usize, Error>> + Send;
}

/// As the blocking side's `outbox_store!`: `$backend`, the module of what the
/// statements do differently on the connection's backend.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! async_outbox_store {
    ($conn:ty, $backend:ident) => {
        #[diagnostic::do_not_recommend]
        impl AsyncOutboxStore for $conn {
            async fn insert_message(
                conn: &mut Self,
                topic: &str,
                payload: &str,
                now: i64,
            ) -> Result<i64, Error> {
                use diesel_async::RunQueryDsl;
                statements::insert_message(topic, payload, now)
                    .execute(conn)
                    .await?;
                Ok(statements::last_id($backend::LAST_ID)
                    .get_result(conn)
                    .await?)
            }

            async fn before_relay(conn: &mut Self) -> Result<(), Error> {
                match $backend::BEFORE_RELAY {
                    Some(sql) => {
                        Ok(diesel_async::SimpleAsyncConnection::batch_execute(conn, sql).await?)
                    }
                    None => Ok(()),
                }
            }

            async fn claim_due(
                conn: &mut Self,
                limit: i64,
                now: i64,
            ) -> Result<Vec<OutboxMessage>, Error> {
                super::queue::claim(conn, statements::due(now), limit).await
            }

            async fn mark_published(conn: &mut Self, id: i64, now: i64) -> Result<bool, Error> {
                use diesel_async::RunQueryDsl;
                let rows = statements::mark_published(id, now).execute(conn).await?;
                Ok(rows == 1)
            }

            async fn mark_failed(
                conn: &mut Self,
                id: i64,
                next_attempt_at: i64,
                reason: &str,
            ) -> Result<(), Error> {
                use diesel_async::RunQueryDsl;
                statements::mark_failed(id, next_attempt_at, reason)
                    .execute(conn)
                    .await?;
                Ok(())
            }

            async fn purge_published(
                conn: &mut Self,
                published_until: i64,
            ) -> Result<usize, Error> {
                use diesel_async::RunQueryDsl;
                Ok(statements::purge_published(published_until)
                    .execute(conn)
                    .await?)
            }

            async fn dead_letters(
                conn: &mut Self,
                dead: i64,
                limit: i64,
            ) -> Result<Vec<DeadLetter>, Error> {
                use diesel_async::RunQueryDsl;
                Ok(statements::dead_letters(dead, limit).load(conn).await?)
            }

            async fn requeue(conn: &mut Self, id: i64, dead: i64, now: i64) -> Result<bool, Error> {
                use diesel_async::RunQueryDsl;
                let rows = statements::requeue(id, dead, now).execute(conn).await?;
                Ok(rows == 1)
            }

            async fn record_received(
                conn: &mut Self,
                consumer: &str,
                message_id: &str,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel_async::RunQueryDsl;
                let rows = $backend::record(consumer, message_id, now)
                    .execute(conn)
                    .await?;
                Ok(rows == 1)
            }

            async fn purge_received(
                conn: &mut Self,
                consumer: &str,
                received_until: i64,
            ) -> Result<usize, Error> {
                use diesel_async::RunQueryDsl;
                Ok(statements::purge_received(consumer, received_until)
                    .execute(conn)
                    .await?)
            }
        }
    };
}

#[cfg(feature = "mysql")]
use crate::outbox::store::mysql;
#[cfg(feature = "postgres")]
use crate::outbox::store::postgres;
#[cfg(feature = "sqlite")]
use crate::outbox::store::sqlite;
#[allow(unused_imports)] // without a backend feature
use crate::outbox::store::statements;

#[cfg(feature = "postgres")]
async_outbox_store!(diesel_async::AsyncPgConnection, postgres);
#[cfg(feature = "mysql")]
async_outbox_store!(diesel_async::AsyncMysqlConnection, mysql);
#[cfg(feature = "sqlite")]
async_outbox_store!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    sqlite
);
