//! lockkit through a `#[derive(diesel::MultiConnection)]` enum: every test runs on
//! each backend with the enum holding that backend's connection, and the
//! closures get the enum, so the Diesel queries in them are written once.

use std::sync::{mpsc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel_migrations::MigrationHarness;
use lockkit::adaptive::AdaptivePolicy;
use lockkit::advisory::{self, AdvisoryKey, AdvisoryLock, Scope};
use lockkit::compare_and_set::expect;
use lockkit::idempotency::{Idempotency, Outcome};
use lockkit::lease::{self, Fence};
use lockkit::migrations::ShippedMigration;
use lockkit::multi::{BackendConn, Dispatch};
use lockkit::prelude::*;
use lockkit::{lock_waits, queue, retry, CurrentState, Error, LockOptions, RetryPolicy};
use lockkit_tests::db::TestBackend;
use lockkit_tests::lock_waits::look_until;
use lockkit_tests::models::{Item, Job};
use lockkit_tests::schema::{doctors, items, jobs, orders};
use lockkit_tests::{exec, idempotency_migrations, lease_migrations, seed_items, TestDb};

#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    Pg(PgConnection),
    Mysql(MysqlConnection),
    Sqlite(SqliteConnection),
}

impl Dispatch for AnyConnection {
    fn dispatch(&mut self) -> BackendConn<'_> {
        match self {
            AnyConnection::Pg(conn) => BackendConn::Pg(conn),
            AnyConnection::Mysql(conn) => BackendConn::Mysql(conn),
            AnyConnection::Sqlite(conn) => BackendConn::Sqlite(conn),
        }
    }
}

/// Wraps a backend's connection in the enum.
trait IntoAny: TestBackend {
    fn into_any(self) -> AnyConnection;
}

impl IntoAny for PgConnection {
    fn into_any(self) -> AnyConnection {
        AnyConnection::Pg(self)
    }
}

impl IntoAny for MysqlConnection {
    fn into_any(self) -> AnyConnection {
        AnyConnection::Mysql(self)
    }
}

impl IntoAny for SqliteConnection {
    fn into_any(self) -> AnyConnection {
        AnyConnection::Sqlite(self)
    }
}

/// A connection of its own to the test database, as the enum.
fn any<C: IntoAny>(db: &TestDb<C>) -> AnyConnection {
    db.connect().into_any()
}

/// The same from the database's URL, for another thread (a `TestDb` stays on
/// its own).
fn any_at<C: IntoAny>(url: &str) -> AnyConnection {
    let mut conn = C::establish(url).unwrap();
    C::on_acquire(&mut conn).unwrap();
    conn.into_any()
}

// From here on nothing is generic: the code a `MultiConnection` user writes.

fn load(conn: &mut AnyConnection, id: i32) -> Item {
    items::table
        .find(id)
        .select(Item::as_select())
        .first(conn)
        .unwrap()
}

fn stock(conn: &mut AnyConnection, id: i32) -> i32 {
    load(conn, id).stock
}

fn order_lines(conn: &mut AnyConnection) -> i64 {
    orders::table.count().get_result(conn).unwrap()
}

/// The doctors on call.
fn doctors_on_call(conn: &mut AnyConnection) -> QueryResult<i64> {
    doctors::table
        .filter(doctors::on_call.eq(true))
        .count()
        .get_result(conn)
}

/// One unit of item 2 sold by `atomic::update_if`, if it has one left: the
/// rows written.
fn sell_one_of_2_if_left(conn: &mut AnyConnection) -> Result<usize, Error> {
    let item_2 = items::table.find(2).filter(items::stock.ge(1));
    lockkit::atomic::update_if(
        conn,
        diesel::update(item_2).set(items::stock.eq(items::stock - 1)),
    )
}

/// One sale under the row lock: read, check, write, in the lock's transaction.
fn sell_locked(conn: &mut AnyConnection, id: i32, options: LockOptions) -> Result<i32, Error> {
    lockkit::with_lock(conn, id, options, |conn: &mut AnyConnection, item: Item| {
        if item.stock < 1 {
            return Err(Error::NoRowMatched);
        }
        diesel::update(items::table.find(item.id))
            .set(items::stock.eq(item.stock - 1))
            .execute(conn)?;
        Ok(item.stock - 1)
    })
}

/// One sale with a version check, retried on `Stale` with a fresh read.
fn sell_optimistic(conn: &mut AnyConnection, id: i32) -> Result<(), Error> {
    let policy = RetryPolicy::default()
        .max_attempts(1000)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5));
    retry(&policy, |_| {
        let mut item = load(conn, id);
        item.stock -= 1;
        item.update_versioned(conn)
    })
}

/// Item 1 read, then written (stock 1) in a transaction that rolls back: the
/// struct as that write left it.
fn rolled_back_write(conn: &mut AnyConnection) -> Item {
    let mut mine = load(conn, 1);
    let rolled_back = conn.transaction(|conn| {
        mine.stock = 1;
        mine.update_versioned(conn)?;
        Err::<(), _>(Error::NoRowMatched)
    });
    assert!(matches!(rolled_back, Err(Error::NoRowMatched)));
    mine
}

/// `held`, the struct a rolled-back write left, writes `stock` again on `conn`:
/// refused as stale.
#[track_caller]
fn rewrite_is_stale(conn: &mut AnyConnection, held: &mut Item, stock: i32) {
    held.stock = stock;
    let outcome = held.update_versioned(conn);
    assert!(matches!(outcome, Err(Error::Stale(_))), "{outcome:?}");
}

/// `threads` connections of their own sell `each` units of item 1 with `sell`.
fn sell_from_threads<C: IntoAny>(
    db: &TestDb<C>,
    threads: usize,
    each: usize,
    sell: fn(&mut AnyConnection) -> Result<(), Error>,
) {
    thread::scope(|s| {
        for _ in 0..threads {
            let url = db.url.as_str();
            s.spawn(move || {
                let mut conn = any_at::<C>(url);
                for _ in 0..each {
                    sell(&mut conn).unwrap();
                }
            });
        }
    });
}

lockkit_tests::backend_tests! {
    fn versioned_writes_check_and_bump_through_the_enum(db) {
        seed_items(&mut db.conn(), &[(1, 10), (2, 5)]);
        let mut conn = any(&db);
        let mut item = load(&mut conn, 1);
        let mut other = item.clone();

        item.stock = 9;
        item.update_versioned(&mut conn).unwrap();
        assert_eq!((stock(&mut conn, 1), item.lock_version), (9, 1));
        item.update_versioned_with(&mut conn, items::stock.eq(8)).unwrap();
        item.touch_versioned(&mut conn).unwrap();
        assert_eq!(item.lock_version, 3);
        let next = Item::update_by_version(&mut conn, 1, 3, items::stock.eq(7)).unwrap();
        assert_eq!((next, stock(&mut conn, 1)), (4, 7));

        // The struct read before all that is stale, with the row's version.
        other.stock = 0;
        match other.update_versioned(&mut conn) {
            Err(Error::Stale(stale)) => {
                assert_eq!((stale.current, stale.database_table), (CurrentState::Version(4), Some("items")))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(stock(&mut conn, 1), 7);

        let gone = load(&mut conn, 2);
        gone.delete_versioned(&mut conn).unwrap();
        match gone.delete_versioned(&mut conn) {
            Err(Error::Stale(stale)) => assert_eq!(stale.current, CurrentState::Deleted),
            other => panic!("{other:?}"),
        }

        // A conditional update, and one whose condition fails.
        let cheap = items::table.find(1).filter(items::stock.ge(7));
        lockkit::atomic::update_if(&mut conn, diesel::update(cheap).set(items::stock.eq(items::stock - 7))).unwrap();
        let none_left = items::table.find(1).filter(items::stock.ge(1));
        let refused = lockkit::atomic::update_if(&mut conn, diesel::update(none_left).set(items::stock.eq(items::stock - 1)));
        assert!(matches!(refused, Err(Error::NoRowMatched)), "{refused:?}");
        assert_eq!(stock(&mut conn, 1), 0);
    }

    fn with_lock_through_the_enum_commits_and_rolls_back(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = any(&db);
        let item = load(&mut conn, 1);
        let left = item.with_lock(&mut conn, |conn: &mut AnyConnection, fresh| {
            diesel::update(items::table.find(fresh.id))
                .set(items::stock.eq(fresh.stock - 4))
                .execute(conn)?;
            Ok::<_, Error>(fresh.stock - 4)
        });
        assert_eq!(left.unwrap(), 6);
        // The lock advanced the version: the struct read before it is stale.
        assert_eq!(load(&mut conn, 1).lock_version, 1);

        let failed = lockkit::with_lock(&mut conn, 1, LockOptions::default().nowait(), |conn: &mut AnyConnection, fresh: Item| {
            diesel::update(items::table.find(fresh.id)).set(items::stock.eq(0)).execute(conn)?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(failed, Err(Error::NoRowMatched)));
        assert_eq!(stock(&mut conn, 1), 6, "rolled back");
        let timed = sell_locked(&mut conn, 1, LockOptions::default().timeout(Duration::from_secs(2)));
        assert_eq!(timed.unwrap(), 5);
        assert!(matches!(sell_locked(&mut conn, 7, LockOptions::default()), Err(Error::NotFound)));
        assert!(!lockkit::LockingConnection::in_transaction(&mut conn));

        // A panic in the closure rolls back before it goes on.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn: &mut AnyConnection, _: Item| {
                diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(conn)?;
                panic!("in the closure");
                #[allow(unreachable_code)]
                Ok::<_, Error>(())
            });
        }));
        assert!(panicked.is_err());
        assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
        assert_eq!(stock(&mut conn, 1), 5);
    }

    fn nowait_through_the_enum_is_busy_while_another_enum_holds_the_row(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let (locked_tx, locked_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        thread::scope(|s| {
            let url = db.url.as_str();
            s.spawn(move || {
                let mut holder = any_at::<Conn>(url);
                lockkit::with_lock(&mut holder, 1, LockOptions::default(), |_, _: Item| {
                    locked_tx.send(()).unwrap();
                    let _ = done_rx.recv();
                    Ok::<_, Error>(())
                })
                .unwrap();
            });
            locked_rx.recv().unwrap();
            let busy = sell_locked(&mut any(&db), 1, LockOptions::default().nowait());
            done_tx.send(()).unwrap();
            assert!(matches!(busy, Err(Error::Busy)), "{busy:?}");
        });
        assert_eq!(stock(&mut any(&db), 1), 10);
    }

    fn concurrent_with_lock_through_the_enum_loses_nothing(db) {
        seed_items(&mut db.conn(), &[(1, 100)]);
        sell_from_threads(&db, 4, 10, |conn| sell_locked(conn, 1, LockOptions::default()).map(drop));
        let mut conn = any(&db);
        assert_eq!(stock(&mut conn, 1), 60, "40 sales, each one counted");
        assert_eq!(load(&mut conn, 1).lock_version, 40, "each lock advanced the version");
    }

    fn concurrent_versioned_writes_with_retry_through_the_enum_lose_nothing(db) {
        seed_items(&mut db.conn(), &[(1, 100)]);
        sell_from_threads(&db, 4, 10, |conn| sell_optimistic(conn, 1));
        let mut conn = any(&db);
        let item = load(&mut conn, 1);
        assert_eq!((item.stock, item.lock_version), (60, 40));
    }

    fn lock_all_and_claims_through_the_enum(db) {
        seed_items(&mut db.conn(), &[(1, 1), (2, 2), (3, 3)]);
        exec(&mut db.conn(), "INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false), (2, 'b', false), (3, 'c', false)");
        let mut conn = any(&db);
        let locked = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn: &mut AnyConnection| {
            let rows = Item::lock_all(conn, &[3, 1, 2, 1])?;
            for row in &rows {
                diesel::update(items::table.find(row.id)).set(items::stock.eq(row.stock * 10)).execute(conn)?;
            }
            Ok::<_, Error>(rows.iter().map(|row| row.id).collect::<Vec<_>>())
        });
        assert_eq!(locked.unwrap(), [1, 2, 3]);
        assert_eq!((stock(&mut conn, 1), stock(&mut conn, 3), load(&mut conn, 2).lock_version), (10, 30, 1));
        assert!(matches!(Item::lock_all(&mut conn, &[1]), Err(Error::NotInTransaction)));

        let mut claimed = Vec::new();
        loop {
            let ids = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn: &mut AnyConnection| {
                // Every backend loads it: no `as_select()`, which names one.
                let batch: Vec<Job> = queue::claim(conn, jobs::table.filter(jobs::done.eq(false)).order(jobs::id), 2)?;
                for job in &batch {
                    diesel::update(jobs::table.find(job.id)).set(jobs::done.eq(true)).execute(conn)?;
                }
                Ok::<_, Error>(batch.into_iter().map(|job| job.id).collect::<Vec<_>>())
            })
            .unwrap();
            if ids.is_empty() {
                break;
            }
            claimed.extend(ids);
        }
        assert_eq!(claimed, [1, 2, 3]);
    }

    fn serializable_and_transaction_with_retry_through_the_enum(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = any(&db);
        let sold = lockkit::serializable(&mut conn, &RetryPolicy::default(), |conn: &mut AnyConnection| {
            let left = stock(conn, 1) - 1;
            diesel::update(items::table.find(1)).set(items::stock.eq(left)).execute(conn)?;
            Ok::<_, Error>(left)
        });
        assert_eq!(sold.unwrap(), 9);
        let nested = conn.transaction(|conn| {
            Ok::<_, Error>(lockkit::serializable(conn, &RetryPolicy::default(), |_| Ok::<_, Error>(())))
        });
        assert!(matches!(nested.unwrap(), Err(Error::AlreadyInTransaction)));

        let failed = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::default(), |conn: &mut AnyConnection| {
            exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)");
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(failed, Err(Error::NoRowMatched)));
        assert_eq!(order_lines(&mut conn), 0, "rolled back");
    }

    fn serializable_through_the_enum_keeps_the_on_call_invariant(db) {
        // pessimistic.rs's write skew, on two threads with an enum each: two
        // doctors on call; each may go off duty only if another stays on.
        let doctors_sql = "INSERT INTO doctors (id, name, on_call) VALUES (1, 'alice', true), (2, 'bob', true)";
        exec(&mut db.conn(), doctors_sql);
        let policy = RetryPolicy::default().max_attempts(10);
        let barrier = Barrier::new(2);
        let went_off: Vec<bool> = thread::scope(|s| {
            let runs: Vec<_> = [1, 2]
                .into_iter()
                .map(|id| {
                    let (barrier, policy, url) = (&barrier, &policy, db.url.as_str());
                    s.spawn(move || {
                        let mut conn = any_at::<Conn>(url);
                        let mut first = true;
                        lockkit::serializable(&mut conn, policy, |conn: &mut AnyConnection| {
                            let on_call = doctors_on_call(conn)?;
                            // Not on SQLite: its BEGIN IMMEDIATE keeps the second
                            // thread out until the first commits.
                            if std::mem::take(&mut first) && BACKEND != "sqlite" {
                                barrier.wait(); // both have read "2 on call"
                            }
                            if on_call < 2 {
                                return Ok::<_, Error>(false);
                            }
                            let off = diesel::update(doctors::table.find(id));
                            off.set(doctors::on_call.eq(false)).execute(conn)?;
                            Ok(true)
                        })
                        .unwrap()
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let on_call = doctors_on_call(&mut any(&db)).unwrap();
        assert_eq!(on_call, 1, "one doctor stays on call: {went_off:?}");
        assert_eq!(went_off.iter().filter(|w| **w).count(), 1, "{went_off:?}");
    }

    fn a_rolled_back_versioned_write_through_the_enum_never_overwrites_a_later_one(db) {
        // The journal sees the enum's transactions: they are the inner
        // connection's.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = any(&db);
        let mut mine = rolled_back_write(&mut conn);
        assert_eq!(mine.lock_version, 1, "the struct moved on; the row did not");

        let mut theirs = any(&db);
        let mut later = load(&mut theirs, 1);
        later.stock = 2;
        later.update_versioned(&mut theirs).unwrap();
        // Not 1: that number is the rolled-back write's, which is never committed.
        assert_eq!(later.lock_version, 2);

        rewrite_is_stale(&mut conn, &mut mine, 3);
        assert_eq!(stock(&mut conn, 1), 2, "the later write stands");
    }

    fn a_fresh_read_retried_through_the_enum_writes_over_a_number_another_instance_committed(db) {
        // combined's test of the same name, through the enum: the move past the
        // first attempt made, undone by its rollback, is made again on the enum.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = any(&db);
        let mut held = rolled_back_write(&mut conn);
        let mut other = any(&db);
        exec(
            &mut other,
            "UPDATE items SET stock = 7, lock_version = lock_version + 1 WHERE id = 1 AND lock_version = 0",
        );
        let sold = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c: &mut AnyConnection| {
            let mut item = load(c, 1);
            item.stock -= 1;
            item.update_versioned(c)?;
            Ok::<_, Error>(item.stock)
        });
        let stored = load(&mut other, 1);
        assert!(
            matches!(sold, Ok(6)) && (stored.stock, stored.lock_version) == (6, 3),
            "a fresh read of the other's commit was refused: {sold:?}, row {stored:?}"
        );
        rewrite_is_stale(&mut conn, &mut held, 2);
        assert_eq!(stock(&mut other, 1), 6, "the rolled-back struct never writes");
    }

    fn a_rolled_back_versioned_write_through_an_unwatched_enum_never_overwrites_a_later_one(db) {
        // The application's own instrumentation, set on the enum (which sets
        // it on the connection inside): lockkit sees no transaction end, and
        // asks the server whether the write's mark stands.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = any(&db);
        conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
        let mut mine = rolled_back_write(&mut conn);

        // Another instance of the application commits v1, as docs/SQL.md
        // shows `update_versioned`.
        exec(
            &mut db.conn(),
            "UPDATE items SET stock = 2, lock_version = lock_version + 1 WHERE id = 1 AND lock_version = 0",
        );
        mine.stock = 3;
        let again = conn.transaction(|conn| mine.update_versioned(conn));
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock(&mut conn, 1) == 2,
            "the rolled-back version 1 matched the other instance's committed 1: {again:?}"
        );
    }

    fn a_bulk_write_retried_on_a_pooled_enum_makes_its_move_past_again(db) {
        // combined's bulk test, on an r2d2 pooled enum: the move past is kept
        // for the enum inside, and made again there after the bulk's rollback.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let manager = diesel::r2d2::ConnectionManager::<AnyConnection>::new(&db.url);
        let pool = diesel::r2d2::Pool::builder().max_size(1).build(manager).unwrap();
        let mut pooled = pool.get().unwrap();
        let mut held = rolled_back_write(&mut pooled);
        let mut other = any(&db);
        exec(
            &mut other,
            "UPDATE items SET stock = 7, lock_version = lock_version + 1 WHERE id = 1 AND lock_version = 0",
        );
        let sold = lockkit::retry(&RetryPolicy::immediate(3), |_| {
            let version = load(&mut pooled, 1).lock_version;
            Item::update_all_by_version(&mut pooled, &[(1, version)], items::stock.eq(items::stock - 1))
        });
        let stored = load(&mut other, 1);
        assert!(
            sold.is_ok() && (stored.stock, stored.lock_version) == (6, 3),
            "a fresh read of the other's commit was refused: {sold:?}, row {stored:?}"
        );
        rewrite_is_stale(&mut pooled, &mut held, 2);
        assert_eq!(stock(&mut other, 1), 6, "the rolled-back struct never writes");
    }

    fn pooled_enum_connections_take_the_same_calls(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let manager = diesel::r2d2::ConnectionManager::<AnyConnection>::new(&db.url);
        let pool = diesel::r2d2::Pool::builder().max_size(2).build(manager).unwrap();
        let mut pooled = pool.get().unwrap();
        let left = lockkit::with_lock(&mut pooled, 1, LockOptions::default(), |conn: &mut AnyConnection, item: Item| {
            diesel::update(items::table.find(item.id)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
            Ok::<_, Error>(item.stock - 1)
        });
        assert_eq!(left.unwrap(), 9);
        let mut item = load(&mut pooled, 1);
        item.stock = 8;
        item.update_versioned(&mut pooled).unwrap();
        assert_eq!((stock(&mut pooled, 1), item.lock_version), (8, 2));
    }
}

/// A pool of two enum connections to the test database.
fn any_pool(url: &str) -> Pool<ConnectionManager<AnyConnection>> {
    Pool::builder()
        .max_size(2)
        .build(ConnectionManager::new(url))
        .unwrap()
}

/// A request's work under an idempotency key: one unit of item 1 sold, and the
/// response to store.
fn sell_one_of_1(conn: &mut AnyConnection) -> Result<String, Error> {
    diesel::update(items::table.find(1))
        .set(items::stock.eq(items::stock - 1))
        .execute(conn)?;
    Ok("201 sold".to_owned())
}

/// The work of a repeat that must replay: it never runs.
fn must_not_run(_: &mut AnyConnection) -> Result<String, Error> {
    panic!("the work ran again")
}

/// Item 1's stock set to `stock` by a write fenced with `fence`.
fn restock(conn: &mut AnyConnection, fence: Fence, stock: i32) -> Result<(), Error> {
    lease::fenced(conn, "item-1", fence, |conn: &mut AnyConnection| {
        diesel::update(items::table.find(1))
            .set(items::stock.eq(stock))
            .execute(conn)?;
        Ok(())
    })
}

/// Idempotency keys and leases through the enum: their statements go to the
/// connection inside, in the enum's transactions.
mod keys_and_leases {
    use super::*;

    lockkit_tests::backend_tests! {
        fn concurrent_duplicates_through_the_enum_run_the_work_once_and_get_its_response(db) {
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 100)]);
            const CLIENTS: usize = 6;
            let barrier = Barrier::new(CLIENTS);
            // The repeats wait for the first request's run, and replay it.
            let keys = Idempotency { wait_while_running: Duration::from_secs(20), ..Idempotency::default() };
            let answers: Vec<Result<Outcome<String>, Error>> = thread::scope(|s| {
                let clients: Vec<_> = (0..CLIENTS)
                    .map(|_| {
                        let (url, barrier, keys) = (db.url.as_str(), &barrier, &keys);
                        s.spawn(move || {
                            let mut conn = any_at::<Conn>(url);
                            barrier.wait();
                            keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", |conn: &mut AnyConnection| {
                                thread::sleep(Duration::from_millis(200)); // the others arrive meanwhile
                                sell_one_of_1(conn)
                            })
                        })
                    })
                    .collect();
                clients.into_iter().map(|client| client.join().unwrap()).collect()
            });
            let ran = answers.iter().filter(|answer| matches!(answer, Ok(Outcome::Ran(_)))).count();
            assert_eq!(ran, 1, "{answers:?}");
            assert!(
                answers.iter().all(|answer| matches!(answer, Ok(outcome) if outcome.clone().into_inner() == "201 sold")),
                "every client gets the one run's response: {answers:?}"
            );
            assert_eq!(stock(&mut any(&db), 1), 99, "the work ran exactly once");
        }

        fn a_failed_run_through_the_enum_rolls_back_its_write_and_releases_the_key(db) {
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 100)]);
            let mut conn = any(&db);
            let keys = Idempotency::default();
            let failed = keys.run(&mut conn, "tenant-1", "order-2", "POST /orders", |conn: &mut AnyConnection| {
                sell_one_of_1(conn)?;
                Err::<String, _>(Error::NoRowMatched)
            });
            assert!(matches!(failed, Err(Error::NoRowMatched)), "{failed:?}");
            assert_eq!(stock(&mut conn, 1), 100, "the work's write rolled back");
            // The resend runs the work, on a pooled enum connection.
            let pool = any_pool(&db.url);
            let resent = keys.run(&mut pool.get().unwrap(), "tenant-1", "order-2", "POST /orders", sell_one_of_1);
            assert_eq!(resent.unwrap(), Outcome::Ran("201 sold".to_owned()));
            let again = keys.run(&mut conn, "tenant-1", "order-2", "POST /orders", must_not_run);
            assert_eq!(again.unwrap(), Outcome::Replayed("201 sold".to_owned()));
            assert_eq!(stock(&mut conn, 1), 99);
            assert_eq!(keys.purge_expired(&mut conn).unwrap(), 0, "the key is kept for its retention");
            let short = Idempotency { retention: Duration::from_millis(1), ..Idempotency::default() };
            thread::sleep(Duration::from_millis(5));
            assert_eq!(short.purge_expired(&mut pool.get().unwrap()).unwrap(), 1, "past a short retention it goes");
            let after = keys.run(&mut conn, "tenant-1", "order-2", "POST /orders", sell_one_of_1);
            assert_eq!(after.unwrap(), Outcome::Ran("201 sold".to_owned()), "a purged key is new again");
        }

        fn idempotency_runs_inside_the_enums_transaction_nest_and_roll_back_with_it(db) {
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 100)]);
            let mut conn = any(&db);
            let keys = Idempotency::default();
            keys.run(&mut conn, "tenant-1", "done", "POST /orders", sell_one_of_1).unwrap();
            let outer = conn.transaction(|conn| {
                // The done key's insert fails in a savepoint of the enum's
                // transaction (PostgreSQL would abort the whole of it
                // otherwise): the replay is read in it.
                let replayed = keys.run(conn, "tenant-1", "done", "POST /orders", must_not_run)?;
                assert_eq!(replayed, Outcome::Replayed("201 sold".to_owned()));
                let ran = keys.run(conn, "tenant-1", "new", "POST /orders", sell_one_of_1)?;
                assert_eq!(ran, Outcome::Ran("201 sold".to_owned()));
                assert_eq!(stock(conn, 1), 98);
                Err::<(), _>(Error::NoRowMatched) // the caller's transaction fails after both
            });
            assert!(matches!(outer, Err(Error::NoRowMatched)), "{outer:?}");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            assert_eq!(stock(&mut conn, 1), 99, "the new key's work went with the enum's transaction");
            // So did its key: the resend runs the work.
            let resent = keys.run(&mut conn, "tenant-1", "new", "POST /orders", sell_one_of_1);
            assert_eq!(resent.unwrap(), Outcome::Ran("201 sold".to_owned()));
            assert_eq!(stock(&mut conn, 1), 98);
        }

        fn a_lease_taken_over_through_the_enum_fences_out_its_old_holder(db) {
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let (mut a, mut b) = (any(&db), any(&db));
            let ttl = Duration::from_millis(150);
            let mut held_by_a = lease::acquire(&mut a, "restock", ttl).unwrap();
            let fence_a = held_by_a.fence();
            thread::sleep(ttl + Duration::from_millis(100)); // A pauses past its TTL
            let mut held_by_b = lease::acquire(&mut b, "restock", Duration::from_secs(30))
                .expect("A's lease ran out: B takes it");
            let fence_b = held_by_b.fence();
            assert_eq!(fence_b, Fence(fence_a.0 + 1));
            held_by_b.renew().unwrap();
            restock(&mut held_by_b, fence_b, 20).unwrap();
            assert_eq!(stock(&mut held_by_b, 1), 20, "the current holder's write lands");

            // A wakes, still believing it holds the lease: refused, its work not run.
            let late = restock(&mut held_by_a, fence_a, 0);
            assert!(
                matches!(late, Err(Error::Fenced { fence, current, .. }) if fence == fence_a.0 && current == fence_b.0),
                "{late:?}"
            );
            assert_eq!(stock(&mut held_by_a, 1), 20, "the old holder wrote nothing");
            assert!(matches!(held_by_a.renew(), Err(Error::LeaseLost)));
            assert!(matches!(held_by_a.release(), Err(Error::LeaseLost)));
            assert!(matches!(lease::acquire(&mut a, "restock", ttl), Err(Error::Busy)), "B's lease stands");

            // The enum's transaction is the inner connection's: a grant there
            // is refused, and a fenced write in it rolls back with its fence.
            let inside = a.transaction(|conn| lease::acquire(conn, "nightly", ttl).map(drop));
            assert!(matches!(inside, Err(Error::AlreadyInTransaction)), "{inside:?}");
            let rolled_back = held_by_b.transaction(|conn| {
                restock(conn, Fence(fence_b.0 + 1), 30)?;
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(matches!(rolled_back, Err(Error::NoRowMatched)), "{rolled_back:?}");
            restock(&mut held_by_b, fence_b, 25).expect("the rolled-back fence was never recorded");
            assert_eq!(stock(&mut held_by_b, 1), 25);
            held_by_b.release().unwrap();

            // Pooled enum connections: one holds the next lease (the
            // connection inside its guard), another makes the fenced write.
            let pool = any_pool(&db.url);
            let mut lease_conn = pool.get().unwrap();
            let held_by_c = lease::acquire(&mut *lease_conn, "restock", Duration::from_secs(30)).unwrap();
            let fence_c = held_by_c.fence();
            assert_eq!(fence_c, Fence(fence_b.0 + 1));
            lease::fenced(&mut pool.get().unwrap(), "item-1", fence_c, |conn: &mut AnyConnection| {
                diesel::update(items::table.find(1)).set(items::stock.eq(5)).execute(conn)?;
                Ok::<_, Error>(())
            })
            .unwrap();
            let stale = restock(&mut b, fence_b, 0);
            assert!(matches!(stale, Err(Error::Fenced { .. })), "{stale:?}");
            assert_eq!(stock(&mut b, 1), 5);
            held_by_c.release().expect("the lease was held throughout");
        }
    }
}

/// One unit of item `id` sold by `policy`, optimistically or under the row lock
/// as it decides: the row as written.
fn sell_adaptive(
    policy: &AdaptivePolicy,
    conn: &mut AnyConnection,
    id: i32,
) -> Result<Item, Error> {
    policy.update(conn, id, |item: &mut Item| {
        item.stock -= 1;
        Ok::<_, Error>(())
    })
}

/// Adaptive writes through the enum: the read and the locked read go to the
/// connection inside, the versioned write through the enum.
mod adaptive {
    use super::*;

    lockkit_tests::backend_tests! {
        fn concurrent_adaptive_writes_through_the_enum_lose_nothing(db) {
            seed_items(&mut db.conn(), &[(1, 100)]);
            // Quick to try the lock, and one lost race sends a call there:
            // both paths write, and meet.
            let policy = AdaptivePolicy::new()
                .min_attempts(2)
                .escalate_at(0.3)
                .min_period(Duration::ZERO)
                .trial(Duration::from_millis(20))
                .max_optimistic_attempts(1)
                .backoff(RetryPolicy::immediate(1));
            thread::scope(|s| {
                for _ in 0..4 {
                    let (url, policy) = (db.url.as_str(), &policy);
                    s.spawn(move || {
                        let mut conn = any_at::<Conn>(url);
                        for _ in 0..10 {
                            sell_adaptive(policy, &mut conn, 1).unwrap();
                        }
                    });
                }
            });
            let item = load(&mut any(&db), 1);
            assert_eq!((item.stock, item.lock_version), (60, 40), "40 sales, each written once");
            let stats = policy.stats();
            assert_eq!(stats.optimistic_writes + stats.locked_writes, 40, "{stats}");
        }

        fn an_adaptive_write_through_the_enum_that_loses_its_race_writes_under_the_lock(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let policy = AdaptivePolicy::new()
                .max_optimistic_attempts(1)
                .backoff(RetryPolicy::immediate(1))
                .lock_options(LockOptions::default().timeout(Duration::from_secs(5)));
            let (mut conn, mut rival) = (any(&db), any(&db));
            let mut first = true;
            let written = policy.update(&mut conn, 1, |item: &mut Item| {
                if std::mem::take(&mut first) {
                    // Another instance sells one between the read and the write.
                    exec(&mut rival, "UPDATE items SET stock = stock - 1, lock_version = lock_version + 1 WHERE id = 1");
                }
                item.stock -= 1;
                Ok::<_, Error>(())
            });
            let written = written.unwrap();
            assert_eq!((written.stock, written.lock_version), (8, 2), "both sales, none lost");
            let stats = policy.stats();
            assert_eq!((stats.conflicts, stats.optimistic_writes, stats.locked_writes), (1, 0, 1), "{stats}");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));

            // `update_adaptive` on a loaded model, on a pooled enum connection.
            let pool = any_pool(&db.url);
            let mut pooled = pool.get().unwrap();
            let mut item = load(&mut pooled, 1);
            item.update_adaptive(&mut pooled, |fresh| {
                fresh.stock -= 1;
                Ok::<_, Error>(())
            })
            .unwrap();
            assert_eq!((item.stock, item.lock_version), (7, 3));
            assert_eq!(load(&mut rival, 1), item, "the struct is the row as written");
            let missing = sell_adaptive(&policy, &mut conn, 7);
            assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
        }
    }
}

/// One unit of item 1 sold by a compare-and-set on its stock, read just before:
/// retried with a fresh read while another sale moved the stock in between.
fn sell_compare_and_set(conn: &mut AnyConnection) -> Result<(), Error> {
    let policy = RetryPolicy::default()
        .max_attempts(1000)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5));
    retry(&policy, |_| {
        let seen = stock(conn, 1);
        Item::compare_and_set(
            conn,
            1,
            expect(items::stock, seen),
            items::stock.eq(seen - 1),
        )
        .map(drop)
    })
}

/// What a refused compare-and-set reports: whether the row is gone, and each
/// column with the value expected and the value found.
type Found = (bool, Vec<(&'static str, String, Option<String>)>);

/// What the refused compare-and-set `outcome` reports.
fn found(outcome: Result<usize, Error>) -> Found {
    match outcome {
        Err(Error::StaleColumns(stale)) => (
            stale.deleted,
            stale
                .columns
                .into_iter()
                .map(|c| (c.column, c.expected, c.current))
                .collect(),
        ),
        other => panic!("expected StaleColumns, got {other:?}"),
    }
}

/// Compare-and-set through the enum: the write runs through it, the read that
/// reports a refused write goes to the connection inside.
mod compare_and_set {
    use super::*;

    lockkit_tests::backend_tests! {
        fn compare_and_set_through_the_enum_writes_while_the_columns_hold_and_reports_what_moved(db) {
            seed_items(&mut db.conn(), &[(1, 10), (2, 5)]);
            let mut conn = any(&db);
            let written = Item::compare_and_set(&mut conn, 1, expect(items::stock, 10), items::stock.eq(9));
            assert_eq!(written.unwrap(), 1);
            assert_eq!(stock(&mut conn, 1), 9);

            // Paying twice: refused, nothing written, both values named.
            let again = Item::compare_and_set(&mut conn, 1, expect(items::stock, 10), items::stock.eq(9));
            assert_eq!(found(again), (false, vec![("stock", "10".to_owned(), Some("9".to_owned()))]));
            let both = Item::compare_and_set(
                &mut conn,
                1,
                (expect(items::stock, 9), expect(items::name, "item 2".to_owned())),
                items::stock.eq(0),
            );
            assert_eq!(
                found(both),
                (false, vec![
                    ("stock", "9".to_owned(), Some("9".to_owned())),
                    ("name", "\"item 2\"".to_owned(), Some("\"item 1\"".to_owned())),
                ])
            );
            assert_eq!(stock(&mut conn, 1), 9);

            // A row gone is reported as gone.
            exec(&mut conn, "DELETE FROM items WHERE id = 2");
            let gone = Item::compare_and_set(&mut conn, 2, expect(items::stock, 5), items::stock.eq(4));
            assert_eq!(found(gone), (true, vec![("stock", "5".to_owned(), None)]));

            // In the enum's transaction, rolled back with it.
            let rolled_back = conn.transaction(|conn| {
                Item::compare_and_set(conn, 1, expect(items::stock, 9), items::stock.eq(8))?;
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(matches!(rolled_back, Err(Error::NoRowMatched)));
            assert_eq!(stock(&mut conn, 1), 9, "rolled back");

            // On a pooled enum connection.
            let pool = any_pool(&db.url);
            let mut pooled = pool.get().unwrap();
            let written = Item::compare_and_set(&mut pooled, 1, expect(items::stock, 9), items::stock.eq(8));
            assert_eq!(written.unwrap(), 1);
            let refused = Item::compare_and_set(&mut pooled, 1, expect(items::stock, 9), items::stock.eq(8));
            assert_eq!(found(refused), (false, vec![("stock", "9".to_owned(), Some("8".to_owned()))]));
        }

        fn concurrent_compare_and_set_through_the_enum_loses_nothing(db) {
            seed_items(&mut db.conn(), &[(1, 100)]);
            sell_from_threads(&db, 4, 10, sell_compare_and_set);
            assert_eq!(stock(&mut any(&db), 1), 60, "40 sales, each one counted");
        }
    }

    /// What a refused write reads on the servers, inside a transaction.
    mod in_transaction {
        use super::*;

        lockkit_tests::server_tests! {
        fn a_refused_compare_and_set_in_the_enums_transaction_reports_the_latest_commit(db) {
            // MySQL/MariaDB's REPEATABLE READ answers a plain read from the
            // transaction's snapshot: the report would say the stock is still
            // what was expected. The inner connection's locking read sees the
            // other session's commit. (PostgreSQL's READ COMMITTED sees it
            // either way: the case is MariaDB's.)
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = any(&db);
            let mut rival = any(&db);
            let outcome = conn.transaction(|conn| {
                assert_eq!(stock(conn, 1), 10, "the snapshot is taken");
                exec(&mut rival, "UPDATE items SET stock = 7 WHERE id = 1");
                Ok::<_, Error>(Item::compare_and_set(conn, 1, expect(items::stock, 10), items::stock.eq(9)))
            });
            assert_eq!(found(outcome.unwrap()), (false, vec![("stock", "10".to_owned(), Some("7".to_owned()))]));
            assert_eq!(stock(&mut conn, 1), 7, "the rival's sale stands");
        }
        }
    }
}

/// Advisory locks and lock waits through the enum: the statements go to the
/// connection inside; an enum holding SQLite, which has neither, refuses.
mod advisory_and_lock_waits {
    use super::*;

    lockkit_tests::backend_tests! {
        fn an_advisory_lock_through_one_enum_keeps_another_out_until_released(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            // Per test database: the lock names are the server's.
            let key = AdvisoryKey::from_name(&db.url);
            let (mut a, mut b) = (any(&db), any(&db));
            if BACKEND == "sqlite" {
                let refused = advisory::try_lock(&mut a, key).map(|guard| guard.is_some());
                assert!(matches!(refused, Err(Error::Unsupported(_))), "{refused:?}");
                let refused = advisory::lock(&mut a, key).map(drop).unwrap_err();
                assert!(matches!(refused, Error::Unsupported(_)), "{refused:?}");
                // A setup error, not the client's, and no retry gets past it.
                assert_eq!(lockkit::etag::status_for(&refused), 500);
                assert!(!refused.is_retryable());
                assert!(!lockkit::LockingConnection::in_transaction(&mut a));
                assert_eq!(stock(&mut a, 1), 10, "the connection is as it was");
                return;
            }

            let mut guard = advisory::try_lock(&mut a, key).unwrap().expect("free at first");
            assert_eq!(guard.scope(), Scope::Session);
            assert!(advisory::try_lock(&mut b, key).unwrap().is_none(), "held through the other enum");
            assert_eq!(stock(&mut guard, 1), 10, "the guard derefs to the enum");
            // A waiting `lock` through the other enum waits for the release.
            let waiter_session = lock_waits::session_id(&mut b).unwrap();
            thread::scope(|s| {
                let waiter = s.spawn(|| advisory::lock(&mut b, key).map(AdvisoryLock::unlock));
                thread::sleep(Duration::from_millis(300));
                assert!(!waiter.is_finished(), "the lock is held: the waiter waits");
                drop(guard);
                let deadline = Instant::now() + Duration::from_secs(10);
                while !waiter.is_finished() && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(10));
                }
                if !waiter.is_finished() {
                    // The drop released nothing: end the waiter's session,
                    // so that this fails, not hangs.
                    lockkit_tests::kill_session(&mut db.conn(), BACKEND, waiter_session);
                    panic!("dropping the guard did not release the lock");
                }
                waiter.join().unwrap().unwrap().unwrap();
            });

            // Inside the enum's transaction: PostgreSQL's transaction lock,
            // held until the commit; MySQL/MariaDB refuse (nothing is sent).
            let inside = a.transaction(|conn| {
                let scope = advisory::lock(conn, key)?.scope();
                let other_got_it = advisory::try_lock(&mut b, key)?.is_some();
                Ok::<_, Error>((scope, other_got_it))
            });
            match BACKEND {
                "postgres" => assert_eq!(inside.unwrap(), (Scope::Transaction, false)),
                _ => assert!(matches!(inside, Err(Error::AlreadyInTransaction)), "{inside:?}"),
            }

            // A pooled enum connection takes it too, once the commit freed it.
            let pool = any_pool(&db.url);
            let mut pooled = pool.get().unwrap();
            let held = advisory::try_lock(&mut pooled, key).unwrap().expect("released at the commit");
            assert!(advisory::try_lock(&mut b, key).unwrap().is_none(), "held through the pooled enum");
            held.unlock().unwrap();
            assert!(advisory::try_lock(&mut b, key).unwrap().is_some(), "released by unlock");
        }

        fn lock_waits_through_the_enum_report_a_waiter_that_really_waits(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut observer = any(&db);
            if BACKEND == "sqlite" {
                let refused = [
                    lock_waits::session_id(&mut observer).map(drop),
                    lock_waits::blocked_sessions(&mut observer).map(drop),
                    lock_waits::current(&mut observer).map(drop),
                ];
                assert!(refused.iter().all(|r| matches!(r, Err(Error::Unsupported(_)))), "{refused:?}");
                return;
            }

            let (locked_tx, locked_rx) = mpsc::channel();
            let (done_tx, done_rx) = mpsc::channel::<()>();
            thread::scope(|s| {
                // Owned here: a failing assertion drops it, and the holder commits.
                let done_tx = done_tx;
                let url = db.url.as_str();
                let holder = s.spawn(move || {
                    let mut holder = any_at::<Conn>(url);
                    let me = lock_waits::session_id(&mut holder).unwrap();
                    lockkit::with_lock(&mut holder, 1, LockOptions::default(), |_, _: Item| {
                        locked_tx.send(me).unwrap();
                        let _ = done_rx.recv();
                        Ok::<_, Error>(())
                    })
                    .unwrap();
                });
                let holder_id = locked_rx.recv().unwrap();
                let pool = any_pool(url);
                let mut waiter = pool.get().unwrap();
                let waiter_id = lock_waits::session_id(&mut waiter).unwrap();
                let waiting = s.spawn(move || sell_locked(&mut waiter, 1, LockOptions::default()));

                let wait = look_until(Duration::from_secs(10), "the waiter never showed up", || {
                    lock_waits::current(&mut observer).unwrap().into_iter().find(|w| w.session == waiter_id)
                });
                assert!(wait.blockers.iter().any(|b| b.session == holder_id), "{wait:?}");
                let blocked = lock_waits::blocked_sessions(&mut observer).unwrap();
                assert!(
                    blocked.iter().any(|b| b.session == waiter_id && b.blocked_by.contains(&holder_id)),
                    "{blocked:?}"
                );
                assert!(!waiting.is_finished(), "the waiter really waits");
                done_tx.send(()).unwrap();
                holder.join().unwrap();
                assert_eq!(waiting.join().unwrap().unwrap(), 9, "it sold once the holder let go");
            });
        }
    }
}

/// The baseline the protected sales are measured against: read, wait a moment,
/// write the stock read minus one, in a plain transaction of the enum.
fn sell_naively(conn: &mut AnyConnection, id: i32) -> Result<(), Error> {
    conn.transaction(|conn| {
        let left = stock(conn, id) - 1;
        thread::sleep(Duration::from_millis(5));
        diesel::update(items::table.find(id))
            .set(items::stock.eq(left))
            .execute(conn)?;
        Ok(())
    })
}

mod servers {
    use super::*;

    lockkit_tests::server_tests! {
        fn the_naive_baseline_through_the_enum_loses_sales(db) {
            // What the concurrent tests above would see if the enum's calls did
            // not lock or check: the servers' default isolation lets these
            // writers overwrite each other.
            seed_items(&mut db.conn(), &[(1, 100)]);
            sell_from_threads(&db, 4, 10, |conn| sell_naively(conn, 1));
            let left = stock(&mut any(&db), 1);
            assert!(left > 60, "40 sales, yet only {} recorded", 100 - left);
        }

        fn a_failing_nested_with_lock_through_the_enum_commits_nothing(db) {
            // The enum's transaction holds an order line and the lock on item 1
            // when its nested `with_lock` on item 2 becomes a deadlock's victim.
            // InnoDB rolls back the whole transaction (lockkit asks MariaDB through
            // the enum and says `TransactionAborted`); PostgreSQL the savepoint,
            // and the caller's `?` then the rest. Either way nothing is committed.
            lockkit_tests::aborts::seed_for_deadlock(&mut db.conn());
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let (held_tx, held_rx) = mpsc::channel::<()>();
            let (outcome, mut conn) = thread::scope(|s| {
                let url = db.url.as_str();
                let neighbour = s.spawn(move || {
                    let mut conn = Conn::establish(url).unwrap();
                    if BACKEND == "postgres" {
                        exec(&mut conn, "SET deadlock_timeout = '30s'");
                    }
                    go_rx.recv().unwrap();
                    conn.transaction(|conn| {
                        exec(conn, "UPDATE items SET name = 'heavy' WHERE id >= 3");
                        let _: Item = items::table.find(2).for_update().first(conn)?;
                        held_tx.send(()).unwrap();
                        thread::sleep(Duration::from_millis(300));
                        let _: Item = items::table.find(1).for_update().first(conn)?;
                        diesel::QueryResult::Ok(())
                    })
                    .expect("the heavier transaction is never the victim");
                });
                let mut conn = any(&db);
                let outcome = conn.transaction(|conn| {
                    exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)");
                    sell_locked(conn, 1, LockOptions::default())?;
                    go_tx.send(()).unwrap();
                    held_rx.recv().unwrap();
                    sell_locked(conn, 2, LockOptions::default())
                });
                neighbour.join().unwrap();
                (outcome, conn)
            });
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            assert_eq!((stock(&mut conn, 1), stock(&mut conn, 2), order_lines(&mut conn)), (10, 10, 0), "nothing committed");
            match (BACKEND, &outcome) {
                ("postgres", Err(Error::Deadlock)) => {}
                ("mysql", Err(Error::TransactionAborted(cause))) => {
                    assert!(matches!(**cause, Error::Deadlock), "{cause:?}");
                    // Settled by the caller's rollback: retryable around it.
                    assert!(outcome.as_ref().unwrap_err().is_retryable());
                }
                other => panic!("{other:?}"),
            }
        }

        fn an_atomic_update_through_the_enum_after_an_error_that_ended_nothing_writes(db) {
            // An error Diesel reports although the server's transaction is
            // alive (an empty query): what lockkit then asks must not abort it
            // on PostgreSQL.
            seed_items(&mut db.conn(), &[(1, 0), (2, 5)]);
            let mut conn = any(&db);
            let outcome = conn.transaction(|conn| {
                sell_one_of_2_if_left(conn)?;
                let empty = diesel::sql_query("-- nothing").execute(conn);
                assert_eq!(empty.is_err(), BACKEND == "postgres", "{empty:?}");
                sell_one_of_2_if_left(conn)
            });
            assert_eq!(outcome.unwrap(), 1);
            assert_eq!(stock(&mut conn, 2), 3);
        }

        fn an_atomic_update_through_the_enum_after_an_error_a_savepoint_undid_writes(db) {
            // The enum's backend type names no server. A statement's error that
            // a rollback to a savepoint undid leaves the transaction alive (on
            // PostgreSQL too): `atomic::update_if` writes in it, and asks
            // nothing that would abort it.
            seed_items(&mut db.conn(), &[(1, 0), (2, 5)]);
            let mut conn = any(&db);
            let outcome = conn.transaction(|conn| {
                sell_one_of_2_if_left(conn)?;
                let failed = conn.transaction(|conn| {
                    diesel::sql_query("SELECT no_such_column FROM items").execute(conn)
                });
                assert!(failed.is_err());
                sell_one_of_2_if_left(conn)
            });
            assert_eq!(outcome.unwrap(), 1);
            assert_eq!(stock(&mut conn, 2), 3);
        }
    }
}

/// SQLite through the enum: item 1 out of stock, item 2 at 5, and a trigger
/// that answers an update below zero by rolling back the whole transaction.
#[cfg(feature = "sqlite")]
fn out_of_stock_any(name: &str) -> (TestDb<diesel::SqliteConnection>, AnyConnection) {
    let db = TestDb::<diesel::SqliteConnection>::new(name);
    seed_items(&mut db.conn(), &[(1, 0), (2, 5)]);
    exec(
        &mut db.conn(),
        lockkit_tests::SQLITE_OUT_OF_STOCK_ROLLS_BACK,
    );
    let conn = any(&db);
    (db, conn)
}

/// Your own statement oversells item 1 (its error let go: the trigger rolled
/// back the whole transaction), then item 2 is sold under `with_lock`.
#[cfg(feature = "sqlite")]
fn oversell_1_then_sell_2(conn: &mut AnyConnection) -> Result<i32, Error> {
    oversell_1(conn);
    sell_locked(conn, 2, LockOptions::default())
}

/// Your own statement oversells item 1: the trigger rolls back the whole
/// transaction, and the error is let go.
#[cfg(feature = "sqlite")]
fn oversell_1(conn: &mut AnyConnection) {
    let failed = diesel::update(items::table.find(1))
        .set(items::stock.eq(-1))
        .execute(conn);
    assert!(failed.is_err(), "item 1 is out of stock");
}

/// Item 2's sale refused, and nothing of the transaction (which said
/// `outcome`) committed.
#[cfg(feature = "sqlite")]
fn refused_and_nothing_committed(
    conn: &mut AnyConnection,
    outcome: &impl std::fmt::Debug,
    sale: Option<Result<i32, Error>>,
) {
    assert_eq!(
        stock(conn, 2),
        5,
        "nothing committed; the transaction said {outcome:?}"
    );
    assert!(
        matches!(sale, Some(Err(Error::TransactionAborted(_)))),
        "{sale:?}"
    );
}

/// On a fresh [`out_of_stock_any`] database named `name`, `sell` runs in a
/// transaction of your own (Diesel's): its sale is refused, and nothing commits.
#[cfg(feature = "sqlite")]
fn refused_in_your_transaction(
    name: &str,
    sell: impl FnOnce(&mut AnyConnection) -> Result<i32, Error>,
) {
    refused_in_your_transaction_after(name, None, sell);
}

/// [`refused_in_your_transaction`], with lockkit's `migrations` run on the
/// database first: the connection, for more checks.
#[cfg(feature = "sqlite")]
fn refused_in_your_transaction_after(
    name: &str,
    migrations: Option<ShippedMigration>,
    sell: impl FnOnce(&mut AnyConnection) -> Result<i32, Error>,
) -> AnyConnection {
    let (db, mut conn) = out_of_stock_any(name);
    if let Some(migrations) = migrations {
        db.conn().run_pending_migrations(migrations).unwrap();
    }
    let mut sale = None;
    let outcome = diesel::Connection::transaction(&mut conn, |conn: &mut AnyConnection| {
        sale = Some(sell(conn));
        Ok::<_, diesel::result::Error>(())
    });
    refused_and_nothing_committed(&mut conn, &outcome, sale);
    conn
}

/// The rows of `table` (one of lockkit's).
fn rows_in(conn: &mut AnyConnection, table: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct Rows {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(format!("SELECT COUNT(*) AS n FROM {table}"))
        .get_result::<Rows>(conn)
        .unwrap()
        .n
}

/// After your own statement rolled back the whole transaction (a trigger's
/// `RAISE(ROLLBACK, ..)`), a nested `with_lock` through the enum refuses
/// instead of committing on its own (`swallowed_errors.rs` on the connection
/// itself).
#[cfg(feature = "sqlite")]
#[test]
fn a_nested_call_through_the_enum_after_sqlite_rolled_back_the_transaction_commits_nothing() {
    let (_db, mut conn) = out_of_stock_any("multi_raise_rollback");
    let mut sale = None;
    let outcome = lockkit::locked_transaction(
        &mut conn,
        LockOptions::default(),
        |conn: &mut AnyConnection| {
            sale = Some(oversell_1_then_sell_2(conn));
            Ok::<_, Error>(())
        },
    );
    refused_and_nothing_committed(&mut conn, &outcome, sale);
}

/// As above, where your statement that SQLite's rollback answers is one that
/// answers with rows, whose error the enum's SQLite connection reports to
/// the work only (`swallowed_errors.rs` on the connection itself).
#[cfg(feature = "sqlite")]
#[test]
fn a_nested_call_through_the_enum_after_a_rollback_hidden_in_a_read_commits_nothing() {
    let (_db, mut conn) = out_of_stock_any("multi_raise_rollback_read");
    let mut sale = None;
    let outcome = lockkit::locked_transaction(
        &mut conn,
        LockOptions::default(),
        |conn: &mut AnyConnection| {
            let oversold =
                diesel::sql_query("UPDATE items SET stock = -1 WHERE id = 1 RETURNING stock")
                    .load::<lockkit_tests::Stock>(conn);
            assert!(oversold.is_err(), "item 1 is out of stock: {oversold:?}");
            sale = Some(sell_locked(conn, 2, LockOptions::default()));
            Ok::<_, Error>(())
        },
    );
    refused_and_nothing_committed(&mut conn, &outcome, sale);
}

/// As above, in a transaction of your own (Diesel's), where `with_lock` is the
/// connection's first lockkit call: the journal it installs learns SQLite's
/// rule from the connection inside the enum, and asks.
#[cfg(feature = "sqlite")]
#[test]
fn a_first_call_through_the_enum_in_your_transaction_after_sqlite_rolled_it_back_commits_nothing() {
    refused_in_your_transaction("multi_raise_rollback_own", oversell_1_then_sell_2);
}

/// A bulk versioned update as the first lockkit call through the enum, in
/// your transaction after SQLite rolled it back: it asks before its savepoint.
#[cfg(feature = "sqlite")]
#[test]
fn a_first_bulk_update_through_the_enum_after_sqlite_rolled_back_your_transaction_commits_nothing()
{
    refused_in_your_transaction("multi_raise_rollback_bulk", |conn| {
        oversell_1(conn);
        Item::update_all_by_version(conn, &[(2, 0)], items::stock.eq(4)).map(|versions| versions[0])
    });
}

/// `atomic::update_if` through the enum, whose backend type names no server:
/// after your own statement rolled back the whole transaction (an earlier
/// `update_if` there had the journal watch the connection), the next
/// `update_if` asks SQLite and refuses, instead of writing in autocommit.
#[cfg(feature = "sqlite")]
#[test]
fn an_atomic_update_through_the_enum_after_sqlite_rolled_back_your_transaction_commits_nothing() {
    refused_in_your_transaction("multi_raise_rollback_atomic", |conn| {
        sell_one_of_2_if_left(conn).unwrap();
        oversell_1(conn);
        sell_one_of_2_if_left(conn).map(|rows| rows as i32)
    });
}

/// `compare_and_set` through the enum in your transaction after SQLite rolled
/// it back, as the first lockkit call and after an earlier one had the
/// journal watch the connection: refused, nothing written in autocommit.
#[cfg(feature = "sqlite")]
#[test]
fn a_compare_and_set_through_the_enum_after_sqlite_rolled_back_your_transaction_commits_nothing() {
    for (name, earlier) in [
        ("multi_raise_rollback_cas", false),
        ("multi_raise_rollback_cas_again", true),
    ] {
        refused_in_your_transaction(name, |conn| {
            let seen = if earlier {
                Item::compare_and_set(conn, 2, expect(items::stock, 5), items::stock.eq(4))
                    .unwrap();
                4
            } else {
                5
            };
            oversell_1(conn);
            Item::compare_and_set(
                conn,
                2,
                expect(items::stock, seen),
                items::stock.eq(seen - 1),
            )
            .map(|rows| rows as i32)
        });
    }
}

/// `atomic::update_if` through the enum as the first lockkit call, in your
/// transaction after SQLite rolled it back: refused, nothing written in
/// autocommit.
#[cfg(feature = "sqlite")]
#[test]
fn a_first_atomic_update_through_the_enum_after_sqlite_rolled_back_your_transaction_commits_nothing(
) {
    refused_in_your_transaction("multi_raise_rollback_atomic_first", |conn| {
        oversell_1(conn);
        sell_one_of_2_if_left(conn).map(|rows| rows as i32)
    });
}

/// On a fresh MySQL/MariaDB database named `name`, your transaction through
/// the enum records order line 1, then your own statement is a deadlock's
/// victim (InnoDB rolls back the whole transaction; the error let go), then
/// `write` is the first lockkit call: refused, nothing written in autocommit,
/// nothing of the transaction committed.
#[cfg(feature = "mysql")]
fn refused_after_a_deadlock_ended_your_transaction<T: std::fmt::Debug + Send>(
    name: &str,
    write: impl FnOnce(&mut AnyConnection) -> Result<T, Error> + Send,
) {
    refused_after_a_deadlock_ended_your_transaction_after(name, None, write);
}

/// [`refused_after_a_deadlock_ended_your_transaction`], with lockkit's
/// `migrations` run on the database first: the database, for more checks.
#[cfg(feature = "mysql")]
fn refused_after_a_deadlock_ended_your_transaction_after<T: std::fmt::Debug + Send>(
    name: &str,
    migrations: Option<ShippedMigration>,
    write: impl FnOnce(&mut AnyConnection) -> Result<T, Error> + Send,
) -> TestDb<diesel::MysqlConnection> {
    use lockkit_tests::aborts::{beside_neighbour, order_line};
    let db = TestDb::<diesel::MysqlConnection>::new(name);
    if let Some(migrations) = migrations {
        db.conn().run_pending_migrations(migrations).unwrap();
    }
    let url = db.url.clone();
    let (outcome, sale) = beside_neighbour(&db, "mysql", |_, cue| {
        let mut conn = any_at::<diesel::MysqlConnection>(&url);
        let mut sale = None;
        let outcome = conn.transaction(|conn| {
            order_line(conn, 1)?;
            exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
            cue.wait();
            let victim =
                diesel::sql_query("SELECT id FROM items WHERE id = 2 FOR UPDATE").execute(conn);
            assert!(victim.is_err(), "the deadlock's victim");
            sale = Some(write(conn));
            Ok::<_, Error>(())
        });
        (outcome, sale)
    });
    let mut conn = any(&db);
    assert_eq!(
        (stock(&mut conn, 2), order_lines(&mut conn)),
        (10, 0),
        "nothing of the transaction committed, nor the sale on its own: {outcome:?}, sale {sale:?}"
    );
    assert!(
        matches!(sale, Some(Err(Error::TransactionAborted(_)))),
        "{sale:?}"
    );
    db
}

#[cfg(feature = "mysql")]
#[test]
fn a_first_atomic_update_through_the_enum_after_a_deadlock_ended_your_transaction_commits_nothing()
{
    refused_after_a_deadlock_ended_your_transaction(
        "multi_deadlock_atomic_first",
        sell_one_of_2_if_left,
    );
}

#[cfg(feature = "mysql")]
#[test]
fn a_first_compare_and_set_through_the_enum_after_a_deadlock_ended_your_transaction_commits_nothing(
) {
    refused_after_a_deadlock_ended_your_transaction("multi_deadlock_cas_first", |conn| {
        Item::compare_and_set(conn, 2, expect(items::stock, 10), items::stock.eq(9))
    });
}

/// `atomic::update_returning` through the enum as the first lockkit call, in
/// your transaction after SQLite rolled it back: refused, nothing written in
/// autocommit.
#[cfg(feature = "sqlite")]
#[test]
fn a_first_update_returning_through_the_enum_after_sqlite_rolled_back_your_transaction_commits_nothing(
) {
    refused_in_your_transaction("multi_raise_rollback_returning_first", |conn| {
        oversell_1(conn);
        lockkit::atomic::update_returning::<_, _, lockkit_tests::Stock>(
            conn,
            diesel::sql_query(lockkit_tests::SELL_ITEM_2_RETURNING),
        )
        .map(|left| left.stock)
    });
}

/// The sale of one unit of item 2, by your own statement: what the lockkit
/// calls below wrap. The rows it wrote.
#[cfg(feature = "sqlite")]
fn sell_one_of_2(conn: &mut AnyConnection) -> Result<i32, Error> {
    let rows = diesel::update(items::table.find(2))
        .set(items::stock.eq(items::stock - 1))
        .execute(conn)?;
    Ok(rows as i32)
}

/// The sale of item 2 under an idempotency key, as a lockkit call of its own.
#[cfg(feature = "sqlite")]
fn sell_one_of_2_under_a_key(conn: &mut AnyConnection) -> Result<i32, Error> {
    Idempotency::default()
        .run(conn, "tenant-1", "order-1", "POST /orders", sell_one_of_2)
        .map(Outcome::into_inner)
}

/// The sale of item 2 as a write fenced with token 7.
#[cfg(feature = "sqlite")]
fn sell_one_of_2_fenced(conn: &mut AnyConnection) -> Result<i32, Error> {
    lease::fenced(conn, "item-2", Fence(7), sell_one_of_2)
}

/// `Idempotency::run` and `lease::fenced` through the enum as the first
/// lockkit call, in your transaction after SQLite rolled it back: a key's or
/// a fence's savepoint would begin a transaction of its own, and commit the
/// work with it. Refused, and neither the work nor lockkit's own row (the key,
/// the fence) written.
#[cfg(feature = "sqlite")]
#[test]
fn keys_and_fences_through_the_enum_after_sqlite_rolled_back_your_transaction_commit_nothing() {
    type Call = fn(&mut AnyConnection) -> Result<i32, Error>;
    let calls: [(&str, ShippedMigration, Call, &str); 2] = [
        (
            "multi_raise_rollback_idempotency",
            idempotency_migrations("sqlite"),
            sell_one_of_2_under_a_key,
            "lockkit_idempotency_keys",
        ),
        (
            "multi_raise_rollback_fenced",
            lease_migrations("sqlite"),
            sell_one_of_2_fenced,
            "lockkit_fences",
        ),
    ];
    for (name, migrations, sell, table) in calls {
        let mut conn = refused_in_your_transaction_after(name, Some(migrations), |conn| {
            oversell_1(conn);
            sell(conn)
        });
        assert_eq!(
            rows_in(&mut conn, table),
            0,
            "{name}: nothing of lockkit's left in {table}"
        );
    }
}

/// `Idempotency::run`, `lease::fenced` and `outbox::enqueue` through the enum
/// as the first lockkit call, in your MySQL/MariaDB transaction after a
/// deadlock ended it: refused, and neither the work nor lockkit's own row
/// (the key, the fence, a message whose order is gone) written in autocommit.
#[cfg(feature = "mysql")]
#[test]
fn keys_fences_and_messages_through_the_enum_after_a_deadlock_ended_your_transaction_commit_nothing(
) {
    type Call = fn(&mut AnyConnection) -> Result<(), Error>;
    let calls: [(&str, ShippedMigration, Call, &str); 3] = [
        (
            "multi_deadlock_idempotency_first",
            idempotency_migrations("mysql"),
            |conn| {
                let sell = |conn: &mut AnyConnection| {
                    sell_one_of_2_if_left(conn).map(|_| "sold".to_owned())
                };
                Idempotency::default()
                    .run(conn, "tenant-1", "order-1", "POST /orders", sell)
                    .map(drop)
            },
            "lockkit_idempotency_keys",
        ),
        (
            "multi_deadlock_fenced_first",
            lease_migrations("mysql"),
            |conn| lease::fenced(conn, "item-2", Fence(7), sell_one_of_2_if_left).map(drop),
            "lockkit_fences",
        ),
        (
            "multi_deadlock_outbox_first",
            lockkit_tests::outbox_migrations("mysql"),
            |conn| lockkit::outbox::enqueue(conn, "orders", "{\"order\":1}").map(drop),
            "lockkit_outbox",
        ),
    ];
    for (name, migrations, call, table) in calls {
        let db =
            refused_after_a_deadlock_ended_your_transaction_after(name, Some(migrations), call);
        assert_eq!(
            rows_in(&mut any(&db), table),
            0,
            "{name}: nothing of lockkit's left in {table}"
        );
    }
}

/// `with_lock` through the enum as the first lockkit call, in your
/// MySQL/MariaDB transaction after a deadlock ended it: refused, nothing
/// written in autocommit.
#[cfg(feature = "mysql")]
#[test]
fn with_lock_through_the_enum_after_a_deadlock_ended_your_transaction_commits_nothing() {
    refused_after_a_deadlock_ended_your_transaction("multi_deadlock_with_lock_first", |conn| {
        sell_locked(conn, 2, LockOptions::default())
    });
}

/// `atomic::update_if` through an r2d2 pooled enum as the first lockkit call,
/// in your transaction after SQLite rolled it back: the pooled connection is
/// asked for the enum inside, and the enum for its connection. Refused,
/// nothing written in autocommit.
#[cfg(feature = "sqlite")]
#[test]
fn a_first_atomic_update_through_a_pooled_enum_after_sqlite_rolled_back_your_transaction_commits_nothing(
) {
    let (db, _) = out_of_stock_any("multi_raise_rollback_atomic_pooled");
    let pool = any_pool(&db.url);
    let mut pooled = pool.get().unwrap();
    let mut sale = None;
    let outcome = diesel::Connection::transaction(&mut pooled, |pooled| {
        oversell_1(pooled);
        let item_2 = items::table.find(2).filter(items::stock.ge(1));
        let sell = diesel::update(item_2).set(items::stock.eq(items::stock - 1));
        sale = Some(lockkit::atomic::update_if(pooled, sell).map(|rows| rows as i32));
        Ok::<_, diesel::result::Error>(())
    });
    refused_and_nothing_committed(&mut pooled, &outcome, sale);
}
