//! Compare-and-set on chosen columns: optimistic locking without a version column.
//!
//! Write only if the columns you read still hold what you read:
//!
//! ```sql
//! UPDATE orders SET state = $1 WHERE orders.id = $2 AND orders.state = $3
//! ```
//!
//! One matched row is success. Zero rows means a column moved (or the row is
//! gone): the call returns [`Error::StaleColumns`] naming every expected column
//! with the value expected and the value found, read by one `SELECT` on the
//! failure path only (`LOCK IN SHARE MODE` on MySQL/MariaDB, so that it sees the
//! latest commit).
//!
//! # Compare-and-set or a version column
//!
//! | | compare-and-set on columns | version column ([`Versioned`](crate::Versioned)) |
//! | --- | --- | --- |
//! | schema | none | one integer column |
//! | detects | a change of the *compared* columns | any write through lockkit (the version moves on every one) |
//! | ABA | **blind**: `pending → paid → pending` between read and write looks unchanged, and the write lands | sees it: the version went from 3 to 5 |
//! | other columns | a change of a column not compared is overwritten or ignored | detected |
//! | text on MySQL/MariaDB | compared under the column's collation: with the default case-insensitive one, `'Jo Smith'` = `'jo smith'` and `'paid '` = `'paid'` (use `VARBINARY` or a `_bin` collation); likewise SQLite's `COLLATE NOCASE`/`RTRIM` columns and PostgreSQL's `citext`, `char(n)` and non-deterministic collations | detected |
//! | a SQLite timestamp stored as other text than Diesel writes (`'2024-01-01 12:00'`, a `Z` suffix) | never equal to the value read back, which Diesel binds as `'2024-01-01 12:00:00'`: every call is [`Error::StaleColumns`] (write such columns through Diesel) | detected |
//!
//! Compare-and-set is right for a state machine whose transitions never come back
//! to a state (`pending → paid → shipped`), or where coming back is harmless. When a
//! value can return to what it was, or the write depends on more than the compared
//! columns, use the version column.
//!
//! A `NULL` cannot be expected (`col = NULL` matches nothing): compare a
//! non-null column, or use the version column.
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::compare_and_set::expect;
//! use lockkit::prelude::*;
//!
//! diesel::table! { orders (id) { id -> Integer, state -> Text, total -> Integer } }
//!
//! #[derive(Queryable, Selectable, Lockable)]
//! #[diesel(table_name = orders)]
//! pub struct Order { pub id: i32, pub state: String, pub total: i32 }
//!
//! # fn main() -> Result<(), lockkit::Error> {
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT NOT NULL, total INTEGER NOT NULL)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO orders VALUES (5, 'pending', 100)").execute(&mut conn)?;
//! let pay = |conn: &mut SqliteConnection| {
//!     Order::compare_and_set(conn, 5, expect(orders::state, "pending".to_owned()), orders::state.eq("paid"))
//! };
//! pay(&mut conn)?;
//!
//! // Paying twice is refused, and the error says why.
//! let err = pay(&mut conn).unwrap_err();
//! let lockkit::Error::StaleColumns(stale) = &err else { panic!("{err}") };
//! assert_eq!(stale.columns[0].column, "state");
//! assert_eq!(stale.columns[0].expected, "\"pending\"");
//! assert_eq!(stale.columns[0].current.as_deref(), Some("\"paid\""));
//! assert_eq!(
//!     err.to_string(),
//!     "stale compare-and-set of orders 5: expected state = \"pending\", found \"paid\""
//! );
//! # Ok(()) }
//! ```
//!
//! Several columns are a tuple: `(expect(orders::state, s), expect(orders::total, t))`.

use std::fmt::Debug;

use diesel::backend::Backend;
use diesel::dsl;
use diesel::expression::{AppearsOnTable, AsExpression, Expression, SelectableExpression};
use diesel::query_builder::{AsChangeset, AsQuery, IntoUpdateTarget};
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::query_dsl::methods::{ExecuteDsl, FilterDsl, FindDsl};
use diesel::sql_types::{Bool, SqlType};
use diesel::{Column, Connection, ExpressionMethods, QueryResult};

use crate::error::classification::classify;
use crate::error::{ColumnValue, Error, StaleColumnsError};
use crate::pessimistic::connection::AsLockingConnection;
use crate::pessimistic::lockable::Lockable;
// What only the per-connection impls of `CurrentValues` name: there are none
// without a backend feature.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use {
    crate::optimistic::backend::{InShareMode, OptimisticBackend},
    diesel::dsl::Select,
    diesel::query_dsl::{methods::LockingDsl, methods::SelectDsl, LoadQuery},
    diesel::{OptionalExtension, RunQueryDsl},
};

/// One column and the value it must still hold: build it with [`expect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect<C, T> {
    column: C,
    value: T,
}

/// `column` must still hold `value` (bound as a parameter). `value` is the owned
/// type the column loads as (`String` for `Text`), so that the value found can be
/// reported next to it.
pub fn expect<C: Column, T>(column: C, value: T) -> Expect<C, T> {
    Expect { column, value }
}

/// The columns a compare-and-set expects: one [`Expect`], or a tuple of up to six.
///
/// Implemented by lockkit; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a list of expected column values",
    label = "expected `expect(column, value)` or a tuple of them",
    note = "each value is the owned Rust type its column loads as, e.g. `expect(orders::state, \"pending\".to_owned())`"
)]
pub trait Expectations {
    /// `col1 = $1 AND col2 = $2 ..`.
    type Filter: Expression<SqlType = Bool>;
    /// The expected columns, as nested pairs for the follow-up `SELECT`.
    type Columns: Expression;
    /// The values found, as the follow-up `SELECT` loads them.
    type Values;

    /// The `WHERE` condition.
    fn filter(&self) -> Self::Filter;
    /// The columns to read after a refused write.
    fn columns(&self) -> Self::Columns;
    /// Expected and found values, column by column (`current = None`: the row is gone).
    fn report(&self, current: Option<&Self::Values>, out: &mut Vec<ColumnValue>);
}

impl<C, T> Expectations for Expect<C, T>
where
    C: Column + ExpressionMethods + Copy,
    C::SqlType: SqlType,
    T: AsExpression<C::SqlType> + Clone + Debug,
    dsl::Eq<C, T>: Expression<SqlType = Bool>,
{
    type Filter = dsl::Eq<C, T>;
    type Columns = C;
    type Values = T;

    fn filter(&self) -> Self::Filter {
        self.column.eq(self.value.clone())
    }

    fn columns(&self) -> C {
        self.column
    }

    fn report(&self, current: Option<&T>, out: &mut Vec<ColumnValue>) {
        out.push(ColumnValue {
            column: C::NAME,
            expected: format!("{:?}", self.value),
            current: current.map(|value| format!("{value:?}")),
        });
    }
}

impl<E: Expectations> Expectations for (E,) {
    type Filter = E::Filter;
    type Columns = E::Columns;
    type Values = E::Values;

    fn filter(&self) -> Self::Filter {
        self.0.filter()
    }

    fn columns(&self) -> Self::Columns {
        self.0.columns()
    }

    fn report(&self, current: Option<&Self::Values>, out: &mut Vec<ColumnValue>) {
        self.0.report(current, out);
    }
}

/// `a AND b`: the condition of two expectations (Diesel's own `AND` type is
/// private, so it cannot be named in [`Expectations::Filter`]).
#[derive(Debug, Clone, Copy, diesel::query_builder::QueryId, diesel::expression::ValidGrouping)]
pub struct Both<A, B>(A, B);

impl<A, B> Expression for Both<A, B>
where
    A: Expression<SqlType = Bool>,
    B: Expression<SqlType = Bool>,
{
    type SqlType = Bool;
}

impl<A, B, QS> AppearsOnTable<QS> for Both<A, B>
where
    A: AppearsOnTable<QS>,
    B: AppearsOnTable<QS>,
    Self: Expression,
{
}

impl<A, B, QS> SelectableExpression<QS> for Both<A, B>
where
    A: SelectableExpression<QS>,
    B: SelectableExpression<QS>,
    Self: AppearsOnTable<QS>,
{
}

impl<A, B, DB> QueryFragment<DB> for Both<A, B>
where
    DB: Backend,
    A: QueryFragment<DB>,
    B: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        self.0.walk_ast(out.reborrow())?;
        out.push_sql(" AND ");
        self.1.walk_ast(out.reborrow())
    }
}

/// `(A, B, C)` is `A` and then `(B, C)`: `a AND (b AND c)`, read as `(a, (b, c))`.
macro_rules! expectations_tuple {
    ($head:ident $($tail:ident)+) => {
        impl<$head, $($tail),+> Expectations for ($head, $($tail),+)
        where
            $head: Expectations,
            $($tail: Clone,)+
            ($($tail,)+): Expectations,
        {
            type Filter = Both<$head::Filter, <($($tail,)+) as Expectations>::Filter>;
            type Columns = ($head::Columns, <($($tail,)+) as Expectations>::Columns);
            type Values = ($head::Values, <($($tail,)+) as Expectations>::Values);

            fn filter(&self) -> Self::Filter {
                #[allow(non_snake_case)]
                let ($head, $($tail),+) = self;
                Both($head.filter(), ($($tail.clone(),)+).filter())
            }

            fn columns(&self) -> Self::Columns {
                #[allow(non_snake_case)]
                let ($head, $($tail),+) = self;
                ($head.columns(), ($($tail.clone(),)+).columns())
            }

            fn report(&self, current: Option<&Self::Values>, out: &mut Vec<ColumnValue>) {
                #[allow(non_snake_case)]
                let ($head, $($tail),+) = self;
                $head.report(current.map(|c| &c.0), out);
                ($($tail.clone(),)+).report(current.map(|c| &c.1), out);
            }
        }
    };
}

expectations_tuple!(A B);
expectations_tuple!(A B C);
expectations_tuple!(A B C D);
expectations_tuple!(A B C D E);
expectations_tuple!(A B C D E F);

/// The read after a refused compare-and-set: the expected columns of `M`'s row
/// `key`, as they are now, on `Conn`. Under `LOCK IN SHARE MODE` on
/// MySQL/MariaDB, so that it sees the latest commit.
///
/// Implemented by lockkit for the [`Expectations`] on `M`'s table whose
/// columns load into their values, on `PgConnection`, `MysqlConnection` and
/// `SqliteConnection` and r2d2 pooled connections to them (feature `r2d2`);
/// on a [`Dispatch`](crate::multi::Dispatch) enum (and an r2d2 pooled
/// connection to one), for those that do so on each of its backends, the read
/// going to the connection inside. Name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "compare-and-set cannot load `{Self}` back from `{M}`'s row on `{Conn}`",
    label = "the values found could not be loaded into these expectations",
    note = "each expected value is the owned Rust type its column loads as, e.g. `expect(orders::state, \"pending\".to_owned())`, not a `&str`",
    note = "the columns are the model's own table's, and the connection a `PgConnection`, `MysqlConnection` or `SqliteConnection`, an r2d2 pooled connection to one (feature `r2d2`), or a `MultiConnection` enum that implements `lockkit::multi::Dispatch` (there the columns load on each backend lockkit is built with)"
)]
pub trait CurrentValues<M: Lockable, Conn>: Expectations {
    /// The expected columns of the row `key` (`None`: it is gone).
    #[doc(hidden)]
    fn load_current(&self, conn: &mut Conn, key: M::Key) -> QueryResult<Option<Self::Values>>;
}

/// Implements [`CurrentValues`] on each connection lockkit supports (a
/// [`Dispatch`](crate::multi::Dispatch) enum hands it on to the connection it
/// holds: `multi.rs`).
macro_rules! current_values_on {
    ($($conn:ty: $cfg:meta),* $(,)?) => {$(
        #[cfg($cfg)]
        impl<M, E> CurrentValues<M, $conn> for E
        where
            M: Lockable,
            E: Expectations,
            M::Table: FindDsl<M::Key>,
            dsl::Find<M::Table, M::Key>: SelectDsl<E::Columns>,
            CurrentRead<M, E>: LockingDsl<InShareMode>,
            <BackendOf<$conn> as OptimisticBackend>::Latest<CurrentRead<M, E>>:
                for<'q> LoadQuery<'q, $conn, E::Values>,
        {
            fn load_current(&self, conn: &mut $conn, key: M::Key) -> QueryResult<Option<E::Values>> {
                let read = M::Table::default().find(key).select(self.columns());
                <BackendOf<$conn> as OptimisticBackend>::latest(read)
                    .get_result::<E::Values>(conn)
                    .optional()
            }
        }
    )*};
}

/// The read of the expected columns of `M`'s row.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
type CurrentRead<M, E> =
    Select<dsl::Find<<M as Lockable>::Table, <M as Lockable>::Key>, <E as Expectations>::Columns>;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
type BackendOf<C> = <C as Connection>::Backend;

crate::sealed::every_connection!(current_values_on);

/// Compare-and-set writes for every [`Lockable`] model (`#[derive(Lockable)]` or
/// `#[derive(Versioned)]`); see the [module docs](self).
pub trait CompareAndSet: Lockable {
    /// `UPDATE <table> SET <changes> WHERE <key> AND <expected columns hold the
    /// expected values>`, in one statement, without reading first.
    /// Returns the number of rows written: 1, unless the database does not enforce
    /// the declared key (unlike versioned writes, this call does not check it).
    ///
    /// Runs on `PgConnection`, `MysqlConnection` and `SqliteConnection`,
    /// `MultiConnection` enums that implement
    /// [`Dispatch`](crate::multi::Dispatch), and r2d2 pooled connections to
    /// either (feature `r2d2`): through an enum the write
    /// runs through the enum, and the read after a refused write goes to the
    /// connection inside, with its backend's locking read.
    ///
    /// On a versioned table this does not bump the version: an editor who read the
    /// row before does not see this write (use
    /// [`Versioned::update_if`](crate::Versioned::update_if) for a conditional write
    /// that moves the version).
    ///
    /// # Errors
    ///
    /// * [`Error::StaleColumns`] when no row matched: every expected column with
    ///   its expected value and the value found (`None` for all when the row is
    ///   gone). Nothing was written.
    /// * a classified database error ([`Error::Busy`], [`Error::LockTimeout`],
    ///   [`Error::Deadlock`], [`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    /// * [`Error::TransactionAborted`] when the write or the read that reports
    ///   a mismatch (or one of the caller's statements before them, whose
    ///   error the caller let go) was a deadlock's victim inside a transaction
    ///   on MySQL/MariaDB (or a lock wait timeout's, on a server started with
    ///   `--innodb-rollback-on-timeout`), or a statement of the caller's
    ///   rolled back the whole transaction on SQLite (a trigger's
    ///   `RAISE(ROLLBACK)`): nothing is written in autocommit, as for
    ///   [`atomic::update_if`](crate::atomic::update_if).
    fn compare_and_set<Conn, E, C>(
        conn: &mut Conn,
        key: Self::Key,
        expected: E,
        changes: C,
    ) -> Result<usize, Error>
    where
        Conn: Connection + AsLockingConnection,
        E: CurrentValues<Self, Conn>,
        Self::Table: FindDsl<Self::Key>,
        dsl::Find<Self::Table, Self::Key>: FilterDsl<E::Filter>,
        dsl::Filter<dsl::Find<Self::Table, Self::Key>, E::Filter>:
            IntoUpdateTarget<Table = Self::Table>,
        C: AsChangeset<Target = Self::Table>,
        dsl::Update<dsl::Filter<dsl::Find<Self::Table, Self::Key>, E::Filter>, C>:
            AsQuery + ExecuteDsl<Conn>,
    {
        let ends = crate::optimistic::atomic::ends_of(conn);
        let target = Self::Table::default()
            .find(key.clone())
            .filter(expected.filter());
        let write = diesel::update(target).set(changes);
        match crate::optimistic::atomic::update_if_on(conn, write, ends) {
            Err(Error::NoRowMatched) => {}
            written => return written,
        }
        // Under `LOCK IN SHARE MODE` (MySQL/MariaDB) the read waits for a
        // row lock, and a deadlock or a lock wait timeout there may end the
        // caller's transaction: decided as for the write.
        let current = expected
            .load_current(conn, key.clone())
            .map_err(|err| crate::transaction::failed_write(conn, classify(err), ends))?;
        let mut columns = Vec::new();
        expected.report(current.as_ref(), &mut columns);
        Err(Error::StaleColumns(StaleColumnsError {
            table: Self::TABLE_NAME,
            key: format!("{key:?}"),
            deleted: current.is_none(),
            columns,
        }))
    }
}

impl<M: Lockable> CompareAndSet for M {}
