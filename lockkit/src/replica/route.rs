//! Where a read goes: [`Policy`], [`Route`] and [`route`].

use std::thread;
use std::time::{Duration, Instant};

use diesel::PgConnection;

use super::{replayed_lsn, Lsn};
use crate::{Error, Result};

/// What a read that must see a write does when the replica has not replayed it
/// yet. The caller's choice; [`route`] applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// Every read that carries a write's position goes to the primary, without
    /// asking the replica. The window is how long the caller keeps the position
    /// (e.g. a cookie's `Max-Age`); reads without one go to the replica.
    Primary,
    /// Waits up to this long for the replica to replay the position, then reads
    /// on the primary. `Duration::ZERO`: the replica only if it has caught up
    /// already.
    WaitThenPrimary(Duration),
    /// Waits up to this long for the replica to replay the position, then fails
    /// with [`Error::ReplicaBehind`]: for a primary that must not take the reads.
    WaitOrFail(Duration),
}

/// Where [`route`] sent a read, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Route {
    /// The replica: the read carried no position, or the replica had replayed it
    /// after waiting `waited`.
    Replica {
        /// How long the read waited for the replica (zero if it had caught up).
        waited: Duration,
    },
    /// The primary, because the [`Policy::Primary`] says so.
    PrimaryByPolicy,
    /// The primary, because the replica had replayed only up to `replayed` when
    /// the wait of [`Policy::WaitThenPrimary`] ran out.
    PrimaryReplicaBehind {
        /// How far the replica had replayed.
        replayed: Lsn,
        /// How long the read waited.
        waited: Duration,
    },
    /// The primary, because the replica is not a standby (not in recovery: it
    /// was promoted, or it is another primary). Its data may have diverged from
    /// the primary's, so it is not read.
    PrimaryNotAStandby,
}

impl Route {
    /// Whether the read goes to the replica.
    pub fn is_replica(&self) -> bool {
        matches!(self, Route::Replica { .. })
    }
}

/// How long the first wait between two looks at the replica lasts; each next
/// one doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest wait between two looks at the replica: a standby that streams
/// replays within milliseconds, and each look is a round trip.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// Decides where a read that must see everything up to `written` (the position
/// of the reader's last write, from [`commit_lsn`](super::commit_lsn)) goes,
/// asking `replica` how far it has replayed and waiting as `policy` allows.
/// With `written` `None` (no write to see) the read goes to the replica at once.
///
/// Each look at the replica is one `SELECT pg_last_wal_replay_lsn()`, repeated
/// with pauses from 1 to 20 ms while the policy waits.
///
/// # Errors
///
/// [`Error::ReplicaBehind`] when the wait of [`Policy::WaitOrFail`] ran out; the
/// errors of the replica's connection.
pub fn route(replica: &mut PgConnection, written: Option<Lsn>, policy: Policy) -> Result<Route> {
    let Some(wanted) = written else {
        return Ok(Route::Replica {
            waited: Duration::ZERO,
        });
    };
    let wait = match policy {
        Policy::Primary => return Ok(Route::PrimaryByPolicy),
        Policy::WaitThenPrimary(wait) | Policy::WaitOrFail(wait) => wait,
    };
    let started = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        let Some(replayed) = replayed_lsn(replica)? else {
            return Ok(Route::PrimaryNotAStandby);
        };
        let waited = started.elapsed();
        if replayed >= wanted {
            return Ok(Route::Replica { waited });
        }
        if waited >= wait {
            return match policy {
                Policy::WaitOrFail(_) => Err(Error::ReplicaBehind {
                    wanted,
                    replayed,
                    waited,
                }),
                _ => Ok(Route::PrimaryReplicaBehind { replayed, waited }),
            };
        }
        thread::sleep(pause.min(wait - waited));
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
