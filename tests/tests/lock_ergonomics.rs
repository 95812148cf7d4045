//! What Rails users expect of pessimistic locking, on real servers: `lock()` and
//! `reload()` on a loaded model, work queued to run after the commit, how long
//! each lock was held, and who blocks whom in `lock_waits`. Concurrency claims use
//! several connections on threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::{lock_waits, locked_transaction, Error, LockOptions, RetryPolicy};
use lockkit_tests::lock_waits::{look_until, while_a_session_waits_for_item_1};
use lockkit_tests::models::*;
use lockkit_tests::observe::observe;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, seed_items, stock_of};

const THREADS: usize = 4;
const ROUNDS: usize = 10;

lockkit_tests::backend_tests! {
    fn lock_refuses_outside_a_transaction(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.conn();
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        item.stock = 99; // unsaved: left alone by the refusal
        assert!(matches!(item.lock(&mut conn), Err(Error::NotInTransaction)));
        assert_eq!((item.stock, item.lock_version), (99, 0));
    }

    fn lock_rereads_in_place_and_a_nowait_locker_is_refused(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.conn();
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        exec(&mut db.conn(), "UPDATE items SET stock = 7 WHERE id = 1");
        let other = conn.transaction(|conn| {
            item.lock(conn)?;
            // The row as it is now, and (Versioned) its version advanced.
            assert_eq!((item.stock, item.lock_version), (7, 1));
            // Another connection that will not wait finds the row taken.
            let other = thread::scope(|s| {
                s.spawn(|| {
                    lockkit::with_lock(&mut db.connect(), 1, LockOptions::default().nowait(), |_, i: Item| {
                        Ok::<_, Error>(i.stock)
                    })
                })
                .join()
                .unwrap()
            });
            Ok::<_, Error>(other)
        })
        .unwrap();
        assert!(matches!(other, Err(Error::Busy)), "{other:?}");
        // Once committed, the row is free again.
        let after = lockkit::with_lock(&mut db.connect(), 1, LockOptions::default().nowait(), |_, i: Item| {
            Ok::<_, Error>(i.lock_version)
        });
        assert_eq!(after.unwrap(), 2, "the next exclusive lock advances the version again");
    }

    fn lock_makes_an_optimistic_writer_who_read_before_stale(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut stale = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        let mut conn = db.conn();
        conn.transaction(|conn| {
            let mut item = items::table.find(1).first::<Item>(conn)?;
            item.lock(conn)
        })
        .unwrap();
        stale.stock = 1;
        assert!(matches!(stale.update_versioned(&mut db.conn()), Err(Error::Stale(_))));
    }

    fn concurrent_decrements_through_lock_are_exact(db) {
        seed_items(&mut db.conn(), &[(1, 1000)]);
        db.race(THREADS, |conn, _, barrier| {
            // Every thread read the row before anyone locked it.
            let mut item = items::table.find(1).first::<Item>(conn).unwrap();
            barrier.wait();
            for _ in 0..ROUNDS {
                conn.transaction(|conn| {
                    item.lock(conn)?;
                    thread::sleep(Duration::from_millis(2)); // widen the race window
                    diesel::update(items::table.find(item.id))
                        .set(items::stock.eq(item.stock - 1))
                        .execute(conn)?;
                    Ok::<_, Error>(())
                })
                .unwrap();
            }
        });
        let expected = 1000 - i32::try_from(THREADS * ROUNDS).unwrap();
        assert_eq!(stock_of!(&mut db.conn()), expected, "every decrement counted");
    }

    fn lock_inside_a_lockkit_transaction_nests(db) {
        seed_items(&mut db.conn(), &[(1, 10), (2, 20)]);
        let mut conn = db.conn();
        let mut item = items::table.find(2).first::<Item>(&mut conn).unwrap();
        locked_transaction(&mut conn, LockOptions::default(), |conn| {
            item.lock(conn)?;
            diesel::update(items::table.find(2)).set(items::stock.eq(item.stock - 5)).execute(conn)?;
            Ok::<_, Error>(())
        })
        .unwrap();
        item.reload(&mut conn).unwrap();
        assert_eq!((item.stock, item.lock_version), (15, 1));
    }

    fn reload_reads_the_row_again_and_reports_a_missing_one(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.conn();
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        item.stock = 99;
        exec(&mut db.conn(), "UPDATE items SET stock = 4, lock_version = 3 WHERE id = 1");
        item.reload(&mut conn).unwrap();
        assert_eq!((item.stock, item.lock_version), (4, 3));
        exec(&mut db.conn(), "DELETE FROM items WHERE id = 1");
        item.stock = 5;
        assert!(matches!(item.reload(&mut conn), Err(Error::NotFound)));
        assert_eq!(item.stock, 5, "left as it was");
    }

    fn after_commit_work_runs_once_after_the_commit_is_visible(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let url = db.url.clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut conn = db.conn();
        lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn, item: Item| {
            diesel::update(items::table.find(item.id)).set(items::stock.eq(3)).execute(conn)?;
            let seen_after = Arc::clone(&seen);
            // Reads the row on a connection of its own: it sees the new stock
            // only if the transaction committed before the work ran.
            lockkit::after_commit(conn, move || {
                let mut other = Conn::establish(&url).unwrap();
                seen_after.lock().unwrap().push(stock_of!(&mut other));
            })?;
            assert!(seen.lock().unwrap().is_empty(), "not while the lock is held");
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![3], "ran once, after the commit");
    }

    fn after_commit_work_never_runs_after_a_rollback_or_a_panic(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let ran = Arc::new(AtomicUsize::new(0));
        let mut conn = db.conn();
        let queue = |conn: &mut Conn, ran: &Arc<AtomicUsize>| {
            let ran = Arc::clone(ran);
            lockkit::after_commit(conn, move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        let failed = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn, _: Item| {
            queue(conn, &ran)?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(failed, Err(Error::NoRowMatched)));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            locked_transaction(&mut conn, LockOptions::default(), |conn| {
                queue(conn, &ran)?;
                panic!("the closure panics after queueing");
                #[allow(unreachable_code)]
                Ok::<_, Error>(())
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        // The connection is usable and the next commit runs only its own work.
        locked_transaction(&mut conn, LockOptions::default(), |conn| queue(conn, &ran)).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    fn after_commit_work_of_a_savepoint_waits_for_the_outermost_commit(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let log = Arc::new(Mutex::new(Vec::new()));
        let push = |conn: &mut Conn, what: &'static str| {
            let log = Arc::clone(&log);
            lockkit::after_commit(conn, move || log.lock().unwrap().push(what))
        };
        let mut conn = db.conn();
        locked_transaction(&mut conn, LockOptions::default(), |conn| {
            push(conn, "outer")?;
            lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| push(conn, "released savepoint"))?;
            assert!(log.lock().unwrap().is_empty(), "the savepoint's work waits for the outermost commit");
            let rolled_back = locked_transaction(conn, LockOptions::default(), |conn| {
                push(conn, "rolled-back savepoint")?;
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(*log.lock().unwrap(), vec!["outer", "released savepoint"]);
    }

    fn after_commit_work_runs_once_for_the_attempt_that_committed(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut conn = db.conn();
        let mut attempt = 0;
        lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |conn| {
            attempt += 1;
            let log = Arc::clone(&log);
            let this = attempt;
            lockkit::after_commit(conn, move || log.lock().unwrap().push(this))?;
            if this < 3 {
                return Err(Error::Deadlock); // retryable: the attempt is rolled back
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(*log.lock().unwrap(), vec![3]);
    }

    fn after_commit_is_refused_where_lockkit_cannot_see_the_commit(db) {
        let mut conn = db.conn();
        assert!(matches!(lockkit::after_commit(&mut conn, || ()), Err(Error::NotInTransaction)));
        let inside_diesel = conn.transaction(|conn| {
            // Diesel's transaction: lockkit would never see its COMMIT.
            let direct = lockkit::after_commit(conn, || ());
            let nested = locked_transaction(conn, LockOptions::default(), |conn| lockkit::after_commit(conn, || ()));
            Ok::<_, Error>((direct, nested))
        })
        .unwrap();
        assert!(matches!(inside_diesel, (Err(Error::NotInTransaction), Err(Error::NotInTransaction))), "{inside_diesel:?}");
    }

    fn after_commit_work_matches_the_commits_of_racing_threads(db) {
        // Threads decrement under with_lock; every other attempt rolls back after
        // its write and its queued work. The work that ran must equal the commits.
        seed_items(&mut db.conn(), &[(1, 1000)]);
        let ran = Arc::new(AtomicUsize::new(0));
        let committed = AtomicUsize::new(0);
        thread::scope(|s| {
            for t in 0..THREADS {
                let (ran, committed, db) = (&ran, &committed, &db);
                s.spawn(move || {
                    let mut conn = db.connect();
                    for round in 0..ROUNDS {
                        let result = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn, item: Item| {
                            diesel::update(items::table.find(item.id)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                            let ran = Arc::clone(ran);
                            lockkit::after_commit(conn, move || {
                                ran.fetch_add(1, Ordering::SeqCst);
                            })?;
                            if (t + round) % 2 == 1 {
                                return Err(Error::NoRowMatched);
                            }
                            Ok(())
                        });
                        if result.is_ok() {
                            committed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        let committed = committed.load(Ordering::SeqCst);
        assert_eq!(committed, THREADS * ROUNDS / 2);
        assert_eq!(ran.load(Ordering::SeqCst), committed, "work ran once per commit");
        assert_eq!(stock_of!(&mut db.conn()), 1000 - i32::try_from(committed).unwrap());
    }

    fn hold_time_covers_the_sleep_inside_the_lock_and_warns_past_the_limit(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        // Limits well apart from the short hold's, which a loaded machine
        // may stretch.
        lockkit::metrics::warn_when_held_longer_than(Some(Duration::from_millis(500)));
        let mut conn = db.conn();
        let ((), seen) = observe(|| {
            lockkit::with_lock(&mut conn, 1, LockOptions::default(), |_, _: Item| {
                thread::sleep(Duration::from_millis(650));
                Ok::<_, Error>(())
            })
            .unwrap();
            // Nested: the lock is held until the outermost transaction ends.
            locked_transaction(&mut conn, LockOptions::default(), |conn| {
                lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| Ok::<_, Error>(()))?;
                thread::sleep(Duration::from_millis(600));
                Ok::<_, Error>(())
            })
            .unwrap();
            // Short: no warning.
            lockkit::with_lock(&mut conn, 1, LockOptions::default(), |_, _: Item| Ok::<_, Error>(())).unwrap();
        });
        let holds = seen.histogram("lockkit_lock_hold_seconds{table=items}");
        assert_eq!(holds.len(), 3, "{holds:?}");
        assert!(holds[0] >= 0.650, "{holds:?}");
        assert!(holds[1] >= 0.600, "held to the end of the outer transaction: {holds:?}");
        // The short hold is warned of only if a loaded machine stretched it.
        let long_holds = holds.iter().filter(|held| **held >= 0.500).count();
        let warnings: Vec<_> = seen
            .events
            .iter()
            .filter(|e| e.level == tracing::Level::WARN && e.message().starts_with("row lock on items 1 held"))
            .collect();
        assert_eq!(warnings.len(), long_holds, "{holds:?}: {:?}", seen.events);
        for warning in &warnings {
            assert_eq!((warning.field("table"), warning.field("key")), (Some("items"), Some("1")));
            let held: u64 = warning.field("held_ms").unwrap().parse().unwrap();
            assert!(held >= 500, "{warning:?}");
            assert!(warning.message().ends_with(&format!("held {held} ms")), "{warning:?}");
        }
    }

    fn hold_time_is_measured_for_lock_and_lock_all(db) {
        seed_items(&mut db.conn(), &[(1, 10), (2, 20)]);
        let mut conn = db.conn();
        let before = lockkit::metrics::snapshot();
        let ((), seen) = observe(|| {
            locked_transaction(&mut conn, LockOptions::default(), |conn| {
                let mut item = items::table.find(1).first::<Item>(conn)?;
                item.lock(conn)?;
                Item::lock_all(conn, &[2, 1])?;
                thread::sleep(Duration::from_millis(80));
                Ok::<_, Error>(())
            })
            .unwrap();
        });
        let holds = seen.histogram("lockkit_lock_hold_seconds{table=items}");
        assert_eq!(holds.len(), 2, "one for lock(), one for lock_all: {holds:?}");
        assert!(holds.iter().all(|held| *held >= 0.080), "{holds:?}");
        let delta = lockkit::metrics::snapshot().since(&before);
        assert!(delta.locks_released >= 2, "{delta:?}");
        assert!(delta.lock_hold_max >= Duration::from_millis(80), "{delta:?}");
    }
}

mod servers {
    use super::*;

    lockkit_tests::server_tests! {
        fn naive_read_then_write_loses_decrements(db) {
            // The baseline: the same decrements without lock() lose updates.
            seed_items(&mut db.conn(), &[(1, 1000)]);
            db.race(THREADS, |conn, _, barrier| {
                conn.transaction(|conn| {
                    let item = items::table.find(1).first::<Item>(conn)?;
                    barrier.wait(); // everyone has read stock = 1000
                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                    Ok::<_, Error>(())
                })
                .unwrap();
            });
            let stock = stock_of!(&mut db.conn());
            assert_eq!(stock, 999, "{THREADS} decrements, one survives");
        }

        fn lock_waits_name_the_lock_and_the_idle_blocker(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut observer = db.connect();
            // Looked at once the waiter has waited, and the holder idled, half
            // a second: however late the waiter's thread began to wait.
            let long = Duration::from_millis(500);
            let (sessions, wait, stock) = while_a_session_waits_for_item_1(&db, |sessions| {
                look_until(Duration::from_secs(10), "the waiter never waited half a second", || {
                    let waits = lock_waits::current(&mut observer).unwrap();
                    waits.into_iter().find(|w| {
                        w.session == sessions.waiter
                            && w.waiting >= long
                            && !w.blockers.is_empty()
                            && w.blockers.iter().all(|b| b.in_state >= long)
                    })
                })
            });
            assert_eq!(stock.unwrap(), 10);

            assert!(wait.query.to_uppercase().contains("FOR UPDATE"), "{wait:?}");
            let mode = wait.lock_mode.clone().unwrap_or_default();
            let expected_mode = if BACKEND == "postgres" { "transactionid ShareLock" } else { "RECORD X" };
            assert_eq!(mode, expected_mode, "{wait:?}");
            assert!(wait.relation.as_deref().unwrap_or_default().contains("items"), "{wait:?}");
            assert_eq!(wait.blockers.len(), 1, "{wait:?}");
            let blocker = &wait.blockers[0];
            assert_eq!(blocker.session, sessions.holder, "{wait:?}");
            assert_eq!(blocker.state, "idle in transaction", "{wait:?}");
            assert!(blocker.is_idle_in_transaction());
            assert!(blocker.in_state >= Duration::from_millis(500), "idle since it took the lock: {wait:?}");
            assert!(blocker.transaction_age.unwrap() >= blocker.in_state, "{wait:?}");
            assert!(wait.waiting >= Duration::from_millis(500), "{wait:?}");
        }
    }
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;
    use lockkit_tests::TestDb;

    #[test]
    fn lock_refuses_a_transaction_the_server_already_ended() {
        // A deadlock ends InnoDB's transaction behind Diesel's back; a COMMIT sent
        // as plain SQL does the same, deterministically. Locking "inside" it would
        // lock in autocommit and let go at once.
        let db = TestDb::<diesel::MysqlConnection>::new(
            "lock_refuses_a_transaction_the_server_already_ended",
        );
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.conn();
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let refused = conn.transaction(|conn| {
            exec(conn, "COMMIT");
            Ok::<_, Error>(item.lock(conn))
        });
        let refused = refused.unwrap();
        // lockkit came after the end and cannot tell a deadlock from a COMMIT,
        // nor whether the work wrote on in autocommit: no retry takes it up.
        assert!(
            matches!(&refused, Err(Error::TransactionAborted(cause))
                if cause.to_string().contains("may have run outside the transaction")),
            "{refused:?}"
        );
        assert!(!refused.unwrap_err().is_retryable());
        assert_eq!(item.lock_version, 0, "nothing was read into the struct");
    }
}
