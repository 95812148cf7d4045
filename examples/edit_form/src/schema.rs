//! The `items` table and its model, and the database set-up.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection};

/// The `items` table of lockkit's test suite (`setup` creates it).
pub use lockkit_tests::schema::items;

/// An item (the test suite's); `lock_version` is the version a form carries in a
/// hidden field.
pub use lockkit_tests::models::Item;

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
