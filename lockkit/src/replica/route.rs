//! Where a read goes: [`Policy`], [`Route`] and [`route`].

use std::thread;
use std::time::{Duration, Instant};

use diesel::PgConnection;

use super::{replayed_lsn, Lsn};
use crate::error::{Error, Result};
use crate::transaction::refuse_transaction_or_broken;

/// What a read that must see a write does when the replica has not replayed it
/// yet. The caller's choice; [`route`] applies it.
///
/// The waits bound how long the replica may take to catch up, not a replica
/// that does not answer: taking its connection from the pool and each look
/// at its position wait as long as the pool and the connection let them
/// (r2d2's `connection_timeout`, 30 s by default; the server's TCP
/// timeouts). Bound those on the replica's pool and URL (a short
/// `connection_timeout`, `connect_timeout` and
/// `options=-c statement_timeout=..` in the URL) when a stalled standby must
/// not hold a read that long.
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
    /// A "replica" that is not in recovery (promoted, or the pool points at
    /// the primary) is answered [`Route::PrimaryNotAStandby`] at once, as
    /// under `WaitThenPrimary`, and the [`Router`](super::Router) reads the
    /// primary then.
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
/// Each look at the replica is one `SELECT pg_last_wal_replay_lsn()` (while it
/// is in recovery), repeated with pauses from 1 to 20 ms while the policy
/// waits.
///
/// The replica is looked at outside a transaction only: inside one, the read
/// would see the snapshot the transaction took at its first statement (under
/// REPEATABLE READ), which may be older than the replay the look found.
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] when a transaction is open on `replica`
///   and the replica is to be looked at (a position to see, a policy that
///   may read the replica); nothing is sent. Route first, then open the
///   transaction. [`Error::Database`]`(BrokenTransactionManager)` on a
///   connection Diesel marked broken: a transaction a dropped call left open
///   there would serve the read from its old snapshot.
/// * [`Error::ReplicaBehind`] when the wait of [`Policy::WaitOrFail`] ran out.
/// * the errors of the replica's connection.
pub fn route(replica: &mut PgConnection, written: Option<Lsn>, policy: Policy) -> Result<Route> {
    let mut routing = match Routing::start(written, policy) {
        Ok(routing) => routing,
        Err(route) => return Ok(route),
    };
    refuse_transaction_or_broken(replica)?;
    loop {
        match routing.look(replayed_lsn(replica)?) {
            Step::Done(decided) => return decided,
            Step::Pause(pause) => thread::sleep(pause),
        }
    }
}

/// The route of a router's read that goes to the primary without a look at
/// the replica ([`Policy::Primary`] with a position), so that no replica
/// connection is taken for it: the r2d2 and the async `Router` decide here.
#[cfg(any(feature = "r2d2", feature = "async"))]
pub(crate) fn skips_the_replica(written: Option<Lsn>, policy: Policy) -> Option<Route> {
    match Routing::start(written, policy) {
        Err(route) if !route.is_replica() => Some(route),
        _ => None,
    }
}

/// What [`Routing::look`] decided: the answer, or a pause before the next look.
#[derive(Debug)]
pub(crate) enum Step {
    /// Where the read goes, or [`Error::ReplicaBehind`].
    Done(Result<Route>),
    /// Look again at the replica after this pause.
    Pause(Duration),
}

/// The decision of [`route`], one look at the replica at a time, without the
/// looking and the sleeping: the blocking [`route`] and its async twin
/// execute the same steps, each with its own connection and its own timer.
#[derive(Debug)]
pub(crate) struct Routing {
    wanted: Lsn,
    policy: Policy,
    wait: Duration,
    started: Instant,
    pause: Duration,
}

impl Routing {
    /// The routing of a read that must see `written`; `Err` holds the route
    /// when no look at the replica is needed (no position, or
    /// [`Policy::Primary`]).
    pub(crate) fn start(written: Option<Lsn>, policy: Policy) -> std::result::Result<Self, Route> {
        let Some(wanted) = written else {
            return Err(Route::Replica {
                waited: Duration::ZERO,
            });
        };
        let wait = match policy {
            Policy::Primary => return Err(Route::PrimaryByPolicy),
            Policy::WaitThenPrimary(wait) | Policy::WaitOrFail(wait) => wait,
        };
        Ok(Routing {
            wanted,
            policy,
            wait,
            started: Instant::now(),
            pause: FIRST_PAUSE,
        })
    }

    /// Takes the replica's answer to one look ([`replayed_lsn`]; `None`: not a
    /// standby) and decides, or says how long to pause before the next look.
    pub(crate) fn look(&mut self, replayed: Option<Lsn>) -> Step {
        let Some(replayed) = replayed else {
            return Step::Done(Ok(Route::PrimaryNotAStandby));
        };
        let waited = self.started.elapsed();
        if replayed >= self.wanted {
            return Step::Done(Ok(Route::Replica { waited }));
        }
        if waited >= self.wait {
            return Step::Done(match self.policy {
                Policy::WaitOrFail(_) => Err(Error::ReplicaBehind {
                    wanted: self.wanted,
                    replayed,
                    waited,
                }),
                _ => Ok(Route::PrimaryReplicaBehind { replayed, waited }),
            });
        }
        let pause = self.pause.min(self.wait - waited);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        Step::Pause(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(n: u64) -> Option<Lsn> {
        Some(Lsn::from(n))
    }

    #[test]
    fn no_look_without_a_position_or_under_the_primary_policy() {
        let wait = Policy::WaitOrFail(Duration::from_secs(1));
        assert_eq!(
            Routing::start(None, wait).unwrap_err(),
            Route::Replica {
                waited: Duration::ZERO
            }
        );
        assert_eq!(
            Routing::start(lsn(5), Policy::Primary).unwrap_err(),
            Route::PrimaryByPolicy
        );
    }

    #[test]
    fn pauses_double_up_to_the_longest_then_the_policy_decides() {
        let mut routing =
            Routing::start(lsn(5), Policy::WaitThenPrimary(Duration::from_secs(60))).unwrap();
        let pauses: Vec<Duration> = (0..7)
            .map(|_| match routing.look(lsn(4)) {
                Step::Pause(pause) => pause,
                done => panic!("{done:?}"),
            })
            .collect();
        let millis: Vec<u128> = pauses.iter().map(Duration::as_millis).collect();
        assert_eq!(millis, [1, 2, 4, 8, 16, 20, 20]);
        assert!(matches!(
            routing.look(lsn(5)),
            Step::Done(Ok(Route::Replica { .. }))
        ));
        assert!(matches!(
            routing.look(None),
            Step::Done(Ok(Route::PrimaryNotAStandby))
        ));

        let mut behind = Routing::start(lsn(5), Policy::WaitThenPrimary(Duration::ZERO)).unwrap();
        assert!(matches!(
            behind.look(lsn(4)),
            Step::Done(Ok(Route::PrimaryReplicaBehind { .. }))
        ));
        let mut fails = Routing::start(lsn(5), Policy::WaitOrFail(Duration::ZERO)).unwrap();
        assert!(matches!(
            fails.look(lsn(4)),
            Step::Done(Err(Error::ReplicaBehind { .. }))
        ));
    }
}
