//! # lockkit: no lost updates for Diesel
//!
//! Two buyers read `stock = 10`, both buy 8, both write `stock = 2`: sixteen sold,
//! ten in stock, and no error anywhere. lockkit gives Diesel applications the
//! standard cures, typed and tested on PostgreSQL, MySQL/MariaDB and SQLite:
//!
//! * **Optimistic locking** — [`Versioned`] (`#[derive(Versioned)]`): every write
//!   checks and bumps a version column; a lost race is [`Error::Stale`].
//! * **Retry** — [`retry`] and [`transaction_with_retry`]: bounded attempts,
//!   exponential backoff, full jitter.
//! * **Typed errors** — [`Error`]: stale, busy, lock timeout, deadlock,
//!   serialization failure, classified in one place ([`classify`]).
//!
//! Start with [`versioned`] for a complete example.

#![warn(missing_docs)]

pub mod classify;
mod error;
pub mod retry;
pub mod version;
pub mod version_check;
pub mod versioned;

pub use classify::{classify, classify_nowait};
pub use error::{CurrentState, Error, Operation, Result, StaleObjectError};
pub use retry::{retry, transaction_with_retry, RetryPolicy};
pub use version::VersionNumber;
pub use versioned::Versioned;

/// `#[derive(Versioned)]`: see [`Versioned`].
#[cfg(feature = "derive")]
pub use lockkit_derive::Versioned;

/// The traits whose methods lockkit adds: `use lockkit::prelude::*;`.
pub mod prelude {
    pub use crate::version_check::{CurrentVersionQuery, VersionCheck};
    pub use crate::Versioned;
}

#[doc(hidden)]
pub mod __private {
    //! Paths the derive's generated code uses. Not public API.
    pub use diesel;
}
