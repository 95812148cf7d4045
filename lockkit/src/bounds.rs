//! The traits lockkit's methods require, gathered in one place: name these only
//! in `where` clauses.
//!
//! You call methods on [`Versioned`](crate::Versioned), [`Lockable`](crate::Lockable)
//! and [`LockQueryExt`](crate::LockQueryExt) (the [prelude](crate::prelude)). The
//! traits here are what those methods ask of your model, its key and your
//! connection. lockkit implements them (most for every type that fits, the
//! backend traits for each backend feature, sealed); you never implement them
//! (except [`KeyColumn`], for a key type of your own), and their own methods are
//! the pieces lockkit builds statements from, not API. They show up in two
//! places:
//!
//! * in compiler errors, when a call does not fit: each trait carries a message
//!   that says what is missing in a model's or a connection's terms (a
//!   composite key given to `lock_all`, advisory locks on SQLite, a connection
//!   type lockkit does not know);
//! * in the bounds of your own generic code over models or backends, as Diesel's
//!   `query_dsl::methods` traits do:
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::bounds::{AsLockingConnection, LockRow, LockingConnection};
//! use lockkit::prelude::*;
//!
//! /// The stock of any lockable item model with a `stock()` accessor, read under its row lock.
//! fn locked_stock<M, C>(conn: &mut C, key: M::Key) -> Result<i32, lockkit::Error>
//! where
//!     C: LockingConnection + AsLockingConnection<Conn = C>,
//!     M: LockRow<C> + HasStock,
//! {
//!     lockkit::with_lock(conn, key, lockkit::LockOptions::default(), |_conn, item: M| Ok(item.stock()))
//! }
//! # pub trait HasStock { fn stock(&self) -> i32; }
//! # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
//! # #[derive(Queryable, Selectable, Lockable)]
//! # #[diesel(table_name = items)]
//! # pub struct Item { pub id: i32, pub stock: i32 }
//! # impl HasStock for Item { fn stock(&self) -> i32 { self.stock } }
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn).unwrap();
//! # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn).unwrap();
//! assert_eq!(locked_stock::<Item, _>(&mut conn, 1).unwrap(), 10);
//! ```
//!
//! | trait | required by | implemented for |
//! | --- | --- | --- |
//! | [`LockRow`] | `with_lock` | every [`Lockable`](crate::Lockable) model that is `Selectable` on the connection's backend |
//! | [`LockAll`] | `lock_all` | those whose key is one column: integer, text, or (feature `uuid`, PostgreSQL) UUID |
//! | [`KeyColumn`] | `lock_all` | such a key column: `pk = ANY($1)` / `pk IN (..)` |
//! | [`MarkLocked`] | `with_lock`, `lock_all` | what an exclusive lock writes: [`NoVersion`](crate::pessimistic::NoVersion), [`BumpVersion`](crate::optimistic::BumpVersion) |
//! | [`AdaptiveRow`] | [`adaptive`](crate::adaptive) writes | every [`Versioned`](crate::Versioned) model that is `Selectable` on `PgConnection`, `MysqlConnection` or `SqliteConnection`; on a [`Dispatch`](crate::multi::Dispatch) enum, one that is so on each of its backends |
//! | [`VersionCheck`] | every versioned write | every [`Versioned`](crate::Versioned) model |
//! | [`CurrentVersionQuery`] | every versioned write, [`Versioned::update_if`](crate::Versioned::update_if) | those, on a connection of a supported backend or a [`Dispatch`](crate::multi::Dispatch) enum |
//! | [`LockedCall`], [`EveryClause`] | `with_lock`, blocking and async (in [`LockRow`]'s and `AsyncLockRow`'s impls) | lockkit's locked reads, under each clause type of [`row_lock`](crate::pessimistic::row_lock) and a [`RowLock`](crate::RowLock) value |
//! | [`VersionNumber`] | every call that takes a version: [`Versioned::Version`](crate::Versioned::Version), [`ETag::from_version`](crate::etag::ETag::from_version), [`expected_version`](crate::etag::expected_version), .. | `i16`, `i32`, `i64` (sealed) |
//! | [`LockingConnection`], [`AsLockingConnection`] | the lock calls | `PgConnection`, `MysqlConnection`, `SqliteConnection`; r2d2 pooled connections to them (feature `r2d2`); [`Dispatch`](crate::multi::Dispatch) enums |
//! | [`ClaimQuery`] | [`queue::claim`](crate::queue::claim) | every select query that takes `.limit(n)` and a row-lock clause, on those connections |
//! | [`Expectations`] | [`CompareAndSet::compare_and_set`](crate::compare_and_set::CompareAndSet::compare_and_set) | [`expect`](crate::compare_and_set::expect)`(column, value)` and tuples of up to six |
//! | [`CurrentValues`] | [`CompareAndSet::compare_and_set`](crate::compare_and_set::CompareAndSet::compare_and_set): the read after a refused write | those whose columns load into their values, on a connection of a supported backend or an r2d2 pooled connection to one (feature `r2d2`); on a [`Dispatch`](crate::multi::Dispatch) enum, those that do so on each of its backends |
//! | [`OptimisticBackend`] | every versioned write | `Pg`, `Mysql`, `Sqlite` (sealed) |
//! | [`AdvisoryConnection`] | [`advisory`](crate::advisory) | `PgConnection`, `MysqlConnection`; r2d2 pooled connections to them (feature `r2d2`); [`Dispatch`](crate::multi::Dispatch) enums (sealed): SQLite has no advisory locks |
//! | [`AdvisoryBackend`] | [`advisory`](crate::advisory)'s statements | `Pg`, `Mysql` (sealed) |
//! | [`LockMonitorConnection`] | [`lock_waits`](crate::lock_waits) | `PgConnection`, `MysqlConnection`; r2d2 pooled connections to them (feature `r2d2`); [`Dispatch`](crate::multi::Dispatch) enums (sealed) |
//! | [`LockMonitor`] | [`lock_waits`](crate::lock_waits)' statements | `Pg`, `Mysql` (sealed) |
//! | `LeaseStore` | `lease::acquire`, `lease::with_lease` (feature `lease`) | `PgConnection`, `MysqlConnection`, `SqliteConnection`, `Dispatch` enums, `lease::redis::RedisStore` (feature `redis`) (sealed) |
//! | `FenceStore` | `lease::fenced` (feature `lease`) | `PgConnection`, `MysqlConnection`, `SqliteConnection`, `Dispatch` enums (sealed) |
//! | `IdempotencyStore` | `idempotency` (feature `idempotency`) | `PgConnection`, `MysqlConnection`, `SqliteConnection`, `Dispatch` enums (sealed) |
//! | `OutboxStore` | `outbox` (feature `outbox`) | `PgConnection`, `MysqlConnection`, `SqliteConnection`, `Dispatch` enums (sealed) |
//!
//! The traits keep their definitions next to the code that uses them; these are
//! the same traits under one path. Those of the diesel-async calls are in
//! [`bounds::asynchronous`](self::asynchronous) (feature `async`).

pub use crate::adaptive::AdaptiveRow;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub use crate::http::idempotency::IdempotencyStore;
#[cfg(feature = "lease")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
pub use crate::lease::{FenceStore, LeaseStore};
pub use crate::optimistic::backend::OptimisticBackend;
pub use crate::optimistic::compare_and_set::{CurrentValues, Expectations};
pub use crate::optimistic::version::VersionNumber;
pub use crate::optimistic::versioned::{CurrentVersionQuery, VersionCheck};
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub use crate::outbox::OutboxStore;
pub use crate::pessimistic::advisory::{AdvisoryBackend, AdvisoryConnection};
pub use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
pub use crate::pessimistic::lock_waits::{LockMonitor, LockMonitorConnection};
pub use crate::pessimistic::lockable::{KeyColumn, LockAll, LockRow, MarkLocked};
pub use crate::pessimistic::queue::ClaimQuery;
pub use crate::pessimistic::row_lock::{EveryClause, LockedCall};

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub mod asynchronous {
    //! The traits lockkit's diesel-async calls require
    //! ([`lockkit::asynchronous`](crate::asynchronous), feature `async`), under
    //! one path: name these only in `where` clauses.
    //!
    //! | trait | required by |
    //! | --- | --- |
    //! | [`AsyncLockingConnection`] | every async call: `AsyncPgConnection`, `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>` (sealed) |
    //! | [`AsyncVersionQuery`] | the async versioned writes |
    //! | [`AsyncLockRow`], [`AsyncLockAll`], [`AsyncMarkLocked`] | async `with_lock`, `lock_all` |
    //! | [`AsyncClaimQuery`] | async `queue::claim` |
    //! | [`AsyncAdvisory`] | async advisory locks (PostgreSQL, MySQL/MariaDB; sealed) |
    //! | [`AsyncLockMonitor`] | async `lock_waits` (sealed) |
    //! | `AsyncIdempotencyStore`, `AsyncLeaseStore`, `AsyncFenceStore`, `AsyncOutboxStore` | async idempotency keys, leases, fenced writes, outbox (their features; sealed) |
    //! | [`ConnWork`], [`RowWork`], [`ConnAttempt`] | the `async` closures the calls take |

    pub use crate::asynchronous::advisory::AsyncAdvisory;
    pub use crate::asynchronous::connection::AsyncLockingConnection;
    #[cfg(feature = "idempotency")]
    #[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
    pub use crate::asynchronous::idempotency::AsyncIdempotencyStore;
    #[cfg(feature = "lease")]
    #[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
    pub use crate::asynchronous::lease::{AsyncFenceStore, AsyncLeaseStore};
    pub use crate::asynchronous::lock_waits::AsyncLockMonitor;
    pub use crate::asynchronous::lockable::{AsyncLockAll, AsyncLockRow, AsyncMarkLocked};
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    pub use crate::asynchronous::outbox::AsyncOutboxStore;
    pub use crate::asynchronous::queue::AsyncClaimQuery;
    pub use crate::asynchronous::versioned::AsyncVersionQuery;
    pub use crate::asynchronous::work::{ConnAttempt, ConnWork, RowWork};
}
