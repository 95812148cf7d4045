//! lockkit on diesel-async (feature `async`): the same strategies, the same
//! statements and the same errors, with `.await`.
//!
//! | item | blocking twin |
//! | --- | --- |
//! | [`AsyncVersioned`]: `update_versioned`, `update_versioned_with`, `update_by_version`, `update_all_by_version`, `delete_versioned`, `delete_by_version`, `touch_versioned` | [`Versioned`](crate::Versioned) |
//! | [`with_lock`], [`locked_transaction`], [`lock_all`] | [`lockkit::with_lock`](crate::with_lock), [`lockkit::locked_transaction`](crate::locked_transaction), [`Lockable::lock_all`](crate::Lockable::lock_all) |
//! | [`retry()`], [`transaction_with_retry`] | [`lockkit::retry`](crate::retry()), [`lockkit::transaction_with_retry`](crate::transaction_with_retry) |
//! | [`queue::claim`] | [`lockkit::queue::claim`](crate::queue::claim) |
//! | [`advisory::with_lock`], [`advisory::try_with_lock`] (a closure, no guard), [`advisory::xact_lock`], [`advisory::try_xact_lock`] (PostgreSQL) | [`lockkit::advisory`](crate::advisory) |
//! | [`serializable()`] | [`lockkit::serializable`](crate::serializable()) |
//! | [`atomic::update_if`], [`atomic::update_returning`], [`atomic::update_counters`] | [`lockkit::atomic`](crate::atomic) |
//! | [`lock_waits::session_id`], [`lock_waits::blocked_sessions`], [`lock_waits::current`] (PostgreSQL, MySQL/MariaDB) | [`lockkit::lock_waits`](crate::lock_waits) |
//! | [`idempotency::run`], [`idempotency::purge_expired`] (feature `idempotency`) | [`Idempotency::run`](crate::idempotency::Idempotency::run), [`Idempotency::purge_expired`](crate::idempotency::Idempotency::purge_expired) |
//! | [`lease::acquire`], [`lease::with_lease`], [`lease::fenced`] (feature `lease`; the database store) | [`lockkit::lease::acquire`](crate::lease::acquire), [`lockkit::lease::with_lease`](crate::lease::with_lease), [`lockkit::lease::fenced`](crate::lease::fenced) |
//! | [`outbox::enqueue`], [`outbox::publish_batch`], [`outbox::receive`] and the rest (feature `outbox`) | [`lockkit::outbox`](crate::outbox) |
//!
//! Blocking only, with no async twin yet: [`Versioned::update_if`](crate::Versioned::update_if)
//! (the versioned conditional update; [`atomic::update_if`] is the unversioned one),
//! [`Lockable::lock`](crate::Lockable::lock) and [`reload`](crate::Lockable::reload),
//! [`compare_and_set`](crate::compare_and_set), adaptive writes
//! ([`adaptive`](crate::adaptive)), [`after_commit`](crate::after_commit()) and the
//! advisory lock guard ([`advisory::lock`](crate::advisory::lock); use the closures
//! above).
//!
//! Connections: `AsyncPgConnection`, `AsyncMysqlConnection` and
//! `SyncConnectionWrapper<SqliteConnection>` (with the features `postgres`,
//! `mysql`, `sqlite`), and the connections of diesel-async's bb8 and deadpool
//! pools, passed as `&mut *conn`. The statements are built by the blocking
//! side's code (the versioned `UPDATE`, the lock clauses, the follow-up reads,
//! the session settings) and errors are classified in the one place
//! ([`classify`](crate::classify())); this module only awaits them.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`versioned`] | [`AsyncVersioned`], the version-checked writes |
//! | [`lockable`] | [`with_lock`], [`locked_transaction`], [`lock_all`] |
//! | `retry` (private) | [`retry()`], [`transaction_with_retry`] |
//! | [`queue`] | [`queue::claim`]: work queues with `FOR UPDATE SKIP LOCKED` |
//! | [`advisory`] | advisory locks for the length of a closure, and what a dropped one leaves ([cancellation](advisory#cancellation)) |
//! | [`isolation`] | [`serializable()`]: `SERIALIZABLE` transactions, retried |
//! | [`atomic`] | conditional single-statement updates and counters |
//! | [`lock_waits`] | who is waiting on whom |
//! | [`connection`] | [`AsyncLockingConnection`]: begin and end a locking transaction per backend, and what a dropped future leaves behind ([cancellation](connection#cancellation)) |
//! | [`work`] | the shape of the `async` closures the calls take |
//! | `transaction` (private) | how every async lockkit transaction ends: commit or roll back, and the caller's error |
//! | [`idempotency`](mod@idempotency) | idempotency keys, and what a dropped `run` leaves |
//! | [`lease`](mod@lease) | database leases and fenced writes |
//! | [`outbox`](mod@outbox) | the outbox's enqueue and relay, and the inbox |
//!
//! Read-your-writes on a PostgreSQL standby (features `replica` and `async`):
//! [`lockkit::replica::asynchronous`](crate::replica::asynchronous).
//!
//! The [`journal`](crate::journal) watches these connections too (see
//! [`versioned`]).

pub mod advisory;
pub mod atomic;
pub mod connection;
#[cfg(feature = "idempotency")]
pub mod idempotency;
pub mod isolation;
#[cfg(feature = "lease")]
pub mod lease;
pub mod lock_waits;
pub mod lockable;
#[cfg(feature = "outbox")]
pub mod outbox;
pub mod queue;
mod read_only_sessions;
mod retry;
mod transaction;
pub mod versioned;
pub mod work;

pub use connection::AsyncLockingConnection;
pub use isolation::serializable;
pub use lockable::{lock_all, locked_transaction, with_lock};
#[cfg(feature = "mysql")]
pub use read_only_sessions::read_only_outside_transactions;
pub use retry::{retry, transaction_with_retry};
pub use versioned::AsyncVersioned;

/// The traits whose methods you call on diesel-async:
/// `use lockkit::asynchronous::prelude::*;` *instead of* `lockkit::prelude`
/// (both have `update_versioned`), with the derives.
pub mod prelude {
    pub use super::AsyncVersioned;
    pub use crate::pessimistic::row_lock::LockQueryExt;
    #[cfg(feature = "derive")]
    pub use lockkit_derive::{Lockable, Versioned};
}
