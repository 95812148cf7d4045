//! Optimistic locking on diesel-async: [`AsyncVersioned`], the version-checked
//! writes of [`Versioned`] with `.await`.
//!
//! The statements are the blocking side's, built by the same methods
//! ([`Versioned::update_versioned_statement`] and friends): `UPDATE .. SET ..,
//! <version> = <version> + 1 WHERE <key> AND <version> = $expected`. Zero rows
//! is [`Error::Stale`] with the row's current state, read with the same
//! follow-up query. `AsyncVersioned` is implemented for every `Versioned`
//! model, so `#[derive(Versioned)]` is all a model needs.
//!
//! Import [`asynchronous::prelude`](super::prelude) instead of
//! [`lockkit::prelude`](crate::prelude): both traits have `update_versioned`,
//! and only one of them may be in scope.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel_async::RunQueryDsl;
//! use lockkit::asynchronous::prelude::*;
//!
//! diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
//!
//! #[derive(Queryable, Selectable, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
//!
//! # async fn run() -> Result<(), lockkit::Error> {
//! use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
//! # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); INSERT INTO items VALUES (1, 10, 0)").await?;
//! let mut alice = items::table.find(1).first::<Item>(&mut conn).await?;
//! let mut bob = items::table.find(1).first::<Item>(&mut conn).await?;
//!
//! alice.stock -= 8;
//! alice.update_versioned(&mut conn).await?; // lock_version 0 -> 1
//!
//! bob.stock -= 8;
//! let err = bob.update_versioned(&mut conn).await.unwrap_err();
//! assert!(matches!(err, lockkit::Error::Stale(_)));
//! assert_eq!(bob.lock_version, 0); // untouched
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
//! ```
//!
//! # What differs from the blocking side
//!
//! * Nothing in what the [`journal`](crate::journal) does: it watches
//!   diesel-async connections as it watches blocking ones (diesel-async reports
//!   `BEGIN`, `COMMIT`, `ROLLBACK` and savepoints to the connection's Diesel
//!   instrumentation too), and the same code decides which version a struct
//!   whose write was rolled back writes with. A connection with instrumentation
//!   of its own keeps it: wrap it in
//!   [`Journal::wrap`](crate::journal::Journal::wrap) there as well.
//! * Nor in the question whether the database enforces a table's declared key:
//!   asked once per connection and table, the answer kept in its journal.

use std::any::TypeId;
use std::future::Future;
use std::pin::Pin;

use diesel::backend::Backend;
use diesel::query_builder::{AsChangeset, BoxedSqlQuery, QueryFragment, SqlQuery};
use diesel::query_dsl::methods::LockingDsl;
use diesel::{OptionalExtension, QueryResult};
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::{AsyncConnectionCore, RunQueryDsl};

use super::connection::{in_transaction, AsyncLockingConnection, Level, Restore, Unsettled};
use crate::error::classification::classify;
use crate::error::{Error, Operation};
use crate::optimistic::backend::{
    DatabaseId, InShareMode, OptimisticBackend, Stands, TableSchema, Unique,
};
use crate::optimistic::mark::Mark;
use crate::optimistic::rollbacks;
use crate::optimistic::sequence::{at_most_one, checked_next, Origin, Step, Write, Written};
use crate::optimistic::statement::BySql;
use crate::optimistic::table;
use crate::optimistic::version::VersionNumber;
use crate::optimistic::versioned::{
    all_or_none, delete, key_order, settle, touch, undone_move_only, update, DeleteVersioned,
    TouchVersioned, UpdateVersioned, VersionCheck, Versioned,
};
use crate::pessimistic::lockable::Lockable;
use crate::transaction::journal::{AnyRedo, AsyncWatched};
use crate::transaction::{Began, Failure};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// [`move_past`] for a model, on `C`, its key `K` and its version `V`.
type MovePast<C, K, V> = for<'c> fn(&'c mut C, K, Option<String>, V) -> BoxFuture<'c, ()>;

/// The version-checked writes of [`Versioned`], on diesel-async connections.
/// Implemented for every `Versioned` model; see the [module docs](self).
///
/// Each method has the blocking method's statement, result and errors; see
/// [`Versioned`].
pub trait AsyncVersioned: Versioned + VersionCheck + Send + Sync {
    /// [`Versioned::update_versioned`], async: writes every updatable field,
    /// checking and bumping the version in one statement.
    ///
    /// # Errors
    ///
    /// [`Error::Stale`] when no row matched the key and the expected version
    /// (nothing was written, `self` is unchanged), [`Error::VersionOverflow`],
    /// [`Error::AmbiguousKey`], or a classified database error.
    fn update_versioned<'a, Conn>(
        &'a mut self,
        conn: &'a mut Conn,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        for<'c> UpdateVersioned<Self, Self::Changeset<'c>>: ExecuteDsl<Conn>,
        for<'c> (Self::Changeset<'c>, Self::Bump): AsChangeset<Target = Self::Table>,
    {
        async move {
            let key = self.key();
            let expected = self.version();
            let this = &*self;
            let statement =
                |checked| update::<Self, _>(this.key(), checked, this.versioned_changeset());
            let written = write_from::<Self, Conn, _>(
                conn,
                &key,
                expected,
                Origin::Held,
                Operation::Update,
                statement,
            )
            .await?;
            settle(self, written)
        }
    }

    /// [`Versioned::update_versioned_with`], async: your own changeset instead
    /// of the model's fields, e.g. `items::stock.eq(items::stock - 1)`. Only the
    /// version is refreshed in memory.
    ///
    /// # Errors
    ///
    /// As [`update_versioned`](Self::update_versioned).
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use diesel_async::RunQueryDsl;
    /// use lockkit::asynchronous::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # async fn run() -> Result<(), lockkit::Error> {
    /// # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    /// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
    /// # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); INSERT INTO items VALUES (1, 10, 0)").await?;
    /// let mut item = items::table.find(1).first::<Item>(&mut conn).await?;
    /// item.update_versioned_with(&mut conn, items::stock.eq(items::stock - 1)).await?;
    /// assert_eq!(item.lock_version, 1);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
    /// ```
    fn update_versioned_with<'a, Conn, C>(
        &'a mut self,
        conn: &'a mut Conn,
        changes: C,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        C: Send + 'a,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, BySql<C>>: ExecuteDsl<Conn>,
    {
        let statement = |key, checked| Self::update_statement(key, checked, changes);
        write_held(self, conn, Origin::Held, Operation::Update, statement)
    }

    /// [`Versioned::update_by_version`], async: applies `changes` to the row
    /// `key` if its version is still `expected_version`, without loading it.
    /// Returns the new version.
    ///
    /// # Errors
    ///
    /// As [`update_versioned`](Self::update_versioned).
    fn update_by_version<'a, Conn, C>(
        conn: &'a mut Conn,
        key: Self::Key,
        expected_version: Self::Version,
        changes: C,
    ) -> impl Future<Output = Result<Self::Version, Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        C: Send + 'a,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, BySql<C>>: ExecuteDsl<Conn>,
    {
        async move {
            let statement = |checked| Self::update_statement(key.clone(), checked, changes);
            let op = Operation::Update;
            let written = write_from::<Self, Conn, _>(
                conn,
                &key,
                expected_version,
                Origin::Outside,
                op,
                statement,
            )
            .await?;
            Ok(written.version()?.unwrap_or(expected_version))
        }
    }

    /// [`Versioned::update_all_by_version`], async: one changeset applied to
    /// many rows, each checked against its own expected version, in one
    /// transaction (a savepoint when one is open), in key order. Either every
    /// version advances, or nothing is written and [`Error::StaleRows`] lists
    /// every stale key. Returns the new versions, in input order.
    ///
    /// # Errors
    ///
    /// As [`Versioned::update_all_by_version`]: [`Error::DuplicateKey`],
    /// [`Error::StaleRows`], [`Error::VersionOverflow`], [`Error::AmbiguousKey`],
    /// or a classified database error; nothing is written on any of them.
    ///
    /// # Example
    ///
    /// ```
    /// # use diesel::prelude::*;
    /// # use diesel_async::RunQueryDsl;
    /// use lockkit::asynchronous::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    /// # async fn run() -> Result<(), lockkit::Error> {
    /// # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
    /// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
    /// # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); INSERT INTO items VALUES (1, 10, 0), (2, 5, 0)").await?;
    /// let versions = Item::update_all_by_version(&mut conn, &[(2, 0), (1, 0)], items::stock.eq(0)).await?;
    /// assert_eq!(versions, vec![1, 1]);
    /// let err = Item::update_all_by_version(&mut conn, &[(1, 1), (2, 0)], items::stock.eq(9)).await.unwrap_err();
    /// assert!(matches!(err, lockkit::Error::StaleRows(ref stale) if stale.len() == 1));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
    /// ```
    fn update_all_by_version<'a, Conn, C>(
        conn: &'a mut Conn,
        rows: &'a [(Self::Key, Self::Version)],
        changes: C,
    ) -> impl Future<Output = Result<Vec<Self::Version>, Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        Self::Key: Ord,
        Self::Version: Sync,
        C: Clone + Send + Sync + 'a,
        (BySql<C>, Self::Bump): AsChangeset<Target = Self::Table>,
        UpdateVersioned<Self, BySql<C>>: ExecuteDsl<Conn>,
    {
        async move {
            let order = key_order::<Self, _>(rows)?;
            super::connection::refuse_if_ended_on_sqlite(conn).await?;
            super::connection::roll_back_unused_drop(conn).await?;
            let began = Began::own(in_transaction(conn));
            super::connection::begin_transaction(conn).await?;
            let mut level = Level::opened(conn);
            let conn = &mut *level;
            let mut versions = vec![None; rows.len()];
            let mut stale = Vec::new();
            let mut failed = None;
            for i in order {
                let (key, expected) = &rows[i];
                let statement =
                    |checked| Self::update_statement(key.clone(), checked, changes.clone());
                match write_from::<Self, Conn, _>(
                    conn,
                    key,
                    *expected,
                    Origin::Outside,
                    Operation::Update,
                    statement,
                )
                .await
                {
                    Ok(Written::Done(next)) => versions[i] = next,
                    Ok(Written::Stale(report)) => stale.push(*report),
                    Err(err) => {
                        failed = Some(err);
                        break;
                    }
                }
            }
            let result = match failed {
                Some(err) => Err(err),
                None => all_or_none(versions, stale),
            };
            super::transaction::end(
                level,
                began,
                Restore::Nothing,
                result.map_err(Failure::Lockkit),
            )
            .await
        }
    }

    /// [`Versioned::delete_versioned`], async: deletes the row only if its
    /// version is still the one this struct holds.
    ///
    /// # Errors
    ///
    /// [`Error::Stale`] when the row changed or is gone (nothing was deleted),
    /// [`Error::AmbiguousKey`], or a classified database error.
    fn delete_versioned<'a, Conn>(
        &'a self,
        conn: &'a mut Conn,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        DeleteVersioned<Self>: ExecuteDsl<Conn>,
    {
        delete_from::<Self, Conn>(conn, self.key(), self.version(), Origin::Held)
    }

    /// [`Versioned::delete_by_version`], async: deletes the row `key` if its
    /// version is still `expected_version`, without loading it first (e.g.
    /// `DELETE` with `If-Match`). A number a rolled-back write left is refused,
    /// never restored, as for [`update_by_version`](Self::update_by_version).
    ///
    /// # Errors
    ///
    /// [`Error::Stale`] when the row changed or is gone (nothing was deleted),
    /// [`Error::AmbiguousKey`], or a classified database error.
    fn delete_by_version<'a, Conn>(
        conn: &'a mut Conn,
        key: Self::Key,
        expected_version: Self::Version,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        DeleteVersioned<Self>: ExecuteDsl<Conn>,
    {
        delete_from::<Self, Conn>(conn, key, expected_version, Origin::Outside)
    }

    /// [`Versioned::touch_versioned`], async: bumps the version without
    /// changing data (a child row changed; the parent's readers must notice).
    ///
    /// # Errors
    ///
    /// As [`update_versioned`](Self::update_versioned).
    fn touch_versioned<'a, Conn>(
        &'a mut self,
        conn: &'a mut Conn,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Conn: AsyncLockingConnection,
        Self: AsyncVersionQuery<Conn> + 'a,
        TouchVersioned<Self>: ExecuteDsl<Conn>,
    {
        write_held(self, conn, Origin::Held, Operation::Touch, touch::<Self>)
    }
}

impl<M: Versioned + VersionCheck + Send + Sync> AsyncVersioned for M {}

/// What a versioned write needs from a diesel-async connection besides the
/// statement: the follow-up read of its failure path and the key check, the
/// blocking side's queries ([`CurrentVersionQuery`](crate::bounds::CurrentVersionQuery)).
/// Implemented for every model on every [`AsyncLockingConnection`]; name it only
/// in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit's async versioned writes on `{Self}` do not run on `{Conn}`",
    label = "not a connection lockkit's async versioned writes support",
    note = "lockkit supports `AsyncPgConnection`, `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (feature `async` with `postgres`, `mysql`, `sqlite`)"
)]
pub trait AsyncVersionQuery<Conn>: VersionCheck<Key: Send + Sync, Version: Send> {
    /// `Some(version)`, or `None` when the row is gone: the latest committed state.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_current_version(
        conn: &mut Conn,
        key: Self::Key,
    ) -> BoxFuture<'_, QueryResult<Option<Self::Version>>>;

    /// `UPDATE .. SET <version> = <version> + 1 WHERE <key> AND <version> = $version`:
    /// moves the row past a version that a rolled-back struct may still hold.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn bump_past(
        conn: &mut Conn,
        key: Self::Key,
        version: Self::Version,
    ) -> BoxFuture<'_, QueryResult<usize>>;

    /// Whether the database enforces the declared key.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn key_is_unique(conn: &mut Conn) -> BoxFuture<'_, QueryResult<bool>>;

    /// The row's identity for the [`journal`](crate::journal): database, table
    /// and key; `None` when the journal needs none (nothing recorded, no
    /// transaction).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn row_id<'a>(
        conn: &'a mut Conn,
        key: &'a Self::Key,
    ) -> BoxFuture<'a, QueryResult<Option<String>>>;

    /// Marks a write made in a transaction on a connection the [`journal`](crate::journal)
    /// cannot watch, in that transaction (the blocking side's
    /// `CurrentVersionQuery::mark`).
    #[doc(hidden)]
    fn mark(conn: &mut Conn, mark: Mark) -> BoxFuture<'_, QueryResult<()>>;

    /// Whether the mark `mark` stands on `conn` (the blocking side's
    /// `CurrentVersionQuery::mark_stands`).
    #[doc(hidden)]
    fn mark_stands(conn: &mut Conn, mark: Mark) -> BoxFuture<'_, QueryResult<bool>>;

    /// The table as the database names it, for a stale report (the blocking
    /// side's `CurrentVersionQuery::database_table`).
    #[doc(hidden)]
    fn database_table() -> &'static str;

    /// The move past of a stale write as the journal keeps it, to be made
    /// again outside any transaction once the one that made it rolled back
    /// (the blocking side's `CurrentVersionQuery::move_past_again`).
    #[doc(hidden)]
    fn move_past_again(key: Self::Key, row: Option<String>, version: Self::Version) -> AnyRedo;
}

type Latest<Conn, Q> = <<Conn as AsyncConnectionCore>::Backend as OptimisticBackend>::Latest<Q>;

impl<M, Conn> AsyncVersionQuery<Conn> for M
where
    Conn: AsyncLockingConnection,
    M: VersionCheck<Key: Send + Sync + 'static, Version: Send>,
    M::CurrentVersion: LockingDsl<InShareMode>,
    Latest<Conn, M::CurrentVersion>: for<'q> LoadQuery<'q, Conn, M::Version> + Send + 'static,
    BoxedSqlQuery<'static, Conn::Backend, SqlQuery>: for<'q> LoadQuery<'q, Conn, Unique> + Send,
    BoxedSqlQuery<'static, Conn::Backend, SqlQuery>:
        for<'q> LoadQuery<'q, Conn, TableSchema> + Send,
    BoxedSqlQuery<'static, Conn::Backend, SqlQuery>:
        for<'q> LoadQuery<'q, Conn, Stands> + ExecuteDsl<Conn> + Send,
    SqlQuery: for<'q> LoadQuery<'q, Conn, DatabaseId>,
    TouchVersioned<M>: ExecuteDsl<Conn> + 'static,
    M::Table: QueryFragment<Conn::Backend> + 'static,
    Conn::Backend: Default,
    <Conn::Backend as Backend>::QueryBuilder: Default,
{
    fn load_current_version(
        conn: &mut Conn,
        key: M::Key,
    ) -> BoxFuture<'_, QueryResult<Option<M::Version>>> {
        let query = <Conn::Backend as OptimisticBackend>::latest(M::current_version(key));
        Box::pin(async move { query.get_result(conn).await.optional() })
    }

    fn bump_past(
        conn: &mut Conn,
        key: M::Key,
        version: M::Version,
    ) -> BoxFuture<'_, QueryResult<usize>> {
        Box::pin(ExecuteDsl::execute(touch::<M>(key, version), conn))
    }

    fn key_is_unique(conn: &mut Conn) -> BoxFuture<'_, QueryResult<bool>> {
        Box::pin(async move {
            let declared = TypeId::of::<M::Table>();
            if let Some(known) = rollbacks::cached_unique_key(&mut AsyncWatched(conn), declared) {
                return Ok(known);
            }
            let table = table::of::<M::Table, Conn::Backend>();
            let query = <Conn::Backend as OptimisticBackend>::key_is_unique_query(
                table.schema.as_deref(),
                &table.name,
                M::KEY_COLUMNS,
            );
            let answer = query.get_result::<Unique>(conn).await?;
            Ok(rollbacks::key_checked(
                &mut AsyncWatched(conn),
                declared,
                table,
                answer,
            ))
        })
    }

    fn row_id<'a>(
        conn: &'a mut Conn,
        key: &'a M::Key,
    ) -> BoxFuture<'a, QueryResult<Option<String>>> {
        Box::pin(async move {
            let declared = TypeId::of::<M::Table>();
            let table = table::of::<M::Table, Conn::Backend>;
            let unread = rollbacks::unread(&mut AsyncWatched(&mut *conn), declared, table);
            let fetched = match unread.database {
                true => Some(
                    diesel::sql_query(<Conn::Backend as OptimisticBackend>::DATABASE_ID)
                        .get_result::<DatabaseId>(&mut *conn)
                        .await?,
                ),
                false => None,
            };
            // As the blocking side's `rollbacks::row_id`. The query is built and
            // boxed in a block of its own, so that it is not held across the
            // await (the future would not be `Send`).
            let found = {
                let asking = unread.schema.map(|table| {
                    <Conn::Backend as OptimisticBackend>::table_schema_query(&table.name)
                        .map(|query| load_boxed::<_, TableSchema>(query, &mut *conn))
                });
                match asking {
                    Some(Some(asking)) => asking.await?.schema,
                    // No search decides it: the connection's schema.
                    Some(None) => Some(String::new()),
                    None => None,
                }
            };
            Ok(rollbacks::row_id_with(
                &mut AsyncWatched(conn),
                declared,
                table,
                key,
                fetched,
                found,
            ))
        })
    }

    fn mark(conn: &mut Conn, mark: Mark) -> BoxFuture<'_, QueryResult<()>> {
        Box::pin(async move {
            let query = || <Conn::Backend as OptimisticBackend>::mark_query(mark);
            let sent = execute_boxed(query(), &mut *conn).await;
            match (sent, <Conn::Backend as OptimisticBackend>::MARKS) {
                (Err(_), Some(create)) if marks_missing(&mut *conn).await => {
                    conn.batch_execute(create).await?;
                    execute_boxed(query(), conn).await.map(drop)
                }
                (sent, _) => sent.map(drop),
            }
        })
    }

    fn mark_stands(conn: &mut Conn, mark: Mark) -> BoxFuture<'_, QueryResult<bool>> {
        Box::pin(async move {
            let ask = || <Conn::Backend as OptimisticBackend>::mark_stands_query(mark);
            let asked = load_boxed::<_, Stands>(ask(), &mut *conn).await;
            let row = match (asked, <Conn::Backend as OptimisticBackend>::MARKS) {
                (Err(_), Some(create)) if marks_missing(&mut *conn).await => {
                    conn.batch_execute(create).await?;
                    load_boxed::<_, Stands>(ask(), conn).await?
                }
                (asked, _) => asked?,
            };
            Ok(row.stands != 0)
        })
    }

    fn database_table() -> &'static str {
        &table::of::<M::Table, Conn::Backend>().qualified
    }

    fn move_past_again(key: M::Key, row: Option<String>, version: M::Version) -> AnyRedo {
        let again: MovePast<Conn, M::Key, M::Version> = move_past::<M, Conn>;
        let redo: crate::transaction::journal::AsyncRedo<Conn> =
            Box::new(move |conn: &mut Conn| again(conn, key, row, version));
        Box::new(redo)
    }
}

/// [`OptimisticBackend::marks_missing`], awaited: whether the connection has
/// no table of marks yet, asked after a mark's statement failed.
async fn marks_missing<Conn: diesel_async::AsyncConnection>(conn: &mut Conn) -> bool
where
    Conn::Backend: OptimisticBackend,
{
    match <Conn::Backend as OptimisticBackend>::MARKS_PRESENT {
        Some(probe) => conn.batch_execute(probe).await.is_err(),
        None => false,
    }
}

/// Executes a statement built for every connection, as a boxed future (see
/// [`load_boxed`]).
fn execute_boxed<'c, Conn>(
    query: BoxedSqlQuery<'static, Conn::Backend, SqlQuery>,
    conn: &'c mut Conn,
) -> BoxFuture<'c, QueryResult<usize>>
where
    Conn: AsyncLockingConnection,
    BoxedSqlQuery<'static, Conn::Backend, SqlQuery>: ExecuteDsl<Conn> + Send,
{
    Box::pin(ExecuteDsl::execute(query, conn))
}

/// Loads the row of a catalog query built for every connection, as a boxed
/// future (so that the caller's future is `Send` for any lifetime of the query).
fn load_boxed<'c, Conn, R>(
    query: BoxedSqlQuery<'static, Conn::Backend, SqlQuery>,
    conn: &'c mut Conn,
) -> BoxFuture<'c, QueryResult<R>>
where
    Conn: AsyncLockingConnection,
    R: Send + 'c,
    BoxedSqlQuery<'static, Conn::Backend, SqlQuery>: for<'q> LoadQuery<'q, Conn, R> + Send,
{
    Box::pin(query.get_result::<R>(conn))
}

/// The blocking side's `delete_from`, awaited: a versioned delete of the row
/// `key`, expecting `expected` from `origin` (a struct's, or one from outside).
async fn delete_from<M, Conn>(
    conn: &mut Conn,
    key: M::Key,
    expected: M::Version,
    origin: Origin,
) -> Result<(), Error>
where
    Conn: AsyncLockingConnection,
    M: Versioned + AsyncVersionQuery<Conn>,
    DeleteVersioned<M>: ExecuteDsl<Conn>,
{
    let statement = |checked| delete::<M>(key.clone(), checked);
    let written =
        write_from::<M, Conn, _>(conn, &key, expected, origin, Operation::Delete, statement);
    written.await?.version().map(drop)
}

/// [`write_from`] of the row `model` holds, checking the version it holds (from
/// `origin`) with the statement `statement` builds for the key and the version
/// to check; the version the write left is kept in `model`.
async fn write_held<M, Conn, S>(
    model: &mut M,
    conn: &mut Conn,
    origin: Origin,
    operation: Operation,
    statement: impl FnOnce(M::Key, M::Version) -> S + Send,
) -> Result<(), Error>
where
    Conn: AsyncLockingConnection,
    M: Versioned + AsyncVersionQuery<Conn>,
    S: ExecuteDsl<Conn>,
{
    let key = model.key();
    let expected = model.version();
    let build = |checked| statement(key.clone(), checked);
    let written = write_from::<M, Conn, _>(conn, &key, expected, origin, operation, build).await?;
    settle(model, written)
}

/// Runs one versioned write, expecting a version from `origin`: the sequence
/// the blocking side's `optimistic::versioned::write` drives
/// (`optimistic::sequence`), its decisions taken by the same functions; only
/// the statements are awaited. As on the blocking side, the
/// error of any of its statements (the follow-up read or a move past as well
/// as the write) is decided as a failed write's, once
/// ([`failed_write`](super::connection::failed_write)). An abort the sequence
/// already reported (a savepoint's, from [`execute_once`]) is handed on as it
/// is: while the transaction is open, an [`Error::TransactionAborted`] is not
/// retryable, and the decision never takes it for a new one.
///
/// Its statements run under an [`Unsettled::until_replied`]: a write dropped
/// with one of them in flight on MySQL/MariaDB marks the connection broken, in
/// a transaction or not (a write in autocommit has no level to do it); on
/// every backend, a write dropped after its statement was sent is recorded in
/// the journal as done ([`Tentative`](crate::optimistic::sequence::Tentative)).
async fn write_from<M, Conn, S>(
    conn: &mut Conn,
    key: &M::Key,
    expected: M::Version,
    origin: Origin,
    operation: Operation,
    statement: impl FnOnce(M::Version) -> S + Send,
) -> Result<Written<M::Version>, Error>
where
    Conn: AsyncLockingConnection,
    M: Versioned + AsyncVersionQuery<Conn>,
    S: ExecuteDsl<Conn>,
{
    let mut unsettled = Unsettled::until_replied(conn);
    let (conn, tentative) = unsettled.parts();
    let written = async {
        super::connection::check_write(conn).await?;
        // The sequence's reads are lockkit's own: once it is done, the journal
        // is as sure as `check_write` left it.
        let before = crate::transaction::journal::own_read(&mut AsyncWatched(&mut *conn));
        let sequence = async {
            // As the blocking side: the key check first, which names the schema.
            let unique = M::key_is_unique(conn).await.map_err(classify)?;
            let row = M::row_id(conn, key).await.map_err(classify)?;
            let id = row.as_deref();
            if let Some(mark) =
                Write::<M>::unconfirmed(&mut AsyncWatched(&mut *conn), id, expected, origin)
            {
                let stands = M::mark_stands(conn, mark).await.map_err(classify)?;
                Write::<M>::confirmed(&mut AsyncWatched(&mut *conn), id, mark, stands);
            }
            let watched = &mut AsyncWatched(&mut *conn);
            let write = Write::<M>::start(watched, key, id, expected, origin, operation)?;
            // Dropped from here until the journal records the write, a write
            // in a transaction is recorded as done: PostgreSQL runs a
            // statement whose future was dropped. Not in autocommit, where a
            // record would make the journal forget numbers structs still hold
            // (as after a commit), for a write that may not run.
            *tentative = in_transaction(conn).then(|| write.tentative()).flatten();
            let rows = match write.statement() {
                Some(checked) => {
                    execute_once::<M, Conn, S>(conn, key, unique, move || statement(checked))
                        .await?
                }
                None => 0,
            };
            if rows != 1 {
                *tentative = None;
            }
            let mut step = write.wrote(&mut AsyncWatched(&mut *conn), rows);
            loop {
                if matches!(step, Step::Mark(..) | Step::Done(..)) {
                    *tentative = None; // recorded
                }
                step = match step {
                    Step::ReadCurrent(then) => {
                        let read = M::load_current_version(conn, key.clone()).await;
                        then.read(&mut AsyncWatched(&mut *conn), read)?
                    }
                    Step::MovePast(version, then) => {
                        let bumped = M::bump_past(conn, key.clone(), version)
                            .await
                            .map_err(classify)?;
                        if bumped == 1 {
                            let again = M::move_past_again(key.clone(), row.clone(), version);
                            crate::transaction::journal::redo_after_rollback(
                                &mut AsyncWatched(&mut *conn),
                                again,
                            );
                        }
                        then.moved(&mut AsyncWatched(&mut *conn), bumped)
                    }
                    Step::MovePastReused(version, then) => {
                        let at = move_past_reused::<M, Conn>(conn, key, then.id(), version).await?;
                        then.moved(&mut AsyncWatched(&mut *conn), at)
                    }
                    Step::Mark(mark, written) => {
                        M::mark(conn, mark).await.map_err(classify)?;
                        Step::Done(written)
                    }
                    Step::Done(written) => return Ok(written.named(M::database_table)),
                };
            }
        };
        match sequence.await {
            Ok(written) => {
                crate::transaction::journal::own_read_done(&mut AsyncWatched(&mut *conn), before);
                Ok(written)
            }
            Err(err) => Err(super::connection::failed_write(conn, err).await),
        }
    }
    .await;
    unsettled.settled();
    written
}

/// The blocking side's [`move_past`](crate::optimistic::versioned::move_past),
/// awaited: outside a transaction, moves the row past `version` if it is still
/// there, and on past the numbers other rolled-back writes left; then the
/// journal forgets the numbers up to `version`. Best effort.
fn move_past<M, Conn>(
    conn: &mut Conn,
    key: M::Key,
    row: Option<String>,
    version: M::Version,
) -> BoxFuture<'_, ()>
where
    Conn: AsyncLockingConnection,
    M: Versioned<Key: 'static> + AsyncVersionQuery<Conn>,
{
    Box::pin(async move {
        #[cfg_attr(not(feature = "mysql"), allow(unused_mut))]
        let mut moved = moves::<M, Conn>(conn, &key, row.as_deref(), version).await;
        // Refused in autocommit on a session made read-only outside lockkit's
        // transactions: again in a read-write transaction of their own, as on
        // the blocking side (`committed_alone`), armed from its `START
        // TRANSACTION` to its `COMMIT` (dropped in between, or left with its
        // end failed, the connection is marked broken, and the journal
        // forgets nothing).
        #[cfg(feature = "mysql")]
        if let Err(diesel::result::Error::DatabaseError(_, info)) = &moved {
            if crate::error::classification::is_mysql_read_only_refusal(info.message())
                && !super::connection::in_transaction(conn)
            {
                use crate::transaction::{MYSQL_BEGIN_ALONE, MYSQL_END_ALONE};
                let mut unsettled = super::connection::Unsettled::armed(&mut *conn);
                let inner = &mut *unsettled.conn;
                let mut again = inner.batch_execute(MYSQL_BEGIN_ALONE).await.map(|()| 0);
                if again.is_ok() {
                    again = moves::<M, Conn>(inner, &key, row.as_deref(), version).await;
                }
                if again.is_ok() {
                    again = inner.batch_execute(MYSQL_END_ALONE).await.and(again);
                }
                let end = if again.is_ok() { "COMMIT" } else { "ROLLBACK" };
                let ended = inner.batch_execute(end).await;
                if ended.is_ok() {
                    unsettled.settled();
                }
                drop(unsettled);
                // A server that ended the transaction silently after the
                // savepoint's release answers the `COMMIT` too: the row past
                // `version` is what lets the journal forget it.
                moved = match ended.and(again) {
                    Ok(1) => match M::load_current_version(conn, key.clone()).await {
                        Ok(Some(now)) if now.to_i64() > version.to_i64() => Ok(1),
                        _ => Ok(0),
                    },
                    other => other,
                };
            }
        }
        if !matches!(moved, Ok(1)) {
            return;
        }
        if let Some(row) = row {
            let column = <M::VersionColumn as diesel::Column>::NAME;
            rollbacks::forget_through(column, &row, version.to_i64());
            if let Ok(next) = checked_next::<M>(&key, version) {
                rollbacks::moved_again(column, &row, version.to_i64(), next.to_i64());
            }
        }
    })
}

/// [`move_past`]'s statements: the row moved past `version`, and on past the
/// numbers other rolled-back writes left (best effort). The first move's
/// count, or its error.
async fn moves<M, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    row: Option<&str>,
    version: M::Version,
) -> QueryResult<usize>
where
    Conn: AsyncLockingConnection,
    M: Versioned<Key: 'static> + AsyncVersionQuery<Conn>,
{
    let bumped = M::bump_past(conn, key.clone(), version).await?;
    if bumped == 1 {
        if let Ok(next) = checked_next::<M>(key, version) {
            let watched = &mut AsyncWatched(&mut *conn);
            if !undone_move_only::<M, _>(watched, row, version, next) {
                let _ = move_past_reused::<M, Conn>(conn, key, row, next).await;
            }
        }
    }
    Ok(bumped)
}

/// The blocking side's
/// [`move_past_reused`](crate::optimistic::versioned::move_past_reused),
/// awaited: while `next` is a number a rolled-back write left with a struct
/// ([`rollbacks::reused`]), the row is moved one further, in the writer's
/// transaction. Returns the version the row ends at.
pub(crate) async fn move_past_reused<M, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    row_id: Option<&str>,
    mut next: M::Version,
) -> Result<M::Version, Error>
where
    Conn: AsyncLockingConnection,
    M: Versioned + AsyncVersionQuery<Conn>,
{
    while rollbacks::reused(
        &mut AsyncWatched(&mut *conn),
        <M::VersionColumn as diesel::Column>::NAME,
        row_id,
        next.to_i64(),
    ) {
        // No number past the type's maximum: as on the blocking side.
        let after = match checked_next::<M>(key, next) {
            Ok(after) => after,
            Err(_)
                if crate::transaction::journal::Watched::depth(&mut AsyncWatched(&mut *conn))
                    .is_none() =>
            {
                break
            }
            Err(overflow) => return Err(overflow),
        };
        if M::bump_past(conn, key.clone(), next)
            .await
            .map_err(classify)?
            != 1
        {
            break;
        }
        next = after;
    }
    Ok(next)
}

/// The version bump of an exclusive lock on a row just read under that lock
/// ([`with_lock`](super::with_lock), [`lock_all`](super::lock_all)): the row's
/// own version, checked as read, never one the journal would restore (see
/// `Origin::Read`).
pub(crate) async fn touch_locked<M, Conn>(conn: &mut Conn, row: &mut M) -> Result<(), Error>
where
    Conn: AsyncLockingConnection,
    M: Versioned + AsyncVersionQuery<Conn>,
    TouchVersioned<M>: ExecuteDsl<Conn>,
{
    write_held(row, conn, Origin::Read, Operation::Touch, touch::<M>).await
}

/// Executes a versioned statement; where the database does not enforce the
/// key (`unique`), in a transaction (a savepoint) that is undone if it matched
/// more than one row.
// The statement is built right before it is sent: it never lives across an
// `.await`, so the future is `Send` whatever lifetime the changeset borrows.
async fn execute_once<M, Conn, S>(
    conn: &mut Conn,
    key: &M::Key,
    unique: bool,
    statement: impl FnOnce() -> S + Send,
) -> Result<usize, Error>
where
    Conn: AsyncLockingConnection,
    M: Lockable + AsyncVersionQuery<Conn>,
    S: ExecuteDsl<Conn>,
{
    if unique {
        return ExecuteDsl::execute(statement(), conn)
            .await
            .map_err(classify);
    }
    // In the caller's transaction, a savepoint: when the statement ends the
    // whole transaction (the savepoint with it), `end` decides as for any
    // nested lockkit transaction (`TransactionAborted`, the stand-in open),
    // which `write_from` hands on as it is.
    let began = Began::own(in_transaction(conn));
    super::connection::begin_transaction(conn).await?;
    let mut level = Level::opened(conn);
    let conn = &mut *level;
    let result = ExecuteDsl::execute(statement(), conn)
        .await
        .map_err(classify)
        .and_then(|rows| at_most_one::<M>(key, rows))
        .map_err(Failure::Lockkit);
    super::transaction::end::<Conn, usize, Error>(level, began, Restore::Nothing, result).await
}
