//! Things going wrong: the server kills the session in the middle of `with_lock`,
//! the connection drops between the read and the versioned write, a statement
//! timeout fires while waiting for a lock, closures panic. Each time the caller
//! gets a typed error, nothing is half-written, and the lock is free again.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use lockkit::lock_waits;
use lockkit::prelude::*;
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::settings::is_mariadb;
use lockkit_tests::{exec, seed_items, stock_of, TestDb};

/// Ends another session from the server side.
fn kill_session<C: SimpleConnection>(admin: &mut C, backend: &str, session: i64) {
    // `session` is an integer read from the server, never text.
    let sql = match backend {
        "postgres" => format!("SELECT pg_terminate_backend({session})"),
        _ => format!("KILL {session}"),
    };
    admin.batch_execute(&sql).unwrap();
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
                let (id_tx, id_rx) = mpsc::channel();
                let (killed_tx, killed_rx) = mpsc::channel::<()>();
                let outcome = thread::scope(|s| {
                    let db = &db;
                    let victim = s.spawn(move || {
                        let mut conn = db.connect();
                        lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                            diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 5)).execute(conn)?;
                            id_tx.send(lock_waits::session_id(conn)?).unwrap();
                            killed_rx.recv().unwrap();
                            if writes_after_the_kill {
                                diesel::update(items::table.find(1)).set(items::name.eq("never")).execute(conn)?;
                            }
                            Ok(())
                        })
                    });
                    let session = id_rx.recv().unwrap();
                    kill_session(&mut db.connect(), BACKEND, session);
                    killed_tx.send(()).unwrap();
                    victim.join().unwrap()
                });
                assert!(matches!(outcome, Err(Error::ConnectionLost)), "{writes_after_the_kill}: {outcome:?}");
                assert_eq!(stock_of!(&mut db.connect()), 10, "nothing half-written");
                assert_row_free!(db);
            }
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
