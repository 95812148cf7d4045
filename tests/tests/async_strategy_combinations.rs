//! `strategy_combinations.rs`' idempotent sales on diesel-async, with
//! cancellation: idempotency keys, each sent by two tasks at once, whose work
//! nests `with_lock` or a versioned write and writes an order; a third of the
//! requests are dropped at a random point by `tokio::time::timeout` (the
//! client hangs up and sends the request again), and the lease is short, so
//! that dropped runs' keys are taken over. Every key's work is applied exactly
//! once and `stock + orders` stays exact.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_migrations::MigrationHarness;
use lockkit::asynchronous::idempotency;
use lockkit::asynchronous::prelude::*;
use lockkit::idempotency::Idempotency;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;
use lockkit_tests::schema::{items, orders};
use lockkit_tests::{idempotency_migrations, seed_items};

async_backend_tests! {
    async fn dropped_idempotent_runs_nesting_locks_apply_each_key_once(db) {
        const INITIAL: i32 = 10_000;
        const KEYS: i32 = 16;
        const TASKS: usize = 8;
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, INITIAL)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let keys = Idempotency {
            lease: Duration::from_millis(150),
            wait_while_running: Duration::from_millis(20),
            ..Idempotency::default()
        };
        let outcomes: Arc<Mutex<lockkit_tests::KeyAnswers>> = Arc::default();
        let dropped = Arc::new(AtomicUsize::new(0));
        let resent = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (pool, outcomes, dropped, resent) = (pool.clone(), outcomes.clone(), dropped.clone(), resent.clone());
            tasks.push(tokio::spawn(async move {
                for k in (0..KEYS).filter(|k| (*k as usize) % 4 == t % 4) {
                    let key = format!("order-{k}");
                    let deadline = Instant::now() + Duration::from_secs(60);
                    loop {
                        let mut conn = pool.get().await.unwrap();
                        let run = idempotency::run(&keys, &mut *conn, "tenant", &key, "POST /orders", async |c: &mut Async| {
                            if k % 2 == 0 {
                                lockkit::asynchronous::with_lock(c, 1, LockOptions::default(), async |c: &mut Async, item: Item| {
                                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(c).await?;
                                    Ok::<_, Error>(())
                                })
                                .await?;
                            } else {
                                let mut item = items::table.find(1).first::<Item>(&mut *c).await?;
                                item.stock -= 1;
                                item.update_versioned(&mut *c).await?;
                            }
                            tokio::time::sleep(Duration::from_micros(fastrand::u64(0..4000))).await;
                            diesel::insert_into(orders::table)
                                .values((orders::id.eq(lockkit_tests::next_order_id()), orders::item_id.eq(1), orders::qty.eq(k)))
                                .execute(&mut *c)
                                .await?;
                            Ok::<_, Error>(format!("order for key {k}"))
                        });
                        let result = if fastrand::u8(0..3) == 0 {
                            match tokio::time::timeout(Duration::from_micros(fastrand::u64(0..8000)), run).await {
                                Ok(result) => result,
                                Err(_) => {
                                    dropped.fetch_add(1, Ordering::Relaxed);
                                    drop(conn);
                                    tokio::time::sleep(Duration::from_millis(fastrand::u64(1..30))).await;
                                    continue;
                                }
                            }
                        } else {
                            run.await
                        };
                        drop(conn);
                        match result {
                            Ok(outcome) => {
                                outcomes.lock().unwrap().push((k, outcome));
                                break;
                            }
                            Err(err)
                                if (matches!(err, Error::IdempotencyInProgress | Error::TransactionAborted(..)) || err.is_retryable())
                                    && Instant::now() < deadline =>
                            {
                                resent.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(fastrand::u64(1..30))).await;
                            }
                            Err(err) => panic!("key {k}: {err:?}"),
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let mut conn = pool.get().await.unwrap();
        let stock = stock!(&mut *conn);
        let orders: Vec<i32> = orders::table.select(orders::qty).load(&mut *conn).await.unwrap();
        let outcomes = outcomes.lock().unwrap().clone();
        eprintln!(
            "{BACKEND}: {} outcomes, {} dropped, {} resends, stock {stock}, {} orders",
            outcomes.len(), AtomicUsize::load(&dropped, Ordering::Relaxed), AtomicUsize::load(&resent, Ordering::Relaxed), orders.len()
        );
        // A client whose run was dropped after its commit gets the replay when
        // it sends again: none of the two may have run it (at most one).
        lockkit_tests::audit_idempotent_sales(INITIAL, KEYS, stock, &orders, &outcomes, false);
    }
}
