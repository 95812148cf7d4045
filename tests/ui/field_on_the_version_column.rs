use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

// A second field on the version column: the versioned write would set the
// version from it.
#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    #[diesel(column_name = lock_version)]
    pub etag: i32,
    pub lock_version: i32,
}

fn main() {}
