//! Row-lock clauses: `FOR UPDATE`, `NOWAIT`, `SKIP LOCKED`, `FOR UPDATE OF`.
//!
//! Diesel already ships `.for_update()`, `.for_no_key_update()`, `.for_share()`,
//! `.for_key_share()`, `.skip_locked()` and `.no_wait()` on PostgreSQL and MySQL;
//! use them. [`LockQueryExt`] adds only what Diesel lacks:
//!
//! * `.nowait()`: the same clause as Diesel's `.no_wait()`, in SQL's own spelling,
//!   whose failure is [`Error::Busy`] through `?` on every
//!   server, MariaDB included (which reports it as a lock wait timeout);
//! * `.for_update_of(table)` (and `_no_key_update_of`, `_share_of`,
//!   `_key_share_of`): lock only the rows of one table of a join. PostgreSQL refuses
//!   `FOR UPDATE` on the nullable side of an outer join; `OF` names the side to lock.
//!   PostgreSQL and MySQL 8 (not MariaDB); on SQLite it does not compile.
//!
//! ```
//! # #[cfg(feature = "postgres")] {
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//! # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
//! # diesel::table! { orders (id) { id -> Integer, item_id -> Integer } }
//! # diesel::joinable!(orders -> items (item_id));
//! # diesel::allow_tables_to_appear_in_same_query!(items, orders);
//! let busy = items::table.find(1).for_update().nowait();
//! assert_eq!(
//!     diesel::debug_query::<diesel::pg::Pg, _>(&busy).to_string(),
//!     r#"SELECT "items"."id", "items"."stock" FROM "items" WHERE ("items"."id" = $1) FOR UPDATE NOWAIT -- binds: [1]"#
//! );
//! let of = orders::table.left_join(items::table).select(orders::id).for_update_of(orders::table).skip_locked();
//! assert!(diesel::debug_query::<diesel::pg::Pg, _>(&of).to_string().contains(r#"FOR UPDATE OF "orders" SKIP LOCKED"#));
//! # }
//! ```
//!
//! [`RowLock`] is the runtime-selected clause behind [`with_lock`](crate::with_lock),
//! [`lock_all`](crate::Lockable::lock_all) and [`queue::claim`](crate::queue::claim):
//! a lock strength and a wait mode, passed to Diesel's own `LockingDsl`.

use diesel::query_builder::QueryId;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::query_dsl::methods::{LockingDsl, ModifyLockDsl};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel::QueryResult;

use crate::error::{classification, Error};

/// How strong a row lock is (PostgreSQL's four lock strengths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockStrength {
    /// `FOR UPDATE`: exclusive; blocks other lockers and writers. The default.
    #[default]
    Update,
    /// `FOR NO KEY UPDATE` (PostgreSQL): exclusive, but lets foreign keys that point
    /// at the row be checked concurrently. `FOR UPDATE` on MySQL/MariaDB.
    NoKeyUpdate,
    /// `FOR SHARE` (PostgreSQL) / `LOCK IN SHARE MODE` (MySQL/MariaDB): readers
    /// share it, writers wait.
    Share,
    /// `FOR KEY SHARE` (PostgreSQL); `LOCK IN SHARE MODE` on MySQL/MariaDB.
    /// On PostgreSQL it waits only for `FOR UPDATE`: writers of the row's
    /// other columns go through, which is why
    /// [`with_lock`](crate::with_lock) refuses it.
    KeyShare,
}

/// What to do when the row is already locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WaitMode {
    /// Wait (up to the lock timeout). The default.
    #[default]
    Wait,
    /// `NOWAIT`: fail at once with [`Error::Busy`].
    NoWait,
    /// `SKIP LOCKED`: leave locked rows out of the result.
    SkipLocked,
}

/// What each wait mode means, decided here: how long a locking transaction may
/// wait, and how lockkit reads the errors of statements that lock with it.
impl WaitMode {
    /// Whether a held lock is waited for (up to the lock timeout).
    pub(crate) fn waits(self) -> bool {
        matches!(self, WaitMode::Wait)
    }

    /// How long SQLite may wait for the database's write lock: `timeout` when
    /// waiting, not at all under `NOWAIT` or `SKIP LOCKED`.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn busy_timeout_millis(self, timeout: Option<i32>) -> Option<i32> {
        if self.waits() {
            timeout
        } else {
            Some(0)
        }
    }

    /// The error of a locking statement: under `NOWAIT` or `SKIP LOCKED`, a lock
    /// wait timeout can only mean the lock was held ([`Error::Busy`]).
    pub(crate) fn classify(self, err: diesel::result::Error) -> Error {
        if self.waits() {
            classification::classify(err)
        } else {
            classification::classify_nowait(err)
        }
    }

    /// Whether a locked read of one key that found no row, on a backend that
    /// ends transactions as `ends` says, reads it once more, locked, before
    /// the row counts as absent. PostgreSQL (`UntilSavepointRollback`, also
    /// inside a `MultiConnection` enum): a read that waited for a transaction
    /// that deleted the row and inserted it again skips the deleted row under
    /// `READ COMMITTED`, and the new one is not in its snapshot; a statement of
    /// its own sees and locks it (as
    /// [`Lockable::lock_all`](crate::Lockable::lock_all) reads such keys
    /// again). InnoDB's locking reads and SQLite's `BEGIN IMMEDIATE` read the
    /// latest commit, and `NOWAIT` and `SKIP LOCKED` wait for no one.
    pub(crate) fn reads_again_when_empty(self, ends: crate::transaction::journal::Ends) -> bool {
        self.waits() && ends == crate::transaction::journal::Ends::UntilSavepointRollback
    }

    /// Whether a locked read of one key that found no row must ask whether the
    /// row exists: `SKIP LOCKED` leaves out a row held by someone, so there an
    /// empty read is "held" or "absent" ([`empty_read`](Self::empty_read)); in
    /// the other modes it is "absent" ([`Error::NotFound`]).
    pub(crate) fn hides_held_rows(self) -> bool {
        matches!(self, WaitMode::SkipLocked)
    }

    /// The error of a locked read of one key that found no row, under a mode
    /// that [hides held rows](Self::hides_held_rows), once asked whether the
    /// row `exists`: [`Error::Busy`] when it does, else [`Error::NotFound`].
    pub(crate) fn empty_read(exists: bool) -> Error {
        if exists {
            // No server error said so: counted here, as `classify` counts
            // the `NOWAIT` one.
            crate::metrics::record_lock_error(
                crate::metrics::LockErrorKind::Busy,
                "SKIP LOCKED passed over the held row",
            );
            Error::Busy
        } else {
            Error::NotFound
        }
    }

    /// The error of SQLite's attempt to take the write lock: when waiting, "database
    /// is locked" means the wait ran out ([`Error::LockTimeout`](crate::Error::LockTimeout)).
    #[cfg(feature = "sqlite")]
    pub(crate) fn classify_write_lock(self, err: diesel::result::Error) -> Error {
        if self.waits() {
            classification::classify_lock_wait(err)
        } else {
            classification::classify(err)
        }
    }
}

/// A row-lock clause chosen at run time: strength plus wait mode.
///
/// Handed to Diesel's `LockingDsl`, so Diesel places it in the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RowLock {
    /// The lock strength.
    pub strength: LockStrength,
    /// The wait mode.
    pub wait: WaitMode,
}

impl RowLock {
    /// `FOR UPDATE`.
    pub const fn update() -> Self {
        RowLock {
            strength: LockStrength::Update,
            wait: WaitMode::Wait,
        }
    }

    /// `FOR SHARE`.
    pub const fn share() -> Self {
        RowLock {
            strength: LockStrength::Share,
            wait: WaitMode::Wait,
        }
    }

    #[must_use]
    /// The same lock with `SKIP LOCKED`.
    pub const fn skip_locked(self) -> Self {
        RowLock {
            wait: WaitMode::SkipLocked,
            ..self
        }
    }

    #[must_use]
    /// The same lock with `NOWAIT`.
    pub const fn nowait(self) -> Self {
        RowLock {
            wait: WaitMode::NoWait,
            ..self
        }
    }
}

// The clause's text depends on run-time values, so it has no static query id:
// Diesel then keys its prepared-statement cache by the SQL text, which keeps each
// variant cached without mixing them up. The common clauses have types of their
// own ([`LockClause`]), cached by type.
impl QueryId for RowLock {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl WaitMode {
    fn sql(self) -> &'static str {
        match self {
            WaitMode::Wait => "",
            WaitMode::NoWait => " NOWAIT",
            WaitMode::SkipLocked => " SKIP LOCKED",
        }
    }
}

#[cfg(feature = "postgres")]
impl LockStrength {
    fn pg(self) -> &'static str {
        match self {
            LockStrength::Update => " FOR UPDATE",
            LockStrength::NoKeyUpdate => " FOR NO KEY UPDATE",
            LockStrength::Share => " FOR SHARE",
            LockStrength::KeyShare => " FOR KEY SHARE",
        }
    }
}

#[cfg(feature = "mysql")]
impl LockStrength {
    fn mysql(self) -> &'static str {
        match self {
            LockStrength::Update | LockStrength::NoKeyUpdate => " FOR UPDATE",
            // MariaDB has no `FOR SHARE`; both servers accept the older spelling.
            LockStrength::Share | LockStrength::KeyShare => " LOCK IN SHARE MODE",
        }
    }
}

impl RowLock {
    #[cfg(feature = "postgres")]
    fn walk_pg(self, mut out: AstPass<'_, '_, diesel::pg::Pg>) -> QueryResult<()> {
        out.push_sql(self.strength.pg());
        out.push_sql(self.wait.sql());
        Ok(())
    }

    #[cfg(feature = "mysql")]
    fn walk_mysql(self, mut out: AstPass<'_, '_, diesel::mysql::Mysql>) -> QueryResult<()> {
        if self.wait == WaitMode::NoWait {
            classification::nowait_sent();
        }
        out.push_sql(self.strength.mysql());
        out.push_sql(self.wait.sql());
        Ok(())
    }
}

#[cfg(feature = "postgres")]
impl QueryFragment<diesel::pg::Pg> for RowLock {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        self.walk_pg(out)
    }
}

#[cfg(feature = "mysql")]
impl QueryFragment<diesel::mysql::Mysql> for RowLock {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        self.walk_mysql(out)
    }
}

/// A common row-lock clause as a type of its own: the [`RowLock`] it stands for
/// is [`LOCK`](Self::LOCK), and its SQL is that one's.
///
/// A query locked with it has a static query id, so Diesel prepares it once per
/// connection and finds it again by type, without building its SQL; a query
/// locked with a [`RowLock`] value is found by its SQL text. lockkit picks the
/// type for [`with_lock`](crate::with_lock) (for these four clauses),
/// [`lock_all`](crate::Lockable::lock_all) ([`ForUpdate`]) and
/// [`queue::claim`](crate::queue::claim) ([`ForUpdateSkipLocked`]).
///
/// Sealed: the four types below are all there are; name it only in `where`
/// clauses.
pub trait LockClause: QueryId + Copy + Default + crate::sealed::Sealed + 'static {
    /// The clause, as a value.
    const LOCK: RowLock;
}

macro_rules! lock_clauses {
    ($($(#[$doc:meta])* $name:ident = $lock:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, QueryId)]
        pub struct $name;

        impl crate::sealed::Sealed for $name {}

        impl LockClause for $name {
            const LOCK: RowLock = $lock;
        }

        #[cfg(feature = "postgres")]
        impl QueryFragment<diesel::pg::Pg> for $name {
            fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
                Self::LOCK.walk_pg(out)
            }
        }

        #[cfg(feature = "mysql")]
        impl QueryFragment<diesel::mysql::Mysql> for $name {
            fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
                Self::LOCK.walk_mysql(out)
            }
        }
    )*};
}

lock_clauses! {
    /// `FOR UPDATE`.
    ForUpdate = RowLock::update();
    /// `FOR UPDATE NOWAIT`.
    ForUpdateNowait = RowLock::update().nowait();
    /// `FOR UPDATE SKIP LOCKED`.
    ForUpdateSkipLocked = RowLock::update().skip_locked();
    /// `FOR SHARE` (PostgreSQL) / `LOCK IN SHARE MODE` (MySQL/MariaDB).
    ForShare = RowLock::share();
}

/// A call that runs a query under the lock clause `L` (a [`LockClause`] type or a
/// [`RowLock`] value) on `Conn`: lockkit's locked reads, generic over the clause.
/// Name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit cannot run this locked read under `{L}` on this connection",
    label = "not a locked read lockkit can run on this connection",
    note = "the model must be `#[derive(Queryable, Selectable)]` for the connection's backend, and its table one that Diesel's row-lock clauses apply to"
)]
pub trait LockedCall<L, Conn> {
    /// What the call returns.
    type Output;
    /// Runs the call with `clause`.
    fn call(self, conn: &mut Conn, clause: L) -> Self::Output;
}

/// A call that takes every clause `with_lock` may pick for a [`RowLock`]. Blanket-
/// implemented; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`with_lock` cannot run this locked read on this connection under every clause it may pick",
    label = "not a locked read under `FOR UPDATE`, `NOWAIT`, `SKIP LOCKED` and `FOR SHARE` alike",
    note = "`with_lock` picks the clause from its `LockOptions` at run time: the model must be `#[derive(Queryable, Selectable)]` for the connection's backend"
)]
pub trait EveryClause<Conn, T>:
    LockedCall<ForUpdate, Conn, Output = T>
    + LockedCall<ForUpdateNowait, Conn, Output = T>
    + LockedCall<ForUpdateSkipLocked, Conn, Output = T>
    + LockedCall<ForShare, Conn, Output = T>
    + LockedCall<RowLock, Conn, Output = T>
{
}

impl<X, Conn, T> EveryClause<Conn, T> for X where
    X: LockedCall<ForUpdate, Conn, Output = T>
        + LockedCall<ForUpdateNowait, Conn, Output = T>
        + LockedCall<ForUpdateSkipLocked, Conn, Output = T>
        + LockedCall<ForShare, Conn, Output = T>
        + LockedCall<RowLock, Conn, Output = T>
{
}

impl RowLock {
    /// Runs `call` with this clause: as its [`LockClause`] type when it is one of
    /// the common clauses (cached by type), else as this value (cached by SQL).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
        allow(dead_code) // called by each backend's locked read
    )]
    pub(crate) fn with_clause<C, Conn, T>(self, conn: &mut Conn, call: C) -> T
    where
        C: EveryClause<Conn, T>,
    {
        if self == ForUpdate::LOCK {
            LockedCall::<ForUpdate, _>::call(call, conn, ForUpdate)
        } else if self == ForUpdateNowait::LOCK {
            LockedCall::<ForUpdateNowait, _>::call(call, conn, ForUpdateNowait)
        } else if self == ForUpdateSkipLocked::LOCK {
            LockedCall::<ForUpdateSkipLocked, _>::call(call, conn, ForUpdateSkipLocked)
        } else if self == ForShare::LOCK {
            LockedCall::<ForShare, _>::call(call, conn, ForShare)
        } else {
            LockedCall::<RowLock, _>::call(call, conn, self)
        }
    }
}

/// The `NOWAIT` modifier of [`LockQueryExt::nowait`].
///
/// Diesel's own marker type for `.no_wait()` is private, so it cannot be named in a
/// generic bound; this one-word marker goes through Diesel's public `ModifyLockDsl`
/// to the very place `.no_wait()` uses, and renders the same SQL (a test compares
/// both with `debug_query`). Unlike Diesel's, it makes a failed `NOWAIT` on
/// MariaDB classify as [`Error::Busy`] through `?` too (see
/// [`classify`](crate::error::classification#limits)): prefer it.
#[derive(Debug, Clone, Copy, Default, QueryId)]
pub struct NoWait;

#[cfg(feature = "postgres")]
impl QueryFragment<diesel::pg::Pg> for NoWait {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        out.push_sql(" NOWAIT");
        Ok(())
    }
}

#[cfg(feature = "mysql")]
impl QueryFragment<diesel::mysql::Mysql> for NoWait {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        // MariaDB reports a failed NOWAIT as a lock wait timeout: see `classify`.
        classification::nowait_sent();
        out.push_sql(" NOWAIT");
        Ok(())
    }
}

/// `FOR <strength> OF <table>`; build it with [`LockQueryExt`].
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub struct LockOf<T> {
    strength: LockStrength,
    table: T,
}

impl<T> QueryId for LockOf<T> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

#[cfg(feature = "postgres")]
impl<T: QueryFragment<diesel::pg::Pg>> QueryFragment<diesel::pg::Pg> for LockOf<T> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::pg::Pg>) -> QueryResult<()> {
        out.push_sql(self.strength.pg());
        out.push_sql(" OF ");
        self.table.walk_ast(out.reborrow())
    }
}

#[cfg(feature = "mysql")]
impl<T: QueryFragment<diesel::mysql::Mysql>> QueryFragment<diesel::mysql::Mysql> for LockOf<T> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, diesel::mysql::Mysql>) -> QueryResult<()> {
        // MySQL 8 spells the shared lock `FOR SHARE OF t`.
        out.push_sql(match self.strength {
            LockStrength::Update | LockStrength::NoKeyUpdate => " FOR UPDATE OF ",
            LockStrength::Share | LockStrength::KeyShare => " FOR SHARE OF ",
        });
        self.table.walk_ast(out.reborrow())
    }
}

/// Lock clauses Diesel lacks, on every query that has Diesel's locking methods.
pub trait LockQueryExt: Sized {
    /// `NOWAIT`: the same clause as Diesel's `.no_wait()`, in SQL's spelling.
    fn nowait(self) -> <Self as ModifyLockDsl<NoWait>>::Output
    where
        Self: ModifyLockDsl<NoWait>,
    {
        self.modify_lock(NoWait)
    }

    /// `FOR UPDATE OF <table>`.
    fn for_update_of<T>(self, table: T) -> <Self as LockingDsl<LockOf<T>>>::Output
    where
        Self: LockingDsl<LockOf<T>>,
    {
        lock_of(self, LockStrength::Update, table)
    }

    /// `FOR NO KEY UPDATE OF <table>` (PostgreSQL).
    fn for_no_key_update_of<T>(self, table: T) -> <Self as LockingDsl<LockOf<T>>>::Output
    where
        Self: LockingDsl<LockOf<T>>,
    {
        lock_of(self, LockStrength::NoKeyUpdate, table)
    }

    /// `FOR SHARE OF <table>`.
    fn for_share_of<T>(self, table: T) -> <Self as LockingDsl<LockOf<T>>>::Output
    where
        Self: LockingDsl<LockOf<T>>,
    {
        lock_of(self, LockStrength::Share, table)
    }

    /// `FOR KEY SHARE OF <table>` (PostgreSQL).
    fn for_key_share_of<T>(self, table: T) -> <Self as LockingDsl<LockOf<T>>>::Output
    where
        Self: LockingDsl<LockOf<T>>,
    {
        lock_of(self, LockStrength::KeyShare, table)
    }
}

impl<Q> LockQueryExt for Q {}

/// `<strength> OF <table>` on `query`: the `*_of` methods of [`LockQueryExt`].
fn lock_of<Q, T>(query: Q, strength: LockStrength, table: T) -> Q::Output
where
    Q: LockingDsl<LockOf<T>>,
{
    query.with_lock(LockOf { strength, table })
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;
    use diesel::pg::Pg;

    /// Renders the clause it is handed, and says whether Diesel caches it by type.
    struct Render;

    impl<L: QueryFragment<Pg> + QueryId> LockedCall<L, ()> for Render {
        type Output = (String, bool);

        fn call(self, _: &mut (), clause: L) -> (String, bool) {
            let sql = diesel::debug_query::<Pg, _>(&clause).to_string();
            (sql, L::HAS_STATIC_QUERY_ID)
        }
    }

    #[test]
    fn the_common_clauses_are_types_with_the_sql_of_their_value() {
        use LockStrength::{KeyShare, NoKeyUpdate, Share, Update};
        use WaitMode::{NoWait, SkipLocked, Wait};
        for strength in [Update, NoKeyUpdate, Share, KeyShare] {
            for wait in [Wait, NoWait, SkipLocked] {
                let lock = RowLock { strength, wait };
                let (sql, by_type) = lock.with_clause(&mut (), Render);
                assert_eq!(sql, diesel::debug_query::<Pg, _>(&lock).to_string());
                let common = matches!((strength, wait), (Update, _) | (Share, Wait));
                assert_eq!(by_type, common, "{lock:?}: {sql}");
            }
        }
    }
}
