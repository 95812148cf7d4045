use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        name -> Text,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub name: String,
}

fn main() {}
