//! The database side, written once and instantiated per backend.
//!
//! As in the `shop` example, Diesel checks query types per backend, so
//! `api_backend!` holds the statements and is instantiated for each connection
//! type (`PgConnection`, `MysqlConnection`, `SqliteConnection`) whose cargo feature
//! is on; inside it, `Conn` is that type. The rest is generic over
//! [`ApiConnection`], which every instantiation implements.

use std::time::Duration;

use diesel::r2d2::{ConnectionManager, Pool, R2D2Connection};
use diesel::QueryResult;
use lockkit::axum::IfMatchVersion;
use lockkit_tests::support::SessionSettings;

use crate::models::{Item, ItemInput};
use crate::{ApiError, Backend, Config, SetupError, Store};

/// A connection type the service runs on; implemented by `api_backend!`.
pub(crate) trait ApiConnection: R2D2Connection + 'static {
    /// Which backend this is.
    #[allow(dead_code)]
    const BACKEND: Backend;
    /// Session settings for every pooled connection.
    fn configure_session(&mut self) -> QueryResult<()>;
    /// Applies the embedded migrations of this backend.
    fn migrate(&mut self) -> Result<(), SetupError>;
    /// `SELECT .. WHERE id = ?`; [`lockkit::Error::NotFound`] when missing.
    fn find_item(&mut self, id: i32) -> Result<Item, lockkit::Error>;
    /// Inserts an item at version 0 and returns it with its new id.
    fn create_item(&mut self, input: &ItemInput) -> Result<Item, lockkit::Error>;
    /// Writes `input` over the item if its version satisfies `if_match`.
    fn update_item(
        &mut self,
        id: i32,
        if_match: &IfMatchVersion<i32>,
        input: &ItemInput,
    ) -> Result<Item, lockkit::Error>;
    /// Deletes the item if its version satisfies `if_match`.
    fn delete_item(
        &mut self,
        id: i32,
        if_match: &IfMatchVersion<i32>,
    ) -> Result<(), lockkit::Error>;
}

/// Migrates the database at `url` and builds the pool.
pub(crate) fn pool<C: ApiConnection>(
    url: &str,
    config: &Config,
) -> Result<Pool<ConnectionManager<C>>, SetupError> {
    // One direct connection first: an unreachable server fails at once with its
    // own message, instead of after the pool's connection timeout.
    let mut setup = C::establish(url)?;
    setup.configure_session()?;
    setup.migrate()?;
    drop(setup);
    Ok(Pool::builder()
        .max_size(config.pool_size.max(1))
        .min_idle(Some(1))
        .connection_timeout(config.connection_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .connection_customizer(Box::new(SessionSettings(C::configure_session)))
        .build(ConnectionManager::<C>::new(url))?)
}

impl<C: ApiConnection> Store for Pool<ConnectionManager<C>> {
    fn get(&self, id: i32) -> Result<Item, ApiError> {
        Ok(Pool::get(self)?.find_item(id)?)
    }

    fn create(&self, input: &ItemInput) -> Result<Item, ApiError> {
        Ok(Pool::get(self)?.create_item(input)?)
    }

    fn update(
        &self,
        id: i32,
        if_match: &IfMatchVersion<i32>,
        input: &ItemInput,
    ) -> Result<Item, ApiError> {
        Ok(Pool::get(self)?.update_item(id, if_match, input)?)
    }

    fn delete(&self, id: i32, if_match: &IfMatchVersion<i32>) -> Result<(), ApiError> {
        Ok(Pool::get(self)?.delete_item(id, if_match)?)
    }
}

/// Writes the statements for one connection type. See the [module docs](self).
macro_rules! api_backend {
    // PostgreSQL and SQLite: `INSERT .. RETURNING`.
    (@create returning) => {
        fn insert(conn: &mut Conn, input: &ItemInput) -> Result<Item, lockkit::Error> {
            Ok(diesel::insert_into(items::table)
                .values(input)
                .returning(Item::as_returning())
                .get_result(conn)?)
        }
    };
    // MySQL has no `RETURNING`: insert, then read the row by `LAST_INSERT_ID()`
    // (per connection, so concurrent inserts do not mix up).
    (@create last_insert_id) => {
        fn insert(conn: &mut Conn, input: &ItemInput) -> Result<Item, lockkit::Error> {
            use diesel::sql_types::{BigInt, Unsigned};
            conn.transaction(|conn| {
                diesel::insert_into(items::table).values(input).execute(conn)?;
                let id: u64 = diesel::select(diesel::dsl::sql::<Unsigned<BigInt>>(
                    "LAST_INSERT_ID()",
                ))
                .get_result(conn)?;
                let id = i32::try_from(id).map_err(|_| {
                    lockkit::Error::Database(diesel::result::Error::DeserializationError(
                        format!("id {id} does not fit the `items.id` INTEGER").into(),
                    ))
                })?;
                find(conn, id)
            })
        }
    };
    (
        $(#[$meta:meta])*
        mod $module:ident {
            connection: $conn:ty,
            backend: $backend:expr,
            migrations: $migrations:tt,
            session: $session:path,
            create: $create:ident $(,)?
        }
    ) => {
        $(#[$meta])*
        mod $module {
            use diesel::prelude::*;
            use diesel_migrations::{EmbeddedMigrations, MigrationHarness};
            use lockkit::axum::IfMatchVersion;
            use lockkit::prelude::*;

            use super::ApiConnection;
            use crate::models::{Item, ItemInput};
            use crate::schema::items;
            use crate::{Backend, SetupError};

            /// The connection type of this instantiation.
            type Conn = $conn;

            const MIGRATIONS: EmbeddedMigrations = diesel_migrations::embed_migrations!($migrations);

            fn find(conn: &mut Conn, id: i32) -> Result<Item, lockkit::Error> {
                items::table
                    .find(id)
                    .select(Item::as_select())
                    .first(conn)
                    .optional()?
                    .ok_or(lockkit::Error::NotFound)
            }

            /// The item's version now (for `If-Match: *` and lists of tags).
            fn current_version(conn: &mut Conn, id: i32) -> Result<i32, lockkit::Error> {
                items::table
                    .find(id)
                    .select(items::lock_version)
                    .first(conn)
                    .optional()?
                    .ok_or(lockkit::Error::NotFound)
            }

            api_backend!(@create $create);

            impl ApiConnection for Conn {
                const BACKEND: Backend = $backend;

                fn configure_session(&mut self) -> QueryResult<()> {
                    $session(self)
                }

                fn migrate(&mut self) -> Result<(), SetupError> {
                    self.run_pending_migrations(MIGRATIONS)
                        .map(drop)
                        .map_err(|e| SetupError::Migration(e.to_string()))
                }

                fn find_item(&mut self, id: i32) -> Result<Item, lockkit::Error> {
                    find(self, id)
                }

                fn create_item(&mut self, input: &ItemInput) -> Result<Item, lockkit::Error> {
                    insert(self, input)
                }

                /// `UPDATE items SET name = ?, stock = ?, lock_version = lock_version + 1
                /// WHERE id = ? AND lock_version = ?`: one statement; zero rows is
                /// `Error::Stale` with the current version (a `412`).
                fn update_item(
                    &mut self,
                    id: i32,
                    if_match: &IfMatchVersion<i32>,
                    input: &ItemInput,
                ) -> Result<Item, lockkit::Error> {
                    let version = if_match.apply(
                        self,
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
                fn delete_item(
                    &mut self,
                    id: i32,
                    if_match: &IfMatchVersion<i32>,
                ) -> Result<(), lockkit::Error> {
                    if_match.apply(
                        self,
                        |conn| current_version(conn, id),
                        |conn, expected| Item::delete_by_version(conn, id, expected),
                    )
                }
            }
        }
    };
}

api_backend! {
    #[cfg(feature = "postgres")]
    mod postgres {
        connection: diesel::PgConnection,
        backend: Backend::Postgres,
        migrations: "migrations/postgres",
        session: lockkit_tests::support::no_session_settings,
        create: returning,
    }
}

api_backend! {
    #[cfg(feature = "mysql")]
    mod mysql {
        connection: diesel::MysqlConnection,
        backend: Backend::Mysql,
        migrations: "migrations/mysql",
        session: lockkit_tests::support::no_session_settings,
        create: last_insert_id,
    }
}

api_backend! {
    #[cfg(feature = "sqlite")]
    mod sqlite {
        connection: diesel::SqliteConnection,
        backend: Backend::Sqlite,
        migrations: "migrations/sqlite",
        session: lockkit_tests::support::sqlite_session_settings,
        create: returning,
    }
}
