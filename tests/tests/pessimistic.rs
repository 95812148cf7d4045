//! Pessimistic locking on real servers: `with_lock`, lock options, `lock_all`,
//! SKIP LOCKED claims, advisory locks, `serializable`, conditional updates and
//! the lock-wait view. Concurrency claims use several connections on threads.

use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use lockkit::bounds::LockRow;
use lockkit::prelude::*;
use lockkit::{locked_transaction, queue, Error, LockOptions};
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::settings::lock_timeout;
use lockkit_tests::{exec, item, seed_items, TestDb};

/// Holds `with_lock` on items row 1 on another connection while `blocked` runs.
fn while_item_locked<C, T>(db: &TestDb<C>, blocked: impl FnOnce() -> T) -> T
where
    C: TestBackend + lockkit::LockingConnection + lockkit::AsLockingConnection<Conn = C>,
    Item: LockRow<C>,
{
    db.while_holding(
        |conn, wait| {
            lockkit::with_lock(
                conn,
                1,
                lockkit::LockOptions::default(),
                |_conn, _item: Item| {
                    wait();
                    Ok::<_, lockkit::Error>(())
                },
            )
            .unwrap();
        },
        blocked,
    )
}

mod all {
    use super::*;

    lockkit_tests::backend_tests! {
        fn with_lock_serializes_concurrent_buyers(db) {
            // Every buyer read stock = 10 before locking; with_lock hands each the
            // fresh row, so nobody sells from a stale count.
            const BUYERS: usize = 5;
            seed_items(&mut db.conn(), &[(1, 10)]);
            let barrier = Barrier::new(BUYERS);
            let sold: i32 = thread::scope(|s| {
                let buyers: Vec<_> = (0..BUYERS)
                    .map(|_| s.spawn(|| {
                        let mut conn = db.conn();
                        let stale = items::table.find(1).first::<Item>(&mut conn).unwrap();
                        barrier.wait();
                        stale
                            .with_lock(&mut conn, |conn, fresh| {
                                thread::sleep(Duration::from_millis(20)); // widen the race window
                                if fresh.stock < 3 {
                                    return Ok::<_, lockkit::Error>(0);
                                }
                                diesel::update(items::table.find(fresh.id))
                                    .set(items::stock.eq(fresh.stock - 3))
                                    .execute(conn)?;
                                Ok(3)
                            })
                            .unwrap()
                    }))
                    .collect();
                buyers.into_iter().map(|b| b.join().unwrap()).sum()
            });
            let stock = items::table.find(1).select(items::stock).first::<i32>(&mut db.conn()).unwrap();
            assert_eq!((sold, stock), (9, 1), "three buyers of 3 from 10");
            assert_eq!(sold + stock, 10, "units sold + stock = initial");
        }

        fn with_lock_hands_over_the_fresh_row_and_leaves_the_struct_alone(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
            exec(&mut conn, "UPDATE items SET stock = 7 WHERE id = 1");
            item.name = "unsaved".into();
            let seen = item.with_lock(&mut conn, |_conn, fresh| Ok::<_, lockkit::Error>(fresh)).unwrap();
            assert_eq!((seen.stock, seen.name.as_str()), (7, "item 1"));
            assert_eq!((item.stock, item.name.as_str()), (10, "unsaved"), "not reloaded, not saved");
        }

        fn with_lock_rolls_back_when_the_closure_fails(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let item = items::table.find(1).first::<Item>(&mut conn).unwrap();
            let err = item
                .with_lock(&mut conn, |conn, fresh| {
                    diesel::update(items::table.find(fresh.id)).set(items::stock.eq(0)).execute(conn)?;
                    Err::<(), _>(Error::NoRowMatched)
                })
                .unwrap_err();
            assert!(matches!(err, Error::NoRowMatched));
            assert_eq!(items::table.find(1).select(items::stock).first::<i32>(&mut conn).unwrap(), 10);
        }

        fn with_lock_on_a_missing_row_is_not_found(db) {
            let mut conn = db.conn();
            let ghost = Item { id: 99, name: "ghost".into(), stock: 0, lock_version: 0 };
            let err = ghost.with_lock(&mut conn, |_, _| Ok(())).unwrap_err();
            assert!(matches!(err, Error::NotFound), "{err:?}");
        }

        fn with_lock_and_update_versioned_compose(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let item = items::table.find(1).first::<Item>(&mut conn).unwrap();
            let version = item
                .with_lock(&mut conn, |conn, mut fresh| {
                    fresh.stock -= 1;
                    fresh.update_versioned(conn)?;
                    Ok::<_, lockkit::Error>(fresh.lock_version)
                })
                .unwrap();
            // One bump for taking the lock on a versioned row, one for the write.
            assert_eq!(version, 2);
            assert_eq!(items::table.find(1).select(items::lock_version).first::<i32>(&mut conn).unwrap(), 2);
        }

        fn lockable_models_without_a_version_can_be_locked(db) {
            let mut conn = db.conn();
            exec(&mut conn, "INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false)");
            let job = jobs::table.find(1).first::<Job>(&mut conn).unwrap();
            job.with_lock(&mut conn, |conn, fresh| {
                diesel::update(jobs::table.find(fresh.id)).set(jobs::done.eq(true)).execute(conn)?;
                Ok::<_, lockkit::Error>(())
            })
            .unwrap();
            assert!(jobs::table.find(1).select(jobs::done).first::<bool>(&mut conn).unwrap());
        }

        fn nowait_reports_busy_at_once(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
            let err = while_item_locked(&db, || {
                let mut conn = db.connect();
                lockkit::with_lock(&mut conn, item.id, LockOptions::default().nowait(), |_, _: Item| Ok::<_, Error>(())).unwrap_err()
            });
            assert!(matches!(err, Error::Busy), "{err:?}");
            // Once released, the same call succeeds.
            lockkit::with_lock(&mut db.conn(), item.id, LockOptions::default().nowait(), |_, _: Item| Ok::<_, Error>(())).unwrap();
        }

        fn a_lock_wait_past_the_timeout_is_lock_timeout(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
            let mut conn = db.connect();
            let before = lock_timeout(&mut conn, BACKEND);
            let (err, waited) = while_item_locked(&db, || {
                let started = Instant::now();
                let err = lockkit::with_lock(&mut conn, item.id, LockOptions::default().timeout(Duration::from_millis(300)), |_, _: Item| Ok::<_, Error>(()))
                    .unwrap_err();
                (err, started.elapsed())
            });
            assert!(matches!(err, Error::LockTimeout), "{err:?}");
            // The error comes from our timeout (MySQL counts whole seconds: 1 s),
            // not from the server's default (MySQL/MariaDB: 50 s).
            let asked = if BACKEND == "mysql" { Duration::from_secs(1) } else { Duration::from_millis(300) };
            assert!(waited >= asked.mul_f64(0.9), "gave up early: {waited:?}");
            assert!(waited < asked + Duration::from_secs(2), "waited past the timeout: {waited:?}");
            assert_eq!(lock_timeout(&mut conn, BACKEND), before, "the session's own timeout is restored");
        }

        fn nested_timeouts_each_put_back_the_value_they_found(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let session = lock_timeout(&mut conn, BACKEND);
            // A call's timeout as its closure sees it: MySQL counts whole seconds.
            let inside = |ms: i64| if BACKEND == "mysql" { ms / 1000 } else { ms };
            locked_transaction(&mut conn, LockOptions::default().timeout(Duration::from_secs(2)), |conn| {
                assert_eq!(lock_timeout(conn, BACKEND), inside(2000));
                lockkit::with_lock(conn, 1, LockOptions::default().timeout(Duration::from_secs(5)), |conn, _: Item| {
                    assert_eq!(lock_timeout(conn, BACKEND), inside(5000));
                    Ok::<_, Error>(())
                })?;
                assert_eq!(lock_timeout(conn, BACKEND), inside(2000), "the outer call's timeout is back");
                // A nested call that fails puts it back too.
                let failed = lockkit::with_lock(conn, 1, LockOptions::default().timeout(Duration::from_secs(7)), |_, _: Item| {
                    Err::<(), _>(Error::NoRowMatched)
                });
                assert!(matches!(failed, Err(Error::NoRowMatched)), "{failed:?}");
                assert_eq!(lock_timeout(conn, BACKEND), inside(2000), "back after a failed nested call");
                Ok::<_, Error>(())
            })
            .unwrap();
            assert_eq!(lock_timeout(&mut conn, BACKEND), session, "the session's own timeout is back");
        }

        fn a_nested_nowait_that_finds_the_lock_held_leaves_the_session_timeout(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let session = lock_timeout(&mut conn, BACKEND);
            // SQLite: the outer transaction is a deferred one, so the nested call
            // takes the write lock itself, under a busy timeout of 0, and fails.
            let err = while_item_locked(&db, || {
                conn.transaction(|conn| {
                    lockkit::with_lock(conn, 1, LockOptions::default().nowait(), |_, _: Item| Ok::<_, Error>(()))
                })
                .unwrap_err()
            });
            assert!(matches!(err, Error::Busy), "{err:?}");
            assert_eq!(lock_timeout(&mut conn, BACKEND), session);
            lockkit::with_lock(&mut conn, 1, LockOptions::default().nowait(), |_, _: Item| Ok::<_, Error>(())).unwrap();
            assert_eq!(lock_timeout(&mut conn, BACKEND), session);
        }

        fn skip_locked_tells_held_from_absent(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
            let err = while_item_locked(&db, || {
                lockkit::with_lock(&mut db.connect(), item.id, LockOptions::default().skip_locked(), |_, _: Item| Ok::<_, Error>(())).unwrap_err()
            });
            assert!(matches!(err, Error::Busy), "{err:?}");
            let err = lockkit::with_lock(&mut db.conn(), 42, LockOptions::default().skip_locked(), |_, _: Item| Ok(()))
                .unwrap_err();
            assert!(matches!(err, Error::NotFound), "{err:?}");
        }

        fn claims_process_every_job_exactly_once(db) {
            const WORKERS: usize = 4;
            const JOBS: i32 = 120;
            let values: Vec<String> = (1..=JOBS).map(|id| format!("({id}, 'job {id}', false)")).collect();
            exec(&mut db.conn(), &format!("INSERT INTO jobs (id, payload, done) VALUES {}", values.join(", ")));
            let processed = Mutex::new(Vec::new());
            thread::scope(|s| {
                for _ in 0..WORKERS {
                    s.spawn(|| {
                        let mut conn = db.conn();
                        loop {
                            let batch = locked_transaction(&mut conn, LockOptions::default(), |conn| {
                                let batch: Vec<Job> = queue::claim(
                                    conn,
                                    jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(Job::as_select()),
                                    5,
                                )?;
                                let ids: Vec<i32> = batch.iter().map(|j| j.id).collect();
                                // One row at a time: InnoDB may scan (and lock) the whole
                                // table for `id IN (..)`, taking other workers' rows.
                                for id in &ids {
                                    diesel::update(jobs::table.find(id)).set(jobs::done.eq(true)).execute(conn)?;
                                }
                                Ok::<_, lockkit::Error>(ids)
                            })
                            .unwrap();
                            if batch.is_empty() {
                                break;
                            }
                            processed.lock().unwrap().extend(batch);
                        }
                    });
                }
            });
            let mut processed = processed.into_inner().unwrap();
            processed.sort();
            assert_eq!(processed, (1..=JOBS).collect::<Vec<_>>(), "each job once");
            let pending = jobs::table.filter(jobs::done.eq(false)).count().get_result::<i64>(&mut db.conn()).unwrap();
            assert_eq!(pending, 0);
        }

        fn claiming_outside_a_transaction_is_an_error(db) {
            let err = queue::claim::<Job, _, _>(&mut db.conn(), jobs::table.select(Job::as_select()), 1).unwrap_err();
            assert!(matches!(err, Error::NotInTransaction));
        }

        fn claiming_with_a_negative_limit_is_refused(db) {
            // SQLite reads `LIMIT -1` as no limit: one worker would claim
            // every job (a limit computed as capacity minus work in hand goes
            // negative easily).
            exec(&mut db.conn(), "INSERT INTO jobs (id, payload) VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')");
            let claimed = locked_transaction(&mut db.connect(), LockOptions::default(), |conn| {
                queue::claim::<i32, _, _>(conn, jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id), -1)
            });
            assert!(matches!(claimed, Err(Error::InvalidInput(_))), "{claimed:?}");
        }

        fn a_claim_on_a_versioned_table_is_a_read_so_claimed_rows_are_marked_with_versioned_writes(db) {
            // `claim` takes row locks but leaves the version alone, as a read:
            // a plain `diesel::update` of a claimed row is lost to a struct read
            // before the claim, a versioned write makes that struct stale.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mark = |conn: &mut _, versioned: bool| {
                locked_transaction(conn, LockOptions::default(), |conn| {
                    let claimed: Vec<Item> =
                        queue::claim(conn, items::table.filter(items::stock.gt(0)).order(items::id), 1)?;
                    let mut item = claimed.into_iter().next().expect("item 1 claimed");
                    item.stock -= 1;
                    if versioned {
                        item.update_versioned(conn)
                    } else {
                        diesel::update(items::table.find(item.id)).set(items::stock.eq(item.stock)).execute(conn).map(drop).map_err(Error::from)
                    }
                })
                .unwrap()
            };
            // The baseline: the plain mark is overwritten.
            let mut early = item!(&mut conn, 1);
            mark(&mut db.conn(), false);
            early.name = "renamed".into();
            early.update_versioned(&mut conn).unwrap();
            assert_eq!(item!(&mut conn, 1).stock, 10, "the plain mark was lost");
            // The versioned mark: the early struct is stale.
            let mut early = item!(&mut conn, 1);
            mark(&mut db.conn(), true);
            early.name = "renamed again".into();
            assert!(matches!(early.update_versioned(&mut conn), Err(Error::Stale(_))));
            assert_eq!(item!(&mut conn, 1).stock, 9, "the versioned mark stands");
        }

        fn lock_all_returns_rows_in_key_order(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 1), (2, 2), (3, 3)]);
            let err = Item::lock_all(&mut conn, &[1, 2]).unwrap_err();
            assert!(matches!(err, Error::NotInTransaction), "locking outside a transaction is refused");
            let rows = locked_transaction(&mut conn, LockOptions::default(), |conn| Item::lock_all(conn, &[3, 1, 3]))
                .unwrap();
            assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 3]);
            let err = locked_transaction(&mut conn, LockOptions::default(), |conn| Item::lock_all(conn, &[1, 7]))
                .unwrap_err();
            assert!(matches!(err, Error::NotFound));
        }

        fn lock_all_reports_a_key_without_a_row_beside_two_rows_of_another(db) {
            // The declared key of twins is not unique in the database: key 1
            // has two rows, key 2 none. The two rows must not stand in for
            // the two keys.
            let mut conn = db.conn();
            exec(&mut conn, "INSERT INTO twins (id, label, lock_version) VALUES (1, 'a', 0), (1, 'b', 0)");
            let locked = locked_transaction(&mut conn, LockOptions::default(), |conn| Twin::lock_all(conn, &[1, 2]));
            assert!(matches!(locked, Err(Error::NotFound)), "{locked:?}");
        }

        fn serializable_keeps_the_on_call_invariant(db) {
            // Two doctors on call; each may go off duty only if another stays on.
            exec(&mut db.conn(), "INSERT INTO doctors (id, name, on_call) VALUES (1, 'alice', true), (2, 'bob', true)");
            let policy = lockkit::RetryPolicy::default().max_attempts(10);
            let barrier = Barrier::new(2);
            let went_off: Vec<bool> = thread::scope(|s| {
                let runs: Vec<_> = [1, 2]
                    .into_iter()
                    .map(|id| {
                        let (barrier, policy, db) = (&barrier, &policy, &db);
                        s.spawn(move || {
                            let mut conn = db.connect();
                            let mut first = true;
                            lockkit::serializable(&mut conn, policy, |conn| {
                                let on_call: i64 = doctors::table.filter(doctors::on_call.eq(true)).count().get_result(conn)?;
                                if std::mem::take(&mut first) && BACKEND != "sqlite" {
                                    barrier.wait(); // both have read "2 on call"
                                }
                                if on_call < 2 {
                                    return Ok::<_, lockkit::Error>(false);
                                }
                                diesel::update(doctors::table.find(id)).set(doctors::on_call.eq(false)).execute(conn)?;
                                Ok(true)
                            })
                            .unwrap()
                        })
                    })
                    .collect();
                runs.into_iter().map(|r| r.join().unwrap()).collect()
            });
            let on_call: i64 = doctors::table.filter(doctors::on_call.eq(true)).count().get_result(&mut db.conn()).unwrap();
            assert_eq!(on_call, 1, "one doctor stays on call: {went_off:?}");
            assert_eq!(went_off.iter().filter(|w| **w).count(), 1);
        }

        fn conditional_updates_never_oversell(db) {
            const BUYERS: usize = 6;
            seed_items(&mut db.conn(), &[(1, 10)]);
            let barrier = Barrier::new(BUYERS);
            let outcomes: Vec<Result<usize, Error>> = thread::scope(|s| {
                let buyers: Vec<_> = (0..BUYERS)
                    .map(|_| s.spawn(|| {
                        let mut conn = db.conn();
                        barrier.wait();
                        lockkit::atomic::update_if(
                            &mut conn,
                            diesel::update(items::table.find(1).filter(items::stock.ge(3)))
                                .set(items::stock.eq(items::stock - 3)),
                        )
                    }))
                    .collect();
                buyers.into_iter().map(|b| b.join().unwrap()).collect()
            });
            let sold = 3 * outcomes.iter().filter(|o| matches!(o, Ok(1))).count() as i32;
            let refused = outcomes.iter().filter(|o| matches!(o, Err(Error::NoRowMatched))).count();
            let stock = items::table.find(1).select(items::stock).first::<i32>(&mut db.conn()).unwrap();
            assert_eq!((sold, refused, stock), (9, 3, 1), "{outcomes:?}");
        }

        fn serializable_refuses_to_nest(db) {
            let mut conn = db.connect();
            let err = conn
                .transaction(|conn| lockkit::serializable(conn, &lockkit::RetryPolicy::default(), |_| Ok(())))
                .unwrap_err();
            assert!(matches!(err, Error::AlreadyInTransaction));
        }
    }
}

mod servers {
    use super::*;

    /// A holder for `TestDb::while_holding`: claims up to `$limit` jobs of
    /// `$pending` in a locked transaction on `$conn`, checks they are
    /// `$claimed`, and keeps them until `$wait` returns. A macro: the
    /// connection type is each backend's.
    macro_rules! hold_claimed {
        ($conn:expr, $pending:expr, $limit:expr, $claimed:expr, $wait:expr) => {
            locked_transaction($conn, LockOptions::default(), |conn| {
                let ids: Vec<i32> = queue::claim(conn, $pending, $limit)?;
                assert_eq!(ids, $claimed);
                $wait();
                Ok::<_, lockkit::Error>(())
            })
            .unwrap()
        };
    }

    lockkit_tests::server_tests! {
        fn a_producer_waits_for_a_claim_only_under_innodbs_repeatable_read(db) {
            // A claim that reaches the end of the pending jobs locks, under
            // InnoDB's REPEATABLE READ, the gap after them too, where every new
            // job goes: a producer's insert waits for the worker's whole batch.
            // At READ COMMITTED (the queue docs' advice for MySQL/MariaDB), and
            // on PostgreSQL, it does not.
            let pending = || jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id);
            for read_committed in [false, true] {
                exec(&mut db.conn(), "DELETE FROM jobs");
                exec(&mut db.conn(), "INSERT INTO jobs (id, payload, done) VALUES (1, 'job 1', false), (2, 'job 2', false)");
                let worker = |conn: &mut Conn, wait: &dyn Fn()| {
                    if read_committed && BACKEND != "postgres" {
                        exec(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
                    }
                    hold_claimed!(conn, pending(), 10, vec![1, 2], wait);
                };
                let inserted = db.while_holding(worker, || {
                    let mut producer = db.connect();
                    exec(&mut producer, if BACKEND == "postgres" { "SET lock_timeout = '1s'" } else { "SET SESSION innodb_lock_wait_timeout = 1" });
                    diesel::sql_query("INSERT INTO jobs (id, payload, done) VALUES (3, 'job 3', false)").execute(&mut producer)
                });
                if BACKEND == "postgres" || read_committed {
                    assert!(inserted.is_ok(), "read committed: {read_committed}; {inserted:?}");
                } else {
                    assert!(inserted.is_err(), "the producer did not wait for the claim's gap lock");
                }
            }
        }

        fn two_workers_claiming_at_once_get_other_jobs_where_plain_reads_get_the_same(db) {
            // Both workers read their batch, and only then (the barrier) mark
            // it done. A plain read inside a transaction hands both the same
            // jobs: each runs them, and the second's marks wait for the
            // first's, then write over them (the naive queue). `queue::claim`
            // hands the second worker the next jobs.
            let pending = || jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id);
            for claim in [false, true] {
                exec(&mut db.conn(), "DELETE FROM jobs");
                let values: Vec<String> = (1..=6).map(|id| format!("({id}, 'job {id}', false)")).collect();
                exec(&mut db.conn(), &format!("INSERT INTO jobs (id, payload, done) VALUES {}", values.join(", ")));
                let barrier = Barrier::new(2);
                let batches: Vec<Vec<i32>> = thread::scope(|s| {
                    let workers: Vec<_> = (0..2)
                        .map(|_| s.spawn(|| {
                            let mut conn = db.connect();
                            let run = |conn: &mut Conn| {
                                let ids: Vec<i32> = if claim {
                                    queue::claim(conn, pending(), 3)?
                                } else {
                                    pending().limit(3).load(conn)?
                                };
                                barrier.wait(); // both have their batch
                                for id in &ids {
                                    diesel::update(jobs::table.find(id)).set(jobs::done.eq(true)).execute(conn)?;
                                }
                                Ok::<_, lockkit::Error>(ids)
                            };
                            if claim {
                                locked_transaction(&mut conn, LockOptions::default(), run).unwrap()
                            } else {
                                conn.transaction(run).unwrap()
                            }
                        }))
                        .collect();
                    workers.into_iter().map(|w| w.join().unwrap()).collect()
                });
                let mut processed: Vec<i32> = batches.concat();
                processed.sort();
                if claim {
                    assert_eq!(processed, (1..=6).collect::<Vec<_>>(), "each job once: {batches:?}");
                } else {
                    assert_eq!(processed, [1, 1, 2, 2, 3, 3], "plain reads: both ran the same jobs");
                }
            }
        }

        fn a_claim_skips_a_held_job_without_waiting(db) {

            let values: Vec<String> = (1..=3).map(|id| format!("({id}, 'job {id}', false)")).collect();
            exec(&mut db.conn(), &format!("INSERT INTO jobs (id, payload, done) VALUES {}", values.join(", ")));
            let pending = || jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id);
            let holder = |conn: &mut Conn, wait: &dyn Fn()| hold_claimed!(conn, pending(), 1, vec![1], wait);
            let second = db.while_holding(holder, || {
                let mut conn = db.connect();
                // A plain FOR UPDATE would wait for job 1 here: let it fail, not hang.
                exec(&mut conn, if BACKEND == "postgres" { "SET lock_timeout = '3s'" } else { "SET SESSION innodb_lock_wait_timeout = 3" });
                // No bound on the claim's time: the holder lets go of job 1
                // only after the claim returned, so a claim that waited for it
                // would fail with the lock timeout, not return jobs 2 and 3.
                locked_transaction(&mut conn, LockOptions::default(), |conn| queue::claim::<i32, _, _>(conn, pending(), 2))
            });
            assert_eq!(second.unwrap(), vec![2, 3], "job 1 skipped while held");
        }
    }
}

/// `lock_all` with UUID keys (feature `uuid`): PostgreSQL only, the one backend
/// Diesel maps UUIDs on.
#[cfg(feature = "postgres")]
mod uuid_keys {
    use super::*;
    use diesel::PgConnection;
    use uuid::Uuid;

    #[test]
    fn lock_all_takes_uuid_keys_in_the_servers_order() {
        let db = TestDb::<PgConnection>::new("lock_all_uuid");
        let mut conn = db.conn();
        // Spread over every first byte, 0x80 and above included (PostgreSQL
        // compares UUIDs as unsigned bytes, as `Uuid`'s `Ord` does), and more
        // than one statement's worth, so the chunks must follow the server's order.
        let ids: Vec<Uuid> = (1..=1500u128)
            .map(|n| Uuid::from_u128(n.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)))
            .collect();
        assert!(ids.len() > lockkit::pessimistic::lockable::MAX_KEYS_PER_STATEMENT);
        let rows: Vec<_> = ids
            .iter()
            .map(|id| (tickets::id.eq(*id), tickets::title.eq("t")))
            .collect();
        diesel::insert_into(tickets::table)
            .values(&rows)
            .execute(&mut conn)
            .unwrap();
        let mut sorted = ids.clone();
        sorted.sort();

        let mut keys = ids.clone();
        keys.push(ids[0]); // named twice, locked once
        let mut other = db.connect();
        let locked = locked_transaction(&mut conn, LockOptions::default(), |conn| {
            let rows = Ticket::lock_all(conn, &keys)?;
            let busy = other
                .transaction(|c| {
                    tickets::table
                        .find(ids[7])
                        .select(tickets::id)
                        .for_update()
                        .nowait()
                        .get_result::<Uuid>(c)
                })
                .map_err(lockkit::classify);
            assert!(
                matches!(busy, Err(Error::Busy)),
                "held by lock_all: {busy:?}"
            );
            Ok::<_, Error>(rows)
        })
        .unwrap();
        assert_eq!(
            locked.iter().map(|t| t.id).collect::<Vec<_>>(),
            sorted,
            "in key order"
        );
        assert!(
            locked.iter().all(|t| t.lock_version == 1),
            "each locked row's version advanced"
        );

        let missing = locked_transaction(&mut conn, LockOptions::default(), |conn| {
            Ticket::lock_all(conn, &[ids[0], Uuid::nil()])
        });
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
        let with_lock = lockkit::with_lock(
            &mut conn,
            ids[3],
            LockOptions::default(),
            |_, ticket: Ticket| Ok::<_, Error>(ticket.lock_version),
        )
        .unwrap();
        assert_eq!(with_lock, 2);
    }
}
