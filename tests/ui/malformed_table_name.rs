use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name)]
pub struct Item {
    pub id: i32,
    pub lock_version: i32,
}

fn main() {}
