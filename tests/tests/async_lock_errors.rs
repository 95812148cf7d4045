//! lockkit on diesel-async when a lock call nested in a transaction is a
//! deadlock's victim: on MariaDB the server rolls back the whole transaction, and
//! nothing may run on as if only the savepoint had gone; the owner of the
//! outermost transaction runs it again. The async twins of the blocking side's
//! `lock_errors` cases, and of `faults.rs`'s killed sessions (inside `with_lock`,
//! an idempotent run, a fenced write).

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex};

use async_common::order_line;
use diesel::{Connection, ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::aborts::{assert_nested_deadlock_settled, assert_swallowed_abort};
use lockkit_tests::models::{Item, Job};
use lockkit_tests::schema::{items, jobs, orders};
use lockkit_tests::{exec, seed_items};

/// The heavier transaction of [`deadlock_first_attempt!`] on its own thread and
/// connection: it locks item 2, says so on `b`, waits for `a`, then locks
/// item 1. Gives the thread, `a`'s sender and `b`'s receiver (shared with the
/// work's future).
/// A value whose bind always fails: diesel-async then reports the statement
/// begun and never its end, with nothing sent.
#[derive(Debug)]
struct Unbindable;

impl<DB: diesel::backend::Backend> diesel::serialize::ToSql<diesel::sql_types::Integer, DB>
    for Unbindable
{
    fn to_sql<'b>(
        &'b self,
        _: &mut diesel::serialize::Output<'b, '_, DB>,
    ) -> diesel::serialize::Result {
        Err("this value cannot be bound".into())
    }
}

macro_rules! heavier_neighbour {
    ($db:expr) => {{
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let url = $db.url.clone();
        let neighbour = std::thread::spawn(move || {
            let mut conn = Sync::establish(&url).unwrap();
            lockkit_tests::aborts::heavier_neighbour(&mut conn, BACKEND, b_tx, a_rx);
        });
        (neighbour, a_tx, Mutex::new(b_rx))
    }};
}

/// What committed, seen from a new connection: item 1's stock and the number
/// of order lines.
macro_rules! committed {
    ($db:expr) => {{
        let mut fresh: Async = async_common::connect(&$db.url, BACKEND).await;
        stock_and_lines!(&mut fresh)
    }};
}

/// What committed of items 3 and 4 (the single writes' rows), seen from a new
/// connection: their stocks.
macro_rules! committed_3_and_4 {
    ($db:expr) => {{
        let mut fresh: Async = async_common::connect(&$db.url, BACKEND).await;
        items::table
            .filter(items::id.eq_any([3, 4]))
            .order(items::id)
            .select(items::stock)
            .load::<i32>(&mut fresh)
            .await
            .unwrap()
    }};
}

/// Empties `orders` and `items`, seeds items 1 to 12 (stock 10), then runs `$run` on a new async connection
/// `$conn`, where `$work(conn, attempt)` sells one unit of item 1 and, on
/// attempt 1, becomes a deadlock's victim: it holds item 1 and waits for item 2,
/// which a heavier transaction on another connection holds while it waits for
/// item 1. InnoDB rolls back the lighter transaction; PostgreSQL's deadlock
/// check runs in the session that waited `deadlock_timeout` first, and the
/// other session's is set far higher. Gives `$run`'s outcome, how many times
/// `$work` ran, and item 1's stock and the number of order lines committed.
///
/// `$work` locks item 2 by its key, which MariaDB reads (and waits for) before
/// it answers: the deadlock comes as the statement's error. With `by_range`
/// first, it locks item 2 by a range (`id >= 2 AND id < 3`), which MariaDB
/// reads after it has sent the columns: the deadlock comes in place of the
/// rows, and diesel-async's MySQL connection has told its instrumentation
/// (lockkit's journal) that the read succeeded.
macro_rules! deadlock_first_attempt {
    (by_range, $db:expr, |$conn:ident, $work:ident| $run:expr) => {
        deadlock_first_attempt!(@run true, $db, |$conn, $work| $run)
    };
    ($db:expr, |$conn:ident, $work:ident| $run:expr) => {
        deadlock_first_attempt!(@run false, $db, |$conn, $work| $run)
    };
    (@run $by_range:expr, $db:expr, |$conn:ident, $work:ident| $run:expr) => {{
        exec(&mut $db.conn(), "DELETE FROM orders");
        exec(&mut $db.conn(), "DELETE FROM items");
        lockkit_tests::aborts::seed_for_deadlock(&mut $db.conn());
        let (neighbour, a_tx, b_rx) = heavier_neighbour!($db);
        let runs = AtomicU32::new(0);
        let $work = async |conn: &mut Async, attempt: u32| -> Result<(), Error> {
            runs.fetch_add(1, Ordering::SeqCst);
            // The sale locks item 1 without a read before it: a write after
            // a read of the work's own is one that may follow a hidden
            // deadlock (`.._runs_again_unless_it_wrote_after`).
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)
                .await?;
            if attempt == 1 {
                a_tx.send(()).unwrap();
                tokio::task::block_in_place(|| b_rx.lock().unwrap().recv()).unwrap();
                if $by_range {
                    let _: Vec<Item> = items::table
                        .filter(items::id.ge(2))
                        .filter(items::id.lt(3))
                        .for_update()
                        .load(conn)
                        .await?;
                } else {
                    let _: Item = items::table.find(2).for_update().first(conn).await?;
                }
            }
            Ok(())
        };
        let mut $conn: Async = async_common::connect(&$db.url, BACKEND).await;
        let outcome: Result<(), Error> = $run;
        tokio::task::block_in_place(|| neighbour.join()).unwrap();
        let (stock, lines) = committed!($db);
        (
            outcome,
            AtomicU32::load(&runs, Ordering::SeqCst),
            stock,
            lines,
        )
    }};
}

/// Runs `$work` (an async closure taking `&mut Async`) in a transaction on
/// `$conn`: lockkit's (`transaction_with_retry`, one attempt) when `$lockkit`,
/// else diesel-async's own.
macro_rules! in_transaction {
    ($lockkit:expr, $conn:expr, $work:expr) => {
        if $lockkit {
            lockkit::asynchronous::transaction_with_retry($conn, &RetryPolicy::immediate(1), $work)
                .await
        } else {
            AsyncConnection::transaction($conn, $work).await
        }
    };
}

/// What the next user of `conn` would find (a pool hands it on when
/// diesel-async counts no transaction open): whether diesel-async counts one,
/// and what an autocommit write of order line 99 does.
async fn what_the_next_user_finds<A>(conn: &mut A) -> (bool, Result<(), Error>)
where
    A: AsyncConnection + SimpleAsyncConnection + Send,
{
    (
        async_common::in_transaction(conn),
        order_line(conn, 99).await,
    )
}

/// After a nested call whose work swallowed a deadlock (so that its `RELEASE
/// SAVEPOINT` failed) and the caller's end: no transaction left open, in
/// diesel-async's books or on the server; order line 99 committed on its own,
/// nothing of the caller's transaction.
fn assert_left_clean(
    (books, write): (bool, Result<(), Error>),
    outcome: &Result<(), Error>,
    runs: u32,
    stock: i32,
    lines: i64,
) {
    assert_eq!(runs, 1);
    assert!(
        !books,
        "diesel-async says a transaction is open: {outcome:?}"
    );
    assert!(
        write.is_ok(),
        "an autocommit write: {write:?} (the caller got {outcome:?})"
    );
    assert_eq!((stock, lines), (10, 1), "{outcome:?}");
}

/// The nested lockkit call a caller sells under after it let its own deadlock
/// go: it sells one unit of item 1 and records order line 2.
#[derive(Debug, Clone, Copy)]
enum Nested {
    WithLock,
    TransactionWithRetry,
}

impl Nested {
    const ALL: [Nested; 2] = [Nested::WithLock, Nested::TransactionWithRetry];
}

/// The sale of the nested lockkit call `$nested` ([`Nested`]) on `$conn`, an
/// `&mut Async` (a macro: each backend's module names its own `Async`).
macro_rules! nested_sale {
    ($nested:expr, $conn:expr) => {
        match $nested {
            Nested::WithLock => {
                lockkit::asynchronous::with_lock(
                    $conn,
                    1,
                    LockOptions::default(),
                    async |conn, item: Item| {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(item.stock - 1))
                            .execute(conn)
                            .await?;
                        order_line(conn, 2).await
                    },
                )
                .await
            }
            Nested::TransactionWithRetry => {
                lockkit::asynchronous::transaction_with_retry(
                    $conn,
                    &RetryPolicy::immediate(1),
                    async |conn: &mut Async| {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(items::stock - 1))
                            .execute(conn)
                            .await?;
                        order_line(conn, 2).await
                    },
                )
                .await
            }
        }
    };
}

/// After the caller let its own deadlock go and sold under a nested lockkit
/// call (`nested`): one run, an error, and nothing committed (on MariaDB no
/// transaction was open any more, so the sale would have committed alone).
fn assert_nested_sale_committed_nothing(
    nested: Nested,
    outcome: &Result<(), Error>,
    runs: u32,
    stock: i32,
    lines: i64,
) {
    assert_eq!(runs, 1);
    assert!(outcome.is_err(), "{outcome:?}");
    assert_eq!(
        (stock, lines),
        (10, 0),
        "the nested {nested:?}'s sale committed on its own, without order line 1: {outcome:?}"
    );
}

/// Kills `$conn`'s session from the server side (on a blocking admin
/// connection of `$db`), and gives the kill time to land.
macro_rules! kill_session {
    ($db:expr, $conn:expr) => {{
        let session = lockkit::asynchronous::lock_waits::session_id($conn)
            .await
            .unwrap();
        lockkit_tests::kill_session(&mut $db.connect(), BACKEND, session);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }};
}

/// The work of a call whose session is killed midway: it sets item 1's stock
/// to `$stock`, the server kills the session, and its next write fails.
macro_rules! written_then_killed {
    ($db:expr, $conn:expr, $stock:expr) => {{
        diesel::update(items::table.find(1))
            .set(items::stock.eq($stock))
            .execute($conn)
            .await?;
        kill_session!($db, $conn);
        diesel::update(items::table.find(1))
            .set(items::name.eq("never"))
            .execute($conn)
            .await?;
    }};
}

async_server_tests! {
    async fn a_session_the_server_killed_is_connection_lost(db) {
        // The blocking side's `faults.rs` case on diesel-async, whose drivers
        // word a closed connection their own way ("connection closed",
        // "Connection to the server is closed").
        use lockkit::asynchronous::prelude::*;
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut item = item!(&mut conn, 1);
        kill_session!(db, &mut conn);
        item.stock -= 1;
        let err = item.update_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::ConnectionLost), "{err:?}");
        assert!(!err.is_retryable());
    }

    async fn a_session_the_server_killed_inside_with_lock_writes_nothing(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |conn, item: Item| {
            written_then_killed!(db, conn, item.stock - 5);
            Ok::<_, Error>(())
        })
        .await;
        assert!(matches!(outcome, Err(Error::ConnectionLost)), "{outcome:?}");
        assert_eq!(lockkit_tests::stock_of!(&mut db.connect()), 10, "nothing half-written");
        let free = lockkit::asynchronous::with_lock(
            &mut async_common::connect::<Async>(&db.url, BACKEND).await,
            1,
            LockOptions::default().nowait(),
            async |_, _: Item| Ok::<_, Error>(()),
        )
        .await;
        assert!(free.is_ok(), "the row lock went with the session: {free:?}");
    }

    async fn a_session_the_server_killed_inside_an_idempotent_run_leaves_the_work_to_the_resend(db) {
        use diesel_migrations::MigrationHarness;
        use lockkit::asynchronous::idempotency;
        use lockkit::idempotency::{Idempotency, Outcome};
        use std::time::{Duration, Instant};
        db.conn().run_pending_migrations(lockkit_tests::idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        // A lease short enough for the resend to take over the key the killed
        // run left running.
        let keys = Idempotency { lease: Duration::from_millis(300), ..Idempotency::default() };
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = idempotency::run(&keys, &mut conn, "tenant", "order-1", "POST /orders", async |conn: &mut Async| {
            written_then_killed!(db, conn, items::stock - 1);
            Ok::<_, Error>("sold".to_owned())
        })
        .await;
        assert!(matches!(outcome, Err(Error::ConnectionLost)), "{outcome:?}");
        assert_eq!(lockkit_tests::stock_of!(&mut db.connect()), 10, "the killed run's work rolled back");
        // The client sends again, on a new connection, until the key is free.
        let deadline = Instant::now() + Duration::from_secs(10);
        let resent = loop {
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            let resent = idempotency::run(&keys, &mut conn, "tenant", "order-1", "POST /orders", async |conn: &mut Async| {
                diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1)).execute(conn).await?;
                Ok::<_, Error>("sold".to_owned())
            })
            .await;
            match resent {
                Err(Error::IdempotencyInProgress) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                resent => break resent,
            }
        };
        assert_eq!(resent.unwrap(), Outcome::Ran("sold".to_owned()));
        assert_eq!(lockkit_tests::stock_of!(&mut db.connect()), 9, "the work ran once");
        let again = idempotency::run(&keys, &mut async_common::connect::<Async>(&db.url, BACKEND).await, "tenant", "order-1", "POST /orders", async |_: &mut Async| -> Result<String, Error> {
            panic!("the work ran again")
        })
        .await;
        assert_eq!(again.unwrap(), Outcome::Replayed("sold".to_owned()));
    }

    async fn a_session_the_server_killed_inside_a_fenced_write_raises_no_fence(db) {
        use diesel_migrations::MigrationHarness;
        use lockkit::asynchronous::lease;
        use lockkit::lease::Fence;
        db.conn().run_pending_migrations(lockkit_tests::lease_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = lease::fenced(&mut conn, "item-1", Fence(7), async |conn: &mut Async| {
            written_then_killed!(db, conn, 20);
            Ok::<_, Error>(())
        })
        .await;
        assert!(matches!(outcome, Err(Error::ConnectionLost)), "{outcome:?}");
        assert_eq!(lockkit_tests::stock_of!(&mut db.connect()), 10, "nothing half-written");
        // The holder tries again with the same fence, on a new connection: it
        // lands, and an older fence is refused.
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        for (fence, stock) in [(7, 20), (6, 30)] {
            let written = lease::fenced(&mut conn, "item-1", Fence(fence), async |conn: &mut Async| {
                diesel::update(items::table.find(1)).set(items::stock.eq(stock)).execute(conn).await?;
                Ok::<_, Error>(())
            })
            .await;
            assert_eq!(written.is_ok(), fence == 7, "fence {fence}: {written:?}");
        }
        assert_eq!(lockkit_tests::stock_of!(&mut db.connect()), 20);
    }

    async fn a_deadlock_inside_a_nested_with_lock_that_the_caller_retries_loses_nothing(db) {
        // The caller's own transaction records order line 1, then sells one unit
        // under `with_lock`, retrying it as its own code would when the error
        // is retryable.
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            after_order_line_1!(conn, {
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let sold = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                        work(conn, attempt).await
                    })
                    .await;
                    match sold {
                        Err(err) if err.is_retryable() && attempt < 5 => continue,
                        sold => break sold,
                    }
                }
            })
        });
        assert_nested_deadlock_settled(BACKEND, &outcome, runs, stock, lines);
    }

    async fn a_deadlock_inside_a_nested_transaction_with_retry_loses_nothing(db) {
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            after_order_line_1!(conn, {
                let attempts = AtomicU32::new(0);
                lockkit::asynchronous::transaction_with_retry(conn, &RetryPolicy::immediate(5), async |conn| {
                    work(conn, attempts.fetch_add(1, Ordering::SeqCst) + 1).await
                })
                .await
            })
        });
        // PostgreSQL: retried in its savepoint, inside the outer transaction;
        // MySQL/MariaDB: not retried in a transaction the server has ended.
        assert_nested_deadlock_settled(BACKEND, &outcome, runs, stock, lines);
    }

    async fn a_deadlock_through_the_owners_lock_is_retried_by_the_owner(db) {
        // The blocking side's case of the same name: two orders, each a
        // `transaction_with_retry` that sells one of its first item, then one
        // of its second in a nested `transaction_with_retry`, deadlock on the
        // locks the outer transactions took. Only the owner's rollback lets
        // such a lock go: both orders must go through.
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let both_hold_their_first = tokio::sync::Barrier::new(2);
        let sell = async |conn: &mut Async, id: i32| -> Result<(), Error> {
            let item: Item = items::table.find(id).for_update().first(conn).await?;
            diesel::update(items::table.find(id)).set(items::stock.eq(item.stock - 1)).execute(conn).await?;
            Ok(())
        };
        let order = async |first: i32, second: i32| {
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            if BACKEND == "postgres" {
                // The deadlock check, once per wait: faster than the default 1 s.
                conn.batch_execute("SET deadlock_timeout = '100ms'").await.unwrap();
            }
            let attempts = AtomicU32::new(0);
            let outcome = lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::default(), async |conn| {
                sell(conn, first).await?;
                if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    both_hold_their_first.wait().await;
                }
                lockkit::asynchronous::transaction_with_retry(conn, &RetryPolicy::default(), async |conn| sell(conn, second).await).await
            })
            .await;
            (outcome, attempts.into_inner())
        };
        let (a, b) = tokio::join!(order(1, 2), order(2, 1));
        assert!(a.0.is_ok() && b.0.is_ok(), "{a:?} {b:?}");
        // One of them ran again, from its owner's new transaction (under load
        // the retry in the savepoint may meet the deadlock again with the
        // other as its victim, and then both owners run again).
        assert!((3..=4).contains(&(a.1 + b.1)), "{a:?} {b:?}");
        let mut fresh: Async = async_common::connect(&db.url, BACKEND).await;
        assert_eq!(stocks!(&mut fresh), vec![8, 8]);
    }

    async fn lock_all_after_a_plain_read_finds_a_row_deleted_since_missing(db) {
        // The blocking side's case of the same name: the key's row is asked of
        // the latest commit, not of the transaction's snapshot.
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |c| {
            let _: Item = items::table.find(1).first(c).await?;
            exec(&mut db.conn(), "DELETE FROM items WHERE id = 2");
            lockkit::asynchronous::lock_all::<Item, _>(c, &[1, 2]).await
        })
        .await;
        assert!(matches!(outcome, Err(Error::NotFound)), "{outcome:?}");
    }

    async fn a_write_after_a_failed_bind_and_a_swallowed_abort_is_refused(db) {
        // A statement that failed before it was sent (a bind that fails)
        // leaves the journal unsure whether a reply is unread. A lockkit write
        // after a deadlock the work let go is refused all the same, and so is
        // the work's own write after that: the probe finds the replies in
        // step, and the stand-in opens (a connection condemned in its place
        // let that write commit on its own).
        let (outcome, runs, stock, _) = deadlock_first_attempt!(db, |conn, work| {
            // A lockkit call before: the journal watches the connection from
            // then on, as it does a pooled connection lockkit used before.
            let none = diesel::update(orders::table.filter(orders::id.eq(-1))).set(orders::qty.eq(1));
            let _ = lockkit::asynchronous::atomic::update_if(&mut conn, none).await;
            after_order_line_1!(conn, {
                let _ = work(conn, 1).await; // the deadlock, let go
                let unbound = diesel::sql_query("UPDATE items SET stock = ? WHERE id = 1")
                    .bind::<diesel::sql_types::Integer, _>(Unbindable)
                    .execute(&mut *conn)
                    .await;
                assert!(unbound.is_err(), "a bind that fails");
                let sale = diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 5));
                let refused = lockkit::asynchronous::atomic::update_if(&mut *conn, sale).await;
                assert!(refused.is_err(), "{refused:?}");
                // The work lets that go too, and sells on.
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 5))
                    .execute(&mut *conn)
                    .await?;
                Ok::<_, Error>(())
            })
        });
        assert_eq!(runs, 1);
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(stock, 10, "a sale after the abort committed on its own: {outcome:?}");
    }

    async fn a_write_after_a_nested_abort_the_caller_swallows_is_refused(db) {
        // The caller's transaction records order line 1, tries to sell under
        // `with_lock`, ignores the failure (a fallback of its own) and records
        // order line 2. On MariaDB the deadlock ended the whole transaction: line
        // 2 must not be committed on its own.
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            after_order_line_1!(conn, {
                let sold = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                    work(conn, 1).await
                })
                .await;
                let _ = sold; // swallowed
                order_line(conn, 2).await?;
                Ok::<_, Error>(())
            })
        });
        assert_eq!(runs, 1);
        assert_swallowed_abort(BACKEND, &outcome, stock, lines);
    }

    async fn a_nested_call_whose_work_swallowed_an_abort_leaves_no_transaction_behind(db) {
        // The work under `with_lock` has a fallback of its own: it swallows the
        // deadlock and returns Ok, so lockkit's RELEASE SAVEPOINT is what fails.
        // Whatever the caller gets, once its transaction is over the connection
        // must be as diesel-async's books say: no transaction open, an
        // autocommit write goes through (a pool would hand it on as clean).
        // The caller: diesel-async's own transaction, then lockkit's outermost
        // `with_lock`.
        for lockkit_outside in [false, true] {
            exec(&mut db.conn(), "DELETE FROM orders");
            exec(&mut db.conn(), "DELETE FROM items");
            let after;
            let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
                {
                    let nested = async |conn: &mut Async| {
                        lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                            let _ = work(conn, 1).await; // a fallback of its own
                            Ok::<_, Error>(())
                        })
                        .await
                    };
                    let outcome = if lockkit_outside {
                        lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |conn, _: Item| nested(conn).await).await
                    } else {
                        after_order_line_1!(conn, {
                            nested(conn).await
                        })
                    };
                    after = Some(what_the_next_user_finds(&mut conn).await);
                    outcome
                }
            });
            assert_left_clean(after.unwrap(), &outcome, runs, stock, lines);
        }
    }

    async fn a_caller_that_rolls_back_after_a_nested_call_failed_at_release_commits_nothing(db) {
        // The work under `with_lock` swallows a failed statement (a duplicate
        // order line); PostgreSQL then refuses the savepoint's RELEASE. The
        // caller ignores the nested call's error, writes order line 2, and then
        // rolls its whole transaction back: nothing may be committed.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome: Result<(), Error> = after_order_line_1!(conn, {
            let nested = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                let _ = order_line(conn, 1).await; // a duplicate, swallowed
                Ok::<_, Error>(())
            })
            .await;
            let _ = nested; // swallowed
            let _ = order_line(conn, 2).await;
            Err(Error::InvalidInput("the caller rolls back"))
        });
        let mut fresh: Async = async_common::connect(&db.url, BACKEND).await;
        let lines: i64 = orders::table.count().get_result(&mut fresh).await.unwrap();
        assert_eq!(lines, 0, "the caller rolled back, yet order lines committed: {outcome:?}");
        assert!(matches!(outcome, Err(Error::InvalidInput(_))), "{outcome:?}");
    }

    async fn a_serialization_failure_inside_a_nested_transaction_with_retry_reruns_the_serializable_transaction(db) {
        // PostgreSQL: a serializable transaction whose snapshot predates another
        // connection's commit to item 1 cannot write item 1, in any savepoint:
        // only a new transaction can. The nested retry must leave that to the
        // owner (`serializable`), which runs the transaction again.
        if BACKEND != "postgres" {
            return; // InnoDB's SERIALIZABLE locks instead: nothing to fail here.
        }
        seed_items(&mut db.conn(), &[(1, 10)]);
        let url = db.url.clone();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let (outer, inner) = (AtomicU32::new(0), AtomicU32::new(0));
        let outcome: Result<(), Error> = lockkit::asynchronous::serializable(&mut conn, &RetryPolicy::immediate(5), async |conn| {
            let _: Item = items::table.find(1).first(conn).await?;
            if outer.fetch_add(1, Ordering::SeqCst) == 0 {
                // Another connection sells one unit after this snapshot.
                tokio::task::block_in_place(|| {
                    exec(&mut Sync::establish(&url).unwrap(), "UPDATE items SET stock = stock - 1 WHERE id = 1");
                });
            }
            lockkit::asynchronous::transaction_with_retry(conn, &RetryPolicy::immediate(5), async |conn| {
                inner.fetch_add(1, Ordering::SeqCst);
                diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1)).execute(conn).await?;
                Ok::<_, Error>(())
            })
            .await
        })
        .await;
        let (outer, inner) = (AtomicU32::load(&outer, Ordering::SeqCst), AtomicU32::load(&inner, Ordering::SeqCst));
        assert!(outcome.is_ok(), "{outcome:?} after {outer} serializable and {inner} nested attempts");
        assert_eq!(outer, 2, "{inner} nested attempts");
        let mut fresh: Async = async_common::connect(&db.url, BACKEND).await;
        let stock: i32 = items::table.find(1).select(items::stock).first(&mut fresh).await.unwrap();
        assert_eq!(stock, 8);
    }

    async fn a_top_level_transaction_with_retry_reruns_after_a_nested_abort(db) {
        // The owner of the outermost transaction may retry: the server rolled
        // everything back, and the next attempt is a new transaction.
        let attempts = AtomicU32::new(0);
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::immediate(5), async |conn| {
                let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                order_line(conn, attempt).await?;
                lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                    work(conn, attempt).await
                })
                .await
            })
            .await
        });
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!((runs, stock, lines), (2, 9, 1));
    }

    async fn a_top_level_transaction_with_retry_whose_work_swallows_a_nested_abort_runs_again(db) {
        // The work catches the nested call's failure and returns `Ok`. On
        // MariaDB the server has thrown order line 1 away: the owner of the
        // outermost transaction must run it again, not report success. The
        // victim is the nested call's read by key, or by a range, whose
        // deadlock the journal never sees (diesel-async told it the read
        // succeeded): the nested call confirms the abort with the server and
        // opens the stand-in, which the owner's question before COMMIT finds;
        // lockkit knew of that end, so the attempt runs again too.
        for by_range in [false, true] {
            let attempts = AtomicU32::new(0);
            let (outcome, runs, stock, lines) = deadlock_first_attempt!(@run by_range, db, |conn, work| {
                lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::immediate(5), async |conn| {
                    let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                    order_line(conn, attempt).await?;
                    let _ = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                        work(conn, attempt).await
                    })
                    .await; // swallowed
                    Ok(())
                })
                .await
            });
            assert!(outcome.is_ok(), "by range: {by_range}; {outcome:?}");
            if BACKEND == "postgres" {
                // Only the savepoint went: order line 1 committed, nothing sold.
                assert_eq!((runs, stock, lines), (1, 10, 1), "by range: {by_range}");
            } else {
                assert_eq!((runs, stock, lines), (2, 9, 1), "the thrown-away attempt reported as done; by range: {by_range}");
            }
        }
    }

    async fn async_nested_calls_after_the_caller_let_its_own_deadlock_go_commit_nothing(db) {
        // The async twins of lock_errors'
        // `a_nested_with_lock_after_the_caller_let_its_own_deadlock_go_commits_nothing`:
        // the caller's own statement is the deadlock's victim, the caller lets
        // it go and sells under a nested lockkit call. On MariaDB no
        // transaction is open any more: the sale must not commit on its own.
        for nested in Nested::ALL {
            let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
                lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::immediate(1), async |conn| {
                    order_line(conn, 1).await?;
                    let _ = work(conn, 1).await; // let go
                    nested_sale!(nested, conn)
                })
                .await
            });
            assert_nested_sale_committed_nothing(nested, &outcome, runs, stock, lines);
        }
    }

    async fn async_nested_calls_after_the_callers_locking_read_was_a_deadlocks_victim_commit_nothing(db) {
        // As above, but the caller's statement that is the victim is a read
        // whose deadlock comes in place of its rows (locking item 2 by a
        // range): lockkit's journal is told the read succeeded. The caller, in
        // its own diesel-async transaction or in lockkit's, lets the error go
        // and sells under a nested lockkit call.
        for nested in Nested::ALL {
            for lockkit_outside in [false, true] {
                let (outcome, runs, stock, lines) = deadlock_first_attempt!(by_range, db, |conn, work| {
                    let sell = async |conn: &mut Async| {
                        order_line(conn, 1).await?;
                        let _ = work(conn, 1).await; // let go
                        nested_sale!(nested, conn)
                    };
                    in_transaction!(lockkit_outside, &mut conn, sell)
                });
                assert_nested_sale_committed_nothing(nested, &outcome, runs, stock, lines);
            }
        }
    }

    async fn async_lock_all_and_claim_after_the_caller_let_a_deadlock_go_refuse(db) {
        // `lock_all` and `queue::claim` lock inside the caller's transaction:
        // after a deadlock the caller let go, on MariaDB they would run in
        // autocommit, their locks ending with their own statement, and return
        // rows as locked (claimed) that any other session may take at once.
        // They refuse, as a nested lockkit transaction does. (PostgreSQL keeps
        // the aborted transaction open, and refuses every statement in it.)
        // The victim is the caller's statement by key, or a read by a range
        // whose deadlock comes in place of its rows; the transaction is
        // lockkit's or diesel-async's own.
        exec(&mut db.conn(), "INSERT INTO jobs (id, payload) VALUES (1, 'job')");
        for by_range in [false, true] {
            for lockkit_outside in [false, true] {
                let seen = Mutex::new(None);
                let (_, runs, _, _) = deadlock_first_attempt!(@run by_range, db, |conn, work| {
                    let let_go = async |conn: &mut Async| {
                        let _ = work(conn, 1).await; // let go
                        let locked = lockkit::asynchronous::lock_all::<Item, _>(conn, &[1])
                            .await
                            .map(|rows| rows.len());
                        let claimed = lockkit::asynchronous::queue::claim::<Job, _, _>(
                            conn,
                            jobs::table.filter(jobs::done.eq(false)),
                            1,
                        )
                        .await
                        .map(|rows| rows.len());
                        *seen.lock().unwrap() = Some((locked, claimed));
                        Ok::<_, Error>(())
                    };
                    in_transaction!(lockkit_outside, &mut conn, let_go)
                });
                assert_eq!(runs, 1);
                let (locked, claimed) = seen.into_inner().unwrap().expect("the work ran");
                if BACKEND == "postgres" {
                    assert!(locked.is_err() && claimed.is_err(), "{locked:?} {claimed:?}");
                } else {
                    assert!(
                        matches!(locked, Err(Error::TransactionAborted(_)))
                            && matches!(claimed, Err(Error::TransactionAborted(_))),
                        "in a transaction the server had ended (victim by range: {by_range}, \
                         lockkit's transaction: {lockkit_outside}), lock_all returned {locked:?} \
                         and claim {claimed:?}"
                    );
                }
            }
        }
    }

    async fn async_single_writes_after_the_caller_let_its_own_deadlock_go_refuse(db) {
        // A versioned write and `update_if` write inside the caller's
        // transaction: after a deadlock the caller let go, on MariaDB they
        // would run in autocommit and commit on their own, whatever the
        // transaction's owner then does. They refuse, as `lock_all` does: in
        // lockkit's transaction (whose journal saw the deadlock), and in
        // diesel-async's own on a connection that has not served lockkit
        // before (the write installs the journal after the deadlock and asks
        // the server once). The victim is the caller's statement by key, or a
        // read by a range whose deadlock comes in place of its rows (the
        // journal is told the read succeeded, so the write asks the server).
        for (by_range, lockkit_outside) in [(false, true), (false, false), (true, true), (true, false)] {
            let seen = Mutex::new(None);
            let (outcome, runs, _, lines) = deadlock_first_attempt!(@run by_range, db, |conn, work| {
                let let_go = async |conn: &mut Async| {
                    let mut three: Item = items::table.find(3).first(conn).await?;
                    three.stock -= 1;
                    order_line(conn, 1).await?;
                    let _ = work(conn, 1).await; // let go
                    let versioned = lockkit::asynchronous::AsyncVersioned::update_versioned(&mut three, conn).await;
                    let sale = diesel::update(items::table.find(4)).set(items::stock.eq(items::stock - 1));
                    let conditional = lockkit::asynchronous::atomic::update_if(conn, sale).await;
                    *seen.lock().unwrap() = Some((versioned, conditional));
                    Ok::<_, Error>(())
                };
                in_transaction!(lockkit_outside, &mut conn, let_go)
            });
            assert_eq!(runs, 1);
            let (versioned, conditional) = seen.into_inner().unwrap().expect("the work ran");
            let stocks = committed_3_and_4!(db);
            assert_eq!(
                (stocks, lines),
                (vec![10, 10], 0),
                "a write committed on its own (lockkit's transaction: {lockkit_outside}, \
                 victim by range: {by_range}): {versioned:?} {conditional:?}, outcome {outcome:?}"
            );
            if BACKEND == "mysql" {
                assert!(
                    matches!(versioned, Err(Error::TransactionAborted(_)))
                        && matches!(conditional, Err(Error::TransactionAborted(_))),
                    "in a transaction the server had ended (lockkit's: {lockkit_outside}, \
                     victim by range: {by_range}), update_versioned returned {versioned:?} \
                     and update_if {conditional:?}"
                );
            }
        }
    }

    async fn async_idempotency_key_is_not_marked_done_for_work_the_server_rolled_back(db) {
        // The async twin of idempotency's
        // `a_key_is_not_marked_done_for_work_innodb_rolled_back`: the work
        // sells one unit and lets its deadlock go. The key must not replay
        // "sold" for a sale that never committed.
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::{fingerprint, Idempotency, Outcome};
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations(BACKEND))
            .unwrap();
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", b"{\"item\":1}");
        let (outcome, runs, stock, _) = deadlock_first_attempt!(db, |conn, work| {
            lockkit::asynchronous::idempotency::run(&keys, &mut conn, "tenant-1", "order-1", &request, async |c| {
                let _ = work(c, 1).await; // let go
                Ok::<_, Error>("201 sold".to_owned())
            })
            .await
            .map(|_| ())
        });
        assert_eq!(runs, 1);
        // The client retries with the same key.
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let again = lockkit::asynchronous::idempotency::run(&keys, &mut conn, "tenant-1", "order-1", &request, async |c| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(c)
                .await?;
            Ok::<_, Error>("201 sold".to_owned())
        })
        .await;
        let after: i32 = items::table.find(1).select(items::stock).first(&mut conn).await.unwrap();
        assert!(
            stock == 10 && matches!(again, Ok(Outcome::Ran(_))) && after == 9,
            "first run {outcome:?} (stock {stock}), the retry {again:?}: stock {after}, the unit \
             must be sold exactly once"
        );
    }
}

/// MySQL/MariaDB probes of the stand-in for an aborted transaction, the async
/// twins of the blocking side's (each test states what must hold).
mod stand_in_probes {
    use super::*;

    async_server_tests! {
        async fn a_stale_mark_and_a_savepoint_of_the_callers_named_lockkit_aborted_commit_nothing_the_caller_rolled_back(db) {
            // A connection on which a stand-in was once opened keeps the mark
            // (set by hand here). A later live transaction that has a savepoint
            // of that name, and a nested call that fails with the closure's own
            // error: nothing may be committed behind the caller's back.
            if BACKEND != "mysql" {
                return;
            }
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            conn.batch_execute("SET @lockkit_aborted = 1").await.unwrap();
            let nested = Mutex::new(None);
            let outcome: Result<(), Error> = after_order_line_1!(conn, {
                conn.batch_execute("SAVEPOINT lockkit_aborted").await?;
                order_line(conn, 2).await?;
                let failed = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |_, _: Item| {
                    Err::<(), _>(Error::InvalidInput("the work fails"))
                })
                .await;
                *nested.lock().unwrap() = Some(failed);
                Err(Error::InvalidInput("the caller rolls back"))
            });
            let nested = nested.into_inner().unwrap();
            let mut fresh: Async = async_common::connect(&db.url, BACKEND).await;
            let lines: i64 = orders::table.count().get_result(&mut fresh).await.unwrap();
            assert_eq!(lines, 0, "the caller rolled back, yet {lines} order line(s) committed; nested: {nested:?}, outcome: {outcome:?}");
            assert!(matches!(nested, Some(Err(Error::InvalidInput(_)))), "{nested:?}");
        }

        async fn a_nested_lock_timeout_the_caller_caught_leaves_its_commit_a_commit(db) {
            // The blocking side's case: the caller writes item 2 with a version
            // check, a nested with_lock on item 1 times out (held by another
            // connection), the server keeps the transaction, and the caller
            // catches the timeout and commits. The struct's next write must go
            // through, not be taken for one whose transaction rolled back.
            if BACKEND != "mysql" {
                return;
            }
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1").await.unwrap();
            let mut two: Item = items::table.find(2).first(&mut conn).await.unwrap();
            let (held_tx, held_rx) = mpsc::channel();
            // The holder lets go once the caller's transaction has returned
            // (or the test panicked and dropped the sender), never before the
            // nested call has timed out on its lock.
            let (release_tx, release_rx) = mpsc::channel::<()>();
            let url = db.url.clone();
            let holder = std::thread::spawn(move || {
                let mut conn = Sync::establish(&url).unwrap();
                conn.transaction(|conn| {
                    exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                    held_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                    diesel::QueryResult::Ok(())
                })
                .unwrap();
            });
            held_rx.recv().unwrap();
            let two_ref = &mut two;
            let committed: Result<(), Error> = conn
                .transaction(async |conn| {
                    two_ref.stock -= 1;
                    lockkit::asynchronous::AsyncVersioned::update_versioned(&mut *two_ref, conn).await?;
                    let timed_out = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |_, _: Item| Ok::<_, Error>(())).await;
                    assert!(matches!(timed_out, Err(Error::LockTimeout)), "{timed_out:?}");
                    Ok(())
                })
                .await;
            release_tx.send(()).unwrap();
            holder.join().unwrap();
            assert!(committed.is_ok(), "{committed:?}");
            two.stock -= 1;
            let again = lockkit::asynchronous::AsyncVersioned::update_versioned(&mut two, &mut conn).await;
            assert!(again.is_ok(), "the second write after a committed first: {again:?}");
        }
    }
}

#[cfg(all(feature = "async", feature = "postgres"))]
mod postgres_only {
    use super::*;
    use diesel_async::{AsyncPgConnection, RunQueryDsl};
    use lockkit_tests::TestDb;

    /// The work lets a failed statement go: PostgreSQL aborts the transaction
    /// and answers the `COMMIT` with `ROLLBACK`, without an error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_with_lock_does_not_report_success_for_work_postgres_rolled_back_at_commit() {
        let (db, mut conn) = async_common::seeded_pg("async_aborted_at_commit", &[(1, 10)]).await;
        let sold = lockkit::asynchronous::with_lock(
            &mut conn,
            1,
            LockOptions::default(),
            async |c, fresh: Item| {
                diesel::update(items::table.find(fresh.id))
                    .set(items::stock.eq(fresh.stock - 1))
                    .execute(c)
                    .await?;
                let failed = diesel::sql_query("SELECT 1 / 0").execute(c).await;
                assert!(failed.is_err());
                Ok::<_, Error>(())
            },
        )
        .await;
        let stock: i32 =
            diesel::RunQueryDsl::first(items::table.find(1).select(items::stock), &mut db.conn())
                .unwrap();
        assert!(
            sold.is_err(),
            "with_lock reported {sold:?}, and the sale is not in the database"
        );
        assert_eq!(stock, 10);
    }

    /// A thread holding item 2 locked (`FOR UPDATE`) on a connection of its
    /// own to `url` until told (or its sender dropped); returns once it holds it.
    fn item_2_held(url: &str) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (locked_tx, locked_rx) = mpsc::channel::<()>();
        let url = url.to_owned();
        let holder = std::thread::spawn(move || {
            let mut holder = diesel::PgConnection::establish(&url).unwrap();
            holder
                .transaction(|c| {
                    diesel::RunQueryDsl::first::<i32>(
                        items::table.find(2).for_update().select(items::stock),
                        c,
                    )?;
                    locked_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                    Ok::<_, diesel::result::Error>(())
                })
                .unwrap();
        });
        locked_rx.recv().unwrap();
        (release_tx, holder)
    }

    /// Lets item 2's holder ([`item_2_held`]) go, if not told yet, and waits
    /// for its thread unless that was joined already; then the stocks
    /// committed, in id order.
    fn stocks_once_let_go(
        db: &TestDb<diesel::PgConnection>,
        release_tx: &mpsc::Sender<()>,
        holder: Option<std::thread::JoinHandle<()>>,
    ) -> Vec<i32> {
        let _ = release_tx.send(());
        if let Some(holder) = holder {
            holder.join().unwrap();
        }
        diesel::RunQueryDsl::load(
            items::table.order(items::id).select(items::stock),
            &mut db.conn(),
        )
        .unwrap()
    }

    /// The blocking side's
    /// `a_retry_inside_with_lock_that_met_a_lock_timeout_lets_the_retry_around_it_run_again`:
    /// the work runs its update again in the transaction a lock timeout
    /// aborted; `with_lock` hands back the timeout, and the retry around it
    /// runs the whole transaction again once item 2 is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_inside_with_lock_that_met_a_lock_timeout_lets_the_retry_around_it_run_again() {
        let (db, mut conn) =
            async_common::seeded_pg("async_retry_inside_aborted", &[(1, 10), (2, 10)]).await;
        let (release_tx, holder) = item_2_held(&db.url);
        let mut holder = Some(holder);
        let wait = LockOptions::default().timeout(std::time::Duration::from_millis(200));
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            if attempts == 2 {
                // Released, and committed, before the second attempt.
                release_tx.send(()).unwrap();
                holder.take().unwrap().join().unwrap();
            }
            let sold =
                lockkit::asynchronous::with_lock(&mut conn, 1, wait, async |c, item: Item| {
                    // A retry of the update alone, inside the transaction.
                    let mut tries = 0;
                    loop {
                        tries += 1;
                        let written = diesel::update(items::table.find(2))
                            .set(items::stock.eq(items::stock - 2))
                            .execute(c)
                            .await
                            .map_err(Error::from);
                        match written {
                            Err(err) if err.is_retryable() && tries < 3 => continue,
                            other => other?,
                        };
                        break;
                    }
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(item.stock - 2))
                        .execute(c)
                        .await?;
                    Ok::<_, Error>(())
                })
                .await;
            match sold {
                Err(err) if err.is_retryable() && attempts < 3 => continue,
                other => break other,
            }
        };
        let stocks = stocks_once_let_go(&db, &release_tx, holder);
        assert!(
            outcome.is_ok() && attempts == 2 && stocks == [8, 8],
            "{outcome:?} after {attempts} attempt(s); stocks {stocks:?}"
        );
    }

    /// The blocking side's
    /// `a_nested_call_whose_work_let_a_lock_timeout_go_is_run_again_by_its_retry`:
    /// a nested `transaction_with_retry` whose work lets a lock timeout go and
    /// returns `Ok` hands back the timeout once its savepoint is rolled back,
    /// and runs again there once item 2 is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_call_whose_work_let_a_lock_timeout_go_is_run_again_by_its_retry() {
        use diesel_async::SimpleAsyncConnection;
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Mutex;
        let (db, mut conn) =
            async_common::seeded_pg("async_nested_swallowed_timeout", &[(1, 10), (2, 10)]).await;
        let (release_tx, holder) = item_2_held(&db.url);
        let holder = Mutex::new(Some(holder));
        let attempts = AtomicU32::new(0);
        let (holder, attempts_ref, release_tx) = (&holder, &attempts, &release_tx);
        let outcome = lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &lockkit::RetryPolicy::immediate(1),
            async |c: &mut AsyncPgConnection| {
                lockkit::asynchronous::transaction_with_retry(
                    c,
                    &lockkit::RetryPolicy::immediate(3),
                    async |c: &mut AsyncPgConnection| {
                        if attempts_ref.fetch_add(1, Ordering::SeqCst) + 1 == 2 {
                            // Released, and committed, before the second attempt.
                            release_tx.send(()).unwrap();
                            let released = holder.lock().unwrap().take();
                            released.unwrap().join().unwrap();
                        }
                        c.batch_execute("SET LOCAL lock_timeout = '200ms'").await?;
                        let _ = diesel::update(items::table.find(2))
                            .set(items::stock.eq(items::stock - 2))
                            .execute(c)
                            .await; // let go
                        Ok::<_, Error>(())
                    },
                )
                .await
            },
        )
        .await;
        let stocks = stocks_once_let_go(&db, release_tx, holder.lock().unwrap().take());
        let attempts = AtomicU32::load(&attempts, Ordering::SeqCst);
        assert!(
            outcome.is_ok() && attempts == 2 && stocks == [10, 8],
            "{outcome:?} after {attempts} attempt(s); stocks {stocks:?}"
        );
    }
}

#[cfg(all(feature = "async", feature = "mysql"))]
mod mysql_only {
    use super::*;
    use diesel::sql_types::Integer;

    type Sync = diesel::MysqlConnection;
    type Async = diesel_async::AsyncMysqlConnection;
    const BACKEND: &str = "mysql";

    #[derive(diesel::QueryableByName)]
    #[allow(dead_code)]
    struct Id {
        #[diesel(sql_type = Integer)]
        id: i32,
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lock_wait_timeout_not_put_back_after_the_commit_still_reports_the_commit() {
        // The blocking side's case of the same name (`row_locks.rs`): the
        // restore after `COMMIT` fails, and the committed work is `Ok`.
        let db = lockkit_tests::TestDb::<Sync>::new("async_restore_fails_after_commit");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let options = LockOptions::default().timeout(std::time::Duration::from_secs(1));
        let outcome =
            lockkit::asynchronous::with_lock(&mut conn, 1, options, async |c, item: Item| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(c)
                    .await?;
                c.batch_execute("SET @lockkit_lock_wait_timeout_0 = 'not a number'")
                    .await?;
                Ok::<_, Error>(())
            })
            .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(stock!(&mut conn), 9);
    }

    /// What the work of a top-level `transaction_with_retry` does around its
    /// sale and the hidden deadlock it lets go.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Around {
        /// Nothing more.
        Nothing,
        /// After the deadlock, writes item 3 with a statement of its own.
        WritesAfter,
        /// As `WritesAfter`, with MariaDB's `SET STATEMENT .. FOR`, which
        /// runs the write after `FOR`.
        WritesAfterInSetStatement,
        /// As `WritesAfter`, then waits for a job another session holds, and
        /// returns the lock wait timeout (which on a server without
        /// `--innodb-rollback-on-timeout` ends nothing: the end lockkit finds
        /// is the hidden deadlock's).
        WritesAfterThenTimesOut,
        /// Before it, puts item -1 in place (the deadlock's other side holds
        /// items 2 and up; an id of 0 would take the next AUTO_INCREMENT
        /// value), reads it and writes it with a versioned write.
        VersionedBefore,
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_top_level_transaction_with_retry_whose_work_lets_a_hidden_deadlock_go_runs_again_unless_it_wrote_after(
    ) {
        // The work's own read by a range is the deadlock's victim, which
        // diesel-async hides from the journal, and the work lets the error go.
        // Meanwhile another connection of the process opens a stand-in, so
        // lockkit asks the server before COMMIT and finds no transaction open.
        // The journal knows a read may have hidden a deadlock:
        // * nothing of the attempt committed, and it runs again (not the
        //   error for an end no statement reported);
        // * unless the work wrote after one of its reads: that write (item
        //   3's) ran in autocommit and committed on its own, and running the
        //   attempt again would sell item 3 twice; the owner reports the end,
        //   not retryable, and the attempt runs once;
        // * a versioned write before the deadlock asks the server first (a
        //   read of the work's own came before it); its own reads and write
        //   leave the journal as sure as its question did, so the attempt
        //   runs again;
        // * a lock wait timeout the work meets after its write, seen by the
        //   journal, does not make that write one made inside the
        //   transaction: the end is still not retryable.
        let all = [
            Around::Nothing,
            Around::WritesAfter,
            Around::WritesAfterInSetStatement,
            Around::WritesAfterThenTimesOut,
            Around::VersionedBefore,
        ];
        for around in all {
            let name = format!("async_hidden_deadlock_{around:?}").to_lowercase();
            let db = lockkit_tests::TestDb::<Sync>::new(&name);
            let mut holder = Sync::establish(&db.url).unwrap();
            if around == Around::WritesAfterThenTimesOut {
                exec(
                    &mut db.conn(),
                    "INSERT INTO jobs (id, payload) VALUES (7, 'held')",
                );
                exec(&mut holder, "BEGIN");
                exec(
                    &mut holder,
                    "UPDATE jobs SET payload = 'holder' WHERE id = 7",
                );
            }
            let attempts = AtomicU32::new(0);
            let (outcome, runs, stock, lines) = deadlock_first_attempt!(
                by_range,
                db,
                |conn, work| {
                    lockkit::asynchronous::transaction_with_retry(
                    &mut conn,
                    &RetryPolicy::immediate(5),
                    async |conn| {
                        let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                        order_line(conn, attempt).await?;
                        if around == Around::VersionedBefore {
                            conn.batch_execute(
                                "INSERT INTO items (id, name, stock, lock_version) VALUES (-1, 'item -1', 10, 0)",
                            )
                            .await?;
                            let mut extra: Item = items::table.find(-1).first(conn).await?;
                            extra.stock -= 1;
                            lockkit::asynchronous::AsyncVersioned::update_versioned(&mut extra, conn).await?;
                        }
                        let _ = work(conn, attempt).await; // let go
                        if matches!(around, Around::WritesAfter | Around::WritesAfterThenTimesOut) {
                            diesel::update(items::table.find(3))
                                .set(items::stock.eq(items::stock - 1))
                                .execute(conn)
                                .await?;
                        }
                        if around == Around::WritesAfterInSetStatement {
                            diesel::sql_query(
                                "SET STATEMENT max_statement_time = 5 FOR UPDATE items SET stock = stock - 1 WHERE id = 3",
                            )
                            .execute(conn)
                            .await?;
                        }
                        if around == Around::WritesAfterThenTimesOut && attempt == 1 {
                            conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1").await?;
                            conn.batch_execute("UPDATE jobs SET payload = 'work' WHERE id = 7").await?;
                        }
                        if attempt == 1 {
                            let mut other = Sync::establish(&db.url).unwrap();
                            lockkit_tests::aborts::open_a_stand_in(&mut other);
                        }
                        Ok(())
                    },
                )
                .await
                }
            );
            exec(&mut holder, "ROLLBACK");
            let mut fresh: Async = async_common::connect(&db.url, BACKEND).await;
            let others: Vec<(i32, i32)> = items::table
                .filter(items::id.eq_any([-1, 3]))
                .order(items::id)
                .select((items::id, items::stock))
                .load(&mut fresh)
                .await
                .unwrap();
            match around {
                Around::WritesAfter
                | Around::WritesAfterInSetStatement
                | Around::WritesAfterThenTimesOut => {
                    assert_eq!(
                        (runs, stock, lines, others),
                        (1, 10, 0, vec![(3, 9)]),
                        "{around:?}: the attempt ran again after its write committed on its own: {outcome:?}"
                    );
                    let err = outcome.expect_err("the transaction had ended under the work");
                    assert!(!err.is_retryable(), "{err:?}");
                }
                Around::Nothing | Around::VersionedBefore => {
                    assert!(outcome.is_ok(), "{around:?}: {outcome:?}");
                    let others_then = match around {
                        Around::VersionedBefore => vec![(-1, 9), (3, 10)],
                        _ => vec![(3, 10)],
                    };
                    assert_eq!(
                        (runs, stock, lines, others),
                        (2, 9, 1, others_then),
                        "{around:?}: the thrown-away attempt reported as done"
                    );
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retry_around_your_transaction_whose_write_followed_a_hidden_deadlock_runs_once() {
        // diesel-async's own transaction under lockkit's `retry`: the work
        // lets its deadlock go (hidden: its read by a range met it, or seen),
        // writes item 3 with a statement of its own (in autocommit: it
        // commits), then meets the end through lockkit: `update_if` asks the
        // server and refuses, or the work, inside a nested lockkit
        // transaction, fails and that call's end finds the caller's
        // transaction gone. The error says that a write may have committed
        // on its own: the retry does not run the work again and sell item 3
        // twice.
        let cases = [
            (true, false, "update_if"),
            (true, true, "update_if"),
            (false, true, "update_if"),
            (false, true, "its own error"),
        ];
        for (hidden, nested, then) in cases {
            let db = lockkit_tests::TestDb::<Sync>::new("async_retry_own_tx_hidden_deadlock");
            let (outcome, runs, _, _) = deadlock_first_attempt!(@run hidden, db, |conn, work| {
                let conn = tokio::sync::Mutex::new(&mut conn);
                lockkit::asynchronous::retry(&RetryPolicy::immediate(5), |attempt| {
                    let (conn, work) = (&conn, &work);
                    async move {
                        let mut guard = conn.lock().await;
                        let conn: &mut Async = &mut guard;
                        conn.transaction::<_, Error, _>(async |conn| {
                            let sale = async |conn: &mut Async| -> Result<(), Error> {
                                let _ = work(conn, attempt).await; // let go
                                diesel::update(items::table.find(3))
                                    .set(items::stock.eq(items::stock - 1))
                                    .execute(conn)
                                    .await?;
                                if then != "update_if" {
                                    return Err(Error::NoRowMatched);
                                }
                                let sale = lockkit::asynchronous::atomic::update(items::table.find(4))
                                    .set(items::stock.eq(items::stock - 1));
                                lockkit::asynchronous::atomic::update_if(conn, sale).await?;
                                Ok(())
                            };
                            match nested {
                                true => {
                                    let options = LockOptions::default();
                                    lockkit::asynchronous::locked_transaction(conn, options, sale).await
                                }
                                false => sale(conn).await,
                            }
                        })
                        .await
                    }
                })
                .await
            });
            let stocks = committed_3_and_4!(db);
            let case = format!("hidden: {hidden}, nested: {nested}, then {then}");
            assert_eq!(
                (runs, stocks),
                (1, vec![9, 10]),
                "{case}: the work ran again after its write committed on its own: {outcome:?}"
            );
            let err = outcome.expect_err("the transaction had ended under the work");
            assert!(!err.is_retryable(), "{case}: {err:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_nested_call_whose_read_after_its_write_was_the_deadlocks_victim_is_retried() {
        // Inside transaction_with_retry, a nested lockkit transaction's work
        // reads, sells item 1, then its read by a range is the deadlock's
        // victim (hidden from the journal) and the work returns that error.
        // The sale went with the rollback: the nested call's end reports a
        // retryable end, and the retry sells once.
        let db = lockkit_tests::TestDb::<Sync>::new("async_nested_victim_after_write");
        let attempts = AtomicU32::new(0);
        let (outcome, runs, stock, _) = deadlock_first_attempt!(by_range, db, |conn, work| {
            lockkit::asynchronous::transaction_with_retry(
                &mut conn,
                &RetryPolicy::immediate(5),
                async |conn| {
                    let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                    let options = LockOptions::default();
                    lockkit::asynchronous::locked_transaction(conn, options, async |conn| {
                        let _: Item = items::table.find(5).first(conn).await?;
                        work(conn, attempt).await?;
                        diesel::update(items::table.find(3))
                            .set(items::stock.eq(items::stock - 1))
                            .execute(conn)
                            .await?;
                        Ok(())
                    })
                    .await
                },
            )
            .await
        });
        assert!(outcome.is_ok(), "the deadlock was retried: {outcome:?}");
        assert_eq!((runs, stock), (2, 9), "item 1 sold once, in the second run");
        assert_eq!(committed_3_and_4!(db), vec![9, 10], "item 3 sold once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writes_after_a_read_of_the_work_ask_the_server_once() {
        // The question a lockkit write asks after a read of the work's own
        // (a deadlock may have come in place of its rows) costs one round
        // trip: the writes after it, whose reads are lockkit's own, ask
        // nothing more.
        use lockkit::asynchronous::prelude::*;
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let db = lockkit_tests::TestDb::<Sync>::new("async_writes_ask_once");
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let asks = Arc::new(AtomicUsize::new(0));
        let counted = asks.clone();
        conn.set_instrumentation(lockkit::journal::Journal::wrap(
            move |event: diesel::connection::InstrumentationEvent<'_>| {
                if let diesel::connection::InstrumentationEvent::StartQuery { query, .. } = event {
                    if query.to_string().contains("@@in_transaction") {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            },
        ));
        let seen = Mutex::new(Vec::new());
        lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &RetryPolicy::immediate(1),
            async |conn| {
                let mut one: Item = items::table.find(1).first(conn).await?;
                let mut two: Item = items::table.find(2).first(conn).await?;
                one.stock -= 1;
                one.update_versioned(conn).await?;
                seen.lock()
                    .unwrap()
                    .push(AtomicUsize::load(&asks, Ordering::SeqCst));
                two.stock -= 1;
                two.update_versioned(conn).await?;
                let sale = lockkit::asynchronous::atomic::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 1));
                lockkit::asynchronous::atomic::update_if(conn, sale).await?;
                seen.lock()
                    .unwrap()
                    .push(AtomicUsize::load(&asks, Ordering::SeqCst));
                Ok::<_, Error>(())
            },
        )
        .await
        .unwrap();
        assert_eq!(seen.into_inner().unwrap(), vec![1, 1]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn nested_with_lock_after_a_set_statement_read_was_a_deadlocks_victim_commits_nothing() {
        // MariaDB's `SET STATEMENT var = value FOR SELECT ..` answers with rows
        // like any SELECT, and a deadlock comes in place of them just the
        // same, though its first word is SET. The caller's transaction sends
        // only writes before it (lockkit's own read by key would have made the
        // journal ask anyway).
        let db = lockkit_tests::TestDb::<Sync>::new("set_statement_victim");
        lockkit_tests::aborts::seed_for_deadlock(&mut db.conn());
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        // An earlier lockkit call on the connection installed its journal.
        lockkit::asynchronous::with_lock(
            &mut conn,
            12,
            LockOptions::default(),
            async |_, _: Item| Ok::<_, Error>(()),
        )
        .await
        .unwrap();
        let (neighbour, a_tx, b_rx) = heavier_neighbour!(db);
        let outcome: Result<(), Error> = after_order_line_1!(conn, {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)
                .await?;
            a_tx.send(()).unwrap();
            tokio::task::block_in_place(|| b_rx.lock().unwrap().recv()).unwrap();
            // The victim's read, whose error the caller lets go.
            let _ = diesel::sql_query(
                "SET STATEMENT max_statement_time = 0 FOR \
                 SELECT id FROM items WHERE id >= 2 AND id < 3 FOR UPDATE",
            )
            .load::<Id>(conn)
            .await;
            nested_sale!(Nested::WithLock, conn)
        });
        tokio::task::block_in_place(|| neighbour.join()).unwrap();
        let (stock, lines) = committed!(db);
        assert_nested_sale_committed_nothing(Nested::WithLock, &outcome, 1, stock, lines);
    }
}

/// SQLite on diesel-async: a statement that rolls back the whole transaction
/// (a trigger's `RAISE(ROLLBACK, ..)`), whose error the work lets go, as on the
/// blocking side (`swallowed_errors.rs`).
#[cfg(all(feature = "async", feature = "sqlite"))]
mod sqlite_only {
    use super::*;
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use lockkit_tests::TestDb;

    type Async = SyncConnectionWrapper<SqliteConnection>;

    /// A database `name` with items of these stocks, whose update below zero
    /// rolls back the whole transaction, and a connection to it.
    async fn out_of_stock_db(
        name: &str,
        stocks: &[(i32, i32)],
    ) -> (TestDb<SqliteConnection>, Async) {
        let db = TestDb::<SqliteConnection>::new(name);
        seed_items(&mut db.conn(), stocks);
        exec(
            &mut db.conn(),
            lockkit_tests::SQLITE_OUT_OF_STOCK_ROLLS_BACK,
        );
        let conn = async_common::connect(&db.url, "sqlite").await;
        (db, conn)
    }

    /// The stocks on `$conn` are `$stocks` (nothing of the transaction, which
    /// said `$outcome`, committed), and `$refused`, lockkit's call after the
    /// rollback, refused.
    macro_rules! nothing_committed {
        ($conn:expr, $stocks:expr, $outcome:expr, $refused:expr) => {{
            let stocks = stocks!($conn);
            assert_eq!(
                stocks, $stocks,
                "nothing committed; the transaction said {:?}",
                $outcome
            );
            let refused = $refused;
            assert!(
                matches!(refused, Some(Err(Error::TransactionAborted(_)))),
                "lockkit's call after the rollback refused: {refused:?}"
            );
        }};
    }

    /// The sale of one unit of item `$id` under `with_lock` on `$conn`.
    macro_rules! sell {
        ($conn:expr, $id:expr) => {
            lockkit::asynchronous::with_lock(
                $conn,
                $id,
                LockOptions::default(),
                async |conn: &mut Async, item: Item| {
                    diesel::update(items::table.find(item.id))
                        .set(items::stock.eq(item.stock - 1))
                        .execute(conn)
                        .await
                        .map(drop)
                        .map_err(Error::from)
                },
            )
        };
    }

    /// Your own statement on `$conn`, in your own transaction, that item 1's
    /// trigger answers by rolling back the whole transaction; its error let go.
    macro_rules! oversell_item_1 {
        ($conn:expr) => {{
            let failed = diesel::update(items::table.find(1))
                .set(items::stock.eq(-1))
                .execute($conn)
                .await;
            assert!(failed.is_err(), "item 1 is out of stock");
        }};
    }

    /// In your own transaction on a database `$name`, a sale of item 2, then
    /// `$oversell` on `$conn`, a statement that answers with rows and that
    /// item 1's trigger answers by rolling back the whole transaction: the
    /// connection reports it as succeeded, its error reaches the work only,
    /// and the work lets it go. The sale after it, under `with_lock`, must
    /// refuse, and nothing commits.
    macro_rules! sale_after_a_rollback_in_place_of_rows_refuses {
        ($name:expr, |$conn:ident| $oversell:expr) => {{
            let (_db, mut conn) = out_of_stock_db($name, &[(1, 0), (2, 5)]).await;
            sell!(&mut conn, 2).await.unwrap(); // lockkit's journal watches the connection
            let mut refused = None;
            let outcome = conn
                .transaction::<(), Error, _>(async |$conn| {
                    sell!($conn, 2).await?;
                    let oversold = $oversell;
                    assert!(oversold.is_err(), "{oversold:?}");
                    refused = Some(sell!($conn, 2).await);
                    Ok(())
                })
                .await;
            nothing_committed!(&mut conn, vec![0, 4], outcome, refused);
        }};
    }

    /// The statement that answers with rows that SQLite's rollback answers.
    const OVERSELL_RETURNING: &str = "UPDATE items SET stock = -1 WHERE id = 1 RETURNING stock";

    /// The blocking side's
    /// `a_nested_call_after_lockkits_own_returning_write_rolled_back_refuses`
    /// (`swallowed_errors.rs`): lockkit's own `atomic::update_returning`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_call_after_lockkits_own_returning_write_rolled_back_refuses() {
        sale_after_a_rollback_in_place_of_rows_refuses!("async_raise_rollback_returning", |conn| {
            lockkit::asynchronous::atomic::update_returning::<_, _, lockkit_tests::Stock>(
                conn,
                diesel::sql_query(OVERSELL_RETURNING),
            )
            .await
        });
    }

    /// The blocking side's
    /// `a_nested_call_after_your_own_statement_that_answers_with_rows_rolled_back_refuses`
    /// (`swallowed_errors.rs`): your own statement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_call_after_your_own_statement_that_answers_with_rows_rolled_back_refuses() {
        sale_after_a_rollback_in_place_of_rows_refuses!("async_raise_rollback_own_read", |conn| {
            diesel::sql_query(OVERSELL_RETURNING)
                .load::<lockkit_tests::Stock>(conn)
                .await
        });
    }

    /// The blocking side's `a_work_that_returns_the_rollback_triggers_error_gets_it_back`
    /// (`swallowed_errors.rs`): a work that returns the trigger's error after
    /// SQLite rolled back the whole transaction gets that error, not the
    /// failed `ROLLBACK`'s, and the connection works on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_work_that_returns_the_rollback_triggers_error_gets_it_back() {
        let (_db, mut conn) =
            out_of_stock_db("async_raise_rollback_returned", &[(1, 0), (2, 5)]).await;
        let oversold = sell!(&mut conn, 1).await;
        assert!(
            oversold
                .as_ref()
                .is_err_and(|err| err.to_string().contains("out of stock")),
            "{oversold:?}"
        );
        sell!(&mut conn, 2).await.expect("the connection works on");
        assert_eq!(stocks!(&mut conn), vec![0, 4]);
    }

    /// The blocking side's `an_idempotency_key_is_kept_for_work_that_wrote_after_sqlites_rollback`
    /// (`swallowed_errors.rs`): a run whose work writes after SQLite rolled the
    /// whole transaction back, then panics, keeps its key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idempotency_key_is_kept_for_work_that_wrote_after_sqlites_rollback() {
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::Idempotency;
        let (db, mut conn) =
            out_of_stock_db("async_raise_rollback_idempotency", &[(1, 0), (2, 5)]).await;
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations("sqlite"))
            .unwrap();
        let keys = Idempotency::default();
        let panicked = async_common::caught_panic(async_common::run_order_1(
            &keys,
            &mut conn,
            async |c: &mut Async| -> Result<String, Error> {
                oversell_item_1!(&mut *c);
                sell_item_2!(c)?; // in autocommit
                panic!("a bug in the handler");
            },
        ))
        .await;
        assert!(panicked.is_err(), "the panic went on");
        async_common::assert_retry_in_progress(
            &keys,
            &mut conn,
            "the retry got",
            async |c: &mut Async| {
                sell_item_2!(c)?;
                Ok::<_, Error>("sold".to_owned())
            },
        )
        .await;
        assert_eq!(stocks!(&mut conn), vec![0, 4]);
    }

    /// A run nested in your transaction after SQLite rolled it back in place
    /// of a read's rows is refused, and leaves no key behind it: the client's
    /// retry runs the work, as on the blocking side (`swallowed_errors.rs`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idempotency_run_refused_after_a_rollback_in_place_of_rows_leaves_no_key() {
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::{Idempotency, Outcome};
        let (db, mut conn) =
            out_of_stock_db("async_raise_rollback_idempotency_nested", &[(1, 0), (2, 5)]).await;
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations("sqlite"))
            .unwrap();
        sell!(&mut conn, 2).await.unwrap(); // lockkit's journal watches the connection
        let keys = Idempotency::default();
        let sell = async |c: &mut Async| -> Result<String, Error> {
            sell_item_2!(c)?;
            Ok("sold".to_owned())
        };
        let mut refused = None;
        let outcome = conn
            .transaction::<(), Error, _>(async |c| {
                let oversold = diesel::sql_query(OVERSELL_RETURNING)
                    .load::<lockkit_tests::Stock>(c)
                    .await;
                assert!(oversold.is_err(), "{oversold:?}");
                refused = Some(async_common::run_order_1(&keys, c, sell).await);
                Ok(())
            })
            .await;
        let refused = refused.expect("the run was called");
        assert!(
            refused.is_err(),
            "{refused:?} (the transaction said {outcome:?})"
        );
        assert_eq!(
            stocks!(&mut conn),
            vec![0, 4],
            "nothing of the run committed"
        );
        let again = async_common::run_order_1(&keys, &mut conn, sell).await;
        assert!(
            matches!(again, Ok(Outcome::Ran(_))),
            "the retry got {again:?}"
        );
        assert_eq!(stocks!(&mut conn), vec![0, 3]);
    }

    /// One unit of each item of `$ids` sold on `$conn`, each result pushed to
    /// the `Mutex<Vec<_>>` `$after`: not one may commit on its own.
    macro_rules! sell_each {
        ($conn:expr, $ids:expr, $after:ident) => {
            for id in $ids {
                let sold = sell!($conn, id).await;
                $after.lock().unwrap().push(sold);
            }
        };
    }

    /// Every sale in `$after` refused, and the stocks on `$conn` still
    /// `$stocks`: nothing of the transaction, which said `$outcome`, committed.
    macro_rules! all_refused {
        ($conn:expr, $stocks:expr, $outcome:expr, $after:ident) => {
            for sold in $after.into_inner().unwrap() {
                nothing_committed!($conn, $stocks, $outcome, Some(sold));
            }
        };
    }

    /// `locked_transaction` on `$conn` whose work runs `$before` (where
    /// `$inner` names its connection), then sells one unit of each item of
    /// `$ids` ([`sell_each!`]): every one of those sales refuses, the stocks
    /// stay `$stocks`, and the call fails.
    macro_rules! every_sale_after_refused {
        ($conn:expr, $ids:expr, $stocks:expr, |$inner:ident| $before:block) => {{
            let after = Mutex::new(Vec::new());
            let outcome = lockkit::asynchronous::locked_transaction(
                $conn,
                LockOptions::default(),
                async |$inner: &mut Async| {
                    $before
                    sell_each!(&mut *$inner, $ids, after);
                    Ok::<_, Error>(())
                },
            )
            .await;
            all_refused!($conn, $stocks, outcome, after);
            assert!(outcome.is_err(), "{outcome:?}");
        }};
    }

    /// In your own transaction, your statement oversells item 1 (the trigger
    /// rolls back the whole transaction; its error let go), then `$write` runs
    /// on item 2 through `$conn`: it refuses, and nothing commits.
    macro_rules! write_after_your_own_rollback {
        ($name:expr, |$conn:ident| $write:expr) => {{
            let (_db, mut conn) = out_of_stock_db($name, &[(1, 0), (2, 5)]).await;
            let written = Mutex::new(None);
            let outcome = conn
                .transaction(async |$conn| {
                    oversell_item_1!($conn);
                    let result = $write;
                    *written.lock().unwrap() = Some(result);
                    Ok::<_, diesel::result::Error>(())
                })
                .await;
            nothing_committed!(&mut conn, [0, 5], outcome, written.into_inner().unwrap());
        }};
    }

    #[tokio::test]
    async fn a_versioned_write_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        use lockkit::asynchronous::prelude::*;
        write_after_your_own_rollback!("async_raise_rollback_own", |conn| {
            Item::update_by_version(conn, 2, 0, items::stock.eq(4)).await
        });
    }

    #[tokio::test]
    async fn an_atomic_update_returning_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        write_after_your_own_rollback!("async_raise_rollback_returning", |conn| {
            lockkit::asynchronous::atomic::update_returning::<_, _, lockkit_tests::Stock>(
                conn,
                diesel::sql_query(lockkit_tests::SELL_ITEM_2_RETURNING),
            )
            .await
        });
    }

    #[tokio::test]
    async fn a_rollback_of_the_whole_transaction_passed_up_with_question_mark_leaves_the_connection_whole(
    ) {
        let (_db, mut conn) =
            out_of_stock_db("async_raise_rollback_passed_up", &[(1, 0), (2, 5), (3, 5)]).await;
        let mine = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |conn: &mut Async| {
                sell!(&mut *conn, 3).await?;
                sell!(&mut *conn, 1).await
            },
        )
        .await;
        assert!(mine.is_err(), "{mine:?}");
        let yours = conn
            .transaction(async |conn| {
                sell!(&mut *conn, 3).await?;
                sell!(&mut *conn, 1).await
            })
            .await;
        assert!(yours.is_err(), "{yours:?}");
        // No transaction is left open in diesel-async's books or on the
        // server: lockkit's calls and your transactions go on.
        sell!(&mut conn, 2).await.unwrap();
        let again = conn
            .transaction(async |conn| {
                sell!(&mut *conn, 2).await?;
                Err::<(), _>(Error::NoRowMatched)
            })
            .await;
        assert!(matches!(again, Err(Error::NoRowMatched)), "{again:?}");
        sell!(&mut conn, 3).await.unwrap();
        let stocks = stocks!(&mut conn);
        assert_eq!(stocks, [0, 4, 4], "the rolled-back sale of item 2 undone");
        use diesel_async::{AsyncConnection, TransactionManager};
        let status = <Async as AsyncConnection>::TransactionManager::transaction_manager_status_mut(
            &mut conn,
        );
        assert_eq!(status.transaction_depth().unwrap(), None);
    }

    #[tokio::test]
    async fn lockkit_calls_after_a_nested_level_whose_count_diesel_dropped_refuse() {
        let (_db, mut conn) = out_of_stock_db(
            "async_raise_rollback_dropped_count",
            &[(1, 0), (2, 5), (3, 5)],
        )
        .await;
        every_sale_after_refused!(&mut conn, [2, 3], [0, 5, 5], |conn| {
            // A nested lockkit level, inside it a savepoint of your own,
            // inside that the sale of item 1, whose trigger rolls back the
            // whole transaction: your savepoint's end makes diesel-async
            // drop its count of open levels.
            let nested = lockkit::asynchronous::locked_transaction(
                &mut *conn,
                LockOptions::default(),
                async |conn: &mut Async| {
                    let yours = conn
                        .transaction(async |conn| sell!(&mut *conn, 1).await)
                        .await;
                    assert!(yours.is_err(), "item 1 is out of stock");
                    Ok::<_, Error>(())
                },
            )
            .await;
            assert!(nested.is_err(), "{nested:?}");
        });
    }

    #[tokio::test]
    async fn every_lockkit_call_after_a_statement_that_rolled_back_the_whole_transaction_refuses() {
        let (_db, mut conn) = out_of_stock_db(
            "async_raise_rollback_every",
            &[(1, 0), (2, 5), (3, 5), (4, 5)],
        )
        .await;
        // Item after item after the oversale: not one of them may commit on
        // its own.
        every_sale_after_refused!(&mut conn, [2, 4], [0, 5, 5, 5], |conn| {
            sell!(&mut *conn, 3).await?;
            assert!(
                sell!(&mut *conn, 1).await.is_err(),
                "item 1 is out of stock"
            );
        });
        // The connection is whole again once the transaction ended.
        sell!(&mut conn, 4).await.unwrap();
        let stocks = stocks!(&mut conn);
        assert_eq!(stocks, [0, 5, 5, 4]);
    }

    /// The blocking side's
    /// `sqlite_with_lock_commits_behind_a_reader_whatever_its_wait_for_the_lock`:
    /// in rollback-journal mode, `COMMIT` waits for a reader under the
    /// connection's own busy timeout, not `nowait()`'s or `timeout(..)`'s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_lock_commits_behind_a_reader_whatever_its_wait_for_the_lock() {
        use std::time::Duration;
        let db =
            lockkit_tests::db::RollbackJournalDb::new("async_commit_behind_a_reader", &[(1, 10)]);
        let waits = [
            LockOptions::default().nowait(),
            LockOptions::default().timeout(Duration::from_millis(50)),
        ];
        for options in waits {
            let (reading_tx, reading_rx) = mpsc::channel();
            let reader_url = db.url.clone();
            let reader = std::thread::spawn(move || {
                let mut reader = SqliteConnection::establish(&reader_url).unwrap();
                reader
                    .transaction(|r| {
                        // Holds the shared lock until its end.
                        let _: Vec<i32> =
                            diesel::RunQueryDsl::load(items::table.select(items::stock), r)?;
                        reading_tx.send(()).unwrap();
                        std::thread::sleep(Duration::from_millis(300));
                        Ok::<_, diesel::result::Error>(())
                    })
                    .unwrap();
            });
            reading_rx.recv().unwrap();
            let mut conn = Async::establish(&db.url).await.unwrap();
            conn.batch_execute("PRAGMA busy_timeout = 5000")
                .await
                .unwrap();
            let sell = async |c: &mut Async, _: Item| {
                let sql = "UPDATE items SET stock = stock - 1 WHERE id = 1";
                Ok::<_, Error>(c.batch_execute(sql).await?)
            };
            let outcome = lockkit::asynchronous::with_lock(&mut conn, 1, options, sell).await;
            reader.join().unwrap();
            assert!(outcome.is_ok(), "{options:?}: {outcome:?}");
        }
        let stock: i32 = diesel::RunQueryDsl::get_result(
            items::table.find(1).select(items::stock),
            &mut db.connect(),
        )
        .unwrap();
        assert_eq!(stock, 8);
    }
}
