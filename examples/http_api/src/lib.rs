//! # http_api: no lost updates over HTTP
//!
//! An axum service over one table, `items (id, name, stock, lock_version)`, where
//! the row's version travels as a strong `ETag` and comes back in `If-Match`:
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /items/{id}` | `200`, the item as JSON, `ETag: "v<version>"`; `404` |
//! | `POST /items` `{"name": .., "stock": ..}` | `201`, `Location`, `ETag`, the item; `422` for an empty name, one over 255 characters or with a NUL, or a negative stock |
//! | `PUT /items/{id}` + `If-Match` + `{"name": .., "stock": ..}` | `200` with the new `ETag`; `412` if the item changed since that `ETag` was read (the body is `application/problem+json` with the current ETag); `428` without `If-Match`; `400` for a malformed one; `404`; `422` for a body `POST` refuses |
//! | `DELETE /items/{id}` + `If-Match` | `204`; `412`, `428`, `400`, `404` as for `PUT` |
//!
//! `If-Match: *` writes whatever the version (the item must exist); a list of
//! tags writes if the item is at any of them; weak tags (`W/"v3"`) never match.
//! Errors are RFC 9457 problem details (`application/problem+json`).
//!
//! Two more routes change the stock on the server, with no `If-Match`:
//!
//! | request | answer |
//! | --- | --- |
//! | `POST /items/{id}/sell` `{"quantity": n}` | `200` with the item and its new `ETag`; `409` when fewer than `n` are in stock; `503` when the row stays locked past the lock timeout; `404` |
//! | `POST /items/{id}/restock` `{"quantity": n}` | `200` with the item and its new `ETag`; `503` when every attempt met a conflict; `404` |
//!
//! The service runs on [diesel-async](https://docs.rs/diesel-async): a bb8 pool
//! of `AsyncPgConnection`, `AsyncMysqlConnection` or
//! `SyncConnectionWrapper<SqliteConnection>`, and lockkit's async calls
//! ([`lockkit::asynchronous`]):
//!
//! * `PUT` and `DELETE` are `AsyncVersioned::update_by_version` and
//!   `delete_by_version`: one statement that checks and bumps the version, so
//!   two clients that read the same `ETag` cannot both write; `If-Match: *`
//!   re-reads and writes again under `asynchronous::retry` when another writer
//!   got in between.
//! * a sale is `asynchronous::with_lock`: the row is read `FOR UPDATE` (SQLite:
//!   `BEGIN IMMEDIATE`), checked and written under the lock.
//! * a restock is a read and `update_versioned` in
//!   `asynchronous::transaction_with_retry`, run again on a conflict.
//!
//! What this service leaves out, on purpose, to stay small: `sell` and
//! `restock` are not idempotent (a client that lost the answer and sends the
//! request again sells twice: take an `Idempotency-Key` with
//! `lockkit::asynchronous::idempotency::run`), and its tags are the plain
//! `"v<version>"`, which item 2 at the same version also matches (bound tags,
//! `lockkit::etag::ETagSecret`, fit one item only; see the README).
//!
//! A client that goes away mid-request drops its handler's future, with the
//! transaction still open on the connection: the pool sees it when the
//! connection comes back and closes it, which ends the transaction and frees
//! the row (`tests/http_api.rs` checks it on every backend).
//!
//! `PUT /blocking/items/{id}` is the same `PUT` on blocking Diesel, kept to show
//! that form (`spawn_blocking` and an r2d2 pool; see `blocking.rs`). The
//! extractor and the error responses come from [`lockkit::axum`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = tokio::runtime::Runtime::new()?;
//! runtime.block_on(async {
//!     let app = http_api::connect("http_api.sqlite", &http_api::Config::default()).await?;
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     http_api::serve(listener, app).await?;
//!     Ok(())
//! })
//! # }
//! ```
//!
//! The backend follows the URL: `postgres://` or `postgresql://` is PostgreSQL,
//! `mysql://` is MySQL/MariaDB, anything else is a SQLite file path.

#![warn(missing_docs)]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("http_api needs a backend: the feature `sqlite`, `postgres` or `mysql`");

mod blocking;
mod db;
mod error;
pub mod models;
mod routes;
pub mod schema;

use std::fmt;
use std::time::Duration;

use axum::Router;
use lockkit::{LockOptions, RetryPolicy};
use lockkit_tests::support::AnyPool;

pub use error::{ApiError, SetupError};
pub use lockkit_tests::support::Backend;
pub use routes::router;

/// The knobs of the service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Connections in the pool: at most this many requests use the database at
    /// once; the others wait for a connection.
    pub pool_size: u32,
    /// How long a request waits for a pooled connection before `503`.
    pub connection_timeout: Duration,
    /// How long a sale waits for the row's lock before `503`.
    pub lock_timeout: Duration,
    /// How a restock retries on conflict.
    pub retry: RetryPolicy,
    /// How long a sale holds the row's lock before it writes: zero. The tests
    /// raise it to have a request hold the lock while its client goes away.
    pub sale_delay: Duration,
}

impl Default for Config {
    /// 8 connections, 30 s wait for one, 5 s for a lock, lockkit's default
    /// retry policy (5 attempts), no sale delay.
    fn default() -> Self {
        Config {
            pool_size: 8,
            connection_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            sale_delay: Duration::ZERO,
        }
    }
}

/// The service's state: the connection pools of one backend and the knobs.
/// Cheap to clone.
#[derive(Clone)]
pub struct App {
    db: db::Pools,
    blocking: AnyPool,
    backend: Backend,
    lock_timeout: Duration,
    retry: RetryPolicy,
    sale_delay: Duration,
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

    /// How a sale locks its row.
    pub(crate) fn lock_options(&self) -> LockOptions {
        LockOptions::default().timeout(self.lock_timeout)
    }
}

/// Connects to the database at `url`, applies the migrations (creating `items`
/// if missing; on a blocking thread, with blocking Diesel) and builds the pools.
///
/// The URL selects the backend (see [`Backend::from_url`]); a backend whose cargo
/// feature is off is a [`SetupError::Unsupported`].
pub async fn connect(url: &str, config: &Config) -> Result<App, SetupError> {
    let backend = Backend::from_url(url);
    let url = lockkit_tests::support::connection_url(url).to_owned();
    let setup = {
        let (url, timeout) = (url.clone(), config.connection_timeout);
        tokio::task::spawn_blocking(move || blocking::setup(&url, timeout))
    };
    let blocking = setup
        .await
        .map_err(|_| SetupError::Panicked("migration"))??;
    let db = db::Pools::new(&url, backend, config).await?;
    Ok(App {
        db,
        blocking,
        backend,
        lock_timeout: config.lock_timeout,
        retry: config.retry.clone(),
        sale_delay: config.sale_delay,
    })
}

/// Serves the API on `listener` until the future is dropped (or, with
/// `.with_graceful_shutdown(..)` on the result, until the signal).
pub fn serve(
    listener: tokio::net::TcpListener,
    app: App,
) -> axum::serve::Serve<tokio::net::TcpListener, Router, Router> {
    axum::serve(listener, router(app))
}
