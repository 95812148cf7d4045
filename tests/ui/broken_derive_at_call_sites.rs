// A broken derive is one error: the traits are implemented anyway, so the calls
// below add none of their own.
use diesel::prelude::*;
use lockkit::prelude::*;

diesel::table! {
    items (id) {
        id -> Integer,
        stock -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub stock: i32,
    #[lockkit(versoin)]
    pub lock_version: i32,
}

// Named as the fallback's own placeholder type could be: one error all the same.
#[derive(Identifiable, lockkit::Versioned)]
#[diesel(table_name = items)]
pub struct Invalid {
    pub id: i32,
    pub lock_version: String,
}

fn main() -> Result<(), lockkit::Error> {
    let conn = &mut SqliteConnection::establish(":memory:").unwrap();
    let mut item = items::table.find(1).select(Item::as_select()).first(conn)?;

    item.stock -= 1;
    item.update_versioned(conn)?;
    item.update_versioned_with(conn, items::stock.eq(2))?;
    item.touch_versioned(conn)?;
    let _version: i32 = item.version();
    let _key: i32 = item.key();

    let _stock: i32 = item.with_lock(conn, |_conn, locked| Ok(locked.stock))?;
    let _stock: i32 = lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |_conn, locked: Item| Ok::<_, lockkit::Error>(locked.stock))?;
    let _all: Vec<Item> = conn.transaction(|conn| Item::lock_all(conn, &[1, 2]))?;

    let mut invalid = Invalid { id: 1, lock_version: String::new() };
    invalid.update_versioned(conn)?;
    let _key: i32 = invalid.key();

    item.delete_versioned(conn)
}
