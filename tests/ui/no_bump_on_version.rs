use diesel::prelude::*;

diesel::table! {
    posts (id) {
        id -> Integer,
        views -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = posts)]
pub struct Post {
    pub id: i32,
    pub views: i32,
    #[lockkit(no_bump)]
    pub lock_version: i32,
}

fn main() {}
