//! What a lockkit transaction gathers while its closure runs, for the moment it
//! ends: the work queued with [`after_commit`](crate::after_commit) and the locks
//! taken in it, whose hold time is measured from the lock to the end of the
//! outermost transaction.
//!
//! The scopes open on a thread form a stack; each belongs to one connection
//! (told apart by its address, stable while the transaction borrows it). A nested
//! scope (a savepoint) hands what it gathered to the scope around it on the same
//! connection: the work only if the savepoint was released, the locks always
//! (lockkit measures up to the end of the outermost transaction in every case,
//! also where a rollback to the savepoint released the row locks, as PostgreSQL
//! does: there the hold time measured runs past the lock's end). The
//! outermost scope runs the work after `COMMIT` and records the hold times after
//! `COMMIT` or `ROLLBACK`.

use std::cell::RefCell;
use std::time::Instant;

/// Work to run after the outermost transaction commits.
pub(crate) type Work = Box<dyn FnOnce()>;

/// A lock taken inside a scope.
struct Held {
    kind: &'static str,
    table: &'static str,
    /// Formatted only when something may name it (see the [module docs](self)).
    key: Option<String>,
    since: Instant,
}

/// One lockkit transaction in progress on this thread.
pub(crate) struct Scope {
    conn: usize,
    outermost: bool,
    work: Vec<Work>,
    held: Vec<Held>,
}

thread_local! {
    static SCOPES: RefCell<Vec<Scope>> = const { RefCell::new(Vec::new()) };
    /// Emptied lists of ended scopes, kept for the next ones.
    static SPARE: RefCell<Vec<Vec<Held>>> = const { RefCell::new(Vec::new()) };
}

/// At most this many emptied lists are kept per thread (one per nesting level),
/// each with room for at most [`SPARE_ROOM`] locks.
const SPARE_LISTS: usize = 8;
const SPARE_ROOM: usize = 64;

/// A connection's identity while it is borrowed: its address.
pub(crate) fn conn_id<C: ?Sized>(conn: &C) -> usize {
    std::ptr::from_ref(conn).cast::<u8>() as usize
}

/// Opens the scope of a transaction on `conn` (`outermost` when no transaction
/// was open before it).
pub(crate) fn enter(conn: usize, outermost: bool) {
    let held = SPARE.with_borrow_mut(Vec::pop).unwrap_or_default();
    SCOPES.with_borrow_mut(|scopes| {
        scopes.push(Scope {
            conn,
            outermost,
            work: Vec::new(),
            held,
        });
    });
}

/// Closes the innermost scope, which `enter` opened, and returns it.
pub(crate) fn leave() -> Option<Scope> {
    SCOPES.with_borrow_mut(Vec::pop)
}

/// Queues `work` in the innermost scope on `conn`, if the outermost transaction
/// on `conn` is lockkit's (only then does lockkit see the `COMMIT` that must come
/// first); hands `work` back otherwise.
pub(crate) fn queue(conn: usize, work: Work) -> Result<(), Work> {
    SCOPES.with_borrow_mut(|scopes| {
        let mut on_conn = scopes.iter_mut().filter(|scope| scope.conn == conn);
        match on_conn.next() {
            Some(first) if first.outermost => {
                let innermost = on_conn.last().unwrap_or(first);
                innermost.work.push(work);
                Ok(())
            }
            _ => Err(work),
        }
    })
}

/// Notes a lock taken on `conn` at `since`, if a lockkit transaction is open on it.
pub(crate) fn hold(
    conn: usize,
    kind: &'static str,
    table: &'static str,
    key: impl FnOnce() -> String,
    since: Instant,
) {
    SCOPES.with_borrow_mut(|scopes| {
        if let Some(scope) = scopes.iter_mut().rev().find(|scope| scope.conn == conn) {
            scope.held.push(Held {
                kind,
                table,
                key: named(key),
                since,
            });
        }
    });
}

/// A held lock's key, formatted only when its release may be reported with it:
/// a hold warning is set, or `tracing` is on at `TRACE` for lockkit.
pub(crate) fn named(key: impl FnOnce() -> String) -> Option<String> {
    let named = crate::metrics::hold_warning().is_some()
        || tracing::enabled!(target: "lockkit", tracing::Level::TRACE);
    named.then(key)
}

/// Keeps an emptied list for the next scope on this thread.
fn spare(mut held: Vec<Held>) {
    held.clear();
    if (1..=SPARE_ROOM).contains(&held.capacity()) {
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_LISTS {
                spare.push(held);
            }
        });
    }
}

impl Scope {
    /// Ends the scope after its transaction (or savepoint) committed or rolled
    /// back: see the [module docs](self).
    pub(crate) fn end(self, committed: bool) {
        let Scope {
            conn,
            outermost,
            work,
            mut held,
        } = self;
        if !outermost {
            SCOPES.with_borrow_mut(|scopes| {
                if let Some(outer) = scopes.iter_mut().rev().find(|scope| scope.conn == conn) {
                    if committed {
                        outer.work.extend(work);
                    }
                    outer.held.append(&mut held);
                }
            });
            spare(held);
            return;
        }
        if !held.is_empty() {
            // One clock read for every lock the transaction held.
            let now = Instant::now();
            for lock in held.drain(..) {
                crate::metrics::record_lock_held(
                    lock.kind,
                    lock.table,
                    lock.key.as_deref(),
                    now.saturating_duration_since(lock.since),
                );
            }
        }
        spare(held);
        if committed {
            // Outside the thread-local's borrow: the work may open transactions.
            for work in work {
                work();
            }
        }
    }
}
