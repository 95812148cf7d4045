//! MySQL/MariaDB sessions made read-only outside lockkit's transactions (`SET
//! SESSION TRANSACTION READ ONLY`; README, "Galera"): lockkit's transactions
//! begin `READ WRITE` and write as usual, and a statement the server runs after
//! it ended the transaction without an error (MariaDB Galera, for another
//! node's write) fails instead of committing on its own. Here the end is a
//! `ROLLBACK` the work sends behind Diesel's back, which leaves the connection
//! as Galera's silent end does: Diesel and lockkit count the transaction open,
//! and the server runs the next statements in autocommit.

#![cfg(feature = "mysql")]

use diesel::{Connection, ExpressionMethods, MysqlConnection, QueryDsl, RunQueryDsl};
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::models::Item;
use lockkit_tests::schema::items;
use lockkit_tests::{exec, seed_items, TestDb};

fn stock(conn: &mut MysqlConnection) -> i32 {
    items::table
        .find(1)
        .select(items::stock)
        .first(conn)
        .unwrap()
}

fn read_only(db: &TestDb<MysqlConnection>) -> MysqlConnection {
    let mut conn = db.connect();
    exec(&mut conn, "SET SESSION TRANSACTION READ ONLY");
    conn
}

fn take_one(conn: &mut MysqlConnection) -> Result<usize, Error> {
    Ok(diesel::update(items::table.find(1))
        .set(items::stock.eq(items::stock - 1))
        .execute(conn)?)
}

/// Every lockkit call that opens a transaction writes on a read-only session,
/// while a write outside them is refused: the session is what the guard needs.
#[test]
fn lockkits_transactions_write_on_a_read_only_session() {
    let db = TestDb::<MysqlConnection>::new("ro_session_writes");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = read_only(&db);
    let policy = RetryPolicy::immediate(3);

    lockkit::locked_transaction(&mut conn, LockOptions::default(), take_one).unwrap();
    lockkit::transaction_with_retry(&mut conn, &policy, take_one).unwrap();
    lockkit::serializable(&mut conn, &policy, take_one).unwrap();
    lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, _: Item| {
        take_one(c)
    })
    .unwrap();
    // Nested: a savepoint in lockkit's read-write transaction.
    lockkit::locked_transaction(&mut conn, LockOptions::default(), |c| {
        lockkit::with_lock(c, 1, LockOptions::default(), |c, _: Item| take_one(c))
    })
    .unwrap();
    assert_eq!(stock(&mut db.conn()), 5);

    // Outside them, and in Diesel's own transaction, the session refuses.
    assert!(matches!(take_one(&mut conn), Err(Error::ReadOnly)));
    let diesel_own = conn.transaction(|c| {
        diesel::update(items::table.find(1))
            .set(items::stock.eq(0))
            .execute(c)
    });
    assert!(diesel_own.is_err(), "{diesel_own:?}");
    assert_eq!(stock(&mut db.conn()), 5);
}

/// The server ends the transaction under the work without an error; the
/// work's next write then fails on a read-only session, and nothing the work
/// did commits: neither the write before the end (the server threw it away)
/// nor the one after.
#[test]
fn a_write_after_the_server_ended_the_transaction_fails_and_commits_nothing() {
    let db = TestDb::<MysqlConnection>::new("ro_session_end");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = read_only(&db);
    let outcome = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, _: Item| {
        take_one(c)?;
        exec(c, "ROLLBACK");
        take_one(c)
    });
    assert!(
        matches!(outcome, Err(Error::ReadOnly)),
        "the write after the end: {outcome:?}"
    );
    assert_eq!(stock(&mut db.conn()), 10, "half of the work committed");
    // The connection goes on.
    lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, _: Item| {
        take_one(c)
    })
    .unwrap();
    assert_eq!(stock(&mut db.conn()), 9);
}

/// The baseline: on a session that is not read-only, the same work's second
/// write runs in autocommit and commits on its own, and the call reports
/// success for work of which only half committed.
#[test]
fn on_a_read_write_session_the_write_after_the_end_commits_on_its_own() {
    let db = TestDb::<MysqlConnection>::new("rw_session_end");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = db.connect();
    let outcome = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, _: Item| {
        take_one(c)?;
        exec(c, "ROLLBACK");
        take_one(c)
    });
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(
        stock(&mut db.conn()),
        9,
        "two writes reported, one committed (the second, in autocommit)"
    );
}
