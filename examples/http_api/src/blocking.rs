//! What stays on blocking Diesel: the migrations at start-up, and one route,
//! `PUT /blocking/items/{id}`, the same write as `PUT /items/{id}` for a service
//! that has not moved to diesel-async.
//!
//! Blocking Diesel must not run on tokio's worker threads (a query would stall
//! every request that worker serves): the handler moves the database work to
//! tokio's blocking threads with [`tokio::task::spawn_blocking`], takes a
//! connection from an r2d2 pool there, and lets
//! [`IfMatchVersion::apply`](lockkit::axum::IfMatchVersion::apply) run the
//! version-checked write for any `If-Match`. The connection is
//! [`AnyConnection`], Diesel's `#[derive(MultiConnection)]` over the backends
//! (the programs' one enum, in `lockkit_tests::support`).
//!
//! The two routes write the same rows with the same statement, so they can
//! serve side by side while a service moves over: a client of one and a client
//! of the other that read the same `ETag` still cannot both write.

use std::time::Duration;

use axum::extract::State;
use axum::response::IntoResponse;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use lockkit::axum::IfMatchVersion;
use lockkit::prelude::*;
use lockkit_tests::support::{AnyConnection, AnyPool, Migrations, SessionSettings};

use crate::models::{Item, ItemInput};
use crate::routes::{tagged, ItemId, Valid};
use crate::schema::items;
use crate::{ApiError, App, SetupError};

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

/// Connections in the blocking pool: the one route's.
const POOL_SIZE: u32 = 2;

/// Migrates the database at `url` (creating `items` if missing) and builds the
/// blocking route's pool. Blocks.
pub(crate) fn setup(url: &str, connection_timeout: Duration) -> Result<AnyPool, SetupError> {
    // One direct connection first: an unreachable server fails at once with its
    // own message, instead of after the pool's connection timeout.
    let mut conn = AnyConnection::open(url)?;
    conn.configure_session()?;
    conn.migrate(MIGRATIONS)?;
    drop(conn);
    Ok(Pool::builder()
        .max_size(POOL_SIZE)
        .min_idle(Some(0))
        .connection_timeout(connection_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .connection_customizer(Box::new(SessionSettings(AnyConnection::configure_session)))
        .build(ConnectionManager::<AnyConnection>::new(url))?)
}

/// `PUT /blocking/items/{id}`: as `PUT /items/{id}` (`200`, `412`, `428`, `400`,
/// `404`), on blocking Diesel.
pub(crate) async fn update_item(
    State(app): State<App>,
    if_match: IfMatchVersion<i32>,
    ItemId(id): ItemId,
    Valid(input): Valid<ItemInput>,
) -> Result<impl IntoResponse, ApiError> {
    let pool = app.blocking.clone();
    let item = tokio::task::spawn_blocking(move || update(&pool, id, &if_match, input))
        .await
        .map_err(|e| ApiError::Internal(format!("database task failed: {e}")))??;
    Ok(tagged(item))
}

/// `UPDATE items SET name = ?, stock = ?, lock_version = lock_version + 1
/// WHERE id = ? AND lock_version = ?`, for the tag(s) of `If-Match`.
fn update(
    pool: &AnyPool,
    id: i32,
    if_match: &IfMatchVersion<i32>,
    input: ItemInput,
) -> Result<Item, ApiError> {
    let mut conn = pool.get()?;
    let version = if_match.apply(
        &mut *conn,
        |conn| {
            items::table
                .find(id)
                .select(items::lock_version)
                .first(conn)
                .optional()?
                .ok_or(lockkit::Error::NotFound)
        },
        |conn, expected| Item::update_by_version(conn, id, expected, &input),
    )?;
    Ok(Item {
        id,
        name: input.name,
        stock: input.stock,
        lock_version: version,
    })
}
