//! Idempotency keys: run a request's work at most once per client key
//! (feature `idempotency`).
//!
//! A client that retries a `POST` after a timeout cannot know whether the first
//! attempt went through. With an idempotency key (e.g. the `Idempotency-Key`
//! header) the server runs the work once and answers every repeat with the stored
//! result.
//!
//! | situation | result | HTTP |
//! | --- | --- | --- |
//! | first request for the key | the work runs; its response is stored | 2xx |
//! | repeat after it completed | [`Outcome::Replayed`] with the stored response; the work does not run | the stored status |
//! | repeat while the first still runs | [`Error::IdempotencyInProgress`] | 409 |
//! | same key, different request (fingerprint) | [`Error::IdempotencyKeyReused`] | 422 |
//! | the work failed | the key is released: the next attempt runs it again | the error's |
//! | the process died between start and finish | after the lease (default 60 s) the next attempt takes the key over and runs the work | |
//!
//! **Expiry:** a completed key is kept for the retention period (default 24 h)
//! after it finished; a repeat after that runs the work again, and
//! [`Idempotency::purge_expired`] deletes such keys (run it from a periodic job).
//! Times come from the application's clock (Unix milliseconds), so keep server
//! clocks in sync to within a small fraction of the lease.
//!
//! **Exactly once:** the work runs in a transaction together with the write that
//! marks the key completed. If the lease ran out and another request took the key
//! over in the meantime, that final write matches nothing and the work is rolled
//! back ([`Error::IdempotencyInProgress`]), so the database sees it at most once.
//!
//! The table's SQL comes as plain strings, [`up_sql`] and [`down_sql`] per
//! [`Dialect`], to copy into your own migrations. With the feature
//! `idempotency-migrations` it also ships as embedded migrations: run
//! `conn.run_pending_migrations(lockkit::idempotency::POSTGRES_MIGRATIONS)` (or
//! `MYSQL_MIGRATIONS`, `SQLITE_MIGRATIONS`) with `diesel_migrations::MigrationHarness`.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! # use diesel::prelude::*;
//! use diesel::connection::SimpleConnection;
//! use lockkit::idempotency::{up_sql, Dialect, Idempotency, Outcome};
//! let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! conn.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
//!
//! let keys = Idempotency::default();
//! let first = keys.run(&mut conn, "order-42", "POST /orders {qty:1}", |_conn| Ok::<_, lockkit::Error>("201 order 7".to_owned())).unwrap();
//! assert_eq!(first, Outcome::Ran("201 order 7".to_owned()));
//! let again = keys.run(&mut conn, "order-42", "POST /orders {qty:1}", |_conn| -> Result<String, lockkit::Error> { unreachable!() }).unwrap();
//! assert_eq!(again, Outcome::Replayed("201 order 7".to_owned()));
//! # }
//! ```
//!
//! Keys and fingerprints are 1 to 255 characters without NUL (PostgreSQL cannot
//! store it), checked before anything is sent, and always travel as bound
//! parameters.

// Without a backend feature nothing implements the store: the feature still builds.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, unused_imports)
)]

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::{millis, now_millis};
use crate::pessimistic::connection::AsLockingConnection;
use crate::transaction::{self, Failure};
use crate::Error;

pub use crate::version_trigger::Dialect;

/// `CREATE TABLE lockkit_idempotency_keys`, the table [`Idempotency`] uses, for
/// `dialect`: put it in a migration.
///
/// ```
/// use lockkit::idempotency::{up_sql, Dialect};
/// assert!(up_sql(Dialect::Postgres).contains("CREATE TABLE lockkit_idempotency_keys"));
/// ```
pub fn up_sql(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => include_str!(
            "../../migrations/idempotency/postgres/2026-11-30-000000_lockkit_idempotency/up.sql"
        ),
        Dialect::Mysql => include_str!(
            "../../migrations/idempotency/mysql/2026-11-30-000000_lockkit_idempotency/up.sql"
        ),
        Dialect::Sqlite => include_str!(
            "../../migrations/idempotency/sqlite/2026-11-30-000000_lockkit_idempotency/up.sql"
        ),
    }
}

/// Drops the table [`up_sql`] creates (a migration's `down.sql`).
pub fn down_sql(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => include_str!(
            "../../migrations/idempotency/postgres/2026-11-30-000000_lockkit_idempotency/down.sql"
        ),
        Dialect::Mysql => include_str!(
            "../../migrations/idempotency/mysql/2026-11-30-000000_lockkit_idempotency/down.sql"
        ),
        Dialect::Sqlite => include_str!(
            "../../migrations/idempotency/sqlite/2026-11-30-000000_lockkit_idempotency/down.sql"
        ),
    }
}

/// The idempotency table's migration for PostgreSQL.
#[cfg(all(feature = "idempotency-migrations", feature = "postgres"))]
#[cfg_attr(
    docsrs,
    doc(cfg(all(feature = "idempotency-migrations", feature = "postgres")))
)]
pub const POSTGRES_MIGRATIONS: diesel_migrations::EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations/idempotency/postgres");
/// The idempotency table's migration for MySQL/MariaDB.
#[cfg(all(feature = "idempotency-migrations", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(all(feature = "idempotency-migrations", feature = "mysql")))
)]
pub const MYSQL_MIGRATIONS: diesel_migrations::EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations/idempotency/mysql");
/// The idempotency table's migration for SQLite.
#[cfg(all(feature = "idempotency-migrations", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(all(feature = "idempotency-migrations", feature = "sqlite")))
)]
pub const SQLITE_MIGRATIONS: diesel_migrations::EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations/idempotency/sqlite");

mod schema {
    diesel::table! {
    lockkit_idempotency_keys (idempotency_key) {
        idempotency_key -> Text,
        fingerprint -> Text,
        state -> Text,
        response -> Nullable<Text>,
        started_at -> BigInt,
        finished_at -> Nullable<BigInt>,
    }
    }
}

use schema::lockkit_idempotency_keys as keys;

const RUNNING: &str = "running";
const DONE: &str = "done";
const MAX_LEN: usize = 255;

/// What [`Idempotency::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// The work ran now; this is its response (now stored).
    Ran(T),
    /// The work had already run for this key; this is the stored response.
    Replayed(T),
}

impl<T> Outcome<T> {
    /// The response either way.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Ran(value) | Outcome::Replayed(value) => value,
        }
    }
}

/// Idempotency settings: the lease of a running key and the retention of a
/// completed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency {
    /// How long a running key is protected before another request may take it
    /// over (it must exceed the longest run of the work). Default 60 s.
    pub lease: Duration,
    /// How long a completed key is kept. Default 24 h.
    pub retention: Duration,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// A stored key, as [`IdempotencyStore`] reads it.
#[doc(hidden)]
#[derive(Debug, Clone, diesel::Queryable)]
pub struct StoredKey {
    pub fingerprint: String,
    pub state: String,
    pub response: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

/// How a request starts: it owns the key (from `started_at`) or replays.
enum Start {
    Owned { started_at: i64 },
    Replay(String),
}

impl Idempotency {
    /// Runs `work` at most once for `key`; see the [module docs](self).
    ///
    /// `fingerprint` identifies the request (e.g. method, path and a hash of the
    /// body): a key reused for another request is refused. `work` returns the
    /// response to store and replay: any `Serialize + DeserializeOwned` value,
    /// stored as JSON. Its error type is yours, as in Diesel's `transaction`: any
    /// `E` that a [`lockkit::Error`](Error) converts into.
    ///
    /// # Errors
    ///
    /// lockkit's errors reach you converted into `E`:
    ///
    /// * [`Error::InvalidInput`] when `key` is empty, or `key` or `fingerprint` is
    ///   longer than 255 characters or contains NUL; nothing is sent.
    /// * [`Error::IdempotencyKeyReused`] when the key was used for a request with
    ///   another fingerprint.
    /// * [`Error::IdempotencyInProgress`] when another request holds the key (its
    ///   lease has not run out), or took it over while `work` ran (which is then
    ///   rolled back).
    /// * whatever `work` returns, untouched; its transaction is rolled back and
    ///   the key released, so a retry runs it again.
    /// * [`Error::Database`] with Diesel's `SerializationError` when the response
    ///   cannot be written as JSON, or `DeserializationError` when a stored one
    ///   does not read as `R` (the response type changed since it was stored).
    /// * a classified database error; see [`classify`](crate::classify()).
    pub fn run<C, R, E, F>(
        &self,
        conn: &mut C,
        key: &str,
        fingerprint: &str,
        work: F,
    ) -> Result<Outcome<R>, E>
    where
        C: AsLockingConnection,
        C::Conn: IdempotencyStore,
        R: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(&mut C::Conn) -> Result<R, E>,
    {
        let valid = |text: &str| text.chars().count() <= MAX_LEN && !text.contains('\0');
        if key.is_empty() || !valid(key) || !valid(fingerprint) {
            return Err(E::from(Error::InvalidInput(
                "idempotency keys and fingerprints are 1 to 255 characters, without NUL",
            )));
        }
        let conn = conn.locking_connection();
        let started_at = match self.start(conn, key, fingerprint)? {
            Start::Replay(stored) => {
                let response = serde_json::from_str(&stored).map_err(|err| {
                    Error::Database(diesel::result::Error::DeserializationError(Box::new(err)))
                })?;
                return Ok(Outcome::Replayed(response));
            }
            Start::Owned { started_at } => started_at,
        };
        let result = transaction::run(conn, |conn| {
            let response = work(conn).map_err(Failure::Closure)?;
            let stored = serde_json::to_string(&response).map_err(|err| {
                Error::Database(diesel::result::Error::SerializationError(Box::new(err)))
            })?;
            match C::Conn::finish(conn, key, started_at, &stored, now_millis())? {
                true => Ok(response),
                // The lease ran out and another request took the key: undo our work.
                false => Err(Failure::Lockkit(Error::IdempotencyInProgress)),
            }
        });
        if result.is_err() {
            // Release the key so that a retry runs the work again; a no-op when
            // another request took it over (its `started_at` is not ours).
            let _ = C::Conn::release(conn, key, started_at);
        }
        result.map(Outcome::Ran)
    }

    fn start<C: IdempotencyStore>(
        &self,
        conn: &mut C,
        key: &str,
        fingerprint: &str,
    ) -> Result<Start, Error> {
        // A few rounds at most: each lost race means another request just
        // inserted, released or expired the key.
        for _ in 0..5 {
            let now = now_millis();
            if C::insert_running(conn, key, fingerprint, now)? {
                return Ok(Start::Owned { started_at: now });
            }
            let Some(row) = C::load(conn, key)? else {
                continue; // released meanwhile: try to insert again
            };
            if row.fingerprint != fingerprint {
                return Err(Error::IdempotencyKeyReused);
            }
            match row.state.as_str() {
                DONE if row.finished_at.unwrap_or(row.started_at)
                    < now - millis(self.retention) =>
                {
                    C::delete_if_started(conn, key, row.started_at)?;
                }
                DONE => return Ok(Start::Replay(row.response.unwrap_or_default())),
                _ if row.started_at < now - millis(self.lease) => {
                    // The owner died (or overran its lease): take the key over.
                    if C::take_over(conn, key, row.started_at, now)? {
                        return Ok(Start::Owned { started_at: now });
                    }
                }
                _ => return Err(Error::IdempotencyInProgress),
            }
        }
        Err(Error::IdempotencyInProgress)
    }

    /// Deletes completed keys older than the retention; returns how many.
    ///
    /// # Errors
    ///
    /// A classified database error; see [`classify`](crate::classify()).
    pub fn purge_expired<C>(&self, conn: &mut C) -> Result<usize, Error>
    where
        C: AsLockingConnection,
        C::Conn: IdempotencyStore,
    {
        C::Conn::purge(
            conn.locking_connection(),
            now_millis() - millis(self.retention),
        )
    }
}

/// The statements behind [`Idempotency`], per connection type.
///
/// Sealed: implemented by lockkit for each backend feature's connection; name it
/// only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's idempotency keys do not support `{Self}`",
    label = "not a connection lockkit's idempotency keys support",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`) and r2d2 pooled connections to them"
)]
pub trait IdempotencyStore: diesel::Connection + crate::sealed::Sealed + Sized {
    #[doc(hidden)]
    fn insert_running(
        conn: &mut Self,
        key: &str,
        fingerprint: &str,
        now: i64,
    ) -> Result<bool, Error>;
    #[doc(hidden)]
    fn load(conn: &mut Self, key: &str) -> Result<Option<StoredKey>, Error>;
    #[doc(hidden)]
    fn take_over(conn: &mut Self, key: &str, seen_started_at: i64, now: i64)
        -> Result<bool, Error>;
    #[doc(hidden)]
    fn finish(
        conn: &mut Self,
        key: &str,
        started_at: i64,
        response: &str,
        now: i64,
    ) -> Result<bool, Error>;
    #[doc(hidden)]
    fn release(conn: &mut Self, key: &str, started_at: i64) -> Result<bool, Error>;
    #[doc(hidden)]
    fn delete_if_started(conn: &mut Self, key: &str, started_at: i64) -> Result<bool, Error>;
    #[doc(hidden)]
    fn purge(conn: &mut Self, finished_before: i64) -> Result<usize, Error>;
}

#[allow(unused_macros)] // used once per enabled backend
macro_rules! idempotency_store {
    ($conn:ty) => {
        impl IdempotencyStore for $conn {
            fn insert_running(
                conn: &mut Self,
                key: &str,
                fingerprint: &str,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel::prelude::*;
                use diesel::result::{DatabaseErrorKind, Error as DieselError};
                // A savepoint when nested: a failed INSERT must not poison the caller's transaction.
                let inserted = conn.transaction(|conn| {
                    diesel::insert_into(keys::table)
                        .values((
                            keys::idempotency_key.eq(key),
                            keys::fingerprint.eq(fingerprint),
                            keys::state.eq(RUNNING),
                            keys::started_at.eq(now),
                        ))
                        .execute(conn)
                });
                match inserted {
                    Ok(_) => Ok(true),
                    Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                        Ok(false)
                    }
                    Err(err) => Err(err.into()),
                }
            }

            fn load(conn: &mut Self, key: &str) -> Result<Option<StoredKey>, Error> {
                use diesel::prelude::*;
                Ok(keys::table
                    .find(key)
                    .select((
                        keys::fingerprint,
                        keys::state,
                        keys::response,
                        keys::started_at,
                        keys::finished_at,
                    ))
                    .first::<StoredKey>(conn)
                    .optional()?)
            }

            fn take_over(
                conn: &mut Self,
                key: &str,
                seen_started_at: i64,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel::prelude::*;
                let rows = diesel::update(
                    keys::table
                        .find(key)
                        .filter(keys::state.eq(RUNNING))
                        .filter(keys::started_at.eq(seen_started_at)),
                )
                .set(keys::started_at.eq(now))
                .execute(conn)?;
                Ok(rows == 1)
            }

            fn finish(
                conn: &mut Self,
                key: &str,
                started_at: i64,
                response: &str,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel::prelude::*;
                let rows = diesel::update(
                    keys::table
                        .find(key)
                        .filter(keys::state.eq(RUNNING))
                        .filter(keys::started_at.eq(started_at)),
                )
                .set((
                    keys::state.eq(DONE),
                    keys::response.eq(response),
                    keys::finished_at.eq(now),
                ))
                .execute(conn)?;
                Ok(rows == 1)
            }

            fn release(conn: &mut Self, key: &str, started_at: i64) -> Result<bool, Error> {
                use diesel::prelude::*;
                let rows = diesel::delete(
                    keys::table
                        .find(key)
                        .filter(keys::state.eq(RUNNING))
                        .filter(keys::started_at.eq(started_at)),
                )
                .execute(conn)?;
                Ok(rows == 1)
            }

            fn delete_if_started(
                conn: &mut Self,
                key: &str,
                started_at: i64,
            ) -> Result<bool, Error> {
                use diesel::prelude::*;
                let rows = diesel::delete(
                    keys::table
                        .find(key)
                        .filter(keys::started_at.eq(started_at)),
                )
                .execute(conn)?;
                Ok(rows == 1)
            }

            fn purge(conn: &mut Self, finished_before: i64) -> Result<usize, Error> {
                use diesel::prelude::*;
                Ok(diesel::delete(
                    keys::table
                        .filter(keys::state.eq(DONE))
                        .filter(keys::finished_at.lt(finished_before)),
                )
                .execute(conn)?)
            }
        }
    };
}

#[cfg(feature = "postgres")]
idempotency_store!(diesel::PgConnection);
#[cfg(feature = "mysql")]
idempotency_store!(diesel::MysqlConnection);
#[cfg(feature = "sqlite")]
idempotency_store!(diesel::SqliteConnection);
