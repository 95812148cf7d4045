//! The adaptive strategy (`lockkit::adaptive`) on every backend: exact totals
//! under contention, escalation to the row lock and back.

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use diesel::prelude::*;
use lockkit::adaptive::{AdaptivePolicy, Mode};
use lockkit::prelude::*;
use lockkit::Error;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::seed_items;

/// `threads` writers each add 1 to row `id` `increments` times through
/// `policy`; the first write of each waits until every writer has read the
/// row, so that they all hold the same version and all but one lose the race.
fn hot_increments<C>(
    pool: &diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<C>>,
    policy: &AdaptivePolicy,
    id: i32,
    threads: usize,
    increments: usize,
) where
    C: diesel::r2d2::R2D2Connection + lockkit::bounds::LockingConnection + Send + 'static,
    Item: lockkit::adaptive::AdaptiveRow<C>,
    diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>>:
        lockkit::AsLockingConnection<Conn = C>,
{
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut conn = pool.get().unwrap();
                let mut first = true;
                for _ in 0..increments {
                    policy
                        .update(&mut conn, id, |item: &mut Item| {
                            if std::mem::take(&mut first) {
                                barrier.wait();
                            }
                            item.stock += 1;
                            Ok::<_, Error>(())
                        })
                        .unwrap();
                }
            });
        }
    });
}

lockkit_tests::backend_tests! {
    fn adaptive_increments_on_a_hot_row_lose_nothing_and_escalate(db) {
        const THREADS: usize = 8;
        const INCREMENTS: usize = 25;
        seed_items(&mut db.conn(), &[(1, 0)]);
        // A long half-life: the row stays hot until the test looks at it.
        let policy = AdaptivePolicy::new().half_life(Duration::from_secs(600));
        hot_increments(&db.pool(), &policy, 1, THREADS, INCREMENTS);

        let total = (THREADS * INCREMENTS) as i32;
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!(item.stock, total, "no increment lost");
        // One version step per write: the locked path does not bump twice.
        assert_eq!(item.lock_version, total);
        let stats = policy.stats();
        assert_eq!(stats.optimistic_writes + stats.locked_writes, total as u64, "{stats}");
        assert!(stats.conflicts >= (THREADS - 1) as u64, "the writers raced: {stats}");
        assert_eq!(stats.escalations, 1, "{stats}");
        assert!(stats.locked_writes > 0, "{stats}");
        assert_eq!(policy.mode::<Item>(&1), Mode::Locked);
        assert_eq!(policy.mode::<Item>(&2), Mode::Optimistic, "only the hot row is locked");
    }

    fn adaptive_returns_to_optimistic_once_the_row_calms_down(db) {
        seed_items(&mut db.conn(), &[(1, 0)]);
        let policy = AdaptivePolicy::new().half_life(Duration::from_millis(200));
        hot_increments(&db.pool(), &policy, 1, 6, 1); // five lost races at once
        let hot = policy.stats();
        assert_eq!(hot.escalations, 1, "{hot}");
        assert_eq!(hot.de_escalations, 0, "{hot}");

        // Six half-lives later a score of at most six is below 0.5.
        thread::sleep(Duration::from_millis(1300));
        assert_eq!(policy.mode::<Item>(&1), Mode::Optimistic);
        let mut conn = db.conn();
        let item: Item = policy.update(&mut conn, 1, |item: &mut Item| {
            item.stock += 1;
            Ok::<_, Error>(())
        }).unwrap();
        let calm = policy.stats().since(&hot);
        assert_eq!((calm.de_escalations, calm.optimistic_writes, calm.locked_writes), (1, 1, 0), "{calm}");
        assert_eq!((item.stock, item.lock_version), (7, 7));
    }

    fn adaptive_keeps_writers_of_their_own_rows_optimistic(db) {
        const THREADS: i32 = 4;
        const INCREMENTS: i32 = 20;
        seed_items(&mut db.conn(), &(1..=THREADS).map(|id| (id, 0)).collect::<Vec<_>>());
        let policy = AdaptivePolicy::new();
        thread::scope(|s| {
            for id in 1..=THREADS {
                let (pool, policy) = (db.pool(), &policy);
                s.spawn(move || {
                    let mut conn = pool.get().unwrap();
                    for _ in 0..INCREMENTS {
                        policy.update(&mut conn, id, |item: &mut Item| {
                            item.stock += 1;
                            Ok::<_, Error>(())
                        }).unwrap();
                    }
                });
            }
        });
        let stock: Vec<i32> = items::table.order(items::id).select(items::stock).load(&mut db.conn()).unwrap();
        assert_eq!(stock, vec![INCREMENTS; THREADS as usize]);
        let stats = policy.stats();
        assert_eq!((stats.optimistic_writes, stats.locked_writes, stats.escalations), ((THREADS * INCREMENTS) as u64, 0, 0), "{stats}");
    }

    fn adaptive_per_table_locks_every_row_of_a_hot_table(db) {
        seed_items(&mut db.conn(), &[(1, 0), (2, 0)]);
        let policy = AdaptivePolicy::new().per_table().half_life(Duration::from_secs(600));
        hot_increments(&db.pool(), &policy, 1, 6, 1);
        assert_eq!(policy.mode::<Item>(&2), Mode::Locked);
        let item: Item = policy.update(&mut db.conn(), 2, |item: &mut Item| {
            item.stock += 5;
            Ok::<_, Error>(())
        }).unwrap();
        assert_eq!((item.stock, item.lock_version), (5, 1));
        assert!(policy.stats().locked_writes >= 1);
    }

    fn adaptive_reports_a_missing_row_and_passes_the_closures_error_back(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 3)]);
        let policy = AdaptivePolicy::new();
        let missing = policy.update(&mut conn, 9, |_: &mut Item| Ok::<_, Error>(()));
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");

        #[derive(Debug)]
        enum Shop { OutOfStock(i32), Lock(#[allow(dead_code)] Error) }
        impl From<Error> for Shop { fn from(e: Error) -> Self { Shop::Lock(e) } }
        let refused = policy.update(&mut conn, 1, |item: &mut Item| {
            if item.stock < 8 { return Err(Shop::OutOfStock(item.stock)); }
            item.stock -= 8;
            Ok(())
        });
        assert!(matches!(refused, Err(Shop::OutOfStock(3))), "{refused:?}");
        let item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!((item.stock, item.lock_version), (3, 0), "nothing written");

        // The same under the lock.
        let locked = AdaptivePolicy::new().max_optimistic_attempts(1).escalate_at(1.0).half_life(Duration::from_secs(600));
        hot_increments(&db.pool(), &locked, 1, 2, 1);
        assert_eq!(locked.mode::<Item>(&1), Mode::Locked);
        let refused = locked.update(&mut conn, 1, |item: &mut Item| {
            if item.stock < 8 { return Err(Shop::OutOfStock(item.stock)); }
            item.stock -= 8;
            Ok(())
        });
        assert!(matches!(refused, Err(Shop::OutOfStock(5))), "{refused:?}");
        let missing = locked.update(&mut conn, 9, |_: &mut Item| Ok::<_, Error>(()));
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
    }

    fn update_adaptive_replaces_the_model_with_the_row_as_written(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut stale = items::table.find(1).first::<Item>(&mut conn).unwrap();
        diesel::update(items::table.find(1)).set((items::stock.eq(20), items::lock_version.eq(4))).execute(&mut conn).unwrap();
        // The closure sees the row as it is now, not the struct it was called on.
        stale.update_adaptive(&mut conn, |fresh| {
            assert_eq!(fresh.stock, 20);
            fresh.stock -= 1;
            Ok::<_, Error>(())
        }).unwrap();
        assert_eq!((stale.stock, stale.lock_version), (19, 5));
    }
}
