//! The benchmark's two tables and its model (the DDL is in [`crate::run::ops`]).

use diesel::prelude::*;

/// Stock: the hot row, the workers' own rows and the order items (the test
/// suite's `items` table).
pub use lockkit_tests::schema::items;

diesel::table! {
    /// The job queue.
    jobs (id) {
        /// Primary key.
        id -> Integer,
        /// Set by the worker that ran the job.
        done -> Bool,
    }
}

/// An item (the test suite's). `#[derive(Versioned)]`: `lock_version` is its version.
pub use lockkit_tests::models::Item;

/// A job row to insert.
#[derive(Debug, Clone, Copy, Insertable)]
#[diesel(table_name = jobs)]
pub struct NewJob {
    /// Primary key.
    pub id: i32,
    /// Always `false` when seeded.
    pub done: bool,
}

/// An item row to insert.
#[derive(Debug, Clone, Insertable)]
#[diesel(table_name = items)]
pub struct NewItem {
    /// Primary key.
    pub id: i32,
    /// Display name.
    pub name: String,
    /// Units.
    pub stock: i32,
    /// Starts at 0.
    pub lock_version: i32,
}

/// The item as the peer crate `diesel_versioning` (0.1.1) models it: its own
/// `Versioned` derive over Diesel's `AsChangeset` and `Identifiable`. Its
/// `update_versioned` sends `UPDATE items SET name = ?, stock = ?,
/// lock_version = ? WHERE id = ? AND lock_version = ?`, binding the next version.
pub mod peer {
    use diesel::prelude::*;
    use diesel_versioning::Versioned;

    use super::items;

    /// An item, `diesel_versioning`'s way.
    #[derive(Debug, Clone, AsChangeset, Identifiable, Versioned)]
    #[diesel(table_name = items)]
    #[diesel(check_for_backend(diesel::pg::Pg, diesel::mysql::Mysql, diesel::sqlite::Sqlite))]
    pub struct PeerItem {
        /// Primary key.
        pub id: i32,
        /// Display name.
        pub name: String,
        /// Units left.
        pub stock: i32,
        /// The version this row was read at.
        #[version]
        pub lock_version: i32,
    }
}
