//! The `UPDATE` of every versioned write, as a statement Diesel prepares once per
//! connection.
//!
//! Diesel never caches a prepared `UPDATE`: its own update statement has no
//! static query id and declares itself unsafe to cache, because the columns an
//! `Option` field skips change its SQL. Every `update_versioned` would then be
//! parsed and planned again by the server (prepared again by SQLite). A versioned
//! write has one fixed shape: `SET <fields>, <version> = <version> + 1 WHERE <key>
//! AND <version> = $expected`. [`VersionedUpdate`] is that statement, with a
//! [`CacheKey`] saying how Diesel's statement cache may key it:
//!
//! * [`ByType`]: the fields' SQL follows from their type (no field is skipped at
//!   run time): the statement has a static query id and is prepared once per
//!   connection, looked up by type, without building its SQL again.
//!   `#[derive(Versioned)]` uses it for models without `Option` fields that are
//!   skipped when `None`.
//! * [`BySql`]: the fields' SQL may vary (a skipped `None`, a changeset you pass
//!   to `update_versioned_with` / `update_by_version`): Diesel keys the prepared
//!   statement by its SQL text, so each distinct set of written columns is
//!   prepared once per connection. Anything Diesel itself refuses to cache (an
//!   `IN` list on MySQL/SQLite, raw SQL) still makes the whole statement uncached.
//!
//! `DELETE` needs none of this: Diesel caches a delete by type already.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel::query_builder::QueryId;
//! use lockkit::prelude::*;
//! # diesel::table! { items (id) { id -> Integer, stock -> Integer, note -> Nullable<Text>, lock_version -> Integer } }
//!
//! #[derive(Queryable, Selectable, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub stock: i32, pub note: Option<String>, pub lock_version: i32 }
//!
//! #[derive(Queryable, Selectable, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Stock { pub id: i32, pub stock: i32, pub lock_version: i32 }
//!
//! fn cached_by_type<Q: QueryId>(_: &Q) -> bool {
//!     Q::HAS_STATIC_QUERY_ID
//! }
//! let stock = Stock { id: 1, stock: 3, lock_version: 0 };
//! assert!(cached_by_type(&stock.update_versioned_statement()));
//! // `note` is left out when `None`: one prepared statement per shape, keyed by its SQL.
//! let item = Item { id: 1, stock: 3, note: None, lock_version: 0 };
//! assert!(!cached_by_type(&item.update_versioned_statement()));
//! ```

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AsChangeset, AstPass, QueryFragment, QueryId, UpdateTarget};
use diesel::query_source::{QuerySource, Table};
use diesel::result::{EmptyChangeset, Error as DieselError};
use diesel::QueryResult;

/// `UPDATE <table> SET <values> <where clause>`: a versioned write's statement,
/// which Diesel's statement cache keeps (see the [module docs](self)).
///
/// Built by [`Versioned`](crate::Versioned)'s `*_statement` methods and, for any
/// `UPDATE`, by [`atomic::update`](crate::atomic::update); print it with
/// `diesel::debug_query`, run it with `execute`.
pub struct VersionedUpdate<T: QuerySource, W, V, K> {
    from_clause: T::FromClause,
    where_clause: W,
    values: V,
    key: PhantomData<K>,
}

impl<T: QuerySource, W, V, K> VersionedUpdate<T, W, V, K> {
    /// The statement that applies `changes` to `target`'s rows.
    pub(crate) fn new<C>(target: UpdateTarget<T, W>, changes: C) -> Self
    where
        T: Table,
        C: AsChangeset<Target = T, Changeset = V>,
    {
        VersionedUpdate {
            from_clause: target.table.from_clause(),
            where_clause: target.where_clause,
            values: changes.as_changeset(),
            key: PhantomData,
        }
    }
}

impl<T: QuerySource, W, V, K> std::fmt::Debug for VersionedUpdate<T, W, V, K>
where
    T::FromClause: std::fmt::Debug,
    W: std::fmt::Debug,
    V: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionedUpdate")
            .field("from_clause", &self.from_clause)
            .field("where_clause", &self.where_clause)
            .field("values", &self.values)
            .finish()
    }
}

impl<DB, T, W, V, K> QueryFragment<DB> for VersionedUpdate<T, W, V, K>
where
    DB: Backend,
    T: QuerySource,
    T::FromClause: QueryFragment<DB>,
    W: QueryFragment<DB>,
    V: QueryFragment<DB>,
{
    // Diesel's own `UPDATE`, less its `unsafe_to_cache_prepared()`: whether this
    // one may be cached is what its parts say (a bound value may; raw SQL or a
    // MySQL/SQLite `IN` list may not).
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if self.values.is_noop(out.backend())? {
            return Err(DieselError::QueryBuilderError(Box::new(EmptyChangeset)));
        }
        out.push_sql("UPDATE ");
        self.from_clause.walk_ast(out.reborrow())?;
        out.push_sql(" SET ");
        self.values.walk_ast(out.reborrow())?;
        self.where_clause.walk_ast(out.reborrow())
    }
}

impl<T: QuerySource, W, V, K, Conn> diesel::RunQueryDsl<Conn> for VersionedUpdate<T, W, V, K> {}

impl<T, W, V, K> QueryId for VersionedUpdate<T, W, V, K>
where
    T: QuerySource + QueryId,
    W: QueryId,
    K: CacheKey,
{
    // The table and the `WHERE` (key and version columns) by their own ids, the
    // `SET` list by its cache key.
    type QueryId = VersionedUpdateId<T::QueryId, W::QueryId, K::QueryId>;
    const HAS_STATIC_QUERY_ID: bool =
        T::HAS_STATIC_QUERY_ID && W::HAS_STATIC_QUERY_ID && K::HAS_STATIC_QUERY_ID;
}

/// The query id of a [`VersionedUpdate`]: table, `WHERE` and `SET` keys.
#[doc(hidden)]
#[derive(Debug)]
pub struct VersionedUpdateId<T, W, K>(PhantomData<(T, W, K)>);

/// How Diesel's statement cache keys the `SET` list of a [`VersionedUpdate`]: by
/// type ([`ByType`]) or by SQL text ([`BySql`]).
///
/// Implemented by lockkit; `#[derive(Versioned)]` picks one for the model's
/// fields. A `Versioned` written by hand wraps its changeset in either.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say how its UPDATE is cached",
    label = "wrap the changeset in `lockkit::optimistic::statement::ByType` or `BySql`",
    note = "`ByType` when the SQL of the fields follows from their type (no `Option` skipped when `None`), `BySql` otherwise"
)]
pub trait CacheKey {
    /// The type that stands for the SQL, when [`HAS_STATIC_QUERY_ID`](Self::HAS_STATIC_QUERY_ID).
    type QueryId: 'static;
    /// Whether the SQL follows from the type alone.
    const HAS_STATIC_QUERY_ID: bool;
}

/// Fields whose SQL follows from their type: the statement is cached by type.
///
/// `C`'s Diesel [`QueryId`] is the key, so every part of it must have one (a
/// bound value, a column, an operator do). Use [`BySql`] when a field may be
/// skipped at run time.
#[derive(Debug, Clone, Copy)]
pub struct ByType<C>(pub C);

/// Fields whose SQL may vary at run time (an `Option` skipped when `None`): the
/// statement is cached by its SQL text, one prepared statement per shape.
#[derive(Debug, Clone, Copy)]
pub struct BySql<C>(pub C);

impl<C: QueryId> CacheKey for ByType<C> {
    type QueryId = ByType<C::QueryId>;
    const HAS_STATIC_QUERY_ID: bool = C::HAS_STATIC_QUERY_ID;
}

impl<C> CacheKey for BySql<C> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// A changeset and the version bump that follows it.
impl<A: CacheKey, B: QueryId> CacheKey for (A, B) {
    type QueryId = (A::QueryId, B::QueryId);
    const HAS_STATIC_QUERY_ID: bool = A::HAS_STATIC_QUERY_ID && B::HAS_STATIC_QUERY_ID;
}

macro_rules! delegate_changeset {
    ($($wrapper:ident),*) => {$(
        impl<C: AsChangeset> AsChangeset for $wrapper<C> {
            type Target = C::Target;
            type Changeset = C::Changeset;

            fn as_changeset(self) -> Self::Changeset {
                self.0.as_changeset()
            }
        }
    )*};
}

delegate_changeset!(ByType, BySql);
