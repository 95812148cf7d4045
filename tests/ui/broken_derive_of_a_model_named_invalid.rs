// A broken derive of a model whose name is one the fallback could use for its
// own placeholder type: still one error, and none at the calls below.
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
pub struct Invalid {
    pub id: i32,
    pub stock: i32,
    #[lockkit(versoin)]
    pub lock_version: i32,
}

fn main() -> Result<(), lockkit::Error> {
    let conn = &mut SqliteConnection::establish(":memory:").unwrap();
    let mut item = items::table.find(1).select(Invalid::as_select()).first(conn)?;

    item.stock -= 1;
    item.update_versioned(conn)?;
    let _version: i32 = item.version();
    let _key: i32 = item.key();
    item.delete_versioned(conn)
}
