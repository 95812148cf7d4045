//! Retry on diesel-async: deadlocks (PostgreSQL, MariaDB) and serialization
//! failures reported at `COMMIT` (PostgreSQL) are classified and retried by
//! `transaction_with_retry`, as on the blocking side.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use lockkit::{Error, RetryPolicy};
use lockkit_tests::models::Item;
use lockkit_tests::schema::items;
use lockkit_tests::seed_items;

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(10)
        .base_delay(Duration::from_millis(5))
}

/// Items 1 and 2, stock 10 each.
const ITEMS: &[(i32, i32)] = &[(1, 10), (2, 10)];

/// Two transactions lock rows 1 and 2 in opposite orders, both holding their
/// first lock before asking for the second: a deadlock. The server picks a
/// victim; `transaction_with_retry` classifies its error as a deadlock and runs
/// it again, so both finish, with three attempts between them.
macro_rules! deadlock_is_retried {
    ($async:ty, $backend:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_deadlock_victim_is_retried() {
            let db = lockkit_tests::TestDb::<Sync>::new("async_deadlock_is_retried");
            seed_items(&mut db.conn(), ITEMS);
            let mut setup: $async = async_common::connect(&db.url, $backend).await;
            let barrier = Arc::new(tokio::sync::Barrier::new(2));
            let attempts = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = [(1, 2), (2, 1)]
                .into_iter()
                .map(|(first, second)| {
                    let (url, barrier, attempts) =
                        (db.url.clone(), barrier.clone(), attempts.clone());
                    tokio::spawn(async move {
                        let mut conn: $async = async_common::connect(&url, $backend).await;
                        let mine = AtomicUsize::new(0);
                        lockkit::asynchronous::transaction_with_retry(
                            &mut conn,
                            &policy(),
                            async |conn| {
                                attempts.fetch_add(1, Ordering::SeqCst);
                                let _: Vec<Item> =
                                    lockkit::asynchronous::lock_all(conn, &[first]).await?;
                                if mine.fetch_add(1, Ordering::SeqCst) == 0 {
                                    barrier.wait().await;
                                }
                                let _: Vec<Item> =
                                    lockkit::asynchronous::lock_all(conn, &[second]).await?;
                                Ok::<_, Error>(())
                            },
                        )
                        .await
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap().unwrap();
            }
            // Two attempts commit; every other one was a deadlock victim, rolled
            // back and retried: one at least. (On a loaded machine the victim's
            // retry can take row 2 before the survivor wakes up to it, and the two
            // deadlock again.)
            let attempts = AtomicUsize::load(&attempts, Ordering::SeqCst);
            let retried = attempts - 2;
            assert!(
                (1..=3).contains(&retried),
                "{attempts} attempts: one deadlock at least, one retry each"
            );
            // Each finished attempt advanced both versions; a victim's did not. A
            // rolled-back bump's number is never committed: the row it had bumped
            // may be one further per victim.
            let versions = each_item!(&mut setup, lock_version);
            let skipped = i32::try_from(retried).unwrap();
            assert!(
                versions.iter().all(|v| (2..=2 + skipped).contains(v)),
                "{versions:?}"
            );
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    type Sync = diesel::PgConnection;
    type Async = diesel_async::AsyncPgConnection;

    deadlock_is_retried!(diesel_async::AsyncPgConnection, "postgres");

    /// Write skew under SERIALIZABLE: both transactions read both rows and
    /// write one each; the second to commit is refused at `COMMIT`, after its
    /// closure returned `Ok`.
    async fn write_skew(url: &str, retry: bool) -> (Result<(), Error>, usize, usize) {
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (committed_tx, committed_rx) = tokio::sync::oneshot::channel::<()>();
        let mut committed_tx = Some(committed_tx);
        let mut committed_rx = Some(committed_rx);
        let mut tasks = Vec::new();
        for (id, first) in [(1, true), (2, false)] {
            let url = url.to_owned();
            let barrier = barrier.clone();
            let signal = committed_tx.take().filter(|_| first);
            let wait = if first { None } else { committed_rx.take() };
            tasks.push(tokio::spawn(async move {
                let mut conn: Async = async_common::connect(&url, "postgres").await;
                diesel_async::SimpleAsyncConnection::batch_execute(
                    &mut conn,
                    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                )
                .await
                .unwrap();
                let attempts = AtomicUsize::new(0);
                let closures_ok = AtomicUsize::new(0);
                // `transaction_with_retry` may run the closure again: what it
                // changes sits behind a lock, so it captures by reference only.
                let wait = std::sync::Mutex::new(wait);
                let work = async |conn: &mut Async| {
                    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
                    let total: i64 = items::table
                        .select(diesel::dsl::sum(items::stock))
                        .get_result::<Option<i64>>(conn)
                        .await?
                        .unwrap_or(0);
                    diesel::update(items::table.find(id))
                        .set(items::stock.eq(total as i32))
                        .execute(conn)
                        .await?;
                    if attempt == 0 {
                        barrier.wait().await;
                        let wait = wait.lock().unwrap().take();
                        if let Some(wait) = wait {
                            // The other one commits first.
                            let _ = wait.await;
                        }
                    }
                    closures_ok.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(())
                };
                let result = if retry {
                    lockkit::asynchronous::transaction_with_retry(&mut conn, &policy(), work).await
                } else {
                    lockkit::asynchronous::locked_transaction(
                        &mut conn,
                        lockkit::LockOptions::default(),
                        work,
                    )
                    .await
                };
                if let Some(signal) = signal {
                    let _ = signal.send(());
                }
                let ok = AtomicUsize::load(&closures_ok, Ordering::SeqCst);
                (result, AtomicUsize::load(&attempts, Ordering::SeqCst), ok)
            }));
        }
        let first = tasks.remove(0).await.unwrap();
        assert!(first.0.is_ok(), "{first:?}");
        tasks.remove(0).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_serialization_failure_at_commit_is_classified() {
        let db = lockkit_tests::TestDb::<Sync>::new("async_serialization_failure_at_commit");
        seed_items(&mut db.conn(), ITEMS);
        let (result, attempts, closures_ok) = write_skew(&db.url, false).await;
        assert_eq!(attempts, 1);
        assert_eq!(
            closures_ok, 1,
            "the closure returned Ok: the failure came at COMMIT"
        );
        assert!(
            matches!(result, Err(Error::SerializationFailure)),
            "{result:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_serialization_failure_at_commit_is_retried() {
        let db = lockkit_tests::TestDb::<Sync>::new("async_serialization_failure_retried");
        seed_items(&mut db.conn(), ITEMS);
        let mut conn: Async = async_common::connect(&db.url, "postgres").await;
        let (result, attempts, _) = write_skew(&db.url, true).await;
        result.unwrap();
        assert_eq!(attempts, 2);
        // Serial outcome: the second saw the first's write (10 + 10 = 20, then 20 + 10 = 30).
        let stocks = each_item!(&mut conn, stock);
        assert_eq!(stocks, [20, 30]);
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use diesel_async::AsyncMysqlConnection;
    type Sync = diesel::MysqlConnection;

    deadlock_is_retried!(AsyncMysqlConnection, "mysql");

    #[derive(diesel::QueryableByName)]
    struct Isolation {
        #[diesel(sql_type = diesel::sql_types::Text)]
        level: String,
    }

    /// The isolation of `conn`'s next transaction, as InnoDB keeps it (the
    /// session's variable does not show a level set for the next
    /// transaction only).
    async fn next_transactions_isolation(conn: &mut AsyncMysqlConnection) -> String {
        use diesel_async::{AsyncConnection, SimpleAsyncConnection};
        conn.transaction(async |c| {
            c.batch_execute("SELECT COUNT(*) FROM items FOR UPDATE").await?;
            diesel::sql_query(
                "SELECT CAST(trx_isolation_level AS CHAR) AS level FROM information_schema.innodb_trx \
                 WHERE trx_mysql_thread_id = CONNECTION_ID()",
            )
            .get_result::<Isolation>(c)
            .await
        })
        .await
        .unwrap()
        .level
    }

    /// Marks `conn`'s transaction manager broken, with no transaction open on
    /// the server (as lockkit does after a dropped call, or as after Galera's
    /// answer to a `ROLLBACK`), or puts it back in order (`broken` false).
    fn set_broken(conn: &mut AsyncMysqlConnection, broken: bool) {
        use diesel_async::{AsyncConnection, TransactionManager};
        let status = <AsyncMysqlConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(conn);
        match broken {
            true => status.set_in_error(),
            false => *status = Default::default(),
        }
    }

    /// Puts `conn`'s transaction manager back in order and checks that the
    /// refused `call` left no isolation for its next transaction.
    async fn repaired_with_no_isolation_pending(conn: &mut AsyncMysqlConnection, call: &str) {
        set_broken(conn, false);
        assert_eq!(
            next_transactions_isolation(conn).await,
            "REPEATABLE READ",
            "after {call}"
        );
    }

    /// The blocking side's `serializable_on_a_broken_connection_leaves_no_isolation_pending`
    /// (`faults.rs`), on diesel-async: `serializable` and a relay step set the
    /// isolation of the next transaction, then open it. On a connection whose
    /// transaction manager is broken no transaction opens: the call is
    /// refused with nothing sent, and no setting is left for the connection's
    /// next transaction (here, once the test puts the manager back in order).
    /// Unlike the blocking side's, the manager is not repaired: lockkit marks
    /// an async connection broken on purpose, for the pool to close it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn serializable_and_a_relay_step_on_a_broken_connection_leave_no_isolation_pending() {
        use diesel_migrations::MigrationHarness;
        use lockkit::outbox::{OutboxMessage, Relay};
        let db = lockkit_tests::TestDb::<Sync>::new("async_broken_serializable");
        db.conn()
            .run_pending_migrations(lockkit_tests::outbox_migrations("mysql"))
            .unwrap();
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let broken = |ran: &Result<(), Error>| {
            matches!(
                ran,
                Err(Error::Database(
                    diesel::result::Error::BrokenTransactionManager
                ))
            )
        };

        set_broken(&mut conn, true);
        let ran = lockkit::asynchronous::serializable(
            &mut conn,
            &RetryPolicy::immediate(1),
            async |_conn: &mut AsyncMysqlConnection| Ok::<_, Error>(()),
        )
        .await;
        assert!(broken(&ran), "serializable: {ran:?}");
        repaired_with_no_isolation_pending(&mut conn, "serializable").await;

        set_broken(&mut conn, true);
        let relayed = lockkit::asynchronous::outbox::publish_batch(
            &Relay::default(),
            &mut conn,
            10,
            async |batch: &[OutboxMessage]| Ok::<_, Error>(vec![Ok(()); batch.len()]),
        )
        .await
        .map(drop);
        assert!(broken(&relayed), "the relay step: {relayed:?}");
        repaired_with_no_isolation_pending(&mut conn, "a relay step").await;
    }
}
