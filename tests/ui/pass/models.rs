//! Every supported shape compiles, and its writes run on SQLite.

use diesel::prelude::*;
use lockkit::prelude::*;

mod schema {
    diesel::table! {
        items (id) {
            id -> Integer,
            name -> Text,
            stock -> Integer,
            lock_version -> Integer,
        }
    }

    diesel::table! {
        gadgets (id) {
            id -> Integer,
            label -> Text,
            version -> SmallInt,
        }
    }

    diesel::table! {
        documents (id) {
            id -> BigInt,
            title -> Text,
            note -> Nullable<Text>,
            lock_version -> BigInt,
        }
    }

    diesel::table! {
        order_lines (order_id, line_no) {
            order_id -> Integer,
            line_no -> Integer,
            qty -> Integer,
            lock_version -> Integer,
        }
    }
}

use schema::{documents, gadgets, order_lines};

/// A table path, and a Diesel `AsChangeset` of its own alongside.
#[derive(Queryable, Selectable, Identifiable, AsChangeset, lockkit::Versioned)]
#[diesel(table_name = schema::items)]
pub struct Item {
    pub id: i32,
    pub name: String,
    pub stock: i32,
    pub lock_version: i32,
}

/// A marked `i16` version with a renamed column.
#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(table_name = gadgets)]
pub struct Gadget {
    pub id: i32,
    pub label: String,
    #[lockkit(version)]
    #[diesel(column_name = version)]
    pub revision: i16,
}

/// An `Option` field (skipped when `None`) and an `i64` key and version.
#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(table_name = documents)]
pub struct Document {
    pub id: i64,
    pub title: String,
    pub note: Option<String>,
    pub lock_version: i64,
}

/// The same row with `treat_none_as_null`, and a `skip_update` field.
#[derive(Queryable, Selectable, lockkit::Versioned)]
#[diesel(table_name = documents, treat_none_as_null = true)]
pub struct DocumentNullable {
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
    nullable.title = "ignored".into();
    nullable.note = None;
    nullable.update_versioned(conn)?;
    let (title, note, version) = documents::table
        .find(1)
        .select((documents::title, documents::note, documents::lock_version))
        .first::<(String, Option<String>, i64)>(conn)?;
    assert_eq!((title.as_str(), note, version), ("draft", None, 2));

    let mut by_name = diesel::sql_query("SELECT * FROM documents WHERE id = 1")
        .get_result::<DocumentByName>(conn)?;
    by_name.title = "final".into();
    by_name.update_versioned(conn)?;
    assert_eq!(by_name.lock_version, 3);

    let mut line = order_lines::table.find((7, 1)).first::<OrderLine>(conn)?;
    line.qty = 4;
    line.update_versioned(conn)?;
    line.touch_versioned(conn)?;
    assert_eq!(line.lock_version, 2);
    line.delete_versioned(conn)?;

    Ok(())
}
