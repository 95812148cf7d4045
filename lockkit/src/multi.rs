//! Choosing the backend at run time: lockkit on a `#[derive(diesel::MultiConnection)]`
//! enum.
//!
//! Diesel's `MultiConnection` derive makes one connection type out of several
//! (`AnyConnection::Pg(PgConnection)`, `AnyConnection::Sqlite(SqliteConnection)`):
//! the application is written once, against `AnyConnection`, and the URL decides
//! the backend. lockkit's statements differ per backend (`FOR UPDATE`, lock
//! timeouts, `BEGIN IMMEDIATE`, `LOCK IN SHARE MODE`, `= ANY($1)`), and the
//! derived backend cannot express them, so lockkit sends each of its own
//! statements to the connection inside the enum. It needs one `match` from you,
//! [`Dispatch::dispatch`]:
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//! use lockkit::multi::{BackendConn, Dispatch};
//!
//! #[derive(diesel::MultiConnection)]
//! pub enum AnyConnection {
//!     Sqlite(SqliteConnection),
//!     // Pg(PgConnection), Mysql(MysqlConnection), .. with lockkit's features
//! }
//!
//! impl Dispatch for AnyConnection {
//!     fn dispatch(&mut self) -> BackendConn<'_> {
//!         match self {
//!             AnyConnection::Sqlite(conn) => BackendConn::Sqlite(conn),
//!         }
//!     }
//! }
//!
//! diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
//!
//! #[derive(Queryable, Selectable, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
//!
//! // One function, no generics: the closure gets your `AnyConnection`.
//! fn sell(conn: &mut AnyConnection, id: i32, qty: i32) -> Result<i32, lockkit::Error> {
//!     lockkit::with_lock(conn, id, lockkit::LockOptions::default(), |conn, item: Item| {
//!         diesel::update(items::table.find(item.id))
//!             .set(items::stock.eq(item.stock - qty))
//!             .execute(conn)?;
//!         Ok(item.stock - qty)
//!     })
//! }
//!
//! # fn main() -> Result<(), lockkit::Error> {
//! let mut conn = AnyConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn)?;
//! assert_eq!(sell(&mut conn, 1, 3)?, 7);
//! let mut item = items::table.find(1).select(Item::as_select()).first(&mut conn)?;
//! item.stock += 1;
//! item.update_versioned(&mut conn)?; // checks and bumps the version, as on SqliteConnection
//! assert_eq!(item.lock_version, 2); // with_lock advanced it once, this write once more
//! # Ok(()) }
//! ```
//!
//! With that `impl`, the enum (and an r2d2 pooled connection to it) takes every
//! call a plain connection takes, except PostgreSQL's
//! [`advisory::xact_lock`](crate::advisory::xact_lock) and
//! [`try_xact_lock`](crate::advisory::try_xact_lock): in the enum's
//! transaction on PostgreSQL, [`advisory::lock`](crate::advisory::lock)
//! already takes the transaction lock that `xact_lock` takes (or call them on
//! the connection that `dispatch` returns). What the others do through the
//! enum:
//!
//! | call | through the enum |
//! | --- | --- |
//! | [`Versioned`](crate::Versioned)'s writes, [`atomic`](crate::atomic), [`compare_and_set`](crate::compare_and_set::CompareAndSet::compare_and_set) | the statement runs through the enum (Diesel's own multi-backend SQL); lockkit's follow-up reads (`compare_and_set`'s after a refused write, with the backend's locking read) go to the inner connection |
//! | adaptive writes: [`AdaptivePolicy::update`](crate::adaptive::AdaptivePolicy::update), [`update_adaptive`](crate::adaptive::UpdateAdaptive::update_adaptive) | the plain and the locked reads and the lock's transaction go to the inner connection, the versioned write through the enum, as above; `change` sees no connection |
//! | [`advisory::lock`](crate::advisory::lock), [`try_lock`](crate::advisory::try_lock) | the lock statements go to the inner connection; the guard derefs to the enum, and its scope is decided by the enum's transaction, as on the plain connection. An enum holding SQLite, which has no advisory locks, refuses with [`Error::Unsupported`] and sends nothing |
//! | [`lock_waits`](crate::lock_waits): `session_id`, `blocked_sessions`, `current` | the server of the inner connection is asked; an enum holding SQLite refuses with [`Error::Unsupported`] and sends nothing |
//! | [`with_lock`](crate::with_lock), [`locked_transaction`](crate::locked_transaction), [`Lockable::lock_all`], [`queue::claim`](crate::queue::claim), [`serializable`](crate::serializable), [`transaction_with_retry`](crate::transaction_with_retry) | lockkit's statements (`BEGIN IMMEDIATE`, timeouts, the locked reads) go to the inner connection; your closure gets the enum |
//! | `outbox` (feature `outbox`): `enqueue`, `Relay`, `Inbox` | the outbox's and the inbox's statements go to the inner connection, in the enum's transaction; the inbox's closure gets the enum |
//! | `idempotency` (feature `idempotency`): `Idempotency::run`, `purge_expired` | the key's statements go to the inner connection, in the enum's transaction (the key's insert in a savepoint of it); the work's closure gets the enum |
//! | `lease` (feature `lease`): `acquire`, `with_lease`, `renew`, `release` on the database store; `fenced` | the lease's and the fence's statements go to the inner connection; `acquire` and `renew` refuse inside the enum's transaction, as on the plain connection; `fenced`'s closure gets the enum. For a pooled enum, pass `&mut *pooled` to `acquire`, as for a pooled plain connection |
//!
//! Every transaction is the inner connection's own: the enum's transaction
//! manager is the inner one's, so your Diesel calls inside a closure run in
//! lockkit's transaction, nested calls use savepoints, and the rollback
//! [`journal`] sees what it sees on the plain connection.
//! lockkit's own statements are those `docs/SQL.md` lists for the backend inside;
//! a versioned `UPDATE` or `DELETE` goes through the enum, which Diesel renders
//! with that backend's query builder. One exception: `with_lock` on a
//! `Versioned` model locks the row and advances its version in two statements
//! (`SELECT .. FOR UPDATE`, then the version's `UPDATE`) where the plain
//! PostgreSQL connection sends one.
//!
//! A query given to [`queue::claim`](crate::queue::claim) runs on the inner
//! connection, so it must load on every backend: select columns (or nothing, for
//! the table's columns) rather than `Model::as_select()`, which names one
//! backend. (Your own statements that the enum cannot express, such as
//! `RETURNING` with MySQL among its backends, run on the inner connection too:
//! match on your enum, as the `http_api` example does.)

use diesel::query_builder::{AsChangeset, IntoUpdateTarget, QueryFragment, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, LockingDsl};
#[cfg(feature = "r2d2")]
use diesel::r2d2::R2D2Connection;
#[cfg(feature = "mysql")]
use diesel::MysqlConnection;
#[cfg(feature = "postgres")]
use diesel::PgConnection;
#[cfg(feature = "sqlite")]
use diesel::SqliteConnection;
use diesel::{QueryResult, QuerySource};

/// The connection inside a multi-connection enum, as [`Dispatch::dispatch`]
/// hands it to lockkit: one variant per backend feature of lockkit.
#[allow(missing_debug_implementations)] // Diesel's connections have no `Debug`
pub enum BackendConn<'a> {
    /// A PostgreSQL connection.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Pg(&'a mut PgConnection),
    /// A MySQL / MariaDB connection.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    Mysql(&'a mut MysqlConnection),
    /// A SQLite connection.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(&'a mut SqliteConnection),
}

/// A `#[derive(diesel::MultiConnection)]` enum that tells lockkit which
/// connection it holds. Implement it with one `match` (see the [module
/// docs](self)); lockkit then takes the enum wherever it takes a
/// `PgConnection`, `MysqlConnection` or `SqliteConnection`.
#[diagnostic::on_unimplemented(
    message = "lockkit cannot tell which backend `{Self}` holds",
    label = "`{Self}` does not implement `lockkit::multi::Dispatch`",
    note = "lockkit takes `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`) and r2d2 pooled connections to them (feature `r2d2`; without it, pass `&mut *pooled`)",
    note = "for a `#[derive(diesel::MultiConnection)]` enum, implement `lockkit::multi::Dispatch` with one `match` that returns `BackendConn::Pg(conn)`, `BackendConn::Mysql(conn)` or `BackendConn::Sqlite(conn)`"
)]
pub trait Dispatch: diesel::Connection + Sized + 'static {
    /// The connection this enum holds now.
    fn dispatch(&mut self) -> BackendConn<'_>;
}

use crate::bounds::{
    AdaptiveRow, ClaimQuery, CurrentValues, CurrentVersionQuery, Expectations, LockAll, LockRow,
    MarkLocked, VersionCheck,
};
use crate::error::Error;
#[cfg(feature = "idempotency")]
use crate::http::idempotency::{IdempotencyStore, PurgeBefore, Scoped, StoredKey, Write};
#[cfg(feature = "lease")]
use crate::lease::{FenceStore, LeaseStore};
use crate::optimistic::mark::Mark;
use crate::optimistic::sequence::Origin;
use crate::optimistic::versioned::{self, UpdateVersioned};
#[cfg(feature = "outbox")]
use crate::outbox::{DeadLetter, OutboxMessage, OutboxStore};
#[cfg(feature = "sqlite")]
use crate::pessimistic::advisory::no_advisory_locks;
use crate::pessimistic::advisory::{AdvisoryConnection, AdvisoryKey, Scope};
use crate::pessimistic::connection;
use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
#[cfg(feature = "sqlite")]
use crate::pessimistic::lock_waits::no_lock_views;
use crate::pessimistic::lock_waits::{BlockedSession, LockMonitorConnection, LockWait};
use crate::pessimistic::lockable::Lockable;
use crate::pessimistic::options::LockOptions;
use crate::pessimistic::row_lock::RowLock;
use crate::transaction::journal;
use crate::transaction::{Control, Reach};

#[cfg(feature = "r2d2")]
use crate::sealed::Pooled;

/// Which backend a [`BackendConn`] is, without the borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    #[cfg(feature = "postgres")]
    Pg,
    #[cfg(feature = "mysql")]
    Mysql,
    #[cfg(feature = "sqlite")]
    Sqlite,
}

/// Which backend `conn` holds.
pub(crate) fn kind<T: Dispatch>(conn: &mut T) -> Kind {
    match conn.dispatch() {
        #[cfg(feature = "postgres")]
        BackendConn::Pg(_) => Kind::Pg,
        #[cfg(feature = "mysql")]
        BackendConn::Mysql(_) => Kind::Mysql,
        #[cfg(feature = "sqlite")]
        BackendConn::Sqlite(_) => Kind::Sqlite,
    }
}

/// `$body` with `$inner` bound to the connection a [`Dispatch`] enum holds,
/// compiled once per backend feature.
#[cfg(any(feature = "idempotency", feature = "lease", feature = "outbox"))]
macro_rules! on_inner {
    ($conn:expr, |$inner:ident| $body:expr) => {
        match $conn.dispatch() {
            #[cfg(feature = "postgres")]
            BackendConn::Pg($inner) => $body,
            #[cfg(feature = "mysql")]
            BackendConn::Mysql($inner) => $body,
            #[cfg(feature = "sqlite")]
            BackendConn::Sqlite($inner) => $body,
        }
    };
}

macro_rules! reach {
    ($($variant:ident($conn:ty): $feature:literal),*) => {$(
        #[cfg(feature = $feature)]
        impl Reach<$conn> for $conn {
            fn reach(&mut self) -> diesel::QueryResult<&mut $conn> {
                Ok(self)
            }
        }

        #[cfg(feature = $feature)]
        impl<T: Dispatch> Reach<$conn> for T {
            fn reach(&mut self) -> diesel::QueryResult<&mut $conn> {
                #[allow(unreachable_patterns)] // one backend feature alone
                match self.dispatch() {
                    BackendConn::$variant(conn) => Ok(conn),
                    _ => Err(diesel::result::Error::BrokenTransactionManager),
                }
            }
        }
    )*};
}

reach!(Pg(PgConnection): "postgres", Mysql(MysqlConnection): "mysql", Sqlite(SqliteConnection): "sqlite");

/// Implements lockkit's connection traits for every [`Dispatch`] enum, each
/// call handed to the connection it holds. `$variant($conn, $module)` lists the
/// enabled backends (a bound such as `M: LockRow<$conn>` cannot be `#[cfg]`'d,
/// so the list is written out once per combination of backend features, below).
macro_rules! dispatch {
    ($($variant:ident($conn:ty, $module:ident)),+) => {
        impl<T: Dispatch> Control for T {
            // The enum's transaction manager is the inner connection's.
            fn begin_level(&mut self) -> diesel::QueryResult<()> {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.begin_level(),)+
                }
            }

            fn commit_marked(&mut self) -> diesel::QueryResult<()> {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.commit_marked(),)+
                }
            }

            fn transaction_ended(&mut self, cause: Option<&Error>) -> Option<Error> {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.transaction_ended(cause),)+
                }
            }

            fn keep_aborted(&mut self) {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.keep_aborted(),)+
                }
            }

            // The enum's transaction manager is the inner connection's.
            fn repair(&mut self) {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.repair(),)+
                }
            }

            fn confirms_abort(&mut self, cause: &Error) -> bool {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.confirms_abort(cause),)+
                }
            }

            fn ends(&mut self) -> journal::Ends {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.ends(),)+
                }
            }
        }

        impl<T: Dispatch> LockingConnection for T {
            /// The clause is the backend's, so the query runs on the inner
            /// connection only: lockkit's row locks go there.
            type Locked<Q: LockingDsl<L>, L> = Q::Output;

            fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L> {
                query.with_lock(lock)
            }

            fn locked_transaction<U, E, F>(&mut self, options: &LockOptions, f: F) -> Result<U, E>
            where
                E: From<Error>,
                F: FnOnce(&mut Self) -> Result<U, E>,
            {
                match kind(self) {
                    $(Kind::$variant => connection::$module::locked_transaction(self, options, f),)+
                }
            }

            fn serializable_transaction<U, E, F>(&mut self, f: F) -> Result<U, E>
            where
                E: From<Error>,
                F: FnOnce(&mut Self) -> Result<U, E>,
            {
                match kind(self) {
                    $(Kind::$variant => connection::$module::serializable_transaction(self, f),)+
                }
            }

            fn take_write_lock(&mut self) -> Result<(), Error> {
                match self.dispatch() {
                    $(BackendConn::$variant(conn) => conn.take_write_lock(),)+
                }
            }
        }

        impl<M, T> LockRow<T> for M
        where
            T: Dispatch,
            M: Lockable $(+ LockRow<$conn>)+,
            M::OnLock: MarkLocked<M, T>,
        {
            fn load_locked(conn: &mut T, key: M::Key, lock: RowLock) -> QueryResult<Option<M>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as LockRow<$conn>>::load_locked(conn, key, lock),)+
                }
            }

            fn exists(conn: &mut T, key: M::Key) -> QueryResult<bool> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as LockRow<$conn>>::exists(conn, key),)+
                }
            }

            fn load(conn: &mut T, key: M::Key) -> QueryResult<Option<M>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as LockRow<$conn>>::load(conn, key),)+
                }
            }
        }

        impl<M, T> LockAll<T> for M
        where
            T: Dispatch,
            M: LockRow<T> $(+ LockAll<$conn>)+,
        {
            fn load_all_locked(conn: &mut T, keys: Vec<M::Key>) -> QueryResult<Vec<M>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as LockAll<$conn>>::load_all_locked(conn, keys),)+
                }
            }
        }

        impl<M, T> CurrentVersionQuery<T> for M
        where
            T: Dispatch,
            M: VersionCheck<Key: Send + 'static> $(+ CurrentVersionQuery<$conn>)+,
        {
            fn load_current_version(conn: &mut T, key: M::Key) -> QueryResult<Option<M::Version>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::load_current_version(conn, key),)+
                }
            }

            fn bump_past(conn: &mut T, key: M::Key, version: M::Version) -> QueryResult<usize> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::bump_past(conn, key, version),)+
                }
            }

            fn known_key_is_unique(conn: &mut T) -> Option<bool> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::known_key_is_unique(conn),)+
                }
            }

            fn key_is_unique(conn: &mut T) -> QueryResult<bool> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::key_is_unique(conn),)+
                }
            }

            fn row_id(conn: &mut T, key: &M::Key) -> QueryResult<Option<String>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::row_id(conn, key),)+
                }
            }

            fn database_table(conn: &mut T) -> &'static str {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::database_table(conn),)+
                }
            }

            fn mark(conn: &mut T, mark: Mark) -> QueryResult<()> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::mark(conn, mark),)+
                }
            }

            fn mark_stands(conn: &mut T, mark: Mark) -> QueryResult<bool> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::mark_stands(conn, mark),)+
                }
            }

            fn ends(conn: &mut T) -> journal::Ends {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as CurrentVersionQuery<$conn>>::ends(conn),)+
                }
            }

            fn move_past_again(
                key: M::Key,
                row: Option<String>,
                version: M::Version,
            ) -> journal::AnyRedo {
                versioned::move_past_again(versioned::move_past::<M, T>, key, row, version)
            }

            fn redo_after_own_rollback(conn: &mut T) {
                crate::transaction::redo(conn);
            }
        }

        /// The plain read goes to the inner connection; the write is
        /// [`Versioned::update_versioned`](crate::Versioned::update_versioned)'s
        /// through the enum, as any versioned write there.
        impl<M, T> AdaptiveRow<T> for M
        where
            T: Dispatch,
            M: LockRow<T> + VersionCheck + CurrentVersionQuery<T> $(+ AdaptiveRow<$conn>)+,
            for<'a> UpdateVersioned<M, M::Changeset<'a>>: ExecuteDsl<T>,
            for<'a> (M::Changeset<'a>, M::Bump): AsChangeset<Target = M::Table>,
            // The parts of the statement above, which the compiler cannot see
            // through the higher-ranked bound.
            M::Table: QueryId,
            <M::Table as QuerySource>::FromClause: QueryFragment<T::Backend>,
            <M::Target as IntoUpdateTarget>::WhereClause: QueryFragment<T::Backend> + QueryId,
            M::Bump: QueryId,
            for<'a> <(M::Changeset<'a>, M::Bump) as AsChangeset>::Changeset: QueryFragment<T::Backend>,
        {
            fn read(conn: &mut T, key: M::Key) -> QueryResult<Option<M>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <M as AdaptiveRow<$conn>>::read(conn, key),)+
                }
            }

            fn write_fresh(&mut self, conn: &mut T) -> Result<(), Error> {
                versioned::update_from(self, conn, Origin::Read)
            }
        }

        /// The read after a refused compare-and-set goes to the inner
        /// connection, with its backend's locking read.
        impl<M, E, T> CurrentValues<M, T> for E
        where
            T: Dispatch,
            M: Lockable,
            E: Expectations $(+ CurrentValues<M, $conn>)+,
        {
            fn load_current(&self, conn: &mut T, key: M::Key) -> QueryResult<Option<E::Values>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <E as CurrentValues<M, $conn>>::load_current(self, conn, key),)+
                }
            }
        }

        impl<Q, M, T> ClaimQuery<T, M> for Q
        where
            T: Dispatch,
            Q: Sized $(+ ClaimQuery<$conn, M>)+,
        {
            fn load_claimed(self, conn: &mut T, limit: i64) -> QueryResult<Vec<M>> {
                match conn.dispatch() {
                    $(BackendConn::$variant(conn) => <Q as ClaimQuery<$conn, M>>::load_claimed(self, conn, limit),)+
                }
            }
        }
    };
}

#[cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]
dispatch!(
    Pg(PgConnection, postgres),
    Mysql(MysqlConnection, mysql),
    Sqlite(SqliteConnection, sqlite)
);
#[cfg(all(feature = "postgres", feature = "mysql", not(feature = "sqlite")))]
dispatch!(Pg(PgConnection, postgres), Mysql(MysqlConnection, mysql));
#[cfg(all(feature = "postgres", not(feature = "mysql"), feature = "sqlite"))]
dispatch!(Pg(PgConnection, postgres), Sqlite(SqliteConnection, sqlite));
#[cfg(all(not(feature = "postgres"), feature = "mysql", feature = "sqlite"))]
dispatch!(
    Mysql(MysqlConnection, mysql),
    Sqlite(SqliteConnection, sqlite)
);
#[cfg(all(feature = "postgres", not(feature = "mysql"), not(feature = "sqlite")))]
dispatch!(Pg(PgConnection, postgres));
#[cfg(all(not(feature = "postgres"), feature = "mysql", not(feature = "sqlite")))]
dispatch!(Mysql(MysqlConnection, mysql));
#[cfg(all(not(feature = "postgres"), not(feature = "mysql"), feature = "sqlite"))]
dispatch!(Sqlite(SqliteConnection, sqlite));

/// The enum takes every lock call a backend connection takes; the closures get
/// the enum.
impl<T: Dispatch> AsLockingConnection for T {
    type Conn = T;
    fn locking_connection(&mut self) -> &mut T {
        self
    }
}

#[cfg(feature = "r2d2")]
#[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
impl<T> AsLockingConnection for Pooled<T>
where
    T: Dispatch + R2D2Connection + Send + 'static,
{
    type Conn = T;
    fn locking_connection(&mut self) -> &mut T {
        self
    }
}

#[cfg(feature = "r2d2")]
#[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
impl<M, T> CurrentVersionQuery<Pooled<T>> for M
where
    T: Dispatch + R2D2Connection + Send + 'static,
    M: CurrentVersionQuery<T>,
{
    fn load_current_version(conn: &mut Pooled<T>, key: M::Key) -> QueryResult<Option<M::Version>> {
        M::load_current_version(conn, key)
    }

    fn bump_past(conn: &mut Pooled<T>, key: M::Key, version: M::Version) -> QueryResult<usize> {
        M::bump_past(conn, key, version)
    }

    fn known_key_is_unique(conn: &mut Pooled<T>) -> Option<bool> {
        M::known_key_is_unique(conn)
    }

    fn key_is_unique(conn: &mut Pooled<T>) -> QueryResult<bool> {
        M::key_is_unique(conn)
    }

    fn row_id(conn: &mut Pooled<T>, key: &M::Key) -> QueryResult<Option<String>> {
        M::row_id(conn, key)
    }

    fn database_table(conn: &mut Pooled<T>) -> &'static str {
        M::database_table(conn)
    }

    fn mark(conn: &mut Pooled<T>, mark: Mark) -> QueryResult<()> {
        M::mark(conn, mark)
    }

    fn mark_stands(conn: &mut Pooled<T>, mark: Mark) -> QueryResult<bool> {
        M::mark_stands(conn, mark)
    }

    fn ends(conn: &mut Pooled<T>) -> journal::Ends {
        M::ends(conn)
    }

    /// The enum's: lockkit's transactions on a pooled connection run on the
    /// enum inside, whose end makes the move again.
    fn move_past_again(key: M::Key, row: Option<String>, version: M::Version) -> journal::AnyRedo {
        M::move_past_again(key, row, version)
    }

    /// On the enum inside, for which the moves were kept.
    fn redo_after_own_rollback(conn: &mut Pooled<T>) {
        M::redo_after_own_rollback(&mut **conn);
    }
}

#[cfg(feature = "r2d2")]
#[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
impl<M, E, T> CurrentValues<M, Pooled<T>> for E
where
    T: Dispatch + R2D2Connection + Send + 'static,
    M: Lockable,
    E: CurrentValues<M, T>,
{
    fn load_current(&self, conn: &mut Pooled<T>, key: M::Key) -> QueryResult<Option<E::Values>> {
        self.load_current(&mut **conn, key)
    }
}

/// Sealed traits take the enum: its impls hand each call to a backend's own.
impl<T: Dispatch> crate::sealed::Sealed for T {}

/// `$body` with `$inner` bound to the server connection (PostgreSQL,
/// MySQL/MariaDB) a [`Dispatch`] enum holds; `$sqlite` when it holds SQLite.
macro_rules! on_server {
    ($conn:expr, |$inner:ident| $body:expr, sqlite: $sqlite:expr) => {
        match $conn.dispatch() {
            #[cfg(feature = "postgres")]
            BackendConn::Pg($inner) => $body,
            #[cfg(feature = "mysql")]
            BackendConn::Mysql($inner) => $body,
            #[cfg(feature = "sqlite")]
            BackendConn::Sqlite(_) => $sqlite,
        }
    };
}

/// The advisory locks of the connection inside the enum: the scope is decided
/// by its backend and its transaction (the enum's), the statements are its
/// backend's. SQLite has none: [`Error::Unsupported`], nothing sent.
// With SQLite alone every call refuses, its arguments unused.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
#[diagnostic::do_not_recommend] // a connection that is none: say so, not "implement Dispatch"
impl<T: Dispatch> AdvisoryConnection for T {
    fn scope(conn: &mut Self) -> Result<Scope, Error> {
        on_server!(conn, |c| AdvisoryConnection::scope(c), sqlite: Err(no_advisory_locks()))
    }

    fn acquire(conn: &mut Self, key: AdvisoryKey, scope: Scope, wait: bool) -> Result<bool, Error> {
        on_server!(conn, |c| AdvisoryConnection::acquire(c, key, scope, wait), sqlite: Err(no_advisory_locks()))
    }

    fn release(conn: &mut Self, key: AdvisoryKey) -> Result<bool, Error> {
        on_server!(conn, |c| AdvisoryConnection::release(c, key), sqlite: Err(no_advisory_locks()))
    }
}

/// The server of the connection inside the enum is asked. SQLite has no lock
/// views: [`Error::Unsupported`], nothing sent.
// With SQLite alone every call refuses, its arguments unused.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
#[diagnostic::do_not_recommend] // a connection that is none: say so, not "implement Dispatch"
impl<T: Dispatch> LockMonitorConnection for T {
    fn session_id(conn: &mut Self) -> Result<i64, Error> {
        on_server!(conn, |c| LockMonitorConnection::session_id(c), sqlite: Err(no_lock_views()))
    }

    fn blocked_sessions(conn: &mut Self) -> Result<Vec<BlockedSession>, Error> {
        on_server!(conn, |c| LockMonitorConnection::blocked_sessions(c), sqlite: Err(no_lock_views()))
    }

    fn current(conn: &mut Self) -> Result<Vec<LockWait>, Error> {
        on_server!(conn, |c| LockMonitorConnection::current(c), sqlite: Err(no_lock_views()))
    }
}

/// Sends each of the outbox's and the inbox's statements to the connection
/// inside the enum: the transactions are the enum's (the inner connection's),
/// the SQL is the backend's.
#[cfg(feature = "outbox")]
impl<T: Dispatch> OutboxStore for T {
    fn before_relay(conn: &mut Self) -> Result<(), Error> {
        on_inner!(conn, |c| OutboxStore::before_relay(c))
    }

    fn insert_message(conn: &mut Self, topic: &str, payload: &str, now: i64) -> Result<i64, Error> {
        on_inner!(conn, |c| OutboxStore::insert_message(
            c, topic, payload, now
        ))
    }

    fn claim_due(conn: &mut Self, limit: i64, now: i64) -> Result<Vec<OutboxMessage>, Error> {
        on_inner!(conn, |c| OutboxStore::claim_due(c, limit, now))
    }

    fn mark_published(conn: &mut Self, id: i64, now: i64) -> Result<bool, Error> {
        on_inner!(conn, |c| OutboxStore::mark_published(c, id, now))
    }

    fn mark_failed(
        conn: &mut Self,
        id: i64,
        next_attempt_at: i64,
        reason: &str,
    ) -> Result<(), Error> {
        on_inner!(conn, |c| OutboxStore::mark_failed(
            c,
            id,
            next_attempt_at,
            reason
        ))
    }

    fn purge_published(conn: &mut Self, published_before: i64) -> Result<usize, Error> {
        on_inner!(conn, |c| OutboxStore::purge_published(c, published_before))
    }

    fn dead_letters(conn: &mut Self, dead: i64, limit: i64) -> Result<Vec<DeadLetter>, Error> {
        on_inner!(conn, |c| OutboxStore::dead_letters(c, dead, limit))
    }

    fn requeue(conn: &mut Self, id: i64, dead: i64, now: i64) -> Result<bool, Error> {
        on_inner!(conn, |c| OutboxStore::requeue(c, id, dead, now))
    }

    fn record_received(
        conn: &mut Self,
        consumer: &str,
        message_id: &str,
        now: i64,
    ) -> Result<bool, Error> {
        on_inner!(conn, |c| OutboxStore::record_received(
            c, consumer, message_id, now
        ))
    }

    fn purge_received(
        conn: &mut Self,
        consumer: &str,
        received_before: i64,
    ) -> Result<usize, Error> {
        on_inner!(conn, |c| OutboxStore::purge_received(
            c,
            consumer,
            received_before
        ))
    }
}

/// Sends each of the idempotency keys' statements to the connection inside the
/// enum: the work's transaction and the savepoint of the key's insert are the
/// enum's (the inner connection's), the SQL is the backend's.
#[cfg(feature = "idempotency")]
impl<T: Dispatch> IdempotencyStore for T {
    fn insert_running(
        conn: &mut Self,
        key: Scoped<'_>,
        fingerprint: &str,
        now: i64,
    ) -> Result<bool, Error> {
        on_inner!(conn, |c| IdempotencyStore::insert_running(
            c,
            key,
            fingerprint,
            now
        ))
    }

    fn load(conn: &mut Self, key: Scoped<'_>) -> Result<Option<StoredKey>, Error> {
        on_inner!(conn, |c| IdempotencyStore::load(c, key))
    }

    fn write(conn: &mut Self, key: Scoped<'_>, write: Write<'_>) -> Result<bool, Error> {
        on_inner!(conn, |c| IdempotencyStore::write(c, key, write))
    }

    fn purge(conn: &mut Self, before: PurgeBefore) -> Result<usize, Error> {
        on_inner!(conn, |c| IdempotencyStore::purge(c, before))
    }
}

/// The database lease store on the connection inside the enum. Whether a
/// transaction is open is the inner connection's word, which is the enum's:
/// `acquire` and `renew` refuse inside the enum's transactions.
#[cfg(feature = "lease")]
impl<T: Dispatch> LeaseStore for T {
    fn grant(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<Option<i64>, Error> {
        on_inner!(self, |c| LeaseStore::grant(c, name, token, ttl_ms))
    }

    fn extend(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<bool, Error> {
        on_inner!(self, |c| LeaseStore::extend(c, name, token, ttl_ms))
    }

    fn revoke(&mut self, name: &str, token: &str) -> Result<bool, Error> {
        on_inner!(self, |c| LeaseStore::revoke(c, name, token))
    }

    fn in_transaction(&mut self) -> bool {
        on_inner!(self, |c| LeaseStore::in_transaction(c))
    }
}

/// Sends the fence's statements to the connection inside the enum, in the
/// enum's transaction.
#[cfg(feature = "lease")]
impl<T: Dispatch> FenceStore for T {
    fn raise(conn: &mut Self, resource: &str, fence: i64) -> Result<Option<i64>, Error> {
        on_inner!(conn, |c| FenceStore::raise(c, resource, fence))
    }
}
