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

/// The longest `name`, in characters: MySQL/MariaDB's column is `VARCHAR(255)`
/// (characters, not bytes), and refuses a longer one (or, without strict
/// mode, cuts it). The same limit on every backend, so that what the API takes
/// does not depend on the database under it.
pub const NAME_MAX_CHARS: usize = 255;

/// The body of `POST /items` and `PUT /items/{id}`: the whole item but its key and
/// version. Unknown fields are refused, so a client cannot think it set the version.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, Insertable, AsChangeset)]
#[diesel(table_name = items)]
#[serde(deny_unknown_fields)]
pub struct ItemInput {
    /// Display name: not empty, at most [`NAME_MAX_CHARS`] characters, no NUL.
    pub name: String,
    /// Units in stock, not negative.
    pub stock: i32,
}

impl ItemInput {
    /// Refuses an empty name, a name some backend's column cannot hold (too
    /// long, or with a NUL, which PostgreSQL's `text` refuses), or a negative
    /// stock: checked here, they are a `422`; left to the database, a `500`.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` must not be empty".to_owned());
        }
        let chars = self.name.chars().count();
        if chars > NAME_MAX_CHARS {
            return Err(format!(
                "`name` must be at most {NAME_MAX_CHARS} characters (got {chars})"
            ));
        }
        if self.name.contains('\0') {
            return Err("`name` must not contain NUL (\\u0000)".to_owned());
        }
        if self.stock < 0 {
            return Err(format!("`stock` must not be negative (got {})", self.stock));
        }
        Ok(())
    }
}
