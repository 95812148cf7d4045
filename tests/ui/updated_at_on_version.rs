use diesel::prelude::*;

diesel::table! {
    posts (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = posts)]
pub struct Post {
    pub id: i32,
    #[lockkit(updated_at)]
    pub lock_version: i32,
}

fn main() {}
