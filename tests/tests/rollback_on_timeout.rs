//! lockkit on a MariaDB server started with `--innodb-rollback-on-timeout`
//! (`ROLLBACK_ON_TIMEOUT_URL`; `scripts/mariadb.sh start` makes one,
//! `scripts/test.sh` does so for the suite): a lock wait timeout (1205) there
//! rolls back the whole transaction, as a deadlock does, and the caller's next
//! statements would run in autocommit. Nothing of the caller's transaction may
//! commit on its own, and nothing may be retried inside it.
//!
//! Each test has a database of its own on that server. The row the caller waits
//! for is held by another connection until the caller's wait (1 s) is over.

#![cfg(feature = "mysql")]

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::MysqlConnection;
use lockkit::prelude::*;
use lockkit::{retry, Error, LockOptions, RetryPolicy};
use lockkit_tests::models::Item;
use lockkit_tests::schema::{items, orders};
use lockkit_tests::support::with_database;

/// A database `name` of its own on the server `ROLLBACK_ON_TIMEOUT_URL` names,
/// with the suite's tables and items 1 and 2 at stock 10: its URL.
fn database(name: &str) -> String {
    let server = std::env::var("ROLLBACK_ON_TIMEOUT_URL").unwrap_or_else(|_| {
        panic!(
            "ROLLBACK_ON_TIMEOUT_URL must name a MariaDB server started with \
             --innodb-rollback-on-timeout (eval \"$(scripts/mariadb.sh start)\", or run \
             scripts/test.sh)"
        )
    });
    let name = format!("lk_rot_{name}");
    let mut admin = MysqlConnection::establish(&server)
        .unwrap_or_else(|e| panic!("cannot connect to {server}: {e}"));
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
        ))
        .unwrap();
    let url = with_database(&server, &name);
    let mut conn = connect(&url);
    conn.batch_execute(&lockkit_tests::schema::create_tables(
        lockkit::version_trigger::Dialect::Mysql,
    ))
    .unwrap();
    lockkit_tests::seed_items(&mut conn, &[(1, 10), (2, 10)]);
    url
}

/// A connection to `url` whose lock waits give up after 1 s.
fn connect(url: &str) -> MysqlConnection {
    let mut conn = MysqlConnection::establish(url).unwrap();
    conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    conn
}

/// What another connection sends to hold item 2 locked.
const HOLD_ITEM_2: &str = "START TRANSACTION; SELECT id FROM items WHERE id = 2 FOR UPDATE";

/// Runs `f` while another connection holds what its statements `hold` take,
/// until `f` returns or for `at_most`: then that connection closes, and lets
/// go of everything.
fn holding<T>(url: &str, hold: &str, at_most: Duration, f: impl FnOnce() -> T) -> T {
    let (held_tx, held) = mpsc::channel();
    let (done, done_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        s.spawn(move || {
            let mut conn = connect(url);
            conn.batch_execute(hold).unwrap();
            held_tx.send(()).unwrap();
            let _ = done_rx.recv_timeout(at_most);
        });
        held.recv().unwrap();
        let out = f();
        let _ = done.send(()); // the holder may have let go already
        out
    })
}

/// How long [`holding_through_the_first_wait`] keeps its hold at most when no
/// statement waits for it and the caller does not return: a bound for a test
/// gone wrong, far past any wait of 1 s.
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// How often the holder of [`holding_through_the_first_wait`] looks at the
/// server's lock waits: more slowly than every 100 ms, or InnoDB serves each
/// look the same copy of its `information_schema` tables.
const LOOK_EVERY: Duration = Duration::from_millis(150);

/// A statement running on the server: its session and its `QUERY_ID`.
#[derive(diesel::QueryableByName, Debug, Clone, Copy, PartialEq, Eq)]
struct Statement {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    session: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    query_id: i64,
}

/// A statement (of any session) now waiting for a lock `holder`'s session
/// holds, if there is one.
fn waiting_for(watcher: &mut MysqlConnection, holder: i64) -> Option<Statement> {
    diesel::sql_query(format!(
        "SELECT CAST(p.ID AS SIGNED) AS session, CAST(p.QUERY_ID AS SIGNED) AS query_id \
           FROM information_schema.INNODB_LOCK_WAITS w \
           JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
           JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
           JOIN information_schema.PROCESSLIST p ON p.ID = r.trx_mysql_thread_id \
          WHERE b.trx_mysql_thread_id = {holder} AND p.COMMAND <> 'Sleep' \
          ORDER BY p.ID LIMIT 1"
    ))
    .get_result(watcher)
    .optional()
    .unwrap()
}

/// Whether `statement` is still running (its wait, if it waits, not over).
fn still_running(watcher: &mut MysqlConnection, statement: Statement) -> bool {
    let running: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!(
        "(SELECT COUNT(*) FROM information_schema.PROCESSLIST \
           WHERE ID = {} AND QUERY_ID = {} AND COMMAND <> 'Sleep')",
        statement.session, statement.query_id
    )))
    .get_result(watcher)
    .unwrap();
    running > 0
}

/// Runs `f` while another connection holds what its statements `hold` take,
/// until the first statement that waits for them has stopped waiting (its
/// wait of 1 s timed out): then that connection rolls back, and a later
/// statement finds everything free. The holder lets go earlier when `f`
/// returns, and after [`HOLD_AT_MOST`] in any case.
///
/// However late `f` gets to its first locking statement, that statement waits
/// its whole 1 s; and the holder watches the server (a connection of its
/// own), not the clock.
fn holding_through_the_first_wait<T>(url: &str, hold: &str, f: impl FnOnce() -> T) -> T {
    let (held_tx, held) = mpsc::channel();
    let (done, done_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        s.spawn(move || {
            let mut watcher = connect(url);
            let mut conn = connect(url);
            let holder = lockkit::lock_waits::session_id(&mut conn).unwrap();
            conn.batch_execute(hold).unwrap();
            held_tx.send(()).unwrap();
            let deadline = Instant::now() + HOLD_AT_MOST;
            let mut first = None;
            while Instant::now() < deadline {
                if !matches!(
                    done_rx.recv_timeout(LOOK_EVERY),
                    Err(RecvTimeoutError::Timeout)
                ) {
                    break; // `f` returned
                }
                match first {
                    None => first = waiting_for(&mut watcher, holder),
                    Some(statement) if !still_running(&mut watcher, statement) => break,
                    Some(_) => {}
                }
            }
            conn.batch_execute("ROLLBACK").unwrap();
        });
        held.recv().unwrap();
        let out = f();
        let _ = done.send(()); // the holder may have let go already
        out
    })
}

/// Runs `caller` on a connection of its own while another connection holds
/// item 2 locked ([`holding_through_the_first_wait`]: until the caller's first
/// wait for it has timed out, so that a later one finds the row free), then
/// reads item 2's stock and the order lines on a new connection.
fn while_item_2_is_held<T>(
    url: &str,
    caller: impl FnOnce(&mut MysqlConnection) -> T,
) -> (T, i32, i64) {
    let out = holding_through_the_first_wait(url, HOLD_ITEM_2, || caller(&mut connect(url)));
    let mut fresh = connect(url);
    let stock: i32 = items::table
        .find(2)
        .select(items::stock)
        .first(&mut fresh)
        .unwrap();
    let lines: i64 = orders::table.count().get_result(&mut fresh).unwrap();
    (out, stock, lines)
}

/// Item 1's stock, read on a new connection.
fn stock_of_1(url: &str) -> i32 {
    items::table
        .find(1)
        .select(items::stock)
        .first(&mut connect(url))
        .unwrap()
}

/// Each of lockkit's `writes` (what it was, and its result) refused with
/// `TransactionAborted`, and nothing of the caller's transaction committed:
/// item 1 keeps its stock, and there is no order line. `outcome`: what the
/// caller's transaction returned.
fn assert_refused(url: &str, writes: &[(&str, &Result<(), Error>)], outcome: &Result<(), Error>) {
    for (write, result) in writes {
        assert!(
            matches!(result, Err(Error::TransactionAborted(_))),
            "{write}: {result:?}"
        );
    }
    let lines: i64 = orders::table.count().get_result(&mut connect(url)).unwrap();
    assert_eq!(
        (stock_of_1(url), lines),
        (10, 0),
        "a write committed on its own; the caller got {outcome:?}"
    );
}

/// [`assert_refused`] for lockkit's two single writes: a versioned write and
/// `update_if`.
fn assert_both_refused(
    url: &str,
    versioned: &Result<(), Error>,
    conditional: &Result<(), Error>,
    outcome: &Result<(), Error>,
) {
    let writes = [("update_versioned", versioned), ("update_if", conditional)];
    assert_refused(url, &writes, outcome);
}

/// Records order line `id` in the caller's transaction.
fn order_line(conn: &mut MysqlConnection, id: i32) -> Result<(), Error> {
    let sql = format!("INSERT INTO orders (id, item_id, qty) VALUES ({id}, NULL, 1)");
    Ok(conn.batch_execute(&sql)?)
}

/// Sells one unit of item 2 the README's way: re-read, change, `update_versioned`.
fn sell_two(conn: &mut MysqlConnection) -> Result<(), Error> {
    let mut two: Item = items::table.find(2).first(conn)?;
    two.stock -= 1;
    two.update_versioned(conn)
}

#[test]
fn a_compare_and_set_whose_follow_up_read_times_out_commits_nothing() {
    // The `UPDATE` matched nothing (item 2 moved on), and before the read that
    // reports what it found, another connection took item 2: the read's wait
    // times out, and the server rolls the caller's whole transaction back. The
    // call must say so, as a failed write does, or the caller's next writes
    // commit on their own.
    use diesel::connection::InstrumentationEvent;
    use lockkit::compare_and_set::expect;
    use std::sync::{Arc, Mutex};
    let url = database("cas_read_times_out");
    let holder: Arc<Mutex<Option<MysqlConnection>>> = Arc::default();
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut conn = connect(&url);
    // At READ COMMITTED (lockkit's advice for workers) the `UPDATE` lets go of
    // the row it did not change.
    conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .unwrap();
    {
        let (holder, armed, url) = (holder.clone(), armed.clone(), url.clone());
        conn.set_instrumentation(lockkit::journal::Journal::wrap(
            move |event: InstrumentationEvent<'_>| {
                let InstrumentationEvent::FinishQuery { query, .. } = event else {
                    return;
                };
                if query.to_string().starts_with("UPDATE")
                    && armed.swap(false, std::sync::atomic::Ordering::SeqCst)
                {
                    let mut hold = connect(&url);
                    hold.batch_execute(HOLD_ITEM_2).unwrap();
                    *holder.lock().unwrap() = Some(hold);
                }
            },
        ));
    }
    let mut cas = None;
    let mut after = None;
    let outcome: Result<(), Error> = conn.transaction(|conn| {
        order_line(conn, 1)?;
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        cas = Some(Item::compare_and_set(
            conn,
            2,
            expect(items::stock, 999),
            items::stock.eq(0),
        ));
        after = Some(order_line(conn, 2));
        Err(Error::NoRowMatched)
    });
    drop(holder.lock().unwrap().take());
    let cas = cas.unwrap().map(drop);
    assert!(matches!(cas, Err(Error::TransactionAborted(_))), "{cas:?}");
    assert!(
        after.unwrap().is_err(),
        "the caller's next write ran in autocommit"
    );
    assert_refused(&url, &[], &outcome);
}

#[test]
fn a_versioned_write_that_times_out_under_a_nested_retry_commits_nothing() {
    // The README's retry around a sale inside the caller's transaction, which
    // first records an order line. The sale's UPDATE waits for item 2 and
    // times out: the server rolls back the whole transaction. A retry of the
    // sale would run in autocommit and sell without the order line.
    let url = database("nested_retry_timeout");
    let mut attempts = 0;
    let (outcome, stock, lines) = while_item_2_is_held(&url, |conn| {
        lockkit::locked_transaction(conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
        conn.transaction(|conn| {
            order_line(conn, 1)?;
            retry(&RetryPolicy::immediate(3), |_| {
                attempts += 1;
                sell_two(conn)
            })
        })
    });
    assert!(
        matches!(outcome, Err(Error::TransactionAborted(_))) && (stock, lines) == (10, 0),
        "after {attempts} attempts the caller got {outcome:?}; item 2's stock {stock}, order \
         lines {lines} (a sale without its order line committed on its own)"
    );
}

#[test]
fn a_nested_with_lock_after_the_caller_let_its_own_lock_timeout_go_commits_nothing() {
    // The caller's own locking read times out; it lets the error go and sells
    // under a nested `with_lock` (item 1, free): no transaction is open on the
    // server any more, and the sale must not commit on its own.
    let url = database("let_go_timeout_with_lock");
    let (outcome, _, lines) = while_item_2_is_held(&url, |conn| {
        lockkit::locked_transaction(conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
        conn.transaction(|conn| {
            order_line(conn, 1)?;
            let timed_out = conn.batch_execute("SELECT id FROM items WHERE id = 2 FOR UPDATE");
            assert!(timed_out.is_err());
            lockkit::with_lock(conn, 1, LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(conn)?;
                order_line(conn, 2)
            })
        })
    });
    let stock_1 = stock_of_1(&url);
    assert!(
        outcome.is_err() && (stock_1, lines) == (10, 0),
        "the caller got {outcome:?}; item 1's stock {stock_1}, order lines {lines}"
    );
}

#[test]
fn a_transaction_with_retry_whose_work_wrote_after_a_let_go_timeout_is_not_run_again() {
    // The work's own locking read times out, which ends the transaction on
    // this server; the work lets it go and writes an order line, in
    // autocommit: committed on its own. Once the server confirms the end, the
    // owner must not run the work again (the line would be written twice).
    let url = database("let_go_timeout_then_write");
    let mut runs = 0;
    let (outcome, _, lines) = while_item_2_is_held(&url, |conn| {
        lockkit::transaction_with_retry(conn, &lockkit::RetryPolicy::immediate(3), |conn| {
            runs += 1;
            let timed_out = conn.batch_execute("SELECT id FROM items WHERE id = 2 FOR UPDATE");
            assert!(timed_out.is_err()); // let go
            order_line(conn, runs)
        })
    });
    assert_eq!(runs, 1, "{outcome:?}");
    assert!(
        outcome.as_ref().is_err_and(|err| !err.is_retryable()),
        "{outcome:?}"
    );
    assert_eq!(lines, 1, "the line written after the end, once");
}

#[test]
fn single_writes_after_the_caller_let_its_own_lock_timeout_go_refuse() {
    // As above, with lockkit's single writes (a versioned write of item 1,
    // `update_if`) in place of the nested call: each would commit on its own.
    let url = database("let_go_timeout_single_writes");
    let mut seen = None;
    let (outcome, _, _) = while_item_2_is_held(&url, |conn| {
        lockkit::locked_transaction(conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
        conn.transaction(|conn| {
            order_line(conn, 1)?;
            let mut one: Item = items::table.find(1).first(conn)?;
            let timed_out = conn.batch_execute("SELECT id FROM items WHERE id = 2 FOR UPDATE");
            assert!(timed_out.is_err());
            one.stock -= 1;
            let versioned = one.update_versioned(conn);
            let conditional = Item::update_if(
                conn,
                1,
                items::stock.ge(1),
                items::stock.eq(items::stock - 1),
            );
            seen = Some((versioned, conditional));
            order_line(conn, 2)
        })
    });
    let (versioned, conditional) = seen.expect("the caller ran");
    assert_both_refused(&url, &versioned, &conditional, &outcome);
}

#[test]
fn a_nested_with_lock_that_times_out_under_a_retry_commits_nothing() {
    // A nested `with_lock` on item 2, retried by the caller inside its own
    // transaction: its lock wait times out, and the server rolls back the
    // whole transaction. The retry must not sell in autocommit.
    let url = database("nested_with_lock_timeout");
    let (outcome, stock, lines) = while_item_2_is_held(&url, |conn| {
        conn.transaction(|conn| {
            order_line(conn, 1)?;
            retry(&RetryPolicy::immediate(3), |_| {
                lockkit::with_lock(conn, 2, LockOptions::default(), |conn, item: Item| {
                    diesel::update(items::table.find(2))
                        .set(items::stock.eq(item.stock - 1))
                        .execute(conn)?;
                    Ok::<_, Error>(())
                })
            })
        })
    });
    assert!(
        matches!(outcome, Err(Error::TransactionAborted(_))) && (stock, lines) == (10, 0),
        "the caller got {outcome:?}; item 2's stock {stock}, order lines {lines}"
    );
}

/// A write to the jobs table (it changes nothing), which waits for the table
/// while another session holds it under `LOCK TABLES`.
const WRITE_JOBS: &str = "UPDATE jobs SET done = done";

#[test]
fn a_metadata_lock_timeout_teaches_nothing_about_row_lock_timeouts() {
    // The caller's write to a table another session holds under `LOCK TABLES`
    // waits for the table's metadata lock and times out: 1205, in the words of
    // InnoDB's lock wait timeout, but it ends no transaction on any server. A
    // nested call after it asks the server, finds the transaction open and
    // goes on; that answer says nothing of row locks. A row lock wait then
    // times out, which on this server rolls back the whole transaction, and
    // the caller lets it go: a nested sale must not commit on its own.
    let url = database("metadata_lock_timeout");
    let mut conn = connect(&url);
    conn.batch_execute("SET SESSION lock_wait_timeout = 1")
        .unwrap();
    lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
    let long = Duration::from_secs(10);
    let mut first = None;
    let outcome = conn.transaction(|conn| {
        order_line(conn, 1)?;
        let waited = holding(&url, "LOCK TABLES jobs WRITE", long, || {
            conn.batch_execute(WRITE_JOBS)
        });
        assert!(waited.is_err(), "the write to jobs waited for nothing");
        first = Some(lockkit::with_lock(
            conn,
            1,
            LockOptions::default(),
            |_, _: Item| Ok::<_, Error>(()),
        ));
        let timed_out = holding(&url, HOLD_ITEM_2, long, || {
            conn.batch_execute("SELECT id FROM items WHERE id = 2 FOR UPDATE")
        });
        assert!(timed_out.is_err(), "item 2 was not held");
        lockkit::with_lock(conn, 1, LockOptions::default(), |conn, item: Item| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(item.stock - 1))
                .execute(conn)?;
            order_line(conn, 2)
        })
    });
    assert!(
        matches!(first, Some(Ok(()))),
        "the nested call after the metadata lock's timeout: {first:?}"
    );
    assert_refused(&url, &[("the sale", &outcome)], &outcome);
}

/// Diesel's way to pick a backend at run time, here over MariaDB alone: the
/// enum's backend type names no server, so lockkit learns from the
/// connection inside what a failed statement does to a transaction.
#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    Mysql(MysqlConnection),
}

impl lockkit::multi::Dispatch for AnyConnection {
    fn dispatch(&mut self) -> lockkit::multi::BackendConn<'_> {
        match self {
            AnyConnection::Mysql(conn) => lockkit::multi::BackendConn::Mysql(conn),
        }
    }
}

/// The caller's transaction on `conn`, through the enum: an order line, a
/// locking read of item 2 that times out (the server rolls back the whole
/// transaction) and whose error the caller lets go, then `writes` on item 1
/// and a second order line.
fn after_a_let_go_timeout<T>(
    conn: &mut AnyConnection,
    writes: impl FnOnce(&mut AnyConnection) -> T,
) -> (T, Result<(), Error>) {
    let mut seen = None;
    let outcome = conn.transaction(|conn| {
        diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)")
            .execute(conn)?;
        let timed_out =
            diesel::sql_query("SELECT id FROM items WHERE id = 2 FOR UPDATE").execute(conn);
        assert!(timed_out.is_err(), "item 2 was not held");
        seen = Some(writes(conn));
        diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)")
            .execute(conn)?;
        Ok::<_, Error>(())
    });
    (seen.expect("the caller ran"), outcome)
}

/// Sells one unit of item 1 through the enum with a versioned write.
fn sell_one_versioned(conn: &mut AnyConnection) -> Result<(), Error> {
    let mut one = items::table.find(1).select(Item::as_select()).first(conn)?;
    one.stock -= 1;
    one.update_versioned(conn)
}

/// Sells one unit of item 1 through the enum with `update_if`.
fn sell_one_if_in_stock(conn: &mut AnyConnection) -> Result<(), Error> {
    Item::update_if(
        conn,
        1,
        items::stock.ge(1),
        items::stock.eq(items::stock - 1),
    )
}

#[test]
fn a_multi_connection_enums_first_lockkit_call_a_single_write_after_a_let_go_timeout_refuses() {
    // The enum is new to lockkit when the caller's locking read times out;
    // lockkit's first call on it, a versioned write or `update_if`, installs
    // its journal after the fact. It must learn that MariaDB is inside and
    // ask the server, not sell in autocommit.
    for versioned_first in [true, false] {
        let url = database(&format!("enum_new_versioned_first_{versioned_first}"));
        let ((versioned, conditional), outcome) =
            holding(&url, HOLD_ITEM_2, Duration::from_secs(10), || {
                let mut conn = AnyConnection::Mysql(connect(&url));
                after_a_let_go_timeout(&mut conn, |conn| {
                    if versioned_first {
                        (sell_one_versioned(conn), sell_one_if_in_stock(conn))
                    } else {
                        let conditional = sell_one_if_in_stock(conn);
                        (sell_one_versioned(conn), conditional)
                    }
                })
            });
        assert_both_refused(&url, &versioned, &conditional, &outcome);
    }
}

/// One way to sell a unit of item 1 through the enum.
type Sale = fn(&mut AnyConnection) -> Result<(), Error>;

#[test]
fn an_atomic_write_as_a_multi_connection_enums_first_lockkit_call_after_a_let_go_timeout_refuses() {
    // As above, with `atomic::update_if` as lockkit's first call on the enum:
    // it asks the connection inside which backend it is, and the server
    // whether the transaction is alive, instead of selling in autocommit.
    let url = database("enum_new_atomic_first");
    let (sale, outcome) = holding(&url, HOLD_ITEM_2, Duration::from_secs(10), || {
        let mut conn = AnyConnection::Mysql(connect(&url));
        after_a_let_go_timeout(&mut conn, sell_one_atomically)
    });
    assert_refused(&url, &[("atomic::update_if", &sale)], &outcome);
}

/// Sells one unit of item 1 through the enum with `atomic::update_if`, which
/// asks the connection inside which backend it is.
fn sell_one_atomically(conn: &mut AnyConnection) -> Result<(), Error> {
    let sale = diesel::update(items::table.find(1).filter(items::stock.ge(1)))
        .set(items::stock.eq(items::stock - 1));
    lockkit::atomic::update_if(conn, sale).map(drop)
}

#[test]
fn update_if_through_a_multi_connection_enum_whose_journal_has_no_rule_after_a_let_go_timeout_refuses(
) {
    // The enum carries a journal with no rule (`Journal::new`, installed by
    // the application), which watched a transaction of its own before: the
    // enum's backend type names no server. The caller's locking read times
    // out, which the journal sees in InnoDB's words and guesses MySQL's rule
    // from. `atomic::update_if` and `Versioned::update_if` after it must
    // refuse, not sell in autocommit; each tells the journal the rule of the
    // connection inside, in place of its guess.
    let sales: [(&str, Sale); 2] = [
        ("atomic::update_if", sell_one_atomically),
        ("Versioned::update_if", sell_one_if_in_stock),
    ];
    for (i, (name, sell)) in sales.into_iter().enumerate() {
        let url = database(&format!("enum_served_update_if_{i}"));
        let mut conn = AnyConnection::Mysql(connect(&url));
        conn.set_instrumentation(lockkit::journal::Journal::new());
        conn.transaction(|conn| {
            diesel::update(items::table.find(2))
                .set(items::stock.eq(items::stock))
                .execute(conn)
        })
        .unwrap();
        let (conditional, outcome) = holding(&url, HOLD_ITEM_2, Duration::from_secs(10), || {
            after_a_let_go_timeout(&mut conn, sell)
        });
        assert_refused(&url, &[(name, &conditional)], &outcome);
    }
}

#[test]
fn a_single_write_through_an_enum_with_its_own_instrumentation_that_times_out_under_a_nested_retry_commits_nothing(
) {
    // The enum carries the user's own Diesel instrumentation, so no journal
    // of lockkit's watches it. The README's retry around a sale (a versioned
    // write, or `Versioned::update_if`) inside the caller's transaction: the
    // sale waits for item 1 and times out, and the server rolls back the
    // whole transaction. lockkit must learn from the connection inside that
    // this may be so: a retry would sell in autocommit, without the order line.
    let sales: [(&str, Sale); 3] = [
        ("update_versioned", sell_one_versioned),
        ("Versioned::update_if", sell_one_if_in_stock),
        ("atomic::update_if", sell_one_atomically),
    ];
    for (i, (name, sell)) in sales.into_iter().enumerate() {
        let url = database(&format!("enum_instrumented_retry_{i}"));
        let hold_item_1 = "START TRANSACTION; SELECT id FROM items WHERE id = 1 FOR UPDATE";
        let outcome = holding_through_the_first_wait(&url, hold_item_1, || {
            let mut conn = AnyConnection::Mysql(connect(&url));
            conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
            conn.transaction(|conn| {
                diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)")
                    .execute(conn)?;
                retry(&RetryPolicy::immediate(3), |_| sell(conn))
            })
        });
        assert_refused(&url, &[(name, &outcome)], &outcome);
    }
}

#[test]
fn with_lock_through_an_enum_with_its_own_instrumentation_whose_work_failed_after_a_timeout_reports_it(
) {
    // As above, no journal of lockkit's watches the enum. The work of an
    // outermost `with_lock` records an order line, then its own locking read
    // of item 2 times out (the server rolls back the whole transaction); it
    // lets that error go and fails with one of its own. The transaction is
    // gone: lockkit asks the server, and hands on a retryable cause, which a
    // `retry` around `with_lock` runs again, not the work's error. (Unwatched,
    // lockkit knows only that the server ended it: it names a deadlock.)
    let url = database("enum_instrumented_with_lock");
    let outcome = holding(&url, HOLD_ITEM_2, Duration::from_secs(10), || {
        let mut conn = AnyConnection::Mysql(connect(&url));
        conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
        lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn, _: Item| {
            diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)")
                .execute(conn)?;
            let timed_out =
                diesel::sql_query("SELECT id FROM items WHERE id = 2 FOR UPDATE").execute(conn);
            assert!(timed_out.is_err(), "item 2 was not held");
            Err::<(), _>(Error::InvalidInput("out of stock"))
        })
    });
    let lines: i64 = orders::table
        .count()
        .get_result(&mut connect(&url))
        .unwrap();
    assert!(
        matches!(outcome, Err(Error::LockTimeout | Error::Deadlock)) && lines == 0,
        "the caller got {outcome:?}; order lines {lines}"
    );
}

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use diesel_async::{AsyncConnection, AsyncMysqlConnection, SimpleAsyncConnection};
    use lockkit::asynchronous::AsyncVersioned;

    /// The blocking side's
    /// `a_versioned_write_that_times_out_under_a_nested_retry_commits_nothing`,
    /// on diesel-async.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_versioned_write_that_times_out_under_a_nested_retry_commits_nothing() {
        let url = database("async_nested_retry_timeout");
        let (outcome, stock, lines) = while_item_2_is_held(&url, |_| {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let mut conn = AsyncMysqlConnection::establish(&url).await.unwrap();
                    conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
                        .await
                        .unwrap();
                    conn.transaction(async |conn| {
                        conn.batch_execute(
                            "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
                        )
                        .await?;
                        let conn = tokio::sync::Mutex::new(conn);
                        lockkit::asynchronous::retry(&RetryPolicy::immediate(3), |_| async {
                            let mut conn = conn.lock().await;
                            let mut two: Item =
                                diesel_async::RunQueryDsl::first(items::table.find(2), &mut **conn)
                                    .await?;
                            two.stock -= 1;
                            AsyncVersioned::update_versioned(&mut two, &mut **conn).await
                        })
                        .await
                    })
                    .await
                })
            })
        });
        assert!(
            matches!(outcome, Err(Error::TransactionAborted(_))) && (stock, lines) == (10, 0),
            "the caller got {outcome:?}; item 2's stock {stock}, order lines {lines} (a sale \
             without its order line committed on its own)"
        );
    }

    /// The blocking side's
    /// `a_metadata_lock_timeout_teaches_nothing_about_row_lock_timeouts`, on
    /// diesel-async, with a versioned write for the sale: a nested call there
    /// asks the server after any read in any case.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_metadata_lock_timeout_teaches_nothing_about_row_lock_timeouts() {
        use tokio::runtime::Handle;
        use tokio::task::block_in_place;
        let url = database("async_metadata_lock_timeout");
        let long = Duration::from_secs(10);
        let mut conn = AsyncMysqlConnection::establish(&url).await.unwrap();
        conn.batch_execute(
            "SET SESSION innodb_lock_wait_timeout = 1, SESSION lock_wait_timeout = 1",
        )
        .await
        .unwrap();
        lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |_| {
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
        let mut first = None;
        let outcome = conn
            .transaction(async |conn| {
                conn.batch_execute("INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)")
                    .await?;
                let waited = block_in_place(|| {
                    holding(&url, "LOCK TABLES jobs WRITE", long, || {
                        Handle::current().block_on(conn.batch_execute(WRITE_JOBS))
                    })
                });
                assert!(waited.is_err(), "the write to jobs waited for nothing");
                first = Some(
                    lockkit::asynchronous::with_lock(
                        conn,
                        1,
                        LockOptions::default(),
                        async |_, _: Item| Ok::<_, Error>(()),
                    )
                    .await,
                );
                // A write, whose error diesel-async shows the journal (it
                // may hide a read's).
                let timed_out = block_in_place(|| {
                    holding(&url, HOLD_ITEM_2, long, || {
                        Handle::current().block_on(
                            conn.batch_execute("UPDATE items SET stock = stock WHERE id = 2"),
                        )
                    })
                });
                assert!(timed_out.is_err(), "item 2 was not held");
                let mut one: Item =
                    diesel_async::RunQueryDsl::first(items::table.find(1), &mut *conn).await?;
                one.stock -= 1;
                AsyncVersioned::update_versioned(&mut one, &mut *conn).await?;
                conn.batch_execute("INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)")
                    .await?;
                Ok::<_, Error>(())
            })
            .await;
        assert!(
            matches!(first, Some(Ok(()))),
            "the nested call after the metadata lock's timeout: {first:?}"
        );
        assert_refused(&url, &[("the sale", &outcome)], &outcome);
    }
}
