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
