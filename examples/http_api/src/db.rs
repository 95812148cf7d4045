//! The database side, written once: every statement runs on [`AnyConnection`],
//! Diesel's `#[derive(MultiConnection)]` over the backends whose cargo feature is
//! on (the programs' one enum, in `lockkit_tests::support`), and lockkit takes
//! it as it takes a `PgConnection`.

use std::time::Duration;

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use lockkit::axum::IfMatchVersion;
use lockkit::prelude::*;
use lockkit_tests::support::{AnyConnection, AnyPool, Migrations, SessionSettings};

use crate::models::{Item, ItemInput};
use crate::schema::items;
use crate::{ApiError, Config, SetupError, Store};

/// The service's tables, per backend; a backend whose cargo feature is off has
/// none, and `migrate` refuses it (`SetupError::Unsupported`).
const MIGRATIONS: Migrations = Migrations {
    #[cfg(feature = "postgres")]
    postgres: Some(diesel_migrations::embed_migrations!("migrations/postgres")),
    #[cfg(not(feature = "postgres"))]
    postgres: None,
    #[cfg(feature = "mysql")]
    mysql: Some(diesel_migrations::embed_migrations!("migrations/mysql")),
    #[cfg(not(feature = "mysql"))]
    mysql: None,
    #[cfg(feature = "sqlite")]
    sqlite: Some(diesel_migrations::embed_migrations!("migrations/sqlite")),
    #[cfg(not(feature = "sqlite"))]
    sqlite: None,
};

/// Migrates the database at `url` and builds the pool.
pub(crate) fn pool(url: &str, config: &Config) -> Result<AnyPool, SetupError> {
    // One direct connection first: an unreachable server fails at once with its
    // own message, instead of after the pool's connection timeout.
    let mut setup = AnyConnection::open(url)?;
    setup.configure_session()?;
    setup.migrate(MIGRATIONS)?;
    drop(setup);
    Ok(Pool::builder()
        .max_size(config.pool_size.max(1))
        .min_idle(Some(1))
        .connection_timeout(config.connection_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .connection_customizer(Box::new(SessionSettings(AnyConnection::configure_session)))
        .build(ConnectionManager::<AnyConnection>::new(url))?)
}

impl Store for AnyPool {
    fn get(&self, id: i32) -> Result<Item, ApiError> {
        Ok(find(&mut *Pool::get(self)?, id)?)
    }

    fn create(&self, input: &ItemInput) -> Result<Item, ApiError> {
        Ok(insert(&mut *Pool::get(self)?, input)?)
    }

    fn update(
        &self,
        id: i32,
        if_match: &IfMatchVersion<i32>,
        input: &ItemInput,
    ) -> Result<Item, ApiError> {
        Ok(update(&mut *Pool::get(self)?, id, if_match, input)?)
    }

    fn delete(&self, id: i32, if_match: &IfMatchVersion<i32>) -> Result<(), ApiError> {
        Ok(delete(&mut *Pool::get(self)?, id, if_match)?)
    }
}

/// `SELECT .. WHERE id = ?`; [`lockkit::Error::NotFound`] when missing.
fn find(conn: &mut AnyConnection, id: i32) -> Result<Item, lockkit::Error> {
    items::table
        .find(id)
        .select(Item::as_select())
        .first(conn)
        .optional()?
        .ok_or(lockkit::Error::NotFound)
}

/// The item's version now (for `If-Match: *` and lists of tags).
fn current_version(conn: &mut AnyConnection, id: i32) -> Result<i32, lockkit::Error> {
    items::table
        .find(id)
        .select(items::lock_version)
        .first(conn)
        .optional()?
        .ok_or(lockkit::Error::NotFound)
}

/// Inserts an item at version 0 and returns it with its new id: `INSERT ..
/// RETURNING` on PostgreSQL and SQLite, sent to the connection inside the enum
/// (Diesel's enum has no `RETURNING` once MySQL is one of its backends). MySQL
/// has no `RETURNING`: insert, then read the row by `LAST_INSERT_ID()` (per
/// connection, so concurrent inserts do not mix up).
fn insert(conn: &mut AnyConnection, input: &ItemInput) -> Result<Item, lockkit::Error> {
    #[allow(unused_macros)] // MySQL alone
    macro_rules! returning {
        ($inner:expr) => {
            diesel::insert_into(items::table)
                .values(input)
                .returning(Item::as_returning())
                .get_result($inner)?
        };
    }
    Ok(match conn {
        #[cfg(feature = "postgres")]
        AnyConnection::Pg(pg) => returning!(pg),
        #[cfg(feature = "sqlite")]
        AnyConnection::Sqlite(sqlite) => returning!(sqlite),
        #[cfg(feature = "mysql")]
        AnyConnection::Mysql(mysql) => {
            use diesel::sql_types::{BigInt, Unsigned};
            let id = mysql.transaction(|mysql| {
                diesel::insert_into(items::table)
                    .values(input)
                    .execute(mysql)?;
                diesel::select(diesel::dsl::sql::<Unsigned<BigInt>>("LAST_INSERT_ID()"))
                    .get_result::<u64>(mysql)
            })?;
            let id = i32::try_from(id).map_err(|_| {
                lockkit::Error::Database(diesel::result::Error::DeserializationError(
                    format!("id {id} does not fit the `items.id` INTEGER").into(),
                ))
            })?;
            find(conn, id)?
        }
        // A backend of the shared enum this build has no feature for: `pool`'s
        // migrations already refused it.
        #[allow(unreachable_patterns)]
        _ => {
            return Err(lockkit::Error::InvalidInput(
                "this build has no support for the connection's backend",
            ))
        }
    })
}

/// `UPDATE items SET name = ?, stock = ?, lock_version = lock_version + 1
/// WHERE id = ? AND lock_version = ?`: one statement; zero rows is
/// `Error::Stale` with the current version (a `412`).
fn update(
    conn: &mut AnyConnection,
    id: i32,
    if_match: &IfMatchVersion<i32>,
    input: &ItemInput,
) -> Result<Item, lockkit::Error> {
    let version = if_match.apply(
        conn,
        |conn| current_version(conn, id),
        |conn, expected| Item::update_by_version(conn, id, expected, input),
    )?;
    // The row as written: no second read, which could see a later write.
    Ok(Item {
        id,
        name: input.name.clone(),
        stock: input.stock,
        lock_version: version,
    })
}

/// `DELETE FROM items WHERE id = ? AND lock_version = ?`.
fn delete(
    conn: &mut AnyConnection,
    id: i32,
    if_match: &IfMatchVersion<i32>,
) -> Result<(), lockkit::Error> {
    if_match.apply(
        conn,
        |conn| current_version(conn, id),
        |conn, expected| Item::delete_by_version(conn, id, expected),
    )
}
