//! The database side, on diesel-async: one bb8 pool of the backend the URL
//! names ([`Pools`]), and the statements written once for all three.
//!
//! diesel-async has no `MultiConnection` derive: [`Pools`] is an enum with one
//! pool per backend, and `on_connection!` runs a block of code with a pooled
//! connection of whichever variant it is. The block is compiled once per backend,
//! each time against that backend's own connection type (`AsyncPgConnection`,
//! `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`), so the
//! statements are Diesel's usual typed queries and lockkit's async calls take
//! the connection as it is.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{AsyncConnection, RunQueryDsl};
use lockkit::asynchronous::prelude::*;
use lockkit::etag::{Expected, ANY_MATCH_ATTEMPTS};
use lockkit::{LockOptions, RetryPolicy};

use crate::models::{Item, ItemInput};
use crate::schema::items;
use crate::{ApiError, Backend, Config, SetupError};

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// `SELECT .. FROM items WHERE id = ?`; [`lockkit::Error::NotFound`] when
/// missing. A macro: the query is checked per backend.
macro_rules! find {
    ($conn:expr, $id:expr) => {
        items::table
            .find($id)
            .select(Item::as_select())
            .first($conn)
            .await
            .optional()
            .map_err(lockkit::Error::from)
            .and_then(|row| row.ok_or(lockkit::Error::NotFound))
    };
}

/// The item's version now (for `If-Match: *` and lists of tags).
macro_rules! current_version {
    ($conn:expr, $id:expr) => {
        items::table
            .find($id)
            .select(items::lock_version)
            .first::<i32>($conn)
            .await
            .optional()
            .map_err(lockkit::Error::from)
            .and_then(|row| row.ok_or(lockkit::Error::NotFound))
    };
}

/// One pool of diesel-async connections, to whichever backend the URL names.
#[derive(Clone)]
pub(crate) enum Pools {
    /// PostgreSQL (`tokio-postgres` underneath).
    #[cfg(feature = "postgres")]
    Pg(Pool<diesel_async::AsyncPgConnection>),
    /// MySQL/MariaDB (`mysql_async` underneath).
    #[cfg(feature = "mysql")]
    Mysql(Pool<diesel_async::AsyncMysqlConnection>),
    /// SQLite: the blocking connection on tokio's blocking threads.
    #[cfg(feature = "sqlite")]
    Sqlite(Pool<SqliteAsync>),
}

/// diesel-async's SQLite connection: Diesel's, run on tokio's blocking threads.
#[cfg(feature = "sqlite")]
pub(crate) type SqliteAsync =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;

/// Runs `$body` with `$conn: &mut <the backend's connection>`, taken from the
/// pool of `$pools` (`503` when none becomes free in time). `$body` is compiled
/// once per backend.
macro_rules! on_connection {
    ($pools:expr, |$conn:ident| $body:expr) => {
        match $pools {
            #[cfg(feature = "postgres")]
            Pools::Pg(pool) => {
                let mut pooled = pool.get().await?;
                let $conn = &mut *pooled;
                $body
            }
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => {
                let mut pooled = pool.get().await?;
                let $conn = &mut *pooled;
                $body
            }
            #[cfg(feature = "sqlite")]
            Pools::Sqlite(pool) => {
                let mut pooled = pool.get().await?;
                let $conn = &mut *pooled;
                $body
            }
        }
    };
}

impl Pools {
    /// The pool for `url` (already migrated), `config.pool_size` connections.
    pub(crate) async fn new(
        url: &str,
        backend: Backend,
        config: &Config,
    ) -> Result<Pools, SetupError> {
        Ok(match backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => Pools::Pg(pool(url, config, no_setup).await?),
            #[cfg(feature = "mysql")]
            Backend::Mysql => Pools::Mysql(pool(url, config, no_setup).await?),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => Pools::Sqlite(pool(url, config, sqlite_session).await?),
            #[allow(unreachable_patterns)]
            backend => return Err(SetupError::Unsupported(backend)),
        })
    }

    /// `GET`: the item, or [`lockkit::Error::NotFound`].
    pub(crate) async fn get(&self, id: i32) -> Result<Item, ApiError> {
        on_connection!(self, |conn| Ok(find!(conn, id)?))
    }

    /// `POST`: inserts an item at version 0 and returns it with its new id:
    /// `INSERT .. RETURNING` on PostgreSQL and SQLite. MySQL has no `RETURNING`:
    /// insert, then read the row by `LAST_INSERT_ID()` (per connection, so
    /// concurrent inserts do not mix up).
    pub(crate) async fn create(&self, input: &ItemInput) -> Result<Item, ApiError> {
        #[allow(unused_macros)] // MySQL alone
        macro_rules! returning {
            ($conn:expr) => {
                diesel::insert_into(items::table)
                    .values(input)
                    .returning(Item::as_returning())
                    .get_result($conn)
                    .await?
            };
        }
        Ok(match self {
            #[cfg(feature = "postgres")]
            Pools::Pg(pool) => returning!(&mut *pool.get().await?),
            #[cfg(feature = "sqlite")]
            Pools::Sqlite(pool) => returning!(&mut *pool.get().await?),
            #[cfg(feature = "mysql")]
            Pools::Mysql(pool) => {
                use diesel::sql_types::{BigInt, Unsigned};
                let mut conn = pool.get().await?;
                diesel::insert_into(items::table)
                    .values(input)
                    .execute(&mut *conn)
                    .await?;
                let id = diesel::select(diesel::dsl::sql::<Unsigned<BigInt>>("LAST_INSERT_ID()"))
                    .get_result::<u64>(&mut *conn)
                    .await?;
                let id = i32::try_from(id).map_err(|_| {
                    ApiError::Internal(format!("id {id} does not fit the `items.id` INTEGER"))
                })?;
                find!(&mut *conn, id)?
            }
        })
    }

    /// `PUT` with `If-Match`: `UPDATE items SET name = ?, stock = ?, lock_version
    /// = lock_version + 1 WHERE id = ? AND lock_version = ?`, one statement; zero
    /// rows is [`lockkit::Error::Stale`] with the current version (a `412`).
    ///
    /// One tag is written at once. A list of tags, or `*`, first reads the
    /// version: a listed one is written, else another listed ([`write_at`]: the
    /// database refuses it, `412` with the current `ETag`). Under `*` another
    /// writer may get in between the read and the write: read and write again,
    /// up to [`ANY_MATCH_ATTEMPTS`] times, a new connection per attempt, in
    /// autocommit. Unlike `Expected::apply` on the blocking side, which retries
    /// only a stale write, [`lockkit::asynchronous::retry()`] also retries the
    /// other retryable errors (a busy database, a deadlock), at once.
    pub(crate) async fn update(
        &self,
        id: i32,
        expected: &Expected<i32>,
        input: &ItemInput,
    ) -> Result<Item, ApiError> {
        let version = if matches!(expected, Expected::Any) {
            let attempts = RetryPolicy::immediate(ANY_MATCH_ATTEMPTS);
            lockkit::asynchronous::retry(&attempts, |_| self.update_once(id, expected, input))
                .await?
        } else {
            self.update_once(id, expected, input).await?
        };
        // The row as written: no second read, which could see a later write.
        Ok(Item {
            id,
            name: input.name.clone(),
            stock: input.stock,
            lock_version: version,
        })
    }

    async fn update_once(
        &self,
        id: i32,
        expected: &Expected<i32>,
        input: &ItemInput,
    ) -> Result<i32, ApiError> {
        on_connection!(self, |conn| {
            let at = match expected {
                Expected::Version(version) => *version,
                listed_or_any => write_at(listed_or_any, current_version!(conn, id)?)?,
            };
            Ok(Item::update_by_version(conn, id, at, input).await?)
        })
    }

    /// `DELETE` with `If-Match`: `DELETE FROM items WHERE id = ? AND
    /// lock_version = ?`, the tags as for [`update`](Self::update).
    pub(crate) async fn delete(&self, id: i32, expected: &Expected<i32>) -> Result<(), ApiError> {
        let once = || async {
            on_connection!(self, |conn| {
                let at = match expected {
                    Expected::Version(version) => *version,
                    listed_or_any => write_at(listed_or_any, current_version!(conn, id)?)?,
                };
                Ok::<_, ApiError>(Item::delete_by_version(conn, id, at).await?)
            })
        };
        if matches!(expected, Expected::Any) {
            let attempts = RetryPolicy::immediate(ANY_MATCH_ATTEMPTS);
            lockkit::asynchronous::retry(&attempts, |_| once()).await
        } else {
            once().await
        }
    }

    /// `POST /items/{id}/sell`: under the row's lock
    /// ([`lockkit::asynchronous::with_lock`]: `SELECT .. FOR UPDATE`, which also
    /// advances the version), takes `quantity` from the stock if there is that
    /// much, else [`ApiError::Insufficient`] and nothing is written. No `If-Match`:
    /// the server reads and writes under the lock, so no sale is lost and none
    /// is refused for being late. `hold` is how long the lock is held before the
    /// write (`Config::sale_delay`).
    pub(crate) async fn sell(
        &self,
        id: i32,
        quantity: i32,
        options: LockOptions,
        hold: Duration,
    ) -> Result<Item, ApiError> {
        on_connection!(self, |conn| {
            lockkit::asynchronous::with_lock(conn, id, options, async |conn, item: Item| {
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                if item.stock < quantity {
                    return Err(ApiError::Insufficient {
                        stock: item.stock,
                        wanted: quantity,
                    });
                }
                let stock = item.stock - quantity;
                diesel::update(items::table.find(id))
                    .set(items::stock.eq(stock))
                    .execute(conn)
                    .await?;
                Ok(Item { stock, ..item })
            })
            .await
        })
    }

    /// `POST /items/{id}/restock`: read, add, write with the version read
    /// ([`AsyncVersioned::update_versioned`]), in a transaction that
    /// [`lockkit::asynchronous::transaction_with_retry`] runs again, re-reading,
    /// when another writer got in between (`Error::Stale`), up to `policy`'s
    /// attempts (then `503`).
    pub(crate) async fn restock(
        &self,
        id: i32,
        quantity: i32,
        policy: &RetryPolicy,
    ) -> Result<Item, ApiError> {
        on_connection!(self, |conn| {
            lockkit::asynchronous::transaction_with_retry(conn, policy, async |conn| {
                let mut item = find!(conn, id)?;
                item.stock = item
                    .stock
                    .checked_add(quantity)
                    .ok_or_else(|| ApiError::Invalid("the stock would overflow".to_owned()))?;
                item.update_versioned(conn).await?;
                Ok::<_, ApiError>(item)
            })
            .await
        })
    }
}

/// The version to write at for a list of tags or `*`, the row being at `now`:
/// `now` if the header names it (`*` names every version), else a listed
/// version, which the database refuses as stale (412 with the current ETag)
/// unless the row got there in between: the last below `i32::MAX` (a made-up
/// tag at the maximum no write can follow: 409), as `Expected::apply` picks.
fn write_at(expected: &Expected<i32>, now: i32) -> Result<i32, lockkit::Error> {
    match expected {
        _ if expected.matches(now) => Ok(now),
        Expected::OneOf(listed) => listed
            .iter()
            .rev()
            .find(|&&v| v < i32::MAX)
            .or(listed.last())
            .copied()
            .ok_or(lockkit::Error::NoRowMatched),
        // One tag is written at once, without reading `now`.
        _ => Err(lockkit::Error::NoRowMatched),
    }
}

/// What a new connection runs before the pool hands it out.
type Setup<C> = for<'c> fn(&'c mut C) -> BoxFuture<'c, diesel::QueryResult<()>>;

/// PostgreSQL and MySQL: nothing.
#[allow(dead_code)] // SQLite alone
fn no_setup<C>(_: &mut C) -> BoxFuture<'_, diesel::QueryResult<()>> {
    Box::pin(async { Ok(()) })
}

/// SQLite: the session settings of the blocking side
/// ([`lockkit_tests::support::sqlite_session_settings`]: busy timeout, WAL,
/// foreign keys), run on the wrapped connection.
#[cfg(feature = "sqlite")]
fn sqlite_session(conn: &mut SqliteAsync) -> BoxFuture<'_, diesel::QueryResult<()>> {
    conn.spawn_blocking(lockkit_tests::support::sqlite_session_settings)
}

/// A bb8 pool of `C` to `url`: each connection runs `setup` once it is open;
/// the pool discards a connection that comes back with a transaction open (a
/// handler dropped mid-transaction: its client went away).
async fn pool<C>(url: &str, config: &Config, setup: Setup<C>) -> Result<Pool<C>, SetupError>
where
    C: AsyncConnection + diesel_async::pooled_connection::PoolableConnection + 'static,
    AsyncDieselConnectionManager<C>:
        bb8::ManageConnection<Error = diesel_async::pooled_connection::PoolError>,
{
    let mut manager = ManagerConfig::default();
    manager.custom_setup = Box::new(move |url| {
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = C::establish(&url).await?;
            setup(&mut conn)
                .await
                .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
            Ok(conn)
        })
    });
    let manager = AsyncDieselConnectionManager::<C>::new_with_config(url, manager);
    bb8::Pool::builder()
        .max_size(config.pool_size.max(1))
        .min_idle(Some(1))
        .connection_timeout(config.connection_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .build(manager)
        .await
        .map_err(|err| match err {
            diesel_async::pooled_connection::PoolError::ConnectionError(err) => err.into(),
            diesel_async::pooled_connection::PoolError::QueryError(err) => err.into(),
        })
}
