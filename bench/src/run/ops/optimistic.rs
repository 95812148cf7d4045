//! Hot row (and own rows), optimistic + retry: read, `update_versioned`, `lockkit::retry` on
//! `Stale`; and the same loop by hand, with the same backoff.

use std::time::Duration;

/// The hand-written retry loop's attempts: those of `RetryPolicy::default()`.
pub const HAND_ATTEMPTS: u32 = 5;

/// The backoff of the hand-written retry loop: the same schedule as
/// `RetryPolicy::default()` (full jitter, 10 ms doubling up to 1 s), written
/// without lockkit.
pub fn hand_backoff(rng: &mut fastrand::Rng, failed_attempt: u32) -> Duration {
    let ceiling = Duration::from_millis(10)
        .saturating_mul(1u32 << failed_attempt.saturating_sub(1).min(31))
        .min(Duration::from_secs(1));
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..=nanos))
}

/// Writes `optimistic` and `optimistic_hand` into one `bench_backend!`
/// instantiation, where `Conn` is its connection type and `$locks` says whether
/// the backend has row locks.
macro_rules! optimistic_ops {
    ($locks:tt) => {
        /// Read, `update_versioned`, `lockkit::retry` on `Stale`.
        fn optimistic(conn: &mut Conn, st: &mut WorkerState, id: i32) -> Result<usize, OpError> {
            let policy = st.policy.clone();
            lockkit::retry(&policy, |_| {
                attempt(st, |_| {
                    let mut item: Item = items::table
                        .find(id)
                        .select(Item::as_select())
                        .get_result(conn)?;
                    item.stock -= 1;
                    item.update_versioned(conn)
                })
            })?;
            Ok(1)
        }

        /// The same by hand: read, version-checked `UPDATE` with its own
        /// row-count check, and a retry loop with the same backoff.
        fn optimistic_hand(
            conn: &mut Conn,
            st: &mut WorkerState,
            id: i32,
        ) -> Result<usize, OpError> {
            let mut failed = 0;
            loop {
                st.counts.attempts += 1;
                let item: Item = items::table
                    .find(id)
                    .select(Item::as_select())
                    .get_result(conn)?;
                let rows = diesel::update(
                    items::table
                        .filter(items::id.eq(item.id))
                        .filter(items::lock_version.eq(item.lock_version)),
                )
                .set((
                    items::name.eq(&item.name),
                    items::stock.eq(item.stock - 1),
                    items::lock_version.eq(items::lock_version + 1),
                ))
                .execute(conn)?;
                if rows == 1 {
                    return Ok(1);
                }
                st.counts.stale += 1;
                failed += 1;
                if failed >= super::optimistic::HAND_ATTEMPTS {
                    return Err(OpError::GaveUp);
                }
                std::thread::sleep(super::optimistic::hand_backoff(&mut st.rng, failed));
            }
        }
    };
}
pub(crate) use optimistic_ops;
