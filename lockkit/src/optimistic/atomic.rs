//! Conditional single-statement updates with a typed outcome.
//!
//! The cheapest cure for a lost update is to let the database do the arithmetic
//! and the check in one statement:
//!
//! ```sql
//! UPDATE items SET stock = stock - $1 WHERE id = $2 AND stock >= $1
//! ```
//!
//! No read, no lock held across a round trip, no version. Its only trap is that
//! "zero rows" looks like success to code that ignores the count; here it is
//! [`Error::NoRowMatched`], which the caller must handle.
//!
//! ```
//! use diesel::prelude::*;
//! # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn).unwrap();
//! # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn).unwrap();
//! let buy = |conn: &mut SqliteConnection, qty: i32| {
//!     lockkit::atomic::update_if(
//!         conn,
//!         diesel::update(items::table.find(1).filter(items::stock.ge(qty)))
//!             .set(items::stock.eq(items::stock - qty)),
//!     )
//! };
//! assert_eq!(buy(&mut conn, 8).unwrap(), 1);
//! assert!(matches!(buy(&mut conn, 8), Err(lockkit::Error::NoRowMatched)));
//! ```

use diesel::query_dsl::methods::ExecuteDsl;
use diesel::query_dsl::LoadQuery;
use diesel::{Connection, OptionalExtension};

use crate::{classify, Error};

/// Executes a conditional `UPDATE` (or `DELETE`): the number of rows written, or
/// [`Error::NoRowMatched`] when its `WHERE` matched nothing.
///
/// # Errors
///
/// * [`Error::NoRowMatched`] when the `WHERE` matched no row; nothing was written.
/// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
///   [`Error::Deadlock`], .., else [`Error::Database`]); see
///   [`classify`](crate::classify()).
pub fn update_if<Conn, S>(conn: &mut Conn, statement: S) -> Result<usize, Error>
where
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    match ExecuteDsl::execute(statement, conn).map_err(classify)? {
        0 => Err(Error::NoRowMatched),
        rows => Ok(rows),
    }
}

/// Executes a conditional `UPDATE ... RETURNING` (PostgreSQL, SQLite 3.35+) and
/// returns the updated row, or [`Error::NoRowMatched`].
///
/// # Errors
///
/// * [`Error::NoRowMatched`] when the `WHERE` matched no row; nothing was written.
/// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
///   [`Error::Deadlock`], .., else [`Error::Database`]); see
///   [`classify`](crate::classify()).
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn).unwrap();
/// let left: i32 = lockkit::atomic::update_returning(
///     &mut conn,
///     diesel::update(items::table.find(1).filter(items::stock.ge(3)))
///         .set(items::stock.eq(items::stock - 3))
///         .returning(items::stock),
/// )
/// .unwrap();
/// assert_eq!(left, 7);
/// ```
pub fn update_returning<Conn, S, T>(conn: &mut Conn, statement: S) -> Result<T, Error>
where
    Conn: Connection,
    S: for<'q> LoadQuery<'q, Conn, T>,
{
    statement
        .get_result(conn)
        .optional()
        .map_err(classify)?
        .ok_or(Error::NoRowMatched)
}
