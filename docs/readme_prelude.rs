// The `items` table and `Item` model of the README's quick start, for the README's
// other examples (compiled as doc tests of the lockkit crate).
use diesel::prelude::*;
use lockkit::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        name -> Text,
        stock -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Debug, Queryable, Selectable, Identifiable, AsChangeset, Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub name: String,
    pub stock: i32,
    pub lock_version: i32,
}
