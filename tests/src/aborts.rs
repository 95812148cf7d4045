//! What a deadlock whose victim is a lockkit call nested in the caller's
//! transaction leaves behind, per backend: PostgreSQL rolls back to the
//! savepoint, InnoDB rolls back the whole transaction. Shared by the blocking
//! (`tests/lock_errors.rs`) and the async (`tests/async_lock_errors.rs`) cases,
//! which read `stock` (item 1, seeded with 10) and `lines` (order lines)
//! from a new connection.

use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use diesel::Connection;
use lockkit::Error;

use crate::exec;

/// The rows [`heavier_neighbour`] works on: items 1 to 12 at stock 10 (it
/// changes 3 and up, so that InnoDB picks the other side as the victim).
pub fn seed_for_deadlock<C: Connection>(conn: &mut C) {
    crate::seed_items(conn, &(1..=12).map(|id| (id, 10)).collect::<Vec<_>>());
}

/// Records order line `id` (no item, one unit) as the caller's own code does
/// in its transaction: the write whose fate an abort decides, its error
/// classified. Sent as plain SQL (`batch_execute`): Diesel's MySQL connection
/// gives such a statement's error no kind, where it names a prepared
/// statement's (1792, a `READ ONLY` transaction, among them), so the two are
/// not interchangeable in these cases.
pub fn order_line<C: Connection>(conn: &mut C, id: i32) -> Result<(), Error> {
    let sql = format!("INSERT INTO orders (id, item_id, qty) VALUES ({id}, NULL, 1)");
    conn.batch_execute(&sql).map_err(lockkit::classify)
}

/// The heavier side of a provoked deadlock, on its own connection `conn`
/// (`backend` as the suite names it): changes items 3 and up (InnoDB rolls back
/// the transaction with fewer changed rows), locks item 2, says so on `locked`,
/// waits for `go`, then locks item 1, which the victim holds while it waits
/// for item 2. PostgreSQL's deadlock check runs in the session that waited
/// `deadlock_timeout` first; this one's is set far higher. Commits: it is never
/// the victim.
pub fn heavier_neighbour<C: Connection>(
    conn: &mut C,
    backend: &str,
    locked: Sender<()>,
    go: Receiver<()>,
) {
    heavier_neighbour_holding(conn, backend, "items WHERE id = 2", locked, go);
}

/// The heavier side of a deadlock over a row of `twins` (a table whose key the
/// database does not enforce), on MariaDB: puts the row in place (id 1, label
/// `a`, version 1), then, as [`heavier_neighbour`] with that row for item 2,
/// locks the rows of `twins` (no index: the scan locks them all).
pub fn twin_holder<C: Connection>(conn: &mut C, locked: Sender<()>, go: Receiver<()>) {
    exec(
        conn,
        "INSERT INTO twins (id, label, lock_version) VALUES (1, 'a', 1)",
    );
    heavier_neighbour_holding(conn, "mysql", "twins", locked, go);
}

/// [`heavier_neighbour`], locking the rows of `SELECT id FROM <rows> FOR
/// UPDATE` where it locks item 2.
fn heavier_neighbour_holding<C: Connection>(
    conn: &mut C,
    backend: &str,
    rows: &str,
    locked: Sender<()>,
    go: Receiver<()>,
) {
    if backend == "postgres" {
        exec(conn, "SET deadlock_timeout = '30s'");
    }
    conn.transaction(|conn| {
        exec(conn, "UPDATE items SET name = 'heavy' WHERE id >= 3");
        exec(conn, &format!("SELECT id FROM {rows} FOR UPDATE"));
        locked.send(()).unwrap();
        go.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
        diesel::QueryResult::Ok(())
    })
    .expect("the heavier transaction is never the victim");
}

/// What the side that will be a deadlock's victim waits for, in
/// [`beside_neighbour`]: [`Cue::wait`] returns once the heavier neighbour holds
/// item 2 and is about to ask for item 1 (200 ms later), which the victim must
/// hold by then; its next lock on item 2 is the victim's.
pub struct Cue {
    locked: Receiver<()>,
    go: Sender<()>,
}

impl Cue {
    /// Waits for the neighbour's lock on item 2, then lets it go on.
    pub fn wait(&self) {
        self.locked.recv().unwrap();
        self.go.send(()).unwrap();
    }
}

/// Seeds the rows of a provoked deadlock ([`seed_for_deadlock`]) and runs
/// `run` on a connection of its own beside [`heavier_neighbour`] on another,
/// on `backend` as the suite names it. `run` calls [`Cue::wait`] once, while it
/// holds item 1, before it asks for item 2.
#[cfg(feature = "harness")]
pub fn beside_neighbour<C, T>(
    db: &crate::TestDb<C>,
    backend: &str,
    run: impl FnOnce(&mut C, &Cue) -> T,
) -> T
where
    C: crate::db::TestBackend,
{
    seed_for_deadlock(&mut db.conn());
    let (locked, locked_rx) = std::sync::mpsc::channel::<()>();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let cue = Cue {
        locked: locked_rx,
        go,
    };
    std::thread::scope(|s| {
        let neighbour =
            s.spawn(move || heavier_neighbour(&mut db.connect(), backend, locked, go_rx));
        let outcome = run(&mut db.connect(), &cue);
        neighbour.join().unwrap();
        outcome
    })
}

/// A nested call retried after the deadlock (by the caller's loop or by a
/// nested `transaction_with_retry`), `runs` times in all. PostgreSQL: the
/// second attempt ran in the same transaction, which committed one sale and
/// its order line. MySQL/MariaDB: nothing committed, nothing retried in the
/// ended transaction (the retry inside it took `TransactionAborted(Deadlock)`
/// for what it is: not retryable while the transaction is open), and the caller,
/// once its transaction rolled back, holds that error settled: retryable like
/// its cause, for a retry around the whole transaction.
pub fn assert_nested_deadlock_settled(
    backend: &str,
    outcome: &Result<(), Error>,
    runs: u32,
    stock: i32,
    lines: i64,
) {
    // Every unit sold has its order line, and the other way round.
    assert_eq!(
        10 - i64::from(stock),
        lines,
        "stock {stock}, order lines {lines}: {outcome:?}"
    );
    if backend == "postgres" {
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!((runs, stock, lines), (2, 9, 1));
    } else {
        assert_eq!((runs, stock, lines), (1, 10, 0), "{outcome:?}");
        match outcome {
            Err(err @ Error::TransactionAborted(aborted)) => {
                assert!(matches!(**aborted, Error::Deadlock), "{aborted:?}");
                assert!(aborted.is_settled() && err.is_retryable(), "{aborted:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The caller's transaction wrote order line 1, caught the nested call's
/// failure, and wrote order line 2. PostgreSQL: only the savepoint went, both
/// lines committed, no sale. MySQL/MariaDB: the server threw line 1 away, and
/// writing line 2 on its own is refused (`ReadOnly`) instead of committing half
/// of the order.
pub fn assert_swallowed_abort(backend: &str, outcome: &Result<(), Error>, stock: i32, lines: i64) {
    if backend == "postgres" {
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!((stock, lines), (10, 2));
    } else {
        assert_eq!((stock, lines), (10, 0), "{outcome:?}");
        assert!(matches!(outcome, Err(Error::ReadOnly)), "{outcome:?}");
    }
}

/// A trigger of the user's on `items` that refuses a sale below zero stock
/// with the very words of InnoDB's deadlock (1213), though it is a `SIGNAL`
/// (1644) that ends nothing: the caller's transaction stays open, and must
/// stay the caller's to commit or roll back.
pub const DEADLOCK_WORDED_REFUSAL: &str = "CREATE TRIGGER items_refuse_negative \
     BEFORE UPDATE ON items FOR EACH ROW IF NEW.stock < 0 THEN \
     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = \
     'Deadlock found when trying to get lock; try restarting transaction'; END IF";

/// What a caller whose write lockkit refused inside its transaction must find
/// (README, Guarantees: "A write after a caught abort is refused"): nothing
/// committed (`nothing_committed`, read off a new connection as `rows`), and
///
/// * `aborted`: the write was the abort's victim; it said
///   [`Error::TransactionAborted`], and the caller's next write was refused
///   ([`Error::ReadOnly`], the stand-in);
/// * otherwise, the write was refused as the user's own rule refused it (a
///   refusal worded like a deadlock, [`DEADLOCK_WORDED_REFUSAL`]), not as an
///   abort: nothing ended on the server, and the caller's transaction failed
///   and rolled back. A line committed there is the caller's rolled-back work,
///   committed by a stand-in's `START TRANSACTION`.
pub fn assert_refused<T: std::fmt::Debug, U: std::fmt::Debug>(
    write: &Option<Result<T, Error>>,
    aborted: bool,
    outcome: &Result<U, Error>,
    nothing_committed: bool,
    rows: &str,
) {
    let as_expected = match write {
        Some(Err(Error::TransactionAborted(_))) => {
            aborted && matches!(outcome, Err(Error::ReadOnly))
        }
        Some(Err(_)) => !aborted && outcome.is_err(),
        _ => false,
    };
    assert!(
        as_expected && nothing_committed,
        "the write got {write:?}, the caller {outcome:?}; {rows}"
    );
}

/// Opens lockkit's read-only stand-in on `conn`, a MySQL/MariaDB connection of
/// its own: a nested `transaction_with_retry` in a transaction the caller
/// already rolled back behind Diesel's back. Every lockkit transaction that
/// runs in the process meanwhile then asks the server before its `COMMIT`
/// whether it is still its own.
#[cfg(feature = "mysql")]
pub fn open_a_stand_in(conn: &mut diesel::MysqlConnection) {
    use diesel::connection::SimpleConnection;
    let nested = conn.transaction(|conn| {
        conn.batch_execute("ROLLBACK")?;
        lockkit::transaction_with_retry(conn, &lockkit::RetryPolicy::immediate(1), |_| {
            Err::<(), _>(Error::Busy)
        })
    });
    assert!(
        matches!(nested, Err(Error::TransactionAborted(_))),
        "{nested:?}"
    );
}

/// What a work whose transaction ended with no failed statement leaves
/// (`tests/lost_updates.rs`, `tests/async_lost_updates.rs`): it sold one unit
/// of item 1 (seeded with 10), a statement committed the transaction
/// implicitly, and it sold another, committed on its own. lockkit must not
/// run it again (`attempts`: 1) and must tell the caller, not retryably; both
/// sales stand (`stock`: 8), the second committed by the server on its own.
pub fn assert_not_run_again<T: std::fmt::Debug>(
    attempts: u32,
    outcome: &Result<T, Error>,
    stock: i32,
) {
    assert_eq!(
        attempts, 1,
        "the work ran again; the caller got {outcome:?}"
    );
    assert!(outcome.as_ref().is_err_and(ended_silently), "{outcome:?}");
    assert_eq!(stock, 8, "item 1's stock; the caller got {outcome:?}");
}

/// Whether `err` is lockkit's report of a transaction that the server ended
/// under the work with no statement failing, whose later statements may have
/// committed on their own: a non-retryable [`Error::Database`] in lockkit's
/// own words.
pub fn ended_silently(err: &Error) -> bool {
    matches!(err, Error::Database(_))
        && !err.is_retryable()
        && err.to_string().contains("no statement of the work failed")
}
