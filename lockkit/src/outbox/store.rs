//! The outbox's and the inbox's statements, once per backend.

use super::{DeadLetter, OutboxMessage};
use crate::error::Error;
use crate::pessimistic::connection::LockingConnection;

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
    /// Runs before the relay's own transaction begins (a relay refuses to
    /// run inside another): MySQL/MariaDB's isolation for it, nothing
    /// elsewhere.
    #[doc(hidden)]
    fn before_relay(conn: &mut Self) -> Result<(), Error>;
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

/// The outbox's and the inbox's statements, built once for the blocking and
/// the async side (which only execute them).
#[allow(clippy::needless_lifetimes)]
pub(crate) mod statements {
    use diesel::dsl::{auto_type, delete, insert_into, insert_or_ignore_into, update};
    use diesel::prelude::*;

    use super::schema::{lockkit_inbox as inbox, lockkit_outbox as outbox};

    #[auto_type(no_type_alias)]
    pub(crate) fn insert_message<'a>(topic: &'a str, payload: &'a str, now: i64) -> _ {
        insert_into(outbox::table).values((
            outbox::topic.eq(topic),
            outbox::payload.eq(payload),
            outbox::created_at.eq(now),
            outbox::next_attempt_at.eq(now),
        ))
    }

    /// The id the connection's last insert made: `SELECT <last_id>`, with the
    /// backend's expression (`LAST_ID` of its module below).
    pub(crate) fn last_id(
        last_id: &'static str,
    ) -> diesel::dsl::select<diesel::expression::SqlLiteral<diesel::sql_types::BigInt>> {
        diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(last_id))
    }

    /// The claim's query, before its `LIMIT` and lock clause.
    #[auto_type(no_type_alias)]
    pub(crate) fn due(now: i64) -> _ {
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
            ))
    }

    /// One row by primary key: see `queue` on MySQL's `IN (..)` scans.
    #[auto_type(no_type_alias)]
    pub(crate) fn mark_published(id: i64, now: i64) -> _ {
        update(
            outbox::table
                .find(id)
                .filter(outbox::published_at.is_null()),
        )
        .set(outbox::published_at.eq(now))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn mark_failed<'a>(id: i64, next_attempt_at: i64, reason: &'a str) -> _ {
        let one: i32 = 1;
        update(outbox::table.find(id)).set((
            outbox::attempts.eq(outbox::attempts + one),
            outbox::next_attempt_at.eq(next_attempt_at),
            outbox::last_error.eq(reason),
        ))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn purge_published(published_until: i64) -> _ {
        delete(outbox::table.filter(outbox::published_at.le(published_until)))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn dead_letters(dead: i64, limit: i64) -> _ {
        outbox::table
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
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn requeue(id: i64, dead: i64, now: i64) -> _ {
        let zero: i32 = 0;
        update(
            outbox::table
                .find(id)
                .filter(outbox::published_at.is_null())
                .filter(outbox::next_attempt_at.eq(dead)),
        )
        .set((outbox::attempts.eq(zero), outbox::next_attempt_at.eq(now)))
    }

    /// The inbox row of `message_id` for `consumer`, received `now`.
    #[auto_type]
    pub(crate) fn inbox_row<'a>(consumer: &'a str, message_id: &'a str, now: i64) -> _ {
        (
            inbox::consumer.eq(consumer),
            inbox::message_id.eq(message_id),
            inbox::received_at.eq(now),
        )
    }

    /// The inbox row's insert, before PostgreSQL's `ON CONFLICT DO NOTHING`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    #[auto_type(no_type_alias)]
    pub(crate) fn record<'a>(consumer: &'a str, message_id: &'a str, now: i64) -> _ {
        let row: inbox_row<'a> = inbox_row(consumer, message_id, now);
        insert_into(inbox::table).values(row)
    }

    /// The inbox row, for `INSERT IGNORE` / `INSERT OR IGNORE` (MySQL, SQLite).
    #[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
    #[auto_type(no_type_alias)]
    pub(crate) fn record_or_ignore<'a>(consumer: &'a str, message_id: &'a str, now: i64) -> _ {
        let row: inbox_row<'a> = inbox_row(consumer, message_id, now);
        insert_or_ignore_into(inbox::table).values(row)
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn purge_received<'a>(consumer: &'a str, received_until: i64) -> _ {
        delete(
            inbox::table
                .filter(inbox::consumer.eq(consumer))
                .filter(inbox::received_at.le(received_until)),
        )
    }
}

// What the outbox's statements do each backend's own way, one module per
// backend, for the blocking and the async store: `LAST_ID`, the SQL expression
// for the id the connection's last insert made; `record`, the inbox's insert
// that skips a row whose key is taken; `BEFORE_RELAY`, what runs before the
// relay's own transaction begins.

/// PostgreSQL's part of the outbox's statements.
#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use diesel::pg::Pg;
    use diesel::query_builder::{QueryFragment, QueryId};

    pub(crate) const LAST_ID: &str = "currval(pg_get_serial_sequence('lockkit_outbox', 'id'))";
    pub(crate) const BEFORE_RELAY: Option<&str> = None;

    /// `INSERT .. ON CONFLICT DO NOTHING` (a type Diesel does not name).
    pub(crate) fn record<'a>(
        consumer: &'a str,
        message_id: &'a str,
        now: i64,
    ) -> impl QueryFragment<Pg> + QueryId + Send + 'a {
        super::statements::record(consumer, message_id, now).on_conflict_do_nothing()
    }
}

/// MySQL's part of the outbox's statements.
#[cfg(feature = "mysql")]
pub(crate) mod mysql {
    pub(crate) const LAST_ID: &str = "CAST(LAST_INSERT_ID() AS SIGNED)";
    /// The relay's transaction at READ COMMITTED. Under InnoDB's REPEATABLE
    /// READ its claim, which stops at its `LIMIT` or at the end of the pending
    /// rows, also locks the gap after them, where every new message goes: the
    /// order service's inserts would wait for the relay's broker, and fail after
    /// the lock wait timeout when the broker is away.
    pub(crate) const BEFORE_RELAY: Option<&str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED");
    // `INSERT IGNORE`.
    pub(crate) use super::statements::record_or_ignore as record;
}

/// SQLite's part of the outbox's statements.
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    pub(crate) const LAST_ID: &str = "last_insert_rowid()";
    pub(crate) const BEFORE_RELAY: Option<&str> = None;
    // `INSERT OR IGNORE`.
    pub(crate) use super::statements::record_or_ignore as record;
}

/// `$backend`: the module of what the statements do differently on the
/// connection's backend.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! outbox_store {
    ($conn:ty, $backend:ident) => {
        impl OutboxStore for $conn {
            fn insert_message(
                conn: &mut Self,
                topic: &str,
                payload: &str,
                now: i64,
            ) -> Result<i64, Error> {
                use diesel::RunQueryDsl;
                // lockkit's own statements, whose answers it sees.
                crate::transaction::journal::own(conn, |conn| {
                    statements::insert_message(topic, payload, now).execute(conn)?;
                    statements::last_id($backend::LAST_ID).get_result(conn)
                })
                .map_err(Error::from)
            }

            fn before_relay(conn: &mut Self) -> Result<(), Error> {
                match $backend::BEFORE_RELAY {
                    Some(sql) => Ok(diesel::connection::SimpleConnection::batch_execute(
                        conn, sql,
                    )?),
                    None => Ok(()),
                }
            }

            fn claim_due(
                conn: &mut Self,
                limit: i64,
                now: i64,
            ) -> Result<Vec<OutboxMessage>, Error> {
                crate::pessimistic::queue::claim(conn, statements::due(now), limit)
            }

            fn mark_published(conn: &mut Self, id: i64, now: i64) -> Result<bool, Error> {
                use diesel::RunQueryDsl;
                let rows = statements::mark_published(id, now).execute(conn)?;
                Ok(rows == 1)
            }

            fn mark_failed(
                conn: &mut Self,
                id: i64,
                next_attempt_at: i64,
                reason: &str,
            ) -> Result<(), Error> {
                use diesel::RunQueryDsl;
                statements::mark_failed(id, next_attempt_at, reason).execute(conn)?;
                Ok(())
            }

            fn purge_published(conn: &mut Self, published_until: i64) -> Result<usize, Error> {
                use diesel::RunQueryDsl;
                Ok(statements::purge_published(published_until).execute(conn)?)
            }

            fn dead_letters(
                conn: &mut Self,
                dead: i64,
                limit: i64,
            ) -> Result<Vec<DeadLetter>, Error> {
                use diesel::RunQueryDsl;
                Ok(statements::dead_letters(dead, limit).load(conn)?)
            }

            fn requeue(conn: &mut Self, id: i64, dead: i64, now: i64) -> Result<bool, Error> {
                use diesel::RunQueryDsl;
                let rows = statements::requeue(id, dead, now).execute(conn)?;
                Ok(rows == 1)
            }

            fn record_received(
                conn: &mut Self,
                consumer: &str,
                message_id: &str,
                now: i64,
            ) -> Result<bool, Error> {
                // What `RunQueryDsl::execute` runs, which PostgreSQL's unnamed
                // statement type does not offer.
                use diesel::query_dsl::methods::ExecuteDsl;
                let rows = ExecuteDsl::execute($backend::record(consumer, message_id, now), conn)?;
                Ok(rows == 1)
            }

            fn purge_received(
                conn: &mut Self,
                consumer: &str,
                received_until: i64,
            ) -> Result<usize, Error> {
                use diesel::RunQueryDsl;
                Ok(statements::purge_received(consumer, received_until).execute(conn)?)
            }
        }
    };
}

#[cfg(feature = "postgres")]
outbox_store!(diesel::PgConnection, postgres);
#[cfg(feature = "mysql")]
outbox_store!(diesel::MysqlConnection, mysql);
#[cfg(feature = "sqlite")]
outbox_store!(diesel::SqliteConnection, sqlite);
