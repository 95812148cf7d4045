use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    #[lockkit(foo)]
    pub lock_version: i32,
}

fn main() {}
