//! `lockkit::asynchronous::atomic` and `serializable` on PostgreSQL, MariaDB
//! and SQLite, on tasks of a multi-threaded runtime: with 8 tasks through a
//! bb8 pool, counters added in SQL are exact, a conditional update never
//! oversells, and a read-modify-write in `SERIALIZABLE` transactions, retried,
//! gives an exact total where the same code in plain transactions loses
//! updates; two tasks with a connection each in `SERIALIZABLE` transactions
//! keep the on-call invariant (no write skew).

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use async_common::{on_tasks, patient, rounds_on_tasks};
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use lockkit::asynchronous::atomic::{counter, update, update_counters, update_if};
use lockkit::Error;
use lockkit_tests::schema::{doctors, items};
use lockkit_tests::{exec, seed_items};

const TASKS: usize = 8;
const ROUNDS: usize = 25;

async_backend_tests! {
    async fn counters_added_by_eight_tasks_are_exact(db) {
        seed_items(&mut db.conn(), &[(1, 0)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        rounds_on_tasks(&pool, TASKS, ROUNDS, async |conn: &mut Async| {
            let written = update_counters(conn, items::table.find(1), counter(items::stock, 1)).await.unwrap();
            assert_eq!(written, 1);
        })
        .await;
        let mut conn = pool.get().await.unwrap();
        assert_eq!(stock_and_version!(&mut *conn), ((TASKS * ROUNDS) as i32, 0), "every increment counted; the version untouched");
        let missing = update_counters(&mut *conn, items::table.find(2), counter(items::stock, 1)).await;
        assert!(matches!(missing, Err(Error::NoRowMatched)), "{missing:?}");
    }

    async fn a_conditional_update_never_oversells_under_eight_tasks(db) {
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let sold = on_tasks(TASKS, |task| {
            let pool = pool.clone();
            async move {
                let mut sold = 0;
                loop {
                    let mut conn = pool.get().await.unwrap();
                    // Half the tasks send Diesel's statement, half the same SQL
                    // prepared once per connection.
                    let in_stock = items::table.find(1).filter(items::stock.ge(3));
                    let take = items::stock.eq(items::stock - 3);
                    let sale = if task % 2 == 0 {
                        update_if(&mut *conn, diesel::update(in_stock).set(take)).await
                    } else {
                        update_if(&mut *conn, update(in_stock).set(take)).await
                    };
                    match sale {
                        Ok(1) => sold += 3,
                        Err(Error::NoRowMatched) => return sold,
                        other => panic!("{other:?}"),
                    }
                }
            }
        })
        .await;
        assert_eq!(sold.iter().sum::<i32>(), 99, "33 sales of 3");
        assert_eq!(stock!(&mut *pool.get().await.unwrap()), 1);
    }

    async fn a_read_modify_write_in_serializable_transactions_retried_is_exact(db) {
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let attempts = Arc::new(AtomicU32::new(0));
        on_tasks(TASKS, |_| {
            let (pool, attempts) = (pool.clone(), attempts.clone());
            async move {
                for _ in 0..ROUNDS {
                    let mut conn = pool.get().await.unwrap();
                    lockkit::asynchronous::serializable(&mut *conn, &patient(), async |conn| {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        read_modify_write!(conn, tokio::task::yield_now()).await?;
                        Ok::<_, Error>(())
                    })
                    .await
                    .unwrap();
                }
            }
        })
        .await;
        let stock = stock!(&mut *pool.get().await.unwrap());
        assert_eq!(stock, 1_000 - (TASKS * ROUNDS) as i32, "no decrement lost");
        let attempts = AtomicU32::load(&attempts, Ordering::Relaxed);
        eprintln!("{BACKEND}: {} decrements in {attempts} attempts", TASKS * ROUNDS);
        // Nested in a transaction: refused, nothing sent.
        let mut conn = pool.get().await.unwrap();
        let nested = lockkit::asynchronous::transaction_with_retry(&mut *conn, &lockkit::RetryPolicy::immediate(1), async |conn| {
            lockkit::asynchronous::serializable(conn, &lockkit::RetryPolicy::immediate(1), async |_| Ok::<_, Error>(())).await
        })
        .await;
        assert!(matches!(nested, Err(Error::AlreadyInTransaction)), "{nested:?}");
    }

    async fn the_same_read_modify_write_in_plain_transactions_loses_updates(db) {
        // The baseline for the test above: READ COMMITTED (PostgreSQL) and
        // REPEATABLE READ (InnoDB) let two transactions read the same stock and
        // both write it back. SQLite's deferred transactions are refused
        // instead (SQLITE_BUSY on the upgrade), so it has no baseline here.
        if BACKEND == "sqlite" {
            return;
        }
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        all_at_once!(pool, TASKS, |conn, all| {
            lockkit::asynchronous::transaction_with_retry(&mut *conn, &patient(), async |conn| {
                read_modify_write!(conn, all.wait()).await?;
                Ok::<_, Error>(())
            })
            .await
            .unwrap()
        });
        let stock = stock!(&mut *pool.get().await.unwrap());
        assert_eq!(stock, 999, "{TASKS} decrements, one recorded");
    }

    async fn serializable_keeps_the_on_call_invariant(db) {
        // The blocking side's test (pessimistic.rs) on two tasks, each with a
        // connection of its own: two doctors on call; each may go off duty only
        // if another stays on. Both read "2 on call" before either writes.
        let doctors_sql = "INSERT INTO doctors (id, name, on_call) VALUES (1, 'alice', true), (2, 'bob', true)";
        exec(&mut db.conn(), doctors_sql);
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let went_off: Vec<bool> = on_tasks(2, |task| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            async move {
                let mut conn: Async = async_common::connect(&url, BACKEND).await;
                let policy = lockkit::RetryPolicy::default().max_attempts(10);
                let first = AtomicBool::new(true);
                let id = task as i32 + 1;
                lockkit::asynchronous::serializable(&mut conn, &policy, async |conn| {
                    let on_call = doctors::table.filter(doctors::on_call.eq(true)).count();
                    let on_call: i64 = on_call.get_result(&mut *conn).await?;
                    // Not on SQLite: its BEGIN IMMEDIATE keeps the second task
                    // out until the first commits, so it could not get here.
                    if first.swap(false, Ordering::Relaxed) && BACKEND != "sqlite" {
                        barrier.wait().await; // both have read "2 on call"
                    }
                    if on_call < 2 {
                        return Ok::<_, Error>(false);
                    }
                    let off = diesel::update(doctors::table.find(id)).set(doctors::on_call.eq(false));
                    off.execute(&mut *conn).await?;
                    Ok(true)
                })
                .await
                .unwrap()
            }
        })
        .await;
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let on_call = doctors::table.filter(doctors::on_call.eq(true));
        let on_call: i64 = on_call.count().get_result(&mut conn).await.unwrap();
        assert_eq!(on_call, 1, "one doctor stays on call: {went_off:?}");
        assert_eq!(went_off.iter().filter(|w| **w).count(), 1, "{went_off:?}");
    }
}
