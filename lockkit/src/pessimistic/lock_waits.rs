//! Who is waiting on whom, right now.
//!
//! When a request hangs, the question is which session holds the lock it waits
//! for. [`blocked_sessions`] answers it from the server's own views:
//!
//! * PostgreSQL: `pg_stat_activity` and `pg_blocking_pids(pid)`;
//! * MariaDB: `information_schema.INNODB_LOCK_WAITS` and `INNODB_TRX`
//!   (MySQL 8: `performance_schema.data_lock_waits`).
//!
//! A session is identified as [`session_id`] reports it: `pg_backend_pid()` or
//! `CONNECTION_ID()`. The views are server-wide (every database). InnoDB serves
//! `information_schema` from a copy it refreshes only after 100 ms without a read:
//! poll it more slowly than that, or every poll sees the same snapshot.

use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::Connection;

use crate::{classify, Error};

/// A session waiting for a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockedSession {
    /// The waiting session.
    pub session: i64,
    /// The sessions holding what it waits for.
    pub blocked_by: Vec<i64>,
    /// How long it has been waiting (PostgreSQL: since its state last changed).
    pub waiting: Duration,
    /// The statement it is running.
    pub query: String,
}

/// A backend whose lock waits lockkit can list: PostgreSQL, MySQL/MariaDB.
///
/// Sealed: implemented by lockkit for each of them; name it only in `where`
/// clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit cannot list lock waits on the `{Self}` backend",
    label = "lock waits are read from PostgreSQL's and MySQL/MariaDB's views",
    note = "SQLite has no row locks to wait on: a writer waits for the database's write lock, up to `PRAGMA busy_timeout`"
)]
pub trait LockMonitor: diesel::backend::Backend + crate::sealed::Sealed {
    /// This connection's session id.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn session_id<C>(conn: &mut C) -> diesel::QueryResult<i64>
    where
        C: Connection<Backend = Self> + LoadConnection;
    /// Every session now waiting for a lock, by session id.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn blocked_sessions<C>(conn: &mut C) -> diesel::QueryResult<Vec<BlockedSession>>
    where
        C: Connection<Backend = Self> + LoadConnection;
}

/// This connection's session id (`pg_backend_pid()`, `CONNECTION_ID()`).
///
/// # Errors
///
/// A classified database error ([`Error::ConnectionLost`], .., else
/// [`Error::Database`]); see [`classify`](crate::classify()).
pub fn session_id<C>(conn: &mut C) -> Result<i64, Error>
where
    C: Connection + LoadConnection,
    C::Backend: LockMonitor,
{
    C::Backend::session_id(conn).map_err(classify)
}

/// Every session now waiting for a lock, ordered by session id.
///
/// # Errors
///
/// A classified database error: [`Error::Database`] when the server's views
/// cannot be read (MySQL 8 without access to `performance_schema`, missing
/// privileges), [`Error::ConnectionLost`], [`Error::StatementTimeout`], ..; see
/// [`classify`](crate::classify()).
///
/// # Example
///
/// ```no_run
/// # #[cfg(feature = "postgres")] {
/// use diesel::prelude::*;
/// use lockkit::lock_waits;
/// let mut conn = PgConnection::establish("postgres://localhost/app").unwrap();
/// for waiter in lock_waits::blocked_sessions(&mut conn).unwrap() {
///     println!(
///         "session {} has waited {:?} on {:?}: {}",
///         waiter.session, waiter.waiting, waiter.blocked_by, waiter.query
///     );
/// }
/// # }
/// ```
pub fn blocked_sessions<C>(conn: &mut C) -> Result<Vec<BlockedSession>, Error>
where
    C: Connection + LoadConnection,
    C::Backend: LockMonitor,
{
    C::Backend::blocked_sessions(conn).map_err(classify)
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
struct SessionId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::pg::Pg;
    use diesel::sql_types::{Array, BigInt, Text};
    use diesel::RunQueryDsl;

    use super::*;

    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        session: i64,
        #[diesel(sql_type = Array<BigInt>)]
        blocked_by: Vec<i64>,
        #[diesel(sql_type = BigInt)]
        waiting_ms: i64,
        #[diesel(sql_type = Text)]
        query: String,
    }

    impl LockMonitor for Pg {
        fn session_id<C>(conn: &mut C) -> diesel::QueryResult<i64>
        where
            C: Connection<Backend = Self> + LoadConnection,
        {
            diesel::sql_query("SELECT pg_backend_pid()::bigint AS id")
                .get_result::<SessionId>(conn)
                .map(|row| row.id)
        }

        fn blocked_sessions<C>(conn: &mut C) -> diesel::QueryResult<Vec<BlockedSession>>
        where
            C: Connection<Backend = Self> + LoadConnection,
        {
            let rows = diesel::sql_query(
                "SELECT pid::bigint AS session, \
                        pg_blocking_pids(pid)::bigint[] AS blocked_by, \
                        (EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(state_change, query_start)) * 1000)::bigint AS waiting_ms, \
                        COALESCE(query, '') AS query \
                   FROM pg_stat_activity \
                  WHERE cardinality(pg_blocking_pids(pid)) > 0 \
                  ORDER BY pid",
            )
            .load::<Row>(conn)?;
            Ok(rows
                .into_iter()
                .map(|row| BlockedSession {
                    session: row.session,
                    blocked_by: row.blocked_by,
                    waiting: millis(row.waiting_ms),
                    query: row.query,
                })
                .collect())
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::mysql::Mysql;
    use diesel::sql_types::{BigInt, Text};
    use diesel::RunQueryDsl;

    use super::*;

    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        session: i64,
        #[diesel(sql_type = BigInt)]
        blocker: i64,
        #[diesel(sql_type = BigInt)]
        waiting_ms: i64,
        #[diesel(sql_type = Text)]
        query: String,
    }

    const MARIADB: &str = "SELECT CAST(r.trx_mysql_thread_id AS SIGNED) AS session, \
            CAST(b.trx_mysql_thread_id AS SIGNED) AS blocker, \
            CAST(TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) DIV 1000 AS SIGNED) AS waiting_ms, \
            COALESCE(r.trx_query, '') AS query \
       FROM information_schema.INNODB_LOCK_WAITS w \
       JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
       JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
      ORDER BY session, blocker";

    const MYSQL8: &str = "SELECT CAST(r.trx_mysql_thread_id AS SIGNED) AS session, \
            CAST(b.trx_mysql_thread_id AS SIGNED) AS blocker, \
            CAST(TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) DIV 1000 AS SIGNED) AS waiting_ms, \
            COALESCE(r.trx_query, '') AS query \
       FROM performance_schema.data_lock_waits w \
       JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID \
       JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID \
      ORDER BY session, blocker";

    impl LockMonitor for Mysql {
        fn session_id<C>(conn: &mut C) -> diesel::QueryResult<i64>
        where
            C: Connection<Backend = Self> + LoadConnection,
        {
            diesel::sql_query("SELECT CAST(CONNECTION_ID() AS SIGNED) AS id")
                .get_result::<SessionId>(conn)
                .map(|row| row.id)
        }

        fn blocked_sessions<C>(conn: &mut C) -> diesel::QueryResult<Vec<BlockedSession>>
        where
            C: Connection<Backend = Self> + LoadConnection,
        {
            let rows = match diesel::sql_query(MARIADB).load::<Row>(conn) {
                Ok(rows) => rows,
                // MySQL 8 removed INNODB_LOCK_WAITS.
                Err(_) => diesel::sql_query(MYSQL8).load::<Row>(conn)?,
            };
            let mut sessions: Vec<BlockedSession> = Vec::new();
            for row in rows {
                match sessions.last_mut() {
                    Some(last) if last.session == row.session => last.blocked_by.push(row.blocker),
                    _ => sessions.push(BlockedSession {
                        session: row.session,
                        blocked_by: vec![row.blocker],
                        waiting: millis(row.waiting_ms),
                        query: row.query,
                    }),
                }
            }
            Ok(sessions)
        }
    }
}
