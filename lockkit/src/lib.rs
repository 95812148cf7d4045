//! # lockkit: no lost updates for Diesel
//!
//! Two buyers read `stock = 10`, both buy 8, both write `stock = 2`: sixteen sold,
//! ten in stock, and no error anywhere. lockkit gives Diesel applications the
//! standard cures, typed and tested on PostgreSQL, MySQL/MariaDB and SQLite:
//!
//! * **Optimistic locking**: [`Versioned`] (`#[derive(Versioned)]`), every write
//!   checks and bumps a version column; a lost race is [`Error::Stale`]
//!   ([`versioned`], [`version_check`], [`version`]).
//! * **Pessimistic locking**: [`Lockable::with_lock`], [`Lockable::lock_all`],
//!   [`LockOptions`] (strength, `NOWAIT`, `SKIP LOCKED`, timeouts) and the query
//!   extensions of [`LockQueryExt`] ([`lockable`], [`row_lock`],
//!   [`locking_connection`]); work queues ([`queue`]), advisory locks
//!   ([`advisory`]), `SERIALIZABLE` with retry ([`isolation`]), conditional
//!   updates ([`atomic`]) and who waits on whom ([`lock_waits`]).
//! * **Around them**: bounded [`retry()`] with backoff and jitter, one error type
//!   classified in one place ([`classify()`]), ETag / `If-Match` for HTTP ([`etag`],
//!   and `axum` behind its feature), idempotency keys (`idempotency`, feature),
//!   version triggers for writers that bypass lockkit ([`version_trigger`]) and
//!   conflict metrics ([`metrics`]).
//!
//! Start with [`versioned`] and [`lockable`] for complete examples; the repository's
//! `docs/SQL.md` lists every statement lockkit sends.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod advisory;
pub mod atomic;
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
pub mod classify;
mod error;
pub mod etag;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
pub mod isolation;
pub mod lock_waits;
pub mod lockable;
pub mod locking_connection;
pub mod metrics;
pub mod queue;
pub mod retry;
pub mod row_lock;
pub mod version;
pub mod version_check;
pub mod version_trigger;
pub mod versioned;

pub use classify::{classify, classify_nowait};
pub use error::{CurrentState, Error, Operation, Result, StaleObjectError};
pub use isolation::serializable;
pub use lockable::{locked_transaction, with_lock, with_lock_opts, Lockable};
pub use locking_connection::{AsLockingConnection, LockOptions, LockingConnection};
pub use retry::{retry, transaction_with_retry, RetryPolicy};
pub use row_lock::{LockQueryExt, LockStrength, RowLock, WaitMode};
pub use version::VersionNumber;
pub use versioned::Versioned;

/// `#[derive(Versioned)]`: see [`Versioned`].
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use lockkit_derive::Versioned;

/// `#[derive(Lockable)]`: see [`Lockable`].
#[cfg(feature = "derive")]
#[cfg_attr(docsrs, doc(cfg(feature = "derive")))]
pub use lockkit_derive::Lockable;

/// The traits whose methods lockkit adds: `use lockkit::prelude::*;`.
pub mod prelude {
    pub use crate::lockable::{LockAll, LockRow};
    pub use crate::version_check::{CurrentVersionQuery, VersionCheck};
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
}
