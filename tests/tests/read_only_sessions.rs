//! MySQL/MariaDB sessions made read-only outside lockkit's transactions
//! (`lockkit::read_only_outside_transactions`, which sends `SET SESSION
//! TRANSACTION READ ONLY`; README, "Galera"): lockkit's transactions
//! begin `READ WRITE` and write as usual, and a statement the server runs after
//! it ended the transaction without an error (MariaDB Galera, for another
//! node's write) fails instead of committing on its own. Here the end is a
//! `ROLLBACK` the work sends behind Diesel's back, which leaves the connection
//! as Galera's silent end does: Diesel and lockkit count the transaction open,
//! and the server runs the next statements in autocommit.

#![cfg(feature = "mysql")]

use diesel::{CombineDsl, Connection, ExpressionMethods, MysqlConnection, QueryDsl, RunQueryDsl};
use lockkit::prelude::*;
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::aborts::open_a_stand_in;
use lockkit_tests::models::Item;
use lockkit_tests::schema::items;
use lockkit_tests::{exec, seed_items, stock_of, TestDb};
use std::sync::atomic::{AtomicU32, Ordering};

/// [`stock_of!`] as a function: the async tests below have diesel-async's
/// `RunQueryDsl` in scope, which would make the macro's `first` ambiguous.
fn stock(conn: &mut MysqlConnection) -> i32 {
    stock_of!(conn)
}

fn read_only(db: &TestDb<MysqlConnection>) -> MysqlConnection {
    let mut conn = db.connect();
    lockkit::read_only_outside_transactions(&mut conn).unwrap();
    conn
}

/// A database named after `name` with item 1 at stock 10, and a read-only
/// session on it.
fn guarded(name: &str) -> (TestDb<MysqlConnection>, MysqlConnection) {
    let db = TestDb::<MysqlConnection>::new(name);
    seed_items(&mut db.conn(), &[(1, 10)]);
    let conn = read_only(&db);
    (db, conn)
}

/// Work that takes one, runs `end` (which ends the transaction under lockkit,
/// or commits it), and takes one more.
fn take_one_around(c: &mut MysqlConnection, end: &str) -> Result<usize, Error> {
    take_one(c)?;
    exec(c, end);
    take_one(c)
}

fn take_one(conn: &mut MysqlConnection) -> Result<usize, Error> {
    Ok(diesel::update(items::table.find(1))
        .set(items::stock.eq(items::stock - 1))
        .execute(conn)?)
}

/// `work` under `lockkit::with_lock` of item 1 (default options), which does
/// not look at the locked row.
fn with_lock_on_1<T>(
    conn: &mut MysqlConnection,
    work: impl FnOnce(&mut MysqlConnection) -> Result<T, Error>,
) -> Result<T, Error> {
    lockkit::with_lock(conn, 1, LockOptions::default(), |c, _: Item| work(c))
}

/// Every lockkit call that opens a transaction writes on a read-only session,
/// while a write outside them is refused: the session is what the guard needs.
#[test]
fn lockkits_transactions_write_on_a_read_only_session() {
    let (db, mut conn) = guarded("ro_session_writes");
    let policy = RetryPolicy::immediate(3);

    lockkit::locked_transaction(&mut conn, LockOptions::default(), take_one).unwrap();
    lockkit::transaction_with_retry(&mut conn, &policy, take_one).unwrap();
    lockkit::serializable(&mut conn, &policy, take_one).unwrap();
    with_lock_on_1(&mut conn, take_one).unwrap();
    // Nested: a savepoint in lockkit's read-write transaction.
    lockkit::locked_transaction(&mut conn, LockOptions::default(), |c| {
        with_lock_on_1(c, take_one)
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
    let (db, mut conn) = guarded("ro_session_end");
    let outcome = with_lock_on_1(&mut conn, |c| {
        take_one(c)?;
        // A read as Diesel writes a `UNION`, parenthesized: it commits nothing.
        let ids: Vec<i32> = items::table
            .select(items::id)
            .union(items::table.select(items::id))
            .load(c)?;
        assert_eq!(ids, [1]);
        exec(c, "ROLLBACK");
        take_one(c)
    });
    // The end, not the refused write, is what happened: a retryable
    // `Deadlock`, as Galera reports the same abort when it says so.
    assert!(
        matches!(outcome, Err(Error::Deadlock)),
        "the write after the end: {outcome:?}"
    );
    assert_eq!(stock(&mut db.conn()), 10, "half of the work committed");
    // The connection goes on.
    with_lock_on_1(&mut conn, take_one).unwrap();
    assert_eq!(stock(&mut db.conn()), 9);
}

/// The retrying calls run a transaction the server ended again, once: the
/// first attempt's writes are gone with it (the one before the end) or refused
/// (the one after), the second commits.
#[test]
fn a_transaction_the_server_ended_is_run_again_by_the_retrying_calls() {
    let (db, mut conn) = guarded("ro_session_retry");
    let policy = RetryPolicy::immediate(3);
    let runs = AtomicU32::new(0);
    let work = |c: &mut MysqlConnection| {
        let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
        take_one_around(c, if first { "ROLLBACK" } else { "DO 0" })
    };
    lockkit::transaction_with_retry(&mut conn, &policy, work).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(stock(&mut db.conn()), 8);

    runs.store(0, Ordering::SeqCst);
    lockkit::retry(&policy, |_| with_lock_on_1(&mut conn, work)).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(stock(&mut db.conn()), 6);
}

/// The server may end the transaction after the work's last statement, where
/// no write of the work follows to be refused: nothing of it ran outside the
/// transaction (a write there would have been refused and seen), so the
/// retrying calls run it again, once, also where the end comes under a nested
/// call.
#[test]
fn a_transaction_the_server_ended_after_its_last_write_is_run_again() {
    let (db, mut conn) = guarded("ro_session_end_last");
    let policy = RetryPolicy::immediate(3);
    let runs = AtomicU32::new(0);
    let work = |c: &mut MysqlConnection| {
        let sold = take_one(c)?;
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            exec(c, "ROLLBACK");
        }
        Ok::<_, Error>(sold)
    };
    lockkit::transaction_with_retry(&mut conn, &policy, work).unwrap();
    assert_eq!(runs.swap(0, Ordering::SeqCst), 2);
    assert_eq!(stock(&mut db.conn()), 9);

    lockkit::retry(&policy, |_| with_lock_on_1(&mut conn, work)).unwrap();
    assert_eq!(runs.swap(0, Ordering::SeqCst), 2);
    assert_eq!(stock(&mut db.conn()), 8);

    lockkit::transaction_with_retry(&mut conn, &policy, |c| with_lock_on_1(c, work)).unwrap();
    assert_eq!(runs.swap(0, Ordering::SeqCst), 2);
    assert_eq!(stock(&mut db.conn()), 7);

    // A stand-in opened meanwhile (a nested call's, on another connection):
    // lockkit asks the server before `COMMIT`, which finds the end first.
    let mut other = db.connect();
    lockkit::transaction_with_retry(&mut conn, &policy, |c| {
        open_a_stand_in(&mut other);
        work(c)
    })
    .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(stock(&mut db.conn()), 6);
}

/// What a guarded session's transaction sends on the suite's MariaDB: it
/// begins with its savepoint, and its commit asks `@@in_transaction` inside
/// the batch before the `COMMIT` (Galera's silent end may leave the savepoint
/// in place; docs/SQL.md).
#[test]
fn on_mariadb_the_commit_batch_asks_whether_the_transaction_is_open() {
    use diesel::connection::InstrumentationEvent;
    use std::sync::{Arc, Mutex};
    let db = TestDb::<MysqlConnection>::new("ro_session_commit_sql");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let sent = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut conn = db.connect();
    let log = Arc::clone(&sent);
    conn.set_instrumentation(lockkit::journal::Journal::wrap(
        move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                log.lock().unwrap().push(query.to_string());
            }
        },
    ));
    lockkit::read_only_outside_transactions(&mut conn).unwrap();
    lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(1), take_one).unwrap();
    assert_eq!(stock(&mut db.conn()), 9);
    let sent = sent.lock().unwrap();
    let tail: Vec<&str> = sent
        .iter()
        .map(String::as_str)
        .skip_while(|q| !q.starts_with("START"))
        .collect();
    assert!(
        tail.first().is_some_and(|q| *q == "START TRANSACTION READ WRITE; SAVEPOINT lockkit_open")
            && tail.iter().any(|q| q.starts_with(
                "RELEASE SAVEPOINT lockkit_open; BEGIN NOT ATOMIC IF @@in_transaction = 0 THEN SIGNAL"
            ) && q.ends_with("END IF; END; COMMIT")),
        "{tail:#?}"
    );
}

/// Work that lets the refused write go and returns `Ok` is not committed as a
/// success: lockkit's `COMMIT` would commit nothing of it.
#[test]
fn work_that_lets_the_refused_write_go_is_not_reported_committed() {
    let (db, mut conn) = guarded("ro_session_swallow");
    let outcome = with_lock_on_1(&mut conn, |c| {
        take_one(c)?;
        exec(c, "ROLLBACK");
        let refused = take_one(c);
        assert!(refused.is_err(), "{refused:?}");
        Ok::<_, Error>(())
    });
    assert!(matches!(outcome, Err(Error::Deadlock)), "{outcome:?}");
    assert_eq!(stock(&mut db.conn()), 10);
}

/// Diesel's own transaction begins read-only on such a session, and a write
/// refused there ends nothing: lockkit's versioned write reports the refusal,
/// not an end, and a nested lockkit call goes on.
#[test]
fn a_refused_write_in_the_callers_own_read_only_transaction_ends_nothing() {
    let (_db, mut conn) = guarded("ro_session_own");
    // A lockkit transaction first: lockkit's journal watches the connection.
    lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
    let mut item: Item = items::table.find(1).first(&mut conn).unwrap();
    let read = conn.transaction(|c| {
        item.stock = 9;
        let refused = item.update_versioned(c);
        assert!(matches!(refused, Err(Error::ReadOnly)), "{refused:?}");
        assert!(matches!(take_one(c), Err(Error::ReadOnly)));
        lockkit::locked_transaction(c, LockOptions::default(), |c| Ok::<_, Error>(stock(c)))
    });
    assert!(matches!(read, Ok(10)), "{read:?}");
}

/// Under `transaction_with_retry` (3 attempts): work that takes one, runs
/// `end` (which may commit the transaction itself) and, with `write_after`,
/// takes one more. What the call returned, and how often the work ran.
fn committing_itself(
    conn: &mut MysqlConnection,
    end: &str,
    write_after: bool,
) -> (Result<(), Error>, u32) {
    let runs = AtomicU32::new(0);
    let outcome = lockkit::transaction_with_retry(conn, &RetryPolicy::immediate(3), |c| {
        runs.fetch_add(1, Ordering::SeqCst);
        take_one(c)?;
        let _ = diesel::connection::SimpleConnection::batch_execute(c, end);
        match write_after {
            true => take_one(c).map(drop),
            false => Ok(()),
        }
    });
    (outcome, runs.into_inner())
}

/// A statement of the work that commits the transaction itself (here a raw
/// `COMMIT`; DDL does so too) is not an end the server made silently: the
/// refused write after it is `ReadOnly`, which no retry takes up, since the
/// part before the commit stands and a rerun would apply it twice.
#[test]
fn a_write_refused_after_the_work_committed_itself_is_not_run_again() {
    let (db, mut conn) = guarded("ro_session_commit");
    // DDL commits before it runs, also when it fails (the table exists); a
    // batch's first statement commits nothing, its second does.
    let ends = ["COMMIT", "CREATE TABLE items (id INT)", "DO 0; COMMIT"];
    for (n, end) in ends.into_iter().enumerate() {
        let (outcome, runs) = committing_itself(&mut conn, end, true);
        assert!(
            matches!(outcome, Err(Error::ReadOnly)),
            "{end}: {outcome:?}"
        );
        assert_eq!(runs, 1, "{end}");
        assert_eq!(stock(&mut db.conn()), 9 - n as i32, "{end}");
    }
}

/// Work whose last statement committed the transaction itself, with no write
/// after it to be refused: its writes stand, and lockkit's `COMMIT` reports
/// them once. The savepoint lockkit began with went with that commit, and its
/// missing release is not an end the server made: the work is not run again.
#[test]
fn work_that_committed_itself_last_is_run_once() {
    let (db, mut conn) = guarded("ro_session_commit_last");
    let ends = ["COMMIT", "CREATE TABLE items (id INT)", "DO 0; COMMIT"];
    for (n, end) in ends.into_iter().enumerate() {
        let (outcome, runs) = committing_itself(&mut conn, end, false);
        // DDL that fails after its commit is itself refused on the session,
        // after the commit: `ReadOnly`, as a refused write after a commit is.
        match end.starts_with("CREATE") {
            true => assert!(
                matches!(outcome, Err(Error::ReadOnly)),
                "{end}: {outcome:?}"
            ),
            false => assert!(outcome.is_ok(), "{end}: {outcome:?}"),
        }
        assert_eq!(runs, 1, "{end}");
        assert_eq!(stock(&mut db.conn()), 9 - n as i32, "{end}");
    }
}

/// The same refusal met by a nested lockkit call, whose owner (here lockkit's
/// outer call) may retry: the nested call hands on the refusal, which no
/// retry takes up, not a deadlock's end.
#[test]
fn a_nested_call_refused_after_the_work_committed_itself_hands_on_read_only() {
    let (db, mut conn) = guarded("ro_session_nested_commit");
    let runs = AtomicU32::new(0);
    let outer = lockkit::locked_transaction(&mut conn, LockOptions::default(), |c| {
        take_one(c)?;
        exec(c, "COMMIT");
        let inner = lockkit::transaction_with_retry(c, &RetryPolicy::immediate(3), |c| {
            runs.fetch_add(1, Ordering::SeqCst);
            take_one(c)
        });
        match &inner {
            Err(Error::TransactionAborted(aborted)) => {
                assert!(matches!(aborted.cause(), Error::ReadOnly), "{inner:?}")
            }
            _ => panic!("the nested call: {inner:?}"),
        }
        inner
    });
    assert!(matches!(outer, Err(Error::ReadOnly)), "{outer:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(stock(&mut db.conn()), 9, "the part before the COMMIT");
}

/// A lock wait timeout the work let go is an end lockkit is not sure of (on
/// most servers it ends nothing): a refusal after it, which may follow a
/// statement of the work that committed the transaction, fails the call as
/// `ReadOnly`, not as the timeout a retry would take up. Also where lockkit
/// was told of the session inside the transaction, after such a statement.
#[test]
fn a_refusal_after_a_lock_wait_timeout_the_work_let_go_is_not_run_again() {
    let (db, mut conn) = guarded("ro_session_timeout_commit");
    exec(&mut conn, "SET SESSION innodb_lock_wait_timeout = 1");
    let mut holder = db.connect();
    exec(
        &mut holder,
        "START TRANSACTION; SELECT id FROM items WHERE id = 1 FOR UPDATE",
    );
    let runs = AtomicU32::new(0);
    let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
        runs.fetch_add(1, Ordering::SeqCst);
        exec(
            c,
            "INSERT INTO items (id, name, stock, lock_version) VALUES (2, 'b', 5, 0)",
        );
        let waited = items::table.find(1).for_update().first::<Item>(c);
        assert!(waited.is_err(), "the row is held: {waited:?}");
        exec(c, "COMMIT");
        take_one(c)
    });
    exec(&mut holder, "ROLLBACK");
    assert!(matches!(outcome, Err(Error::ReadOnly)), "{outcome:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let rows: i64 = items::table.count().get_result(&mut db.conn()).unwrap();
    assert_eq!(rows, 2, "the insert before the COMMIT, once");

    // Told inside a transaction, after a COMMIT it did not see.
    let mut conn = db.connect();
    let runs = AtomicU32::new(0);
    let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
        runs.fetch_add(1, Ordering::SeqCst);
        take_one(c)?;
        exec(c, "COMMIT");
        lockkit::read_only_outside_transactions(c)?;
        take_one(c)
    });
    assert!(matches!(outcome, Err(Error::ReadOnly)), "{outcome:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(stock(&mut db.conn()), 9, "the sale before the COMMIT, once");
}

/// A session made read-only by the user's own SQL, not through lockkit: the
/// journal learns of it at the server's first refusal there (here a write
/// outside a transaction), and from then on tells a statement that committed
/// the transaction itself, as above.
#[test]
fn a_session_made_read_only_in_sql_is_guarded_from_its_first_refusal() {
    let db = TestDb::<MysqlConnection>::new("ro_session_sql");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = db.connect();
    // The journal watches the connection from lockkit's first call on it.
    lockkit::locked_transaction(&mut conn, LockOptions::default(), take_one).unwrap();
    exec(&mut conn, "SET SESSION TRANSACTION READ ONLY");
    assert!(matches!(take_one(&mut conn), Err(Error::ReadOnly)));
    let runs = AtomicU32::new(0);
    let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
        runs.fetch_add(1, Ordering::SeqCst);
        take_one_around(c, "COMMIT")
    });
    assert!(matches!(outcome, Err(Error::ReadOnly)), "{outcome:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        stock(&mut db.conn()),
        8,
        "the first sale, and the one before the COMMIT"
    );
}

/// Where the journal does not know the session is read-only (made so in the
/// user's SQL, with no refusal seen yet; or the guard's journal replaced by
/// the user's own, wrapped), it did not look for statements that commit the
/// transaction themselves: a refusal then fails the call as `ReadOnly`, run
/// once, whether the work committed itself or the server ended the
/// transaction, and never as `Ok`.
#[test]
fn on_a_session_not_known_read_only_a_refusal_fails_the_call_once() {
    let db = TestDb::<MysqlConnection>::new("ro_session_unknown");
    seed_items(&mut db.conn(), &[(1, 10)]);
    // A fresh session each time: the first refusal makes the session known.
    let replaced = || {
        let mut conn = read_only(&db);
        conn.set_instrumentation(lockkit::journal::Journal::wrap(
            |_: diesel::connection::InstrumentationEvent<'_>| {},
        ));
        conn
    };
    let in_sql = || {
        let mut conn = db.connect();
        exec(&mut conn, "SET SESSION TRANSACTION READ ONLY");
        conn
    };
    let mut expected = 10;
    for (session, connect) in [
        ("replaced", &replaced as &dyn Fn() -> MysqlConnection),
        ("in SQL", &in_sql),
    ] {
        for (end, committed) in [("COMMIT", 1), ("ROLLBACK", 0)] {
            for swallowed in [false, true] {
                let mut conn = connect();
                let runs = AtomicU32::new(0);
                let outcome =
                    lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        match swallowed {
                            false => take_one_around(c, end),
                            true => Ok(take_one_around(c, end).unwrap_or(0)),
                        }
                    });
                let case = format!("{session}, {end}, swallowed {swallowed}");
                assert!(
                    matches!(outcome, Err(Error::ReadOnly)),
                    "{case}: {outcome:?}"
                );
                assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}");
                expected -= committed;
                assert_eq!(stock(&mut db.conn()), expected, "{case}");
            }
        }
    }
}

/// lockkit's own writes outside a transaction on such a session: the move of
/// a row past a number that a rolled-back write left with a struct, made again
/// once the retried transaction's rollback undid it (see `combined.rs`, "a
/// fresh read in a retried transaction"). Refused in autocommit, every attempt
/// would read the other's number again and be stale.
#[test]
fn a_fresh_read_retried_after_a_rollback_writes_on_a_read_only_session() {
    let (db, mut conn) = guarded("ro_session_redo");
    // This process's write of version 1 rolls back...
    let mut held: Item = items::table.find(1).first(&mut conn).unwrap();
    let rolled_back = lockkit::locked_transaction(&mut conn, LockOptions::default(), |c| {
        held.stock = 9;
        held.update_versioned(c)?;
        Err::<(), _>(Error::NoRowMatched)
    });
    assert!(matches!(rolled_back, Err(Error::NoRowMatched)));
    // ... and another instance commits its own version 1.
    exec(
        &mut db.conn(),
        "UPDATE items SET stock = 7, lock_version = 1 WHERE id = 1",
    );
    let sold = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
        let mut item: Item = items::table.find(1).first(c)?;
        item.stock -= 1;
        item.update_versioned(c)?;
        Ok::<_, Error>(item.stock)
    });
    assert!(matches!(sold, Ok(6)), "{sold:?}");
    assert_eq!(stock(&mut db.conn()), 6);
}

/// The baseline: on a session that is not read-only, the same work's second
/// write runs in autocommit and commits on its own, and the call reports
/// success for work of which only half committed.
#[test]
fn on_a_read_write_session_the_write_after_the_end_commits_on_its_own() {
    let db = TestDb::<MysqlConnection>::new("rw_session_end");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = db.connect();
    let outcome = with_lock_on_1(&mut conn, |c| take_one_around(c, "ROLLBACK"));
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(
        stock(&mut db.conn()),
        9,
        "two writes reported, one committed (the second, in autocommit)"
    );
}

/// The same on diesel-async's MySQL connection: its lockkit transactions begin
/// read-write too, and a transaction the server ended is run again.
#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

    async fn read_only(db: &TestDb<MysqlConnection>) -> AsyncMysqlConnection {
        let mut conn = AsyncMysqlConnection::establish(&db.url).await.unwrap();
        lockkit::asynchronous::read_only_outside_transactions(&mut conn)
            .await
            .unwrap();
        conn
    }

    async fn take_one(conn: &mut AsyncMysqlConnection) -> Result<usize, Error> {
        Ok(diesel::update(items::table.find(1))
            .set(items::stock.eq(items::stock - 1))
            .execute(conn)
            .await?)
    }

    #[tokio::test]
    async fn lockkits_async_transactions_write_on_a_read_only_session() {
        let db = TestDb::<MysqlConnection>::new("ro_session_async_writes");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = read_only(&db).await;
        let policy = RetryPolicy::immediate(3);
        lockkit::asynchronous::transaction_with_retry(&mut conn, &policy, async |c| {
            take_one(c).await
        })
        .await
        .unwrap();
        lockkit::asynchronous::with_lock(
            &mut conn,
            1,
            LockOptions::default(),
            async |c, _: Item| take_one(c).await,
        )
        .await
        .unwrap();
        lockkit::asynchronous::serializable(&mut conn, &policy, async |c| take_one(c).await)
            .await
            .unwrap();
        assert_eq!(stock(&mut db.conn()), 7);
        assert!(matches!(take_one(&mut conn).await, Err(Error::ReadOnly)));
    }

    /// As `a_fresh_read_retried_after_a_rollback_writes_on_a_read_only_session`.
    #[tokio::test]
    async fn a_fresh_read_retried_after_a_rollback_writes_on_async() {
        use lockkit::asynchronous::AsyncVersioned;
        let db = TestDb::<MysqlConnection>::new("ro_session_async_redo");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = read_only(&db).await;
        let mut held: Item = items::table.find(1).first(&mut conn).await.unwrap();
        let rolled_back = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |c| {
                held.stock = 9;
                AsyncVersioned::update_versioned(&mut held, c).await?;
                Err::<(), _>(Error::NoRowMatched)
            },
        )
        .await;
        assert!(
            matches!(rolled_back, Err(Error::NoRowMatched)),
            "{rolled_back:?}"
        );
        exec(
            &mut db.conn(),
            "UPDATE items SET stock = 7, lock_version = 1 WHERE id = 1",
        );
        let sold = lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &RetryPolicy::immediate(3),
            async |c| {
                let mut item: Item = items::table.find(1).first(c).await?;
                item.stock -= 1;
                AsyncVersioned::update_versioned(&mut item, c).await?;
                Ok::<_, Error>(item.stock)
            },
        )
        .await;
        assert!(matches!(sold, Ok(6)), "{sold:?}");
    }

    #[tokio::test]
    async fn a_transaction_the_server_ended_is_run_again_on_async() {
        let db = TestDb::<MysqlConnection>::new("ro_session_async_end");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = read_only(&db).await;
        let runs = AtomicU32::new(0);
        lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &RetryPolicy::immediate(3),
            async |c| {
                take_one(c).await?;
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    c.batch_execute("ROLLBACK").await?;
                }
                take_one(c).await
            },
        )
        .await
        .unwrap();
        assert_eq!(AtomicU32::load(&runs, Ordering::SeqCst), 2);
        assert_eq!(stock(&mut db.conn()), 8);
    }

    /// As `work_that_committed_itself_last_is_run_once`.
    #[tokio::test]
    async fn work_that_committed_itself_last_is_run_once_on_async() {
        let db = TestDb::<MysqlConnection>::new("ro_session_async_commit_last");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = read_only(&db).await;
        let runs = AtomicU32::new(0);
        let outcome = lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &RetryPolicy::immediate(3),
            async |c| {
                runs.fetch_add(1, Ordering::SeqCst);
                take_one(c).await?;
                c.batch_execute("COMMIT").await?;
                Ok::<_, Error>(())
            },
        )
        .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(AtomicU32::load(&runs, Ordering::SeqCst), 1);
        assert_eq!(stock(&mut db.conn()), 9);
    }

    /// As `a_transaction_the_server_ended_after_its_last_write_is_run_again`.
    #[tokio::test]
    async fn a_transaction_the_server_ended_after_its_last_write_is_run_again_on_async() {
        let db = TestDb::<MysqlConnection>::new("ro_session_async_end_last");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn = read_only(&db).await;
        let runs = AtomicU32::new(0);
        let policy = RetryPolicy::immediate(3);
        lockkit::asynchronous::transaction_with_retry(&mut conn, &policy, async |c| {
            let sold = take_one(c).await?;
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                c.batch_execute("ROLLBACK").await?;
            }
            Ok::<_, Error>(sold)
        })
        .await
        .unwrap();
        assert_eq!(runs.swap(0, Ordering::SeqCst), 2);
        assert_eq!(stock(&mut db.conn()), 9);

        // `with_lock` reports the end as the retryable `Deadlock` a retry
        // takes up; the rerun sells once.
        for expected in [Err(()), Ok(1)] {
            let outcome = lockkit::asynchronous::with_lock(
                &mut conn,
                1,
                LockOptions::default(),
                async |c, _: Item| {
                    let sold = take_one(c).await?;
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        c.batch_execute("ROLLBACK").await?;
                    }
                    Ok::<_, Error>(sold)
                },
            )
            .await;
            match expected {
                Ok(sold) => assert_eq!(outcome.unwrap(), sold),
                Err(()) => assert!(matches!(outcome, Err(Error::Deadlock)), "{outcome:?}"),
            }
        }
        assert_eq!(AtomicU32::load(&runs, Ordering::SeqCst), 2);
        assert_eq!(stock(&mut db.conn()), 8);
    }

    /// As `on_a_session_not_known_read_only_a_refusal_fails_the_call_once`
    /// and `a_write_refused_after_the_work_committed_itself_is_not_run_again`:
    /// on a session made read-only in SQL (not known), and on one made so
    /// through lockkit after a `COMMIT` of the work's, the refusal fails the
    /// call as `ReadOnly`, run once, also where the work let it go.
    #[tokio::test]
    async fn a_refusal_that_may_follow_a_commit_fails_once_on_async() {
        let db = TestDb::<MysqlConnection>::new("ro_session_async_commit");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut expected = 10;
        for known in [false, true] {
            for swallowed in [false, true] {
                let mut conn = match known {
                    true => read_only(&db).await,
                    false => {
                        let mut conn = AsyncMysqlConnection::establish(&db.url).await.unwrap();
                        conn.batch_execute("SET SESSION TRANSACTION READ ONLY")
                            .await
                            .unwrap();
                        conn
                    }
                };
                let runs = AtomicU32::new(0);
                let outcome = lockkit::asynchronous::transaction_with_retry(
                    &mut conn,
                    &RetryPolicy::immediate(3),
                    async |c| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        take_one(c).await?;
                        c.batch_execute("COMMIT").await?;
                        match (take_one(c).await, swallowed) {
                            (Err(_), true) => Ok(0),
                            (outcome, _) => outcome,
                        }
                    },
                )
                .await;
                let case = format!("known {known}, swallowed {swallowed}");
                assert!(
                    matches!(outcome, Err(Error::ReadOnly)),
                    "{case}: {outcome:?}"
                );
                assert_eq!(AtomicU32::load(&runs, Ordering::SeqCst), 1, "{case}");
                expected -= 1;
                assert_eq!(stock(&mut db.conn()), expected, "{case}");
            }
        }
    }
}
