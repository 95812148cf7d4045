//! Database leases and fenced writes on diesel-async, on PostgreSQL, MariaDB
//! and SQLite: tasks of a multi-threaded runtime racing for one lease through a
//! bb8 pool find one holder; the next holder gets a larger fence, and the old
//! holder's fenced write is refused once the new one has written, also when
//! the two race on tasks, and in the caller's transaction; holders contending
//! with a short TTL land no write over a newer holder's.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_migrations::MigrationHarness;
use lockkit::asynchronous::lease;
use lockkit::lease::Fence;
use lockkit::Error;
use lockkit_tests::schema::{docs, items};
use lockkit_tests::{lease_migrations, seed_items};

const TASKS: usize = 8;

/// Sets item 1's stock under `fence`, as a fenced write.
macro_rules! fenced_set {
    ($conn:expr, $fence:expr, $stock:expr) => {
        lease::fenced($conn, "item-1", $fence, async |conn: &mut Async| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq($stock))
                .execute(conn)
                .await?;
            Ok::<_, Error>(())
        })
        .await
    };
}

/// The lease and fence tables, and `docs` row 1, as the blocking `lease.rs`'s
/// `setup`.
fn setup<C: diesel::Connection + MigrationHarness<C::Backend>>(conn: &mut C, backend: &str) {
    conn.run_pending_migrations(lease_migrations(backend))
        .unwrap();
    lockkit_tests::create_docs(conn);
}

/// What the tasks of a contention run saw, as the blocking `contend`'s
/// counters.
#[derive(Default)]
struct Contention {
    landed: AtomicI64,
    refused: AtomicUsize,
    older_after_newer: AtomicUsize,
    believers: AtomicUsize,
    most_believers: AtomicUsize,
    others: Mutex<Vec<String>>,
}

impl Contention {
    /// Whether the run has shown enough: the last three assertions hold.
    fn enough(&self) -> bool {
        // `AtomicUsize::load`, not diesel-async's `RunQueryDsl::load`.
        AtomicI64::load(&self.landed, Ordering::SeqCst) >= 10
            && AtomicUsize::load(&self.refused, Ordering::SeqCst) > 0
            && AtomicUsize::load(&self.most_believers, Ordering::SeqCst) >= 2
    }

    /// At least 2.5 s, and on until [`enough`](Self::enough), for at most a
    /// minute.
    fn go_on(&self, started: Instant) -> bool {
        let elapsed = started.elapsed();
        elapsed < Duration::from_millis(2500)
            || (elapsed < Duration::from_secs(60) && !self.enough())
    }
}

/// One holder's turn in a contention run, as the blocking `read_pause_write`:
/// a fenced read of the counter on `$data`, a pause (one in four past the
/// TTL), a fenced write of the read plus one and `$fence`. Counts in
/// `$older_after_newer` the writes that find a newer holder's fence in the
/// row. A macro: the connection is the calling test's `Async`.
macro_rules! read_pause_write {
    ($data:expr, $fence:expr, $older_after_newer:expr) => {
        async {
            let fence: Fence = $fence;
            let older_after_newer: &AtomicUsize = $older_after_newer;
            let read = lease::fenced($data, "counter", fence, async |conn: &mut Async| {
                Ok::<_, Error>(
                    docs::table
                        .find(1)
                        .select(docs::counter)
                        .first::<i32>(conn)
                        .await?,
                )
            })
            .await?;
            let pause = if fastrand::u8(0..4) == 0 {
                40..70
            } else {
                0..10
            };
            tokio::time::sleep(Duration::from_millis(fastrand::u64(pause))).await;
            lease::fenced($data, "counter", fence, async |conn: &mut Async| {
                // What the data itself says: the last writer's fence.
                let last_fence = docs::table
                    .find(1)
                    .select(docs::last_fence)
                    .first::<i64>(conn)
                    .await?;
                if last_fence > fence.0 {
                    older_after_newer.fetch_add(1, Ordering::SeqCst);
                }
                diesel::update(docs::table.find(1))
                    .set((docs::counter.eq(read + 1), docs::last_fence.eq(fence.0)))
                    .execute(conn)
                    .await?;
                Ok::<_, Error>(())
            })
            .await
        }
    };
}

async_backend_tests! {
    async fn tasks_racing_for_a_lease_find_one_holder_and_a_stale_fence_is_refused(db) {
        db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 100)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, TASKS as u32).await;
        let start = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tried = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (pool, start, tried) = (pool.clone(), start.clone(), tried.clone());
                tokio::spawn(async move {
                    let mut conn = pool.get().await.expect("pooled connection");
                    start.wait().await;
                    let acquired = lease::acquire(&mut *conn, "nightly", Duration::from_secs(30)).await;
                    // Everyone tries while the holder still holds it.
                    tried.wait().await;
                    match acquired {
                        Ok(held) => {
                            let fence = held.fence();
                            held.release().await.unwrap();
                            Some(fence)
                        }
                        Err(Error::Busy) => None,
                        Err(other) => panic!("acquire: {other}"),
                    }
                })
            })
            .collect();
        let mut holders = Vec::new();
        for task in tasks {
            holders.extend(task.await.unwrap());
        }
        assert_eq!(holders, vec![Fence(1)], "one holder, with the first fence");

        let mut old_conn = pool.get().await.unwrap();
        let mut new_conn = pool.get().await.unwrap();
        // The old holder's lease runs out while it is paused; a new one takes over.
        let mut old = lease::acquire(&mut *old_conn, "report", Duration::from_millis(200)).await.unwrap();
        let old_fence = old.fence();
        fenced_set!(&mut *old, old_fence, 90).unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut new = lease::acquire(&mut *new_conn, "report", Duration::from_secs(30)).await.unwrap();
        assert!(new.fence() > old_fence);
        let busy = {
            let mut third = pool.get().await.unwrap();
            lease::acquire(&mut *third, "report", Duration::from_secs(30)).await.map(|held| held.fence())
        };
        assert!(matches!(busy, Err(Error::Busy)), "{busy:?}");
        let new_fence = new.fence();
        fenced_set!(&mut *new, new_fence, 80).unwrap();
        // The old holder wakes up and writes: refused, nothing written.
        let stale = fenced_set!(&mut *old, old_fence, 1);
        match stale {
            Err(Error::Fenced { fence, current, .. }) => assert_eq!((fence, current), (old_fence.0, new_fence.0)),
            other => panic!("the stale write must be refused: {other:?}"),
        }
        assert_eq!(stock!(&mut *new), 80);
        assert!(matches!(old.renew().await, Err(Error::LeaseLost)));
        assert!(matches!(old.release().await, Err(Error::LeaseLost)));
        new.release().await.unwrap();
    }

    async fn with_lease_releases_on_err_and_acquire_checks_its_input(db) {
        db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let failed = lease::with_lease(&mut conn, "cron", Duration::from_secs(30), async |held: &mut lease::AsyncLease<'_, Async>| {
            assert_eq!(held.fence(), Fence(1));
            Err::<(), _>(Error::InvalidInput("work failed"))
        })
        .await;
        assert!(matches!(failed, Err(Error::InvalidInput("work failed"))));
        let fence = lease::with_lease(&mut conn, "cron", Duration::from_secs(30), async |held: &mut lease::AsyncLease<'_, Async>| {
            held.renew().await?;
            Ok::<_, Error>(held.fence())
        })
        .await
        .unwrap();
        assert_eq!(fence, Fence(2), "released after the failure: taken at once");
        assert!(matches!(lease::acquire(&mut conn, "", Duration::from_secs(1)).await, Err(Error::InvalidInput(_))));
        assert!(matches!(lease::acquire(&mut conn, "x", Duration::ZERO).await, Err(Error::InvalidInput(_))));
        let nested = lockkit::asynchronous::locked_transaction(&mut conn, lockkit::LockOptions::default(), async |conn: &mut Async| {
            lease::acquire(conn, "x", Duration::from_secs(1)).await.map(|held| held.fence())
        })
        .await;
        assert!(matches!(nested, Err(Error::AlreadyInTransaction)), "{nested:?}");
    }

    async fn a_connection_a_dropped_call_left_in_its_transaction_grants_no_lease(db) {
        // The outermost call is dropped in its work: its transaction stays
        // open on the server, and the connection is marked broken. A grant
        // there would be undone with that transaction, and its fence handed
        // out again.
        db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let in_work = tokio::sync::Notify::new();
        let call = lockkit::asynchronous::locked_transaction(&mut conn, lockkit::LockOptions::default(), async |_conn: &mut Async| {
            in_work.notify_one();
            std::future::pending::<()>().await;
            Ok::<_, Error>(())
        });
        async_common::drop_once_reached(&in_work, call, "in its work").await;
        let granted = lease::acquire(&mut conn, "nightly", Duration::from_secs(30)).await.map(|held| held.fence());
        assert!(matches!(granted, Err(Error::AlreadyInTransaction)), "{granted:?}");
        drop(conn);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let held = lease::acquire(&mut other, "nightly", Duration::from_secs(30)).await.unwrap();
        assert_eq!(held.fence(), Fence(1), "no fence was handed out in the abandoned transaction");
        held.release().await.unwrap();
    }

    async fn a_release_after_a_dropped_call_in_the_lease_is_not_sent_in_the_abandoned_transaction(db) {
        // The lease's work drops a lockkit call in its transaction: that
        // transaction stays open on the server, and the connection is marked
        // broken. A release sent there would never commit, and would keep the
        // lease's row locked while the connection lives: other workers' grants
        // would wait for it, not find the lease busy.
        db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let ran = lease::with_lease(&mut conn, "nightly", Duration::from_secs(30), async |held: &mut lease::AsyncLease<'_, Async>| {
            async_common::drop_a_call_in_its_work(&mut **held).await;
            Ok::<_, Error>(())
        })
        .await;
        ran.unwrap();
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let granted = tokio::time::timeout(
            Duration::from_secs(5),
            lease::acquire(&mut other, "nightly", Duration::from_secs(1)),
        )
        .await
        .map(|granted| granted.map(|held| held.fence()));
        // On SQLite the abandoned transaction holds the database's write lock
        // whatever the release does: every grant waits for the connection.
        if BACKEND != "sqlite" {
            assert!(matches!(granted, Ok(Err(Error::Busy))), "{granted:?}");
        }
        drop(conn);
    }

    async fn an_older_fence_racing_a_newer_one_on_a_new_resource_never_writes_after_it(db) {
        // As the blocking `first_fence` test, on tasks: holders 7 and 8 write
        // a resource nobody fenced before, at once: 8 first (it holds the
        // fence's row until it commits), then 7, which must be refused (on
        // MySQL/MariaDB the row is created, then raised).
        db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let newer = tokio::spawn({
            let (url, barrier) = (db.url.clone(), barrier.clone());
            async move {
                let mut conn: Async = async_common::connect(&url, BACKEND).await;
                lease::fenced(&mut conn, "report", Fence(8), async |c: &mut Async| {
                    barrier.wait().await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(8))
                        .execute(c)
                        .await?;
                    Ok::<_, Error>(())
                })
                .await
            }
        });
        let older = tokio::spawn({
            let (url, barrier) = (db.url.clone(), barrier.clone());
            async move {
                let mut conn: Async = async_common::connect(&url, BACKEND).await;
                barrier.wait().await;
                lease::fenced(&mut conn, "report", Fence(7), async |c: &mut Async| {
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(7))
                        .execute(c)
                        .await?;
                    Ok::<_, Error>(())
                })
                .await
            }
        });
        let (newer, older) = (newer.await.unwrap(), older.await.unwrap());
        newer.unwrap();
        assert!(matches!(older, Err(Error::Fenced { fence: 7, current: 8, .. })), "{older:?}");
        let mut check: Async = async_common::connect(&db.url, BACKEND).await;
        assert_eq!(stock!(&mut check), 8, "the newer holder's write stands");
    }

    async fn db_lease_contending_holders_never_both_write(db) {
        // As the blocking `contend` with the database store, on tasks: they
        // contend for one lease with a short TTL; each holder reads the
        // counter through a fenced read, pauses for a random while (one in
        // four past its TTL, so holders overlap), and writes back its read
        // plus one through a fenced write, with its fence. The counter must
        // end equal to the writes that landed, and no write may find a newer
        // holder's fence in the row it overwrites.
        const TASKS: usize = 6;
        setup(&mut db.connect(), BACKEND);
        let ttl = Duration::from_millis(30);
        let started = Instant::now();
        let seen = Arc::new(Contention::default());
        async_common::on_tasks(TASKS, |_| {
            let (url, seen) = (db.url.clone(), seen.clone());
            async move {
                let mut store: Async = async_common::connect(&url, BACKEND).await;
                let mut data: Async = async_common::connect(&url, BACKEND).await;
                while seen.go_on(started) {
                    let held = match lease::acquire(&mut store, "counter", ttl).await {
                        Ok(held) => held,
                        Err(Error::Busy) => {
                            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..4))).await;
                            continue;
                        }
                        Err(err) => panic!("acquire: {err}"),
                    };
                    let now = seen.believers.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most_believers.fetch_max(now, Ordering::SeqCst);
                    let fence = held.fence();
                    let outcome = read_pause_write!(&mut data, fence, &seen.older_after_newer).await;
                    seen.believers.fetch_sub(1, Ordering::SeqCst);
                    match held.release().await {
                        Ok(()) | Err(Error::LeaseLost) => {}
                        Err(err) => panic!("release: {err}"),
                    }
                    match outcome {
                        Ok(()) => {
                            seen.landed.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::Fenced { .. }) => {
                            seen.refused.fetch_add(1, Ordering::SeqCst);
                        }
                        // SQLite's busy database, InnoDB's deadlocks: rolled back, nothing landed.
                        Err(err) if err.is_retryable() => {
                            seen.others.lock().unwrap().push(err.to_string())
                        }
                        Err(err) => panic!("fenced: {err}"),
                    }
                }
            }
        })
        .await;
        let seen = Arc::into_inner(seen).unwrap();
        let landed = seen.landed.into_inner();
        let mut check: Async = async_common::connect(&db.url, BACKEND).await;
        let counter: i32 = docs::table.find(1).select(docs::counter).first(&mut check).await.unwrap();
        let (refused, most) = (seen.refused.into_inner(), seen.most_believers.into_inner());
        eprintln!(
            "landed {landed}, refused {refused}, at most {most} believed they held it, others {:?}",
            seen.others.lock().unwrap()
        );
        assert_eq!(
            i64::from(counter),
            landed,
            "no write of a holder that overran its lease landed over a newer one"
        );
        let older_after_newer = seen.older_after_newer.into_inner();
        assert_eq!(older_after_newer, 0, "a holder wrote after a newer holder had written");
        assert!(landed >= 10, "landed {landed}");
        assert!(most >= 2, "holders never overlapped: the test would prove nothing");
        assert!(refused > 0, "no late write was refused: the test would prove nothing");
    }
}

/// A fenced write inside the caller's transaction, which read before it (on
/// MySQL/MariaDB that read fixes the transaction's REPEATABLE READ snapshot):
/// a newer holder fenced the resource after that read, on another connection.
/// The older write is refused, and the refusal is `Error::Fenced` naming the
/// newer fence, as the blocking `nested_in_a_transaction_that_read`.
mod nested_in_a_transaction_that_read {
    use diesel_async::AsyncConnection;

    use super::*;

    async_server_tests! {
        async fn an_older_fence_is_refused_as_fenced_with_the_newer_one(db) {
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            let mut newer: Async = async_common::connect(&db.url, BACKEND).await;
            let older = conn
                .transaction(async |c| {
                    let read = stock!(&mut *c); // the caller's own read
                    assert_eq!(read, 10);
                    // Meanwhile the newer holder writes the resource.
                    fenced_set!(&mut newer, Fence(8), 8).unwrap();
                    Ok::<_, Error>(fenced_set!(c, Fence(7), 7))
                })
                .await
                .unwrap();
            assert_eq!(stock!(&mut newer), 8, "the newer holder's write stands");
            assert!(matches!(older, Err(Error::Fenced { fence: 7, current: 8, .. })), "{older:?}");
        }

        async fn an_older_fence_is_refused_with_the_newer_one_when_the_caller_saw_an_older_one(db) {
            // The resource had fence 5 when the caller read; 8 since.
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            let mut newer: Async = async_common::connect(&db.url, BACKEND).await;
            let nothing = async |_: &mut Async| Ok::<_, Error>(());
            lease::fenced(&mut newer, "report", Fence(5), nothing).await.unwrap();
            let older = conn
                .transaction(async |c| {
                    let _ = stock!(&mut *c);
                    lease::fenced(&mut newer, "report", Fence(8), nothing).await.unwrap();
                    Ok::<_, Error>(lease::fenced(c, "report", Fence(7), nothing).await)
                })
                .await
                .unwrap();
            assert!(matches!(older, Err(Error::Fenced { fence: 7, current: 8, .. })), "{older:?}");
        }
    }
}

/// A diesel-async MySQL connection made from a `mysql_async` one with options
/// of its own (`AsyncMysqlConnection::try_from`): unless asked, the server
/// reports the rows a statement changed, not the rows it matched, and a
/// fence written again is a statement that changes nothing.
#[cfg(feature = "mysql")]
mod a_mysql_connection_reporting_changed_rows {
    use super::*;
    use diesel_async::AsyncMysqlConnection;

    /// A database named after `name` with the lease tables, and such a
    /// connection to it.
    async fn changed_rows_connection(
        name: &str,
    ) -> (
        lockkit_tests::TestDb<diesel::MysqlConnection>,
        AsyncMysqlConnection,
    ) {
        let db = lockkit_tests::TestDb::<diesel::MysqlConnection>::new(name);
        db.conn()
            .run_pending_migrations(lease_migrations("mysql"))
            .unwrap();
        let opts = mysql_async::Opts::from_url(&db.url).unwrap();
        let conn = AsyncMysqlConnection::try_from(mysql_async::Conn::new(opts).await.unwrap())
            .await
            .unwrap();
        (db, conn)
    }

    /// A renew in the millisecond of the last one sets the expiry it already
    /// has: such a connection reports no row changed, and the lease, still
    /// held, must not be reported lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renews_in_one_millisecond_keep_the_lease() {
        let (_db, mut conn) = changed_rows_connection("async_renew_changed_rows").await;
        let mut held = lease::acquire(&mut conn, "heartbeat", Duration::from_secs(60))
            .await
            .unwrap();
        for round in 0..300 {
            let renewed = held.renew().await;
            assert!(renewed.is_ok(), "renew {round}: {renewed:?}");
        }
        held.release().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_same_fence_writes_again() {
        let (db, mut conn) = changed_rows_connection("async_fence_changed_rows").await;
        seed_items(&mut db.conn(), &[(1, 10)]);
        for stock in [5, 6] {
            let written = lease::fenced(
                &mut conn,
                "item-1",
                Fence(7),
                async |conn: &mut AsyncMysqlConnection| {
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(stock))
                        .execute(conn)
                        .await?;
                    Ok::<_, Error>(())
                },
            )
            .await;
            assert!(written.is_ok(), "stock {stock}: {written:?}");
        }
        let older = lease::fenced(
            &mut conn,
            "item-1",
            Fence(6),
            async |_: &mut AsyncMysqlConnection| Ok::<_, Error>(()),
        )
        .await;
        assert!(
            matches!(
                older,
                Err(Error::Fenced {
                    fence: 6,
                    current: 7,
                    ..
                })
            ),
            "{older:?}"
        );
    }
}
