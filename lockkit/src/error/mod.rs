//! lockkit's error type, and the stale-write report.
//!
//! Every lockkit call that talks to the database returns [`Error`] (a few
//! parsers and constructors have small errors of their own: `IfMatchError`,
//! `ParseLsnError`, `InvalidIdentifier`, `SecretTooShort`; the HTTP layer answers
//! with a `Problem`). Database errors become typed
//! variants through [`classify`] (also used by `From<diesel::result::Error>`),
//! so a caller matches on what happened, not on server text:
//!
//! ```
//! # use lockkit::Error;
//! fn http_status(err: &Error) -> u16 {
//!     match err {
//!         Error::Stale(_) => 409,
//!         Error::NotFound => 404,
//!         e if e.is_retryable() => 503,
//!         _ => 500,
//!     }
//! }
//! assert_eq!(http_status(&Error::NotFound), 404);
//! assert_eq!(http_status(&Error::Deadlock), 503);
//! ```

mod aborted;
pub mod classification;

pub use aborted::Aborted;
pub(crate) use aborted::Settler;
pub use classification::{classify, classify_nowait};

use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Everything that can go wrong in lockkit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A version-checked write matched no row: someone else changed or deleted it.
    #[error(transparent)]
    Stale(#[from] StaleObjectError),

    /// A compare-and-set ([`compare_and_set`](crate::compare_and_set)) matched no
    /// row: an expected column no longer holds the value read, or the row is gone.
    /// Nothing was written.
    #[error(transparent)]
    StaleColumns(StaleColumnsError),

    /// A versioned bulk update found these rows changed; nothing was written.
    /// See [`Versioned::update_all_by_version`](crate::Versioned::update_all_by_version).
    #[error("{} of the rows were changed by someone else; nothing was written: {}", .0.len(), stale_keys(.0))]
    StaleRows(Vec<StaleObjectError>),

    /// The row to read or lock does not exist.
    #[error("row not found")]
    NotFound,

    /// A lock could not be taken at once (`NOWAIT`, or `SKIP LOCKED` on one
    /// key), SQLite's database is locked, or a lease is held by another holder.
    #[error("lock not available: another transaction or holder has it")]
    Busy,

    /// Waiting for a lock took longer than the lock timeout.
    #[error("lock wait timed out")]
    LockTimeout,

    /// The connection to the server was lost or killed. The server rolls back
    /// the transaction that was open on it, unless the connection was lost
    /// while it committed: when the `COMMIT` reached the server and its answer
    /// did not come back, the transaction committed and nobody can tell the
    /// client. So do not take this error for "nothing happened" after a write:
    /// read the row again, or make the work idempotent (lockkit's idempotency
    /// keys mark the key done in the work's transaction). Not retryable on the
    /// same connection: take a new one (a pool does), and drop the old one.
    /// Inside a transaction of your own (Diesel's `transaction`), lockkit
    /// takes the versions that transaction wrote for rolled back only when
    /// the connection is dropped (r2d2 drops a broken one at once): while a
    /// lost connection lives on, a struct written there may still match
    /// another writer's commit of its number.
    #[error(
        "the database connection was lost; an open transaction was rolled back, \
         unless it was lost while committing"
    )]
    ConnectionLost,

    /// The statement ran past the server's statement timeout and was cancelled.
    #[error("statement timed out")]
    StatementTimeout,

    /// The server broke a deadlock by aborting this transaction. Also
    /// MariaDB's 1020 under `innodb_snapshot_isolation` (a row changed since
    /// the transaction's snapshot), which InnoDB handles as a deadlock.
    #[error("deadlock detected; the transaction was rolled back")]
    Deadlock,

    /// A serializable (or snapshot) transaction could not be serialized.
    #[error("could not serialize access due to concurrent update")]
    SerializationFailure,

    /// The version is already at its type's maximum; see [`crate::optimistic::version`].
    #[error("{table} {key}: version {version} is the maximum of its type; refusing to write")]
    VersionOverflow {
        /// Table of the row.
        table: &'static str,
        /// The row's primary key, formatted.
        key: String,
        /// The version that cannot be incremented.
        version: i64,
    },

    /// The call needs an open transaction (row locks outside one would be released
    /// at once), e.g. [`Lockable::lock_all`](crate::Lockable::lock_all).
    #[error("this call must run inside a transaction")]
    NotInTransaction,

    /// The call opens its own transaction and cannot run inside another one,
    /// e.g. [`serializable`](crate::serializable).
    #[error("this call opens its own transaction and cannot be nested in another")]
    AlreadyInTransaction,

    /// A conditional update ([`atomic`](crate::atomic)) matched no row: its
    /// condition was false or the row does not exist. Nothing was written.
    #[error("the conditional update matched no row; nothing was written")]
    NoRowMatched,

    /// Another request with the same idempotency key is still running (HTTP 409).
    #[error("a request with this idempotency key is still in progress")]
    IdempotencyInProgress,

    /// The idempotency key was used before for a different request (HTTP 422).
    #[error("this idempotency key was already used for a different request")]
    IdempotencyKeyReused,

    /// The lease ([`lease`](crate::lease)) ran out or was taken over by another
    /// holder: renewing or releasing it did nothing. Its holder must stop writing;
    /// not retryable as it is (acquire the lease again, which issues a new fence).
    #[error("the lease ran out or was taken over by another holder")]
    LeaseLost,

    /// A fenced write ([`lease::fenced`](crate::lease::fenced)) carried a fence
    /// older than one its resource has already seen: a newer holder of the lease
    /// exists. Nothing was written. Not retryable with the same fence.
    #[error("fenced write to {resource} refused: fence {fence} is older than fence {current}, already seen")]
    Fenced {
        /// The resource the write was for.
        resource: String,
        /// The fence the write carried.
        fence: i64,
        /// The newest fence the resource has seen.
        current: i64,
    },

    /// The Redis lease store ([`lease::redis`](crate::lease::redis)) failed: a
    /// connection, protocol or script error from the `redis` client.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("the Redis lease store failed")]
    Redis(#[from] redis::RedisError),

    /// The server refused a write because the transaction or the server is
    /// read-only: a PostgreSQL hot standby (replica), a `READ ONLY` transaction
    /// (SQLSTATE 25006), MySQL/MariaDB's `READ ONLY` transaction (1792) or
    /// `--read-only` server (1290). Nothing was written. Not retryable on the same
    /// server: send writes to the primary (see `lockkit::replica`). Also a write
    /// on MySQL/MariaDB after a nested lockkit call returned
    /// [`TransactionAborted`](Self::TransactionAborted) and the caller went on:
    /// the server ended the transaction, and lockkit left a read-only one in its
    /// place until the caller's rollback.
    #[error("the server refused a write: the transaction or the server is read-only (a replica?)")]
    ReadOnly,

    /// The replica had not replayed the position a read had to see within the
    /// wait of [`replica::Policy::WaitOrFail`](crate::replica::Policy::WaitOrFail).
    /// Nothing was read. Retryable: the replica catches up, unless it is stuck.
    #[cfg(feature = "replica")]
    #[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
    #[error("the replica has replayed the WAL up to {replayed}, not yet to {wanted}, after waiting {waited:?}")]
    ReplicaBehind {
        /// The position the read had to see (the last write's).
        wanted: crate::lsn::Lsn,
        /// How far the replica had replayed when the wait ended.
        replayed: crate::lsn::Lsn,
        /// How long the read waited.
        waited: std::time::Duration,
    },

    /// No connection could be taken from an r2d2 pool (the
    /// [`replica::Router`](crate::replica::Router)'s pools): its timeout ran out,
    /// or the server could not be reached.
    #[cfg(all(feature = "replica", feature = "r2d2"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "replica", feature = "r2d2"))))]
    #[error("no connection from the pool")]
    Pool(#[from] diesel::r2d2::PoolError),

    /// No connection could be taken from a diesel-async pool (the bb8 or
    /// deadpool pools of
    /// [`replica::asynchronous::Router`](crate::replica::asynchronous::Router)):
    /// its timeout ran out, or the server could not be reached.
    #[cfg(all(feature = "replica", feature = "async"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "replica", feature = "async"))))]
    #[error("no connection from the pool")]
    AsyncPool(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A value from the caller is out of range; nothing was sent.
    #[error("invalid input: {0}")]
    InvalidInput(&'static str),

    /// The connection cannot take this call: advisory locks or lock views
    /// through a [`Dispatch`](crate::multi::Dispatch) enum that holds a SQLite
    /// connection. Nothing was sent. A setup error, not the client's: not
    /// retryable, and a `500` over HTTP.
    #[error("not supported on this connection: {0}")]
    Unsupported(&'static str),

    /// [`retry`](crate::retry()) gave up; `last` is the error of the final attempt.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// How many times the operation ran.
        attempts: u32,
        /// The error of the last attempt.
        last: Box<Error>,
    },

    /// A versioned write's key matched more than one row: the table's declared
    /// primary key is not unique in the database. The statement was undone;
    /// nothing was written. Declare the real key (or add the constraint).
    #[error("{table} {key}: the key matched more than one row; nothing was written (is the primary key declared right?)")]
    AmbiguousKey {
        /// Table of the rows.
        table: &'static str,
        /// The key, formatted.
        key: String,
    },

    /// The same row was named twice in one call (e.g.
    /// [`Versioned::update_all_by_version`](crate::Versioned::update_all_by_version));
    /// nothing was sent.
    #[error("{table} {key} is named more than once; nothing was written")]
    DuplicateKey {
        /// Table of the row.
        table: &'static str,
        /// The key, formatted.
        key: String,
    },

    /// The server rolled back the whole transaction while a lockkit call ran in
    /// it (a nested lockkit transaction, or a single write of lockkit's); `0`
    /// holds what went wrong. InnoDB does this on a deadlock. Nothing of the
    /// transaction was committed, and nothing more may run in it: not retryable
    /// while the transaction is open in Diesel's books. Return it to the code that
    /// opened the outermost transaction; once that has rolled back, the error is
    /// retryable like its cause ([`Aborted::is_settled`]), so a
    /// [`retry`](crate::retry()) around the whole transaction runs it again.
    /// [`transaction_with_retry`](crate::transaction_with_retry),
    /// [`serializable`](crate::serializable) and [`locked_transaction`](crate::locked_transaction)
    /// opened at the top level retry (or report) the cause itself.
    #[error("the server rolled back the whole transaction: {0}")]
    TransactionAborted(Aborted),

    /// A lockkit call nested in this one (async) was dropped before it
    /// finished (a `tokio::time::timeout` around it), and a statement ran
    /// after it, inside the savepoint it left open: that statement went with
    /// the savepoint, so this call rolled back everything and committed
    /// nothing. Also when a level it did not open was left open above its own
    /// (a nested transaction of the caller's, dropped; on the blocking side, a
    /// Diesel `transaction` whose closure panicked, the panic caught in the
    /// work, which Diesel leaves open). Not retryable: return from the closure
    /// once a nested call was dropped, or give up on it only at the top level.
    #[error("a nested call was dropped and work ran in the savepoint it left open; nothing was committed")]
    NestedCallDropped,

    /// Any other database error, unchanged.
    #[error(transparent)]
    Database(diesel::result::Error),
}

impl Error {
    /// Whether running the same work again (after re-reading) may succeed.
    ///
    /// True for [`Stale`](Error::Stale), [`StaleColumns`](Error::StaleColumns),
    /// [`StaleRows`](Error::StaleRows), [`Busy`](Error::Busy),
    /// [`LockTimeout`](Error::LockTimeout), [`Deadlock`](Error::Deadlock) and
    /// [`SerializationFailure`](Error::SerializationFailure): they are caused by
    /// other transactions and go away when those finish. Also for
    /// `ReplicaBehind` (feature `replica`): the replica catches up.
    /// [`TransactionAborted`](Error::TransactionAborted) only once its
    /// transaction's owner has rolled it back ([`Aborted::is_settled`]): until
    /// then nothing may run in that transaction, and a retry inside it would run
    /// in autocommit; run the outermost one again instead.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Stale(_)
                | Error::StaleColumns(_)
                | Error::StaleRows(_)
                | Error::Busy
                | Error::LockTimeout
                | Error::Deadlock
                | Error::SerializationFailure
        ) || self.is_replica_behind()
            || matches!(self, Error::TransactionAborted(aborted)
                if aborted.is_settled() && aborted.cause().is_retryable())
    }

    #[cfg(feature = "replica")]
    pub(crate) fn is_replica_behind(&self) -> bool {
        matches!(self, Error::ReplicaBehind { .. })
    }

    #[cfg(not(feature = "replica"))]
    pub(crate) fn is_replica_behind(&self) -> bool {
        false
    }

    /// Attaches what the writer tried to write to a stale-write report
    /// ([`StaleObjectError::record`]); `record` runs only for [`Error::Stale`], and
    /// any other error is returned unchanged.
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn).unwrap();
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 3)").execute(&mut conn).unwrap();
    /// #[derive(Debug, PartialEq)]
    /// struct Form { stock: i32, version: i32 }
    ///
    /// let form = Form { stock: 4, version: 2 }; // the user saw version 2
    /// let err = Item::update_by_version(&mut conn, 1, form.version, items::stock.eq(form.stock))
    ///     .map_err(|e| e.with_record(|| form))
    ///     .unwrap_err();
    /// let stale = err.as_stale().unwrap();
    /// assert_eq!(stale.record::<Form>(), Some(&Form { stock: 4, version: 2 }));
    /// ```
    #[must_use]
    pub fn with_record<M: Any + Send + Sync>(self, record: impl FnOnce() -> M) -> Self {
        match self {
            Error::Stale(stale) => Error::Stale(stale.with_record(record())),
            other => other,
        }
    }

    /// The stale-write report, if this is [`Error::Stale`].
    pub fn as_stale(&self) -> Option<&StaleObjectError> {
        match self {
            Error::Stale(stale) => Some(stale),
            _ => None,
        }
    }
}

fn stale_keys(stale: &[StaleObjectError]) -> String {
    let keys: Vec<&str> = stale.iter().map(|s| s.key.as_str()).collect();
    format!(
        "{} {}",
        stale.first().map_or("", |s| s.table),
        keys.join(", ")
    )
}

/// Which version-checked operation found the row changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `update_versioned`, `update_versioned_with`, `update_by_version`.
    Update,
    /// `delete_versioned`.
    Delete,
    /// `touch_versioned` (version bump only).
    Touch,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Update => "update",
            Operation::Delete => "delete",
            Operation::Touch => "touch",
        })
    }
}

/// What the database holds now, found by one `SELECT` after a stale write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CurrentState {
    /// The row exists with this version.
    Version(i64),
    /// The row no longer exists.
    Deleted,
    /// The row exists but its version is NULL, which no expected version matches:
    /// the row was written by something that ignores the version (declare the
    /// column `NOT NULL`).
    NullVersion,
    /// The row exists with this version, which is *lower* than the one the writer
    /// expected: the struct is ahead of the row. Its version was never committed
    /// (set by hand, or a write it made was rolled back and could not be matched to
    /// this struct). Reload the row.
    Behind(i64),
}

/// A version-checked write matched no row (Rails' `ActiveRecord::StaleObjectError`).
///
/// Nothing was written and the in-memory model was left as it was. Re-read the
/// row, re-apply the change and try again (see [`retry`](crate::retry())), or report a
/// conflict to the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale {operation} of {table} {key}: expected {version_column} = {expected_version}, {current}"
)]
#[non_exhaustive]
pub struct StaleObjectError {
    /// The table's name: the last segment of the model's
    /// `#[diesel(table_name = ..)]`, its `table!`'s Rust name.
    pub table: &'static str,
    /// The table as the database names it: `schema.name` for a `table!` that
    /// names a schema, the `sql_name` of one that renames the table. Two
    /// `table!`s may share a Rust name (`archive::items` and `items`); this
    /// tells their rows apart. `None` in a report made with [`new`](Self::new).
    pub database_table: Option<&'static str>,
    /// The primary key, formatted with `Debug` (`1`, `(1, 2)`, `"sku-9"`).
    pub key: String,
    /// The version column's name.
    pub version_column: &'static str,
    /// The operation that was refused.
    pub operation: Operation,
    /// The version the writer expected to find.
    pub expected_version: i64,
    /// What is in the database now.
    pub current: CurrentState,
    /// What the losing writer tried to write (Rails' `StaleObjectError#record`),
    /// when the call attached it: [`Versioned::update_versioned_recorded`](crate::Versioned::update_versioned_recorded)
    /// or [`Error::with_record`]. Read it with [`record`](Self::record).
    pub record: Option<StaleRecord>,
}

impl StaleObjectError {
    /// A stale-write report, e.g. to test how your code maps one to a response.
    pub fn new(
        table: &'static str,
        key: impl Into<String>,
        version_column: &'static str,
        operation: Operation,
        expected_version: i64,
        current: CurrentState,
    ) -> Self {
        StaleObjectError {
            table,
            database_table: None,
            key: key.into(),
            version_column,
            operation,
            expected_version,
            current,
            record: None,
        }
    }

    /// What the losing writer tried to write, if it was attached and is an `M`:
    /// for a merge UI that shows the user's values next to the row's current ones.
    pub fn record<M: Any>(&self) -> Option<&M> {
        self.record.as_ref()?.0.value.downcast_ref()
    }

    /// This report with `record` attached as what the writer tried to write.
    #[must_use]
    pub fn with_record<M: Any + Send + Sync>(mut self, record: M) -> Self {
        self.record = Some(StaleRecord(Arc::new(Recorded {
            type_name: std::any::type_name::<M>(),
            value: record,
        })));
        self
    }
}

/// What a losing writer tried to write, carried by a [`StaleObjectError`].
///
/// Type-erased, so that [`Error`] stays one non-generic type and `?` keeps
/// working: get it back as the type you attached with
/// [`StaleObjectError::record`]. Cloning it shares the record. Two are equal
/// only when they are the same attached record (the record need not be `Eq`).
#[derive(Clone)]
pub struct StaleRecord(Arc<Recorded<dyn Any + Send + Sync>>);

/// A record and its type's name, in one allocation behind one pointer: the
/// report (and so every `Result<_, Error>`) stays small.
struct Recorded<T: ?Sized> {
    type_name: &'static str,
    value: T,
}

impl StaleRecord {
    /// The Rust type of the record, as `std::any::type_name` prints it.
    pub fn type_name(&self) -> &'static str {
        self.0.type_name
    }
}

impl fmt::Debug for StaleRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StaleRecord")
            .field(&self.0.type_name)
            .finish()
    }
}

impl PartialEq for StaleRecord {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StaleRecord {}

impl fmt::Display for CurrentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CurrentState::Version(v) => write!(f, "found {v} (changed by someone else)"),
            CurrentState::Deleted => f.write_str("but the row was deleted"),
            CurrentState::NullVersion => f.write_str("but the row's version is NULL"),
            CurrentState::Behind(v) => write!(
                f,
                "found {v}, behind this struct (its version was never committed: reload the row)"
            ),
        }
    }
}

/// A compare-and-set matched no row ([`Error::StaleColumns`]): what each expected
/// column was expected to hold and what it holds now.
///
/// Nothing was written. The values are formatted with `Debug` (`"pending"`, `7`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale compare-and-set of {table} {key}: {}", describe_columns(self))]
#[non_exhaustive]
pub struct StaleColumnsError {
    /// The table's name.
    pub table: &'static str,
    /// The primary key, formatted with `Debug`.
    pub key: String,
    /// Whether the row is gone (then every `current` is `None`).
    pub deleted: bool,
    /// Every expected column, in the order given.
    pub columns: Vec<ColumnValue>,
}

impl StaleColumnsError {
    /// The columns that no longer hold their expected value (empty when the row
    /// is gone, or when a column changed and changed back before the read).
    pub fn changed(&self) -> impl Iterator<Item = &ColumnValue> {
        self.columns
            .iter()
            .filter(|c| c.current.as_ref().is_some_and(|now| *now != c.expected))
    }
}

/// One column of a [`StaleColumnsError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ColumnValue {
    /// The column's name.
    pub column: &'static str,
    /// The value the write expected, formatted with `Debug`.
    pub expected: String,
    /// The value found after the refused write, formatted with `Debug`; `None`
    /// when the row is gone.
    pub current: Option<String>,
}

fn describe_columns(stale: &StaleColumnsError) -> String {
    if stale.deleted {
        let names: Vec<String> = stale
            .columns
            .iter()
            .map(|c| format!("{} = {}", c.column, c.expected))
            .collect();
        return format!("expected {}, but the row was deleted", names.join(", "));
    }
    let changed: Vec<String> = stale
        .changed()
        .map(|c| {
            format!(
                "{} = {}, found {}",
                c.column,
                c.expected,
                c.current.as_deref().unwrap_or("")
            )
        })
        .collect();
    if changed.is_empty() {
        "the expected values changed and changed back before they were read".to_owned()
    } else {
        format!("expected {}", changed.join("; expected "))
    }
}

/// `Result` with lockkit's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its sources, `: `-separated, for lockkit's own log lines: an
/// error whose `Display` leaves its cause to `source()` (a pool's, Redis's)
/// still shows it there.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_shows_the_source_a_display_leaves_out() {
        #[derive(Debug, thiserror::Error)]
        #[error("no connection from the pool")]
        struct Outer(#[source] std::io::Error);
        let err = Outer(std::io::Error::other("connection refused"));
        assert_eq!(
            Chain(&err).to_string(),
            "no connection from the pool: connection refused"
        );
        assert_eq!(
            Chain(&Error::Deadlock).to_string(),
            Error::Deadlock.to_string()
        );
    }

    #[test]
    fn stale_message_names_everything() {
        let err = Error::from(StaleObjectError {
            table: "items",
            database_table: Some("items"),
            key: "7".into(),
            version_column: "lock_version",
            operation: Operation::Update,
            expected_version: 3,
            current: CurrentState::Version(4),
            record: None,
        });
        assert_eq!(
            err.to_string(),
            "stale update of items 7: expected lock_version = 3, found 4 (changed by someone else)"
        );
        assert!(err.is_retryable());
        let gone = StaleObjectError {
            current: CurrentState::Deleted,
            operation: Operation::Delete,
            ..err.as_stale().unwrap().clone()
        };
        assert_eq!(
            gone.to_string(),
            "stale delete of items 7: expected lock_version = 3, but the row was deleted"
        );
    }

    #[test]
    fn retryable_kinds() {
        assert!(Error::Busy.is_retryable());
        assert!(Error::LockTimeout.is_retryable());
        assert!(Error::Deadlock.is_retryable());
        assert!(Error::SerializationFailure.is_retryable());
        assert!(!Error::NotFound.is_retryable());
        assert!(!Error::StatementTimeout.is_retryable());
        assert!(!Error::TransactionAborted(Aborted::new(Error::Deadlock)).is_retryable());
        let exhausted = Error::RetriesExhausted {
            attempts: 5,
            last: Box::new(Error::Deadlock),
        };
        assert!(!exhausted.is_retryable());
        assert_eq!(
            exhausted.to_string(),
            "gave up after 5 attempts: deadlock detected; the transaction was rolled back"
        );
    }
}
