//! [`LockOptions`]: how to lock a row (strength, wait mode, lock timeout), for
//! [`with_lock`](crate::with_lock); and for [`locked_transaction`](crate::locked_transaction)
//! around [`Lockable::lock_all`](crate::Lockable::lock_all) and
//! [`queue::claim`](crate::queue::claim), whose lock waits its timeout bounds
//! (their own row-lock clauses stay `FOR UPDATE` and `SKIP LOCKED`). What each
//! option becomes on each backend is decided in
//! [`LockingConnection`](crate::LockingConnection)'s impls.

use std::time::Duration;

use super::row_lock::{LockStrength, RowLock, WaitMode};
use crate::error::Error;

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
    ///
    /// Which of the two is asked with a plain read (a locking one would wait
    /// for the holder). On MySQL/MariaDB, nested in a transaction that has
    /// already read, that read sees the transaction's snapshot: a row deleted
    /// since is reported `Busy`, and one inserted since and held `NotFound`.
    /// Take such calls outside the transaction, or in one that has read
    /// nothing yet, where the answer is the latest commit's. On SQLite, which
    /// locks the whole database, a locked database is `Busy` whether the row
    /// exists or not.
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
    ///
    /// [`with_lock`](crate::with_lock) refuses [`LockStrength::KeyShare`] with
    /// [`Error::InvalidInput`], before it sends anything: PostgreSQL's
    /// `FOR KEY SHARE` lets other writers change the row's columns (and a
    /// second `with_lock` take the same lock), so a write the closure based on
    /// its copy would lose theirs. Take that lock in a query of your own
    /// (`.for_key_share()`) where the row's values do not matter.
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
    /// `FOR SHARE` / `LOCK IN SHARE MODE`: a reader's lock. Nobody may change or
    /// delete the row until the transaction ends, and other readers may take
    /// the same lock meanwhile (on SQLite, which has no row locks, the
    /// transaction holds the database's write lock, as with every strength).
    /// Unlike the exclusive strengths, it does not advance a
    /// [`Versioned`](crate::Versioned) row's version.
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use lockkit::prelude::*;
    /// use lockkit::LockOptions;
    /// # diesel::table! { customers (id) { id -> Integer, name -> Text, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = customers)]
    /// # pub struct Customer { pub id: i32, pub name: String, pub lock_version: i32 }
    ///
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO customers VALUES (1, 'Ada', 0)").execute(&mut conn)?;
    /// // An order for customer 1: the customer stays as read until the order commits.
    /// let shared = LockOptions::default().share();
    /// let name = lockkit::with_lock(&mut conn, 1, shared, |conn, customer: Customer| {
    ///     diesel::sql_query("INSERT INTO orders (customer_id) VALUES (1)").execute(conn)?;
    ///     Ok::<_, lockkit::Error>(customer.name)
    /// })?;
    /// assert_eq!(name, "Ada");
    /// let version = customers::table.find(1).select(customers::lock_version).first::<i32>(&mut conn)?;
    /// assert_eq!(version, 0); // a shared lock leaves the version alone
    /// # Ok(()) }
    /// ```
    pub fn share(self) -> Self {
        self.strength(LockStrength::Share)
    }

    /// The row-lock clause these options produce.
    pub(crate) fn row_lock(&self) -> RowLock {
        self.lock
    }

    /// Whether [`with_lock`](crate::with_lock) takes these options, where the
    /// closure's copy must stay the row's: `KeyShare` is refused (see
    /// [`LockOptions::strength`]).
    pub(crate) fn check_for_with_lock(&self) -> Result<(), Error> {
        match self.lock.strength {
            LockStrength::KeyShare => Err(Error::InvalidInput(
                "with_lock cannot lock with LockStrength::KeyShare: FOR KEY SHARE lets other \
                 writers change the row under the closure's copy; use Share, NoKeyUpdate or \
                 Update",
            )),
            _ => Ok(()),
        }
    }

    /// The wait mode.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // SQLite's busy timeout reads it
    pub(crate) fn wait_mode(&self) -> WaitMode {
        self.lock.wait
    }

    // What each backend is sent is decided in `LockingConnection`'s impls;
    // these two are the values they send.

    /// The timeout in whole milliseconds, clamped to 1 ..= `i32::MAX`.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn timeout_millis(&self) -> Option<i32> {
        self.timeout.map(|t| {
            let millis = t.as_millis().clamp(1, i32::MAX as u128);
            i32::try_from(millis).unwrap_or(i32::MAX)
        })
    }

    /// The timeout in whole seconds, rounded up, clamped to 1 ..= 1,073,741,824
    /// (MySQL's range for `innodb_lock_wait_timeout`; MariaDB caps it further, at
    /// 100,000,000 s, with a warning).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn timeout_secs(&self) -> Option<i64> {
        self.timeout.map(|t| {
            let secs = t.as_secs().saturating_add(u64::from(t.subsec_nanos() > 0));
            i64::try_from(secs.clamp(1, 1_073_741_824)).unwrap_or(1_073_741_824)
        })
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

    #[test]
    fn timeouts_are_clamped_around_every_edge_never_rejected() {
        let around = |edge: u64| edge.saturating_sub(5)..=edge.saturating_add(5);
        let seconds = around(0)
            .chain(around(i32::MAX as u64 / 1000)) // i32::MAX milliseconds
            .chain(around(1 << 30)) // MySQL's maximum, in seconds
            .chain(around(u64::MAX));
        for secs in seconds {
            for nanos in [
                0,
                1,
                999_999,
                1_000_000,
                647_999_999,
                648_000_000,
                999_999_999,
            ] {
                let timeout = Duration::new(secs, nanos);
                let opts = LockOptions::default().timeout(timeout);
                let millis = timeout.as_millis().clamp(1, i32::MAX as u128);
                assert_eq!(opts.timeout_millis().map(i128::from), Some(millis as i128));
                let whole_secs = u128::from(secs) + u128::from(nanos > 0);
                let secs = whole_secs.clamp(1, 1 << 30);
                assert_eq!(opts.timeout_secs().map(i128::from), Some(secs as i128));
            }
        }
    }

    #[test]
    fn timeouts_at_the_edges_are_sent_as_these() {
        let max_millis = i32::MAX; // 2_147_483.647 s
        let max_secs: i64 = 1 << 30;
        for (timeout, millis, secs) in [
            (Duration::ZERO, 1, 1),
            (Duration::from_nanos(1), 1, 1),
            (Duration::new(1, 0), 1000, 1),
            (Duration::new(1, 1), 1000, 2),
            (
                Duration::new(2_147_483, 646_999_999),
                max_millis - 1,
                2_147_484,
            ),
            (Duration::new(2_147_483, 647_000_000), max_millis, 2_147_484),
            (Duration::new(2_147_483, 648_000_000), max_millis, 2_147_484),
            (
                Duration::new(1 << 30, 0) - Duration::from_nanos(1),
                max_millis,
                max_secs,
            ),
            (Duration::new(1 << 30, 0), max_millis, max_secs),
            (Duration::new(1 << 30, 1), max_millis, max_secs),
            (Duration::MAX, max_millis, max_secs),
        ] {
            let opts = LockOptions::default().timeout(timeout);
            assert_eq!(
                (opts.timeout_millis(), opts.timeout_secs()),
                (Some(millis), Some(secs)),
                "{timeout:?}"
            );
        }
    }
}
