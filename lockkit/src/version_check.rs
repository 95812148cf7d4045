//! The version check itself: the statement pieces every versioned write is built
//! from, and the execution that turns "0 rows" into a [`StaleObjectError`].
//!
//! [`VersionCheck`] is implemented for every [`Versioned`] model whose table,
//! key and version column fit together; you never implement it yourself. It holds
//! the three SQL fragments of optimistic locking:
//!
//! * the target: `WHERE <primary key> = $key AND <version> = $expected`
//! * the bump: `SET <version> = <version> + 1`
//! * the follow-up read after a stale write: `SELECT <version> WHERE <primary key> = $key`

use diesel::dsl::{self, Find, Select};
use diesel::expression::{AsExpression, Expression};
use diesel::query_builder::{AsChangeset, IntoUpdateTarget};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, FindDsl, SelectDsl};
use diesel::query_dsl::LoadQuery;
use diesel::sql_types::SqlType;
use diesel::{Column, Connection, ExpressionMethods, OptionalExtension, RunQueryDsl};

use crate::version::VersionNumber;
use crate::{classify, CurrentState, Error, Operation, StaleObjectError, Versioned};

type VersionColumnOf<M> = <M as Versioned>::VersionColumn;
type VersionOf<M> = <M as Versioned>::Version;

/// `UPDATE ... SET <changes>, <version> = <version> + 1 WHERE <key> AND <version> = $`.
pub type UpdateVersioned<M, C> =
    dsl::Update<<M as VersionCheck>::Target, (C, <M as VersionCheck>::Bump)>;
/// `UPDATE ... SET <version> = <version> + 1 WHERE <key> AND <version> = $`.
pub type TouchVersioned<M> = dsl::Update<<M as VersionCheck>::Target, <M as VersionCheck>::Bump>;
/// `DELETE FROM ... WHERE <key> AND <version> = $`.
pub type DeleteVersioned<M> = dsl::delete<<M as VersionCheck>::Target>;

/// The SQL fragments of a version check, for any [`Versioned`] model.
///
/// Blanket-implemented; it exists so that the bounds Diesel needs to build these
/// fragments are written once, here, instead of on every method.
pub trait VersionCheck: Versioned {
    /// `table.find(key).filter(version.eq(expected))`.
    type Target: IntoUpdateTarget<Table = Self::Table>;
    /// `version.eq(version + 1)`.
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
    type Bump =
        dsl::Eq<VersionColumnOf<M>, <VersionColumnOf<M> as std::ops::Add<VersionOf<M>>>::Output>;
    type CurrentVersion = Select<Find<M::Table, M::Key>, VersionColumnOf<M>>;

    fn target(key: M::Key, expected: M::Version) -> Self::Target {
        M::Table::default()
            .find(key)
            .filter(VersionColumnOf::<M>::default().eq(expected))
    }

    fn bump() -> Self::Bump {
        let version = VersionColumnOf::<M>::default();
        version.eq(VersionColumnOf::<M>::default() + <M::Version as VersionNumber>::ONE)
    }

    fn current_version(key: M::Key) -> Self::CurrentVersion {
        M::Table::default()
            .find(key)
            .select(VersionColumnOf::<M>::default())
    }
}

/// Reads the current version of a row after a stale write (failure path only).
///
/// Blanket-implemented for every connection that can run the query.
pub trait CurrentVersionQuery<Conn>: VersionCheck {
    /// `Some(version)`, or `None` when the row is gone.
    fn load_current_version(
        conn: &mut Conn,
        key: Self::Key,
    ) -> diesel::QueryResult<Option<Self::Version>>;
}

impl<M, Conn> CurrentVersionQuery<Conn> for M
where
    M: VersionCheck,
    Conn: Connection,
    M::CurrentVersion: for<'q> LoadQuery<'q, Conn, M::Version>,
{
    fn load_current_version(
        conn: &mut Conn,
        key: M::Key,
    ) -> diesel::QueryResult<Option<M::Version>> {
        M::current_version(key).get_result(conn).optional()
    }
}

/// The version a successful write will leave, or [`Error::VersionOverflow`].
pub(crate) fn next_version<M: Versioned>(model: &M) -> Result<M::Version, Error> {
    match model.version().checked_next() {
        Some(next) => Ok(next),
        // The key is only needed (and cloned) for the error.
        None => checked_next::<M>(&model.key(), model.version()),
    }
}

pub(crate) fn checked_next<M: Versioned>(
    key: &M::Key,
    expected: M::Version,
) -> Result<M::Version, Error> {
    expected
        .checked_next()
        .ok_or_else(|| Error::VersionOverflow {
            table: M::TABLE_NAME,
            key: format!("{key:?}"),
            version: expected.to_i64(),
        })
}

/// Runs a version-checked statement: one matched row is success, zero is stale.
/// `key` is called only on the failure path, to report and re-read the row.
pub(crate) fn execute<M, S, Conn>(
    statement: S,
    conn: &mut Conn,
    key: impl FnOnce() -> M::Key,
    expected: M::Version,
    operation: Operation,
) -> Result<(), Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    match try_execute::<M, S, Conn>(statement, conn, key, expected, operation)? {
        None => Ok(()),
        Some(stale) => Err(stale.into()),
    }
}

/// Like [`execute`], with a stale write as `Ok(Some(report))` instead of an error.
pub(crate) fn try_execute<M, S, Conn>(
    statement: S,
    conn: &mut Conn,
    key: impl FnOnce() -> M::Key,
    expected: M::Version,
    operation: Operation,
) -> Result<Option<StaleObjectError>, Error>
where
    M: CurrentVersionQuery<Conn>,
    Conn: Connection,
    S: ExecuteDsl<Conn>,
{
    let rows = ExecuteDsl::execute(statement, conn).map_err(classify)?;
    if rows >= 1 {
        if rows > 1 {
            tracing::warn!(
                target: "lockkit",
                table = M::TABLE_NAME,
                rows,
                "a versioned write matched more than one row; is the primary key declared right?"
            );
        }
        return Ok(None);
    }
    let key = key();
    let current = match M::load_current_version(conn, key.clone()) {
        Ok(Some(version)) => CurrentState::Version(version.to_i64()),
        Ok(None) => CurrentState::Deleted,
        Err(diesel::result::Error::DeserializationError(err))
            if err.is::<diesel::result::UnexpectedNullError>() =>
        {
            CurrentState::NullVersion
        }
        Err(err) => return Err(classify(err)),
    };
    let stale = StaleObjectError {
        table: M::TABLE_NAME,
        key: format!("{key:?}"),
        version_column: <M::VersionColumn as Column>::NAME,
        operation,
        expected_version: expected.to_i64(),
        current,
    };
    crate::metrics::record_stale(&stale);
    Ok(Some(stale))
}
