//! Who is waiting on whom, right now, on diesel-async: [`session_id`],
//! [`blocked_sessions`] and [`lock_waits::current`](current), the async twins of
//! [`lockkit::lock_waits`](crate::lock_waits), with the same statements over
//! the server's views and the same answers (see there for what each backend
//! reports). PostgreSQL and MySQL/MariaDB; SQLite has no row locks to wait on.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), lockkit::Error> {
//! use lockkit::asynchronous::lock_waits;
//! for wait in lock_waits::current(conn).await? {
//!     for blocker in wait.blockers.iter().filter(|b| b.is_idle_in_transaction()) {
//!         println!("session {} waits for session {}, idle in transaction for {:?}",
//!             wait.session, blocker.session, blocker.in_state);
//!     }
//! }
//! # Ok(()) }
//! ```

use std::future::Future;

use crate::error::classification::classify;
use crate::error::Error;
pub use crate::pessimistic::lock_waits::{BlockedSession, Blocker, LockWait};

/// A diesel-async connection whose lock waits lockkit can list:
/// `AsyncPgConnection`, `AsyncMysqlConnection` (a pooled one as `&mut *conn`).
/// Sealed; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit cannot list lock waits on `{Self}`",
    label = "lock waits are read from PostgreSQL's and MySQL/MariaDB's views",
    note = "SQLite has no row locks to wait on: a writer waits for the database's write lock, up to `PRAGMA busy_timeout`"
)]
pub trait AsyncLockMonitor: diesel_async::AsyncConnection + crate::sealed::Sealed {
    /// This connection's session id.
    #[doc(hidden)]
    fn session_id(&mut self) -> impl Future<Output = diesel::QueryResult<i64>> + Send;
    /// Every session now waiting for a lock, by session id.
    #[doc(hidden)]
    fn blocked_sessions(
        &mut self,
    ) -> impl Future<Output = diesel::QueryResult<Vec<BlockedSession>>> + Send;
    /// Every session now waiting for a lock, with its blockers.
    #[doc(hidden)]
    fn current(&mut self) -> impl Future<Output = diesel::QueryResult<Vec<LockWait>>> + Send;
}

/// This connection's session id (`pg_backend_pid()`, `CONNECTION_ID()`), as
/// [`lockkit::lock_waits::session_id`](crate::lock_waits::session_id).
///
/// # Errors
///
/// A classified database error; see [`classify`](crate::classify()).
pub async fn session_id<C: AsyncLockMonitor>(conn: &mut C) -> Result<i64, Error> {
    conn.session_id().await.map_err(classify)
}

/// Every session now waiting for a lock, ordered by session id, as
/// [`lockkit::lock_waits::blocked_sessions`](crate::lock_waits::blocked_sessions).
///
/// # Errors
///
/// As [`lockkit::lock_waits::blocked_sessions`](crate::lock_waits::blocked_sessions).
pub async fn blocked_sessions<C: AsyncLockMonitor>(
    conn: &mut C,
) -> Result<Vec<BlockedSession>, Error> {
    conn.blocked_sessions().await.map_err(classify)
}

/// Every session now waiting for a lock, ordered by session id, with the lock
/// it waits for and what each of its blockers is doing, as
/// [`lockkit::lock_waits::current`](crate::lock_waits::current).
///
/// # Errors
///
/// As [`lockkit::lock_waits::current`](crate::lock_waits::current)
/// (MySQL 8: [`Error::Database`]; use [`blocked_sessions`]).
pub async fn current<C: AsyncLockMonitor>(conn: &mut C) -> Result<Vec<LockWait>, Error> {
    conn.current().await.map_err(classify)
}

/// Implements [`AsyncLockMonitor`] for `$conn` with the blocking side's
/// statements, rows and answers for its backend (`crate::lock_waits::$sql`),
/// awaited.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! async_lock_monitor {
    ($conn:ty, $sql:ident) => {
        impl AsyncLockMonitor for $conn {
            async fn session_id(&mut self) -> diesel::QueryResult<i64> {
                use diesel_async::RunQueryDsl;
                diesel::sql_query(crate::pessimistic::lock_waits::$sql::SESSION_ID)
                    .get_result::<crate::pessimistic::lock_waits::SessionId>(self)
                    .await
                    .map(|row| row.id)
            }

            async fn blocked_sessions(&mut self) -> diesel::QueryResult<Vec<BlockedSession>> {
                use crate::pessimistic::lock_waits::$sql::{blocked, Row, BLOCKED_SESSIONS_TRIED};
                use diesel_async::RunQueryDsl;
                let mut rows = Ok(Vec::new());
                for sql in BLOCKED_SESSIONS_TRIED {
                    rows = diesel::sql_query(*sql).load::<Row>(self).await;
                    if rows.is_ok() {
                        break;
                    }
                }
                rows.map(blocked)
            }

            async fn current(&mut self) -> diesel::QueryResult<Vec<LockWait>> {
                use diesel_async::RunQueryDsl;
                diesel::sql_query(crate::pessimistic::lock_waits::$sql::LOCK_WAITS)
                    .load::<crate::pessimistic::lock_waits::WaitRow>(self)
                    .await
                    .map(crate::pessimistic::lock_waits::group_waits)
            }
        }
    };
}

#[cfg(feature = "postgres")]
async_lock_monitor!(diesel_async::AsyncPgConnection, postgres);
#[cfg(feature = "mysql")]
async_lock_monitor!(diesel_async::AsyncMysqlConnection, mysql);
