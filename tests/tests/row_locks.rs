//! Row locks on the servers that have them (PostgreSQL, MySQL/MariaDB): deadlocks
//! and how `lock_all` prevents them, nested `with_lock`, lock clauses and lock
//! strengths, advisory locks, write skew, and who waits on whom.

use std::sync::{mpsc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use lockkit::advisory::{self, AdvisoryKey};
use lockkit::lock_waits;
use lockkit::prelude::*;
use lockkit::{locked_transaction, Error, LockOptions, LockStrength};
use lockkit_tests::lock_waits::{look_until, while_a_session_waits_for_item_1};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, seed_items};

lockkit_tests::server_tests! {
    fn locking_in_opposite_orders_deadlocks_and_lock_all_never_does(db) {
        seed_items(&mut db.conn(), &[(1, 100), (2, 100)]);
        // One row at a time, {1, 2} against {2, 1}: the server must break a deadlock.
        let barrier = Barrier::new(2);
        let outcomes: Vec<Result<(), Error>> = thread::scope(|s| {
            let runs: Vec<_> = [[1, 2], [2, 1]]
                .into_iter()
                .map(|order| {
                    let (barrier, db) = (&barrier, &db);
                    s.spawn(move || {
                        let mut conn = db.connect();
                        locked_transaction(&mut conn, LockOptions::default(), |conn| {
                            for (i, id) in order.into_iter().enumerate() {
                                let _: Item = items::table.find(id).for_update().first(conn)?;
                                if i == 0 {
                                    barrier.wait();
                                }
                            }
                            Ok(())
                        })
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(outcomes.iter().filter(|o| matches!(o, Err(Error::Deadlock))).count(), 1, "{outcomes:?}");

        // The same workload through lock_all, many times over: no deadlock, no loss.
        const ROUNDS: usize = 25;
        let barrier = Barrier::new(2);
        thread::scope(|s| {
            for order in [[1, 2], [2, 1]] {
                let (barrier, db) = (&barrier, &db);
                s.spawn(move || {
                    let mut conn = db.connect();
                    for _ in 0..ROUNDS {
                        barrier.wait();
                        locked_transaction(&mut conn, LockOptions::default(), |conn| {
                            let rows = Item::lock_all(conn, &order)?;
                            for row in rows {
                                diesel::update(items::table.find(row.id))
                                    .set(items::stock.eq(row.stock - 1))
                                    .execute(conn)?;
                            }
                            Ok::<_, lockkit::Error>(())
                        })
                        .expect("lock_all never deadlocks");
                    }
                });
            }
        });
        let stocks: Vec<i32> = items::table.order(items::id).select(items::stock).load(&mut db.conn()).unwrap();
        assert_eq!(stocks, vec![100 - 2 * ROUNDS as i32; 2]);
    }

    fn nested_with_lock_holds_the_lock_until_the_outer_commit(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        let mut conn = db.connect();
        let mut other = db.connect();
        let nowait = LockOptions::default().nowait();
        conn.transaction(|conn| {
            item.with_lock(conn, |_, _| Ok::<_, lockkit::Error>(()))?;
            // The closure has returned, but only a savepoint was released.
            let err = lockkit::with_lock(&mut other, item.id, nowait, |_, _: Item| Ok::<_, Error>(())).unwrap_err();
            assert!(matches!(err, Error::Busy), "{err:?}");
            Ok::<_, Error>(())
        })
        .unwrap();
        lockkit::with_lock(&mut other, item.id, nowait, |_, _: Item| Ok::<_, Error>(())).unwrap();
    }

    fn a_nested_call_that_failed_lets_its_row_lock_go(db) {
        // Nested, the savepoint's release keeps the row lock (above). A
        // nested call whose closure fails rolls back to its savepoint, and
        // PostgreSQL then releases the row locks taken after it; MariaDB
        // does too where the transaction had done nothing before the
        // savepoint (it rolls the whole of it back). Code that lets the
        // failure go and writes from what the call read may hold no lock:
        // the docs say to lock again.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        let mut other = db.connect();
        let nowait = LockOptions::default().nowait();
        conn.transaction(|conn| {
            let failed = lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| {
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(matches!(failed, Err(Error::NoRowMatched)), "{failed:?}");
            let taken = lockkit::with_lock(&mut other, 1, nowait, |_, _: Item| Ok::<_, Error>(()));
            assert!(taken.is_ok(), "released with the savepoint: {taken:?}");
            // Inside a savepoint of your own, after a read: the same on
            // PostgreSQL; MariaDB keeps this one.
            let mut item: Item = items::table.find(1).first(conn)?;
            let rolled_back = conn.transaction(|conn| {
                item.lock(conn)?;
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            let taken = lockkit::with_lock(&mut other, 1, nowait, |_, _: Item| Ok::<_, Error>(()));
            if BACKEND == "postgres" {
                assert!(taken.is_ok(), "released with the savepoint: {taken:?}");
            } else {
                assert!(matches!(taken, Err(Error::Busy)), "kept after a read before the savepoint: {taken:?}");
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    }

    fn nowait_is_the_same_clause_as_diesels_no_wait(db) {
        let _ = db;
        let ours = diesel::debug_query::<Backend, _>(&items::table.find(1).for_update().nowait()).to_string();
        let diesels = diesel::debug_query::<Backend, _>(&items::table.find(1).for_update().no_wait()).to_string();
        assert_eq!(ours, diesels);
        assert!(ours.contains("FOR UPDATE NOWAIT"), "{ours}");
    }

    fn our_nowait_fails_fast_on_a_locked_row(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let err = db.while_holding(
            |conn, wait| {
                lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |_, _: Item| {
                    wait();
                    Ok::<_, lockkit::Error>(())
                })
                .unwrap();
            },
            || {
                db.connect()
                    .transaction(|conn| items::table.find(1).for_update().nowait().first::<Item>(conn))
                    .unwrap_err()
            },
        );
        assert!(matches!(lockkit::classify_nowait(err), Error::Busy));
    }

    fn advisory_locks_admit_one_session_at_a_time(db) {
        let mut a = db.connect();
        let mut b = db.connect();
        for key in [AdvisoryKey::from(7), AdvisoryKey::from_name("nightly-report")] {
            let guard = advisory::try_lock(&mut a, key).unwrap().expect("free at first");
            assert!(advisory::try_lock(&mut b, key).unwrap().is_none(), "held by a");
            drop(guard);
            let again = advisory::try_lock(&mut b, key).unwrap().expect("released on drop");
            again.unlock().unwrap();
        }
        // A waiting `lock` gets the lock once the holder lets go.
        let key = AdvisoryKey::from_name("migration");
        let held = advisory::lock(&mut a, key).unwrap();
        // Set just before a lets go: b's lock, granted, finds it set however
        // late b's thread began to wait.
        let released = std::sync::atomic::AtomicBool::new(false);
        thread::scope(|s| {
            let waiter = s.spawn(|| {
                let guard = advisory::lock(&mut b, key).unwrap();
                let after_release = released.load(std::sync::atomic::Ordering::SeqCst);
                drop(guard);
                after_release
            });
            thread::sleep(Duration::from_millis(200));
            released.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(held);
            assert!(waiter.join().unwrap(), "b waited for a");
        });
    }

    fn an_advisory_lock_covers_the_commit_of_the_writes_made_under_it(db) {
        // Read-modify-writes made one at a time under an advisory lock: the
        // next holder must read what the previous one committed. PostgreSQL
        // takes a transaction lock inside a transaction, held until COMMIT.
        // MySQL/MariaDB's GET_LOCK is the session's, released when its guard
        // drops, before COMMIT: refused inside a transaction, and taken before
        // it instead.
        seed_items(&mut db.conn(), &[(1, 0)]);
        let key = AdvisoryKey::from_name(&db.url); // MySQL's names are server-wide
        let increment = |conn: &mut Conn| -> Result<(), Error> {
            let stock: i32 = items::table.find(1).select(items::stock).first(conn)?;
            diesel::update(items::table.find(1)).set(items::stock.eq(stock + 1)).execute(conn)?;
            Ok(())
        };
        let (threads, rounds) = (4, 25);
        thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut conn = db.connect();
                    for _ in 0..rounds {
                        let inside = locked_transaction(&mut conn, LockOptions::default(), |conn| {
                            let mut guard = advisory::lock(conn, key)?;
                            increment(&mut guard)
                        });
                        match inside {
                            Ok(()) => {}
                            Err(Error::AlreadyInTransaction) if BACKEND == "mysql" => {
                                let mut guard = advisory::lock(&mut conn, key).unwrap();
                                locked_transaction(&mut *guard, LockOptions::default(), increment).unwrap();
                            }
                            Err(err) => panic!("{err}"),
                        }
                    }
                });
            }
        });
        let stock: i32 = items::table.find(1).select(items::stock).first(&mut db.conn()).unwrap();
        assert_eq!(stock, threads * rounds, "increments made one at a time under the lock");
    }

    fn hostile_advisory_names_are_only_data(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let name = "x'); DROP TABLE items; -- \" ` \\";
        let guard = advisory::try_lock(&mut *conn, name).unwrap().expect("lock");
        guard.unlock().unwrap();
        assert_eq!(items::table.count().get_result::<i64>(&mut conn).unwrap(), 1);
    }

    fn repeatable_read_lets_write_skew_break_the_invariant(db) {
        // The baseline `serializable` is measured against: both doctors read
        // "two on call" from their snapshots and both go off duty.
        exec(&mut db.conn(), "INSERT INTO doctors (id, name, on_call) VALUES (1, 'alice', true), (2, 'bob', true)");
        let barrier = Barrier::new(2);
        thread::scope(|s| {
            for id in [1, 2] {
                let (barrier, db) = (&barrier, &db);
                s.spawn(move || {
                    let mut conn = db.connect();
                    exec(&mut conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
                    conn.transaction(|conn| {
                        let on_call: i64 = doctors::table.filter(doctors::on_call.eq(true)).count().get_result(conn)?;
                        barrier.wait();
                        if on_call >= 2 {
                            diesel::update(doctors::table.find(id)).set(doctors::on_call.eq(false)).execute(conn)?;
                        }
                        diesel::QueryResult::Ok(())
                    })
                    .unwrap();
                });
            }
        });
        let on_call: i64 = doctors::table.filter(doctors::on_call.eq(true)).count().get_result(&mut db.conn()).unwrap();
        assert_eq!(on_call, 0, "write skew: nobody is on call");
    }

    fn lock_waits_show_who_waits_on_whom(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut observer = db.connect();
        let (sessions, blocked, stock) = while_a_session_waits_for_item_1(&db, |sessions| {
            look_until(Duration::from_secs(10), "b never showed up as waiting", || {
                let found = lock_waits::blocked_sessions(&mut observer).unwrap();
                found.into_iter().find(|s| s.session == sessions.waiter)
            })
        });
        let (a_id, b_id) = (sessions.holder, sessions.waiter);
        assert_eq!(blocked.blocked_by, vec![a_id], "b waits on a");
        assert!(blocked.query.to_uppercase().contains("FOR UPDATE"), "{}", blocked.query);
        assert_eq!(stock.unwrap(), 10);
        // The view is server-wide (other tests may be waiting): look for b only.
        // InnoDB refreshes its information_schema copy only after 100 ms without
        // a read, so poll more slowly than that.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let sessions = lock_waits::blocked_sessions(&mut observer).unwrap();
            if sessions.iter().all(|s| s.session != b_id) {
                break;
            }
            assert!(Instant::now() < deadline, "b still shown waiting: {sessions:?}");
            thread::sleep(Duration::from_millis(250));
        }
    }

    fn for_share_is_shared_by_readers_and_keeps_writers_out(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let share = LockOptions::default().share();
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (shared, exclusive) = thread::scope(|s| {
            let db = &db;
            s.spawn(move || {
                lockkit::with_lock(&mut db.connect(), 1, share, |_, _: Item| {
                    locked_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                    Ok::<_, lockkit::Error>(())
                })
                .unwrap();
            });
            locked_rx.recv().unwrap();
            let mut other = db.connect();
            let shared = lockkit::with_lock(&mut other, 1, share.nowait(), |_, item: Item| Ok::<_, lockkit::Error>(item.stock));
            let exclusive = lockkit::with_lock(&mut other, 1, LockOptions::default().nowait(), |_, _: Item| Ok(()));
            release_tx.send(()).unwrap();
            (shared, exclusive)
        });
        assert_eq!(shared.unwrap(), 10, "a second reader shares the lock");
        assert!(matches!(exclusive, Err(Error::Busy)), "{exclusive:?}");
    }

    fn lock_timeouts_reach_the_server_as_numbers(db) {
        // The timeout is a Duration, bound (PostgreSQL, MySQL) or formatted as an
        // integer: there is no text to inject. Extreme values are clamped, not errors.
        seed_items(&mut db.conn(), &[(1, 10)]);
        for timeout in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            let stock = lockkit::with_lock(&mut db.conn(), 1, LockOptions::default().timeout(timeout), |_, item: Item| {
                Ok::<_, lockkit::Error>(item.stock)
            })
            .unwrap();
            assert_eq!(stock, 10);
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres_only {
    use super::*;

    /// What lockkit reports when a session lock's unlock finds it not held.
    const NOT_HELD: &str = "advisory unlock found the lock not held by this session: \
        released by other code, or the unlock reached another server session \
        (a pooler in transaction mode), which may still hold it";
    use diesel::connection::SimpleConnection;
    use diesel::PgConnection;
    use lockkit_tests::row_2_replaced::Row2ReplacedTwice;
    use lockkit_tests::TestDb;

    #[test]
    fn a_session_lock_whose_unlock_fails_marks_the_connection_broken() {
        // The guard drops inside a transaction that a failed statement
        // aborted (a panic left it open): PostgreSQL refuses the unlock, and
        // the session keeps the lock. The connection must say it is broken, so
        // that a pool closes it (and the server frees the lock), as the async
        // side does.
        let db = TestDb::<PgConnection>::new("advisory_unlock_fails");
        let key = AdvisoryKey::from_name("unlock fails");
        let (conn, mut other) = released_in_an_aborted_transaction(&db, key, |guard| drop(guard));
        drop(conn);
        // The server frees it once the session's process has exited, which
        // the client does not wait for.
        look_until(
            Duration::from_secs(10),
            "never freed with the session",
            || advisory::try_lock(&mut other, key).unwrap().map(drop),
        );
    }

    #[test]
    fn a_session_lock_whose_explicit_unlock_fails_marks_the_connection_broken() {
        // As above, released with `unlock`, which reports the failure: the
        // connection must still say it is broken, or, its transaction rolled
        // back, it goes back to its pool healthy and holding the lock.
        let db = TestDb::<PgConnection>::new("advisory_explicit_unlock_fails");
        let key = AdvisoryKey::from_name("explicit unlock fails");
        released_in_an_aborted_transaction(&db, key, |guard| {
            let unlocked = guard.unlock();
            assert!(unlocked.is_err(), "{unlocked:?}");
        });
    }

    /// Takes `key`'s session lock on a new connection of `db` and fails a
    /// statement in a transaction opened on the guard, which aborts it;
    /// `release` then lets the guard go. The connection must say it is
    /// broken, and another session find the lock still held: returns the
    /// connection and that other session's.
    fn released_in_an_aborted_transaction(
        db: &TestDb<PgConnection>,
        key: AdvisoryKey,
        release: impl FnOnce(advisory::AdvisoryLock<'_, PgConnection>),
    ) -> (PgConnection, PgConnection) {
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        let mut conn = db.connect();
        let mut guard = advisory::lock(&mut conn, key).unwrap();
        AnsiTransactionManager::begin_transaction(&mut *guard).unwrap();
        assert!(guard.batch_execute("SELECT 1/0").is_err());
        release(guard);
        let status = AnsiTransactionManager::transaction_manager_status_mut(&mut conn);
        assert!(status.transaction_depth().is_err(), "{status:?}");
        let mut other = db.connect();
        assert!(
            advisory::try_lock(&mut other, key).unwrap().is_none(),
            "the session still holds it"
        );
        (conn, other)
    }

    #[test]
    fn a_session_lock_found_not_held_at_its_drop_is_reported() {
        // Code of yours released it (`pg_advisory_unlock_all()`), or a pooler
        // in transaction mode sent the unlock to another server session than
        // the lock's, which still holds it: the guard cannot tell which, and
        // must not stay silent.
        let db = TestDb::<PgConnection>::new("advisory_unlock_not_held");
        let mut conn = db.connect();
        let key = AdvisoryKey::from_name("not held at drop");
        let ((), seen) = lockkit_tests::observe::observe(|| {
            let mut guard = advisory::lock(&mut conn, key).unwrap();
            guard
                .batch_execute("SELECT pg_advisory_unlock_all()")
                .unwrap();
        });
        let warned = seen.events_named(NOT_HELD);
        assert_eq!(warned.len(), 1, "{:?}", seen.events);
        assert_eq!(warned[0].level, tracing::Level::WARN);
    }

    #[test]
    fn lock_waits_answer_a_role_that_cannot_see_other_roles_sessions() {
        // Without `pg_read_all_stats`, `pg_stat_activity` shows no times
        // (NULL) and no statement for the sessions of other roles: the waiter
        // is listed all the same, its wait unknown (zero).
        let db = TestDb::<PgConnection>::new("lock_waits_unprivileged");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let database = db.url.rsplit('/').next().unwrap().to_owned();
        let role = format!("{database}_observer");
        exec(&mut db.conn(), &format!("DROP ROLE IF EXISTS \"{role}\""));
        exec(&mut db.conn(), &format!("CREATE ROLE \"{role}\" NOLOGIN"));
        let mut watcher = db.connect();
        let mut observer = db.connect();
        exec(&mut observer, &format!("SET ROLE \"{role}\""));
        let (sessions, (blocked, waits), _) = while_a_session_waits_for_item_1(&db, |sessions| {
            look_until(
                Duration::from_secs(10),
                "b never showed up as waiting",
                || {
                    let found = lock_waits::blocked_sessions(&mut watcher).unwrap();
                    found.into_iter().find(|s| s.session == sessions.waiter)
                },
            );
            (
                lock_waits::blocked_sessions(&mut observer),
                lock_waits::current(&mut observer),
            )
        });
        drop(observer);
        exec(&mut db.conn(), &format!("DROP ROLE \"{role}\""));
        let blocked = blocked.unwrap();
        let blocked = blocked.iter().find(|s| s.session == sessions.waiter);
        assert_eq!(
            blocked.map(|s| s.blocked_by.clone()),
            Some(vec![sessions.holder]),
            "{blocked:?}"
        );
        let waits = waits.unwrap();
        assert!(
            waits.iter().any(|w| w.session == sessions.waiter),
            "{waits:?}"
        );
    }

    #[test]
    fn for_update_of_locks_one_side_of_an_outer_join() {
        let db = TestDb::<PgConnection>::new("for_update_of");
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        exec(
            &mut conn,
            "INSERT INTO orders (id, item_id, qty) VALUES (1, 1, 2), (2, NULL, 1)",
        );
        let query = || {
            orders::table
                .left_join(items::table)
                .select((orders::id, items::stock.nullable()))
        };
        let refused = conn
            .transaction(|conn| query().for_update().load::<(i32, Option<i32>)>(conn))
            .unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("nullable side of an outer join"),
            "{refused}"
        );
        let rows = conn
            .transaction(|conn| {
                query()
                    .order(orders::id)
                    .for_update_of(orders::table)
                    .load::<(i32, Option<i32>)>(conn)
            })
            .unwrap();
        assert_eq!(rows, vec![(1, Some(10)), (2, None)]);
        let sql = diesel::debug_query::<diesel::pg::Pg, _>(
            &query().for_update_of(orders::table).skip_locked(),
        )
        .to_string();
        assert!(
            sql.contains(r#"FOR UPDATE OF "orders" SKIP LOCKED"#),
            "{sql}"
        );

        // What is locked, seen from another connection with NOWAIT.
        let mut other = db.connect();
        let mut free = |table: &str| {
            let sql = format!("SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE NOWAIT");
            other.transaction(|other| other.batch_execute(&sql)).is_ok()
        };
        // Without OF (on an inner join, where it is allowed) both sides are locked...
        conn.transaction(|conn| {
            orders::table
                .inner_join(items::table)
                .select(orders::id)
                .for_update()
                .load::<i32>(conn)?;
            assert_eq!((free("orders"), free("items")), (false, false));
            diesel::QueryResult::Ok(())
        })
        .unwrap();
        // ... with OF, only the orders rows; the items stay free.
        conn.transaction(|conn| {
            query()
                .for_update_of(orders::table)
                .load::<(i32, Option<i32>)>(conn)?;
            assert_eq!((free("orders"), free("items")), (false, true));
            diesel::QueryResult::Ok(())
        })
        .unwrap();
    }

    /// Under READ COMMITTED, a locking read that waited for a transaction
    /// which deleted a row and inserted it again skips the deleted row, and
    /// the new one is not in its snapshot: `lock_all` must still return, and
    /// lock, the row of every key, or refuse; and return them in key order
    /// (the new row is found by a read of its own, after the others).
    #[test]
    fn lock_all_locks_a_row_deleted_and_inserted_again_by_the_transaction_it_waited_for() {
        let db = TestDb::<PgConnection>::new("lock_all_reinserted");
        seed_items(&mut db.conn(), &[(1, 10), (2, 10), (3, 10)]);
        let locked = once_item_2_replaced(&db, |conn| {
            locked_transaction(conn, LockOptions::default(), |c| {
                let rows = Item::lock_all(c, &[1, 2, 3])?;
                Ok::<_, Error>(rows.iter().map(|r| (r.id, r.stock)).collect::<Vec<_>>())
            })
        });
        assert_eq!(locked.unwrap(), vec![(1, 10), (2, 7), (3, 10)]);
    }

    #[test]
    fn with_lock_locks_a_row_deleted_and_inserted_again_by_the_transaction_it_waited_for() {
        // As lock_all above, for one row: the locked read that waited skips
        // the row the other transaction deleted, and the new one is not in
        // its snapshot. The row exists, locked: it must come back, not
        // `NotFound`, with each lock strength (the versioned `FOR UPDATE`
        // bumps in its read, the others read only; the adaptive policy's
        // locked path reads as they do).
        let db = TestDb::<PgConnection>::new("with_lock_reinserted");
        let cases = [
            ("for update", LockOptions::default()),
            ("for share", LockOptions::default().share()),
            ("for no key update", LockOptions::default().no_key_update()),
        ];
        for (name, options) in cases {
            exec(&mut db.conn(), "DELETE FROM items");
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let locked = once_item_2_replaced(&db, |conn| {
                lockkit::with_lock(conn, 2, options, |_, item: Item| Ok::<_, Error>(item.stock))
            });
            assert!(matches!(locked, Ok(7)), "{name}: {locked:?}");
        }
    }

    /// Runs `lock` on a new connection of `db` while another transaction
    /// replaces item 2 (deletes it and inserts it again, stock 7): the
    /// replacement commits once the server shows `lock`'s session waiting for
    /// it. What `lock` returned.
    fn once_item_2_replaced<T: Send>(
        db: &TestDb<PgConnection>,
        lock: impl FnOnce(&mut PgConnection) -> T + Send,
    ) -> T {
        let mut replacer = db.connect();
        replacer
            .batch_execute(lockkit_tests::REPLACE_ITEM_2_UNCOMMITTED)
            .unwrap();
        let mut observer = db.connect();
        let mut conn = db.connect();
        let session = lock_waits::session_id(&mut conn).unwrap();
        thread::scope(|s| {
            let locker = s.spawn(move || lock(&mut conn));
            look_until(
                Duration::from_secs(10),
                "the locked read never waited",
                || {
                    let found = lock_waits::blocked_sessions(&mut observer).unwrap();
                    found.into_iter().find(|s| s.session == session)
                },
            );
            replacer.batch_execute("COMMIT").unwrap();
            locker.join().unwrap()
        })
    }

    #[test]
    fn lock_all_locks_a_row_committed_while_its_second_read_waited() {
        // lock_all waits for row 1, which a holder locked. Meanwhile one
        // transaction replaces row 2 and commits, and another replaces it
        // again, not committed yet. Once the holder commits, the first read
        // skips the row 2 the first replacement deleted; the second read
        // waits for the second replacement's delete, and skips that row once
        // it commits. The row 2 committed last must be locked and returned,
        // not left out of an `Ok`.
        let db = TestDb::<PgConnection>::new("lock_all_second_read_waited");
        let mut scene = Row2ReplacedTwice::new(&db);
        let mut observer = db.connect();
        let (session_tx, session_rx) = mpsc::channel();
        let locked = thread::scope(|s| {
            let locker = s.spawn(|| lock_all_telling_its_session(&db, &[1, 2], session_tx));
            let session = session_rx.recv().unwrap();
            let mut waits_on = |blocker: Option<i64>, never: &str| {
                look_until(Duration::from_secs(10), never, || {
                    let found = lock_waits::blocked_sessions(&mut observer).unwrap();
                    found.into_iter().find(|s| {
                        s.session == session && blocker.is_none_or(|b| s.blocked_by == [b])
                    })
                });
            };
            waits_on(None, "lock_all never waited for row 1");
            scene.replace_row_2_twice(&db);
            waits_on(
                Some(scene.replacer_id),
                "the second read never waited for the replacement",
            );
            scene.commit_the_second();
            locker.join().unwrap()
        });
        assert_eq!(locked.unwrap(), vec![(1, 10), (2, 7)]);
    }

    /// `lock_all` of items `keys` in a lockkit transaction on a new
    /// connection of `db`, which first sends its session's id on `session`:
    /// the rows' `(id, stock)`.
    fn lock_all_telling_its_session(
        db: &TestDb<PgConnection>,
        keys: &[i32],
        session: mpsc::Sender<i64>,
    ) -> Result<Vec<(i32, i32)>, Error> {
        let mut conn = db.connect();
        session
            .send(lock_waits::session_id(&mut conn).unwrap())
            .unwrap();
        locked_transaction(&mut conn, LockOptions::default(), |c| {
            let rows = Item::lock_all(c, keys)?;
            Ok::<_, Error>(rows.iter().map(|r| (r.id, r.stock)).collect::<Vec<_>>())
        })
    }

    /// Holds row 1 of items with `options` on another connection while `during` runs.
    fn while_held<T>(
        db: &TestDb<PgConnection>,
        options: LockOptions,
        during: impl FnOnce() -> T,
    ) -> T {
        db.while_holding(
            |conn, wait| {
                lockkit::with_lock(conn, 1, options, |_, _: Item| {
                    wait();
                    Ok::<_, lockkit::Error>(())
                })
                .unwrap();
            },
            during,
        )
    }

    /// Whether `options` with NOWAIT can lock row 1 of items now.
    fn can_lock(conn: &mut PgConnection, options: LockOptions) -> Result<(), Error> {
        lockkit::with_lock(conn, 1, options.nowait(), |_, _: Item| Ok(()))
    }

    #[test]
    fn no_key_update_lets_a_foreign_key_insert_through() {
        // Inserting an order for item 1 checks the foreign key with FOR KEY SHARE
        // on the item: FOR UPDATE blocks it, FOR NO KEY UPDATE does not.
        let db = TestDb::<PgConnection>::new("no_key_update_fk");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut inserter = db.connect();
        exec(&mut inserter, "SET lock_timeout = '500ms'");
        let insert = |conn: &mut PgConnection, id: i32| {
            conn.batch_execute(&format!(
                "INSERT INTO orders (id, item_id, qty) VALUES ({id}, 1, 1)"
            ))
            .map_err(lockkit::classify)
        };
        let no_key = LockOptions::default().no_key_update();
        let inserted = while_held(&db, no_key, || insert(&mut inserter, 1));
        assert!(inserted.is_ok(), "{inserted:?}");
        let blocked = while_held(&db, LockOptions::default(), || insert(&mut inserter, 2));
        assert!(matches!(blocked, Err(Error::LockTimeout)), "{blocked:?}");
    }

    #[test]
    fn key_share_blocks_only_key_changes() {
        let db = TestDb::<PgConnection>::new("key_share");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let hold_key_share = |conn: &mut PgConnection, wait: &dyn Fn()| {
            conn.transaction(|conn| {
                items::table
                    .find(1)
                    .select(items::id)
                    .for_key_share()
                    .load::<i32>(conn)?;
                wait();
                Ok::<_, diesel::result::Error>(())
            })
            .unwrap();
        };
        let (no_key_update, update) = db.while_holding(
            |conn, wait| hold_key_share(conn, &wait),
            || {
                let mut other = db.connect();
                (
                    can_lock(&mut other, LockOptions::default().no_key_update()),
                    can_lock(&mut other, LockOptions::default()),
                )
            },
        );
        assert!(no_key_update.is_ok(), "{no_key_update:?}");
        assert!(matches!(update, Err(Error::Busy)), "{update:?}");
    }

    #[test]
    fn with_lock_refuses_key_share_which_lets_writers_through() {
        // FOR KEY SHARE waits only for FOR UPDATE: a plain UPDATE, or a second
        // caller with the same lock, would change the row under the closure's
        // copy, and the closure's write would lose theirs.
        let db = TestDb::<PgConnection>::new("key_share_refused");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = sent.clone();
        conn.set_instrumentation(move |event: diesel::connection::InstrumentationEvent<'_>| {
            if matches!(
                event,
                diesel::connection::InstrumentationEvent::StartQuery { .. }
                    | diesel::connection::InstrumentationEvent::BeginTransaction { .. }
            ) {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let key_share = LockOptions::default().strength(LockStrength::KeyShare);
        let mut ran = false;
        let refused = lockkit::with_lock(&mut conn, 1, key_share, |_, _: Item| {
            ran = true;
            Ok::<_, Error>(())
        });
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{refused:?}"
        );
        assert!(!ran, "the closure never runs");
        assert_eq!(
            sent.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing was sent"
        );
        // The counter counts: the same call with `Share` sends statements.
        lockkit::with_lock(
            &mut conn,
            1,
            LockOptions::default().share(),
            |_, _: Item| Ok::<_, Error>(()),
        )
        .unwrap();
        assert!(sent.load(std::sync::atomic::Ordering::SeqCst) > 0);
    }

    #[test]
    fn transaction_advisory_locks_end_with_the_transaction() {
        let db = TestDb::<PgConnection>::new("pg_xact_advisory");
        let mut a = db.connect();
        let mut b = db.connect();
        assert!(matches!(
            advisory::xact_lock(&mut a, 5),
            Err(Error::NotInTransaction)
        ));
        a.transaction(|a| {
            advisory::xact_lock(a, 5)?;
            b.transaction(|b| {
                assert!(!advisory::try_xact_lock(b, 5)?, "held by a's transaction");
                Ok::<_, Error>(())
            })
        })
        .unwrap();
        b.transaction(|b| {
            assert!(advisory::try_xact_lock(b, 5)?, "released at a's commit");
            Ok::<_, Error>(())
        })
        .unwrap();
    }

    #[test]
    fn a_transaction_lock_at_repeatable_read_is_refused_and_issues_no_number_twice() {
        // Two sessions issue the next number (`max(stock) + 1`, a new item)
        // under one transaction lock, the second waiting for the first's
        // COMMIT. At READ COMMITTED each statement after the wait sees that
        // commit: 11, then 12. At REPEATABLE READ (here a session default, as
        // a database's or a role's `default_transaction_isolation` would set
        // it) the waiter's snapshot predates the commit, and both would issue
        // 11: the lock is refused there instead, nothing locked.
        let db = TestDb::<PgConnection>::new("pg_xact_lock_repeatable_read");
        for isolation in ["read committed", "repeatable read"] {
            exec(&mut db.conn(), "DELETE FROM items");
            seed_items(&mut db.conn(), &[(1, 10)]);
            let connect = || {
                let mut conn = db.connect();
                exec(
                    &mut conn,
                    &format!("SET default_transaction_isolation = '{isolation}'"),
                );
                conn
            };
            let (mut first, mut second) = (connect(), connect());
            let waiter = lock_waits::session_id(&mut second).unwrap();
            let mut observer = db.connect();
            let issue = |conn: &mut PgConnection, id: i32| -> Result<(), Error> {
                let last: Option<i32> = items::table
                    .select(diesel::dsl::max(items::stock))
                    .first(conn)?;
                diesel::insert_into(items::table)
                    .values((
                        items::id.eq(id),
                        items::name.eq("issued"),
                        items::stock.eq(last.unwrap_or(0) + 1),
                        items::lock_version.eq(0),
                    ))
                    .execute(conn)?;
                Ok(())
            };
            let held = Barrier::new(2);
            let (a, b) = thread::scope(|s| {
                let a = s.spawn(|| {
                    first.transaction(|c| {
                        let locked = advisory::xact_lock(c, 7);
                        held.wait();
                        locked?;
                        // The second session's lock statement, and with it its
                        // snapshot, comes before this commit: it waits.
                        look_until(
                            Duration::from_secs(10),
                            "the second session never waited",
                            || {
                                let found = lock_waits::blocked_sessions(&mut observer).unwrap();
                                found.into_iter().find(|s| s.session == waiter)
                            },
                        );
                        issue(c, 2)
                    })
                });
                held.wait();
                let b = second.transaction(|c| {
                    advisory::xact_lock(c, 7)?;
                    issue(c, 3)
                });
                (a.join().unwrap(), b)
            });
            let numbers: Vec<i32> = items::table
                .filter(items::id.gt(1))
                .order(items::id)
                .select(items::stock)
                .load(&mut db.conn())
                .unwrap();
            match isolation {
                "read committed" => {
                    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
                    assert_eq!(numbers, [11, 12], "one number each, in turn");
                }
                _ => {
                    assert!(numbers.is_empty(), "numbers issued: {numbers:?}");
                    for refused in [a, b] {
                        let err = refused.unwrap_err();
                        assert!(
                            err.to_string().contains("REPEATABLE READ") && !err.is_retryable(),
                            "{err:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn update_returning_hands_back_the_row_or_no_row_matched() {
        let db = TestDb::<PgConnection>::new("pg_update_returning");
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 5)]);
        let buy = |conn: &mut PgConnection, qty: i32| {
            lockkit::atomic::update_returning::<_, _, Item>(
                conn,
                diesel::update(items::table.find(1).filter(items::stock.ge(qty)))
                    .set(items::stock.eq(items::stock - qty))
                    .returning(Item::as_returning()),
            )
        };
        assert_eq!(buy(&mut conn, 3).unwrap().stock, 2);
        assert!(matches!(buy(&mut conn, 3), Err(Error::NoRowMatched)));
    }
}

#[cfg(feature = "mysql")]
mod mysql_only {
    use super::*;
    use diesel::MysqlConnection;

    #[test]
    fn for_update_of_renders_mysql_8_syntax() {
        let sql = diesel::debug_query::<diesel::mysql::Mysql, _>(
            &orders::table
                .left_join(items::table)
                .select(orders::id)
                .for_update_of(orders::table),
        )
        .to_string();
        assert!(sql.contains("FOR UPDATE OF `orders`"), "{sql}");
        let _ = std::marker::PhantomData::<MysqlConnection>;
    }

    #[test]
    fn a_lock_wait_timeout_not_put_back_after_the_commit_still_reports_the_commit() {
        // The session's `innodb_lock_wait_timeout` is put back after `COMMIT`,
        // from the variable lockkit kept it in; the work spoils that variable,
        // so the restore fails. The work committed (and its after-commit work
        // ran): an error would have the caller run it a second time.
        let db = lockkit_tests::TestDb::<MysqlConnection>::new("restore_fails_after_commit");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        let confirmed = std::rc::Rc::new(std::cell::Cell::new(false));
        let outcome = lockkit::with_lock(
            &mut conn,
            1,
            LockOptions::default().timeout(Duration::from_secs(1)),
            |c, item: Item| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(c)?;
                exec(c, "SET @lockkit_lock_wait_timeout_0 = 'not a number'");
                let confirmed = confirmed.clone();
                lockkit::after_commit(c, move || confirmed.set(true))?;
                Ok::<_, Error>(())
            },
        );
        assert!(outcome.is_ok(), "{outcome:?}");
        assert!(confirmed.get());
        assert_eq!(lockkit_tests::stock_of!(&mut conn), 9);
    }

    #[test]
    fn lock_all_returns_a_row_once_for_keys_the_collation_holds_equal_across_chunks() {
        // 899 fillers, then "K" and "k": Rust's order puts them in two chunks
        // of 900 keys, and the column's collation finds row K for both.
        let db = lockkit_tests::TestDb::<MysqlConnection>::new("lock_all_ci_across_chunks");
        let keys = lockkit_tests::seed_codes_across_chunks(&mut db.conn());
        let version = |conn: &mut MysqlConnection| -> i32 {
            sku_codes::table
                .find("K")
                .select(sku_codes::lock_version)
                .first(conn)
                .unwrap()
        };
        let before = version(&mut db.conn());
        let codes: Vec<String> =
            locked_transaction(&mut db.connect(), LockOptions::default(), |conn| {
                Ok::<_, Error>(
                    Sku::lock_all(conn, &keys)?
                        .into_iter()
                        .map(|sku| sku.code)
                        .collect(),
                )
            })
            .unwrap();
        let k_rows = codes
            .iter()
            .filter(|code| code.eq_ignore_ascii_case("k"))
            .count();
        assert_eq!(
            (codes.len(), k_rows),
            (900, 1),
            "row K returned {k_rows} times"
        );
        assert_eq!(
            version(&mut db.conn()),
            before + 1,
            "row K's version advanced once"
        );
    }

    #[test]
    fn lock_all_reports_a_key_without_a_row_beside_two_rows_the_collation_holds_equal() {
        // A declared key the database does not enforce, under a collation
        // that holds "k" and "K" equal: key "K" finds both rows, key "z" none.
        // The two rows, whose keys differ in their bytes, must not stand in
        // for the two keys.
        diesel::table! {
            ci_twins (code) {
                code -> Text,
                stock -> Integer,
            }
        }
        #[derive(Debug, Queryable, Selectable, Lockable)]
        #[diesel(table_name = ci_twins, primary_key(code))]
        struct CiTwin {
            code: String,
            #[allow(dead_code)]
            stock: i32,
        }
        let db = lockkit_tests::TestDb::<MysqlConnection>::new("lock_all_ci_twins");
        let mut conn = db.connect();
        exec(
            &mut conn,
            "CREATE TABLE ci_twins (code VARCHAR(8) NOT NULL, stock INT NOT NULL) \
             CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci; \
             INSERT INTO ci_twins VALUES ('k', 1), ('K', 2)",
        );
        let keys = ["K".to_owned(), "z".to_owned()];
        let locked = locked_transaction(&mut conn, LockOptions::default(), |c| {
            CiTwin::lock_all(c, &keys)
        });
        assert!(matches!(locked, Err(Error::NotFound)), "{locked:?}");
    }
}
