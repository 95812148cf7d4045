//! Conditional single-statement updates on diesel-async: [`update_if`],
//! [`update_returning`] and [`update_counters`], the async twins of
//! [`lockkit::atomic`](crate::atomic), with the same statements (the counters'
//! `SET n = COALESCE(n, 0) + $1` is [`counter`]'s) and the same outcome: zero
//! rows is [`Error::NoRowMatched`].
//!
//! ```sql
//! UPDATE items SET stock = stock - $1 WHERE id = $2 AND stock >= $1
//! UPDATE posts SET views = COALESCE(views, 0) + $1 WHERE posts.id = $2
//! ```
//!
//! Each is one statement: a future dropped while it runs leaves the statement
//! applied or not, as the server decided. On MySQL/MariaDB a statement dropped
//! before its reply came would leave that reply for the connection's next
//! statement to read as its own: the dropped write marks the connection
//! broken, in a transaction or not, so that its pool closes it (as a dropped
//! versioned write does).
//! Build the `UPDATE` with [`update`] (re-exported from
//! [`lockkit::atomic`](crate::atomic::update)) to have diesel-async prepare it
//! once per connection, as it does a `SELECT`.
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::asynchronous::atomic::{counter, update_counters, update_if};
//! # diesel::table! { posts (id) { id -> Integer, views -> Nullable<Integer>, stock -> Integer } }
//! # async fn run() -> Result<(), lockkit::Error> {
//! # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
//! # conn.batch_execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, views INTEGER, stock INTEGER NOT NULL); INSERT INTO posts VALUES (1, NULL, 2)").await?;
//! update_counters(&mut conn, posts::table.find(1), counter(posts::views, 1)).await?;
//!
//! let buy = lockkit::asynchronous::atomic::update(posts::table.find(1).filter(posts::stock.ge(3)))
//!     .set(posts::stock.eq(posts::stock - 3));
//! assert!(matches!(update_if(&mut conn, buy).await, Err(lockkit::Error::NoRowMatched)));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
//! ```

use diesel::query_builder::{AsChangeset, AsQuery, IntoUpdateTarget};
use diesel::OptionalExtension;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::RunQueryDsl;

use super::connection::{AsyncLockingConnection, Unsettled};
use crate::error::classification::classify;
use crate::error::Error;
pub use crate::optimistic::atomic::{counter, update, Increment, PreparedUpdate, Update};
use crate::optimistic::atomic::{counters_statement, matched};

/// Executes a conditional `UPDATE` (or `DELETE`): the number of rows written,
/// or [`Error::NoRowMatched`] when its `WHERE` matched nothing
/// ([`lockkit::atomic::update_if`](crate::atomic::update_if) on diesel-async).
///
/// # Errors
///
/// As [`lockkit::atomic::update_if`](crate::atomic::update_if).
pub async fn update_if<Conn, S>(conn: &mut Conn, statement: S) -> Result<usize, Error>
where
    Conn: AsyncLockingConnection,
    S: ExecuteDsl<Conn> + Send,
{
    let mut unsettled = Unsettled::until_replied(conn);
    let conn = &mut *unsettled.conn;
    let rows = async {
        super::connection::check_write(conn).await?;
        match statement.execute(conn).await {
            Ok(rows) => Ok(rows),
            Err(err) => Err(super::connection::failed_write(conn, classify(err)).await),
        }
    }
    .await;
    unsettled.settled();
    matched(rows?)
}

/// Executes a conditional `UPDATE ... RETURNING` (PostgreSQL, SQLite 3.35+) and
/// returns the updated row, or [`Error::NoRowMatched`]
/// ([`lockkit::atomic::update_returning`](crate::atomic::update_returning) on
/// diesel-async).
///
/// # Errors
///
/// As [`lockkit::atomic::update_returning`](crate::atomic::update_returning).
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # async fn run() -> Result<(), lockkit::Error> {
/// # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
/// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
/// # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL); INSERT INTO items VALUES (1, 10)").await?;
/// let left: i32 = lockkit::asynchronous::atomic::update_returning(
///     &mut conn,
///     diesel::update(items::table.find(1).filter(items::stock.ge(3)))
///         .set(items::stock.eq(items::stock - 3))
///         .returning(items::stock),
/// )
/// .await?;
/// assert_eq!(left, 7);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
pub async fn update_returning<Conn, S, T>(conn: &mut Conn, statement: S) -> Result<T, Error>
where
    Conn: AsyncLockingConnection,
    S: for<'q> LoadQuery<'q, Conn, T> + Send,
    T: Send,
{
    let mut unsettled = Unsettled::until_replied(conn);
    let conn = &mut *unsettled.conn;
    let row = async {
        super::connection::check_write(conn).await?;
        match statement.get_result(conn).await.optional() {
            Ok(row) => Ok(row),
            Err(err) => Err(super::connection::failed_write(conn, classify(err)).await),
        }
    }
    .await;
    unsettled.settled();
    row?.ok_or(Error::NoRowMatched)
}

/// Adds to counters of the rows `target` selects, in one statement without
/// reading them: [`lockkit::atomic::update_counters`](crate::atomic::update_counters)
/// on diesel-async. Concurrent increments never lose one another; the version
/// column is not touched.
///
/// # Errors
///
/// As [`lockkit::atomic::update_counters`](crate::atomic::update_counters):
/// [`Error::NoRowMatched`] when `target` selects no row.
pub async fn update_counters<Conn, T, C>(
    conn: &mut Conn,
    target: T,
    counters: C,
) -> Result<usize, Error>
where
    Conn: AsyncLockingConnection,
    T: IntoUpdateTarget,
    C: AsChangeset<Target = T::Table>,
    diesel::dsl::Update<T, C>: AsQuery + ExecuteDsl<Conn> + Send,
{
    update_if(conn, counters_statement(target, counters)).await
}
