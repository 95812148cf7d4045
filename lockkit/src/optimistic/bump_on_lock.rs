//! What an exclusive lock writes to a [`Versioned`] row: [`with_lock`],
//! [`Lockable::lock`] and [`Lockable::lock_all`] advance its version
//! ([`BumpVersion`]), so that a struct read before the lock can no longer write.
//!
//! A lock sends the locked read, then the bump every versioned write sends
//! (`MarkLocked`). On PostgreSQL a `FOR UPDATE` that waits on one row sends
//! both as one statement (`LockedBump`, through `BumpOnLock`), and falls back
//! to the two when that matches no row. Which lock takes which path, and why,
//! is in the [`lockable`](crate::pessimistic::lockable) module docs. The async
//! side's twins (`AsyncMarkLocked`, `AsyncBumpOnLock`) are in
//! `asynchronous::lockable`.
//!
//! [`with_lock`]: crate::with_lock
//! [`Lockable::lock`]: crate::Lockable::lock
//! [`Lockable::lock_all`]: crate::Lockable::lock_all

use diesel::query_dsl::methods::ExecuteDsl;

use crate::error::{Error, Operation};
use crate::optimistic::sequence::Origin;
use crate::optimistic::versioned::{
    touch, write_held, BumpVersion, CurrentVersionQuery, TouchVersioned, VersionCheck, Versioned,
};
use crate::pessimistic::lockable::MarkLocked;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use crate::pessimistic::lockable::{BumpOnLock, Lockable};

impl<M, Conn> MarkLocked<M, Conn> for BumpVersion
where
    Conn: diesel::Connection,
    M: Versioned + VersionCheck + CurrentVersionQuery<Conn>,
    TouchVersioned<M>: ExecuteDsl<Conn>,
{
    fn mark(conn: &mut Conn, row: &mut M) -> Result<(), Error> {
        // The row is locked: the version cannot have moved since the locked read,
        // and is the row's own (see `Origin::Read`).
        write_held(row, conn, Origin::Read, Operation::Touch, touch::<M>)
    }
}

/// MySQL/MariaDB has no `UPDATE .. RETURNING`; SQLite's (3.35 and later) is
/// left to the two statements, which run on any SQLite Diesel links.
macro_rules! two_statements_on {
    ($($conn:ty, $feature:literal);*) => {$(
        #[cfg(feature = $feature)]
        impl<M: Lockable> BumpOnLock<M, $conn> for BumpVersion {
            fn lock_bumped(_: &mut $conn, _: &M::Key) -> Result<Option<M>, Error> {
                Ok(None)
            }
        }
    )*};
}

two_statements_on!(
    diesel::MysqlConnection, "mysql";
    diesel::SqliteConnection, "sqlite"
);

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use folded::{LockedBump, LockedBumpQuery};

/// PostgreSQL's one-statement lock and bump.
#[cfg(feature = "postgres")]
mod folded {
    use std::marker::PhantomData;

    use diesel::dsl::{self, AsSelect, Find};
    use diesel::expression::{AsExpression, Expression};
    use diesel::pg::{Pg, PgConnection};
    use diesel::query_builder::{
        AsChangeset, AstPass, IntoUpdateTarget, Query, QueryFragment, QueryId,
    };
    use diesel::query_dsl::methods::{FilterDsl, FindDsl, LockingDsl, SelectDsl};
    use diesel::query_dsl::LoadQuery;
    use diesel::query_source::QuerySource;
    use diesel::sql_types::{SingleValue, SqlType};
    use diesel::{
        ExpressionMethods, OptionalExtension, QueryResult, RunQueryDsl, Selectable,
        SelectableHelper,
    };

    use super::BumpVersion;
    use crate::error::classification::classify;
    use crate::error::Error;
    use crate::optimistic::mark::Mark;
    use crate::optimistic::rollbacks;
    use crate::optimistic::version::VersionNumber;
    use crate::optimistic::versioned::{
        move_past_reused, CurrentVersionQuery, VersionCheck, Versioned,
    };
    use crate::pessimistic::lockable::{by_key, BumpOnLock, ByKey, Lockable};
    use crate::pessimistic::row_lock::ForUpdate;
    use crate::transaction::journal;

    type VersionColumnOf<M> = <M as Versioned>::VersionColumn;
    type VersionOf<M> = <M as Versioned>::Version;
    /// `WHERE <key> AND <version> < <the version type's maximum>`.
    type BelowMax<M> = dsl::Filter<
        Find<<M as Lockable>::Table, <M as Lockable>::Key>,
        dsl::Lt<VersionColumnOf<M>, VersionOf<M>>,
    >;

    /// `UPDATE <table> SET <version> = <version> + 1 WHERE <key> AND <version> <
    /// $max AND EXISTS (SELECT <fields> FROM <table> WHERE <key> FOR UPDATE)
    /// RETURNING <fields>`: the locked read of `with_lock` and the bump that
    /// follows it, in one statement (one round trip, one statement for the
    /// client to run).
    ///
    /// * The sub-select takes `FOR UPDATE` first (an uncorrelated `EXISTS` is
    ///   evaluated once, before the row is scanned): a plain `UPDATE` takes only
    ///   `FOR NO KEY UPDATE`, which would let a foreign key check (`FOR KEY
    ///   SHARE`) through. It waits as the locked read does, within
    ///   `lock_timeout`, and a waiter updates the row as its holder left it.
    /// * The version is advanced only below its type's maximum: a row at the
    ///   maximum, like a missing one, matches nothing, and `with_lock` then
    ///   takes the two statements, which refuse it before the bump
    ///   ([`Error::VersionOverflow`]) or report the row missing.
    /// * The `SET` list is the bump of every versioned write (with the model's
    ///   `updated_at`), so a version trigger sees what it always sees.
    ///
    /// Prepared once per connection and found again by type.
    pub struct LockedBump<T: QuerySource, W, V, K, L, S> {
        from_clause: T::FromClause,
        where_clause: W,
        values: V,
        locked: L,
        returning: S,
        bump: PhantomData<fn() -> K>,
    }

    /// The query id of a [`LockedBump`].
    #[doc(hidden)]
    #[derive(Debug)]
    pub struct LockedBumpId<T, W, K, L, S>(PhantomData<(T, W, K, L, S)>);

    impl<T, W, V, K, L, S> QueryId for LockedBump<T, W, V, K, L, S>
    where
        T: QuerySource + QueryId,
        W: QueryId,
        K: QueryId,
        L: QueryId,
        S: QueryId,
    {
        type QueryId = LockedBumpId<T::QueryId, W::QueryId, K::QueryId, L::QueryId, S::QueryId>;
        const HAS_STATIC_QUERY_ID: bool = T::HAS_STATIC_QUERY_ID
            && W::HAS_STATIC_QUERY_ID
            && K::HAS_STATIC_QUERY_ID
            && L::HAS_STATIC_QUERY_ID
            && S::HAS_STATIC_QUERY_ID;
    }

    impl<T: QuerySource, W, V, K, L, S: Expression> Query for LockedBump<T, W, V, K, L, S> {
        type SqlType = S::SqlType;
    }

    impl<T: QuerySource, W, V, K, L, S, Conn> RunQueryDsl<Conn> for LockedBump<T, W, V, K, L, S> {}

    impl<T, W, V, K, L, S> QueryFragment<Pg> for LockedBump<T, W, V, K, L, S>
    where
        T: QuerySource,
        T::FromClause: QueryFragment<Pg>,
        W: QueryFragment<Pg>,
        V: QueryFragment<Pg>,
        L: QueryFragment<Pg>,
        S: QueryFragment<Pg>,
    {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
            out.push_sql("UPDATE ");
            self.from_clause.walk_ast(out.reborrow())?;
            out.push_sql(" SET ");
            self.values.walk_ast(out.reborrow())?;
            self.where_clause.walk_ast(out.reborrow())?;
            out.push_sql(" AND EXISTS (");
            self.locked.walk_ast(out.reborrow())?;
            out.push_sql(") RETURNING ");
            self.returning.walk_ast(out.reborrow())
        }
    }

    /// A [`Versioned`] model whose lock and bump PostgreSQL runs as one
    /// [`LockedBump`]. Blanket-implemented; name it only in `where` clauses.
    #[doc(hidden)]
    pub trait LockedBumpQuery: VersionCheck {
        /// The statement.
        type Statement: QueryFragment<Pg> + QueryId + Query + Send + 'static;
        /// The statement for the row `key`.
        fn locked_bump(key: &Self::Key) -> Self::Statement;
    }

    impl<M> LockedBumpQuery for M
    where
        M: VersionCheck + Selectable<Pg> + 'static,
        M::Key: Send,
        AsSelect<M, Pg>: Expression + QueryFragment<Pg> + QueryId + Send + 'static,
        M::Table: FindDsl<M::Key>,
        Find<M::Table, M::Key>:
            SelectDsl<AsSelect<M, Pg>> + FilterDsl<dsl::Lt<VersionColumnOf<M>, VersionOf<M>>>,
        <VersionColumnOf<M> as Expression>::SqlType: SqlType + SingleValue,
        VersionOf<M>: AsExpression<<VersionColumnOf<M> as Expression>::SqlType>,
        BelowMax<M>: IntoUpdateTarget<Table = M::Table>,
        <BelowMax<M> as IntoUpdateTarget>::WhereClause:
            QueryFragment<Pg> + QueryId + Send + 'static,
        <M::Table as QuerySource>::FromClause: QueryFragment<Pg> + Send + 'static,
        M::Table: QueryId + 'static,
        M::Bump: QueryId + 'static,
        <M::Bump as AsChangeset>::Changeset: QueryFragment<Pg> + Send + 'static,
        ByKey<M, Pg>: LockingDsl<ForUpdate>,
        <ByKey<M, Pg> as LockingDsl<ForUpdate>>::Output:
            QueryFragment<Pg> + QueryId + Send + 'static,
    {
        type Statement = LockedBump<
            M::Table,
            <BelowMax<M> as IntoUpdateTarget>::WhereClause,
            <M::Bump as AsChangeset>::Changeset,
            M::Bump,
            <ByKey<M, Pg> as LockingDsl<ForUpdate>>::Output,
            AsSelect<M, Pg>,
        >;

        fn locked_bump(key: &M::Key) -> Self::Statement {
            let below_max =
                VersionColumnOf::<M>::default().lt(<VersionOf<M> as VersionNumber>::MAX);
            let target = M::Table::default()
                .find(key.clone())
                .filter(below_max)
                .into_update_target();
            LockedBump {
                from_clause: target.table.from_clause(),
                where_clause: target.where_clause,
                values: M::bump().as_changeset(),
                locked: by_key::<M, Pg>(key.clone()).with_lock(ForUpdate),
                returning: M::as_select(),
                bump: PhantomData,
            }
        }
    }

    impl<M> BumpOnLock<M, PgConnection> for BumpVersion
    where
        M: LockedBumpQuery + CurrentVersionQuery<PgConnection>,
        M::Statement: for<'q> LoadQuery<'q, PgConnection, M>,
    {
        fn lock_bumped(conn: &mut PgConnection, key: &M::Key) -> Result<Option<M>, Error> {
            // Where the database does not enforce the key, the two statements:
            // their bump is undone when it matched several rows.
            if !M::key_is_unique(conn).map_err(classify)? {
                return Ok(None);
            }
            let row_id = M::row_id(conn, key).map_err(classify)?;
            let Some(mut row) = M::locked_bump(key)
                .get_result::<M>(conn)
                .optional()
                .map_err(classify)?
            else {
                return Ok(None);
            };
            // Written as read, under the lock: the plan of `mark`'s bump.
            let next = move_past_reused::<M, _>(conn, key, row_id.as_deref(), row.version())?;
            if let Some(mark) = written_under_lock::<M>(conn, row_id.as_deref(), &row, next) {
                M::mark(conn, mark).map_err(classify)?;
            }
            row.set_version(next);
            Ok(Some(row))
        }
    }

    /// What the bump of `mark` records after its write: the row moved from the
    /// version before the folded statement's (`row`'s, less one) to `next`;
    /// on a connection the journal cannot watch, the mark its caller sends.
    pub(crate) fn written_under_lock<M: Versioned>(
        conn: &mut impl journal::Watched,
        row_id: Option<&str>,
        row: &M,
        next: M::Version,
    ) -> Option<Mark> {
        let from = row.version().to_i64() - 1;
        rollbacks::written(
            conn,
            <M::VersionColumn as diesel::Column>::NAME,
            row_id,
            from,
            Some(next.to_i64()),
        )
    }
}

#[cfg(all(feature = "postgres", feature = "async"))]
pub(crate) use folded::written_under_lock;
