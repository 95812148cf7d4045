//! The item, as stored and as sent.

use diesel::prelude::*;
use lockkit::Versioned;
use serde::{Deserialize, Serialize};

use crate::schema::items;

/// An item. Its JSON is `{"id", "name", "stock"}`: the version is not in the body
/// but in the `ETag` header, the one place a client must send it back from.
#[derive(
    Debug, Clone, PartialEq, Eq, Queryable, Selectable, Identifiable, Versioned, Serialize,
)]
#[diesel(table_name = items)]
pub struct Item {
    /// Primary key.
    pub id: i32,
    /// Display name.
    pub name: String,
    /// Units in stock.
    pub stock: i32,
    /// The version this row was read at (the `ETag`).
    #[serde(skip_serializing)]
    pub lock_version: i32,
}

/// The body of `POST /items` and `PUT /items/{id}`: the whole item but its key and
/// version. Unknown fields are refused, so a client cannot think it set the version.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Insertable, AsChangeset)]
#[diesel(table_name = items)]
#[serde(deny_unknown_fields)]
pub struct ItemInput {
    /// Display name, not empty.
    pub name: String,
    /// Units in stock, not negative.
    pub stock: i32,
}

impl ItemInput {
    /// Refuses an empty name or a negative stock.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` must not be empty".to_owned());
        }
        if self.stock < 0 {
            return Err(format!("`stock` must not be negative (got {})", self.stock));
        }
        Ok(())
    }
}
