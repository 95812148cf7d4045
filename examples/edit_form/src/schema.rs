//! The `items` table and its model, and the database set-up.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection};
use lockkit::Versioned;

diesel::table! {
    items (id) {
        id -> Integer,
        name -> Text,
        stock -> Integer,
        lock_version -> Integer,
    }
}

/// An item; `lock_version` is the version a form carries in a hidden field.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = items)]
pub struct Item {
    pub id: i32,
    pub name: String,
    pub stock: i32,
    pub lock_version: i32,
}

/// The app's connection pool.
pub type Pool = diesel::r2d2::Pool<ConnectionManager<SqliteConnection>>;

#[derive(Debug)]
struct BusyTimeout;

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for BusyTimeout {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute("PRAGMA busy_timeout = 5000")
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Opens the SQLite database at `path`, creates the table and, when it is
/// empty, two items.
///
/// # Errors
///
/// When the database cannot be opened or set up.
pub fn setup(path: &str) -> Result<Pool, Box<dyn std::error::Error + Send + Sync>> {
    let pool = Pool::builder()
        .max_size(4)
        .connection_customizer(Box::new(BusyTimeout))
        .build(ConnectionManager::new(path))?;
    pool.get()?.batch_execute(
        "CREATE TABLE IF NOT EXISTS items (
             id INTEGER PRIMARY KEY,
             name TEXT NOT NULL,
             stock INTEGER NOT NULL,
             lock_version INTEGER NOT NULL DEFAULT 0
         );
         INSERT OR IGNORE INTO items (id, name, stock) VALUES (1, 'Blue mug', 10), (2, 'Red kettle', 3);",
    )?;
    Ok(pool)
}
