//! Optimistic locking: write only if nobody wrote since you read.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`versioned`] | the [`Versioned`] model trait and its version-checked writes (start here) |
//! | [`statement`] | the `UPDATE` of a versioned write, which Diesel prepares once per connection |
//! | [`version_check`] | the SQL of a version check, and the blocking writes' run of the sequence |
//! | `sequence` | the one sequence every versioned write runs, blocking or async, decided without I/O, and what a stale write reports |
//! | [`updated_at`] | the `updated_at` column every versioned write sets to the database's clock |
//! | [`version`] | the integer types a version column may have, and their limit |
//! | [`backend`] | what each backend adds: key uniqueness, reading the latest committed version |
//! | [`journal`] | versions written inside transactions that rolled back |
//! | [`atomic`] | conditional single-statement updates, for tables without a version column |
//! | [`compare_and_set`] | writes checked against chosen columns, for tables without a version column |
//! | [`version_trigger`] | database triggers for writers that bypass lockkit |
//!
//! Versions are checked in SQL (`WHERE lock_version = $read`), so they hold across
//! processes and servers; nothing here takes a lock.

pub mod atomic;
pub mod backend;
pub mod compare_and_set;
pub mod journal;
pub(crate) mod sequence;
pub mod statement;
pub mod updated_at;
pub mod version;
pub mod version_check;
pub mod version_trigger;
pub mod versioned;

pub use version::VersionNumber;
pub use versioned::{BumpVersion, Versioned};
