//! Pessimistic locking on diesel-async: [`with_lock`], [`locked_transaction`]
//! and [`lock_all`], the async twins of
//! [`lockkit::with_lock`](crate::with_lock),
//! [`lockkit::locked_transaction`](crate::locked_transaction) and
//! [`Lockable::lock_all`], with the same statements
//! and the same errors (see [`pessimistic::lockable`](crate::pessimistic::lockable)):
//!
//! ```sql
//! BEGIN;                                      -- SQLite: BEGIN IMMEDIATE
//! SELECT set_config('lock_timeout', $1, true); -- only with LockOptions::timeout
//! SELECT items.id, items.stock, items.lock_version
//!   FROM items WHERE items.id = $1 FOR UPDATE; -- SQLite: no clause
//! UPDATE items SET lock_version = lock_version + 1
//!  WHERE items.id = $1 AND items.lock_version = $2; -- Versioned models only
//! -- your closure
//! COMMIT;                                     -- or ROLLBACK on Err
//! ```
//!
//! On PostgreSQL a versioned model's read and bump under a waiting `FOR UPDATE`
//! are one statement, the blocking side's (`UPDATE .. WHERE .. AND EXISTS
//! (SELECT .. FOR UPDATE) RETURNING ..`; see
//! [`pessimistic::lockable`](crate::pessimistic::lockable)).
//!
//! The closure is an `async` closure that gets the connection and the fresh,
//! locked row, and returns your own error type (any `E: From<lockkit::Error>`).
//! A future dropped before it finishes leaves the transaction open on the
//! connection: see [cancellation](super::connection#cancellation).
//!
//! ```
//! # use diesel::prelude::*;
//! # use diesel_async::RunQueryDsl;
//! use lockkit::asynchronous::prelude::*;
//! use lockkit::LockOptions;
//! # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
//! #[derive(Queryable, Selectable, Lockable)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub stock: i32 }
//!
//! # async fn run() -> Result<(), lockkit::Error> {
//! # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
//! # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
//! # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL); INSERT INTO items VALUES (1, 10)").await?;
//! let left = lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |conn, item: Item| {
//!     diesel::update(items::table.find(item.id))
//!         .set(items::stock.eq(item.stock - 8))
//!         .execute(conn)
//!         .await?;
//!     Ok::<_, lockkit::Error>(item.stock - 8)
//! })
//! .await?;
//! assert_eq!(left, 2);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use diesel::dsl::{self, AsSelect};
use diesel::expression::Expression;
use diesel::query_dsl::methods::{FilterDsl, FindDsl, LockingDsl, OrderDsl, SelectDsl};
use diesel::{OptionalExtension, QueryResult, Selectable};
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::RunQueryDsl;

use super::connection::{open_locked, AsyncLockingConnection, Level, Unsettled};
use super::transaction::{end_caught, Panicked};
use super::versioned::{AsyncVersionQuery, AsyncVersioned};
use super::work::{ConnWork, RowWork};
use crate::error::classification::classify;
use crate::error::Error;
use crate::optimistic::versioned::TouchVersioned;
use crate::optimistic::BumpVersion;
use crate::pessimistic::lockable::Lockable;
use crate::pessimistic::lockable::{
    all_by_keys, by_key, first_of_each_key, incomplete, lock_order, unmatched, AllByKeys, ByKey,
    KeyColumn, KeysFilter, Pk, Returned, MAX_KEYS_PER_STATEMENT,
};
use crate::pessimistic::options::LockOptions;
use crate::pessimistic::row_lock::{
    EveryClause, ForUpdate, LockClause, LockedCall, RowLock, WaitMode,
};
use crate::pessimistic::NoVersion;
use crate::transaction::journal;
use crate::transaction::Failure;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Locks the row `key` of `M` as `options` say and runs `f` on the fresh row, in
/// a transaction: [`lockkit::with_lock`](crate::with_lock) on diesel-async.
///
/// `f` is an `async` closure that returns your own error type, as in Diesel's
/// `transaction`. An `Err` rolls the transaction back; the error comes back to
/// you untouched.
///
/// # Errors
///
/// As [`Lockable::with_lock`]: [`Error::NotFound`], [`Error::Busy`] with
/// `nowait()` or `skip_locked()`, [`Error::LockTimeout`], [`Error::Deadlock`],
/// a serialization failure or deadlock reported at `COMMIT`, any other
/// classified database error, and whatever `f` returns; [`Error::InvalidInput`],
/// with nothing sent, for [`LockStrength::KeyShare`](crate::LockStrength::KeyShare)
/// (see [`LockOptions::strength`](crate::LockOptions::strength)).
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # use diesel_async::RunQueryDsl;
/// use lockkit::asynchronous::prelude::*;
/// use lockkit::LockOptions;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # #[derive(Queryable, Selectable, Lockable)]
/// # #[diesel(table_name = items)]
/// # pub struct Item { pub id: i32, pub stock: i32 }
/// #[derive(Debug, thiserror::Error)]
/// enum ShopError {
///     #[error("only {0} left")]
///     NotEnough(i32),
///     #[error(transparent)]
///     Lock(#[from] lockkit::Error),
/// }
///
/// # async fn run() {
/// # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
/// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
/// # conn.batch_execute("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL); INSERT INTO items VALUES (1, 5)").await.unwrap();
/// let opts = LockOptions::default().nowait();
/// let sold = lockkit::asynchronous::with_lock(&mut conn, 1, opts, async |_conn, item: Item| {
///     if item.stock < 8 {
///         return Err(ShopError::NotEnough(item.stock));
///     }
///     Ok(8)
/// })
/// .await;
/// assert!(matches!(sold, Err(ShopError::NotEnough(5))));
/// # }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run());
/// ```
pub async fn with_lock<M, C, T, E, F>(
    conn: &mut C,
    key: M::Key,
    options: LockOptions,
    f: F,
) -> Result<T, E>
where
    C: AsyncLockingConnection,
    M: AsyncLockRow<C>,
    E: From<Error> + Send,
    T: Send,
    F: RowWork<C, M, T, E>,
{
    options.check_for_with_lock()?;
    let began = super::connection::began(conn).await.map_err(E::from)?;
    let (mut unsettled, restore) = open_locked(conn, &options).await.map_err(E::from)?;
    let mut level = Level::opened(&mut *unsettled.conn);
    let conn = &mut *level;
    let mut held = None;
    let work = async {
        match lock_row::<M, C>(conn, key, options).await {
            Ok((row, mut lock)) => {
                // Nested in the caller's transaction, the lock lasts until the
                // caller's end, which lockkit does not see (the blocking side
                // hands it to the outer lockkit transaction's scope).
                lock.recorded = !began.nested;
                held = Some(lock);
                f(conn, row).await.map_err(Failure::Closure)
            }
            Err(err) => Err(Failure::Lockkit(err)),
        }
    };
    let worked = Panicked::catch(work).await;
    let ended = end_caught(level, began, restore, worked).await;
    unsettled.settled();
    // The transaction has ended: the hold is recorded.
    drop(held);
    ended.unwrap_or_else(|panicked| panicked.resume())
}

/// The row lock [`with_lock`] took: what the blocking side's transaction scope
/// keeps of a lock, to report how long it was held. Recorded (and warned about
/// past [`hold_warning`](crate::metrics::hold_warning)) when dropped: after
/// the call's transaction ended, or where the call's future was dropped or its
/// work panicked, whose transaction is rolled back.
struct HeldRow {
    table: &'static str,
    key: Option<String>,
    since: std::time::Instant,
    /// Whether the drop records the hold: not for a lock nested in the
    /// caller's transaction.
    recorded: bool,
}

impl Drop for HeldRow {
    fn drop(&mut self) {
        if self.recorded {
            let held = self.since.elapsed();
            crate::metrics::record_lock_held("row", self.table, self.key.as_deref(), held);
        }
    }
}

/// Runs `f` in a transaction fit for locking, as
/// [`lockkit::locked_transaction`](crate::locked_transaction) does: a plain
/// transaction with the options' lock timeout on PostgreSQL and MySQL, `BEGIN
/// IMMEDIATE` on SQLite. Use it around [`lock_all`]. Of the options, as there,
/// the lock timeout bounds the lock waits of `f` on the servers; the strength
/// and wait mode are `with_lock`'s (and on SQLite how `BEGIN IMMEDIATE` waits).
///
/// # Errors
///
/// As [`lockkit::locked_transaction`](crate::locked_transaction): a classified
/// error from `BEGIN`, the setting or `COMMIT`, and whatever `f` returns.
///
/// # Example
///
/// See [`lock_all`].
pub async fn locked_transaction<C, T, E, F>(
    conn: &mut C,
    options: LockOptions,
    f: F,
) -> Result<T, E>
where
    C: AsyncLockingConnection,
    E: From<Error> + Send,
    T: Send,
    F: ConnWork<C, T, E>,
{
    let began = super::connection::began(conn).await.map_err(E::from)?;
    let (mut unsettled, restore) = open_locked(conn, &options).await.map_err(E::from)?;
    let mut level = Level::opened(&mut *unsettled.conn);
    let worked = Panicked::catch(async { f(&mut *level).await.map_err(Failure::Closure) }).await;
    let ended = end_caught(level, began, restore, worked).await;
    unsettled.settled();
    ended.unwrap_or_else(|panicked| panicked.resume())
}

/// The locked read of [`with_lock`], in its transaction: the row, its version
/// advanced when the lock is exclusive and the model versioned, and the lock.
async fn lock_row<M, C>(
    conn: &mut C,
    key: M::Key,
    options: LockOptions,
) -> Result<(M, HeldRow), Error>
where
    C: AsyncLockingConnection,
    M: AsyncLockRow<C>,
{
    let waited = crate::metrics::LockWait::start();
    let held = |key: &M::Key| HeldRow {
        table: M::TABLE_NAME,
        since: waited.acquired(M::TABLE_NAME, 1),
        key: crate::transaction::scope::named(|| format!("{key:?}")),
        // Set by `with_lock` once the read (and the bump) succeeded.
        recorded: false,
    };
    let lock = options.row_lock();
    // A locking read of lockkit's own that answered hid no deadlock: the
    // journal is left as sure as it was before it, and neither the bump below
    // nor a later write asks the server for it.
    let before = journal::own_read(&mut journal::AsyncWatched(&mut *conn));
    if lock == ForUpdate::LOCK {
        if let Some(row) = M::load_locked_bumped(conn, &key).await? {
            journal::own_read_done(&mut journal::AsyncWatched(&mut *conn), before);
            return Ok((row, held(&key)));
        }
    }
    let mut row = M::load_locked(conn, key.clone(), lock)
        .await
        .map_err(|err| lock.wait.classify(err))?;
    let ends = journal::Watched::ends(&journal::AsyncWatched(&mut *conn));
    if row.is_none() && lock.wait.reads_again_when_empty(ends) {
        row = M::load_locked(conn, key.clone(), lock)
            .await
            .map_err(|err| lock.wait.classify(err))?;
    }
    journal::own_read_done(&mut journal::AsyncWatched(&mut *conn), before);
    let mut row = match row {
        Some(row) => row,
        None if lock.wait.hides_held_rows() => {
            let exists = M::exists(conn, key).await.map_err(classify)?;
            return Err(WaitMode::empty_read(exists));
        }
        None => return Err(Error::NotFound),
    };
    let lock_held = held(&key);
    if lock.strength.is_exclusive() {
        <M::OnLock as AsyncMarkLocked<M, C>>::mark(conn, &mut row).await?;
    }
    Ok((row, lock_held))
}

/// Locks the rows with these keys in ascending key order and returns them in
/// that order: [`Lockable::lock_all`] on diesel-async, with its statement and
/// errors. Must run inside a transaction ([`Error::NotInTransaction`]
/// otherwise, `BrokenTransactionManager` on a broken connection):
/// [`locked_transaction`].
///
/// # Errors
///
/// As [`Lockable::lock_all`]; among them [`Error::TransactionAborted`] when a
/// statement you let go (a MariaDB deadlock) has ended the transaction: nothing
/// is sent, which on MySQL/MariaDB would run in autocommit and lock nothing.
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # use diesel_async::RunQueryDsl;
/// use lockkit::asynchronous::prelude::*;
/// use lockkit::LockOptions;
/// # diesel::table! { accounts (id) { id -> Integer, balance -> BigInt } }
/// # #[derive(Queryable, Selectable, Lockable)]
/// # #[diesel(table_name = accounts)]
/// # pub struct Account { pub id: i32, pub balance: i64 }
/// # async fn run() -> Result<(), lockkit::Error> {
/// # use diesel_async::{AsyncConnection, SimpleAsyncConnection};
/// # let mut conn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await.unwrap();
/// # conn.batch_execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL); INSERT INTO accounts VALUES (1, 100), (2, 50)").await?;
/// let total = lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |conn| {
///     let accounts: Vec<Account> = lockkit::asynchronous::lock_all(conn, &[2, 1]).await?;
///     Ok::<_, lockkit::Error>(accounts.iter().map(|a| a.balance).sum::<i64>())
/// })
/// .await?;
/// assert_eq!(total, 150);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run()).unwrap();
/// ```
pub async fn lock_all<M, C>(conn: &mut C, keys: &[M::Key]) -> Result<Vec<M>, Error>
where
    C: AsyncLockingConnection,
    M: AsyncLockAll<C>,
    M::Key: Ord + Send + Sync,
{
    // It opens no level of its own: a call dropped (timed out on its own) with
    // one of its statements in flight on MySQL/MariaDB marks the connection
    // broken, so that the transaction around does not read that reply for its
    // `COMMIT`'s.
    let mut unsettled = Unsettled::until_replied(conn);
    let conn = &mut *unsettled.conn;
    let locked = async {
        super::connection::require_transaction(conn)?;
        super::connection::require_live(conn).await?;
        // Its reads are lockkit's own: once they answered, the journal is as
        // sure as `require_live` left it.
        let before = journal::own_read(&mut journal::AsyncWatched(&mut *conn));
        let waited = crate::metrics::LockWait::start();
        conn.take_write_lock().await?; // SQLite: a deferred transaction holds no lock yet
        let keys = lock_order(keys);
        let mut rows = Vec::with_capacity(keys.len());
        // Chunk after chunk in key order: every transaction takes the locks in the
        // same order, whatever the length of its list.
        let mut returned = Returned::for_keys(keys.len());
        for chunk in keys.chunks(MAX_KEYS_PER_STATEMENT) {
            let mut locked = M::load_all_locked(conn, chunk.to_vec())
                .await
                .map_err(classify)?;
            if incomplete(chunk, &locked) {
                // The rows found so far, each once (two rows with one key
                // count as one).
                first_of_each_key(&mut locked);
                let first = locked.len();
                // As on the blocking side: the keys without a row, read again.
                let missed: Vec<M::Key> = unmatched(chunk, &locked).cloned().collect();
                if !missed.is_empty() {
                    let again = M::load_all_locked(conn, missed.clone())
                        .await
                        .map_err(classify)?;
                    locked.extend(again);
                }
                // Asked of the latest commit, and a row found then locked and
                // returned, as on the blocking side.
                let still: Vec<M::Key> = unmatched(&missed, &locked).cloned().collect();
                for key in still {
                    match M::load_locked(conn, key, RowLock::update())
                        .await
                        .map_err(classify)?
                    {
                        Some(row) => locked.push(row),
                        None => return Err(Error::NotFound),
                    }
                }
                first_of_each_key(&mut locked);
                if locked.len() > first {
                    // In key order, as on the blocking side.
                    locked = M::load_all_locked(conn, chunk.to_vec())
                        .await
                        .map_err(classify)?;
                    first_of_each_key(&mut locked);
                }
            }
            // A row found by keys of two chunks, before it is marked again (as on
            // the blocking side).
            returned.keep_new(&mut locked);
            for row in &mut locked {
                <M::OnLock as AsyncMarkLocked<M, C>>::mark(conn, row).await?;
            }
            rows.append(&mut locked);
        }
        waited.acquired(M::TABLE_NAME, rows.len());
        journal::own_read_done(&mut journal::AsyncWatched(&mut *conn), before);
        Ok(rows)
    }
    .await;
    unsettled.settled();
    locked
}

/// The locked re-read of one row, which [`with_lock`] requires: the blocking
/// side's statement ([`LockRow`](crate::bounds::LockRow)), run on a diesel-async
/// connection. Implemented for every [`Lockable`] model that is `Selectable` on
/// the connection's backend; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`{Self}` rows cannot be locked on `{Conn}`",
    label = "not a lockable model on this connection",
    note = "`with_lock` needs a model with `#[derive(Lockable)]` or `#[derive(Versioned)]` that is also `#[derive(Queryable, Selectable)]` for the connection's backend"
)]
pub trait AsyncLockRow<Conn: AsyncLockingConnection>:
    Lockable<OnLock: AsyncMarkLocked<Self, Conn>, Key: Send + Sync> + Send
{
    /// `SELECT <fields> FROM <table> WHERE <key> FOR UPDATE`.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_locked(
        conn: &mut Conn,
        key: Self::Key,
        lock: RowLock,
    ) -> BoxFuture<'_, QueryResult<Option<Self>>>;
    /// Whether the row exists (an unlocked read).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn exists(conn: &mut Conn, key: Self::Key) -> BoxFuture<'_, QueryResult<bool>>;
    /// The blocking side's
    /// [`load_locked_bumped`](crate::bounds::LockRow::load_locked_bumped):
    /// the locked read of a waiting `FOR UPDATE` and the version bump in one
    /// statement where the backend and the model allow it, else `None`.
    #[doc(hidden)]
    fn load_locked_bumped<'a>(
        conn: &'a mut Conn,
        key: &'a Self::Key,
    ) -> BoxFuture<'a, Result<Option<Self>, Error>>;
}

/// The locked read of one row under whichever clause the [`RowLock`] picks
/// (the blocking side decides which, as for `with_lock`), on a diesel-async
/// connection. Name it only in `where` clauses.
#[derive(Debug)]
pub struct AsyncFirst<'c, Q, M, C>(Q, &'c mut C, PhantomData<M>);

impl<'c, Q, M, C, L> LockedCall<L, ()> for AsyncFirst<'c, Q, M, C>
where
    C: AsyncLockingConnection,
    Q: LockingDsl<L>,
    C::Locked<Q, L>: LoadQuery<'c, C, M> + Send + 'c,
    M: Send + 'c,
{
    type Output = BoxFuture<'c, QueryResult<Option<M>>>;

    fn call(self, _: &mut (), clause: L) -> Self::Output {
        let query = C::apply_lock(self.0, clause);
        Box::pin(async move { query.get_result(self.1).await.optional() })
    }
}

impl<M, C> AsyncLockRow<C> for M
where
    C: AsyncLockingConnection,
    M: Lockable<OnLock: AsyncMarkLocked<M, C> + AsyncBumpOnLock<M, C>, Key: Send + Sync>
        + Selectable<C::Backend>
        + Send
        + 'static,
    AsSelect<M, C::Backend>: Expression,
    M::Table: FindDsl<M::Key>,
    dsl::Find<M::Table, M::Key>: SelectDsl<AsSelect<M, C::Backend>>,
    ByKey<M, C::Backend>: for<'q> LoadQuery<'q, C, M> + Send + 'static,
    for<'c> AsyncFirst<'c, ByKey<M, C::Backend>, M, C>:
        EveryClause<(), BoxFuture<'c, QueryResult<Option<M>>>>,
{
    fn load_locked(
        conn: &mut C,
        key: M::Key,
        lock: RowLock,
    ) -> BoxFuture<'_, QueryResult<Option<M>>> {
        lock.with_clause(
            &mut (),
            AsyncFirst(by_key::<M, C::Backend>(key), conn, PhantomData),
        )
    }

    fn exists(conn: &mut C, key: M::Key) -> BoxFuture<'_, QueryResult<bool>> {
        let query = by_key::<M, C::Backend>(key);
        Box::pin(async move {
            query
                .get_result::<M>(conn)
                .await
                .optional()
                .map(|row| row.is_some())
        })
    }

    fn load_locked_bumped<'a>(
        conn: &'a mut C,
        key: &'a M::Key,
    ) -> BoxFuture<'a, Result<Option<M>, Error>> {
        <M::OnLock as AsyncBumpOnLock<M, C>>::lock_bumped(conn, key)
    }
}

/// The ordered multi-row lock of [`lock_all`]: the blocking side's statement
/// ([`LockAll`](crate::bounds::LockAll)) on a diesel-async connection. Name it
/// only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`lock_all` cannot lock `{Self}` rows on `{Conn}`",
    label = "lock_all needs a single-column integer, string or UUID key",
    note = "keys `lock_all` takes: `i16`, `i32`, `i64`, `String`, and `uuid::Uuid` (feature `uuid`, PostgreSQL only)"
)]
pub trait AsyncLockAll<Conn: AsyncLockingConnection>: AsyncLockRow<Conn> {
    /// `SELECT .. WHERE pk IN (..) ORDER BY pk FOR UPDATE`.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn load_all_locked(
        conn: &mut Conn,
        keys: Vec<Self::Key>,
    ) -> BoxFuture<'_, QueryResult<Vec<Self>>>;
}

impl<M, C> AsyncLockAll<C> for M
where
    C: AsyncLockingConnection,
    M: AsyncLockRow<C> + Selectable<C::Backend>,
    AsSelect<M, C::Backend>: Expression,
    Pk<M>: KeyColumn<M::Key>,
    M::Table: FilterDsl<KeysFilter<M>>,
    dsl::Filter<M::Table, KeysFilter<M>>: OrderDsl<dsl::Asc<Pk<M>>>,
    dsl::Order<dsl::Filter<M::Table, KeysFilter<M>>, dsl::Asc<Pk<M>>>:
        SelectDsl<AsSelect<M, C::Backend>>,
    AllByKeys<M, C::Backend>: LockingDsl<ForUpdate>,
    C::Locked<AllByKeys<M, C::Backend>, ForUpdate>: for<'q> LoadQuery<'q, C, M> + Send + 'static,
{
    fn load_all_locked(conn: &mut C, keys: Vec<M::Key>) -> BoxFuture<'_, QueryResult<Vec<M>>> {
        let query = C::apply_lock(all_by_keys::<M, C::Backend>(keys), ForUpdate);
        Box::pin(async move { query.load(conn).await })
    }
}

/// What an exclusive lock on one row writes to it, on a diesel-async
/// connection: nothing ([`NoVersion`]), or the version bump ([`BumpVersion`]),
/// as on the blocking side ([`MarkLocked`](crate::bounds::MarkLocked)). Name it
/// only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "a lock on `{M}` cannot advance its version on `{Conn}`",
    label = "`{Self}` cannot mark a locked `{M}` row",
    note = "an exclusive lock on a `Versioned` model writes its version: the model must fit lockkit's async versioned writes on this connection (`#[derive(Versioned)]` on a `table!` of a supported backend)"
)]
pub trait AsyncMarkLocked<M, Conn> {
    /// Marks one locked row as written (the model is updated to match).
    fn mark<'a>(conn: &'a mut Conn, row: &'a mut M) -> BoxFuture<'a, Result<(), Error>>;
}

impl<M, Conn> AsyncMarkLocked<M, Conn> for NoVersion {
    fn mark<'a>(_: &'a mut Conn, _: &'a mut M) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

impl<M, Conn> AsyncMarkLocked<M, Conn> for BumpVersion
where
    Conn: AsyncLockingConnection,
    M: AsyncVersioned + AsyncVersionQuery<Conn>,
    TouchVersioned<M>: ExecuteDsl<Conn>,
{
    fn mark<'a>(conn: &'a mut Conn, row: &'a mut M) -> BoxFuture<'a, Result<(), Error>> {
        // The row is locked: the version cannot have moved since the locked read,
        // and is the row's own.
        Box::pin(super::versioned::touch_locked(conn, row))
    }
}

/// The locked read and the version bump of [`with_lock`] in one statement, as
/// on the blocking side ([`BumpOnLock`](crate::pessimistic::lockable::BumpOnLock)):
/// nothing for [`NoVersion`], and for [`BumpVersion`] on PostgreSQL the same
/// statement ([`LockedBumpQuery`](crate::optimistic::bump_on_lock::LockedBumpQuery)).
/// Name it only in `where` clauses.
#[doc(hidden)]
pub trait AsyncBumpOnLock<M: Lockable, Conn> {
    /// The row, locked `FOR UPDATE` and its version advanced, or `None`
    /// (nothing sent, or no row matched).
    fn lock_bumped<'a>(
        conn: &'a mut Conn,
        key: &'a M::Key,
    ) -> BoxFuture<'a, Result<Option<M>, Error>>;
}

impl<M: Lockable + Send + 'static, Conn> AsyncBumpOnLock<M, Conn> for NoVersion {
    fn lock_bumped<'a>(_: &'a mut Conn, _: &'a M::Key) -> BoxFuture<'a, Result<Option<M>, Error>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// MySQL/MariaDB and SQLite: the two statements, as on the blocking side.
#[cfg(feature = "mysql")]
impl<M: Lockable + Send + 'static> AsyncBumpOnLock<M, diesel_async::AsyncMysqlConnection>
    for BumpVersion
{
    fn lock_bumped<'a>(
        _: &'a mut diesel_async::AsyncMysqlConnection,
        _: &'a M::Key,
    ) -> BoxFuture<'a, Result<Option<M>, Error>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

#[cfg(feature = "sqlite")]
impl<M: Lockable + Send + 'static>
    AsyncBumpOnLock<
        M,
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>,
    > for BumpVersion
{
    fn lock_bumped<'a>(
        _: &'a mut diesel_async::sync_connection_wrapper::SyncConnectionWrapper<
            diesel::SqliteConnection,
        >,
        _: &'a M::Key,
    ) -> BoxFuture<'a, Result<Option<M>, Error>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// PostgreSQL: the blocking side's statement and journal bookkeeping, awaited.
#[cfg(feature = "postgres")]
impl<M> AsyncBumpOnLock<M, diesel_async::AsyncPgConnection> for BumpVersion
where
    M: crate::optimistic::bump_on_lock::LockedBumpQuery
        + AsyncVersionQuery<diesel_async::AsyncPgConnection>
        + Send,
    M::Key: Send + Sync,
    M::Statement: for<'q> LoadQuery<'q, diesel_async::AsyncPgConnection, M>,
{
    fn lock_bumped<'a>(
        conn: &'a mut diesel_async::AsyncPgConnection,
        key: &'a M::Key,
    ) -> BoxFuture<'a, Result<Option<M>, Error>> {
        use crate::optimistic::bump_on_lock::written_under_lock;
        use crate::transaction::journal::AsyncWatched;
        Box::pin(async move {
            // Where the database does not enforce the key, the two statements.
            if !M::key_is_unique(conn).await.map_err(classify)? {
                return Ok(None);
            }
            let row_id = M::row_id(conn, key).await.map_err(classify)?;
            let statement = M::locked_bump(key);
            let Some(mut row) = statement
                .get_result::<M>(conn)
                .await
                .optional()
                .map_err(classify)?
            else {
                return Ok(None);
            };
            // A row read under lock is written as read: `Plan::Write`.
            let next = super::versioned::move_past_reused::<M, _>(
                conn,
                key,
                row_id.as_deref(),
                row.version(),
            )
            .await?;
            let mark =
                written_under_lock::<M>(&mut AsyncWatched(conn), row_id.as_deref(), &row, next);
            if let Some(mark) = mark {
                M::mark(conn, mark).await.map_err(classify)?;
            }
            row.set_version(next);
            Ok(Some(row))
        })
    }
}
