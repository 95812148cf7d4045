//! The shop's models.

use diesel::prelude::*;
use lockkit::Versioned;

use crate::schema::{items, orders};

/// An item for sale. `#[derive(Versioned)]` makes `lock_version` its
/// optimistic-locking version: `update_versioned` writes only if nobody else
/// wrote since this struct was read.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    /// Primary key.
    pub id: i32,
    /// Display name.
    pub name: String,
    /// Units left.
    pub stock: i32,
    /// The version this row was read at.
    pub lock_version: i32,
}

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
