//! Rollbacks, seen: the versions lockkit wrote inside transactions that did not
//! commit, so that a struct holding one never writes over somebody else's row.
//!
//! # The problem
//!
//! A versioned write inside a transaction advances the struct's version at once
//! (`lock_version` 0 → 1), as later writes in the same transaction need. If the
//! transaction then rolls back, the row is at 0 again but the struct says 1. When
//! somebody else now writes the row (0 → 1, with *their* data), the first struct's
//! next write checks `lock_version = 1`, matches, and overwrites them: a lost update
//! that no version number can reveal (the "rollback ABA"). Rails avoids it by
//! restoring `lock_version` on rollback; Diesel has no transaction callbacks, and
//! lockkit cannot reach a struct after the write returned.
//!
//! # What lockkit does
//!
//! Diesel reports every `BEGIN`, `COMMIT`, `ROLLBACK` and savepoint to the
//! connection's [`Instrumentation`]. lockkit installs a [`Journal`] there (the
//! first time it writes a versioned row on a connection that has no
//! instrumentation of its own), and records each version it writes inside a
//! transaction as *tentative*. A commit forgets them; a rollback (of the
//! transaction or of the savepoint that holds them, or the connection being
//! dropped with the transaction open) marks them rolled back. A later versioned
//! write from a struct holding a rolled-back version then:
//!
//! 1. writes as if the version had been restored (Rails' behaviour): it expects the
//!    version the row had before the rolled-back write; if nobody wrote since, it
//!    succeeds, exactly once, and (rule 4) leaves the row one number past the
//!    rolled-back one, which any copy of the struct (a clone made after the
//!    rollback) still holds. Only the version is restored: the struct's other
//!    fields keep what the rolled-back attempt set them to, so a retried
//!    closure must set them from values (or re-read the row), never change
//!    them relative to themselves (`a.stock -= 1` subtracts once per attempt);
//! 2. otherwise, if the row now holds the very number the struct holds (somebody
//!    re-produced it), it cannot tell the struct from a legitimate reader of that
//!    number: it moves the row's version past it (`SET v = v + 1 WHERE v = $n`,
//!    data untouched) and reports [`Error::Stale`]. The
//!    struct's write never lands, and any other holder of that number reloads once.
//!    A move past made inside a transaction goes with it if the transaction
//!    rolls back (as a stale write's transaction usually does), and a reader
//!    retried in a new transaction would find the number again, attempt after
//!    attempt: so the journal keeps the move, and lockkit's own transactions
//!    (`transaction_with_retry`, `with_lock`, `locked_transaction`,
//!    `serializable`, ...) make it again, outside any transaction (committed
//!    on its own; on a MySQL/MariaDB session that refuses writes there, in a
//!    read-write transaction of its own), once their
//!    outermost level ended (before a retry's next attempt). After a rollback
//!    of a transaction of your own (Diesel's `transaction`) it waits for the
//!    end of lockkit's next transaction on that connection (a move made
//!    through an r2d2 pooled connection itself, never the connection lockkit's
//!    transactions run on, is not made again); a versioned write of the row
//!    outside a transaction moves the row on by itself. Until then a fresh
//!    read of the row, written in transactions of your own retried by
//!    [`retry`](crate::retry()), is refused as stale on every attempt: retry
//!    the transaction with [`transaction_with_retry`](crate::transaction_with_retry)
//!    instead, which makes the move between its attempts. The move is
//!    recorded as a write of the transaction (on a connection the journal
//!    watches): a struct read after it there, once the transaction rolled
//!    back, holds a number only that transaction had, and writes as restored
//!    (rule 1) or is reported stale, never matching another commit of that
//!    number; one written after it is refused (rule 3); and the move, once
//!    made again outside the transaction and committed, gives that number
//!    back to the row with the data the struct read (where it went one
//!    number: one that went further is made again and moved on, and such a
//!    struct is reported stale);
//!
//! 3. unless the struct's number was written from another uncommitted write's
//!    number (the row written twice in the rolled-back transaction, by one
//!    struct or by a second one that read it there, also when something moved
//!    the version between the two writes, such as a version trigger's bump of
//!    a plain `UPDATE`; or the row moved by `Versioned::update_if` earlier in
//!    that transaction, whose number lockkit reads there, so that a struct
//!    read after it, written or not, is refused): such a struct may carry what the earlier
//!    write changed, its number exists only in the rolled-back transaction,
//!    and restoring it would commit that change, or match the next commit of
//!    that number, in any process. It is reported [`Error::Stale`] without a
//!    write. A version your own SQL moved in the transaction before lockkit
//!    wrote the row there (a plain `UPDATE` under the version trigger, a raw
//!    `SET lock_version = ..`; under the trigger also lockkit's calls that do
//!    not write the version: `atomic::update_counters`, `atomic::update_if`,
//!    `compare_and_set`) is a number lockkit cannot see: reload a struct
//!    read after such a write once its transaction rolled back, instead of
//!    writing it again (as on a connection with instrumentation of its own not
//!    wrapped in [`Journal::wrap`], where lockkit keeps no record of what its
//!    transaction wrote, and sees neither case);
//!
//! 4. and no write ever *commits* a number a rolled-back write left with a
//!    struct of the process (a fresh reader of the row writing n after another
//!    struct's write of n rolled back, in a transaction or not; or the restored
//!    write of rule 1, whose struct may have been cloned): it
//!    moves the row one further in the same transaction (`SET v = v + 1 WHERE
//!    v = $n`) and hands its own struct that number, so that the struct holding
//!    the rolled-back n is stale instead of matching the commit. A write whose
//!    row another connection's write of n is still recorded open on counts too:
//!    that write must have been rolled back, even if its `ROLLBACK` has not
//!    been reported yet. The cost is one statement and a skipped number, only
//!    on a row with such a struct. (At the version type's maximum there is no
//!    number past it: a write inside a transaction is refused before its
//!    commit, [`Error::VersionOverflow`](crate::Error::VersionOverflow); one
//!    outside, already committed, stands, and the struct holding the
//!    rolled-back maximum is refused by its own write's `VersionOverflow`.)
//!    The rolled-back numbers stay recorded until a
//!    write outside a transaction moves the row past them (or the record's
//!    bound, below, forgets the oldest).
//!
//! A connection with its own Diesel instrumentation keeps it: wrap it with
//! [`Journal::wrap`] (`conn.set_instrumentation(Journal::wrap(yours))`, or in
//! `diesel::connection::set_default_instrumentation`) to let lockkit see
//! commits. Without that, lockkit sees no `BEGIN`, `COMMIT` or `ROLLBACK`
//! there, and asks the server instead. Each versioned write it makes in a
//! transaction on such a connection is *marked* in the same transaction
//! (PostgreSQL: the session setting `lockkit.marks`; MySQL/MariaDB and SQLite:
//! a row of the temporary table `lockkit_marks`; the latest 1024 per
//! connection), so that the mark stands exactly as long as the write does: a
//! rollback of the transaction or savepoint takes both, a commit keeps both.
//! Before a struct holding such a version writes again on that connection,
//! lockkit asks whether the mark stands: if not (or no longer kept), the
//! version was rolled back, and the rules above apply; if so, the write is of
//! the open transaction or committed, and the struct writes on. A version
//! written on another connection (or on one whose session is gone) cannot be
//! asked: it is taken for possibly rolled back, which never loses an update
//! but may report a reused struct as stale. The rollbacks of lockkit's own
//! transactions (`with_lock`, `transaction_with_retry`, ...) mark the versions
//! written in them rolled back at once, and a write that finds the row below
//! such a version knows that the version's write was undone.
//!
//! The record is per process (a rolled-back transaction's struct lives in the
//! process that ran it) and bounded ([`MAX_TENTATIVE`] versions); entries go away
//! when their transaction commits, when the row's version moves past them, or when
//! the struct holding them writes again.
//!
//! A row is named by its key (as the model's key type prints it), its table
//! with the table's schema (as the database names them, whatever the `table!`
//! declaration's Rust name), its database (on PostgreSQL its name, on SQLite
//! its file) and its version column. The schema is the one
//! the model's `table!` names (`archive.items`, on MySQL/MariaDB a database;
//! on SQLite a table of an attached database is named by that file), or else
//! the one the connection finds the table in: on PostgreSQL the schema its
//! `search_path` finds it in (asked with the key check, once per connection
//! and table), on MySQL/MariaDB its database, on SQLite `main`. The server as
//! the connection reached it (its address, or host name, and port) is kept
//! beside the name: a rolled-back number protects the row whichever server
//! recorded it, and a commit forgets only what was recorded through its own,
//! so that one server reached by two paths, or a cluster's two nodes, cannot make one row
//! two. The connection's names are read once per connection. An SQLite
//! database without a file (`:memory:`, a temporary one) is private to its
//! connection and named after it; a shared-cache in-memory database used from
//! several connections is therefore several databases to the journal, and a
//! struct rolled back on one connection is not recognised on another: give
//! such a database a file. It is named after the journal that watches the
//! connection, so replacing the connection's instrumentation
//! (`set_instrumentation`, even with [`Journal::wrap`]) after a rollback
//! forgets what was recorded of it: install yours before the first
//! transaction. The server a PostgreSQL connection reached is the address and
//! port the server sees (`inet_server_addr()`; the port alone over a Unix
//! socket): two servers each reached through a tunnel that ends at the same
//! address and port on their side, or by sockets on the same port, are one
//! server to the journal.
//!
//! # What else it watches
//!
//! The same journal tells lockkit's transactions whether a statement the work
//! let go ended the open transaction on the server (any error on PostgreSQL,
//! until a rollback to a savepoint; a deadlock on MySQL/MariaDB, which then
//! runs the next statements in autocommit), so that no lockkit call reports
//! as committed, or retries inside, a transaction the server rolled back.
//! Where no journal watches, lockkit asks the server instead. That part of it
//! serves every strategy; the versions it records serve the versioned writes,
//! which keep their record in it.

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::error::classification;
use crate::error::Error;
use diesel::connection::{Instrumentation, InstrumentationEvent, TransactionManager};
use diesel::result::DatabaseErrorKind;
use diesel::Connection;

/// At most this many tentative versions are remembered; past it the oldest
/// rolled-back ones are forgotten (with a warning), which re-opens the rollback
/// ABA for the structs that held them.
pub const MAX_TENTATIVE: usize = 100_000;

/// lockkit's per-connection record of transactions, installed as the
/// connection's Diesel [`Instrumentation`]; see the [module docs](self).
pub struct Journal {
    id: u64,
    inner: Option<Box<dyn Instrumentation>>,
    /// What the versioned writes keep about this connection and the versions
    /// it wrote in its open transaction; made at its first versioned write.
    record: Option<Box<dyn Record>>,
    /// A top-level `COMMIT` was sent; its outcome comes with the next event.
    committing: bool,
    /// The `RELEASE` of the savepoint at this depth was announced; it is
    /// released once the statement succeeds. When it fails (PostgreSQL, in a
    /// transaction a statement aborted), Diesel rolls back to the savepoint
    /// instead, and says so.
    releasing: Option<u32>,
    /// Whether a failed statement has ended the open transaction.
    aborts: Aborts,
    /// Statements to send again once the transaction that sent them rolled
    /// back ([`redo_after_rollback`]).
    redo: ToRedo,
    /// The levels lockkit's async calls hold open, and what a dropped one left.
    #[cfg(feature = "async")]
    levels: super::levels::Levels,
}

/// How a transaction (or a savepoint) ended, as the journal saw it: what it
/// tells the [`Record`] it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The outermost transaction committed.
    Committed,
    /// The savepoint at `depth` was released: what it wrote belongs to the
    /// level above now.
    Released { depth: u32 },
    /// The transaction or savepoint at `depth` rolled back (1: the outermost,
    /// also when its `COMMIT` failed or committed nothing, or the session
    /// ended with it open).
    RolledBack { depth: u32 },
}

/// What a layer above keeps in a connection's journal: the versioned writes'
/// record (`optimistic::rollbacks`, which this floor does not name). The journal
/// tells it how each transaction ends, and drops it with the connection's
/// session (which the server ends by rolling back what is open: the record's
/// own `Drop` takes that for [`End::RolledBack`] at depth 1).
pub(crate) trait Record: Any + Send {
    /// The open transaction (or a savepoint of it) ended so.
    fn ended(&mut self, end: End);
}

/// How a failed statement leaves the open transaction, by backend: what
/// lockkit's connections tell the journal. Not for use outside lockkit.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Ends {
    /// PostgreSQL: any error aborts it, until a rollback to a savepoint taken
    /// before the error; its `COMMIT` is then answered with `ROLLBACK`, and no
    /// error.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    UntilSavepointRollback,
    /// MySQL/MariaDB: a deadlock (`1213`, Galera's certification failure too)
    /// rolls back the whole transaction; the next statements run in
    /// autocommit, and `COMMIT` commits nothing. So may a lock wait timeout
    /// (`1205`), on a server started with `--innodb-rollback-on-timeout`: the
    /// journal counts it too, and the server is asked before lockkit treats the
    /// transaction as ended.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    OnDeadlock,
    /// SQLite: an error ends its statement only, but for a trigger's
    /// `RAISE(ROLLBACK, ..)`, an `ON CONFLICT ROLLBACK` constraint, or SQLite's
    /// own rollback after `SQLITE_FULL`, `SQLITE_IOERR` or `SQLITE_NOMEM`,
    /// which end the whole transaction: lockkit asks before it begins or
    /// writes in a transaction where a statement failed
    /// ([`Aborts::failed`]; `transaction::ended_on_sqlite`), or where one of
    /// the work's succeeded, which Diesel reports so even where that rollback
    /// came in place of its rows ([`Aborts::read_unseen`]).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Never,
    /// A backend type that names no server (a `MultiConnection` enum's):
    /// treated as [`Never`](Self::Never) until the connection inside tells,
    /// or InnoDB's words do (see `Aborts::failed`).
    #[default]
    Unknown,
}

impl Ends {
    /// The rule of the backend `B`.
    pub(crate) fn of<B>() -> Self {
        // A type name, not a `TypeId`: the connection's backend is not known
        // to be `'static` where the journal is reached. Names of distinct
        // backends differ; any other is unknown.
        let name = std::any::type_name::<B>();
        #[cfg(feature = "postgres")]
        if name == std::any::type_name::<diesel::pg::Pg>() {
            return Ends::UntilSavepointRollback;
        }
        #[cfg(feature = "mysql")]
        if name == std::any::type_name::<diesel::mysql::Mysql>() {
            return Ends::OnDeadlock;
        }
        #[cfg(feature = "sqlite")]
        if name == std::any::type_name::<diesel::sqlite::Sqlite>() {
            return Ends::Never;
        }
        let _ = name;
        Ends::Unknown
    }

    fn by(self, kind: DatabaseErrorKind, message: &str) -> bool {
        match self {
            Ends::UntilSavepointRollback => true,
            // diesel-async reports MySQL's 1213 as an unknown kind: its message
            // tells, as in lockkit's classification.
            Ends::OnDeadlock => {
                kind == DatabaseErrorKind::SerializationFailure
                    || classification::is_deadlock(message)
                    || classification::is_lock_wait_timeout(message)
                    || message == ENDED_READ_ONLY
            }
            Ends::Never | Ends::Unknown => false,
        }
    }
}

/// Whether a failed statement has ended the open transaction, as far as the
/// connection's events tell: the work of a lockkit transaction may catch a
/// statement's error and go on, and the server's answer to the `COMMIT` that
/// follows does not say that nothing was committed.
#[derive(Debug, Default)]
struct Aborts {
    ends: Ends,
    /// `ends` was guessed from InnoDB's words ([`Ends::Unknown`] before): the
    /// connection's own answer, once lockkit asks it, replaces it.
    guessed: bool,
    /// The depth of the open transaction (0: none).
    depth: u32,
    /// SQLite ([`Ends::Never`]), or a backend not known yet: the first
    /// statement that failed in the open transaction since lockkit last asked
    /// ([`take_failed_statement`]). It may have rolled back the whole
    /// transaction, which neither SQLite's answer nor Diesel's connection
    /// reports as such. Where
    /// the backend is not known, lockkit asks with a statement that fails on
    /// SQLite only (`transaction::probe_for`); a rollback to a savepoint clears
    /// this.
    failed: Option<(DatabaseErrorKind, String)>,
    /// SQLite ([`Ends::Never`]): a statement that may write succeeded after
    /// one failed in the open transaction (`failed`, or while `orphaned`). If
    /// the failure rolled the whole transaction back, that statement ran in
    /// autocommit and committed on its own ([`wrote_after_failed`]).
    wrote_after_failed: bool,
    /// SQLite ([`Ends::Never`]): a statement succeeded in the open
    /// transaction since lockkit last asked, not one of lockkit's own
    /// ([`own`]; on the async side, one that answered: [`own_read_done`]) nor
    /// one that begins or ends a level.
    /// Diesel's SQLite connection reports a statement that answers with rows
    /// (`load`, `get_result`, `RETURNING`) to its instrumentation as succeeded
    /// when an error came in place of its rows, and the error reaches the
    /// caller only: it may have rolled back the whole transaction, as
    /// `failed` may ([`take_failed_statement`]). Which statements answer with
    /// rows the journal does not read off their SQL (writing a statement's SQL
    /// out costs more than the question lockkit then asks): any counts.
    read_unseen: bool,
    /// SQLite: a statement succeeded while [`read_unseen`](Self::read_unseen)
    /// stood. If the statement before it had rolled the whole transaction
    /// back, it ran in autocommit, and if it wrote, it committed on its own
    /// ([`wrote_after_unseen`]); forgotten once SQLite answers that the
    /// transaction is alive ([`read_answered`]), unless a savepoint followed
    /// (`savepoint_after_read`): then it becomes `wrote_after_failed`. Read only where lockkit asks before a call
    /// of its own ([`wrote_after_unseen`]), and not where a statement was
    /// seen to fail in the transaction (`seen_failure`): that one, which
    /// SQLite reported, is taken for the one that rolled the transaction back.
    wrote_after_read: bool,
    /// SQLite: a statement failed in the open transaction, as the journal saw
    /// (`failed` was set, whether or not lockkit asked about it since).
    seen_failure: bool,
    /// SQLite: a savepoint was opened while
    /// [`read_unseen`](Self::read_unseen) stood. After a rollback of the whole
    /// transaction it begins a new one, which SQLite then finds alive, while
    /// what the work wrote before it committed on its own.
    savepoint_after_read: bool,
    /// MySQL/MariaDB: a statement of the open transaction may have committed
    /// it implicitly (DDL, a raw `COMMIT`, `SET autocommit`, a procedure:
    /// [`may_commit_implicitly`]). A later write refused as one in a
    /// read-only transaction then follows a commit, not an end the server
    /// made silently, and is not taken for one ([`Aborts::silent_end`]).
    implicit_commit: bool,
    /// MySQL/MariaDB: the session refuses writes outside transactions
    /// (README, "Galera"): lockkit made it so
    /// ([`read_only_outside_transactions`](crate::read_only_outside_transactions)),
    /// or the server refused a write as one in a read-only transaction (1792).
    /// Kept for the connection's life. Only then does the journal look for
    /// statements that may commit implicitly (`implicit_commit`): that reads
    /// each statement's SQL, which costs about as much as Diesel building it,
    /// and a refusal that follows such a statement arrives only on such a
    /// session.
    guarded: bool,
    /// SQLite rolled back the whole transaction under callers whose code still
    /// runs and counts it open (`transaction::ended_on_sqlite` found it and
    /// put Diesel's depth back): every lockkit call refuses until the
    /// outermost one ends it, which Diesel tells as the end of depth 1.
    orphaned: Option<Orphan>,
    /// Diesel told of a `BEGIN` or `SAVEPOINT` whose answer has not come: if
    /// it fails, the level never opened.
    opening: bool,
    /// Diesel told of a level's end (its `COMMIT`, `RELEASE` or `ROLLBACK
    /// [TO]` comes next): that statement is none of the work's
    /// ([`read_unseen`](Self::read_unseen)).
    closing: bool,
    /// lockkit's own statements are running ([`own`]): they mark nothing
    /// ([`read_unseen`](Self::read_unseen)).
    own: bool,
    /// The error that ended the open transaction (its kind and message). Set
    /// and cleared through [`Aborts::ended`] and [`Aborts::not_ended`], which
    /// keep [`ENDED`] in step.
    ended_by: Option<(DatabaseErrorKind, String)>,
    /// This journal's entry in [`ENDED`] while `ended_by` is set.
    ended_entry: Option<u64>,
    /// A rollback to a savepoint was sent after such an error: on PostgreSQL
    /// its success revives the transaction.
    reviving: bool,
    /// A statement that may write succeeded after the one in `ended_by`, on a
    /// backend that then runs it in autocommit (MySQL/MariaDB's deadlock,
    /// [`Ends::OnDeadlock`]): it committed on its own, and a rerun of the work
    /// would apply it twice ([`wrote_after_end`]). After a lock wait timeout,
    /// whose end is not certain, it counts once the server confirms the end.
    wrote_after_end: bool,
    /// A statement failed after the one in `ended_by` (on PostgreSQL every one
    /// does until the transaction is revived): the work went on in the ended
    /// transaction, a `retry` inside it ran again there ([`whole_at_end`]).
    failed_after: bool,
    /// The aborts lockkit reported in the open transaction
    /// ([`Error::TransactionAborted`]), settled
    /// when it ends.
    reported: Vec<crate::error::Settler>,
    /// One of them said that statements of the work may have committed on
    /// their own ([`may_have_committed`](crate::transaction::may_have_committed)):
    /// read by the idempotency keys after the work ([`committed_on_own`]) and
    /// by a nested call's end ([`reported_own_commits`]).
    reported_own_commits: bool,
    /// The connection reports a statement that answers with rows as succeeded
    /// once they begin to come, and an error in their place reaches the caller
    /// only (diesel-async's MySQL connection: a locking read that is a
    /// deadlock's victim). See [`unsure`].
    hides_read_errors: bool,
    /// On such a connection, a statement that may answer with rows succeeded
    /// in the open transaction since lockkit last asked the server whether it
    /// is alive: a deadlock may have ended it unseen.
    unsure: bool,
    /// A statement that may write succeeded while [`unsure`](Self::unsure)
    /// stood, and no statement was seen to end the transaction since: if the
    /// server then finds the transaction ended, the deadlock a read hid may
    /// have come before it, and it may have run in autocommit and committed
    /// on its own ([`wrote_while_unsure`]).
    wrote_while_unsure: bool,
    /// The journal learned that its backend ends a transaction on a deadlock
    /// only inside the open transaction (installed by a connection's first
    /// lockkit call there, or told its rule late): it may have missed, or not
    /// counted, a statement before that ended the transaction. Until lockkit
    /// asks the server ([`answered`]) or the transaction ends.
    missed: bool,
    /// MariaDB: the server answers `@@in_transaction`, which the `COMMIT` of
    /// a `marked` transaction asks
    /// ([`MARIADB_COMMIT_MARKED`](crate::transaction::MARIADB_COMMIT_MARKED)).
    /// Told with `guarded`.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    answers_in_transaction: bool,
    /// MySQL/MariaDB: the open transaction began with a savepoint that only it
    /// holds ([`MYSQL_BEGIN_MARKED`](crate::transaction::MYSQL_BEGIN_MARKED),
    /// on a `guarded` session), which its `COMMIT` releases first
    /// ([`take_marked`]).
    marked: bool,
}

/// What [`Aborts::orphaned`] keeps: the error of the statement that rolled the
/// whole transaction back.
#[derive(Debug)]
struct Orphan {
    kind: DatabaseErrorKind,
    message: String,
}

impl Aborts {
    /// A statement ended the open transaction with `cause`: recorded, and
    /// entered in [`ENDED`] for the thread that saw it, unless the cause is
    /// a lock wait timeout on MySQL/MariaDB, which ends the transaction only
    /// on a server started with `--innodb-rollback-on-timeout`: lockkit's
    /// calls ask the server before they take it for an end, and a `retry`,
    /// which cannot ask, runs again as it would after the statement alone
    /// failed.
    fn ended(&mut self, cause: (DatabaseErrorKind, String)) {
        let certain = self.certain(&cause.1);
        self.ended_by = Some(cause);
        if certain && self.ended_entry.is_none() {
            self.ended_entry = Some(Ended::enter());
        }
    }

    /// Whether a statement that failed with `message`, on this journal's
    /// backend, certainly ended the transaction it ended: all but a lock wait
    /// timeout on MySQL/MariaDB ([`ended`](Self::ended)).
    fn certain(&self, message: &str) -> bool {
        !(self.ends == Ends::OnDeadlock
            && (classification::is_lock_wait_timeout(message)
                || message == SILENT_END
                || message == ENDED_READ_ONLY))
    }

    /// What the journal records for a write MySQL/MariaDB refused as one in a
    /// read-only transaction (1792, `kind` and `message`) while no end is
    /// known: lockkit's transactions begin read-write
    /// ([`MYSQL_BEGIN`](crate::transaction::MYSQL_BEGIN)), so the refusal says
    /// that the transaction ended and the write ran in autocommit on a
    /// session read-only outside transactions. Recorded as an end, not a
    /// certain one: the server is asked (a transaction of the caller's own
    /// that began read-only is alive, and the refusal is only what it says).
    /// Its cause:
    ///
    /// * on a session known to be read-only before the refusal (`guarded`),
    ///   with no statement since the transaction began that may have
    ///   committed it itself (`implicit_commit`): the server ended it without
    ///   an error (README, "Galera"), nothing of it committed, and the cause
    ///   is a deadlock (as Galera reports the same abort when it says so),
    ///   which the retrying calls run again;
    /// * otherwise the refusal itself ([`Error::ReadOnly`], which no retry
    ///   takes up): the part before an implicit commit stands, which a rerun
    ///   would apply twice, and on a session not known to be read-only the
    ///   journal did not look for one.
    ///
    /// Either way the call fails: work that let the refused write go is not
    /// reported committed. Inside lockkit's read-only stand-in, the known end
    /// stands.
    fn silent_end(
        &self,
        kind: DatabaseErrorKind,
        message: &str,
    ) -> Option<(DatabaseErrorKind, String)> {
        if !(classification::is_read_only_refusal(kind, message)
            && self.ends == Ends::OnDeadlock
            && self.depth > 0
            && self.reported.is_empty())
        {
            return None;
        }
        match (&self.ended_by, self.nothing_writes_outside()) {
            (None, true) => Some((
                DatabaseErrorKind::SerializationFailure,
                SILENT_END.to_owned(),
            )),
            // Also after an end recorded as not certain (a lock wait timeout
            // the work let go, which ends nothing on most servers): a
            // statement since may have committed the transaction, and the
            // timeout's retry would apply that part twice.
            (None, false) => Some(read_only_end()),
            (Some((_, recorded)), false)
                if self.ended_entry.is_none() && recorded != ENDED_READ_ONLY =>
            {
                Some(read_only_end())
            }
            (Some(_), _) => None,
        }
    }

    /// Whether no statement of the open transaction can have written outside
    /// it: the session refuses writes outside transactions (`guarded`) and no
    /// statement since it began may have committed it itself
    /// (`implicit_commit`). An end the server made without an error then let
    /// nothing of the work commit on its own: the writes before it went with
    /// the transaction, and one after it was refused, which the journal sees
    /// ([`silent_end`](Self::silent_end)).
    fn nothing_writes_outside(&self) -> bool {
        self.guarded && !self.implicit_commit
    }

    /// Nothing (any more) ended the open transaction: a rollback to a
    /// savepoint revived it, the server said it is alive, or it is over.
    fn not_ended(&mut self) {
        self.ended_by = None;
        self.wrote_after_end = false;
        if let Some(entry) = self.ended_entry.take() {
            Ended::leave(entry);
        }
    }

    /// The open transaction ended (or the session did): every abort reported in
    /// it is settled.
    fn settle(&mut self) {
        for reported in self.reported.drain(..) {
            reported.settle();
        }
        self.reported_own_commits = false;
    }

    /// No transaction is open any more: nothing ended it, nothing is unsure,
    /// and every abort reported in it is settled.
    fn closed(&mut self) {
        self.not_ended();
        self.failed = None;
        self.wrote_after_failed = false;
        self.read_unseen = false;
        self.wrote_after_read = false;
        self.savepoint_after_read = false;
        self.seen_failure = false;
        self.own = false;
        self.reviving = false;
        self.unsure = false;
        self.wrote_while_unsure = false;
        self.missed = false;
        self.marked = false;
        self.settle();
    }

    fn on_event(&mut self, event: &InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::BeginTransaction { depth, .. } => {
                self.depth = depth.get();
                self.savepoint_after_read |= self.read_unseen && depth.get() > 1;
                self.opening = true;
                if depth.get() == 1 {
                    self.orphaned = None;
                    self.implicit_commit = false;
                }
            }
            InstrumentationEvent::FinishQuery { error: Some(_), .. }
                if std::mem::take(&mut self.opening) =>
            {
                // Diesel keeps its depth when its `BEGIN` (a busy `BEGIN
                // IMMEDIATE`) or `SAVEPOINT` fails: so does the journal.
                self.depth = self.depth.saturating_sub(1);
            }
            InstrumentationEvent::CommitTransaction { depth, .. }
            | InstrumentationEvent::RollbackTransaction { depth, .. } => {
                self.depth = depth.get() - 1;
                self.closing = true;
                let rollback = matches!(event, InstrumentationEvent::RollbackTransaction { .. });
                if self.depth == 0 {
                    // The outermost caller ends the transaction, also one
                    // SQLite rolled back under it.
                    self.orphaned = None;
                    self.closed();
                } else if rollback && self.ends == Ends::UntilSavepointRollback {
                    self.reviving = self.ended_by.is_some();
                }
            }
            InstrumentationEvent::FinishQuery { query, error, .. } => {
                let opened = std::mem::take(&mut self.opening);
                let closed = std::mem::take(&mut self.closing);
                // Failed too: MySQL/MariaDB commit before they run DDL. Read
                // on a guarded session only, where the rule may be theirs
                // (writing the SQL out costs).
                if self.guarded
                    && self.depth > 0
                    && !opened
                    && !self.implicit_commit
                    && matches!(self.ends, Ends::OnDeadlock | Ends::Unknown)
                    && may_commit_implicitly(query)
                {
                    self.implicit_commit = true;
                }
                if self.unsure && self.depth > 0 && error.is_none() && !only_reads(query) {
                    self.wrote_while_unsure = true;
                }
                if self.ends == Ends::Never
                    && self.depth > 0
                    && error.is_none()
                    && !opened
                    && !closed
                    && !self.own
                {
                    // No SQL read: see `read_unseen`.
                    self.wrote_after_read |= self.read_unseen;
                    self.read_unseen = true;
                }
                if self.hides_read_errors
                    && self.depth > 0
                    && error.is_none()
                    && may_answer_with_rows(query)
                {
                    self.unsure = true;
                }
                if std::mem::take(&mut self.reviving) {
                    if error.is_none() {
                        self.not_ended();
                    }
                } else if error.is_none() {
                    // After a lock wait timeout, which ends the transaction
                    // only on a server started with
                    // `--innodb-rollback-on-timeout`, the flag stands only if
                    // the server confirms the end (else the end is forgotten,
                    // and the flag with it), and a certain end that follows
                    // (a deadlock) clears it: the statement ran in the live
                    // transaction, and went with it.
                    if self.depth > 0
                        && self.ended_by.is_some()
                        && self.ends == Ends::OnDeadlock
                        && !only_reads(query)
                    {
                        self.wrote_after_end = true;
                    }
                    if self.depth > 0
                        && (self.failed.is_some() || self.orphaned.is_some())
                        && matches!(self.ends, Ends::Never | Ends::Unknown)
                        && !only_reads(query)
                    {
                        self.wrote_after_failed = true;
                    }
                    // PostgreSQL runs nothing in an aborted transaction but a
                    // rollback: a statement that succeeded there was one to a
                    // savepoint (the work's own SQL), which revived it.
                    if self.ended_by.is_some() && self.ends == Ends::UntilSavepointRollback {
                        self.not_ended();
                    }
                    // Not knowing the backend, the journal keeps a failed
                    // statement as SQLite's (for lockkit to ask about it) until
                    // a rollback to a savepoint undid it: one that succeeds
                    // finds the transaction alive on every backend.
                    if self.ends == Ends::Unknown
                        && self.failed.is_some()
                        && first_word_is(query, "ROLLBACK")
                    {
                        self.failed = None;
                        self.wrote_after_failed = false;
                    }
                } else if let Some(diesel::result::Error::DatabaseError(kind, info)) = error {
                    let silent = self.silent_end(*kind, info.message());
                    // A refusal of MySQL/MariaDB's (not PostgreSQL's, which
                    // ends in `Ends::UntilSavepointRollback`) shows the guard.
                    self.guarded |= match self.ends {
                        Ends::OnDeadlock => {
                            classification::is_read_only_refusal(*kind, info.message())
                        }
                        Ends::Unknown => classification::is_mysql_read_only_refusal(info.message()),
                        Ends::Never | Ends::UntilSavepointRollback => false,
                    };
                    let (kind, message) = match &silent {
                        Some((kind, message)) => (kind, message.as_str()),
                        None => (kind, info.message()),
                    };
                    // A journal whose backend type names no server (a
                    // `MultiConnection` enum's, or one the user installed)
                    // learns its rule when a lockkit call tells it; before
                    // that, InnoDB's own words (a deadlock's, or a lock wait
                    // timeout's) make a guess, which the call's rule replaces.
                    #[cfg(feature = "mysql")]
                    if self.ends == Ends::Unknown
                        && (classification::is_innodb_deadlock(message)
                            || classification::is_lock_wait_timeout(message))
                    {
                        self.ends = Ends::OnDeadlock;
                        self.guessed = true;
                    }
                    let ends_it = self.depth > 0 && self.ends.by(*kind, message);
                    if self.depth > 0 && self.ended_by.is_some() && message == ENDED_READ_ONLY {
                        // The refusal replaces an end that was not certain
                        // ([`Aborts::silent_end`]).
                        self.ended((*kind, message.to_owned()));
                        self.failed_after = false;
                    } else if self.depth > 0 && self.ended_by.is_some() {
                        // Not after a refusal that may follow an implicit
                        // commit (`ENDED_READ_ONLY`): a deadlock then ends
                        // a transaction the work began after the commit,
                        // and the committed part still stands.
                        if ends_it
                            && self.ended_entry.is_none()
                            && self.certain(message)
                            && self
                                .ended_by
                                .as_ref()
                                .is_none_or(|(_, m)| m != ENDED_READ_ONLY)
                        {
                            // A certain end after one that was not (a
                            // deadlock after a lock wait timeout the work let
                            // go): the transaction lived until now, and what
                            // the work wrote in between went with it.
                            self.ended((*kind, message.to_owned()));
                            self.wrote_after_end = false;
                            self.wrote_while_unsure = false;
                            self.failed_after = false;
                        } else {
                            self.failed_after = true;
                        }
                    } else if ends_it {
                        // Seen to end it for certain (a deadlock): what the
                        // work wrote before, it wrote in the transaction. Not
                        // after a lock wait timeout, which ends nothing on a
                        // server without `--innodb-rollback-on-timeout`: an
                        // end found there came earlier, unseen.
                        if self.certain(message) {
                            self.wrote_while_unsure = false;
                        }
                        self.ended((*kind, message.to_owned()));
                        self.failed_after = false;
                    }
                    if self.depth > 0
                        && matches!(self.ends, Ends::Never | Ends::Unknown)
                        && self.failed.is_none()
                    {
                        self.failed = Some((*kind, message.to_owned()));
                        self.seen_failure = true;
                    }
                }
            }
            _ => {}
        }
    }
}

/// What `read` makes of the start of a statement (its SQL, as the connection
/// reports it): the first piece the statement's `Display` writes, which holds
/// its first words; the rest is not written. `None` for a statement that
/// writes nothing.
fn read_start<T>(query: &dyn std::fmt::Display, read: impl FnOnce(&str) -> T) -> Option<T> {
    use std::fmt::Write;
    struct Start<R, T>(Option<R>, Option<T>);
    impl<R: FnOnce(&str) -> T, T> Write for Start<R, T> {
        fn write_str(&mut self, sql: &str) -> std::fmt::Result {
            if let Some(read) = self.0.take() {
                self.1 = Some(read(sql));
            }
            // Enough read: the rest of the statement is not written.
            Err(std::fmt::Error)
        }
    }
    let mut start = Start(Some(read), None);
    let _ = write!(start, "{query}");
    start.1
}

/// The first word of `sql` (letters only).
fn first_word(sql: &str) -> &str {
    sql.trim_start_matches(|c: char| c.is_whitespace())
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default()
}

/// Whether `sql` is MariaDB's `SET STATEMENT <settings> FOR <statement>`,
/// which runs the statement after `FOR` (any other `SET` sets variables).
/// Read off its first two words; a variable's name (`@statement`,
/// `statement_x`) is not the second word `STATEMENT`.
fn runs_a_statement(sql: &str) -> bool {
    let mut words = sql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '@'))
        .filter(|word| !word.is_empty());
    words
        .next()
        .is_some_and(|word| word.eq_ignore_ascii_case("SET"))
        && words
            .next()
            .is_some_and(|word| word.eq_ignore_ascii_case("STATEMENT"))
}

/// Whether the first word of a statement is `keyword`, in any case.
fn first_word_is(query: &dyn std::fmt::Display, keyword: &str) -> bool {
    read_start(query, |sql| first_word(sql).eq_ignore_ascii_case(keyword)).unwrap_or(false)
}

/// The first words of the transaction statements, which write nothing and
/// answer with no rows.
const TRANSACTION_WORDS: [&str; 6] = [
    "BEGIN",
    "START",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT",
    "RELEASE",
];

/// Whether `sql` is a batch of several statements (`batch_execute`'s), read
/// off its first `;` (a `;` in a string counts too).
fn several_statements(sql: &str) -> bool {
    sql.split_once(';')
        .is_some_and(|(_, rest)| !rest.trim().is_empty())
}

/// Whether a statement writes nothing a rerun could apply twice: a read, a
/// session setting (not MariaDB's `SET STATEMENT .. FOR`, which runs a
/// statement that may write), or a transaction statement. Anything else
/// (also a statement whose start cannot be read, and a batch of several
/// statements, whose first word says nothing of the others) may write.
fn only_reads(query: &dyn std::fmt::Display) -> bool {
    read_start(query, |sql| {
        let word = first_word(sql);
        if runs_a_statement(sql) || several_statements(sql) {
            return false;
        }
        ["SELECT", "SHOW", "SET", "DESCRIBE", "DESC", "EXPLAIN"]
            .iter()
            .chain(&TRANSACTION_WORDS)
            .any(|keyword| word.eq_ignore_ascii_case(keyword))
    })
    .unwrap_or(false)
}

/// Whether a statement (its SQL, as the connection reports it) may have
/// committed the open transaction on MySQL/MariaDB (also when it failed: DDL
/// commits before it runs): any but a read (a parenthesized one too, as
/// Diesel writes a `UNION`), a row write, a savepoint statement, a `ROLLBACK`
/// (which commits nothing), `CREATE TEMPORARY TABLE`, and a `SET` of a
/// variable (not `autocommit`, `PASSWORD` or MariaDB's `SET STATEMENT .. FOR`,
/// which runs another statement). Read off the statement's first words; one
/// that does not say (a procedure's `CALL`, a leading comment, a batch of
/// several statements) may have.
fn may_commit_implicitly(query: &dyn std::fmt::Display) -> bool {
    read_start(query, |sql| {
        let sql = sql.trim_start();
        if sql.starts_with('(') {
            return false;
        }
        // A batch of several statements: any of them may commit.
        if several_statements(sql) {
            return true;
        }
        let lower = sql.to_ascii_lowercase();
        let mut words = lower.split_whitespace();
        match words.next().unwrap_or_default() {
            "set" => {
                let next = words.next().unwrap_or_default();
                next.starts_with("password")
                    || runs_a_statement(sql)
                    || lower.match_indices("autocommit").any(|(at, _)| {
                        // Not a user variable (`@my_autocommit`) or another
                        // name that holds the word; `@@autocommit` is it.
                        let before = &lower[..at];
                        let user = before.ends_with('@') && !before.ends_with("@@");
                        !user && !before.ends_with(|c: char| c == '_' || c.is_ascii_alphanumeric())
                    })
            }
            "create" => words.next() != Some("temporary"),
            "select" | "insert" | "update" | "delete" | "replace" | "with" | "values" | "table"
            | "show" | "describe" | "desc" | "explain" | "do" | "savepoint" | "release"
            | "rollback" => false,
            _ => true,
        }
    })
    .unwrap_or(false)
}

/// Whether a statement (its SQL, as the connection reports it) may answer
/// with rows, so that an error coming in their place may reach its caller
/// only ([`Aborts::hides_read_errors`]): any statement but a transaction
/// statement, `SET`, DDL and `LOCK`/`UNLOCK TABLES`, and a write without
/// `RETURNING`. Read off the statement's first word; the text is scanned for
/// `RETURNING` only for a write that MariaDB lets return rows.
fn may_answer_with_rows(query: &dyn std::fmt::Display) -> bool {
    read_start(query, |sql| {
        let word = first_word(sql);
        let is = |keyword: &str| word.eq_ignore_ascii_case(keyword);
        let never = [
            "UPDATE",
            // DDL and table locks answer with no rows (most of them also
            // commit implicitly; a temporary table's do not).
            "CREATE", "ALTER", "DROP", "TRUNCATE", "RENAME", "LOCK", "UNLOCK",
        ];
        if is("SET") {
            // MariaDB's `SET STATEMENT .. FOR <statement>` runs a statement
            // that may answer with rows; any other `SET` does not.
            runs_a_statement(sql)
        } else if TRANSACTION_WORDS
            .iter()
            .chain(&never)
            .any(|keyword| is(keyword))
        {
            false
        } else if ["INSERT", "REPLACE", "DELETE"]
            .iter()
            .any(|keyword| is(keyword))
        {
            sql.as_bytes()
                .windows("RETURNING".len())
                .any(|word| word.eq_ignore_ascii_case(b"RETURNING"))
        } else {
            true
        }
    })
    .unwrap_or(true)
}

impl Journal {
    /// A journal for a connection without other instrumentation.
    ///
    /// lockkit installs one by itself at the first versioned write on a
    /// connection that has no instrumentation. To have one watch every
    /// connection from its first transaction on, install it yourself, on one
    /// connection (`conn.set_instrumentation(Journal::new())`) or as Diesel's
    /// default for all:
    ///
    /// ```
    /// use diesel::connection::{set_default_instrumentation, Instrumentation};
    /// use diesel::prelude::*;
    /// use lockkit::journal::Journal;
    /// use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    ///
    /// # fn main() -> Result<(), lockkit::Error> {
    /// fn journal() -> Option<Box<dyn Instrumentation>> {
    ///     Some(Box::new(Journal::new()))
    /// }
    /// set_default_instrumentation(journal)?;
    ///
    /// let mut conn = SqliteConnection::establish(":memory:").unwrap(); // watched
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn)?;
    /// let mut item = items::table.find(1).first::<Item>(&mut conn)?;
    /// let rolled_back = conn.transaction::<(), lockkit::Error, _>(|conn| {
    ///     item.update_versioned(conn)?; // lock_version 0 -> 1, then undone
    ///     Err(diesel::result::Error::RollbackTransaction.into())
    /// });
    /// assert!(rolled_back.is_err());
    /// // The journal saw the rollback: the struct's next write expects version 0
    /// // again, and moves the row past the rolled-back 1.
    /// item.update_versioned(&mut conn)?;
    /// assert_eq!(item.lock_version, 2);
    /// # Ok(()) }
    /// ```
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Journal {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            inner: None,
            record: None,
            committing: false,
            releasing: None,
            aborts: Aborts::default(),
            redo: ToRedo::default(),
            #[cfg(feature = "async")]
            levels: Default::default(),
        }
    }

    /// A journal that passes every event on to your own instrumentation.
    ///
    /// A connection with instrumentation of its own (a query logger, tracing)
    /// gets no journal from lockkit: install yours wrapped, before the first
    /// transaction, and lockkit sees every `BEGIN`, `COMMIT` and `ROLLBACK`
    /// while your instrumentation still gets every event. Here a struct whose
    /// write was rolled back cannot overwrite the write that came after it:
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// use diesel::connection::InstrumentationEvent;
    /// use diesel::prelude::*;
    /// use lockkit::journal::Journal;
    /// use lockkit::prelude::*;
    /// # diesel::table! { items (id) { id -> Integer, stock -> Integer, lock_version -> Integer } }
    /// # #[derive(Queryable, Selectable, Versioned)]
    /// # #[diesel(table_name = items)]
    /// # pub struct Item { pub id: i32, pub stock: i32, pub lock_version: i32 }
    ///
    /// # fn main() -> Result<(), lockkit::Error> {
    /// let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// let rollbacks = Arc::new(AtomicUsize::new(0));
    /// let seen = Arc::clone(&rollbacks);
    /// conn.set_instrumentation(Journal::wrap(move |event: InstrumentationEvent<'_>| {
    ///     // your own instrumentation: here it counts rollbacks
    ///     if let InstrumentationEvent::RollbackTransaction { .. } = event {
    ///         seen.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// }));
    /// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
    /// # diesel::sql_query("INSERT INTO items VALUES (1, 10, 0)").execute(&mut conn)?;
    ///
    /// // Alice writes in a transaction that rolls back: her struct says 1, the row 0.
    /// let mut alice = items::table.find(1).first::<Item>(&mut conn)?;
    /// let rolled_back = conn.transaction::<(), lockkit::Error, _>(|conn| {
    ///     alice.stock = 9;
    ///     alice.update_versioned(conn)?;
    ///     Err(diesel::result::Error::RollbackTransaction.into())
    /// });
    /// assert!(rolled_back.is_err());
    /// assert_eq!(alice.lock_version, 1);
    ///
    /// // Bob reads the row (version 0) and writes it.
    /// let mut bob = items::table.find(1).first::<Item>(&mut conn)?;
    /// bob.stock = 5;
    /// bob.update_versioned(&mut conn)?;
    ///
    /// // Alice's struct matched the number Bob's write would have committed:
    /// // the journal saw her rollback, so her write is refused.
    /// assert!(matches!(alice.update_versioned(&mut conn), Err(lockkit::Error::Stale(_))));
    /// assert_eq!(items::table.find(1).select(items::stock).first::<i32>(&mut conn)?, 5);
    /// assert_eq!(rollbacks.load(Ordering::Relaxed), 1); // and your instrumentation saw it too
    /// # Ok(()) }
    /// ```
    pub fn wrap(inner: impl Instrumentation) -> Self {
        let mut journal = Journal::new();
        journal.inner = Some(Box::new(inner));
        journal
    }

    /// Your instrumentation, if this journal wraps one.
    pub fn inner(&mut self) -> Option<&mut dyn Instrumentation> {
        self.inner.as_deref_mut()
    }

    /// The record of type `R` this journal keeps, made at its first use.
    /// One type of record is ever kept (the versioned writes'), so the record
    /// found is an `R`.
    pub(crate) fn record<R: Record + Default>(&mut self) -> &mut R {
        let record = self.record.get_or_insert_with(|| Box::new(R::default()));
        let any: &mut dyn Any = &mut **record;
        match any.downcast_mut::<R>() {
            Some(record) => record,
            None => unreachable!("a journal keeps one type of record"),
        }
    }

    /// The record of type `R` this journal keeps, if one was made.
    pub(crate) fn existing_record<R: Record>(&mut self) -> Option<&mut R> {
        let any: &mut dyn Any = &mut **self.record.as_mut()?;
        any.downcast_mut::<R>()
    }

    /// The record, if one was made, and what is to be sent again: told how the
    /// transaction ended.
    fn ended(&mut self, end: End) {
        if let Some(record) = &mut self.record {
            record.ended(end);
        }
        self.redo.ended(end);
    }
}

impl Default for Journal {
    fn default() -> Self {
        Journal::new()
    }
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("id", &self.id)
            .field("records", &self.record.is_some())
            .field("wraps", &self.inner.is_some())
            .finish()
    }
}

impl Instrumentation for Journal {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::BeginTransaction { depth, .. } = &event {
            if !self.committing && depth.get() <= self.aborts.depth {
                // A level the journal counts open at `depth` or above ended
                // without an event: Diesel forgets its count when it finds
                // the server outside a transaction (SQLite's rollback of the
                // whole transaction under a failed statement, whose nested
                // `ROLLBACK TO SAVEPOINT` then fails; a raw `ROLLBACK`).
                // Taken for rolled back, the safe side: a commit is reported.
                self.ended(End::RolledBack { depth: depth.get() });
                if depth.get() == 1 {
                    self.aborts.closed();
                }
            }
        }
        match &event {
            InstrumentationEvent::BeginTransaction { .. } if self.committing => {
                self.committing = false;
                self.ended(End::Committed);
            }
            // The server ended the transaction under a failed statement: the
            // `COMMIT` commits nothing (PostgreSQL answers it with `ROLLBACK`).
            InstrumentationEvent::CommitTransaction { depth, .. }
                if depth.get() == 1 && self.aborts.ended_by.is_some() =>
            {
                self.ended(End::RolledBack { depth: 1 });
            }
            InstrumentationEvent::CommitTransaction { depth, .. } => {
                if depth.get() == 1 {
                    // Nothing to tell until a record was made.
                    self.committing = self.record.is_some() || !self.redo.entries.is_empty();
                } else {
                    self.releasing = Some(depth.get());
                }
            }
            InstrumentationEvent::RollbackTransaction { depth, .. } => {
                self.committing = false;
                self.releasing = None;
                self.ended(End::RolledBack { depth: depth.get() });
            }
            InstrumentationEvent::FinishQuery { error, .. } if self.releasing.is_some() => {
                if let (Some(depth), None) = (self.releasing.take(), error) {
                    self.ended(End::Released { depth });
                }
            }
            InstrumentationEvent::FinishQuery { error, .. } if self.committing => {
                self.committing = false;
                self.ended(match error {
                    None => End::Committed,
                    // A failed COMMIT did not commit.
                    Some(_) => End::RolledBack { depth: 1 },
                });
            }
            _ => {}
        }
        #[cfg(feature = "async")]
        self.levels.on_event(&event);
        self.aborts.on_event(&event);
        if let Some(inner) = &mut self.inner {
            inner.on_connection_event(event);
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // The server rolls back a transaction whose session ends: the record
        // takes its open versions for rolled back as it goes, before the
        // aborts reported in that transaction are settled, so that whoever
        // sees one settled sees its versions rolled back.
        drop(self.record.take());
        self.aborts.settle();
        self.aborts.not_ended();
    }
}

/// The transactions a statement ended under code that still runs in them:
/// one entry per journal whose [`Aborts::ended_by`] is set, with the thread
/// whose statement ended it. A blocking [`retry`](crate::retry()) asks it
/// ([`Ended::since`]) before it runs an attempt again: an attempt that left
/// such a transaction behind ran inside it, and a second attempt would run
/// in autocommit on MySQL/MariaDB (committing on its own), or fail again on
/// PostgreSQL. Touched only when a transaction ends under a statement and
/// when that is over, never on the path of a statement that succeeds.
pub(crate) struct Ended;

/// [`Ended`]'s entries: the thread, and the entry's number.
static ENDED: std::sync::Mutex<Vec<(std::thread::ThreadId, u64)>> =
    std::sync::Mutex::new(Vec::new());

/// The number of the latest entry [`Ended`] made.
static ENDED_COUNT: AtomicU64 = AtomicU64::new(0);

impl Ended {
    fn entries() -> std::sync::MutexGuard<'static, Vec<(std::thread::ThreadId, u64)>> {
        ENDED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enter() -> u64 {
        let entry = ENDED_COUNT.fetch_add(1, Ordering::Relaxed) + 1;
        Ended::entries().push((std::thread::current().id(), entry));
        entry
    }

    fn leave(entry: u64) {
        Ended::entries().retain(|&(_, e)| e != entry);
    }

    /// Where the entries stand now, for [`Ended::since`].
    pub(crate) fn mark() -> u64 {
        ENDED_COUNT.load(Ordering::Relaxed)
    }

    /// Whether a statement on this thread ended a transaction after `mark`,
    /// under code that still runs in it (not rolled back, no savepoint
    /// rolled back to revive it).
    pub(crate) fn since(mark: u64) -> bool {
        if ENDED_COUNT.load(Ordering::Relaxed) == mark {
            return false;
        }
        let thread = std::thread::current().id();
        Ended::entries()
            .iter()
            .any(|&(t, entry)| t == thread && entry > mark)
    }
}

/// The most statements a journal keeps to send again ([`redo_after_rollback`]);
/// past it the oldest is dropped (its struct is reported stale until a write
/// outside a transaction moves the row on).
pub(crate) const MAX_REDO: usize = 64;

/// A [`Redo`] or an [`AsyncRedo`] for some connection type, as the journal
/// keeps it ([`redo_after_rollback`]).
pub(crate) type AnyRedo = Box<dyn Any + Send>;

/// A statement to send again on a blocking connection of type `C`
/// ([`redo_after_rollback`]).
pub(crate) type Redo<C> = Box<dyn FnOnce(&mut C) + Send>;

/// A statement to send again on a diesel-async connection of type `C`
/// ([`redo_after_rollback`]).
#[cfg(feature = "async")]
pub(crate) type AsyncRedo<C> = Box<
    dyn for<'c> FnOnce(
            &'c mut C,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'c>>
        + Send,
>;

/// Whether any journal of the process ever kept a statement to send again: until
/// then the end of every lockkit transaction skips the question.
static REDO_KEPT: AtomicBool = AtomicBool::new(false);

/// [`REDO_KEPT`].
pub(crate) fn redo_kept() -> bool {
    REDO_KEPT.load(Ordering::Relaxed)
}

/// What a transaction sent that must stand even though the transaction rolled
/// back: each entry with the depth of the level that sent it while that level
/// is open, `None` once it rolled back. A commit forgets what it committed
/// (its moves stand) and keeps what rolled back before it.
#[derive(Default)]
struct ToRedo {
    entries: Vec<(Option<u32>, AnyRedo)>,
}

impl ToRedo {
    fn ended(&mut self, end: End) {
        if self.entries.is_empty() {
            return;
        }
        match end {
            End::Committed => self.entries.retain(|(depth, _)| depth.is_none()),
            End::Released { depth } => {
                for (level, _) in &mut self.entries {
                    if let Some(level) = level.as_mut().filter(|level| **level >= depth) {
                        *level = depth - 1;
                    }
                }
            }
            End::RolledBack { depth } => {
                for (level, _) in &mut self.entries {
                    if level.is_some_and(|level| level >= depth) {
                        *level = None;
                    }
                }
            }
        }
    }
}

/// `redo` was sent in the open transaction on `conn` and must stand even if
/// that transaction rolls back (the move past of a stale versioned write:
/// `optimistic::rollbacks`). It is a [`Redo`] for the connection's type (or
/// the async side's `AsyncRedo`), type-erased; once lockkit's own outermost
/// transaction on a connection of that type ended, committed or rolled back,
/// what rolled back is sent again outside any transaction ([`take_redo`]).
/// Kept by the journal watching `conn`; where none does, or outside a
/// transaction, nothing is kept.
pub(crate) fn redo_after_rollback<W: Watched>(conn: &mut W, redo: AnyRedo) {
    let Some(depth) = conn.depth() else {
        return;
    };
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        REDO_KEPT.store(true, Ordering::Relaxed);
        let entries = &mut journal.redo.entries;
        if entries.len() == MAX_REDO {
            entries.remove(0);
        }
        entries.push((Some(depth), redo));
    }
}

/// What rolled back of what [`redo_after_rollback`] kept on `conn`, of type
/// `R` (a [`Redo`] or an `AsyncRedo` for the connection's type), to be sent
/// again now (and forgotten here). The caller has made sure that no
/// transaction is open, in the transaction manager's books as on the server
/// (a broken manager counts as open: the redo would run inside what the server
/// may still hold open, and be rolled back with it), and asks it only once a
/// journal ever kept one ([`redo_kept`]).
pub(crate) fn take_redo<R: Any, W: Watched>(conn: &mut W) -> Vec<Box<R>> {
    let Some(journal) = conn.slot().downcast_mut::<Journal>() else {
        return Vec::new();
    };
    let entries = &mut journal.redo.entries;
    let undone = |(depth, redo): &(Option<u32>, AnyRedo)| depth.is_none() && redo.is::<R>();
    if !entries.iter().any(undone) {
        return Vec::new();
    }
    let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(entries).into_iter().partition(undone);
    *entries = kept;
    taken
        .into_iter()
        .filter_map(|(_, redo)| (redo as Box<dyn Any>).downcast::<R>().ok())
        .collect()
}

/// What the journal needs from a connection, blocking or async: the
/// instrumentation it lives in, the transaction depth, and an identity.
///
/// Only the hooks differ between the two: Diesel's transaction manager and
/// diesel-async's report `BEGIN`, `COMMIT`, `ROLLBACK` and savepoints to the
/// connection's instrumentation alike, so one [`Journal`] watches both: what
/// ended a transaction is decided here once, and what is recorded and which
/// version a struct writes with (`optimistic::rollbacks`) once above it.
pub(crate) trait Watched {
    /// The connection's Diesel instrumentation.
    fn slot(&mut self) -> &mut dyn Instrumentation;
    /// Installs a journal as the connection's instrumentation.
    fn install(&mut self, journal: Journal);
    /// Whether the connection has Diesel's built-in "no instrumentation".
    fn bare(&mut self) -> bool;
    /// The depth of the open transaction, if one is open.
    fn depth(&mut self) -> Option<u32>;
    /// The connection's address: who wrote an unwatched entry.
    fn address(&mut self) -> usize;
    /// How a failed statement leaves the open transaction on its backend.
    fn ends(&self) -> Ends;
    /// Whether the connection reports a statement that answers with rows as
    /// succeeded before an error that comes in their place
    /// ([`Aborts::hides_read_errors`]). Diesel's blocking connections do not.
    fn hides_read_errors(&self) -> bool {
        false
    }
}

impl<C: Connection> Watched for C {
    fn slot(&mut self) -> &mut dyn Instrumentation {
        Connection::instrumentation(self)
    }

    fn install(&mut self, journal: Journal) {
        Connection::set_instrumentation(self, journal);
    }

    fn bare(&mut self) -> bool {
        has_no_instrumentation(self)
    }

    fn depth(&mut self) -> Option<u32> {
        C::TransactionManager::transaction_manager_status_mut(self)
            .transaction_depth()
            .ok()
            .flatten()
            .map(|d| d.get())
    }

    fn address(&mut self) -> usize {
        std::ptr::from_mut(self) as *mut u8 as usize
    }

    fn ends(&self) -> Ends {
        Ends::of::<C::Backend>()
    }
}

/// A diesel-async connection, watched by the journal like a blocking one.
#[cfg(feature = "async")]
pub(crate) struct AsyncWatched<'a, C>(pub(crate) &'a mut C);

#[cfg(feature = "async")]
impl<C: diesel_async::AsyncConnection> Watched for AsyncWatched<'_, C> {
    fn slot(&mut self) -> &mut dyn Instrumentation {
        self.0.instrumentation()
    }

    fn install(&mut self, journal: Journal) {
        self.0.set_instrumentation(journal);
    }

    /// diesel-async keeps Diesel's placeholder behind a pointer
    /// (`AsyncPgConnection`, `SyncConnectionWrapper`), so there are no bounds
    /// to compare its address with. What tells it from a user's instrumentation:
    /// it is zero-sized and stored in place, while a zero-sized instrumentation
    /// a user sets is boxed, which leaves it at the dangling address (its
    /// alignment).
    fn bare(&mut self) -> bool {
        let current = self.0.instrumentation();
        let at = std::ptr::from_mut(current) as *mut u8 as usize;
        std::mem::size_of_val(current) == 0 && at != std::mem::align_of_val(current)
    }

    fn depth(&mut self) -> Option<u32> {
        use diesel_async::TransactionManager;
        C::TransactionManager::transaction_manager_status_mut(self.0)
            .transaction_depth()
            .ok()
            .flatten()
            .map(|d| d.get())
    }

    fn address(&mut self) -> usize {
        std::ptr::from_mut(self.0) as *mut u8 as usize
    }

    fn ends(&self) -> Ends {
        Ends::of::<C::Backend>()
    }

    /// diesel-async's MySQL connection tells the instrumentation that a read
    /// succeeded as soon as its rows begin to come; an error that comes in
    /// their place (InnoDB reads the rows, and waits for their locks, after it
    /// has sent the columns) reaches the caller only.
    fn hides_read_errors(&self) -> bool {
        self.ends() == Ends::OnDeadlock
    }
}

/// The connection's journal, installed if the connection has no instrumentation;
/// `None` if it has instrumentation of its own.
pub(crate) fn journal_of<W: Watched>(conn: &mut W) -> Option<&mut Journal> {
    watched(conn, |conn| conn.ends())
}

/// The levels lockkit's async calls hold open on `conn`, as its journal keeps
/// them; `None` if it has instrumentation of its own.
#[cfg(feature = "async")]
pub(crate) fn levels<W: Watched>(conn: &mut W) -> Option<&mut super::levels::Levels> {
    journal_of(conn).map(|journal| &mut journal.levels)
}

/// Installs the journal on `conn` as [`journal_of`] does, with the rule the
/// connection tells (`ends`: the dispatched connection's, for an enum; asked
/// until the journal has a rule that was not guessed).
pub(crate) fn watch<W: Watched>(conn: &mut W, ends: impl FnOnce(&mut W) -> Ends) {
    let _ = watched(conn, ends);
}

/// [`journal_of`], the journal taking its rule from `ends` while it has none
/// or a guessed one (a `MultiConnection` enum's is told by [`watch`], as its
/// backend type names none).
fn watched<W: Watched>(conn: &mut W, ends: impl FnOnce(&mut W) -> Ends) -> Option<&mut Journal> {
    let hides_read_errors = conn.hides_read_errors();
    // Whether the journal knows the connection's rule: `None` when the
    // connection has no journal yet.
    let known = conn
        .slot()
        .downcast_mut::<Journal>()
        .map(|journal| journal.aborts.ends != Ends::Unknown && !journal.aborts.guessed);
    if known.is_none() {
        if !conn.bare() {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "lockkit",
                    "this connection has its own Diesel instrumentation: wrap it in \
                     lockkit::journal::Journal::wrap so that lockkit can tell commits from rollbacks"
                );
            }
            return None;
        }
        let mut journal = Journal::new();
        // Installed inside a transaction, it saw its `BEGIN` go by, and the
        // statements since.
        journal.aborts.depth = conn.depth().unwrap_or(0);
        journal.aborts.unsure = hides_read_errors && journal.aborts.depth > 0;
        conn.install(journal);
    }
    let rule = (known != Some(true)).then(|| ends(conn));
    let journal = conn.slot().downcast_mut::<Journal>()?;
    if let Some(rule) = rule.filter(|rule| *rule != Ends::Unknown) {
        // What a guess recorded that the connection's own rule would not have
        // (a SQLite trigger's error in InnoDB's words) ended nothing.
        if let Some((kind, message)) = &journal.aborts.ended_by {
            if !rule.by(*kind, message) {
                journal.aborts.not_ended();
            }
        }
        journal.aborts.ends = rule;
        journal.aborts.guessed = false;
        // What was kept as SQLite's while the rule was unknown.
        if rule != Ends::Never {
            journal.aborts.failed = None;
        }
        // Told now, inside the transaction: it may have missed what ended it.
        journal.aborts.missed = journal.aborts.depth > 0 && rule == Ends::OnDeadlock;
        if journal.aborts.depth > 0 && rule == Ends::Never && journal.aborts.failed.is_none() {
            journal.aborts.failed = Some((DatabaseErrorKind::Unknown, FAILED_UNSEEN.to_owned()));
        }
    }
    journal.aborts.hides_read_errors = hides_read_errors;
    Some(journal)
}

/// The cause lockkit reports where SQLite's transaction ended under a
/// statement that ran before lockkit's journal watched the connection.
const FAILED_UNSEEN: &str = "a statement rolled back the whole transaction before lockkit \
     watched this connection (a trigger's RAISE(ROLLBACK), an ON CONFLICT ROLLBACK constraint)";

/// Forgets what [`ended_by`] said: the server answered that the transaction is
/// alive (the work recovered with a savepoint of its own, in SQL; the error
/// only read like one that ends a transaction; or a lock wait timeout on a
/// server that keeps transactions on one).
///
/// That this transaction survived a lock wait timeout teaches nothing about
/// the next one: a metadata lock's timeout, or a trigger's `SIGNAL` in the
/// same words, ends nothing even on a server that ends transactions on a row
/// lock's. So every timeout in a transaction costs one question, on that
/// error path only.
pub(crate) fn forget_abort<W: Watched>(conn: &mut W) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.not_ended();
        journal.aborts.missed = false;
    }
}

/// The journal on `conn` was installed by lockkit's own outermost transaction
/// right after its `BEGIN`: it missed nothing of it.
pub(crate) fn saw_begin<W: Watched>(conn: &mut W) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.missed = false;
        journal.aborts.failed = None;
        journal.aborts.wrote_after_failed = false;
    }
}

/// Whether a journal watches `conn`: `false` where the connection keeps
/// instrumentation of its own, not wrapped in [`Journal::wrap`]. No statement
/// is then seen to end a transaction, and lockkit asks the server instead
/// ([`ended_unwatched`](crate::transaction::ended_unwatched)).
pub(crate) fn watches<W: Watched>(conn: &mut W) -> bool {
    conn.slot().is::<Journal>()
}

/// Whether a deadlock may have ended the open transaction on `conn` without
/// the journal seeing it, since lockkit last asked the server ([`answered`]):
/// a statement that may answer with rows succeeded, on a connection that
/// hides an error in their place ([`Aborts::hides_read_errors`]), or the
/// journal came in the middle of the transaction ([`Aborts::missed`]).
/// `false` when no journal watches `conn`.
pub(crate) fn unsure<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| {
            (journal.aborts.unsure || journal.aborts.missed) && journal.aborts.ended_by.is_none()
        })
}

/// The server answered whether the open transaction on `conn` is alive
/// (`ended`: what ended it; `None` only for an answer that it is alive, not
/// for a question that failed), after [`unsure`]: the journal is sure again, and
/// a deadlock that ended it is recorded as if seen, so that the rest of
/// lockkit treats it as it treats a statement's ([`ended_by`], [`whole`]), and
/// the versions written in the transaction count as rolled back when it ends.
pub(crate) fn answered<W: Watched>(conn: &mut W, ended: Option<&Error>) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.unsure = false;
        let missed = std::mem::take(&mut journal.aborts.missed);
        if ended.is_none() {
            // Alive: what the work wrote, it wrote in the transaction.
            journal.aborts.wrote_while_unsure = false;
        } else if missed && journal.aborts.ended_by.is_none() {
            // Ended before the journal came: the work's statements it did
            // not see may have run after the end, in autocommit.
            journal.aborts.wrote_while_unsure = true;
        }
        if matches!(ended, Some(Error::Deadlock)) && journal.aborts.ended_by.is_none() {
            journal
                .aborts
                .ended((DatabaseErrorKind::Unknown, UNSEEN_DEADLOCK.to_owned()));
        }
    }
}

/// Whether a statement of the work that may write succeeded on `conn` while
/// the journal was [`unsure`], and no statement was seen to end the
/// transaction since: where the server then finds it ended, the deadlock a
/// read hid may have come before that statement, which then ran in autocommit
/// and committed on its own. `false` where no journal watches `conn`.
pub(crate) fn wrote_while_unsure<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.wrote_while_unsure)
}

/// How sure the journal was before a read of lockkit's own ([`own_read`]),
/// for [`own_read_done`] to put back.
#[cfg_attr(not(feature = "async"), allow(dead_code))] // the blocking side runs `own`
#[derive(Clone, Copy)]
pub(crate) struct OwnRead {
    was_unsure: bool,
    had_written_while_unsure: bool,
    was_read_unseen: bool,
    had_written_after_read: bool,
}

/// Before a read of lockkit's own on an async `conn` (and the statements of
/// lockkit's that follow it in the same call, such as `with_lock`'s bump): how
/// sure the journal is (diesel-async's MySQL connection: [`unsure`]; SQLite:
/// [`Aborts::read_unseen`]). The blocking side, whose statements run in a
/// closure, runs them in [`own`] instead.
#[cfg_attr(not(feature = "async"), allow(dead_code))] // the blocking side runs `own`
pub(crate) fn own_read<W: Watched>(conn: &mut W) -> OwnRead {
    let had_written_while_unsure = wrote_while_unsure(conn);
    let was_unsure = unsure(conn);
    let (was_read_unseen, had_written_after_read) = conn
        .slot()
        .downcast_mut::<Journal>()
        .map_or((false, false), |journal| {
            (journal.aborts.read_unseen, journal.aborts.wrote_after_read)
        });
    OwnRead {
        was_unsure,
        had_written_while_unsure,
        was_read_unseen,
        had_written_after_read,
    }
}

/// A read of lockkit's own on `conn` returned all its rows: no error can have
/// come in their place, so it leaves the journal as sure as it found it
/// (`before`, [`own_read`]), with what lockkit wrote after it in the same
/// call. Not after a failure, whose error the caller may let go: the journal
/// then stays unsure.
#[cfg_attr(not(feature = "async"), allow(dead_code))] // the blocking side runs `own`
pub(crate) fn own_read_done<W: Watched>(conn: &mut W, before: OwnRead) {
    let Some(journal) = conn.slot().downcast_mut::<Journal>() else {
        return;
    };
    if !before.was_unsure {
        journal.aborts.unsure = false;
        journal.aborts.wrote_while_unsure = before.had_written_while_unsure;
    }
    if !before.was_read_unseen {
        journal.aborts.read_unseen = false;
        journal.aborts.wrote_after_read = before.had_written_after_read;
    }
}

/// The work of lockkit's outermost transaction on `conn` returned `Ok`: its
/// `COMMIT` tells whether SQLite rolled the transaction back under a
/// statement whose error the journal did not see ([`Aborts::read_unseen`]),
/// which SQLite then refuses, so lockkit does not ask before it.
pub(crate) fn commit_tells<W: Watched>(conn: &mut W) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.read_unseen = false;
    }
}

/// Runs `statements`, lockkit's own on `conn` (no closure of the caller's
/// runs among them): SQLite's journal counts none of them as a statement of
/// the work that may have hidden an error ([`Aborts::read_unseen`]), since
/// lockkit sees every answer they give. Where they fail with a database
/// error, the error reaches the caller, who may let it go: the journal then
/// counts them as such a statement after all, so that lockkit's next call in
/// the transaction asks SQLite.
pub(crate) fn own<W: Watched, T, E: OwnFailure>(
    conn: &mut W,
    statements: impl FnOnce(&mut W) -> Result<T, E>,
) -> Result<T, E> {
    let was = set_own(conn, true);
    // Put back also when a `Queryable` or `Debug` of the caller's panics in
    // them, and the panic is caught: the connection counts the work's
    // statements again.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| statements(conn)));
    set_own(conn, was);
    let result = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    if let Err(err) = &result {
        if !was && err.answered_by_database() {
            if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
                let aborts = &mut journal.aborts;
                if aborts.ends == Ends::Never && aborts.depth > 0 {
                    aborts.read_unseen = true;
                }
            }
        }
    }
    result
}

/// Sets [`Aborts::own`] on `conn`'s journal; returns what it was.
fn set_own<W: Watched>(conn: &mut W, own: bool) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| std::mem::replace(&mut journal.aborts.own, own))
}

/// The error of lockkit's own statements ([`own`]): whether the database
/// answered it (a `NotFound` of lockkit's, or Diesel's empty result, did not).
pub(crate) trait OwnFailure {
    /// Whether the database answered with this error.
    fn answered_by_database(&self) -> bool;
}

impl OwnFailure for diesel::result::Error {
    fn answered_by_database(&self) -> bool {
        !matches!(self, diesel::result::Error::NotFound)
    }
}

impl OwnFailure for Error {
    fn answered_by_database(&self) -> bool {
        match self {
            Error::Database(err) => err.answered_by_database(),
            Error::Busy
            | Error::LockTimeout
            | Error::ConnectionLost
            | Error::StatementTimeout
            | Error::Deadlock
            | Error::SerializationFailure
            | Error::ReadOnly
            | Error::DuplicateKey { .. } => true,
            _ => false,
        }
    }
}

/// What [`Aborts::silent_end`] records: InnoDB's words for a deadlock, which
/// [`ended_by`] classifies as one.
const SILENT_END: &str = "Deadlock found when trying to get lock (the server had ended the \
     transaction without an error: a later write ran outside it, on a read-only session, and was \
     refused)";

/// What [`Aborts::silent_end`] records where a rerun could apply work twice:
/// MySQL/MariaDB's words for the refusal (1792), which [`ended_by`]
/// classifies as [`Error::ReadOnly`].
const ENDED_READ_ONLY: &str = "Cannot execute statement in a READ ONLY transaction (lockkit's \
     read-write transaction had ended: a later write ran outside it, on a read-only session, and \
     was refused)";

/// [`ENDED_READ_ONLY`] with the refusal's kind, as [`Aborts::silent_end`]
/// records it.
fn read_only_end() -> (DatabaseErrorKind, String) {
    (
        DatabaseErrorKind::ReadOnlyTransaction,
        ENDED_READ_ONLY.to_owned(),
    )
}

/// What [`answered`] records for a deadlock that ended the transaction unseen:
/// InnoDB's words, which [`ended_by`] classifies as a deadlock.
const UNSEEN_DEADLOCK: &str =
    "Deadlock found when trying to get lock (in place of a read's rows; the transaction has ended)";

/// What ended the open transaction on `conn` under a statement whose error the
/// work let go ([`Ends`]), if the connection's journal saw one: lockkit's
/// transactions then neither commit nor go on as if it were open. `None` when
/// nothing did, or no journal watches `conn`.
pub(crate) fn ended_by<W: Watched>(conn: &mut W) -> Option<Error> {
    let journal = conn.slot().downcast_mut::<Journal>()?;
    let (kind, message) = journal.aborts.ended_by.clone()?;
    Some(classification::recall(
        diesel::result::Error::DatabaseError(kind, Box::new(message)),
    ))
}

/// Whether lockkit knows how the open transaction on `conn` ended: a
/// statement's error the journal saw ([`ended_by`]), or an abort lockkit
/// confirmed with the server and reported in it ([`aborted`]; a read whose
/// deadlock diesel-async hid from the journal, among them). `false` where no
/// journal watches `conn`.
pub(crate) fn knows_of_end<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| {
            journal.aborts.ended_by.is_some() || !journal.aborts.reported.is_empty()
        })
}

/// Whether the session behind `conn` refuses writes outside transactions
/// ([`Aborts::guarded`]). `false` where no journal watches `conn`.
#[cfg(feature = "mysql")]
pub(crate) fn guarded<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.guarded)
}

/// The transaction just begun on `conn` holds the savepoint
/// [`MYSQL_BEGIN_MARKED`](crate::transaction::MYSQL_BEGIN_MARKED) opens
/// ([`Aborts::marked`]).
#[cfg(feature = "mysql")]
pub(crate) fn began_marked<W: Watched>(conn: &mut W) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.marked = true;
    }
}

/// The batch that commits the open transaction on `conn` where it began
/// marked ([`began_marked`]; asked once, at the end):
/// [`MYSQL_COMMIT_MARKED`](crate::transaction::MYSQL_COMMIT_MARKED), or
/// [`MARIADB_COMMIT_MARKED`](crate::transaction::MARIADB_COMMIT_MARKED) where
/// the server answers `@@in_transaction`. `None` where it did not begin so,
/// and where a statement of it may have committed it itself
/// ([`Aborts::nothing_writes_outside`]): the savepoint went with that commit,
/// and what came before it stands, which a rerun would apply twice; Diesel's
/// plain `COMMIT` ends it then.
#[cfg(feature = "mysql")]
pub(crate) fn marked_commit<W: Watched>(conn: &mut W) -> Option<&'static str> {
    let aborts = &mut conn.slot().downcast_mut::<Journal>()?.aborts;
    let marked = std::mem::take(&mut aborts.marked);
    (marked && aborts.nothing_writes_outside()).then_some(match aborts.answers_in_transaction {
        true => crate::transaction::MARIADB_COMMIT_MARKED,
        false => crate::transaction::MYSQL_COMMIT_MARKED,
    })
}

/// Whether no statement of the open transaction on `conn` can have written
/// outside it ([`Aborts::nothing_writes_outside`]): a session that refuses
/// writes outside transactions, where nothing may have committed the
/// transaction itself. `false` where no journal watches `conn`.
pub(crate) fn nothing_writes_outside<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.nothing_writes_outside())
}

/// Whether a statement of the work that may write succeeded on `conn` after
/// a statement ended the open transaction ([`ended_by`]) on a backend that
/// then runs it in autocommit: it committed on its own. `false` where no
/// journal watches `conn`.
pub(crate) fn wrote_after_end<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.wrote_after_end)
}

/// Whether lockkit reported an abort in the open transaction on `conn` that
/// said statements of the work may have committed on their own
/// ([`Aborts::reported_own_commits`]). `false` where no journal watches `conn`.
pub(crate) fn reported_own_commits<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.reported_own_commits)
}

/// SQLite: whether a statement that may write succeeded on `conn` after one
/// failed in the open transaction ([`Aborts::wrote_after_failed`]): if the
/// failure had rolled the whole transaction back, it committed on its own.
/// Read before the transaction's end, which forgets it.
pub(crate) fn wrote_after_failed<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.wrote_after_failed)
}

/// SQLite: whether, where no statement was seen to fail in the open
/// transaction on `conn`, a statement of the work followed one whose error
/// the journal may not have seen ([`Aborts::wrote_after_read`]): if that one
/// had rolled the whole transaction back, what followed ran in autocommit.
/// Read where lockkit asks SQLite before a call of its own (a call after such
/// a rollback means the work let its error go), not at the end of work that
/// failed: there the work's error is most often that statement's own (a
/// trigger's `RAISE(ROLLBACK, ..)` in a `RETURNING`, returned with `?`), which
/// lockkit cannot tell from one the work let go; it keeps the work's error.
pub(crate) fn wrote_after_unseen<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.wrote_after_read && !journal.aborts.seen_failure)
}

/// SQLite: whether a statement was seen to fail in the open transaction on
/// `conn` ([`Aborts::seen_failure`]).
pub(crate) fn seen_failure<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.seen_failure)
}

/// SQLite: lockkit's probe failed on `conn`, as it always does: its failure
/// is forgotten, and whether a statement was seen to fail before it (`seen`)
/// put back.
pub(crate) fn probe_failed<W: Watched>(conn: &mut W, seen: bool) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.failed = None;
        journal.aborts.seen_failure = seen;
    }
}

/// SQLite answered that the open transaction on `conn` is alive: the reads
/// whose errors the journal does not see ([`Aborts::read_unseen`]) rolled
/// nothing back, and what the work wrote after them, it wrote in the
/// transaction (unless a savepoint of the work's own may have begun it:
/// [`Aborts::savepoint_after_read`]).
pub(crate) fn read_answered<W: Watched>(conn: &mut W) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        let aborts = &mut journal.aborts;
        if aborts.savepoint_after_read && aborts.wrote_after_read && !aborts.seen_failure {
            // The transaction SQLite finds alive may be the one a savepoint
            // of the work's own began after a rollback: what the work ran
            // before that savepoint may have committed on its own, which the
            // end of the work, failed or not, must know.
            aborts.wrote_after_failed = true;
        } else {
            aborts.wrote_after_read = false;
        }
        aborts.read_unseen = false;
        // Nor did a failure it saw.
        aborts.seen_failure = false;
    }
}

/// Sets [`wrote_after_failed`] to `wrote`: kept across the end that
/// [`ended_unseen`] closed where SQLite's rollback leaves callers running
/// ([`orphan`]).
pub(crate) fn set_wrote_after_failed<W: Watched>(conn: &mut W, wrote: bool) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.wrote_after_failed = wrote;
    }
}

/// Whether the journal on `conn` does not know its backend's rule (a
/// `MultiConnection` enum's, or lockkit built without the backend's feature):
/// [`take_failed_statement`]'s statement may then be any backend's.
pub(crate) fn rule_unknown<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| journal.aborts.ends == Ends::Unknown)
}

/// SQLite: lockkit's own statement that answers with rows
/// ([`atomic::update_returning`](crate::atomic::update_returning)) failed with
/// `err` in the open transaction on `conn`, whose backend ends transactions as
/// `ends` says. Diesel's SQLite connection reports such a statement to its
/// instrumentation as succeeded, and its error reaches the caller only: the
/// journal keeps it as the transaction's failed statement (unless it keeps
/// one already), so that lockkit's next call asks SQLite whether it rolled
/// back the whole transaction ([`take_failed_statement`]), as after a failed statement
/// the journal saw.
pub(crate) fn failed_unseen<W: Watched>(conn: &mut W, err: &Error, ends: Ends) {
    if ends != Ends::Never || conn.depth().is_none() {
        return;
    }
    let Some(journal) = conn.slot().downcast_mut::<Journal>() else {
        return;
    };
    if journal.aborts.depth > 0 && journal.aborts.failed.is_none() {
        journal.aborts.seen_failure = true;
        journal.aborts.failed = Some(match err {
            Error::Database(diesel::result::Error::DatabaseError(kind, info)) => {
                (*kind, info.message().to_owned())
            }
            other => (DatabaseErrorKind::Unknown, other.to_string()),
        });
    }
}

/// SQLite: the error of the first statement that failed in the open
/// transaction on `conn` since lockkit last asked ([`Aborts::failed`]), which
/// may have rolled the whole transaction back, as the journal keeps it; for a
/// statement of the work whose error the journal may not have seen
/// ([`Aborts::read_unseen`]), [`READ_UNSEEN`]. Forgotten once taken. `None`
/// when neither, on the other backends, or where no journal watches `conn`.
pub(crate) fn take_failed_statement<W: Watched>(
    conn: &mut W,
) -> Option<(DatabaseErrorKind, String)> {
    let aborts = &mut journal_of(conn)?.aborts;
    let read_unseen = std::mem::take(&mut aborts.read_unseen);
    aborts
        .failed
        .take()
        .or_else(|| read_unseen.then(|| (DatabaseErrorKind::Unknown, READ_UNSEEN.to_owned())))
}

/// The cause lockkit reports where SQLite rolled back the whole transaction
/// under a statement that answers with rows, whose error reached the caller
/// only ([`Aborts::read_unseen`]).
const READ_UNSEEN: &str = "SQLite rolled back the whole transaction under a statement whose \
     error reached the caller only (one that answers with rows: load, get_result, RETURNING)";

/// A statement error as the journal keeps it, classified again.
pub(crate) fn recall(kind: DatabaseErrorKind, message: String) -> Error {
    classification::recall(diesel::result::Error::DatabaseError(
        kind,
        Box::new(message),
    ))
}

/// SQLite: the whole transaction on `conn` was rolled back (by `failed`, when
/// the journal noted it) under callers whose code still runs, counting `depth`
/// levels open, which lockkit has put back in Diesel's books
/// (`transaction::restore_depth`): the journal counts them too, takes every
/// level for rolled back, and lockkit refuses until the outermost caller ends
/// the transaction ([`orphaned`]). Returns the error to refuse with.
pub(crate) fn orphan<W: Watched>(
    conn: &mut W,
    failed: Option<(DatabaseErrorKind, String)>,
    depth: u32,
) -> Error {
    let Some(journal) = conn.slot().downcast_mut::<Journal>() else {
        let (kind, message) = failed.unwrap_or_else(ended_under_a_nested_level);
        return recall(kind, message);
    };
    let (kind, message) = match journal.aborts.orphaned.take() {
        Some(orphan) => (orphan.kind, orphan.message),
        None => {
            journal.committing = false;
            journal.releasing = None;
            journal.ended(End::RolledBack { depth: 1 });
            failed
                .or_else(|| journal.aborts.failed.take())
                .unwrap_or_else(ended_under_a_nested_level)
        }
    };
    journal.aborts.depth = depth;
    journal.aborts.orphaned = Some(Orphan {
        kind,
        message: message.clone(),
    });
    recall(kind, message)
}

/// The cause an orphan carries when no failed statement was noted.
fn ended_under_a_nested_level() -> (DatabaseErrorKind, String) {
    (
        DatabaseErrorKind::Unknown,
        "SQLite rolled back the whole transaction under a nested lockkit call".to_owned(),
    )
}

/// lockkit's outermost transaction on `conn` ended and Diesel counts none
/// open: whatever the journal still counts open ended with it, uncommitted (a
/// commit would have told it), and nothing is orphaned any more.
pub(crate) fn outermost_ended<W: Watched>(conn: &mut W) {
    let Some(journal) = conn.slot().downcast_mut::<Journal>() else {
        return;
    };
    journal.aborts.orphaned = None;
    if journal.aborts.depth > 0 {
        journal.committing = false;
        journal.releasing = None;
        journal.ended(End::RolledBack { depth: 1 });
        journal.aborts.depth = 0;
        journal.aborts.closed();
    }
}

/// SQLite: the error of the statement that rolled back the whole transaction
/// under the callers still running on `conn` ([`Aborts::orphaned`]), while
/// Diesel counts a transaction open. Where Diesel counts none (a failed
/// statement of the caller's own reset its count: lockkit can no longer tell
/// whether the callers still run), it is forgotten.
pub(crate) fn orphaned<W: Watched>(conn: &mut W) -> Option<Error> {
    let open = conn.depth().is_some();
    let journal = conn.slot().downcast_mut::<Journal>()?;
    if !open {
        journal.aborts.orphaned = None;
    }
    let orphan = journal.aborts.orphaned.as_ref()?;
    Some(recall(orphan.kind, orphan.message.clone()))
}

/// Whether the transaction that the journal of `conn` has open is deeper than
/// the one Diesel's connection has: Diesel's SQLite connection drops its depth
/// without an event when a statement fails where SQLite has no transaction
/// open any more (see `transaction::ended_on_sqlite`). The journal then takes
/// the levels Diesel dropped for rolled back, as SQLite has them.
///
/// Returns the depth the journal had open (the levels the callers count),
/// when it was deeper.
pub(crate) fn ended_unseen<W: Watched>(conn: &mut W) -> Option<u32> {
    let now = conn.depth().unwrap_or(0);
    let journal = conn.slot().downcast_mut::<Journal>()?;
    let open = journal.aborts.depth;
    if open <= now {
        return None;
    }
    journal.committing = false;
    journal.releasing = None;
    journal.ended(End::RolledBack { depth: now + 1 });
    journal.aborts.depth = now;
    if now == 0 {
        journal.aborts.closed();
    }
    Some(open)
}

/// The session behind `conn` refuses writes outside transactions
/// ([`Aborts::guarded`]): installs the journal if the connection has none
/// (one with instrumentation of its own is not watched).
/// `mariadb`: the server answers `@@in_transaction`
/// ([`Aborts::answers_in_transaction`]).
#[cfg(feature = "mysql")]
pub(crate) fn guard<W: Watched>(conn: &mut W, mariadb: bool) {
    if let Some(journal) = journal_of(conn) {
        journal.aborts.guarded = true;
        journal.aborts.answers_in_transaction = mariadb;
        // Told inside a transaction: the statements before were not looked
        // at, and any of them may have committed it.
        if journal.aborts.depth > 0 {
            journal.aborts.implicit_commit = true;
        }
    }
}

/// Before a write statement of lockkit's that runs in the caller's transaction
/// (a versioned write; [`before_write_told`] for the atomic writes): the
/// journal watches it, so that [`write_ended_transaction`] can tell whether it
/// ended the transaction. Outside a transaction nothing is installed here (an
/// async call's reply guard installs it there:
/// [`Unsettled::until_replied`](crate::asynchronous::connection::Unsettled::until_replied)).
pub(crate) fn before_write<W: Watched>(conn: &mut W) {
    if conn.depth().is_some() {
        let _ = journal_of(conn);
    }
}

/// [`before_write`], the caller telling the connection's rule (`ends`: the
/// rule of the connection inside a `MultiConnection` enum, whose backend type
/// names none), which a journal installed or guessed here takes.
pub(crate) fn before_write_told<W: Watched>(conn: &mut W, ends: Ends) {
    if conn.depth().is_some() {
        watch(conn, |_| ends);
    }
}

/// The error lockkit reports when the server rolled back the whole open
/// transaction on `conn` under one of its calls (`cause`: why):
/// [`Error::TransactionAborted`], not retryable
/// until the transaction's owner ends it, which the journal watching `conn`
/// sees and settles ([`Aborted`](crate::Aborted)). Without a journal (a
/// connection with instrumentation of its own), it stays unsettled; outside a
/// transaction it is settled at once.
pub(crate) fn aborted<W: Watched>(conn: &mut W, cause: Error) -> Error {
    let aborted = crate::error::Aborted::new(cause);
    if conn.depth().is_none() {
        aborted.settler().settle();
    } else if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.reported_own_commits |=
            crate::transaction::may_have_committed(aborted.cause());
        journal.aborts.reported.push(aborted.settler());
    }
    Error::TransactionAborted(aborted)
}

/// Whether statements of the work in the open transaction on `conn` may have
/// committed on their own: one wrote after the transaction ended
/// ([`wrote_after_end`]), or lockkit reported an abort saying so (a nested call
/// that found the transaction ended silently), or one wrote after a read that
/// may have hidden the end lockkit then found ([`wrote_while_unsure`]). For the
/// idempotency keys, which then keep the key. `false` where no journal watches
/// `conn`.
#[cfg(feature = "idempotency")]
pub(crate) fn committed_on_own<W: Watched>(conn: &mut W) -> bool {
    conn.slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| {
            let aborts = &journal.aborts;
            aborts.wrote_after_end
                || aborts.reported_own_commits
                || (aborts.wrote_while_unsure && aborts.ended_by.is_some())
        })
}

/// A write statement of lockkit's ([`before_write`]) failed with `err`: whether
/// that rolled back the whole open transaction ([`whole`]), so that
/// the write must report [`TransactionAborted`](crate::Error::TransactionAborted),
/// which no retry takes up (a `retry` around the write would otherwise run it
/// again in autocommit, outside the caller's transaction that the server rolled
/// back, and commit half of the caller's work), and keep the caller's next
/// statements out of autocommit. Decided here for the blocking
/// ([`transaction::failed_write`](crate::transaction::failed_write)) and the
/// async write.
pub(crate) fn write_ended_transaction<W: Watched>(conn: &mut W, err: &Error, ends: Ends) -> bool {
    match whole(conn, ends) {
        Whole::Seen => err.is_retryable(),
        Whole::Unwatched => may_end_transaction(err),
        Whole::No => false,
    }
}

/// Whether a statement's error may have rolled back the whole open transaction
/// on MySQL/MariaDB, where no journal saw the statement: InnoDB does so for
/// every deadlock's victim, and for a lock wait timeout (MariaDB's failed
/// `NOWAIT` too) under `innodb_rollback_on_timeout`. The stand-in's first
/// statement then asks the server.
pub(crate) fn may_end_transaction(err: &Error) -> bool {
    matches!(err, Error::Deadlock | Error::LockTimeout | Error::Busy)
}

/// What the journal knows of whether a statement rolled back the whole open
/// transaction on `conn` (MySQL/MariaDB's deadlock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whole {
    /// It saw one.
    Seen,
    /// No journal watches `conn` (instrumentation of its own), whose backend
    /// ends a transaction on a deadlock: the server must be asked, or the
    /// error read.
    Unwatched,
    /// None did, or the backend never does.
    No,
}

/// [`Whole`] for `conn`, in a transaction, on a backend whose rule is `ends`
/// (what decides where no journal watches: a `MultiConnection` enum's is the
/// connection's inside, which its backend type does not name).
pub(crate) fn whole<W: Watched>(conn: &mut W, ends: Ends) -> Whole {
    let seen = conn.slot().downcast_mut::<Journal>().map(|journal| {
        journal.aborts.ends == Ends::OnDeadlock && journal.aborts.ended_by.is_some()
    });
    match seen {
        Some(true) => Whole::Seen,
        Some(false) => Whole::No,
        None if conn.depth().is_some() && ends == Ends::OnDeadlock => Whole::Unwatched,
        None => Whole::No,
    }
}

/// [`whole`], as the end of an outermost transaction whose work failed asks
/// it (`Began::check`): also [`Whole::Seen`] where a statement's retryable
/// failure (a deadlock, a lock timeout, a serialization failure) aborted the
/// transaction on PostgreSQL, no rollback to a savepoint revived it, and the
/// work went on there: every statement after it failed (25P02), and a `retry`
/// inside the work met only those. The owner then hands back the cause,
/// retryable, for a retry around the transaction to run it again, as InnoDB's
/// abort of the whole transaction is handed back on MySQL/MariaDB. A work that
/// returned at the failure, with the failure or an error of its own, keeps it.
pub(crate) fn whole_at_end<W: Watched>(conn: &mut W, ends: Ends) -> Whole {
    let aborted_retryably = conn
        .slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| {
            let aborts = &journal.aborts;
            aborts.ends == Ends::UntilSavepointRollback
                && aborts.ended_by.is_some()
                && aborts.failed_after
        })
        && ended_by(conn).is_some_and(|cause| cause.is_retryable());
    if aborted_retryably {
        return Whole::Seen;
    }
    whole(conn, ends)
}

/// Before a write statement of lockkit's in the open transaction on `conn`
/// ([`before_write`]): what ended that transaction, where the journal saw a
/// statement do so on a backend that then runs later statements in autocommit
/// (MySQL/MariaDB's deadlock, [`Whole::Seen`]), or a deadlock it may have
/// missed ([`Aborts::missed`]); and whether lockkit has reported the abort in
/// it already (then the server confirmed it, and the read-only stand-in was
/// opened).
pub(crate) fn ended_before_write<W: Watched>(conn: &mut W) -> Option<(Error, bool)> {
    let ends = conn.ends();
    if whole(conn, ends) != Whole::Seen {
        // Came in the middle of the transaction: what it missed may have.
        let missed = conn
            .slot()
            .downcast_mut::<Journal>()
            .is_some_and(|journal| journal.aborts.missed && journal.aborts.depth > 0);
        return missed.then_some((Error::Deadlock, false));
    }
    let cause = ended_by(conn)?;
    let reported = conn
        .slot()
        .downcast_mut::<Journal>()
        .is_some_and(|journal| !journal.aborts.reported.is_empty());
    Some((cause, reported))
}

/// Whether `conn` has Diesel's built-in "no instrumentation".
///
/// Diesel's connections keep that placeholder, a zero-sized value, inline in the
/// connection (inline also in an r2d2 `PooledConnection`), while every
/// instrumentation a user sets is boxed, so on the heap (or, if zero-sized, at a
/// dangling address). Anything else is treated as the user's own, which is the
/// safe side: lockkit then never replaces it.
fn has_no_instrumentation<C: Connection>(conn: &mut C) -> bool {
    let start = std::ptr::from_mut(conn) as *mut u8 as usize;
    let end = start + std::mem::size_of::<C>();
    let current = conn.instrumentation();
    let at = std::ptr::from_mut(current) as *mut u8 as usize;
    // A zero-sized field may sit at the very end of the connection.
    std::mem::size_of_val(current) == 0 && (start..=end).contains(&at)
}

/// What lockkit's own rollback on a connection no journal watches tells the
/// layer that recorded writes there ([`rolled_back_unwatched`]): set by that
/// layer at its first such write.
static UNWATCHED_ROLLBACK: OnceLock<fn(usize, u32)> = OnceLock::new();

/// Makes `hook` hear of every rollback lockkit makes of its own transactions
/// (or savepoints) on a connection no journal watches, with the connection's
/// address and the level it was opened at (1: the outermost).
pub(crate) fn on_unwatched_rollback(hook: fn(usize, u32)) {
    let _ = UNWATCHED_ROLLBACK.set(hook);
}

/// lockkit rolled back one of its own transactions (or savepoints) on the
/// connection at `address`, opened at depth `level`: what the journal of a
/// connection with instrumentation of its own cannot see, lockkit's
/// transaction plumbing tells for the transactions it runs. Nothing to do
/// unless a write was ever recorded on such a connection.
pub(crate) fn rolled_back_unwatched(address: usize, level: u32) {
    if let Some(hook) = UNWATCHED_ROLLBACK.get() {
        hook(address, level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_takes_reads_settings_and_transaction_statements() {
        for sql in [
            "SELECT 1",
            "select * from items for update",
            "SHOW VARIABLES",
            "SET @statement = 1",
            "SET statement_x = 1",
            "SET SESSION innodb_lock_wait_timeout = 1",
            "START TRANSACTION READ WRITE",
            "RELEASE SAVEPOINT lockkit_1",
            "SELECT 1;",
            "SELECT 1;  \n",
        ] {
            assert!(only_reads(&sql), "{sql}");
        }
    }

    #[test]
    fn only_reads_counts_what_may_write() {
        for sql in [
            "INSERT INTO orders VALUES (1)",
            "UPDATE items SET stock = 1",
            // MariaDB's `SET STATEMENT .. FOR` runs the statement after `FOR`.
            "SET STATEMENT max_statement_time = 5 FOR INSERT INTO orders VALUES (1)",
            "set statement max_statement_time=5 for update items set stock = 1",
            "SET/**/STATEMENT max_statement_time = 5 FOR DELETE FROM orders",
            // A batch: its first word says nothing of the others.
            "SET @x = 1; INSERT INTO orders VALUES (@x)",
            "SELECT 1; DELETE FROM orders",
            // Starts that say nothing.
            "/* a comment */ SELECT 1",
            "(SELECT 1) UNION (SELECT 2)",
            "CALL restock()",
            "DO restock()",
            "",
        ] {
            assert!(!only_reads(&sql), "{sql}");
        }
    }

    #[test]
    fn set_statement_may_commit_and_answer_with_rows_as_its_statement_may() {
        let set_statement = "SET STATEMENT max_statement_time = 5 FOR SELECT 1";
        assert!(may_commit_implicitly(&set_statement));
        assert!(may_answer_with_rows(&set_statement));
        for setting in ["SET @statement = 1", "SET SESSION sql_mode = ''"] {
            assert!(!may_commit_implicitly(&setting), "{setting}");
            assert!(!may_answer_with_rows(&setting), "{setting}");
        }
        assert!(may_commit_implicitly(&"SET autocommit = 1"));
        assert!(may_commit_implicitly(&"SELECT 1; CREATE TABLE t (id INT)"));
    }
}
