use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        revision -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    #[lockkit(version = true)]
    pub revision: i32,
}

fn main() {}
