//! Advisory locks: one job, cron run or migration at a time across many app
//! instances, without a row to lock.
//!
//! | | PostgreSQL | MySQL / MariaDB |
//! | --- | --- | --- |
//! | [`lock`] / [`try_lock`] outside a transaction: session lock, released when the guard drops | `pg_advisory_lock($1)` / `pg_try_advisory_lock($1)`, then `pg_advisory_unlock($1)` | `GET_LOCK(?, ?)` / `GET_LOCK(?, 0)`, then `RELEASE_LOCK(?)` |
//! | [`lock`] / [`try_lock`] inside a transaction | transaction lock: `pg_advisory_xact_lock($1)` / `pg_try_advisory_xact_lock($1)`, released when the transaction ends (not taken at `REPEATABLE READ`, below) | refused: [`Error::AlreadyInTransaction`], nothing is sent; take the lock before the transaction |
//! | [`xact_lock`] / [`try_xact_lock`] (released at commit) | `pg_advisory_xact_lock($1)`, `pg_try_advisory_xact_lock($1)` (not taken at `REPEATABLE READ`, below) | — |
//!
//! Why the transaction lock inside a transaction: PostgreSQL refuses every
//! statement in a transaction that a failed statement aborted, the unlock
//! included, so a session lock taken there would outlive the guard (and the
//! transaction) until the connection closes. A transaction lock cannot: it ends
//! with the transaction, commit or rollback. It ends *then*, not when the guard
//! drops ([`AdvisoryLock::scope`]); or earlier, if it was taken in a savepoint
//! (a nested Diesel `transaction`, or a nested lockkit call) that rolls back:
//! PostgreSQL lets it go with the rest of the savepoint's work. Once a nested
//! level that took it failed, take it again before going on under it.
//!
//! On PostgreSQL each lock statement ends in `WHERE NOT pg_is_in_recovery()`:
//! a hot standby grants advisory locks of its own, which would exclude no one
//! who takes the same key on the primary. There the call is [`Error::ReadOnly`],
//! as a row lock is; take the lock on the primary.
//!
//! Why MySQL/MariaDB refuse inside a transaction: `GET_LOCK` is the session's,
//! released when the guard drops, and a guard taken inside a transaction drops
//! before its `COMMIT`. The next holder would then read the rows written under
//! the lock as they were before (InnoDB shows no uncommitted writes), and a
//! read-modify-write made "one at a time" under the lock would lose updates.
//! Take the lock first and open the transaction on the guard: the lock then
//! covers the `COMMIT`.
//!
//! On PostgreSQL the same holds of a transaction at `REPEATABLE READ` or
//! `SERIALIZABLE`: its snapshot is taken by its first statement (the lock's,
//! at the latest), before the wait, so the next holder reads the rows as they
//! were before the last holder committed. At `REPEATABLE READ` nothing reports
//! it, and a transaction lock asked for there is refused, nothing locked
//! ([`Error::Database`], not retryable); at `SERIALIZABLE`
//! ([`serializable`](crate::serializable())) the server keeps the outcome
//! serializable, though not necessarily in the lock's order, and reports a
//! conflict that would break it as a serialization failure, which a retry
//! takes up. Take the lock in a
//! transaction at `READ COMMITTED`, where each statement reads the latest
//! commit, or a session lock before `BEGIN`. lockkit's other transactions
//! begin at the database's default isolation: `READ COMMITTED`, unless
//! `default_transaction_isolation` (the server's, a database's or a role's)
//! says otherwise.
//!
//! ```no_run
//! # #[cfg(feature = "mysql")] {
//! use diesel::prelude::*;
//! use lockkit::{advisory, locked_transaction, LockOptions};
//! let mut conn = MysqlConnection::establish("mysql://localhost/app").unwrap();
//! let mut guard = advisory::lock(&mut conn, "counter").unwrap();
//! locked_transaction(&mut *guard, LockOptions::default(), |_conn| {
//!     // read-modify-write: committed before the lock is released
//!     Ok::<_, lockkit::Error>(())
//! })
//! .unwrap();
//! drop(guard); // RELEASE_LOCK, after COMMIT
//! # }
//! ```
//!
//! SQLite has no advisory locks; these functions do not compile for it. They
//! take `PgConnection`, `MysqlConnection`, r2d2 pooled connections to them
//! (feature `r2d2`) and [`Dispatch`](crate::multi::Dispatch) enums
//! ([`AdvisoryConnection`]); an enum takes the lock on the connection inside,
//! and one holding a SQLite connection refuses with [`Error::Unsupported`],
//! sending nothing.
//!
//! On diesel-async (feature `async`): `lockkit::asynchronous::advisory`, with
//! these statements, holding the lock for the length of a closure instead of a
//! guard's life.
//!
//! # Keys
//!
//! An [`AdvisoryKey`] is an `i64`, or a string hashed to one with 64-bit FNV-1a
//! over its UTF-8 bytes (the same value on every machine, release and run; written
//! out in [`AdvisoryKey::from_name`]). PostgreSQL takes the number; MySQL/MariaDB
//! lock names are strings of at most 64 characters, so the key is sent as
//! `lockkit:` followed by its 16 hexadecimal digits. Keys always travel as bound
//! parameters. FNV-1a is no cryptographic hash: two names may share a key
//! (by chance, or made to by whoever chooses the names), and then share one
//! lock, as a name's key and the same number given as an `i64` do. That
//! serializes what need not be (a `try_lock` says "held" for the other name),
//! never lets two holders in; hash names users choose yourself, with a keyed
//! hash, if that matters. A PostgreSQL advisory lock belongs to its database; a MySQL/MariaDB
//! name to the whole server, so databases that share a server share its names:
//! put the database's name in the key there.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")] {
//! use diesel::prelude::*;
//! use lockkit::advisory::{self, AdvisoryKey};
//! let mut conn = PgConnection::establish("postgres://localhost/app").unwrap();
//! let lock = advisory::try_lock(&mut conn, AdvisoryKey::from_name("nightly-report")).unwrap();
//! if let Some(mut guard) = lock {
//!     // only one instance gets here; `guard` derefs to the connection
//!     diesel::sql_query("SELECT 1").execute(&mut *guard).unwrap();
//! } // unlocked here
//! # }
//! ```

use std::ops::{Deref, DerefMut};

use diesel::connection::{LoadConnection, TransactionManager};
use diesel::Connection;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::error::classification::classify;
use crate::error::Error;

/// An advisory lock's key; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdvisoryKey(pub i64);

impl AdvisoryKey {
    /// The key of a name: 64-bit FNV-1a of its UTF-8 bytes (offset basis
    /// `0xcbf29ce484222325`, prime `0x100000001b3`), as a two's-complement `i64`.
    ///
    /// ```
    /// use lockkit::advisory::AdvisoryKey;
    /// assert_eq!(AdvisoryKey::from_name("").0 as u64, 0xcbf29ce484222325);
    /// assert_eq!(AdvisoryKey::from_name("a").0 as u64, 0xaf63dc4c8601ec8c);
    /// ```
    pub const fn from_name(name: &str) -> Self {
        let bytes = name.as_bytes();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut i = 0;
        while i < bytes.len() {
            hash ^= bytes[i] as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        AdvisoryKey(hash as i64)
    }

    /// The MySQL/MariaDB lock name: `lockkit:` and 16 hex digits.
    pub fn mysql_name(self) -> String {
        format!("lockkit:{:016x}", self.0 as u64)
    }
}

impl From<i64> for AdvisoryKey {
    fn from(key: i64) -> Self {
        AdvisoryKey(key)
    }
}

impl From<&str> for AdvisoryKey {
    fn from(name: &str) -> Self {
        AdvisoryKey::from_name(name)
    }
}

/// How long an advisory lock lasts; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// Until the guard drops (or [`AdvisoryLock::unlock`]), or the session ends.
    Session,
    /// Until the transaction it was taken in ends (PostgreSQL); it cannot be
    /// released earlier, but for a rollback of the savepoint it was taken in,
    /// which releases it with that savepoint's work.
    Transaction,
}

/// A backend with advisory locks: PostgreSQL and MySQL/MariaDB.
///
/// Sealed: implemented by lockkit for each of them; name it only in `where`
/// clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "advisory locks need PostgreSQL or MySQL/MariaDB; `{Self}` has none",
    label = "no advisory locks on this connection's backend",
    note = "on SQLite, whose writers take turns on the database's write lock, run the work in `lockkit::locked_transaction` (`BEGIN IMMEDIATE`) instead"
)]
pub trait AdvisoryBackend: diesel::backend::Backend + crate::sealed::Sealed {
    /// Whether this backend has locks that end with the transaction (PostgreSQL).
    const TRANSACTION_LOCKS: bool;
    /// Waits for the lock; `false` if the server gave up waiting.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn acquire<C>(conn: &mut C, key: AdvisoryKey, scope: Scope) -> diesel::QueryResult<bool>
    where
        C: Connection<Backend = Self> + LoadConnection,
    {
        Self::run(conn, Self::acquire_statement(key, scope, true))
    }
    /// Takes the lock if it is free; `false` if another session holds it.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    fn try_acquire<C>(conn: &mut C, key: AdvisoryKey, scope: Scope) -> diesel::QueryResult<bool>
    where
        C: Connection<Backend = Self> + LoadConnection,
    {
        Self::run(conn, Self::acquire_statement(key, scope, false))
    }
    /// Releases a session lock; `false` if this session did not hold it.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    fn release<C>(conn: &mut C, key: AdvisoryKey) -> diesel::QueryResult<bool>
    where
        C: Connection<Backend = Self> + LoadConnection,
    {
        Self::run(conn, Self::release_statement(key))
    }
    /// Sends one of this backend's lock statements; its `locked` column.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    #[doc(hidden)]
    fn run<C>(conn: &mut C, statement: Statement<Self>) -> diesel::QueryResult<bool>
    where
        C: Connection<Backend = Self> + LoadConnection;
    /// The statement that takes the lock (waiting, or `try`), one boolean
    /// column `locked`; shared by the blocking and the async calls.
    #[doc(hidden)]
    fn acquire_statement(key: AdvisoryKey, scope: Scope, wait: bool) -> Statement<Self>;
    /// The statement that releases a session lock, one boolean column `locked`.
    #[doc(hidden)]
    fn release_statement(key: AdvisoryKey) -> Statement<Self>;
}

/// An advisory lock statement with its key bound.
#[doc(hidden)]
pub type Statement<DB> =
    diesel::query_builder::BoxedSqlQuery<'static, DB, diesel::query_builder::SqlQuery>;

/// A connection that takes advisory locks: `PgConnection` and
/// `MysqlConnection`, r2d2 pooled connections to them (feature `r2d2`), and
/// [`Dispatch`](crate::multi::Dispatch) enums, which take them on the
/// connection inside (one holding SQLite refuses: [`Error::Unsupported`]).
/// The statements are its backend's ([`AdvisoryBackend`]).
///
/// Sealed: implemented by lockkit; name it only in `where` clauses
/// ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "advisory locks need a PostgreSQL or MySQL/MariaDB connection, not `{Self}`",
    label = "no advisory locks on this connection",
    note = "on SQLite, whose writers take turns on the database's write lock, run the work in `lockkit::locked_transaction` (`BEGIN IMMEDIATE`) instead",
    note = "advisory locks take `PgConnection`, `MysqlConnection` (features `postgres`, `mysql`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums that implement `lockkit::multi::Dispatch`"
)]
pub trait AdvisoryConnection: Connection + crate::sealed::Sealed {
    /// The scope of a lock taken now on `conn` ([`scope_for`]).
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyInTransaction`] inside a transaction on MySQL/MariaDB,
    /// [`Error::Database`] with a broken transaction manager,
    /// [`Error::Unsupported`] on an enum holding SQLite.
    #[doc(hidden)]
    fn scope(conn: &mut Self) -> Result<Scope, Error>;
    /// Takes the lock `key` in `scope`, waiting for it or not: whether the
    /// server granted it.
    ///
    /// # Errors
    ///
    /// A classified database error.
    #[doc(hidden)]
    fn acquire(conn: &mut Self, key: AdvisoryKey, scope: Scope, wait: bool) -> Result<bool, Error>;
    /// Releases the session lock `key`: `false` if this session did not hold
    /// it.
    ///
    /// # Errors
    ///
    /// A classified database error.
    #[doc(hidden)]
    fn release(conn: &mut Self, key: AdvisoryKey) -> Result<bool, Error>;
}

/// [`AdvisoryConnection`] for a connection of a backend with advisory locks:
/// its backend's statements.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! advisory_connection {
    ($conn:ty) => {
        impl AdvisoryConnection for $conn {
            fn scope(conn: &mut Self) -> Result<Scope, Error> {
                let status =
                    <Self as Connection>::TransactionManager::transaction_manager_status_mut(conn);
                scope_for(<Self as Connection>::Backend::TRANSACTION_LOCKS, status)
            }

            fn acquire(
                conn: &mut Self,
                key: AdvisoryKey,
                scope: Scope,
                wait: bool,
            ) -> Result<bool, Error> {
                type B = <$conn as Connection>::Backend;
                match wait {
                    true => B::acquire(conn, key, scope),
                    false => B::try_acquire(conn, key, scope),
                }
                .map_err(classify)
            }

            fn release(conn: &mut Self, key: AdvisoryKey) -> Result<bool, Error> {
                <Self as Connection>::Backend::release(conn, key).map_err(classify)
            }
        }
    };
}

#[cfg(feature = "postgres")]
advisory_connection!(diesel::PgConnection);
#[cfg(feature = "mysql")]
advisory_connection!(diesel::MysqlConnection);

/// The connection inside the pooled one takes the locks.
#[cfg(feature = "r2d2")]
#[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
impl<C> AdvisoryConnection for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>>
where
    C: AdvisoryConnection + diesel::r2d2::R2D2Connection + Send + 'static,
{
    fn scope(conn: &mut Self) -> Result<Scope, Error> {
        C::scope(conn)
    }

    fn acquire(conn: &mut Self, key: AdvisoryKey, scope: Scope, wait: bool) -> Result<bool, Error> {
        C::acquire(conn, key, scope, wait)
    }

    fn release(conn: &mut Self, key: AdvisoryKey) -> Result<bool, Error> {
        C::release(conn, key)
    }
}

/// What a [`Dispatch`](crate::multi::Dispatch) enum holding a SQLite
/// connection answers an advisory lock call: nothing is sent.
#[cfg(feature = "sqlite")]
pub(crate) fn no_advisory_locks() -> Error {
    Error::Unsupported(
        "advisory locks need PostgreSQL or MySQL/MariaDB: the MultiConnection enum holds a \
         SQLite connection",
    )
}

/// The scope of a lock taken now on a connection of a backend with (or
/// without) transaction locks, inside a transaction or not: decided here for
/// the blocking and the async calls. A session lock inside a transaction
/// (MySQL/MariaDB) is refused, [`Error::AlreadyInTransaction`]: released
/// before the transaction's `COMMIT`, it would not cover the writes made under
/// it (see the [module docs](self)).
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn scope_for(
    transaction_locks: bool,
    status: &mut diesel::connection::TransactionManagerStatus,
) -> Result<Scope, Error> {
    // A broken transaction manager: a dropped async call's transaction may
    // still be open on the server, and a lock taken and work done there would
    // go with it, under an `Ok`.
    crate::transaction::refuse_broken(status)?;
    match (transaction_locks, status.transaction_depth()) {
        (true, Ok(Some(_))) => Ok(Scope::Transaction),
        (false, Ok(Some(_))) => Err(Error::AlreadyInTransaction),
        (_, _) => Ok(Scope::Session),
    }
}

/// A waiting lock statement that came back without the lock (MySQL/MariaDB's
/// `GET_LOCK` ran out of time): [`Error::LockTimeout`], for the blocking and
/// the async calls.
pub(crate) fn gave_up() -> Error {
    crate::error::classification::lock_error(Error::LockTimeout, "GET_LOCK gave up waiting")
}

/// A held advisory lock. Derefs to the connection; a session lock is released
/// when the guard drops (or explicitly with [`AdvisoryLock::unlock`]), a
/// transaction lock when its transaction ends ([`AdvisoryLock::scope`]). If
/// the release on drop fails (PostgreSQL refuses it inside a transaction that
/// a failed statement aborted, as a panic may leave one), the session keeps
/// the lock: the connection's transaction manager is then marked broken, so
/// that a pool closes the connection and the server frees the lock, and a
/// connection of your own refuses its next transaction.
#[must_use = "the lock is released when the guard is dropped"]
pub struct AdvisoryLock<'c, C>
where
    C: Connection,
{
    conn: &'c mut C,
    key: AdvisoryKey,
    scope: Scope,
    held: bool,
    /// `C`'s [`AdvisoryConnection::release`], taken with the lock: `Drop`
    /// may ask no more of `C` than the struct does (`Connection`).
    release: fn(&mut C, AdvisoryKey) -> Result<bool, Error>,
}

impl<C> AdvisoryLock<'_, C>
where
    C: Connection,
{
    /// The key.
    pub fn key(&self) -> AdvisoryKey {
        self.key
    }

    /// How long the lock lasts.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Releases a session lock now, reporting failure. A transaction lock is
    /// released when its transaction ends; for it this does nothing.
    ///
    /// # Errors
    ///
    /// * [`Error::NotFound`] when the server says this session did not hold the
    ///   lock.
    /// * a classified database error ([`Error::ConnectionLost`], .., else
    ///   [`Error::Database`]); see [`classify`](crate::classify()).
    pub fn unlock(mut self) -> Result<(), Error> {
        if self.scope == Scope::Transaction {
            self.held = false;
            return Ok(());
        }
        let released = (self.release)(self.conn, self.key)?;
        // Only now: a failed release leaves the guard holding, and its drop
        // tries once more, then marks the connection broken.
        self.held = false;
        match released {
            true => Ok(()),
            false => Err(Error::NotFound),
        }
    }
}

/// Shows the key and whether the lock is still held, not the connection.
impl<C> std::fmt::Debug for AdvisoryLock<'_, C>
where
    C: Connection,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryLock")
            .field("key", &self.key)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl<C> Deref for AdvisoryLock<'_, C>
where
    C: Connection,
{
    type Target = C;
    fn deref(&self) -> &C {
        self.conn
    }
}

impl<C> DerefMut for AdvisoryLock<'_, C>
where
    C: Connection,
{
    fn deref_mut(&mut self) -> &mut C {
        self.conn
    }
}

impl<C> Drop for AdvisoryLock<'_, C>
where
    C: Connection,
{
    fn drop(&mut self) {
        if self.held && self.scope == Scope::Session {
            let released = (self.release)(self.conn, self.key);
            if let Ok(false) = released {
                not_held_at_unlock(self.key);
            }
            if let Err(err) = released {
                // The session may keep the lock (PostgreSQL refuses the unlock
                // in an aborted transaction): marked broken, as on the async
                // side, the connection is closed by its pool, and the server
                // frees the lock. A lost connection has lost it already.
                C::TransactionManager::transaction_manager_status_mut(self.conn).set_in_error();
                tracing::warn!(
                    target: "lockkit",
                    key = self.key.0,
                    error = %crate::error::Chain(&err),
                    "advisory unlock failed: the connection is marked broken, for its pool to close"
                );
            }
        }
    }
}

/// A session lock's unlock answered that this session did not hold it: code of
/// the caller's released it, or the unlock reached another server session than
/// the lock (a pooler in transaction mode), and that session may hold it still.
/// lockkit cannot tell which; the blocking and the async releases say so here.
pub(crate) fn not_held_at_unlock(key: AdvisoryKey) {
    tracing::warn!(
        target: "lockkit",
        key = key.0,
        "advisory unlock found the lock not held by this session: released by other code, \
         or the unlock reached another server session (a pooler in transaction mode), \
         which may still hold it"
    );
}

/// Waits for the advisory lock `key`: a session lock, or inside a transaction on
/// PostgreSQL a transaction lock (see the [module docs](self)).
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] on MySQL/MariaDB inside a transaction (the
///   session lock would be released before `COMMIT`); nothing is sent.
/// * [`Error::Unsupported`] on a [`Dispatch`](crate::multi::Dispatch) enum
///   holding a SQLite connection; nothing is sent.
/// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
///   transaction manager is broken (a transaction may be open on the server
///   that Diesel no longer counts); nothing is sent.
/// * [`Error::Database`], not retryable, on PostgreSQL inside a transaction at
///   `REPEATABLE READ`, whose snapshot predates the wait; nothing is locked
///   (see the [module docs](self)).
/// * [`Error::LockTimeout`] when the wait ran out: PostgreSQL's `lock_timeout`,
///   or MySQL/MariaDB's `GET_LOCK` giving up.
/// * [`Error::Deadlock`] when the server broke a deadlock with this session.
/// * any other classified database error ([`Error::ConnectionLost`],
///   [`Error::StatementTimeout`], .., else [`Error::Database`]); see
///   [`classify`](crate::classify()).
pub fn lock<C>(conn: &mut C, key: impl Into<AdvisoryKey>) -> Result<AdvisoryLock<'_, C>, Error>
where
    C: AdvisoryConnection,
{
    taken(conn, key.into(), true)?.ok_or_else(gave_up)
}

/// Takes the advisory lock `key` if it is free (scoped as by [`lock`]).
/// `Ok(None)` when another session holds it.
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] on MySQL/MariaDB inside a transaction, as
///   [`lock`]; nothing is sent.
/// * [`Error::Unsupported`] on a [`Dispatch`](crate::multi::Dispatch) enum
///   holding a SQLite connection, as [`lock`]; nothing is sent.
/// * [`Error::Database`], not retryable, on PostgreSQL inside a transaction at
///   `REPEATABLE READ`, as [`lock`]; nothing is locked.
/// * a classified database error ([`Error::ConnectionLost`], .., else
///   [`Error::Database`]); see [`classify`](crate::classify()).
pub fn try_lock<C>(
    conn: &mut C,
    key: impl Into<AdvisoryKey>,
) -> Result<Option<AdvisoryLock<'_, C>>, Error>
where
    C: AdvisoryConnection,
{
    taken(conn, key.into(), false)
}

/// Takes the lock `key`, waiting for it or not, scoped by
/// [`AdvisoryConnection::scope`]: its guard, or `None` when the server did not
/// grant it.
fn taken<C>(
    conn: &mut C,
    key: AdvisoryKey,
    wait: bool,
) -> Result<Option<AdvisoryLock<'_, C>>, Error>
where
    C: AdvisoryConnection,
{
    let scope = C::scope(conn)?;
    Ok(match C::acquire(conn, key, scope, wait)? {
        true => Some(AdvisoryLock {
            conn,
            key,
            scope,
            held: true,
            release: C::release,
        }),
        false => None,
    })
}

/// The one column of every advisory lock statement.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
pub(crate) struct Locked {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Bool>)]
    pub(crate) locked: Option<bool>,
}

/// What lockkit answers a PostgreSQL transaction lock asked for at
/// `REPEATABLE READ` ([`Locked::answer`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
const REPEATABLE_READ: &str = "an advisory transaction lock at REPEATABLE READ protects \
     nothing: the transaction's snapshot is taken before the wait, and the next holder would \
     not see what the last one committed under the lock; nothing was locked. Run the \
     transaction at READ COMMITTED (PostgreSQL's default, unless default_transaction_isolation \
     says otherwise), or take a session lock before BEGIN";

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Locked {
    /// What a lock statement answered (blocking or async): whether the lock
    /// was taken. No row is PostgreSQL's standby, where the statement takes
    /// nothing (`WHERE NOT pg_is_in_recovery()`): a standby's advisory locks
    /// are its own and would exclude no one on the primary. That is the
    /// server's read-only error, [`Error::ReadOnly`] once classified. `NULL` is
    /// a PostgreSQL transaction lock asked for at `REPEATABLE READ`, which the
    /// statement does not take ([`REPEATABLE_READ`]): not retryable.
    pub(crate) fn answer(row: diesel::QueryResult<Locked>) -> diesel::QueryResult<bool> {
        match row {
            Ok(Locked {
                locked: Some(locked),
            }) => Ok(locked),
            Ok(Locked { locked: None }) => Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::Unknown,
                Box::new(REPEATABLE_READ.to_owned()),
            )),
            Err(diesel::result::Error::NotFound) => Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ReadOnlyTransaction,
                Box::new("a standby takes no advisory lock: take it on the primary".to_owned()),
            )),
            Err(err) => Err(err),
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::connection::LoadConnection;
    use diesel::pg::Pg;
    use diesel::sql_types::BigInt;
    use diesel::{Connection, RunQueryDsl};

    use super::{AdvisoryBackend, AdvisoryKey, Locked, Scope, Statement};
    use crate::error::classification::classify;
    use crate::error::Error;
    use crate::transaction::require_transaction_on;

    fn statement(sql: &'static str, key: AdvisoryKey) -> Statement<Pg> {
        diesel::sql_query(sql).into_boxed().bind::<BigInt, _>(key.0)
    }

    impl AdvisoryBackend for Pg {
        const TRANSACTION_LOCKS: bool = true;

        fn run<C>(conn: &mut C, statement: Statement<Self>) -> diesel::QueryResult<bool>
        where
            C: Connection<Backend = Self> + LoadConnection,
        {
            Locked::answer(statement.get_result::<Locked>(conn))
        }

        fn acquire_statement(key: AdvisoryKey, scope: Scope, wait: bool) -> Statement<Pg> {
            let sql = match (scope, wait) {
                (Scope::Session, true) => {
                    "SELECT pg_advisory_lock($1) IS NOT NULL AS locked \
                     WHERE NOT pg_is_in_recovery()"
                }
                // Not taken at REPEATABLE READ, whose snapshot predates the
                // wait (`Locked::answer`); SERIALIZABLE reports what that
                // snapshot misses as a serialization failure.
                (Scope::Transaction, true) => {
                    "SELECT CASE WHEN current_setting('transaction_isolation') = 'repeatable read' \
                     THEN NULL ELSE pg_advisory_xact_lock($1) IS NOT NULL END AS locked \
                     WHERE NOT pg_is_in_recovery()"
                }
                (Scope::Session, false) => {
                    "SELECT pg_try_advisory_lock($1) AS locked WHERE NOT pg_is_in_recovery()"
                }
                (Scope::Transaction, false) => {
                    "SELECT CASE WHEN current_setting('transaction_isolation') = 'repeatable read' \
                     THEN NULL ELSE pg_try_advisory_xact_lock($1) END AS locked \
                     WHERE NOT pg_is_in_recovery()"
                }
            };
            statement(sql, key)
        }

        fn release_statement(key: AdvisoryKey) -> Statement<Pg> {
            statement("SELECT pg_advisory_unlock($1) AS locked", key)
        }
    }

    /// PostgreSQL: waits for the transaction-level advisory lock `key`, held until
    /// the transaction ends. [`Error::NotInTransaction`] outside a transaction.
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
    /// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
    ///   transaction manager is broken (a dropped call's transaction may still be
    ///   open on the server); nothing is sent.
    /// * [`Error::Database`], not retryable, in a transaction at
    ///   `REPEATABLE READ`, whose snapshot predates the wait; nothing is locked
    ///   (see the [module docs](super)).
    /// * [`Error::LockTimeout`] when the wait ran past `lock_timeout`.
    /// * [`Error::Deadlock`] when the server broke a deadlock with this session.
    /// * any other classified database error; see [`classify`](crate::classify()).
    ///
    /// ```no_run
    /// use diesel::prelude::*;
    /// use lockkit::advisory;
    ///
    /// let mut conn = PgConnection::establish("postgres://localhost/app").unwrap();
    /// conn.transaction(|conn| {
    ///     advisory::xact_lock(conn, "invoice-numbers")?; // waits for the holder's COMMIT
    ///     // read the last invoice number, insert the next: one transaction at a time
    ///     Ok::<_, lockkit::Error>(())
    /// }) // released here, at COMMIT (or ROLLBACK)
    /// .unwrap();
    /// ```
    pub fn xact_lock<C>(conn: &mut C, key: impl Into<AdvisoryKey>) -> Result<(), Error>
    where
        C: Connection<Backend = Pg> + LoadConnection,
    {
        require_transaction_on(conn)?;
        Pg::acquire(conn, key.into(), Scope::Transaction)
            .map(drop)
            .map_err(classify)
    }

    /// PostgreSQL: takes the transaction-level advisory lock `key` if it is free.
    /// `Ok(false)` when another session holds it.
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] outside a transaction; nothing is sent.
    /// * [`Error::Database`] with `BrokenTransactionManager` when the connection's
    ///   transaction manager is broken (a dropped call's transaction may still be
    ///   open on the server); nothing is sent.
    /// * [`Error::Database`], not retryable, in a transaction at
    ///   `REPEATABLE READ`, whose snapshot predates the wait; nothing is locked
    ///   (see the [module docs](super)).
    /// * a classified database error; see [`classify`](crate::classify()).
    ///
    /// ```no_run
    /// use diesel::prelude::*;
    /// use lockkit::advisory;
    ///
    /// let mut conn = PgConnection::establish("postgres://localhost/app").unwrap();
    /// let ran = conn
    ///     .transaction(|conn| {
    ///         if !advisory::try_xact_lock(conn, "nightly-report")? {
    ///             return Ok(false); // another instance is running it
    ///         }
    ///         // ... the report, written in this transaction ...
    ///         Ok::<_, lockkit::Error>(true)
    ///     })
    ///     .unwrap();
    /// println!("ran the report: {ran}");
    /// ```
    pub fn try_xact_lock<C>(conn: &mut C, key: impl Into<AdvisoryKey>) -> Result<bool, Error>
    where
        C: Connection<Backend = Pg> + LoadConnection,
    {
        require_transaction_on(conn)?;
        Pg::try_acquire(conn, key.into(), Scope::Transaction).map_err(classify)
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{try_xact_lock, xact_lock};

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::connection::LoadConnection;
    use diesel::mysql::Mysql;
    use diesel::sql_types::{Integer, Text};
    use diesel::{Connection, RunQueryDsl};

    use super::{AdvisoryBackend, AdvisoryKey, Locked, Scope, Statement};

    /// `GET_LOCK` waits this long at most when asked to wait: one year.
    const FOREVER_SECS: i32 = 365 * 24 * 3600;

    impl AdvisoryBackend for Mysql {
        const TRANSACTION_LOCKS: bool = false;

        fn run<C>(conn: &mut C, statement: Statement<Self>) -> diesel::QueryResult<bool>
        where
            C: Connection<Backend = Self> + LoadConnection,
        {
            Locked::answer(statement.get_result::<Locked>(conn))
        }

        /// Session locks only: the scope changes nothing.
        fn acquire_statement(key: AdvisoryKey, _: Scope, wait: bool) -> Statement<Mysql> {
            diesel::sql_query("SELECT COALESCE(GET_LOCK(?, ?), 0) = 1 AS locked")
                .into_boxed()
                .bind::<Text, _>(key.mysql_name())
                .bind::<Integer, _>(if wait { FOREVER_SECS } else { 0 })
        }

        fn release_statement(key: AdvisoryKey) -> Statement<Mysql> {
            diesel::sql_query("SELECT COALESCE(RELEASE_LOCK(?), 0) = 1 AS locked")
                .into_boxed()
                .bind::<Text, _>(key.mysql_name())
        }
    }
}

#[cfg(test)]
mod tests {
    use diesel::connection::TransactionManagerStatus;

    use super::*;

    #[test]
    fn a_broken_transaction_manager_takes_no_lock_of_either_scope() {
        for transaction_locks in [true, false] {
            let refused = scope_for(transaction_locks, &mut TransactionManagerStatus::InError);
            assert!(
                matches!(
                    refused,
                    Err(Error::Database(
                        diesel::result::Error::BrokenTransactionManager
                    ))
                ),
                "{refused:?}"
            );
        }
        let mut idle = TransactionManagerStatus::Valid(Default::default());
        assert_eq!(scope_for(false, &mut idle).unwrap(), Scope::Session);
    }
}
