//! lockkit on diesel-async (feature `async`): the same strategies, the same
//! statements and the same errors, with `.await`.
//!
//! | item | blocking twin |
//! | --- | --- |
//! | [`AsyncVersioned`]: `update_versioned`, `update_versioned_with`, `update_by_version`, `update_all_by_version`, `delete_versioned`, `touch_versioned` | [`Versioned`](crate::Versioned) |
//! | [`with_lock`], [`locked_transaction`], [`lock_all`] | [`lockkit::with_lock`](crate::with_lock), [`lockkit::locked_transaction`](crate::locked_transaction), [`Lockable::lock_all`](crate::Lockable::lock_all) |
//! | [`retry()`], [`transaction_with_retry`] | [`lockkit::retry`](crate::retry()), [`lockkit::transaction_with_retry`](crate::transaction_with_retry) |
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
//! | [`retry`](mod@retry) | [`retry()`], [`transaction_with_retry`] |
//! | [`connection`] | [`AsyncLockingConnection`]: begin and end a locking transaction per backend, and what a dropped future leaves behind ([cancellation](connection#cancellation)) |
//! | [`work`] | the shape of the `async` closures the calls take |
//!
//! Read-your-writes on a PostgreSQL standby (features `replica` and `async`):
//! [`lockkit::replica::asynchronous`](crate::replica::asynchronous).
//!
//! Not here yet: `queue::claim`, advisory locks, `serializable`, `atomic`,
//! idempotency keys, leases and the outbox on diesel-async. The
//! [`journal`](crate::journal) watches these connections too (see [`versioned`]).

pub mod connection;
pub mod lockable;
pub mod retry;
pub mod versioned;
pub mod work;

pub use connection::AsyncLockingConnection;
pub use lockable::{lock_all, locked_transaction, with_lock};
pub use retry::{retry, transaction_with_retry};
pub use versioned::AsyncVersioned;

/// The traits whose methods you call on diesel-async:
/// `use lockkit::asynchronous::prelude::*;` *instead of* `lockkit::prelude`
/// (both have `update_versioned`), with the derives.
pub mod prelude {
    pub use super::AsyncVersioned;
    pub use crate::LockQueryExt;
    #[cfg(feature = "derive")]
    pub use lockkit_derive::{Lockable, Versioned};
}
