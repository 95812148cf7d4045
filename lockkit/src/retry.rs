//! Bounded retry with exponential backoff and full jitter; see [`retry()`].

use std::time::Duration;

use crate::error::Error;
use crate::pessimistic::connection::{AsLockingConnection, LockingConnection};
use crate::transaction::journal::Ended;
use crate::transaction::{self, Failure};

/// What the retrying calls ([`retry()`], [`transaction_with_retry`],
/// [`serializable`](crate::serializable)) need to know about the error type your
/// closure returns: which errors are worth another attempt.
///
/// Implemented for [`lockkit::Error`](Error). For your own error type, say where
/// its lockkit error is; the default methods do the rest:
///
/// ```
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error("out of stock")]
///     OutOfStock,
///     #[error(transparent)]
///     Lock(#[from] lockkit::Error),
/// }
///
/// impl lockkit::RetryableError for AppError {
///     fn lockkit_error(&self) -> Option<&lockkit::Error> {
///         match self {
///             AppError::Lock(err) => Some(err),
///             AppError::OutOfStock => None,
///         }
///     }
/// }
///
/// let mut conflicts = 1;
/// let result: Result<(), AppError> = lockkit::retry(&lockkit::RetryPolicy::immediate(3), |_attempt| {
///     if conflicts > 0 {
///         conflicts -= 1;
///         return Err(AppError::from(lockkit::Error::Deadlock)); // retried
///     }
///     Err(AppError::OutOfStock) // returned at once
/// });
/// assert!(matches!(result, Err(AppError::OutOfStock)));
/// ```
pub trait RetryableError: From<Error> {
    /// The lockkit error this error carries, if any.
    fn lockkit_error(&self) -> Option<&Error>;

    /// Whether running the work again may succeed. By default: when it carries a
    /// [retryable](Error::is_retryable) lockkit error.
    fn is_retryable(&self) -> bool {
        self.lockkit_error().is_some_and(Error::is_retryable)
    }

    /// What the retrying call returns after `attempts` attempts failed, the last
    /// one with `self`. By default `self`; [`Error`] wraps itself in
    /// [`Error::RetriesExhausted`].
    #[must_use]
    fn retries_exhausted(self, attempts: u32) -> Self {
        let _ = attempts;
        self
    }
}

impl RetryableError for Error {
    fn lockkit_error(&self) -> Option<&Error> {
        Some(self)
    }

    fn retries_exhausted(self, attempts: u32) -> Self {
        Error::RetriesExhausted {
            attempts,
            last: Box::new(self),
        }
    }
}

/// How often and how patiently to retry. `RetryPolicy::default()`: 5 attempts,
/// backoff from 10 ms doubling up to 1 s, full jitter.
///
/// The builder methods change one setting each; [`delay_after`](Self::delay_after)
/// is the wait the policy asks for after a failed attempt:
///
/// ```
/// use std::time::Duration;
/// use lockkit::{retry, Error, RetryPolicy};
///
/// let policy = RetryPolicy::default()
///     .max_attempts(3)
///     .base_delay(Duration::from_millis(2))
///     .max_delay(Duration::from_millis(5))
///     .jitter(false);
/// assert_eq!(policy.attempts(), 3);
/// // Without jitter each wait is its ceiling: doubling, then capped at max_delay.
/// assert_eq!(policy.delay_after(1), Duration::from_millis(2));
/// assert_eq!(policy.delay_after(2), Duration::from_millis(4));
/// assert_eq!(policy.delay_after(3), Duration::from_millis(5));
/// // With jitter (the default), a random part of the ceiling.
/// assert!(policy.clone().jitter(true).delay_after(2) <= Duration::from_millis(4));
///
/// // `retry` with it: a conflict on every attempt gives up after the third.
/// let mut runs = 0;
/// let result: Result<(), Error> = retry(&policy, |_attempt| {
///     runs += 1;
///     Err(Error::Deadlock)
/// });
/// assert_eq!(runs, 3);
/// assert!(matches!(result, Err(Error::RetriesExhausted { attempts: 3, .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
    jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(1),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// Retries at once, without waiting, up to `max_attempts` in all. Useful in
    /// tests and to measure what backoff buys.
    pub fn immediate(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            base_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            jitter: false,
        }
    }

    #[must_use]
    /// At most this many runs of the operation in all (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    #[must_use]
    /// The first backoff ceiling; it doubles after every failed attempt.
    pub fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    #[must_use]
    /// The largest backoff ceiling.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    #[must_use]
    /// `false` waits the full ceiling each time instead of a random part of it.
    pub fn jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The configured number of attempts.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The wait after failed attempt number `attempt` (1-based).
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(31);
        let ceiling = self
            .base_delay
            .saturating_mul(1u32 << exponent)
            .min(self.max_delay);
        if self.jitter && !ceiling.is_zero() {
            // fastrand: uniform over 0..=ceiling in nanoseconds.
            let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(fastrand::u64(0..=nanos))
        } else {
            ceiling
        }
    }
}

/// Bounded retry with exponential backoff and full jitter.
///
/// Conflicts ([`Error::is_retryable`]) go away when the other transaction
/// finishes, so the cure is to re-read and try again, a bounded number of times,
/// waiting a random time that grows with each attempt so that the losers of a race
/// do not collide again in lock-step ("full jitter": the delay before attempt
/// `n + 1` is uniform in `0 ..= min(max_delay, base_delay * 2^(n-1))`).
///
/// ```
/// use lockkit::{retry, Error, RetryPolicy};
///
/// let mut conflicts = 2;
/// let value = retry(&RetryPolicy::immediate(5), |attempt| {
///     // re-read, change, save: here the first two attempts meet a conflict
///     if conflicts > 0 {
///         conflicts -= 1;
///         return Err(Error::Deadlock);
///     }
///     Ok(attempt)
/// })
/// .unwrap();
/// assert_eq!(value, 3);
/// ```
///
/// # Running `op`
///
/// `retry` runs `op` until it succeeds, returns a non-retryable error, or has run
/// `policy.attempts()` times. `op` receives the attempt number, starting at 1. It
/// must do the whole read-change-write each time: retrying only the write would
/// fail the same way. Its error type is yours: any [`RetryableError`] (lockkit's
/// [`Error`], or your own type that says where its lockkit error is).
///
/// Inside a transaction you opened yourself, a lockkit call whose transaction the
/// server rolled back reports [`Error::TransactionAborted`], which is not
/// retryable while that transaction is open: a `retry` inside it returns it at
/// once, for you to roll back (return it from the transaction's closure). Once
/// the transaction has rolled back, the error is retryable like its cause
/// ([`Aborted::is_settled`](crate::Aborted::is_settled)), so a `retry` around the
/// whole transaction runs it again. A plain Diesel statement of `op` that ends
/// the open transaction (on MySQL/MariaDB a deadlock's victim, after which
/// statements run in autocommit; on PostgreSQL any failure, after which
/// statements fail until a savepoint rolls back) is seen by lockkit's journal
/// on a connection it watches (see [`journal`](crate::journal)): `retry`
/// then returns the error at once instead of running `op` again, in
/// autocommit or in the aborted transaction, for the transaction's owner to
/// run the whole of it again. On a connection no lockkit call has watched
/// yet, or one with instrumentation of its own not wrapped in
/// [`Journal::wrap`](crate::journal::Journal::wrap), `retry` cannot know, nor
/// after a MySQL/MariaDB lock wait timeout, which ends the transaction only
/// on a server started with `--innodb-rollback-on-timeout` (elsewhere it
/// ends the statement, and `retry` runs `op` again). So put the retry around
/// the transaction:
/// [`transaction_with_retry`], or `retry` around `with_lock`, whose
/// transaction hands back the first failure when its work went on after it.
/// [`transaction_with_retry`] also makes again, between its attempts, what the
/// rollback journal keeps of a rolled-back attempt (see [`journal`](crate::journal)),
/// which a `retry` around Diesel's own `transaction` cannot.
///
/// # Errors
///
/// * the first error of `op` that is not retryable
///   ([`RetryableError::is_retryable`]), at once.
/// * when `op` failed with retryable errors `policy.attempts()` times: the last
///   one, through [`RetryableError::retries_exhausted`] (for lockkit's [`Error`],
///   [`Error::RetriesExhausted`], whose `last` is the final error).
pub fn retry<T, E, F>(policy: &RetryPolicy, op: F) -> Result<T, E>
where
    E: RetryableError,
    F: FnMut(u32) -> Result<T, E>,
{
    retry_while(policy, op, |err, _| err.is_retryable(), Spent::Exhausted)
}

/// The one retry loop: runs `op` until it succeeds, fails with an error
/// `retryable` refuses (given the error and the attempt that failed), or has
/// run `policy.attempts()` times (then `spent` says what it returns).
pub(crate) fn retry_while<T, E, F>(
    policy: &RetryPolicy,
    mut op: F,
    retryable: impl Fn(&E, u32) -> bool,
    spent: Spent,
) -> Result<T, E>
where
    E: RetryableError,
    F: FnMut(u32) -> Result<T, E>,
{
    let mut attempt = 1;
    loop {
        let mark = Ended::mark();
        let err = match op(attempt) {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        // An attempt under which a statement ended the open transaction ran
        // inside it: the next would run in autocommit (MySQL/MariaDB) or into
        // the aborted transaction (PostgreSQL). Its owner retries it whole.
        let ended = Ended::since(mark);
        match after_failure(policy, attempt, err, spent, |err| {
            !ended && retryable(err, attempt)
        }) {
            Next::GiveUp(err) => return Err(err),
            Next::RetryAfter(delay) => {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                attempt += 1;
            }
        }
    }
}

/// What follows a failed attempt.
pub(crate) enum Next<E> {
    /// Return this error to the caller.
    GiveUp(E),
    /// Sleep this long, then run the next attempt.
    RetryAfter(std::time::Duration),
}

/// What a retry loop returns once the policy's attempts are spent, each
/// failed with a retryable error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spent {
    /// The last error through [`RetryableError::retries_exhausted`]
    /// ([`Error::RetriesExhausted`], not retryable): an outer retry would only
    /// repeat what failed.
    Exhausted,
    /// The loop ran nested in an open transaction, each attempt in a
    /// savepoint that keeps the transaction's snapshot: an error that
    /// snapshot may cause on every attempt (a stale write,
    /// [`Error::Stale`], [`Error::StaleRows`] or [`Error::StaleColumns`], of
    /// a row read from a REPEATABLE READ snapshot older than the latest
    /// commit; SQLite's [`Error::Busy`], a snapshot older than the write
    /// lock's holder's commit, or a `NOWAIT` refusal, which costs no wait)
    /// comes back as it is, retryable, for the owner of the outermost
    /// transaction, whose new transaction has a new snapshot. Any other is
    /// [`Exhausted`](Self::Exhausted): a lock wait's each attempt already
    /// waited in full.
    Nested,
}

impl Spent {
    /// A `transaction_with_retry`'s, `nested` in an open transaction or not.
    pub(crate) fn for_transaction(nested: bool) -> Self {
        match nested {
            true => Spent::Nested,
            false => Spent::Exhausted,
        }
    }
}

/// The one decision of every retry loop, blocking or async: give up (not
/// retryable, or the policy's attempts spent: as `spent` says) or wait and
/// try again. The metrics are recorded here.
pub(crate) fn after_failure<E: RetryableError>(
    policy: &RetryPolicy,
    attempt: u32,
    err: E,
    spent: Spent,
    retryable: impl Fn(&E) -> bool,
) -> Next<E> {
    if !retryable(&err) {
        return Next::GiveUp(err);
    }
    if attempt >= policy.max_attempts {
        crate::metrics::record_exhausted(attempt, err.lockkit_error().map(|e| e as _));
        let snapshot_bound = matches!(
            err.lockkit_error(),
            Some(Error::Stale(_) | Error::StaleRows(_) | Error::StaleColumns(_) | Error::Busy)
        );
        return Next::GiveUp(match spent {
            Spent::Nested if snapshot_bound => err,
            _ => err.retries_exhausted(attempt),
        });
    }
    let delay = policy.delay_after(attempt);
    crate::metrics::record_retry(attempt, delay, err.lockkit_error().map(|e| e as _));
    Next::RetryAfter(delay)
}

/// Whether a transaction's attempt that failed with `err` may run again,
/// `nested` in an open transaction (as a savepoint) or not: the blocking and
/// the async `transaction_with_retry` ask this.
///
/// * A transaction the server ended under a nested call
///   ([`Error::TransactionAborted`]) is retried by the owner of the outermost
///   transaction only, like its cause.
/// * A serialization failure is not retried in a savepoint: the savepoint keeps
///   the transaction's snapshot, so every attempt would fail the same way; the
///   owner of the transaction runs it again in a new one.
/// * A deadlock is retried in a savepoint only when the first attempt failed
///   with it (`attempt` is the attempt that failed). One on a later attempt
///   may say the cycle runs through a lock the transaction took before the
///   savepoint, which only the owner's rollback lets go: the deadlock goes to
///   the owner as it is (retryable), not as [`Error::RetriesExhausted`].
pub(crate) fn may_retry<E: RetryableError>(err: &E, nested: bool, attempt: u32) -> bool {
    match err.lockkit_error() {
        Some(Error::TransactionAborted(aborted)) if !nested => aborted.cause().is_retryable(),
        Some(Error::SerializationFailure) if nested => false,
        Some(Error::Deadlock) if nested && attempt > 1 => false,
        _ => err.is_retryable(),
    }
}

/// [`retry`] around a transaction: each attempt runs `op` in a fresh
/// transaction on `conn`, which is rolled back when `op` fails (or panics: the
/// rollback happens before the panic continues).
///
/// Called inside another transaction, each attempt is a savepoint. If the server
/// rolled back the whole transaction (InnoDB on a deadlock), nothing is retried in
/// it: the result is [`Error::TransactionAborted`] for the owner of the outermost
/// transaction. A deadlock that leaves the transaction open (PostgreSQL) on
/// the first attempt is retried in the savepoint; one on a later attempt may
/// mean the cycle runs through a lock taken before the savepoint, which only
/// the owner's rollback lets go, so it returns [`Error::Deadlock`] (retryable)
/// for the owner to run again. Called outside one, an attempt that ended that
/// way is retried like its cause. See
/// [`locking_connection`](crate::pessimistic::connection#when-the-server-aborts-the-whole-transaction).
///
/// # Errors
///
/// Each failed attempt is rolled back:
///
/// * the first error that is not retryable ([`RetryableError::is_retryable`]),
///   at once: `op`'s own, or a classified database error from `BEGIN` or
///   `COMMIT`.
/// * [`Error::TransactionAborted`] when nested in an open transaction that the
///   server rolled back as a whole; not retried.
/// * [`Error::Deadlock`] when nested, from a deadlock on any attempt but the first.
/// * when every attempt failed with a retryable error, the last one through
///   [`RetryableError::retries_exhausted`] ([`Error::RetriesExhausted`] for
///   lockkit's own error type); nested, a last stale write ([`Error::Stale`],
///   `StaleRows`, `StaleColumns`) or [`Error::Busy`] as it is, retryable:
///   each attempt ran in a savepoint of
///   the open transaction, whose snapshot every attempt shared (a row read
///   stale from a REPEATABLE READ snapshot, say), and the owner of the
///   outermost transaction runs the whole of it again in a new one.
///
/// # Example
///
/// ```
/// # use diesel::prelude::*;
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// let n = lockkit::transaction_with_retry(&mut conn, &lockkit::RetryPolicy::default(), |conn| {
///     Ok::<_, lockkit::Error>(diesel::sql_query("SELECT 1").execute(conn)?)
/// })
/// .unwrap();
/// assert_eq!(n, 0);
/// ```
pub fn transaction_with_retry<C, T, E, F>(
    conn: &mut C,
    policy: &RetryPolicy,
    mut op: F,
) -> Result<T, E>
where
    C: AsLockingConnection,
    E: RetryableError,
    F: FnMut(&mut C::Conn) -> Result<T, E>,
{
    let conn = conn.locking_connection();
    let nested = conn.in_transaction();
    retry_while(
        policy,
        |_| transaction::run(conn, |conn| op(conn).map_err(Failure::Closure)),
        |err, attempt| may_retry(err, nested, attempt),
        Spent::for_transaction(nested),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy::default().jitter(false);
        assert_eq!(policy.delay_after(1), Duration::from_millis(10));
        assert_eq!(policy.delay_after(2), Duration::from_millis(20));
        assert_eq!(policy.delay_after(4), Duration::from_millis(80));
        assert_eq!(policy.delay_after(30), Duration::from_secs(1));
        assert_eq!(policy.delay_after(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_under_the_ceiling() {
        let policy = RetryPolicy::default();
        for attempt in 1..10 {
            let ceiling = RetryPolicy::default().jitter(false).delay_after(attempt);
            let delays: Vec<Duration> = (0..100).map(|_| policy.delay_after(attempt)).collect();
            assert!(
                delays.iter().all(|d| *d <= ceiling),
                "{attempt}: {delays:?}"
            );
            // Spread over the whole range (uniform: each half is missed by all
            // 100 draws with probability 2^-100), not stuck at 0 or the ceiling.
            let half = ceiling / 2;
            assert!(delays.iter().any(|d| *d < half), "{attempt}: {delays:?}");
            assert!(delays.iter().any(|d| *d > half), "{attempt}: {delays:?}");
        }
    }

    /// Retries an operation that always fails with `error()`, up to
    /// `attempts` times: how many times it ran, and what came back.
    fn always_failing(attempts: u32, error: fn() -> Error) -> (u32, Result<(), Error>) {
        let mut runs = 0;
        let result = retry(&RetryPolicy::immediate(attempts), |_| {
            runs += 1;
            Err(error())
        });
        (runs, result)
    }

    #[test]
    fn gives_up_after_max_attempts_with_the_last_error() {
        let (runs, result) = always_failing(3, || Error::Busy);
        assert_eq!(runs, 3);
        match result {
            Err(Error::RetriesExhausted { attempts: 3, last }) => {
                assert!(matches!(*last, Error::Busy))
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn nested_attempts_spent_hand_a_snapshot_bound_error_on_as_it_is() {
        let spent = |err: Error| {
            let policy = RetryPolicy::immediate(2);
            match after_failure(&policy, 2, err, Spent::for_transaction(true), |_| true) {
                Next::GiveUp(err) => err,
                Next::RetryAfter(_) => panic!("attempts left"),
            }
        };
        assert!(matches!(spent(Error::Busy), Error::Busy));
        assert!(matches!(
            spent(Error::StaleRows(Vec::new())),
            Error::StaleRows(_)
        ));
        assert!(matches!(
            spent(Error::LockTimeout),
            Error::RetriesExhausted { .. }
        ));
        let outermost = match after_failure(
            &RetryPolicy::immediate(2),
            2,
            Error::Busy,
            Spent::for_transaction(false),
            |_| true,
        ) {
            Next::GiveUp(err) => err,
            Next::RetryAfter(_) => panic!("attempts left"),
        };
        assert!(matches!(outermost, Error::RetriesExhausted { .. }));
    }

    #[test]
    fn a_nested_deadlock_is_retried_in_its_savepoint_once() {
        assert!(may_retry(&Error::Deadlock, true, 1));
        assert!(!may_retry(&Error::Deadlock, true, 2));
        // The owner retries it for as long as its policy says.
        assert!(may_retry(&Error::Deadlock, false, 2));
        assert!(may_retry(&Error::LockTimeout, true, 2));
    }

    #[test]
    fn non_retryable_errors_return_at_once() {
        let (runs, result) = always_failing(5, || Error::NotFound);
        assert_eq!(runs, 1);
        assert!(matches!(result, Err(Error::NotFound)));
    }
}
