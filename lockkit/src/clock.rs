//! The application's clock in Unix milliseconds, as the tables of idempotency
//! keys and of the outbox store their times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds (0 before 1970, `i64::MAX` far in the future).
pub(crate) fn now_millis() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// A duration in milliseconds, small enough to add to or subtract from a
/// timestamp without overflow.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX / 2)
}
