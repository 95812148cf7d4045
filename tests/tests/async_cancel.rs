//! Cancellation: a `with_lock` future dropped before it finishes (a client
//! went away, `tokio::time::timeout` fired) must not hand a pooled connection
//! to the next user inside an open transaction, or leave its row locked.
//!
//! Each case drops the future at some point, then asks the pool for a
//! connection (the pool holds one, so the next user gets that one or its
//! replacement) and checks, on the server, that it has no transaction; and
//! checks that another connection can lock the row at once (`NOWAIT`; on
//! SQLite, `BEGIN IMMEDIATE` without waiting). A connection held without a
//! pool shows what the pool prevents: after the drop it is still inside the
//! abandoned transaction, holding the row.
//!
//! A dropped call that changed a session setting (its lock timeout on SQLite
//! and MySQL/MariaDB) does not hand the next user its setting either.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_common::{in_transaction, lock_timeout, seeded, RowHolder};
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::{AsyncConnection, RunQueryDsl};
use lockkit::asynchronous::lock_waits;
use lockkit::asynchronous::AsyncLockingConnection;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;
use lockkit_tests::schema::items;
use lockkit_tests::seed_items;

/// Whether another connection gets a lock on the row without waiting: a
/// shared one, which conflicts with the exclusive lock of `with_lock` and,
/// being a read, leaves the version alone.
async fn row_is_free<A: AsyncLockingConnection>(conn: &mut A) -> bool
where
    Item: lockkit::asynchronous::lockable::AsyncLockRow<A>,
{
    let opts = LockOptions::default().share().nowait();
    match lockkit::asynchronous::with_lock(conn, 1, opts, async |_conn, _item: Item| {
        Ok::<_, Error>(())
    })
    .await
    {
        Ok(()) => true,
        Err(Error::Busy) => false,
        Err(other) => panic!("locking the row: {other}"),
    }
}

/// Waits until the row is free; how long that took.
async fn row_freed<A: AsyncLockingConnection>(conn: &mut A) -> Duration
where
    Item: lockkit::asynchronous::lockable::AsyncLockRow<A>,
{
    async_common::freed("the row", async || row_is_free(conn).await).await
}

/// The server's own word that this session (on `backend`) has no open
/// transaction.
async fn server_says_no_transaction<A>(conn: &mut A, backend: &str) -> bool
where
    A: AsyncConnection,
    for<'q> diesel::query_builder::SqlQuery: diesel_async::methods::LoadQuery<'q, A, Open>,
{
    match backend {
        // PostgreSQL refuses a SAVEPOINT outside a transaction block.
        "postgres" => conn.batch_execute("SAVEPOINT probe").await.is_err(),
        "mysql" => {
            diesel::sql_query("SELECT CAST(@@in_transaction AS SIGNED) AS open")
                .get_result::<Open>(conn)
                .await
                .unwrap()
                .open
                == 0
        }
        // SQLite refuses a BEGIN inside a transaction.
        _ => conn.batch_execute("BEGIN; ROLLBACK;").await.is_ok(),
    }
}

/// What a dropped call leaves: the pool hands the next user (`next`) a
/// connection with no transaction open, on diesel-async's books and on the
/// server, and the row is free again for `other`; how long that took.
async fn assert_left_clean<A>(next: &mut A, other: &mut A, backend: &str, context: &str) -> Duration
where
    A: AsyncLockingConnection,
    Item: lockkit::asynchronous::lockable::AsyncLockRow<A>,
    for<'q> diesel::query_builder::SqlQuery: diesel_async::methods::LoadQuery<'q, A, Open>,
{
    assert!(!in_transaction(next), "{context}");
    assert!(
        server_says_no_transaction(next, backend).await,
        "{context}: the next user is inside a transaction"
    );
    row_freed(other).await
}

/// Polls `fut` once with a waker that does nothing: how far a future gets
/// before a caller that gives up (a `select!`, a timeout) drops it.
fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    fut.poll(&mut cx)
}

#[derive(diesel::QueryableByName)]
struct Open {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    open: i64,
}

/// `with_lock` on item 1 (with `options`, the default ones when omitted) that
/// decrements its stock, then waits `linger` inside the lock (or runs the
/// block after `then` there).
macro_rules! decrement {
    ($conn:expr, $options:expr, then $then:block) => {
        lockkit::asynchronous::with_lock($conn, 1, $options, async |conn, item: Item| {
            diesel::update(items::table.find(item.id))
                .set(items::stock.eq(item.stock - 1))
                .execute(conn)
                .await?;
            $then
            Ok::<_, Error>(())
        })
    };
    ($conn:expr, $linger:expr) => {
        decrement!($conn, LockOptions::default(), $linger)
    };
    ($conn:expr, $options:expr, $linger:expr) => {
        decrement!($conn, $options, then {
            if let Some(linger) = $linger {
                tokio::time::sleep(linger).await;
            }
        })
    };
}

/// [`decrement!`] on `$conn` that lingers an hour inside the lock, dropped
/// once its work has decremented (as a timeout firing there would), however
/// long it took to get there: its transaction stays open on the server,
/// holding the row.
macro_rules! drop_a_decrement_in_its_work {
    ($conn:expr) => {{
        let decremented = tokio::sync::Notify::new();
        let call = decrement!($conn, LockOptions::default(), then {
            decremented.notify_one();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        async_common::drop_once_reached(&decremented, call, "inside the closure").await
    }};
}

/// The caller's own sale of one unit of item `$id` on `$conn`, in the work's
/// error type.
macro_rules! sell_one {
    ($conn:expr, $id:expr) => {
        diesel::update(items::table.find($id))
            .set(items::stock.eq(items::stock - 1))
            .execute($conn)
            .await
            .map(drop)
    };
}

/// A nested [`decrement!`] of item 1 that lingers 5 s inside its lock, given
/// up on after 100 ms ("try item 1 for 100 ms").
macro_rules! give_up_on_item_1 {
    ($conn:expr) => {{
        let tried = tokio::time::timeout(
            Duration::from_millis(100),
            decrement!($conn, Some(Duration::from_secs(5))),
        )
        .await;
        assert!(tried.is_err(), "the nested call was given up on");
    }};
}

/// `locked_transaction` on `$conn` whose work sells one of item 2, then ends
/// with `$then`, where `$inner` names the transaction's connection.
macro_rules! sell_2_then {
    ($conn:expr, |$inner:ident| $then:expr) => {
        lockkit::asynchronous::locked_transaction(
            $conn,
            LockOptions::default(),
            async |$inner: &mut Async| {
                sell_one!(&mut *$inner, 2)?;
                $then
            },
        )
    };
}

/// [`sell_2_then!`] whose work gives up on a nested call
/// ([`give_up_on_item_1!`]) before it ends with `$then`.
macro_rules! sell_2_then_give_up_on_1 {
    ($conn:expr, |$inner:ident| $then:expr) => {
        sell_2_then!($conn, |$inner| {
            give_up_on_item_1!(&mut *$inner);
            $then
        })
    };
}

/// Items 1 to 3 with 10 each, and [`sell_2_then_give_up_on_1!`] whose work
/// then sells one of item 3 with `$then`: the call must say `Ok`, with items 2
/// and 3 sold and item 1 not, and leave its connection out of any transaction.
macro_rules! sells_2_and_3_after_the_drop {
    ($db:expr, |$inner:ident| $then:expr) => {{
        seed_items(&mut $db.conn(), &[(1, 10), (2, 10), (3, 10)]);
        let mut conn: Async = async_common::connect(&$db.url, BACKEND).await;
        let outcome = sell_2_then_give_up_on_1!(&mut conn, |$inner| $then).await;
        let mut other: Async = async_common::connect(&$db.url, BACKEND).await;
        let stocks = stocks!(&mut other);
        assert!(
            outcome.is_ok() && stocks == [10, 9, 9],
            "locked_transaction returned {outcome:?}; stocks {stocks:?}"
        );
        assert!(!in_transaction(&mut conn) && server_says_no_transaction(&mut conn, BACKEND).await);
    }};
}

/// Returns once the server shows session `$id` in a statement that waits
/// for another session's row lock, a statement like `$statement` (an SQL
/// `LIKE` pattern), as `$watcher`, a connection of another session, sees it;
/// fails the test after 10 s. PostgreSQL reports the lock wait itself.
/// MariaDB's processlist shows a statement waiting for a row lock in the state
/// of the step that reads the row (`Statistics` for a key lookup, `Updating`),
/// so there the look is for the statement executing (not being prepared):
/// with the row held, it waits or is about to. InnoDB's own views of lock
/// waits do not serve: they are a copy refreshed only after 100 ms without a
/// read, which tests polling at once can keep stale for as long as they poll.
macro_rules! until_waiting {
    ($watcher:expr, $backend:expr, $id:expr, $statement:literal) => {
        match $backend {
            "postgres" => until_counted!(
                $watcher,
                "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                $id,
                "a wait for a lock"
            ),
            _ => until_counted!(
                $watcher,
                concat!(
                    "SELECT COUNT(*) AS n FROM information_schema.processlist \
                     WHERE id = ? AND command IN ('Query', 'Execute') AND info LIKE '",
                    $statement,
                    "'"
                ),
                $id,
                "a wait for a lock"
            ),
        }
    };
}

/// Items 1 and 2 at stock 10; on a pooled connection, your own
/// transaction that sells one of item 2, then runs `$then` (`$conn` its
/// connection) and returns `Ok`. The connection, given back, is left clean
/// (no transaction, no lock). Evaluates to the pool, another connection, the
/// transaction's outcome and item 2's stock.
macro_rules! around_item_2s_sale {
    ($db:expr, |$conn:ident| $then:block) => {{
        seed_items(&mut $db.conn(), &[(1, 10), (2, 10)]);
        let pool = async_common::bb8_pool::<Async>(&$db.url, BACKEND, 1).await;
        let mut other: Async = async_common::connect(&$db.url, BACKEND).await;
        let mut conn = pool.get().await.unwrap();
        let outcome = (*conn)
            .transaction(async |$conn| {
                sell_one!(&mut *$conn, 2)?;
                $then
                Ok::<_, Error>(())
            })
            .await;
        drop(conn);
        assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, "after the transaction").await;
        let sold: i32 = items::table.find(2).select(items::stock).first(&mut other).await.unwrap();
        (pool, other, outcome, sold)
    }};
}

async_backend_tests! {
    async fn a_held_connection_refuses_the_next_transaction_instead_of_nesting_it(db) {
        // The hazard the pool's check removes, shown: no pool discards the
        // connection, which is still inside the abandoned transaction. Its
        // next transaction must fail, not become a savepoint of the abandoned
        // one whose commit commits nothing.
        seed_items(&mut db.conn(), &[(1, 1_000), (2, 10)]);
        let mut held: Async = async_common::connect(&db.url, BACKEND).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        drop_a_decrement_in_its_work!(&mut held);
        assert!(!row_is_free(&mut other).await, "the abandoned transaction still holds the row");
        let next = held
            .transaction(async |conn| sell_one!(conn, 2).map_err(Error::from))
            .await;
        let again = decrement!(&mut held, None).await;
        drop(held);
        row_freed(&mut other).await;
        let sold: i32 = items::table.find(2).select(items::stock).first(&mut other).await.unwrap();
        assert!(
            matches!(next, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) && sold == 10,
            "the next transaction returned {next:?}, and item 2's stock is {sold}"
        );
        assert!(
            matches!(again, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))),
            "a lockkit call on the held connection returned {again:?}"
        );
        assert_eq!(stock!(&mut other), 1_000, "the abandoned decrement was rolled back");
    }

    async fn a_held_connection_refuses_a_versioned_write_or_update_if_after_a_dropped_call(db) {
        // As above, with the writes that open no transaction of their own: a
        // versioned write and `update_if` would run inside the abandoned
        // transaction, answer `Ok`, and go with it. The versioned struct would
        // then hold a number nobody committed, and match another writer's
        // later commit of it.
        seed_items(&mut db.conn(), &[(1, 1_000), (2, 10)]);
        let mut held: Async = async_common::connect(&db.url, BACKEND).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let mut item: Item = items::table.find(2).first(&mut held).await.unwrap();
        drop_a_decrement_in_its_work!(&mut held);
        item.stock = 5;
        let written = lockkit::asynchronous::AsyncVersioned::update_versioned(&mut item, &mut held).await;
        let sell = lockkit::asynchronous::atomic::update_if(
            &mut held,
            diesel::update(items::table.find(2)).set(items::stock.eq(items::stock - 1)),
        )
        .await;
        drop(held);
        row_freed(&mut other).await;
        let broken = |outcome: Result<(), &Error>| {
            matches!(outcome, Err(Error::Database(diesel::result::Error::BrokenTransactionManager)))
        };
        assert!(broken(written.as_ref().map(drop)), "the versioned write returned {written:?}");
        assert!(broken(sell.as_ref().map(drop)), "update_if returned {sell:?}");
        let stored: Item = items::table.find(2).first(&mut other).await.unwrap();
        assert_eq!((stored.stock, stored.lock_version), (10, 0));
    }

    async fn your_own_transaction_around_a_dropped_call_fails_instead_of_committing_nothing(db) {
        // A lockkit call given up on inside diesel-async's own `transaction`
        // leaves its savepoint open. The transaction's commit must not
        // release that savepoint only and return Ok, with the transaction
        // still open and item 2's sale lost with the connection.
        let (pool, mut other, outcome, sold) = around_item_2s_sale!(db, |conn| {
            give_up_on_item_1!(conn);
        });
        assert!(
            matches!(outcome, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) && sold == 10,
            "the transaction returned {outcome:?}, and item 2's stock is {sold}"
        );
        assert_eq!(stock!(&mut other), 10, "the dropped call's work is rolled back");
        // The pool works on.
        decrement!(&mut *pool.get().await.unwrap(), None).await.unwrap();
        assert_eq!(stock!(&mut other), 9);
    }

    async fn a_call_whose_work_panics_inside_your_transaction_rolls_back_its_own_level_only(db) {
        // The blocking side's panic guard, on diesel-async: a lockkit call
        // whose work panics rolls back its own level (item 1's decrement),
        // and the panic goes on. Your transaction, which caught it, commits
        // its own work (item 2's sale): no level of the call is left for its
        // commit to release in place of the transaction's.
        let (_pool, mut other, outcome, sold) = around_item_2s_sale!(db, |conn| {
            let panicked = async_common::caught_panic(decrement!(&mut *conn, LockOptions::default(), then {
                if std::hint::black_box(true) {
                    panic!("a bug in the work");
                }
            }))
            .await;
            assert!(panicked.is_err(), "the panic went on");
        });
        assert!(outcome.is_ok() && sold == 9, "the transaction returned {outcome:?}, and item 2's stock is {sold}");
        assert_eq!(stock!(&mut other), 10, "the panicking call's work is rolled back");
    }

    async fn a_call_whose_work_panics_on_a_held_connection_leaves_no_transaction_open(db) {
        // Outermost, on a connection held without a pool (one writer that
        // catches each job's panic): the call's transaction is rolled back,
        // and the next job's work commits, not nests in it.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut held: Async = async_common::connect(&db.url, BACKEND).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let panicked = async_common::caught_panic(decrement!(&mut held, LockOptions::default(), then {
            if std::hint::black_box(true) {
                panic!("a bug in the job");
            }
        }))
        .await;
        assert!(panicked.is_err(), "the panic went on");
        assert!(!in_transaction(&mut held), "the call's transaction is still open");
        decrement!(&mut held, None).await.unwrap();
        assert_eq!(stock!(&mut other), 9, "the next job's decrement committed");
        // The same for `locked_transaction`.
        let panicked = async_common::caught_panic(lockkit::asynchronous::locked_transaction(
            &mut held,
            LockOptions::default(),
            async |conn: &mut Async| -> Result<(), Error> {
                sell_one!(&mut *conn, 1)?;
                if std::hint::black_box(true) {
                    panic!("a bug in the job");
                }
                Ok(())
            },
        ))
        .await;
        assert!(panicked.is_err(), "the panic went on");
        assert!(!in_transaction(&mut held), "locked_transaction's transaction is still open");
        assert_eq!(stock!(&mut other), 9, "the panicking work's sale rolled back");
        // The same for a retried transaction's attempt.
        let policy = lockkit::RetryPolicy::immediate(3);
        let panicked = async_common::caught_panic(lockkit::asynchronous::transaction_with_retry(
            &mut held,
            &policy,
            async |conn: &mut Async| -> Result<(), Error> {
                sell_one!(&mut *conn, 1)?;
                panic!("a bug in the job");
            },
        ))
        .await;
        assert!(panicked.is_err(), "the panic went on");
        assert!(!in_transaction(&mut held), "the attempt's transaction is still open");
        decrement!(&mut held, None).await.unwrap();
        assert_eq!(stock!(&mut other), 8, "the panicking attempt's sale rolled back, the next decrement committed");
    }

    async fn bb8_discards_a_connection_dropped_inside_with_lock(db) {
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        for linger in [Duration::from_millis(100), Duration::from_secs(3600)] {
            let mut conn = pool.get().await.unwrap();
            let dropped = tokio::time::timeout(Duration::from_millis(50), decrement!(&mut *conn, Some(linger))).await;
            assert!(dropped.is_err());
            drop(conn);
            assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, "after the drop").await;
        }
        assert_eq!(stock!(&mut other), 1_000, "both decrements were rolled back");
        // The pool works on: a decrement through it commits.
        decrement!(&mut *pool.get().await.unwrap(), None).await.unwrap();
        assert_eq!(stock!(&mut other), 999);
    }

    async fn deadpool_discards_a_connection_dropped_inside_with_lock(db) {
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::deadpool_pool::<Async>(&db.url, BACKEND, 1);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let mut conn = pool.get().await.unwrap();
        let dropped = tokio::time::timeout(Duration::from_millis(50), decrement!(&mut *conn, Some(Duration::from_secs(3600)))).await;
        assert!(dropped.is_err());
        drop(conn);
        assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, "after the drop").await;
        assert_eq!(stock!(&mut other), 1_000);
    }

    async fn a_future_dropped_while_waiting_for_the_lock_leaves_nothing_behind(db) {
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        // `holder` takes the row's lock and keeps it until told.
        let holder = RowHolder::lock(async_common::connect::<Async>(&db.url, BACKEND).await).await;
        let mut conn = pool.get().await.unwrap();
        // Dropped in the locked read (PostgreSQL, MariaDB), once the server
        // shows it waiting for `holder`, or in `BEGIN IMMEDIATE` (SQLite), 200
        // ms into its wait for the file's write lock (no server to ask).
        use async_common::ServerSession;
        match conn.server_session().await {
            Some(session) => tokio::select! {
                () = async { until_waiting!(&mut other, BACKEND, session, "%FOR UPDATE%") } => {}
                tried = decrement!(&mut *conn, None) => panic!("the call returned {tried:?} before it waited"),
            },
            None => {
                let dropped = tokio::time::timeout(Duration::from_millis(200), decrement!(&mut *conn, None)).await;
                assert!(dropped.is_err(), "the call waited for the lock");
            }
        }
        drop(conn);
        holder.release().await;
        assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, "after the drop").await;
        assert_eq!(stock!(&mut other), 1_000, "the dropped call wrote nothing");
    }

    async fn dropped_at_every_point_the_next_user_is_clean_and_no_decrement_is_half_done(db) {
        // A sweep of deadlines over the whole call: BEGIN, the locked read, the
        // version bump, the closure's UPDATE, its 2 ms linger before COMMIT,
        // COMMIT, and after. The linger makes the first deadlines drop the call
        // on any machine (on an idle one a bare call once beat them all), and the
        // last step's 10 s lets it finish on a loaded one.
        seed_items(&mut db.conn(), &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let (mut finished, mut dropped, mut slowest) = (0, 0, Duration::ZERO);
        let linger = Some(Duration::from_millis(2));
        for step in 0..=60u64 {
            let deadline = match step {
                60 => Duration::from_secs(10),
                _ => Duration::from_micros(step * 150),
            };
            let mut conn = pool.get().await.unwrap();
            match tokio::time::timeout(deadline, decrement!(&mut *conn, linger)).await {
                Ok(done) => {
                    done.unwrap();
                    finished += 1;
                }
                Err(_) => dropped += 1,
            }
            drop(conn);
            let freed = assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, &format!("step {step}")).await;
            slowest = slowest.max(freed);
        }
        let stock = stock!(&mut other);
        // A call dropped after its COMMIT was sent may have committed; none
        // can have committed half (the stock and the version move together,
        // except that a dropped call's rolled-back version number is never
        // committed: the next call skips it).
        let version: i32 = items::table.find(1).select(items::lock_version).get_result(&mut other).await.unwrap();
        assert!(
            (1_000 - stock..=1_000 - stock + dropped).contains(&version),
            "stock and version moved together: version {version}, {} decrements, {dropped} dropped",
            1_000 - stock
        );
        assert!(
            (1_000 - finished - dropped..=1_000 - finished).contains(&stock),
            "stock {stock} after {finished} finished and {dropped} dropped calls"
        );
        assert!(finished > 0 && dropped > 0, "the sweep covers both: {finished} finished, {dropped} dropped");
        eprintln!("{BACKEND}: {finished} finished, {dropped} dropped; the row was free again within {slowest:?}");
    }

    async fn an_outer_call_whose_nested_call_was_dropped_commits_its_own_work_only(db) {
        // A nested call given up on (`tokio::time::timeout` around it: "try
        // item 1 for 100 ms, else sell without it") while the caller's own
        // lockkit transaction goes on: its savepoint is left on diesel-async's
        // books. The outer call's end rolls it back and commits its own work,
        // instead of taking that level for its own (releasing the savepoint
        // and reporting Ok with nothing committed).
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = sell_2_then_give_up_on_1!(&mut conn, |_conn| Ok::<_, Error>(())).await;
        let open = in_transaction(&mut conn);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let sold: i32 = items::table.find(2).select(items::stock).first(&mut other).await.unwrap();
        assert!(
            outcome.is_ok() && sold == 9 && !open,
            "locked_transaction returned {outcome:?}; item 2's sale committed: {}; the \
             connection is still in a transaction: {open}",
            sold == 9
        );
        assert!(server_says_no_transaction(&mut conn, BACKEND).await);
        let (stock, version): (i32, i32) = items::table
            .find(1)
            .select((items::stock, items::lock_version))
            .first(&mut other)
            .await
            .unwrap();
        assert_eq!((stock, version), (10, 0), "the dropped call's work is rolled back");
        assert!(row_is_free(&mut other).await, "and its row lock gone");
    }

    async fn a_nested_call_tried_again_after_a_drop_keeps_its_work(db) {
        // "Try item 1 for 100 ms, then once more": the second call must not
        // run inside the savepoint the first one left, which the outer call
        // rolls back at its end, its decrement with it, under an Ok.
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = sell_2_then_give_up_on_1!(&mut conn, |conn| decrement!(conn, None).await).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let stocks = stocks!(&mut other);
        assert!(
            outcome.is_ok() && stocks == [9, 9],
            "locked_transaction returned {outcome:?}; stocks {stocks:?}"
        );
        assert!(!in_transaction(&mut conn) && server_says_no_transaction(&mut conn, BACKEND).await);
    }

    async fn work_after_a_dropped_nested_call_is_never_rolled_back_under_an_ok(db) {
        // "Try item 1 for 100 ms, else sell item 3 instead": the sale of item 3
        // runs after the nested call was given up on, inside the savepoint
        // that call left open. The outer call must not roll that savepoint
        // back with the sale in it and then commit and say Ok.
        seed_items(&mut db.conn(), &[(1, 10), (2, 10), (3, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outcome = sell_2_then_give_up_on_1!(&mut conn, |conn| sell_one!(conn, 3).map_err(Error::from)).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let stocks = stocks!(&mut other);
        assert!(
            matches!(outcome, Err(Error::NestedCallDropped)) && stocks == [10, 10, 10],
            "locked_transaction returned {outcome:?}; stocks {stocks:?}"
        );
        assert!(!in_transaction(&mut conn) && server_says_no_transaction(&mut conn, BACKEND).await);
        assert!(row_is_free(&mut other).await, "and the dropped call's row lock is gone");
    }

    async fn a_versioned_write_after_a_dropped_nested_call_keeps_its_work(db) {
        // "Try item 1 for 100 ms, else sell item 3 with a versioned write": the
        // write opens no level of its own, yet must not run inside the
        // savepoint the given-up call left, as a lockkit call that begins
        // there does not.
        use lockkit::asynchronous::prelude::*;
        sells_2_and_3_after_the_drop!(db, |conn| {
            Item::update_by_version(conn, 3, 0, items::stock.eq(9)).await.map(drop)
        });
    }

    async fn a_lock_all_after_a_dropped_nested_call_keeps_its_work(db) {
        // The same with `lock_all`, which locks in the caller's transaction.
        sells_2_and_3_after_the_drop!(db, |conn| {
            let locked: Vec<Item> = lockkit::asynchronous::lock_all(&mut *conn, &[3]).await?;
            assert_eq!(locked.len(), 1);
            sell_one!(conn, 3).map_err(Error::from)
        });
    }

    async fn a_queue_claim_after_a_dropped_nested_call_keeps_its_work(db) {
        // The same with `queue::claim`, which claims in the caller's transaction.
        sells_2_and_3_after_the_drop!(db, |conn| {
            let due = items::table.filter(items::id.eq(3)).order(items::id);
            let claimed: Vec<Item> = lockkit::asynchronous::queue::claim(&mut *conn, due, 1).await?;
            assert_eq!(claimed.len(), 1);
            sell_one!(conn, 3).map_err(Error::from)
        });
    }

    async fn an_outbox_write_after_a_dropped_nested_call_keeps_its_work(db) {
        // The same with an outbox message, written in the caller's transaction.
        use diesel_migrations::MigrationHarness;
        db.conn().run_pending_migrations(lockkit_tests::outbox_migrations(BACKEND)).unwrap();
        sells_2_and_3_after_the_drop!(db, |conn| {
            lockkit::asynchronous::outbox::enqueue(&mut *conn, "sold", "item 3").await?;
            sell_one!(conn, 3).map_err(Error::from)
        });
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let unpublished: i64 = lockkit_tests::unpublished_count().get_result(&mut other).await.unwrap();
        assert_eq!(unpublished, 1, "the message committed with the sale");
    }
}

/// On the servers, where a write waits for another session's row lock.
mod waiting {
    use super::*;

    async_server_tests! {
    async fn a_nested_call_dropped_while_waiting_for_a_lock_is_rolled_back_in_step(db) {
        // The nested call is given up on while its locked read waits for the
        // holder's lock: its statement is still running on the server when
        // the enclosing call rolls its savepoint back. PostgreSQL answers the
        // rollback once that read is done (the holder lets go), in step, and
        // the enclosing call commits its own work. MySQL/MariaDB's client may
        // instead close the connection under a dropped statement, and the
        // enclosing call then fails. Either way its answer is the truth, the
        // dropped call's work is gone, and the pool's next user reads its own
        // replies.
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let holder = RowHolder::lock(async_common::connect::<Async>(&db.url, BACKEND).await).await;
        // The holder lets go only once the nested call has been given up on,
        // a while later, so that the enclosing call's rollback comes while
        // the dropped read still waits.
        let (given_up, release) =
            async_common::once_signalled(Duration::from_millis(800), holder.release());
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut conn = pool.get().await.unwrap();
        // The nested call is given up on once the server shows its locked read
        // waiting for the holder's lock, however long it took to get there.
        let session = lock_waits::session_id(&mut *conn).await.unwrap();
        let mut watcher: Async = async_common::connect(&db.url, BACKEND).await;
        let call = sell_2_then!(&mut *conn, |conn| {
            tokio::select! {
                () = async { until_waiting!(&mut watcher, BACKEND, session, "%FOR UPDATE%") } => {}
                tried = decrement!(conn, None) => panic!("the nested call returned {tried:?} before it waited"),
            }
            given_up.notify_one();
            Ok::<_, Error>(())
        });
        let outcome = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .expect("the enclosing call ended once the holder let go");
        drop(conn);
        given_up.notify_one(); // had the work failed before its nested call
        release.await.unwrap();
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, "after the call").await;
        let stocks = stocks!(&mut other);
        let committed = stocks == [10, 9];
        assert!(
            (outcome.is_ok() && committed) || (BACKEND == "mysql" && outcome.is_err() && stocks == [10, 10]),
            "locked_transaction returned {outcome:?}; stocks {stocks:?}"
        );
        // The pool works on.
        decrement!(&mut *pool.get().await.unwrap(), None).await.unwrap();
        assert_eq!(stock!(&mut other), 9);
    }

    async fn a_nested_call_dropped_at_every_point_never_makes_the_outer_answer_a_lie(db) {
        // A sweep of deadlines over a nested `with_lock` inside
        // `locked_transaction`, each step on the pool's one connection: its
        // BEGIN, locked read, version bump, UPDATE, RELEASE (a drop while that
        // is in flight leaves the savepoint's fate unknown) and after. Whatever
        // the step, the outer call's answer is the truth: Ok means its sale of
        // item 2 committed, with item 1's decrement exactly when the nested
        // call finished; an error means nothing committed. (On SQLite,
        // diesel-async refuses any access to a connection while a dropped
        // statement still runs on its blocking thread, the outer call's end
        // included; the servers only.)
        seed_items(&mut db.conn(), &[(1, 1_000), (2, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 1).await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let mut expected = vec![1_000, 1_000];
        let (mut finished, mut dropped, mut failed) = (0, 0, 0);
        for step in 0..=50u64 {
            let deadline = match step {
                50 => Duration::from_secs(10),
                _ => Duration::from_micros(step * 200),
            };
            let mut conn = pool.get().await.unwrap();
            let outcome = sell_2_then!(&mut *conn, |conn| {
                // Step 0 polls the nested call once, then drops it: a
                // drop whatever the timer's tick (on a loaded machine
                // every deadline below may come after the call's end).
                if step == 0 {
                    let nested = std::pin::pin!(decrement!(&mut *conn, None));
                    return Ok::<_, Error>(matches!(poll_once(nested), Poll::Ready(Ok(()))));
                }
                let tried = tokio::time::timeout(deadline, decrement!(conn, None)).await;
                Ok::<_, Error>(matches!(tried, Ok(Ok(()))))
            })
            .await;
            match outcome {
                Ok(nested) => {
                    expected[1] -= 1;
                    if nested {
                        expected[0] -= 1;
                        finished += 1;
                    } else {
                        dropped += 1;
                    }
                }
                Err(_) => failed += 1,
            }
            drop(conn);
            assert_left_clean(&mut *pool.get().await.unwrap(), &mut other, BACKEND, &format!("step {step}")).await;
            assert_eq!(stocks!(&mut other), expected, "step {step}: the outer call returned {outcome:?}");
        }
        assert!(finished > 0 && dropped + failed > 0, "{finished} finished, {dropped} dropped, {failed} failed");
        eprintln!("{BACKEND}: {finished} nested calls finished, {dropped} dropped under an outer Ok, {failed} outer calls failed");
    }

    async fn your_own_transaction_around_a_dropped_versioned_write_fails(db) {
        // lockkit's own savepoint, around a versioned write of several rows,
        // given up on while it waits for the lock another session holds on
        // item 1: the caller's transaction must not commit nothing and say Ok.
        use lockkit::asynchronous::prelude::*;
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let holder = RowHolder::lock(async_common::connect::<Async>(&db.url, BACKEND).await).await;
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let session = lock_waits::session_id(&mut conn).await.unwrap();
        let mut watcher: Async = async_common::connect(&db.url, BACKEND).await;
        let transaction = conn.transaction(async |conn| {
            sell_one!(&mut *conn, 2)?;
            tokio::select! {
                () = async { until_waiting!(&mut watcher, BACKEND, session, "UPDATE%") } => {}
                tried = Item::update_all_by_version(conn, &[(1, 0)], items::stock.eq(0)) => {
                    panic!("the write returned {tried:?} before it waited")
                }
            }
            Ok::<_, Error>(())
        });
        // A commit sent behind the dropped write would wait for the holder's
        // lock, which is released only after it.
        let outcome = async_common::ended_without_waiting_for(transaction, "write").await;
        drop(conn);
        holder.release().await;
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let sold: i32 = items::table.find(2).select(items::stock).first(&mut other).await.unwrap();
        assert!(
            matches!(outcome, Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) && sold == 10,
            "the transaction returned {outcome:?}, and item 2's stock is {sold}"
        );
        assert_eq!(stock!(&mut other), 10, "the dropped write wrote nothing");
    }
    }
}

/// `with_lock` on item 1 with a one-second lock timeout, decrementing its
/// stock, on a connection of `pool` that is dropped once `deadline` has passed,
/// with the call if it is still running: a client that went away.
macro_rules! decrement_dropped_after {
    ($pool:expr, $deadline:expr) => {{
        let mut conn = $pool.get().await.unwrap();
        let call = decrement!(
            &mut *conn,
            LockOptions::default().timeout(Duration::from_secs(1)),
            None
        );
        let _ = tokio::time::timeout($deadline, call).await;
    }};
}

#[cfg(feature = "sqlite")]
mod sqlite_only {
    use super::*;
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
    use diesel_async::RunQueryDsl;
    use lockkit_tests::TestDb;

    type Async = SyncConnectionWrapper<SqliteConnection>;

    /// A database `name` with item 1, a pool of one connection to it, and the
    /// suite's busy timeout, read off that connection.
    async fn pool_of_one(
        name: &str,
    ) -> (
        TestDb<SqliteConnection>,
        diesel_async::pooled_connection::bb8::Pool<Async>,
        i64,
    ) {
        let db = seeded::<SqliteConnection>(name, &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, "sqlite", 1).await;
        let session = lock_timeout(&mut pool.get().await.unwrap(), "sqlite").await;
        assert_eq!(session, 10_000, "the suite's busy timeout");
        (db, pool, session)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_dropped_with_lock_leaves_the_next_user_its_own_busy_timeout() {
        let (db, pool, session) = pool_of_one("dropped_busy_timeout").await;
        // Calls dropped at different points (tokio's timer fires on a
        // millisecond tick, so a zero or sub-millisecond deadline drops the call
        // at its first wait, or not at all): each is a client that went away.
        let mut left = None;
        for attempt in 0..400u64 {
            decrement_dropped_after!(pool, Duration::from_micros(attempt % 8 * 50));
            let now = lock_timeout(&mut pool.get().await.unwrap(), "sqlite").await;
            if now != session {
                left = Some((attempt, now));
                break;
            }
        }
        // The next user of the pool writes while another connection holds the
        // write lock for 3 s: with the session's 10 s it waits and writes.
        let holder =
            async_common::RowHolder::lock(async_common::connect::<Async>(&db.url, "sqlite").await)
                .await;
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            holder.release().await;
        });
        let mut next = pool.get().await.unwrap();
        let written = diesel::update(items::table.find(1))
            .set(items::stock.eq(items::stock + 100))
            .execute(&mut *next)
            .await;
        release.await.unwrap();
        assert!(
            written.is_ok() && left.is_none(),
            "a dropped with_lock left the pooled connection busy_timeout = {left:?} ms instead of \
             the session's {session} ms, and the pool's next user's write failed: {written:?}"
        );
    }

    /// `nowait()` without `timeout(..)` sets the busy timeout too (to 0, for
    /// the call's `BEGIN IMMEDIATE`): a call dropped between that setting and
    /// its transaction does not hand the pool's next user a connection that
    /// gives up on the write lock at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_dropped_nowait_with_lock_leaves_the_next_user_its_own_busy_timeout() {
        let (_db, pool, session) = pool_of_one("dropped_nowait_busy_timeout").await;
        let mut left = Vec::new();
        // Dropped after 1 to 6 polls, each letting the statement in flight
        // finish on its blocking thread: every point up to the transaction.
        for polls in (1..=6).cycle().take(24) {
            let mut conn = pool.get().await.unwrap();
            {
                let mut call = Box::pin(decrement!(
                    &mut *conn,
                    LockOptions::default().nowait(),
                    None
                ));
                for _ in 0..polls {
                    if poll_once(call.as_mut()).is_ready() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(conn);
            let mut next = pool.get().await.unwrap();
            let now = lock_timeout(&mut next, "sqlite").await;
            if now != session {
                left.push((polls, now));
                // The session's value back, for the next round.
                diesel_async::SimpleAsyncConnection::batch_execute(
                    &mut *next,
                    "PRAGMA busy_timeout = 10000",
                )
                .await
                .unwrap();
            }
        }
        assert!(
            left.is_empty(),
            "dropped nowait with_lock calls handed the pool's next user busy_timeout \
             (polls, ms) = {left:?} instead of the session's {session} ms"
        );
    }
}

/// MySQL/MariaDB: the lock wait timeout a dropped `with_lock` set before its
/// `BEGIN` is not the pool's next user's.
#[cfg(feature = "mysql")]
mod mysql_only {
    use super::*;
    use diesel::MysqlConnection;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::AsyncMysqlConnection;
    use lockkit::RetryPolicy;
    use lockkit_tests::{idempotency_migrations, lease_migrations, outbox_migrations, TestDb};

    /// A value whose bind always fails: diesel-async's MySQL connection then
    /// reports the statement begun and never its end, with nothing sent.
    #[derive(Debug)]
    struct Unbindable;

    impl diesel::serialize::ToSql<diesel::sql_types::Integer, diesel::mysql::Mysql> for Unbindable {
        fn to_sql<'b>(
            &'b self,
            _: &mut diesel::serialize::Output<'b, '_, diesel::mysql::Mysql>,
        ) -> diesel::serialize::Result {
            Err("this value cannot be bound".into())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_statement_that_fails_to_bind_leaves_the_connection_healthy() {
        // No future was dropped: the unanswered statement was never sent,
        // and lockkit must not take the connection for one out of step.
        let db = seeded::<MysqlConnection>("unbindable", &[(1, 10)]);
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |conn: &mut AsyncMysqlConnection| {
                sell_one!(&mut *conn, 1)?;
                diesel::sql_query("UPDATE items SET stock = ? WHERE id = 1")
                    .bind::<diesel::sql_types::Integer, _>(Unbindable)
                    .execute(conn)
                    .await?;
                Ok::<_, Error>(())
            },
        )
        .await;
        assert!(
            matches!(
                outcome,
                Err(Error::Database(diesel::result::Error::SerializationError(
                    _
                )))
            ),
            "{outcome:?}"
        );
        // The sale was rolled back, and the connection works on.
        decrement!(&mut conn, None).await.unwrap();
        assert_eq!(stock!(&mut conn), 9);
    }

    /// A nested call dropped while its lock wait timeout is in force marks
    /// the connection broken on purpose. When the server's transaction then
    /// ends under the outer call (a statement that commits implicitly, a
    /// deadlock), the outer call's repair after its failure must not hand the
    /// connection back healthy: the pool's next user would wait 1 s for row
    /// locks instead of its session's timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_repair_never_hands_on_a_connection_a_dropped_nested_call_broke() {
        use diesel_async::SimpleAsyncConnection;
        let (_db, pool, session) =
            one_connection_and_its_lock_wait("repair_after_dropped_nested").await;
        {
            let mut pooled = pool.get().await.unwrap();
            let outer = lockkit::asynchronous::locked_transaction(
                &mut *pooled,
                LockOptions::default(),
                async |conn: &mut AsyncMysqlConnection| {
                    let nested = lockkit::asynchronous::with_lock(
                        &mut *conn,
                        1,
                        LockOptions::default().timeout(Duration::from_secs(1)),
                        async |_conn, _item: Item| {
                            tokio::time::sleep(Duration::from_secs(3_600)).await;
                            Ok::<_, Error>(())
                        },
                    );
                    let dropped = tokio::time::timeout(Duration::from_millis(300), nested).await;
                    assert!(dropped.is_err(), "the nested call sleeps");
                    // The server's transaction ends under the outer call.
                    conn.batch_execute("COMMIT").await?;
                    Err::<(), _>(Error::NoRowMatched)
                },
            )
            .await;
            assert!(outer.is_err(), "{outer:?}");
        }
        let next = lock_timeout(&mut pool.get().await.unwrap(), "mysql").await;
        assert_eq!(
            next, session,
            "the pool's next user got innodb_lock_wait_timeout = {next} (its session had {session})"
        );
    }

    /// A database `name` with item 1 at 1,000 units, a pool of one connection
    /// to it, and that connection's session `innodb_lock_wait_timeout`, which
    /// differs from the 1 s the calls in these tests set.
    async fn one_connection_and_its_lock_wait(
        name: &str,
    ) -> (
        TestDb<MysqlConnection>,
        bb8::Pool<AsyncDieselConnectionManager<AsyncMysqlConnection>>,
        i64,
    ) {
        let db = seeded::<MysqlConnection>(name, &[(1, 1_000)]);
        let pool = async_common::bb8_pool::<AsyncMysqlConnection>(&db.url, "mysql", 1).await;
        let session = lock_timeout(&mut pool.get().await.unwrap(), "mysql").await;
        assert_ne!(
            session, 1,
            "the server's default differs from the call's 1 s"
        );
        (db, pool, session)
    }

    /// A statement that failed to bind reports its start and no end: the
    /// call's end then asks whether the replies are in step (a probe). The
    /// probe is not the work's statement: a nested call the work gave up on,
    /// with nothing run in its level since, is still rolled back in step, and
    /// the call commits the rest of its work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_probe_after_a_bind_error_leaves_a_given_up_nested_call_handed_on() {
        let db = seeded::<MysqlConnection>("probe_after_unbindable", &[(1, 10), (2, 10)]);
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |conn: &mut AsyncMysqlConnection| {
                let unbound = diesel::sql_query("UPDATE items SET stock = ? WHERE id = 2")
                    .bind::<diesel::sql_types::Integer, _>(Unbindable)
                    .execute(&mut *conn)
                    .await;
                assert!(unbound.is_err());
                sell_one!(&mut *conn, 2)?;
                give_up_on_item_1!(&mut *conn);
                Ok::<_, Error>(())
            },
        )
        .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        let stocks: Vec<i32> = diesel::RunQueryDsl::load(
            items::table.order(items::id).select(items::stock),
            &mut db.conn(),
        )
        .unwrap();
        assert_eq!(
            stocks,
            [10, 9],
            "item 2 sold, the given-up call's sale of item 1 rolled back"
        );
    }

    /// After a statement of the work's own cut short, the work goes on with a
    /// versioned write, which reads the cut-short statement's lock wait
    /// timeout as its own. The stand-in for an ended transaction would send
    /// `START TRANSACTION`, which commits what the open transaction holds
    /// (the versioned write itself, which the server ran): nothing commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_after_a_statement_cut_short_commits_nothing() {
        use diesel_async::SimpleAsyncConnection;
        use lockkit::asynchronous::prelude::*;
        let db = seeded::<MysqlConnection>("write_after_cut_short", &[(1, 10), (2, 10)]);
        let mut holder = holding(&db.url, "SELECT 1 FROM items WHERE id = 1 FOR UPDATE").await;
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let mut item_2 = item!(&mut conn, 2);
        // A first write, so that the one below sends its UPDATE first (the
        // connection knows the table's key by then).
        item_2.update_versioned(&mut conn).await.unwrap();
        let session = lock_waits::session_id(&mut conn).await.unwrap();
        let mut watcher: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default().timeout(Duration::from_secs(1)),
            async |conn: &mut AsyncMysqlConnection| {
                let sell = diesel::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(&mut *conn);
                // Cut short once it waits for the holder's lock.
                tokio::select! {
                    () = async { until_waiting!(&mut watcher, "mysql", session, "UPDATE%") } => {}
                    sold = sell => panic!("the UPDATE returned {sold:?} before it waited"),
                }
                // The cut-short UPDATE's lock wait timeout comes after 1 s.
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                item_2.stock = 0;
                item_2.update_versioned(conn).await
            },
        )
        .await;
        holder.batch_execute("ROLLBACK").await.unwrap();
        assert!(outcome.is_err(), "{outcome:?}");
        let mut reader: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let row = item!(&mut reader, 2);
        assert_eq!(
            (row.stock, row.lock_version),
            (10, 1),
            "nothing committed: {outcome:?}"
        );
        // The write's row lock went with the call, not with the connection,
        // which the caller still holds.
        let locked = reader
            .batch_execute("BEGIN; SELECT 1 FROM items WHERE id = 2 FOR UPDATE NOWAIT; ROLLBACK")
            .await;
        assert!(locked.is_ok(), "item 2 is still locked: {locked:?}");
        drop(conn);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_dropped_with_lock_leaves_the_next_user_its_own_lock_wait_timeout() {
        let (_db, pool, session) = one_connection_and_its_lock_wait("dropped_lock_wait").await;
        let mut seen = Vec::new();
        for attempt in 0..200u64 {
            decrement_dropped_after!(pool, Duration::from_micros(attempt % 4 * 100));
            let now = lock_timeout(&mut pool.get().await.unwrap(), "mysql").await;
            if now != session {
                seen.push((attempt, now));
                break;
            }
        }
        assert!(
            seen.is_empty(),
            "the pool's next user got innodb_lock_wait_timeout = {seen:?} (its session had {session})"
        );
    }

    /// A database whose item 1 has 1,000 units, with lockkit's `tables` in it.
    fn item_1_at_1_000(
        name: &str,
        tables: lockkit::migrations::ShippedMigration,
    ) -> TestDb<MysqlConnection> {
        use diesel_migrations::MigrationHarness;
        let db = seeded::<MysqlConnection>(name, &[(1, 1_000)]);
        db.conn().run_pending_migrations(tables).unwrap();
        db
    }

    /// Another session on `url`, in a transaction that took `lock` (a locking
    /// read) and holds it until the test rolls it back.
    async fn holding(url: &str, lock: &str) -> AsyncMysqlConnection {
        use diesel_async::SimpleAsyncConnection;
        let mut holder: AsyncMysqlConnection = async_common::connect(url, "mysql").await;
        holder.batch_execute("BEGIN").await.unwrap();
        holder.batch_execute(lock).await.unwrap();
        holder
    }

    /// Rolls `holder`'s transaction back (its locks with it) `after` the
    /// returned signal, as [`async_common::once_signalled`].
    fn rolled_back_once_signalled(
        mut holder: AsyncMysqlConnection,
        after: Duration,
    ) -> (
        std::sync::Arc<tokio::sync::Notify>,
        tokio::task::JoinHandle<()>,
    ) {
        use diesel_async::SimpleAsyncConnection;
        async_common::once_signalled(after, async move {
            holder.batch_execute("ROLLBACK").await.unwrap();
        })
    }

    /// A pool of one connection without bb8's check-out ping, as lockkit's
    /// docs advise on MySQL with cancellation.
    async fn unpinged_pool(url: &str) -> Pool {
        bb8::Pool::builder()
            .max_size(1)
            .test_on_check_out(false)
            .build(AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(
                url,
            ))
            .await
            .unwrap()
    }

    type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncMysqlConnection>>;

    /// Item 1's `$column` (an `Integer` column of `items`) as the next user of
    /// `$pool` reads it, an error as its text.
    macro_rules! next_users_read {
        ($pool:expr, $column:expr) => {{
            let mut next = $pool.get().await.unwrap();
            items::table
                .find(1)
                .select($column)
                .first::<i32>(&mut *next)
                .await
                .map_err(|e| e.to_string())
        }};
    }

    /// Checks out the pool's connection as `$conn`, polls `$call` once (its
    /// first statement goes out), lets the reply arrive, drops the call and
    /// gives the connection back; then what the pool's next user reads. A
    /// call that finished in that one poll (every reply was there at once, on
    /// a busy machine) is made again.
    macro_rules! next_user_after {
        ($pool:expr, |$conn:ident| $call:expr) => {{
            let mut pending = false;
            for _ in 0..20 {
                let mut pooled = $pool.get().await.unwrap();
                let $conn = &mut *pooled;
                let mut call = Box::pin($call);
                if poll_once(call.as_mut()).is_pending() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    pending = true;
                    break;
                }
            }
            assert!(pending, "the call never waited for a reply");
            next_users_read!($pool, items::stock)
        }};
    }

    /// `serializable` sends `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`
    /// (for the session's next transaction) before its `BEGIN`, and a relay
    /// step `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`: a call dropped
    /// while that statement is in flight does not hand the pool's next user a
    /// connection that reads the wrong replies, as the guarded `SET` of
    /// `with_lock(.. timeout(..))` does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_call_dropped_during_its_set_transaction_hands_the_next_user_a_working_connection() {
        use lockkit::outbox::{OutboxMessage, Relay};
        let db = item_1_at_1_000("dropped_set", outbox_migrations("mysql"));

        let guarded = unpinged_pool(&db.url).await;
        let with_lock = next_user_after!(guarded, |conn| lockkit::asynchronous::with_lock(
            conn,
            1,
            LockOptions::default().timeout(Duration::from_secs(5)),
            async |_conn, _item: Item| Ok::<_, Error>(()),
        ));
        assert_eq!(with_lock, Ok(1_000), "the guarded SET of with_lock");

        let pool = unpinged_pool(&db.url).await;
        let policy = RetryPolicy::immediate(1);
        let serializable = next_user_after!(pool, |conn| lockkit::asynchronous::serializable(
            conn,
            &policy,
            async |_conn: &mut AsyncMysqlConnection| Ok::<_, Error>(()),
        ));
        assert_eq!(
            serializable,
            Ok(1_000),
            "after a serializable() dropped during its SET TRANSACTION, the pool's next user's read"
        );

        let pool = unpinged_pool(&db.url).await;
        let relay = Relay::default();
        let relayed = next_user_after!(pool, |conn| lockkit::asynchronous::outbox::publish_batch(
            &relay,
            conn,
            10,
            async |batch: &[OutboxMessage]| Ok::<_, Error>(vec![Ok(()); batch.len()]),
        ));
        assert_eq!(
            relayed,
            Ok(1_000),
            "after a relay step dropped during its SET TRANSACTION, the pool's next user's read"
        );
    }

    /// Takes `$lock` (a locking read) on another session, runs `$call` with
    /// `$conn` a connection of `$pool`, and drops it after a second, while its
    /// statement waits for that lock; gives the connection back and lets the
    /// statement through.
    macro_rules! dropped_while_it_waits {
        ($pool:expr, $url:expr, $lock:expr, |$conn:ident| $call:expr) => {{
            use diesel_async::SimpleAsyncConnection;
            let mut holder = holding($url, $lock).await;
            let mut pooled = $pool.get().await.unwrap();
            {
                let $conn = &mut *pooled;
                let dropped = tokio::time::timeout(Duration::from_secs(1), $call).await;
                assert!(
                    dropped.is_err(),
                    "the call waits for the other session's lock"
                );
            }
            drop(pooled);
            holder.batch_execute("ROLLBACK").await.unwrap();
        }};
    }

    /// A moment for a statement let through to answer; then the pool's next
    /// user must read item 1's id, after what `after` names.
    async fn assert_next_user_reads_item_1(pool: &Pool, after: &str) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            next_users_read!(pool, items::id),
            Ok(1),
            "after {after}, the pool's next user's read"
        );
    }

    /// A lease's `renew` is one statement in autocommit (it refuses to run
    /// in a transaction): one dropped while it waits for another session's
    /// lock on the lease's row does not hand the pool's next user a connection
    /// that reads its reply as its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lease_renew_dropped_while_it_waits_hands_the_next_user_a_working_connection() {
        use diesel_async::SimpleAsyncConnection;
        let db = item_1_at_1_000("dropped_lease_renew", lease_migrations("mysql"));
        let pool = unpinged_pool(&db.url).await;
        let mut holder = {
            let mut pooled = pool.get().await.unwrap();
            let ttl = Duration::from_secs(60);
            let mut lease = lockkit::asynchronous::lease::acquire(&mut *pooled, "nightly", ttl)
                .await
                .unwrap();
            let holder = holding(
                &db.url,
                "SELECT 1 FROM lockkit_leases WHERE name = 'nightly' FOR UPDATE",
            )
            .await;
            let dropped = tokio::time::timeout(Duration::from_secs(1), lease.renew()).await;
            assert!(
                dropped.is_err(),
                "the renew waits for the other session's lock"
            );
            holder
        };
        holder.batch_execute("ROLLBACK").await.unwrap();
        assert_next_user_reads_item_1(&pool, "a lease renew dropped while it waited").await;
    }

    /// A statement of the work's own, cut short inside a lockkit transaction
    /// (a `timeout` the work catches, going on to return), leaves its reply
    /// unread on MySQL/MariaDB. The call's `COMMIT` or `ROLLBACK` would read
    /// that reply as its own: the transaction looked ended, the connection
    /// went back to the pool one reply behind, and (ending `Ok`) the cut-short
    /// `UPDATE` committed. The call marks the connection broken, for the pool
    /// to close, and fails; its `ROLLBACK` has run on the server by the time
    /// it returns, so its locks are gone although the caller still holds the
    /// connection. The work writes many rows first, so that the server takes
    /// a while to roll back: on the old code the call returned with the
    /// `ROLLBACK` still on its way, and the row still locked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_statement_of_the_works_own_cut_short_hands_the_next_user_a_working_connection() {
        use diesel_async::SimpleAsyncConnection;
        let db = seeded::<MysqlConnection>("own_statement_cut_short", &[(1, 1_000)]);
        diesel::connection::SimpleConnection::batch_execute(
            &mut db.conn(),
            "CREATE TABLE filler (n INT PRIMARY KEY, pad VARCHAR(100) NOT NULL)",
        )
        .unwrap();
        for ends_ok in [true, false] {
            let pool = unpinged_pool(&db.url).await;
            let holder = holding(&db.url, "SELECT 1 FROM items WHERE id = 1 FOR UPDATE").await;
            // The holder lets go once the work has cut its UPDATE short, so
            // that the UPDATE's reply comes while the call ends.
            let (cut_short, release) =
                rolled_back_once_signalled(holder, Duration::from_millis(300));
            // Connected before the call ends, so that the check below asks
            // the moment the call returns.
            let mut other: diesel_async::AsyncMysqlConnection =
                async_common::connect(&db.url, "mysql").await;
            let mut pooled = pool.get().await.unwrap();
            pooled
                .batch_execute("SET SESSION max_recursive_iterations = 1000000")
                .await
                .unwrap();
            let session = lock_waits::session_id(&mut *pooled).await.unwrap();
            let mut watcher: diesel_async::AsyncMysqlConnection =
                async_common::connect(&db.url, "mysql").await;
            let result = {
                lockkit::asynchronous::locked_transaction(
                    &mut *pooled,
                    LockOptions::default(),
                    async |conn: &mut diesel_async::AsyncMysqlConnection| {
                        diesel::sql_query(
                            "INSERT INTO filler (n, pad) WITH RECURSIVE s(n) AS \
                             (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200000) \
                             SELECT n, REPEAT('x', 100) FROM s",
                        )
                        .execute(conn)
                        .await?;
                        let sell = diesel::update(items::table.find(1))
                            .set(items::stock.eq(items::stock - 1))
                            .execute(conn);
                        // Cut short once it waits for the holder's lock.
                        tokio::select! {
                            () = async { until_waiting!(&mut watcher, "mysql", session, "UPDATE%") } => {}
                            sold = sell => panic!("the UPDATE returned {sold:?} before it waited"),
                        }
                        cut_short.notify_one();
                        match ends_ok {
                            true => Ok(()),
                            false => Err(Error::NoRowMatched),
                        }
                    },
                )
                .await
            };
            // Its row lock went with the call, not with the connection, which
            // the caller still holds: gone by the time the call returns.
            let locked = other
                .batch_execute(
                    "BEGIN; SELECT 1 FROM items WHERE id = 1 FOR UPDATE NOWAIT; ROLLBACK",
                )
                .await;
            release.await.unwrap();
            assert!(
                result.is_err(),
                "a call whose work cut a statement short, ending Ok = {ends_ok}: {result:?}"
            );
            assert!(
                locked.is_ok(),
                "the row is still locked (ending Ok = {ends_ok}): {locked:?}"
            );
            drop(pooled);
            let after = format!("a work that cut a statement short (ending Ok = {ends_ok})");
            assert_next_user_reads_item_1(&pool, &after).await;
            let stock: i32 = diesel::RunQueryDsl::first(
                items::table.find(1).select(items::stock),
                &mut db.conn(),
            )
            .unwrap();
            assert_eq!(
                stock, 1_000,
                "the cut-short UPDATE committed nothing (ending Ok = {ends_ok})"
            );
            let filled: i64 = diesel::RunQueryDsl::get_result(
                diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    "(SELECT COUNT(*) FROM filler)",
                )),
                &mut db.conn(),
            )
            .unwrap();
            assert_eq!(
                filled, 0,
                "the work's own rows committed nothing (ending Ok = {ends_ok})"
            );
        }
    }

    /// A versioned write outside a transaction opens no level: one dropped
    /// while its `UPDATE` waits for another session's lock on the row does not
    /// hand the pool's next user a connection that reads that reply as its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_versioned_write_dropped_in_autocommit_hands_the_next_user_a_working_connection() {
        use lockkit::asynchronous::prelude::*;
        let db = seeded::<MysqlConnection>("dropped_autocommit_write", &[(1, 1_000)]);
        let pool = unpinged_pool(&db.url).await;
        let mut item = item!(&mut *pool.get().await.unwrap(), 1);
        item.stock = 999;
        dropped_while_it_waits!(
            pool,
            &db.url,
            "SELECT 1 FROM items WHERE id = 1 FOR UPDATE",
            |conn| item.update_versioned(conn)
        );
        assert_next_user_reads_item_1(&pool, "a versioned write dropped in autocommit").await;
    }

    /// The atomic writes are one statement each, outside a transaction here:
    /// one dropped while its `UPDATE` waits for another session's lock on the
    /// row does not hand the pool's next user a connection that reads that
    /// reply as its own (a conditional sale that matched nothing would come
    /// back as one row written, and one that sold as nothing).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_atomic_write_dropped_in_autocommit_hands_the_next_user_a_working_connection() {
        use lockkit::asynchronous::atomic::{counter, update, update_counters, update_if};
        let db = seeded::<MysqlConnection>("dropped_atomic_write", &[(1, 1_000)]);
        let pool = unpinged_pool(&db.url).await;
        dropped_while_it_waits!(
            pool,
            &db.url,
            "SELECT 1 FROM items WHERE id = 1 FOR UPDATE",
            |conn| update_if(
                conn,
                update(items::table.find(1).filter(items::stock.ge(1)))
                    .set(items::stock.eq(items::stock - 1))
            )
        );
        assert_next_user_reads_item_1(&pool, "update_if dropped in autocommit").await;
        dropped_while_it_waits!(
            pool,
            &db.url,
            "SELECT 1 FROM items WHERE id = 1 FOR UPDATE",
            |conn| update_counters(conn, items::table.find(1), counter(items::stock, -1))
        );
        assert_next_user_reads_item_1(&pool, "update_counters dropped in autocommit").await;
    }

    /// `lease::acquire` sends three statements outside any transaction: one
    /// dropped while they wait for another session's lock on the lease's row
    /// does not hand the pool's next user a connection that reads their reply
    /// as its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lease_acquire_dropped_while_it_waits_hands_the_next_user_a_working_connection() {
        let db = item_1_at_1_000("dropped_lease_acquire", lease_migrations("mysql"));
        let pool = unpinged_pool(&db.url).await;
        {
            let mut conn = pool.get().await.unwrap();
            let lease = lockkit::asynchronous::lease::acquire(
                &mut *conn,
                "nightly",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
            lease.release().await.unwrap();
        }
        dropped_while_it_waits!(
            pool,
            &db.url,
            "SELECT 1 FROM lockkit_leases WHERE name = 'nightly' FOR UPDATE",
            |conn| async {
                lockkit::asynchronous::lease::acquire(conn, "nightly", Duration::from_secs(60))
                    .await
                    .map(drop)
            }
        );
        assert_next_user_reads_item_1(&pool, "a lease acquire dropped while it waited").await;
    }

    /// `lock_all` opens no level of its own: one timed out on its own while it
    /// waits for a row lock, in a `locked_transaction` that goes on, fails
    /// that transaction instead of letting its `COMMIT` read the lock's reply.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_lock_all_dropped_while_it_waits_fails_the_transaction_around() {
        let db = seeded::<MysqlConnection>("dropped_lock_all", &[(1, 1_000), (2, 1_000)]);
        let holder = holding(&db.url, "SELECT 1 FROM items WHERE id = 2 FOR UPDATE").await;
        // The holder lets go only once `lock_all` has been given up on, a
        // while later, so that its reply comes while the transaction ends.
        let (given_up, releaser) = rolled_back_once_signalled(holder, Duration::from_millis(500));
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |conn: &mut AsyncMysqlConnection| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(&mut *conn)
                    .await?;
                let waited = tokio::time::timeout(
                    Duration::from_secs(1),
                    lockkit::asynchronous::lock_all::<Item, _>(&mut *conn, &[1, 2]),
                )
                .await;
                given_up.notify_one();
                assert!(waited.is_err(), "lock_all waits for item 2");
                Ok::<_, Error>(())
            },
        )
        .await;
        given_up.notify_one(); // had the work failed before its `lock_all`
        releaser.await.unwrap();
        let mut check: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let stock = items::table
            .find(1)
            .select(items::stock)
            .first::<i32>(&mut check)
            .await
            .unwrap();
        assert!(
            matches!(
                outcome,
                Err(Error::Database(
                    diesel::result::Error::BrokenTransactionManager
                ))
            ) && stock == 1_000,
            "the transaction returned {outcome:?}, and item 1's stock is {stock}"
        );
    }

    /// A run whose work failed releases its key after its transaction ended
    /// (so that a retry runs the work again): a run dropped while that release
    /// waits for another session's lock on the key's row does not hand the
    /// pool's next user a connection that reads the release's reply for its
    /// own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_run_dropped_while_releasing_its_key_hands_the_next_user_a_working_connection() {
        use diesel_async::SimpleAsyncConnection;
        use lockkit::idempotency::Idempotency;
        let db = item_1_at_1_000("dropped_key_release", idempotency_migrations("mysql"));

        let pool = unpinged_pool(&db.url).await;
        let mut holder: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        let keys = Idempotency::default();
        let mut pooled = pool.get().await.unwrap();
        let run = lockkit::asynchronous::idempotency::run(
            &keys,
            &mut *pooled,
            "tenant-1",
            "order-1",
            "POST /orders",
            async |_conn: &mut AsyncMysqlConnection| {
                // The key is taken and committed: another session locks its row.
                holder.batch_execute("BEGIN").await?;
                holder
                    .batch_execute("SELECT 1 FROM lockkit_idempotency_keys FOR UPDATE")
                    .await?;
                Err::<String, Error>(Error::NoRowMatched)
            },
        );
        let dropped = tokio::time::timeout(Duration::from_secs(1), run).await;
        assert!(
            dropped.is_err(),
            "the release waits for the other session's lock: {dropped:?}"
        );
        drop(pooled);
        // The release goes through now, and its reply reaches the connection.
        holder.batch_execute("ROLLBACK").await.unwrap();
        assert_next_user_reads_item_1(&pool, "a run dropped while releasing its key").await;
    }
}

#[cfg(feature = "postgres")]
mod postgres_only {
    use super::*;
    use diesel::connection::SimpleConnection as _;
    use diesel::Connection as _;
    use diesel::PgConnection;
    use diesel_async::AsyncPgConnection;
    use lockkit::asynchronous::prelude::*;
    use lockkit_tests::TestDb;

    /// Another session holding item 1's row lock ([`hold_the_row`]).
    struct HeldRow {
        release: std::sync::mpsc::Sender<()>,
        thread: std::thread::JoinHandle<()>,
    }

    impl HeldRow {
        /// Tells the holder to run its statement and commit; call it right
        /// after the write under test was given up on.
        fn let_go(&self) {
            let _ = self.release.send(());
        }

        /// Lets go (if not yet told to) and waits for the holder's commit.
        fn join(self) {
            self.let_go();
            self.thread.join().unwrap();
        }
    }

    /// Another session holds item 1's row lock until told to let go (or the
    /// [`HeldRow`] is dropped), then runs `then` and commits; returns once it
    /// holds the lock.
    fn hold_the_row(db: &TestDb<PgConnection>, then: &'static str) -> HeldRow {
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let url = db.url.clone();
        let thread = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            conn.transaction(|c| {
                c.batch_execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")?;
                locked_tx.send(()).unwrap();
                let _ = release_rx.recv();
                c.batch_execute(then)
            })
            .unwrap();
        });
        locked_rx.recv().unwrap();
        HeldRow { release, thread }
    }

    /// Item 1 as read before a versioned write of it (stock 5) that rolled
    /// back: the struct holds the rolled-back number 1.
    async fn rolled_back_write(conn: &mut AsyncPgConnection) -> Item {
        let mut item = item!(&mut *conn, 1);
        let rolled_back = lockkit::asynchronous::locked_transaction(
            &mut *conn,
            LockOptions::default(),
            async |conn: &mut AsyncPgConnection| {
                item.stock = 5;
                item.update_versioned(conn).await?;
                Err::<(), _>(Error::NoRowMatched)
            },
        )
        .await;
        assert!(rolled_back.is_err());
        assert_eq!(
            item.lock_version, 1,
            "the struct holds the rolled-back number"
        );
        item
    }

    /// A session of a test database, by the id the server knows it by.
    struct Session<'a> {
        url: &'a str,
        id: i64,
    }

    impl<'a> Session<'a> {
        /// `conn`'s session, on the database at `url`.
        async fn of(conn: &mut AsyncPgConnection, url: &'a str) -> Self {
            let id = lockkit::asynchronous::lock_waits::session_id(conn)
                .await
                .unwrap();
            Session { url, id }
        }

        /// Returns once the server shows the session waiting for a lock, as
        /// another session sees it. Fails the test after 10 s.
        async fn waits_for_a_lock(&self) {
            let mut watcher: AsyncPgConnection = async_common::connect(self.url, "postgres").await;
            until_waiting!(&mut watcher, "postgres", self.id, "%")
        }
    }

    /// Drops `write` once `session` (its connection's) waits for `what`,
    /// however long it took to get there, then calls `let_go`, which frees
    /// what it waited for.
    async fn given_up_while_it_waits<F>(
        write: F,
        session: &Session<'_>,
        let_go: impl FnOnce(),
        what: &str,
    ) where
        F: Future,
        F::Output: std::fmt::Debug,
    {
        tokio::select! {
            () = session.waits_for_a_lock() => {}
            outcome = write => panic!("returned {outcome:?} before it waited for {what}"),
        }
        let_go();
    }

    /// A versioned write of stock 7 to item 1 as read now on `conn`, given up
    /// on while it waits for `what` ([`given_up_while_it_waits`]), in a
    /// `locked_transaction` that goes on to commit: what that returned.
    async fn write_of_7_given_up_in_a_commit(
        conn: &mut AsyncPgConnection,
        url: &str,
        let_go: impl FnOnce() + Send,
        what: &str,
    ) -> Result<(), Error> {
        let session = Session::of(conn, url).await;
        let mut item = item!(&mut *conn, 1);
        lockkit::asynchronous::locked_transaction(
            conn,
            LockOptions::default(),
            async |conn: &mut AsyncPgConnection| {
                item.stock = 7;
                given_up_while_it_waits(item.update_versioned(conn), &session, let_go, what).await;
                Ok::<_, Error>(())
            },
        )
        .await
    }

    /// `item`'s versioned write of stock 4 on `conn`: refused as stale, and
    /// the stock of 7 that `stands` names stays.
    async fn refused_as_stale(conn: &mut AsyncPgConnection, mut item: Item, stands: &str) {
        item.stock = 4;
        let outcome = item.update_versioned(&mut *conn).await;
        assert!(matches!(outcome, Err(Error::Stale(_))), "{outcome:?}");
        assert_eq!(stock!(conn), 7, "{stands}");
    }

    /// PostgreSQL runs a statement whose future was dropped: a versioned
    /// write given up on while it waits for another session's lock on the row
    /// still writes, in the caller's transaction, once the lock is let go. A
    /// struct read after it holds the number it wrote; the transaction rolls
    /// back, another process commits that number with its own change, and the
    /// struct must not match it (the journal's rule 3, for a write it did not
    /// see finish).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_versioned_write_dropped_in_flight_in_a_rolled_back_transaction_is_never_matched_again(
    ) {
        let db = seeded::<PgConnection>("dropped_write_rolled_back", &[(1, 10)]);
        let holder = hold_the_row(&db, "SELECT 1");
        let mut conn: AsyncPgConnection = async_common::connect(&db.url, "postgres").await;
        let mut a = item!(&mut conn, 1);
        let session = Session::of(&mut conn, &db.url).await;
        let mut fresh = None;
        let outcome = lockkit::asynchronous::locked_transaction(
            &mut conn,
            LockOptions::default(),
            async |conn: &mut AsyncPgConnection| {
                a.stock = 5;
                given_up_while_it_waits(
                    a.update_versioned(conn),
                    &session,
                    || holder.let_go(),
                    "the lock",
                )
                .await;
                // Queued behind the dropped write: sees it once the holder lets go.
                fresh = Some(item!(conn, 1));
                Err::<(), _>(Error::NoRowMatched) // the caller gives up: rolled back
            },
        )
        .await;
        assert!(matches!(outcome, Err(Error::NoRowMatched)), "{outcome:?}");
        holder.join();
        let fresh = fresh.unwrap();
        assert_eq!(
            (fresh.stock, fresh.lock_version),
            (5, 1),
            "the dropped write ran in the transaction"
        );
        db.conn()
            .batch_execute(
                "UPDATE items SET stock = 7, lock_version = 1 WHERE id = 1 AND lock_version = 0",
            )
            .unwrap();
        refused_as_stale(&mut conn, fresh, "the other process's change stands").await;
    }

    /// A write dropped in flight in a transaction that commits: PostgreSQL
    /// runs it, and the row commits a number a rolled-back write left with
    /// another struct (a write that finished would have moved the row past
    /// it). The journal must still refuse that struct.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_dropped_in_flight_keeps_another_structs_rolled_back_number_refused() {
        let db = seeded::<PgConnection>("dropped_write_reused_number", &[(1, 10)]);
        let mut conn: AsyncPgConnection = async_common::connect(&db.url, "postgres").await;
        let s1 = rolled_back_write(&mut conn).await;
        let holder = hold_the_row(&db, "SELECT 1");
        let committed =
            write_of_7_given_up_in_a_commit(&mut conn, &db.url, || holder.let_go(), "the lock")
                .await;
        holder.join();
        assert!(committed.is_ok(), "{committed:?}");
        assert_eq!(
            item!(&mut conn, 1).lock_version,
            1,
            "the dropped write committed the rolled-back number"
        );
        refused_as_stale(&mut conn, s1, "the dropped write's change stands").await;
    }

    /// A write dropped while it waits for another transaction's versioned
    /// write of the row, which then rolls back: the dropped write runs and
    /// commits that write's number. The rolled-back struct must not match it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_dropped_behind_a_rolled_back_write_keeps_that_struct_refused() {
        let db = seeded::<PgConnection>("dropped_behind_rolled_back", &[(1, 10)]);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        // The other write rolls back once the dropped write was given up on
        // (or the test panicked and dropped the sender).
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let url = db.url.clone();
        let a = std::thread::spawn(move || {
            let mut conn = PgConnection::establish(&url).unwrap();
            let mut s_a: Item =
                diesel::RunQueryDsl::first(items::table.find(1), &mut conn).unwrap();
            let rolled_back = conn.transaction(|c| {
                s_a.stock = 5;
                lockkit::prelude::Versioned::update_versioned(&mut s_a, c)?;
                locked_tx.send(()).unwrap();
                let _ = release_rx.recv();
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            (conn, s_a)
        });
        locked_rx.recv().unwrap();
        let mut conn: AsyncPgConnection = async_common::connect(&db.url, "postgres").await;
        let let_go = || {
            let _ = release.send(());
        };
        let committed =
            write_of_7_given_up_in_a_commit(&mut conn, &db.url, let_go, "the other write").await;
        assert!(committed.is_ok(), "{committed:?}");
        drop(release); // had the call failed before its write
        let (mut a_conn, mut s_a) = a.join().unwrap();
        assert_eq!(
            s_a.lock_version, 1,
            "the rolled-back struct holds the number the dropped write committed"
        );
        s_a.stock = 4;
        let outcome = lockkit::prelude::Versioned::update_versioned(&mut s_a, &mut a_conn);
        assert!(matches!(outcome, Err(Error::Stale(_))), "{outcome:?}");
        assert_eq!(stock!(&mut conn), 7, "the dropped write's change stands");
    }

    /// A delete dropped in autocommit while it waits for another session's
    /// lock may or may not run: it must not make the journal forget what it
    /// knows of the row. A struct holds a number a rolled-back write left;
    /// another process then commits that number, and the struct must not
    /// match it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_delete_dropped_in_autocommit_keeps_the_journals_rolled_back_numbers() {
        let db = seeded::<PgConnection>("dropped_delete_autocommit", &[(1, 10)]);
        let mut conn: AsyncPgConnection = async_common::connect(&db.url, "postgres").await;
        let s1 = rolled_back_write(&mut conn).await;
        let other = hold_the_row(
            &db,
            "UPDATE items SET stock = 7, lock_version = 1 WHERE id = 1",
        );
        let s2 = item!(&mut conn, 1);
        let session = Session::of(&mut conn, &db.url).await;
        given_up_while_it_waits(
            s2.delete_versioned(&mut conn),
            &session,
            || other.let_go(),
            "the lock",
        )
        .await;
        other.join();
        refused_as_stale(&mut conn, s1, "the other process's change stands").await;
    }
}
