//! # http_api: no lost updates over HTTP
//!
//! An axum service over one table, `items (id, name, stock, lock_version)`, where
//! the row's version travels as a strong `ETag` and comes back in `If-Match`:
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /items/{id}` | `200`, the item as JSON, `ETag: "v<version>"`; `404` |
//! | `POST /items` `{"name": .., "stock": ..}` | `201`, `Location`, `ETag`, the item |
//! | `PUT /items/{id}` + `If-Match` + `{"name": .., "stock": ..}` | `200` with the new `ETag`; `412` if the item changed since that `ETag` was read (the body is `application/problem+json` with the current ETag); `428` without `If-Match`; `400` for a malformed one; `404` |
//! | `DELETE /items/{id}` + `If-Match` | `204`; `412`, `428`, `400`, `404` as for `PUT` |
//!
//! `If-Match: *` writes whatever the version (the item must exist); a list of
//! tags writes if the item is at any of them; weak tags (`W/"v3"`) never match.
//! Errors are RFC 9457 problem details (`application/problem+json`).
//!
//! The writes are [`lockkit::Versioned::update_by_version`] and
//! `delete_versioned`: one statement that checks and bumps the version, so two
//! clients that read the same `ETag` cannot both write. The extractor and the
//! error responses come from [`lockkit::axum`].
//!
//! Diesel is synchronous: every handler runs its database work on tokio's blocking
//! threads ([`tokio::task::spawn_blocking`]) with a connection from an r2d2 pool.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let app = http_api::connect("http_api.sqlite", &http_api::Config::default())?;
//! let runtime = tokio::runtime::Runtime::new()?;
//! runtime.block_on(async {
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     http_api::serve(listener, app).await
//! })?;
//! # Ok(()) }
//! ```
//!
//! The backend follows the URL: `postgres://` or `postgresql://` is PostgreSQL,
//! `mysql://` is MySQL/MariaDB, anything else is a SQLite file path.

#![warn(missing_docs)]

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod db;
mod error;
pub mod models;
mod routes;
pub mod schema;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;

pub use error::{ApiError, SetupError};
pub use lockkit_tests::support::Backend;
pub use routes::router;

use crate::models::{Item, ItemInput};
use lockkit::axum::IfMatchVersion;

/// The knobs of the service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Connections in the pool: at most this many requests use the database at
    /// once; the others wait for a connection.
    pub pool_size: u32,
    /// How long a request waits for a pooled connection before `503`.
    pub connection_timeout: Duration,
}

impl Default for Config {
    /// 8 connections, 30 s wait.
    fn default() -> Self {
        Config {
            pool_size: 8,
            connection_timeout: Duration::from_secs(30),
        }
    }
}

/// The items, on whatever backend: what the handlers call, on a blocking thread.
pub(crate) trait Store: Send + Sync + 'static {
    fn get(&self, id: i32) -> Result<Item, ApiError>;
    fn create(&self, input: &ItemInput) -> Result<Item, ApiError>;
    fn update(
        &self,
        id: i32,
        if_match: &IfMatchVersion<i32>,
        input: &ItemInput,
    ) -> Result<Item, ApiError>;
    fn delete(&self, id: i32, if_match: &IfMatchVersion<i32>) -> Result<(), ApiError>;
}

/// The service's state: the connection pool of one backend. Cheap to clone.
#[derive(Clone)]
pub struct App {
    store: Arc<dyn Store>,
    backend: Backend,
}

impl fmt::Debug for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("App")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl App {
    /// The backend this service runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Runs `work` on a blocking thread (Diesel is synchronous).
    pub(crate) async fn blocking<T, F>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, ApiError> + Send + 'static,
    {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || work(&*store))
            .await
            .map_err(|e| ApiError::Internal(format!("database task failed: {e}")))?
    }
}

/// Connects to the database at `url`, applies the migrations (creating `items`
/// if missing) and builds the pool. Blocks: call it before starting the runtime
/// or on a blocking thread.
///
/// The URL selects the backend (see [`Backend::from_url`]); a backend whose cargo
/// feature is off is a [`SetupError::Unsupported`].
pub fn connect(url: &str, config: &Config) -> Result<App, SetupError> {
    let backend = Backend::from_url(url);
    let url = lockkit_tests::support::connection_url(url);
    let store = store(url, backend, config)?;
    Ok(App { store, backend })
}

/// The pool, as the routes use it.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn store(url: &str, backend: Backend, config: &Config) -> Result<Arc<dyn Store>, SetupError> {
    let _ = backend; // the URL says it again
    Ok(Arc::new(db::pool(url, config)?))
}

/// A build without a backend feature serves nothing.
#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn store(url: &str, backend: Backend, config: &Config) -> Result<Arc<dyn Store>, SetupError> {
    let _ = (url, config);
    Err(SetupError::Unsupported(backend))
}

/// Serves the API on `listener` until the future is dropped (or, with
/// `.with_graceful_shutdown(..)` on the result, until the signal).
pub fn serve(
    listener: tokio::net::TcpListener,
    app: App,
) -> axum::serve::Serve<tokio::net::TcpListener, Router, Router> {
    axum::serve(listener, router(app))
}
