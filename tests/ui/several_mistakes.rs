// Every mistake is reported in one build, not one per build.
use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        name -> Text,
        lock_version -> Text,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items, primary_key(item_id))]
pub struct Item {
    pub id: i32,
    #[lockkit(versoin)]
    pub name: String,
    pub lock_version: String,
}

fn main() {}
