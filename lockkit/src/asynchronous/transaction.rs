//! The ground floor of the async side: how every async lockkit transaction
//! ends ([`end`]), as the blocking side's [`finish`](crate::transaction)
//! does, with the same decisions ([`Failed`], [`settle`]).

use diesel_async::TransactionManager;

use super::connection::{in_transaction, AsyncLockingConnection, Begun, Level, Restore};
use super::work::ConnAttempt;
use crate::error::classification::classify;
use crate::error::Error;
use crate::transaction::journal;
use crate::transaction::{settle, Check, Failed, Failure};

/// The end of every async lockkit transaction, `began` nested in an open one or
/// not:
///
/// * first roll back what a nested call whose future was dropped left open
///   above this call's own level ([`roll_back_dropped`](super::connection::roll_back_dropped)),
///   so that what follows ends this call's level;
/// * commit on `Ok`, unless the work caught an abort of the whole transaction
///   ([`Began`](crate::transaction::Began), as on the blocking side); a failed `COMMIT` is classified (a
///   serialization failure or deadlock found at commit is retryable like any
///   other);
/// * roll back on `Err`;
/// * put back the session setting the transaction changed;
/// * decide the caller's error as the blocking side does ([`Failed`]): a nested
///   transaction whose whole transaction the server ended is
///   [`Error::TransactionAborted`].
///
/// It takes the call's [`Level`] and closes it: a future dropped in the middle
/// of these statements (its `COMMIT` or `RELEASE` may be in flight) marks the
/// connection broken rather than hand the level on.
pub(crate) async fn end<C, T, E>(
    mut level: Level<'_, C>,
    began: impl Into<Begun>,
    restore: Restore,
    result: Result<T, Failure<E>>,
) -> Result<T, E>
where
    C: AsyncLockingConnection,
    E: From<Error> + Send,
    T: Send,
{
    level.ending();
    let conn = &mut *level;
    let begun: Begun = began.into();
    // The statements and decisions; a `return` in them ends this block.
    let result = async move {
        let began = begun.began;
        let nested = began.nested;
        // Before anything is sent (MySQL/MariaDB): a statement of the work's
        // own that it cut short left its reply unread, which this end's
        // statements would read as theirs (a `ROLLBACK` answered by an
        // `UPDATE`'s row count, the real answer left for the pool's next
        // user). The connection is condemned instead (its pool closes it):
        // nothing commits, and the work's error stands (for `Ok`, the broken
        // connection's).
        if super::connection::replies_out_of_step(conn).await {
            // The outermost level ends the server's transaction, so that its
            // locks go now, not when the pool closes the connection (deadpool
            // looks at it only at its next check-out). Nested, the
            // transaction stays open (a rollback would leave the caller's
            // next statements in autocommit) until the outermost end's.
            if !nested {
                // Diesel's books see no rollback: the versions written in the
                // transaction count as rolled back now, not when the
                // connection is dropped (also if this future is dropped while
                // the server rolls back).
                journal::outermost_ended(&mut journal::AsyncWatched(&mut *conn));
                super::connection::roll_back_out_of_step(conn).await;
            }
            let failure = match result {
                Ok(_) => Failure::Diesel(diesel::result::Error::BrokenTransactionManager),
                Err(failure) => failure,
            };
            return Err(Failed::from_failure(failure, classify).into_error(
                nested,
                None,
                |cause| cause,
            ));
        }
        // First the levels a dropped nested call left open above this call's own.
        // The work's own error stands before the work that went with them: nothing
        // is committed either way.
        let result = match (
            super::connection::roll_back_dropped(conn, &begun).await,
            result,
        ) {
            (Ok(()), result) => result,
            (Err(Failure::Lockkit(Error::NestedCallDropped)), Err(failure)) => Err(failure),
            (Err(failure), _) => Err(failure),
        };
        // This call's own level in diesel-async's books: its transaction, or the
        // savepoint nested in the caller's.
        let depth = super::connection::transaction_depth(conn);
        // A nested level whose work let a statement abort the transaction
        // (PostgreSQL): as the blocking side's panic guard decides it.
        let result = match result {
            Ok(value) if nested => {
                let watched = &mut journal::AsyncWatched(&mut *conn);
                let ends = journal::Watched::ends(watched);
                let ended = match crate::transaction::may_have_aborted_level(watched, ends) {
                    true => super::connection::ended_by_seen_statement(conn).await,
                    false => None,
                };
                match ended {
                    Some(cause) => Err(Failure::Lockkit(cause)),
                    None => Ok(value),
                }
            }
            result => result,
        };
        // Before `COMMIT` (or `ROLLBACK`): did the work let a statement (or a
        // nested call) end this transaction? As the blocking side's panic guard
        // asks it.
        if !nested && result.is_ok() {
            journal::commit_tells(&mut journal::AsyncWatched(&mut *conn));
        }
        let check = began.check(&result, || {
            let watched = &mut journal::AsyncWatched(&mut *conn);
            let ends = journal::Watched::ends(watched);
            journal::whole_at_end(watched, ends)
        });
        let ended = match check {
            Check::Nothing => None,
            Check::Ended { stand_in } => {
                match super::connection::ended_by_seen_statement(conn).await {
                    Some(cause) => Some(cause),
                    None if stand_in => {
                        let unsure = journal::unsure(&mut journal::AsyncWatched(&mut *conn));
                        let ended = conn.transaction_ended(None).await;
                        let watched = &mut journal::AsyncWatched(&mut *conn);
                        crate::transaction::ended_silently(watched, unsure, ended, false)
                    }
                    None => None,
                }
            }
        };
        let watched = &mut journal::AsyncWatched(&mut *conn);
        let ended = crate::transaction::reported_end(&result, watched, ended);
        let result = settle(result, ended);
        let mut restore = restore;
        let result = match result {
            Ok(value) => match conn.restore(&restore, true).await {
                Ok(()) => {
                    restore = restore.after_end();
                    match conn.commit_marked().await {
                        Ok(()) => C::TransactionManager::commit_transaction(conn)
                            .await
                            .map(|()| value)
                            .map_err(Failure::Diesel),
                        Err(err) => Err(Failure::Diesel(err)),
                    }
                }
                Err(err) => Err(Failure::Diesel(err)),
            },
            Err(failure) => Err(failure),
        };
        let mut rollback_failed = None;
        let mut wrote_after_sqlite_rollback = None;
        if result.is_err() && depth > 0 && super::connection::transaction_depth(conn) == depth {
            // Read before the rollback, whose end the journal forgets it at.
            let wrote = journal::wrote_after_failed(&mut journal::AsyncWatched(&mut *conn));
            // Roll back this call's level, if it is still open: after a failed
            // COMMIT or RELEASE SAVEPOINT diesel-async has already ended (or given
            // up on) it, and one more rollback would end the caller's. A broken
            // transaction manager says less than the error behind it.
            match C::TransactionManager::rollback_transaction(conn).await {
                Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => {}
                // SQLite had rolled the whole transaction back under the work:
                // the work's error stands, as on the blocking side, unless the
                // work wrote after it.
                Err(rollback) if crate::transaction::rolled_back_by_sqlite(&rollback) => {
                    wrote_after_sqlite_rollback =
                        crate::transaction::wrote_after_sqlite_rollback(wrote);
                }
                Err(rollback) => rollback_failed = Some(rollback),
            }
        }
        if result.is_err() {
            crate::transaction::rolled_back(conn, depth.max(1));
        }
        // The level as it began (diesel-async's count may have fallen since).
        let level = begun.level.or((depth > 0).then_some(depth));
        crate::transaction::after_level(
            &mut journal::AsyncWatched(&mut *conn),
            super::connection::status_of,
            nested,
            level,
        );
        let restored = conn.restore(&restore, false).await;
        if !nested {
            redo(conn).await;
        }
        // As on the blocking side (`transaction::finish`): nested, a restore
        // that found the whole transaction ended ends the call.
        let failure = match (result, restored) {
            (Ok(value), Ok(())) => return Ok(value),
            (Ok(value), Err(err)) => {
                let cause = classify(err);
                let ended = match nested {
                    true => conn.transaction_ended(Some(&cause)).await,
                    false => None,
                };
                let Some(ended) = ended else {
                    crate::transaction::setting_kept(&cause);
                    return Ok(value);
                };
                if in_transaction(conn) {
                    conn.keep_aborted().await;
                }
                let failed = Failed::<E>::Lockkit(cause);
                return Err(failed.into_error(true, Some(ended), |cause| {
                    journal::aborted(&mut journal::AsyncWatched(conn), cause)
                }));
            }
            (Err(failure), _) => failure,
        };
        if !nested {
            conn.repair().await;
        }
        let failed = Failed::from_failure(failure, classify);
        let unsure = journal::unsure(&mut journal::AsyncWatched(&mut *conn));
        let (asked, ended) = match failed.question(nested) {
            Some(cause) => (true, conn.transaction_ended(cause).await),
            None => (false, None),
        };
        // No transaction open under a nested call, and nothing the journal
        // saw ended it: a statement committed it implicitly, and the owner
        // must not run the committed work again.
        let watched = &mut journal::AsyncWatched(&mut *conn);
        let ended = crate::transaction::ended_silently(watched, unsure, ended, true);
        // A statement of the work that wrote after the end committed on its
        // own: the end the caller's retry sees must say so.
        let ended = ended.map(|cause| crate::transaction::ended_under_failed_work(watched, cause));
        // Only while the caller's transaction is open in diesel-async's books:
        // the caller's rollback then ends the stand-in, and nothing is left open
        // behind the books' back.
        if ended.is_some() && in_transaction(conn) {
            conn.keep_aborted().await;
        }
        // A savepoint that could not be rolled back because the server had ended
        // the whole transaction (InnoDB's deadlock victim) is decided like any other
        // nested failure; otherwise the failed rollback is the error, as Diesel's
        // own transactions report it.
        if let Some(rollback) = rollback_failed {
            if !nested || (asked && ended.is_none()) {
                return Err(E::from(classify(rollback)));
            }
        }
        if let Some(wrote) = wrote_after_sqlite_rollback {
            return Err(E::from(classify(wrote)));
        }
        Err(failed.into_error(nested, ended, |cause| {
            journal::aborted(&mut journal::AsyncWatched(conn), cause)
        }))
    }
    .await;
    level.closed();
    result
}

/// A panic of a call's work, caught while the call's [`Level`] is open: the
/// blocking side's panic guard. Left to the level's guard, the panic would
/// leave the level open, to be found by the caller's next statement: on
/// PostgreSQL and MySQL/MariaDB the connection marked broken, and on SQLite,
/// whose connection a panicking thread cannot reach, not even that (your own
/// transaction's commit would then release the call's savepoint in place of
/// committing, and return `Ok`).
pub(crate) struct Panicked(Box<dyn std::any::Any + Send>);

impl Panicked {
    /// Awaits `work`, the part of a call that runs your code, catching its
    /// panic.
    pub(crate) async fn catch<F: std::future::Future>(work: F) -> Result<F::Output, Panicked> {
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(cx)))
            {
                Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
                Ok(std::task::Poll::Ready(output)) => std::task::Poll::Ready(Ok(output)),
                Err(panic) => std::task::Poll::Ready(Err(Panicked(panic))),
            }
        })
        .await
    }

    /// Ends the call's `level` as a failed work's ([`end`]: rolled back, the
    /// session setting put back), before the panic goes on.
    pub(crate) async fn end<C: AsyncLockingConnection>(
        self,
        level: Level<'_, C>,
        began: impl Into<Begun>,
        restore: Restore,
    ) -> Self {
        let failed = Err(Failure::Lockkit(Error::InvalidInput("the work panicked")));
        let _ = end::<C, (), Error>(level, began, restore, failed).await;
        self
    }

    /// Lets the panic go on.
    pub(crate) fn resume(self) -> ! {
        std::panic::resume_unwind(self.0)
    }
}

/// [`end`] for the answer of work awaited under [`Panicked::catch`]: its
/// result, or its panic once the level ended ([`Panicked::end`]), to be let
/// go on ([`Panicked::resume`]) after whatever the call settles first.
pub(crate) async fn end_caught<C, T, E>(
    level: Level<'_, C>,
    began: impl Into<Begun>,
    restore: Restore,
    worked: Result<Result<T, Failure<E>>, Panicked>,
) -> Result<Result<T, E>, Panicked>
where
    C: AsyncLockingConnection,
    E: From<Error> + Send,
    T: Send,
{
    match worked {
        Ok(result) => Ok(end(level, began, restore, result).await),
        Err(panicked) => Err(panicked.end(level, began, restore).await),
    }
}

/// One attempt of a retried call's work (`transaction_with_retry`,
/// `serializable`) in the transaction just begun on `conn`: `op` under the
/// level's guard ([`Level`]), then [`end`].
pub(crate) async fn attempt<C, T, E, F>(
    conn: &mut C,
    began: impl Into<Begun>,
    op: &mut F,
) -> Result<T, E>
where
    C: AsyncLockingConnection,
    E: From<Error> + Send,
    T: Send,
    F: ConnAttempt<C, T, E>,
{
    let mut level = Level::opened(conn);
    let worked = Panicked::catch(async { op(&mut *level).await.map_err(Failure::Closure) }).await;
    let ended = end_caught(level, began, Restore::Nothing, worked).await;
    ended.unwrap_or_else(|panicked| panicked.resume())
}

/// After lockkit's own outermost transaction on `conn` ended: sends again,
/// outside any transaction, what the journal keeps that a rollback undid and
/// must stand (the blocking side's `transaction::redo`); nothing while the
/// transaction manager is broken. Best effort.
async fn redo<C: AsyncLockingConnection>(conn: &mut C) {
    if !journal::redo_kept() {
        return;
    }
    let status = C::TransactionManager::transaction_manager_status_mut(conn);
    if !matches!(status.transaction_depth(), Ok(None)) {
        return;
    }
    let watched = &mut journal::AsyncWatched(&mut *conn);
    for redo in journal::take_redo::<journal::AsyncRedo<C>, _>(watched) {
        redo(conn).await;
    }
}
