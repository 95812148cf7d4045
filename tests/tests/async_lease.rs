//! Database leases and fenced writes on diesel-async, on PostgreSQL, MariaDB
//! and SQLite: tasks of a multi-threaded runtime racing for one lease through a
//! bb8 pool find one holder; the next holder gets a larger fence, and the old
//! holder's fenced write is refused once the new one has written.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::Arc;
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_migrations::MigrationHarness;
use lockkit::asynchronous::lease;
use lockkit::lease::Fence;
use lockkit::Error;
use lockkit_tests::schema::items;
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
