//! Every supported shape compiles, and its writes run on SQLite.

use diesel::prelude::*;
use lockkit::prelude::*;

// The shapes the suite's own models already cover (a table path with Diesel's
// `AsChangeset` alongside, a marked `i16` version under another name, an `Option`
// field and `i64` key and version, `treat_none_as_null`) come from the harness,
// itself a crate downstream of the derive; this file adds the shapes only a user's
// crate shows, and runs every model's writes.
use lockkit_tests::models::{Document, DocumentNullable, Gadget, Item};
use lockkit_tests::schema::{self, documents, gadgets, order_lines};

/// `skip_update` on a field other than the version: the write leaves it alone.
#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(table_name = documents)]
pub struct DocumentKeepingTitle {
    pub id: i64,
    #[diesel(skip_update)]
    pub title: String,
    pub note: Option<String>,
    pub lock_version: i64,
}

/// Diesel keys lockkit does not read, one with a generic type as its value.
#[derive(QueryableByName, lockkit::Versioned)]
#[diesel(table_name = documents, check_for_backend(diesel::sqlite::Sqlite))]
pub struct DocumentByName {
    pub id: i64,
    pub title: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub note: Option<String>,
    pub lock_version: i64,
}

/// A composite primary key and Diesel's inferred table name (`order_lines`).
#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(primary_key(order_id, line_no))]
pub struct OrderLine {
    pub order_id: i32,
    pub line_no: i32,
    pub qty: i32,
    pub lock_version: i32,
}

fn main() -> Result<(), lockkit::Error> {
    let conn = &mut SqliteConnection::establish(":memory:").unwrap();
    diesel::connection::SimpleConnection::batch_execute(
        conn,
        "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL);
         CREATE TABLE gadgets (id INTEGER PRIMARY KEY, label TEXT NOT NULL, version SMALLINT NOT NULL);
         CREATE TABLE documents (id BIGINT PRIMARY KEY, title TEXT NOT NULL, note TEXT, lock_version BIGINT NOT NULL);
         CREATE TABLE order_lines (order_id INTEGER NOT NULL, line_no INTEGER NOT NULL, qty INTEGER NOT NULL, lock_version INTEGER NOT NULL, PRIMARY KEY (order_id, line_no));
         INSERT INTO items VALUES (1, 'widget', 10, 0);
         INSERT INTO gadgets VALUES (1, 'gizmo', 0);
         INSERT INTO documents VALUES (1, 'draft', 'keep', 0);
         INSERT INTO order_lines VALUES (7, 1, 3, 0);",
    )
    .unwrap();

    let mut item = schema::items::table.find(1).first::<Item>(conn)?;
    let mut stale = schema::items::table.find(1).first::<Item>(conn)?;
    item.stock -= 8;
    item.update_versioned(conn)?;
    assert_eq!(item.lock_version, 1);
    stale.stock -= 8;
    assert!(matches!(
        stale.update_versioned(conn),
        Err(lockkit::Error::Stale(_))
    ));
    assert_eq!(stale.lock_version, 0);

    let mut gadget = gadgets::table.find(1).first::<Gadget>(conn)?;
    gadget.label = "gadget".into();
    gadget.update_versioned(conn)?;
    assert_eq!(gadget.revision, 1);

    // `None` leaves `note` alone...
    let mut document = documents::table.find(1).first::<Document>(conn)?;
    document.note = None;
    document.update_versioned(conn)?;
    let note = documents::table
        .find(1)
        .select(documents::note)
        .first::<Option<String>>(conn)?;
    assert_eq!(note.as_deref(), Some("keep"));

    // ...unless `treat_none_as_null`; `skip_update` leaves `title` alone.
    let mut nullable = documents::table.find(1).first::<DocumentNullable>(conn)?;
    nullable.note = None;
    nullable.update_versioned(conn)?;
    let mut keeping = documents::table.find(1).first::<DocumentKeepingTitle>(conn)?;
    keeping.title = "ignored".into();
    keeping.update_versioned(conn)?;
    let (title, note, version) = documents::table
        .find(1)
        .select((documents::title, documents::note, documents::lock_version))
        .first::<(String, Option<String>, i64)>(conn)?;
    assert_eq!((title.as_str(), note, version), ("draft", None, 3));

    let mut by_name = diesel::sql_query("SELECT * FROM documents WHERE id = 1")
        .get_result::<DocumentByName>(conn)?;
    by_name.title = "final".into();
    by_name.update_versioned(conn)?;
    assert_eq!(by_name.lock_version, 4);

    let mut line = order_lines::table.find((7, 1)).first::<OrderLine>(conn)?;
    line.qty = 4;
    line.update_versioned(conn)?;
    line.touch_versioned(conn)?;
    assert_eq!(line.lock_version, 2);
    line.delete_versioned(conn)?;

    Ok(())
}
