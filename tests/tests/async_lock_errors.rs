//! lockkit on diesel-async when a lock call nested in a transaction is a
//! deadlock's victim: on MariaDB the server rolls back the whole transaction, and
//! nothing may run on as if only the savepoint had gone; the owner of the
//! outermost transaction runs it again. The async twins of the blocking side's
//! `lock_errors` cases.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use diesel::{Connection, ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::aborts::{assert_nested_deadlock_settled, assert_swallowed_abort};
use lockkit_tests::models::Item;
use lockkit_tests::schema::{items, orders};
use lockkit_tests::{exec, seed_items};

/// Seeds items 1 to 12 (stock 10), then runs `$run` on a new async connection
/// `$conn`, where `$work(conn, attempt)` sells one unit of item 1 and, on
/// attempt 1, becomes a deadlock's victim: it holds item 1 and waits for item 2,
/// which a heavier transaction on another connection holds while it waits for
/// item 1. InnoDB rolls back the lighter transaction; PostgreSQL's deadlock
/// check runs in the session that waited `deadlock_timeout` first, and the
/// other session's is set far higher. Gives `$run`'s outcome, how many times
/// `$work` ran, and item 1's stock and the number of order lines committed.
macro_rules! deadlock_first_attempt {
    ($db:expr, |$conn:ident, $work:ident| $run:expr) => {{
        seed_items(
            &mut $db.conn(),
            &(1..=12).map(|id| (id, 10)).collect::<Vec<_>>(),
        );
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let b_rx = Mutex::new(b_rx); // shared with the work's future
        let url = $db.url.clone();
        let neighbour = std::thread::spawn(move || {
            let mut conn = Sync::establish(&url).unwrap();
            if BACKEND == "postgres" {
                exec(&mut conn, "SET deadlock_timeout = '30s'");
            }
            conn.transaction(|conn| {
                exec(conn, "UPDATE items SET name = 'heavy' WHERE id >= 3");
                let _: Item = diesel::RunQueryDsl::first(items::table.find(2).for_update(), conn)?;
                b_tx.send(()).unwrap();
                a_rx.recv().unwrap();
                std::thread::sleep(Duration::from_millis(200));
                let _: Item = diesel::RunQueryDsl::first(items::table.find(1).for_update(), conn)?;
                diesel::QueryResult::Ok(())
            })
            .expect("the heavier transaction is never the victim");
        });
        let runs = AtomicU32::new(0);
        let $work = async |conn: &mut Async, attempt: u32| -> Result<(), Error> {
            runs.fetch_add(1, Ordering::SeqCst);
            let item: Item = items::table.find(1).for_update().first(conn).await?;
            diesel::update(items::table.find(1))
                .set(items::stock.eq(item.stock - 1))
                .execute(conn)
                .await?;
            if attempt == 1 {
                a_tx.send(()).unwrap();
                tokio::task::block_in_place(|| b_rx.lock().unwrap().recv()).unwrap();
                let _: Item = items::table.find(2).for_update().first(conn).await?;
            }
            Ok(())
        };
        let mut $conn: Async = async_common::connect(&$db.url, BACKEND).await;
        let outcome: Result<(), Error> = $run;
        tokio::task::block_in_place(|| neighbour.join()).unwrap();
        // What committed, seen from a new connection.
        let mut fresh: Async = async_common::connect(&$db.url, BACKEND).await;
        let stock: i32 = items::table
            .find(1)
            .select(items::stock)
            .first(&mut fresh)
            .await
            .unwrap();
        let lines: i64 = orders::table.count().get_result(&mut fresh).await.unwrap();
        (
            outcome,
            AtomicU32::load(&runs, Ordering::SeqCst),
            stock,
            lines,
        )
    }};
}

/// `INSERT`s order line `id`: the write whose fate the deadlock decides.
async fn order_line<A: SimpleAsyncConnection + Send>(conn: &mut A, id: u32) -> Result<(), Error> {
    let sql = format!("INSERT INTO orders (id, item_id, qty) VALUES ({id}, NULL, 1)");
    Ok(conn.batch_execute(&sql).await?)
}

async_server_tests! {
    async fn a_deadlock_inside_a_nested_with_lock_that_the_caller_retries_loses_nothing(db) {
        // The caller's own transaction records order line 1, then sells one unit
        // under `with_lock`, retrying it as its own code would when the error
        // is retryable.
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            conn.transaction(async |conn| {
                order_line(conn, 1).await?;
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
            .await
        });
        assert_nested_deadlock_settled(BACKEND, &outcome, runs, stock, lines);
    }

    async fn a_deadlock_inside_a_nested_transaction_with_retry_loses_nothing(db) {
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            conn.transaction(async |conn| {
                order_line(conn, 1).await?;
                let attempts = AtomicU32::new(0);
                lockkit::asynchronous::transaction_with_retry(conn, &RetryPolicy::immediate(5), async |conn| {
                    work(conn, attempts.fetch_add(1, Ordering::SeqCst) + 1).await
                })
                .await
            })
            .await
        });
        // PostgreSQL: retried in its savepoint, inside the outer transaction;
        // MySQL/MariaDB: not retried in a transaction the server has ended.
        assert_nested_deadlock_settled(BACKEND, &outcome, runs, stock, lines);
    }

    async fn a_write_after_a_nested_abort_the_caller_swallows_is_refused(db) {
        // The caller's transaction records order line 1, tries to sell under
        // `with_lock`, ignores the failure (a fallback of its own) and records
        // order line 2. On MariaDB the deadlock ended the whole transaction: line
        // 2 must not be committed on its own.
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            conn.transaction(async |conn| {
                order_line(conn, 1).await?;
                let sold = lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
                    work(conn, 1).await
                })
                .await;
                let _ = sold; // swallowed
                order_line(conn, 2).await?;
                Ok::<_, Error>(())
            })
            .await
        });
        assert_eq!(runs, 1);
        assert_swallowed_abort(BACKEND, &outcome, stock, lines);
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
}
