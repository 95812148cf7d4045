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

use diesel::query_builder::{AsChangeset, AsQuery};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{Column, Connection};

use crate::version::VersionNumber;
use crate::version_check::{
    self, CurrentVersionQuery, DeleteVersioned, TouchVersioned, UpdateVersioned, VersionCheck,
};
use crate::{Error, Lockable, Operation};

/// A Diesel model with a version column. Implement it with `#[derive(Versioned)]`.
///
/// The trait only *describes* the model (version column and type, and the fields
/// to write; table and key come from [`Lockable`]); the version-checked writes are
/// provided methods, generic over every backend.
pub trait Versioned: Lockable {
    /// The version column (`items::lock_version`).
    type VersionColumn: Column<Table = Self::Table> + Default;
    /// The version's Rust type: `i16`, `i32` or `i64`.
    type Version: VersionNumber;
    /// The columns `update_versioned` writes: every field but the primary key and
    /// the version, following Diesel's `AsChangeset` rules (`column_name`,
    /// `skip_update`, `treat_none_as_null`).
    type Changeset<'a>: AsChangeset<Target = Self::Table>
    where
        Self: 'a;

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
    fn update_versioned<Conn>(&mut self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        for<'a> UpdateVersioned<Self, Self::Changeset<'a>>: ExecuteDsl<Conn>,
        for<'a> (Self::Changeset<'a>, Self::Bump): AsChangeset<Target = Self::Table>,
        for<'a> UpdateVersioned<Self, Self::Changeset<'a>>: AsQuery,
    {
        let next = version_check::next_version(self)?;
        let statement = self.update_versioned_statement();
        version_check::execute::<Self, _, _>(
            statement,
            conn,
            || self.key(),
            self.version(),
            Operation::Update,
        )?;
        self.set_version(next);
        Ok(())
    }

    /// Like [`update_versioned`](Self::update_versioned), with your own changeset
    /// instead of the model's fields, e.g. `items::stock.eq(items::stock - 1)`.
    /// Only the version is refreshed in memory; re-read the row if you need the rest.
    fn update_versioned_with<Conn, C>(&mut self, conn: &mut Conn, changes: C) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        (C, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, C>: AsQuery + ExecuteDsl<Conn>,
    {
        let next = version_check::next_version(self)?;
        let statement = Self::update_statement(self.key(), self.version(), changes);
        version_check::execute::<Self, _, _>(
            statement,
            conn,
            || self.key(),
            self.version(),
            Operation::Update,
        )?;
        self.set_version(next);
        Ok(())
    }

    /// Deletes the row if it still has the version this struct was read at.
    fn delete_versioned<Conn>(&self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        DeleteVersioned<Self>: ExecuteDsl<Conn>,
    {
        version_check::execute::<Self, _, _>(
            self.delete_versioned_statement(),
            conn,
            || self.key(),
            self.version(),
            Operation::Delete,
        )
    }

    /// Deletes the row `key` if its version is still `expected_version`, without
    /// loading it first (e.g. `DELETE` with `If-Match`).
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
        let statement = diesel::delete(Self::target(key.clone(), expected_version));
        version_check::execute::<Self, _, _>(
            statement,
            conn,
            || key,
            expected_version,
            Operation::Delete,
        )
    }

    /// Bumps the version only (JPA's `OPTIMISTIC_FORCE_INCREMENT`): marks the row
    /// as changed, e.g. when a child row changed, so concurrent editors of the parent
    /// become stale.
    fn touch_versioned<Conn>(&mut self, conn: &mut Conn) -> Result<(), Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        TouchVersioned<Self>: AsQuery + ExecuteDsl<Conn>,
    {
        let next = version_check::next_version(self)?;
        version_check::execute::<Self, _, _>(
            self.touch_versioned_statement(),
            conn,
            || self.key(),
            self.version(),
            Operation::Touch,
        )?;
        self.set_version(next);
        Ok(())
    }

    /// Applies `changes` to the row `key` if its version is still
    /// `expected_version`, without loading it first: for a version that arrives from
    /// outside (a form's hidden field, an `If-Match` header). Returns the new version.
    fn update_by_version<Conn, C>(
        conn: &mut Conn,
        key: Self::Key,
        expected_version: Self::Version,
        changes: C,
    ) -> Result<Self::Version, Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        (C, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, C>: AsQuery + ExecuteDsl<Conn>,
    {
        let next = version_check::checked_next::<Self>(&key, expected_version)?;
        let statement = Self::update_statement(key.clone(), expected_version, changes);
        version_check::execute::<Self, _, _>(
            statement,
            conn,
            || key,
            expected_version,
            Operation::Update,
        )?;
        Ok(next)
    }

    /// Applies one changeset to many rows, each checked against its own expected
    /// version, in one transaction: either every row matches and every version
    /// advances, or nothing is written and [`Error::StaleRows`] lists **every**
    /// stale key (not just the first). Returns the new versions, in input order.
    ///
    /// One `UPDATE` per row (each is the statement of
    /// [`update_by_version`](Self::update_by_version)), inside a transaction (a
    /// savepoint when one is already open).
    fn update_all_by_version<Conn, C>(
        conn: &mut Conn,
        rows: &[(Self::Key, Self::Version)],
        changes: C,
    ) -> Result<Vec<Self::Version>, Error>
    where
        Conn: Connection,
        Self: VersionCheck + CurrentVersionQuery<Conn>,
        C: Clone,
        (C, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, C>: AsQuery + ExecuteDsl<Conn>,
    {
        conn.transaction(|conn| {
            let mut versions = Vec::with_capacity(rows.len());
            let mut stale = Vec::new();
            for (key, expected) in rows {
                let next = version_check::checked_next::<Self>(key, *expected)?;
                let statement = Self::update_statement(key.clone(), *expected, changes.clone());
                match version_check::try_execute::<Self, _, _>(
                    statement,
                    conn,
                    || key.clone(),
                    *expected,
                    Operation::Update,
                )? {
                    None => versions.push(next),
                    Some(report) => stale.push(report),
                }
            }
            if stale.is_empty() {
                Ok(versions)
            } else {
                Err(Error::StaleRows(stale))
            }
        })
    }

    /// The unexecuted statement of [`update_versioned`](Self::update_versioned), for
    /// `diesel::debug_query`.
    fn update_versioned_statement<'a>(&'a self) -> UpdateVersioned<Self, Self::Changeset<'a>>
    where
        Self: VersionCheck,
        (Self::Changeset<'a>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, Self::Changeset<'a>>: AsQuery,
    {
        Self::update_statement(self.key(), self.version(), self.versioned_changeset())
    }

    /// The statement `UPDATE <table> SET <changes>, <version> = <version> + 1
    /// WHERE <key> AND <version> = <expected_version>`, unexecuted.
    fn update_statement<C>(
        key: Self::Key,
        expected_version: Self::Version,
        changes: C,
    ) -> UpdateVersioned<Self, C>
    where
        Self: VersionCheck,
        (C, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, C>: AsQuery,
    {
        diesel::update(Self::target(key, expected_version)).set((changes, Self::bump()))
    }

    /// The unexecuted statement of [`delete_versioned`](Self::delete_versioned).
    fn delete_versioned_statement(&self) -> DeleteVersioned<Self>
    where
        Self: VersionCheck,
    {
        diesel::delete(Self::target(self.key(), self.version()))
    }

    /// The unexecuted statement of [`touch_versioned`](Self::touch_versioned).
    fn touch_versioned_statement(&self) -> TouchVersioned<Self>
    where
        Self: VersionCheck,
        TouchVersioned<Self>: AsQuery,
    {
        diesel::update(Self::target(self.key(), self.version())).set(Self::bump())
    }
}
