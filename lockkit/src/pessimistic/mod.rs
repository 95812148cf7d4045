//! Pessimistic locking: hold the row (or a named lock) while you work on it.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`lockable`] | [`Lockable::with_lock`], [`Lockable::lock`] and [`Lockable::reload`], [`Lockable::lock_all`], [`locked_transaction`] (start here) |
//! | [`options`] | [`LockOptions`]: strength, `NOWAIT`, `SKIP LOCKED`, lock timeout |
//! | [`row_lock`] | the row-lock clause ([`RowLock`], and the common ones as types: [`row_lock::LockClause`]) and the query extensions of [`LockQueryExt`] |
//! | [`connection`] | [`LockingConnection`]: what each backend does to begin a locking transaction and bound its wait |
//! | [`queue`] | work queues with `FOR UPDATE SKIP LOCKED` |
//! | [`advisory`] | advisory locks: one job at a time without a row |
//! | [`lock_waits`] | who is waiting on whom, right now, and what the blockers are doing |

pub mod advisory;
pub mod connection;
pub mod lock_waits;
pub mod lockable;
pub mod options;
pub mod queue;
pub mod row_lock;

pub use connection::{AsLockingConnection, LockingConnection};
pub use lockable::{locked_transaction, with_lock, Lockable, NoVersion};
pub use options::LockOptions;
pub use row_lock::{LockQueryExt, LockStrength, RowLock, WaitMode};
