//! Conflict metrics: how often writers collide, and how long they wait.
//!
//! Conflicts are how a team learns that its locking strategy no longer fits the
//! load: a rising stale-write rate says optimistic locking is retrying more than it
//! writes; rising lock waits say a hot row needs a different design. lockkit counts
//! them in-process ([`snapshot`]) and reports each one three ways:
//!
//! * a `tracing` event (target `lockkit`): stale writes and retries at `INFO`/`DEBUG`,
//!   exhausted retries and deadlocks at `WARN`;
//! * the counters below, readable at any time with [`snapshot`];
//! * with the `metrics` feature, the [`metrics`](https://docs.rs/metrics) facade:
//!   counters `lockkit_stale_writes_total{table}`, `lockkit_retries_total`,
//!   `lockkit_retries_exhausted_total`, `lockkit_lock_errors_total{kind=busy|lock_timeout|deadlock|serialization_failure|statement_timeout}`,
//!   `lockkit_locks_acquired_total{table}`, histograms `lockkit_lock_acquire_seconds{table}`
//!   and `lockkit_lock_hold_seconds{table}`
//!   (`table` is the model's table; `queue` for [`queue::claim`](crate::queue::claim),
//!   whose query lockkit cannot name; `database` for SQLite's write lock).
//!
//! # How long a lock was held
//!
//! A row lock lockkit takes (`with_lock`, `lock`; the rows of one `lock_all`
//! together) is held from the locked read to the end of the outermost
//! transaction, where the server lets it go: that span is counted in [`Metrics::locks_released`],
//! [`Metrics::lock_hold_time`] and [`Metrics::lock_hold_max`], recorded in
//! `lockkit_lock_hold_seconds`, and warned about (a `tracing` event at `WARN`
//! naming the table and the key) past the limit of
//! [`warn_when_held_longer_than`].
//!
//! ```
//! let before = lockkit::metrics::snapshot();
//! // ... run the workload ...
//! let delta = lockkit::metrics::snapshot().since(&before);
//! println!("{delta}");
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use std::fmt::Display;

/// Declares every metric once: a counter's process-wide atomic, or a timer's
/// pair (total and longest); its fields in [`Metrics`] (with their docs), its
/// words in [`Metrics`]' `Display`, and its part in [`snapshot`] and
/// [`Metrics::since`]. A new metric is one entry here plus the function that
/// records it.
macro_rules! metrics {
    (
        counters {
            $($(#[doc = $doc:literal])* $field:ident: $name:ident, $words:literal;)*
        }
        timers {
            $(
                $(#[doc = $total_doc:literal])* $total:ident,
                $(#[doc = $max_doc:literal])* $max:ident:
                $timer:ident, after $gate:ident, $verb:literal;
            )*
        }
    ) => {
        $(static $name: AtomicU64 = AtomicU64::new(0);)*
        $(static $timer: Timer = Timer::new();)*

        /// The counters at one moment, since the process started.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Metrics {
            $($(#[doc = $doc])* pub $field: u64,)*
            $(
                $(#[doc = $total_doc])* pub $total: Duration,
                $(#[doc = $max_doc])* pub $max: Duration,
            )*
        }

        impl Metrics {
            /// What happened between `earlier` and `self`. Counters and total times
            /// are differences (zero, never a panic, where `earlier` is the later
            /// snapshot); the longest times stay the process-wide maximum.
            pub fn since(&self, earlier: &Metrics) -> Metrics {
                Metrics {
                    $($field: self.$field.saturating_sub(earlier.$field),)*
                    $(
                        $total: self.$total.saturating_sub(earlier.$total),
                        $max: self.$max,
                    )*
                }
            }

            /// Each counter with its words, in declaration order.
            fn counts(&self) -> [(&'static str, u64); [$($words),*].len()] {
                [$(($words, self.$field)),*]
            }

            /// Each timer with its verb, its total and its longest, when the
            /// counter it follows counted anything.
            fn times(&self) -> impl Iterator<Item = (&'static str, Duration, Duration)> {
                [$(($verb, self.$gate, self.$total, self.$max)),*]
                    .into_iter()
                    .filter(|(_, gate, _, _)| *gate > 0)
                    .map(|(verb, _, total, max)| (verb, total, max))
            }
        }

        /// The counters now.
        pub fn snapshot() -> Metrics {
            Metrics {
                $($field: $name.load(Relaxed),)*
                $($total: $timer.total(), $max: $timer.max(),)*
            }
        }
    };
}

metrics! {
    counters {
        /// Version-checked writes that matched no row ([`Error::Stale`](crate::Error::Stale)), bulk rows included.
        stale_writes: STALE_WRITES, "stale writes";
        /// Attempts [`retry`](crate::retry()) made after a retryable error
        /// (counted when the retry is decided: on diesel-async, a future
        /// dropped during the wait before the attempt counts it too).
        retries: RETRIES, "retries";
        /// Times [`retry`](crate::retry()) gave up with its attempts spent
        /// ([`Error::RetriesExhausted`](crate::Error::RetriesExhausted), or a nested
        /// `transaction_with_retry`'s last error handed to the owner as it is).
        retries_exhausted: RETRIES_EXHAUSTED, "retries exhausted";
        /// [`Error::Busy`](crate::Error::Busy): `NOWAIT`, a row `SKIP LOCKED` passed
        /// over in a locked read of one key, or SQLite's busy database.
        busy: BUSY, "busy";
        /// [`Error::LockTimeout`](crate::Error::LockTimeout).
        lock_timeouts: LOCK_TIMEOUTS, "lock timeouts";
        /// [`Error::Deadlock`](crate::Error::Deadlock).
        deadlocks: DEADLOCKS, "deadlocks";
        /// [`Error::SerializationFailure`](crate::Error::SerializationFailure).
        serialization_failures: SERIALIZATION_FAILURES, "serialization failures";
        /// [`Error::StatementTimeout`](crate::Error::StatementTimeout).
        statement_timeouts: STATEMENT_TIMEOUTS, "statement timeouts";
        /// Locks taken: rows locked by [`with_lock`](crate::with_lock),
        /// [`lock_all`](crate::Lockable::lock_all) and [`queue::claim`](crate::queue::claim),
        /// and on SQLite the database's write lock taken by a locking transaction.
        locks_acquired: LOCKS_ACQUIRED, "locks";
        /// Row locks whose hold time was measured: those taken by
        /// [`with_lock`](crate::with_lock), [`Lockable::lock`](crate::Lockable::lock)
        /// and [`lock_all`](crate::Lockable::lock_all) (one per statement) inside a
        /// transaction lockkit opened, counted when its outermost transaction ended;
        /// on diesel-async, by a `with_lock` that opened its transaction itself.
        locks_released: LOCKS_RELEASED, "locks released";
    }
    timers {
        /// Total time spent taking them (the locked read or `BEGIN IMMEDIATE`, waits
        /// included), counted once per statement however many rows it locked.
        lock_acquire_time,
        /// The longest single lock acquisition.
        lock_acquire_max: LOCK_ACQUIRE, after locks_acquired, "waited";
        /// Total time the locks counted in `locks_released` were held: from
        /// the locked read to the end of the outermost transaction.
        lock_hold_time,
        /// The longest single hold.
        lock_hold_max: LOCK_HOLD, after locks_released, "held";
    }
}

/// A timer's process-wide total and longest, in nanoseconds.
struct Timer {
    total: AtomicU64,
    max: AtomicU64,
}

impl Timer {
    const fn new() -> Self {
        Timer {
            total: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Adds `took` to the total and the longest; its nanoseconds, saturated.
    /// The total saturates too: it sums the holds of every connection at
    /// once, and a sum that wrapped would read as a small total (and as no
    /// time at all in a later [`Metrics::since`]).
    fn record(&self, took: Duration) -> u64 {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .total
            .fetch_update(Relaxed, Relaxed, |total| Some(total.saturating_add(nanos)));
        self.max.fetch_max(nanos, Relaxed);
        nanos
    }

    fn total(&self) -> Duration {
        Duration::from_nanos(self.total.load(Relaxed))
    }

    fn max(&self) -> Duration {
        Duration::from_nanos(self.max.load(Relaxed))
    }
}

/// [`warn_when_held_longer_than`]'s limit in nanoseconds; `u64::MAX`: off.
static HOLD_WARNING_NANOS: AtomicU64 = AtomicU64::new(u64::MAX);

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (words, count)) in self.counts().into_iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{words} {count}")?;
        }
        for (verb, total, max) in self.times() {
            // The maximum is the process's, not the interval's (see `since`).
            write!(f, " ({verb} {total:?}, longest so far {max:?})")?;
        }
        Ok(())
    }
}

/// A version-checked write that matched no row, described by its report's
/// fields (this module knows nothing of the error types).
pub(crate) fn record_stale(
    table: &'static str,
    key: &str,
    operation: impl Display,
    expected: i64,
    current: impl Display,
) {
    STALE_WRITES.fetch_add(1, Relaxed);
    tracing::info!(target: "lockkit", table, key, operation = %operation,
        expected, current = %current, "stale write");
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lockkit_stale_writes_total", "table" => table).increment(1);
}

pub(crate) fn record_retry(attempt: u32, delay: Duration, error: Option<&dyn Display>) {
    RETRIES.fetch_add(1, Relaxed);
    tracing::debug!(target: "lockkit", attempt, ?delay, error = error.map(tracing::field::display), "retrying");
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lockkit_retries_total").increment(1);
}

pub(crate) fn record_exhausted(attempts: u32, error: Option<&dyn Display>) {
    RETRIES_EXHAUSTED.fetch_add(1, Relaxed);
    tracing::warn!(target: "lockkit", attempts, error = error.map(tracing::field::display), "retries exhausted");
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lockkit_retries_exhausted_total").increment(1);
}

/// The lock errors counted, one counter each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockErrorKind {
    Busy,
    LockTimeout,
    Deadlock,
    SerializationFailure,
    StatementTimeout,
}

/// Called by [`classify`](crate::classify) for every lock error it recognises.
pub(crate) fn record_lock_error(kind: LockErrorKind, server_message: &str) {
    let (counter, kind) = match kind {
        LockErrorKind::Busy => (&BUSY, "busy"),
        LockErrorKind::LockTimeout => (&LOCK_TIMEOUTS, "lock_timeout"),
        LockErrorKind::Deadlock => (&DEADLOCKS, "deadlock"),
        LockErrorKind::SerializationFailure => (&SERIALIZATION_FAILURES, "serialization_failure"),
        LockErrorKind::StatementTimeout => (&STATEMENT_TIMEOUTS, "statement_timeout"),
    };
    counter.fetch_add(1, Relaxed);
    if kind == "deadlock" {
        tracing::warn!(target: "lockkit", kind, server_message, "lock error");
    } else {
        tracing::debug!(target: "lockkit", kind, server_message, "lock error");
    }
    #[cfg(feature = "metrics")]
    ::metrics::counter!("lockkit_lock_errors_total", "kind" => kind).increment(1);
}

/// `rows` locks on `table` taken by one statement that waited `waited`.
fn record_locks_acquired(table: &'static str, rows: u64, waited: Duration) {
    LOCKS_ACQUIRED.fetch_add(rows, Relaxed);
    LOCK_ACQUIRE.record(waited);
    tracing::trace!(target: "lockkit", table, rows, ?waited, "row locked");
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!("lockkit_locks_acquired_total", "table" => table).increment(rows);
        ::metrics::histogram!("lockkit_lock_acquire_seconds", "table" => table)
            .record(waited.as_secs_f64());
    }
}

/// Times one lock acquisition: start it right before the statement that waits
/// for the lock (the locked read, or SQLite's `BEGIN IMMEDIATE`), finish it with
/// [`LockWait::acquired`] once the statement returned its rows.
#[must_use]
pub(crate) struct LockWait(Instant);

impl LockWait {
    pub(crate) fn start() -> Self {
        LockWait(Instant::now())
    }

    /// Records `rows` locks on `table` (nothing when no row was locked), and
    /// returns when they were taken: now, for a hold time measured from there.
    pub(crate) fn acquired(self, table: &'static str, rows: usize) -> Instant {
        let now = Instant::now();
        if rows > 0 {
            let rows = u64::try_from(rows).unwrap_or(u64::MAX);
            record_locks_acquired(table, rows, now.saturating_duration_since(self.0));
        }
        now
    }
}

/// Warns (a `tracing` event at `WARN`, target `lockkit`) about every row lock
/// held longer than `limit` (see [how long a lock was held](self#how-long-a-lock-was-held));
/// `None`, the default, warns about none. Process-wide.
///
/// The warning names the locked row's key when the limit was set before the
/// lock was taken (lockkit formats keys only then); a lock taken earlier is
/// named `?`.
///
/// ```
/// use std::time::Duration;
/// use lockkit::metrics;
/// # use diesel::prelude::*;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # #[derive(Queryable, Selectable, lockkit::Lockable)]
/// # #[diesel(table_name = items)]
/// # pub struct Item { pub id: i32, pub stock: i32 }
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn).unwrap();
/// # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn).unwrap();
///
/// // At start-up: a WARN event (target `lockkit`) for every lock held over 5 ms.
/// metrics::warn_when_held_longer_than(Some(Duration::from_millis(5)));
/// assert_eq!(metrics::hold_warning(), Some(Duration::from_millis(5)));
///
/// let before = metrics::snapshot();
/// lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |_conn, _item: Item| {
///     std::thread::sleep(Duration::from_millis(10)); // slow work under the lock: warned
///     Ok::<_, lockkit::Error>(())
/// })
/// .unwrap();
/// let held = metrics::snapshot().since(&before);
/// assert_eq!(held.locks_released, 1);
/// assert!(held.lock_hold_time >= Duration::from_millis(10));
///
/// metrics::warn_when_held_longer_than(None); // no more warnings
/// assert_eq!(metrics::hold_warning(), None);
/// ```
pub fn warn_when_held_longer_than(limit: Option<Duration>) {
    let nanos = limit.map_or(u64::MAX, |limit| {
        u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX - 1)
    });
    HOLD_WARNING_NANOS.store(nanos, Relaxed);
}

/// The limit [`warn_when_held_longer_than`] set, if any.
pub fn hold_warning() -> Option<Duration> {
    match HOLD_WARNING_NANOS.load(Relaxed) {
        u64::MAX => None,
        nanos => Some(Duration::from_nanos(nanos)),
    }
}

/// A `kind` lock (`row`) on `key` of `table` was held for `held`: counted, and
/// warned about past [`hold_warning`]. The key is `None` when it was not
/// formatted (no warning was on when the lock was taken): `?` then.
pub(crate) fn record_lock_held(
    kind: &'static str,
    table: &'static str,
    key: Option<&str>,
    held: Duration,
) {
    let key = key.unwrap_or("?");
    LOCKS_RELEASED.fetch_add(1, Relaxed);
    let nanos = LOCK_HOLD.record(held);
    let held_ms = u64::try_from(held.as_millis()).unwrap_or(u64::MAX);
    if nanos > HOLD_WARNING_NANOS.load(Relaxed) {
        tracing::warn!(target: "lockkit", table, key, held_ms, "{kind} lock on {table} {key} held {held_ms} ms");
    } else {
        tracing::trace!(target: "lockkit", table, key, held_ms, "{kind} lock released");
    }
    #[cfg(feature = "metrics")]
    ::metrics::histogram!("lockkit_lock_hold_seconds", "table" => table).record(held.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// `locks` locks taken in `total` ms, the longest in `max` ms.
    fn acquired(locks: u64, total: u64, max: u64) -> Metrics {
        Metrics {
            locks_acquired: locks,
            lock_acquire_time: ms(total),
            lock_acquire_max: ms(max),
            ..Metrics::default()
        }
    }

    #[test]
    fn display_lists_the_counters_then_the_times_of_those_that_counted() {
        let waited = Metrics {
            lock_hold_time: ms(9), // no lock released: not shown
            ..acquired(2, 3, 2)
        };
        assert_eq!(
            waited.to_string(),
            "stale writes 0, retries 0, retries exhausted 0, busy 0, lock timeouts 0, \
             deadlocks 0, serialization failures 0, statement timeouts 0, locks 2, \
             locks released 0 (waited 3ms, longest so far 2ms)"
        );
        let both = Metrics {
            locks_released: 1,
            lock_hold_max: ms(9),
            ..waited
        };
        assert!(
            both.to_string().ends_with(
                "locks released 1 (waited 3ms, longest so far 2ms) (held 9ms, longest so far 9ms)"
            ),
            "{both}"
        );
    }

    #[test]
    fn since_takes_differences_of_totals_and_keeps_the_longest() {
        let delta = acquired(3, 10, 5).since(&acquired(1, 4, 4));
        assert_eq!(
            (
                delta.locks_acquired,
                delta.lock_acquire_time,
                delta.lock_acquire_max
            ),
            (2, ms(6), ms(5))
        );
    }

    #[test]
    fn a_timers_total_saturates_instead_of_wrapping() {
        let timer = Timer::new();
        timer.record(Duration::from_nanos(u64::MAX - 5));
        timer.record(Duration::from_nanos(10));
        assert_eq!(timer.total(), Duration::from_nanos(u64::MAX));
        assert_eq!(timer.max(), Duration::from_nanos(u64::MAX - 5));
    }

    #[test]
    fn since_a_later_snapshot_is_zero_not_a_panic() {
        let delta = acquired(1, 4, 4).since(&acquired(3, 10, 5));
        assert_eq!(
            (delta.locks_acquired, delta.lock_acquire_time),
            (0, Duration::ZERO)
        );
    }
}
