//! Turning Diesel's database errors into lockkit's typed [`Error`].
//!
//! Diesel exposes no SQLSTATE or server error number. It maps PostgreSQL's
//! `40001` and MySQL's `1213` to [`DatabaseErrorKind::SerializationFailure`], and
//! leaves PostgreSQL's `40P01` (deadlock) and `55P03` (lock not available), MySQL's
//! `1205` (lock wait timeout) and `3572` (`NOWAIT`) without a kind of their own
//! (Diesel's hidden `Unknown`, which it asks users to match as `_`, since later
//! releases may add kinds). So this module, and nothing else in lockkit, reads the
//! server's message: for `SerializationFailure` and for every kind that is not a
//! constraint violation (whose messages may quote user data).
//!
//! | server | error | message lockkit looks for | result |
//! | --- | --- | --- | --- |
//! | PostgreSQL | 40P01 | `deadlock detected` | [`Error::Deadlock`] |
//! | PostgreSQL | 55P03 (NOWAIT) | `could not obtain lock` | [`Error::Busy`] |
//! | PostgreSQL | 55P03 (`lock_timeout`) | `lock timeout` | [`Error::LockTimeout`] |
//! | PostgreSQL | 57014 | `statement timeout` | [`Error::StatementTimeout`] |
//! | PostgreSQL | 40001 | (kind) | [`Error::SerializationFailure`] |
//! | MySQL/MariaDB | 1213 | `Deadlock found` | [`Error::Deadlock`] |
//! | MariaDB (`innodb_snapshot_isolation`, the default from 11.6.2) | 1020 | `Record has changed since last read` | [`Error::Deadlock`]: InnoDB rolls back the whole transaction, as for a deadlock |
//! | MySQL/MariaDB | 1205 | `Lock wait timeout exceeded` | [`Error::LockTimeout`]; right after lockkit's `NOWAIT` (MariaDB's failed `NOWAIT`), [`Error::Busy`], see below |
//! | MySQL | 3572 | `NOWAIT is set` | [`Error::Busy`] |
//! | MySQL/MariaDB | 3024 / 1969 | `maximum statement execution time` / `max_statement_time` | [`Error::StatementTimeout`] |
//! | SQLite | `SQLITE_BUSY` | `database is locked` | [`Error::Busy`] ([`Error::LockTimeout`] when lockkit waited for the write lock, see [`locking_connection`](crate::pessimistic::connection)) |
//! | PostgreSQL | 57P01, lost socket | `terminating connection due to administrator command`, `server closed the connection unexpectedly` (or Diesel's `ClosedConnection`) | [`Error::ConnectionLost`] |
//! | MySQL/MariaDB | 1927, 2006, 2013 | `Connection was killed`, `MySQL server has gone away`, `Lost connection to` | [`Error::ConnectionLost`] |
//! | PostgreSQL | 25006 (a hot standby, `READ ONLY`) | (kind) | [`Error::ReadOnly`] |
//! | MySQL/MariaDB | 1792 (`READ ONLY` transaction) | (kind) | [`Error::ReadOnly`] |
//! | MySQL/MariaDB | 1290 | `running with the --read-only option` | [`Error::ReadOnly`] |
//!
//! # Limits
//!
//! * The servers must speak English (`lc_messages` on PostgreSQL,
//!   `lc_messages`/`--language` on MySQL/MariaDB): a translated message is left as
//!   [`Error::Database`] (or [`Error::SerializationFailure`] by kind), never
//!   misclassified. Messages of constraint violations (unique, foreign key, not
//!   null, check, restrict, exclusion) are never read, so user data inside them
//!   (e.g. a duplicate key that spells "deadlock") is never matched.
//! * A refusal of the user's own in the server's words (a trigger's `SIGNAL`
//!   whose text is InnoDB's deadlock message) is classified as what it says.
//!   Nothing ends the caller's transaction on its word alone: before lockkit
//!   treats a transaction as ended by it, the server confirms (a nested call
//!   asks, a versioned write's stand-in opens only where no transaction is
//!   open, see [`locking_connection`](crate::pessimistic::connection)).
//! * MariaDB reports a failed `NOWAIT` with error 1205, the same error and text as
//!   a lock wait timeout. lockkit tells them apart by time: its `NOWAIT` clause
//!   ([`LockQueryExt::nowait`](crate::LockQueryExt::nowait), [`RowLock`](crate::RowLock)
//!   with [`WaitMode::NoWait`](crate::WaitMode::NoWait)) notes on the thread when it
//!   is sent, and a 1205 classified within [`NOWAIT_WINDOW`] of that is
//!   [`Error::Busy`]. This cannot misread a real lock wait timeout: every statement
//!   sent after the `NOWAIT` one waits at least `innodb_lock_wait_timeout`, one
//!   second or more (0 means "do not wait", which is `NOWAIT`), before its 1205.
//!   Diesel's own `.no_wait()` is not seen, and a 1205 kept for longer than the
//!   window before it is classified stays [`Error::LockTimeout`]; calls that know
//!   they asked for `NOWAIT` can use [`classify_nowait`]. Both are retryable.
//!   The note is the thread's: on an async runtime, another task's `NOWAIT` sent
//!   on the same worker thread within the window makes a real lock wait timeout
//!   read as [`Error::Busy`] (and a task moved to another thread after its
//!   `NOWAIT` reads its failure as [`Error::LockTimeout`]); async code that must
//!   tell them apart classifies its own `NOWAIT` statements with
//!   [`classify_nowait`].

use std::cell::Cell;
use std::time::{Duration, Instant};

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::error::Error;

/// How long after lockkit sent a `NOWAIT` clause on a thread a MySQL/MariaDB lock
/// wait timeout (1205) is read as that clause's failure, [`Error::Busy`]. Under the
/// smallest real lock wait, one second.
pub const NOWAIT_WINDOW: Duration = Duration::from_millis(500);

/// Classifies a Diesel error; see the [module docs](self) for the table.
///
/// ```
/// use diesel::result::Error as DieselError;
/// assert!(matches!(lockkit::classify(DieselError::NotFound), lockkit::Error::NotFound));
/// ```
pub fn classify(err: DieselError) -> Error {
    classify_with(err, Context::Statement)
}

/// Like [`classify`], for a statement that used `NOWAIT`: a lock wait timeout can
/// only mean the lock was not available (MariaDB), so it is [`Error::Busy`].
///
/// For Diesel's own `.no_wait()`, which lockkit does not see being sent (and
/// for async code, see the [module docs](self#limits)):
///
/// ```no_run
/// # #[cfg(feature = "mysql")] {
/// use diesel::prelude::*;
/// # diesel::table! { jobs (id) { id -> Integer, done -> Bool } }
/// let mut conn = MysqlConnection::establish("mysql://localhost/app").unwrap();
/// let done = conn.transaction(|conn| {
///     jobs::table.find(1).select(jobs::done).for_update().no_wait().first::<bool>(conn)
/// });
/// match done.map_err(lockkit::classify_nowait) {
///     Ok(done) => println!("job 1 locked, done: {done}"),
///     Err(lockkit::Error::Busy) => println!("another worker holds job 1"), // MariaDB's 1205 too
///     Err(other) => panic!("{other}"),
/// }
/// # }
/// ```
pub fn classify_nowait(err: DieselError) -> Error {
    classify_with(err, Context::NoWait)
}

/// Like [`classify`], for SQLite's attempt to take the database's write lock after
/// waiting up to its busy timeout: "database is locked" then means the wait ran
/// out, [`Error::LockTimeout`].
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn classify_lock_wait(err: DieselError) -> Error {
    classify_with(err, Context::WaitedForWriteLock)
}

/// Like [`classify`], for a statement's error lockkit's journal kept
/// (`journal::ended_by`): not counted in [`metrics`](crate::metrics) again.
pub(crate) fn recall(err: DieselError) -> Error {
    classify_with(err, Context::Recalled)
}

/// A lock error lockkit found without a database error (MySQL's `GET_LOCK`
/// returning 0): counted and reported like a classified one.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn lock_error(error: Error, what: &str) -> Error {
    record(&error, what);
    error
}

thread_local! {
    static NOWAIT_SENT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Called by lockkit's MySQL `NOWAIT` clause each time a statement with it is
/// built, which Diesel does right before sending it (the SQL may come from the
/// statement cache, the bind values never do).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) fn nowait_sent() {
    NOWAIT_SENT.with(|sent| sent.set(Some(Instant::now())));
}

/// Whether lockkit sent a `NOWAIT` clause on this thread within [`NOWAIT_WINDOW`];
/// forgets it, so that one clause explains one error at most.
fn nowait_just_sent() -> bool {
    NOWAIT_SENT
        .with(Cell::take)
        .is_some_and(|sent| sent.elapsed() < NOWAIT_WINDOW)
}

/// What the failed statement was doing, which decides between [`Error::Busy`]
/// and [`Error::LockTimeout`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    /// Any statement.
    Statement,
    /// A statement with `NOWAIT`.
    NoWait,
    /// SQLite taking the write lock with a busy timeout.
    WaitedForWriteLock,
    /// A statement's error lockkit's journal kept, classified again: it was
    /// counted when it happened.
    Recalled,
}

fn classify_with(err: DieselError, context: Context) -> Error {
    let kind = match &err {
        DieselError::NotFound => return Error::NotFound,
        DieselError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::SerializationFailure if is_deadlock(info.message()) => {
                Some(Error::Deadlock)
            }
            DatabaseErrorKind::SerializationFailure => Some(Error::SerializationFailure),
            DatabaseErrorKind::ClosedConnection => Some(Error::ConnectionLost),
            DatabaseErrorKind::ReadOnlyTransaction => Some(Error::ReadOnly),
            // Their messages may quote the user's data.
            DatabaseErrorKind::UniqueViolation
            | DatabaseErrorKind::ForeignKeyViolation
            | DatabaseErrorKind::NotNullViolation
            | DatabaseErrorKind::CheckViolation
            | DatabaseErrorKind::RestrictViolation
            | DatabaseErrorKind::ExclusionViolation => None,
            // Diesel's hidden `Unknown`, and any kind a later Diesel adds.
            _ => classify_message(info.message()),
        },
        // Diesel's `ROLLBACK` after a failed `COMMIT` failed too. A `COMMIT`
        // that lost the connection (MySQL/MariaDB's 2013, then "server has
        // gone away") may have committed; one the server refused did not,
        // and stays a database error.
        DieselError::RollbackErrorOnCommit { commit_error, .. } if is_lost(commit_error) => {
            Some(Error::ConnectionLost)
        }
        _ => None,
    };
    let classified = match (kind, context) {
        (Some(Error::LockTimeout), Context::NoWait) => Error::Busy,
        (Some(Error::LockTimeout), Context::Statement) if nowait_just_sent() => Error::Busy,
        (Some(Error::Busy), Context::WaitedForWriteLock) => Error::LockTimeout,
        (Some(classified), Context::Recalled) => return classified,
        (Some(classified), _) => classified,
        (None, _) => return Error::Database(err),
    };
    record(&classified, &err.to_string());
    classified
}

pub(crate) fn is_deadlock(message: &str) -> bool {
    // PostgreSQL: "deadlock detected"; MySQL/MariaDB: "Deadlock found when trying to get lock".
    message.starts_with("deadlock detected") || is_innodb_deadlock(message)
}

/// MySQL/MariaDB's refusal of a write in a read-only transaction (1792; the
/// kind is Diesel's reading, the message diesel-async's): in autocommit on a
/// session made read-only outside lockkit's transactions (README, "Galera"),
/// or in a transaction that began read-only.
pub(crate) fn is_read_only_refusal(kind: DatabaseErrorKind, message: &str) -> bool {
    kind == DatabaseErrorKind::ReadOnlyTransaction || is_mysql_read_only_refusal(message)
}

/// MySQL/MariaDB's refusal of a server running read-only (1290, `--read-only`
/// or `--super-read-only`), read from the message's start.
pub(crate) fn is_read_only_server(message: &str) -> bool {
    message.starts_with("The MySQL server is running with the --read-only option")
        || message.starts_with("The MySQL server is running with the --super-read-only option")
        || message.starts_with("The MariaDB server is running with the --read-only option")
}

/// MySQL/MariaDB's refusal of a write in a read-only transaction (1792), read
/// off its message only: PostgreSQL's (25006, the same kind) says it otherwise.
pub(crate) fn is_mysql_read_only_refusal(message: &str) -> bool {
    message.starts_with("Cannot execute statement in a READ ONLY transaction")
}

/// MySQL/MariaDB's deadlock (1213, Galera's certification failure too), which
/// rolls back the victim's whole transaction; no other server says it so.
/// MariaDB's 1020 under `innodb_snapshot_isolation` (the default from 11.6.2:
/// a locking read or write of a row changed since the transaction's snapshot)
/// is one too: InnoDB handles it as a deadlock, and rolls back the whole
/// transaction.
pub(crate) fn is_innodb_deadlock(message: &str) -> bool {
    message.starts_with("Deadlock found")
        || message.starts_with("Record has changed since last read")
}

/// MySQL/MariaDB's lock wait timeout (1205, also MariaDB's failed `NOWAIT`),
/// which rolls back the whole transaction on a server started with
/// `--innodb-rollback-on-timeout`, else the statement only.
pub(crate) fn is_lock_wait_timeout(message: &str) -> bool {
    message.starts_with("Lock wait timeout exceeded")
}

/// Whether `err` is a lost connection, as [`classify`] reads it (the
/// messages of the kinds it never reads are not read here either).
fn is_lost(err: &DieselError) -> bool {
    match err {
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => true,
        DieselError::DatabaseError(
            DatabaseErrorKind::Unknown | DatabaseErrorKind::UnableToSendCommand,
            info,
        ) => is_connection_lost(info.message()),
        _ => false,
    }
}

fn is_connection_lost(message: &str) -> bool {
    // PostgreSQL: pg_terminate_backend, a restart, a broken socket. libpq's
    // words may follow the server's last message (`FATAL:  ..`) on a line of
    // their own; read there or at the start only, as a message may quote the
    // user's data, newlines included.
    const CLOSED: &str = "server closed the connection unexpectedly";
    let mut lines = message.lines();
    let (first, second) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    message.starts_with("terminating connection due to administrator command")
        || first.starts_with(CLOSED)
        || (first.starts_with("FATAL:") && second.starts_with(CLOSED))
        || message.starts_with("no connection to the server")
        // MySQL/MariaDB: KILL (1927), 2006, 2013.
        || message.starts_with("Connection was killed")
        || message.starts_with("MySQL server has gone away")
        || message.starts_with("Server has gone away")
        || message.starts_with("Lost connection to")
        // MySQL 8.0.24+'s 4031: an idle session past `wait_timeout`.
        || message.starts_with("The client was disconnected by the server because of inactivity")
        // diesel-async's drivers, whose closed connection carries no code:
        // tokio-postgres ...
        || message == "connection closed"
        || message.starts_with("error communicating with the server")
        // ... and mysql_async (its driver error, as diesel-async words it).
        || message.starts_with("Driver error: `Connection to the server is closed")
        || message.starts_with("Input/output error")
}

/// MySQL's 3572, whole: the words alone may stand in a message that quotes
/// the user's data.
const MYSQL_NOWAIT: &str =
    "Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set";

/// The server's message, read from its start: a message may quote the user's
/// data (an invalid enum value, a truncated string), which must not read as a
/// lock error and be retried.
fn classify_message(message: &str) -> Option<Error> {
    if is_deadlock(message) {
        Some(Error::Deadlock)
    } else if message.starts_with("could not obtain lock")
        || message.starts_with(MYSQL_NOWAIT)
        || message.starts_with("database is locked")
        || message.starts_with("database table is locked")
    {
        Some(Error::Busy)
    } else if is_lock_wait_timeout(message)
        || message.starts_with("canceling statement due to lock timeout")
    {
        Some(Error::LockTimeout)
    } else if is_read_only_server(message) {
        Some(Error::ReadOnly)
    } else if is_connection_lost(message) {
        Some(Error::ConnectionLost)
    } else if message.starts_with("canceling statement due to statement timeout")
        || (message.starts_with("Query execution was interrupted")
            && (message.contains("maximum statement execution time exceeded")
                || message.contains("max_statement_time exceeded")))
    {
        Some(Error::StatementTimeout)
    } else {
        None
    }
}

impl From<diesel::result::Error> for Error {
    /// Classifies the error; see [`classify()`].
    fn from(err: diesel::result::Error) -> Self {
        classify(err)
    }
}

/// Counts a lock error in [`metrics`](crate::metrics); other errors are not counted.
fn record(error: &Error, server_message: &str) {
    use crate::metrics::LockErrorKind;
    let kind = match error {
        Error::Busy => LockErrorKind::Busy,
        Error::LockTimeout => LockErrorKind::LockTimeout,
        Error::Deadlock => LockErrorKind::Deadlock,
        Error::SerializationFailure => LockErrorKind::SerializationFailure,
        Error::StatementTimeout => LockErrorKind::StatementTimeout,
        _ => return,
    };
    crate::metrics::record_lock_error(kind, server_message);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lost_at_commit_is_connection_lost_after_the_failed_rollback() {
        let error = |message: &str| {
            Box::new(DieselError::DatabaseError(
                DatabaseErrorKind::Unknown,
                Box::new(message.to_owned()),
            ))
        };
        let lost = DieselError::RollbackErrorOnCommit {
            commit_error: error("Lost connection to MySQL server during query"),
            rollback_error: error("MySQL server has gone away"),
        };
        assert!(matches!(classify(lost), Error::ConnectionLost));
        // A COMMIT the server refused did not commit, whatever the ROLLBACK
        // after it met.
        for rollback in [
            "cannot rollback - no transaction is active",
            "MySQL server has gone away",
        ] {
            let refused = DieselError::RollbackErrorOnCommit {
                commit_error: error("Deferred constraint failed"),
                rollback_error: error(rollback),
            };
            assert!(
                matches!(classify(refused), Error::Database(_)),
                "{rollback}"
            );
        }
    }

    #[test]
    fn the_users_data_in_a_message_is_never_a_lock_error() {
        for quoted in [
            "invalid input value for enum status: \"x NOWAIT is set\"",
            "Incorrect integer value: 'running with the --read-only option' for column 'n'",
            "invalid input syntax for type integer: \"max_statement_time exceeded\"",
            "Data too long for column 'note': 'maximum statement execution time exceeded'",
            "rejected: \"server closed the connection unexpectedly\"",
            "invalid input syntax for type integer: \"x\nserver closed the connection unexpectedly\"",
        ] {
            assert!(classify_message(quoted).is_none(), "{quoted}");
        }
        for (server, expected) in [
            ("Statement aborted because lock(s) could not be acquired immediately and NOWAIT is set.", Error::Busy),
            ("The MySQL server is running with the --read-only option so it cannot execute this statement", Error::ReadOnly),
            ("Query execution was interrupted, maximum statement execution time exceeded", Error::StatementTimeout),
            ("Query execution was interrupted (max_statement_time exceeded)", Error::StatementTimeout),
            ("The MySQL server is running with the --super-read-only option so it cannot execute this statement", Error::ReadOnly),
            ("The client was disconnected by the server because of inactivity. See wait_timeout and interactive_timeout for configuring this behavior.", Error::ConnectionLost),
            ("server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally", Error::ConnectionLost),
            ("FATAL:  terminating connection due to idle-session timeout\nserver closed the connection unexpectedly", Error::ConnectionLost),
        ] {
            let classified = classify_message(server);
            assert_eq!(
                classified.as_ref().map(ToString::to_string),
                Some(expected.to_string()),
                "{server}"
            );
        }
    }
}
