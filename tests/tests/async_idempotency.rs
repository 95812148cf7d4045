//! Idempotency keys on diesel-async, on PostgreSQL, MariaDB and SQLite: eight
//! tasks of a multi-threaded runtime send one key through a bb8 pool; the work
//! runs once and all eight get the one stored response. A future dropped while
//! its work runs leaves the key running until the lease runs out, as a crashed
//! process does; then a repeat takes it over and runs the work, once.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_migrations::MigrationHarness;
use lockkit::asynchronous::idempotency;
use lockkit::idempotency::{fingerprint, Idempotency, Outcome};
use lockkit::Error;
use lockkit_tests::models::Item;
use lockkit_tests::schema::{items, lockkit_idempotency_keys};
use lockkit_tests::{idempotency_migrations, seed_items};
use serde::{Deserialize, Serialize};

const TASKS: usize = 8;

/// When the request that owns key `$key` took it, as `$conn` reads it.
macro_rules! started_at_of {
    ($conn:expr, $key:expr) => {
        lockkit_idempotency_keys::table
            .filter(lockkit_idempotency_keys::idempotency_key.eq($key))
            .select(lockkit_idempotency_keys::started_at)
            .first::<i64>($conn)
            .await
            .unwrap()
    };
}

/// The response a request stores and its repeats replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Order {
    order: usize,
    left: i32,
}

/// Sells one unit of item 1; the stock left.
macro_rules! sell_one {
    ($conn:expr) => {{
        diesel::update(items::table.find(1))
            .set(items::stock.eq(items::stock - 1))
            .execute(&mut *$conn)
            .await?;
        Ok::<i32, Error>(stock!(&mut *$conn))
    }};
}

/// Request `k` of tenant `t` (fingerprint `f`) under `$keys` on `$conn`, whose
/// work sells one unit of item 1 and answers as order `$order`: the retry
/// after a failed run of it.
macro_rules! sell_under_key_k {
    ($keys:expr, $conn:expr, $order:expr) => {
        idempotency::run(&$keys, $conn, "t", "k", "f", async |conn: &mut Async| {
            let left = sell_one!(conn)?;
            Ok::<_, Error>(Order {
                order: $order,
                left,
            })
        })
    };
}

/// A repeat of request `key` (tenant `tenant-1`, fingerprint `request`) on
/// `conn`, after the request completed: it replays `stored`, without running
/// the work.
async fn assert_replayed<C>(
    keys: &Idempotency,
    conn: &mut C,
    key: &str,
    request: &str,
    stored: Order,
) where
    C: idempotency::AsyncIdempotencyStore,
{
    let again = idempotency::run(
        keys,
        conn,
        "tenant-1",
        key,
        request,
        async |_conn: &mut C| -> Result<Order, Error> {
            panic!("a completed key must not run the work again")
        },
    )
    .await
    .unwrap();
    assert_eq!(again, Outcome::Replayed(stored));
}

async_backend_tests! {
    async fn eight_tasks_with_one_key_run_the_work_once_and_get_one_response(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let keys = Idempotency { wait_while_running: Duration::from_secs(20), ..Idempotency::default() };
        let request = fingerprint("POST", "/orders", br#"{"item":1,"qty":1}"#);
        let start = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (pool, runs, request, start) = (pool.clone(), runs.clone(), request.clone(), start.clone());
                tokio::spawn(async move {
                    let mut conn = pool.get().await.expect("pooled connection");
                    start.wait().await;
                    idempotency::run(&keys, &mut *conn, "tenant-1", "order-42", &request, async |conn: &mut Async| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        // The repeats arrive while this one holds the key.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let left = sell_one!(conn)?;
                        Ok::<_, Error>(Order { order: task, left })
                    })
                    .await
                    .unwrap()
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        assert_eq!(AtomicUsize::load(&runs, Ordering::SeqCst), 1, "the work ran once");
        let ran: Vec<&Order> = outcomes.iter().filter_map(|o| match o { Outcome::Ran(r) => Some(r), _ => None }).collect();
        assert_eq!(ran.len(), 1, "{outcomes:?}");
        let stored = ran[0].clone();
        assert_eq!(stored.left, 99);
        for outcome in &outcomes {
            assert_eq!(outcome.clone().into_inner(), stored, "every task got the stored response");
        }
        let mut conn = pool.get().await.unwrap();
        assert_eq!(stock!(&mut *conn), 99, "one unit sold");
        // Later repeats replay too, without running the work.
        assert_replayed(&keys, &mut *conn, "order-42", &request, stored).await;
    }

    async fn a_run_whose_work_gave_up_on_a_nested_call_stores_its_response(db) {
        // The work tries item 2 for 100 ms, gives up, and answers: the run
        // rolls back the savepoint the nested call left before it writes the
        // response, instead of writing it inside that savepoint and failing.
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100), (2, 100)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", br#"{"item":1,"qty":1}"#);
        let ran = idempotency::run(&keys, &mut conn, "tenant-1", "order-3", &request, async |conn: &mut Async| {
            let left = sell_one!(conn)?;
            let tried = tokio::time::timeout(
                Duration::from_millis(100),
                lockkit::asynchronous::with_lock(conn, 2, lockkit::LockOptions::default(), async |_conn, _item: Item| {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok::<_, Error>(())
                }),
            )
            .await;
            assert!(tried.is_err(), "the nested call was given up on");
            Ok::<_, Error>(Order { order: 3, left })
        })
        .await;
        let order = Order { order: 3, left: 99 };
        assert_eq!(ran.as_ref().ok(), Some(&Outcome::Ran(order.clone())), "the run returned {ran:?}");
        assert_eq!(stock!(&mut conn), 99);
        assert_replayed(&keys, &mut conn, "order-3", &request, order).await;
    }

    async fn a_dropped_run_holds_its_key_until_the_lease_then_a_repeat_runs_the_work_once(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 2).await;
        let keys = Idempotency { lease: Duration::from_millis(1500), ..Idempotency::default() };
        let request = fingerprint("POST", "/orders", b"1");
        let dropped = {
            let mut conn = pool.get().await.unwrap();
            tokio::time::timeout(
                Duration::from_millis(500),
                idempotency::run(&keys, &mut *conn, "tenant-1", "order-7", &request, async |conn: &mut Async| {
                    let left = sell_one!(conn)?;
                    // The client goes away while the work runs.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, Error>(Order { order: 1, left })
                }),
            )
            .await
        };
        assert!(dropped.is_err(), "the first request was cancelled");
        let dropped_at = std::time::Instant::now();
        let mut conn = pool.get().await.unwrap();
        assert_eq!(stock!(&mut *conn), 100, "the dropped work was rolled back");
        macro_rules! repeat {
            ($conn:expr) => {
                idempotency::run(&keys, $conn, "tenant-1", "order-7", &request, async |conn: &mut Async| {
                    let left = sell_one!(conn)?;
                    Ok::<_, Error>(Order { order: 2, left })
                })
            };
        }
        // Within the lease the key is still the crashed holder's.
        let early = repeat!(&mut *conn).await;
        assert!(matches!(early, Err(Error::IdempotencyInProgress)), "{early:?}");
        if dropped_at.elapsed() < Duration::from_millis(1700) {
            tokio::time::sleep(Duration::from_millis(1700) - dropped_at.elapsed()).await;
        }
        let late = repeat!(&mut *conn).await.unwrap();
        assert_eq!(late, Outcome::Ran(Order { order: 2, left: 99 }), "after the lease the repeat took the key over");
        assert_eq!(stock!(&mut *conn), 99, "the work took effect once");
        let replay = repeat!(&mut *conn).await.unwrap();
        assert_eq!(replay, Outcome::Replayed(Order { order: 2, left: 99 }));
    }

    async fn a_failed_work_releases_the_key_and_reuse_and_bad_input_are_refused(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let keys = Idempotency::default();
        let failed = idempotency::run(&keys, &mut conn, "t", "k", "f", async |conn: &mut Async| {
            sell_one!(conn)?;
            Err::<Order, _>(Error::InvalidInput("out of stock"))
        })
        .await;
        assert!(matches!(failed, Err(Error::InvalidInput("out of stock"))), "{failed:?}");
        assert_eq!(stock!(&mut conn), 100, "the failed work was rolled back");
        let retried = sell_under_key_k!(keys, &mut conn, 3).await.unwrap();
        assert_eq!(retried, Outcome::Ran(Order { order: 3, left: 99 }), "the released key ran again");
        let reused = idempotency::run(&keys, &mut conn, "t", "k", "another request", async |_conn: &mut Async| {
            Ok::<_, Error>(Order { order: 4, left: 0 })
        })
        .await;
        assert!(matches!(reused, Err(Error::IdempotencyKeyReused)), "{reused:?}");
        let bad = idempotency::run(&keys, &mut conn, "t", "a\0b", "f", async |_conn: &mut Async| {
            Ok::<_, Error>(Order { order: 5, left: 0 })
        })
        .await;
        assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
        assert_eq!(idempotency::purge_expired(&keys, &mut conn).await.unwrap(), 0, "nothing expired yet");
        let expired = Idempotency { retention: Duration::ZERO, ..keys };
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(idempotency::purge_expired(&expired, &mut conn).await.unwrap(), 1);
        lockkit_tests::exec(
            &mut db.conn(),
            "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, started_at) \
             VALUES ('t', 'crashed', 'f', 'running', 0)",
        );
        assert_eq!(
            idempotency::purge_expired(&keys, &mut conn).await.unwrap(),
            1,
            "a run abandoned past the retention"
        );
        // A dropped call leaves its transaction open and the connection
        // marked broken: a purge sent there would count deletes that never
        // commit, and keep the rows locked.
        lockkit_tests::exec(
            &mut db.conn(),
            "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, started_at) \
             VALUES ('t', 'crashed again', 'f', 'running', 0)",
        );
        async_common::drop_a_call_in_its_work(&mut conn).await;
        let purged = idempotency::purge_expired(&keys, &mut conn).await;
        assert!(matches!(purged, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))), "{purged:?}");
        drop(conn);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        assert_eq!(idempotency::purge_expired(&keys, &mut other).await.unwrap(), 1, "not purged before");
    }

    /// The blocking test of that name: the slow owner has its key when the
    /// fast request starts, past the lease, and goes on until the fast one
    /// has taken the key over, however late either task runs. Its sale must
    /// be rolled back and its run refused; the stock shows one sale.
    async fn an_owner_that_overruns_its_lease_is_rolled_back(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let keys = Idempotency { lease: Duration::from_millis(100), ..Idempotency::default() };
        let (claimed, has_claimed) = tokio::sync::oneshot::channel();
        let (starts, fast_starts) = tokio::sync::oneshot::channel::<()>();
        let url = db.url.clone();
        let slow = tokio::spawn(async move {
            let mut conn: Async = async_common::connect(&url, BACKEND).await;
            let mut watcher: Async = async_common::connect(&url, BACKEND).await;
            idempotency::run(&keys, &mut conn, "tenant-1", "k", "fp", async |conn: &mut Async| {
                let left = sell_one!(conn)?;
                let claimed_at = started_at_of!(&mut watcher, "k");
                claimed.send(()).unwrap();
                fast_starts.await.unwrap();
                if BACKEND == "sqlite" {
                    // The take-over waits for this transaction: it needs the
                    // database's write lock.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                } else {
                    let deadline = std::time::Instant::now() + Duration::from_secs(30);
                    while started_at_of!(&mut watcher, "k") == claimed_at {
                        assert!(std::time::Instant::now() < deadline, "the fast request never took the key over");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                Ok::<_, Error>(Order { order: 1, left })
            })
            .await
        });
        has_claimed.await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        starts.send(()).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let fast = idempotency::run(&keys, &mut conn, "tenant-1", "k", "fp", async |conn: &mut Async| {
            let left = sell_one!(conn)?;
            Ok::<_, Error>(Order { order: 2, left })
        })
        .await;
        let slow = slow.await.unwrap();
        if BACKEND == "sqlite" {
            // SQLite serializes writers: the take-over waits for the slow
            // owner's commit, then finds the key done.
            assert_eq!(slow.unwrap(), Outcome::Ran(Order { order: 1, left: 99 }));
            assert_eq!(fast.unwrap(), Outcome::Replayed(Order { order: 1, left: 99 }));
        } else {
            assert_eq!(fast.unwrap(), Outcome::Ran(Order { order: 2, left: 99 }), "took the expired lease over");
            assert!(matches!(slow, Err(Error::IdempotencyInProgress)), "{slow:?}");
        }
        assert_eq!(stock!(&mut conn), 99, "sold once");
    }

    /// The blocking test of that name, clients A and B sending the same key
    /// and request at the same time: each runs its own order, and never gets
    /// the other's stored response.
    async fn a_key_belongs_to_its_principal(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 2).await;
        let keys = Idempotency { wait_while_running: Duration::from_secs(20), ..Idempotency::default() };
        let request = fingerprint("POST", "/orders", br#"{"item":1,"qty":1}"#);
        macro_rules! order_for {
            ($conn:expr, $request:expr, $principal:expr, $who:expr) => {
                idempotency::run(&keys, $conn, $principal, "order-1", $request, async |conn: &mut Async| {
                    sell_one!(conn)?;
                    // The other client's request arrives while this one runs.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Error>(format!("201 order for {}", $who))
                })
            };
        }
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let both = async_common::on_tasks(2, |n| {
            let (pool, start, request) = (pool.clone(), start.clone(), request.clone());
            let (principal, who) = [("client-a", "a"), ("client-b", "b")][n];
            async move {
                let mut conn = pool.get().await.expect("pooled connection");
                start.wait().await;
                order_for!(&mut *conn, &request, principal, who).await.unwrap()
            }
        })
        .await;
        assert_eq!(both, [Outcome::Ran("201 order for a".to_owned()), Outcome::Ran("201 order for b".to_owned())]);
        let mut conn = pool.get().await.unwrap();
        assert_eq!(stock!(&mut *conn), 98, "both orders ran");
        // Each replays its own.
        for (who, response) in [("client-a", "201 order for a"), ("client-b", "201 order for b")] {
            let again = idempotency::run(&keys, &mut *conn, who, "order-1", &request, async |_conn: &mut Async| -> Result<String, Error> {
                panic!("ran twice")
            })
            .await;
            assert_eq!(again.unwrap(), Outcome::Replayed(response.to_owned()));
        }
        // Principals are compared exactly too.
        let c = order_for!(&mut *conn, &request, "CLIENT-A", "c").await.unwrap();
        assert_eq!(c, Outcome::Ran("201 order for c".to_owned()));
        for bad in ["", "\0"] {
            let refused = order_for!(&mut *conn, &request, bad, "nobody").await;
            assert!(matches!(refused, Err(Error::InvalidInput(_))), "{bad:?}: {refused:?}");
        }
        assert_eq!(stock!(&mut *conn), 97);
    }

    /// The blocking test of that name: three clients send one key three
    /// times each, all at once. Each client's work runs once; its repeats get
    /// its response or are refused while it runs, never another client's.
    async fn concurrent_clients_sharing_a_key_each_run_once(db) {
        const CLIENTS: usize = 3;
        const REPEATS: usize = 3;
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, (CLIENTS * REPEATS) as u32).await;
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", b"qty=1");
        let start = Arc::new(tokio::sync::Barrier::new(CLIENTS * REPEATS));
        let outcomes = async_common::on_tasks(CLIENTS * REPEATS, |n| {
            let (pool, start, request) = (pool.clone(), start.clone(), request.clone());
            let client = n % CLIENTS;
            async move {
                let mut conn = pool.get().await.expect("pooled connection");
                start.wait().await;
                let principal = format!("client-{client}");
                let ran = idempotency::run(&keys, &mut *conn, &principal, "order-1", &request, async |conn: &mut Async| {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    sell_one!(conn)?;
                    Ok::<_, Error>(format!("201 for client-{client}"))
                })
                .await;
                (client, ran)
            }
        })
        .await;
        lockkit_tests::audit_clients_sharing_a_key(CLIENTS, &outcomes);
        let mut conn = pool.get().await.unwrap();
        assert_eq!(stock!(&mut *conn), 100 - CLIENTS as i32, "once per client");
    }
}

/// A run whose work panics, on a task of a server that lives on (tokio turns
/// the task's panic into a `JoinError`): the work is rolled back and the key
/// released before the panic goes on, so the client's retry runs the work, as
/// after any other failure (not refused for the whole lease, as after a crash).
mod a_panicking_work {
    use super::*;

    async_backend_tests! {
        async fn a_work_that_panics_releases_its_key_for_the_retry(db) {
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 100)]);
            let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 2).await;
            let keys = Idempotency::default();
            let first = {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut conn = pool.get().await.expect("pooled connection");
                    idempotency::run(&keys, &mut *conn, "tenant-1", "order-7", "POST /orders", async |conn: &mut Async| {
                        let left = sell_one!(conn)?;
                        let bug = left >= 0;
                        if bug {
                            panic!("a bug in the handler");
                        }
                        Ok::<_, Error>(Order { order: 1, left })
                    })
                    .await
                })
                .await
            };
            assert!(first.is_err(), "the task panicked");
            let mut conn = pool.get().await.expect("pooled connection");
            assert_eq!(stock!(&mut *conn), 100, "the work was rolled back");
            let retry = idempotency::run(&keys, &mut *conn, "tenant-1", "order-7", "POST /orders", async |conn: &mut Async| {
                let left = sell_one!(conn)?;
                Ok::<_, Error>(Order { order: 2, left })
            })
            .await;
            assert!(matches!(&retry, Ok(Outcome::Ran(_))), "the retry after a rolled-back run: {retry:?}");
        }
    }
}

/// On the servers, where taking a key waits for another session's uncommitted
/// take of it.
mod waiting {
    use super::*;
    use diesel_async::AsyncConnection;

    async_server_tests! {
        async fn your_own_transaction_around_a_run_dropped_while_taking_its_key_fails(db) {
            // The take of the key (an INSERT in a savepoint of its own) waits
            // for `other`'s take of the same key, still open in `other`'s
            // transaction; the run is given up on right there. Your
            // transaction must not then commit nothing and say Ok.
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 100)]);
            let keys = Idempotency::default();
            let request = fingerprint("POST", "/orders", br#"{"item":1,"qty":1}"#);
            let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
            let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
            let other_url = db.url.clone();
            let other = tokio::spawn(async move {
                let mut other: Async = async_common::connect(&other_url, BACKEND).await;
                let keys = Idempotency::default();
                let request = fingerprint("POST", "/orders", br#"{"item":1,"qty":1}"#);
                let _ = other
                    .transaction(async |conn| {
                        idempotency::run(&keys, conn, "tenant-1", "order-9", &request, async |_conn: &mut Async| {
                            Ok::<_, Error>(Order { order: 0, left: 0 })
                        })
                        .await?;
                        taken_tx.send(()).unwrap();
                        let _ = release_rx.await;
                        // Rolled back: the key is free again.
                        Err::<(), _>(Error::NoRowMatched)
                    })
                    .await;
            });
            taken_rx.await.unwrap();
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            let transaction = conn.transaction(async |conn| {
                sell_one!(conn)?;
                let tried = tokio::time::timeout(
                    Duration::from_millis(300),
                    idempotency::run(&keys, conn, "tenant-1", "order-9", &request, async |_conn: &mut Async| {
                        Ok::<_, Error>(Order { order: 1, left: 0 })
                    }),
                )
                .await;
                assert!(tried.is_err(), "the run was given up on while it waited for the key");
                Ok::<_, Error>(())
            });
            // A commit sent behind the waiting INSERT would wait for `other`,
            // which lets go only after it.
            let outcome = async_common::ended_without_waiting_for(transaction, "take").await;
            drop(conn);
            release.send(()).unwrap();
            other.await.unwrap();
            let mut check: Async = async_common::connect(&db.url, BACKEND).await;
            let left = stock!(&mut check);
            assert!(
                matches!(outcome, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) && left == 100,
                "the transaction returned {outcome:?}, and item 1's stock is {left}"
            );
        }

        async fn a_repeat_while_a_key_whose_take_waited_past_the_lease_runs_is_refused(db) {
            // A takes the key in its own transaction, holds it past the
            // lease and rolls back. B's take waited all that while behind
            // A's, then got the key: during B's run, a repeat must find the
            // key running, not abandoned since B's take was sent. A take is
            // an insert, or the take-over of an abandoned key.
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 100)]);
            lockkit_tests::insert_abandoned_key(&mut db.conn());
            let keys = Idempotency { lease: Duration::from_secs(1), ..Idempotency::default() };
            for (key, left) in [("new", 99), ("abandoned", 98)] {
                let (taken_tx, taken_rx) = tokio::sync::oneshot::channel();
                let url = db.url.clone();
                let a = tokio::spawn(async move {
                    let mut conn: Async = async_common::connect(&url, BACKEND).await;
                    let _ = conn
                        .transaction(async |conn| {
                            idempotency::run(&keys, conn, "tenant-1", key, "POST /orders", async |_conn: &mut Async| {
                                Ok::<_, Error>(Order { order: 0, left: 0 })
                            })
                            .await?;
                            taken_tx.send(()).unwrap();
                            tokio::time::sleep(Duration::from_millis(1_500)).await;
                            Err::<(), _>(Error::NoRowMatched)
                        })
                        .await;
                });
                taken_rx.await.unwrap();
                let (running_tx, running_rx) = tokio::sync::oneshot::channel();
                let (repeated_tx, repeated_rx) = tokio::sync::oneshot::channel::<()>();
                let url = db.url.clone();
                let b = tokio::spawn(async move {
                    let mut conn: Async = async_common::connect(&url, BACKEND).await;
                    idempotency::run(&keys, &mut conn, "tenant-1", key, "POST /orders", async |conn: &mut Async| {
                        running_tx.send(()).unwrap();
                        let _ = repeated_rx.await;
                        let left = sell_one!(conn)?;
                        Ok::<_, Error>(Order { order: 1, left })
                    })
                    .await
                });
                running_rx.await.unwrap();
                let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
                let repeat = idempotency::run(&keys, &mut conn, "tenant-1", key, "POST /orders", async |conn: &mut Async| {
                    let left = sell_one!(conn)?;
                    Ok::<_, Error>(Order { order: 2, left })
                })
                .await;
                repeated_tx.send(()).unwrap();
                a.await.unwrap();
                let b = b.await.unwrap();
                assert!(matches!(repeat, Err(Error::IdempotencyInProgress)), "the repeat while B ran ({key} key): {repeat:?}");
                assert_eq!(b.unwrap(), Outcome::Ran(Order { order: 1, left }), "{key} key");
                assert_eq!(stock!(&mut conn), left, "sold once");
            }
        }
    }
}

/// SQLite: a work that lets go the error of a statement that rolled back the
/// whole transaction (a trigger's `RAISE(ROLLBACK, ..)`) and returns `Ok`: the
/// run fails instead of storing the response in autocommit, and the retry runs
/// the work again.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_work_that_let_sqlite_roll_back_the_whole_transaction_stores_no_response() {
    use diesel::SqliteConnection;
    type Async = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>;
    let db = lockkit_tests::TestDb::<SqliteConnection>::new("async_idem_raise_rollback");
    db.conn()
        .run_pending_migrations(idempotency_migrations("sqlite"))
        .unwrap();
    seed_items(&mut db.conn(), &[(1, 5), (2, 0)]);
    lockkit_tests::exec(
        &mut db.conn(),
        lockkit_tests::SQLITE_OUT_OF_STOCK_ROLLS_BACK,
    );
    let mut conn: Async = async_common::connect(&db.url, "sqlite").await;
    let keys = Idempotency::default();
    let first = idempotency::run(&keys, &mut conn, "t", "k", "f", async |conn: &mut Async| {
        let left = sell_one!(conn)?;
        // Item 2 is out of stock: its trigger rolls back the whole
        // transaction, the sale of item 1 with it. The error is let go.
        let failed = diesel::update(items::table.find(2))
            .set(items::stock.eq(-1))
            .execute(&mut *conn)
            .await;
        assert!(failed.is_err(), "item 2 is out of stock");
        Ok::<_, Error>(Order { order: 1, left })
    })
    .await;
    assert!(first.is_err(), "{first:?}");
    assert_eq!(stock!(&mut conn), 5, "the sale was rolled back");
    let retried = sell_under_key_k!(keys, &mut conn, 2).await.unwrap();
    assert_eq!(
        retried,
        Outcome::Ran(Order { order: 2, left: 4 }),
        "nothing was stored: the work ran again"
    );
}
