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
//! | MySQL/MariaDB | 1205 | `Lock wait timeout exceeded` | [`Error::LockTimeout`] (MariaDB's `NOWAIT` too, see below) |
//! | MySQL | 3572 | `NOWAIT is set` | [`Error::Busy`] |
//! | MySQL/MariaDB | 3024 / 1969 | `maximum statement execution time` / `max_statement_time` | [`Error::StatementTimeout`] |
//! | SQLite | `SQLITE_BUSY` | `database is locked` | [`Error::Busy`] |
//! | PostgreSQL | 57P01, lost socket | `terminating connection due to administrator command`, `server closed the connection unexpectedly` (or Diesel's `ClosedConnection`) | [`Error::ConnectionLost`] |
//! | MySQL/MariaDB | 1927, 2006, 2013 | `Connection was killed`, `MySQL server has gone away`, `Lost connection to` | [`Error::ConnectionLost`] |
//!
//! # Limits
//!
//! * The servers must speak English (`lc_messages` on PostgreSQL,
//!   `lc_messages`/`--language` on MySQL/MariaDB): a translated message is left as
//!   [`Error::Database`] (or [`Error::SerializationFailure`] by kind), never
//!   misclassified. Messages of constraint violations (unique, foreign key, not
//!   null, check, restrict, exclusion) are never read, so user data inside them
//!   (e.g. a duplicate key that spells "deadlock") is never matched.
//! * MariaDB reports a failed `NOWAIT` with error 1205, the same as a lock wait
//!   timeout. Calls that know they asked for `NOWAIT` use [`classify_nowait`], which
//!   reports [`Error::Busy`]; a `?` on your own NOWAIT query gives
//!   [`Error::LockTimeout`] on MariaDB. Both are retryable.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::Error;

/// Classifies a Diesel error; see the [module docs](self) for the table.
///
/// ```
/// use diesel::result::Error as DieselError;
/// assert!(matches!(lockkit::classify(DieselError::NotFound), lockkit::Error::NotFound));
/// ```
pub fn classify(err: DieselError) -> Error {
    classify_with(err, LockWait::Wait)
}

/// Like [`classify`], for a statement that used `NOWAIT`: a lock wait timeout can
/// only mean the lock was not available (MariaDB), so it is [`Error::Busy`].
pub fn classify_nowait(err: DieselError) -> Error {
    classify_with(err, LockWait::NoWait)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum LockWait {
    Wait,
    NoWait,
}

fn classify_with(err: DieselError, wait: LockWait) -> Error {
    let kind = match &err {
        DieselError::NotFound => return Error::NotFound,
        DieselError::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::SerializationFailure if is_deadlock(info.message()) => {
                Some(Error::Deadlock)
            }
            DatabaseErrorKind::SerializationFailure => Some(Error::SerializationFailure),
            DatabaseErrorKind::ClosedConnection => Some(Error::ConnectionLost),
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
        _ => None,
    };
    let classified = match kind {
        Some(Error::LockTimeout) if wait == LockWait::NoWait => Error::Busy,
        Some(classified) => classified,
        None => return Error::Database(err),
    };
    crate::metrics::record_lock_error(&classified, &err.to_string());
    classified
}

fn is_deadlock(message: &str) -> bool {
    // PostgreSQL: "deadlock detected"; MySQL/MariaDB: "Deadlock found when trying to get lock".
    message.starts_with("deadlock detected") || message.starts_with("Deadlock found")
}

fn is_connection_lost(message: &str) -> bool {
    // PostgreSQL: pg_terminate_backend, a restart, a broken socket.
    message.starts_with("terminating connection due to administrator command")
        || message.contains("server closed the connection unexpectedly")
        || message.starts_with("no connection to the server")
        // MySQL/MariaDB: KILL (1927), 2006, 2013.
        || message.starts_with("Connection was killed")
        || message.starts_with("MySQL server has gone away")
        || message.starts_with("Server has gone away")
        || message.starts_with("Lost connection to")
}

fn classify_message(message: &str) -> Option<Error> {
    if is_deadlock(message) {
        Some(Error::Deadlock)
    } else if message.starts_with("could not obtain lock")
        || message.contains("NOWAIT is set")
        || message.starts_with("database is locked")
        || message.starts_with("database table is locked")
    {
        Some(Error::Busy)
    } else if message.starts_with("Lock wait timeout exceeded")
        || message.starts_with("canceling statement due to lock timeout")
    {
        Some(Error::LockTimeout)
    } else if is_connection_lost(message) {
        Some(Error::ConnectionLost)
    } else if message.starts_with("canceling statement due to statement timeout")
        || message.contains("maximum statement execution time exceeded")
        || message.contains("max_statement_time exceeded")
    {
        Some(Error::StatementTimeout)
    } else {
        None
    }
}
