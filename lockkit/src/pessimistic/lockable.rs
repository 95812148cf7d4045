//! Pessimistic locking of models: [`Lockable::with_lock`] and [`Lockable::lock_all`].
//!
//! `with_lock` is Rails' `with_lock`, made safe: it opens a transaction, re-reads
//! the row by primary key with `FOR UPDATE`, hands the closure the *fresh* row,
//! commits when the closure returns `Ok` and rolls back on `Err`. The struct you
//! called it on is only used for its key: any unsaved changes on it are neither
//! silently applied nor silently discarded, because the closure works on the row
//! as it is in the database, locked.
//!
//! ```sql
//! BEGIN;                                      -- SQLite: BEGIN IMMEDIATE
//! SELECT set_config('lock_timeout', $1, true); -- only with LockOptions::timeout
//! SELECT items.id, items.name, items.stock, items.lock_version
//!   FROM items WHERE items.id = $1 FOR UPDATE; -- SQLite: no clause
//! UPDATE items SET lock_version = lock_version + 1
//!  WHERE items.id = $1 AND items.lock_version = $2; -- Versioned models only
//! -- your closure
//! COMMIT;                                     -- or ROLLBACK on Err
//! ```
//!
//! On a [`Versioned`](crate::Versioned) model, taking the lock also advances the
//! version (`UPDATE .. SET lock_version = lock_version + 1 WHERE id = $1 AND
//! lock_version = $2`, right after the locked read, in the same transaction): the
//! closure may write the row any way it likes (a plain `diesel::update`, as
//! below) and an optimistic writer who read the row before still gets
//! [`Error::Stale`]. The fresh row handed to the closure carries the new version,
//! so a versioned write inside the closure works as usual. A shared lock
//! ([`LockOptions::share`]) is a read and leaves the version alone. A rollback
//! undoes the bump with everything else. [`Lockable::lock_all`] does the same for
//! every row it locks.
//!
//! On PostgreSQL, a versioned model's `FOR UPDATE` that waits (the default lock,
//! with or without [`LockOptions::timeout`]) sends the locked read and the bump
//! as one statement, which returns the row as bumped:
//!
//! ```sql
//! UPDATE items SET lock_version = lock_version + 1
//!  WHERE items.id = $1 AND items.lock_version < $2 -- $2: the version type's maximum
//!    AND EXISTS (SELECT items.id, .. FROM items WHERE items.id = $1 FOR UPDATE)
//!  RETURNING items.id, items.name, items.stock, items.lock_version;
//! ```
//!
//! The sub-select keeps the lock a `FOR UPDATE` (a plain `UPDATE` takes `FOR NO
//! KEY UPDATE`, which a foreign key check does not wait for). When it matches no
//! row (the row is missing, or its version is at the maximum), lockkit sends the
//! two statements above, which report which. `nowait()`, `skip_locked()`, the
//! other strengths, MySQL/MariaDB (no `UPDATE .. RETURNING`) and SQLite (whose
//! `RETURNING` needs 3.35) keep the two statements.
//!
//! Nested inside an open transaction, `with_lock` uses a savepoint: the row lock is
//! then held until the **outermost** transaction ends, not when the closure returns.
//! A closure that fails rolls back to the savepoint, and PostgreSQL releases the
//! row locks taken after it there (MariaDB too, where the transaction did nothing
//! before the savepoint): after letting such an error go, lock the row again
//! before writing from what the call read.
//!
//! On SQLite, which has no row locks, the transaction is `BEGIN IMMEDIATE`: it takes
//! the database's write lock up front, so concurrent `with_lock` calls run one after
//! another and no update is lost.
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//! # diesel::table! { items (id) { id -> Integer, name -> Text, stock -> Integer, lock_version -> Integer } }
//! #[derive(Queryable, Selectable, Identifiable, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub name: String, pub stock: i32, pub lock_version: i32 }
//!
//! # fn main() -> Result<(), lockkit::Error> {
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO items VALUES (1, 'widget', 10, 0)").execute(&mut conn)?;
//! let item = items::table.find(1).first::<Item>(&mut conn)?;
//! let left = item.with_lock(&mut conn, |conn, fresh| {
//!     if fresh.stock < 8 {
//!         return Err(lockkit::Error::NoRowMatched);
//!     }
//!     diesel::update(items::table.find(fresh.id))
//!         .set(items::stock.eq(fresh.stock - 8))
//!         .execute(conn)?;
//!     Ok(fresh.stock - 8)
//! })?;
//! assert_eq!(left, 2);
//! # Ok(()) }
//! ```

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]
use std::marker::PhantomData;

use diesel::dsl::{self, AsSelect, Find, Select};
use diesel::expression::{AppearsOnTable, Expression, SelectableExpression, ValidGrouping};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::query_dsl::methods::{FilterDsl, FindDsl, LockingDsl, OrderDsl, SelectDsl};
use diesel::query_dsl::LoadQuery;
use diesel::serialize::ToSql;
use diesel::sql_types::HasSqlType;
use diesel::QueryResult;
use diesel::{
    ExpressionMethods, OptionalExtension, RunQueryDsl, Selectable, SelectableHelper, Table,
};

use super::connection::{AsLockingConnection, LockingConnection};
use super::options::LockOptions;
use super::row_lock::{
    EveryClause, ForUpdate, LockClause, LockStrength, LockedCall, RowLock, WaitMode,
};
use crate::error::classification::classify;
use crate::error::Error;
use crate::transaction::{require_live, require_transaction_on, scope, Control};

/// `lock_all` sends at most this many keys per statement (SQLite's oldest limit
/// on bound parameters is 999); longer lists are locked chunk by chunk, in key
/// order, which keeps the no-deadlock promise. For text keys that order is
/// Rust's (bytes) between chunks and the column's collation within each: see
/// [`Lockable::lock_all`].
pub const MAX_KEYS_PER_STATEMENT: usize = 900;

pub(crate) type Pk<M> = <<M as Lockable>::Table as Table>::PrimaryKey;

/// A model whose row can be locked: table and primary key.
///
/// `#[derive(Versioned)]` implements it; for a model without a version column use
/// `#[derive(Lockable)]`. A table with a version column is locked through
/// `Versioned` models only: their locks advance the version
/// ([`BumpVersion`](crate::optimistic::BumpVersion)), which makes an editor's
/// older copy stale; a `Lockable` model's lock writes nothing, so that copy
/// would still match and write over the locked change.
pub trait Lockable: Sized {
    /// The Diesel table (`items::table`).
    type Table: Table + Default;
    /// The primary key, owned: `i32`, `String`, or a tuple for composite keys.
    type Key: Clone + std::fmt::Debug;

    /// The table's name, for error reports.
    const TABLE_NAME: &'static str;

    /// The primary key's column names, in key order.
    const KEY_COLUMNS: &'static [&'static str];

    /// What taking an exclusive lock on the row also writes: [`NoVersion`] for a
    /// model without a version column, [`BumpVersion`](crate::optimistic::BumpVersion) for a
    /// [`Versioned`](crate::Versioned) one (see the [module docs](self)).
    type OnLock;

    /// This row's primary key.
    fn key(&self) -> Self::Key;

    /// Locks this row (`FOR UPDATE`) in a transaction and runs `f` on the fresh
    /// row; see the [module docs](self). This is [`with_lock`]
    /// with this row's key and the default [`LockOptions`]; call that for
    /// `nowait()`, `skip_locked()`, a timeout or a shared lock, or when you have
    /// a key but no loaded model.
    ///
    /// `f` returns your own error type, as in Diesel's `transaction`: any `E`
    /// that a [`lockkit::Error`](Error) converts into (`lockkit::Error` itself, or
    /// your enum with a `#[from] lockkit::Error` variant). An `Err` (or a panic)
    /// rolls the transaction back; the error comes back to you untouched.
    ///
    /// # Errors
    ///
    /// The transaction is rolled back on every error:
    ///
    /// * [`Error::NotFound`] when no row has the key.
    /// * [`Error::Busy`] with `nowait()` or `skip_locked()` when another transaction
    ///   holds the row (SQLite: the database's write lock).
    /// * [`Error::LockTimeout`] when waiting for the lock ran past the lock timeout
    ///   (the options' or the server's).
    /// * [`Error::Deadlock`] when the server chose this transaction as a deadlock's
    ///   victim.
    /// * [`Error::TransactionAborted`] when nested in an open transaction that the
    ///   server rolled back as a whole (InnoDB on a deadlock); not retryable here.
    /// * [`Error::VersionOverflow`] for a [`Versioned`](crate::Versioned) model whose version is at
    ///   its type's maximum (an exclusive lock advances it).
    /// * any other classified database error ([`Error::SerializationFailure`],
    ///   [`Error::ConnectionLost`], .., else [`Error::Database`]); see
    ///   [`classify`](crate::classify()).
    /// * whatever `f` returns.
    fn with_lock<C, T, E, F>(&self, conn: &mut C, f: F) -> Result<T, E>
    where
        C: AsLockingConnection,
        Self: LockRow<C::Conn>,
        E: From<Error>,
        F: FnOnce(&mut C::Conn, Self) -> Result<T, E>,
    {
        with_lock(conn, self.key(), LockOptions::default(), f)
    }

    /// Locks this row inside the caller's transaction and re-reads it into
    /// `self`: Rails' `lock!`, Django's `select_for_update().get()`.
    ///
    /// ```sql
    /// SELECT CAST(@@in_transaction AS SIGNED), CAST(@lockkit_aborted AS CHAR)
    ///                                          -- MariaDB only: is the transaction still open?
    /// PRAGMA incremental_vacuum(1)             -- SQLite only: the database's write lock
    /// SELECT items.id, .. FROM items WHERE items.id = $1 FOR UPDATE  -- SQLite: no clause
    /// UPDATE items SET lock_version = lock_version + 1
    ///  WHERE items.id = $1 AND items.lock_version = $2   -- Versioned models only
    /// ```
    ///
    /// (On PostgreSQL a versioned model's read and bump are one statement, as in
    /// [`with_lock`](Self::with_lock): see the [module docs](self).)
    ///
    /// The lock is held until the transaction ends (taken inside a savepoint that
    /// rolls back, on PostgreSQL until that rollback, and on MariaDB too where the
    /// transaction did nothing before the savepoint), so this must run inside one
    /// (yours from Diesel's `conn.transaction`, or a lockkit one such as
    /// [`locked_transaction`]): outside, the lock would be released as soon as
    /// it was taken, and `lock` refuses with [`Error::NotInTransaction`] without
    /// sending anything. Any unsaved changes on `self` are overwritten by the row
    /// as it now is (the point of locking is to decide on the fresh row). On a
    /// [`Versioned`](crate::Versioned) model the version advances, as with
    /// [`with_lock`](Self::with_lock): an optimistic writer who read the row
    /// before gets [`Error::Stale`], and `self` carries the new version.
    ///
    /// lockkit first makes sure that the transaction Diesel believes open still
    /// is: a statement its journal saw end it (a deadlock on MySQL/MariaDB, a
    /// failed statement on PostgreSQL, SQLite's whole-transaction rollback),
    /// and on MariaDB the server's own answer. If not, [`Error::TransactionAborted`]:
    /// return it from your transaction's closure.
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
    /// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
    ///   transaction manager is broken (a dropped call's transaction may still be
    ///   open on the server); nothing is sent.
    /// * [`Error::TransactionAborted`] when the server already ended the
    ///   transaction.
    /// * [`Error::NotFound`] when the row is gone; `self` is left as it was.
    /// * [`Error::LockTimeout`], [`Error::Deadlock`] (SQLite: [`Error::Busy`]) when
    ///   waiting for the lock failed; the transaction should be rolled back.
    /// * [`Error::VersionOverflow`] for a [`Versioned`](crate::Versioned) model at its
    ///   version type's maximum.
    /// * any other classified database error; see [`classify`](crate::classify()).
    ///
    /// # Example
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
    /// # #[derive(Queryable, Selectable, lockkit::Lockable)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn)?;
    /// let mut item = items::table.find(1).first::<Item>(&mut conn)?;
    /// # diesel::sql_query("UPDATE items SET stock = 9").execute(&mut conn)?;
    /// conn.transaction(|conn| {
    ///     item.lock(conn)?; // the row as it is now, locked until COMMIT
    ///     assert_eq!(item.stock, 9);
    ///     diesel::update(items::table.find(item.id)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
    ///     Ok::<_, lockkit::Error>(())
    /// })?;
    /// assert!(matches!(item.lock(&mut conn), Err(lockkit::Error::NotInTransaction)));
    /// item.reload(&mut conn)?;
    /// assert_eq!(item.stock, 8);
    /// # Ok(()) }
    /// ```
    fn lock<C>(&mut self, conn: &mut C) -> Result<(), Error>
    where
        C: AsLockingConnection,
        Self: LockRow<C::Conn>,
    {
        let conn = conn.locking_connection();
        require_transaction_on(conn)?;
        // A statement that ended the transaction (SQLite's whole-transaction
        // rollback, a deadlock the caller let go): the lock would be taken in
        // autocommit, and released at once.
        require_live(conn)?;
        if let Some(reason) = conn.transaction_ended(None) {
            conn.keep_aborted(); // as at the end of a nested call that found it
            return Err(crate::transaction::journal::aborted(conn, reason));
        }
        conn.take_write_lock()?; // SQLite: a deferred transaction holds no lock yet
        *self = lock_row(conn, self.key(), LockOptions::default())?;
        Ok(())
    }

    /// Re-reads this row into `self`, without a lock: Rails' `reload`, Django's
    /// `refresh_from_db`. Unsaved changes on `self` are overwritten.
    ///
    /// ```sql
    /// SELECT items.id, .. FROM items WHERE items.id = $1
    /// ```
    ///
    /// A plain read sees the transaction's snapshot: on MySQL/MariaDB (InnoDB's
    /// `REPEATABLE READ`) a `reload` inside a transaction after a
    /// [`lock`](Self::lock) can return the row as it was before another
    /// session's later commit, which a write of it then undoes. To re-read a row
    /// you mean to write, in a transaction, use [`lock`](Self::lock) again.
    ///
    /// # Errors
    ///
    /// * [`Error::NotFound`] when the row is gone; `self` is left as it was.
    /// * a classified database error; see [`classify`](crate::classify()).
    fn reload<C>(&mut self, conn: &mut C) -> Result<(), Error>
    where
        C: AsLockingConnection,
        Self: LockRow<C::Conn>,
    {
        let conn = conn.locking_connection();
        *self = Self::load(conn, self.key())
            .map_err(classify)?
            .ok_or(Error::NotFound)?;
        Ok(())
    }

    /// Locks the rows with these keys in ascending key order, in one statement,
    /// and returns them in that order (the server's: for text keys, the
    /// column's collation, in which `"b"` may come before `"Z"`).
    ///
    /// Two transactions that lock overlapping sets one row at a time in different
    /// orders deadlock; locking every set in the same (key) order cannot. (A
    /// deadlock is not only an error: PostgreSQL looks for one only after a lock
    /// wait of `deadlock_timeout`, 1 s by default, so each one also costs that long.) Must run
    /// inside a transaction ([`Error::NotInTransaction`] otherwise); a missing key is
    /// [`Error::NotFound`]. Duplicate keys are locked once, and so are keys the
    /// column's collation holds equal (MySQL/MariaDB's "K" and "k"): each row
    /// is returned once. On SQLite run it inside
    /// [`locked_transaction`], whose `BEGIN IMMEDIATE`
    /// is the lock.
    ///
    /// ```sql
    /// SELECT ... FROM items WHERE items.id = ANY($1) ORDER BY items.id FOR UPDATE   -- PostgreSQL
    /// SELECT ... FROM items WHERE items.id IN (?, ?) ORDER BY items.id FOR UPDATE   -- MySQL
    /// ```
    ///
    /// On MySQL/MariaDB and SQLite the `IN` list is padded to 1, 2, 4, .. 512 or
    /// [`MAX_KEYS_PER_STATEMENT`] keys by repeating the last one, so that each
    /// length is one statement the connection prepares once ([`KeyList`]).
    ///
    /// # Keys
    ///
    /// The primary key must be one column ([`KeyColumn`]): `i16`, `i32`, `i64`,
    /// `String`, and with the `uuid` feature `uuid::Uuid` on PostgreSQL, whose
    /// `uuid` order is `Uuid`'s. Diesel maps UUIDs on no other backend: on
    /// MySQL/MariaDB and SQLite store them as text and use a `String` key.
    ///
    /// A list of more than [`MAX_KEYS_PER_STATEMENT`] keys is cut into
    /// chunks in Rust's order of the keys, each locked in one statement in
    /// the server's. For integer and UUID keys the two agree. For text keys
    /// under a collation that does not order by bytes (MySQL/MariaDB's
    /// case-insensitive defaults, PostgreSQL's non-`C` collations) they may
    /// not: two such lists may then take their locks in different orders and
    /// deadlock ([`Error::Deadlock`], retryable). Keep such lists within one
    /// chunk, or give the key column a byte-ordered collation (`COLLATE "C"`,
    /// `utf8mb4_bin`).
    ///
    /// A composite key does not compile: its columns are a tuple, which is no
    /// [`KeyColumn`] ("lock_all needs a single-column integer, string or UUID
    /// key"), since Diesel has no `(a, b) IN (..)`. Lock such rows with
    /// [`with_lock`](Self::with_lock) one at a time inside one
    /// [`locked_transaction`], always in key order: each lock is held until that
    /// transaction ends.
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
    /// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
    ///   transaction manager is broken (a dropped call's transaction may still be
    ///   open on the server); nothing is sent.
    /// * [`Error::TransactionAborted`] when a statement whose error the work let
    ///   go has ended the transaction (a deadlock on MySQL/MariaDB, seen by
    ///   lockkit's journal); nothing is sent, and later writes are kept out of
    ///   autocommit.
    /// * [`Error::NotFound`] when a key has no row.
    /// * [`Error::Busy`] on SQLite when another connection holds the database's
    ///   write lock past the busy timeout.
    /// * [`Error::LockTimeout`] or [`Error::Deadlock`] when waiting for a row lock
    ///   failed (PostgreSQL, MySQL/MariaDB).
    /// * [`Error::VersionOverflow`] for a [`Versioned`](crate::Versioned) model whose version is at
    ///   its type's maximum (each locked row's version advances).
    /// * any other classified database error ([`Error::SerializationFailure`],
    ///   [`Error::ConnectionLost`], .., else [`Error::Database`]); see
    ///   [`classify`](crate::classify()).
    ///
    /// The locks taken before the error are held until the transaction ends: roll
    /// it back (return the error from its closure).
    ///
    /// # Example
    ///
    /// ```
    /// use diesel::prelude::*;
    /// use lockkit::prelude::*;
    /// use lockkit::{locked_transaction, LockOptions};
    /// # diesel::table! { accounts (id) { id -> Integer, balance -> BigInt } }
    /// # #[derive(Queryable, Selectable, lockkit::Lockable, Debug)]
    /// # #[diesel(table_name = accounts)]
    /// # pub struct Account { pub id: i32, pub balance: i64 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO accounts VALUES (1, 100), (2, 50)").execute(&mut conn)?;
    /// // A transfer locks both accounts, always in key order.
    /// let total = locked_transaction(&mut conn, LockOptions::default(), |conn| {
    ///     let accounts = Account::lock_all(conn, &[2, 1])?;
    ///     assert_eq!(accounts.iter().map(|a| a.id).collect::<Vec<_>>(), [1, 2]);
    ///     Ok::<_, lockkit::Error>(accounts.iter().map(|a| a.balance).sum::<i64>())
    /// })?;
    /// assert_eq!(total, 150);
    ///
    /// let missing = locked_transaction(&mut conn, LockOptions::default(), |conn| {
    ///     Account::lock_all(conn, &[1, 3])
    /// });
    /// assert!(matches!(missing, Err(lockkit::Error::NotFound)));
    ///
    /// // Outside a transaction the locks would be released at once.
    /// let outside = Account::lock_all(&mut conn, &[1]);
    /// assert!(matches!(outside, Err(lockkit::Error::NotInTransaction)));
    /// # Ok(()) }
    /// ```
    fn lock_all<C>(conn: &mut C, keys: &[Self::Key]) -> Result<Vec<Self>, Error>
    where
        C: AsLockingConnection,
        Self: LockAll<C::Conn>,
        Self::Key: Ord,
    {
        let conn = conn.locking_connection();
        require_transaction_on(conn)?;
        // A statement that ended the transaction (a deadlock the caller let go,
        // MySQL/MariaDB): the locks would be taken in autocommit, and released
        // at once.
        require_live(conn)?;
        let waited = crate::metrics::LockWait::start();
        let keys = lock_order(keys);
        // lockkit's own statements, whose answers lockkit sees (SQLite's
        // journal): a later call asks nothing for them.
        let rows = crate::transaction::journal::own(conn, |conn| {
            conn.take_write_lock()?; // SQLite: a deferred transaction holds no lock yet
            let mut rows = Vec::with_capacity(keys.len());
            let mut returned = Returned::for_keys(keys.len());
            // Chunk after chunk in key order: every transaction takes the locks in
            // the same order, whatever the length of its list.
            for chunk in keys.chunks(MAX_KEYS_PER_STATEMENT) {
                let mut locked = Self::load_all_locked(conn, chunk.to_vec()).map_err(classify)?;
                if incomplete(chunk, &locked) {
                    // The rows found so far, each once (two rows with one key
                    // count as one).
                    first_of_each_key(&mut locked);
                    let first = locked.len();
                    // Read the keys the read found no row for again, in a statement
                    // of its own (see [`unmatched`]).
                    let missed: Vec<Self::Key> = unmatched(chunk, &locked).cloned().collect();
                    if !missed.is_empty() {
                        locked
                            .extend(Self::load_all_locked(conn, missed.clone()).map_err(classify)?);
                    }
                    // Asked of the latest commit, as the locked reads were: on
                    // InnoDB a plain read asks the transaction's snapshot, which
                    // may still hold a row deleted since. A row found now (one
                    // committed while the second read waited) is locked and
                    // returned as well.
                    let still: Vec<Self::Key> = unmatched(&missed, &locked).cloned().collect();
                    for key in still {
                        match Self::load_locked(conn, key, RowLock::update()).map_err(classify)? {
                            Some(row) => locked.push(row),
                            None => return Err(Error::NotFound),
                        }
                    }
                    // A row found by two keys of this chunk is returned once, in
                    // the order the server returned it.
                    first_of_each_key(&mut locked);
                    if locked.len() > first {
                        // Rows found by the later reads came after the rest: the
                        // chunk, all of it locked now, read once more in key order.
                        locked = Self::load_all_locked(conn, chunk.to_vec()).map_err(classify)?;
                        first_of_each_key(&mut locked);
                    }
                }
                // And a row found by keys of two chunks (before it is marked
                // again: a versioned row's version would advance twice).
                returned.keep_new(&mut locked);
                // One `UPDATE .. WHERE <key> = $1` per row: on MySQL/MariaDB an
                // `IN (..)` list may be run as a scan that locks rows of others.
                for row in &mut locked {
                    <Self::OnLock as MarkLocked<Self, C::Conn>>::mark(conn, row)?;
                }
                rows.append(&mut locked);
            }
            Ok::<_, Error>(rows)
        })?;
        let since = waited.acquired(Self::TABLE_NAME, rows.len());
        if !rows.is_empty() {
            scope::hold(
                scope::conn_id(conn),
                "row",
                Self::TABLE_NAME,
                || match keys.as_slice() {
                    [first, .., last] if keys.len() > 8 => {
                        format!("[{first:?} ..= {last:?}] ({} keys)", keys.len())
                    }
                    keys => format!("{keys:?}"),
                },
                since,
            );
        }
        Ok(rows)
    }
}

/// The keys in the order [`Lockable::lock_all`] locks them, blocking or async:
/// ascending, each once, so that every transaction takes its locks in the same
/// order.
pub(crate) fn lock_order<K: Ord + Clone>(keys: &[K]) -> Vec<K> {
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    keys
}

/// The keys of the rows [`Lockable::lock_all`] has returned so far, blocking or
/// async, when its keys span more than one chunk: on MySQL/MariaDB keys that the
/// column's collation holds equal ("K", "k") find the same row, and they may
/// fall in different chunks (Rust's order is not the collation's).
pub(crate) struct Returned<K>(Option<std::collections::BTreeSet<K>>);

impl<K: Ord + Clone> Returned<K> {
    /// Kept only for more than [`MAX_KEYS_PER_STATEMENT`] keys (one chunk
    /// dedups its own rows).
    pub(crate) fn for_keys(keys: usize) -> Self {
        Returned((keys > MAX_KEYS_PER_STATEMENT).then(std::collections::BTreeSet::new))
    }

    /// Drops the rows of `locked` (one chunk's) that an earlier chunk returned.
    pub(crate) fn keep_new<M: Lockable<Key = K>>(&mut self, locked: &mut Vec<M>) {
        if let Some(returned) = &mut self.0 {
            locked.retain(|row| returned.insert(row.key()));
        }
    }
}

/// What the derive checks of a model's key: that it names the primary key of
/// the model's `table!`, column for column, in the same order. lockkit finds a
/// model's row with `table.find(key)`, which matches the `table!`'s key: a
/// model key of other columns (or of the same ones in another order) would
/// find, and write, another row. Implemented for a key and itself only.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "the model's key is `{Key}`, but its `table!`'s primary key is `{Self}`",
    label = "lockkit finds the model's row with `table.find(key)`, which matches the `table!`'s primary key",
    note = "name the `table!`'s primary key columns, in its order, in `#[diesel(primary_key(..))]` (without it, the key is the field `id`)"
)]
pub trait PrimaryKeyIs<Key> {}

impl<Key> PrimaryKeyIs<Key> for Key {}

/// The derive's call that checks [`PrimaryKeyIs`] at compile time.
#[doc(hidden)]
pub fn key_is_primary_key<T: diesel::Table, Key>()
where
    T::PrimaryKey: PrimaryKeyIs<Key>,
{
}

/// Whether `locked`, the rows the first read of `chunk` returned (in the
/// server's key order), may leave a key of `chunk` without its row. Complete
/// is only the usual answer: one row for each key, in the keys' own order
/// (the server's for integer and UUID keys, and for text under a binary
/// collation). Anything else may hide a key without a row behind rows of
/// another: two rows with one key (a key the database does not enforce
/// unique), or with keys the column's collation holds equal ("k" and "K",
/// both found by "K"), or rows in another order. [`Lockable::lock_all`] then
/// reads the keys [`unmatched`] says again, and sends nothing more when it
/// says none. A key whose row is stored under other bytes that the collation
/// holds equal ("k" finding "K") is one of those: read again on its own.
pub(crate) fn incomplete<M>(chunk: &[M::Key], locked: &[M]) -> bool
where
    M: Lockable,
    M::Key: Ord,
{
    locked.len() != chunk.len() || locked.iter().zip(chunk).any(|(row, key)| row.key() != *key)
}

/// The keys of `chunk` that no row of `locked` has: a key without a row; keys
/// that the column's collation holds equal ("k", "K" on MySQL/MariaDB), which
/// find one row; or, on PostgreSQL under `READ COMMITTED`, a key whose row a
/// transaction the read waited for deleted and inserted again: the read skips
/// the deleted row, and the new one is not in its snapshot.
/// [`Lockable::lock_all`] reads them again, in a statement of their own (which
/// sees and locks such a new row), then reads each key still without a row
/// once more, locked (the latest commit, not the transaction's snapshot): a
/// row committed while the second read waited is locked and returned there,
/// and a key without one is [`Error::NotFound`]. Such a row is locked after
/// the rest of its chunk, out of key order: in that race only, a deadlock with
/// another `lock_all` is possible, and reported as one (retryable). Once every
/// row of the chunk is locked, the chunk is read once more, so that its rows
/// come back in key order.
pub(crate) fn unmatched<'k, M>(
    chunk: &'k [M::Key],
    locked: &[M],
) -> impl Iterator<Item = &'k M::Key>
where
    M: Lockable,
    M::Key: Ord,
{
    let found: std::collections::BTreeSet<M::Key> = locked.iter().map(Lockable::key).collect();
    chunk.iter().filter(move |key| !found.contains(key))
}

/// Keeps the first row of each key in `locked`, in the order the server
/// returned them: [`Lockable::lock_all`]'s rows of a chunk, blocking or async.
pub(crate) fn first_of_each_key<M>(locked: &mut Vec<M>)
where
    M: Lockable,
    M::Key: Ord,
{
    let mut seen = std::collections::BTreeSet::new();
    locked.retain(|row| seen.insert(row.key()));
}

/// Locks the row `key` of `M` as `options` say and runs `f` on the fresh row, in
/// a transaction: [`Lockable::with_lock`] with a key instead of a loaded model,
/// and with [`LockOptions`] (strength, `nowait()`, `skip_locked()`,
/// `timeout(..)`).
///
/// `f` returns your own error type, as in Diesel's `transaction`: any `E` that a
/// [`lockkit::Error`](Error) converts into. An `Err` (or a panic) rolls the
/// transaction back; the error comes back to you untouched.
///
/// # Errors
///
/// As [`Lockable::with_lock`]; [`Error::Busy`] with `nowait()` or `skip_locked()`
/// when the row is held, [`Error::LockTimeout`] after `timeout(..)`;
/// [`Error::InvalidInput`], with nothing sent, for
/// [`LockStrength::KeyShare`] (see
/// [`LockOptions::strength`]). lockkit's errors reach you converted into `E`.
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # use lockkit::prelude::*;
/// use lockkit::LockOptions;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # #[derive(Queryable, Selectable, lockkit::Lockable)]
/// # #[diesel(table_name = items)]
/// # pub struct Item { pub id: i32, pub stock: i32 }
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn).unwrap();
/// #[derive(Debug, thiserror::Error)]
/// enum ShopError {
///     #[error("only {0} left")]
///     NotEnough(i32),
///     #[error(transparent)]
///     Lock(#[from] lockkit::Error),
/// }
///
/// let opts = LockOptions::default().nowait();
/// let left = lockkit::with_lock(&mut conn, 1, opts, |conn, item: Item| {
///     if item.stock < 8 {
///         return Err(ShopError::NotEnough(item.stock));
///     }
///     diesel::update(items::table.find(item.id))
///         .set(items::stock.eq(item.stock - 8))
///         .execute(conn)
///         .map_err(lockkit::Error::from)?;
///     Ok(item.stock - 8)
/// });
/// assert_eq!(left.unwrap(), 2);
/// let again = lockkit::with_lock(&mut conn, 1, opts, |_conn, item: Item| {
///     if item.stock < 8 {
///         return Err(ShopError::NotEnough(item.stock));
///     }
///     Ok(item.stock)
/// });
/// assert!(matches!(again, Err(ShopError::NotEnough(2))));
/// ```
pub fn with_lock<M, C, T, E, F>(
    conn: &mut C,
    key: M::Key,
    options: LockOptions,
    f: F,
) -> Result<T, E>
where
    C: AsLockingConnection,
    M: LockRow<C::Conn>,
    E: From<Error>,
    F: FnOnce(&mut C::Conn, M) -> Result<T, E>,
{
    options.check_for_with_lock()?;
    conn.locking_connection()
        .locked_transaction(&options, |conn| {
            let row = lock_row::<M, _>(conn, key, options)?;
            f(conn, row)
        })
}

/// The locked read of [`with_lock`], in its transaction: the row, its version
/// advanced when the lock is exclusive and the model versioned.
fn lock_row<M, Conn>(conn: &mut Conn, key: M::Key, options: LockOptions) -> Result<M, Error>
where
    Conn: LockingConnection,
    M: LockRow<Conn>,
{
    // lockkit's own statements, whose answers lockkit sees (SQLite's
    // journal): a later call asks nothing for them.
    crate::transaction::journal::own(conn, |conn| {
        lock_row_unwatched::<M, Conn>(conn, key, options)
    })
}

/// [`lock_row`]'s statements.
fn lock_row_unwatched<M, Conn>(
    conn: &mut Conn,
    key: M::Key,
    options: LockOptions,
) -> Result<M, Error>
where
    Conn: LockingConnection,
    M: LockRow<Conn>,
{
    let lock = options.row_lock();
    if lock == ForUpdate::LOCK {
        let waited = crate::metrics::LockWait::start();
        if let Some(row) = M::load_locked_bumped(conn, &key)? {
            held::<M, Conn>(conn, &key, waited);
            return Ok(row);
        }
    }
    let row = load_held(conn, key.clone(), lock)?;
    let mut row = match row {
        Some(row) => row,
        None if lock.wait.hides_held_rows() => {
            let exists = M::exists(conn, key).map_err(classify)?;
            return Err(WaitMode::empty_read(exists));
        }
        None => return Err(Error::NotFound),
    };
    if lock.strength.is_exclusive() {
        <M::OnLock as MarkLocked<M, Conn>>::mark(conn, &mut row)?;
    }
    Ok(row)
}

/// `M::load_locked`, classified, and the lock it took recorded (its wait, and
/// its hold until the transaction ends): the locked read of [`with_lock`] and
/// of the adaptive policy's locked path. The wait at SQLite's `BEGIN
/// IMMEDIATE` is recorded by `locked_transaction`; here, the locked read's. A
/// read that found no row is read again where the mode says so
/// ([`WaitMode::reads_again_when_empty`]: a row deleted and inserted again by
/// the transaction the read waited for).
pub(crate) fn load_held<M, Conn>(
    conn: &mut Conn,
    key: M::Key,
    lock: RowLock,
) -> Result<Option<M>, Error>
where
    Conn: LockingConnection,
    M: LockRow<Conn>,
{
    let waited = crate::metrics::LockWait::start();
    // lockkit's own reads, whose answers lockkit sees (SQLite's journal).
    let read = |conn: &mut Conn| {
        crate::transaction::journal::own(conn, |conn| M::load_locked(conn, key.clone(), lock))
            .map_err(|err| lock.wait.classify(err))
    };
    let mut row = read(conn)?;
    if row.is_none() && lock.wait.reads_again_when_empty(conn.ends()) {
        row = read(conn)?;
    }
    if row.is_some() {
        held::<M, Conn>(conn, &key, waited);
    }
    Ok(row)
}

/// Records the row lock on `key` of `M` that `conn` took after `waited`.
fn held<M: Lockable, Conn: LockingConnection>(
    conn: &mut Conn,
    key: &M::Key,
    waited: crate::metrics::LockWait,
) {
    let since = waited.acquired(M::TABLE_NAME, 1);
    let conn_id = scope::conn_id(conn);
    scope::hold(conn_id, "row", M::TABLE_NAME, || format!("{key:?}"), since);
}

/// Runs `f` in a transaction fit for locking: a plain transaction on PostgreSQL and
/// MySQL (with the options' lock timeout), `BEGIN IMMEDIATE` on SQLite. Use it around
/// [`Lockable::lock_all`] and [`queue::claim`](crate::queue::claim).
///
/// Of the options, the lock timeout bounds every lock wait of `f` on the servers;
/// the strength and wait mode are [`with_lock`]'s. `lock_all` always waits
/// (`FOR UPDATE`) and `claim` always skips (`SKIP LOCKED`), `nowait()` or not; on
/// SQLite the wait mode says how `BEGIN IMMEDIATE` waits for the database's write
/// lock (`nowait()`: [`Error::Busy`] at once). For a `lock_all` that must not wait,
/// give it a short `timeout(..)`.
///
/// `f` returns your own error type, as in Diesel's `transaction`: any `E` that a
/// [`lockkit::Error`](Error) converts into. An `Err` (or a panic) rolls the
/// transaction back; the error comes back to you untouched.
///
/// # Errors
///
/// The transaction is rolled back on every error:
///
/// * [`Error::LockTimeout`] (or [`Error::Busy`] with `nowait()` or
///   `skip_locked()`) on SQLite when another connection holds the database's
///   write lock.
/// * [`Error::TransactionAborted`] when nested in an open transaction that the
///   server rolled back as a whole; not retryable here.
/// * a classified database error from `BEGIN`, the lock timeout's setting or
///   `COMMIT`; see [`classify`](crate::classify()).
/// * whatever `f` returns.
pub fn locked_transaction<C, T, E, F>(conn: &mut C, options: LockOptions, f: F) -> Result<T, E>
where
    C: AsLockingConnection,
    E: From<Error>,
    F: FnOnce(&mut C::Conn) -> Result<T, E>,
{
    conn.locking_connection().locked_transaction(&options, f)
}

/// The locked re-read of one row, which [`with_lock`] requires. Implemented for
/// every [`Lockable`] model that is `Selectable` on the connection's backend;
/// name it only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "`{Self}` rows cannot be locked on `{Conn}`",
    label = "not a lockable model on this connection",
    note = "`with_lock` needs a model with `#[derive(Lockable)]` or `#[derive(Versioned)]` that is also `#[derive(Queryable, Selectable)]` for the connection's backend"
)]
pub trait LockRow<Conn: LockingConnection>: Lockable<OnLock: MarkLocked<Self, Conn>> {
    /// `SELECT <fields> FROM <table> WHERE <key> FOR UPDATE`.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_locked(
        conn: &mut Conn,
        key: Self::Key,
        lock: RowLock,
    ) -> diesel::QueryResult<Option<Self>>;
    /// Whether the row exists (an unlocked read).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    fn exists(conn: &mut Conn, key: Self::Key) -> diesel::QueryResult<bool>;
    /// The row, read without a lock.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    fn load(conn: &mut Conn, key: Self::Key) -> diesel::QueryResult<Option<Self>>;
    /// The locked read of a waiting `FOR UPDATE` and the version bump in one
    /// statement, where the backend and the model allow it ([`BumpOnLock`]):
    /// the row with its new version, the journal told as by
    /// [`MarkLocked::mark`]. `None` when not here, or when the statement
    /// matched no row: [`with_lock`] then reads and bumps in two statements,
    /// which tell a missing row from a version at its maximum.
    ///
    /// # Errors
    ///
    /// A classified database error; nothing is left half done (the statement
    /// is one).
    #[doc(hidden)]
    fn load_locked_bumped(conn: &mut Conn, key: &Self::Key) -> Result<Option<Self>, Error> {
        let _ = (conn, key);
        Ok(None)
    }
}

/// The locked read of one row, under whichever clause lockkit picks for the
/// [`RowLock`]: a [`LockClause`] type or the
/// value. Name it only in `where` clauses.
#[derive(Debug)]
pub struct First<Q, M>(Q, PhantomData<M>);

impl<Q, M, Conn, L> LockedCall<L, Conn> for First<Q, M>
where
    Conn: LockingConnection,
    Q: LockingDsl<L>,
    Conn::Locked<Q, L>: for<'q> LoadQuery<'q, Conn, M>,
{
    type Output = diesel::QueryResult<Option<M>>;

    fn call(self, conn: &mut Conn, clause: L) -> Self::Output {
        Conn::apply_lock(self.0, clause).get_result(conn).optional()
    }
}

/// `SELECT <fields> FROM <table> WHERE <key>`: the read `with_lock` locks.
pub(crate) type ByKey<M, DB> =
    Select<Find<<M as Lockable>::Table, <M as Lockable>::Key>, AsSelect<M, DB>>;

/// Builds [`ByKey`], for the blocking and the async connections.
pub(crate) fn by_key<M, DB>(key: M::Key) -> ByKey<M, DB>
where
    DB: diesel::backend::Backend,
    M: Lockable + Selectable<DB>,
    AsSelect<M, DB>: Expression,
    M::Table: FindDsl<M::Key>,
    Find<M::Table, M::Key>: SelectDsl<AsSelect<M, DB>>,
{
    M::Table::default().find(key).select(M::as_select())
}

/// Implements [`LockRow`] and [`LockAll`] for every model that fits, on each
/// connection lockkit locks rows on (a [`Dispatch`](crate::multi::Dispatch)
/// enum hands them on to the connection it holds: `multi.rs`).
macro_rules! lock_row_on {
    ($($conn:ty, $db:ty, $feature:literal);*) => {$(
        #[cfg(feature = $feature)]
        impl<M> LockRow<$conn> for M
        where
            M: Lockable + Selectable<$db>,
            M::OnLock: MarkLocked<M, $conn> + BumpOnLock<M, $conn>,
            AsSelect<M, $db>: Expression,
            M::Table: FindDsl<M::Key>,
            Find<M::Table, M::Key>: SelectDsl<AsSelect<M, $db>>,
            ByKey<M, $db>: for<'q> LoadQuery<'q, $conn, M>,
            First<ByKey<M, $db>, M>: EveryClause<$conn, diesel::QueryResult<Option<M>>>,
        {
            fn load_locked_bumped(conn: &mut $conn, key: &M::Key) -> Result<Option<M>, Error> {
                <M::OnLock as BumpOnLock<M, $conn>>::lock_bumped(conn, key)
            }

            fn load_locked(
                conn: &mut $conn,
                key: M::Key,
                lock: RowLock,
            ) -> diesel::QueryResult<Option<M>> {
                lock.with_clause(conn, First(by_key::<M, $db>(key), PhantomData))
            }

            fn exists(conn: &mut $conn, key: M::Key) -> diesel::QueryResult<bool> {
                Self::load(conn, key).map(|row| row.is_some())
            }

            fn load(conn: &mut $conn, key: M::Key) -> diesel::QueryResult<Option<M>> {
                by_key::<M, $db>(key).get_result::<M>(conn).optional()
            }
        }

        #[cfg(feature = $feature)]
        impl<M> LockAll<$conn> for M
        where
            M: LockRow<$conn> + Selectable<$db>,
            AsSelect<M, $db>: Expression,
            Pk<M>: KeyColumn<M::Key>,
            M::Table: FilterDsl<KeysFilter<M>>,
            dsl::Filter<M::Table, KeysFilter<M>>: OrderDsl<dsl::Asc<Pk<M>>>,
            dsl::Order<dsl::Filter<M::Table, KeysFilter<M>>, dsl::Asc<Pk<M>>>:
                SelectDsl<AsSelect<M, $db>>,
            AllByKeys<M, $db>: LockingDsl<ForUpdate>,
            <$conn as LockingConnection>::Locked<AllByKeys<M, $db>, ForUpdate>:
                for<'q> LoadQuery<'q, $conn, M>,
        {
            fn load_all_locked(
                conn: &mut $conn,
                keys: Vec<M::Key>,
            ) -> diesel::QueryResult<Vec<M>> {
                <$conn>::apply_lock(all_by_keys::<M, $db>(keys), ForUpdate).load(conn)
            }
        }
    )*};
}

lock_row_on!(
    diesel::PgConnection, diesel::pg::Pg, "postgres";
    diesel::MysqlConnection, diesel::mysql::Mysql, "mysql";
    diesel::SqliteConnection, diesel::sqlite::Sqlite, "sqlite"
);

/// The ordered multi-row lock of [`Lockable::lock_all`]. Implemented for every
/// [`LockRow`] model whose primary key is one [`KeyColumn`]; name it only in
/// `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "`lock_all` cannot lock `{Self}` rows on `{Conn}`",
    label = "lock_all needs a single-column integer, string or UUID key",
    note = "keys `lock_all` takes: `i16`, `i32`, `i64`, `String`, and `uuid::Uuid` (feature `uuid`, PostgreSQL only); lock the rows of a composite key one at a time with `with_lock`, in a fixed order"
)]
pub trait LockAll<Conn: LockingConnection>: LockRow<Conn> {
    /// `SELECT .. WHERE pk IN (..) ORDER BY pk FOR UPDATE`.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    fn load_all_locked(conn: &mut Conn, keys: Vec<Self::Key>) -> diesel::QueryResult<Vec<Self>>;
}

/// A primary-key column that [`Lockable::lock_all`] can match against a list of
/// keys: `pk = ANY($1)` on PostgreSQL, `pk IN (?, ?, ..)` on MySQL/MariaDB and
/// SQLite.
///
/// lockkit implements it for every column of one of these SQL types, with the
/// key type Diesel maps to it:
///
/// | key | column | backends |
/// | --- | --- | --- |
/// | `i16`, `i32`, `i64` | `SmallInt`, `Integer`, `BigInt` | all |
/// | `String` | `Text` | all |
/// | `uuid::Uuid` (feature `uuid`) | `Uuid` | PostgreSQL: Diesel has no UUID type for MySQL/MariaDB or SQLite (store it as text there and use a `String` key) |
///
/// A composite key's columns are a tuple, which is none of these: `lock_all`
/// does not compile for such a model (see [`Lockable::lock_all`]).
///
/// Diesel's `eq_any` bound cannot be named in generic code, so it is stated here
/// once per key type. It is also the one extension point among the
/// [bounds](crate::bounds): for a key type of your own (a newtype over `i64`
/// that implements Diesel's `AsExpression<BigInt>`), implement it for your key
/// column with `self.eq_any(keys)`.
#[diagnostic::on_unimplemented(
    message = "lock_all needs a single-column integer, string or UUID key, not `{K}`",
    label = "the primary key `{Self}` cannot be matched against a list of `{K}`",
    note = "keys `lock_all` takes: `i16`, `i32`, `i64`, `String`, and `uuid::Uuid` (feature `uuid`, PostgreSQL only; Diesel maps UUIDs on no other backend)",
    note = "a composite key is refused: lock its rows one at a time with `with_lock`, in a fixed order"
)]
pub trait KeyColumn<K>: ExpressionMethods {
    /// `pk.eq_any(keys)`.
    type EqAny;
    /// Builds `pk.eq_any(keys)`.
    fn eq_any_keys(self, keys: Vec<K>) -> Self::EqAny;
}

macro_rules! key_column {
    ($($key:ty => $sql:ty),*) => {$(
        impl<C> KeyColumn<$key> for C
        where
            C: Expression<SqlType = $sql> + ExpressionMethods,
        {
            type EqAny = KeyList<C, $key>;
            fn eq_any_keys(self, keys: Vec<$key>) -> Self::EqAny {
                KeyList { column: self, keys }
            }
        }
    )*};
}

/// `pk = ANY($1)` on PostgreSQL (one array bind), `pk IN (?, .., ?)` on
/// MySQL/MariaDB and SQLite with the list padded to a few fixed lengths (1, 2,
/// 4, .. 512, then [`MAX_KEYS_PER_STATEMENT`]) by repeating the last key: each
/// length is one statement that the connection prepares once and caches, where
/// Diesel's `eq_any` is prepared anew on every call on those backends. A
/// repeated key matches the same row, so the rows are the same. Name it only in
/// `where` clauses.
#[derive(Debug, Clone)]
pub struct KeyList<C, K> {
    column: C,
    keys: Vec<K>,
}

#[cfg_attr(not(any(feature = "mysql", feature = "sqlite")), allow(dead_code))]
impl<C, K> KeyList<C, K> {
    /// How many keys the `IN` list holds: the next of the fixed lengths.
    fn padded_len(&self) -> usize {
        let n = self.keys.len().max(1);
        if n > MAX_KEYS_PER_STATEMENT / 2 {
            n.max(MAX_KEYS_PER_STATEMENT)
        } else {
            n.next_power_of_two()
        }
    }
}

impl<C: Expression, K> Expression for KeyList<C, K> {
    type SqlType = diesel::sql_types::Bool;
}

impl<C: ValidGrouping<()>, K> ValidGrouping<()> for KeyList<C, K> {
    type IsAggregate = C::IsAggregate;
}

impl<C: AppearsOnTable<QS>, K, QS> AppearsOnTable<QS> for KeyList<C, K> where Self: Expression {}

impl<C: SelectableExpression<QS>, K, QS> SelectableExpression<QS> for KeyList<C, K> where
    Self: AppearsOnTable<QS>
{
}

impl<C, K> QueryId for KeyList<C, K> {
    // Cached by its SQL, which depends on the padded length.
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(feature = "postgres")]
impl<C, K> QueryFragment<diesel::pg::Pg> for KeyList<C, K>
where
    C: Expression + QueryFragment<diesel::pg::Pg>,
    C::SqlType: diesel::sql_types::SqlType,
    Vec<K>: ToSql<diesel::sql_types::Array<C::SqlType>, diesel::pg::Pg>,
    diesel::pg::Pg: HasSqlType<diesel::sql_types::Array<C::SqlType>>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        // Parenthesized as Diesel's `eq_any`: the same SQL as before.
        out.push_sql("(");
        self.column.walk_ast(out.reborrow())?;
        out.push_sql(" = ANY(");
        out.push_bind_param::<diesel::sql_types::Array<C::SqlType>, _>(&self.keys)?;
        out.push_sql("))");
        Ok(())
    }
}

/// The padded `IN` list of MySQL/MariaDB and SQLite.
macro_rules! padded_in_list {
    ($($db:ty, $feature:literal);*) => {$(
        #[cfg(feature = $feature)]
        impl<C, K> QueryFragment<$db> for KeyList<C, K>
        where
            C: Expression + QueryFragment<$db>,
            $db: HasSqlType<C::SqlType>,
            K: ToSql<C::SqlType, $db>,
        {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, $db>) -> QueryResult<()> {
                let Some(last) = self.keys.last() else {
                    // No key: no row (lock_all never sends an empty list).
                    out.push_sql("(1 = 0)");
                    return Ok(());
                };
                out.push_sql("(");
                self.column.walk_ast(out.reborrow())?;
                out.push_sql(" IN (");
                for i in 0..self.padded_len() {
                    if i > 0 {
                        out.push_sql(", ");
                    }
                    out.push_bind_param::<C::SqlType, K>(self.keys.get(i).unwrap_or(last))?;
                }
                out.push_sql("))");
                Ok(())
            }
        }
    )*};
}

padded_in_list!(
    diesel::mysql::Mysql, "mysql";
    diesel::sqlite::Sqlite, "sqlite"
);

key_column!(
    i16 => diesel::sql_types::SmallInt,
    i32 => diesel::sql_types::Integer,
    i64 => diesel::sql_types::BigInt,
    String => diesel::sql_types::Text
);

// PostgreSQL orders `uuid` bytewise, as `Uuid`'s `Ord` does: the chunks of a
// long list are locked in the order the server returns their rows.
#[cfg(all(feature = "uuid", feature = "postgres"))]
key_column!(uuid::Uuid => diesel::sql_types::Uuid);

pub(crate) type KeysFilter<M> = <Pk<M> as KeyColumn<<M as Lockable>::Key>>::EqAny;
/// `SELECT <fields> FROM <table> WHERE <pk> IN (..) ORDER BY <pk>`: the read
/// `lock_all` locks.
pub(crate) type AllByKeys<M, DB> = Select<
    dsl::Order<dsl::Filter<<M as Lockable>::Table, KeysFilter<M>>, dsl::Asc<Pk<M>>>,
    AsSelect<M, DB>,
>;

/// Builds [`AllByKeys`] for one chunk of keys, for the blocking and the async
/// connections.
pub(crate) fn all_by_keys<M, DB>(keys: Vec<M::Key>) -> AllByKeys<M, DB>
where
    DB: diesel::backend::Backend,
    M: Lockable + Selectable<DB>,
    AsSelect<M, DB>: Expression,
    Pk<M>: KeyColumn<M::Key>,
    M::Table: FilterDsl<KeysFilter<M>>,
    dsl::Filter<M::Table, KeysFilter<M>>: OrderDsl<dsl::Asc<Pk<M>>>,
    dsl::Order<dsl::Filter<M::Table, KeysFilter<M>>, dsl::Asc<Pk<M>>>: SelectDsl<AsSelect<M, DB>>,
{
    let pk = || M::Table::default().primary_key();
    M::Table::default()
        .filter(pk().eq_any_keys(keys))
        .order(pk().asc())
        .select(M::as_select())
}

impl LockStrength {
    /// `FOR UPDATE` and `FOR NO KEY UPDATE`: the locks a writer takes.
    pub(crate) fn is_exclusive(self) -> bool {
        matches!(self, LockStrength::Update | LockStrength::NoKeyUpdate)
    }
}

/// [`Lockable::OnLock`] of a model without a version column: a lock writes nothing.
#[derive(Debug, Clone, Copy)]
pub struct NoVersion;

/// What an exclusive lock on one row writes to it ([`Lockable::OnLock`]).
/// Implemented by [`NoVersion`] (here) and
/// [`BumpVersion`](crate::optimistic::BumpVersion)
/// ([`bump_on_lock`](crate::optimistic::bump_on_lock)); you never implement
/// it, and name it only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "a lock on `{M}` cannot advance its version on `{Conn}`",
    label = "`{Self}` cannot mark a locked `{M}` row",
    note = "an exclusive lock on a `Versioned` model writes its version: the model must fit lockkit's versioned writes on this connection (`#[derive(Versioned)]` on a `table!` of a supported backend)"
)]
pub trait MarkLocked<M, Conn> {
    /// Marks one locked row as written (the model is updated to match).
    ///
    /// # Errors
    ///
    /// [`BumpVersion`](crate::optimistic::BumpVersion): those of
    /// [`Versioned::touch_versioned`](crate::Versioned::touch_versioned).
    fn mark(conn: &mut Conn, row: &mut M) -> Result<(), Error>;
}

impl<M, Conn> MarkLocked<M, Conn> for NoVersion {
    fn mark(_: &mut Conn, _: &mut M) -> Result<(), Error> {
        Ok(())
    }
}

/// The locked read and the version bump of [`with_lock`] in one statement
/// ([`LockRow::load_locked_bumped`]), for what [`Lockable::OnLock`] names:
/// nothing for [`NoVersion`], and for
/// [`BumpVersion`](crate::optimistic::BumpVersion) on PostgreSQL the statement
/// of [`LockedBumpQuery`](crate::optimistic::bump_on_lock::LockedBumpQuery)
/// (both in [`bump_on_lock`](crate::optimistic::bump_on_lock)). Implemented by
/// lockkit for every model and connection; name it only in `where` clauses.
#[doc(hidden)]
pub trait BumpOnLock<M: Lockable, Conn> {
    /// The row, locked `FOR UPDATE` and its version advanced, or `None`
    /// (nothing sent, or no row matched).
    ///
    /// # Errors
    ///
    /// A classified database error.
    fn lock_bumped(conn: &mut Conn, key: &M::Key) -> Result<Option<M>, Error>;
}

impl<M: Lockable, Conn> BumpOnLock<M, Conn> for NoVersion {
    fn lock_bumped(_: &mut Conn, _: &M::Key) -> Result<Option<M>, Error> {
        Ok(None)
    }
}
