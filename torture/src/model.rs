//! The item model every strategy uses: versioned (optimistic writes) and
//! lockable (`with_lock`, `lock_all`) at once.

use diesel::prelude::*;
use lockkit::Versioned;

use crate::schema::torture_items;

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = torture_items)]
pub struct Item {
    pub id: i32,
    pub name: String,
    pub stock: i32,
    pub lock_version: i32,
}
