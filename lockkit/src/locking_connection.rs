//! What differs between backends when taking locks: the lock clause, how a
//! locking transaction begins, and how its lock timeout is set.
//!
//! | | PostgreSQL | MySQL / MariaDB | SQLite |
//! | --- | --- | --- | --- |
//! | row lock | `FOR UPDATE` (and strengths) | `FOR UPDATE` / `LOCK IN SHARE MODE` | none: the transaction is `BEGIN IMMEDIATE`, which takes the database's write lock and so serializes writers |
//! | timeout | `SELECT set_config('lock_timeout', $1, true)` (= `SET LOCAL`) | `SET SESSION innodb_lock_wait_timeout = ?`, whole seconds, restored afterwards | `PRAGMA busy_timeout = n`, restored afterwards |
//! | `NOWAIT` / `SKIP LOCKED` | in the clause | in the clause | busy timeout 0: a locked database is [`Error::Busy`] |
//! | wait ran out | [`Error::LockTimeout`] | [`Error::LockTimeout`] | [`Error::LockTimeout`] (busy while taking the write lock) |
//! | nested | savepoint; a timeout is put back before the savepoint is released (`SET LOCAL` outlives `RELEASE SAVEPOINT`) | savepoint | savepoint, then `PRAGMA incremental_vacuum(1)`, which takes the write lock a deferred outer transaction lacks |
//!
//! Options apply to the call that asked for them and to nothing after it, nested
//! or not. A panic in the closure rolls the transaction back before it unwinds
//! further, so the connection is never left inside a transaction.
//!
//! # When the server aborts the whole transaction
//!
//! A nested call runs in a savepoint. PostgreSQL rolls back to the savepoint after
//! any error, so retrying there is sound. InnoDB answers a deadlock by rolling back
//! the *whole* transaction, while Diesel still counts it as open; work retried in
//! it would run in autocommit and commit half an operation. So when a nested
//! lockkit transaction ([`locked_transaction`](crate::locked_transaction), behind
//! `with_lock`, and [`transaction_with_retry`](crate::transaction_with_retry)) fails, lockkit
//! asks the server whether its transaction is still open (MariaDB: `SELECT
//! @@in_transaction`; where that variable is missing, a deadlock or a lost
//! connection counts as the end) and, if not, returns
//! [`Error::TransactionAborted`], which is not retryable: it travels up to the code
//! that opened the outermost transaction, and nothing was committed. The lockkit
//! calls that open the outermost transaction themselves retry (or report) the
//! cause. The question costs one statement, on the error path of nested calls only.
//!
//! Timeouts come from a [`Duration`] and reach the server as a
//! bound parameter (PostgreSQL, MySQL) or a formatted integer (SQLite's `PRAGMA`
//! takes no parameters); no caller text is ever interpolated.

use std::time::Duration;

use diesel::connection::{AnsiTransactionManager, TransactionManager};
use diesel::query_dsl::methods::LockingDsl;
use diesel::Connection;

use crate::row_lock::{LockStrength, RowLock, WaitMode};
use crate::Error;

/// How to lock: strength, wait mode and lock timeout. `LockOptions::default()` is
/// `FOR UPDATE`, waiting up to the server's own lock timeout.
///
/// ```
/// use std::time::Duration;
/// use lockkit::LockOptions;
/// let opts = LockOptions::default().nowait();
/// let patient = LockOptions::default().timeout(Duration::from_millis(250));
/// let weaker = LockOptions::default().no_key_update();
/// # let _ = (opts, patient, weaker);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LockOptions {
    lock: RowLock,
    timeout: Option<Duration>,
}

impl LockOptions {
    #[must_use]
    /// Fail at once with [`Error::Busy`] if the row is locked.
    pub fn nowait(mut self) -> Self {
        self.lock.wait = WaitMode::NoWait;
        self
    }

    #[must_use]
    /// Skip a locked row: [`with_lock`](crate::with_lock) then reports [`Error::Busy`]
    /// (the row exists but someone holds it) or [`Error::NotFound`].
    pub fn skip_locked(mut self) -> Self {
        self.lock.wait = WaitMode::SkipLocked;
        self
    }

    #[must_use]
    /// Wait at most `timeout` for the lock, then fail with [`Error::LockTimeout`].
    ///
    /// Clamped to 1 ms ..= `i32::MAX` ms. MySQL/MariaDB count whole seconds, so the
    /// timeout is rounded up to the next second there.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    #[must_use]
    /// The lock strength ([`LockStrength::Update`] by default).
    pub fn strength(mut self, strength: LockStrength) -> Self {
        self.lock.strength = strength;
        self
    }

    #[must_use]
    /// `FOR NO KEY UPDATE` on PostgreSQL (`FOR UPDATE` elsewhere).
    pub fn no_key_update(self) -> Self {
        self.strength(LockStrength::NoKeyUpdate)
    }

    #[must_use]
    /// `FOR SHARE` / `LOCK IN SHARE MODE`.
    pub fn share(self) -> Self {
        self.strength(LockStrength::Share)
    }

    /// The row-lock clause these options produce.
    pub fn row_lock(&self) -> RowLock {
        self.lock
    }

    /// The wait mode.
    pub fn wait_mode(&self) -> WaitMode {
        self.lock.wait
    }

    /// The timeout in whole milliseconds, clamped to 1 ..= `i32::MAX`.
    pub fn timeout_millis(&self) -> Option<i32> {
        self.timeout.map(|t| {
            let millis = t.as_millis().clamp(1, i32::MAX as u128);
            i32::try_from(millis).unwrap_or(i32::MAX)
        })
    }

    /// The timeout in whole seconds, rounded up, clamped to 1 ..= 1,073,741,824
    /// (MySQL's range for `innodb_lock_wait_timeout`; MariaDB caps it further, at
    /// 100,000,000 s, with a warning).
    pub fn timeout_secs(&self) -> Option<i64> {
        self.timeout.map(|t| {
            let secs = t.as_secs().saturating_add(u64::from(t.subsec_nanos() > 0));
            i64::try_from(secs.clamp(1, 1_073_741_824)).unwrap_or(1_073_741_824)
        })
    }
}

/// Catches a panic in a closure run inside a transaction, so that the transaction
/// is rolled back before the panic goes on: the connection is then left usable,
/// with no transaction open (and a pooled one is not returned mid-transaction).
#[derive(Default)]
pub(crate) struct PanicGuard(Option<Box<dyn std::any::Any + Send + 'static>>);

impl PanicGuard {
    /// Runs `f`; a panic becomes an error that makes Diesel roll back.
    pub(crate) fn call<C, T>(
        &mut self,
        conn: &mut C,
        f: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))) {
            Ok(result) => result,
            Err(payload) => {
                self.0 = Some(payload);
                Err(Error::Database(diesel::result::Error::RollbackTransaction))
            }
        }
    }

    /// Goes on with the caught panic, if there was one (after the rollback).
    pub(crate) fn resume(self) {
        if let Some(payload) = self.0 {
            std::panic::resume_unwind(payload);
        }
    }
}

/// The end of a locking transaction that changed a session setting: `restored`
/// is how putting it back went. A failed restore is reported only when the work
/// itself succeeded; a panic in the work goes on after the restore.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn after_restore<T>(
    result: Result<T, Error>,
    restored: Option<diesel::QueryResult<()>>,
    guard: PanicGuard,
) -> Result<T, Error> {
    guard.resume();
    match (result, restored) {
        (Ok(_), Some(Err(err))) => Err(crate::classify(err)),
        (result, _) => result,
    }
}

/// A connection lockkit can take row locks on: `PgConnection`, `MysqlConnection`
/// or `SqliteConnection`.
pub trait LockingConnection:
    Connection<TransactionManager = AnsiTransactionManager> + Sized
{
    /// The query with its row-lock clause (SQLite: the query unchanged).
    type Locked<Q: LockingDsl<RowLock>>;

    /// Adds the row-lock clause to a query.
    fn apply_lock<Q: LockingDsl<RowLock>>(query: Q, lock: RowLock) -> Self::Locked<Q>;

    /// Runs `f` in a transaction fit for locking, with the options' timeout.
    ///
    /// # Errors
    ///
    /// As [`locked_transaction`](crate::locked_transaction).
    fn locked_transaction<T, F>(&mut self, options: &LockOptions, f: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Self) -> Result<T, Error>;

    /// Runs `f` in a `SERIALIZABLE` transaction (SQLite: `BEGIN IMMEDIATE`, which
    /// is serializable).
    ///
    /// # Errors
    ///
    /// * [`Error::AlreadyInTransaction`] when a transaction is already open.
    /// * [`Error::SerializationFailure`], [`Error::Deadlock`] or another
    ///   classified database error, e.g. from `COMMIT`; not retried here (see
    ///   [`serializable`](crate::serializable)).
    /// * whatever `f` returns.
    fn serializable_transaction<T, F>(&mut self, f: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Self) -> Result<T, Error>;

    /// Whether a transaction is open on this connection.
    fn in_transaction(&mut self) -> bool {
        in_transaction(self)
    }

    /// Makes sure the open transaction holds what row locks need. On SQLite, the
    /// database's write lock, which a deferred transaction (`conn.transaction`)
    /// takes only at its first write: sends `PRAGMA incremental_vacuum(1)`, which
    /// takes it (waiting up to the busy timeout, then [`Error::Busy`]) and changes
    /// no data. A no-op on PostgreSQL and MySQL, whose row locks need nothing more.
    ///
    /// # Errors
    ///
    /// SQLite: [`Error::Busy`] when another connection holds the write lock past
    /// the busy timeout, or another classified database error.
    fn take_write_lock(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// After a nested transaction on this connection failed with `cause`: whether
    /// the server has ended the whole transaction (see the
    /// [module docs](self#when-the-server-aborts-the-whole-transaction)). Asked on
    /// error paths only. The default: only a lost connection does.
    fn transaction_aborted(&mut self, cause: &Error) -> bool {
        matches!(cause, Error::ConnectionLost)
    }
}

/// The error of a lockkit transaction that failed, decided in one place: a nested
/// one (`nested`: a transaction was open when it began) whose whole transaction
/// the server ended becomes [`Error::TransactionAborted`]; an outermost one hands
/// on the cause of such an error, since the transaction is gone and a new one may
/// begin.
pub(crate) fn failed_transaction<C: LockingConnection>(
    conn: &mut C,
    nested: bool,
    error: Error,
) -> Error {
    match error {
        Error::TransactionAborted(cause) if !nested => *cause,
        Error::TransactionAborted(_) => error,
        _ if nested && conn.transaction_aborted(&error) => {
            Error::TransactionAborted(Box::new(error))
        }
        _ => error,
    }
}

/// Whether a transaction is open on `conn`, for any connection type (pooled ones
/// included): Diesel's transaction manager knows its depth.
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    matches!(
        C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}

/// Something that gives access to a [`LockingConnection`]: the connection itself
/// or an r2d2 pooled connection to it (feature `r2d2`). This is what lets `item.with_lock(&mut conn, ..)`
/// take either; the closure receives the underlying connection.
pub trait AsLockingConnection {
    /// The underlying connection.
    type Conn: LockingConnection;
    /// Borrows it.
    fn locking_connection(&mut self) -> &mut Self::Conn;
}

#[allow(unused_macros)] // used once per enabled backend
macro_rules! as_locking_connection {
    ($($conn:ty),*) => {$(
        impl AsLockingConnection for $conn {
            type Conn = $conn;
            fn locking_connection(&mut self) -> &mut $conn {
                self
            }
        }

        #[cfg(feature = "r2d2")]
        #[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
        impl AsLockingConnection
            for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<$conn>>
        {
            type Conn = $conn;
            fn locking_connection(&mut self) -> &mut $conn {
                self
            }
        }
    )*};
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::sql_types::Text;
    use diesel::{PgConnection, RunQueryDsl};

    use super::*;

    as_locking_connection!(PgConnection);

    fn lock_timeout(conn: &mut PgConnection) -> diesel::QueryResult<String> {
        diesel::select(diesel::dsl::sql::<Text>("current_setting('lock_timeout')")).get_result(conn)
    }

    fn set_lock_timeout(conn: &mut PgConnection, value: &str) -> diesel::QueryResult<()> {
        // `set_config(.., true)` is `SET LOCAL`, with the value bound.
        diesel::sql_query("SELECT set_config('lock_timeout', $1, true)")
            .bind::<Text, _>(value)
            .execute(conn)
            .map(drop)
    }

    impl LockingConnection for PgConnection {
        type Locked<Q: LockingDsl<RowLock>> = Q::Output;

        fn apply_lock<Q: LockingDsl<RowLock>>(query: Q, lock: RowLock) -> Self::Locked<Q> {
            query.with_lock(lock)
        }

        fn locked_transaction<T, F>(&mut self, options: &LockOptions, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            let nested = self.in_transaction();
            let mut guard = PanicGuard::default();
            let result = self.transaction(|conn| {
                let outer = match options.timeout_millis() {
                    Some(millis) => {
                        let outer = if nested {
                            Some(lock_timeout(conn)?)
                        } else {
                            None
                        };
                        set_lock_timeout(conn, &format!("{millis}ms"))?;
                        outer
                    }
                    None => None,
                };
                let result = guard.call(conn, f)?;
                // `SET LOCAL` survives `RELEASE SAVEPOINT`: give the outer
                // transaction its own value back (a rollback to the savepoint does).
                if let Some(outer) = outer {
                    set_lock_timeout(conn, &outer)?;
                }
                Ok(result)
            });
            guard.resume();
            result.map_err(|err| failed_transaction(self, nested, err))
        }

        fn serializable_transaction<T, F>(&mut self, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            if self.in_transaction() {
                return Err(Error::AlreadyInTransaction);
            }
            let mut guard = PanicGuard::default();
            let result = self
                .build_transaction()
                .serializable()
                .run(|conn| guard.call(conn, f));
            guard.resume();
            result.map_err(|err| failed_transaction(self, false, err))
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::sql_types::BigInt;
    use diesel::{MysqlConnection, RunQueryDsl};

    use super::*;

    as_locking_connection!(MysqlConnection);

    fn lock_wait_timeout(conn: &mut MysqlConnection) -> diesel::QueryResult<i64> {
        diesel::select(diesel::dsl::sql::<BigInt>(
            "CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)",
        ))
        .get_result(conn)
    }

    /// MariaDB's `@@in_transaction`: whether the server has a transaction open.
    fn in_server_transaction(conn: &mut MysqlConnection) -> diesel::QueryResult<bool> {
        diesel::select(diesel::dsl::sql::<BigInt>(
            "CAST(@@in_transaction AS SIGNED)",
        ))
        .get_result::<i64>(conn)
        .map(|open| open != 0)
    }

    fn set_lock_wait_timeout(conn: &mut MysqlConnection, secs: i64) -> diesel::QueryResult<()> {
        diesel::sql_query("SET SESSION innodb_lock_wait_timeout = ?")
            .bind::<BigInt, _>(secs)
            .execute(conn)
            .map(drop)
    }

    impl LockingConnection for MysqlConnection {
        type Locked<Q: LockingDsl<RowLock>> = Q::Output;

        fn apply_lock<Q: LockingDsl<RowLock>>(query: Q, lock: RowLock) -> Self::Locked<Q> {
            query.with_lock(lock)
        }

        fn locked_transaction<T, F>(&mut self, options: &LockOptions, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            // innodb_lock_wait_timeout is a session setting: set it, run, put it back.
            let previous = match options.timeout_secs() {
                Some(secs) => {
                    let previous = lock_wait_timeout(self)?;
                    set_lock_wait_timeout(self, secs)?;
                    Some(previous)
                }
                None => None,
            };
            let nested = self.in_transaction();
            let mut guard = PanicGuard::default();
            let result = self.transaction(|conn| guard.call(conn, f));
            let restored = previous.map(|previous| set_lock_wait_timeout(self, previous));
            after_restore(result, restored, guard)
                .map_err(|err| failed_transaction(self, nested, err))
        }

        fn serializable_transaction<T, F>(&mut self, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            if self.in_transaction() {
                return Err(Error::AlreadyInTransaction);
            }
            // Applies to the next transaction only.
            diesel::sql_query("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").execute(self)?;
            let mut guard = PanicGuard::default();
            let result = self.transaction(|conn| guard.call(conn, f));
            guard.resume();
            result.map_err(|err| failed_transaction(self, false, err))
        }

        fn transaction_aborted(&mut self, cause: &Error) -> bool {
            // MariaDB knows; MySQL has no such variable, but InnoDB always ends
            // the transaction of a deadlock victim.
            match in_server_transaction(self) {
                Ok(open) => !open,
                Err(_) => matches!(cause, Error::Deadlock | Error::ConnectionLost),
            }
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::connection::SimpleConnection;
    use diesel::{RunQueryDsl, SqliteConnection};

    use super::*;
    use crate::classify::classify_lock_wait;
    use crate::metrics::LockWait;

    as_locking_connection!(SqliteConnection);

    #[derive(diesel::QueryableByName)]
    struct BusyTimeout {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        timeout: i32,
    }

    /// A transaction's error before lockkit classified it: from Diesel (`BEGIN`,
    /// `COMMIT`), or from the work.
    enum Failed {
        Diesel(diesel::result::Error),
        Work(Error),
    }

    impl From<diesel::result::Error> for Failed {
        fn from(err: diesel::result::Error) -> Self {
            Failed::Diesel(err)
        }
    }

    /// Takes the database's write lock in the open transaction without changing
    /// data: `incremental_vacuum` is a write (so it takes the lock, waiting up to
    /// the busy timeout) that frees at most one unused page, and none unless the
    /// database uses `auto_vacuum = INCREMENTAL`. It reads nothing first: a read
    /// would fix the transaction's snapshot, and a snapshot older than the lock
    /// holder's commit could never be upgraded to a write.
    fn write_lock(conn: &mut SqliteConnection) -> diesel::QueryResult<()> {
        conn.batch_execute("PRAGMA incremental_vacuum(1)")
    }

    fn set_busy_timeout(conn: &mut SqliteConnection, millis: i32) -> diesel::QueryResult<()> {
        // PRAGMA takes no bound parameters; `millis` is an integer, never caller text.
        conn.batch_execute(&format!("PRAGMA busy_timeout = {millis}"))
    }

    impl LockingConnection for SqliteConnection {
        type Locked<Q: LockingDsl<RowLock>> = Q;

        fn apply_lock<Q: LockingDsl<RowLock>>(query: Q, _lock: RowLock) -> Self::Locked<Q> {
            query
        }

        fn locked_transaction<T, F>(&mut self, options: &LockOptions, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            let busy_timeout = match options.wait_mode() {
                WaitMode::NoWait | WaitMode::SkipLocked => Some(0),
                WaitMode::Wait => options.timeout_millis(),
            };
            let nested = self.in_transaction();
            let previous = match busy_timeout {
                Some(millis) => {
                    let previous = diesel::sql_query("PRAGMA busy_timeout")
                        .get_result::<BusyTimeout>(self)?
                        .timeout;
                    set_busy_timeout(self, millis)?;
                    Some(previous)
                }
                None => None,
            };
            // Busy while taking the write lock: the wait ran out, unless it was
            // not to wait at all.
            let lock_error = |err| match options.wait_mode() {
                WaitMode::Wait => classify_lock_wait(err),
                WaitMode::NoWait | WaitMode::SkipLocked => crate::classify(err),
            };
            let waited = LockWait::start();
            let mut guard = PanicGuard::default();
            let result = if nested {
                // A savepoint takes no lock, and the outer transaction may be a
                // deferred one that has none yet.
                self.transaction(|conn| {
                    write_lock(conn).map_err(lock_error)?;
                    waited.acquired("database", 1);
                    guard.call(conn, f)
                })
            } else {
                // Takes the write lock before the first read: writers queue here.
                // Diesel's own errors (BEGIN, COMMIT) are classified here, once,
                // knowing which statement failed.
                let mut waited = Some(waited);
                self.immediate_transaction(|conn| {
                    if let Some(waited) = waited.take() {
                        waited.acquired("database", 1);
                    }
                    guard.call(conn, f).map_err(Failed::Work)
                })
                .map_err(|failed| match failed {
                    Failed::Work(err) => err,
                    Failed::Diesel(err) if waited.is_some() => lock_error(err),
                    Failed::Diesel(err) => crate::classify(err),
                })
            };
            let restored = previous.map(|previous| set_busy_timeout(self, previous));
            after_restore(result, restored, guard)
                .map_err(|err| failed_transaction(self, nested, err))
        }

        fn serializable_transaction<T, F>(&mut self, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            if self.in_transaction() {
                return Err(Error::AlreadyInTransaction);
            }
            let mut guard = PanicGuard::default();
            let result = self.immediate_transaction(|conn| guard.call(conn, f));
            guard.resume();
            result.map_err(|err| failed_transaction(self, false, err))
        }

        fn take_write_lock(&mut self) -> Result<(), Error> {
            write_lock(self).map_err(crate::classify)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_clamped_and_rounded() {
        let opts = LockOptions::default();
        assert_eq!(opts.timeout_millis(), None);
        let opts = opts.timeout(Duration::from_micros(10));
        assert_eq!(opts.timeout_millis(), Some(1));
        assert_eq!(opts.timeout_secs(), Some(1));
        let opts = opts.timeout(Duration::from_millis(2500));
        assert_eq!(
            (opts.timeout_millis(), opts.timeout_secs()),
            (Some(2500), Some(3))
        );
        let opts = opts.timeout(Duration::MAX);
        assert_eq!(opts.timeout_millis(), Some(i32::MAX));
        assert_eq!(opts.timeout_secs(), Some(1_073_741_824));
    }
}
