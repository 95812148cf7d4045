// Row-lock clauses do not exist on SQLite: `FOR UPDATE OF` must not compile there.
use diesel::prelude::*;
use lockkit::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        stock -> Integer,
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let _ = items::table
        .select(items::id)
        .for_update_of(items::table)
        .load::<i32>(&mut conn);
}
