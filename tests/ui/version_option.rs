use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Nullable<Integer>,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub lock_version: Option<i32>,
}

fn main() {}
