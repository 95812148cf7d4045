//! # lockkit: no lost updates for Diesel
//!
//! Two buyers read `stock = 10`, both buy 8, both write `stock = 2`: sixteen sold,
//! ten in stock, and no error anywhere. lockkit gives Diesel applications the
//! standard cures, typed and tested on PostgreSQL, MySQL/MariaDB and SQLite:
//!
//! * **Optimistic locking** ([`optimistic`]): [`Versioned`] (`#[derive(Versioned)]`),
//!   every write checks and bumps a version column; a lost race is
//!   [`Error::Stale`]. Rollbacks are seen by the [`journal`]; tables without a
//!   version column get conditional updates ([`atomic`]); writers that bypass
//!   lockkit get [`version_trigger`]s.
//! * **Pessimistic locking** ([`pessimistic`]): [`Lockable::with_lock`],
//!   [`Lockable::lock_all`], [`LockOptions`] (strength, `NOWAIT`, `SKIP LOCKED`,
//!   timeouts) and the query extensions of [`LockQueryExt`]; work queues
//!   ([`queue`]), advisory locks ([`advisory`]) and who waits on whom
//!   ([`lock_waits`]).
//! * **Around them**: work that runs only after the commit ([`after_commit`]),
//!   bounded [`retry()`] with backoff and jitter,
//!   [`serializable`] transactions retried, one [`Error`] type classified in one
//!   place ([`error::classification`]), ETag / `If-Match` for HTTP, axum glue and
//!   idempotency keys ([`http`]), the transactional outbox and the consumer's
//!   inbox (`outbox`, feature `outbox`), and conflict [`metrics`].
//! * **Leases** (`lease`, feature `lease`): one holder at a time for a TTL, on
//!   the database or on Redis, each grant with a fencing token that lockkit's
//!   fenced writes check, so a holder that overran its lease cannot write.
//! * **Replicas** (`replica`, feature `replica`): reads on a PostgreSQL standby
//!   that wait for the reader's own writes, or go to the primary.
//!
//! The two buyers, on an in-memory SQLite database: Bob's write from his stale
//! copy is refused, and under the row lock he decides again on the fresh row.
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//!
//! diesel::table! {
//!     items (id) { id -> Integer, name -> Text, stock -> Integer, lock_version -> Integer }
//! }
//!
//! #[derive(Debug, Queryable, Selectable, Identifiable, AsChangeset, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub name: String, pub stock: i32, pub lock_version: i32 }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO items (id, name, stock) VALUES (1, 'widget', 10)").execute(&mut conn)?;
//! // Two buyers read stock = 10.
//! let mut alice = items::table.find(1).first::<Item>(&mut conn)?;
//! let mut bob = items::table.find(1).first::<Item>(&mut conn)?;
//!
//! // Alice buys 8: UPDATE .. WHERE id = 1 AND lock_version = 0.
//! alice.stock -= 8;
//! alice.update_versioned(&mut conn)?;
//! assert_eq!(alice.lock_version, 1);
//!
//! // Bob buys 8 from his stale copy: refused, nothing written.
//! bob.stock -= 8;
//! assert!(matches!(bob.update_versioned(&mut conn), Err(lockkit::Error::Stale(_))));
//!
//! // Bob again, under the row lock: `fresh` is the row as it is now.
//! let sold = bob.with_lock(&mut conn, |conn, fresh| {
//!     let qty = fresh.stock.min(8); // only 2 left
//!     diesel::update(items::table.find(fresh.id))
//!         .set(items::stock.eq(fresh.stock - qty))
//!         .execute(conn)?;
//!     Ok::<_, lockkit::Error>(qty)
//! })?;
//! assert_eq!(sold, 2);
//! assert_eq!(items::table.find(1).select(items::stock).first::<i32>(&mut conn)?, 0);
//! # Ok(()) }
//! ```
//!
//! | module | concept |
//! | --- | --- |
//! | [`optimistic`] | version-checked writes |
//! | [`pessimistic`] | row locks, queues, advisory locks |
//! | [`adaptive`] | optimistic while a row is calm, locked while it is hot |
//! | `isolation` (private) | [`serializable`] transactions, retried |
//! | `retry` (private) | bounded [`retry()`] with backoff and jitter, [`RetryPolicy`] |
//! | [`http`] | ETag / `If-Match`, axum, idempotency keys |
//! | `lease` (feature `lease`) | leases with fencing tokens, fenced writes |
//! | `outbox` (feature `outbox`) | the transactional outbox and the consumer's inbox |
//! | `replica` (feature `replica`) | read-your-writes on a PostgreSQL standby |
//! | `asynchronous` (feature `async`) | the same strategies on diesel-async |
//! | [`error`] | the error type and the one place that reads server messages |
//! | [`metrics`] | conflict counters, lock wait and hold times |
//! | [`bounds`] | the traits lockkit's methods require: name them only in `where` clauses |
//! | `sealed` (private) | the supertrait that keeps the backend traits lockkit's own |
//! | [`multi`] | the backend chosen at run time: `#[derive(diesel::MultiConnection)]` enums |
//! | [`migrations`] | the tables lockkit ships, as SQL per server and as Diesel migrations |
//! | `transaction` (private) | what every lockkit transaction does the same way: the panic guard, the [`journal`] that watches each connection's transactions, [`after_commit`] work, the read-only sessions of the Galera guard |
//! | `clock` (private; features `idempotency`, `outbox`) | the application's clock, as the idempotency and outbox tables store times |
//! | `lsn` (private; feature `replica`) | a position in PostgreSQL's WAL (`replica::Lsn`), which the replica's errors carry |
//!
//! Start with [`optimistic::versioned`] and [`pessimistic::lockable`] for complete
//! examples; the repository's `docs/SQL.md` lists every statement lockkit sends.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adaptive;
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub mod asynchronous;
pub mod bounds;
pub mod error;
pub mod http;
#[cfg(feature = "lease")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
pub mod lease;
pub mod metrics;
pub mod migrations;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub mod multi;
pub mod optimistic;
#[cfg(feature = "outbox")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
pub mod outbox;
pub mod pessimistic;
#[cfg(feature = "replica")]
#[cfg_attr(docsrs, doc(cfg(feature = "replica")))]
pub mod replica;

#[cfg(any(feature = "idempotency", feature = "outbox"))]
mod clock;
mod isolation;
#[cfg(feature = "replica")]
mod lsn;
mod retry;
mod sealed;
mod transaction;

// The modules users name, at the crate's root.
#[cfg(feature = "axum")]
pub use http::axum;
pub use http::etag;
#[cfg(feature = "idempotency")]
pub use http::idempotency;
pub use optimistic::{atomic, compare_and_set, version_trigger};
pub use pessimistic::{advisory, lock_waits, queue};
pub use transaction::journal;

pub use error::{classify, classify_nowait};
pub use error::{
    Aborted, ColumnValue, CurrentState, Error, Operation, Result, StaleColumnsError,
    StaleObjectError, StaleRecord,
};
pub use isolation::serializable;
pub use optimistic::{VersionNumber, Versioned};
pub use pessimistic::{locked_transaction, with_lock, Lockable};
pub use pessimistic::{AsLockingConnection, LockOptions, LockingConnection};
pub use pessimistic::{LockQueryExt, LockStrength, RowLock, WaitMode};
pub use retry::{retry, transaction_with_retry, RetryPolicy, RetryableError};
pub use transaction::after_commit;
#[cfg(feature = "mysql")]
pub use transaction::read_only_outside_transactions;

/// `#[derive(Versioned)]`: implements [`Versioned`] and [`Lockable`] for a model
/// with a version column. The attributes it reads, their defaults, its errors and
/// the code it generates are listed after the example.
///
/// ```
/// use diesel::prelude::*;
/// use lockkit::prelude::*;
///
/// diesel::table! {
///     order_lines (order_id, line) {
///         order_id -> Integer,
///         line -> Integer,
///         qty -> Integer,
///         row_version -> BigInt,
///     }
/// }
///
/// #[derive(Queryable, Selectable, Versioned)]
/// #[diesel(table_name = order_lines, primary_key(order_id, line))]
/// pub struct OrderLine {
///     pub order_id: i32,
///     pub line: i32,
///     pub qty: i32,
///     #[lockkit(version)]
///     pub row_version: i64,
/// }
///
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE order_lines (order_id INTEGER NOT NULL, line INTEGER NOT NULL, qty INTEGER NOT NULL, row_version BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (order_id, line))").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO order_lines (order_id, line, qty) VALUES (7, 1, 2)").execute(&mut conn).unwrap();
/// let mut line = order_lines::table.find((7, 1)).first::<OrderLine>(&mut conn).unwrap();
/// line.qty = 3;
/// line.update_versioned(&mut conn).unwrap();
/// assert_eq!(line.row_version, 1);
/// ```
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use lockkit_derive::Versioned;

/// `#[derive(Lockable)]`: implements [`Lockable`] (table and primary key) for a
/// model without a version column, for [`Lockable::with_lock`] and
/// [`Lockable::lock_all`]. The attributes it reads are listed after the example.
///
/// ```
/// use diesel::prelude::*;
/// use lockkit::prelude::*;
///
/// diesel::table! { accounts (id) { id -> Integer, balance -> BigInt } }
///
/// #[derive(Queryable, Selectable, Lockable)]
/// #[diesel(table_name = accounts)]
/// pub struct Account { pub id: i32, pub balance: i64 }
///
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO accounts VALUES (1, 100)").execute(&mut conn).unwrap();
/// let balance = lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |_conn, account: Account| Ok::<_, lockkit::Error>(account.balance)).unwrap();
/// assert_eq!(balance, 100);
/// ```
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use lockkit_derive::Lockable;

/// The traits whose methods you call: `use lockkit::prelude::*;`.
///
/// [`Versioned`] (the version-checked writes), [`Lockable`] (`with_lock`,
/// `lock_all`), [`CompareAndSet`](compare_and_set::CompareAndSet)
/// (`Model::compare_and_set`), [`UpdateAdaptive`](adaptive::UpdateAdaptive)
/// (`update_adaptive`) and [`LockQueryExt`] (`.nowait()`,
/// `.for_update_of(..)`), with the
/// derives of the same names. The traits those methods require are in
/// [`bounds`], to be named only in `where` clauses
/// (`M: lockkit::bounds::LockRow<C>`).
pub mod prelude {
    pub use crate::adaptive::UpdateAdaptive;
    pub use crate::compare_and_set::CompareAndSet;
    pub use crate::{LockQueryExt, Lockable, Versioned};
}

// `Error` crosses threads and tasks (`anyhow`, `Box<dyn Error + Send + Sync>`, axum
// handlers): keep it that way.
const _: () = {
    const fn assert_send_sync_static<T: Send + Sync + 'static>() {}
    assert_send_sync_static::<Error>();
};

// The README's examples run as doc tests, so they cannot drift from the code.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[doc(hidden)]
pub mod __private {
    //! Every path the derive's generated code uses, so that lockkit's modules can
    //! move without touching the derive. Not public API.
    pub use crate::optimistic::statement::{BySql, ByType};
    pub use crate::optimistic::updated_at::{NoUpdatedAt, SetUpdatedAt};
    pub use crate::optimistic::BumpVersion;
    pub use crate::pessimistic::lockable::key_is_primary_key;
    pub use crate::pessimistic::NoVersion;
    pub use crate::{Lockable, Versioned};
    pub use diesel;
}
