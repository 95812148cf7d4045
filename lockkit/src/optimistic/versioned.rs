//! Optimistic locking: the [`Versioned`] model trait and its version-checked writes.
//!
//! A versioned model carries an integer version column (Rails' `lock_version`,
//! JPA's `@Version`). Every write is one statement that checks the version the
//! writer read and bumps it by one:
//!
//! ```sql
//! UPDATE items SET name = $1, stock = $2, lock_version = lock_version + 1
//!  WHERE id = $3 AND lock_version = $4
//! ```
//!
//! One matched row is success and the in-memory version advances. Zero rows means
//! somebody else wrote (or deleted) the row since it was read: the call returns
//! [`Error::Stale`] with a [`StaleObjectError`](crate::StaleObjectError) and leaves
//! the struct exactly as it was. Only on that failure path does lockkit run one more
//! `SELECT` to say what is there now.
//!
//! Implement [`Versioned`] with `#[derive(Versioned)]`:
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//!
//! diesel::table! {
//!     items (id) {
//!         id -> Integer,
//!         name -> Text,
//!         stock -> Integer,
//!         lock_version -> Integer,
//!     }
//! }
//!
//! #[derive(Queryable, Selectable, Identifiable, Versioned, Debug)]
//! #[diesel(table_name = items)]
//! pub struct Item {
//!     pub id: i32,
//!     pub name: String,
//!     pub stock: i32,
//!     pub lock_version: i32,
//! }
//!
//! # fn main() -> Result<(), lockkit::Error> {
//! let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO items VALUES (1, 'widget', 10, 0)").execute(&mut conn)?;
//! let mut alice = items::table.find(1).first::<Item>(&mut conn)?;
//! let mut bob = items::table.find(1).first::<Item>(&mut conn)?;
//!
//! alice.stock -= 8;
//! alice.update_versioned(&mut conn)?; // lock_version 0 -> 1
//!
//! bob.stock -= 8;
//! let err = bob.update_versioned(&mut conn).unwrap_err(); // bob read version 0
//! assert!(matches!(err, lockkit::Error::Stale(_)));
//! assert_eq!(bob.lock_version, 0); // untouched
//! # Ok(()) }
//! ```
//!
//! The bound traits the writes name ([`VersionCheck`], [`CurrentVersionQuery`])
//! are declared here as well: each has [`Versioned`] as its supertrait, so the
//! trait and they are one unit whichever file holds them.
//! [`version_check`](crate::optimistic::version_check) implements them for
//! every model and connection that fit. The run of one write on a blocking
//! connection, at the end of this file, sends the statements of the sequence
//! every versioned write goes through (`optimistic::sequence`).

use diesel::dsl::{self, Find};
use diesel::query_builder::{AsChangeset, IntoUpdateTarget, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, FindDsl};
use diesel::{Column, Connection};

use crate::error::classification::classify;
use crate::error::{Error, Operation};
use crate::optimistic::mark::Mark;
use crate::optimistic::rollbacks;
use crate::optimistic::sequence::{self, at_most_one, checked_next, Origin, Step, Write, Written};
use crate::optimistic::statement::{BySql, ByType, CacheKey, VersionedUpdate};
use crate::optimistic::version::VersionNumber;
use crate::pessimistic::lockable::Lockable;
use crate::transaction::journal;

/// A Diesel model with a version column. Implement it with `#[derive(Versioned)]`.
///
/// The trait only *describes* the model (version column and type, and the fields
/// to write; table and key come from [`Lockable`]); the version-checked writes are
/// provided methods, generic over every backend.
pub trait Versioned: Lockable<OnLock = BumpVersion> {
    /// The version column (`items::lock_version`).
    type VersionColumn: Column<Table = Self::Table> + Default;
    /// The version's Rust type: `i16`, `i32` or `i64`.
    type Version: VersionNumber;
    /// The columns `update_versioned` writes: every field but the primary key and
    /// the version, following Diesel's `AsChangeset` rules (`column_name`,
    /// `skip_update`, `treat_none_as_null`), wrapped in [`ByType`] or [`BySql`]:
    /// how Diesel caches the prepared `UPDATE` (see
    /// [`statement`](crate::optimistic::statement)).
    type Changeset<'a>: AsChangeset<Target = Self::Table> + CacheKey
    where
        Self: 'a;
    /// What every versioned write sets besides the version:
    /// [`SetUpdatedAt`](crate::optimistic::updated_at::SetUpdatedAt) for a
    /// `#[lockkit(updated_at)]` field (`updated_at = CURRENT_TIMESTAMP`), else
    /// [`NoUpdatedAt`](crate::optimistic::updated_at::NoUpdatedAt) (nothing).
    type UpdatedAt: AsChangeset<Target = Self::Table> + QueryId + Default;

    /// The version this row was read at.
    fn version(&self) -> Self::Version;
    /// Records a new version after a successful write.
    fn set_version(&mut self, version: Self::Version);
    /// The changeset of all updatable fields (without the version).
    fn versioned_changeset(&self) -> Self::Changeset<'_>;

    /// Writes every updatable field, checking and bumping the version in one
    /// statement. On success the in-memory version advances by one; on
    /// [`Error::Stale`] nothing is written and `self` is unchanged.
    ///
    /// The model's own `AsChangeset` is not used: lockkit writes the version itself
    /// (exactly once), whether or not your `AsChangeset` includes or skips it.
    ///
    /// # Errors
    ///
    /// * [`Error::Stale`] when no row matched the key and the expected version:
    ///   someone else changed or deleted it. Nothing was written.
    /// * [`Error::VersionOverflow`] when the version is already its type's maximum;
    ///   nothing is sent.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (the
    ///   database does not enforce the declared key); the statement was undone.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    fn update_versioned<Conn>(&mut self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        for<'a> UpdateVersioned<Self, Self::Changeset<'a>>: ExecuteDsl<Conn>,
        for<'a> (Self::Changeset<'a>, Self::Bump): AsChangeset<Target = Self::Table>,
    {
        let written = write::<Self, _, _>(
            conn,
            &self.key(),
            self.version(),
            Origin::Held,
            Operation::Update,
            |checked| update::<Self, _>(self.key(), checked, self.versioned_changeset()),
        )?;
        settle(self, written)
    }

    /// [`update_versioned`](Self::update_versioned), and on [`Error::Stale`] the
    /// report carries a copy of this struct as it was sent (Rails'
    /// `StaleObjectError#record`): [`StaleObjectError::record`](crate::StaleObjectError::record)
    /// gives it back to a merge UI far up the call stack, after `?` has turned the
    /// call's error into yours.
    ///
    /// The copy is made only on the failure path. The struct itself is left as it
    /// was, as by `update_versioned`.
    ///
    /// # Errors
    ///
    /// As [`update_versioned`](Self::update_versioned).
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// #[derive(Queryable, Selectable, Versioned, Clone, Debug, PartialEq)]
    /// #[diesel(table_name = items)]
    /// pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    ///
    /// fn save(conn: &mut SqliteConnection, item: &mut Item) -> Result<(), lockkit::Error> {
    ///     item.update_versioned_recorded(conn)?;
    ///     Ok(())
    /// }
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn).unwrap();
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn).unwrap();
    /// let mut alice = items::table.find(1).first::<Item>(&mut conn).unwrap();
    /// let mut bob = alice.clone();
    /// alice.stock = 7;
    /// save(&mut conn, &mut alice).unwrap();
    ///
    /// bob.stock = 3;
    /// let err = save(&mut conn, &mut bob).unwrap_err();
    /// let mine = err.as_stale().unwrap().record::<Item>().unwrap();
    /// assert_eq!(mine.stock, 3); // what bob sent, to show next to the row's 7
    /// ```
    fn update_versioned_recorded<Conn>(&mut self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn> + Clone + Send + Sync + 'static,
        for<'a> UpdateVersioned<Self, Self::Changeset<'a>>: ExecuteDsl<Conn>,
        for<'a> (Self::Changeset<'a>, Self::Bump): AsChangeset<Target = Self::Table>,
    {
        let written = self.update_versioned(conn);
        written.map_err(|err| err.with_record(|| self.clone()))
    }

    /// Like [`update_versioned`](Self::update_versioned), with your own changeset
    /// instead of the model's fields, e.g. `items::stock.eq(items::stock - 1)`.
    /// Only the version is refreshed in memory; re-read the row if you need the rest.
    /// Leave the version column out of `changes`, as for
    /// [`update_by_version`](Self::update_by_version): lockkit sets it.
    ///
    /// # Errors
    ///
    /// * [`Error::Stale`] when no row matched the key and the expected version:
    ///   someone else changed or deleted it. Nothing was written.
    /// * [`Error::VersionOverflow`] when the version is already its type's maximum;
    ///   nothing is sent.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (the
    ///   database does not enforce the declared key); the statement was undone.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").execute(&mut conn)?;
    /// let mut item = items::table.find(1).first::<Item>(&mut conn)?;
    /// item.update_versioned_with(&mut conn, items::stock.eq(items::stock - 3))?;
    /// assert_eq!(item.lock_version, 1);
    /// assert_eq!(item.stock, 10); // the struct keeps what it read
    /// assert_eq!(items::table.find(1).select(items::stock).first::<i32>(&mut conn)?, 7);
    /// # Ok(()) }
    /// ```
    fn update_versioned_with<Conn, C>(&mut self, conn: &mut Conn, changes: C) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, BySql<C>>: ExecuteDsl<Conn>,
    {
        write_held(
            self,
            conn,
            Origin::Held,
            Operation::Update,
            |key, checked| Self::update_statement(key, checked, changes),
        )
    }

    /// Deletes the row if it still has the version this struct was read at.
    ///
    /// # Errors
    ///
    /// * [`Error::Stale`] when no row matched the key and the expected version:
    ///   someone else changed or deleted it. Nothing was written.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (the
    ///   database does not enforce the declared key); the statement was undone.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").execute(&mut conn)?;
    /// let old = items::table.find(1).first::<Item>(&mut conn)?;
    /// let mut fresh = items::table.find(1).first::<Item>(&mut conn)?;
    /// fresh.touch_versioned(&mut conn)?; // someone else writes: version 0 -> 1
    ///
    /// let err = old.delete_versioned(&mut conn).unwrap_err();
    /// assert!(matches!(err, lockkit::Error::Stale(_)));
    /// fresh.delete_versioned(&mut conn)?;
    /// assert_eq!(items::table.find(1).count().get_result::<i64>(&mut conn)?, 0);
    /// # Ok(()) }
    /// ```
    fn delete_versioned<Conn>(&self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        DeleteVersioned<Self>: ExecuteDsl<Conn>,
    {
        delete_from::<Self, _>(conn, self.key(), self.version(), Origin::Held)
    }

    /// Deletes the row `key` if its version is still `expected_version`, without
    /// loading it first (e.g. `DELETE` with `If-Match`).
    ///
    /// # Errors
    ///
    /// * [`Error::Stale`] when no row matched the key and the expected version:
    ///   someone else changed or deleted it. Nothing was written.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (the
    ///   database does not enforce the declared key); the statement was undone.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").execute(&mut conn)?;
    /// Item::delete_by_version(&mut conn, 1, 0)?;
    ///
    /// let again = Item::delete_by_version(&mut conn, 1, 0).unwrap_err();
    /// assert_eq!(again.as_stale().unwrap().current, lockkit::CurrentState::Deleted);
    /// # Ok(()) }
    /// ```
    fn delete_by_version<Conn>(
        conn: &mut Conn,
        key: Self::Key,
        expected_version: Self::Version,
    ) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        DeleteVersioned<Self>: ExecuteDsl<Conn>,
    {
        delete_from::<Self, _>(conn, key, expected_version, Origin::Outside)
    }

    /// Bumps the version only (JPA's `OPTIMISTIC_FORCE_INCREMENT`): marks the row
    /// as changed, e.g. when a child row changed, so concurrent editors of the parent
    /// become stale.
    ///
    /// # Errors
    ///
    /// * [`Error::Stale`] when no row matched the key and the expected version:
    ///   someone else changed or deleted it. Nothing was written.
    /// * [`Error::VersionOverflow`] when the version is already its type's maximum;
    ///   nothing is sent.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (the
    ///   database does not enforce the declared key); the statement was undone.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").execute(&mut conn)?;
    /// let mut parent = items::table.find(1).first::<Item>(&mut conn)?;
    /// let mut editor = items::table.find(1).first::<Item>(&mut conn)?;
    ///
    /// parent.touch_versioned(&mut conn)?; // e.g. one of its child rows changed
    /// assert_eq!(parent.lock_version, 1);
    ///
    /// editor.stock = 0;
    /// assert!(matches!(editor.update_versioned(&mut conn), Err(lockkit::Error::Stale(_))));
    /// # Ok(()) }
    /// ```
    fn touch_versioned<Conn>(&mut self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        TouchVersioned<Self>: ExecuteDsl<Conn>,
    {
        write_held(self, conn, Origin::Held, Operation::Touch, touch::<Self>)
    }

    /// Applies `changes` to the row `key` if its version is still
    /// `expected_version`, without loading it first: for a version that arrives from
    /// outside (a form's hidden field, an `If-Match` header). Returns the new version.
    ///
    /// Leave the version column out of `changes` (a struct that derives
    /// `AsChangeset` with it: `#[diesel(skip_update)]` on the field, or a
    /// changeset of the other columns): lockkit sets it. PostgreSQL refuses a
    /// statement that sets a column twice, and MySQL/MariaDB, which assign
    /// from left to right, would move the version to your value plus one.
    ///
    /// # Errors
    ///
    /// * [`Error::Stale`] when no row matched the key and the expected version:
    ///   someone else changed or deleted it. Nothing was written.
    /// * [`Error::VersionOverflow`] when the version is already its type's maximum;
    ///   nothing is sent.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (the
    ///   database does not enforce the declared key); the statement was undone.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").execute(&mut conn)?;
    /// // The client read version 0 and sends it back with its change.
    /// let version = Item::update_by_version(&mut conn, 1, 0, items::stock.eq(7))?;
    /// assert_eq!(version, 1);
    ///
    /// // A second client that also read version 0 is refused.
    /// let err = Item::update_by_version(&mut conn, 1, 0, items::stock.eq(3)).unwrap_err();
    /// assert_eq!(err.as_stale().unwrap().current, lockkit::CurrentState::Version(1));
    /// # Ok(()) }
    /// ```
    fn update_by_version<Conn, C>(
        conn: &mut Conn,
        key: Self::Key,
        expected_version: Self::Version,
        changes: C,
    ) -> Result<Self::Version, Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, BySql<C>>: ExecuteDsl<Conn>,
    {
        let written = write::<Self, _, _>(
            conn,
            &key,
            expected_version,
            Origin::Outside,
            Operation::Update,
            |checked| Self::update_statement(key.clone(), checked, changes),
        )?;
        Ok(written.version()?.unwrap_or(expected_version))
    }

    /// A conditional update of the row `key` that also bumps its version, in one
    /// statement: `UPDATE .. SET <changes>, <version> = <version> + 1 WHERE <key>
    /// AND <condition>`. [`Error::NoRowMatched`] when the condition is false or the
    /// row is gone; nothing is written then.
    ///
    /// This is [`atomic::update_if`](crate::atomic::update_if) of an
    /// [`atomic::update`](crate::atomic::update) (prepared once per connection) for a versioned
    /// table: the version moves, so an optimistic writer who read the row before
    /// gets [`Error::Stale`] instead of writing over this change.
    ///
    /// Leave the version column out of `changes`, as for
    /// [`update_by_version`](Self::update_by_version): lockkit sets it.
    /// PostgreSQL refuses a statement that sets a column twice, and
    /// MySQL/MariaDB, which assign from left to right, would move the version
    /// to your value plus one, back to where an older copy of the row matches.
    ///
    /// Inside a transaction, which may roll back, the [`journal`] learns the
    /// number the row moved to: one more statement reads it (under the row
    /// lock the update holds), so that a struct read after the update in that
    /// transaction is refused once it rolled back, as after lockkit's other
    /// writes. Outside a transaction it is the one statement, once the
    /// connection knows that the database enforces the key: its first
    /// `update_if` of a table writes in a savepoint (as every write does where
    /// the key is not enforced, undone if it matched several rows), then asks
    /// the catalog. A connection with instrumentation of its own remembers no
    /// answer, and writes in a savepoint each time.
    ///
    /// # Errors
    ///
    /// * [`Error::NoRowMatched`] when the condition is false or the row is gone.
    /// * [`Error::AmbiguousKey`] when the key matched more than one row (a key
    ///   the database does not enforce); nothing is written.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
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
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn).unwrap();
    /// Item::update_if(&mut conn, 1, items::stock.ge(8), items::stock.eq(items::stock - 8)).unwrap();
    /// let again = Item::update_if(&mut conn, 1, items::stock.ge(8), items::stock.eq(items::stock - 8));
    /// assert!(matches!(again, Err(lockkit::Error::NoRowMatched)));
    /// ```
    fn update_if<Conn, P, C>(
        conn: &mut Conn,
        key: Self::Key,
        condition: P,
        changes: C,
    ) -> Result<(), Error>
    where
        Conn: Connection,
        Self::Table: FindDsl<Self::Key>,
        Find<Self::Table, Self::Key>: FilterDsl<P>,
        dsl::Filter<Find<Self::Table, Self::Key>, P>: IntoUpdateTarget<Table = Self::Table>,
        Self: CurrentVersionQuery<Conn>,
        (C, Self::Bump): AsChangeset<Target = Self::Table>,
        crate::optimistic::atomic::PreparedUpdate<
            Self::Table,
            <dsl::Filter<Find<Self::Table, Self::Key>, P> as IntoUpdateTarget>::WhereClause,
            <(C, Self::Bump) as AsChangeset>::Changeset,
        >: ExecuteDsl<Conn>,
    {
        let target = Self::Table::default().find(key.clone()).filter(condition);
        let statement = crate::optimistic::atomic::update(target).set((changes, Self::bump()));
        // The backend inside a `MultiConnection` enum, whose own backend type
        // names none.
        let ends = Self::ends(conn);
        journal::watch(conn, |_| ends);
        journal::before_write(conn);
        crate::transaction::check_write(conn)?;
        // A key the database does not enforce is written as the versioned
        // writes write it: in a savepoint, undone if it matched more than one
        // row. The catalog is asked after the write (in its savepoint), once
        // per connection: a read before it would keep the `UPDATE` of a
        // deferred SQLite transaction from waiting for the write lock (`Busy`
        // at once).
        let known = Self::known_key_is_unique(conn);
        let rows = journal::own(conn, |conn| {
            execute_once::<Self, _, _>(conn, &key, known, statement)
        })
        .map_err(|err| crate::transaction::failed_write(conn, err, ends))?;
        crate::optimistic::atomic::matched(rows)?;
        moved_by_update_if::<Self, _>(conn, &key)
    }

    /// Applies one changeset to many rows, each checked against its own expected
    /// version, in one transaction: either every row matches and every version
    /// advances, or nothing is written and [`Error::StaleRows`] lists **every**
    /// stale key (not just the first). Returns the new versions, in input order.
    ///
    /// One `UPDATE` per row (each is the statement of
    /// [`update_by_version`](Self::update_by_version)), inside a transaction (a
    /// savepoint when one is already open), in key order (so two bulk updates of
    /// overlapping rows cannot deadlock). A key named twice is
    /// [`Error::DuplicateKey`], before anything is sent. Leave the version
    /// column out of `changes`, as for `update_by_version`.
    ///
    /// # Errors
    ///
    /// Nothing is written on any of them:
    ///
    /// * [`Error::DuplicateKey`] when a key is named twice; nothing is sent.
    /// * [`Error::StaleRows`] with one report per row that no longer has its
    ///   expected version (changed or deleted).
    /// * [`Error::VersionOverflow`] when an expected version is already its type's
    ///   maximum.
    /// * [`Error::AmbiguousKey`] when a key matched more than one row.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when one of its statements (or one of the
    ///   caller's before it, whose error the caller let go) was a deadlock's victim
    ///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a
    ///   server started with `--innodb-rollback-on-timeout`), which rolled the
    ///   whole transaction back: not retryable here, since a retry would run in
    ///   autocommit; the owner of the outermost transaction runs it again whole.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # fn main() -> Result<(), lockkit::Error> {
    /// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").execute(&mut conn)?;
    /// let versions = Item::update_all_by_version(&mut conn, &[(2, 0), (1, 0)], items::stock.eq(0))?;
    /// assert_eq!(versions, vec![1, 1]); // in input order
    ///
    /// // Row 2 is no longer at version 0: neither row is written.
    /// let err = Item::update_all_by_version(&mut conn, &[(1, 1), (2, 0)], items::stock.eq(9)).unwrap_err();
    /// let lockkit::Error::StaleRows(stale) = err else { panic!("{err}") };
    /// assert_eq!(stale.len(), 1);
    /// assert_eq!(stale[0].key, "2");
    /// assert_eq!(items::table.find(1).first::<Item>(&mut conn)?.lock_version, 1);
    /// # Ok(()) }
    /// ```
    fn update_all_by_version<Conn, C>(
        conn: &mut Conn,
        rows: &[(Self::Key, Self::Version)],
        changes: C,
    ) -> Result<Vec<Self::Version>, Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        Self::Key: Ord,
        C: Clone,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, BySql<C>>: ExecuteDsl<Conn>,
    {
        let order = key_order::<Self, _>(rows)?;
        // Before the savepoint, which SQLite would open as a transaction of
        // its own after a rollback of the caller's whole transaction; the
        // journal first learns the rule of the backend (inside a
        // `MultiConnection` enum, the connection's), as `write` does.
        let ends = Self::ends(conn);
        journal::watch(conn, |_| ends);
        crate::transaction::refuse_if_ended_on_sqlite(conn)?;
        let nested = crate::transaction::in_transaction(conn);
        let written = conn.transaction(|conn| {
            let mut versions = vec![None; rows.len()];
            let mut stale = Vec::new();
            for i in order {
                let (key, expected) = &rows[i];
                match write::<Self, _, _>(
                    conn,
                    key,
                    *expected,
                    Origin::Outside,
                    Operation::Update,
                    |checked| Self::update_statement(key.clone(), checked, changes.clone()),
                )? {
                    Written::Done(next) => versions[i] = next,
                    Written::Stale(report) => stale.push(*report),
                }
            }
            all_or_none(versions, stale)
        });
        // A stale row's move past went with the rollback: made again, as
        // after lockkit's other transactions ([`transaction::finish`]).
        if written.is_err() && !nested {
            Self::redo_after_own_rollback(conn);
        }
        written.map_err(|err| crate::transaction::owners_error(err, nested))
    }

    /// The unexecuted statement of [`update_versioned`](Self::update_versioned), for
    /// `diesel::debug_query`.
    fn update_versioned_statement<'a>(&'a self) -> UpdateVersioned<Self, Self::Changeset<'a>>
    where
        Self: VersionCheck,
        (Self::Changeset<'a>, Self::Bump): AsChangeset<Target = Self::Table>,
    {
        update::<Self, _>(self.key(), self.version(), self.versioned_changeset())
    }

    /// The statement `UPDATE <table> SET <changes>, <version> = <version> + 1
    /// WHERE <key> AND <version> = <expected_version>`, unexecuted.
    fn update_statement<C>(
        key: Self::Key,
        expected_version: Self::Version,
        changes: C,
    ) -> UpdateVersioned<Self, BySql<C>>
    where
        Self: VersionCheck,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
    {
        update::<Self, _>(key, expected_version, BySql(changes))
    }

    /// The unexecuted statement of [`delete_versioned`](Self::delete_versioned).
    fn delete_versioned_statement(&self) -> DeleteVersioned<Self>
    where
        Self: VersionCheck,
    {
        delete::<Self>(self.key(), self.version())
    }

    /// The unexecuted statement of [`touch_versioned`](Self::touch_versioned).
    fn touch_versioned_statement(&self) -> TouchVersioned<Self>
    where
        Self: VersionCheck,
    {
        touch::<Self>(self.key(), self.version())
    }
}

// The bound traits of the writes above: each names `Versioned` (as its
// supertrait) and the writes name them (in `where` clauses), so they are
// declared here, with the model trait. `version_check` implements them for
// every model and connection that fit.

type TableOf<M> = <M as Lockable>::Table;
type WhereOf<M> = <<M as VersionCheck>::Target as IntoUpdateTarget>::WhereClause;
type BumpOf<M> = <M as VersionCheck>::Bump;

/// `UPDATE ... SET <changes>, <version> = <version> + 1 WHERE <key> AND <version> = $`,
/// cached as `S` says ([`ByType`] or [`BySql`]).
pub type UpdateVersioned<M, S> = VersionedUpdate<
    TableOf<M>,
    WhereOf<M>,
    <(S, BumpOf<M>) as AsChangeset>::Changeset,
    (S, BumpOf<M>),
>;
/// `UPDATE ... SET <version> = <version> + 1 WHERE <key> AND <version> = $`.
pub type TouchVersioned<M> = VersionedUpdate<
    TableOf<M>,
    WhereOf<M>,
    <BumpOf<M> as AsChangeset>::Changeset,
    ByType<BumpOf<M>>,
>;
/// `DELETE FROM ... WHERE <key> AND <version> = $`.
pub type DeleteVersioned<M> = dsl::delete<<M as VersionCheck>::Target>;

/// The SQL fragments of a version check, for any [`Versioned`] model.
///
/// Blanket-implemented; it exists so that the bounds Diesel needs to build these
/// fragments are written once, on its implementation
/// ([`version_check`](crate::optimistic::version_check)), instead of on every
/// method. Name it only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no version check: its table, key and version column do not fit together",
    label = "lockkit cannot build `WHERE <key> = $1 AND <version> = $2` for this model",
    note = "the key must be what `table.find(..)` takes and the version a `SmallInt`, `Integer` or `BigInt` column of the same table; `#[derive(Versioned)]` reads both from `#[diesel(..)]`"
)]
pub trait VersionCheck: Versioned {
    /// `table.find(key).filter(version.eq(expected))`.
    type Target: IntoUpdateTarget<Table = Self::Table>;
    /// `version.eq(version + 1)`, and the model's [`Versioned::UpdatedAt`].
    type Bump: AsChangeset<Target = Self::Table>;
    /// `table.find(key).select(version)`.
    type CurrentVersion;

    /// The row at `key` if, and only if, it still has `expected`.
    fn target(key: Self::Key, expected: Self::Version) -> Self::Target;
    /// The version increment.
    fn bump() -> Self::Bump;
    /// The follow-up read of the current version.
    fn current_version(key: Self::Key) -> Self::CurrentVersion;
}

/// What a versioned write needs from the connection besides the statement: the
/// reads and the one extra write of its failure path, and the key check.
///
/// Implemented for every model on `PgConnection`, `MysqlConnection`,
/// `SqliteConnection`, r2d2 pooled connections to them, and
/// [`Dispatch`](crate::multi::Dispatch) enums over them; it exists so that
/// these bounds are written once, on its implementations
/// ([`version_check`](crate::optimistic::version_check)). Name it only in
/// `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's versioned writes on `{Self}` do not run on `{Conn}`",
    label = "not a connection lockkit's versioned writes support",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums that implement `lockkit::multi::Dispatch`"
)]
pub trait CurrentVersionQuery<Conn>: VersionCheck {
    /// `Some(version)`, or `None` when the row is gone: the latest committed state.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_current_version(
        conn: &mut Conn,
        key: Self::Key,
    ) -> diesel::QueryResult<Option<Self::Version>>;

    /// What the connection already knows of [`key_is_unique`](Self::key_is_unique)'s
    /// answer, without asking: `None` before its first check of the table;
    /// `Some(false)` on a connection that keeps no answer (instrumentation of
    /// its own), whose writes all go in a savepoint.
    fn known_key_is_unique(conn: &mut Conn) -> Option<bool>;

    /// `UPDATE .. SET <version> = <version> + 1 WHERE <key> AND <version> = $version`:
    /// moves the row past a version that a rolled-back struct may still hold.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn bump_past(
        conn: &mut Conn,
        key: Self::Key,
        version: Self::Version,
    ) -> diesel::QueryResult<usize>;

    /// Whether the database enforces the declared key (a unique index on key
    /// columns only), so that it can never match two rows.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn key_is_unique(conn: &mut Conn) -> diesel::QueryResult<bool>;

    /// The row's identity for the [`journal`]: database, table and
    /// key; `None` when the journal needs none (nothing recorded, no transaction).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn row_id(conn: &mut Conn, key: &Self::Key) -> diesel::QueryResult<Option<String>>;

    /// The table as the database names it, for a stale report
    /// ([`StaleObjectError::database_table`](crate::StaleObjectError::database_table)).
    #[doc(hidden)]
    fn database_table(conn: &mut Conn) -> &'static str;

    /// Marks a write made in a transaction on a connection the [`journal`]
    /// cannot watch, in that transaction
    /// ([`OptimisticBackend::mark`](crate::optimistic::backend::OptimisticBackend::mark)).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    #[doc(hidden)]
    fn mark(conn: &mut Conn, mark: Mark) -> diesel::QueryResult<()>;

    /// Whether the mark `mark` stands on `conn`
    /// ([`OptimisticBackend::mark_stands`](crate::optimistic::backend::OptimisticBackend::mark_stands)).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    #[doc(hidden)]
    fn mark_stands(conn: &mut Conn, mark: Mark) -> diesel::QueryResult<bool>;

    /// How a failed statement leaves the open transaction on `conn`'s backend,
    /// for the [`journal`] (an enum's: the connection it holds), so that a
    /// write that installs it inside the caller's transaction knows what it
    /// may have missed there.
    #[doc(hidden)]
    fn ends(conn: &mut Conn) -> journal::Ends;

    /// The move past of a stale write ([`bump_past`](Self::bump_past) of `key`
    /// from `version`, the row named `row` for the [`journal`]) as the journal
    /// keeps it, to be made again outside any transaction once the one that
    /// made it rolled back ([`move_past_again`]).
    #[doc(hidden)]
    fn move_past_again(
        key: Self::Key,
        row: Option<String>,
        version: Self::Version,
    ) -> journal::AnyRedo;

    /// After a transaction of lockkit's own on `conn` rolled back outside any
    /// other: sends again the moves past that [`move_past_again`](Self::move_past_again)
    /// kept, on the connection whose type they were kept for (a pooled
    /// `MultiConnection` enum's: the enum inside).
    #[doc(hidden)]
    fn redo_after_own_rollback(conn: &mut Conn);
}

/// A move past that a stale write made inside a transaction, as the
/// [`Redo`](journal::Redo) the journal keeps for the connection type `C`:
/// `again` (a [`move_past`] for the model) on `key`, `row` and `version`. The
/// transaction's rollback (which a stale write usually brings) undoes the move;
/// without it made again, every reader of the row's number in a retried
/// transaction would find that number again and be stale, attempt after attempt.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn move_past_again<C, K, V>(
    again: fn(&mut C, K, Option<String>, V),
    key: K,
    row: Option<String>,
    version: V,
) -> journal::AnyRedo
where
    C: 'static,
    K: Send + 'static,
    V: Send + 'static,
{
    let redo: journal::Redo<C> = Box::new(move |conn: &mut C| again(conn, key, row, version));
    Box::new(redo)
}

/// Outside a transaction: moves the row `key` (`row` for the journal) past
/// `version`, a number a rolled-back write left with some struct, if it is
/// still there, and on past the numbers other rolled-back writes left; then
/// the journal forgets the numbers up to `version`, which no row can hold
/// again. Best effort: a failure leaves holders of `version` stale, as they were.
/// The moves are committed on their own, or where the session refuses writes
/// outside lockkit's transactions, in one of their own ([`committed_alone`]).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn move_past<M, Conn>(
    conn: &mut Conn,
    key: M::Key,
    row: Option<String>,
    version: M::Version,
) where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
{
    let moves = |conn: &mut Conn| {
        let bumped = M::bump_past(conn, key.clone(), version)?;
        if bumped == 1 {
            if let Ok(next) = checked_next::<M>(&key, version) {
                if !undone_move_only::<M, _>(conn, row.as_deref(), version, next) {
                    let _ = move_past_reused::<M, _>(conn, &key, row.as_deref(), next);
                }
            }
        }
        Ok(bumped)
    };
    match committed_alone(conn, moves) {
        Ok((1, false)) => {}
        // Sent again in a transaction of its own: a server that ended it
        // silently after the savepoint's release answers the `COMMIT` too;
        // the row past `version` is what lets the journal forget it.
        Ok((1, true)) => match M::load_current_version(conn, key.clone()) {
            Ok(Some(now)) if now.to_i64() > version.to_i64() => {}
            _ => return,
        },
        _ => return,
    }
    if let Some(row) = &row {
        let column = <M as sequence::Model>::VERSION_COLUMN;
        rollbacks::forget_through(column, row, version.to_i64());
        if let Ok(next) = checked_next::<M>(&key, version) {
            rollbacks::moved_again(column, row, version.to_i64(), next.to_i64());
        }
    }
}

/// Whether the row `row`, moved again from `version` to `next` by a redo,
/// holds `next` where only the undone move it redoes left that number
/// ([`rollbacks::only_an_undone_move`]): then it stays there. Blocking and
/// async.
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite",
        feature = "async"
    )),
    allow(dead_code)
)]
pub(crate) fn undone_move_only<M: sequence::Model, W: journal::Watched>(
    conn: &mut W,
    row: Option<&str>,
    version: M::Version,
    next: M::Version,
) -> bool {
    row.is_some_and(|row| {
        let (from, to) = (version.to_i64(), next.to_i64());
        rollbacks::only_an_undone_move(conn, M::VERSION_COLUMN, row, from, to)
    })
}

/// `write`, outside any transaction, committed on its own: in autocommit, or,
/// where MySQL/MariaDB refuses it there as a write in a read-only transaction
/// (a session made read-only outside lockkit's transactions; README,
/// "Galera"), again in a read-write transaction of its own
/// ([`MYSQL_BEGIN_ALONE`] ... `RELEASE SAVEPOINT` ... `COMMIT`, sent past
/// Diesel's books, which count none): then `true` with the count. Its result
/// stands only once the savepoint was still there (a transaction the server
/// ended silently took it) and the `COMMIT` succeeded; a caller that acts on
/// `Ok` (the journal forgetting a number) checks the row too, since a server
/// that ends a transaction silently answers its `COMMIT` as well. Where the
/// transaction's statements fail to begin or end it, Diesel's transaction
/// manager is marked broken, so that a pool closes the connection rather than
/// hand on a transaction left open.
///
/// [`MYSQL_BEGIN_ALONE`]: crate::transaction::MYSQL_BEGIN_ALONE
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn committed_alone<Conn: Connection>(
    conn: &mut Conn,
    write: impl Fn(&mut Conn) -> diesel::QueryResult<usize>,
) -> diesel::QueryResult<(usize, bool)> {
    let first = write(conn);
    #[cfg(feature = "mysql")]
    if let Err(diesel::result::Error::DatabaseError(_, info)) = &first {
        if crate::error::classification::is_mysql_read_only_refusal(info.message())
            && !crate::transaction::in_transaction(conn)
        {
            use crate::transaction::{MYSQL_BEGIN_ALONE, MYSQL_END_ALONE};
            use diesel::connection::TransactionManager;
            let again = conn
                .batch_execute(MYSQL_BEGIN_ALONE)
                .and_then(|()| write(conn))
                .and_then(|n| conn.batch_execute(MYSQL_END_ALONE).map(|()| n));
            let end = conn.batch_execute(if again.is_ok() { "COMMIT" } else { "ROLLBACK" });
            if end.is_err() {
                Conn::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
            }
            return end.and(again).map(|n| (n, true));
        }
    }
    first.map(|n| (n, false))
}

/// After [`Versioned::update_if`] moved the row `key` to a number lockkit did
/// not read: inside a transaction its journal watches, which may roll back,
/// the number is read (under the row lock the write holds), moved past while
/// a rolled-back write left it with a struct (rule 4 of the [`journal`]), and
/// recorded, so that a struct read after the write in the transaction is
/// refused once the transaction rolled back. Outside one the write committed,
/// and nothing is sent.
fn moved_by_update_if<M, Conn>(conn: &mut Conn, key: &M::Key) -> Result<(), Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
{
    if !rollbacks::in_watched_transaction(conn) {
        return Ok(());
    }
    let Some(row) = M::row_id(conn, key).map_err(classify)? else {
        return Ok(());
    };
    rollbacks::moved_unnumbered(conn, <M as sequence::Model>::VERSION_COLUMN, &row);
    // lockkit's own statements, whose answers it sees.
    let Some(moved) =
        journal::own(conn, |conn| M::load_current_version(conn, key.clone())).map_err(classify)?
    else {
        return Ok(());
    };
    let at = journal::own(conn, |conn| {
        move_past_reused::<M, _>(conn, key, Some(&row), moved)
    })?;
    let from = moved.to_i64().saturating_sub(1);
    rollbacks::written(
        conn,
        <M as sequence::Model>::VERSION_COLUMN,
        Some(&row),
        from,
        Some(at.to_i64()),
    );
    Ok(())
}

/// A versioned delete of the row `key`, expecting `expected` from `origin`: a
/// struct's (`delete_versioned`) or one from outside (`delete_by_version`).
fn delete_from<M, Conn>(
    conn: &mut Conn,
    key: M::Key,
    expected: M::Version,
    origin: Origin,
) -> Result<(), Error>
where
    Conn: Connection,
    M: VersionCheck + CurrentVersionQuery<Conn>,
    DeleteVersioned<M>: ExecuteDsl<Conn>,
{
    let statement = |checked| delete::<M>(key.clone(), checked);
    write::<M, _, _>(conn, &key, expected, origin, Operation::Delete, statement)?
        .version()
        .map(drop)
}

/// The order `update_all_by_version` writes `rows` in: by key, so that two bulk
/// updates of overlapping rows cannot deadlock; a key named twice is refused.
pub(crate) fn key_order<M: Lockable, V>(rows: &[(M::Key, V)]) -> Result<Vec<usize>, Error>
where
    M::Key: Ord,
{
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[a].0.cmp(&rows[b].0));
    if let Some(twice) = order.windows(2).find(|w| rows[w[0]].0 == rows[w[1]].0) {
        return Err(Error::DuplicateKey {
            table: M::TABLE_NAME,
            key: format!("{:?}", rows[twice[0]].0),
        });
    }
    Ok(order)
}

/// The end of `update_all_by_version`: every new version, in input order, or
/// every stale row.
pub(crate) fn all_or_none<V>(
    versions: Vec<Option<V>>,
    stale: Vec<crate::error::StaleObjectError>,
) -> Result<Vec<V>, Error> {
    if stale.is_empty() {
        Ok(versions.into_iter().flatten().collect())
    } else {
        Err(Error::StaleRows(stale))
    }
}

/// Applies a write's outcome to the model: the new version, or the stale report.
pub(crate) fn settle<M: Versioned>(
    model: &mut M,
    written: Written<M::Version>,
) -> Result<(), Error> {
    if let Some(next) = written.version()? {
        model.set_version(next);
    }
    Ok(())
}

/// One versioned write of the row `model` holds, checking the version it holds
/// (from `origin`) with the statement `statement` builds for the key and the
/// version to check; the version the write left is kept in `model`.
pub(crate) fn write_held<M, Conn, S>(
    model: &mut M,
    conn: &mut Conn,
    origin: Origin,
    operation: Operation,
    statement: impl FnOnce(M::Key, M::Version) -> S,
) -> Result<(), Error>
where
    Conn: Connection,
    M: CurrentVersionQuery<Conn>,
    S: ExecuteDsl<Conn>,
{
    let key = model.key();
    let expected = model.version();
    let build = |checked| statement(key.clone(), checked);
    let written = write::<M, _, _>(conn, &key, expected, origin, operation, build)?;
    settle(model, written)
}

/// [`Versioned::update_versioned`] of `model`, whose version came from `origin`:
/// a struct the caller held, or the row read under its lock. (The trait's
/// method writes the same inline: through its higher-ranked bounds a generic
/// caller cannot show this function's, which a concrete connection can.)
pub(crate) fn update_from<M, Conn>(
    model: &mut M,
    conn: &mut Conn,
    origin: Origin,
) -> Result<(), Error>
where
    Conn: Connection,
    M: Versioned + VersionCheck + CurrentVersionQuery<Conn>,
    for<'a> UpdateVersioned<M, M::Changeset<'a>>: ExecuteDsl<Conn>,
    for<'a> (M::Changeset<'a>, M::Bump): AsChangeset<Target = M::Table>,
{
    let written = write::<M, _, _>(
        conn,
        &model.key(),
        model.version(),
        origin,
        Operation::Update,
        |checked| update::<M, _>(model.key(), checked, model.versioned_changeset()),
    )?;
    settle(model, written)
}

/// [`Lockable::OnLock`] of a [`Versioned`] model: an exclusive
/// lock advances the version.
#[derive(Debug, Clone, Copy)]
pub struct BumpVersion;

// The run of a versioned write on a blocking connection: the statements, and
// the driver of the one sequence (`optimistic::sequence`) every versioned
// write goes through.

/// The statement that applies `changes` (and the version bump) to the row `key`
/// if it still has `expected`.
pub(crate) fn update<M, S>(key: M::Key, expected: M::Version, changes: S) -> UpdateVersioned<M, S>
where
    M: VersionCheck,
    (S, M::Bump): AsChangeset<Target = M::Table>,
{
    VersionedUpdate::new(
        M::target(key, expected).into_update_target(),
        (changes, M::bump()),
    )
}

/// The statement that bumps the version of the row `key` if it still has `expected`.
pub(crate) fn touch<M: VersionCheck>(key: M::Key, expected: M::Version) -> TouchVersioned<M> {
    VersionedUpdate::new(M::target(key, expected).into_update_target(), M::bump())
}

/// The statement that deletes the row `key` if it still has `expected`.
pub(crate) fn delete<M: VersionCheck>(key: M::Key, expected: M::Version) -> DeleteVersioned<M> {
    diesel::delete(M::target(key, expected))
}

/// The version a write that left the row at `next` ends with: while `next` is
/// a number a rolled-back write left with a struct ([`rollbacks::reused`]),
/// the row is moved one further (`bump_past`), in the writer's transaction.
pub(crate) fn move_past_reused<M, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    row_id: Option<&str>,
    mut next: M::Version,
) -> Result<M::Version, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
{
    while rollbacks::reused(
        conn,
        <M as sequence::Model>::VERSION_COLUMN,
        row_id,
        next.to_i64(),
    ) {
        let after = match checked_next::<M>(key, next) {
            Ok(after) => after,
            // No number past the type's maximum. Outside a transaction the
            // write committed it: it stands there, and the struct holding the
            // rolled-back maximum is refused all the same (its write finds the
            // row at its own number, with none to move past it to).
            Err(_) if journal::Watched::depth(conn).is_none() => break,
            // In a transaction, refused before it commits: recorded, the
            // write would take the place of the rolled-back maximum's record.
            Err(overflow) => return Err(overflow),
        };
        if M::bump_past(conn, key.clone(), next).map_err(classify)? != 1 {
            break;
        }
        next = after;
    }
    Ok(next)
}

/// Runs one versioned write, expecting the version `expected` from `origin`:
/// drives the sequence (`optimistic::sequence`) on `conn`.
///
/// `statement` builds the statement for the version to check (usually
/// `expected`; see [`journal`]).
///
/// Any statement of the sequence may end the caller's transaction (on
/// MySQL/MariaDB, the victim of a deadlock: the follow-up read under `LOCK IN
/// SHARE MODE` or a move past as well as the write), so the call's error is
/// decided as a failed write's, once
/// ([`failed_write`](crate::transaction::failed_write)).
pub(crate) fn write<M, S, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    expected: M::Version,
    origin: Origin,
    operation: Operation,
    statement: impl FnOnce(M::Version) -> S,
) -> Result<Written<M::Version>, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    let sequence = |conn: &mut Conn| -> Result<Written<M::Version>, Error> {
        // First: at a connection's first write to the table, the key check
        // also names the schema the row id needs.
        let unique = M::key_is_unique(conn).map_err(classify)?;
        let row = M::row_id(conn, key).map_err(classify)?;
        if let Some(mark) = Write::<M>::unconfirmed(conn, row.as_deref(), expected, origin) {
            let stands = M::mark_stands(conn, mark).map_err(classify)?;
            Write::<M>::confirmed(conn, row.as_deref(), mark, stands);
        }
        let write = Write::<M>::start(conn, key, row.as_deref(), expected, origin, operation)?;
        let rows = match write.statement() {
            Some(checked) => execute_once::<M, _, _>(conn, key, Some(unique), statement(checked))?,
            None => 0,
        };
        let mut step = write.wrote(conn, rows);
        loop {
            step = match step {
                Step::ReadCurrent(then) => {
                    let read = M::load_current_version(conn, key.clone());
                    then.read(conn, read)?
                }
                Step::MovePast(version, then) => {
                    let bumped = M::bump_past(conn, key.clone(), version).map_err(classify)?;
                    if bumped == 1 {
                        let again = M::move_past_again(key.clone(), row.clone(), version);
                        journal::redo_after_rollback(conn, again);
                    }
                    then.moved(conn, bumped)
                }
                Step::MovePastReused(version, then) => {
                    let at = move_past_reused::<M, _>(conn, key, then.id(), version)?;
                    then.moved(conn, at)
                }
                Step::Mark(mark, written) => {
                    M::mark(conn, mark).map_err(classify)?;
                    Step::Done(written)
                }
                Step::Done(written) => return Ok(written.named(|| M::database_table(conn))),
            };
        }
    };
    // The rule of the backend inside a `MultiConnection` enum, which its
    // backend type does not name.
    let ends = M::ends(conn);
    journal::watch(conn, |_| ends);
    crate::transaction::check_write(conn)?;
    // lockkit sees every answer of the sequence (SQLite's journal).
    journal::own(conn, sequence).map_err(|err| crate::transaction::failed_write(conn, err, ends))
}

/// Executes a versioned statement; where the database does not enforce the
/// key (`unique`: `Some(false)`), in a savepoint that is undone if it matched
/// more than one row. Not known yet (`None`): in the savepoint too, and the
/// key check ([`CurrentVersionQuery::key_is_unique`]) asked in it after the
/// statement, so that its failure undoes the write.
fn execute_once<M, S, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    unique: Option<bool>,
    statement: S,
) -> Result<usize, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    if unique == Some(true) {
        return ExecuteDsl::execute(statement, conn).map_err(classify);
    }
    // In the caller's transaction, a savepoint. A deadlock's victim on
    // MySQL/MariaDB takes the savepoint with the whole transaction; Diesel,
    // which marks its transaction manager on that error (1213), lets the failed
    // `ROLLBACK TO SAVEPOINT` go and hands back the statement's error, which
    // `write` decides as without a savepoint. SQLite's rollback of the whole
    // transaction under the statement (a trigger's `RAISE(ROLLBACK)`) leaves
    // the statement's error too (`transaction::level`).
    crate::transaction::diesel_level(conn, |conn| {
        let rows = at_most_one::<M>(key, ExecuteDsl::execute(statement, conn).map_err(classify)?)?;
        if unique.is_none() {
            M::key_is_unique(conn).map_err(classify)?;
        }
        Ok(rows)
    })
}

/// Every versioned model is what the sequence knows of one, so that
/// `sequence.rs` needs none of the model traits.
impl<M: Versioned> sequence::Model for M {
    const TABLE_NAME: &'static str = <M as Lockable>::TABLE_NAME;
    const VERSION_COLUMN: &'static str = <M::VersionColumn as Column>::NAME;
    type Key = <M as Lockable>::Key;
    type Version = <M as Versioned>::Version;
}
