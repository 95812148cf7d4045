use diesel::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        name -> Text,
        lock_version -> Integer,
    }
}

pub struct Name(pub String);

impl From<Name> for String {
    fn from(name: Name) -> String {
        name.0
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    #[diesel(serialize_as = String)]
    pub name: Name,
    pub lock_version: i32,
}

fn main() {}
