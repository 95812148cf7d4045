//! Conditional single-statement updates with a typed outcome.
//!
//! The cheapest cure for a lost update is to let the database do the arithmetic
//! and the check in one statement:
//!
//! ```sql
//! UPDATE items SET stock = stock - $1 WHERE id = $2 AND stock >= $1
//! ```
//!
//! No read, no lock held across a round trip, no version. Counters have their own
//! helper, [`update_counters`] (Rails' `update_counters`). Its only trap is that
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

use diesel::backend::Backend;
use diesel::expression::AsExpression;
use diesel::expression::TypedExpressionType;
use diesel::query_builder::{
    AsChangeset, AstPass, IntoUpdateTarget, QueryFragment, QueryId, UpdateTarget,
};
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::query_dsl::LoadQuery;
use diesel::query_source::{QuerySource, Table};
use diesel::sql_types::{IntoNotNullable, SqlType};
use diesel::{Column, Connection, Expression, OptionalExtension, QueryResult};

use crate::error::classification::classify;
use crate::error::Error;
use crate::optimistic::statement::{BySql, VersionedUpdate};
use crate::pessimistic::connection::AsLockingConnection;
use crate::transaction::journal;
use crate::transaction::Control;

/// Starts an `UPDATE` that Diesel prepares once per connection: `diesel::update`
/// with the same SQL, for the statements a hot path sends again and again.
///
/// Diesel never caches its own `UPDATE` (an `Option` in a changeset would change
/// its SQL), so every one is parsed and planned again by the server (prepared
/// again by SQLite and MySQL), also while a transaction holds a row lock. The
/// statement [`Update::set`] returns is kept in the connection's statement cache
/// by its SQL text: each distinct SQL (a changeset that skips a `None` has two)
/// is prepared once, and parts Diesel itself refuses to cache (an `IN` list on
/// MySQL/SQLite, raw SQL) still make it uncached. Run it with
/// [`execute`](diesel::RunQueryDsl::execute) or pass it to [`update_if`].
///
/// ```
/// use diesel::prelude::*;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn).unwrap();
/// let sell = |qty: i32| {
///     lockkit::atomic::update(items::table.find(1).filter(items::stock.ge(qty)))
///         .set(items::stock.eq(items::stock - qty))
/// };
/// assert_eq!(
///     diesel::debug_query::<diesel::sqlite::Sqlite, _>(&sell(8)).to_string(),
///     diesel::debug_query::<diesel::sqlite::Sqlite, _>(
///         &diesel::update(items::table.find(1).filter(items::stock.ge(8)))
///             .set(items::stock.eq(items::stock - 8)),
///     )
///     .to_string(),
/// );
/// assert_eq!(lockkit::atomic::update_if(&mut conn, sell(8)).unwrap(), 1);
/// assert!(matches!(lockkit::atomic::update_if(&mut conn, sell(8)), Err(lockkit::Error::NoRowMatched)));
/// sell(0).execute(&mut conn).unwrap();
/// ```
pub fn update<T: IntoUpdateTarget>(target: T) -> Update<T::Table, T::WhereClause> {
    Update(target.into_update_target())
}

/// An `UPDATE` with its target and no `SET` yet: [`update`]'s value.
pub struct Update<T: QuerySource, W>(UpdateTarget<T, W>);

impl<T: Table, W> Update<T, W> {
    /// The statement that writes `changes` to the target's rows:
    /// `UPDATE <table> SET <changes> <where clause>`.
    pub fn set<C>(self, changes: C) -> PreparedUpdate<T, W, C::Changeset>
    where
        C: AsChangeset<Target = T>,
    {
        VersionedUpdate::new(self.0, changes)
    }
}

impl<T: QuerySource, W: std::fmt::Debug> std::fmt::Debug for Update<T, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Update")
            .field("where_clause", &self.0.where_clause)
            .finish_non_exhaustive()
    }
}

/// The statement [`Update::set`] returns: cached by its SQL text (see [`update`]).
pub type PreparedUpdate<T, W, V> = VersionedUpdate<T, W, V, BySql<V>>;

/// Executes a conditional `UPDATE` (or `DELETE`): the number of rows written, or
/// [`Error::NoRowMatched`] when its `WHERE` matched nothing.
///
/// Build the `UPDATE` with [`update`] to have it prepared once per connection.
///
/// # Errors
///
/// * [`Error::NoRowMatched`] when the `WHERE` matched no row; nothing was written.
/// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
///   [`Error::Deadlock`], .., else [`Error::Database`]); see
///   [`classify`](crate::classify()).
/// * [`Error::TransactionAborted`] when the statement (or one of the caller's
///   before it, whose error the caller let go) was a deadlock's victim
///   inside a transaction on MySQL/MariaDB (or a lock wait timeout's, on a server
///   started with `--innodb-rollback-on-timeout`), or a statement of the
///   caller's rolled back the whole transaction on SQLite (a trigger's
///   `RAISE(ROLLBACK)`): not retryable here, since a retry would run in
///   autocommit; the owner of the outermost transaction runs it again whole.
///
/// Runs on `PgConnection`, `MysqlConnection` and `SqliteConnection`,
/// `MultiConnection` enums that implement [`Dispatch`](crate::multi::Dispatch),
/// and r2d2 pooled connections to either (feature `r2d2`): through an enum the
/// statement runs through the enum, and what a failed statement does to the open
/// transaction is decided by the backend of the connection inside.
pub fn update_if<Conn, S>(conn: &mut Conn, statement: S) -> Result<usize, Error>
where
    Conn: Connection + AsLockingConnection,
    S: ExecuteDsl<Conn>,
{
    let ends = ends_of(conn);
    update_if_on(conn, statement, ends)
}

/// How a failed statement leaves the open transaction on `conn`: the rule of
/// its backend, or of the connection inside an enum (whose own backend names
/// none).
pub(crate) fn ends_of<Conn: AsLockingConnection>(conn: &mut Conn) -> journal::Ends {
    conn.locking_connection().ends()
}

/// [`update_if`] on a backend whose rule is `ends` (the backend's inside a
/// `MultiConnection` enum), which the journal of a transaction learns before
/// the write asks it.
pub(crate) fn update_if_on<Conn, S>(
    conn: &mut Conn,
    statement: S,
    ends: journal::Ends,
) -> Result<usize, Error>
where
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    journal::before_write_told(conn, ends);
    crate::transaction::check_write(conn)?;
    let rows = journal::own(conn, |conn| ExecuteDsl::execute(statement, conn))
        .map_err(|err| crate::transaction::failed_write(conn, classify(err), ends))?;
    matched(rows)
}

/// The rows a conditional write reports: [`Error::NoRowMatched`] for none (also
/// the async twins').
pub(crate) fn matched(rows: usize) -> Result<usize, Error> {
    match rows {
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
/// * [`Error::TransactionAborted`], as [`update_if`] returns it: nothing is
///   written in autocommit after the caller's transaction ended under it.
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
    Conn: Connection + AsLockingConnection,
    S: for<'q> LoadQuery<'q, Conn, T>,
{
    let ends = ends_of(conn);
    journal::before_write_told(conn, ends);
    crate::transaction::check_write(conn)?;
    journal::own(conn, |conn| statement.get_result(conn).optional())
        .map_err(|err| crate::transaction::failed_write(conn, classify(err), ends))?
        .ok_or(Error::NoRowMatched)
}

/// `<column> = COALESCE(<column>, 0) + $by`: one counter of [`update_counters`].
/// Build it with [`counter`].
#[derive(Debug, Clone, Copy)]
pub struct Increment<C, E> {
    column: std::marker::PhantomData<C>,
    by: E,
}

/// The amount's expression: bound as the column's type, without `NULL`.
type Amount<C, V> =
    <V as AsExpression<<<C as Expression>::SqlType as IntoNotNullable>::NotNullable>>::Expression;

/// Adds `by` (negative to subtract) to `column` in SQL: `column = COALESCE(column,
/// 0) + $1`, a `NULL` counting as zero. `by` is bound as a parameter. Put it
/// on an integer, floating-point or numeric column: lockkit does not check the
/// column's type, and SQLite adds text and timestamps as numbers (a text column
/// would hold `0`).
pub fn counter<C, V>(_column: C, by: V) -> Increment<C, Amount<C, V>>
where
    C: Column,
    C::SqlType: IntoNotNullable,
    <C::SqlType as IntoNotNullable>::NotNullable: SqlType + TypedExpressionType,
    V: AsExpression<<C::SqlType as IntoNotNullable>::NotNullable>,
{
    Increment {
        column: std::marker::PhantomData,
        by: by.as_expression(),
    }
}

impl<C: Column, E> AsChangeset for Increment<C, E> {
    type Target = C::Table;
    type Changeset = Self;

    fn as_changeset(self) -> Self {
        self
    }
}

impl<C, E, DB> QueryFragment<DB> for Increment<C, E>
where
    DB: Backend,
    C: Column,
    E: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(C::NAME)?;
        out.push_sql(" = COALESCE(");
        out.push_identifier(C::NAME)?;
        out.push_sql(", 0) + ");
        self.by.walk_ast(out.reborrow())
    }
}

impl<C: QueryId, E: QueryId> QueryId for Increment<C, E> {
    type QueryId = Increment<C::QueryId, E::QueryId>;
    const HAS_STATIC_QUERY_ID: bool = C::HAS_STATIC_QUERY_ID && E::HAS_STATIC_QUERY_ID;
}

/// Adds to counters of the rows `target` selects, in one statement without
/// reading them (Rails' `update_counters`): `UPDATE <table> SET n = COALESCE(n,
/// 0) + $1, .. WHERE ..`. Returns the number of rows written, or
/// [`Error::NoRowMatched`].
///
/// Concurrent increments never lose one another: each adds to what the row
/// holds when the statement runs, not to what someone read. The version column is
/// not touched, so on a [`Versioned`](crate::Versioned) model an increment does
/// not make an editor's write stale; mark the counter `#[lockkit(no_bump)]` so
/// that the editor's `update_versioned` does not write it back either.
///
/// # Errors
///
/// * [`Error::NoRowMatched`] when `target` selects no row; nothing was written.
/// * a classified database error; see [`classify`](crate::classify()).
/// * [`Error::TransactionAborted`], as [`update_if`] (which it calls) returns
///   it.
///
/// # Example
///
/// ```
/// use diesel::prelude::*;
/// use lockkit::atomic::{counter, update_counters};
/// # diesel::table! { posts (id) { id -> Integer, views -> Nullable<Integer>, likes -> BigInt } }
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE posts (id INTEGER PRIMARY KEY, views INTEGER, likes BIGINT NOT NULL)").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO posts VALUES (1, NULL, 10)").execute(&mut conn).unwrap();
/// update_counters(&mut conn, posts::table.find(1), (counter(posts::views, 1), counter(posts::likes, -2))).unwrap();
/// let row = posts::table.find(1).select((posts::views, posts::likes)).first::<(Option<i32>, i64)>(&mut conn).unwrap();
/// assert_eq!(row, (Some(1), 8)); // NULL counted as 0
///
/// let missing = update_counters(&mut conn, posts::table.find(2), counter(posts::views, 1));
/// assert!(matches!(missing, Err(lockkit::Error::NoRowMatched)));
/// ```
pub fn update_counters<Conn, T, C>(conn: &mut Conn, target: T, counters: C) -> Result<usize, Error>
where
    Conn: Connection + AsLockingConnection,
    T: diesel::query_builder::IntoUpdateTarget,
    C: AsChangeset<Target = T::Table>,
    diesel::dsl::Update<T, C>: diesel::query_builder::AsQuery + ExecuteDsl<Conn>,
{
    update_if(conn, counters_statement(target, counters))
}

/// [`update_counters`]' statement (also the async twin's): `UPDATE <target> SET
/// <counters>`.
pub(crate) fn counters_statement<T, C>(target: T, counters: C) -> diesel::dsl::Update<T, C>
where
    T: diesel::query_builder::IntoUpdateTarget,
    C: AsChangeset<Target = T::Table>,
    diesel::dsl::Update<T, C>: diesel::query_builder::AsQuery,
{
    diesel::update(target).set(counters)
}
