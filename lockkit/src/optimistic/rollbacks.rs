//! What the versioned writes record in the [`journal`](crate::journal): the
//! versions they wrote inside transactions, so that a struct holding one that
//! did not commit never writes over somebody else's row. The rules it keeps are
//! the journal's docs' (rules 1 to 4); here is where each is decided:
//!
//! * [`plan`]: how a struct writes (as usual, restored, or refused);
//! * [`reused`]: whether a write gave the row a number a rolled-back write left
//!   with some struct, so that the row is moved past it;
//! * [`written`], [`confirmed`], [`forget_through`], [`found_stale`]: what is
//!   recorded, and forgotten, after a write;
//! * [`unconfirmed`]: a write's [`Mark`] to ask about, on a connection no
//!   journal watches;
//! * [`row_id`]: how a row is named, and what a connection keeps to name it
//!   ([`Versions`]).
//!
//! The record is per process ([`MAX_TENTATIVE`] entries at most); what each
//! connection wrote in its open transaction is kept in its journal
//! ([`Versions`]), which tells it how the transaction ended.

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

use crate::optimistic::backend::{DatabaseId, Unique};
use crate::optimistic::mark::Mark;
use crate::optimistic::table::TableName;
use crate::transaction::journal::{self, End, Journal, Record, Watched, MAX_TENTATIVE};
use diesel::Connection;

/// What the journal of a connection keeps for its versioned writes: the
/// versions written in its open transaction, and what the connection learned
/// to name its rows.
#[derive(Debug)]
pub(crate) struct Versions {
    /// This record's number, unique in the process: whose open transaction
    /// an entry is of ([`State::Open`]).
    id: u64,
    /// Versions this connection wrote in its open transaction.
    open: Vec<(RowId, i64)>,
    /// Rows whose versions a write of lockkit's moved in the open transaction
    /// without a number it knows ([`moved_unnumbered`]).
    unnumbered: Vec<RowId>,
    /// Whether each table's declared key is unique in this connection's database.
    /// Keyed by the table's type: two tables may share a name.
    unique_keys: ByType<bool>,
    /// The schema each table written without one is found in, quoted as
    /// [`Database::schema`] (`None`: the connection's). Keyed by the table's type.
    schemas: ByType<Option<String>>,
    /// The database this connection writes to, and its schema.
    database: Option<Database>,
}

impl Default for Versions {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Versions {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            open: Vec::new(),
            unnumbered: Vec::new(),
            unique_keys: ByType::default(),
            schemas: ByType::default(),
            database: None,
        }
    }
}

impl Versions {
    /// The server this connection's row ids name ([`server_and_rest`]).
    fn server(database: &Option<Database>) -> &str {
        database.as_ref().map_or("", |database| &database.server)
    }

    fn rolled_back(&mut self, depth: u32) {
        if depth <= 1 {
            self.unnumbered.clear();
        }
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
        self.unnumbered.clear();
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

impl Record for Versions {
    fn ended(&mut self, end: End) {
        match end {
            End::Committed => self.committed(),
            End::Released { depth } => self.released(depth),
            End::RolledBack { depth } => self.rolled_back(depth),
        }
    }
}

impl Drop for Versions {
    fn drop(&mut self) {
        // The server rolls back a transaction whose session ends.
        self.rolled_back(1);
    }
}

/// The record in the journal watching `conn` (installed if the connection
/// has no instrumentation); `None` if it has instrumentation of its own.
fn versions_of<W: Watched>(conn: &mut W) -> Option<&mut Versions> {
    journal::journal_of(conn).map(Journal::record::<Versions>)
}

/// Whether the table's key is known to be unique on this connection's database.
pub(crate) fn cached_unique_key<W: Watched>(conn: &mut W, table: TypeId) -> Option<bool> {
    versions_of(conn).and_then(|j| j.unique_keys.get(&table).copied())
}

/// What a write that asks the key check after its statement
/// (`Versioned::update_if`) goes by: the answer the connection keeps, `None`
/// when it has not asked yet, and `Some(false)` (write in a savepoint, ask
/// nothing) on a connection with instrumentation of its own, which keeps none.
pub(crate) fn known_unique_key<W: Watched>(conn: &mut W, table: TypeId) -> Option<bool> {
    match versions_of(conn) {
        Some(versions) => versions.unique_keys.get(&table).copied(),
        None => Some(false),
    }
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
    if let (Some(found), Some(versions)) = (answer.schema, versions_of(conn)) {
        versions.unique_keys.insert(declared, unique);
        if table.schema.is_none() {
            versions.schemas.insert(declared, quoted_schema(&found));
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

/// The version column's name, and the row id without its server
/// ([`server_and_rest`]). The row id names the table as the database knows it,
/// so that two `table!` declarations of one table (two Rust names, one
/// `sql_name`) name its rows alike.
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
/// not the `items` of the connection's schema; `key` as its type prints it, so
/// two spellings the database compares equal, under a case-insensitive
/// collation or `char(n)` padding, name two rows here: a limit the README
/// states), or `None` when the write needs
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
    let unread = unread(conn, declared, &table);
    let fetched = match unread.database {
        true => Some(fetch(conn)?),
        false => None,
    };
    let found = match unread.schema {
        Some(table) => find(conn, &table.name)?,
        None => None,
    };
    Ok(row_id_with(conn, declared, table, key, fetched, found))
}

/// What [`row_id_with`] needs read first ([`unread`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unread {
    /// The database id ([`OptimisticBackend::DATABASE_ID`](crate::optimistic::backend::OptimisticBackend::DATABASE_ID)):
    /// at a journaled connection's first versioned write, and without a
    /// journal whenever an identity is needed.
    pub(crate) database: bool,
    /// The table whose schema
    /// ([`OptimisticBackend::table_schema_query`](crate::optimistic::backend::OptimisticBackend::table_schema_query))
    /// is to be read: a table whose `table!` names no schema, on a journaled
    /// connection when its key check has not answered it (which it does at the
    /// first versioned write to the table, in a transaction or not: what a
    /// connection sends must not depend on what other connections recorded),
    /// and without a journal whenever an identity is needed.
    pub(crate) schema: Option<&'static TableName>,
}

/// What [`row_id_with`] needs read first on `conn`, for the table of type
/// `declared` (`table`: its name, asked only for a schema to read).
pub(crate) fn unread<W: Watched>(
    conn: &mut W,
    declared: TypeId,
    table: impl FnOnce() -> &'static TableName,
) -> Unread {
    let needed = needs_row_ids(conn);
    let (database, schema) = match versions_of(conn) {
        Some(versions) => (
            versions.database.is_none(),
            !versions.schemas.contains_key(&declared),
        ),
        None => (needed, needed),
    };
    Unread {
        database,
        schema: schema.then(table).filter(|table| table.schema.is_none()),
    }
}

/// [`row_id`] once what [`unread`] named was read: the database id
/// (`fetched`), and the table's schema (`found`:
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
    match versions_of(conn) {
        Some(versions) => {
            if versions.database.is_none() {
                versions.database = private(fetched, format!("journal {}", versions.id));
            }
            if let Some(found) = found {
                versions.schemas.insert(declared, found);
            }
            let found = versions.schemas.get(&declared).and_then(Option::as_deref);
            versions
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
    /// Whether it records an undone move past from `from` to `to` through
    /// `server`: rolled back, untainted ([`only_an_undone_move`],
    /// [`moved_again`]).
    fn undone_move(&self, server: &str, from: i64, to: i64) -> bool {
        *self.server == *server
            && self.version == to
            && self.restore == from
            && !self.tainted
            && matches!(self.state, State::RolledBack)
    }

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
                    tracing::warn!(target: "lockkit", column = row.0, row = %row.1,
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

/// Looks at the entries recorded for the version `column` of `row`, whichever
/// server recorded them ([`server_and_rest`]): `None` where the write names no
/// row, or nothing is recorded for it. What `look` needs of the connection (`ask`) is
/// asked before the registry is locked, so that nothing the connection does
/// can wait for the registry while it is held.
fn recorded<W: Watched, A, T>(
    conn: &mut W,
    column: &'static str,
    row: Option<&str>,
    ask: impl FnOnce(&mut W) -> A,
    look: impl FnOnce(&[Entry], A) -> T,
) -> Option<T> {
    let row = row?;
    if ENTRIES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let asked = ask(conn);
    let registry = registry();
    let entries = registry
        .rows
        .get(&(column, server_and_rest(row).1.to_owned()))?;
    Some(look(entries, asked))
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
    column: &'static str,
    row: Option<&str>,
    expected: i64,
) -> Plan {
    let here = |conn: &mut W| (conn.address(), conn.depth());
    recorded(conn, column, row, here, |entries, here| {
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
        let Some(entry) = entries.iter().find(held) else {
            return Plan::Write;
        };
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
    })
    .unwrap_or(Plan::Write)
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
    column: &'static str,
    row: Option<&str>,
    to: i64,
) -> bool {
    let ask = |conn: &mut W| {
        let mine = conn
            .slot()
            .downcast_mut::<Journal>()
            .and_then(Journal::existing_record::<Versions>)
            .map(|versions| versions.id);
        (mine, (conn.address(), conn.depth()))
    };
    recorded(conn, column, row, ask, |entries, (mine, here)| {
        // Another connection's write of `to` still marked open did not commit
        // either: this write found the row below `to`. (Its rollback may simply
        // not have been reported yet: the server released the row first.)
        let elsewhere =
            |e: &Entry| matches!(e.state, State::Open { journal, .. } if Some(journal) != mine);
        // An unwatched entry at `to` cannot be of the open transaction, whatever
        // the connection and depth say: this write found the row below `to`, so
        // the write of `to` was undone (a rollback lockkit did not see).
        let unwatched = |e: &Entry| matches!(e.state, State::Unwatched { .. });
        entries
            .iter()
            .any(|e| e.version == to && (e.uncommitted(here) || elsewhere(e) || unwatched(e)))
    })
    .unwrap_or(false)
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

/// Whether `conn` is in a transaction its journal watches: only there does a
/// write lockkit cannot number ([`moved_unnumbered`]) need recording.
pub(crate) fn in_watched_transaction<W: Watched>(conn: &mut W) -> bool {
    conn.depth().is_some() && versions_of(conn).is_some()
}

/// A write of lockkit's moved the version `column` of the row `row` on `conn`,
/// in a transaction its journal watches
/// ([`in_watched_transaction`]), without a number lockkit knows
/// (`Versioned::update_if`: `SET v = v + 1`, no read). A versioned write of
/// that row later in the transaction writes from a number the transaction
/// made: [`written`] records it tainted, never restored after a rollback. Kept
/// until the outermost transaction ends.
///
/// The caller then reads the number the write left and records it with
/// [`written`], tainted by this: a struct read after the write in the
/// transaction holds that number, which exists only there.
pub(crate) fn moved_unnumbered<W: Watched>(conn: &mut W, column: &'static str, row: &str) {
    let row = (column, server_and_rest(row).1.to_owned());
    if let Some(versions) = versions_of(conn) {
        if !versions.unnumbered.contains(&row) {
            versions.unnumbered.push(row);
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
    column: &'static str,
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
    let row = (column, rest.to_owned());
    let through = |e: &Entry| *e.server == *server;
    // A restored write's rolled-back numbers stay recorded: copies of its
    // struct hold them too. They go once a write outside a transaction moves
    // the row past them.
    let Some(to) = to else {
        // Deleted at `from`. Inside a transaction the delete may still be
        // rolled back, with the row and the rolled-back versions other
        // structs hold: those stay. Committed, the numbers up to `from` go,
        // as after a write to `from + 1`; the ones past it stay: a row
        // inserted again "with a version past the old one" (the README's
        // advice) may take exactly the number a rolled-back write left.
        if depth.is_none() {
            registry().remove(&row, |e| {
                through(e) && e.version <= from && !matches!(e.state, State::Open { .. })
            });
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
    let mut unnumbered = false;
    let watcher = match versions_of(conn) {
        Some(versions) => {
            versions.open.push((row.clone(), to));
            unnumbered = versions.unnumbered.contains(&row);
            Ok(versions.id)
        }
        None => {
            // Installed before any entry of such a connection is recorded, so
            // that the rollback of whichever transaction holds one is heard.
            journal::on_unwatched_rollback(unwatched_rolled_back);
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
    // `from` is a number no commit may hold: another uncommitted write's, or
    // one this transaction made. It did if it wrote the row before (whatever
    // moved the version since: a trigger's bump of a plain `UPDATE` after
    // `with_lock`'s), or moved it by a write lockkit cannot number. After a
    // rollback, the row is back below `from`, and the next commit, in any
    // process, may make `from` again: such a struct is never restored to it.
    let mine = watcher.ok();
    let tainted = unnumbered
        || registry.rows.get(&row).is_some_and(|entries| {
            entries.iter().any(|e| {
                through(e)
                    && ((e.version == from && !matches!(e.state, State::RolledBack))
                        || matches!(e.state, State::Open { journal, .. } if Some(journal) == mine))
            })
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

/// [`written`] for a write sent in a transaction whose answer never came (an
/// async write dropped with its statement in flight, which PostgreSQL still
/// runs): recorded, unless the journal already holds `to` for the row. That
/// number is then one a rolled-back write left with some struct, which a write
/// that finished would have moved the row past, or another transaction's open
/// write of the row (whose lock this write was waiting for): a record would
/// replace the entry that keeps that struct refused, and a commit would forget
/// it. Left as it is: two connections' writes of one row both dropped in flight
/// share the entry of the first.
#[cfg(feature = "async")]
pub(crate) fn written_unanswered<W: Watched>(
    conn: &mut W,
    column: &'static str,
    row: &str,
    from: i64,
    to: i64,
) {
    let (server, rest) = server_and_rest(row);
    let id = (column, rest.to_owned());
    let known = registry().rows.get(&id).is_some_and(|entries| {
        entries
            .iter()
            .any(|e| *e.server == *server && e.version == to)
    });
    if !known {
        let _ = written(conn, column, Some(row), from, Some(to));
    }
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
    column: &'static str,
    row: Option<&str>,
    expected: i64,
) -> Option<Mark> {
    if !UNWATCHED.load(Ordering::Relaxed) {
        return None;
    }
    recorded(conn, column, row, W::address, |entries, here| {
        entries.iter().find_map(|e| match e.state {
            State::Unwatched { conn, slot, .. } if conn == here && e.version == expected => {
                Some(Mark {
                    id: e.seq as i64,
                    slot,
                })
            }
            _ => None,
        })
    })
    .flatten()
}

/// The server answered whether the mark `mark` stands on `conn`
/// ([`unconfirmed`]). It does not: its write was rolled back, with its
/// transaction or savepoint. It does: its write stands, committed (outside a
/// transaction now, it is forgotten as a commit forgets) or in the open
/// transaction (at the depth the connection is at now, or above).
pub(crate) fn confirmed<W: Watched>(
    conn: &mut W,
    column: &'static str,
    row: &str,
    mark: Mark,
    stands: bool,
) {
    let depth = conn.depth();
    let row = (column, server_and_rest(row).1.to_owned());
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

/// After the row was moved past `version` outside a transaction: forgets the
/// tentative versions at or below it, which the row can never hold again.
pub(crate) fn forget_through(column: &'static str, row: &str, version: i64) {
    forget(column, row, |v| v <= version);
}

/// The entries of the row `row` at `to` that count as a number a rolled-back
/// write left ([`reused`]) all record one undone move past, from `from` to
/// `to` (a stale report's, [`sequence`]): a redo of that move, which lands
/// the row on `to` again with the data it had at `from`, need not move it on.
/// A struct read after the undone move holds `to` with that data (its write
/// may match); one written after it is tainted, and stays refused.
///
/// [`sequence`]: crate::optimistic::sequence
pub(crate) fn only_an_undone_move<W: Watched>(
    conn: &mut W,
    column: &'static str,
    row: &str,
    from: i64,
    to: i64,
) -> bool {
    let server = server_and_rest(row).0.to_owned();
    recorded(
        conn,
        column,
        Some(row),
        |_| (),
        |entries, ()| {
            let mut at_to = entries
                .iter()
                .filter(|e| *e.server == *server && e.version == to)
                .peekable();
            at_to.peek().is_some() && at_to.all(|e| e.undone_move(&server, from, to))
        },
    )
    .unwrap_or(false)
}

/// Once a redo of an undone move past (from `from` to `to`, the row `row`)
/// committed: forgets the entry that recorded the undone move
/// ([`only_an_undone_move`]), whose number the row holds again with the data
/// it recorded. Called only after the commit is known, so that a redo that
/// did not commit leaves the entry, and a struct holding `to` refused.
pub(crate) fn moved_again(column: &'static str, row: &str, from: i64, to: i64) {
    if ENTRIES.load(Ordering::Relaxed) > 0 {
        let (server, rest) = server_and_rest(row);
        registry().remove(&(column, rest.to_owned()), |e| {
            e.undone_move(server, from, to)
        });
    }
}

/// Forgets the tentative versions of `row` that `doomed` names, but those of
/// open transactions, as recorded through the server `row` names.
fn forget(column: &'static str, row: &str, doomed: impl Fn(i64) -> bool) {
    if ENTRIES.load(Ordering::Relaxed) > 0 {
        let (server, rest) = server_and_rest(row);
        registry().remove(&(column, rest.to_owned()), |e| {
            *e.server == *server && doomed(e.version) && !matches!(e.state, State::Open { .. })
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
/// moved) is committed, so the rolled-back numbers below it can never match
/// again. One at `current` itself stays: the row holds that number, committed
/// by a writer lockkit did not see (another process, raw SQL), and the struct
/// that holds it from a rolled-back write, another than this one, must still
/// be refused (its write restores, and finds the row at its number:
/// [`must_move_past`]).
pub(crate) fn found_stale<W: Watched>(
    conn: &mut W,
    column: &'static str,
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
            forget(column, row, |v| v < current);
        }
    }
}
