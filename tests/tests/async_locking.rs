//! lockkit on diesel-async, on PostgreSQL, MariaDB and SQLite: the versioned
//! writes and their stale reports, `with_lock` / `lock_all`, and retry, each
//! with several connections on tasks of a multi-threaded runtime. A naive
//! read-modify-write through the same pool loses updates; the protected ones
//! give exact totals.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::Arc;
use std::time::Duration;

use async_common::{in_transaction, on_tasks, patient, rounds_on_tasks, RowHolder};
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use lockkit::asynchronous::prelude::*;
use lockkit::{CurrentState, Error, LockOptions, RetryPolicy};
use lockkit_tests::models::Item;
use lockkit_tests::observe::observe;
use lockkit_tests::schema::items;
use lockkit_tests::settings::{lock_timeout_query, Setting};
use lockkit_tests::{seed_items, ShopError};

const TASKS: usize = 8;
const ROUNDS: usize = 15;

/// Item 1 after `TASKS * ROUNDS` decrements of 1 from 1 000, each a versioned
/// write: the stock and the version moved together, none lost.
macro_rules! assert_every_decrement_counted {
    ($pool:expr) => {
        let total = (TASKS * ROUNDS) as i32;
        assert_eq!(
            stock_and_version!(&mut *$pool.get().await.unwrap()),
            (1_000 - total, total)
        );
    };
}

/// Item 1 at 1 000 and a pool of `TASKS` connections to `$db`; on each of
/// `TASKS` tasks, `$round` (one decrement of 1) runs `ROUNDS` times on a pooled
/// connection; then every decrement must be counted.
macro_rules! decrements_on_tasks {
    ($db:expr, $round:expr) => {
        seed_items(&mut $db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&$db.url, BACKEND, TASKS as u32).await;
        rounds_on_tasks(&pool, TASKS, ROUNDS, $round).await;
        assert_every_decrement_counted!(pool);
    };
}

async_backend_tests! {
    async fn with_lock_refuses_key_share_before_it_sends_anything(db) {
        // FOR KEY SHARE lets writers of the row's other columns through on
        // PostgreSQL: the closure's copy would not stay the row's.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let key_share = LockOptions::default().strength(lockkit::LockStrength::KeyShare);
        let refused = lockkit::asynchronous::with_lock(&mut conn, 1, key_share, async |_, _: Item| {
            Ok::<_, Error>(())
        })
        .await;
        assert!(matches!(refused, Err(Error::InvalidInput(_))), "{refused:?}");
        let _ = &mut conn;
    }

    async fn update_versioned_refuses_a_stale_struct_and_leaves_it_untouched(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut alice: Item = items::table.find(1).first(&mut conn).await.unwrap();
        let mut bob = alice.clone();

        alice.stock -= 8;
        alice.update_versioned(&mut conn).await.unwrap();
        assert_eq!(alice.lock_version, 1);

        bob.stock -= 8;
        let err = bob.update_versioned(&mut conn).await.unwrap_err();
        let Error::Stale(stale) = err else { panic!("{err}") };
        assert_eq!(stale.current, CurrentState::Version(1));
        assert_eq!(stale.expected_version, 0);
        assert_eq!((stale.table, stale.database_table), ("items", Some("items")));
        assert_eq!(bob.lock_version, 0);
        assert_eq!(stock_and_version!(&mut conn), (2, 1));

        // touch, update_versioned_with, update_by_version, delete: each checks
        // and bumps the version the same way.
        alice.touch_versioned(&mut conn).await.unwrap();
        assert_eq!(stock_and_version!(&mut conn), (2, 2));
        alice.update_versioned_with(&mut conn, items::stock.eq(items::stock + 5)).await.unwrap();
        assert_eq!(alice.lock_version, 3);
        assert_eq!(stock_and_version!(&mut conn), (7, 3));
        let next = Item::update_by_version(&mut conn, 1, 3, items::stock.eq(1)).await.unwrap();
        assert_eq!(next, 4);
        let err = Item::update_by_version(&mut conn, 1, 3, items::stock.eq(0)).await.unwrap_err();
        assert!(matches!(&err, Error::Stale(s) if s.current == CurrentState::Version(4)), "{err}");
        let err = alice.delete_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::Stale(_)), "{err}");
        alice.lock_version = 4;
        alice.delete_versioned(&mut conn).await.unwrap();
        let err = alice.update_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(&err, Error::Stale(s) if s.current == CurrentState::Deleted), "{err}");
    }

    async fn a_naive_read_modify_write_loses_updates(db) {
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        // Every task reads before any writes: the interleaving a busy server
        // produces now and then, forced.
        all_at_once!(pool, TASKS, |conn, all| read_modify_write!(conn, all.wait()).await.unwrap());
        let (stock, _) = stock_and_version!(&mut *pool.get().await.unwrap());
        assert_eq!(stock, 99, "{TASKS} sales, one recorded: the baseline loses updates");
    }

    async fn concurrent_versioned_decrements_with_retry_are_exact(db) {
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let written = on_tasks(TASKS, |_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            async move {
                let mut written = 0;
                for round in 0..ROUNDS {
                    lockkit::asynchronous::retry(&patient(), |attempt| {
                        let (pool, barrier) = (pool.clone(), barrier.clone());
                        async move {
                            let mut conn = pool.get().await.unwrap();
                            let mut item: Item = items::table.find(1).first(&mut *conn).await?;
                            if round == 0 && attempt == 1 {
                                // The naive test's interleaving: all read, then all write.
                                barrier.wait().await;
                            }
                            item.stock -= 1;
                            item.update_versioned(&mut *conn).await
                        }
                    })
                    .await
                    .unwrap();
                    written += 1;
                }
                written
            }
        })
        .await;
        assert_eq!(written, [ROUNDS; TASKS]);
        assert_every_decrement_counted!(pool);
    }

    async fn concurrent_with_lock_decrements_are_exact(db) {
        // An exclusive lock on a versioned row also advances its version.
        decrements_on_tasks!(db, async |conn: &mut Async| {
            lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, item: Item| {
                // Give the others time to queue behind the lock.
                tokio::task::yield_now().await;
                diesel::update(items::table.find(item.id))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(conn)
                    .await?;
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        });
    }

    async fn concurrent_transactions_with_retry_are_exact(db) {
        decrements_on_tasks!(db, async |conn: &mut Async| {
            lockkit::asynchronous::transaction_with_retry(conn, &patient(), async |conn| {
                let mut item: Item = items::table.find(1).first(conn).await?;
                tokio::task::yield_now().await;
                item.stock -= 1;
                item.update_versioned(conn).await?;
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        });
    }

    async fn with_lock_reports_missing_rows_and_rolls_back_on_the_closures_error(db) {
        seed_items(&mut db.conn(), &[(1, 5)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let missing = lockkit::asynchronous::with_lock(&mut conn, 2, LockOptions::default(), async |_conn, _item: Item| {
            Ok::<_, Error>(())
        })
        .await;
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");

        let refused = lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |conn, item: Item| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(0))
                .execute(conn)
                .await
                .map_err(Error::from)?;
            Err::<(), _>(ShopError::NotEnough(item.stock))
        })
        .await;
        assert!(matches!(refused, Err(ShopError::NotEnough(5))), "{refused:?}");
        // Rolled back: the stock and the version the lock bumped.
        assert_eq!(stock_and_version!(&mut conn), (5, 0));
        assert!(!in_transaction(&mut conn));
    }

    async fn nested_transaction_with_retry_retries_its_savepoint_while_the_transaction_lives(db) {
        // As on the blocking side: the savepoint is rolled back and run again,
        // inside the same outer transaction. (A server that ended the whole
        // transaction is not retried in it: see `async_lock_errors`.)
        seed_items(&mut db.conn(), &[(1, 5)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let inner_runs = std::sync::atomic::AtomicUsize::new(0);
        let outer_runs = std::sync::atomic::AtomicUsize::new(0);
        lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), async |conn| {
            outer_runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            lockkit::asynchronous::transaction_with_retry(conn, &RetryPolicy::immediate(3), async |conn| {
                let inner = inner_runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(conn)
                    .await?;
                if inner == 0 { Err(Error::Deadlock) } else { Ok(()) }
            })
            .await
        })
        .await
        .unwrap();
        let runs = |n: &std::sync::atomic::AtomicUsize| std::sync::atomic::AtomicUsize::load(n, std::sync::atomic::Ordering::SeqCst);
        assert_eq!((runs(&outer_runs), runs(&inner_runs)), (1, 2));
        // The first attempt's decrement went with its savepoint.
        assert_eq!(stock!(&mut conn), 4);
        assert!(!in_transaction(&mut conn));
    }

    async fn with_lock_reports_how_long_it_held_the_row(db) {
        seed_items(&mut db.conn(), &[(1, 5)]);
        let url = db.url.clone();
        let holds = holds_recorded_by(move || async move {
            let mut conn: Async = async_common::connect(&url, BACKEND).await;
            lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |conn, _: Item| {
                tokio::time::sleep(Duration::from_millis(80)).await;
                // Nested in the transaction above: its lock lasts until that
                // one ends, which lockkit does not see from here.
                lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |_, _: Item| Ok::<_, Error>(())).await
            })
            .await
            .unwrap();
        });
        assert_eq!(holds.len(), 1, "the outer with_lock's: {holds:?}");
        assert!(holds[0] >= 0.080, "{holds:?}");
    }

    async fn a_with_lock_dropped_or_panicking_in_its_closure_records_its_hold(db) {
        // A timeout around a lock held too long is the hold the warning is
        // for: the dropped call records it, and so does one whose closure
        // panics, as the blocking side does.
        seed_items(&mut db.conn(), &[(1, 5)]);
        let url = db.url.clone();
        let holds = holds_recorded_by(move || async move {
            let mut conn: Async = async_common::connect(&url, BACKEND).await;
            // The closure says when it is entered (the row is held), so that
            // the call is dropped 80 ms into its hold, however long it took
            // to get there.
            let entered = tokio::sync::Notify::new();
            let mut call = Box::pin(lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |_, _: Item| {
                entered.notify_one();
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, Error>(())
            }));
            tokio::select! {
                ended = &mut call => panic!("the call ended before its closure slept: {ended:?}"),
                () = entered.notified() => {}
            }
            assert!(tokio::time::timeout(Duration::from_millis(80), &mut call).await.is_err());
            drop(call);
            // Closed: the server rolls back what the dropped call left open.
            drop(conn);
            let panicked = tokio::spawn(async move {
                let mut conn: Async = async_common::connect(&url, BACKEND).await;
                lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |_, _: Item| {
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    if true {
                        panic!("the closure panics");
                    }
                    Ok::<_, Error>(())
                })
                .await
            });
            assert!(panicked.await.unwrap_err().is_panic());
        });
        assert_eq!(holds.len(), 2, "the dropped call's and the panicking one's: {holds:?}");
        assert!(holds.iter().all(|held| *held >= 0.040), "{holds:?}");
    }

    async fn nowait_skip_locked_and_timeout_on_a_held_row_and_the_setting_put_back(db) {
        seed_items(&mut db.conn(), &[(1, 5)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let holder = RowHolder::lock(async_common::connect::<Async>(&db.url, BACKEND).await).await;
        let before = lock_timeout_query(BACKEND).get_result::<Setting>(&mut conn).await.unwrap().value;
        for (options, expected) in [
            (LockOptions::default().nowait(), "Busy"),
            (LockOptions::default().skip_locked(), "Busy"),
            (LockOptions::default().timeout(Duration::from_millis(200)), "LockTimeout"),
        ] {
            let started = std::time::Instant::now();
            let result = lockkit::asynchronous::with_lock(&mut conn, 1, options, async |_conn, _item: Item| Ok::<_, Error>(())).await;
            let got = match result {
                Err(Error::Busy) => "Busy",
                Err(Error::LockTimeout) => "LockTimeout",
                other => panic!("{options:?}: {other:?}"),
            };
            assert_eq!(got, expected, "{options:?}");
            // MySQL/MariaDB count the lock wait in whole seconds.
            assert!(started.elapsed() < Duration::from_secs(5), "{options:?} waited {:?}", started.elapsed());
            assert!(!in_transaction(&mut conn));
            let after = lock_timeout_query(BACKEND).get_result::<Setting>(&mut conn).await.unwrap().value;
            assert_eq!(after, before, "{options:?}: the session's setting is put back");
        }
        if BACKEND == "mysql" {
            // The blocking side's statement: the session's value kept on the
            // server, in the user variable of transaction depth 0.
            let kept = diesel::sql_query("SELECT CAST(@lockkit_lock_wait_timeout_0 AS SIGNED) AS value")
                .get_result::<Setting>(&mut conn)
                .await
                .unwrap()
                .value;
            assert_eq!(kept, before);
        }
        holder.release().await;
    }

    async fn a_key_matching_several_rows_is_an_error_and_writes_nothing(db) {
        use lockkit_tests::models::Twin;
        use lockkit_tests::schema::twins;
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        for label in ["a", "b"] {
            diesel::insert_into(twins::table)
                .values((twins::id.eq(1), twins::label.eq(label), twins::lock_version.eq(0)))
                .execute(&mut conn)
                .await
                .unwrap();
        }
        let labels = || twins::table.order(twins::label).select((twins::label, twins::lock_version));
        let before: Vec<(String, i32)> = labels().load(&mut conn).await.unwrap();
        let mut twin = Twin { id: 1, label: "c".into(), lock_version: 0 };
        let err = twin.update_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::AmbiguousKey { table: "twins", .. }), "{err:?}");
        assert_eq!(twin.lock_version, 0);
        let err = twin.delete_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::AmbiguousKey { .. }), "{err:?}");
        assert_eq!(labels().load::<(String, i32)>(&mut conn).await.unwrap(), before, "nothing was written");
        assert!(!in_transaction(&mut conn));
    }

    /// The blocking side's `a_key_unique_in_the_connections_table_..`
    /// (`combined`): the key is asked of `lockkit_archive.items`, which
    /// enforces none, not of the connection's `items`, which does.
    async fn a_key_unique_in_the_connections_table_of_that_name_is_not_unique_in_the_archive(db) {
        use diesel_async::SimpleAsyncConnection;
        use lockkit_tests::models::Archived;
        seed_items(&mut db.conn(), &[(2, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        conn.batch_execute(&lockkit_tests::archive_sql(BACKEND, 2)).await.unwrap();
        conn.batch_execute("INSERT INTO lockkit_archive.items VALUES (2, 'twin', 10, 0)").await.unwrap();
        let mut item = item!(&mut conn, 2);
        item.update_versioned(&mut conn).await.unwrap();

        let mut archived = Archived { id: 2, name: "c".into(), stock: 0, lock_version: 0 };
        let err = archived.update_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::AmbiguousKey { table: "items", .. }), "{err:?}");
        let stored: Vec<(String, i32)> = lockkit_tests::archived(2).load(&mut conn).await.unwrap();
        assert_eq!(stored, [("archived".into(), 0), ("twin".into(), 0)], "nothing was written");
    }

    /// Whether the database enforces a table's key is a question about one
    /// database: a second database whose `items` enforces none is asked about
    /// its own, after the first database's `items` answered yes.
    async fn a_table_of_the_same_name_in_another_database_is_asked_about_its_own_key(db) {
        let unkeyed = lockkit_tests::TestDb::<Sync>::empty("async_unkeyed_items");
        lockkit_tests::exec(
            &mut unkeyed.connect(),
            "CREATE TABLE items (id INTEGER NOT NULL, name VARCHAR(100) NOT NULL, \
             stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); \
             INSERT INTO items VALUES (1, 'a', 10, 0); INSERT INTO items VALUES (1, 'b', 10, 0)",
        );
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut keyed: Async = async_common::connect(&db.url, BACKEND).await;
        let mut item = item!(&mut keyed, 1);
        item.update_versioned(&mut keyed).await.unwrap();

        let mut conn: Async = async_common::connect(&unkeyed.url, BACKEND).await;
        let mut twin = Item { id: 1, name: "c".into(), stock: 0, lock_version: 0 };
        let err = twin.update_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(err, Error::AmbiguousKey { table: "items", .. }), "{err:?}");
        let versions: Vec<i32> = items::table.select(items::lock_version).load(&mut conn).await.unwrap();
        assert_eq!(versions, [0, 0], "nothing was written");
    }

    async fn update_all_by_version_writes_every_row_or_none(db) {
        seed_items(&mut db.conn(), &[(1, 1), (2, 2), (3, 3)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let versions = Item::update_all_by_version(&mut conn, &[(3, 0), (1, 0)], items::stock.eq(0)).await.unwrap();
        assert_eq!(versions, [1, 1]);
        let err = Item::update_all_by_version(&mut conn, &[(1, 0), (2, 0), (3, 0)], items::stock.eq(7)).await.unwrap_err();
        let Error::StaleRows(stale) = err else { panic!("{err}") };
        let keys: Vec<_> = stale.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["1", "3"], "every stale row is named");
        let err = Item::update_all_by_version(&mut conn, &[(2, 0), (2, 0)], items::stock.eq(7)).await.unwrap_err();
        assert!(matches!(err, Error::DuplicateKey { .. }), "{err}");
        let rows: Vec<(i32, i32)> = items::table.order(items::id).select((items::stock, items::lock_version)).load(&mut conn).await.unwrap();
        assert_eq!(rows, [(0, 1), (2, 0), (0, 1)], "row 2 was not written");
        assert!(!in_transaction(&mut conn));
    }

    async fn lock_all_locks_in_key_order_inside_a_locked_transaction(db) {
        seed_items(&mut db.conn(), &[(1, 1), (2, 2), (3, 3)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outside: Result<Vec<Item>, _> = lockkit::asynchronous::lock_all(&mut conn, &[1]).await;
        assert!(matches!(outside, Err(Error::NotInTransaction)), "{outside:?}");
        let ids = lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |conn| {
            let rows: Vec<Item> = lockkit::asynchronous::lock_all(conn, &[3, 1, 3]).await?;
            Ok::<_, Error>(rows.iter().map(|r| (r.id, r.lock_version)).collect::<Vec<_>>())
        })
        .await
        .unwrap();
        assert_eq!(ids, [(1, 1), (3, 1)]);
        let missing = lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |conn| {
            lockkit::asynchronous::lock_all::<Item, _>(conn, &[1, 9]).await
        })
        .await;
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
    }

    /// The blocking `locking_in_opposite_orders_deadlocks_and_lock_all_never_does`:
    /// two tasks lock rows {1, 2} and {2, 1} through `lock_all`, in the same
    /// round each time, and write from what they read. No round may fail
    /// (a deadlock fails the test), and no decrement may be lost. On SQLite
    /// the writers take turns: the totals only.
    async fn lock_all_in_opposite_orders_never_deadlocks(db) {
        const ROUNDS: usize = 25;
        seed_items(&mut db.conn(), &[(1, 100), (2, 100)]);
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        // Every round's outcome, so that a task whose round failed still meets
        // the other at the next barrier, and the test fails instead of hanging.
        let outcomes = on_tasks(2, |task| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            let order = [[1, 2], [2, 1]][task];
            async move {
                let mut conn: Async = async_common::connect(&url, BACKEND).await;
                let mut outcomes = Vec::with_capacity(ROUNDS);
                for round in 0..ROUNDS {
                    barrier.wait().await;
                    let outcome = lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |conn| {
                        let rows: Vec<Item> = lockkit::asynchronous::lock_all(conn, &order).await?;
                        for row in rows {
                            diesel::update(items::table.find(row.id))
                                .set(items::stock.eq(row.stock - 1))
                                .execute(conn)
                                .await?;
                        }
                        Ok::<_, Error>(())
                    })
                    .await;
                    outcomes.push((order, round, outcome));
                }
                outcomes
            }
        })
        .await;
        for (order, round, outcome) in outcomes.into_iter().flatten() {
            outcome.unwrap_or_else(|e| panic!("lock_all never deadlocks: {order:?}, round {round}: {e:?}"));
        }
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let left = 100 - 2 * ROUNDS as i32;
        assert_eq!(stocks!(&mut conn), [left; 2], "every decrement counted");
        // Each lock_all advanced both rows' versions: every lock was taken.
        assert_eq!(each_item!(&mut conn, lock_version), [2 * ROUNDS as i32; 2]);
    }
}

/// The first half of the blocking
/// `locking_in_opposite_orders_deadlocks_and_lock_all_never_does`, the
/// baseline `lock_all_in_opposite_orders_never_deadlocks` is measured against:
/// one row at a time, {1, 2} against {2, 1}, each task holding its first row
/// when it asks for its second. The server must break the deadlock: one of
/// the two fails with `Deadlock`. (SQLite has no row locks.)
mod one_row_at_a_time {
    use super::*;

    async_server_tests! {
        async fn locking_one_row_at_a_time_in_opposite_orders_deadlocks(db) {
            seed_items(&mut db.conn(), &[(1, 100), (2, 100)]);
            let barrier = Arc::new(tokio::sync::Barrier::new(2));
            let outcomes = on_tasks(2, |task| {
                let (url, barrier) = (db.url.clone(), barrier.clone());
                let order = [[1, 2], [2, 1]][task];
                async move {
                    let mut conn: Async = async_common::connect(&url, BACKEND).await;
                    lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |conn| {
                        for (i, id) in order.into_iter().enumerate() {
                            let _: Item = items::table.find(id).for_update().first(conn).await?;
                            if i == 0 {
                                barrier.wait().await;
                            }
                        }
                        Ok::<_, Error>(())
                    })
                    .await
                }
            })
            .await;
            let deadlocks = outcomes.iter().filter(|o| matches!(o, Err(Error::Deadlock))).count();
            assert_eq!(deadlocks, 1, "{outcomes:?}");
            assert!(outcomes.iter().any(Result::is_ok), "the other went on: {outcomes:?}");
        }
    }
}

/// The row-lock holds on `items` that `work` records, run on a thread and a
/// single-threaded runtime of its own, so that what lockkit reports is seen
/// there only, and counted exactly.
fn holds_recorded_by<F: std::future::Future<Output = ()>>(
    work: impl FnOnce() -> F + Send + 'static,
) -> Vec<f64> {
    let ((), seen) = std::thread::spawn(move || {
        observe(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(work())
        })
    })
    .join()
    .unwrap();
    seen.histogram("lockkit_lock_hold_seconds{table=items}")
        .to_vec()
}

/// SQLite has no row locks: `lock_all` holds its rows by the database's write
/// lock, which a deferred transaction (`transaction_with_retry`, diesel-async's
/// own) does not have yet. It takes it, as the blocking `lock_all` does, also
/// for a model without a version (whose lock writes nothing).
#[cfg(feature = "sqlite")]
mod sqlite_only {
    use super::*;
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, SqliteConnection};
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use lockkit_tests::models::Job;
    use lockkit_tests::TestDb;

    type Async = SyncConnectionWrapper<SqliteConnection>;

    /// Whether another connection writes job 1 within 300 ms.
    fn another_writes(url: &str) -> bool {
        let mut other = SqliteConnection::establish(url).unwrap();
        other.batch_execute("PRAGMA busy_timeout = 300").unwrap();
        other
            .batch_execute("UPDATE jobs SET payload = 'other' WHERE id = 1")
            .is_ok()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn lock_all_in_a_deferred_transaction_holds_its_rows() {
        let db = TestDb::<SqliteConnection>::new("async_lock_all_deferred");
        db.conn()
            .batch_execute("INSERT INTO jobs (id, payload) VALUES (1, 'job')")
            .unwrap();
        let mut conn: Async = async_common::connect(&db.url, "sqlite").await;
        let url = db.url.clone();
        let free = lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &RetryPolicy::immediate(1),
            async |conn: &mut Async| {
                let rows: Vec<Job> = lockkit::asynchronous::lock_all(conn, &[1]).await?;
                assert_eq!(rows.len(), 1);
                let url = url.clone();
                Ok::<_, Error>(
                    tokio::task::spawn_blocking(move || another_writes(&url))
                        .await
                        .unwrap(),
                )
            },
        )
        .await
        .unwrap();
        assert!(
            !free,
            "another connection wrote the row that lock_all had just returned as locked"
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql_only {
    use super::*;
    use diesel::MysqlConnection;
    use diesel_async::AsyncMysqlConnection;
    use lockkit_tests::models::Sku;
    use lockkit_tests::schema::sku_codes;
    use lockkit_tests::TestDb;

    /// The blocking `lock_all_returns_a_row_once_for_keys_the_collation_holds_equal_across_chunks`
    /// on diesel-async: 899 fillers, then "K" and "k", which fall in two chunks
    /// of 900 keys and find one row under the column's collation. The row is
    /// returned, and its version advanced, once.
    #[tokio::test]
    async fn lock_all_returns_a_row_once_for_keys_the_collation_holds_equal_across_chunks() {
        let db = TestDb::<MysqlConnection>::new("async_lock_all_ci_across_chunks");
        let keys = lockkit_tests::seed_codes_across_chunks(&mut db.conn());
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let codes: Vec<String> = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |conn| {
                let rows: Vec<Sku> = lockkit::asynchronous::lock_all(conn, &keys).await?;
                Ok::<_, Error>(rows.into_iter().map(|sku| sku.code).collect())
            },
        )
        .await
        .unwrap();
        let k_rows = codes
            .iter()
            .filter(|code| code.eq_ignore_ascii_case("k"))
            .count();
        let version: i32 = sku_codes::table
            .find("K")
            .select(sku_codes::lock_version)
            .first(&mut conn)
            .await
            .unwrap();
        assert!(
            codes.len() == 900 && k_rows == 1 && version == 1,
            "{} rows, row K {k_rows} times, its version {version} (from 0)",
            codes.len()
        );
    }
}

/// As the blocking `row_locks.rs` shows: under READ COMMITTED a locking read
/// that waited for a transaction which deleted a row and inserted it again
/// skips the deleted row, and the new one is not in its snapshot. `lock_all`
/// must still return, and lock, the row of every key, in key order.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_all_locks_a_row_deleted_and_inserted_again_by_the_transaction_it_waited_for() {
    let db = lockkit_tests::TestDb::<diesel::PgConnection>::new("async_lock_all_reinserted");
    seed_items(&mut db.conn(), &[(1, 10), (2, 10), (3, 10)]);
    let locked = once_item_2_replaced(&db, |mut conn| async move {
        lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |c| {
            let rows: Vec<Item> = lockkit::asynchronous::lock_all(c, &[1, 2, 3]).await?;
            Ok::<_, Error>(rows.iter().map(|r| (r.id, r.stock)).collect::<Vec<_>>())
        })
        .await
    })
    .await;
    assert_eq!(locked.unwrap(), vec![(1, 10), (2, 7), (3, 10)]);
}

/// The same race for `with_lock`'s one row, with a lock that only reads
/// (`FOR SHARE`, not the versioned `FOR UPDATE` that bumps in its read): the
/// row exists, locked, and must come back, not `NotFound`.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_lock_locks_a_row_deleted_and_inserted_again_by_the_transaction_it_waited_for() {
    let db = lockkit_tests::TestDb::<diesel::PgConnection>::new("async_with_lock_reinserted");
    seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
    let locked = once_item_2_replaced(&db, |mut conn| async move {
        let options = LockOptions::default().share();
        lockkit::asynchronous::with_lock(&mut conn, 2, options, async |_, item: Item| {
            Ok::<_, Error>(item.stock)
        })
        .await
    })
    .await;
    assert!(matches!(locked, Ok(7)), "{locked:?}");
}

/// Runs `lock` on a new connection of `db`, in a task of its own, while
/// another transaction replaces item 2 (deletes it and inserts it again,
/// stock 7): the replacement commits once the server shows `lock`'s session
/// waiting for it. What `lock` returned.
#[cfg(feature = "postgres")]
async fn once_item_2_replaced<T, F, Fut>(
    db: &lockkit_tests::TestDb<diesel::PgConnection>,
    lock: F,
) -> T
where
    T: Send + 'static,
    F: FnOnce(diesel_async::AsyncPgConnection) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    use diesel::connection::SimpleConnection;
    use lockkit::asynchronous::lock_waits;
    let mut replacer = db.connect();
    replacer
        .batch_execute(lockkit_tests::REPLACE_ITEM_2_UNCOMMITTED)
        .unwrap();
    let mut conn: diesel_async::AsyncPgConnection =
        async_common::connect(&db.url, "postgres").await;
    let session = lock_waits::session_id(&mut conn).await.unwrap();
    let locker = tokio::spawn(lock(conn));
    let mut observer: diesel_async::AsyncPgConnection =
        async_common::connect(&db.url, "postgres").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !lock_waits::blocked_sessions(&mut observer)
        .await
        .unwrap()
        .iter()
        .any(|s| s.session == session)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the locked read never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    replacer.batch_execute("COMMIT").unwrap();
    locker.await.unwrap()
}

/// As the blocking `row_locks.rs` shows: a row committed while `lock_all`'s
/// second read waited (which skipped the row that read saw deleted) is found
/// by the last read by key, and must be locked and returned, not left out of
/// an `Ok`.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_all_locks_a_row_committed_while_its_second_read_waited() {
    use lockkit::asynchronous::lock_waits;
    let db = lockkit_tests::TestDb::<diesel::PgConnection>::new("async_lock_all_second_read");
    let mut scene = lockkit_tests::row_2_replaced::Row2ReplacedTwice::new(&db);
    let mut conn: diesel_async::AsyncPgConnection =
        async_common::connect(&db.url, "postgres").await;
    let session = lock_waits::session_id(&mut conn).await.unwrap();
    let locker = tokio::spawn(async move {
        lockkit::asynchronous::locked_transaction(&mut conn, LockOptions::default(), async |c| {
            let rows: Vec<Item> = lockkit::asynchronous::lock_all(c, &[1, 2]).await?;
            Ok::<_, Error>(rows.iter().map(|r| (r.id, r.stock)).collect::<Vec<_>>())
        })
        .await
    });
    let mut observer: diesel_async::AsyncPgConnection =
        async_common::connect(&db.url, "postgres").await;
    for blocker in [None, Some(scene.replacer_id)] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !lock_waits::blocked_sessions(&mut observer)
            .await
            .unwrap()
            .iter()
            .any(|s| s.session == session && blocker.is_none_or(|b| s.blocked_by == [b]))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "lock_all never waited for {blocker:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if blocker.is_none() {
            scene.replace_row_2_twice(&db);
        }
    }
    scene.commit_the_second();
    let locked = locker.await.unwrap();
    assert_eq!(locked.unwrap(), vec![(1, 10), (2, 7)]);
}
