//! What differs between backends when taking locks: the lock clause, how a
//! locking transaction begins, and how its lock timeout is set.
//!
//! | | PostgreSQL | MySQL / MariaDB | SQLite |
//! | --- | --- | --- | --- |
//! | row lock | `FOR UPDATE` (and strengths) | `FOR UPDATE` / `LOCK IN SHARE MODE` | none: the transaction is `BEGIN IMMEDIATE`, which takes the database's write lock and so serializes writers |
//! | timeout | `SELECT set_config('lock_timeout', $1, true)` (= `SET LOCAL`) | `SET SESSION innodb_lock_wait_timeout = ?`, whole seconds, restored afterwards | `PRAGMA busy_timeout = n`, restored afterwards |
//! | `NOWAIT` / `SKIP LOCKED` | in the clause | in the clause | busy timeout 0: a locked database is [`Error::Busy`] |
//! | wait ran out | [`Error::LockTimeout`] | [`Error::LockTimeout`] | [`Error::LockTimeout`] (busy at `BEGIN IMMEDIATE`) |
//! | nested | savepoint | savepoint | savepoint (the outer transaction's lock mode applies) |
//!
//! A panic in the closure rolls the transaction back before it unwinds further, so
//! the connection is never left inside a transaction.
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
    /// Fail at once with [`Error::Busy`] if the row is locked.
    pub fn nowait(mut self) -> Self {
        self.lock.wait = WaitMode::NoWait;
        self
    }

    /// Skip a locked row: [`with_lock`](crate::with_lock) then reports [`Error::Busy`]
    /// (the row exists but someone holds it) or [`Error::NotFound`].
    pub fn skip_locked(mut self) -> Self {
        self.lock.wait = WaitMode::SkipLocked;
        self
    }

    /// Wait at most `timeout` for the lock, then fail with [`Error::LockTimeout`].
    ///
    /// Clamped to 1 ms ..= `i32::MAX` ms. MySQL/MariaDB count whole seconds, so the
    /// timeout is rounded up to the next second there.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The lock strength ([`LockStrength::Update`] by default).
    pub fn strength(mut self, strength: LockStrength) -> Self {
        self.lock.strength = strength;
        self
    }

    /// `FOR NO KEY UPDATE` on PostgreSQL (`FOR UPDATE` elsewhere).
    pub fn no_key_update(self) -> Self {
        self.strength(LockStrength::NoKeyUpdate)
    }

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
    fn locked_transaction<T, F>(&mut self, options: &LockOptions, f: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Self) -> Result<T, Error>;

    /// Runs `f` in a `SERIALIZABLE` transaction (SQLite: `BEGIN IMMEDIATE`, which
    /// is serializable).
    fn serializable_transaction<T, F>(&mut self, f: F) -> Result<T, Error>
    where
        F: FnOnce(&mut Self) -> Result<T, Error>;

    /// Whether a transaction is open on this connection.
    fn in_transaction(&mut self) -> bool {
        in_transaction(self)
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

    impl LockingConnection for PgConnection {
        type Locked<Q: LockingDsl<RowLock>> = Q::Output;

        fn apply_lock<Q: LockingDsl<RowLock>>(query: Q, lock: RowLock) -> Self::Locked<Q> {
            query.with_lock(lock)
        }

        fn locked_transaction<T, F>(&mut self, options: &LockOptions, f: F) -> Result<T, Error>
        where
            F: FnOnce(&mut Self) -> Result<T, Error>,
        {
            let mut guard = PanicGuard::default();
            let result = self.transaction(|conn| {
                if let Some(millis) = options.timeout_millis() {
                    // `set_config(.., true)` is `SET LOCAL`, with the value bound.
                    diesel::sql_query("SELECT set_config('lock_timeout', $1, true)")
                        .bind::<Text, _>(format!("{millis}ms"))
                        .execute(conn)?;
                }
                guard.call(conn, f)
            });
            guard.resume();
            result
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
            result
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
            let mut guard = PanicGuard::default();
            let result = self.transaction(|conn| guard.call(conn, f));
            let restored = previous.map(|previous| set_lock_wait_timeout(self, previous));
            after_restore(result, restored, guard)
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
            result
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::connection::SimpleConnection;
    use diesel::{RunQueryDsl, SqliteConnection};

    use super::*;

    as_locking_connection!(SqliteConnection);

    #[derive(diesel::QueryableByName)]
    struct BusyTimeout {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        timeout: i32,
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
                Some(millis) if !nested => {
                    let previous = diesel::sql_query("PRAGMA busy_timeout")
                        .get_result::<BusyTimeout>(self)?
                        .timeout;
                    set_busy_timeout(self, millis)?;
                    Some(previous)
                }
                _ => None,
            };
            // SQLite waits for the lock at BEGIN IMMEDIATE; a busy error before `f`
            // ran means the wait ran out.
            let mut entered = false;
            let mut guard = PanicGuard::default();
            let run = |conn: &mut Self| {
                entered = true;
                guard.call(conn, f)
            };
            let result = if nested {
                self.transaction(run)
            } else {
                // Takes the write lock before the first read: writers queue here.
                self.immediate_transaction(run)
            };
            let result = match result {
                Err(Error::Busy) if !entered && options.wait_mode() == WaitMode::Wait => {
                    Err(Error::LockTimeout)
                }
                other => other,
            };
            let restored = previous.map(|previous| set_busy_timeout(self, previous));
            after_restore(result, restored, guard)
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
            result
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
