//! The version check itself: the SQL every versioned write is built from, for
//! every model and connection that fit.
//!
//! The bound traits of the versioned writes are declared with the model trait
//! ([`versioned`](crate::optimistic::versioned), whose methods name them) and
//! implemented here; you never implement them yourself.
//! [`VersionCheck`] is implemented for every [`Versioned`] model whose table,
//! key and version column fit together. It holds the three SQL fragments of
//! optimistic locking:
//!
//! * the target: `WHERE <primary key> = $key AND <version> = $expected`
//! * the bump: `SET <version> = <version> + 1` (and `updated_at = CURRENT_TIMESTAMP`
//!   for a model with an [`updated_at`](crate::optimistic::updated_at) field)
//! * the follow-up read after a stale write: `SELECT <version> WHERE <primary key> = $key`
//!   (`LOCK IN SHARE MODE` on MySQL/MariaDB, so that it sees the latest commit)
//!
//! [`CurrentVersionQuery`] is implemented for every model on each connection
//! lockkit supports: the follow-up read, the one extra write of a stale
//! write's path, and the check that the database enforces the key.

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

use std::any::TypeId;

use diesel::dsl::{self, Find, Select};
use diesel::expression::{AsExpression, Expression};
use diesel::query_builder::{AsChangeset, IntoUpdateTarget, QueryFragment};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, FindDsl, LockingDsl, SelectDsl};
use diesel::query_dsl::LoadQuery;
use diesel::sql_types::SqlType;
use diesel::{Connection, ExpressionMethods, OptionalExtension, RunQueryDsl};

use crate::optimistic::backend::{InShareMode, OptimisticBackend};
use crate::optimistic::mark::Mark;
use crate::optimistic::rollbacks;
use crate::optimistic::table;
use crate::optimistic::version::VersionNumber;
use crate::optimistic::versioned::{touch, Versioned};
pub use crate::optimistic::versioned::{
    CurrentVersionQuery, DeleteVersioned, TouchVersioned, UpdateVersioned, VersionCheck,
};
use crate::transaction::journal;

type VersionColumnOf<M> = <M as Versioned>::VersionColumn;
type VersionOf<M> = <M as Versioned>::Version;

impl<M> VersionCheck for M
where
    M: Versioned,
    M::Table: FindDsl<M::Key>,
    Find<M::Table, M::Key>:
        FilterDsl<dsl::Eq<VersionColumnOf<M>, VersionOf<M>>> + SelectDsl<VersionColumnOf<M>>,
    dsl::Filter<Find<M::Table, M::Key>, dsl::Eq<VersionColumnOf<M>, VersionOf<M>>>:
        IntoUpdateTarget<Table = M::Table>,
    VersionColumnOf<M>: ExpressionMethods + std::ops::Add<VersionOf<M>>,
    <VersionColumnOf<M> as Expression>::SqlType: SqlType,
    VersionOf<M>: AsExpression<<VersionColumnOf<M> as Expression>::SqlType>,
    <VersionColumnOf<M> as std::ops::Add<VersionOf<M>>>::Output:
        AsExpression<<VersionColumnOf<M> as Expression>::SqlType>,
    dsl::Eq<VersionColumnOf<M>, <VersionColumnOf<M> as std::ops::Add<VersionOf<M>>>::Output>:
        AsChangeset<Target = M::Table>,
{
    type Target = dsl::Filter<Find<M::Table, M::Key>, dsl::Eq<VersionColumnOf<M>, VersionOf<M>>>;
    type Bump = (
        dsl::Eq<VersionColumnOf<M>, <VersionColumnOf<M> as std::ops::Add<VersionOf<M>>>::Output>,
        M::UpdatedAt,
    );
    type CurrentVersion = Select<Find<M::Table, M::Key>, VersionColumnOf<M>>;

    fn target(key: M::Key, expected: M::Version) -> Self::Target {
        M::Table::default()
            .find(key)
            .filter(VersionColumnOf::<M>::default().eq(expected))
    }

    fn bump() -> Self::Bump {
        let version = VersionColumnOf::<M>::default();
        (
            version.eq(VersionColumnOf::<M>::default() + <M::Version as VersionNumber>::ONE),
            M::UpdatedAt::default(),
        )
    }

    fn current_version(key: M::Key) -> Self::CurrentVersion {
        M::Table::default()
            .find(key)
            .select(VersionColumnOf::<M>::default())
    }
}

/// Implements [`CurrentVersionQuery`] for every model that fits, on each
/// connection lockkit supports (a [`Dispatch`](crate::multi::Dispatch) enum
/// hands it on to the connection it holds: `multi.rs`).
macro_rules! current_version_query_on {
    ($($conn:ty: $cfg:meta),* $(,)?) => {$(
        #[cfg($cfg)]
        impl<M> CurrentVersionQuery<$conn> for M
        where
            M: VersionCheck,
            M::CurrentVersion: LockingDsl<InShareMode>,
            <Backend<$conn> as OptimisticBackend>::Latest<M::CurrentVersion>:
                for<'q> LoadQuery<'q, $conn, M::Version>,
            TouchVersioned<M>: ExecuteDsl<$conn>,
            M::Table: QueryFragment<Backend<$conn>> + 'static,
            M::Key: Send + 'static,
        {
            fn load_current_version(
                conn: &mut $conn,
                key: M::Key,
            ) -> diesel::QueryResult<Option<M::Version>> {
                <Backend<$conn> as OptimisticBackend>::latest(M::current_version(key))
                    .get_result(conn)
                    .optional()
            }

            fn bump_past(
                conn: &mut $conn,
                key: M::Key,
                version: M::Version,
            ) -> diesel::QueryResult<usize> {
                ExecuteDsl::execute(touch::<M>(key, version), conn)
            }

            fn known_key_is_unique(conn: &mut $conn) -> Option<bool> {
                rollbacks::known_unique_key(conn, TypeId::of::<M::Table>())
            }

            fn key_is_unique(conn: &mut $conn) -> diesel::QueryResult<bool> {
                if let Some(known) = rollbacks::cached_unique_key(conn, TypeId::of::<M::Table>()) {
                    return Ok(known);
                }
                let table = table::of::<M::Table, Backend<$conn>>();
                let answer = <Backend<$conn> as OptimisticBackend>::key_is_unique(
                    conn,
                    table.schema.as_deref(),
                    &table.name,
                    M::KEY_COLUMNS,
                )?;
                Ok(rollbacks::key_checked(conn, TypeId::of::<M::Table>(), table, answer))
            }

            fn row_id(conn: &mut $conn, key: &M::Key) -> diesel::QueryResult<Option<String>> {
                rollbacks::row_id(
                    conn,
                    TypeId::of::<M::Table>(),
                    table::of::<M::Table, Backend<$conn>>,
                    key,
                    <Backend<$conn> as OptimisticBackend>::database_id,
                    <Backend<$conn> as OptimisticBackend>::table_schema,
                )
            }

            fn database_table(_: &mut $conn) -> &'static str {
                &table::of::<M::Table, Backend<$conn>>().qualified
            }

            fn mark(conn: &mut $conn, mark: Mark) -> diesel::QueryResult<()> {
                <Backend<$conn> as OptimisticBackend>::mark(conn, mark)
            }

            fn mark_stands(conn: &mut $conn, mark: Mark) -> diesel::QueryResult<bool> {
                <Backend<$conn> as OptimisticBackend>::mark_stands(conn, mark)
            }

            fn ends(_: &mut $conn) -> journal::Ends {
                journal::Ends::of::<Backend<$conn>>()
            }

            fn move_past_again(
                key: M::Key,
                row: Option<String>,
                version: M::Version,
            ) -> journal::AnyRedo {
                use crate::optimistic::versioned::{move_past, move_past_again};
                move_past_again(move_past::<M, $conn>, key, row, version)
            }

            fn redo_after_own_rollback(conn: &mut $conn) {
                crate::transaction::redo(conn);
            }
        }
    )*};
}

type Backend<C> = <C as Connection>::Backend;

crate::sealed::every_connection!(current_version_query_on);
