// A `#[derive(diesel::MultiConnection)]` enum that does not say which backend it
// holds: lockkit asks for `lockkit::multi::Dispatch`, in those words.
use diesel::prelude::*;

diesel::table! { items (id) { id -> Integer, stock -> Integer } }

#[derive(Queryable, Selectable, lockkit::Lockable)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub stock: i32,
}

#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    Sqlite(SqliteConnection),
}

fn main() {
    let mut conn = AnyConnection::establish(":memory:").unwrap();
    let _ = lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |_, item: Item| {
        Ok::<_, lockkit::Error>(item.stock)
    });
}
