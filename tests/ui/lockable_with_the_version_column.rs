use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        stock -> Integer,
        lock_version -> Integer,
    }
}

// A `Lockable` model reading the version column: its locks would not advance
// the version, and an editor holding a `Versioned` copy of the row would write
// over the locked change.
#[derive(Queryable, Selectable, lockkit::Lockable)]
#[diesel(table_name = items)]
pub struct ItemStock {
    pub id: i32,
    pub stock: i32,
    pub lock_version: i32,
}

fn main() {}
