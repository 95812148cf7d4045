//! The adaptive strategy: optimistic while a row is calm, locked while it is hot.
//!
//! Optimistic locking is the cheapest write when writers rarely meet: one read,
//! one checked `UPDATE`. On a hot row it is the most expensive: most writers
//! lose the race, read again and write again, and under enough writers some
//! never win. A row lock is the other way round: a transaction and a locked
//! read per write, but one write per writer whatever the contention. Which one
//! fits changes with the load, row by row.
//!
//! [`AdaptivePolicy::update`] (and [`UpdateAdaptive::update_adaptive`] on a
//! loaded model) picks for you. It keeps, per row (or per table, see
//! [`AdaptivePolicy::per_table`]), the **conflict rate** of its optimistic
//! writes: of the recent attempts, the share that lost the race
//! ([`Error::Stale`]). Both counts halve every
//! [`half_life`](AdaptivePolicy::half_life), so old conflicts fade.
//!
//! * Once at least [`min_attempts`](AdaptivePolicy::min_attempts) recent
//!   attempts have a conflict rate of [`escalate_at`](AdaptivePolicy::escalate_at)
//!   or more (by default: 8 attempts, three quarters of them lost), the row turns
//!   [`Mode::Locked`].
//! * After [`locked_for`](AdaptivePolicy::locked_for) it turns
//!   [`Mode::Optimistic`] again and measures afresh: a row that is still hot
//!   is locked again after a few lost races, a row that calmed down stays
//!   optimistic. (Under the lock nobody loses a race, so the rate cannot be
//!   measured there; lock waits are no measure either: on PostgreSQL many
//!   writers queue at a hot row's lock while optimistic writes would still win
//!   most races.)
//!
//! Either way your closure runs against a **fresh** row, read in the same call,
//! and the row is written with [`Versioned::update_versioned`]:
//!
//! ```sql
//! -- Mode::Optimistic: a lost race reads again (and may escalate)
//! SELECT items.id, items.name, items.stock, items.lock_version FROM items WHERE items.id = $1;
//! UPDATE items SET name = $1, stock = $2, lock_version = lock_version + 1
//!  WHERE items.id = $3 AND items.lock_version = $4;
//!
//! -- Mode::Locked
//! BEGIN;                                            -- SQLite: BEGIN IMMEDIATE
//! SELECT .. FROM items WHERE items.id = $1 FOR UPDATE; -- SQLite: no clause
//! UPDATE items SET .. WHERE items.id = $3 AND items.lock_version = $4;
//! COMMIT;
//! ```
//!
//! The versioned `UPDATE` is the write in both modes, so the two mix safely: an
//! optimistic writer racing a locked one loses with `Stale` and reads again,
//! and a locked writer can never be stale (nobody writes the locked row). After
//! [`max_optimistic_attempts`](AdaptivePolicy::max_optimistic_attempts) lost
//! races a call takes the lock whatever the rate, so every call ends.
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//! use lockkit::adaptive::{AdaptivePolicy, Mode};
//! # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
//! #[derive(Queryable, Selectable, Versioned, Debug)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
//!
//! # fn main() -> Result<(), lockkit::Error> {
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn)?;
//! // The process-wide policy, on a loaded model:
//! let mut item = items::table.find(1).first::<Item>(&mut conn)?;
//! item.update_adaptive(&mut conn, |fresh| {
//!     fresh.stock -= 1;
//!     Ok::<_, lockkit::Error>(())
//! })?;
//! assert_eq!((item.stock, item.lock_version), (9, 1));
//!
//! // A policy of your own, by key:
//! let policy = AdaptivePolicy::new();
//! let item: Item = policy.update(&mut conn, 1, |fresh: &mut Item| {
//!     fresh.stock -= 1;
//!     Ok::<_, lockkit::Error>(())
//! })?;
//! assert_eq!(item.stock, 8);
//! assert_eq!(policy.mode::<Item>(&1), Mode::Optimistic); // no conflict yet
//! # Ok(()) }
//! ```
//!
//! What holds and what does not:
//!
//! * No update is lost in either mode, nor while the modes change: every write
//!   is version-checked.
//! * The closure may run more than once (once per optimistic attempt): keep it
//!   free of side effects outside the row. It sees no connection; for work that
//!   must happen in the row's transaction, use [`Lockable::with_lock`].
//! * Rows share rates by hash: a calm row that lands on a hot row's slot (one
//!   in [`SLOTS`]) is locked too. That costs speed, never correctness.
//! * The rates live in the process: each process learns on its own.
//! * On `PgConnection`, `MysqlConnection` and `SqliteConnection` (and r2d2
//!   pooled connections to them), not on [`Dispatch`](crate::multi::Dispatch)
//!   enums.
//! * Inside a transaction you opened, a `REPEATABLE READ` snapshot cannot see
//!   other writers' rows: the optimistic attempts then stay stale until the
//!   call takes the lock, which reads the latest row.

// Without a backend feature no connection implements `AdaptiveRow`, and the
// pieces it is built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

use std::fmt::{self, Write as _};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use diesel::dsl::{AsSelect, Find, Select};
use diesel::expression::Expression;
use diesel::query_builder::{AsChangeset, IntoUpdateTarget, QueryFragment, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, FindDsl, SelectDsl};
use diesel::query_dsl::LoadQuery;
use diesel::QuerySource;
use diesel::{OptionalExtension, RunQueryDsl, Selectable, SelectableHelper};

use crate::optimistic::version_check::{CurrentVersionQuery, UpdateVersioned, VersionCheck};
use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
use crate::pessimistic::lockable::LockRow;
use crate::{classify, Error, LockOptions, Lockable, RetryPolicy, Versioned, WaitMode};

/// How many rates a policy keeps: rows are spread over them by hash.
pub const SLOTS: usize = 1024;

/// How a row is written now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Read, change, versioned `UPDATE`; a lost race reads again.
    #[default]
    Optimistic,
    /// A transaction with the row locked (`FOR UPDATE`; SQLite: `BEGIN
    /// IMMEDIATE`), then the versioned `UPDATE`.
    Locked,
}

/// Whether a policy keeps a rate per row or per table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Row,
    Table,
}

/// One row's (or table's) recent optimistic attempts, and its mode.
#[derive(Debug, Clone, Copy)]
struct Slot {
    attempts: f64,
    conflicts: f64,
    at: Option<Instant>,
    mode: Mode,
    locked_until: Option<Instant>,
}

const CALM: Slot = Slot {
    attempts: 0.0,
    conflicts: 0.0,
    at: None,
    mode: Mode::Optimistic,
    locked_until: None,
};

/// What a policy did, since it was created ([`AdaptivePolicy::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveStats {
    /// Rows written by the optimistic path.
    pub optimistic_writes: u64,
    /// Rows written under the row lock.
    pub locked_writes: u64,
    /// Optimistic writes that lost their race (each read again).
    pub conflicts: u64,
    /// Times a row (or table) turned [`Mode::Locked`].
    pub escalations: u64,
    /// Times it turned [`Mode::Optimistic`] again.
    pub de_escalations: u64,
}

impl AdaptiveStats {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &AdaptiveStats) -> AdaptiveStats {
        AdaptiveStats {
            optimistic_writes: self.optimistic_writes - earlier.optimistic_writes,
            locked_writes: self.locked_writes - earlier.locked_writes,
            conflicts: self.conflicts - earlier.conflicts,
            escalations: self.escalations - earlier.escalations,
            de_escalations: self.de_escalations - earlier.de_escalations,
        }
    }
}

impl fmt::Display for AdaptiveStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} optimistic and {} locked writes, {} conflicts, {} escalations, {} de-escalations",
            self.optimistic_writes,
            self.locked_writes,
            self.conflicts,
            self.escalations,
            self.de_escalations
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    optimistic_writes: AtomicU64,
    locked_writes: AtomicU64,
    conflicts: AtomicU64,
    escalations: AtomicU64,
    de_escalations: AtomicU64,
}

/// When to switch between optimistic writes and row locks; see the
/// [module docs](self). Share one policy between the threads that write the
/// same rows (it is `Sync`); [`AdaptivePolicy::global`] is the process's.
#[derive(Debug)]
pub struct AdaptivePolicy {
    half_life: Duration,
    escalate_at: f64,
    min_attempts: f64,
    locked_for: Duration,
    max_optimistic_attempts: u32,
    backoff: RetryPolicy,
    lock: LockOptions,
    scope: Scope,
    slots: Box<[Mutex<Slot>]>,
    counters: Counters,
}

impl Default for AdaptivePolicy {
    fn default() -> Self {
        AdaptivePolicy::new()
    }
}

static GLOBAL: LazyLock<AdaptivePolicy> = LazyLock::new(AdaptivePolicy::new);

impl AdaptivePolicy {
    /// Per row; counts halve every second; locked once 8 recent attempts lost
    /// three quarters of their races, for one second; at most 3 optimistic
    /// attempts per call, with a jittered wait from 1 ms between them; the
    /// lock is `FOR UPDATE` with the server's timeout.
    pub fn new() -> Self {
        AdaptivePolicy {
            half_life: Duration::from_secs(1),
            escalate_at: 0.75,
            min_attempts: 8.0,
            locked_for: Duration::from_secs(1),
            max_optimistic_attempts: 3,
            backoff: RetryPolicy::default()
                .base_delay(Duration::from_millis(1))
                .max_delay(Duration::from_millis(20)),
            lock: LockOptions::default(),
            scope: Scope::Row,
            slots: (0..SLOTS).map(|_| Mutex::new(CALM)).collect(),
            counters: Counters::default(),
        }
    }

    /// The process-wide policy that [`UpdateAdaptive::update_adaptive`] uses.
    pub fn global() -> &'static AdaptivePolicy {
        &GLOBAL
    }

    /// One rate per table instead of per row: a table whose rows are hot in
    /// turn is locked as a whole.
    #[must_use]
    pub fn per_table(mut self) -> Self {
        self.scope = Scope::Table;
        self
    }

    /// How fast the counts forget: they halve every `half_life` (at least 1 ms).
    #[must_use]
    pub fn half_life(mut self, half_life: Duration) -> Self {
        self.half_life = half_life.max(Duration::from_millis(1));
        self
    }

    /// The conflict rate (lost races per optimistic attempt, from 0 to 1) at
    /// which a row turns [`Mode::Locked`].
    #[must_use]
    pub fn escalate_at(mut self, rate: f64) -> Self {
        self.escalate_at = rate.clamp(0.0, 1.0);
        self
    }

    /// How many recent attempts the rate needs before it counts (at least 1).
    #[must_use]
    pub fn min_attempts(mut self, attempts: u32) -> Self {
        self.min_attempts = f64::from(attempts.max(1));
        self
    }

    /// How long a row stays [`Mode::Locked`] before it is tried optimistically
    /// again.
    #[must_use]
    pub fn locked_for(mut self, locked_for: Duration) -> Self {
        self.locked_for = locked_for;
        self
    }

    /// Lost races after which a call takes the lock whatever the rate (at
    /// least 1).
    #[must_use]
    pub fn max_optimistic_attempts(mut self, attempts: u32) -> Self {
        self.max_optimistic_attempts = attempts.max(1);
        self
    }

    /// The wait before the next optimistic attempt after a lost race: by
    /// default a random part of 1 ms, doubling per lost race (up to 20 ms), so
    /// that the losers do not meet again at once. Only its delays are used;
    /// [`max_optimistic_attempts`](Self::max_optimistic_attempts) bounds the
    /// attempts. [`RetryPolicy::immediate`] does not wait.
    #[must_use]
    pub fn backoff(mut self, backoff: RetryPolicy) -> Self {
        self.backoff = backoff;
        self
    }

    /// The options of the locked path (a timeout, `nowait()`); the strength is
    /// always an exclusive `FOR UPDATE`, and `skip_locked()` acts as `nowait()`
    /// (a skipped row would read as absent).
    #[must_use]
    pub fn lock_options(mut self, options: LockOptions) -> Self {
        let options = options.strength(crate::LockStrength::Update);
        self.lock = match options.wait_mode() {
            WaitMode::SkipLocked => options.nowait(),
            _ => options,
        };
        self
    }

    /// The mode the row `key` of `M` is written in now.
    pub fn mode<M: Lockable>(&self, key: &M::Key) -> Mode {
        self.touch(self.slot::<M>(key), Instant::now(), None)
    }

    /// What this policy did since it was created.
    pub fn stats(&self) -> AdaptiveStats {
        let c = &self.counters;
        AdaptiveStats {
            optimistic_writes: c.optimistic_writes.load(Relaxed),
            locked_writes: c.locked_writes.load(Relaxed),
            conflicts: c.conflicts.load(Relaxed),
            escalations: c.escalations.load(Relaxed),
            de_escalations: c.de_escalations.load(Relaxed),
        }
    }

    /// Reads the row `key` of `M` fresh, runs `change` on it and writes it back
    /// version-checked, optimistically or under the row lock as the row's
    /// conflict rate says (see the [module docs](self)). Returns the row as
    /// written.
    ///
    /// `change` may run more than once; its `Err` ends the call at once,
    /// nothing written, and comes back to you untouched.
    ///
    /// # Errors
    ///
    /// * [`Error::NotFound`] when no row has the key.
    /// * [`Error::LockTimeout`], [`Error::Deadlock`] or [`Error::Busy`] from the
    ///   locked path (`Busy` with `nowait()` in
    ///   [`lock_options`](Self::lock_options)).
    /// * [`Error::VersionOverflow`] when the version is at its type's maximum.
    /// * any other classified database error; see [`classify`](crate::classify()).
    /// * whatever `change` returns.
    pub fn update<M, C, E, F>(&self, conn: &mut C, key: M::Key, mut change: F) -> Result<M, E>
    where
        C: AsLockingConnection,
        M: AdaptiveRow<C::Conn>,
        E: From<Error>,
        F: FnMut(&mut M) -> Result<(), E>,
    {
        let conn = conn.locking_connection();
        let slot = self.slot::<M>(&key);
        let mut lost = 0;
        while lost < self.max_optimistic_attempts
            && self.touch(slot, Instant::now(), None) == Mode::Optimistic
        {
            let mut row = M::read(conn, key.clone())
                .map_err(classify)?
                .ok_or(Error::NotFound)?;
            change(&mut row)?;
            match row.write_versioned(conn) {
                Ok(()) => {
                    self.counters.optimistic_writes.fetch_add(1, Relaxed);
                    self.touch(slot, Instant::now(), Some(false));
                    return Ok(row);
                }
                Err(Error::Stale(_)) => {
                    self.counters.conflicts.fetch_add(1, Relaxed);
                    lost += 1;
                    let mode = self.touch(slot, Instant::now(), Some(true));
                    if mode == Mode::Optimistic && lost < self.max_optimistic_attempts {
                        let wait = self.backoff.delay_after(lost);
                        if !wait.is_zero() {
                            std::thread::sleep(wait);
                        }
                    }
                }
                Err(err) => return Err(err.into()),
            }
        }
        let row = conn.locked_transaction(&self.lock, |conn| {
            let lock = self.lock.row_lock();
            let mut row = M::load_locked(conn, key, lock)
                .map_err(|err| lock.wait.classify(err))?
                .ok_or(Error::NotFound)?;
            change(&mut row)?;
            // The row is locked: this write cannot be stale.
            row.write_versioned(conn)?;
            Ok::<_, E>(row)
        })?;
        self.counters.locked_writes.fetch_add(1, Relaxed);
        Ok(row)
    }

    /// The slot of the row `key` of `M` (or of its table).
    fn slot<M: Lockable>(&self, key: &M::Key) -> usize {
        let mut hasher = DefaultHasher::new();
        M::TABLE_NAME.hash(&mut hasher);
        if self.scope == Scope::Row {
            // The key is only `Debug`: hash what it prints, without allocating.
            let _ = write!(HashWriter(&mut hasher), "{key:?}");
        }
        (hasher.finish() % SLOTS as u64) as usize
    }

    /// Decays the slot's counts to `now`, ends a lock period that is over,
    /// counts an optimistic attempt (`Some(lost)`), locks the row when its
    /// conflict rate calls for it, and returns the mode.
    fn touch(&self, slot: usize, now: Instant, attempt: Option<bool>) -> Mode {
        let mut slot = self.slots[slot]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = slot.at {
            let halvings =
                now.saturating_duration_since(at).as_secs_f64() / self.half_life.as_secs_f64();
            let keep = 0.5f64.powf(halvings);
            slot.attempts *= keep;
            slot.conflicts *= keep;
        }
        slot.at = Some(now);
        if slot.mode == Mode::Locked && slot.locked_until.is_some_and(|until| now >= until) {
            // Measure afresh: the rate from before the lock is stale news.
            *slot = Slot {
                at: Some(now),
                ..CALM
            };
            self.counters.de_escalations.fetch_add(1, Relaxed);
            tracing::debug!(target: "lockkit", "adaptive: trying a locked row optimistically again");
        }
        if let Some(lost) = attempt {
            slot.attempts += 1.0;
            slot.conflicts += if lost { 1.0 } else { 0.0 };
        }
        if slot.mode == Mode::Optimistic
            // The counts decay between attempts: allow for that.
            && slot.attempts >= self.min_attempts - 0.5
            && slot.conflicts >= self.escalate_at * slot.attempts
            && slot.conflicts > 0.0
        {
            slot.mode = Mode::Locked;
            slot.locked_until = now.checked_add(self.locked_for);
            self.counters.escalations.fetch_add(1, Relaxed);
            tracing::debug!(target: "lockkit", attempts = slot.attempts, conflicts = slot.conflicts,
                "adaptive: locking a hot row");
        }
        slot.mode
    }
}

/// Feeds what a key prints into a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// [`AdaptivePolicy::update`] on a loaded model, with the process-wide policy.
/// In the [prelude](crate::prelude).
pub trait UpdateAdaptive: Versioned {
    /// Reads this row fresh, runs `change` on it and writes it back,
    /// optimistically or under the row lock as the row's conflict rate in
    /// [`AdaptivePolicy::global`] says; on success `self` becomes the row as
    /// written. See [`AdaptivePolicy::update`] for the errors.
    ///
    /// # Errors
    ///
    /// Those of [`AdaptivePolicy::update`]; `self` is unchanged then.
    fn update_adaptive<C, E, F>(&mut self, conn: &mut C, change: F) -> Result<(), E>
    where
        C: AsLockingConnection,
        Self: AdaptiveRow<C::Conn>,
        E: From<Error>,
        F: FnMut(&mut Self) -> Result<(), E>,
    {
        *self = AdaptivePolicy::global().update(conn, self.key(), change)?;
        Ok(())
    }
}

impl<M: Versioned> UpdateAdaptive for M {}

/// What [`AdaptivePolicy::update`] needs of a model on a connection: a plain
/// read by key, the locked read of [`Lockable::with_lock`] and
/// [`Versioned::update_versioned`]. Implemented for every `#[derive(Versioned)]`
/// model that is `Selectable` on the connection's backend; name it only in
/// `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`{Self}` rows cannot be written adaptively on `{Conn}`",
    label = "not a versioned, selectable model on this connection",
    note = "adaptive writes need `#[derive(Queryable, Selectable, Versioned)]` for the connection's backend"
)]
pub trait AdaptiveRow<Conn: LockingConnection>: LockRow<Conn> + Versioned {
    /// `SELECT <fields> FROM <table> WHERE <key>`, unlocked.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified.
    fn read(conn: &mut Conn, key: Self::Key) -> diesel::QueryResult<Option<Self>>;
    /// [`Versioned::update_versioned`].
    ///
    /// # Errors
    ///
    /// Those of [`Versioned::update_versioned`].
    fn write_versioned(&mut self, conn: &mut Conn) -> Result<(), Error>;
}

type ByKey<M, DB> = Select<Find<<M as Lockable>::Table, <M as Lockable>::Key>, AsSelect<M, DB>>;

/// Implements [`AdaptiveRow`] for every model that fits, on each connection.
macro_rules! adaptive_row_on {
    ($($conn:ty, $db:ty, $feature:literal);*) => {$(
        #[cfg(feature = $feature)]
        impl<M> AdaptiveRow<$conn> for M
        where
            M: LockRow<$conn> + Versioned + VersionCheck + CurrentVersionQuery<$conn>,
            M: Selectable<$db>,
            AsSelect<M, $db>: Expression,
            M::Table: FindDsl<M::Key>,
            Find<M::Table, M::Key>: SelectDsl<AsSelect<M, $db>>,
            ByKey<M, $db>: for<'q> LoadQuery<'q, $conn, M>,
            for<'a> UpdateVersioned<M, M::Changeset<'a>>: ExecuteDsl<$conn>,
            for<'a> (M::Changeset<'a>, M::Bump): AsChangeset<Target = M::Table>,
            // The parts of the statement above, which the compiler cannot see
            // through the higher-ranked bound.
            M::Table: QueryId,
            <M::Table as QuerySource>::FromClause: QueryFragment<$db>,
            <M::Target as IntoUpdateTarget>::WhereClause: QueryFragment<$db> + QueryId,
            M::Bump: QueryId,
            for<'a> <(M::Changeset<'a>, M::Bump) as AsChangeset>::Changeset: QueryFragment<$db>,
        {
            fn read(conn: &mut $conn, key: M::Key) -> diesel::QueryResult<Option<M>> {
                M::Table::default()
                    .find(key)
                    .select(M::as_select())
                    .get_result(conn)
                    .optional()
            }

            fn write_versioned(&mut self, conn: &mut $conn) -> Result<(), Error> {
                Versioned::update_versioned(self, conn)
            }
        }
    )*};
}

adaptive_row_on!(
    diesel::PgConnection, diesel::pg::Pg, "postgres";
    diesel::MysqlConnection, diesel::mysql::Mysql, "mysql";
    diesel::SqliteConnection, diesel::sqlite::Sqlite, "sqlite"
);
