//! A failed statement that the work of a lockkit transaction lets go, where
//! lockkit's journal decides: a transaction the server ended is not reported as
//! a success through a `MultiConnection` enum either, and one the work
//! recovered (with a savepoint, Diesel's or its own in SQL) is not refused. The
//! other cases are in `lock_errors`, `async_lock_errors`, `combined` and
//! `idempotency`.

#[cfg(feature = "postgres")]
mod postgres_only {
    use std::sync::atomic::{AtomicU32, Ordering};

    use diesel::{ExpressionMethods, QueryDsl, RunQueryDsl};
    use lockkit::{Error, RetryPolicy};
    use lockkit_tests::schema::items;
    use lockkit_tests::{exec, seed_items, stock_of, TestDb};

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
        let stock = stock_of!(&mut db.conn());
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

/// On a connection with instrumentation of its own (an application's query
/// logger, not wrapped in `Journal::wrap`), no journal sees the statement
/// that failed: lockkit asks the server before it commits.
mod instrumented {
    use diesel::prelude::*;
    use lockkit::{Error, LockOptions};
    use lockkit_tests::models::Item;
    use lockkit_tests::schema::items;
    use lockkit_tests::{seed_items, stock_of};

    lockkit_tests::backend_tests! {
        fn with_lock_reports_what_committed_when_the_work_lets_a_failed_statement_go(db) {
            // The work sells one, then a statement fails (a duplicate key) and
            // the work lets the error go. PostgreSQL has aborted the
            // transaction and answers its `COMMIT` with `ROLLBACK`: the sale is
            // gone, and the caller must not be told otherwise. MySQL/MariaDB
            // and SQLite end nothing at a duplicate key: the sale commits.
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut own: Conn = db.connect();
            own.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
            let result = lockkit::with_lock(&mut own, 1, LockOptions::default(), |c, item: Item| {
                diesel::update(items::table.find(item.id))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(c)?;
                let duplicate = diesel::sql_query(
                    "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'dup', 0, 0)",
                )
                .execute(c);
                assert!(duplicate.is_err());
                Ok::<_, Error>(())
            });
            let stock = stock_of!(&mut db.conn());
            assert!(
                result.is_ok() == (stock == 9) && (BACKEND != "postgres" || stock == 10),
                "with_lock returned {result:?}; stock {stock}"
            );
            assert!(!lockkit::LockingConnection::in_transaction(&mut own));
        }
    }

    /// Inserts order line `attempt` (no item, quantity 1): one for each run
    /// of the work.
    #[cfg(feature = "mysql")]
    fn insert_order_line(c: &mut diesel::MysqlConnection, attempt: i32) -> QueryResult<usize> {
        let line = format!("INSERT INTO orders (id, item_id, qty) VALUES ({attempt}, NULL, 1)");
        diesel::sql_query(line).execute(c)
    }

    /// The work, whose statement committed implicitly, ran once (`attempts`),
    /// left one order line in `db`, and ended with an error no retry takes up.
    #[cfg(feature = "mysql")]
    #[track_caller]
    fn assert_run_once(
        db: &lockkit_tests::TestDb<diesel::MysqlConnection>,
        attempts: i32,
        outcome: Result<(), Error>,
    ) {
        use lockkit_tests::schema::orders;
        let lines: i64 = orders::table.count().get_result(&mut db.conn()).unwrap();
        assert!(
            attempts == 1 && lines == 1 && outcome.as_ref().is_err_and(|e| !e.is_retryable()),
            "{attempts} attempt(s), {lines} order line(s): {outcome:?}"
        );
    }

    /// MySQL/MariaDB: a statement of the work commits the transaction
    /// implicitly (DDL). With no journal, lockkit finds no transaction open
    /// before its `COMMIT` and cannot tell this from a deadlock's rollback: it
    /// must not call it retryable, or `transaction_with_retry` would apply the
    /// committed work a second time.
    #[cfg(feature = "mysql")]
    #[test]
    fn an_implicit_commit_in_the_work_is_never_retried() {
        use lockkit::RetryPolicy;
        let db = lockkit_tests::TestDb::<diesel::MysqlConnection>::new("implicit_commit");
        let mut own = db.connect();
        own.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
        let mut attempts = 0;
        let outcome = lockkit::transaction_with_retry(&mut own, &RetryPolicy::immediate(3), |c| {
            attempts += 1;
            insert_order_line(c, attempts)?;
            diesel::sql_query("CREATE TABLE IF NOT EXISTS implicit_commit (id INT)").execute(c)?;
            Ok::<_, Error>(())
        });
        assert_run_once(&db, attempts, outcome);
    }

    /// As above, with the journal watching, where a nested call fails after
    /// the implicit commit: the server has no transaction open under it, and
    /// nothing the journal saw ended one. That is no deadlock's rollback, and
    /// the owner must not run the committed work again.
    #[cfg(feature = "mysql")]
    #[test]
    fn a_nested_call_after_an_implicit_commit_is_never_retried() {
        use lockkit::RetryPolicy;
        let db = lockkit_tests::TestDb::<diesel::MysqlConnection>::new("nested_implicit_commit");
        let mut conn = db.conn();
        let mut attempts = 0;
        let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
            attempts += 1;
            insert_order_line(c, attempts)?;
            lockkit::transaction_with_retry(c, &RetryPolicy::immediate(3), |c| {
                diesel::sql_query("CREATE TABLE IF NOT EXISTS nested_implicit_commit (id INT)")
                    .execute(c)?;
                Err::<(), _>(Error::NotFound)
            })
        });
        assert_run_once(&db, attempts, outcome);
    }
}

/// SQLite: a statement that rolls back the whole transaction (a trigger's
/// `RAISE(ROLLBACK, ..)`), whose error the work lets go. Every statement after
/// it would run in autocommit and commit on its own: a nested lockkit call must
/// refuse instead, and nothing of the transaction may commit.
#[cfg(feature = "sqlite")]
mod sqlite_only {
    use std::fmt::Debug;

    use diesel::{ExpressionMethods, QueryDsl, RunQueryDsl, SqliteConnection};
    use lockkit::{Error, LockOptions};
    use lockkit_tests::models::Item;
    use lockkit_tests::schema::items;
    use lockkit_tests::{exec, seed_items, TestDb};

    /// A database `name` with items of these stocks, whose update below zero
    /// rolls back the whole transaction (a trigger's `RAISE(ROLLBACK, ..)`).
    fn out_of_stock_db(name: &str, stocks: &[(i32, i32)]) -> TestDb<SqliteConnection> {
        let db = TestDb::<SqliteConnection>::new(name);
        seed_items(&mut db.conn(), stocks);
        exec(
            &mut db.conn(),
            lockkit_tests::SQLITE_OUT_OF_STOCK_ROLLS_BACK,
        );
        db
    }

    /// Your own statement, in your own transaction, that item 1's trigger
    /// answers by rolling back the whole transaction; its error let go.
    fn oversell_item_1(conn: &mut SqliteConnection) {
        let failed = diesel::update(items::table.find(1))
            .set(items::stock.eq(-1))
            .execute(conn);
        assert!(failed.is_err());
    }

    /// As [`oversell_item_1`], by a statement that answers with rows
    /// (`RETURNING`), read with `load` or `get_result`: Diesel's SQLite
    /// connection reports it to its instrumentation as succeeded, and its
    /// error reaches the caller only.
    fn oversell_item_1_in_a_read(conn: &mut SqliteConnection, get_result: bool) {
        let oversell =
            diesel::sql_query("UPDATE items SET stock = -1 WHERE id = 1 RETURNING stock");
        let failed = if get_result {
            oversell.get_result::<lockkit_tests::Stock>(conn).map(drop)
        } else {
            oversell.load::<lockkit_tests::Stock>(conn).map(drop)
        };
        assert!(failed.is_err(), "{failed:?}");
    }

    /// The stocks are `stocks` (nothing of the transaction, which said
    /// `outcome`, committed), and lockkit's call after the rollback refused.
    fn nothing_committed<T: Debug>(
        db: &TestDb<SqliteConnection>,
        stocks: &[i32],
        outcome: &impl Debug,
        refused: Option<Result<T, Error>>,
    ) {
        let now: Vec<i32> = items::table
            .order(items::id)
            .select(items::stock)
            .load(&mut db.conn())
            .unwrap();
        assert_eq!(
            now, stocks,
            "nothing committed; the transaction said {outcome:?}"
        );
        assert!(
            matches!(refused, Some(Err(Error::TransactionAborted(_)))),
            "lockkit's call after the rollback refused: {refused:?}"
        );
    }

    /// The stocks are `stocks`.
    fn nothing_committed_but(db: &TestDb<SqliteConnection>, stocks: &[i32]) {
        let now: Vec<i32> = items::table
            .order(items::id)
            .select(items::stock)
            .load(&mut db.conn())
            .unwrap();
        assert_eq!(now, stocks);
    }

    /// One unit of item `id` sold under `with_lock`.
    fn sell(conn: &mut SqliteConnection, id: i32) -> Result<(), Error> {
        lockkit::with_lock(conn, id, LockOptions::default(), |conn, item: Item| {
            diesel::update(items::table.find(item.id))
                .set(items::stock.eq(item.stock - 1))
                .execute(conn)
                .map(drop)
                .map_err(Error::from)
        })
    }

    /// lockkit's own `atomic::update_returning` is the statement SQLite's
    /// trigger answers by rolling back the whole transaction: Diesel's SQLite
    /// connection reports a statement that answers with rows as succeeded, so
    /// only lockkit sees its error. The work lets it go and sells item 2 under
    /// `with_lock`, which must refuse rather than begin and commit on its own.
    #[test]
    fn a_nested_call_after_lockkits_own_returning_write_rolled_back_refuses() {
        let db = out_of_stock_db("raise_rollback_returning", &[(1, 0), (2, 5)]);
        let mut conn = db.connect();
        sell(&mut conn, 2).unwrap(); // lockkit's journal watches the connection
        let mut refused = None;
        let outcome = diesel::Connection::transaction(&mut conn, |conn| {
            sell(conn, 2)?;
            let oversold = lockkit::atomic::update_returning::<_, _, lockkit_tests::Stock>(
                conn,
                diesel::sql_query("UPDATE items SET stock = -1 WHERE id = 1 RETURNING stock"),
            );
            assert!(oversold.is_err(), "{oversold:?}");
            refused = Some(sell(conn, 2));
            Ok::<_, Error>(())
        });
        nothing_committed(&db, &[0, 4], &outcome, refused);
    }

    /// Your own statement that answers with rows is the one SQLite's trigger
    /// answers by rolling back the whole transaction, its error let go: the
    /// journal saw it succeed, so lockkit's next call in the transaction
    /// asks SQLite, and refuses rather than begin and commit on its own.
    #[test]
    fn a_nested_call_after_your_own_statement_that_answers_with_rows_rolled_back_refuses() {
        for get_result in [false, true] {
            let db = out_of_stock_db(
                &format!("raise_rollback_own_read_{get_result}"),
                &[(1, 0), (2, 5)],
            );
            let mut conn = db.connect();
            sell(&mut conn, 2).unwrap(); // lockkit's journal watches the connection
            let mut refused = None;
            let outcome = diesel::Connection::transaction(&mut conn, |conn| {
                sell(conn, 2)?;
                oversell_item_1_in_a_read(conn, get_result);
                refused = Some(sell(conn, 2));
                Ok::<_, Error>(())
            });
            nothing_committed(&db, &[0, 4], &outcome, refused);
        }
    }

    /// A work that returns the trigger's error (`?`) after SQLite rolled back
    /// the whole transaction gets that error back, as lockkit promises of the
    /// work's own error: not the failure of the `ROLLBACK` (or `ROLLBACK TO`)
    /// that finds no transaction (or savepoint) left. And the connection works
    /// on.
    #[test]
    fn a_work_that_returns_the_rollback_triggers_error_gets_it_back() {
        let db = out_of_stock_db("raise_rollback_returned", &[(1, 0), (2, 5)]);
        let mut conn = db.connect();
        let oversell = |conn: &mut SqliteConnection| {
            lockkit::with_lock(conn, 1, LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(item.id))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(conn)?;
                Ok::<_, Error>(())
            })
        };
        let outermost = oversell(&mut conn);
        assert!(
            outermost
                .as_ref()
                .is_err_and(|err| err.to_string().contains("out of stock")),
            "outermost: {outermost:?}"
        );
        let mut nested = None;
        let around = diesel::Connection::transaction(&mut conn, |conn| {
            nested = Some(oversell(conn));
            Ok::<_, Error>(())
        });
        assert!(
            matches!(&nested, Some(Err(err)) if err.to_string().contains("out of stock")),
            "nested: {nested:?}"
        );
        assert!(
            around.is_err(),
            "the transaction SQLite rolled back: {around:?}"
        );
        sell(&mut conn, 2).expect("the connection works on");
        nothing_committed_but(&db, &[0, 4]);
    }

    /// A work under `transaction_with_retry` on a database `name` with these
    /// stocks that lets SQLite's whole rollback go, sells one unit of item 2
    /// (in autocommit, where the write commits on its own), runs `more`, and
    /// returns a retryable error of its own: a retry would apply that write
    /// twice. The call must run it once, answer an error that is not retried,
    /// and leave the stocks `after`.
    fn runs_once_after_writing_past_the_rollback(
        name: &str,
        stocks: &[(i32, i32)],
        more: impl Fn(&mut SqliteConnection) -> Result<(), Error>,
        after: &[i32],
    ) {
        runs_once_after_writing_past(name, stocks, oversell_item_1, more, after);
    }

    /// [`runs_once_after_writing_past_the_rollback`], where `oversell` is the
    /// work's statement that SQLite's rollback answers.
    fn runs_once_after_writing_past(
        name: &str,
        stocks: &[(i32, i32)],
        oversell: impl Fn(&mut SqliteConnection),
        more: impl Fn(&mut SqliteConnection) -> Result<(), Error>,
        after: &[i32],
    ) {
        let db = out_of_stock_db(name, stocks);
        let mut conn = db.connect();
        let mut runs = 0;
        let outcome =
            lockkit::transaction_with_retry(&mut conn, &lockkit::RetryPolicy::immediate(3), |c| {
                runs += 1;
                oversell(c);
                diesel::update(items::table.find(2))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(c)?;
                more(c)?;
                Err::<(), _>(Error::LockTimeout)
            });
        assert!(
            outcome.as_ref().is_err_and(|err| !err.is_retryable()),
            "{outcome:?}"
        );
        assert_eq!(runs, 1, "the work ran again");
        nothing_committed_but(&db, after);
    }

    #[test]
    fn a_work_that_wrote_after_sqlites_rollback_is_not_retried() {
        runs_once_after_writing_past_the_rollback(
            "raise_rollback_wrote_on",
            &[(1, 0), (2, 5)],
            |_| Ok(()),
            &[0, 4],
        );
    }

    /// As above, where the statement SQLite's rollback answers is one that
    /// answers with rows, whose error the journal does not see, and a lockkit
    /// call follows the write: it asks SQLite, refuses, and says the write may
    /// have committed on its own, so that no retry runs the work again.
    /// So too where that call runs in a savepoint of the work's own, which
    /// SQLite, in autocommit, takes for the start of a new transaction that
    /// it then finds alive: the call sells item 3 there, and the work still
    /// runs once.
    #[test]
    fn a_lockkit_call_after_a_write_after_a_rollback_its_read_hid_is_not_retried() {
        type More = fn(&mut SqliteConnection) -> Result<(), Error>;
        let more: [(&str, More, i32); 2] = [
            ("sell", |c| sell(c, 3), 5),
            (
                "savepoint",
                |c| diesel::Connection::transaction(c, |c| sell(c, 3)),
                4,
            ),
        ];
        for (name, more, item_3) in more {
            runs_once_after_writing_past(
                &format!("raise_rollback_read_wrote_on_{name}"),
                &[(1, 0), (2, 5), (3, 5)],
                |c| oversell_item_1_in_a_read(c, false),
                more,
                &[0, 4, item_3],
            );
        }
    }

    /// A work that wrote, then met SQLite's whole rollback in a statement
    /// that answers with rows and returned its error (`?`), gets that error
    /// back, outermost and nested: the journal, which did not see that
    /// statement fail, takes it for the rollback's, not for one the work let
    /// go before it wrote on.
    #[test]
    fn a_work_that_returns_the_error_of_its_read_after_a_write_gets_it_back() {
        let db = out_of_stock_db("raise_rollback_read_returned", &[(1, 0), (2, 5)]);
        let mut conn = db.connect();
        let work = |conn: &mut SqliteConnection| {
            lockkit::with_lock(conn, 2, LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(item.id))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(conn)?;
                diesel::sql_query("UPDATE items SET stock = -1 WHERE id = 1 RETURNING stock")
                    .load::<lockkit_tests::Stock>(conn)?;
                Ok::<_, Error>(())
            })
        };
        let outermost = work(&mut conn);
        let mut nested = None;
        let _ = diesel::Connection::transaction(&mut conn, |conn| {
            nested = Some(work(conn));
            Ok::<_, Error>(())
        });
        for (at, returned) in [("outermost", Some(outermost)), ("nested", nested)] {
            assert!(
                matches!(&returned, Some(Err(err)) if err.to_string().contains("out of stock")),
                "{at}: {returned:?}"
            );
        }
        nothing_committed_but(&db, &[0, 5]);
    }

    /// As above, where the work returns `Ok`: SQLite refuses the `COMMIT`
    /// (no transaction is open), and no retry runs the work again. Nor does
    /// lockkit ask SQLite before that `COMMIT` for the read (the refusal
    /// tells): the work's reads cost no statement at the end.
    #[test]
    fn a_work_that_returns_ok_after_a_rollback_its_read_hid_is_not_retried() {
        let db = out_of_stock_db("raise_rollback_read_ok", &[(1, 0), (2, 5)]);
        let mut conn = db.connect();
        let mut runs = 0;
        let outcome =
            lockkit::transaction_with_retry(&mut conn, &lockkit::RetryPolicy::immediate(3), |c| {
                runs += 1;
                oversell_item_1_in_a_read(c, false);
                diesel::update(items::table.find(2))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(c)?;
                Ok::<_, Error>(())
            });
        assert!(
            outcome.as_ref().is_err_and(|err| !err.is_retryable()),
            "{outcome:?}"
        );
        assert_eq!(runs, 1, "the work ran again");
        nothing_committed_but(&db, &[0, 4]);
    }

    /// As above, with a savepoint of the work's own after the write, which
    /// SQLite, in autocommit, takes for the start of a new transaction; a
    /// lockkit call in it finds that transaction alive. The write before it
    /// still committed on its own: no retry.
    #[test]
    fn a_work_that_wrote_after_sqlites_rollback_then_opened_a_savepoint_is_not_retried() {
        runs_once_after_writing_past_the_rollback(
            "raise_rollback_wrote_then_savepoint",
            &[(1, 0), (2, 5), (3, 5)],
            |c| diesel::Connection::transaction(c, |c| sell(c, 3)),
            &[0, 4, 4],
        );
    }

    /// An idempotency key's run whose work writes after SQLite rolled the
    /// whole transaction back (in autocommit: the write committed) and then
    /// fails or panics keeps its key, so that the client's retry does not
    /// write again.
    #[test]
    fn an_idempotency_key_is_kept_for_work_that_wrote_after_sqlites_rollback() {
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::Idempotency;
        use lockkit_tests::failed_work::fail_under_a_key;
        let db = out_of_stock_db("raise_rollback_idempotency", &[(1, 0), (2, 5)]);
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations("sqlite"))
            .unwrap();
        let keys = Idempotency::default();
        let mut conn = db.connect();
        let sell_two = |c: &mut SqliteConnection| {
            diesel::update(items::table.find(2))
                .set(items::stock.eq(items::stock - 1))
                .execute(c)
        };
        for panics in [false, true] {
            let (key, _) = fail_under_a_key(&keys, &mut conn, panics, Error::LockTimeout, |c| {
                oversell_item_1(c);
                sell_two(c)?; // in autocommit
                Ok(())
            });
            let again = keys.run(&mut conn, "tenant-1", key, "f", |c| {
                sell_two(c)?;
                Ok::<_, Error>("sold".to_owned())
            });
            assert!(
                matches!(again, Err(Error::IdempotencyInProgress)),
                "{key}: the retry got {again:?}"
            );
        }
        nothing_committed_but(&db, &[0, 3]);
    }

    /// An idempotency key's run nested in your transaction after SQLite
    /// rolled it back in place of a read's rows is refused and leaves no key
    /// behind it: the client's retry runs the work.
    #[test]
    fn an_idempotency_run_refused_after_a_rollback_in_place_of_rows_leaves_no_key() {
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::{Idempotency, Outcome};
        let db = out_of_stock_db("raise_rollback_idempotency_nested", &[(1, 0), (2, 5)]);
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations("sqlite"))
            .unwrap();
        let keys = Idempotency::default();
        let mut conn = db.connect();
        sell(&mut conn, 2).unwrap(); // lockkit's journal watches the connection
        let sell_two = |c: &mut SqliteConnection| {
            sell(c, 2)?;
            Ok::<_, Error>("sold".to_owned())
        };
        let mut refused = None;
        let outcome = diesel::Connection::transaction(&mut conn, |c| {
            oversell_item_1_in_a_read(c, false);
            refused = Some(keys.run(c, "tenant-1", "order-1", "f", sell_two));
            Ok::<_, Error>(())
        });
        let refused = refused.expect("the run was called");
        assert!(
            refused.is_err(),
            "{refused:?} (the transaction said {outcome:?})"
        );
        nothing_committed_but(&db, &[0, 4]);
        let again = keys.run(&mut conn, "tenant-1", "order-1", "f", sell_two);
        assert!(
            matches!(again, Ok(Outcome::Ran(_))),
            "the retry got {again:?}"
        );
        nothing_committed_but(&db, &[0, 3]);
    }

    #[test]
    fn a_versioned_write_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        use lockkit::prelude::*;
        let db = out_of_stock_db("raise_rollback_own", &[(1, 0), (2, 5)]);
        let mut conn = db.connect();
        let mut item: Item = items::table.find(2).first(&mut conn).unwrap();
        item.stock -= 1;
        let mut written = None;
        let outcome = diesel::Connection::transaction(&mut conn, |conn| {
            oversell_item_1(conn);
            written = Some(item.update_versioned(conn));
            Ok::<_, diesel::result::Error>(())
        });
        nothing_committed(&db, &[0, 5], &outcome, written);
        assert!(outcome.is_err(), "{outcome:?}");
    }

    #[test]
    fn a_row_lock_after_your_own_statement_rolled_back_the_whole_transaction_is_refused() {
        // `lock()` on a model without a version column: in autocommit its
        // write lock and its read would hold nothing, and the caller's
        // read-change-write after it would run unprotected.
        use lockkit::prelude::*;
        use lockkit_tests::models::Job;
        use lockkit_tests::schema::jobs;
        let db = out_of_stock_db("raise_rollback_lock", &[(1, 0)]);
        exec(
            &mut db.conn(),
            "INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false)",
        );
        let mut conn = db.connect();
        let mut job: Job = jobs::table.find(1).first(&mut conn).unwrap();
        let mut locked = None;
        let outcome = diesel::Connection::transaction(&mut conn, |conn| {
            oversell_item_1(conn);
            locked = Some(job.lock(conn));
            Ok::<_, diesel::result::Error>(())
        });
        nothing_committed(&db, &[0], &outcome, locked);
    }

    #[test]
    fn an_outbox_message_after_your_own_statement_rolled_back_the_whole_transaction_is_refused() {
        use diesel_migrations::MigrationHarness;
        let db = out_of_stock_db("raise_rollback_outbox", &[(1, 0)]);
        db.conn()
            .run_pending_migrations(lockkit_tests::outbox_migrations("sqlite"))
            .unwrap();
        let mut conn = db.connect();
        let mut enqueued = None;
        let outcome = diesel::Connection::transaction(&mut conn, |conn| {
            oversell_item_1(conn);
            enqueued = Some(lockkit::outbox::enqueue(conn, "sold", "item 1"));
            Ok::<_, diesel::result::Error>(())
        });
        nothing_committed(&db, &[0], &outcome, enqueued);
        let unpublished: i64 = lockkit_tests::unpublished_count()
            .get_result(&mut db.conn())
            .unwrap();
        assert_eq!(unpublished, 0, "no message committed on its own");
    }

    /// Every call in `after` refused (`TransactionAborted`), the transaction
    /// failed and committed nothing (the stocks are still `stocks`), and once
    /// it ended the connection sells item `id` again.
    fn refused_then_whole_again<T: Debug, E: Debug>(
        db: &TestDb<SqliteConnection>,
        conn: &mut SqliteConnection,
        after: &[Result<T, Error>],
        outcome: Result<(), E>,
        stocks: &[i32],
        id: i32,
    ) {
        for call in after {
            assert!(
                matches!(call, Err(Error::TransactionAborted(_))),
                "refused: {after:?}"
            );
        }
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(self::stocks(db), stocks, "nothing committed");
        sell(conn, id).unwrap();
        let mut sold = stocks.to_vec();
        sold[usize::try_from(id - 1).unwrap()] -= 1;
        assert_eq!(self::stocks(db), sold, "the connection is whole again");
    }

    /// The stocks, by id.
    fn stocks(db: &TestDb<SqliteConnection>) -> Vec<i32> {
        items::table
            .order(items::id)
            .select(items::stock)
            .load(&mut db.conn())
            .unwrap()
    }

    #[test]
    fn every_lockkit_call_after_a_statement_that_rolled_back_the_whole_transaction_refuses() {
        use lockkit::prelude::*;
        let db = out_of_stock_db("raise_rollback_every", &[(1, 0), (2, 5), (3, 5), (4, 5)]);
        let mut conn = db.connect();
        let mut item_4: Item = items::table.find(4).first(&mut conn).unwrap();
        let mut after = Vec::new();
        let outcome = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
            sell(conn, 3)?;
            assert!(sell(conn, 1).is_err());
            // The work tries item after item: not one of them may commit on
            // its own.
            after.push(sell(conn, 2));
            after.push(sell(conn, 4));
            item_4.stock -= 1;
            after.push(item_4.update_versioned(conn));
            after.push(Item::update_all_by_version(conn, &[(2, 0)], items::stock.eq(0)).map(drop));
            Ok::<_, Error>(())
        });
        refused_then_whole_again(&db, &mut conn, &after, outcome, &[0, 5, 5, 5], 4);
    }

    #[test]
    fn a_rollback_of_the_whole_transaction_passed_up_with_question_mark_leaves_the_connection_whole(
    ) {
        let db = out_of_stock_db("raise_rollback_passed_up", &[(1, 0), (2, 5), (3, 5)]);
        let mut conn = db.connect();
        // lockkit's transaction, then your own: the nested sale's error ends
        // the whole transaction and travels up with `?`.
        let mine = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
            sell(conn, 3)?;
            sell(conn, 1)
        });
        assert!(mine.is_err(), "{mine:?}");
        let yours = diesel::Connection::transaction(&mut conn, |conn| {
            sell(conn, 3)?;
            sell(conn, 1)
        });
        assert!(yours.is_err(), "{yours:?}");
        assert_eq!(stocks(&db), [0, 5, 5], "nothing committed");
        // No transaction is left open in Diesel's books or on the server:
        // lockkit's calls, your transactions and autocommit writes go on.
        sell(&mut conn, 2).unwrap();
        let again = diesel::Connection::transaction(&mut conn, |conn| {
            sell(conn, 2)?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(again, Err(Error::NoRowMatched)), "{again:?}");
        sell(&mut conn, 3).unwrap();
        assert_eq!(
            stocks(&db),
            [0, 4, 4],
            "the rolled-back sale of item 2 undone"
        );
        use diesel::connection::{Connection, TransactionManager};
        let status =
            <SqliteConnection as Connection>::TransactionManager::transaction_manager_status_mut(
                &mut conn,
            );
        assert_eq!(
            status.transaction_depth().unwrap(),
            None,
            "Diesel counts no transaction"
        );
    }

    #[test]
    fn lockkit_calls_after_a_nested_level_whose_count_diesel_dropped_refuse() {
        let db = out_of_stock_db("raise_rollback_dropped_count", &[(1, 0), (2, 5), (3, 5)]);
        let mut conn = db.connect();
        let mut after = Vec::new();
        let outcome = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
            // A nested lockkit level, inside it a savepoint of your own, inside
            // that the sale of item 1, whose trigger rolls back the whole
            // transaction: your savepoint's end makes Diesel drop its count.
            let nested = lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                let yours = diesel::Connection::transaction(conn, |conn| sell(conn, 1));
                assert!(yours.is_err(), "item 1 is out of stock");
                Ok::<_, Error>(())
            });
            assert!(nested.is_err(), "{nested:?}");
            after.push(sell(conn, 2));
            after.push(sell(conn, 3));
            Ok::<_, Error>(())
        });
        refused_then_whole_again(&db, &mut conn, &after, outcome, &[0, 5, 5], 2);
    }

    #[test]
    fn every_lockkit_call_in_your_own_transaction_after_it_was_rolled_back_whole_refuses() {
        let db = out_of_stock_db("raise_rollback_every_own", &[(1, 0), (2, 5), (3, 5)]);
        let mut conn = db.connect();
        let mut after = Vec::new();
        let outcome = diesel::Connection::transaction(&mut conn, |conn| {
            oversell_item_1(conn);
            after.push(sell(conn, 2));
            after.push(sell(conn, 3));
            Ok::<_, diesel::result::Error>(())
        });
        refused_then_whole_again(&db, &mut conn, &after, outcome, &[0, 5, 5], 3);
    }

    /// In your own transaction, your statement oversells item 1 (the trigger
    /// rolls back the whole transaction; its error let go), then `write` runs
    /// on item 2: it refuses, and nothing of the transaction commits.
    fn write_after_your_own_rollback<T: Debug>(
        name: &str,
        write: impl FnOnce(&mut SqliteConnection) -> Result<T, Error>,
    ) {
        let db = out_of_stock_db(name, &[(1, 0), (2, 5)]);
        let mut conn = db.connect();
        let mut written = None;
        let outcome = diesel::Connection::transaction(&mut conn, |conn| {
            oversell_item_1(conn);
            written = Some(write(conn));
            Ok::<_, diesel::result::Error>(())
        });
        nothing_committed(&db, &[0, 5], &outcome, written);
        assert!(outcome.is_err(), "{outcome:?}");
    }

    #[test]
    fn a_bulk_versioned_update_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        use lockkit::prelude::*;
        write_after_your_own_rollback("raise_rollback_bulk", |conn| {
            Item::update_all_by_version(conn, &[(2, 0)], items::stock.eq(4))
        });
    }

    #[test]
    fn an_atomic_update_returning_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        write_after_your_own_rollback("raise_rollback_returning", |conn| {
            lockkit::atomic::update_returning::<_, _, lockkit_tests::Stock>(
                conn,
                diesel::sql_query(lockkit_tests::SELL_ITEM_2_RETURNING),
            )
        });
    }

    #[test]
    fn an_atomic_update_if_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        write_after_your_own_rollback("raise_rollback_update_if", |conn| {
            let item_2 = items::table.find(2).filter(items::stock.ge(1));
            lockkit::atomic::update_if(
                conn,
                diesel::update(item_2).set(items::stock.eq(items::stock - 1)),
            )
        });
    }

    #[test]
    fn a_compare_and_set_after_your_own_statement_rolled_back_the_whole_transaction_commits_nothing(
    ) {
        use lockkit::compare_and_set::expect;
        use lockkit::prelude::*;
        write_after_your_own_rollback("raise_rollback_compare_and_set", |conn| {
            Item::compare_and_set(conn, 2, expect(items::stock, 5), items::stock.eq(4))
        });
    }

    #[test]
    fn lockkit_calls_after_a_nested_call_found_the_whole_transaction_rolled_back_refuse() {
        let db = out_of_stock_db("raise_rollback_nested", &[(1, 0), (2, 5), (3, 5), (4, 5)]);
        let mut conn = db.connect();
        let mut after = Vec::new();
        let outcome = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
            sell(conn, 3)?;
            let nested = lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                oversell_item_1(conn);
                sell(conn, 2)
            });
            assert!(nested.is_err(), "{nested:?}");
            after.push(sell(conn, 4));
            after.push(sell(conn, 2));
            Ok::<_, Error>(())
        });
        refused_then_whole_again(&db, &mut conn, &after, outcome, &[0, 5, 5, 5], 2);
    }

    #[test]
    fn a_failed_statement_that_ends_only_itself_leaves_the_transaction_to_lockkit_calls() {
        // SQLite's default: a constraint's error ends its statement only. The
        // nested call after it runs, and commits with the transaction.
        let db = TestDb::<SqliteConnection>::new("abort_statement_only");
        seed_items(&mut db.conn(), &[(1, 5), (2, 5)]);
        let mut conn = db.connect();
        let outcome = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
            let duplicate = diesel::sql_query(
                "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'again', 1, 0)",
            )
            .execute(conn);
            assert!(duplicate.is_err(), "the key is taken");
            sell(conn, 2)
        });
        assert!(outcome.is_ok(), "{outcome:?}");
        let stocks: Vec<i32> = items::table
            .order(items::id)
            .select(items::stock)
            .load(&mut db.conn())
            .unwrap();
        assert_eq!(stocks, [5, 4]);
    }

    #[test]
    fn a_versioned_write_a_nested_transactions_trigger_rolled_back_is_never_taken_for_committed() {
        // The trigger rolls back the whole transaction under a nested Diesel
        // transaction: Diesel's `ROLLBACK TO SAVEPOINT` then fails in
        // autocommit, Diesel forgets its count, and the outer transaction's
        // end reports nothing. A's write there (v0 -> v1) did not commit: the
        // connection's next transaction, which commits, must not be taken for
        // its commit, or another writer's v1 is A's to write over.
        use diesel::Connection;
        use lockkit::prelude::*;
        let db = out_of_stock_db("nested_raise_rollback", &[(1, 10), (2, 10)]);
        let mut conn = db.conn();
        let mut a: Item = items::table.find(2).first(&mut conn).unwrap();
        let outcome: Result<(), Error> = conn.transaction(|c| {
            a.stock = 5;
            a.update_versioned(c)?;
            c.transaction(|c| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(-1))
                    .execute(c)
                    .map(drop)
            })?;
            Ok(())
        });
        assert!(outcome.is_err(), "{outcome:?}");
        conn.transaction(|c| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(9))
                .execute(c)
                .map(drop)
        })
        .unwrap();
        let mut other = db.conn();
        let mut b: Item = items::table.find(2).first(&mut other).unwrap();
        b.stock = 7;
        b.update_versioned(&mut other).unwrap();
        a.stock = 3;
        let again = a.update_versioned(&mut conn);
        assert!(matches!(again, Err(Error::Stale(_))), "{again:?}");
        let stock: i32 = items::table
            .find(2)
            .select(items::stock)
            .first(&mut other)
            .unwrap();
        assert_eq!(stock, 7, "the other writer's sale stands");
    }
}
