use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Double,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub lock_version: f64,
}

fn main() {}
