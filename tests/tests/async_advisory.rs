//! Advisory locks and lock waits on diesel-async, on PostgreSQL and MariaDB
//! (SQLite has neither), with several tasks of a multi-threaded runtime:
//! `advisory::with_lock` serializes a read-modify-write that loses updates
//! without it, also in a transaction (on PostgreSQL the lock inside it, held
//! until COMMIT; on MySQL/MariaDB, which refuse that, the transaction inside
//! the lock); a future dropped while it holds a session lock leaves its
//! connection marked broken, so the pool closes it and the lock is free for
//! the next user; a transaction lock ends with a rollback; `lock_waits` shows
//! a real waiter and the session in its way.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::time::{Duration, Instant};

use async_common::{on_tasks, RowHolder};
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, RunQueryDsl, TransactionManager};
use lockkit::asynchronous::advisory::{self, AdvisoryKey};
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;
use lockkit_tests::seed_items;

const TASKS: usize = 8;
const ROUNDS: usize = 10;

/// Advisory keys are server-wide: one per test database.
fn key(url: &str) -> AdvisoryKey {
    AdvisoryKey::from_name(url)
}

fn broken<A: AsyncConnection>(conn: &mut A) -> bool {
    A::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .is_err()
}

/// Whether `conn` takes the lock at once (and releases it).
async fn lock_is_free<A: advisory::AsyncAdvisory>(conn: &mut A, key: AdvisoryKey) -> bool {
    advisory::try_with_lock(conn, key, async |_| Ok::<_, Error>(()))
        .await
        .unwrap()
        .is_some()
}

/// Waits until `conn` takes the lock; how long that took.
async fn lock_freed<A: advisory::AsyncAdvisory>(conn: &mut A, key: AdvisoryKey) -> Duration {
    async_common::freed("the lock", async || lock_is_free(conn, key).await).await
}

/// A `with_lock` that holds the lock for an hour: only dropping ends it.
macro_rules! hold_for_an_hour {
    ($conn:expr, $key:expr) => {
        advisory::with_lock($conn, $key, async |_conn| {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, Error>(())
        })
    };
}

/// Returns once the server shows session `$session` waiting for an advisory
/// lock, as `$conn` (another session) sees it. Fails the test after 10 s.
macro_rules! waits_for_an_advisory_lock {
    ($conn:expr, $session:expr) => {
        async {
            let sql = if BACKEND == "postgres" {
                "SELECT COUNT(*) AS n FROM pg_locks \
                 WHERE locktype = 'advisory' AND NOT granted AND pid = $1"
            } else {
                "SELECT COUNT(*) AS n FROM information_schema.processlist \
                 WHERE state = 'User lock' AND id = ?"
            };
            until_counted!($conn, sql, $session, "a wait for the advisory lock")
        }
    };
}

/// A `with_lock` on `$conn` like [`hold_for_an_hour!`], dropped once its
/// closure runs, holding the lock (as a timeout firing there would), however
/// long it took to get there.
macro_rules! drop_while_holding {
    ($conn:expr, $key:expr) => {{
        let holding = tokio::sync::Notify::new();
        let call = advisory::with_lock($conn, $key, async |_conn| {
            holding.notify_one();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, Error>(())
        });
        async_common::drop_once_reached(&holding, call, "holding the lock").await
    }};
}

/// `read_modify_write!` with a short pause between the read and the write,
/// its error lockkit's.
macro_rules! sell_one {
    ($conn:expr) => {
        async {
            Ok::<_, Error>(
                read_modify_write!($conn, tokio::time::sleep(Duration::from_millis(2))).await?,
            )
        }
    };
}

async_server_tests! {
    async fn with_lock_serializes_a_read_modify_write_that_loses_updates_without_it(db) {
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let key = key(&db.url);
        // Naive: every task reads, yields, writes back what it read minus one.
        all_at_once!(pool, TASKS, |conn, all| read_modify_write!(conn, all.wait()).await.unwrap());
        let after_naive = stock!(&mut *pool.get().await.unwrap());
        assert_eq!(after_naive, 999, "{TASKS} decrements, one recorded: the baseline loses updates");
        // The same read-modify-write, each under the advisory lock.
        on_tasks(TASKS, |_| {
            let pool = pool.clone();
            async move {
                for _ in 0..ROUNDS {
                    let mut conn = pool.get().await.unwrap();
                    advisory::with_lock(&mut *conn, key, async |conn| {
                        read_modify_write!(conn, tokio::time::sleep(Duration::from_millis(1))).await?;
                        Ok::<_, Error>(())
                    })
                    .await
                    .unwrap();
                }
            }
        })
        .await;
        assert_eq!(stock!(&mut *pool.get().await.unwrap()), 999 - (TASKS * ROUNDS) as i32, "no decrement lost");
        assert!(lock_is_free(&mut *pool.get().await.unwrap(), key).await, "and the lock was released");
    }

    async fn a_read_modify_write_in_a_transaction_takes_the_lock_in_it_or_before_it(db) {
        // On PostgreSQL the lock taken inside the transaction is a transaction
        // lock, held until COMMIT: the next holder reads what the last one
        // committed. On MySQL/MariaDB a session lock would be released before
        // COMMIT: refused there, so the lock is taken first and the
        // transaction runs inside it.
        const TASKS: usize = 4;
        const ROUNDS: usize = 25;
        seed_items(&mut db.conn(), &[(1, (TASKS * ROUNDS) as i32)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let key = key(&db.url);
        if BACKEND == "mysql" {
            let mut conn = pool.get().await.unwrap();
            let options = LockOptions::default();
            let refused = lockkit::asynchronous::locked_transaction(&mut *conn, options, async |conn: &mut Async| {
                let waited = advisory::with_lock(conn, key, async |_| Ok::<_, Error>(())).await;
                let tried = advisory::try_with_lock(conn, key, async |_| Ok::<_, Error>(())).await;
                Ok::<_, Error>([waited.err(), tried.err()])
            })
            .await
            .unwrap();
            for err in refused {
                assert!(matches!(err, Some(Error::AlreadyInTransaction)), "{err:?}");
            }
            assert!(!broken(&mut *conn));
            assert!(lock_is_free(&mut *pool.get().await.unwrap(), key).await, "nothing was locked");
        }
        on_tasks(TASKS, |_| {
            let pool = pool.clone();
            async move {
                for _ in 0..ROUNDS {
                    let mut conn = pool.get().await.unwrap();
                    let options = LockOptions::default();
                    if BACKEND == "postgres" {
                        // The lock inside the transaction.
                        lockkit::asynchronous::locked_transaction(&mut *conn, options, async |conn: &mut Async| {
                            advisory::with_lock(conn, key, async |conn: &mut Async| sell_one!(conn).await)
                                .await
                        })
                        .await
                        .unwrap();
                    } else {
                        // The transaction inside the lock.
                        advisory::with_lock(&mut *conn, key, async |conn: &mut Async| {
                            lockkit::asynchronous::locked_transaction(conn, options, async |conn: &mut Async| {
                                sell_one!(conn).await
                            })
                            .await
                        })
                        .await
                        .unwrap();
                    }
                }
            }
        })
        .await;
        let stock = stock!(&mut *pool.get().await.unwrap());
        assert_eq!(stock, 0, "no sale lost");
        assert!(lock_is_free(&mut *pool.get().await.unwrap(), key).await, "and the lock was released");
    }

    async fn try_with_lock_skips_a_held_lock_and_releases_after_an_error(db) {
        let key = key(&db.url);
        let mut a: Async = async_common::connect(&db.url, BACKEND).await;
        let mut b: Async = async_common::connect(&db.url, BACKEND).await;
        let mut ran = false;
        let inner = advisory::with_lock(&mut a, key, async |_conn| {
            let other = advisory::try_with_lock(&mut b, key, async |_| {
                ran = true;
                Ok::<_, Error>(())
            })
            .await?;
            Ok::<_, Error>(other)
        })
        .await
        .unwrap();
        assert_eq!(inner, None, "held by another session");
        assert!(!ran, "the closure did not run");
        // An error in the closure still releases the lock.
        let err = advisory::with_lock(&mut a, key, async |_conn| Err::<(), _>(Error::NoRowMatched)).await.unwrap_err();
        assert!(matches!(err, Error::NoRowMatched), "{err}");
        assert!(!broken(&mut a));
        assert!(lock_is_free(&mut b, key).await, "released after the closure's error");
    }

    async fn a_future_dropped_holding_a_session_lock_leaves_the_next_pool_user_free_to_take_it(db) {
        let key = key(&db.url);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        // Dropped inside the closure, as a timeout firing there would.
        let mut conn = pool.get().await.unwrap();
        drop_while_holding!(&mut *conn, key);
        assert!(broken(&mut *conn), "the connection is marked broken");
        drop(conn);
        let mut next = pool.get().await.unwrap();
        assert!(!broken(&mut *next), "the pool handed out a new connection");
        let freed = lock_freed(&mut *next, key).await;
        assert!(lock_is_free(&mut other, key).await, "and every other session can take it");
        drop(next);
        // Aborted as a task.
        let task_pool = pool.clone();
        let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut conn = task_pool.get().await.unwrap();
            advisory::with_lock(&mut *conn, key, async |_conn| {
                locked_tx.send(()).unwrap();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<_, Error>(())
            })
            .await
        });
        locked_rx.await.unwrap();
        assert!(!lock_is_free(&mut other, key).await, "the task holds it");
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let mut next = pool.get().await.unwrap();
        let freed_after_abort = lock_freed(&mut *next, key).await;
        drop(next);
        lock_freed(&mut other, key).await;
        eprintln!("{BACKEND}: free again within {freed:?} (timeout) and {freed_after_abort:?} (abort)");
    }

    async fn deadpool_closes_a_connection_dropped_holding_a_session_lock(db) {
        let key = key(&db.url);
        let pool = async_common::deadpool_pool::<Async>(&db.url, BACKEND, 1);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let mut conn = pool.get().await.unwrap();
        drop_while_holding!(&mut *conn, key);
        drop(conn);
        let mut next = pool.get().await.unwrap();
        lock_freed(&mut *next, key).await;
        drop(next);
        assert!(lock_is_free(&mut other, key).await, "another session takes it");
    }

    async fn a_future_dropped_while_waiting_for_the_lock_takes_nothing_with_it(db) {
        // The server may grant the lock after the future is gone: the
        // connection is marked broken from the moment the statement is sent.
        let key = key(&db.url);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut holder: Async = async_common::connect(&db.url, BACKEND).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let held = tokio::spawn(async move {
            advisory::with_lock(&mut holder, key, async |_conn| {
                locked_tx.send(()).unwrap();
                let _ = release_rx.await;
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        });
        locked_rx.await.unwrap();
        let mut conn = pool.get().await.unwrap();
        let session = lockkit::asynchronous::lock_waits::session_id(&mut *conn).await.unwrap();
        // Dropped once the server shows it waiting, however long it took to
        // get there.
        tokio::select! {
            () = waits_for_an_advisory_lock!(&mut other, session) => {}
            outcome = hold_for_an_hour!(&mut *conn, key) => panic!("the call returned {outcome:?} while the lock was held"),
        }
        assert!(broken(&mut *conn));
        drop(conn);
        release_tx.send(()).unwrap();
        held.await.unwrap();
        lock_freed(&mut other, key).await;
        lock_freed(&mut *pool.get().await.unwrap(), key).await;
    }

    async fn a_held_connection_keeps_a_dropped_session_lock_until_it_is_closed(db) {
        // What the pool's discard prevents, shown: nobody closes this one.
        let key = key(&db.url);
        let mut held: Async = async_common::connect(&db.url, BACKEND).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        drop_while_holding!(&mut held, key);
        assert!(!lock_is_free(&mut other, key).await, "the abandoned session still holds the lock");
        let err = lockkit::asynchronous::locked_transaction(&mut held, LockOptions::default(), async |_| Ok::<_, Error>(()))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Database(_)), "its broken transaction manager refuses transactions: {err}");
        drop(held);
        lock_freed(&mut other, key).await;
    }

    async fn a_connection_a_dropped_call_left_in_its_transaction_takes_no_advisory_lock(db) {
        // The outermost call is dropped in its work: its transaction stays
        // open on the server, and the connection is marked broken. A lock and
        // work there would go with that transaction, under an `Ok`.
        let db_key = key(&db.url);
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut held: Async = async_common::connect(&db.url, BACKEND).await;
        async_common::drop_a_call_in_its_work(&mut held).await;
        let locked = advisory::with_lock(&mut held, db_key, async |conn: &mut Async| {
            diesel::update(lockkit_tests::schema::items::table.find(1))
                .set(lockkit_tests::schema::items::stock.eq(9))
                .execute(conn)
                .await?;
            Ok::<_, Error>(())
        })
        .await;
        assert!(
            matches!(locked, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))),
            "{locked:?}"
        );
        drop(held);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let stock: i32 = lockkit_tests::schema::items::table
            .find(1)
            .select(lockkit_tests::schema::items::stock)
            .first(&mut other)
            .await
            .unwrap();
        assert_eq!(stock, 10, "nothing ran in the abandoned transaction");
    }

    async fn lock_waits_shows_a_real_waiter_and_the_idle_session_in_its_way(db) {
        use lockkit::asynchronous::lock_waits;
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let holder_session = lock_waits::session_id(&mut conn).await.unwrap();
        let holder = RowHolder::lock(conn).await;
        let url = db.url.clone();
        let (waiter_tx, waiter_rx) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn(async move {
            let mut conn: Async = async_common::connect(&url, BACKEND).await;
            waiter_tx.send(lock_waits::session_id(&mut conn).await.unwrap()).unwrap();
            lockkit::asynchronous::with_lock(&mut conn, 1, LockOptions::default(), async |_conn, item: Item| Ok::<_, Error>(item.stock))
                .await
                .unwrap()
        });
        let waiter_session = waiter_rx.await.unwrap();
        let mut observer: Async = async_common::connect(&db.url, BACKEND).await;
        let started = Instant::now();
        let wait = loop {
            let waits = lock_waits::current(&mut observer).await.unwrap();
            if let Some(wait) = waits.into_iter().find(|w| w.session == waiter_session) {
                break wait;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "the waiter never showed up");
            // InnoDB refreshes information_schema after 100 ms without a read.
            tokio::time::sleep(Duration::from_millis(150)).await;
        };
        let blocker = wait.blockers.iter().find(|b| b.session == holder_session).expect("the holder is in its way");
        assert!(blocker.is_idle_in_transaction(), "{blocker:?}");
        assert!(wait.relation.as_deref().unwrap_or_default().contains("items"), "{wait:?}");
        let blocked = lock_waits::blocked_sessions(&mut observer).await.unwrap();
        assert!(
            blocked.iter().any(|b| b.session == waiter_session && b.blocked_by.contains(&holder_session)),
            "{blocked:?}"
        );
        holder.release().await;
        assert_eq!(waiter.await.unwrap(), 10);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(lock_waits::current(&mut observer).await.unwrap().iter().all(|w| w.session != waiter_session));
    }
}

#[cfg(feature = "postgres")]
mod postgres_transaction_locks {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_transaction_lock_at_repeatable_read_is_refused_and_takes_nothing() {
        // The blocking side's `row_locks` test issues a number twice under
        // such a lock. Here: lockkit's transaction begins at the session's
        // default, REPEATABLE READ (as a database's or role's setting would
        // make it); each way of taking a transaction lock is refused, and the
        // lock is free for another session meanwhile.
        use diesel_async::SimpleAsyncConnection;
        let db =
            lockkit_tests::TestDb::<diesel::PgConnection>::new("async_xact_lock_repeatable_read");
        let key = key(&db.url);
        let mut a: diesel_async::AsyncPgConnection =
            async_common::connect(&db.url, "postgres").await;
        let mut b: diesel_async::AsyncPgConnection =
            async_common::connect(&db.url, "postgres").await;
        a.batch_execute("SET default_transaction_isolation = 'repeatable read'")
            .await
            .unwrap();
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut a,
            LockOptions::default(),
            async |conn| {
                let refused = [
                    advisory::xact_lock(conn, key).await.err(),
                    advisory::try_xact_lock(conn, key).await.err(),
                    advisory::with_lock(conn, key, async |_| Ok::<_, Error>(()))
                        .await
                        .err(),
                ];
                assert!(lock_is_free(&mut b, key).await, "nothing was locked");
                Ok::<_, Error>(refused)
            },
        )
        .await
        .unwrap();
        for err in outcome {
            let err = err.expect("refused at REPEATABLE READ");
            assert!(
                err.to_string().contains("REPEATABLE READ") && !err.is_retryable(),
                "{err:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_xact_lock_is_held_until_rollback() {
        let db = lockkit_tests::TestDb::<diesel::PgConnection>::new("async_xact_lock_rollback");
        let key = key(&db.url);
        let mut a: diesel_async::AsyncPgConnection =
            async_common::connect(&db.url, "postgres").await;
        let mut b: diesel_async::AsyncPgConnection =
            async_common::connect(&db.url, "postgres").await;
        let err = advisory::xact_lock(&mut a, key).await.unwrap_err();
        assert!(matches!(err, Error::NotInTransaction), "{err}");
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut a,
            LockOptions::default(),
            async |conn| {
                advisory::xact_lock(conn, key).await?;
                let free = lockkit::asynchronous::locked_transaction(
                    &mut b,
                    LockOptions::default(),
                    async |conn| advisory::try_xact_lock(conn, key).await,
                )
                .await?;
                assert!(!free, "held by the open transaction");
                // with_lock inside a transaction takes a transaction lock too: it
                // outlives the closure.
                advisory::with_lock(conn, key, async |_| Ok::<_, Error>(())).await?;
                assert!(
                    !lock_is_free(&mut b, key).await,
                    "held until the transaction ends"
                );
                Err::<(), _>(Error::NoRowMatched)
            },
        )
        .await;
        assert!(matches!(outcome, Err(Error::NoRowMatched)));
        let free = lockkit::asynchronous::locked_transaction(
            &mut b,
            LockOptions::default(),
            async |conn| advisory::try_xact_lock(conn, key).await,
        )
        .await
        .unwrap();
        assert!(free, "the rollback released it");
    }

    #[test]
    fn a_session_lock_found_not_held_at_its_unlock_is_reported() {
        // As on the blocking side: the work released it (or a pooler sent the
        // unlock to another server session); `with_lock` cannot tell which,
        // and must not stay silent.
        let db = lockkit_tests::TestDb::<diesel::PgConnection>::new("async_unlock_not_held");
        let url = db.url.clone();
        let ((), seen) = std::thread::spawn(move || {
            lockkit_tests::observe::observe(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let mut conn: diesel_async::AsyncPgConnection =
                        async_common::connect(&url, "postgres").await;
                    let key = key(&url);
                    advisory::with_lock(
                        &mut conn,
                        key,
                        async |conn: &mut diesel_async::AsyncPgConnection| {
                            diesel::sql_query("SELECT pg_advisory_unlock_all()")
                                .execute(conn)
                                .await?;
                            Ok::<_, Error>(())
                        },
                    )
                    .await
                    .unwrap();
                })
            })
        })
        .join()
        .unwrap();
        let warned: Vec<_> = seen
            .events
            .iter()
            .filter(|e| {
                e.message()
                    .starts_with("advisory unlock found the lock not held")
            })
            .collect();
        assert_eq!(warned.len(), 1, "{:?}", seen.events);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_xact_lock_of_a_dropped_future_ends_with_the_discarded_connection() {
        let db = lockkit_tests::TestDb::<diesel::PgConnection>::new("async_xact_lock_dropped");
        let key = key(&db.url);
        let pool =
            async_common::bb8_pool::<diesel_async::AsyncPgConnection>(&db.url, "postgres", 1).await;
        let mut other: diesel_async::AsyncPgConnection =
            async_common::connect(&db.url, "postgres").await;
        let mut conn = pool.get().await.unwrap();
        let locked = tokio::sync::Notify::new();
        let call = lockkit::asynchronous::locked_transaction(
            &mut *conn,
            LockOptions::default(),
            async |conn| {
                advisory::xact_lock(conn, key).await?;
                locked.notify_one();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<_, Error>(())
            },
        );
        async_common::drop_once_reached(&locked, call, "holding the lock").await;
        drop(conn);
        drop(pool.get().await.unwrap());
        lock_freed(&mut other, key).await;
    }
}
