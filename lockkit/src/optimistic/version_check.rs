//! The version check itself: the statement pieces every versioned write is built
//! from, and their run on a blocking connection, which turns "0 rows" into a
//! [`StaleObjectError`](crate::StaleObjectError).
//!
//! [`VersionCheck`] is implemented for every [`Versioned`] model whose table,
//! key and version column fit together; you never implement it yourself. It holds
//! the three SQL fragments of optimistic locking:
//!
//! * the target: `WHERE <primary key> = $key AND <version> = $expected`
//! * the bump: `SET <version> = <version> + 1` (and `updated_at = CURRENT_TIMESTAMP`
//!   for a model with an [`updated_at`](crate::optimistic::updated_at) field)
//! * the follow-up read after a stale write: `SELECT <version> WHERE <primary key> = $key`
//!   (`LOCK IN SHARE MODE` on MySQL/MariaDB, so that it sees the latest commit)
//!
//! and [`write`], which runs a versioned write on a blocking connection: it
//! sends the statements of the one sequence every versioned write goes
//! through, blocking or async (`optimistic::sequence`, which decides it).

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

use diesel::dsl::{self, Find, Select};
use diesel::expression::{AsExpression, Expression};
use diesel::query_builder::{AsChangeset, IntoUpdateTarget};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, FindDsl, LockingDsl, SelectDsl};
use diesel::query_dsl::LoadQuery;
use diesel::sql_types::SqlType;
use diesel::{Connection, ExpressionMethods, OptionalExtension, RunQueryDsl};

use crate::error::classification::classify;
use crate::error::{Error, Operation};
use crate::optimistic::backend::{InShareMode, OptimisticBackend};
use crate::optimistic::journal::{self, Plan};
use crate::optimistic::sequence::{checked_next, Origin, Step, Write, Written};
use crate::optimistic::statement::{ByType, VersionedUpdate};
use crate::optimistic::version::VersionNumber;
use crate::optimistic::versioned::Versioned;
use crate::pessimistic::lockable::Lockable;

type VersionColumnOf<M> = <M as Versioned>::VersionColumn;
type VersionOf<M> = <M as Versioned>::Version;

type TableOf<M> = <M as Lockable>::Table;
type WhereOf<M> = <<M as VersionCheck>::Target as IntoUpdateTarget>::WhereClause;
type BumpOf<M> = <M as VersionCheck>::Bump;

/// `UPDATE ... SET <changes>, <version> = <version> + 1 WHERE <key> AND <version> = $`,
/// cached as `S` says ([`ByType`] or
/// [`BySql`](crate::optimistic::statement::BySql)).
pub type UpdateVersioned<M, S> = VersionedUpdate<
    TableOf<M>,
    WhereOf<M>,
    <(S, BumpOf<M>) as AsChangeset>::Changeset,
    (S, BumpOf<M>),
>;
/// `UPDATE ... SET <version> = <version> + 1 WHERE <key> AND <version> = $`.
pub type TouchVersioned<M> = VersionedUpdate<
    TableOf<M>,
    WhereOf<M>,
    <BumpOf<M> as AsChangeset>::Changeset,
    ByType<BumpOf<M>>,
>;
/// `DELETE FROM ... WHERE <key> AND <version> = $`.
pub type DeleteVersioned<M> = dsl::delete<<M as VersionCheck>::Target>;

/// The SQL fragments of a version check, for any [`Versioned`] model.
///
/// Blanket-implemented; it exists so that the bounds Diesel needs to build these
/// fragments are written once, here, instead of on every method. Name it only in
/// `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no version check: its table, key and version column do not fit together",
    label = "lockkit cannot build `WHERE <key> = $1 AND <version> = $2` for this model",
    note = "the key must be what `table.find(..)` takes and the version a `SmallInt`, `Integer` or `BigInt` column of the same table; `#[derive(Versioned)]` reads both from `#[diesel(..)]`"
)]
pub trait VersionCheck: Versioned {
    /// `table.find(key).filter(version.eq(expected))`.
    type Target: IntoUpdateTarget<Table = Self::Table>;
    /// `version.eq(version + 1)`, and the model's [`Versioned::UpdatedAt`].
    type Bump: AsChangeset<Target = Self::Table>;
    /// `table.find(key).select(version)`.
    type CurrentVersion;

    /// The row at `key` if, and only if, it still has `expected`.
    fn target(key: Self::Key, expected: Self::Version) -> Self::Target;
    /// The version increment.
    fn bump() -> Self::Bump;
    /// The follow-up read of the current version.
    fn current_version(key: Self::Key) -> Self::CurrentVersion;
}

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

/// What a versioned write needs from the connection besides the statement: the
/// reads and the one extra write of its failure path, and the key check.
///
/// Implemented for every model on `PgConnection`, `MysqlConnection`,
/// `SqliteConnection`, r2d2 pooled connections to them, and
/// [`Dispatch`](crate::multi::Dispatch) enums over them; it exists so that
/// these bounds are written once, here. Name it only in `where` clauses
/// ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's versioned writes on `{Self}` do not run on `{Conn}`",
    label = "not a connection lockkit's versioned writes support",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums that implement `lockkit::multi::Dispatch`"
)]
pub trait CurrentVersionQuery<Conn>: VersionCheck {
    /// `Some(version)`, or `None` when the row is gone: the latest committed state.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_current_version(
        conn: &mut Conn,
        key: Self::Key,
    ) -> diesel::QueryResult<Option<Self::Version>>;

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
    ) -> diesel::QueryResult<usize>;

    /// Whether the database enforces the declared key (a unique index on key
    /// columns only), so that it can never match two rows.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn key_is_unique(conn: &mut Conn) -> diesel::QueryResult<bool>;

    /// The row's identity for the [`journal`]: database, table and
    /// key; `None` when the journal needs none (nothing recorded, no transaction).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn row_id(conn: &mut Conn, key: &Self::Key) -> diesel::QueryResult<Option<String>>;

    /// How a failed statement leaves the open transaction on `conn`'s backend,
    /// for the [`journal`] (an enum's: the connection it holds), so that a
    /// write that installs it inside the caller's transaction knows what it
    /// may have missed there.
    #[doc(hidden)]
    fn ends(conn: &mut Conn) -> journal::Ends;
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

            fn key_is_unique(conn: &mut $conn) -> diesel::QueryResult<bool> {
                if let Some(known) = journal::cached_unique_key(conn, M::TABLE_NAME) {
                    return Ok(known);
                }
                let unique = <Backend<$conn> as OptimisticBackend>::key_is_unique(
                    conn,
                    M::TABLE_NAME,
                    M::KEY_COLUMNS,
                )?;
                journal::cache_unique_key(conn, M::TABLE_NAME, unique);
                Ok(unique)
            }

            fn row_id(conn: &mut $conn, key: &M::Key) -> diesel::QueryResult<Option<String>> {
                journal::row_id(conn, key, <Backend<$conn> as OptimisticBackend>::database_id)
            }

            fn ends(_: &mut $conn) -> journal::Ends {
                journal::Ends::of::<Backend<$conn>>()
            }
        }
    )*};
}

/// The statement that applies `changes` (and the version bump) to the row `key`
/// if it still has `expected`.
pub(crate) fn update<M, S>(key: M::Key, expected: M::Version, changes: S) -> UpdateVersioned<M, S>
where
    M: VersionCheck,
    (S, M::Bump): AsChangeset<Target = M::Table>,
{
    VersionedUpdate::new(
        M::target(key, expected).into_update_target(),
        (changes, M::bump()),
    )
}

/// The statement that bumps the version of the row `key` if it still has `expected`.
pub(crate) fn touch<M: VersionCheck>(key: M::Key, expected: M::Version) -> TouchVersioned<M> {
    VersionedUpdate::new(M::target(key, expected).into_update_target(), M::bump())
}

type Backend<C> = <C as Connection>::Backend;
#[cfg(feature = "r2d2")]
#[allow(unused)] // without a backend feature
type Pooled<C> = diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>>;

current_version_query_on!(
    diesel::PgConnection: feature = "postgres",
    diesel::MysqlConnection: feature = "mysql",
    diesel::SqliteConnection: feature = "sqlite",
);
#[cfg(feature = "r2d2")]
current_version_query_on!(
    Pooled<diesel::PgConnection>: feature = "postgres",
    Pooled<diesel::MysqlConnection>: feature = "mysql",
    Pooled<diesel::SqliteConnection>: feature = "sqlite",
);

/// The version a write that left the row at `next` ends with: while `next` is
/// a number a rolled-back write left with another struct ([`journal::reused`]),
/// the row is moved one further (`bump_past`), in the writer's transaction.
pub(crate) fn move_past_reused<M, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    row_id: Option<&str>,
    plan: Plan,
    mut next: M::Version,
) -> Result<M::Version, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
{
    while journal::reused(conn, M::TABLE_NAME, row_id, plan, next.to_i64()) {
        if M::bump_past(conn, key.clone(), next).map_err(classify)? != 1 {
            break;
        }
        next = checked_next::<M, _>(key, next)?;
    }
    Ok(next)
}

/// Runs one versioned write, expecting the version `expected` from `origin`:
/// drives the sequence (`optimistic::sequence`) on `conn`.
///
/// `statement` builds the statement for the version to check (usually
/// `expected`; see [`journal`]).
///
/// Any statement of the sequence may end the caller's transaction (on
/// MySQL/MariaDB, the victim of a deadlock: the follow-up read under `LOCK IN
/// SHARE MODE` or a move past as well as the write), so the call's error is
/// decided as a failed write's, once
/// ([`failed_write`](crate::transaction::failed_write)).
pub(crate) fn write<M, S, Conn>(
    conn: &mut Conn,
    key: &M::Key,
    expected: M::Version,
    origin: Origin,
    operation: Operation,
    statement: impl FnOnce(M::Version) -> S,
) -> Result<Written<M::Version>, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    let sequence = |conn: &mut Conn| -> Result<Written<M::Version>, Error> {
        let row = M::row_id(conn, key).map_err(classify)?;
        let write = Write::<M>::start(conn, key, row.as_deref(), expected, origin, operation)?;
        let rows = match write.statement() {
            Some(checked) => execute_once::<M, _, _>(conn, key, statement(checked))?,
            None => 0,
        };
        let mut step = write.wrote(conn, rows);
        loop {
            step = match step {
                Step::ReadCurrent(then) => {
                    let read = M::load_current_version(conn, key.clone());
                    then.read(conn, read)?
                }
                Step::MovePast(version, then) => {
                    let bumped = M::bump_past(conn, key.clone(), version).map_err(classify)?;
                    then.moved(conn, bumped)
                }
                Step::MovePastReused(version, then) => {
                    let at = move_past_reused::<M, _>(conn, key, then.id(), then.plan(), version)?;
                    then.moved(conn, at)
                }
                Step::Done(written) => return Ok(written),
            };
        }
    };
    // The rule of the backend inside a `MultiConnection` enum, which its
    // backend type does not name.
    let ends = M::ends(conn);
    journal::watch(conn, |_| ends);
    crate::transaction::check_write(conn)?;
    sequence(conn).map_err(|err| crate::transaction::failed_write(conn, err, ends))
}

/// Executes a versioned statement; where the database does not enforce the
/// key, in a savepoint that is undone if it matched more than one row.
fn execute_once<M, S, Conn>(conn: &mut Conn, key: &M::Key, statement: S) -> Result<usize, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    if M::key_is_unique(conn).map_err(classify)? {
        return ExecuteDsl::execute(statement, conn).map_err(classify);
    }
    // In the caller's transaction, a savepoint. A deadlock's victim on
    // MySQL/MariaDB takes the savepoint with the whole transaction; Diesel,
    // which marks its transaction manager on that error (1213), lets the failed
    // `ROLLBACK TO SAVEPOINT` go and hands back the statement's error, which
    // `write` decides as without a savepoint.
    conn.transaction(|conn| {
        at_most_one::<M>(key, ExecuteDsl::execute(statement, conn).map_err(classify)?)
    })
}

/// A versioned statement run where the database does not enforce the key
/// matched `rows` rows: more than one is [`Error::AmbiguousKey`], and the
/// caller undoes the write. Decided here for the blocking and the async writes.
pub(crate) fn at_most_one<M: Lockable>(key: &M::Key, rows: usize) -> Result<usize, Error> {
    match rows {
        0 | 1 => Ok(rows),
        _ => Err(Error::AmbiguousKey {
            table: M::TABLE_NAME,
            key: format!("{key:?}"),
        }),
    }
}
