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
//! * **Around them**: bounded [`retry()`] with backoff and jitter,
//!   [`serializable`] transactions retried, one [`Error`] type classified in one
//!   place ([`error::classification`]), ETag / `If-Match` for HTTP, axum glue and
//!   idempotency keys ([`http`]), and conflict [`metrics`].
//!
//! | folder | concept |
//! | --- | --- |
//! | [`optimistic`] | version-checked writes |
//! | [`pessimistic`] | row locks, queues, advisory locks |
//! | [`http`] | ETag / `If-Match`, axum, idempotency keys |
//! | [`error`] | the error type and the one place that reads server messages |
//! | [`bounds`] | the traits lockkit's methods require: name them only in `where` clauses |
//! | `transaction` (private) | what every lockkit transaction does the same way: the panic guard |
//!
//! Start with [`optimistic::versioned`] and [`pessimistic::lockable`] for complete
//! examples; the repository's `docs/SQL.md` lists every statement lockkit sends.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bounds;
pub mod error;
pub mod http;
pub mod metrics;
pub mod optimistic;
pub mod pessimistic;

mod isolation;
mod retry;
mod sealed;
mod transaction;

// The modules users name, at the crate's root.
#[cfg(feature = "axum")]
pub use http::axum;
pub use http::etag;
#[cfg(feature = "idempotency")]
pub use http::idempotency;
pub use optimistic::{atomic, journal, version_trigger};
pub use pessimistic::{advisory, lock_waits, queue};

pub use error::{classify, classify_nowait};
pub use error::{CurrentState, Error, Operation, Result, StaleObjectError};
pub use isolation::serializable;
pub use optimistic::{VersionNumber, Versioned};
pub use pessimistic::{locked_transaction, with_lock, with_lock_opts, Lockable};
pub use pessimistic::{AsLockingConnection, LockOptions, LockingConnection};
pub use pessimistic::{LockQueryExt, LockStrength, RowLock, WaitMode};
pub use retry::{retry, transaction_with_retry, RetryPolicy};

/// `#[derive(Versioned)]`: implements [`Versioned`] and [`Lockable`] for a model
/// with a version column.
///
/// The derive only describes the model (table, key, version column and type, the
/// changeset of the other fields); every method is generic code in lockkit.
///
/// # The version field
///
/// The field named `lock_version`, or the one field marked `#[lockkit(version)]`
/// (which takes no value and may appear once). Its type is `i16`, `i32` or `i64`:
/// not an `Option` (a NULL version cannot be compared; declare the column
/// `NOT NULL DEFAULT 0`), and not part of the primary key.
///
/// # What it reads from `#[diesel(..)]`
///
/// Diesel's own attributes, with Diesel's defaults, so the model needs nothing
/// twice:
///
/// | attribute | on | default | used for |
/// | --- | --- | --- | --- |
/// | `table_name = items` | struct | the struct's name in snake case plus `s` (`FooBar` → `foo_bars`) | every statement |
/// | `primary_key(id)` / `primary_key(a, b)` | struct | `id` | the `WHERE` of every write; a composite key is a tuple (`Key = (i32, i32)`) |
/// | `column_name = "..."` | field | the field's name | the field's column |
/// | `skip_update` | field | | `update_versioned` leaves the column out |
/// | `treat_none_as_null = true` | struct or field | `false` | `update_versioned` writes `None` as `NULL` instead of skipping it |
///
/// Fields with `#[diesel(serialize_as = ..)]` or `#[diesel(embed)]` are refused
/// with a hint to add `skip_update` and write them with `update_versioned_with`.
/// Every mistake is a compile error at the attribute, with a `help:` line showing
/// the correct form.
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
/// [`Lockable::lock_all`].
///
/// It reads `#[diesel(table_name = ..)]` and `#[diesel(primary_key(..))]` with
/// Diesel's defaults, as [`Versioned`](derive@Versioned) does; a composite key is a
/// tuple. `#[derive(Versioned)]` already implements `Lockable`: derive one or the
/// other.
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
/// let balance = lockkit::with_lock(&mut conn, 1, |_conn, account: Account| Ok(account.balance)).unwrap();
/// assert_eq!(balance, 100);
/// ```
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use lockkit_derive::Lockable;

/// The traits whose methods you call: `use lockkit::prelude::*;`.
///
/// [`Versioned`] (the version-checked writes), [`Lockable`] (`with_lock`,
/// `lock_all`) and [`LockQueryExt`] (`.nowait()`, `.for_update_of(..)`), with the
/// derives of the same names. The traits those methods require are in
/// [`bounds`], to be named only in `where` clauses
/// (`M: lockkit::bounds::LockRow<C>`).
pub mod prelude {
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
    //! Paths the derive's generated code uses. Not public API.
    pub use diesel;

    pub use crate::optimistic::BumpVersion;
    pub use crate::pessimistic::NoVersion;
}
