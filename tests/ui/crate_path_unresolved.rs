// A `crate` path that names nothing: one error, at the path, and nothing
// from the generated impls or the call site below.
use diesel::prelude::*;
use lockkit::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(table_name = items)]
#[lockkit(crate = "no_such_facade::lockkit")]
pub struct Item {
    pub id: i32,
    pub lock_version: i32,
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let mut item = Item { id: 1, lock_version: 0 };
    let _ = item.update_versioned(&mut conn);
}
