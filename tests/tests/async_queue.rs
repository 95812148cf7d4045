//! `lockkit::asynchronous::queue::claim` on PostgreSQL, MariaDB and SQLite:
//! a queue drained by 8 tasks of a multi-threaded runtime through a bb8 pool
//! claims each job exactly once; a claim skips the rows another transaction
//! holds (PostgreSQL, MariaDB) or waits its turn (SQLite); outside a
//! transaction nothing is sent.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use lockkit::asynchronous::{locked_transaction, queue};
use lockkit::{Error, LockOptions};
use lockkit_tests::schema::jobs;

const TASKS: usize = 8;
const JOBS: i32 = 60;

macro_rules! insert_jobs {
    ($conn:expr, $n:expr) => {{
        let conn = $conn;
        for id in 1..=$n {
            diesel::insert_into(jobs::table)
                .values((
                    jobs::id.eq(id),
                    jobs::payload.eq(format!("job {id}")),
                    jobs::done.eq(false),
                ))
                .execute(&mut *conn)
                .await
                .expect("insert job");
        }
    }};
}

/// Claims up to `n` open jobs in a locked transaction, marks them done one key
/// at a time, lingers `linger` holding them, commits; the claimed ids.
macro_rules! claim_batch {
    ($conn:expr, $n:expr, $linger:expr) => {
        locked_transaction($conn, LockOptions::default(), async |conn| {
            let ids: Vec<i32> = queue::claim(
                conn,
                jobs::table
                    .filter(jobs::done.eq(false))
                    .order(jobs::id)
                    .select(jobs::id),
                $n,
            )
            .await?;
            for id in &ids {
                diesel::update(jobs::table.find(id))
                    .set(jobs::done.eq(true))
                    .execute(conn)
                    .await?;
            }
            tokio::time::sleep($linger).await;
            Ok::<_, Error>(ids)
        })
    };
}

async_backend_tests! {
    async fn eight_tasks_drain_a_queue_and_claim_each_job_exactly_once(db) {
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        insert_jobs!(&mut *pool.get().await.unwrap(), JOBS);
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    loop {
                        let ids = lockkit::asynchronous::retry(&async_common::patient(), |_| {
                            let pool = pool.clone();
                            async move {
                                let mut conn = pool.get().await.unwrap();
                                claim_batch!(&mut *conn, 3, Duration::from_millis(2)).await
                            }
                        })
                        .await
                        .unwrap();
                        if ids.is_empty() {
                            return mine;
                        }
                        mine.extend(ids);
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut workers_with_jobs = 0;
        for task in tasks {
            let mine = task.await.unwrap();
            workers_with_jobs += usize::from(!mine.is_empty());
            all.extend(mine);
        }
        let claimed = all.len();
        let distinct: BTreeSet<i32> = all.into_iter().collect();
        assert_eq!(claimed, JOBS as usize, "every job claimed once, none twice");
        assert_eq!(distinct, (1..=JOBS).collect::<BTreeSet<_>>());
        let open: i64 = jobs::table.filter(jobs::done.eq(false)).count().get_result(&mut *pool.get().await.unwrap()).await.unwrap();
        assert_eq!(open, 0);
        eprintln!("{BACKEND}: {claimed} jobs claimed by {workers_with_jobs} of {TASKS} tasks");
    }

    async fn a_claim_skips_the_rows_another_transaction_holds(db) {
        let mut setup: Async = async_common::connect(&db.url, BACKEND).await;
        insert_jobs!(&mut setup, 4);
        let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let url = db.url.clone();
        let first = tokio::spawn(async move {
            let mut conn: Async = async_common::connect(&url, BACKEND).await;
            locked_transaction(&mut conn, LockOptions::default(), async |conn| {
                let ids: Vec<i32> = queue::claim(conn, jobs::table.order(jobs::id).select(jobs::id), 2).await?;
                claimed_tx.send(ids.clone()).unwrap();
                let _ = release_rx.await;
                Ok::<_, Error>(ids)
            })
            .await
            .unwrap()
        });
        assert_eq!(claimed_rx.await.unwrap(), vec![1, 2]);
        let url = db.url.clone();
        let started = std::time::Instant::now();
        let second = tokio::spawn(async move {
            let mut conn: Async = async_common::connect(&url, BACKEND).await;
            locked_transaction(&mut conn, LockOptions::default(), async |conn| {
                queue::claim::<i32, _, _>(conn, jobs::table.order(jobs::id).select(jobs::id), 2).await
            })
            .await
            .unwrap()
        });
        if BACKEND == "sqlite" {
            // No row locks: the second claim waits for the first transaction's
            // write lock, then sees every row (none was marked done).
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!second.is_finished(), "SQLite's claims take turns");
            release_tx.send(()).unwrap();
            assert_eq!(second.await.unwrap(), vec![1, 2]);
        } else {
            assert_eq!(second.await.unwrap(), vec![3, 4], "the held rows are skipped");
            assert!(started.elapsed() < Duration::from_secs(5), "without waiting");
            release_tx.send(()).unwrap();
        }
        assert_eq!(first.await.unwrap(), vec![1, 2]);
    }

    async fn outside_a_transaction_claim_sends_nothing(db) {
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        insert_jobs!(&mut conn, 1);
        let err = queue::claim::<i32, _, _>(&mut conn, jobs::table.select(jobs::id), 1).await.unwrap_err();
        assert!(matches!(err, Error::NotInTransaction), "{err}");
    }

    async fn a_claim_on_a_connection_a_dropped_call_broke_is_refused_as_broken(db) {
        // Not `NotInTransaction`, whose help (wrap the claim in a transaction)
        // is wrong here: the dropped call's transaction is still open on the
        // server, and the connection is to be dropped.
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        insert_jobs!(&mut conn, 1);
        async_common::drop_a_call_in_its_work(&mut conn).await;
        let err = queue::claim::<i32, _, _>(&mut conn, jobs::table.select(jobs::id), 1).await.unwrap_err();
        assert!(matches!(err, Error::Database(diesel::result::Error::BrokenTransactionManager)), "{err}");
    }

    async fn claiming_with_a_negative_limit_is_refused(db) {
        // As on the blocking side: SQLite reads `LIMIT -1` as no limit.
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        insert_jobs!(&mut conn, 4);
        let claimed = locked_transaction(&mut conn, LockOptions::default(), async |conn| {
            queue::claim::<i32, _, _>(conn, jobs::table.order(jobs::id).select(jobs::id), -1).await
        })
        .await;
        assert!(matches!(claimed, Err(Error::InvalidInput(_))), "{claimed:?}");
    }
}
