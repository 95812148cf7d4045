//! Who opened each open transaction level of an async connection, as the
//! [`journal`](super::journal) keeps it: what decides where a nested lockkit
//! call whose future was dropped leaves its level.
//!
//! A future dropped in the middle of a call (a `tokio::time::timeout` around
//! it) cannot send `ROLLBACK TO SAVEPOINT`: its savepoint stays open, and every
//! statement sent on the connection afterwards runs inside it. Whoever ends
//! the level below decides the fate of all of it:
//!
//! * a lockkit call (its level is marked [`opened`](Levels::opened)) rolls the
//!   dropped level back at its end. What ran in the dropped level after the
//!   drop goes with it, so a statement seen there ([`on_statement`](Levels::on_statement))
//!   makes that call fail rather than commit without it;
//! * the caller's own transaction (diesel-async's `transaction`) would release
//!   the dropped savepoint as its own, report `Ok`, and stay open with nothing
//!   committed; so would the caller's next transaction after an outermost call
//!   was dropped. There the dropped call marks the connection's transaction
//!   manager broken instead (`asynchronous::connection::Level`).

/// The levels lockkit's async calls hold open on one connection, and what a
/// dropped one left.
#[derive(Debug, Default)]
pub(crate) struct Levels {
    /// Bit `l` set: level `l` (1 to 63) is a lockkit call's, which rolls back
    /// what a dropped nested call leaves above it.
    lockkit: u64,
    /// The lowest level a dropped nested call left open above a lockkit
    /// call's.
    abandoned: Option<u32>,
    /// A statement was sent while `abandoned` was open: it ran inside the
    /// dropped call's savepoint.
    stranded: bool,
    /// A statement began and its reply has not been read: its future was
    /// dropped, if nothing runs on the connection now.
    awaiting_reply: bool,
    /// A statement began while `awaiting_reply` was set: on MySQL/MariaDB it
    /// may have read the reply left unread as its own, leaving its own unread
    /// (or the first was never sent: a bind that failed). Until a probe
    /// settles it ([`in_step`](Levels::in_step)).
    out_of_step: bool,
    /// lockkit marked the connection broken on purpose (a dropped call, a
    /// reply left unread): nothing may repair it, only its pool's closing.
    condemned: bool,
}

/// What was left above a lockkit call's level when it ended
/// ([`Levels::left_above`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// A nested lockkit call dropped directly above it, and no statement since.
    Dropped,
    /// Anything else: a dropped call's level that statements ran in since, or
    /// a level nobody told the journal about (the caller's own nested
    /// transaction, dropped).
    Unknown,
}

impl Levels {
    /// A lockkit call opened `level`. Every level at or above it had closed
    /// before: what is recorded of them (a connection marked broken and
    /// repaired, a new outermost transaction) is forgotten.
    pub(crate) fn opened(&mut self, level: u32) {
        self.lockkit &= bit(level).wrapping_sub(1);
        self.lockkit |= bit(level);
        if self.abandoned.is_some_and(|abandoned| abandoned >= level) {
            self.abandoned = None;
            self.stranded = false;
        }
    }

    /// The lockkit call at `level` ended, or was dropped.
    pub(crate) fn closed(&mut self, level: u32) {
        self.lockkit &= !bit(level);
    }

    /// The lockkit call at `level` was dropped with its level open: whether a
    /// lockkit call holds the level below, which then ends it. If not, the
    /// dropped call must mark the connection broken.
    pub(crate) fn dropped(&mut self, level: u32) -> bool {
        let handed_on = level > 1 && self.lockkit & bit(level - 1) != 0;
        if handed_on {
            self.abandoned = Some(self.abandoned.map_or(level, |lowest| lowest.min(level)));
        }
        handed_on
    }

    /// What the connection reported: a statement begins, or its reply came.
    pub(crate) fn on_event(&mut self, event: &diesel::connection::InstrumentationEvent<'_>) {
        use diesel::connection::InstrumentationEvent;
        match event {
            InstrumentationEvent::StartQuery { .. } => self.on_statement(),
            InstrumentationEvent::FinishQuery { .. } => self.awaiting_reply = false,
            _ => {}
        }
    }

    /// A statement was sent on the connection.
    pub(crate) fn on_statement(&mut self) {
        self.out_of_step |= self.awaiting_reply;
        self.awaiting_reply = true;
        if self.abandoned.is_some() {
            self.stranded = true;
        }
    }

    /// Whether a statement's reply was never read: asked from the guard of a
    /// call whose future was dropped, with that statement in flight.
    pub(crate) fn reply_unread(&self) -> bool {
        self.awaiting_reply
    }

    /// Whether a statement may have left its reply unread, now or before the
    /// statements since: asked at the end of a lockkit call, where a
    /// statement of the work's own whose future the work dropped leaves one.
    pub(crate) fn replies_unsure(&self) -> bool {
        self.awaiting_reply || self.out_of_step
    }

    /// Whether a statement ran in a dropped call's level since it was left
    /// ([`on_statement`](Levels::on_statement)).
    pub(crate) fn stranded(&self) -> bool {
        self.stranded
    }

    /// A probe read back its own reply: every reply so far has been read. The
    /// probe is not the work's: a dropped call's level it ran in counts as
    /// `stranded` only if it did before.
    pub(crate) fn in_step(&mut self, stranded: bool) {
        self.awaiting_reply = false;
        self.out_of_step = false;
        self.stranded = stranded;
    }

    /// A question of lockkit's ran (SQLite's probe, which fails and changes
    /// nothing): not the work's, so a dropped call's level it ran in counts as
    /// `stranded` only if it did before.
    pub(crate) fn asked(&mut self, stranded: bool) {
        self.stranded = stranded;
    }

    /// lockkit marked the connection broken on purpose.
    pub(crate) fn condemn(&mut self) {
        self.condemned = true;
    }

    /// Whether lockkit marked the connection broken on purpose: no repair.
    pub(crate) fn condemned(&self) -> bool {
        self.condemned
    }

    /// Before a lockkit call begins: the level a dropped nested call left, if
    /// no statement ran in it since, which may then be rolled back at once, so
    /// that the new call's work does not go with it. Forgets the record.
    pub(crate) fn take_unused_drop(&mut self) -> Option<u32> {
        match (self.abandoned, self.stranded) {
            (Some(abandoned), false) => {
                self.abandoned = None;
                Some(abandoned)
            }
            _ => None,
        }
    }

    /// At the end of the lockkit call at `level`, which found levels above its
    /// own open: who left them. Forgets a dropped call's record above `level`.
    pub(crate) fn left_above(&mut self, level: u32) -> Left {
        let dropped = match self.abandoned {
            Some(abandoned) if abandoned > level => {
                self.abandoned = None;
                abandoned == level + 1 && !std::mem::take(&mut self.stranded)
            }
            _ => false,
        };
        if dropped {
            Left::Dropped
        } else {
            Left::Unknown
        }
    }
}

/// Level `level`'s bit; none past 63, which are never taken for lockkit's.
fn bit(level: u32) -> u64 {
    1u64.checked_shl(level).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Levels with lockkit calls open at `open`, in that order.
    fn opened(open: &[u32]) -> Levels {
        let mut levels = Levels::default();
        for &level in open {
            levels.opened(level);
        }
        levels
    }

    /// A lockkit call at level 1, and one nested in it at level 2 dropped.
    fn dropped_at_2() -> Levels {
        let mut levels = opened(&[1, 2]);
        assert!(levels.dropped(2));
        levels
    }

    #[test]
    fn a_call_dropped_above_a_lockkit_level_is_handed_to_it() {
        let mut levels = dropped_at_2();
        levels.closed(2);
        assert_eq!(levels.left_above(1), Left::Dropped);
        // The record is gone with the answer.
        assert_eq!(levels.left_above(1), Left::Unknown);
    }

    #[test]
    fn a_statement_after_the_drop_strands_it() {
        let mut levels = Levels::default();
        levels.opened(1);
        levels.on_statement();
        levels.opened(2);
        assert!(levels.dropped(2));
        levels.on_statement();
        assert_eq!(levels.left_above(1), Left::Unknown);
        // A later drop starts clean.
        levels.opened(2);
        assert!(levels.dropped(2));
        assert_eq!(levels.left_above(1), Left::Dropped);
    }

    #[test]
    fn a_drop_nothing_ran_in_since_is_handed_to_the_next_call() {
        let mut levels = dropped_at_2();
        assert_eq!(levels.take_unused_drop(), Some(2));
        assert_eq!(levels.take_unused_drop(), None);
        levels.opened(2);
        assert!(levels.dropped(2));
        levels.on_statement();
        assert_eq!(levels.take_unused_drop(), None, "a statement ran in it");
        assert_eq!(levels.left_above(1), Left::Unknown);
    }

    #[test]
    fn outermost_or_under_the_callers_own_level_nobody_takes_it() {
        let mut levels = opened(&[1]);
        assert!(!levels.dropped(1));
        // Level 2 is the caller's own transaction.
        levels.opened(3);
        assert!(!levels.dropped(3));
        assert!(!levels.dropped(64));
    }

    #[test]
    fn a_new_outermost_level_forgets_what_an_old_one_left() {
        let mut levels = dropped_at_2();
        levels.on_statement();
        levels.opened(1);
        assert!(!levels.dropped(3));
        assert_eq!(levels.left_above(1), Left::Unknown);
        assert_eq!(levels.abandoned, None);
        assert!(!levels.stranded);
    }

    #[test]
    fn a_level_opened_again_forgets_what_was_recorded_of_it() {
        let mut levels = opened(&[1, 2, 3]);
        assert!(levels.dropped(3));
        levels.on_statement();
        // Level 2 ends without asking (its own drop marked the connection
        // broken) and is opened again: level 2's bit is the new call's, level 3's is gone.
        levels.opened(2);
        assert!(!levels.dropped(4));
        assert!(levels.dropped(3));
        assert_eq!(
            levels.left_above(2),
            Left::Dropped,
            "the stale stranded record is gone"
        );
        // A live record below the new level stays.
        levels.opened(2);
        assert!(levels.dropped(3));
        levels.on_statement(); // the new level's SAVEPOINT
        levels.opened(4);
        assert_eq!(
            levels.left_above(2),
            Left::Unknown,
            "the new level's SAVEPOINT ran in it"
        );
    }

    #[test]
    fn a_call_dropped_inside_a_dropped_call_leaves_the_lower_level() {
        let mut levels = opened(&[1, 2, 3]);
        assert!(levels.dropped(3));
        levels.closed(3);
        assert!(levels.dropped(2));
        levels.closed(2);
        assert_eq!(levels.left_above(1), Left::Dropped);
    }
}
