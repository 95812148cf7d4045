//! Things going wrong: the server kills the session in the middle of `with_lock`,
//! of an idempotent run, of a fenced write, or while it holds an advisory lock;
//! the connection drops between the read and the versioned write; a statement
//! timeout fires while waiting for a lock; closures panic. Each time the caller
//! gets a typed error, nothing is half-written, the lock is free again, and what
//! the caller does next (a resend, the same fence again) applies the work once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::idempotency::{Idempotency, Outcome};
use lockkit::lease::{self, Fence};
use lockkit::lock_waits;
use lockkit::prelude::*;
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::settings::is_mariadb;
use lockkit_tests::{
    exec, idempotency_migrations, kill_session, lease_migrations, seed_items, stock_of, TestDb,
};

/// Runs `call` on a connection of its own in another thread. When `call`'s
/// work calls the `midway` it is handed (after a write, before the next), that
/// session is killed from the server side, and `midway` returns once it is.
fn killed_midway<C, T>(
    db: &TestDb<C>,
    backend: &str,
    session_id: fn(&mut C) -> i64,
    call: impl FnOnce(&mut C, &dyn Fn(&mut C)) -> T + Send,
) -> T
where
    C: TestBackend + SimpleConnection,
    T: Send,
{
    let (id_tx, id_rx) = mpsc::channel();
    let (killed_tx, killed_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let victim = s.spawn(move || {
            let midway = |conn: &mut C| {
                id_tx.send(session_id(conn)).unwrap();
                killed_rx.recv().unwrap();
            };
            call(&mut db.connect(), &midway)
        });
        let session = id_rx.recv().expect("the work reached its midway");
        kill_session(&mut db.connect(), backend, session);
        killed_tx.send(()).unwrap();
        victim.join().unwrap()
    })
}

/// The session id of a test connection.
fn session_id<C>(conn: &mut C) -> i64
where
    C: lockkit::bounds::LockMonitorConnection,
{
    lock_waits::session_id(conn).unwrap()
}

/// `nowait` succeeds: nobody holds row 1.
macro_rules! assert_row_free {
    ($db:expr) => {
        lockkit::with_lock(
            &mut $db.connect(),
            1,
            LockOptions::default().nowait(),
            |_, _: Item| Ok::<_, lockkit::Error>(()),
        )
        .expect("the row lock was released");
    };
}

mod servers {
    use super::*;

    lockkit_tests::server_tests! {
        fn the_server_killing_the_session_inside_with_lock(db) {
            // The kill lands while the work runs. Its next statement finds the
            // connection gone; or, with no statement after the kill, `COMMIT`
            // does (on MySQL/MariaDB Diesel's `ROLLBACK` then fails too), and
            // whether a commit was applied is unknown to the client. Either way
            // `ConnectionLost`, never an error that reads as "nothing was
            // written", and nothing half-written.
            seed_items(&mut db.conn(), &[(1, 10)]);
            for writes_after_the_kill in [true, false] {
                let outcome = killed_midway(&db, BACKEND, session_id, |conn, midway| {
                    lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                        diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 5)).execute(conn)?;
                        midway(conn);
                        if writes_after_the_kill {
                            diesel::update(items::table.find(1)).set(items::name.eq("never")).execute(conn)?;
                        }
                        Ok(())
                    })
                });
                assert!(matches!(outcome, Err(Error::ConnectionLost)), "{writes_after_the_kill}: {outcome:?}");
                assert_eq!(stock_of!(&mut db.connect()), 10, "nothing half-written");
                assert_row_free!(db);
            }
        }

        fn the_server_killing_the_session_of_an_idempotent_run(db) {
            // The killed run's work rolls back; its key, left running, is
            // taken over once its lease ran out, and the work runs once.
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let keys = Idempotency { lease: Duration::from_millis(300), ..Idempotency::default() };
            let sell = |conn: &mut Conn| -> Result<String, Error> {
                diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1)).execute(conn)?;
                Ok("sold".to_owned())
            };
            let outcome = killed_midway(&db, BACKEND, session_id, |conn, midway| {
                keys.run(conn, "tenant", "order-1", "POST /orders", |conn: &mut Conn| {
                    let sold = sell(conn)?;
                    midway(conn);
                    diesel::update(items::table.find(1)).set(items::name.eq("never")).execute(conn)?;
                    Ok(sold)
                })
            });
            assert!(matches!(outcome, Err(Error::ConnectionLost)), "{outcome:?}");
            assert_eq!(stock_of!(&mut db.connect()), 10, "the killed run's work rolled back");
            // The client sends again, on a new connection, until the key is free.
            let deadline = Instant::now() + Duration::from_secs(10);
            let resent = loop {
                match keys.run(&mut db.connect(), "tenant", "order-1", "POST /orders", sell) {
                    Err(Error::IdempotencyInProgress) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(50));
                    }
                    resent => break resent,
                }
            };
            assert_eq!(resent.unwrap(), Outcome::Ran("sold".to_owned()));
            assert_eq!(stock_of!(&mut db.connect()), 9, "the work ran once");
            let again = keys.run(&mut db.connect(), "tenant", "order-1", "POST /orders", |_: &mut Conn| -> Result<String, Error> {
                panic!("the work ran again")
            });
            assert_eq!(again.unwrap(), Outcome::Replayed("sold".to_owned()));
        }

        fn the_server_killing_the_session_of_a_fenced_write(db) {
            // The killed write raised no fence: the holder's next try with the
            // same fence, on a new connection, lands, and an older one is refused.
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let fence = {
                let mut store = db.connect();
                let lease = lease::acquire(&mut store, "restock-1", Duration::from_secs(30)).unwrap();
                let fence = lease.fence();
                lease.release().unwrap();
                let newer = lease::acquire(&mut store, "restock-1", Duration::from_secs(30)).unwrap();
                assert!(newer.fence() > fence);
                newer.fence()
            };
            let restock = |conn: &mut Conn, fence, stock: i32| {
                lease::fenced(conn, "item-1", fence, |conn: &mut Conn| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(stock)).execute(conn)?;
                    Ok::<_, Error>(())
                })
            };
            let outcome = killed_midway(&db, BACKEND, session_id, |conn, midway| {
                lease::fenced(conn, "item-1", fence, |conn: &mut Conn| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(20)).execute(conn)?;
                    midway(conn);
                    diesel::update(items::table.find(1)).set(items::name.eq("never")).execute(conn)?;
                    Ok::<_, Error>(())
                })
            });
            assert!(matches!(outcome, Err(Error::ConnectionLost)), "{outcome:?}");
            assert_eq!(stock_of!(&mut db.connect()), 10, "nothing half-written");
            restock(&mut db.connect(), fence, 20).unwrap();
            assert_eq!(stock_of!(&mut db.connect()), 20);
            let older = Fence(fence.0 - 1);
            let refused = restock(&mut db.connect(), older, 30);
            assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");
            assert_eq!(stock_of!(&mut db.connect()), 20);
        }

        fn the_server_killing_the_session_that_holds_an_advisory_lock(db) {
            // The lock goes with the session: another session takes it at
            // once, and the old holder's next write fails instead of landing
            // outside the lock. Its guard's drop on the dead connection is quiet.
            seed_items(&mut db.conn(), &[(1, 10)]);
            let outcome = killed_midway(&db, BACKEND, session_id, |conn, midway| {
                let mut guard = lockkit::advisory::lock(conn, "faults-restock").unwrap();
                midway(&mut guard);
                diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(&mut *guard)
            });
            assert!(outcome.is_err(), "{outcome:?}");
            let mut other = db.connect();
            let taken = lockkit::advisory::try_lock(&mut other, "faults-restock").unwrap();
            assert!(taken.is_some(), "the killed session's lock is free");
            drop(taken);
            assert_eq!(stock_of!(&mut db.connect()), 10);
        }

        fn the_connection_dropping_between_read_and_versioned_write(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
            let session = lock_waits::session_id(&mut conn).unwrap();
            kill_session(&mut db.connect(), BACKEND, session);
            item.stock -= 1;
            let before = item.clone();
            let err = item.update_versioned(&mut conn).unwrap_err();
            assert!(matches!(err, Error::ConnectionLost), "{err:?}");
            assert_eq!(item, before, "the struct is unchanged");
            // A fresh connection finishes the job with the same struct.
            item.update_versioned(&mut db.connect()).unwrap();
            assert_eq!(stock_of!(&mut db.connect()), 9);
        }

        fn a_statement_timeout_while_waiting_for_a_lock(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let hold = |conn: &mut Conn, wait: &dyn Fn()| {
                lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                    wait();
                    Ok::<_, lockkit::Error>(())
                })
                .unwrap();
            };
            let err = db.while_holding(hold, || {
                let mut conn = db.connect();
                let setting = match BACKEND {
                    "postgres" => "SET statement_timeout = 200",
                    _ if is_mariadb(&mut conn, BACKEND) => "SET SESSION max_statement_time = 0.2",
                    _ => "SET SESSION max_execution_time = 200",
                };
                exec(&mut conn, setting);
                lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 100)).execute(conn)?;
                    Ok(())
                })
                .unwrap_err()
            });
            assert!(matches!(err, Error::StatementTimeout), "{err:?}");
            assert_eq!(stock_of!(&mut db.connect()), 9, "only the holder's write");
            assert_row_free!(db);
        }
    }
}

mod all {
    use super::*;

    /// Runs `call`, which must panic: the panic goes on through lockkit, and
    /// is caught here.
    fn assert_panics(call: impl FnOnce()) {
        let panicked = catch_unwind(AssertUnwindSafe(call));
        assert!(panicked.is_err(), "the panic goes on");
    }

    /// Seeds item 1 (stock 10) and runs `call` on a new connection: it must
    /// panic, as [`assert_panics`]. The connection, for what the test checks
    /// on it next.
    fn panicked_on<C: TestBackend>(
        db: &TestDb<C>,
        call: impl FnOnce(&mut C) -> Result<(), Error>,
    ) -> C {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        assert_panics(|| {
            let _ = call(&mut conn);
        });
        conn
    }

    lockkit_tests::backend_tests! {
        fn a_panic_inside_with_lock_rolls_back_and_frees_the_connection(db) {
            let mut conn = panicked_on(&db, |conn| {
                lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 5)).execute(conn)?;
                    panic!("bug in the closure");
                })
            });
            assert_eq!(stock_of!(&mut db.connect()), 10, "rolled back");
            // The same connection is usable, outside any transaction: a new
            // transaction is a real one, not a savepoint in the dead one.
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                Ok::<_, lockkit::Error>(())
            })
            .unwrap();
            assert_eq!(stock_of!(&mut db.connect()), 9);
            assert_row_free!(db);
        }

        /// Diesel's own `transaction` does not roll back its savepoint when its
        /// closure panics: the guard rolls back every level above its own first,
        /// so that its rollback ends lockkit's transaction, not that savepoint.
        fn a_panic_in_a_diesel_transaction_inside_with_lock_rolls_back_lockkits_transaction(db) {
            let mut conn = panicked_on(&db, |conn| {
                lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                    conn.transaction(|conn| {
                        diesel::update(items::table.find(item.id)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                        panic!("bug in the closure's own transaction");
                        #[allow(unreachable_code)]
                        Ok::<_, Error>(())
                    })
                })
            });
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn), "no transaction left open");
            assert_eq!(stock_of!(&mut db.connect()), 10, "rolled back");
            assert_row_free!(db);
        }

        /// The same panic, caught inside lockkit's closure, which then returns
        /// `Ok`: the savepoint stays open, and Diesel's `COMMIT` would release
        /// it, not commit lockkit's transaction, which would stay open with
        /// its row lock (and its after-commit work would run). The call rolls
        /// both back and fails instead.
        fn a_savepoint_the_work_left_open_is_rolled_back_and_the_call_fails(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let ran_after = ran.clone();
            let result = lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                lockkit::after_commit(conn, move || ran_after.store(true, std::sync::atomic::Ordering::SeqCst))?;
                let caught = catch_unwind(AssertUnwindSafe(|| {
                    let _ = conn.transaction(|_| -> QueryResult<()> { panic!("caught by the work") });
                }));
                assert!(caught.is_err());
                Ok::<_, Error>(())
            });
            assert!(matches!(result, Err(Error::NestedCallDropped)), "{result:?}");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn), "no transaction left open");
            assert_eq!(stock_of!(&mut db.connect()), 10, "rolled back");
            assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "no after-commit work without a commit");
            assert_row_free!(db);
        }

        /// Two levels left open, the deeper one's savepoint gone on the
        /// server (released behind Diesel's back): its `ROLLBACK TO` fails, and
        /// Diesel counts it gone anyway. The guard goes on to the next level,
        /// so that no level of lockkit's transaction is left open.
        fn two_savepoints_the_work_left_open_are_rolled_back_when_one_is_gone(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let result = lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                let caught = catch_unwind(AssertUnwindSafe(|| {
                    let _ = conn.transaction(|c| -> QueryResult<()> {
                        c.transaction(|_| -> QueryResult<()> { panic!("caught by the work") })
                    });
                }));
                assert!(caught.is_err());
                conn.batch_execute("RELEASE SAVEPOINT diesel_savepoint_2")?;
                Ok::<_, Error>(())
            });
            assert!(matches!(result, Err(Error::NestedCallDropped)), "{result:?}");
            assert_eq!(stock_of!(&mut db.connect()), 10, "rolled back");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn), "no transaction left open");
            assert_row_free!(db);
        }

        fn a_panic_with_a_pooled_connection_never_returns_it_mid_transaction(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let pool = db.pool();
            for _ in 0..3 {
                assert_panics(|| {
                    let mut pooled = pool.get().unwrap();
                    let _: Result<(), Error> = lockkit::transaction_with_retry(&mut *pooled, &RetryPolicy::immediate(2), |conn| {
                        conn.batch_execute("UPDATE items SET stock = 0 WHERE id = 1")?;
                        panic!("bug");
                        #[allow(unreachable_code)]
                        Ok(())
                    });
                });
            }
            // Every connection the pool hands out is outside a transaction.
            for _ in 0..3 {
                let mut pooled = pool.get().unwrap();
                assert!(!lockkit::LockingConnection::in_transaction(&mut *pooled));
            }
            assert_eq!(stock_of!(&mut db.connect()), 10);
            assert_row_free!(db);
        }

        fn a_panic_inside_serializable_rolls_back(db) {
            let mut conn = panicked_on(&db, |conn| {
                lockkit::serializable(conn, &RetryPolicy::default(), |conn| {
                    conn.batch_execute("UPDATE items SET stock = 0 WHERE id = 1")?;
                    panic!("bug");
                    #[allow(unreachable_code)]
                    Ok(())
                })
            });
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            assert_eq!(stock_of!(&mut conn), 10);
            lockkit::serializable(&mut conn, &RetryPolicy::default(), |_| Ok::<_, lockkit::Error>(())).unwrap();
        }
    }
}

/// MySQL/MariaDB: `serializable` sets the isolation of the next transaction
/// before it opens it. On a connection whose transaction manager Diesel marked
/// broken (a failed `ROLLBACK`, say) no transaction opens: the setting must not
/// be left pending for the next user of the connection, whose transaction would
/// run at SERIALIZABLE. Where the server has no transaction open, lockkit puts
/// the manager back in order first, and the call runs.
#[cfg(feature = "mysql")]
#[test]
fn serializable_on_a_broken_connection_leaves_no_isolation_pending() {
    use diesel::connection::TransactionManager;
    #[derive(QueryableByName)]
    struct Isolation {
        #[diesel(sql_type = diesel::sql_types::Text)]
        level: String,
    }
    let db = TestDb::<diesel::MysqlConnection>::new("broken_serializable");
    let mut conn = db.connect();
    let status =
        <diesel::MysqlConnection as Connection>::TransactionManager::transaction_manager_status_mut(
            &mut conn,
        );
    status.set_in_error();
    let ran = lockkit::serializable(
        &mut conn,
        &RetryPolicy::immediate(1),
        |_| Ok::<_, Error>(()),
    );
    assert!(ran.is_ok(), "{ran:?}");
    // The transaction's own level, as InnoDB keeps it (the session's
    // variable does not show a level set for the next transaction).
    let level = conn
        .transaction(|c| {
            c.batch_execute("SELECT COUNT(*) FROM items FOR UPDATE")?;
            diesel::sql_query(
                "SELECT CAST(trx_isolation_level AS CHAR) AS level FROM information_schema.innodb_trx \
                 WHERE trx_mysql_thread_id = CONNECTION_ID()",
            )
            .get_result::<Isolation>(c)
        })
        .unwrap()
        .level;
    assert_eq!(level, "REPEATABLE READ", "the next transaction's isolation");
}
