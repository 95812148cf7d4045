// `no_bump` on the key, twice on a field, with a value, and together with
// `updated_at`; `updated_at` on two fields; both on a `Lockable`.
use diesel::prelude::*;

diesel::table! {
    posts (id) {
        id -> Integer,
        views -> Integer,
        likes -> Integer,
        updated_at -> Nullable<Text>,
        created_at -> Nullable<Text>,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = posts)]
pub struct Post {
    #[lockkit(no_bump)]
    pub id: i32,
    #[lockkit(no_bump, no_bump)]
    pub views: i32,
    #[lockkit(no_bump = true)]
    pub likes: i32,
    #[lockkit(updated_at, no_bump)]
    pub updated_at: Option<String>,
    #[lockkit(updated_at)]
    pub created_at: Option<String>,
    pub lock_version: i32,
}

#[derive(Queryable, lockkit::Lockable)]
#[diesel(table_name = posts)]
pub struct PostRow {
    pub id: i32,
    #[lockkit(no_bump)]
    pub views: i32,
    pub likes: i32,
    #[lockkit(updated_at)]
    pub updated_at: Option<String>,
    pub created_at: Option<String>,
}

fn main() {}
