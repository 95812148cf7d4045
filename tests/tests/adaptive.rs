//! The adaptive strategy (`lockkit::adaptive`) on every backend: exact totals
//! under contention, escalation to the row lock and back.

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use diesel::prelude::*;
use lockkit::adaptive::{AdaptivePolicy, Mode};
use lockkit::prelude::*;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::seed_items;

/// `threads` writers each add 1 to row `id` `increments` times through
/// `policy`. On a row that is not locked yet, the first write of each waits
/// until every writer has read the row, so that they all hold the same version
/// and all but one lose the race. (On a locked row that wait would hold the
/// lock the others need to get there.)
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
    let race = policy.mode::<Item>(&id) == Mode::Optimistic;
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut conn = pool.get().unwrap();
                let mut first = race;
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

/// A policy that locks a row after the first round of [`hot_increments`]:
/// while its six writers' first attempts are recorded, no writer wins twice
/// before it lost once, so at least 2 of the first 4 attempts are lost, and a
/// rate of 0.3 over 4 attempts is reached whatever the order, and tried at
/// once (no minimum optimistic period).
fn hot_policy() -> AdaptivePolicy {
    AdaptivePolicy::new()
        .min_attempts(4)
        .escalate_at(0.3)
        .min_period(Duration::ZERO)
}

/// Another writer, on `$other`, moves item 1's version on, so that the
/// optimistic attempt under way loses its race. It gives up after 2 s if the
/// row is locked: an attempt under the lock cannot lose, so a call that holds
/// it took the lock too early.
macro_rules! another_writer_moves_item_1_on {
    ($other:expr) => {
        lockkit::locked_transaction(
            &mut $other,
            LockOptions::default().timeout(Duration::from_secs(2)),
            |c| {
                diesel::update(items::table.find(1))
                    .set(items::lock_version.eq(items::lock_version + 1))
                    .execute(c)
                    .map_err(lockkit::classify)
            },
        )
        .expect("the row is not locked while the call races optimistically")
    };
}

/// A connection to `$db` (with instrumentation of its own unless `$watched`,
/// so that lockkit cannot watch it) on which a versioned write of item 1
/// rolled back (v -> v + 1), after which another connection committed its own
/// v + 1 with 100 more in stock; and that v.
macro_rules! rolled_back_then_reused {
    ($db:expr, $watched:expr) => {{
        let mut conn = $db.connect();
        if !$watched {
            conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
        }
        let mut held = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let version = held.lock_version;
        lockkit_tests::write_rolled_back!(conn, held, 5);
        diesel::update(items::table.find(1))
            .set((
                items::stock.eq(items::stock + 100),
                items::lock_version.eq(version + 1),
            ))
            .execute(&mut $db.conn())
            .unwrap();
        (conn, version)
    }};
}

lockkit_tests::backend_tests! {
    fn adaptive_increments_on_a_hot_row_lose_nothing_and_escalate(db) {
        const THREADS: usize = 8;
        const INCREMENTS: usize = 25;
        seed_items(&mut db.conn(), &[(1, 0)]);
        // A long trial: the row stays locked until the test looks at it.
        let policy = hot_policy().trial(Duration::from_secs(600));
        hot_increments(&db.pool(), &policy, 1, 6, 1);
        assert_eq!(policy.stats().escalations, 1, "{}", policy.stats());
        assert_eq!(policy.mode::<Item>(&1), Mode::Locked);
        assert_eq!(policy.mode::<Item>(&2), Mode::Optimistic, "only the hot row is locked");

        let before = policy.stats();
        hot_increments(&db.pool(), &policy, 1, THREADS, INCREMENTS);
        let total = 6 + (THREADS * INCREMENTS) as i32;
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!(item.stock, total, "no increment lost");
        // One version step per write: the locked path does not bump twice.
        assert_eq!(item.lock_version, total);
        let locked = policy.stats().since(&before);
        assert_eq!((locked.locked_writes, locked.optimistic_writes, locked.conflicts), ((THREADS * INCREMENTS) as u64, 0, 0), "{locked}");
    }

    fn a_locked_adaptive_write_is_counted_as_a_lock(db) {
        // The locked path takes `with_lock`'s locked read, and the lock
        // metrics count it as they count `with_lock`'s, on every backend.
        seed_items(&mut db.conn(), &[(1, 0)]);
        let policy = hot_policy().trial(Duration::from_secs(600));
        hot_increments(&db.pool(), &policy, 1, 6, 1);
        assert_eq!(policy.mode::<Item>(&1), Mode::Locked);
        let mut conn = db.conn();
        let (row, seen) = lockkit_tests::observe::observe(|| {
            policy.update::<Item, _, Error, _>(&mut conn, 1, |item| {
                item.stock += 1;
                Ok(())
            })
        });
        assert_eq!(row.unwrap().stock, 7);
        assert_eq!(seen.counter("lockkit_locks_acquired_total{table=items}"), 1, "{seen:?}");
    }

    fn a_locked_adaptive_write_is_never_stale_after_a_rolled_back_write_of_the_row(db) {
        // This process rolled back a versioned write of the row (v6 -> v7),
        // and another process then committed its own v7. The locked path
        // reads the row under its lock: that v7 is the row's own, and the
        // write must go through, not restore v6 and report stale, once or (on
        // a connection lockkit does not watch) on every call.
        seed_items(&mut db.conn(), &[(1, 0)]);
        let policy = hot_policy().trial(Duration::from_secs(600));
        hot_increments(&db.pool(), &policy, 1, 6, 1);
        assert_eq!(policy.mode::<Item>(&1), Mode::Locked);
        for watched in [true, false] {
            let (mut conn, _) = rolled_back_then_reused!(db, watched);
            for _ in 0..2 {
                let written = policy.update::<Item, _, Error, _>(&mut conn, 1, |item| {
                    item.stock += 1;
                    Ok(())
                });
                assert!(written.is_ok(), "watched: {watched}: {written:?}");
            }
        }
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!(item.stock, 6 + 2 * 100 + 4, "nothing lost");
    }

    fn an_optimistic_adaptive_write_is_not_stale_after_a_rolled_back_write_of_the_row(db) {
        // As above, on the optimistic path: the row it just read is the row's
        // own v7, not a struct that may hold a number a rollback left. Its
        // write must go through at once: no lost race counted (which would
        // push the row toward the lock), no version skipped.
        seed_items(&mut db.conn(), &[(1, 0)]);
        for watched in [true, false] {
            let policy = AdaptivePolicy::new();
            let (mut conn, version) = rolled_back_then_reused!(db, watched);
            let written = policy.update::<Item, _, Error, _>(&mut conn, 1, |item| {
                item.stock += 1;
                Ok(())
            });
            assert!(written.is_ok(), "watched: {watched}: {written:?}");
            let stats = policy.stats();
            assert_eq!((stats.conflicts, stats.optimistic_writes), (0, 1), "watched: {watched}: {stats}");
            let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
            assert_eq!(item.lock_version, version + 2, "watched: {watched}: no version skipped");
        }
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!(item.stock, 2 * 100 + 2, "nothing lost");
    }

    fn adaptive_switching_between_modes_loses_nothing(db) {
        const THREADS: usize = 8;
        const INCREMENTS: usize = 40;
        seed_items(&mut db.conn(), &[(1, 0)]);
        // Short trials and lock periods: the row may go back and forth while
        // the writers race.
        let policy = hot_policy().trial(Duration::from_millis(5)).locked_for(Duration::from_millis(5)).half_life(Duration::from_millis(20));
        hot_increments(&db.pool(), &policy, 1, THREADS, INCREMENTS);
        let total = (THREADS * INCREMENTS) as i32;
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        let stats = policy.stats();
        assert_eq!((item.stock, item.lock_version), (total, total), "no increment lost: {stats}");
        assert_eq!(stats.optimistic_writes + stats.locked_writes, total as u64, "{stats}");
        // SQLite's writers seldom lose a race (they take turns at the database's
        // lock), so there the row may never turn locked.
        if BACKEND != "sqlite" {
            assert!(stats.escalations >= 1, "{stats}");
        }
    }

    fn adaptive_returns_to_optimistic_once_the_row_calms_down(db) {
        seed_items(&mut db.conn(), &[(1, 0)]);
        // Whether the lock wins its trial or not, the row is optimistic again
        // 2 s after it. Periods long enough for the losers' locked retries to
        // end inside the trial on a loaded machine.
        let policy = hot_policy().trial(Duration::from_millis(1_000)).locked_for(Duration::from_millis(1_000));
        hot_increments(&db.pool(), &policy, 1, 6, 1); // five races lost of six
        let hot = policy.stats();
        assert_eq!(hot.escalations, 1, "{hot}");
        assert_eq!(hot.de_escalations, 0, "{hot}");

        thread::sleep(Duration::from_millis(2_300));
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
        let policy = hot_policy().per_table().trial(Duration::from_secs(600));
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
        seed_items(&mut conn, &[(1, 1)]);
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
        assert!(matches!(refused, Err(Shop::OutOfStock(1))), "{refused:?}");
        let item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!((item.stock, item.lock_version), (1, 0), "nothing written");

        // The same under the lock.
        let locked = hot_policy().trial(Duration::from_secs(600));
        hot_increments(&db.pool(), &locked, 1, 6, 1);
        assert_eq!(locked.mode::<Item>(&1), Mode::Locked);
        let refused = locked.update(&mut conn, 1, |item: &mut Item| {
            if item.stock < 8 { return Err(Shop::OutOfStock(item.stock)); }
            item.stock -= 8;
            Ok(())
        });
        assert!(matches!(refused, Err(Shop::OutOfStock(7))), "{refused:?}");
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

    fn inside_a_transaction_a_read_that_cannot_win_goes_to_the_lock(db) {
        // Inside the caller's transaction a REPEATABLE READ snapshot (MySQL/
        // MariaDB's default) reads the same old row again: more optimistic
        // attempts would all be stale, sleeping between them while the stale
        // UPDATE's row lock is held. The call takes the lock as soon as the
        // read returns the version that lost. At READ COMMITTED (PostgreSQL's
        // default) the read sees the winner, and the second attempt wins
        // optimistically. (SQLite: the caller's transaction that read holds
        // off the other writer's commit, so no race can be lost there.)
        if BACKEND == "sqlite" {
            return;
        }
        seed_items(&mut db.conn(), &[(1, 0)]);
        let policy = AdaptivePolicy::new().min_attempts(1_000);
        let mut conn = db.conn();
        if BACKEND == "mysql" {
            // MariaDB's `innodb_snapshot_isolation` (the default from 11.6.2)
            // answers the stale write with 1020 instead, which rolls back the
            // whole transaction (a `Deadlock`: `combined.rs`). Older servers
            // and MySQL have no such setting.
            let _ = diesel::sql_query("SET SESSION innodb_snapshot_isolation = OFF").execute(&mut conn);
        }
        let mut other = db.conn();
        let mut attempts = 0;
        let item = conn
            .transaction(|conn| {
                policy.update::<Item, _, Error, _>(conn, 1, |item| {
                    attempts += 1;
                    if attempts == 1 {
                        another_writer_moves_item_1_on!(other);
                    }
                    item.stock += 1;
                    Ok(())
                })
            })
            .unwrap();
        let stats = policy.stats();
        let (locked, optimistic) = if BACKEND == "mysql" { (1, 0) } else { (0, 1) };
        assert_eq!((stats.conflicts, stats.locked_writes, stats.optimistic_writes), (1, locked, optimistic), "{stats}");
        assert_eq!(attempts, 2);
        assert_eq!((item.stock, item.lock_version), (1, 2));
        let stored = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!((stored.stock, stored.lock_version), (1, 2));
    }

    fn a_call_takes_the_lock_only_after_eight_lost_races(db) {
        seed_items(&mut db.conn(), &[(1, 0)]);
        // The default bound per call; no trial of the lock from the rate: this
        // test is about one call's bad luck.
        let policy = AdaptivePolicy::new().min_attempts(1_000);
        let mut conn = db.conn();
        let mut other = db.conn();
        // Another writer moves the row on while each of the first `lost`
        // attempts runs its closure, so each of those attempts loses its race.
        // It gives up after 2 s if the row is locked: an attempt under the lock
        // cannot lose, so the policy took the lock too early.
        for (lost, locked) in [(7, 0), (8, 1)] {
            let before = policy.stats();
            let mut attempts = 0;
            let item: Item = policy
                .update(&mut conn, 1, |item: &mut Item| {
                    attempts += 1;
                    if attempts <= lost {
                        another_writer_moves_item_1_on!(other);
                    }
                    item.stock += 1;
                    Ok::<_, Error>(())
                })
                .unwrap();
            let stats = policy.stats().since(&before);
            assert_eq!((stats.conflicts, stats.locked_writes, stats.optimistic_writes), (lost, locked, 1 - locked), "{stats}");
            assert_eq!(attempts, lost + 1);
            assert_eq!(item.stock, 1 + i32::from(locked == 1));
        }
    }
}
