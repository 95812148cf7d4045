//! [`AsyncLockingConnection`]: what each diesel-async connection does to begin
//! and end a locking transaction. The statements are the blocking side's
//! ([`crate::pessimistic::connection`]); only their execution is async.
//!
//! | | `AsyncPgConnection` | `AsyncMysqlConnection` | `SyncConnectionWrapper<SqliteConnection>` |
//! | --- | --- | --- | --- |
//! | begin | `BEGIN` (`SAVEPOINT` nested) | `START TRANSACTION READ WRITE` (`SAVEPOINT` nested) | `BEGIN IMMEDIATE` (nested: `SAVEPOINT` + write lock) |
//! | row-lock clause | the [`RowLock`](crate::RowLock)'s | the [`RowLock`](crate::RowLock)'s | none: the transaction holds the database's write lock |
//! | [`LockOptions::timeout`](crate::LockOptions::timeout) | `set_config('lock_timeout', $1, true)` | `innodb_lock_wait_timeout`, put back after | `PRAGMA busy_timeout`, put back after |
//!
//! # Cancellation
//!
//! A future of lockkit's async calls that is dropped before it finishes (a
//! client went away, `tokio::time::timeout` fired) cannot send `ROLLBACK`:
//! nothing runs after a drop. The connection then still has its transaction
//! open, and diesel-async's transaction manager says so. diesel-async's bb8
//! and deadpool pools ask exactly that (`is_broken`) when the connection comes
//! back, and discard a connection with an open transaction (or one dropped in
//! the middle of `BEGIN`, `COMMIT` or `ROLLBACK`) instead of handing it to the
//! next user. Closing it ends the server session, and with it the transaction
//! and its row locks. `tests/tests/async_cancel.rs` drops `with_lock` at every await
//! point and checks both. (Not diesel-async 0.9.2's mobc pool, whose check-in
//! test keeps a connection that `is_broken` and closes a sound one: README,
//! "Cancellation".)
//!
//! A session setting a call sends before its `BEGIN` (the lock timeout of
//! [`LockOptions::timeout`](crate::LockOptions::timeout), SQLite's busy
//! timeout under `nowait()` or `skip_locked()`, the `SET TRANSACTION ISOLATION
//! LEVEL SERIALIZABLE` of [`serializable`](super::serializable()) on
//! MySQL/MariaDB) is guarded the same way: a call dropped while it may be in
//! force (or its reply unread) marks the connection broken, and the pool
//! closes it.
//!
//! A nested call dropped while the transaction around it goes on (a
//! `tokio::time::timeout` around a `with_lock` inside your
//! `locked_transaction`) leaves its savepoint open, and whatever the
//! connection sends next runs inside it. Who ends the level below decides
//! (each call holds its level through a guard, and lockkit's
//! [`journal`] records which levels are lockkit's):
//!
//! * another lockkit call: the next lockkit call on the connection (you try
//!   again, or go on with a versioned write, `lock_all`, `queue::claim` or an
//!   outbox write) rolls the dropped savepoint back first, with the dropped
//!   call's work, if nothing was sent since; otherwise the enclosing call's end does, and then
//!   fails with [`Error::NestedCallDropped`] when a statement ran in it after
//!   the drop (that statement went with it), or commits (or rolls back) its
//!   own work when none did. If a rollback fails, it fails and marks the
//!   connection broken;
//! * your own transaction (diesel-async's `transaction`), or none (the dropped
//!   call was the outermost): the dropped call marks the connection's
//!   transaction manager broken, so that your commit, or your next transaction
//!   on a connection you hold without a pool, fails with
//!   `BrokenTransactionManager` instead of releasing the dropped savepoint,
//!   saying `Ok` and committing nothing. A pool discards the connection, and
//!   the server rolls back.
//!
//! A call dropped while one of its own transaction statements was in flight
//! (its `BEGIN` or `SAVEPOINT`, or its end's `COMMIT`, `RELEASE` or `ROLLBACK
//! TO`) leaves its level in a state nobody knows: it marks the connection
//! broken wherever it was nested. On MySQL/MariaDB a statement dropped before
//! its reply was read may leave that reply for the next statement to read as
//! its own (as the check-out ping below does; a `COMMIT` could be reported
//! failed that committed): a call dropped with one of its statements in
//! flight (the journal sees it begin and no reply come) marks the connection
//! broken wherever it was nested, so that no `COMMIT` is sent on it and the
//! transaction around fails with `BrokenTransactionManager`, committing
//! nothing. So do the calls that open no level of their own, in a
//! transaction or not: a versioned write, an atomic write (`atomic::*`),
//! `lock_all`, `queue::claim`, an outbox message, and a lease's `acquire`,
//! `renew` and `release`. The outbox's and the idempotency keys'
//! housekeeping are left as a statement of your own is (below). On
//! SQLite, diesel-async
//! refuses any access to the connection while a dropped statement still runs
//! on its blocking thread: a call dropped then cannot mark anything (lockkit
//! warns), so give up on the whole transaction there rather than on a nested
//! call.
//!
//! A connection you hold yourself (no pool) is not discarded: after a dropped
//! call it is still inside the abandoned transaction, and refuses every
//! transaction until you drop it. Drop such a connection too, or use a pool.
//!
//! **MySQL/MariaDB and bb8's check-out ping.** bb8 sends `SELECT 1` on a
//! connection before it hands it out (`test_on_check_out`, on by default). A
//! future dropped while that ping is in flight leaves `AsyncMysqlConnection`
//! with an unread reply that `is_broken` does not see, and bb8 hands the
//! connection to the next user, who reads the wrong replies (a row that exists
//! comes back as `NotFound`, or the connection closes). On MySQL/MariaDB with
//! cancellation, build the pool with `.test_on_check_out(false)`; the torture
//! program's async mode does, and `torture/tests/torture.rs`
//! (`mysql_async_with_the_pool_ping_fails`) shows the failure with the ping on.
//! A statement of your own (outside lockkit's transactions) dropped in flight
//! leaves the same unread reply: on MySQL, run statements that a dropped future
//! may cut short inside a transaction, so the pool discards the connection.
//! Inside a lockkit call whose work cuts one of its statements short and goes
//! on (a `timeout` it catches), the call's end finds the reply unread (a probe,
//! a read of a column named with a number of its own, whose error names it,
//! asked only then): it sends no `COMMIT`,
//! marks the connection broken for its pool to close, ends the outermost
//! transaction with a `ROLLBACK`, whose own reply comes after the unread ones
//! (it probes until a probe's own comes back, up to 64 times, so that the
//! transaction's locks are gone when it returns), and fails: the work's error,
//! or for `Ok` `BrokenTransactionManager`. A statement the work sent after
//! the cut-short one has read that reply as its own (a lockkit write then
//! opens no stand-in, and a nested lockkit call refuses to begin): do not go
//! on with a work after cutting one of its statements short. A connection
//! lockkit marked broken on purpose is never repaired (where its journal
//! watches the connection: one with instrumentation of its own, not wrapped
//! in `Journal::wrap`, keeps no such mark, and a failed outermost call's
//! repair may hand it on once the server has no transaction open).

use std::future::Future;

use diesel::query_dsl::methods::LockingDsl;
use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use crate::error::classification::classify;
use crate::error::Error;
use crate::optimistic::backend::OptimisticBackend;
use crate::optimistic::sequence::Tentative;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::pessimistic::connection::LockingConnection;
use crate::pessimistic::options::LockOptions;
use crate::transaction::journal;
use crate::transaction::levels::Levels;
use crate::transaction::Failure;

/// A diesel-async connection lockkit's async calls run on:
/// `AsyncPgConnection`, `AsyncMysqlConnection`,
/// `SyncConnectionWrapper<SqliteConnection>` (features `postgres`, `mysql`,
/// `sqlite`). A pooled connection (bb8's `PooledConnection`, deadpool's
/// `Object`) is passed as `&mut *pooled`.
///
/// Sealed; name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "lockkit's async calls do not run on `{Self}`",
    label = "not a diesel-async connection lockkit supports",
    note = "lockkit supports `AsyncPgConnection`, `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (feature `async` with `postgres`, `mysql`, `sqlite`); pass a pooled connection as `&mut *conn`"
)]
pub trait AsyncLockingConnection:
    AsyncConnection<Backend: OptimisticBackend> + Send + crate::sealed::Sealed + 'static
{
    /// A query with a row-lock clause: the clause on PostgreSQL and MySQL, the
    /// query unchanged on SQLite; the blocking connection's
    /// [`LockingConnection::Locked`].
    type Locked<Q: LockingDsl<L>, L>;

    /// Puts the row-lock clause on `query`: the blocking connection's
    /// [`LockingConnection::apply_lock`].
    fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L>;

    /// Begins a transaction fit for locking (a savepoint when one is open) with
    /// the options' lock timeout; what it returns puts the setting back.
    #[doc(hidden)]
    fn begin_locked(
        &mut self,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Restore, Error>> + Send;

    /// Whether [`begin_locked`](Self::begin_locked) changes a session setting
    /// for these options, to be put back after the call. The default: a lock
    /// timeout does.
    #[doc(hidden)]
    fn changes_setting(options: &LockOptions) -> bool {
        options.timeout_millis().is_some()
    }

    /// Puts back a setting [`begin_locked`](Self::begin_locked) changed: `before`
    /// the end of the transaction (or savepoint) or after it.
    #[doc(hidden)]
    fn restore(
        &mut self,
        restore: &Restore,
        before_end: bool,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Makes sure the open transaction holds what row locks need, as
    /// [`LockingConnection::take_write_lock`](crate::LockingConnection::take_write_lock):
    /// SQLite's write lock; nothing elsewhere.
    #[doc(hidden)]
    fn take_write_lock(&mut self) -> impl Future<Output = Result<(), Error>> + Send {
        std::future::ready(Ok(()))
    }

    /// Opens a lockkit call's level: diesel-async's `BEGIN`, or a `SAVEPOINT`
    /// when a transaction is open. MySQL/MariaDB begin with
    /// [`MYSQL_BEGIN`](crate::transaction::MYSQL_BEGIN), as the blocking
    /// connection does.
    #[doc(hidden)]
    fn begin_level(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
        Self::TransactionManager::begin_transaction(self)
    }

    /// Before diesel-async's `COMMIT` of a level whose work succeeded: the
    /// blocking connection's
    /// [`Control::commit_marked`](crate::transaction::Control::commit_marked).
    /// The default: nothing.
    #[doc(hidden)]
    fn commit_marked(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
        std::future::ready(Ok(()))
    }

    /// Begins a top-level `SERIALIZABLE` transaction (SQLite: `BEGIN
    /// IMMEDIATE`), with the blocking side's statements.
    #[doc(hidden)]
    fn begin_serializable(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// After a nested transaction failed (with `cause` when lockkit can see it):
    /// whether the server has ended the whole transaction, and why; the blocking
    /// connection's answer. The default: only a lost connection does.
    #[doc(hidden)]
    fn transaction_ended(
        &mut self,
        cause: Option<&Error>,
    ) -> impl Future<Output = Option<Error>> + Send {
        std::future::ready(crate::transaction::connection_lost(cause))
    }

    /// After the server ended the whole transaction under a nested call: keeps
    /// the caller's code from writing on in autocommit, as the blocking
    /// connection's [`Control::keep_aborted`](crate::transaction::Control::keep_aborted).
    /// The default: nothing.
    #[doc(hidden)]
    fn keep_aborted(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// After an outermost transaction failed: puts diesel-async's transaction
    /// manager back in order, as the blocking connection's
    /// [`Control::repair`](crate::transaction::Control::repair). The default:
    /// nothing.
    #[doc(hidden)]
    fn repair(&mut self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// After lockkit's journal saw a statement end the open transaction with
    /// `cause`: whether the server agrees, as the blocking connection's
    /// [`Control::confirms_abort`](crate::transaction::Control::confirms_abort).
    /// The default: yes.
    #[doc(hidden)]
    fn confirms_abort(&mut self, cause: &Error) -> impl Future<Output = bool> + Send {
        let _ = cause;
        std::future::ready(true)
    }
}

/// A session setting a locked transaction changed, to be put back.
#[doc(hidden)]
#[derive(Debug)]
pub enum Restore {
    /// Nothing changed.
    Nothing,
    /// PostgreSQL, nested: the outer transaction's `lock_timeout` (`SET LOCAL`
    /// survives `RELEASE SAVEPOINT`).
    LockTimeout(String),
    /// MySQL/MariaDB: the session's `innodb_lock_wait_timeout`, kept on the
    /// server in the user variable of this transaction depth.
    LockWaitTimeout(u32),
    /// SQLite: the connection's busy timeout.
    BusyTimeout(i32),
}

impl Restore {
    /// What is left to put back after the end of the transaction (or
    /// savepoint), once [`AsyncLockingConnection::restore`] ran before it.
    /// SQLite's busy timeout is back by then: it bounds the wait for the write
    /// lock, not the `COMMIT`, which in rollback-journal mode waits for the
    /// database's readers.
    pub(crate) fn after_end(self) -> Restore {
        match self {
            Restore::BusyTimeout(_) => Restore::Nothing,
            other => other,
        }
    }
}

/// The connection while its state is unsettled: a session setting a call
/// changes may be in force (its lock timeout on MySQL/MariaDB; SQLite's busy
/// timeout, which `nowait()` and `skip_locked()` set to 0 as well), armed from
/// before the setting is sent until it is put back; or a transaction statement
/// that opens a level ([`begin_transaction`]) is in flight, before the call's
/// [`Level`] guards it. Dropped armed (the call's future was dropped in
/// between), it marks the connection's transaction manager broken, so that a
/// pool closes the connection instead of handing the next user the dropped
/// call's setting (diesel-async finishes a statement already sent even when
/// its future is dropped), and so that diesel-async refuses the next
/// transaction statement with `BrokenTransactionManager` instead of sending it
/// without knowing whether the level opened (a debug build of diesel-async
/// panics there). The advisory locks' `Held` does the same for a session lock.
pub(crate) struct Unsettled<'c, C: AsyncConnection> {
    pub(crate) conn: &'c mut C,
    armed: bool,
    /// Armed only against a reply left unread ([`Unsettled::until_replied`]).
    unread_only: bool,
    /// A versioned write in flight: recorded in the journal if dropped
    /// ([`Tentative`]).
    tentative: Option<Tentative>,
}

impl<'c, C: AsyncConnection> Unsettled<'c, C> {
    /// Armed: a setting or a transaction statement is about to be sent.
    pub(crate) fn armed(conn: &'c mut C) -> Self {
        Unsettled::new(conn, false)
    }

    /// Around the statements a call sends outside a level of its own: armed
    /// only against a reply left unread (a drop with one of them in flight on
    /// MySQL/MariaDB). Installs lockkit's journal first, which sees every
    /// statement begin and its reply come; on a MySQL/MariaDB connection with
    /// instrumentation of its own, which it cannot watch, any drop marks the
    /// connection broken.
    pub(crate) fn until_replied(conn: &'c mut C) -> Self {
        watch(conn);
        Unsettled::new(conn, true)
    }

    fn new(conn: &'c mut C, unread_only: bool) -> Self {
        Unsettled {
            conn,
            armed: true,
            unread_only,
            tentative: None,
        }
    }

    /// The connection, and where a versioned write puts what its statement
    /// in flight may leave on its row, until its answer came.
    pub(crate) fn parts(&mut self) -> (&mut C, &mut Option<Tentative>) {
        (&mut *self.conn, &mut self.tentative)
    }

    /// The setting is back (or was never changed), the statement answered.
    pub(crate) fn settled(&mut self) {
        self.armed = false;
    }
}

impl<C: AsyncConnection> Drop for Unsettled<'_, C> {
    fn drop(&mut self) {
        if let Some(tentative) = self.tentative.take().filter(|_| self.armed) {
            from_drop(self.conn, |conn| {
                tentative.record(&mut journal::AsyncWatched(conn));
            });
        }
        // Only MySQL/MariaDB leaves a reply unread ([`reply_left_unread`]):
        // elsewhere there is nothing to ask the connection.
        let unread_anywhere = journal::Ends::of::<C::Backend>() == journal::Ends::OnDeadlock;
        if self.armed && (unread_anywhere || !self.unread_only) {
            let unread_only = self.unread_only;
            mark_broken_from_drop(
                self.conn,
                "a lockkit call was dropped while a setting of its was in force or a transaction statement in flight: the connection is marked broken, for its pool to close",
                |conn| {
                    !unread_only
                        || journal::levels(&mut journal::AsyncWatched(conn))
                            .is_none_or(|levels| levels.reply_unread())
                },
            );
        }
    }
}

/// diesel-async's `begin_transaction` (`BEGIN`, or a `SAVEPOINT` when nested)
/// under an armed [`Unsettled`]: how every async lockkit call opens its level
/// when its backend needs nothing else.
pub(crate) async fn begin_transaction<C: AsyncLockingConnection>(
    conn: &mut C,
) -> Result<(), Error> {
    let mut unsettled = Unsettled::armed(conn);
    let begun = match unsettled.conn.begin_level().await {
        Ok(()) => Ok(()),
        // Still armed: what deciding the error sends (the stand-in's
        // statements) is in flight too.
        Err(err) => Err(begin_failed(&mut *unsettled.conn, err).await),
    };
    unsettled.settled();
    begun
}

/// A transaction or savepoint `conn` could not open: nested, its statement may
/// be the first to learn that the caller's transaction ended (another Galera
/// node's commit aborted it while it sat idle), and the error is decided as a
/// failed write's (`TransactionAborted`, the stand-in open), as the blocking
/// side's failed level is, not a plain retryable error.
pub(crate) async fn begin_failed<C: AsyncConnection>(
    conn: &mut C,
    err: diesel::result::Error,
) -> Error {
    failed_write(conn, classify(err)).await
}

/// Begins a transaction fit for locking on `conn`
/// ([`AsyncLockingConnection::begin_locked`]) under an armed [`Unsettled`],
/// which stays armed while the session setting it changed is in force
/// ([`AsyncLockingConnection::changes_setting`]): settle it once the call's
/// end has put the setting back.
pub(crate) async fn open_locked<'c, C: AsyncLockingConnection>(
    conn: &'c mut C,
    options: &LockOptions,
) -> Result<(Unsettled<'c, C>, Restore), Error> {
    let mut unsettled = Unsettled::armed(conn);
    let begun = unsettled.conn.begin_locked(options).await;
    // On an error, `begin_locked` put the setting back.
    if begun.is_err() || !C::changes_setting(options) {
        unsettled.settled();
    }
    begun.map(|restore| (unsettled, restore))
}

/// Runs `f` on `conn` from a guard's `Drop`, unless the connection cannot be
/// reached there: diesel-async's SQLite wrapper panics on any access while a
/// statement a dropped future sent still runs on its blocking thread. Then
/// (and on SQLite while the thread is already panicking) nothing is done, a
/// warning says so, and the answer is `None`.
fn from_drop<C: AsyncConnection, R>(conn: &mut C, f: impl FnOnce(&mut C) -> R) -> Option<R> {
    if journal::Ends::of::<C::Backend>() != journal::Ends::Never {
        return Some(f(conn));
    }
    let reached = match std::thread::panicking() {
        true => None,
        false => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))).ok(),
    };
    if reached.is_none() {
        tracing::warn!(
            target: "lockkit",
            "a lockkit call was dropped while its statement still ran on SQLite's blocking thread: its connection cannot be marked broken; drop it"
        );
    }
    reached
}

/// From a guard's `Drop` (through [`from_drop`]): marks `conn`'s transaction
/// manager broken, so that no commit on it succeeds and a pool closes it, when
/// `decide` says the dropped call left it unsafe, and warns with `why`.
fn mark_broken_from_drop<C: AsyncConnection>(
    conn: &mut C,
    why: &'static str,
    decide: impl FnOnce(&mut C) -> bool,
) {
    let marked = from_drop(conn, |conn| {
        let broken = decide(conn);
        if broken {
            condemn(conn);
        }
        broken
    });
    if marked == Some(true) {
        tracing::warn!(target: "lockkit", "{why}");
    }
}

/// Marks `conn`'s transaction manager broken on purpose, for its pool to
/// close: a call left it unsafe (a setting or a session lock in force, a reply
/// unread), and no [`repair`](AsyncLockingConnection::repair) may hand it on.
pub(crate) fn condemn<C: AsyncConnection>(conn: &mut C) {
    C::TransactionManager::transaction_manager_status_mut(conn).set_in_error();
    if let Some(levels) = journal::levels(&mut journal::AsyncWatched(conn)) {
        levels.condemn();
    }
}

/// Whether lockkit marked `conn` broken on purpose ([`condemn`]).
fn condemned<C: AsyncConnection>(conn: &mut C) -> bool {
    journal::levels(&mut journal::AsyncWatched(conn)).is_some_and(|levels| levels.condemned())
}

/// At the end of a lockkit call on MySQL/MariaDB, before any statement of
/// its end: a statement of the work's own whose future the work dropped (a
/// `timeout` it caught, going on) left its reply unread, which the next
/// statement reads as its own. Asked only where the journal saw a statement
/// begin and no reply come since (a statement that failed to bind does that
/// too, with nothing sent): the connection's probe ([`replies_in_step`]). Out of
/// step, the connection is [`condemn`]ed and `true`: nothing of the work's
/// may be sent on it, nor a `COMMIT`, and its pool closes it. The outermost
/// call's end still rolls the server's transaction back
/// ([`roll_back_out_of_step`]).
pub(crate) async fn replies_out_of_step<C: AsyncConnection>(conn: &mut C) -> bool {
    let stranded = match journal::levels(&mut journal::AsyncWatched(&mut *conn)) {
        Some(levels) if levels.replies_unsure() => levels.stranded(),
        _ => return false,
    };
    // Found out of step under a nested call already: nothing more is sent.
    if condemned(conn) {
        return true;
    }
    // The probe sends no read that could hide an error in place of its rows;
    // it leaves the journal as sure as it found it.
    let before = journal::own_read(&mut journal::AsyncWatched(&mut *conn));
    let in_step = replies_in_step(conn).await;
    journal::own_read_done(&mut journal::AsyncWatched(&mut *conn), before);
    if in_step {
        if let Some(levels) = journal::levels(&mut journal::AsyncWatched(&mut *conn)) {
            levels.in_step(stranded);
        }
        return false;
    }
    condemn(conn);
    tracing::warn!(
        target: "lockkit",
        "a statement's reply was left unread inside a lockkit call (its future dropped): the connection is marked broken, for its pool to close"
    );
    true
}

/// Whether `conn` reads its own replies: on MySQL/MariaDB a question whose
/// answer only it can give, the error of a column named with a number of
/// its own (`SELECT lockkit_probe_<n>`: "Unknown column 'lockkit_probe_<n>'
/// in 'field list'", in any language, and with no table, so no privilege,
/// asked for). A reply left unread (an `UPDATE`'s row count, another error,
/// another query's rows) reads back as anything else. Elsewhere yes, with
/// nothing sent: PostgreSQL's client keeps its replies in step, and SQLite
/// has none. Any connection, so that the stand-in asks it too.
async fn replies_in_step<C: AsyncConnection>(conn: &mut C) -> bool {
    if journal::Ends::of::<C::Backend>() != journal::Ends::OnDeadlock {
        return true;
    }
    let token = probe_token();
    match conn.batch_execute(&probe(&token)).await {
        Err(diesel::result::Error::DatabaseError(_, info)) => info.message().contains(&token),
        _ => false,
    }
}

/// Probes sent after the `ROLLBACK` of [`roll_back_out_of_step`] at most: one
/// more than the replies left unread before it (one per statement cut
/// short) reaches a probe's own. A work that cut more statements short than
/// this leaves the locks to the pool's close; on a lost connection (whose
/// errors diesel-async reports as the server's) each probe fails at once.
const PROBES_AFTER_ROLLBACK: usize = 64;

/// Ends the server's transaction on a connection found out of step
/// ([`replies_out_of_step`]), and returns once the server has run that
/// `ROLLBACK`, so that the transaction's locks are gone when the lockkit call
/// returns, not when the pool closes the connection. Each reply read is an
/// earlier statement's, so the `ROLLBACK`'s own says nothing; the server runs
/// a connection's statements in order, so a probe's own reply, read back,
/// means the `ROLLBACK` before it has run. Probes are sent until one's comes
/// back, [`PROBES_AFTER_ROLLBACK`] at most (a lost connection rolls back
/// too).
pub(crate) async fn roll_back_out_of_step<C: AsyncConnection>(conn: &mut C) {
    let _ = conn.batch_execute("ROLLBACK").await;
    if journal::Ends::of::<C::Backend>() != journal::Ends::OnDeadlock {
        return;
    }
    let mut sent = Vec::new();
    for _ in 0..PROBES_AFTER_ROLLBACK {
        sent.push(probe_token());
        match conn.batch_execute(&probe(&sent[sent.len() - 1])).await {
            Err(diesel::result::Error::DatabaseError(_, info))
                if sent
                    .iter()
                    .any(|token| info.message().contains(token.as_str())) =>
            {
                return
            }
            _ => {}
        }
    }
}

/// A number no other statement's reply holds, for [`probe`].
fn probe_token() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The probe's statement: a column named with `token`, which the server's
/// error repeats.
fn probe(token: &str) -> String {
    format!("SELECT lockkit_probe_{token}")
}

/// An async lockkit call's own transaction level, from the moment it is open
/// until the call's end has closed it ([`closed`](Level::closed)); the call
/// reaches its connection through it. Dropped open (the call's future was
/// dropped: a `tokio::time::timeout` around it, a client that went away), it
/// leaves the level, and whatever the connection sends next runs inside it,
/// to whoever ends the level below (see [`levels`](crate::transaction::levels)):
///
/// * a lockkit call's, directly below: the next lockkit call rolls the
///   dropped level back ([`roll_back_unused_drop`]) if nothing was sent
///   since, or else the call below does at its end ([`roll_back_dropped`]),
///   and fails if a statement ran in it;
/// * otherwise (the outermost level, or nested in a transaction of the
///   caller's own, or no journal on the connection to tell which, or dropped
///   in the call's end, whose statement may be in flight, or on MySQL/MariaDB
///   with a statement's reply unread ([`reply_left_unread`])): it marks
///   the connection's transaction manager broken, so that the caller's commit,
///   or next transaction, fails instead of committing nothing behind an `Ok`,
///   and a pool closes the connection (the server then rolls back).
pub(crate) struct Level<'c, C: AsyncConnection> {
    conn: &'c mut C,
    level: u32,
    open: bool,
    /// The call's end is sending its statements: a drop now may leave its
    /// `COMMIT`, `RELEASE` or `ROLLBACK TO` in flight, and the level in an
    /// unknown state.
    ending: bool,
}

impl<'c, C: AsyncConnection> Level<'c, C> {
    /// The level just opened on `conn`: its transaction depth now.
    pub(crate) fn opened(conn: &'c mut C) -> Self {
        let level = transaction_depth(conn);
        if let Some(levels) = journal::levels(&mut journal::AsyncWatched(&mut *conn)) {
            levels.opened(level);
        }
        Level {
            conn,
            level,
            open: true,
            ending: false,
        }
    }

    /// The call's end begins ([`end`](super::transaction::end)).
    pub(crate) fn ending(&mut self) {
        self.ending = true;
    }

    /// The call's end has closed the level (or has left it to the caller,
    /// after the server ended the whole transaction).
    pub(crate) fn closed(mut self) {
        self.open = false;
    }
}

impl<C: AsyncConnection> std::ops::Deref for Level<'_, C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.conn
    }
}

impl<C: AsyncConnection> std::ops::DerefMut for Level<'_, C> {
    fn deref_mut(&mut self) -> &mut C {
        self.conn
    }
}

impl<C: AsyncConnection> Drop for Level<'_, C> {
    fn drop(&mut self) {
        let (level, open, ending) = (self.level, self.open, self.ending);
        mark_broken_from_drop(
            self.conn,
            "a lockkit call was dropped before it finished, outside any other lockkit call: the connection is marked broken, so that no commit on it can report work it does not commit",
            |conn| {
                let open = open && transaction_depth(conn) >= level;
                let mut watched = journal::AsyncWatched(conn);
                let levels = journal::levels(&mut watched);
                let in_step = !reply_left_unread::<C>(levels.as_deref());
                let handed_on = match levels {
                    Some(levels) => {
                        let handed_on = open && !ending && in_step && levels.dropped(level);
                        levels.closed(level);
                        handed_on
                    }
                    None => false,
                };
                (open && !handed_on) || !in_step
            },
        );
    }
}

/// From a guard's `Drop`: whether the dropped call left a statement's reply
/// unread on MySQL/MariaDB, where the next statement may read it as its own
/// (a `COMMIT` reported failed that committed, or the other way round). Such
/// a connection is marked broken whatever level the call held, so that no
/// `COMMIT` is sent on it. PostgreSQL's client keeps its replies in step, and
/// SQLite has none.
fn reply_left_unread<C: AsyncConnection>(levels: Option<&Levels>) -> bool {
    journal::Ends::of::<C::Backend>() == journal::Ends::OnDeadlock
        && levels.is_some_and(Levels::reply_unread)
}

/// How many transactions are open on `conn` (0: none), as
/// [`crate::transaction::transaction_depth`] on the blocking side.
pub(crate) fn transaction_depth<C: AsyncConnection>(conn: &mut C) -> u32 {
    crate::transaction::depth_of(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// Whether a transaction is open on `conn`.
pub(crate) fn in_transaction<C: AsyncConnection>(conn: &mut C) -> bool {
    transaction_depth(conn) > 0
}

/// [`require_transaction`](crate::transaction::require_transaction) for an
/// async connection.
pub(crate) fn require_transaction<C: AsyncConnection>(conn: &mut C) -> Result<(), Error> {
    crate::transaction::require_transaction(C::TransactionManager::transaction_manager_status_mut(
        conn,
    ))
}

/// Where an async lockkit transaction about to begin on `conn` stands
/// ([`Began`](crate::transaction::Began)), with lockkit's journal watching the
/// work, as the blocking side's panic guard has it; nested, first asks
/// [`require_live`] (which rolls back the levels a dropped nested call left
/// unused).
///
/// # Errors
///
/// A classified error when those levels cannot be rolled back. Nested in a
/// transaction that a statement the caller let go has ended
/// ([`ended_by_statement`]): [`Error::TransactionAborted`], before anything is
/// sent that MySQL/MariaDB would run in autocommit; the read-only stand-in is
/// opened, as at the end of a nested call that found the transaction ended.
pub(crate) async fn began<C: AsyncLockingConnection>(conn: &mut C) -> Result<Begun, Error> {
    watch(conn);
    refuse_if_ended_on_sqlite(conn).await?;
    let nested = in_transaction(conn);
    if nested {
        let mut unsettled = Unsettled::until_replied(conn);
        let live = require_live(unsettled.conn).await;
        unsettled.settled();
        live?;
    }
    Ok(Begun {
        began: crate::transaction::Began::with_work(nested),
        nested,
        level: Some(transaction_depth(conn) + 1),
    })
}

/// Before a lockkit call begins on `conn`, or sends anything in the caller's
/// transaction ([`require_live`], [`check_write`], an idempotency key's
/// response after its work): rolls back the levels a nested call whose future
/// was dropped left open, if nothing was sent since (the caller tries again
/// after a timeout, or goes on with other work), so that the new call's work
/// is not made inside them and rolled back with them at the end of the call
/// around it; the depth then. Marks the connection broken if one cannot be
/// rolled back.
pub(crate) async fn roll_back_unused_drop<C: AsyncConnection>(conn: &mut C) -> Result<u32, Error> {
    let depth = transaction_depth(conn);
    let dropped = match journal::levels(&mut journal::AsyncWatched(&mut *conn)) {
        Some(levels) if depth > 0 => levels.take_unused_drop(),
        _ => None,
    };
    let Some(dropped) = dropped.filter(|&level| level > 1 && level <= depth) else {
        return Ok(depth);
    };
    roll_back_above(conn, dropped - 1).await.map_err(classify)?;
    Ok(dropped - 1)
}

/// Rolls back every level above `level` on `conn` (what a dropped nested call
/// left open), under an armed [`Unsettled`], and tells the journal. `Err`
/// when one cannot be: the connection is then marked broken.
async fn roll_back_above<C: AsyncConnection>(conn: &mut C, level: u32) -> QueryResult<()> {
    let depth = transaction_depth(conn);
    let mut unsettled = Unsettled::armed(conn);
    for _ in level..depth {
        if let Err(err) = C::TransactionManager::rollback_transaction(unsettled.conn).await {
            C::TransactionManager::transaction_manager_status_mut(unsettled.conn).set_in_error();
            unsettled.settled();
            return Err(err);
        }
    }
    unsettled.settled();
    drop(unsettled);
    crate::transaction::rolled_back(conn, level + 1);
    Ok(())
}

/// Where an async lockkit transaction began ([`Began`](crate::transaction::Began)),
/// and the level it opens in diesel-async's books: what its end needs to tell
/// its own level from one that a nested call whose future was dropped left
/// open ([`roll_back_dropped`]).
#[derive(Clone, Copy)]
pub(crate) struct Begun {
    pub(crate) began: crate::transaction::Began,
    /// Nested in an open transaction: a savepoint.
    pub(crate) nested: bool,
    /// The depth of the transaction (or savepoint) the call opens, when known:
    /// always for an outermost one (1).
    pub(crate) level: Option<u32>,
}

/// A transaction begun without [`began`]: outermost (level 1), or nested
/// around lockkit's own statements only, where no nested call can be dropped.
impl From<crate::transaction::Began> for Begun {
    fn from(began: crate::transaction::Began) -> Self {
        Begun {
            began,
            nested: began.nested,
            level: (!began.nested).then_some(1),
        }
    }
}

/// At the end of the call that `begun` began: levels deeper than its own in
/// diesel-async's books were left open by a nested call whose future was
/// dropped (a `tokio::time::timeout` around it), and every statement since
/// ran inside them. They are rolled back, so that the call's `COMMIT` (or
/// `RELEASE`) is its own and not the dropped savepoint's. `Err` when one
/// cannot be (the connection is then marked broken, for its pool to close),
/// and [`Error::NestedCallDropped`] when a statement ran in them after the
/// drop, or when nobody told who left them ([`Left::Unknown`]): work that went
/// with them must not be reported as committed.
///
/// [`Left::Unknown`]: crate::transaction::levels::Left::Unknown
pub(crate) async fn roll_back_dropped<C: AsyncConnection, E>(
    conn: &mut C,
    begun: &Begun,
) -> Result<(), Failure<E>> {
    use crate::transaction::levels::Left;
    let Some(level) = begun.level else {
        return Ok(());
    };
    let left = transaction_depth(conn);
    if left <= level {
        return Ok(());
    }
    // Asked before the rollbacks below, which are statements too.
    let who = match journal::levels(&mut journal::AsyncWatched(&mut *conn)) {
        Some(levels) => levels.left_above(level),
        None => Left::Unknown,
    };
    tracing::warn!(
        target: "lockkit",
        "a nested lockkit call was dropped before it finished: its savepoint is rolled back at the end of the transaction around it"
    );
    roll_back_above(conn, level)
        .await
        .map_err(Failure::Diesel)?;
    match who {
        Left::Dropped => Ok(()),
        Left::Unknown => Err(Failure::Lockkit(Error::NestedCallDropped)),
    }
}

/// The blocking side's [`require_live`](crate::transaction::require_live) on an
/// async connection, after [`roll_back_unused_drop`]; also asked by
/// [`lock_all`](super::lock_all()), [`queue::claim`](super::queue::claim) and
/// the outbox's `enqueue`, which work inside the caller's transaction.
pub(crate) async fn require_live<C: AsyncLockingConnection>(conn: &mut C) -> Result<(), Error> {
    // A reply left unread (MySQL/MariaDB): whatever is sent now reads it.
    if replies_out_of_step(conn).await {
        return Err(Error::Database(
            diesel::result::Error::BrokenTransactionManager,
        ));
    }
    refuse_if_ended_on_sqlite(conn).await?;
    roll_back_unused_drop(conn).await?;
    match ended_by_statement(conn).await {
        Some(cause) => {
            conn.keep_aborted().await;
            Err(journal::aborted(&mut journal::AsyncWatched(conn), cause))
        }
        None => Ok(()),
    }
}

/// The blocking side's [`ended_by_statement`](crate::transaction::ended_by_statement)
/// on an async connection, asked before lockkit opens a nested transaction or
/// writes in the caller's ([`began`], [`require_live`], an idempotency key's
/// last write).
///
/// One more case: diesel-async's MySQL connection tells the journal that a
/// read succeeded as soon as its rows begin to come, and a deadlock that comes
/// in their place (a locking read that InnoDB runs after it has sent the
/// columns, such as one by a range) reaches the caller only. Where a read may
/// have hidden one since lockkit last knew ([`unsure`](crate::journal::unsure)),
/// the server is asked (`SELECT @@in_transaction`, one round trip; none after
/// writes only, and none on the other connections), and a transaction it
/// finds ended is treated as one a statement was seen to end.
pub(crate) async fn ended_by_statement<C: AsyncLockingConnection>(conn: &mut C) -> Option<Error> {
    // Installed now inside the caller's transaction, it is unsure at once.
    watch(conn);
    if let Some(cause) = ended_on_sqlite(conn).await {
        return Some(cause);
    }
    if !journal::watches(&mut journal::AsyncWatched(&mut *conn)) {
        return ended_unwatched(conn).await;
    }
    if journal::unsure(&mut journal::AsyncWatched(&mut *conn)) {
        if let Some(ended) = hidden_end(conn).await {
            return Some(ended);
        }
    }
    ended_by_seen_statement(conn).await
}

/// Where lockkit's journal is not sure that no read of the work hid an end
/// ([`unsure`](crate::journal::unsure)): the server's answer whether the open
/// transaction ended, as lockkit reports it
/// ([`ended_under_work`](crate::transaction::ended_under_work): not retryable
/// where the work wrote after that read). An answer that it is alive makes the
/// journal sure (`ended_unless_open`); a question that failed leaves it unsure.
async fn hidden_end<C: AsyncLockingConnection>(conn: &mut C) -> Option<Error> {
    let cause = conn.transaction_ended(None).await?;
    let watched = &mut journal::AsyncWatched(&mut *conn);
    journal::answered(watched, Some(&cause));
    Some(crate::transaction::ended_under_work(watched, cause))
}

/// [`ended_by_statement`] from what the journal saw only, with the server's
/// confirmation: what an outermost transaction asks before its `COMMIT`
/// ([`end`](super::transaction::end)), where asking the server after every read
/// would cost each call a round trip.
pub(crate) async fn ended_by_seen_statement<C: AsyncLockingConnection>(
    conn: &mut C,
) -> Option<Error> {
    if !journal::watches(&mut journal::AsyncWatched(&mut *conn)) {
        return ended_unwatched(conn).await;
    }
    let cause = journal::ended_by(&mut journal::AsyncWatched(&mut *conn))?;
    if conn.confirms_abort(&cause).await {
        Some(cause)
    } else {
        journal::forget_abort(&mut journal::AsyncWatched(conn));
        None
    }
}

/// The blocking side's [`ended_unwatched`](crate::transaction::ended_unwatched)
/// on an async connection: where no journal watches it, the server is asked
/// whether the open transaction is alive.
async fn ended_unwatched<C: AsyncLockingConnection>(conn: &mut C) -> Option<Error> {
    use journal::Watched;
    if !in_transaction(conn) {
        return None;
    }
    match journal::AsyncWatched(&mut *conn).ends() {
        #[cfg(feature = "postgres")]
        journal::Ends::UntilSavepointRollback => {
            let probe = crate::transaction::PG_CONFIRM_ABORT;
            conn.batch_execute(probe).await.err().map(classify)
        }
        journal::Ends::OnDeadlock => conn.transaction_ended(None).await,
        _ => None,
    }
}

/// The blocking side's [`ended_on_sqlite`](crate::transaction::ended_on_sqlite)
/// on an async connection: where a statement failed in the open transaction,
/// SQLite is asked whether it rolled back the whole transaction; then its
/// error, the cause.
pub(crate) async fn ended_on_sqlite<C: AsyncConnection>(conn: &mut C) -> Option<Error> {
    let watched = &mut journal::AsyncWatched(&mut *conn);
    if let Some(cause) = journal::orphaned(watched) {
        return Some(cause);
    }
    // Marked broken (lockkit does so after a dropped call): the call refuses
    // as such, and nothing is asked.
    if refuse_broken(conn).is_err() {
        return None;
    }
    let watched = &mut journal::AsyncWatched(&mut *conn);
    let seen = journal::seen_failure(watched);
    let failed = journal::take_failed_statement(watched)?;
    let probe = crate::transaction::probe_for(watched);
    let stranded = journal::levels(watched).map(|levels| levels.stranded());
    let before = transaction_depth(conn);
    let _ = conn.batch_execute(probe).await;
    let watched = &mut journal::AsyncWatched(conn);
    if let (Some(levels), Some(stranded)) = (journal::levels(watched), stranded) {
        levels.asked(stranded);
    }
    crate::transaction::after_probe(watched, status_of, failed, (before, seen))
}

/// The blocking side's [`refuse_if_ended_on_sqlite`](crate::transaction::refuse_if_ended_on_sqlite)
/// on an async connection: [`ended_on_sqlite`], then
/// [`Error::TransactionAborted`].
pub(crate) async fn refuse_if_ended_on_sqlite<C: AsyncConnection>(
    conn: &mut C,
) -> Result<(), Error> {
    match ended_on_sqlite(conn).await {
        Some(cause) => Err(journal::aborted(&mut journal::AsyncWatched(conn), cause)),
        None => Ok(()),
    }
}

/// The transaction manager of the connection `watched` wraps.
pub(crate) fn status_of<'w, C: AsyncConnection>(
    watched: &'w mut journal::AsyncWatched<'_, C>,
) -> &'w mut diesel::connection::TransactionManagerStatus {
    C::TransactionManager::transaction_manager_status_mut(&mut *watched.0)
}

/// [`Error::Database`] with `BrokenTransactionManager` when a dropped call
/// left `conn` in its transaction ([`crate::transaction::refuse_broken`]):
/// that transaction never commits, so a statement sent there would answer as
/// done for nothing, and keep its rows locked while the connection lives. For
/// the calls that write outside a lockkit transaction of their own (a lease's
/// release, the outbox's and the idempotency keys' housekeeping).
pub(crate) fn refuse_broken<C: AsyncConnection>(conn: &mut C) -> Result<(), Error> {
    crate::transaction::refuse_broken(C::TransactionManager::transaction_manager_status_mut(conn))
}

/// [`crate::transaction::refuse_transaction_or_broken`] on an async
/// connection: for the calls that send a setting for the transaction they are
/// about to open (`serializable`'s and the relay's `SET TRANSACTION ISOLATION
/// LEVEL` on MySQL/MariaDB), which on a broken connection would open none and
/// leave the setting for the connection's next transaction. Unlike the
/// blocking side, no repair first: lockkit marks an async connection broken
/// on purpose after a dropped call (a session advisory lock it may still hold,
/// a lock timeout it may have left in force, a reply left unread), with no
/// transaction open on the server, so that the pool closes it; a repair would
/// hand it on.
pub(crate) fn refuse_transaction_or_broken<C: AsyncConnection>(conn: &mut C) -> Result<(), Error> {
    refuse_broken(conn)?;
    crate::transaction::refuse_transaction(in_transaction(conn))
}

/// The blocking side's [`check_write`](crate::transaction::check_write) on an
/// async connection, after [`roll_back_unused_drop`].
///
/// One more case: where a read of the work's own may have hidden a deadlock
/// since lockkit last knew ([`unsure`](crate::journal::unsure): diesel-async's
/// MySQL connection), the server is asked first, as [`require_live`] asks it
/// (one round trip, only for a write that follows such a read in a
/// transaction), so that the write never runs in autocommit after an end
/// nobody saw.
pub(crate) async fn check_write<C: AsyncLockingConnection>(conn: &mut C) -> Result<(), Error> {
    refuse_broken(conn)?;
    journal::before_write(&mut journal::AsyncWatched(&mut *conn));
    refuse_if_ended_on_sqlite(conn).await?;
    roll_back_unused_drop(conn).await?;
    if journal::unsure(&mut journal::AsyncWatched(&mut *conn)) {
        // A reply left unread would answer the question: as `require_live`.
        if replies_out_of_step(conn).await {
            return Err(Error::Database(
                diesel::result::Error::BrokenTransactionManager,
            ));
        }
        if let Some(cause) = hidden_end(conn).await {
            if in_transaction(conn) {
                conn.keep_aborted().await;
            }
            return Err(journal::aborted(&mut journal::AsyncWatched(conn), cause));
        }
    }
    let watched = &mut journal::AsyncWatched(&mut *conn);
    let Some((cause, reported)) = journal::ended_before_write(watched) else {
        return Ok(());
    };
    if reported || open_stand_in(conn).await {
        // Confirmed: from now on as if the journal had seen it.
        let watched = &mut journal::AsyncWatched(&mut *conn);
        journal::answered(watched, Some(&cause));
        let cause = crate::transaction::ended_under_work(watched, cause);
        return Err(journal::aborted(&mut journal::AsyncWatched(conn), cause));
    }
    journal::forget_abort(&mut journal::AsyncWatched(conn));
    Ok(())
}

/// The blocking side's [`failed_write`](crate::transaction::failed_write) on an
/// async connection.
///
/// One more case: diesel-async's MySQL connection tells the connection's
/// instrumentation that a read succeeded as soon as its rows begin to come,
/// and an error that comes in their place (a locking read that is a
/// deadlock's victim, such as a versioned write's follow-up read) reaches the
/// caller only, so the journal never sees it. Inside a transaction on a
/// backend that ends it on a deadlock, a deadlock (or a lock wait timeout,
/// under `innodb_rollback_on_timeout`) may have ended it, seen or not, as where
/// no journal watches the connection: the stand-in's first statement asks.
pub(crate) async fn failed_write<C: AsyncConnection>(conn: &mut C, err: Error) -> Error {
    use crate::transaction::journal::Watched;
    let watched = &mut journal::AsyncWatched(&mut *conn);
    let ends = watched.ends();
    // SQLite: as on the blocking side (`journal::failed_unseen`).
    journal::failed_unseen(watched, &err, ends);
    let unseen = journal::may_end_transaction(&err)
        && watched.depth().is_some()
        && ends == journal::Ends::OnDeadlock;
    if !unseen && !journal::write_ended_transaction(watched, &err, ends) {
        return err;
    }
    if !open_stand_in(conn).await {
        journal::forget_abort(&mut journal::AsyncWatched(conn));
        return err;
    }
    journal::aborted(&mut journal::AsyncWatched(conn), err)
}

/// The blocking side's [`open_stand_in`](crate::transaction::open_stand_in) on
/// an async connection: `false` when the server still had a transaction open.
pub(crate) async fn open_stand_in<C: AsyncConnection>(conn: &mut C) -> bool {
    // A reply left unread (a statement of the work's own cut short, which
    // the probe tells from one that failed before it was sent): the error
    // may be that statement's, the stand-in's `START TRANSACTION` would
    // commit what the open transaction holds, and every reply read now is
    // another statement's. The connection is condemned instead, and counts as
    // ended: the write is refused (or reported `TransactionAborted`),
    // lockkit's next writes are refused on the broken connection, nothing on
    // it commits, and the end of the lockkit call around ends it.
    if replies_out_of_step(conn).await {
        return true;
    }
    #[cfg(feature = "mysql")]
    for (i, statement) in crate::transaction::keep_aborted_sql().iter().enumerate() {
        if let Err(err) = conn.batch_execute(statement).await {
            // On a lost connection this fails too, and there is nothing to keep.
            return !(i == 0 && crate::transaction::found_open(&err));
        }
    }
    #[cfg(not(feature = "mysql"))]
    let _ = conn;
    true
}

/// Installs lockkit's journal on `conn` unless it has instrumentation of its
/// own: it sees a statement end the transaction even when the work lets the
/// error go ([`ended_by`](crate::journal::ended_by)).
pub(crate) fn watch<C: AsyncConnection>(conn: &mut C) {
    let _ = journal::journal_of(&mut journal::AsyncWatched(conn));
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::sql_types::Text;
    use diesel::PgConnection;
    use diesel_async::{AsyncPgConnection, RunQueryDsl};

    use super::*;
    use crate::pessimistic::connection::postgres::{
        lock_timeout_query, lock_timeout_value, SET_LOCK_TIMEOUT,
    };

    async fn set_lock_timeout(conn: &mut AsyncPgConnection, value: String) -> QueryResult<()> {
        diesel::sql_query(SET_LOCK_TIMEOUT)
            .bind::<Text, _>(value)
            .execute(conn)
            .await
            .map(drop)
    }

    impl AsyncLockingConnection for AsyncPgConnection {
        type Locked<Q: LockingDsl<L>, L> = <PgConnection as LockingConnection>::Locked<Q, L>;

        fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L> {
            PgConnection::apply_lock(query, lock)
        }

        async fn begin_locked(&mut self, options: &LockOptions) -> Result<Restore, Error> {
            let nested = in_transaction(self);
            <Self as AsyncConnection>::TransactionManager::begin_transaction(self)
                .await
                .map_err(classify)?;
            let Some(millis) = options.timeout_millis() else {
                return Ok(Restore::Nothing);
            };
            let set = async {
                let outer = if nested {
                    let outer = lock_timeout_query().get_result::<String>(self).await?;
                    Restore::LockTimeout(outer)
                } else {
                    Restore::Nothing
                };
                set_lock_timeout(self, lock_timeout_value(millis)).await?;
                Ok(outer)
            }
            .await;
            match set {
                Ok(restore) => Ok(restore),
                Err(err) => {
                    let _ =
                        <Self as AsyncConnection>::TransactionManager::rollback_transaction(self)
                            .await;
                    Err(classify(err))
                }
            }
        }

        async fn restore(&mut self, restore: &Restore, before_end: bool) -> QueryResult<()> {
            match restore {
                Restore::LockTimeout(outer) if before_end => {
                    set_lock_timeout(self, outer.clone()).await
                }
                _ => Ok(()),
            }
        }

        async fn begin_serializable(&mut self) -> QueryResult<()> {
            diesel_async::AnsiTransactionManager::begin_transaction_sql(
                self,
                crate::transaction::PG_BEGIN_SERIALIZABLE,
            )
            .await
        }

        async fn confirms_abort(&mut self, _: &Error) -> bool {
            use diesel_async::SimpleAsyncConnection;
            let sql = crate::transaction::PG_CONFIRM_ABORT;
            self.batch_execute(sql).await.is_err()
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::MysqlConnection;
    use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

    use super::*;
    use crate::pessimistic::connection::mysql::{
        restore_lock_wait_timeout_sql, server_transaction_query, SaveAndSetLockWaitTimeout,
    };

    impl AsyncLockingConnection for AsyncMysqlConnection {
        type Locked<Q: LockingDsl<L>, L> = <MysqlConnection as LockingConnection>::Locked<Q, L>;

        fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L> {
            MysqlConnection::apply_lock(query, lock)
        }

        async fn begin_level(&mut self) -> QueryResult<()> {
            if transaction_depth(self) == 0 {
                // As on the blocking side: marked on a guarded session.
                let marked = journal::guarded(&mut journal::AsyncWatched(&mut *self));
                let begin = match marked {
                    true => crate::transaction::MYSQL_BEGIN_MARKED,
                    false => crate::transaction::MYSQL_BEGIN,
                };
                let begun =
                    diesel_async::AnsiTransactionManager::begin_transaction_sql(self, begin).await;
                // As on the blocking side: a server running read-only takes
                // diesel-async's `BEGIN` where it may refuse `READ WRITE`.
                match begun {
                    Err(diesel::result::Error::DatabaseError(_, info))
                        if crate::error::classification::is_read_only_server(info.message()) => {}
                    Ok(()) if marked => {
                        journal::began_marked(&mut journal::AsyncWatched(self));
                        return Ok(());
                    }
                    begun => return begun,
                }
            }
            <Self as AsyncConnection>::TransactionManager::begin_transaction(self).await
        }

        async fn begin_locked(&mut self, options: &LockOptions) -> Result<Restore, Error> {
            // innodb_lock_wait_timeout is a session setting: set it (keeping the
            // session's value on the server), run, put it back; the blocking
            // side's statements.
            let restore = match options.timeout_secs() {
                Some(secs) => {
                    let depth = transaction_depth(self);
                    let set = (SaveAndSetLockWaitTimeout { depth, secs })
                        .execute(self)
                        .await;
                    if let Err(err) = set {
                        // As on the blocking side: nested, this may be the
                        // first statement to learn that the caller's
                        // transaction ended.
                        return Err(begin_failed(self, err).await);
                    }
                    Restore::LockWaitTimeout(depth)
                }
                None => Restore::Nothing,
            };
            if let Err(err) = self.begin_level().await {
                let _ = self.restore(&restore, false).await;
                return Err(begin_failed(self, err).await);
            }
            Ok(restore)
        }

        async fn restore(&mut self, restore: &Restore, before_end: bool) -> QueryResult<()> {
            match restore {
                Restore::LockWaitTimeout(depth) if !before_end => {
                    self.batch_execute(&restore_lock_wait_timeout_sql(*depth))
                        .await
                }
                _ => Ok(()),
            }
        }

        async fn begin_serializable(&mut self) -> QueryResult<()> {
            // Applies to the next transaction only. Sent outside any
            // transaction: a call dropped before its `BEGIN` is in diesel-async's
            // books (with the statement's reply unread, or the setting pending
            // for the next user's transaction) marks the connection broken.
            let mut unsettled = Unsettled::armed(self);
            let conn = &mut *unsettled.conn;
            let begun = match diesel::sql_query(crate::transaction::MYSQL_SET_SERIALIZABLE)
                .execute(&mut *conn)
                .await
            {
                Ok(_) => conn.begin_level().await,
                Err(err) => Err(err),
            };
            unsettled.settled();
            begun
        }

        async fn commit_marked(&mut self) -> QueryResult<()> {
            // As on the blocking side.
            if transaction_depth(self) != 1 {
                return Ok(());
            }
            match journal::marked_commit(&mut journal::AsyncWatched(&mut *self)) {
                Some(commit) => self
                    .batch_execute(commit)
                    .await
                    .map_err(crate::transaction::ended_before_commit),
                None => Ok(()),
            }
        }

        async fn transaction_ended(&mut self, cause: Option<&Error>) -> Option<Error> {
            // MariaDB knows.
            let alive = caller_transaction_alive(self).await;
            crate::transaction::ended_unless_open(&mut journal::AsyncWatched(self), alive, cause)
        }

        async fn confirms_abort(&mut self, cause: &Error) -> bool {
            self.transaction_ended(Some(cause)).await.is_some()
        }

        async fn keep_aborted(&mut self) {
            let _ = super::open_stand_in(self).await;
        }

        async fn repair(&mut self) {
            // As the blocking connection's: Galera's answer to a ROLLBACK.
            // Never a connection lockkit marked broken on purpose.
            type Manager = <AsyncMysqlConnection as AsyncConnection>::TransactionManager;
            if crate::transaction::is_broken(Manager::transaction_manager_status_mut(self))
                && !condemned(self)
                && matches!(in_server_transaction(self).await, Ok(false))
            {
                *Manager::transaction_manager_status_mut(self) = Default::default();
            }
        }
    }

    /// Whether the caller's transaction is alive on the server, as the blocking
    /// connection reads it: open, and not lockkit's stand-in for an aborted one.
    async fn caller_transaction_alive(conn: &mut AsyncMysqlConnection) -> QueryResult<bool> {
        use crate::transaction::StandIn;
        match StandIn::read(server_transaction_query().get_result(conn).await?) {
            StandIn::NoTransaction => Ok(false),
            StandIn::Alive => Ok(true),
            StandIn::Probe(token) => match StandIn::probe(&token) {
                Some(probe) => match conn.batch_execute(&probe).await {
                    Ok(()) => Ok(false),
                    // The probe met the abort of the caller's transaction
                    // (Galera's 1213 at the next statement): it has ended.
                    Err(err) if crate::transaction::ends_transaction(&err) => Err(err),
                    Err(_) => conn.batch_execute(StandIn::FORGET).await.map(|()| true),
                },
                None => conn.batch_execute(StandIn::FORGET).await.map(|()| true),
            },
        }
    }

    /// MariaDB's `@@in_transaction`: whether the server has any transaction open.
    async fn in_server_transaction(conn: &mut AsyncMysqlConnection) -> QueryResult<bool> {
        server_transaction_query()
            .get_result::<(i64, Option<String>)>(conn)
            .await
            .map(|(open, _)| open != 0)
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::connection::AnsiTransactionManager;
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

    use super::*;
    use crate::pessimistic::connection::sqlite::{
        set_busy_timeout_sql, BusyTimeout, BUSY_TIMEOUT, WRITE_LOCK,
    };
    use crate::transaction::SQLITE_BEGIN_IMMEDIATE;

    type Wrapped = SyncConnectionWrapper<SqliteConnection>;

    impl AsyncLockingConnection for Wrapped {
        type Locked<Q: LockingDsl<L>, L> = <SqliteConnection as LockingConnection>::Locked<Q, L>;

        fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L> {
            SqliteConnection::apply_lock(query, lock)
        }

        async fn begin_locked(&mut self, options: &LockOptions) -> Result<Restore, Error> {
            let wait = options.wait_mode();
            let restore = match wait.busy_timeout_millis(options.timeout_millis()) {
                Some(millis) => {
                    // lockkit's own statements, whose answers it sees: they
                    // leave the journal as sure as it was.
                    let before = journal::own_read(&mut journal::AsyncWatched(&mut *self));
                    let previous = diesel::sql_query(BUSY_TIMEOUT)
                        .get_result::<BusyTimeout>(self)
                        .await
                        .map_err(classify)?
                        .timeout;
                    self.batch_execute(&set_busy_timeout_sql(millis))
                        .await
                        .map_err(classify)?;
                    journal::own_read_done(&mut journal::AsyncWatched(&mut *self), before);
                    Restore::BusyTimeout(previous)
                }
                None => Restore::Nothing,
            };
            let waited = crate::metrics::LockWait::start();
            // Top level: `BEGIN IMMEDIATE` takes the write lock before the first
            // read, so writers queue here. Nested: a savepoint takes no lock, and
            // the outer transaction may be a deferred one that has none yet.
            let begun = if in_transaction(self) {
                match <Self as AsyncConnection>::TransactionManager::begin_transaction(self).await {
                    Ok(()) => {
                        // The savepoint is open and the caller's call holds no
                        // guard of its level yet: dropped while waiting for the
                        // write lock, the connection is marked broken.
                        let mut unsettled = Unsettled::armed(self);
                        // lockkit's own statement, whose answer it sees.
                        let watched = &mut journal::AsyncWatched(&mut *unsettled.conn);
                        let before = journal::own_read(watched);
                        let locked = unsettled.conn.batch_execute(WRITE_LOCK).await;
                        if locked.is_ok() {
                            let watched = &mut journal::AsyncWatched(&mut *unsettled.conn);
                            journal::own_read_done(watched, before);
                        }
                        if locked.is_err() {
                            let _ = <Self as AsyncConnection>::TransactionManager::rollback_transaction(unsettled.conn).await;
                        }
                        unsettled.settled();
                        locked
                    }
                    Err(err) => Err(err),
                }
            } else {
                self.spawn_blocking(|sqlite| {
                    AnsiTransactionManager::begin_transaction_sql(sqlite, SQLITE_BEGIN_IMMEDIATE)
                })
                .await
            };
            match begun {
                Ok(()) => {
                    waited.acquired("database", 1);
                    Ok(restore)
                }
                Err(err) => {
                    let _ = self.restore(&restore, false).await;
                    Err(wait.classify_write_lock(err))
                }
            }
        }

        fn changes_setting(options: &LockOptions) -> bool {
            // `nowait()` and `skip_locked()` set the busy timeout too (to 0).
            options
                .wait_mode()
                .busy_timeout_millis(options.timeout_millis())
                .is_some()
        }

        async fn restore(&mut self, restore: &Restore, _before_end: bool) -> QueryResult<()> {
            match restore {
                // Before the end too: see `Restore::after_end`.
                Restore::BusyTimeout(previous) => {
                    self.batch_execute(&set_busy_timeout_sql(*previous)).await
                }
                _ => Ok(()),
            }
        }

        async fn take_write_lock(&mut self) -> Result<(), Error> {
            self.batch_execute(WRITE_LOCK).await.map_err(classify)
        }

        async fn begin_serializable(&mut self) -> QueryResult<()> {
            self.spawn_blocking(|sqlite| {
                AnsiTransactionManager::begin_transaction_sql(sqlite, SQLITE_BEGIN_IMMEDIATE)
            })
            .await
        }
    }
}
