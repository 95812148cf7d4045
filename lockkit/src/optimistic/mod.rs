//! Optimistic locking: write only if nobody wrote since you read.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`versioned`] | the [`Versioned`] model trait, its version-checked writes and the bound traits they name, and their run on a blocking connection (start here) |
//! | [`statement`] | the `UPDATE` of a versioned write, which Diesel prepares once per connection |
//! | [`version_check`] | the SQL of a version check: the implementations of the bound traits, for every model and connection |
//! | `sequence` | the one sequence every versioned write runs, blocking or async, decided without I/O, and what a stale write reports |
//! | [`bump_on_lock`] | what an exclusive lock writes to a versioned row, and PostgreSQL's one-statement lock and bump |
//! | [`updated_at`] | the `updated_at` column every versioned write sets to the database's clock |
//! | [`version`] | the integer types a version column may have, and their limit |
//! | `table` | a table as the database names it (`"archive"."items"`): what the journal and the key check name |
//! | [`backend`] | what each backend adds: key uniqueness, reading the latest committed version |
//! | `rollbacks` | what the versioned writes record in the [`journal`]: the versions written inside transactions that did not commit, and how a struct holding one writes |
//! | `mark` | the mark of a write on a connection the journal cannot watch, which its transaction keeps or rolls back with it |
//! | [`atomic`] | conditional single-statement updates, for tables without a version column |
//! | [`compare_and_set`] | writes checked against chosen columns, for tables without a version column |
//! | [`version_trigger`] | database triggers for writers that bypass lockkit |
//!
//! Versions are checked in SQL (`WHERE lock_version = $read`), so they hold across
//! processes and servers; nothing here takes a lock but what
//! [`bump_on_lock`] writes under the row lock of `with_lock`.

pub mod atomic;
pub mod backend;
pub mod bump_on_lock;
pub mod compare_and_set;
pub(crate) mod mark;
pub(crate) mod rollbacks;
pub(crate) mod sequence;
pub mod statement;
pub(crate) mod table;
pub mod updated_at;
pub mod version;
pub mod version_check;
pub mod version_trigger;
pub mod versioned;

// The journal lives on the ground floor, where every transaction is watched.
pub use crate::transaction::journal;
#[doc(hidden)]
pub use mark::Mark;
pub use version::VersionNumber;
pub use versioned::{BumpVersion, Versioned};
