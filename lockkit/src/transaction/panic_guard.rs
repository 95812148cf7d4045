//! The panic guard of every lockkit transaction.

use diesel::connection::TransactionManager;

use super::journal;
use super::scope::{self, Scope};
use super::{
    ended_by_statement, ended_silently, reported_end, settle, Began, Check, Control, Failure,
};
use crate::error::Error;

/// Catches a panic in a closure run inside a transaction, so that the transaction
/// is rolled back before the panic goes on: the connection is then left usable,
/// with no transaction open (and a pooled one is not returned mid-transaction).
///
/// It also opens the transaction's [`scope`] while the closure runs, and keeps it
/// for [`finish`](super::finish) to end.
#[derive(Default)]
pub(crate) struct PanicGuard {
    panic: Option<Box<dyn std::any::Any + Send + 'static>>,
    scope: Option<Scope>,
    /// The depth of the level it guards, once the transaction began.
    level: Option<u32>,
}

impl PanicGuard {
    /// The depth of the level it guarded, if the transaction began
    /// ([`after_level`](super::after_level)).
    pub(crate) fn level(&self) -> Option<u32> {
        self.level
    }

    /// Runs `f` (inside the transaction it guards); a panic becomes an error that
    /// makes Diesel roll back.
    pub(crate) fn call<C: Control, T, E>(
        &mut self,
        conn: &mut C,
        f: impl FnOnce(&mut C) -> Result<T, Failure<E>>,
    ) -> Result<T, Failure<E>> {
        let depth = C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth();
        let outermost = matches!(depth, Ok(Some(depth)) if depth.get() == 1);
        self.level = depth
            .as_ref()
            .ok()
            .copied()
            .flatten()
            .map(|depth| depth.get());
        let began = Began::with_work(!outermost);
        // Watched by the journal (installed on a connection without
        // instrumentation of its own), which sees a statement end the
        // transaction even when the work lets its error go.
        journal::watch(conn, C::ends);
        if outermost {
            // Diesel's `BEGIN` for this call was all the transaction sent.
            journal::saw_begin(conn);
        } else {
            if let Some(cause) = ended_by_statement(conn) {
                // The caller let the error go and calls on: on MySQL/MariaDB
                // the work would run in autocommit. Decided as a failed nested
                // call ([`finish`](super::finish)): `TransactionAborted`.
                return Err(Failure::Lockkit(cause));
            }
        }
        scope::enter(scope::conn_id(conn), outermost);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn)));
        self.scope = scope::leave();
        match result {
            // Before `COMMIT` (or `ROLLBACK`): did the work let a statement (or
            // a nested call) end this transaction?
            Ok(result) => {
                // A level the work left open above this one: a Diesel
                // `transaction` whose closure panicked, the panic caught in
                // the work, or a nested call whose `RELEASE SAVEPOINT` failed
                // (Diesel then keeps counting it). Diesel's `COMMIT` would
                // release that savepoint, not commit this level, which would
                // stay open with its locks: rolled back, deepest first. Work
                // that failed keeps its error; work that succeeded is refused.
                if let Ok(Some(own)) = depth {
                    if super::transaction_depth(conn) > own.get() {
                        roll_back_above(conn, own.get());
                        if result.is_ok() {
                            return Err(Failure::Lockkit(Error::NestedCallDropped));
                        }
                    }
                }
                if !outermost && result.is_ok() {
                    let ends = Control::ends(conn);
                    if super::may_have_aborted_level(conn, ends) {
                        if let Some(cause) = ended_by_statement(conn) {
                            return Err(Failure::Lockkit(cause));
                        }
                    }
                }
                if outermost && result.is_ok() {
                    journal::commit_tells(conn);
                }
                let whole = || {
                    let ends = Control::ends(conn);
                    journal::whole_at_end(conn, ends)
                };
                let ended = match began.check(&result, whole) {
                    Check::Nothing => None,
                    Check::Ended { stand_in } => ended_by_statement(conn).or_else(|| {
                        let unsure = journal::unsure(conn);
                        let ended = stand_in.then(|| conn.transaction_ended(None)).flatten();
                        ended_silently(conn, unsure, ended, false)
                    }),
                };
                let ended = reported_end(&result, conn, ended);
                settle(result, ended)
            }
            Err(payload) => {
                self.panic = Some(payload);
                // Diesel's own `transaction` does not roll back when its
                // closure panics: a savepoint the work opened that way is still
                // open. Rolled back here, deepest first, so that the rollback
                // after this error ends this transaction's level and not that
                // savepoint (which would leave the caller in lockkit's open
                // transaction, its row locks held).
                if let Ok(Some(own)) = depth {
                    roll_back_above(conn, own.get());
                }
                Err(Failure::Diesel(diesel::result::Error::RollbackTransaction))
            }
        }
    }

    /// Ends the transaction's scope (`committed`: it committed, or its savepoint
    /// was released), then goes on with the caught panic, if there was one.
    pub(crate) fn resume(self, committed: bool) {
        if let Some(scope) = self.scope {
            scope.end(committed && self.panic.is_none());
        }
        if let Some(payload) = self.panic {
            std::panic::resume_unwind(payload);
        }
    }
}

/// Rolls back the transactions (savepoints) open on `conn` above depth `own`,
/// deepest first; goes on while each rollback lowers the depth, failed or not
/// (Diesel counts a savepoint gone whose `ROLLBACK TO` failed because the
/// server ended the transaction), and stops when one leaves it as it was (the
/// transaction manager is broken: the rollback that follows reports it).
fn roll_back_above<C: Control>(conn: &mut C, own: u32) {
    loop {
        let depth = super::transaction_depth(conn);
        if depth <= own {
            return;
        }
        let _ = C::TransactionManager::rollback_transaction(conn);
        if super::transaction_depth(conn) >= depth {
            return;
        }
    }
}
