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
//! loaded model) picks for you, per row (or per table, see
//! [`AdaptivePolicy::per_table`]), by **measuring both**: which mode writes
//! the row more often per second under the load it has now.
//!
//! * A row starts [`Mode::Optimistic`], and stays so while few of its recent
//!   optimistic writes lose the race ([`Error::Stale`]): a calm row never pays
//!   for a lock. The counts halve every [`half_life`](AdaptivePolicy::half_life),
//!   so old conflicts fade.
//! * Once at least [`min_attempts`](AdaptivePolicy::min_attempts) recent
//!   attempts have a conflict rate of [`escalate_at`](AdaptivePolicy::escalate_at)
//!   or more (by default: 8 attempts, three quarters of them lost), the row is
//!   locked for a **trial** of [`trial`](AdaptivePolicy::trial) (100 ms), once
//!   the optimistic period has lasted [`min_period`](AdaptivePolicy::min_period)
//!   (100 ms: writers that start together lose a burst of races that says
//!   nothing of the rate once the losers back off). The rows
//!   written per second during the trial are compared with those of the
//!   optimistic period before it.
//! * If the lock wrote more (by a tenth or more), the row stays
//!   [`Mode::Locked`] for [`locked_for`](AdaptivePolicy::locked_for) (1 s),
//!   then turns optimistic to measure afresh. If not, it turns optimistic at
//!   once, and the next trial waits: 1 s after a lost trial, doubling with each
//!   one lost in a row up to 32 s, so that a row where optimistic writes win
//!   (often the case: on PostgreSQL many writers queue at a hot row's lock
//!   while optimistic writes with backoff still win most races) spends a few
//!   per cent of its time on trials at most.
//!
//! A high conflict rate alone is no reason to lock: losers that back off
//! leave the row to the others, and the row may still be written more often
//! than the lock allows. Only the measured throughput decides.
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
//! races (8) a call takes the lock whatever the mode, so every call ends. That
//! last resort is costly on a hot row: the locked write holds the row over four
//! round trips, and every optimistic writer that read the row meanwhile loses
//! its race. So a call races a few more times than
//! [`retry`](crate::retry())'s default 5 attempts before it locks, and waits at
//! most 80 ms between attempts (the losers back off, and one call does not sleep
//! for long). Where a hot row stays optimistic, a quarter to a half of the
//! races are lost: at most 1 call in 256 then loses 8 in a row, against 1 in
//! 32 losing 5 (and each locked write makes more writers lose: the benchmark
//! measured 2 to 9% of the writes locked with 5).
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
//! * On `PgConnection`, `MysqlConnection` and `SqliteConnection`, on
//!   [`Dispatch`](crate::multi::Dispatch) enums (the reads and the lock go to
//!   the connection inside, the versioned write through the enum), and on r2d2
//!   pooled connections to them.
//! * Inside a transaction you opened, a lost race is tried again without a
//!   backoff (which would sleep holding the transaction's locks). A
//!   `REPEATABLE READ` snapshot cannot see other writers' rows: when the read
//!   returns the version that just lost, the call takes the lock at once (on
//!   MySQL/MariaDB the locked read is the latest row's). On PostgreSQL the
//!   first write to a row that another transaction changed since the snapshot
//!   fails with [`Error::SerializationFailure`], and on MariaDB with
//!   `innodb_snapshot_isolation` (the default from 11.6.2) with
//!   [`Error::Deadlock`] (1020, which rolls back the whole transaction): both
//!   retryable, by running the whole transaction again.

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

use crate::error::classification::classify;
use crate::error::Error;
use crate::optimistic::sequence::Origin;
use crate::optimistic::versioned::{
    update_from, CurrentVersionQuery, UpdateVersioned, VersionCheck, Versioned,
};
use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
use crate::pessimistic::lockable::{load_held, LockRow, Lockable};
use crate::pessimistic::options::LockOptions;
use crate::pessimistic::row_lock::{LockStrength, WaitMode};
use crate::retry::RetryPolicy;

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

/// One row's (or table's) recent history, and its mode.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Recent optimistic attempts and the races they lost; with `writes`,
    /// they halve every `half_life`.
    attempts: f64,
    conflicts: f64,
    /// Rows written since the current mode began (by either path).
    writes: f64,
    /// When the counts were last brought up to date.
    at: Option<Instant>,
    mode: Mode,
    /// When the current mode began.
    since: Option<Instant>,
    /// While [`Mode::Locked`]: when the locked period ends, and whether it is
    /// a trial (compared with `optimistic_rate` at its end).
    locked_until: Option<Instant>,
    trial: bool,
    /// Rows per second in the optimistic period before the trial.
    optimistic_rate: f64,
    /// No trial before this; and the wait after the next lost trial.
    next_trial: Option<Instant>,
    trial_wait: Duration,
}

const CALM: Slot = Slot {
    attempts: 0.0,
    conflicts: 0.0,
    writes: 0.0,
    at: None,
    mode: Mode::Optimistic,
    since: None,
    locked_until: None,
    trial: false,
    optimistic_rate: 0.0,
    next_trial: None,
    trial_wait: FIRST_TRIAL_WAIT,
};

/// The wait before the next trial after a lost one, doubling per trial lost
/// in a row up to [`LAST_TRIAL_WAIT`].
const FIRST_TRIAL_WAIT: Duration = Duration::from_secs(1);
const LAST_TRIAL_WAIT: Duration = Duration::from_secs(32);

/// How much more a trial must write than the optimistic period before it for
/// the row to stay locked: a tie goes to the mode that holds no lock.
const LOCK_MUST_WIN_BY: f64 = 1.1;

/// What [`AdaptivePolicy::touch`] is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Nothing happened; only the mode is wanted.
    Ask,
    /// An optimistic attempt that wrote the row (`lost: false`) or lost the
    /// race.
    Optimistic { lost: bool },
    /// A row written under the lock.
    Locked,
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
    /// Times a row (or table) turned [`Mode::Locked`] for a trial of the lock.
    pub escalations: u64,
    /// Times it turned [`Mode::Optimistic`] again (after a lost trial, or
    /// after a locked period to measure afresh).
    pub de_escalations: u64,
}

impl AdaptiveStats {
    /// What happened between `earlier` and `self`. Each count is at least 0:
    /// stats taken in the other order, or from another policy, never panic.
    pub fn since(&self, earlier: &AdaptiveStats) -> AdaptiveStats {
        AdaptiveStats {
            optimistic_writes: self
                .optimistic_writes
                .saturating_sub(earlier.optimistic_writes),
            locked_writes: self.locked_writes.saturating_sub(earlier.locked_writes),
            conflicts: self.conflicts.saturating_sub(earlier.conflicts),
            escalations: self.escalations.saturating_sub(earlier.escalations),
            de_escalations: self.de_escalations.saturating_sub(earlier.de_escalations),
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
///
/// A policy of your own, quick to judge, with a rival writer on a second
/// connection that wins the first race:
///
/// ```
/// use std::time::Duration;
/// use diesel::prelude::*;
/// use lockkit::adaptive::{AdaptivePolicy, Mode};
/// use lockkit::prelude::*;
/// use lockkit::{LockOptions, RetryPolicy};
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
/// # #[derive(Queryable, Selectable, Versioned, Debug)]
/// # #[diesel(table_name = items)]
/// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
///
/// # fn main() -> Result<(), lockkit::Error> {
/// let policy = AdaptivePolicy::new()
///     .half_life(Duration::from_secs(60)) // conflicts fade slowly
///     .min_attempts(2) // a rate from 2 attempts on
///     .escalate_at(0.3) // try the lock once 30% of the races are lost
///     .min_period(Duration::ZERO)
///     .trial(Duration::from_secs(60))
///     .locked_for(Duration::from_secs(60))
///     .max_optimistic_attempts(1) // one lost race, then the lock
///     .backoff(RetryPolicy::immediate(1))
///     .lock_options(LockOptions::default().timeout(Duration::from_secs(2)));
///
/// // Two connections to one in-memory database.
/// let url = "file:adaptive?mode=memory&cache=shared";
/// let mut conn = SqliteConnection::establish(url).unwrap();
/// let mut rival = SqliteConnection::establish(url).unwrap();
/// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
/// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn)?;
/// let mut first = true;
/// let item: Item = policy.update(&mut conn, 1, |fresh: &mut Item| {
///     if std::mem::take(&mut first) {
///         // the rival sells one between our read and our write
///         diesel::sql_query("UPDATE items SET stock = stock - 1, lock_version = lock_version + 1")
///             .execute(&mut rival)?;
///     }
///     fresh.stock -= 1;
///     Ok::<_, lockkit::Error>(())
/// })?;
/// assert_eq!(item.stock, 8); // both sales, none lost
/// let stats = policy.stats();
/// assert_eq!((stats.conflicts, stats.locked_writes), (1, 1)); // lost once, then locked
///
/// // One more write, uncontested: 1 race lost in 2 attempts is over 30%,
/// // so the row is locked for a trial.
/// policy.update(&mut conn, 1, |fresh: &mut Item| {
///     fresh.stock -= 1;
///     Ok::<_, lockkit::Error>(())
/// })?;
/// assert_eq!(policy.mode::<Item>(&1), Mode::Locked);
/// assert_eq!(policy.stats().escalations, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AdaptivePolicy {
    half_life: Duration,
    escalate_at: f64,
    min_attempts: f64,
    min_period: Duration,
    trial: Duration,
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
    /// Per row; counts halve every second; a 100 ms trial of the lock once 8
    /// recent attempts lost three quarters of their races (after 100 ms of
    /// optimistic writes at least), and locked for one
    /// second when the trial wrote more; 8 optimistic attempts per call at
    /// most, with [`RetryPolicy::default`]'s jittered waits between them capped
    /// at 80 ms; the lock is `FOR UPDATE` with the server's timeout.
    pub fn new() -> Self {
        AdaptivePolicy {
            half_life: Duration::from_secs(1),
            escalate_at: 0.75,
            min_attempts: 8.0,
            min_period: Duration::from_millis(100),
            trial: Duration::from_millis(100),
            locked_for: Duration::from_secs(1),
            max_optimistic_attempts: 8,
            backoff: RetryPolicy::default().max_delay(Duration::from_millis(80)),
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
    /// which a row's lock is tried (see [`trial`](Self::trial)).
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

    /// How long a row must have been written optimistically before its
    /// rate is compared with a trial of the lock (100 ms by default; zero
    /// tries the lock as soon as the conflict rate says so). Writers that
    /// start together lose a burst of races at first, and the rate over those
    /// few milliseconds says nothing of the rate once the losers back off.
    #[must_use]
    pub fn min_period(mut self, period: Duration) -> Self {
        self.min_period = period;
        self
    }

    /// How long a trial of the lock lasts: the row is [`Mode::Locked`] that
    /// long, then stays locked only if it was written more often than in the
    /// optimistic period before (at least 1 ms).
    #[must_use]
    pub fn trial(mut self, trial: Duration) -> Self {
        self.trial = trial.max(Duration::from_millis(1));
        self
    }

    /// How long a row stays [`Mode::Locked`] after the lock won its trial,
    /// before it is measured optimistically again (`Duration::MAX`: for ever).
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
    /// default [`RetryPolicy::default`]'s (a random part of 10 ms, doubling per
    /// lost race) up to 80 ms, so that the losers do not meet again at once and
    /// leave the row to the others meanwhile. Only its delays are used;
    /// [`max_optimistic_attempts`](Self::max_optimistic_attempts) bounds the
    /// attempts. [`RetryPolicy::immediate`] does not wait.
    #[must_use]
    pub fn backoff(mut self, backoff: RetryPolicy) -> Self {
        self.backoff = backoff;
        self
    }

    /// The options of the locked path (a timeout, `nowait()`); the strength is
    /// always an exclusive `FOR UPDATE`, and `skip_locked()` acts as `nowait()`
    /// (both make a held row [`Error::Busy`]; `NOWAIT` says
    /// so in one statement, where `SKIP LOCKED` needs a second to ask whether
    /// the row it left out exists).
    #[must_use]
    pub fn lock_options(mut self, options: LockOptions) -> Self {
        let options = options.strength(LockStrength::Update);
        self.lock = match options.wait_mode() {
            WaitMode::SkipLocked => options.nowait(),
            _ => options,
        };
        self
    }

    /// The mode the row `key` of `M` is written in now.
    pub fn mode<M: Lockable>(&self, key: &M::Key) -> Mode {
        self.touch(self.slot::<M>(key), Instant::now(), Event::Ask)
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
    /// measurements say (see the [module docs](self)). Returns the row as
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
        // Inside a transaction of the caller's, a lost race is tried again at
        // once: a backoff would sleep holding the transaction's locks.
        let nested = crate::transaction::in_transaction(conn);
        let slot = self.slot::<M>(&key);
        let mut lost = 0;
        let mut lost_with = None;
        while lost < self.max_optimistic_attempts
            && self.touch(slot, Instant::now(), Event::Ask) == Mode::Optimistic
        {
            let mut row = M::read(conn, key.clone())
                .map_err(classify)?
                .ok_or(Error::NotFound)?;
            // The version that just lost, read again, cannot win: a snapshot
            // of the caller's transaction (`REPEATABLE READ`, MySQL/MariaDB's
            // default) that does not show the winner. The locked read is the
            // latest row's.
            if lost_with == Some(row.version()) {
                break;
            }
            change(&mut row)?;
            let version = row.version();
            match row.write_fresh(conn) {
                Ok(()) => {
                    self.counters.optimistic_writes.fetch_add(1, Relaxed);
                    self.touch(slot, Instant::now(), Event::Optimistic { lost: false });
                    return Ok(row);
                }
                Err(Error::Stale(_)) => {
                    self.counters.conflicts.fetch_add(1, Relaxed);
                    lost += 1;
                    lost_with = Some(version);
                    let mode = self.touch(slot, Instant::now(), Event::Optimistic { lost: true });
                    if !nested && mode == Mode::Optimistic && lost < self.max_optimistic_attempts {
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
            let mut row =
                load_held::<M, _>(conn, key, self.lock.row_lock())?.ok_or(Error::NotFound)?;
            change(&mut row)?;
            // The row is locked: this write cannot be stale.
            row.write_fresh(conn)?;
            Ok::<_, E>(row)
        })?;
        self.counters.locked_writes.fetch_add(1, Relaxed);
        self.touch(slot, Instant::now(), Event::Locked);
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

    /// Brings the slot's counts up to `now`, counts `event`, ends a locked
    /// period that is over (keeping the lock if it won its trial), starts a
    /// trial when the conflict rate calls for one, and returns the mode.
    fn touch(&self, slot: usize, now: Instant, event: Event) -> Mode {
        let mut slot = self.slots[slot]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let half_life = self.half_life.as_secs_f64();
        if let Some(at) = slot.at {
            let keep = 0.5f64.powf(now.saturating_duration_since(at).as_secs_f64() / half_life);
            slot.attempts *= keep;
            slot.conflicts *= keep;
            slot.writes *= keep;
        }
        slot.at = Some(now);
        let since = *slot.since.get_or_insert(now);
        match event {
            Event::Ask => {}
            Event::Optimistic { lost } => {
                slot.attempts += 1.0;
                if lost {
                    slot.conflicts += 1.0;
                } else {
                    slot.writes += 1.0;
                }
            }
            Event::Locked => slot.writes += 1.0,
        }

        let over = slot
            .locked_until
            .filter(|until| slot.mode == Mode::Locked && now >= *until);
        if let Some(until) = over {
            let rate = self.rate(slot.writes, now.saturating_duration_since(since));
            let won = slot.trial && rate > slot.optimistic_rate * LOCK_MUST_WIN_BY;
            // A won trial keeps the lock for `locked_for` from the trial's end
            // (`None`: past the clock's end, for ever).
            let keep_until = won
                .then(|| until.checked_add(self.locked_for))
                .filter(|keep_until| keep_until.is_none_or(|keep_until| now < keep_until));
            if let Some(keep_until) = keep_until {
                slot.trial = false;
                slot.locked_until = keep_until;
                slot.trial_wait = FIRST_TRIAL_WAIT;
                tracing::debug!(target: "lockkit", locked = rate, optimistic = slot.optimistic_rate,
                    "adaptive: the lock wrote more, keeping it");
            } else {
                let (next_trial, trial_wait) = if slot.trial && !won {
                    // The lock lost its trial: the next one waits longer.
                    (
                        now.checked_add(slot.trial_wait),
                        (slot.trial_wait * 2).min(LAST_TRIAL_WAIT),
                    )
                } else {
                    (None, FIRST_TRIAL_WAIT)
                };
                tracing::debug!(target: "lockkit", locked = rate, optimistic = slot.optimistic_rate,
                    "adaptive: writing a locked row optimistically again");
                *slot = Slot {
                    at: Some(now),
                    since: Some(now),
                    next_trial,
                    trial_wait,
                    ..CALM
                };
                self.counters.de_escalations.fetch_add(1, Relaxed);
            }
        } else if slot.mode == Mode::Optimistic
            // The counts decay between attempts: allow for that.
            && slot.attempts >= self.min_attempts - 0.5
            && slot.conflicts >= self.escalate_at * slot.attempts
            && slot.conflicts > 0.0
            // A rate to compare the trial with, over a long enough period.
            && slot.writes > 0.0
            && now.saturating_duration_since(since) >= self.min_period
            && slot.next_trial.is_none_or(|at| now >= at)
        {
            slot.optimistic_rate = self.rate(slot.writes, now.saturating_duration_since(since));
            slot.mode = Mode::Locked;
            slot.trial = true;
            slot.since = Some(now);
            slot.writes = 0.0;
            slot.locked_until = now.checked_add(self.trial);
            self.counters.escalations.fetch_add(1, Relaxed);
            tracing::debug!(target: "lockkit", attempts = slot.attempts, conflicts = slot.conflicts,
                optimistic = slot.optimistic_rate, "adaptive: trying the lock on a hot row");
        }
        slot.mode
    }

    /// Rows per second, from `writes` counted (and halved every half-life)
    /// over the last `elapsed`: the decayed count over the decayed length of
    /// the window, `h / ln 2 · (1 − 2^(−elapsed/h))`.
    fn rate(&self, writes: f64, elapsed: Duration) -> f64 {
        let half_life = self.half_life.as_secs_f64();
        let elapsed = elapsed.as_secs_f64().max(1e-3);
        let window = half_life / std::f64::consts::LN_2 * (1.0 - 0.5f64.powf(elapsed / half_life));
        writes / window
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
    /// [`Versioned::update_versioned`] of the row as just read (by
    /// [`read`](Self::read), or under its lock): its version is the row's
    /// own, never one a rolled-back write of this process left with a struct,
    /// so the write is stale only when another writer got in between, and
    /// never under the lock.
    ///
    /// # Errors
    ///
    /// Those of [`Versioned::update_versioned`].
    fn write_fresh(&mut self, conn: &mut Conn) -> Result<(), Error>;
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

            fn write_fresh(&mut self, conn: &mut $conn) -> Result<(), Error> {
                update_from(self, conn, Origin::Read)
            }
        }
    )*};
}

adaptive_row_on!(
    diesel::PgConnection, diesel::pg::Pg, "postgres";
    diesel::MysqlConnection, diesel::mysql::Mysql, "mysql";
    diesel::SqliteConnection, diesel::sqlite::Sqlite, "sqlite"
);

#[cfg(test)]
mod tests {
    //! The decisions alone, on a clock of the test's own: what the policy does
    //! with the writes and lost races it is told about.
    use super::*;

    #[test]
    fn stats_since_later_stats_are_zero_not_a_panic() {
        let later = AdaptiveStats {
            conflicts: 5,
            escalations: 1,
            ..AdaptiveStats::default()
        };
        let earlier = AdaptiveStats::default();
        assert_eq!(later.since(&earlier).conflicts, 5);
        assert_eq!(earlier.since(&later), AdaptiveStats::default());
    }

    const SLOT: usize = 7;

    struct Clock {
        policy: AdaptivePolicy,
        start: Instant,
        now: Duration,
    }

    impl Clock {
        fn new(policy: AdaptivePolicy) -> Self {
            Clock {
                policy,
                start: Instant::now(),
                now: Duration::ZERO,
            }
        }

        /// Optimistic attempts, `writes` won and `lost` lost in every
        /// `writes + lost`, spread evenly at `writes + lost` per `per`, for
        /// `during` or until the row turns locked; returns the mode.
        fn optimistic(&mut self, writes: u32, lost: u32, per: Duration, during: Duration) -> Mode {
            let events = writes + lost;
            let end = self.now + during;
            let mut i = 0;
            while self.now + per / events <= end {
                self.now += per / events;
                // Lose `lost` of every `events`, spread out.
                let k = i % events;
                let lost = (k + 1) * lost / events != k * lost / events;
                i += 1;
                let at = self.start + self.now;
                if self.policy.touch(SLOT, at, Event::Optimistic { lost }) == Mode::Locked {
                    return Mode::Locked;
                }
            }
            Mode::Optimistic
        }

        fn locked(&mut self, writes: u32, during: Duration) -> Mode {
            let mut mode = Mode::Locked;
            for _ in 0..writes {
                self.now += during / writes;
                mode = self
                    .policy
                    .touch(SLOT, self.start + self.now, Event::Locked);
            }
            mode
        }

        fn ask_after(&mut self, wait: Duration) -> Mode {
            self.now += wait;
            self.policy.touch(SLOT, self.start + self.now, Event::Ask)
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_calm_row_is_never_locked() {
        let mut clock = Clock::new(AdaptivePolicy::new());
        assert_eq!(
            clock.optimistic(100, 1, 100 * MS, 2000 * MS),
            Mode::Optimistic
        );
        assert_eq!(clock.policy.stats().escalations, 0);
    }

    #[test]
    fn a_hot_row_where_optimistic_writes_win_goes_back_and_waits_longer_each_time() {
        let mut clock = Clock::new(AdaptivePolicy::new());
        // 400 optimistic writes per second, three races lost per write.
        assert_eq!(
            clock.optimistic(4, 12, 10 * MS, 1000 * MS),
            Mode::Locked,
            "a trial"
        );
        // The trial writes 100 per second.
        assert_eq!(clock.locked(10, 99 * MS), Mode::Locked);
        assert_eq!(clock.ask_after(2 * MS), Mode::Optimistic, "the trial lost");
        let stats = clock.policy.stats();
        assert_eq!((stats.escalations, stats.de_escalations), (1, 1));

        // Just as hot: no trial for a second...
        assert_eq!(clock.optimistic(4, 12, 10 * MS, 950 * MS), Mode::Optimistic);
        // ...then one, lost again; the next waits two seconds.
        assert_eq!(clock.optimistic(4, 12, 10 * MS, 100 * MS), Mode::Locked);
        clock.locked(10, 100 * MS);
        assert_eq!(clock.ask_after(MS), Mode::Optimistic);
        assert_eq!(
            clock.optimistic(4, 12, 10 * MS, 1950 * MS),
            Mode::Optimistic
        );
        assert_eq!(clock.optimistic(4, 12, 10 * MS, 100 * MS), Mode::Locked);
        assert_eq!(clock.policy.stats().escalations, 3);
    }

    #[test]
    fn a_hot_row_where_the_lock_wins_stays_locked_then_is_measured_again() {
        let mut clock = Clock::new(AdaptivePolicy::new());
        // 20 optimistic writes per second, twenty races lost per write.
        assert_eq!(clock.optimistic(1, 20, 50 * MS, 1000 * MS), Mode::Locked);
        // The trial writes 500 per second: the row stays locked for a second.
        assert_eq!(clock.locked(50, 100 * MS), Mode::Locked);
        assert_eq!(clock.locked(450, 900 * MS), Mode::Locked);
        assert_eq!(clock.policy.stats().de_escalations, 0);
        assert_eq!(
            clock.ask_after(110 * MS),
            Mode::Optimistic,
            "measured afresh"
        );
        // Still hot and slow optimistically: a trial at once, not after a wait.
        assert_eq!(clock.optimistic(1, 20, 50 * MS, 200 * MS), Mode::Locked);
        let stats = clock.policy.stats();
        assert_eq!((stats.escalations, stats.de_escalations), (2, 1));
    }

    #[test]
    fn a_burst_of_lost_races_at_the_start_is_no_rate_to_try_the_lock_against() {
        let mut clock = Clock::new(AdaptivePolicy::new());
        // 32 writers start at once: one wins, 31 lose, within 2 ms. The
        // optimistic rate over those 2 ms (500 per second) says nothing of the
        // rate the row will see once the losers back off.
        assert_eq!(
            clock.optimistic(1, 31, 2 * MS, 2 * MS),
            Mode::Optimistic,
            "no trial against a 2 ms window"
        );
        // As hot for as long as a trial lasts: now the rate is worth a trial.
        assert_eq!(
            clock.optimistic(1, 31, 2 * MS, 100 * MS),
            Mode::Locked,
            "a trial once the optimistic period is as long as a trial"
        );
        assert_eq!(clock.policy.stats().escalations, 1);
    }

    #[test]
    fn a_row_whose_lock_won_stays_locked_for_ever_with_locked_for_max() {
        let mut clock = Clock::new(AdaptivePolicy::new().locked_for(Duration::MAX));
        assert_eq!(clock.optimistic(1, 20, 50 * MS, 1000 * MS), Mode::Locked);
        // The trial writes 500 per second: the lock won, and keeps the row.
        assert_eq!(clock.locked(50, 100 * MS), Mode::Locked);
        assert_eq!(clock.locked(500, 10_000 * MS), Mode::Locked);
        assert_eq!(clock.ask_after(100_000 * MS), Mode::Locked);
        assert_eq!(clock.policy.stats().de_escalations, 0);
    }

    #[test]
    fn a_trial_nobody_writes_in_ends_optimistic() {
        let mut clock = Clock::new(AdaptivePolicy::new());
        assert_eq!(clock.optimistic(1, 3, 10 * MS, 200 * MS), Mode::Locked);
        assert_eq!(clock.ask_after(10_000 * MS), Mode::Optimistic);
    }
}
