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
//! [`AdaptivePolicy::per_table`]), a conflict score that decays with time:
//!
//! * each optimistic write that lost its race ([`Error::Stale`]) adds 1;
//! * each locked write whose lock took longer than
//!   [`contended_wait`](AdaptivePolicy::contended_wait) to get adds 1 (the
//!   writers now queue at the lock instead of colliding);
//! * the score halves every [`half_life`](AdaptivePolicy::half_life).
//!
//! At [`escalate_at`](AdaptivePolicy::escalate_at) the row turns
//! [`Mode::Locked`]; once the score has decayed below
//! [`calm_at`](AdaptivePolicy::calm_at) it turns [`Mode::Optimistic`] again.
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
//! races a call takes the lock whatever the score, so every call ends.
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
//! * Rows share scores by hash: a calm row that lands on a hot row's slot (one
//!   in [`SLOTS`]) is locked too. That costs speed, never correctness.
//! * The scores live in the process: each process learns on its own.
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
use crate::{classify, Error, LockOptions, Lockable, Versioned, WaitMode};

/// How many scores a policy keeps: rows are spread over them by hash.
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

/// Whether a policy scores each row or each table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Row,
    Table,
}

/// One score: its value when last touched, and the mode it set.
#[derive(Debug, Clone, Copy)]
struct Slot {
    score: f64,
    at: Option<Instant>,
    mode: Mode,
}

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
    /// Locked writes that waited longer than `contended_wait` for the lock.
    pub contended_locks: u64,
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
            contended_locks: self.contended_locks - earlier.contended_locks,
            escalations: self.escalations - earlier.escalations,
            de_escalations: self.de_escalations - earlier.de_escalations,
        }
    }
}

impl fmt::Display for AdaptiveStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} optimistic and {} locked writes, {} conflicts, {} contended locks, {} escalations, {} de-escalations",
            self.optimistic_writes,
            self.locked_writes,
            self.conflicts,
            self.contended_locks,
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
    contended_locks: AtomicU64,
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
    calm_at: f64,
    contended_wait: Duration,
    max_optimistic_attempts: u32,
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
    /// Per row; half-life 1 s; locked from a score of 3, optimistic again
    /// below 0.5; a lock that took over 2 ms counts as contended; at most 3
    /// optimistic attempts per call; the lock is `FOR UPDATE` with the server's
    /// timeout.
    pub fn new() -> Self {
        let slot = Slot {
            score: 0.0,
            at: None,
            mode: Mode::Optimistic,
        };
        AdaptivePolicy {
            half_life: Duration::from_secs(1),
            escalate_at: 3.0,
            calm_at: 0.5,
            contended_wait: Duration::from_millis(2),
            max_optimistic_attempts: 3,
            lock: LockOptions::default(),
            scope: Scope::Row,
            slots: (0..SLOTS).map(|_| Mutex::new(slot)).collect(),
            counters: Counters::default(),
        }
    }

    /// The process-wide policy that [`UpdateAdaptive::update_adaptive`] uses.
    pub fn global() -> &'static AdaptivePolicy {
        &GLOBAL
    }

    /// One score per table instead of per row: a table whose rows are hot in
    /// turn is locked as a whole.
    #[must_use]
    pub fn per_table(mut self) -> Self {
        self.scope = Scope::Table;
        self
    }

    /// How fast a score forgets: it halves every `half_life` (at least 1 ms).
    #[must_use]
    pub fn half_life(mut self, half_life: Duration) -> Self {
        self.half_life = half_life.max(Duration::from_millis(1));
        self
    }

    /// The score at which a row turns [`Mode::Locked`] (at least 1).
    #[must_use]
    pub fn escalate_at(mut self, score: f64) -> Self {
        self.escalate_at = score.max(1.0);
        self
    }

    /// The score below which a locked row turns [`Mode::Optimistic`] again
    /// (kept below `escalate_at`).
    #[must_use]
    pub fn calm_at(mut self, score: f64) -> Self {
        self.calm_at = score.max(0.0);
        self
    }

    /// A locked write that waited longer than this for its lock scores as a
    /// conflict.
    #[must_use]
    pub fn contended_wait(mut self, wait: Duration) -> Self {
        self.contended_wait = wait;
        self
    }

    /// Lost races after which a call takes the lock whatever the score (at
    /// least 1).
    #[must_use]
    pub fn max_optimistic_attempts(mut self, attempts: u32) -> Self {
        self.max_optimistic_attempts = attempts.max(1);
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
        self.touch(self.slot::<M>(key), Instant::now(), 0.0)
    }

    /// What this policy did since it was created.
    pub fn stats(&self) -> AdaptiveStats {
        let c = &self.counters;
        AdaptiveStats {
            optimistic_writes: c.optimistic_writes.load(Relaxed),
            locked_writes: c.locked_writes.load(Relaxed),
            conflicts: c.conflicts.load(Relaxed),
            contended_locks: c.contended_locks.load(Relaxed),
            escalations: c.escalations.load(Relaxed),
            de_escalations: c.de_escalations.load(Relaxed),
        }
    }

    /// Reads the row `key` of `M` fresh, runs `change` on it and writes it back
    /// version-checked, optimistically or under the row lock as the row's
    /// score says (see the [module docs](self)). Returns the row as written.
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
            && self.touch(slot, Instant::now(), 0.0) == Mode::Optimistic
        {
            let mut row = M::read(conn, key.clone())
                .map_err(classify)?
                .ok_or(Error::NotFound)?;
            change(&mut row)?;
            match row.write_versioned(conn) {
                Ok(()) => {
                    self.counters.optimistic_writes.fetch_add(1, Relaxed);
                    return Ok(row);
                }
                Err(Error::Stale(_)) => {
                    self.counters.conflicts.fetch_add(1, Relaxed);
                    self.touch(slot, Instant::now(), 1.0);
                    lost += 1;
                }
                Err(err) => return Err(err.into()),
            }
        }
        let started = Instant::now();
        let row = conn.locked_transaction(&self.lock, |conn| {
            let lock = self.lock.row_lock();
            let mut row = M::load_locked(conn, key, lock)
                .map_err(|err| lock.wait.classify(err))?
                .ok_or(Error::NotFound)?;
            let waited = started.elapsed();
            change(&mut row)?;
            // The row is locked: this write cannot be stale.
            row.write_versioned(conn)?;
            Ok::<_, E>((row, waited))
        });
        let (row, waited) = row?;
        self.counters.locked_writes.fetch_add(1, Relaxed);
        let contended = waited > self.contended_wait;
        if contended {
            self.counters.contended_locks.fetch_add(1, Relaxed);
        }
        self.touch(slot, Instant::now(), if contended { 1.0 } else { 0.0 });
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

    /// Decays the slot's score to `now`, adds `conflict`, moves its mode across
    /// the thresholds, and returns the mode.
    fn touch(&self, slot: usize, now: Instant, conflict: f64) -> Mode {
        let mut slot = self.slots[slot]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = slot.at {
            let halvings =
                now.saturating_duration_since(at).as_secs_f64() / self.half_life.as_secs_f64();
            slot.score *= 0.5f64.powf(halvings);
        }
        slot.score += conflict;
        slot.at = Some(now);
        let calm_at = self.calm_at.min(self.escalate_at / 2.0);
        match slot.mode {
            Mode::Optimistic if slot.score >= self.escalate_at => {
                slot.mode = Mode::Locked;
                self.counters.escalations.fetch_add(1, Relaxed);
                tracing::debug!(target: "lockkit", score = slot.score, "adaptive: locking a hot row");
            }
            Mode::Locked if slot.score < calm_at => {
                slot.mode = Mode::Optimistic;
                self.counters.de_escalations.fetch_add(1, Relaxed);
                tracing::debug!(target: "lockkit", score = slot.score, "adaptive: the row is calm again");
            }
            _ => {}
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
    /// optimistically or under the row lock as the row's score in
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
