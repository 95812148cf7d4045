use diesel::prelude::*;

diesel::table! {
    items (code) {
        code -> Text,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub code: String,
    pub lock_version: i32,
}

fn main() {}
