// A connection type lockkit does not know (here a wrapper) cannot take row locks.
use diesel::prelude::*;
use lockkit::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        stock -> Integer,
    }
}

#[derive(Queryable, Selectable, Lockable)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub stock: i32,
}

struct AppConnection(SqliteConnection);

fn main() {
    let mut conn = AppConnection(SqliteConnection::establish(":memory:").unwrap());
    let _ = lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |_conn, item: Item| Ok::<_, lockkit::Error>(item.stock));
}
