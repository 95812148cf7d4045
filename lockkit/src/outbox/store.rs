//! The outbox's and the inbox's statements, once per backend.

use super::{DeadLetter, OutboxMessage};
use crate::pessimistic::connection::LockingConnection;
use crate::Error;

use super::schema;

/// The statements behind [`outbox`](super), per connection type.
///
/// Sealed: implemented by lockkit for each backend feature's connection; name it
/// only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's outbox does not support `{Self}`",
    label = "not a connection lockkit's outbox supports",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums over them that implement `lockkit::multi::Dispatch`"
)]
pub trait OutboxStore: LockingConnection + crate::sealed::Sealed {
    #[doc(hidden)]
    fn insert_message(conn: &mut Self, topic: &str, payload: &str, now: i64) -> Result<i64, Error>;
    #[doc(hidden)]
    fn claim_due(conn: &mut Self, limit: i64, now: i64) -> Result<Vec<OutboxMessage>, Error>;
    #[doc(hidden)]
    fn mark_published(conn: &mut Self, id: i64, now: i64) -> Result<bool, Error>;
    #[doc(hidden)]
    fn mark_failed(
        conn: &mut Self,
        id: i64,
        next_attempt_at: i64,
        reason: &str,
    ) -> Result<(), Error>;
    #[doc(hidden)]
    fn purge_published(conn: &mut Self, published_until: i64) -> Result<usize, Error>;
    /// Unpublished messages whose `next_attempt_at` is `dead`, oldest first.
    #[doc(hidden)]
    fn dead_letters(conn: &mut Self, dead: i64, limit: i64) -> Result<Vec<DeadLetter>, Error>;
    /// Makes the dead letter `id` due at `now` with no attempts; `false` if it
    /// is not a dead letter.
    #[doc(hidden)]
    fn requeue(conn: &mut Self, id: i64, dead: i64, now: i64) -> Result<bool, Error>;
    /// Inserts the inbox row unless it is there; `false` if it was.
    #[doc(hidden)]
    fn record_received(
        conn: &mut Self,
        consumer: &str,
        message_id: &str,
        now: i64,
    ) -> Result<bool, Error>;
    #[doc(hidden)]
    fn purge_received(conn: &mut Self, consumer: &str, received_until: i64)
        -> Result<usize, Error>;
}

/// `$last_id`: the SQL expression for the id the connection's last insert made.
/// `$record`: how an insert skips a row whose key is taken (`on_conflict`:
/// `ON CONFLICT DO NOTHING`; `ignore`: `INSERT IGNORE` / `INSERT OR IGNORE`).
#[allow(unused_macros)] // used once per enabled backend
macro_rules! outbox_store {
    ($conn:ty, last_id: $last_id:literal, record: $record:ident) => {
        impl OutboxStore for $conn {
            fn insert_message(
                conn: &mut Self,
                topic: &str,
                payload: &str,
                now: i64,
            ) -> Result<i64, Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                diesel::insert_into(outbox::table)
                    .values((
                        outbox::topic.eq(topic),
                        outbox::payload.eq(payload),
                        outbox::created_at.eq(now),
                        outbox::next_attempt_at.eq(now),
                    ))
                    .execute(conn)?;
                Ok(diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    $last_id,
                ))
                .get_result(conn)?)
            }

            fn claim_due(
                conn: &mut Self,
                limit: i64,
                now: i64,
            ) -> Result<Vec<OutboxMessage>, Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                crate::queue::claim(
                    conn,
                    outbox::table
                        .filter(outbox::published_at.is_null())
                        .filter(outbox::next_attempt_at.le(now))
                        .order(outbox::id)
                        .select((
                            outbox::id,
                            outbox::topic,
                            outbox::payload,
                            outbox::attempts,
                            outbox::created_at,
                        )),
                    limit,
                )
            }

            fn mark_published(conn: &mut Self, id: i64, now: i64) -> Result<bool, Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                // One row by primary key: see `queue` on MySQL's `IN (..)` scans.
                let rows = diesel::update(
                    outbox::table
                        .find(id)
                        .filter(outbox::published_at.is_null()),
                )
                .set(outbox::published_at.eq(now))
                .execute(conn)?;
                Ok(rows == 1)
            }

            fn mark_failed(
                conn: &mut Self,
                id: i64,
                next_attempt_at: i64,
                reason: &str,
            ) -> Result<(), Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                diesel::update(outbox::table.find(id))
                    .set((
                        outbox::attempts.eq(outbox::attempts + 1),
                        outbox::next_attempt_at.eq(next_attempt_at),
                        outbox::last_error.eq(reason),
                    ))
                    .execute(conn)?;
                Ok(())
            }

            fn purge_published(conn: &mut Self, published_until: i64) -> Result<usize, Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                Ok(
                    diesel::delete(outbox::table.filter(outbox::published_at.le(published_until)))
                        .execute(conn)?,
                )
            }

            fn dead_letters(
                conn: &mut Self,
                dead: i64,
                limit: i64,
            ) -> Result<Vec<DeadLetter>, Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                Ok(outbox::table
                    .filter(outbox::published_at.is_null())
                    .filter(outbox::next_attempt_at.eq(dead))
                    .order(outbox::id)
                    .limit(limit)
                    .select((
                        outbox::id,
                        outbox::topic,
                        outbox::payload,
                        outbox::attempts,
                        outbox::created_at,
                        outbox::last_error,
                    ))
                    .load(conn)?)
            }

            fn requeue(conn: &mut Self, id: i64, dead: i64, now: i64) -> Result<bool, Error> {
                use diesel::prelude::*;
                use schema::lockkit_outbox as outbox;
                let rows = diesel::update(
                    outbox::table
                        .find(id)
                        .filter(outbox::published_at.is_null())
                        .filter(outbox::next_attempt_at.eq(dead)),
                )
                .set((outbox::attempts.eq(0), outbox::next_attempt_at.eq(now)))
                .execute(conn)?;
                Ok(rows == 1)
            }

            fn record_received(
                conn: &mut Self,
                consumer: &str,
                message_id: &str,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel::prelude::*;
                use schema::lockkit_inbox as inbox;
                let row = (
                    inbox::consumer.eq(consumer),
                    inbox::message_id.eq(message_id),
                    inbox::received_at.eq(now),
                );
                let rows = outbox_store!(@$record conn, inbox::table, row)?;
                Ok(rows == 1)
            }

            fn purge_received(
                conn: &mut Self,
                consumer: &str,
                received_until: i64,
            ) -> Result<usize, Error> {
                use diesel::prelude::*;
                use schema::lockkit_inbox as inbox;
                Ok(diesel::delete(
                    inbox::table
                        .filter(inbox::consumer.eq(consumer))
                        .filter(inbox::received_at.le(received_until)),
                )
                .execute(conn)?)
            }
        }
    };
    (@on_conflict $conn:ident, $table:expr, $row:expr) => {
        diesel::insert_into($table)
            .values($row)
            .on_conflict_do_nothing()
            .execute($conn)
    };
    (@ignore $conn:ident, $table:expr, $row:expr) => {
        diesel::insert_or_ignore_into($table)
            .values($row)
            .execute($conn)
    };
}

#[cfg(feature = "postgres")]
outbox_store!(
    diesel::PgConnection,
    last_id: "currval(pg_get_serial_sequence('lockkit_outbox', 'id'))",
    record: on_conflict
);
#[cfg(feature = "mysql")]
outbox_store!(
    diesel::MysqlConnection,
    last_id: "CAST(LAST_INSERT_ID() AS SIGNED)",
    record: ignore
);
#[cfg(feature = "sqlite")]
outbox_store!(diesel::SqliteConnection, last_id: "last_insert_rowid()", record: ignore);
