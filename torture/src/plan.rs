//! What every worker does next, blocking thread or async task alike: its
//! operations, drawn from its own seeded random numbers, and how patiently it
//! retries a conflict.

use std::time::Duration;

use lockkit::RetryPolicy;

use crate::config::Config;
use crate::stats::{Op, Strategy};

/// Conflicts are retried with a short, jittered backoff, and patiently: a
/// thread that still loses after this many attempts is starving, which the run
/// reports as a failure.
pub(crate) fn retry_policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(500)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(25))
}

/// The next operation of a worker thread (or task): a strategy and its order.
pub(crate) fn next_op(rng: &mut fastrand::Rng, config: &Config, id: i64, worker: &str) -> Op {
    let strategy = Strategy::pick(rng, Strategy::of_run(config.asynchronous));
    let mut item = || rng.i32(1..=config.items);
    let lines = match strategy {
        Strategy::LockAll => {
            let mut ids: Vec<i32> = (1..=config.items).collect();
            rng.shuffle(&mut ids);
            ids.truncate(rng.usize(2..=3).min(ids.len()));
            ids.into_iter().map(|id| (id, rng.i32(1..=3))).collect()
        }
        Strategy::ByVersion => {
            let id = item();
            vec![(id, -rng.i32(1..=12))]
        }
        Strategy::SkipLocked => Vec::new(),
        _ => {
            let id = item();
            vec![(id, rng.i32(1..=3))]
        }
    };
    Op {
        id,
        strategy,
        lines,
        batch: rng.i64(1..=6),
        worker: worker.to_owned(),
        bump: config.bump,
    }
}

/// The random numbers of worker thread (or task) `thread` of a process.
pub(crate) fn thread_rng(config: &Config, thread: u32) -> fastrand::Rng {
    fastrand::Rng::with_seed(
        config
            .seed
            .wrapping_add(u64::from(thread).wrapping_mul(0x2545_f491_4f6c_dd1d)),
    )
}
