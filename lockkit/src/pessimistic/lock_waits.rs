//! Who is waiting on whom, right now.
//!
//! When a request hangs, the question is which session holds the lock it waits
//! for. [`blocked_sessions`] answers it from the server's own views:
//!
//! * PostgreSQL: `pg_stat_activity` and `pg_blocking_pids(pid)`;
//! * MariaDB: `information_schema.INNODB_LOCK_WAITS` and `INNODB_TRX`
//!   (MySQL 8: `performance_schema.data_lock_waits`).
//!
//! [`lock_waits::current`](current) says more, one entry per waiting session: which lock it waits
//! for (mode and relation) and, for each session in its way, what that session
//! is doing and for how long. The usual culprit is a blocker that is
//! `idle in transaction`: it took a lock, then went to do something else (an HTTP
//! call, a slow loop in the application) without ending its transaction.
//!
//! | field | PostgreSQL | MariaDB |
//! | --- | --- | --- |
//! | [`LockWait::lock_mode`] | the waiting `pg_locks` row: `locktype mode` (`transactionid ShareLock` while waiting for another's row lock, `tuple AccessExclusiveLock` while queued behind a first waiter) | `INNODB_LOCKS`: `lock_type lock_mode` (`RECORD X`) |
//! | [`LockWait::relation`] | the relation of the session's tuple lock, else of the lock it waits for, as `regclass` (`items`) | `INNODB_LOCKS.lock_table` (`` `test`.`items` ``) |
//! | [`Blocker::state`] | `pg_stat_activity.state`: `active`, `idle in transaction`, .. | from `PROCESSLIST.COMMAND`: `Sleep` is `idle in transaction` (the session holds an InnoDB transaction), `Query` is `active`, any other command in lower case |
//! | [`Blocker::in_state`] | since `state_change` | `PROCESSLIST.TIME_MS`: time in the current command |
//! | [`Blocker::transaction_age`] | since `xact_start` | since `INNODB_TRX.trx_started` |
//!
//! [`lock_waits::current`](current) reads MariaDB's `information_schema` (`INNODB_LOCK_WAITS`,
//! `INNODB_LOCKS`, `INNODB_TRX`, `PROCESSLIST`); MySQL 8 removed the first two,
//! and there it fails with [`Error::Database`]: use [`blocked_sessions`].
//!
//! A session is identified as [`session_id`] reports it: `pg_backend_pid()` or
//! `CONNECTION_ID()`. The views are server-wide (every database). InnoDB serves
//! `information_schema` from a copy it refreshes only after 100 ms without a read:
//! poll it more slowly than that, or every poll sees the same snapshot.
//!
//! These functions take `PgConnection`, `MysqlConnection`, r2d2 pooled
//! connections to them (feature `r2d2`) and
//! [`Dispatch`](crate::multi::Dispatch) enums ([`LockMonitorConnection`]),
//! which ask the server of the connection inside; one holding a SQLite
//! connection refuses with [`Error::Unsupported`], sending nothing.
//!
//! On diesel-async (feature `async`): `lockkit::asynchronous::lock_waits`, with
//! these statements.

use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::Connection;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::classification::classify;
use crate::error::Error;

/// A session waiting for a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockedSession {
    /// The waiting session.
    pub session: i64,
    /// The sessions holding what it waits for.
    pub blocked_by: Vec<i64>,
    /// How long it has been waiting (PostgreSQL: since its state last
    /// changed); zero where the server does not show it (on PostgreSQL, a
    /// session of another role, to a role without `pg_read_all_stats`).
    pub waiting: Duration,
    /// The statement it is running.
    pub query: String,
}

/// A session waiting for a lock, with what lockkit can learn of the lock and
/// of those holding it: [`lock_waits::current`](current).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockWait {
    /// The waiting session.
    pub session: i64,
    /// How long it has been waiting (PostgreSQL: since its state last
    /// changed); zero where the server does not show it (on PostgreSQL, a
    /// session of another role, to a role without `pg_read_all_stats`).
    pub waiting: Duration,
    /// The statement it is running.
    pub query: String,
    /// The lock it waits for, as the server names it (see the [module
    /// docs](self)); `None` when the server did not say.
    pub lock_mode: Option<String>,
    /// The table (or index) it waits on; `None` when the server did not say.
    pub relation: Option<String>,
    /// The sessions in its way, by session id.
    pub blockers: Vec<Blocker>,
}

/// A session holding a lock that another one waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Blocker {
    /// Its session id.
    pub session: i64,
    /// What it is doing: `active`, `idle in transaction`, .. (see the [module
    /// docs](self)); empty when the server did not say.
    pub state: String,
    /// How long it has been in that state: for `idle in transaction`, how long
    /// it has held its locks without sending anything.
    pub in_state: Duration,
    /// How long its transaction has been open, if the server says.
    pub transaction_age: Option<Duration>,
    /// Its current (or, when idle, last) statement; MariaDB: empty when idle.
    pub query: String,
}

impl Blocker {
    /// Whether it holds its locks while doing nothing: it opened a transaction
    /// and went away without ending it.
    pub fn is_idle_in_transaction(&self) -> bool {
        self.state.starts_with("idle in transaction")
    }
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
    /// Every session now waiting for a lock, with its blockers.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn current<C>(conn: &mut C) -> diesel::QueryResult<Vec<LockWait>>
    where
        C: Connection<Backend = Self> + LoadConnection;
}

/// A connection whose server lockkit can ask for lock waits: `PgConnection`
/// and `MysqlConnection`, r2d2 pooled connections to them (feature `r2d2`), and
/// [`Dispatch`](crate::multi::Dispatch) enums, which ask through the connection
/// inside (one holding SQLite refuses: [`Error::Unsupported`]). The
/// statements are its backend's ([`LockMonitor`]).
///
/// Sealed: implemented by lockkit; name it only in `where` clauses
/// ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit cannot list lock waits through `{Self}`",
    label = "lock waits are read from PostgreSQL's and MySQL/MariaDB's views",
    note = "SQLite has no row locks to wait on: a writer waits for the database's write lock, up to `PRAGMA busy_timeout`",
    note = "lock waits are listed through `PgConnection`, `MysqlConnection` (features `postgres`, `mysql`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums that implement `lockkit::multi::Dispatch`"
)]
pub trait LockMonitorConnection: Connection + crate::sealed::Sealed {
    /// [`session_id`].
    ///
    /// # Errors
    ///
    /// Those of [`session_id`].
    #[doc(hidden)]
    fn session_id(conn: &mut Self) -> Result<i64, Error>;
    /// [`blocked_sessions`].
    ///
    /// # Errors
    ///
    /// Those of [`blocked_sessions`].
    #[doc(hidden)]
    fn blocked_sessions(conn: &mut Self) -> Result<Vec<BlockedSession>, Error>;
    /// [`current`].
    ///
    /// # Errors
    ///
    /// Those of [`current`].
    #[doc(hidden)]
    fn current(conn: &mut Self) -> Result<Vec<LockWait>, Error>;
}

/// [`LockMonitorConnection`] for a connection of a backend with lock views:
/// its backend's statements.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! lock_monitor_connection {
    ($conn:ty) => {
        impl LockMonitorConnection for $conn {
            fn session_id(conn: &mut Self) -> Result<i64, Error> {
                <$conn as Connection>::Backend::session_id(conn).map_err(classify)
            }

            fn blocked_sessions(conn: &mut Self) -> Result<Vec<BlockedSession>, Error> {
                <$conn as Connection>::Backend::blocked_sessions(conn).map_err(classify)
            }

            fn current(conn: &mut Self) -> Result<Vec<LockWait>, Error> {
                <$conn as Connection>::Backend::current(conn).map_err(classify)
            }
        }
    };
}

#[cfg(feature = "postgres")]
lock_monitor_connection!(diesel::PgConnection);
#[cfg(feature = "mysql")]
lock_monitor_connection!(diesel::MysqlConnection);

/// The server of the connection inside the pooled one is asked.
#[cfg(feature = "r2d2")]
#[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
impl<C> LockMonitorConnection for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>>
where
    C: LockMonitorConnection + diesel::r2d2::R2D2Connection + Send + 'static,
{
    fn session_id(conn: &mut Self) -> Result<i64, Error> {
        C::session_id(conn)
    }

    fn blocked_sessions(conn: &mut Self) -> Result<Vec<BlockedSession>, Error> {
        C::blocked_sessions(conn)
    }

    fn current(conn: &mut Self) -> Result<Vec<LockWait>, Error> {
        C::current(conn)
    }
}

/// What a [`Dispatch`](crate::multi::Dispatch) enum holding a SQLite
/// connection answers a lock-wait call: nothing is sent.
#[cfg(feature = "sqlite")]
pub(crate) fn no_lock_views() -> Error {
    Error::Unsupported(
        "lock waits are read from PostgreSQL's and MySQL/MariaDB's views: the MultiConnection \
         enum holds a SQLite connection",
    )
}

/// This connection's session id (`pg_backend_pid()`, `CONNECTION_ID()`).
///
/// # Errors
///
/// A classified database error ([`Error::ConnectionLost`], .., else
/// [`Error::Database`]); see [`classify`](crate::classify()).
/// [`Error::Unsupported`] on a [`Dispatch`](crate::multi::Dispatch) enum
/// holding a SQLite connection; nothing is sent.
///
/// # Example
///
/// Find this connection among the waiters:
///
/// ```no_run
/// # #[cfg(feature = "postgres")] {
/// use diesel::prelude::*;
/// use lockkit::lock_waits;
/// let mut conn = PgConnection::establish("postgres://localhost/app").unwrap();
/// let me = lock_waits::session_id(&mut conn).unwrap();
/// let mut monitor = PgConnection::establish("postgres://localhost/app").unwrap();
/// let waiting = lock_waits::blocked_sessions(&mut monitor).unwrap();
/// println!("waiting for a lock: {}", waiting.iter().any(|w| w.session == me));
/// # }
/// ```
pub fn session_id<C: LockMonitorConnection>(conn: &mut C) -> Result<i64, Error> {
    C::session_id(conn)
}

/// Every session now waiting for a lock, ordered by session id.
///
/// # Errors
///
/// A classified database error: [`Error::Database`] when the server's views
/// cannot be read (MySQL 8 without access to `performance_schema`, missing
/// privileges), [`Error::ConnectionLost`], [`Error::StatementTimeout`], ..; see
/// [`classify`](crate::classify()).
/// [`Error::Unsupported`] on a [`Dispatch`](crate::multi::Dispatch) enum
/// holding a SQLite connection; nothing is sent.
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
pub fn blocked_sessions<C: LockMonitorConnection>(
    conn: &mut C,
) -> Result<Vec<BlockedSession>, Error> {
    C::blocked_sessions(conn)
}

/// Every session now waiting for a lock, ordered by session id, with the lock it
/// waits for and what each of its blockers is doing (see the [module
/// docs](self) for what each backend reports).
///
/// ```sql
/// -- PostgreSQL: pg_stat_activity of the waiter, its waiting pg_locks row, and
/// -- pg_stat_activity of each pid in pg_blocking_pids(waiter)
/// -- MariaDB: INNODB_LOCK_WAITS joined to INNODB_TRX (both sides), INNODB_LOCKS
/// -- (the requested lock) and PROCESSLIST (the blocker)
/// ```
///
/// # Errors
///
/// A classified database error: [`Error::Database`] when the server's views
/// cannot be read (MySQL 8, which lacks MariaDB's `INNODB_LOCK_WAITS`, missing
/// privileges), [`Error::ConnectionLost`], ..; see [`classify`](crate::classify()).
/// [`Error::Unsupported`] on a [`Dispatch`](crate::multi::Dispatch) enum
/// holding a SQLite connection; nothing is sent.
///
/// # Example
///
/// ```no_run
/// # #[cfg(feature = "postgres")] {
/// use diesel::prelude::*;
/// use lockkit::lock_waits;
/// let mut conn = PgConnection::establish("postgres://localhost/app").unwrap();
/// for wait in lock_waits::current(&mut conn).unwrap() {
///     for blocker in wait.blockers.iter().filter(|b| b.is_idle_in_transaction()) {
///         println!(
///             "session {} waits {:?} for {:?} on {:?}: session {} has been idle in transaction for {:?}",
///             wait.session, wait.waiting, wait.lock_mode, wait.relation, blocker.session, blocker.in_state
///         );
///     }
/// }
/// # }
/// ```
pub fn current<C: LockMonitorConnection>(conn: &mut C) -> Result<Vec<LockWait>, Error> {
    C::current(conn)
}

/// One row of the lock-wait queries: a waiter and one of its blockers.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
pub(crate) struct WaitRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    session: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    waiting_ms: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    query: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    lock_mode: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    relation: Option<String>,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    blocker: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    blocker_state: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    blocker_state_ms: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    blocker_transaction_ms: Option<i64>,
    #[diesel(sql_type = diesel::sql_types::Text)]
    blocker_query: String,
}

/// `sessions` in their order, each once (`pg_blocking_pids` may name one
/// twice).
#[cfg(feature = "postgres")]
fn once_each(mut sessions: Vec<i64>) -> Vec<i64> {
    let mut seen = Vec::with_capacity(sessions.len());
    sessions.retain(|session| {
        let first = !seen.contains(session);
        seen.push(*session);
        first
    });
    sessions
}

/// Rows ordered by waiter, then blocker: one [`LockWait`] per waiter.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn group_waits(rows: Vec<WaitRow>) -> Vec<LockWait> {
    let mut waits: Vec<LockWait> = Vec::new();
    for row in rows {
        let blocker = Blocker {
            session: row.blocker,
            state: row.blocker_state,
            in_state: millis(row.blocker_state_ms),
            transaction_age: row.blocker_transaction_ms.map(millis),
            query: row.blocker_query,
        };
        match waits.last_mut() {
            // One row per blocking lock: a blocker holding two locks the
            // waiter waits for is listed once.
            Some(last) if last.session == row.session => {
                if last.blockers.iter().all(|b| b.session != blocker.session) {
                    last.blockers.push(blocker);
                }
            }
            _ => waits.push(LockWait {
                session: row.session,
                waiting: millis(row.waiting_ms),
                query: row.query,
                lock_mode: row.lock_mode,
                relation: row.relation,
                blockers: vec![blocker],
            }),
        }
    }
    waits
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
pub(crate) struct SessionId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(crate) id: i64,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Implements [`LockMonitor`] for `$backend` with the statements and row of
/// its module `$sql`: `SESSION_ID`, `LOCK_WAITS`, and `BLOCKED_SESSIONS_TRIED`
/// (each in turn until one loads), whose `Row`s `blocked` turns into the answer.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! lock_monitor {
    ($backend:ty, $sql:ident) => {
        impl LockMonitor for $backend {
            fn session_id<C>(conn: &mut C) -> diesel::QueryResult<i64>
            where
                C: Connection<Backend = Self> + LoadConnection,
            {
                use diesel::RunQueryDsl;
                diesel::sql_query($sql::SESSION_ID)
                    .get_result::<SessionId>(conn)
                    .map(|row| row.id)
            }

            fn blocked_sessions<C>(conn: &mut C) -> diesel::QueryResult<Vec<BlockedSession>>
            where
                C: Connection<Backend = Self> + LoadConnection,
            {
                use diesel::RunQueryDsl;
                let mut rows = Ok(Vec::new());
                for sql in $sql::BLOCKED_SESSIONS_TRIED {
                    rows = diesel::sql_query(*sql).load::<$sql::Row>(conn);
                    if rows.is_ok() {
                        break;
                    }
                }
                rows.map($sql::blocked)
            }

            fn current<C>(conn: &mut C) -> diesel::QueryResult<Vec<LockWait>>
            where
                C: Connection<Backend = Self> + LoadConnection,
            {
                use diesel::RunQueryDsl;
                diesel::sql_query($sql::LOCK_WAITS)
                    .load::<WaitRow>(conn)
                    .map(group_waits)
            }
        }
    };
}

#[cfg(feature = "postgres")]
lock_monitor!(diesel::pg::Pg, postgres);
#[cfg(feature = "mysql")]
lock_monitor!(diesel::mysql::Mysql, mysql);

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use diesel::sql_types::{Array, BigInt, Text};

    use super::*;

    #[derive(diesel::QueryableByName)]
    pub(crate) struct Row {
        #[diesel(sql_type = BigInt)]
        pub(super) session: i64,
        #[diesel(sql_type = Array<BigInt>)]
        pub(super) blocked_by: Vec<i64>,
        #[diesel(sql_type = BigInt)]
        pub(super) waiting_ms: i64,
        #[diesel(sql_type = Text)]
        pub(super) query: String,
    }

    /// The waiter's first lock not granted names the mode; its tuple lock (held
    /// by the first in line, awaited by the others) names the table, since the
    /// `transactionid` lock a row-lock waiter waits on has none.
    pub(crate) const LOCK_WAITS: &str = "SELECT a.pid::bigint AS session, \
            COALESCE((EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(a.state_change, a.query_start)) * 1000)::bigint, 0) AS waiting_ms, \
            COALESCE(a.query, '') AS query, \
            w.locktype || ' ' || w.mode AS lock_mode, \
            COALESCE(t.relation, w.relation)::regclass::text AS relation, \
            blocking.pid::bigint AS blocker, \
            COALESCE(b.state, '') AS blocker_state, \
            COALESCE((EXTRACT(EPOCH FROM clock_timestamp() - b.state_change) * 1000)::bigint, 0) AS blocker_state_ms, \
            (EXTRACT(EPOCH FROM clock_timestamp() - b.xact_start) * 1000)::bigint AS blocker_transaction_ms, \
            COALESCE(b.query, '') AS blocker_query \
       FROM pg_stat_activity a \
      CROSS JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS blocking(pid) \
       LEFT JOIN pg_stat_activity b ON b.pid = blocking.pid \
       LEFT JOIN LATERAL (SELECT l.locktype, l.mode, l.relation FROM pg_locks l \
                           WHERE l.pid = a.pid AND NOT l.granted LIMIT 1) w ON true \
       LEFT JOIN LATERAL (SELECT l.relation FROM pg_locks l \
                           WHERE l.pid = a.pid AND l.locktype = 'tuple' LIMIT 1) t ON true \
      ORDER BY session, blocker";

    pub(crate) const SESSION_ID: &str = "SELECT pg_backend_pid()::bigint AS id";

    pub(crate) const BLOCKED_SESSIONS: &str = "SELECT pid::bigint AS session, \
            pg_blocking_pids(pid)::bigint[] AS blocked_by, \
            COALESCE((EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(state_change, query_start)) * 1000)::bigint, 0) AS waiting_ms, \
            COALESCE(query, '') AS query \
       FROM pg_stat_activity \
      WHERE cardinality(pg_blocking_pids(pid)) > 0 \
      ORDER BY pid";

    /// The statements [`LockMonitor::blocked_sessions`] tries in turn.
    pub(crate) const BLOCKED_SESSIONS_TRIED: &[&str] = &[BLOCKED_SESSIONS];

    /// The rows of [`BLOCKED_SESSIONS`], one per waiter.
    pub(crate) fn blocked(rows: Vec<Row>) -> Vec<BlockedSession> {
        rows.into_iter()
            .map(|row| BlockedSession {
                session: row.session,
                blocked_by: once_each(row.blocked_by),
                waiting: millis(row.waiting_ms),
                query: row.query,
            })
            .collect()
    }
}

#[cfg(feature = "mysql")]
pub(crate) mod mysql {
    use diesel::sql_types::{BigInt, Text};

    use super::*;

    #[derive(diesel::QueryableByName)]
    pub(crate) struct Row {
        #[diesel(sql_type = BigInt)]
        pub(super) session: i64,
        #[diesel(sql_type = BigInt)]
        pub(super) blocker: i64,
        #[diesel(sql_type = BigInt)]
        pub(super) waiting_ms: i64,
        #[diesel(sql_type = Text)]
        pub(super) query: String,
    }

    /// The query of [`BLOCKED_SESSIONS_TRIED`] over the lock-wait view its
    /// `FROM` clause names (joined to `INNODB_TRX` as `r`, the waiter, and
    /// `b`, the blocker): a row per waiter and blocker.
    macro_rules! blocked_sessions {
        ($from:literal) => {
            concat!(
                "SELECT CAST(r.trx_mysql_thread_id AS SIGNED) AS session, \
                    CAST(b.trx_mysql_thread_id AS SIGNED) AS blocker, \
                    CAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) DIV 1000, 0) AS SIGNED) AS waiting_ms, \
                    COALESCE(r.trx_query, '') AS query ",
                $from,
                " ORDER BY session, blocker"
            )
        };
    }

    pub(crate) const MARIADB: &str = blocked_sessions!(
        "FROM information_schema.INNODB_LOCK_WAITS w \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id"
    );

    pub(crate) const MYSQL8: &str = blocked_sessions!(
        "FROM performance_schema.data_lock_waits w \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID"
    );

    /// MariaDB's views; `PROCESSLIST.COMMAND` is `Sleep` between statements.
    pub(crate) const LOCK_WAITS: &str = "SELECT CAST(r.trx_mysql_thread_id AS SIGNED) AS session, \
            CAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)) DIV 1000, 0) AS SIGNED) AS waiting_ms, \
            COALESCE(r.trx_query, '') AS query, \
            CAST(CONCAT(rl.lock_type, ' ', rl.lock_mode) AS CHAR(64)) AS lock_mode, \
            rl.lock_table AS relation, \
            CAST(b.trx_mysql_thread_id AS SIGNED) AS blocker, \
            CASE p.COMMAND WHEN 'Sleep' THEN 'idle in transaction' WHEN 'Query' THEN 'active' \
                 ELSE COALESCE(LOWER(p.COMMAND), '') END AS blocker_state, \
            CAST(COALESCE(p.TIME_MS, 0) AS SIGNED) AS blocker_state_ms, \
            CAST(TIMESTAMPDIFF(MICROSECOND, b.trx_started, NOW(6)) DIV 1000 AS SIGNED) AS blocker_transaction_ms, \
            COALESCE(b.trx_query, '') AS blocker_query \
       FROM information_schema.INNODB_LOCK_WAITS w \
       JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
       JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
       LEFT JOIN information_schema.INNODB_LOCKS rl ON rl.lock_id = w.requested_lock_id \
       LEFT JOIN information_schema.PROCESSLIST p ON p.ID = b.trx_mysql_thread_id \
      ORDER BY session, blocker";

    /// The statements [`LockMonitor::blocked_sessions`] tries in turn: MySQL 8
    /// removed `INNODB_LOCK_WAITS`.
    pub(crate) const BLOCKED_SESSIONS_TRIED: &[&str] = &[MARIADB, MYSQL8];

    pub(crate) const SESSION_ID: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED) AS id";

    /// The rows of [`MARIADB`] or [`MYSQL8`], ordered by waiter and blocker:
    /// one entry per waiter.
    pub(crate) fn blocked(rows: Vec<Row>) -> Vec<BlockedSession> {
        let mut sessions: Vec<BlockedSession> = Vec::new();
        for row in rows {
            match sessions.last_mut() {
                // One row per blocking lock: each blocker once.
                Some(last) if last.session == row.session => {
                    if !last.blocked_by.contains(&row.blocker) {
                        last.blocked_by.push(row.blocker);
                    }
                }
                _ => sessions.push(BlockedSession {
                    session: row.session,
                    blocked_by: vec![row.blocker],
                    waiting: millis(row.waiting_ms),
                    query: row.query,
                }),
            }
        }
        sessions
    }
}

#[cfg(all(test, feature = "postgres", feature = "mysql"))]
mod tests {
    use super::*;

    fn wait_row(session: i64, blocker: i64) -> WaitRow {
        WaitRow {
            session,
            waiting_ms: 5,
            query: "SELECT 1".into(),
            lock_mode: None,
            relation: None,
            blocker,
            blocker_state: "idle in transaction".into(),
            blocker_state_ms: 1,
            blocker_transaction_ms: None,
            blocker_query: String::new(),
        }
    }

    #[test]
    fn a_blocker_holding_two_locks_is_listed_once() {
        let waits = group_waits(vec![
            wait_row(7, 3),
            wait_row(7, 3),
            wait_row(7, 4),
            wait_row(8, 3),
        ]);
        let blockers: Vec<(i64, Vec<i64>)> = waits
            .iter()
            .map(|w| (w.session, w.blockers.iter().map(|b| b.session).collect()))
            .collect();
        assert_eq!(blockers, [(7, vec![3, 4]), (8, vec![3])]);
        let rows = [(7, 3), (7, 3), (7, 4)]
            .into_iter()
            .map(|(session, blocker)| mysql::Row {
                session,
                blocker,
                waiting_ms: 5,
                query: String::new(),
            })
            .collect();
        assert_eq!(mysql::blocked(rows)[0].blocked_by, [3, 4]);
        let rows = vec![postgres::Row {
            session: 7,
            blocked_by: vec![4, 3, 4],
            waiting_ms: 5,
            query: String::new(),
        }];
        assert_eq!(postgres::blocked(rows)[0].blocked_by, [4, 3]);
    }
}
