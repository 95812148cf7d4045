//! The ground floor: what every lockkit transaction does the same way, whatever
//! it locks. Nothing here is public but [`after_commit`] and the [`journal`],
//! which the crate re-exports; the strategies above build on it.
//!
//! Every transaction lockkit opens for a closure (`with_lock`,
//! `locked_transaction`, `serializable`, `transaction_with_retry`, idempotency
//! keys) runs the closure behind the [`PanicGuard`] and ends in [`finish`], which
//! decides, once, what the caller gets back (the async connections' end decides
//! it with the same [`Failed`]):
//!
//! * the closure's own error, untouched, in the caller's error type;
//! * lockkit's own failures (`BEGIN`, a setting, the locked read, `COMMIT`)
//!   classified into [`Error`] and converted with `From`;
//! * a nested transaction (a savepoint) whose whole transaction the server ended
//!   (InnoDB does on a deadlock): [`Error::TransactionAborted`], not retryable,
//!   for the owner of the outermost transaction, which hands on its cause
//!   (retryable) whatever its work returned after it ([`swallowed`]); see
//!   [`connection`](crate::pessimistic::connection#when-the-server-aborts-the-whole-transaction).
//!
//! While the closure runs, the transaction's [`scope`] gathers the work queued
//! with [`after_commit`] and the locks taken, so that [`finish`] can run the one
//! after `COMMIT` and measure how long the others were held.
//!
//! Beneath them all, the [`journal`] (lockkit's Diesel instrumentation on the
//! connection) watches every transaction end and every statement that ends
//! one on the server, for lockkit's own transactions and the caller's alike.
//! The versioned writes keep their record of the versions they wrote in it
//! (`optimistic::rollbacks`), told how each transaction ended: this floor
//! names nothing above it.

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

mod after_commit;
mod begin;
pub mod journal;
#[cfg(feature = "async")]
pub(crate) mod levels;
mod panic_guard;
mod read_only_sessions;
pub(crate) mod scope;

use std::sync::atomic::{AtomicU64, Ordering};

use diesel::connection::TransactionManager;
use diesel::Connection;

pub use after_commit::after_commit;
pub(crate) use begin::*;
pub(crate) use panic_guard::PanicGuard;
#[cfg(feature = "mysql")]
pub use read_only_sessions::read_only_outside_transactions;
#[cfg(all(feature = "mysql", feature = "async"))]
pub(crate) use read_only_sessions::{answers_in_transaction, in_transaction_probe, SET_READ_ONLY};

use crate::error::classification::classify;
use crate::error::Aborted;
use crate::error::Error;

/// A lockkit transaction's failure on its way to the caller.
pub(crate) enum Failure<E> {
    /// From Diesel's transaction statements (`BEGIN`, `SAVEPOINT`, `COMMIT`,
    /// `ROLLBACK`), not classified yet: which statement failed decides how.
    Diesel(diesel::result::Error),
    /// From one of lockkit's own steps inside the transaction.
    Lockkit(Error),
    /// The closure's own error, handed back untouched.
    Closure(E),
}

impl<E> From<diesel::result::Error> for Failure<E> {
    fn from(err: diesel::result::Error) -> Self {
        Failure::Diesel(err)
    }
}

impl<E> From<Error> for Failure<E> {
    fn from(err: Error) -> Self {
        Failure::Lockkit(err)
    }
}

/// What the transaction plumbing asks of a connection. Implemented for the
/// connections lockkit supports and for [`Dispatch`](crate::multi::Dispatch)
/// enums over them, and only by lockkit: it seals
/// [`LockingConnection`](crate::LockingConnection).
pub trait Control: Connection + Sized + 'static {
    /// Opens a lockkit call's level: Diesel's `BEGIN`, or a `SAVEPOINT` when
    /// a transaction is open. MySQL/MariaDB begin with
    /// [`MYSQL_BEGIN`](crate::transaction::MYSQL_BEGIN) instead.
    #[doc(hidden)]
    fn begin_level(&mut self) -> diesel::QueryResult<()> {
        Self::TransactionManager::begin_transaction(self)
    }

    /// Before Diesel's `COMMIT` of a level whose work succeeded: on
    /// MySQL/MariaDB, the outermost transaction begun with
    /// [`MYSQL_BEGIN_MARKED`](crate::transaction::MYSQL_BEGIN_MARKED) commits
    /// with the batch [`journal::marked_commit`] picks, which fails where the
    /// server ended it. The default: nothing.
    #[doc(hidden)]
    fn commit_marked(&mut self) -> diesel::QueryResult<()> {
        Ok(())
    }

    /// After a nested transaction failed (with `cause` when lockkit can see it):
    /// whether the server has ended the whole transaction, and why. Asked on
    /// error paths only. Where the server answers that the transaction is
    /// open, lockkit's journal forgets what it saw end it (a caller that then
    /// commits commits). The default: only a lost connection does.
    fn transaction_ended(&mut self, cause: Option<&Error>) -> Option<Error> {
        connection_lost(cause)
    }

    /// After [`transaction_ended`](Self::transaction_ended) found that the server
    /// ended the whole transaction under a nested call: keeps the caller's code
    /// from writing on in autocommit ([`keep_aborted_sql`]). The default: nothing
    /// (only MySQL/MariaDB end a transaction and keep the connection).
    fn keep_aborted(&mut self) {}

    /// After an outermost transaction failed: puts Diesel's transaction manager
    /// back in order when it gave up on the connection although the server has
    /// no transaction open. The default: nothing.
    fn repair(&mut self) {}

    /// After lockkit's journal saw a statement end the open transaction
    /// with `cause` ([`ended_by_statement`]): whether the server agrees (where
    /// it cannot answer, as MySQL 8 cannot, the cause decides). Asked on that
    /// path only. The default: yes.
    fn confirms_abort(&mut self, cause: &Error) -> bool {
        let _ = cause;
        true
    }

    /// How a failed statement leaves the open transaction on this connection's
    /// backend, for lockkit's journal. The default: read off the backend type.
    fn ends(&mut self) -> journal::Ends {
        journal::Ends::of::<Self::Backend>()
    }
}

/// The error of a statement that ended the open transaction on `conn` while the
/// work let it go (lockkit's journal saw it fail), once the server confirms that
/// the transaction is over; else the journal forgets it (the work recovered
/// with a savepoint of its own, in SQL). Where the journal may have missed such
/// a statement (installed now, inside the caller's transaction), the server is
/// asked whether the transaction is alive. The async connections' twin asks the
/// same.
pub(crate) fn ended_by_statement<C: Control>(conn: &mut C) -> Option<Error> {
    // Installed now, inside the caller's transaction, it asks the server once.
    journal::watch(conn, C::ends);
    if let Some(cause) = ended_on_sqlite(conn) {
        return Some(cause);
    }
    if !journal::watches(conn) {
        return ended_unwatched(conn);
    }
    if journal::unsure(conn) {
        // An answer that it is alive makes the journal sure (`ended_unless_open`);
        // a question that failed leaves it unsure.
        if let Some(cause) = conn.transaction_ended(None) {
            journal::answered(conn, Some(&cause));
            return Some(ended_under_work(conn, cause));
        }
    }
    let cause = journal::ended_by(conn)?;
    if conn.confirms_abort(&cause) {
        Some(cause)
    } else {
        journal::forget_abort(conn);
        None
    }
}

/// SQLite: whether a statement that failed in the open transaction on `conn`
/// (lockkit's journal saw it: [`journal::take_failed_statement`]) rolled back the whole
/// transaction, as a trigger's `RAISE(ROLLBACK, ..)`, an `ON CONFLICT ROLLBACK`
/// constraint and SQLite's own rollback after `SQLITE_FULL`, `SQLITE_IOERR` or
/// `SQLITE_NOMEM` do; then its error, the cause. SQLite runs every statement
/// after such a rollback in autocommit: a nested lockkit call would begin and
/// commit on its own, under the caller's code that let the error go. Asked
/// with a statement that always fails ([`SQLITE_PROBE`]): Diesel's SQLite
/// connection drops its transaction depth to none when a statement fails with
/// no transaction open on SQLite, and the journal, which still has the
/// transaction open, is told it rolled back ([`journal::ended_unseen`]).
/// Nothing is sent unless a statement failed in the transaction since lockkit
/// last asked, or may have before its journal watched the connection, or a
/// statement of the work succeeded in Diesel's eyes since (one that answers
/// with rows may have met such a rollback unseen: [`journal::own`] says which
/// are lockkit's own, which ask nothing); on the other backends, never.
pub(crate) fn ended_on_sqlite<C: Connection>(conn: &mut C) -> Option<Error> {
    if let Some(cause) = journal::orphaned(conn) {
        return Some(cause);
    }
    let seen = journal::seen_failure(conn);
    let failed = journal::take_failed_statement(conn)?;
    let before = transaction_depth(conn);
    let probe = probe_for(conn);
    let _ = conn.batch_execute(probe);
    after_probe(
        conn,
        C::TransactionManager::transaction_manager_status_mut,
        failed,
        (before, seen),
    )
}

/// What [`SQLITE_PROBE`], sent on `conn` where Diesel counted `before` levels
/// open after `failed` failed (and the journal had `seen` a statement fail in
/// the transaction: [`journal::seen_failure`]), tells (blocking or async;
/// `status`: the connection's transaction manager): the error to refuse with,
/// if SQLite had rolled back the whole transaction.
pub(crate) fn after_probe<W: journal::Watched>(
    conn: &mut W,
    status: impl FnOnce(&mut W) -> &mut diesel::connection::TransactionManagerStatus,
    failed: (diesel::result::DatabaseErrorKind, String),
    (before, seen): (u32, bool),
) -> Option<Error> {
    // The probe's own failure is no news.
    journal::probe_failed(conn, seen);
    // Kept where the probe finds the transaction alive, too: a savepoint of
    // the work's own may have begun a new transaction after SQLite's
    // rollback, in which the probe finds it alive, while what the work wrote
    // before had committed on its own.
    let wrote = journal::wrote_after_failed(conn) || journal::wrote_after_unseen(conn);
    if journal::ended_unseen(conn).is_none() {
        // Alive: the statements whose errors the journal may not have seen
        // rolled nothing back.
        journal::read_answered(conn);
        return None;
    }
    if before == 0 {
        // Diesel had already dropped the transaction (a failed statement of
        // the caller's own): lockkit cannot tell whether the callers still
        // run in it, and refuses this call only.
        let (kind, message) = failed;
        return Some(journal::recall(kind, message));
    }
    // The question dropped it, inside this call: the callers' code still runs
    // and counts the transaction open. Diesel's count says so again, so that
    // lockkit's later calls in it refuse too (`journal::orphaned`) and the
    // outermost caller's end, which Diesel tells, closes it.
    restore_depth(status(conn), before);
    let orphaned = journal::orphan(conn, Some(failed), before);
    journal::set_wrote_after_failed(conn, wrote);
    Some(orphaned)
}

/// After a lockkit level opened at depth `level` on `conn` ended (`nested`:
/// inside its caller's transaction), blocking or async (`status`: the
/// connection's transaction manager): where Diesel's count of open levels fell
/// below the caller's, SQLite rolled back the whole transaction under this
/// level, and its `ROLLBACK TO` (or `RELEASE`), failing in autocommit, made
/// Diesel drop the count. The caller's code runs on: the count is put back and
/// lockkit refuses until the outermost caller ends it (see
/// [`ended_on_sqlite`]). At the end of lockkit's outermost level, what the
/// journal still counts open ended with it.
pub(crate) fn after_level<W: journal::Watched>(
    conn: &mut W,
    status: impl FnOnce(&mut W) -> &mut diesel::connection::TransactionManagerStatus,
    nested: bool,
    level: Option<u32>,
) {
    let now = conn.depth().unwrap_or(0);
    if !nested {
        if now == 0 {
            journal::outermost_ended(conn);
        }
        return;
    }
    let Some(caller) = level.and_then(|level| level.checked_sub(1)) else {
        return;
    };
    if caller == 0 || now >= caller {
        return;
    }
    restore_depth(status(conn), caller);
    let _ = journal::orphan(conn, None, caller);
}

/// Puts Diesel's (or diesel-async's) count of open levels back up to `depth`
/// where SQLite's rollback of the whole transaction dropped it (see
/// [`ended_on_sqlite`]); the server has no transaction open, as without
/// lockkit's question.
pub(crate) fn restore_depth(status: &mut diesel::connection::TransactionManagerStatus, depth: u32) {
    use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
    if let TransactionManagerStatus::Valid(valid) = status {
        while valid.transaction_depth().map_or(0, |d| d.get()) < depth {
            if valid
                .change_transaction_depth(TransactionDepthChange::IncreaseDepth)
                .is_err()
            {
                return;
            }
        }
    }
}

/// [`ended_on_sqlite`]'s statement: the release of a savepoint that no one
/// opens, which fails whether a transaction is open or not, and changes
/// nothing.
pub(crate) const SQLITE_PROBE: &str = "RELEASE SAVEPOINT lockkit_probe_never_opened";

/// [`ended_on_sqlite`]'s statement where the journal does not know the
/// backend (a `MultiConnection` enum's): it fails on SQLite only (which has
/// no `version()`), and changes nothing anywhere. [`SQLITE_PROBE`] would fail
/// on PostgreSQL too, and abort a transaction that a failed statement left
/// alive there (one Diesel reports without the server: an empty query, too
/// many binds).
pub(crate) const UNKNOWN_PROBE: &str = "SELECT version()";

/// The statement [`ended_on_sqlite`] (and its async twin) sends on `conn`.
pub(crate) fn probe_for<W: journal::Watched>(conn: &mut W) -> &'static str {
    if journal::rule_unknown(conn) {
        UNKNOWN_PROBE
    } else {
        SQLITE_PROBE
    }
}

/// [`ended_on_sqlite`] before lockkit begins a transaction or writes on
/// `conn`: [`Error::TransactionAborted`] when a statement the caller let go
/// rolled back the transaction it runs in, so that nothing is begun or
/// written in autocommit.
pub(crate) fn refuse_if_ended_on_sqlite<C: Connection>(conn: &mut C) -> Result<(), Error> {
    match ended_on_sqlite(conn) {
        Some(cause) => Err(journal::aborted(conn, cause)),
        None => Ok(()),
    }
}

/// What confirms that a PostgreSQL transaction is aborted, for the blocking
/// and the async connections: it fails there, and only there.
#[cfg(feature = "postgres")]
pub(crate) const PG_CONFIRM_ABORT: &str = "SELECT 1";

/// [`ended_by_statement`] where no journal watches `conn` (instrumentation of
/// its own, not wrapped in [`Journal::wrap`](crate::journal::Journal::wrap)):
/// lockkit cannot see a statement of the work end the open transaction, so it
/// asks the server whether the transaction is alive. PostgreSQL aborts it at
/// any failed statement: the probe (`SELECT 1`) then fails, and its error is
/// the cause. MySQL/MariaDB end it at a deadlock: `@@in_transaction`
/// ([`Control::transaction_ended`]). SQLite can (a trigger's `RAISE(ROLLBACK,
/// ..)`), but has no question to ask: without a journal that saw the failed
/// statement, lockkit cannot tell (the README says so). One round trip before
/// each `COMMIT` of lockkit's and each nested call on such a connection, the
/// price of not wrapping its instrumentation. Outside a transaction, nothing.
/// The async connections' twin asks the same.
pub(crate) fn ended_unwatched<C: Control>(conn: &mut C) -> Option<Error> {
    if !in_transaction(conn) {
        return None;
    }
    match conn.ends() {
        #[cfg(feature = "postgres")]
        journal::Ends::UntilSavepointRollback => {
            let probe = PG_CONFIRM_ABORT;
            conn.batch_execute(probe).err().map(classify)
        }
        journal::Ends::OnDeadlock => conn.transaction_ended(None),
        _ => None,
    }
}

/// What an outermost transaction reports of an end the server made under its
/// work (`ended`), for the blocking panic guard and the async connections'
/// end alike:
///
/// * where the work returned `Ok` and no journal watches `conn`
///   ([`ended_unwatched`]): on MySQL/MariaDB, which then has no transaction
///   open, a deadlock rolled it back or a statement of the work committed it
///   implicitly (DDL, `TRUNCATE`, `LOCK TABLES`), and lockkit cannot tell which;
/// * where the journal saw a statement of the work write after the end
///   ([`journal::wrote_after_end`]: the work let a deadlock go on
///   MySQL/MariaDB, and went on in autocommit): that statement committed on its
///   own.
///
/// Neither is retryable, so that no retry applies committed work twice. Work
/// that failed otherwise, and the other answers (a lost connection), stand as
/// they are.
pub(crate) fn reported_end<T, E, W: journal::Watched>(
    result: &Result<T, Failure<E>>,
    conn: &mut W,
    ended: Option<Error>,
) -> Option<Error> {
    match ended {
        Some(Error::Deadlock) if result.is_ok() && !journal::watches(conn) => {
            Some(unseen(ENDED_UNSEEN))
        }
        ended => ended.map(|cause| ended_under_work(conn, cause)),
    }
}

/// What ended a transaction under the work (`cause`, a statement's error the
/// journal saw), as lockkit reports it: [`WROTE_AFTER_END`] where a statement of
/// the work wrote after it (on MySQL/MariaDB, in autocommit: it committed on
/// its own), else `cause`. For [`reported_end`], and for the idempotency keys,
/// which ask before their own last write.
pub(crate) fn ended_under_work<W: journal::Watched>(conn: &mut W, cause: Error) -> Error {
    let may_have_written = journal::wrote_while_unsure(conn);
    ended_under(conn, cause, may_have_written)
}

/// `cause`, or the error that says statements of the work committed on their
/// own: certainly where the journal saw one write after the end, else where
/// the caller says one may have (`may_have_written`).
fn ended_under<W: journal::Watched>(conn: &mut W, cause: Error, may_have_written: bool) -> Error {
    if journal::wrote_after_end(conn) {
        unseen(WROTE_AFTER_END)
    } else if may_have_written {
        unseen(MAY_HAVE_WRITTEN_AFTER_END)
    } else {
        cause
    }
}

/// What a nested lockkit transaction whose work failed reports of the end
/// its question found (`cause`), blocking and async: where lockkit knows that
/// statements of the work ran after the end (the journal saw one write after
/// it, or a lockkit call in the work already refused saying so), the error
/// that no retry takes up; else `cause`.
///
/// A write after a read that may have hidden the end
/// ([`journal::wrote_while_unsure`]) does not count here, unlike in
/// [`ended_under_work`]: most often the work's error is that read's own (a
/// locking read by a range, the deadlock's victim, after the write), the
/// write went with the rollback, and the retry is the one the caller wants.
/// lockkit cannot tell that from work that let the read's error go, wrote on
/// in autocommit and then failed otherwise; it keeps the retry, as the
/// outermost end does for failed work (which asks the server nothing), and the
/// README names the case.
pub(crate) fn ended_under_failed_work<W: journal::Watched>(conn: &mut W, cause: Error) -> Error {
    let reported = journal::reported_own_commits(conn);
    ended_under(conn, cause, reported)
}

/// Whether `error` says that statements of the work may have committed on their
/// own after its transaction ended under it ([`reported_end`],
/// [`ended_silently`]): not retried, and an idempotency key is not released
/// for it, so that nothing is applied twice.
pub(crate) fn may_have_committed(error: &Error) -> bool {
    match error {
        Error::Database(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            info,
        )) => {
            [
                WROTE_AFTER_END,
                MAY_HAVE_WRITTEN_AFTER_END,
                ENDED_UNSEEN,
                ENDED_SILENTLY,
                ENDED_SILENTLY_UNDER_NESTED,
            ]
            .contains(&info.message())
                || info.message() == WROTE_AFTER_SQLITE_ROLLBACK
        }
        Error::TransactionAborted(aborted) => may_have_committed(aborted.cause()),
        _ => false,
    }
}

const WROTE_AFTER_END: &str = "the transaction ended under the work (a deadlock rolled it back), \
     which let the error go and went on: its statements after that point ran outside the \
     transaction, and those that write committed on their own; not retried, so that nothing is \
     applied twice";

/// [`WROTE_AFTER_END`] where no statement was seen to end the transaction
/// ([`journal::wrote_while_unsure`]): a read of the work may have hidden the
/// deadlock that did (diesel-async's MySQL connection reports a read as
/// succeeded before an error that comes in place of its rows) and a statement
/// of the work wrote after such a read, or the journal came in the middle of
/// the transaction and did not see the statements before it. Which statement
/// came after the end nobody can tell, so a write may have run in autocommit.
const MAY_HAVE_WRITTEN_AFTER_END: &str = "the transaction ended under the work (a deadlock's \
     rollback, or a commit lockkit did not see) and no statement lockkit saw ended it: the work \
     let that error go (a read may hide it), or it came before lockkit's first call in the \
     transaction, and statements of the work may have run outside the transaction and committed \
     on their own; not retried, so that nothing is applied twice";

/// SQLite's twin of [`WROTE_AFTER_END`] ([`wrote_after_sqlite_rollback`]).
pub(crate) const WROTE_AFTER_SQLITE_ROLLBACK: &str = "SQLite rolled the whole transaction back \
     under the work (a trigger's RAISE(ROLLBACK), ON CONFLICT ROLLBACK), which let the error go \
     and went on: its statements after that point ran outside the transaction, and those that \
     write committed on their own; not retried, so that nothing is applied twice";

const ENDED_UNSEEN: &str = "the transaction ended before lockkit's COMMIT: a deadlock rolled it \
     back, or a statement of the work committed it implicitly (DDL, TRUNCATE, LOCK TABLES); \
     wrap the connection's instrumentation in lockkit::journal::Journal::wrap to tell which";

/// The server's answer to the question an outermost transaction asks before
/// `COMMIT` ([`Began::check`]'s `stand_in`), where lockkit's journal, which
/// watches the connection, saw no statement end the transaction: `ended`.
///
/// A deadlock that the question itself met (Galera's 1213 at the next
/// statement) ended the transaction after the work's last statement, and
/// stands, retryable. So does an end that lockkit confirmed and reported in the
/// work (a nested call's, [`journal::knows_of_end`]), and one that a deadlock
/// the journal could not see may have caused (`unsure`: [`journal::unsure`] as
/// the work left it, read before the question, itself a read; diesel-async's
/// MySQL connection hides a read's error that comes in place of its rows;
/// where the work wrote after such a read, [`reported_end`] makes that end not
/// retryable).
///
/// So does an end on a session that refuses writes outside transactions, where
/// no statement of the transaction may have committed it itself
/// ([`journal::nothing_writes_outside`]; README, "Galera"): a write after the
/// end would have been refused, which the journal reads as the end it is, so
/// none came after it, and nothing of the work committed on its own. Galera
/// ends a transaction so between its last statement and the question.
///
/// Otherwise the server has no transaction open although every statement of
/// the work succeeded, as far as lockkit knows: one of them ended it without an
/// error (a statement that commits implicitly; on MariaDB Galera, an abort for
/// another node's write that the server did not report), and the statements
/// after it ran outside it, each committed on its own. Not retryable, as where
/// no journal watches ([`ended_under_ok`]): a rerun would apply them twice. For
/// the blocking panic guard and the async connections' end alike, and for a
/// nested call that failed (`nested`), whose question found the caller's
/// transaction gone.
pub(crate) fn ended_silently<W: journal::Watched>(
    conn: &mut W,
    unsure: bool,
    ended: Option<Error>,
    nested: bool,
) -> Option<Error> {
    match ended {
        Some(Error::Deadlock)
            if journal::watches(conn)
                && !journal::knows_of_end(conn)
                && !unsure
                && !journal::nothing_writes_outside(conn) =>
        {
            Some(unseen(if nested {
                ENDED_SILENTLY_UNDER_NESTED
            } else {
                ENDED_SILENTLY
            }))
        }
        ended => ended,
    }
}

const ENDED_SILENTLY: &str = "the transaction ended under the work before lockkit's COMMIT, \
     and no statement of the work failed: its statements after that point ran outside it and \
     may have committed on their own (a statement that commits implicitly: DDL, TRUNCATE, \
     LOCK TABLES; on MariaDB Galera, an abort for another node's write that the server did not \
     report); not retried, so that nothing is applied twice";

const ENDED_SILENTLY_UNDER_NESTED: &str = "the transaction ended before a nested lockkit call \
     failed, and no statement lockkit saw ended it: the statements after that point ran outside \
     it and may have committed on their own (a statement that commits implicitly: DDL, TRUNCATE, \
     LOCK TABLES; on MariaDB Galera, an abort for another node's write that the server did not \
     report); not retried, so that nothing is applied twice";

/// [`Error::Database`] with lockkit's own words for an end it could not see.
fn unseen(message: &str) -> Error {
    Error::Database(diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new(message.to_owned()),
    ))
}

/// Refuses a write or a lock in the caller's transaction once a statement has
/// ended it (the work let a deadlock go on MySQL/MariaDB, or SQLite rolled the
/// whole transaction back): an outbox message or an idempotency key's first
/// write would otherwise run in autocommit and commit on its own, for work the
/// server threw away, and a row lock would be released at once. As a nested
/// lockkit transaction refuses to start: [`Error::TransactionAborted`], and the
/// caller's later statements are kept out of autocommit. The async
/// connections' twin does the same.
pub(crate) fn require_live<C: Control>(conn: &mut C) -> Result<(), Error> {
    match ended_by_statement(conn) {
        Some(cause) => {
            conn.keep_aborted();
            Err(journal::aborted(conn, cause))
        }
        None => Ok(()),
    }
}

/// Before a single write statement of lockkit's in the caller's transaction (a
/// versioned write, [`atomic::update_if`](crate::atomic::update_if)): where
/// lockkit's journal saw a statement end that transaction (a deadlock the
/// caller let go, on MySQL/MariaDB), the write would run in autocommit and
/// commit on its own, whatever the transaction's owner then does. It refuses
/// with [`Error::TransactionAborted`], as [`require_live`] does, once the server
/// confirms: the stand-in's first statement asks ([`open_stand_in`]), and the
/// stand-in then keeps the caller's later writes out. Where the server still
/// has the transaction open (a refusal that only read like a deadlock), the
/// journal forgets the abort and the write goes on. Nothing is sent when the
/// journal saw no such statement and watched the whole transaction (on a
/// connection new to lockkit, the first write in the caller's transaction
/// asks). The async writes' twin does the same.
pub(crate) fn check_write<C: Connection>(conn: &mut C) -> Result<(), Error> {
    use diesel::connection::TransactionManager;
    refuse_broken(C::TransactionManager::transaction_manager_status_mut(conn))?;
    journal::before_write(conn);
    refuse_if_ended_on_sqlite(conn)?;
    let Some((cause, reported)) = journal::ended_before_write(conn) else {
        return Ok(());
    };
    if reported || open_stand_in(conn) {
        // Confirmed: from now on as if the journal had seen it.
        journal::answered(conn, Some(&cause));
        let cause = ended_under_work(conn, cause);
        return Err(journal::aborted(conn, cause));
    }
    journal::forget_abort(conn);
    Ok(())
}

/// A single write statement of lockkit's in the caller's transaction (a
/// versioned write, [`atomic::update_if`](crate::atomic::update_if)) failed with
/// `err`, on a backend whose rule is `ends`. Where that rolled back the whole transaction
/// ([`journal::write_ended_transaction`](crate::journal::write_ended_transaction)),
/// the write reports [`Error::TransactionAborted`] and opens the read-only
/// stand-in ([`keep_aborted_sql`]), as a nested lockkit transaction does: the
/// caller's later writes fail instead of committing on their own. The owner of
/// the outermost transaction runs it again whole. The async write's twin does
/// the same.
///
/// An error that only reads like a deadlock (a trigger's `SIGNAL` in InnoDB's
/// words) has ended nothing: the stand-in's first statement finds the
/// transaction still open, nothing is opened, the journal forgets the abort,
/// and the write returns its error as it is, the caller's transaction still
/// the caller's to commit or roll back.
pub(crate) fn failed_write<C: Connection>(conn: &mut C, err: Error, ends: journal::Ends) -> Error {
    // SQLite: a write that answers with rows failed where the journal could
    // not see it; lockkit's next call asks whether it ended the transaction.
    journal::failed_unseen(conn, &err, ends);
    if !journal::write_ended_transaction(conn, &err, ends) {
        return err;
    }
    if !open_stand_in(conn) {
        journal::forget_abort(conn);
        return err;
    }
    journal::aborted(conn, err)
}

/// Opens the read-only stand-in for an aborted transaction
/// ([`keep_aborted_sql`]) on any blocking connection: MySQL/MariaDB's
/// [`Control::keep_aborted`], and [`failed_write`]'s. `false` when the server
/// still had a transaction open ([`found_open`]): then nothing is opened.
pub(crate) fn open_stand_in<C: diesel::connection::SimpleConnection>(conn: &mut C) -> bool {
    #[cfg(feature = "mysql")]
    for (i, statement) in keep_aborted_sql().iter().enumerate() {
        if let Err(err) = conn.batch_execute(statement) {
            // On a lost connection this fails too, and there is nothing to keep.
            return !(i == 0 && found_open(&err));
        }
    }
    #[cfg(not(feature = "mysql"))]
    let _ = conn;
    true
}

/// Whether the first statement of [`keep_aborted_sql`] failed because a
/// transaction is still open on the server (MySQL/MariaDB's 1568, which
/// `SET TRANSACTION` meets inside one): the error that looked like the end of
/// the caller's transaction did not end it. The text is the server's answer to
/// lockkit's own statement, which runs no code of the user's.
#[cfg(feature = "mysql")]
pub(crate) fn found_open(err: &diesel::result::Error) -> bool {
    matches!(err, diesel::result::Error::DatabaseError(_, info)
        if info.message().starts_with("Transaction characteristics can't be changed"))
}

/// What [`Control::keep_aborted`] sends on MySQL/MariaDB, for the blocking and
/// the async connection. When InnoDB rolls back a whole transaction (a
/// deadlock's victim) under a savepoint, the caller's code may catch the error
/// and go on writing; with no transaction open on the server, each write would
/// commit on its own, half of an operation. So lockkit opens a read-only
/// transaction in its place: a later write fails (MariaDB's 1792, "Cannot
/// execute statement in a READ ONLY transaction"), and the caller's `ROLLBACK`
/// (or `COMMIT`) ends it. A caller that swallows the error and writes nothing
/// more still commits nothing of what came before: the server threw it away
/// (and lockkit's own outermost call does not commit the stand-in: [`Began`]).
///
/// It opens in two steps, `SET TRANSACTION READ ONLY` then `START TRANSACTION`,
/// never `START TRANSACTION READ ONLY` at once: a `START TRANSACTION` inside an
/// open transaction commits it, and `SET TRANSACTION` refuses there instead
/// ([`found_open`]). So an error that only read like the end of the caller's
/// transaction commits nothing of it.
///
/// The stand-in carries a savepoint of its own, named by a random token that a
/// session mark keeps, so that a lockkit call further up, asking whether its
/// transaction survived, is not fooled by it ([`StandIn`]).
#[cfg(feature = "mysql")]
pub(crate) fn keep_aborted_sql() -> [String; 4] {
    STAND_INS.fetch_add(1, Ordering::Relaxed);
    let token = format!("{}{:016x}", StandIn::PREFIX, fastrand::u64(..));
    [
        "SET TRANSACTION READ ONLY".to_owned(),
        "START TRANSACTION".to_owned(),
        format!("SAVEPOINT {token}"),
        format!("SET @lockkit_aborted = '{token}'"),
    ]
}

/// How many stand-ins ([`keep_aborted_sql`]) lockkit has opened in this
/// process: see [`Began`].
static STAND_INS: AtomicU64 = AtomicU64::new(0);

/// Where a lockkit transaction's work began: nested in an open transaction or
/// not, and how many stand-ins the process had opened by then.
///
/// The work of an outermost transaction may catch a nested call's
/// [`Error::TransactionAborted`] and return `Ok` (the docs say to let it
/// travel). On MySQL/MariaDB the server has then thrown the work away and a
/// read-only stand-in is open: committing it would report success for nothing.
/// So an outermost transaction whose work succeeded asks the server before
/// `COMMIT` whether the transaction is still its own, but only when a stand-in
/// was opened (anywhere in the process) while its work ran: one atomic read on
/// every other path, and no question unless an abort was caught somewhere.
#[derive(Clone, Copy)]
pub(crate) struct Began {
    /// Nested in an open transaction: a savepoint.
    pub(crate) nested: bool,
    /// The count before the caller's work ran; `None` where no work of the
    /// caller's runs (lockkit's own statements catch nothing).
    stand_ins: Option<u64>,
}

impl Began {
    /// A transaction that runs the caller's work: read before the work starts.
    pub(crate) fn with_work(nested: bool) -> Self {
        Began {
            nested,
            stand_ins: Some(STAND_INS.load(Ordering::Relaxed)),
        }
    }

    /// A transaction of lockkit's own statements only.
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    pub(crate) fn own(nested: bool) -> Self {
        Began {
            nested,
            stand_ins: None,
        }
    }

    /// Whether the work, which succeeded, must be checked before `COMMIT`: see
    /// the [type's docs](Self). The question is
    /// [`Control::transaction_ended`] (the async connections' twin), and an
    /// answer other than `None` is [`swallowed`].
    fn must_ask(self) -> bool {
        !self.nested
            && self
                .stand_ins
                .is_some_and(|then| STAND_INS.load(Ordering::Relaxed) != then)
    }

    /// What an outermost transaction asks before it ends, given how its work
    /// went (`result`), decided here for the blocking panic guard and the async
    /// connections' end; [`settle`] reads the answer.
    ///
    /// * Work that succeeded may have let a statement (or a nested call) end
    ///   the transaction: the journal is asked, and the server too where a
    ///   stand-in was opened ([`must_ask`](Self::must_ask)).
    /// * Work that failed after a statement rolled back the whole transaction
    ///   (`whole`, MySQL/MariaDB's deadlock as the journal saw it; where no
    ///   journal watches a MySQL/MariaDB connection, the server is asked),
    ///   most often with a nested call's [`Error::TransactionAborted`]: the
    ///   server confirms, and the owner hands on the cause, retryable, since
    ///   nothing of the work is left (unless the work wrote after the end:
    ///   [`reported_end`]).
    /// * Anything else, and a nested transaction: nothing to ask.
    pub(crate) fn check<T, E>(
        self,
        result: &Result<T, Failure<E>>,
        whole: impl FnOnce() -> journal::Whole,
    ) -> Check {
        match result {
            _ if self.nested => Check::Nothing,
            Ok(_) => Check::Ended {
                stand_in: self.must_ask(),
            },
            Err(Failure::Closure(_)) => match whole() {
                journal::Whole::Seen => Check::Ended { stand_in: false },
                // No journal saw it: the server is asked.
                journal::Whole::Unwatched => Check::Ended { stand_in: true },
                journal::Whole::No => Check::Nothing,
            },
            Err(_) => Check::Nothing,
        }
    }
}

/// A nested lockkit transaction whose work returned `Ok` after a statement of
/// it failed and aborted the transaction, on a backend where that lasts until
/// a rollback to a savepoint (PostgreSQL; `ends`), as the journal saw it (the
/// work let the error go): its `RELEASE SAVEPOINT` would be refused ("current
/// transaction is aborted", which no retry takes up). The statement's error,
/// for the call to fail with instead: its savepoint is then rolled back, which
/// revives the transaction around it, and a retry may run it again there.
/// Whether to ask is decided here; the blocking panic guard and the async end
/// ask the server ([`ended_by_statement`] and its async twin), since the
/// journal takes some errors that abort nothing for an abort (Diesel's empty
/// query, a client-side refusal). (The journal holds no such error from
/// before the call: [`refuse_if_ended_before_level`] refused the call then.)
pub(crate) fn may_have_aborted_level<W: journal::Watched>(
    conn: &mut W,
    ends: journal::Ends,
) -> bool {
    ends == journal::Ends::UntilSavepointRollback && journal::ended_by(conn).is_some()
}

/// What [`Began::check`] asks before an outermost transaction ends.
pub(crate) enum Check {
    /// Nothing: the work's result stands.
    Nothing,
    /// Whether a statement ended the transaction ([`ended_by_statement`]) and,
    /// when `stand_in`, whether the server has ended it
    /// ([`Control::transaction_ended`]).
    Ended { stand_in: bool },
}

/// The work's result once the server answered [`Began::check`]: `ended`, the
/// transaction ended under the work, and why.
pub(crate) fn settle<T, E>(
    result: Result<T, Failure<E>>,
    ended: Option<Error>,
) -> Result<T, Failure<E>> {
    match ended {
        Some(reason) => Err(swallowed(reason)),
        None => result,
    }
}

/// The failure of an outermost transaction whose work returned `Ok` after the
/// server had ended the transaction under it (`reason`), or failed after a
/// statement rolled the whole transaction back (MySQL/MariaDB's deadlock; the
/// work's error is then most often a nested call's
/// [`Error::TransactionAborted`]): the transaction (or the stand-in) is rolled
/// back, and the caller gets `reason`, retryable, since a new transaction may
/// begin ([`Failed::into_error`]).
pub(crate) fn swallowed<E>(reason: Error) -> Failure<E> {
    Failure::Lockkit(Error::TransactionAborted(Aborted::new(reason)))
}

/// MySQL/MariaDB: what lockkit reads to learn whether the caller's transaction
/// survived, `SELECT CAST(@@in_transaction AS SIGNED), CAST(@lockkit_aborted AS
/// CHAR)`, and what it then does.
#[cfg(feature = "mysql")]
pub(crate) enum StandIn {
    /// No transaction open on the server: the caller's has ended.
    NoTransaction,
    /// A transaction open, and no stand-in was ever opened in this session: the
    /// caller's is alive (the one statement asked, as before any abort).
    Alive,
    /// A transaction open, and the token of a stand-in opened in this session:
    /// the stand-in itself (the caller's transaction has ended), or a live
    /// transaction after the stand-in ended. [`probe`](Self::probe) tells: only
    /// in the stand-in does the savepoint of that name exist (rolling back to it
    /// there undoes nothing: it is read-only). Otherwise the mark is stale:
    /// [`FORGET`](Self::FORGET).
    Probe(String),
}
#[cfg(feature = "mysql")]
impl StandIn {
    /// How a stand-in's savepoint name begins; 16 hex digits follow.
    const PREFIX: &'static str = "lockkit_aborted_";
    /// Clears a stale mark, so that the next question is one statement again.
    pub(crate) const FORGET: &'static str = "SET @lockkit_aborted = NULL";

    /// Reads the answer to the question (`open`: not 0 for yes; the mark).
    pub(crate) fn read((open, mark): (i64, Option<String>)) -> Self {
        match (open != 0, mark) {
            (false, _) => StandIn::NoTransaction,
            (true, None) => StandIn::Alive,
            (true, Some(token)) => StandIn::Probe(token),
        }
    }

    /// The statement that succeeds only inside the stand-in whose token the
    /// mark holds: `ROLLBACK TO SAVEPOINT <token>`. `None` for a mark lockkit did
    /// not write (only a token of its own shape is written into SQL): stale.
    pub(crate) fn probe(token: &str) -> Option<String> {
        let digits = token.strip_prefix(Self::PREFIX)?;
        (digits.len() == 16 && digits.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| format!("ROLLBACK TO SAVEPOINT {token}"))
    }
}

/// Whether Diesel's (or diesel-async's) transaction manager gave up on the
/// connection: [`Control::repair`]'s first question.
#[cfg(feature = "mysql")]
pub(crate) fn is_broken(status: &mut diesel::connection::TransactionManagerStatus) -> bool {
    status.transaction_depth().is_err()
}

/// Refuses a statement of lockkit's on a connection whose transaction manager
/// gave up on it (a dropped async call, which may have left its transaction
/// open on the server; a failed rollback): the statement would run in that
/// transaction and go with it, under an `Ok`. Diesel refuses a transaction
/// there; this refuses the single statements (a versioned write,
/// `atomic::update_if`, an advisory lock) the same way, blocking and async.
pub(crate) fn refuse_broken(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> Result<(), Error> {
    match status.transaction_depth() {
        Err(_) => Err(Error::Database(
            diesel::result::Error::BrokenTransactionManager,
        )),
        Ok(_) => Ok(()),
    }
}

/// [`refuse_if_ended_on_sqlite`] before a lockkit transaction begins on `conn`,
/// whose rule the journal learns first from the connection ([`Control::ends`]:
/// the one inside a `MultiConnection` enum, whose backend type names no
/// server), so that a journal installed now, inside the caller's transaction,
/// asks SQLite.
pub(crate) fn refuse_if_ended<C: Control>(conn: &mut C) -> Result<(), Error> {
    journal::watch(conn, C::ends);
    refuse_if_ended_on_sqlite(conn)
}

/// Before a lockkit transaction's `BEGIN` or `SAVEPOINT`: [`refuse_if_ended`];
/// and nested where the journal saw a statement end the caller's transaction,
/// [`require_live`] decides before the call's `SAVEPOINT`, which PostgreSQL
/// would refuse with "current transaction is aborted" (a plain database error,
/// which no retry takes up) before the panic guard could report the cause, as
/// it does on MySQL/MariaDB. The async calls ask the same before theirs.
pub(crate) fn refuse_if_ended_before_level<C: Control>(conn: &mut C) -> Result<(), Error> {
    refuse_if_ended(conn)?;
    if in_transaction(conn) && journal::ended_by(conn).is_some() {
        require_live(conn)?;
    }
    Ok(())
}

/// Runs `f` in a transaction (a savepoint when one is open) behind the panic
/// guard, and ends it as [`finish`] decides.
pub(crate) fn run<C, T, E, F>(conn: &mut C, f: F) -> Result<T, E>
where
    C: Control,
    E: From<Error>,
    F: FnOnce(&mut C) -> Result<T, Failure<E>>,
{
    refuse_if_ended_before_level(conn)?;
    let nested = in_transaction(conn);
    let mut guard = PanicGuard::default();
    let result = level(conn, |conn| guard.call(conn, f));
    finish(conn, nested, guard, result, None, classify)
}

/// The end of every lockkit transaction, decided here once: `result` is how
/// the transaction went, `restored` how putting back a session setting changed
/// for it went (reported only when the work itself succeeded), `classify` how to
/// read a failure of Diesel's own transaction statements. A panic in the work goes
/// on here, after the rollback and the restore.
pub(crate) fn finish<C, T, E>(
    conn: &mut C,
    nested: bool,
    guard: PanicGuard,
    result: Result<T, Failure<E>>,
    restored: Option<diesel::QueryResult<()>>,
    classify: impl FnOnce(diesel::result::Error) -> Error,
) -> Result<T, E>
where
    C: Control,
    E: From<Error>,
{
    if result.is_err() {
        // Rolled back: this call's level, the one above the caller's.
        let level = transaction_depth(conn) + 1;
        rolled_back(conn, level);
    }
    after_level(
        conn,
        C::TransactionManager::transaction_manager_status_mut,
        nested,
        guard.level(),
    );
    if !nested {
        redo(conn);
    }
    // Committed as soon as the work succeeded: a failure to put a session
    // setting back afterwards undoes nothing. Nested, the savepoint is only
    // released: a restore that found the whole transaction ended (another
    // Galera node's commit aborted it while it sat idle) ends the call as the
    // work's own statement would have, or the caller writes on in autocommit.
    guard.resume(result.is_ok());
    let failure = match (result, restored) {
        (Ok(value), None | Some(Ok(()))) => return Ok(value),
        (Ok(value), Some(Err(err))) => {
            let cause = classify(err);
            let Some(ended) = nested
                .then(|| conn.transaction_ended(Some(&cause)))
                .flatten()
            else {
                setting_kept(&cause);
                return Ok(value);
            };
            if in_transaction(conn) {
                conn.keep_aborted();
            }
            let failed = Failed::<E>::Lockkit(cause);
            return Err(failed.into_error(true, Some(ended), |cause| journal::aborted(conn, cause)));
        }
        (Err(failure), _) => failure,
    };
    if !nested {
        conn.repair();
    }
    let failed = Failed::from_failure(failure, classify);
    let unsure = journal::unsure(conn);
    let ended = failed
        .question(nested)
        .and_then(|cause| conn.transaction_ended(cause));
    // No transaction open under a nested call, and nothing the journal saw
    // ended it: a statement committed it implicitly, and the owner must not
    // run the committed work again.
    let ended = ended_silently(conn, unsure, ended, true);
    // A statement of the work that wrote after the end committed on its own:
    // the end the caller's retry sees must say so.
    let ended = ended.map(|cause| ended_under_failed_work(conn, cause));
    // Only while the caller's transaction is open in Diesel's books: the
    // caller's rollback then ends the stand-in.
    if ended.is_some() && in_transaction(conn) {
        conn.keep_aborted();
    }
    Err(failed.into_error(nested, ended, |cause| journal::aborted(conn, cause)))
}

/// A session setting a lockkit transaction changed (MySQL/MariaDB's
/// `innodb_lock_wait_timeout`) could not be put back after its work
/// committed, for the blocking and the async side. The call still returns its
/// work's `Ok`: the work stands, and an error would have the caller run it
/// again. The session keeps the call's setting; it is logged.
pub(crate) fn setting_kept(err: &dyn std::fmt::Display) {
    tracing::warn!(
        target: "lockkit",
        error = %err,
        "lock timeout not put back after the transaction; the session keeps the call's"
    );
}

/// After lockkit's own outermost transaction on `conn` ended: sends again,
/// outside any transaction, what the journal keeps that a rollback undid and
/// must stand ([`journal::redo_after_rollback`]); nothing while the transaction
/// manager is broken (the server may still hold a transaction open). Each is
/// best effort: one that fails leaves a struct stale, never a write over
/// somebody else's.
pub(crate) fn redo<C: Connection + 'static>(conn: &mut C) {
    use diesel::connection::TransactionManager;
    if !journal::redo_kept() {
        return;
    }
    let status = C::TransactionManager::transaction_manager_status_mut(conn);
    if !matches!(status.transaction_depth(), Ok(None)) {
        return;
    }
    for redo in journal::take_redo::<journal::Redo<C>, _>(conn) {
        redo(conn);
    }
}

/// What lockkit tells the journal when it rolled back its own transaction (or
/// savepoint) opened at depth `level` on `conn`, blocking or async: on a
/// connection whose own instrumentation keeps the journal from seeing the
/// `ROLLBACK`, the versions written in it are taken for rolled back
/// ([`rolled_back_unwatched`](journal::rolled_back_unwatched)).
pub(crate) fn rolled_back<C: ?Sized>(conn: &C, level: u32) {
    journal::rolled_back_unwatched(scope::conn_id(conn), level);
}

/// A failed transaction's failure, Diesel's errors classified: the part of
/// [`finish`] that the async connections' end shares, so that both decide the
/// caller's error the same way. Deciding it may need one answer from the server
/// ([`question`](Self::question)), which each side asks its own way.
pub(crate) enum Failed<E> {
    /// The closure's own error.
    Closure(E),
    /// lockkit's own failure, or Diesel's classified.
    Lockkit(Error),
}

impl<E: From<Error>> Failed<E> {
    /// `failure` with a failed transaction statement classified by `classify`.
    pub(crate) fn from_failure(
        failure: Failure<E>,
        classify: impl FnOnce(diesel::result::Error) -> Error,
    ) -> Self {
        match failure {
            Failure::Closure(err) => Failed::Closure(err),
            Failure::Lockkit(err) => Failed::Lockkit(err),
            Failure::Diesel(err) => Failed::Lockkit(classify(err)),
        }
    }

    /// What the server must be asked before the error is decided: for a nested
    /// transaction only, whether the whole transaction has ended, given lockkit's
    /// own error when there is one (the closure's is the caller's: lockkit cannot
    /// look inside it, so it asks the server instead). `None`: nothing to ask.
    pub(crate) fn question(&self, nested: bool) -> Option<Option<&Error>> {
        match self {
            _ if !nested => None,
            Failed::Closure(_) => Some(None),
            Failed::Lockkit(Error::TransactionAborted(_)) => None,
            Failed::Lockkit(err) => Some(Some(err)),
        }
    }

    /// The caller's error, given the server's answer to [`question`](Self::question)
    /// (`ended`: the whole transaction ended, and why). A nested failure whose
    /// whole transaction the server ended becomes [`Error::TransactionAborted`];
    /// an outermost one hands on the cause of such an error, since the
    /// transaction is gone and a new one may begin. `aborted` makes the
    /// [`Error::TransactionAborted`] for a cause, watched on the connection
    /// ([`journal::aborted`](crate::journal::aborted)).
    pub(crate) fn into_error(
        self,
        nested: bool,
        ended: Option<Error>,
        aborted: impl FnOnce(Error) -> Error,
    ) -> E {
        match (self, ended) {
            (Failed::Closure(_), Some(reason)) if nested => E::from(aborted(reason)),
            (Failed::Closure(err), _) => err,
            (Failed::Lockkit(Error::TransactionAborted(cause)), _) if !nested => {
                E::from(cause.into_cause())
            }
            (Failed::Lockkit(err @ Error::TransactionAborted(_)), _) => E::from(err),
            // lockkit's own error names the cause when it is one of the
            // errors that end a transaction (a deadlock, a lost connection);
            // else (a failed RELEASE SAVEPOINT, say) the server's answer does.
            // A reason that says statements may have committed on their own
            // wins: no retry may take the call up.
            (Failed::Lockkit(err), Some(reason)) if nested => {
                let cause = if err.is_retryable() && !may_have_committed(&reason) {
                    err
                } else {
                    reason
                };
                E::from(aborted(cause))
            }
            (Failed::Lockkit(err), _) => E::from(err),
        }
    }
}

/// The error of a transaction lockkit opened with Diesel's own `transaction`
/// around its own statements (no work of the caller's), `nested` in an open one
/// or not, decided as [`finish`] decides lockkit's own failures: an outermost
/// one hands on the cause of a [`Error::TransactionAborted`] (a write in it was
/// the victim of a deadlock that ended it), since a new transaction may begin.
pub(crate) fn owners_error(err: Error, nested: bool) -> Error {
    Failed::<Error>::Lockkit(err).into_error(nested, None, |cause| {
        Error::TransactionAborted(Aborted::new(cause))
    })
}

/// [`Control::transaction_ended`] where the server is not asked: only a lost
/// connection ends the whole transaction.
pub(crate) fn connection_lost(cause: Option<&Error>) -> Option<Error> {
    matches!(cause, Some(Error::ConnectionLost)).then_some(Error::ConnectionLost)
}

/// [`Control::transaction_ended`] on MySQL/MariaDB, from the server's answer to
/// `SELECT @@in_transaction` (`open`). InnoDB ends a transaction while the
/// connection lives only for a deadlock's victim, or a lock wait timeout's
/// under `innodb_rollback_on_timeout`: an ended transaction is reported as
/// the lock wait timeout where that was the `cause`, else as a deadlock.
/// Shared by the blocking and the async connection, which each ask in their
/// own way. Where the server answers "open", the journal watching `conn`
/// forgets what it saw end the transaction (a caller that then commits
/// commits).
///
/// A question that fails with a deadlock (1213) met the abort itself: Galera
/// reports a transaction that another node's write aborted while its client sat
/// between statements at the client's next statement, which may be this one.
/// The transaction is gone, and a `COMMIT` sent after it would commit nothing
/// and succeed.
#[cfg(feature = "mysql")]
pub(crate) fn ended_unless_open<W: journal::Watched>(
    conn: &mut W,
    open: diesel::QueryResult<bool>,
    cause: Option<&Error>,
) -> Option<Error> {
    // The journal took a refusal for the end (`Error::ReadOnly`: the session
    // refuses writes outside transactions, and a statement of the work may
    // have committed the transaction itself): the end is that, which no
    // retry takes up, also where the server cannot be asked.
    let refused = matches!(journal::ended_by(conn), Some(Error::ReadOnly));
    match open {
        Ok(true) => {
            // Alive: no read hid an end, and what the work wrote it wrote in
            // the transaction.
            journal::forget_abort(conn);
            journal::answered(conn, None);
            None
        }
        _ if refused => Some(Error::ReadOnly),
        Ok(false) if matches!(cause, Some(Error::LockTimeout)) => Some(Error::LockTimeout),
        Ok(false) => Some(Error::Deadlock),
        Err(err) => match (cause, classify(err)) {
            (Some(Error::Deadlock), _) | (_, Error::Deadlock) => Some(Error::Deadlock),
            (_, Error::ConnectionLost) | (Some(Error::ConnectionLost), _) => {
                Some(Error::ConnectionLost)
            }
            _ => None,
        },
    }
}

/// Whether a failed statement's error is a deadlock (1213), which on
/// MySQL/MariaDB ends the whole transaction: what the stand-in's probe reads,
/// for the blocking and the async connection.
#[cfg(feature = "mysql")]
pub(crate) fn ends_transaction(err: &diesel::result::Error) -> bool {
    matches!(err, diesel::result::Error::DatabaseError(_, info)
        if crate::error::classification::is_deadlock(info.message()))
}

/// Whether a transaction is open on `conn`, for any connection type (pooled ones
/// included): Diesel's transaction manager knows its depth.
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    transaction_depth(conn) > 0
}

/// Whether a transaction may be open on the server under `status`: Diesel
/// counts one, or its transaction manager is broken (a dropped async call's
/// transaction may still be open there). For the calls that must commit on
/// their own, blocking and async.
#[cfg(feature = "lease")]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub(crate) fn may_be_in_transaction(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> bool {
    !matches!(status.transaction_depth(), Ok(None))
}

/// [`Error::AlreadyInTransaction`] when a transaction is open (`open`): the
/// calls that must run outside one (commit on their own, or read outside any
/// snapshot) send nothing inside one. [`require_transaction`]'s twin.
pub(crate) fn refuse_transaction(open: bool) -> Result<(), Error> {
    if open {
        Err(Error::AlreadyInTransaction)
    } else {
        Ok(())
    }
}

/// [`refuse_transaction`] for `conn`, and [`refuse_broken`] first: for the
/// calls that send a setting for the transaction they are about to open
/// (MySQL/MariaDB's `SET TRANSACTION ISOLATION LEVEL`, which applies to the
/// next transaction). On a connection Diesel marked broken that transaction
/// never opens, and the setting would wait for the connection's next user.
/// A manager Diesel gave up on although the server has no transaction open is
/// put back in order first ([`Control::repair`]), as after lockkit's failed
/// transactions, so that the connection works on.
pub(crate) fn refuse_transaction_or_broken<C: Control>(conn: &mut C) -> Result<(), Error> {
    conn.repair();
    refuse_broken(C::TransactionManager::transaction_manager_status_mut(conn))?;
    refuse_transaction(in_transaction(conn))
}

/// [`Error::NotInTransaction`] unless a transaction is open on the connection
/// whose transaction manager reports `status`: the calls that lock or write
/// inside the caller's transaction send nothing outside one. On a connection
/// Diesel marked broken, [`refuse_broken`]'s error: the transaction a dropped
/// call left may still be open on the server, and the help of
/// `NotInTransaction` (open one) is wrong there.
pub(crate) fn require_transaction(
    status: &mut diesel::connection::TransactionManagerStatus,
) -> Result<(), Error> {
    refuse_broken(status)?;
    if depth_of(status) > 0 {
        Ok(())
    } else {
        Err(Error::NotInTransaction)
    }
}

/// [`require_transaction`] for a blocking connection.
pub(crate) fn require_transaction_on<C: Connection>(conn: &mut C) -> Result<(), Error> {
    require_transaction(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// How many transactions (the outermost one and its savepoints) are open on
/// `conn`: 0 when none is, or when Diesel's transaction manager is broken.
pub(crate) fn transaction_depth<C: Connection>(conn: &mut C) -> u32 {
    depth_of(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// [`transaction_depth`] read off a transaction manager's status (also the
/// async connections').
pub(crate) fn depth_of(status: &mut diesel::connection::TransactionManagerStatus) -> u32 {
    match status.transaction_depth() {
        Ok(Some(depth)) => depth.get(),
        _ => 0,
    }
}
