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
//!    rollback) still holds;
//! 2. otherwise, if the row now holds the very number the struct holds (somebody
//!    re-produced it), it cannot tell the struct from a legitimate reader of that
//!    number: it moves the row's version past it (`SET v = v + 1 WHERE v = $n`,
//!    data untouched) and reports [`Error::Stale`]. The
//!    struct's write never lands, and any other holder of that number reloads once.
//!
//! 3. unless the struct's number was written from another uncommitted write's
//!    number (the row written twice in the rolled-back transaction, by one
//!    struct or by a second one that read it there): such a struct may carry
//!    what the earlier write changed, and restoring it would either commit that
//!    or match another struct's retry. It is reported
//!    [`Error::Stale`] without a write;
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
//!    on a row with such a struct. The rolled-back numbers stay recorded until a
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
//! A row is named by its key, its table with the table's schema, and its
//! database (on PostgreSQL its name, on SQLite its file). The schema is the one
//! the model's `table!` names (`archive.items`, on MySQL/MariaDB a database;
//! on SQLite a table of an attached database is named by that file), or else
//! the one the connection finds the table in: on PostgreSQL the schema its
//! `search_path` finds it in (asked with the key check, once per connection
//! and table), on MySQL/MariaDB its database, on SQLite `main`. The server as
//! the connection reached it (its address, or host name, and port) is kept
//! beside the name: a rolled-back
//! number protects the row whichever server recorded it, and a commit forgets
//! only what was recorded through its own (`server_and_rest`), so that one
//! server reached by two paths, or a cluster's two nodes, cannot make one row
//! two. The connection's names are read once per connection. An SQLite
//! database without a file (`:memory:`, a temporary one) is private to its
//! connection and named after it; a shared-cache in-memory database used from
//! several connections is therefore several databases to the journal, and a
//! struct rolled back on one connection is not recognised on another: give
//! such a database a file.

// Without a backend feature no connection implements the per-connection traits,
// and the pieces they are built from go unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(unused_imports, dead_code)
)]

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::error::classification;
use crate::error::Error;
use crate::optimistic::backend::{DatabaseId, Unique};
#[doc(hidden)]
pub use crate::optimistic::mark::Mark;
use crate::optimistic::table::TableName;
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
    /// Versions this connection wrote in its open transaction.
    open: Vec<(RowId, i64)>,
    /// A top-level `COMMIT` was sent; its outcome comes with the next event.
    committing: bool,
    /// Whether each table's declared key is unique in this connection's database.
    /// Keyed by the table's type: two tables may share a name.
    unique_keys: ByType<bool>,
    /// The schema each table written without one is found in, quoted as
    /// [`Database::schema`] (`None`: the connection's). Keyed by the table's type.
    schemas: ByType<Option<String>>,
    /// The database this connection writes to, and its schema.
    database: Option<Database>,
    /// Whether a failed statement has ended the open transaction.
    aborts: Aborts,
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
    /// SQLite: an error ends its statement only.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Never,
    /// A backend type that names no server (a `MultiConnection` enum's):
    /// treated as [`Never`](Self::Never) until the connection inside tells,
    /// or InnoDB's words do.
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
    /// The error that ended the open transaction (its kind and message).
    ended_by: Option<(DatabaseErrorKind, String)>,
    /// A rollback to a savepoint was sent after such an error: on PostgreSQL
    /// its success revives the transaction.
    reviving: bool,
    /// The aborts lockkit reported in the open transaction
    /// ([`Error::TransactionAborted`]), settled
    /// when it ends.
    reported: Vec<crate::error::Settler>,
    /// The connection reports a statement that answers with rows as succeeded
    /// once they begin to come, and an error in their place reaches the caller
    /// only (diesel-async's MySQL connection: a locking read that is a
    /// deadlock's victim). See [`unsure`].
    hides_read_errors: bool,
    /// On such a connection, a statement that may answer with rows succeeded
    /// in the open transaction since lockkit last asked the server whether it
    /// is alive: a deadlock may have ended it unseen.
    unsure: bool,
    /// The journal learned that its backend ends a transaction on a deadlock
    /// only inside the open transaction (installed by a connection's first
    /// lockkit call there, or told its rule late): it may have missed, or not
    /// counted, a statement before that ended the transaction. Until lockkit
    /// asks the server ([`answered`]) or the transaction ends.
    missed: bool,
}

impl Aborts {
    /// The open transaction ended (or the session did): every abort reported in
    /// it is settled.
    fn settle(&mut self) {
        for reported in self.reported.drain(..) {
            reported.settle();
        }
    }

    fn on_event(&mut self, event: &InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::BeginTransaction { depth, .. } => self.depth = depth.get(),
            InstrumentationEvent::CommitTransaction { depth, .. }
            | InstrumentationEvent::RollbackTransaction { depth, .. } => {
                self.depth = depth.get() - 1;
                let rollback = matches!(event, InstrumentationEvent::RollbackTransaction { .. });
                if self.depth == 0 {
                    self.ended_by = None;
                    self.reviving = false;
                    self.unsure = false;
                    self.missed = false;
                    self.settle();
                } else if rollback && self.ends == Ends::UntilSavepointRollback {
                    self.reviving = self.ended_by.is_some();
                }
            }
            InstrumentationEvent::FinishQuery { query, error, .. } => {
                if self.hides_read_errors
                    && self.depth > 0
                    && error.is_none()
                    && may_answer_with_rows(query)
                {
                    self.unsure = true;
                }
                if std::mem::take(&mut self.reviving) {
                    if error.is_none() {
                        self.ended_by = None;
                    }
                } else if let Some(diesel::result::Error::DatabaseError(kind, info)) = error {
                    // A journal whose backend type names no server (a
                    // `MultiConnection` enum's, or one the user installed)
                    // learns its rule when a lockkit call tells it; before
                    // that, InnoDB's own words (a deadlock's, or a lock wait
                    // timeout's) make a guess, which the call's rule replaces.
                    #[cfg(feature = "mysql")]
                    if self.ends == Ends::Unknown
                        && (classification::is_innodb_deadlock(info.message())
                            || classification::is_lock_wait_timeout(info.message()))
                    {
                        self.ends = Ends::OnDeadlock;
                        self.guessed = true;
                    }
                    if self.depth > 0
                        && self.ended_by.is_none()
                        && self.ends.by(*kind, info.message())
                    {
                        self.ended_by = Some((*kind, info.message().to_owned()));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether a statement (its SQL, as the connection reports it) may answer
/// with rows, so that an error coming in their place may reach its caller
/// only ([`Aborts::hides_read_errors`]): any statement but a transaction
/// statement, `SET`, and a write without `RETURNING`. Read off the statement's
/// first word; the text is scanned for `RETURNING` only for a write that
/// MariaDB lets return rows.
fn may_answer_with_rows(query: &dyn std::fmt::Display) -> bool {
    use std::fmt::Write;
    /// Reads the statement as it is written, and stops the writing once it
    /// knows.
    struct Answer(Option<bool>);
    impl Write for Answer {
        fn write_str(&mut self, sql: &str) -> std::fmt::Result {
            let word = sql
                .trim_start_matches(|c: char| c.is_whitespace())
                .split(|c: char| !c.is_ascii_alphabetic())
                .next()
                .unwrap_or_default();
            let is = |keyword: &str| word.eq_ignore_ascii_case(keyword);
            let never = [
                "BEGIN",
                "START",
                "COMMIT",
                "ROLLBACK",
                "SAVEPOINT",
                "RELEASE",
                "UPDATE",
            ];
            let answer = if is("SET") {
                // MariaDB's `SET STATEMENT .. FOR <statement>` runs a statement
                // that may answer with rows; any other `SET` does not.
                sql.trim_start_matches(|c: char| c.is_whitespace())[word.len()..]
                    .split(|c: char| !c.is_ascii_alphabetic())
                    .find(|next| !next.is_empty())
                    .is_some_and(|next| next.eq_ignore_ascii_case("STATEMENT"))
            } else if never.iter().any(|keyword| is(keyword)) {
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
            };
            self.0 = Some(answer);
            // Enough read: the rest of the statement is not written.
            Err(std::fmt::Error)
        }
    }
    let mut answer = Answer(None);
    let _ = write!(answer, "{query}");
    answer.0.unwrap_or(true)
}

impl Journal {
    /// A journal for a connection without other instrumentation.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Journal {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            inner: None,
            open: Vec::new(),
            committing: false,
            unique_keys: ByType::default(),
            schemas: ByType::default(),
            database: None,
            aborts: Aborts::default(),
        }
    }

    /// A journal that passes every event on to your own instrumentation.
    pub fn wrap(inner: impl Instrumentation) -> Self {
        let mut journal = Journal::new();
        journal.inner = Some(Box::new(inner));
        journal
    }

    /// Your instrumentation, if this journal wraps one.
    pub fn inner(&mut self) -> Option<&mut dyn Instrumentation> {
        self.inner.as_deref_mut()
    }

    /// The server this connection's row ids name ([`server_and_rest`]).
    fn server(database: &Option<Database>) -> &str {
        database.as_ref().map_or("", |database| &database.server)
    }

    fn rolled_back(&mut self, depth: u32) {
        // Nothing written here: the shared registry is not touched.
        if self.open.is_empty() {
            return;
        }
        let mut registry = registry();
        let server = Self::server(&self.database);
        self.open.retain(|(row, version)| {
            let Some(entry) = registry.find_mut(row, server, *version) else {
                return false;
            };
            match entry.state {
                State::Open { depth: d, .. } if d >= depth => {
                    entry.state = State::RolledBack;
                    false
                }
                _ => true,
            }
        });
    }

    fn released(&mut self, depth: u32) {
        // Nothing written here: the shared registry is not touched.
        if self.open.is_empty() {
            return;
        }
        let mut registry = registry();
        let server = Self::server(&self.database);
        for (row, version) in &self.open {
            if let Some(Entry {
                state: State::Open { depth: d, .. },
                ..
            }) = registry.find_mut(row, server, *version)
            {
                if *d >= depth {
                    *d = depth - 1;
                }
            }
        }
    }

    fn committed(&mut self) {
        // Nothing written here: the shared registry is not touched.
        if self.open.is_empty() {
            return;
        }
        let mut registry = registry();
        let server = Self::server(&self.database);
        for (row, version) in self.open.drain(..) {
            // Only what this transaction wrote: the rolled-back numbers below
            // stay, since a commit the journal took for one may not have been
            // (a failure it could not see ended the transaction).
            registry.remove(&row, |e| e.version == version && *e.server == *server);
        }
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
            .field("open", &self.open.len())
            .field("wraps", &self.inner.is_some())
            .finish()
    }
}

impl Instrumentation for Journal {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match &event {
            InstrumentationEvent::BeginTransaction { .. } if self.committing => {
                self.committing = false;
                self.committed();
            }
            // The server ended the transaction under a failed statement: the
            // `COMMIT` commits nothing (PostgreSQL answers it with `ROLLBACK`).
            InstrumentationEvent::CommitTransaction { depth, .. }
                if depth.get() == 1 && self.aborts.ended_by.is_some() =>
            {
                self.rolled_back(1);
            }
            InstrumentationEvent::CommitTransaction { depth, .. } => {
                if depth.get() == 1 {
                    self.committing = !self.open.is_empty();
                } else {
                    self.released(depth.get());
                }
            }
            InstrumentationEvent::RollbackTransaction { depth, .. } => {
                self.committing = false;
                self.rolled_back(depth.get());
            }
            InstrumentationEvent::FinishQuery { error, .. } if self.committing => {
                self.committing = false;
                match error {
                    None => self.committed(),
                    // A failed COMMIT did not commit.
                    Some(_) => self.rolled_back(1),
                }
            }
            _ => {}
        }
        self.aborts.on_event(&event);
        if let Some(inner) = &mut self.inner {
            inner.on_connection_event(event);
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // The server rolls back a transaction whose session ends.
        self.rolled_back(1);
        self.aborts.settle();
    }
}

/// What the journal needs from a connection, blocking or async: the
/// instrumentation it lives in, the transaction depth, and an identity.
///
/// Only the hooks differ between the two: Diesel's transaction manager and
/// diesel-async's report `BEGIN`, `COMMIT`, `ROLLBACK` and savepoints to the
/// connection's instrumentation alike, so one [`Journal`] watches both, and
/// what is recorded and which version a struct writes with ([`plan`],
/// [`written`]) is decided here once.
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
                journal.aborts.ended_by = None;
            }
        }
        journal.aborts.ends = rule;
        journal.aborts.guessed = false;
        // Told now, inside the transaction: it may have missed what ended it.
        journal.aborts.missed = journal.aborts.depth > 0 && rule == Ends::OnDeadlock;
    }
    journal.aborts.hides_read_errors = hides_read_errors;
    Some(journal)
}

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
        journal.aborts.ended_by = None;
        journal.aborts.missed = false;
    }
}

/// The journal on `conn` was installed by lockkit's own outermost transaction
/// right after its `BEGIN`: it missed nothing of it.
pub(crate) fn saw_begin<W: Watched>(conn: &mut W) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.missed = false;
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
/// (`ended`: what ended it), after [`unsure`]: the journal is sure again, and
/// a deadlock that ended it is recorded as if seen, so that the rest of
/// lockkit treats it as it treats a statement's ([`ended_by`], [`whole`]), and
/// the versions written in the transaction count as rolled back when it ends.
pub(crate) fn answered<W: Watched>(conn: &mut W, ended: Option<&Error>) {
    if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
        journal.aborts.unsure = false;
        journal.aborts.missed = false;
        if matches!(ended, Some(Error::Deadlock)) && journal.aborts.ended_by.is_none() {
            journal.aborts.ended_by =
                Some((DatabaseErrorKind::Unknown, UNSEEN_DEADLOCK.to_owned()));
        }
    }
}

/// A read of lockkit's own on `conn` returned all its rows: no error can have
/// come in their place, so it leaves the journal as sure as it found it
/// (`was_unsure`, [`unsure`] before the read).
#[cfg_attr(not(feature = "async"), allow(dead_code))] // only diesel-async hides read errors
pub(crate) fn own_read_done<W: Watched>(conn: &mut W, was_unsure: bool) {
    if !was_unsure {
        if let Some(journal) = conn.slot().downcast_mut::<Journal>() {
            journal.aborts.unsure = false;
        }
    }
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

/// Before a write statement of lockkit's that runs in the caller's transaction
/// (a versioned write, [`atomic::update_if`](crate::atomic::update_if)): the
/// journal watches it, so that [`write_ended_transaction`] can tell whether it
/// ended the transaction. Outside a transaction nothing is installed.
pub(crate) fn before_write<W: Watched>(conn: &mut W) {
    if conn.depth().is_some() {
        let _ = journal_of(conn);
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
        journal.aborts.reported.push(aborted.settler());
    }
    Error::TransactionAborted(aborted)
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

/// Whether the table's key is known to be unique on this connection's database.
pub(crate) fn cached_unique_key<W: Watched>(conn: &mut W, table: TypeId) -> Option<bool> {
    journal_of(conn).and_then(|j| j.unique_keys.get(&table).copied())
}

/// What the key check of `table` (its type `declared`) answered: whether the
/// key is unique, which is returned. A journaled connection keeps it, and the
/// schema the check found the table in (empty where the connection's schema
/// is the table's) if its `table!` names none, which [`row_id`] then need not
/// ask; nothing where the connection found no such table (`schema` NULL: one
/// not created yet, whose schema and key are asked again at the next write).
pub(crate) fn key_checked<W: Watched>(
    conn: &mut W,
    declared: TypeId,
    table: &TableName,
    answer: Unique,
) -> bool {
    let unique = answer.unique_key != 0;
    if let (Some(found), Some(journal)) = (answer.schema, journal_of(conn)) {
        journal.unique_keys.insert(declared, unique);
        if table.schema.is_none() {
            journal.schemas.insert(declared, quoted_schema(&found));
        }
    }
    unique
}

/// The schema a connection found a table in, quoted as [`Database::schema`];
/// `None` for an empty answer (the connection's schema).
fn quoted_schema(found: &str) -> Option<String> {
    (!found.is_empty()).then(|| format!("{found:?}"))
}

/// What a connection learned about each table, keyed by the table's type.
/// A `TypeId` is a hash already: it is used as its own (a versioned write in a
/// transaction looks a table up twice).
type ByType<V> = HashMap<TypeId, V, std::hash::BuildHasherDefault<TypeIdHasher>>;

/// Hashes a `TypeId` to the bits it holds.
#[derive(Default)]
struct TypeIdHasher(u64);

impl std::hash::Hasher for TypeIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, bits: u64) {
        self.0 ^= bits;
    }

    // How `TypeId` hashes itself is the standard library's choice: any other
    // write is folded in, byte by byte.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
}

/// The table's name, and the row id without its server ([`server_and_rest`]).
type RowId = (&'static str, String);

/// The database a connection writes to, as its row ids name it.
#[derive(Debug)]
struct Database {
    /// [`DatabaseId::id`], or a name of its own for a database private to
    /// the connection.
    id: String,
    /// [`DatabaseId::server`].
    server: String,
    /// [`DatabaseId::schema`], quoted as [`TableName::quoted_name`].
    schema: String,
    /// [`DatabaseId::attached`]: each attached database's name and file.
    attached: Vec<(String, String)>,
}

/// Splits a row id ([`row_id_with`]) into the server as the connection
/// reached it and the rest: database, schema, table and key.
///
/// One server reached by two paths (a Unix socket and TCP, two addresses)
/// or two nodes of one cluster name the same row with two servers. So what
/// protects a row (a rolled-back number to restore, [`plan`], or to move past,
/// [`reused`]) is looked up by the rest alone, whichever server recorded it,
/// and what forgets an entry (a commit that moved the row past it) only
/// forgets the entries recorded through the same server: a row of another
/// server that shares database, table and key costs at worst a stale report
/// or a version skipped, never a write over another, as long as the two
/// servers' names differ.
fn server_and_rest(row: &str) -> (&str, &str) {
    row.split_once('\0').unwrap_or(("", row))
}

/// Whether a versioned write on `conn` must name its row to the journal: when
/// something is recorded, or the write happens inside a transaction.
pub(crate) fn needs_row_ids<W: Watched>(conn: &mut W) -> bool {
    ENTRIES.load(Ordering::Relaxed) > 0 || conn.depth().is_some()
}

/// The row's identity for the journal: database, schema, table and key
/// (`table`: the schema the model's `table!` names, so that `archive.items` is
/// not the `items` of the connection's schema), or `None` when the write needs
/// none (nothing recorded, no transaction). Only then is `table` asked.
///
/// The database id is read with `fetch` once per journaled connection, at its
/// first versioned write (so that every connection sends the same statements),
/// and on a connection without a journal only when an identity is needed. The
/// schema of a table whose `table!` names none is known to a journaled
/// connection from its key check, at its first versioned write to the table
/// ([`key_checked`]); it is asked with `find` (its name; empty where the
/// connection's schema is every such table's, `None` where it finds no such
/// table: nothing is kept then) where no key check answered it, and without a
/// journal whenever needed.
pub(crate) fn row_id<C: Connection>(
    conn: &mut C,
    declared: TypeId,
    table: impl Fn() -> &'static TableName,
    key: &dyn std::fmt::Debug,
    fetch: impl FnOnce(&mut C) -> diesel::QueryResult<DatabaseId>,
    find: impl FnOnce(&mut C, &str) -> diesel::QueryResult<Option<String>>,
) -> diesel::QueryResult<Option<String>> {
    let fetched = match needs_database_id(conn) {
        true => Some(fetch(conn)?),
        false => None,
    };
    let found = match needs_table_schema(conn, declared, &table) {
        Some(table) => find(conn, &table.name)?,
        None => None,
    };
    Ok(row_id_with(conn, declared, table, key, fetched, found))
}

/// The table whose schema [`row_id_with`] needs read first
/// ([`OptimisticBackend::table_schema_query`](crate::optimistic::backend::OptimisticBackend::table_schema_query)):
/// a table whose `table!` names no schema, on a journaled connection when its
/// key check has not answered it (which it does at the first versioned write
/// to the table, in a transaction or not: what a connection sends must not
/// depend on what other connections recorded), and without a journal whenever
/// an identity is needed.
pub(crate) fn needs_table_schema<W: Watched>(
    conn: &mut W,
    declared: TypeId,
    table: impl FnOnce() -> &'static TableName,
) -> Option<&'static TableName> {
    let needed = needs_row_ids(conn);
    let needed = match journal_of(conn) {
        Some(journal) => !journal.schemas.contains_key(&declared),
        None => needed,
    };
    needed.then(table).filter(|table| table.schema.is_none())
}

/// Whether [`row_id_with`] needs the database id read first: at a journaled
/// connection's first versioned write, and without a journal whenever an
/// identity is needed.
pub(crate) fn needs_database_id<W: Watched>(conn: &mut W) -> bool {
    let needed = needs_row_ids(conn);
    match journal_of(conn) {
        Some(journal) => journal.database.is_none(),
        None => needed,
    }
}

/// [`row_id`] once the database id was read if [`needs_database_id`] said so
/// (`fetched`), and the table's schema if [`needs_table_schema`] did (`found`:
/// empty where the connection's schema is the table's; `None` where it was
/// not asked, or the connection found no such table: the row is then named
/// in the connection's schema, and nothing is kept).
pub(crate) fn row_id_with<W: Watched>(
    conn: &mut W,
    declared: TypeId,
    table: impl FnOnce() -> &'static TableName,
    key: &dyn std::fmt::Debug,
    fetched: Option<DatabaseId>,
    found: Option<String>,
) -> Option<String> {
    let needed = needs_row_ids(conn);
    let found = found.as_deref().map(quoted_schema);
    let row = |database: &Database, found: Option<&str>| {
        let table = table();
        // A table of an attached database (SQLite) is named by the file, as
        // the file's connections name their own tables: schema `main`.
        let attached = table.schema.as_deref().and_then(|schema| {
            // SQLite's schema names ignore case.
            database
                .attached
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(schema))
        });
        let (database_id, schema) = match attached {
            Some((_, file)) => (file.as_str(), "\"main\""),
            None => (
                database.id.as_str(),
                table
                    .quoted_schema
                    .as_deref()
                    .or(found)
                    .unwrap_or(&database.schema),
            ),
        };
        let mut id = String::with_capacity(64);
        id.push_str(&database.server);
        id.push('\0');
        id.push_str(database_id);
        id.push('/');
        id.push_str(schema);
        id.push('.');
        id.push_str(&table.quoted_name);
        id.push('/');
        let _ = write!(id, "{key:?}");
        id
    };
    // A database with no name and no server (SQLite's `:memory:` and
    // temporary databases) is private to its connection: named after it, not
    // after "".
    let private = |database: Option<DatabaseId>, owner: String| {
        database.map(|database| Database {
            id: match database.id.is_empty() && database.server.is_empty() {
                true => format!(":private:{owner}"),
                false => database.id,
            },
            server: database.server,
            schema: format!("{:?}", database.schema),
            attached: database
                .attached
                .split_terminator('\u{1e}')
                .filter_map(|one| one.split_once('\u{1f}'))
                .map(|(name, file)| (name.to_owned(), file.to_owned()))
                .collect(),
        })
    };
    let address = conn.address();
    match journal_of(conn) {
        Some(journal) => {
            if journal.database.is_none() {
                journal.database = private(fetched, format!("journal {}", journal.id));
            }
            if let Some(found) = found {
                journal.schemas.insert(declared, found);
            }
            let found = journal.schemas.get(&declared).and_then(Option::as_deref);
            journal
                .database
                .as_ref()
                .filter(|_| needed)
                .map(|database| row(database, found))
        }
        None => private(fetched, format!("connection {address:#x}"))
            .as_ref()
            .filter(|_| needed)
            .map(|database| row(database, found.flatten().as_deref())),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Written in a transaction still open on the journal `journal`, at `depth`.
    Open { journal: u64, depth: u32 },
    /// Its transaction (or savepoint) rolled back, or its commit failed.
    RolledBack,
    /// Written in a transaction on a connection lockkit cannot watch (identified
    /// by its address), at `depth`, and marked there with the entry's `seq` in
    /// `slot` ([`Mark`]): whether it still stands is asked of that connection
    /// ([`unconfirmed`]); elsewhere, or unasked once that transaction may be
    /// over, it is taken for possibly rolled back.
    Unwatched { conn: usize, depth: u32, slot: u32 },
}

#[derive(Debug)]
struct Entry {
    version: i64,
    /// The version the row had before this write.
    restore: i64,
    /// That version was itself another write's, not committed when this one
    /// was made (written earlier in the same transaction, by this struct or by
    /// another that read it there): a struct holding `version` may carry what
    /// that write changed, so it is never restored, only refused.
    tainted: bool,
    state: State,
    seq: u64,
    /// The server the write went through ([`server_and_rest`]).
    server: Box<str>,
}

impl Entry {
    /// Whether its write did not commit (or may not have), seen from the
    /// connection at `here` (its address and transaction depth).
    fn uncommitted(&self, here: (usize, Option<u32>)) -> bool {
        match self.state {
            State::Open { .. } => false,
            State::RolledBack => true,
            // Still inside the transaction that wrote it, on the same connection.
            State::Unwatched { conn, depth, .. } => {
                !(conn == here.0 && here.1.is_some_and(|now| now >= depth))
            }
        }
    }
}

#[derive(Default)]
struct Registry {
    rows: HashMap<RowId, Vec<Entry>>,
    /// Rows in the order their entries were made, oldest first, for eviction
    /// (an entry removed since is skipped when its turn comes).
    order: std::collections::VecDeque<(u64, RowId)>,
    seq: u64,
    /// How many marks were made through each connection lockkit cannot watch
    /// (by its address), modulo [`Mark::KEPT`]: the next one's slot.
    marks: HashMap<usize, u32>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
/// How many entries the registry holds: the fast path skips it when zero.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Whether a write on a connection lockkit cannot watch was ever recorded:
/// only then do lockkit's own transaction ends look at the registry
/// ([`unwatched_rolled_back`]).
static UNWATCHED: AtomicBool = AtomicBool::new(false);

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves consistent data (every change is one
    // step), so a poisoned lock is used as it is.
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registry {
    fn find_mut(&mut self, row: &RowId, server: &str, version: i64) -> Option<&mut Entry> {
        self.rows
            .get_mut(row)?
            .iter_mut()
            .find(|e| e.version == version && *e.server == *server)
    }

    fn remove(&mut self, row: &RowId, mut doomed: impl FnMut(&Entry) -> bool) {
        if let Some(entries) = self.rows.get_mut(row) {
            let before = entries.len();
            entries.retain(|e| !doomed(e));
            ENTRIES.fetch_sub(before - entries.len(), Ordering::Relaxed);
            if entries.is_empty() {
                self.rows.remove(row);
            }
        }
    }

    /// The slot of the next mark made through the connection at `address`.
    /// Past 4096 addresses the counts start again (a mark may then be
    /// overwritten early: taken for rolled back, the safe side).
    fn next_slot(&mut self, address: usize) -> u32 {
        if self.marks.len() >= 4096 && !self.marks.contains_key(&address) {
            self.marks.clear();
        }
        let made = self.marks.entry(address).or_default();
        let slot = *made;
        *made = (*made + 1) % Mark::KEPT;
        slot
    }

    /// Records `entry` for `row`; its sequence number.
    fn insert(&mut self, row: RowId, mut entry: Entry) -> u64 {
        if ENTRIES.load(Ordering::Relaxed) >= MAX_TENTATIVE {
            self.evict_oldest();
        }
        self.compact();
        self.seq += 1;
        entry.seq = self.seq;
        self.order.push_back((entry.seq, row.clone()));
        let entries = self.rows.entry(row).or_default();
        let before = entries.len();
        entries.retain(|e| e.version != entry.version || e.server != entry.server);
        entries.push(entry);
        let after = entries.len();
        if after > before {
            ENTRIES.fetch_add(after - before, Ordering::Relaxed);
        } else {
            ENTRIES.fetch_sub(before - after, Ordering::Relaxed);
        }
        self.seq
    }

    /// Forgets the oldest entry, unless it belongs to an open transaction (those
    /// go away at its end).
    fn evict_oldest(&mut self) {
        while let Some((seq, row)) = self.order.pop_front() {
            let state = self
                .rows
                .get(&row)
                .and_then(|entries| entries.iter().find(|e| e.seq == seq))
                .map(|e| e.state);
            match state {
                None => continue, // removed since
                Some(State::Open { .. }) => {
                    self.order.push_front((seq, row));
                    return;
                }
                Some(_) => {
                    tracing::warn!(target: "lockkit", table = row.0, key = %row.1,
                        "forgetting a rolled-back version: more than {MAX_TENTATIVE} are remembered");
                    self.remove(&row, |e| e.seq == seq);
                    return;
                }
            }
        }
    }

    /// Drops the queue's slots of entries removed since, when they outnumber
    /// the live ones.
    fn compact(&mut self) {
        let live = ENTRIES.load(Ordering::Relaxed);
        if self.order.len() > 2 * live.max(1024) {
            let rows = &self.rows;
            self.order.retain(|(seq, row)| {
                rows.get(row)
                    .is_some_and(|entries| entries.iter().any(|e| e.seq == *seq))
            });
        }
    }
}

/// How to run a versioned write whose struct holds `expected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// As usual: check `expected`.
    Write,
    /// `expected` (`tentative`) was written in a transaction that did not commit
    /// (or may not have): check the version the row had before it, `restore`.
    Restore { restore: i64, tentative: i64 },
    /// `expected` (`tentative`) was written in a transaction that did not
    /// commit, from a version another uncommitted write left: what the struct
    /// holds may rest on that write, and lockkit cannot tell which struct made
    /// it. Nothing is sent but the follow-up read: the struct is stale.
    Refuse { tentative: i64 },
}

/// Decides how to write `row` from a struct holding `expected`.
pub(crate) fn plan<W: Watched>(
    conn: &mut W,
    table: &'static str,
    row: Option<&str>,
    expected: i64,
) -> Plan {
    let Some(row) = row else {
        return Plan::Write;
    };
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return Plan::Write;
    }
    // Whichever server recorded it.
    let row = (table, server_and_rest(row).1.to_owned());
    let here = (conn.address(), conn.depth());
    let registry = registry();
    let Some(entries) = registry.rows.get(&row) else {
        return Plan::Write;
    };
    let uncommitted = |e: &Entry| e.uncommitted(here);
    // Two servers' entries may hold the same number (two writes through two
    // paths, neither of which saw the other's yet): any one that did not
    // commit decides, a tainted one first.
    let held = |e: &&Entry| e.version == expected && uncommitted(e);
    if entries.iter().filter(held).any(|e| e.tainted) {
        return Plan::Refuse {
            tentative: expected,
        };
    }
    match entries.iter().find(held) {
        Some(entry) => {
            let mut restore = entry.restore;
            while let Some(earlier) = entries
                .iter()
                .find(|e| e.version == restore && uncommitted(e))
            {
                restore = earlier.restore;
            }
            Plan::Restore {
                restore,
                tentative: expected,
            }
        }
        None => Plan::Write,
    }
}

/// Whether a write that just moved `row` to `to` gave it a number that a
/// rolled-back write left with some struct: that struct's next write would
/// expect `to`, match, and land over this one. The struct may be this write's
/// own, restored past it, but also any copy of it (a clone made after the
/// rollback holds the same number, and the journal cannot tell them apart).
/// The caller moves the row past it (`SET v = v + 1 WHERE v = $to`, data
/// untouched) and hands its struct the number after, so that no rolled-back
/// number is ever committed.
pub(crate) fn reused<W: Watched>(
    conn: &mut W,
    table: &'static str,
    row: Option<&str>,
    to: i64,
) -> bool {
    let Some(row) = row else {
        return false;
    };
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return false;
    }
    // Another connection's write of `to` still marked open did not commit
    // either: this write found the row below `to`. (Its rollback may simply
    // not have been reported yet: the server released the row first.)
    let mine = conn
        .slot()
        .downcast_mut::<Journal>()
        .map(|journal| journal.id);
    let elsewhere =
        |e: &Entry| matches!(e.state, State::Open { journal, .. } if Some(journal) != mine);
    let here = (conn.address(), conn.depth());
    let registry = registry();
    // Whichever server recorded it.
    let Some(entries) = registry
        .rows
        .get(&(table, server_and_rest(row).1.to_owned()))
    else {
        return false;
    };
    // An unwatched entry at `to` cannot be of the open transaction, whatever the
    // connection and depth say: this write found the row below `to`, so the
    // write of `to` was undone (a rollback lockkit did not see).
    let unwatched = |e: &Entry| matches!(e.state, State::Unwatched { .. });
    entries
        .iter()
        .any(|e| e.version == to && (e.uncommitted(here) || elsewhere(e) || unwatched(e)))
}

/// lockkit rolled back one of its own transactions (or savepoints) on the
/// connection at `address`, opened at depth `level` (1: the outermost): what
/// the journal of a connection with instrumentation of its own cannot see,
/// lockkit's transaction plumbing tells it for the transactions it runs. The
/// versions written on that connection at `level` or deeper did not commit.
/// (One written in an earlier transaction there that did commit is taken for
/// rolled back too: its struct may be reported stale, the safe side.) Nothing
/// to do unless such a connection ever wrote a versioned row.
pub(crate) fn unwatched_rolled_back(address: usize, level: u32) {
    if !UNWATCHED.load(Ordering::Relaxed) || ENTRIES.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut registry = registry();
    for entry in registry.rows.values_mut().flatten() {
        if matches!(entry.state, State::Unwatched { conn, depth, .. } if conn == address && depth >= level)
        {
            entry.state = State::RolledBack;
        }
    }
}

/// After a versioned write moved `row` from `from` to `to` (`None`: deleted):
/// forgets what can no longer recur and, inside a transaction, records `to` as
/// tentative. On a connection lockkit cannot watch, the [`Mark`] its caller
/// sends in the same transaction, so that what became of the write can be
/// asked later ([`unconfirmed`]).
pub(crate) fn written<W: Watched>(
    conn: &mut W,
    table: &'static str,
    row: Option<&str>,
    from: i64,
    to: Option<i64>,
) -> Option<Mark> {
    let row = row?;
    let depth = conn.depth();
    if ENTRIES.load(Ordering::Relaxed) == 0 && (depth.is_none() || to.is_none()) {
        return None;
    }
    let (server, rest) = server_and_rest(row);
    let row = (table, rest.to_owned());
    let through = |e: &Entry| *e.server == *server;
    // A restored write's rolled-back numbers stay recorded: copies of its
    // struct hold them too. They go once a write outside a transaction moves
    // the row past them.
    let Some(to) = to else {
        // Deleted: nothing can match the row again, once the delete commits. A
        // delete inside a transaction may still be rolled back, with the row
        // and the rolled-back versions other structs hold: those stay.
        if depth.is_none() {
            registry().remove(&row, through);
        }
        return None;
    };
    let Some(depth) = depth else {
        // Committed: versions only grow, so a number below the row's can never
        // match again.
        registry().remove(&row, |e| {
            through(e) && e.version < to && !matches!(e.state, State::Open { .. })
        });
        return None;
    };
    // The journal that watches the transaction, or the address of the
    // connection none watches.
    let watcher = match journal_of(conn) {
        Some(journal) => {
            journal.open.push((row.clone(), to));
            Ok(journal.id)
        }
        None => {
            UNWATCHED.store(true, Ordering::Relaxed);
            Err(conn.address())
        }
    };
    let mut registry = registry();
    let (state, slot) = match watcher {
        Ok(journal) => (State::Open { journal, depth }, None),
        Err(conn) => {
            let slot = registry.next_slot(conn);
            (State::Unwatched { conn, depth, slot }, Some(slot))
        }
    };
    let tainted = registry.rows.get(&row).is_some_and(|entries| {
        entries
            .iter()
            .any(|e| through(e) && e.version == from && !matches!(e.state, State::RolledBack))
    });
    let seq = registry.insert(
        row,
        Entry {
            version: to,
            restore: from,
            tainted,
            state,
            seq: 0,
            server: server.into(),
        },
    );
    slot.map(|slot| Mark {
        id: seq as i64,
        slot,
    })
}

/// Before a write of `row` from a struct holding `expected`: the mark of the
/// write that gave the struct its number, when lockkit cannot tell whether it
/// still stands, since it was made on this connection (which lockkit cannot
/// watch) in a transaction that may be the open one or an earlier one. The
/// caller asks the server whether the mark stands
/// ([`OptimisticBackend::mark_stands`](crate::optimistic::backend::OptimisticBackend::mark_stands))
/// and tells [`confirmed`].
pub(crate) fn unconfirmed<W: Watched>(
    conn: &mut W,
    table: &'static str,
    row: Option<&str>,
    expected: i64,
) -> Option<Mark> {
    let row = row?;
    if !UNWATCHED.load(Ordering::Relaxed) || ENTRIES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let here = conn.address();
    let registry = registry();
    registry
        .rows
        .get(&(table, server_and_rest(row).1.to_owned()))?
        .iter()
        .find_map(|e| match e.state {
            State::Unwatched { conn, slot, .. } if conn == here && e.version == expected => {
                Some(Mark {
                    id: e.seq as i64,
                    slot,
                })
            }
            _ => None,
        })
}

/// The server answered whether the mark `mark` stands on `conn`
/// ([`unconfirmed`]). It does not: its write was rolled back, with its
/// transaction or savepoint. It does: its write stands, committed (outside a
/// transaction now, it is forgotten as a commit forgets) or in the open
/// transaction (at the depth the connection is at now, or above).
pub(crate) fn confirmed<W: Watched>(
    conn: &mut W,
    table: &'static str,
    row: &str,
    mark: Mark,
    stands: bool,
) {
    let depth = conn.depth();
    let row = (table, server_and_rest(row).1.to_owned());
    let mut registry = registry();
    let ours = |e: &Entry| e.seq as i64 == mark.id;
    if stands && depth.is_none() {
        registry.remove(&row, ours);
        return;
    }
    let Some(entry) = registry
        .rows
        .get_mut(&row)
        .and_then(|entries| entries.iter_mut().find(|e| ours(e)))
    else {
        return;
    };
    match (&mut entry.state, depth) {
        (State::Unwatched { depth, .. }, Some(now)) if stands => *depth = (*depth).min(now),
        (state, _) if !stands => *state = State::RolledBack,
        _ => {}
    }
}

/// After a write planned as [`Plan::Restore`] found the row elsewhere: forgets
/// the tentative versions at or below what the row holds now.
pub(crate) fn forget_through(table: &'static str, row: &str, current: i64) {
    if ENTRIES.load(Ordering::Relaxed) > 0 {
        let (server, rest) = server_and_rest(row);
        registry().remove(&(table, rest.to_owned()), |e| {
            *e.server == *server && e.version <= current && !matches!(e.state, State::Open { .. })
        });
    }
}

/// Whether a write planned as `plan` that matched no row found the row at the
/// very number a rolled-back write gave the struct (`current`): somebody wrote
/// it again, and the struct cannot be told from them. The caller moves the row
/// past it (`SET v = v + 1 WHERE v = $n`) so that neither writes on a guess.
pub(crate) fn must_move_past(plan: Plan, current: i64) -> bool {
    matches!(plan, Plan::Restore { tentative, .. } | Plan::Refuse { tentative } if tentative == current)
}

/// After a write planned as `plan` was found stale, the row at `current`
/// (after the move past, if any): outside a transaction what was read (and
/// moved) is committed, so the rolled-back numbers at or below it can never
/// match again.
pub(crate) fn found_stale<W: Watched>(
    conn: &mut W,
    table: &'static str,
    row: Option<&str>,
    plan: Plan,
    current: crate::error::CurrentState,
) {
    if let (
        Plan::Restore { .. } | Plan::Refuse { .. },
        crate::error::CurrentState::Version(current),
        Some(row),
    ) = (plan, current, row)
    {
        if conn.depth().is_none() {
            forget_through(table, row, current);
        }
    }
}
