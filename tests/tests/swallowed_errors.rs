//! A failed statement that the work of a lockkit transaction lets go. The
//! server may have ended the transaction (PostgreSQL aborts it, InnoDB rolls
//! back a deadlock's victim): lockkit must neither report success for it, nor
//! run nested work in autocommit, nor mark an idempotency key done; and it must
//! not refuse a transaction the work recovered (with a savepoint, Diesel's or
//! its own in SQL). On diesel-async and through a `MultiConnection` enum too
//! (the blocking side's cases are in `lock_errors` and `combined`).

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use diesel::{Connection, ExpressionMethods, QueryDsl};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::models::Item;
use lockkit_tests::schema::{items, orders};
use lockkit_tests::{exec, seed_items};

/// Seeds items 1 to 12 (stock 10), then runs `$run` on a new async connection
/// `$conn`, where `$work(conn, attempt)` sells one unit of item 1 and, on
/// attempt 1, becomes a deadlock's victim (a heavier transaction on another
/// connection holds item 2 and waits for item 1). Gives `$run`'s outcome, how
/// many times `$work` ran, item 1's stock and the number of order lines
/// committed.
macro_rules! deadlock_first_attempt {
    ($db:expr, |$conn:ident, $work:ident| $run:expr) => {{
        seed_items(
            &mut $db.conn(),
            &(1..=12).map(|id| (id, 10)).collect::<Vec<_>>(),
        );
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let b_rx = Mutex::new(b_rx);
        let url = $db.url.clone();
        let neighbour = std::thread::spawn(move || {
            let mut conn = Sync::establish(&url).unwrap();
            if BACKEND == "postgres" {
                exec(&mut conn, "SET deadlock_timeout = '30s'");
            }
            conn.transaction(|conn| {
                exec(conn, "UPDATE items SET name = 'heavy' WHERE id >= 3");
                let _: Item = diesel::RunQueryDsl::first(items::table.find(2).for_update(), conn)?;
                b_tx.send(()).unwrap();
                a_rx.recv().unwrap();
                std::thread::sleep(Duration::from_millis(200));
                let _: Item = diesel::RunQueryDsl::first(items::table.find(1).for_update(), conn)?;
                diesel::QueryResult::Ok(())
            })
            .expect("the heavier transaction is never the victim");
        });
        let runs = AtomicU32::new(0);
        let $work = async |conn: &mut Async, attempt: u32| -> Result<(), Error> {
            runs.fetch_add(1, Ordering::SeqCst);
            let item: Item = items::table.find(1).for_update().first(conn).await?;
            diesel::update(items::table.find(1))
                .set(items::stock.eq(item.stock - 1))
                .execute(conn)
                .await?;
            if attempt == 1 {
                a_tx.send(()).unwrap();
                tokio::task::block_in_place(|| b_rx.lock().unwrap().recv()).unwrap();
                let _: Item = items::table.find(2).for_update().first(conn).await?;
            }
            Ok(())
        };
        let mut $conn: Async = async_common::connect(&$db.url, BACKEND).await;
        let outcome: Result<(), Error> = $run;
        tokio::task::block_in_place(|| neighbour.join()).unwrap();
        let mut fresh: Async = async_common::connect(&$db.url, BACKEND).await;
        let stock: i32 = items::table
            .find(1)
            .select(items::stock)
            .first(&mut fresh)
            .await
            .unwrap();
        let lines: i64 = orders::table.count().get_result(&mut fresh).await.unwrap();
        (
            outcome,
            AtomicU32::load(&runs, Ordering::SeqCst),
            stock,
            lines,
        )
    }};
}

/// `INSERT`s order line `id`.
async fn order_line<A: SimpleAsyncConnection + Send>(conn: &mut A, id: u32) -> Result<(), Error> {
    let sql = format!("INSERT INTO orders (id, item_id, qty) VALUES ({id}, NULL, 1)");
    Ok(conn.batch_execute(&sql).await?)
}

async_server_tests! {
    async fn async_nested_with_lock_after_the_caller_let_its_own_deadlock_go_commits_nothing(db) {
        // The async twin of lock_errors'
        // `a_nested_with_lock_after_the_caller_let_its_own_deadlock_go_commits_nothing`:
        // the caller's own statement is the deadlock's victim, the caller lets
        // it go and sells under a nested `with_lock`. On MariaDB no transaction
        // is open any more: the sale must not commit on its own.
        let (outcome, runs, stock, lines) = deadlock_first_attempt!(db, |conn, work| {
            lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::immediate(1), async |conn| {
                order_line(conn, 1).await?;
                let _ = work(conn, 1).await; // let go
                lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, item: Item| {
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(item.stock - 1))
                        .execute(conn)
                        .await?;
                    order_line(conn, 2).await
                })
                .await
            })
            .await
        });
        assert_eq!(runs, 1);
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(
            (stock, lines),
            (10, 0),
            "the nested sale committed on its own, without order line 1: {outcome:?}"
        );
    }

    async fn async_idempotency_key_is_not_marked_done_for_work_the_server_rolled_back(db) {
        // The async twin of idempotency's
        // `a_key_is_not_marked_done_for_work_innodb_rolled_back`: the work
        // sells one unit and lets its deadlock go. The key must not replay
        // "sold" for a sale that never committed.
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::{fingerprint, Idempotency, Outcome};
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations(BACKEND))
            .unwrap();
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", b"{\"item\":1}");
        let (outcome, runs, stock, _) = deadlock_first_attempt!(db, |conn, work| {
            lockkit::asynchronous::idempotency::run(&keys, &mut conn, "tenant-1", "order-1", &request, async |c| {
                let _ = work(c, 1).await; // let go
                Ok::<_, Error>("201 sold".to_owned())
            })
            .await
            .map(|_| ())
        });
        assert_eq!(runs, 1);
        // The client retries with the same key.
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let again = lockkit::asynchronous::idempotency::run(&keys, &mut conn, "tenant-1", "order-1", &request, async |c| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(c)
                .await?;
            Ok::<_, Error>("201 sold".to_owned())
        })
        .await;
        let after: i32 = items::table.find(1).select(items::stock).first(&mut conn).await.unwrap();
        assert!(
            stock == 10 && matches!(again, Ok(Outcome::Ran(_))) && after == 9,
            "first run {outcome:?} (stock {stock}), the retry {again:?}: stock {after}, the unit \
             must be sold exactly once"
        );
    }
}

#[cfg(feature = "postgres")]
mod postgres_only {
    use std::sync::atomic::{AtomicU32, Ordering};

    use diesel::{ExpressionMethods, QueryDsl, RunQueryDsl};
    use lockkit::{Error, RetryPolicy};
    use lockkit_tests::schema::items;
    use lockkit_tests::{exec, seed_items, TestDb};

    /// The work recovers from a failed statement with a savepoint of its own,
    /// in SQL (`SAVEPOINT`, `ROLLBACK TO SAVEPOINT`), as PostgreSQL allows:
    /// the transaction is alive and its `COMMIT` commits.
    #[test]
    fn a_transaction_that_recovers_with_its_own_sql_savepoint_commits() {
        let db = TestDb::<diesel::PgConnection>::new("sql_savepoint");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        let runs = AtomicU32::new(0);
        let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
            runs.fetch_add(1, Ordering::SeqCst);
            diesel::update(items::table.find(1))
                .set(items::stock.eq(9))
                .execute(c)?;
            exec(c, "SAVEPOINT best_effort");
            let failed = diesel::sql_query("SELECT 1 / 0").execute(c);
            assert!(failed.is_err());
            exec(c, "ROLLBACK TO SAVEPOINT best_effort");
            Ok::<_, Error>(())
        });
        let stock: i32 = items::table
            .find(1)
            .select(items::stock)
            .first(&mut db.conn())
            .unwrap();
        assert!(
            outcome.is_ok() && stock == 9,
            "a transaction the server kept was refused: {outcome:?} after {} run(s), stock {stock}",
            AtomicU32::load(&runs, Ordering::SeqCst)
        );
    }
}

/// Through a `#[derive(diesel::MultiConnection)]` enum holding a
/// PostgreSQL connection: lockkit's journal reads the backend's rule from the
/// enum's backend, which is none of lockkit's.
#[cfg(all(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod multi_connection {
    use diesel::prelude::*;
    use lockkit::prelude::*;
    use lockkit::{Error, RetryPolicy};
    use lockkit_tests::models::Item;
    use lockkit_tests::schema::items;
    use lockkit_tests::{seed_items, TestDb};

    #[derive(diesel::MultiConnection)]
    pub enum AnyConnection {
        Pg(PgConnection),
        Mysql(MysqlConnection),
        Sqlite(SqliteConnection),
    }

    impl lockkit::multi::Dispatch for AnyConnection {
        fn dispatch(&mut self) -> lockkit::multi::BackendConn<'_> {
            match self {
                AnyConnection::Pg(conn) => lockkit::multi::BackendConn::Pg(conn),
                AnyConnection::Mysql(conn) => lockkit::multi::BackendConn::Mysql(conn),
                AnyConnection::Sqlite(conn) => lockkit::multi::BackendConn::Sqlite(conn),
            }
        }
    }

    fn load(conn: &mut AnyConnection) -> Item {
        items::table
            .find(1)
            .select(Item::as_select())
            .first(conn)
            .unwrap()
    }

    /// combined's
    /// `a_versioned_write_postgres_rolled_back_at_commit_never_lands_over_a_later_commit`
    /// through the enum: the work lets a failed statement go, PostgreSQL
    /// answers the `COMMIT` with `ROLLBACK`.
    #[test]
    fn a_write_postgres_rolled_back_at_commit_through_the_enum_is_not_success_nor_a_lost_update() {
        let db = TestDb::<PgConnection>::new("multi_aborted_at_commit");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut own = AnyConnection::Pg(db.connect());
        let mut other = AnyConnection::Pg(db.connect());
        let mut a = load(&mut own);
        let outcome = lockkit::transaction_with_retry(
            &mut own,
            &RetryPolicy::immediate(1),
            |c: &mut AnyConnection| {
                a.stock = 5;
                a.update_versioned(c)?;
                assert!(diesel::sql_query("SELECT 1 / 0").execute(c).is_err());
                Ok::<_, Error>(())
            },
        );
        assert_eq!(load(&mut other).stock, 10, "nothing of A's committed");
        // B reads v0, writes its 7 and commits: v1, B's data.
        let mut b = load(&mut other);
        b.stock = 7;
        b.update_versioned(&mut other).unwrap();
        // A writes again: its 1 never committed, the row's 1 is B's.
        a.stock = 3;
        let again = a.update_versioned(&mut own);
        let stock = load(&mut other).stock;
        assert!(
            outcome.is_err() && matches!(again, Err(Error::Stale(_))) && stock == 7,
            "the transaction reported {outcome:?}; A's write again: {again:?}, stock {stock} \
             (B's 7 must stand)"
        );
    }
}

/// PostgreSQL: a failed statement that the work recovers from the ways Diesel
/// knows (a nested transaction, a test transaction) does not make lockkit
/// refuse a transaction the server kept.
#[cfg(feature = "postgres")]
mod recoveries {
    use diesel::{Connection, ExpressionMethods, QueryDsl, RunQueryDsl};
    use lockkit::{Error, LockOptions, RetryPolicy};
    use lockkit_tests::models::Item;
    use lockkit_tests::schema::items;
    use lockkit_tests::{seed_items, TestDb};

    fn stock(conn: &mut diesel::PgConnection) -> i32 {
        items::table
            .find(1)
            .select(items::stock)
            .first(conn)
            .unwrap()
    }

    #[test]
    fn a_failed_statement_in_a_diesel_nested_transaction_the_work_lets_go_commits() {
        let db = TestDb::<diesel::PgConnection>::new("recovered_nested_recovery");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(1), |c| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(9))
                .execute(c)?;
            // Rolled back to its savepoint by Diesel.
            let failed = c.transaction(|c| diesel::sql_query("SELECT 1 / 0").execute(c));
            assert!(failed.is_err());
            // The work lets the error go inside the nested transaction: its
            // RELEASE fails, Diesel rolls back to the savepoint.
            let released = c.transaction(|c| {
                let _ = diesel::sql_query("SELECT 1 / 0").execute(c);
                diesel::QueryResult::Ok(())
            });
            assert!(released.is_err());
            Ok::<_, Error>(())
        });
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(stock(&mut db.conn()), 9);
    }

    #[test]
    fn lockkit_calls_in_a_test_transaction_after_a_failed_nested_call_run() {
        let db = TestDb::<diesel::PgConnection>::new("recovered_test_transaction");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = db.connect();
        conn.begin_test_transaction().unwrap();
        // A nested lockkit call fails on a statement: its savepoint is rolled back.
        let failed = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, _: Item| {
            diesel::sql_query("SELECT 1 / 0").execute(c)?;
            Ok::<_, Error>(())
        });
        assert!(failed.is_err());
        // The next one runs and its write stands in the test transaction.
        lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, item: Item| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(item.stock - 1))
                .execute(c)?;
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(stock(&mut conn), 9);
    }
}
