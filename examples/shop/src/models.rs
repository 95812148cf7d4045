//! The shop's models.

use diesel::prelude::*;

use crate::schema::orders;

/// An item for sale: lockkit's test suite's `Item`, whose `#[derive(Versioned)]`
/// makes `lock_version` its optimistic-locking version: `update_versioned` writes
/// only if nobody else wrote since this struct was read.
pub use lockkit_tests::models::Item;

/// An accepted purchase (or one line of a basket), to insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Insertable)]
#[diesel(table_name = orders)]
pub struct NewOrder {
    /// The item bought.
    pub item_id: i32,
    /// Units bought.
    pub qty: i32,
    /// The basket this line belongs to; `None` for a single-item purchase.
    pub basket_id: Option<i32>,
}
