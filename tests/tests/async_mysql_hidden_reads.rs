//! diesel-async's MySQL connection reports a read as succeeded before a
//! deadlock that comes in place of its rows; lockkit's journal then asks the
//! server before a nested call. A read MariaDB runs under `SET STATEMENT .. FOR`
//! counts as a read, and lockkit's own read by key asks nothing later: an async
//! `with_lock` with an outbox message sends as many `SELECT`s as the blocking one.

#![cfg(all(feature = "async", feature = "mysql"))]

#[macro_use]
mod async_common;

use std::sync::{mpsc, Mutex};

use diesel::sql_types::Integer;
use diesel::{Connection, ExpressionMethods, QueryDsl, QueryableByName};
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::MigrationHarness;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;
use lockkit_tests::outbox_migrations;
use lockkit_tests::schema::{items, orders};

#[derive(QueryableByName)]
#[allow(dead_code)]
struct Id {
    #[diesel(sql_type = Integer)]
    id: i32,
}

async fn order_line<A: SimpleAsyncConnection + Send>(conn: &mut A, id: u32) -> Result<(), Error> {
    let sql = format!("INSERT INTO orders (id, item_id, qty) VALUES ({id}, NULL, 1)");
    Ok(conn.batch_execute(&sql).await?)
}

/// The session's `Com_select` (each probe counts one more).
#[cfg(feature = "mysql")]
async fn com_select_async<A>(conn: &mut A) -> i64
where
    A: AsyncConnection<Backend = diesel::mysql::Mysql> + Send,
{
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::sql_query(
        "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS \
         WHERE VARIABLE_NAME = 'COM_SELECT'",
    )
    .get_result::<N>(conn)
    .await
    .unwrap()
    .n
}

#[cfg(feature = "mysql")]
fn com_select_sync(conn: &mut diesel::MysqlConnection) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    diesel::RunQueryDsl::get_result::<N>(
        diesel::sql_query(
            "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS \
             WHERE VARIABLE_NAME = 'COM_SELECT'",
        ),
        conn,
    )
    .unwrap()
    .n
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    type Sync = diesel::MysqlConnection;
    type Async = diesel_async::AsyncMysqlConnection;
    const BACKEND: &str = "mysql";

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn nested_with_lock_after_a_set_statement_read_was_a_deadlocks_victim_commits_nothing() {
        let db = lockkit_tests::TestDb::<Sync>::new("review_set_statement");
        // MariaDB's `SET STATEMENT var = value FOR SELECT ...` answers with
        // rows like any SELECT, and a deadlock comes in place of them just
        // the same; but its first word is SET, which the journal's classifier
        // counts among the statements that never answer with rows.
        lockkit_tests::aborts::seed_for_deadlock(&mut db.conn());
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        // An earlier lockkit call on the connection installed its journal.
        lockkit::asynchronous::with_lock(
            &mut conn,
            12,
            LockOptions::default(),
            async |_, _: Item| Ok::<_, Error>(()),
        )
        .await
        .unwrap();
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let b_rx = Mutex::new(b_rx);
        let url = db.url.clone();
        let neighbour = std::thread::spawn(move || {
            let mut conn = Sync::establish(&url).unwrap();
            lockkit_tests::aborts::heavier_neighbour(&mut conn, BACKEND, b_tx, a_rx);
        });
        let outcome: Result<(), Error> = conn
            .transaction(async |conn| {
                // Writes only before the victim's read: nothing the journal
                // counts as a read.
                order_line(conn, 1).await?;
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(conn)
                    .await?;
                a_tx.send(()).unwrap();
                tokio::task::block_in_place(|| b_rx.lock().unwrap().recv()).unwrap();
                // The victim's read, whose error the caller lets go.
                let victim = diesel::sql_query(
                    "SET STATEMENT max_statement_time = 0 FOR \
                     SELECT id FROM items WHERE id >= 2 AND id < 3 FOR UPDATE",
                )
                .load::<Id>(conn)
                .await;
                eprintln!(
                    "the victim's read: {:?}",
                    victim.as_ref().map(|rows| rows.len())
                );
                lockkit::asynchronous::with_lock(
                    conn,
                    1,
                    LockOptions::default(),
                    async |conn, item: Item| {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(item.stock - 1))
                            .execute(conn)
                            .await?;
                        order_line(conn, 2).await
                    },
                )
                .await
            })
            .await;
        tokio::task::block_in_place(|| neighbour.join()).unwrap();
        let mut fresh: Async = async_common::connect(&db.url, BACKEND).await;
        let stock: i32 = items::table
            .find(1)
            .select(items::stock)
            .first(&mut fresh)
            .await
            .unwrap();
        let lines: i64 = orders::table.count().get_result(&mut fresh).await.unwrap();
        assert!(outcome.is_err(), "{outcome:?}");
        assert_eq!(
            (stock, lines),
            (10, 0),
            "the nested with_lock's sale committed on its own, without order line 1: {outcome:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn async_with_lock_with_an_outbox_message_sends_no_more_selects_than_blocking() {
        let db = lockkit_tests::TestDb::<Sync>::new("review_outbox_cost");
        // A top-level with_lock that enqueues an outbox message: the journal
        // is unsure after with_lock's own locking read by key (whose deadlock
        // would come as the statement's error), so enqueue asks the server
        // `SELECT @@in_transaction` on every such call on diesel-async's
        // MySQL connection; the blocking twin sends no such statement.
        db.conn()
            .run_pending_migrations(outbox_migrations(BACKEND))
            .unwrap();
        lockkit_tests::seed_items(&mut db.conn(), &[(1, 10)]);

        let mut sync = db.connect();
        // Warm up (journal installed, statements prepared).
        for _ in 0..2 {
            lockkit::with_lock(&mut sync, 1, LockOptions::default(), |conn, _: Item| {
                lockkit::outbox::enqueue(conn, "orders", "1").map(|_| ())
            })
            .unwrap();
        }
        let before = com_select_sync(&mut sync);
        lockkit::with_lock(&mut sync, 1, LockOptions::default(), |conn, _: Item| {
            lockkit::outbox::enqueue(conn, "orders", "1").map(|_| ())
        })
        .unwrap();
        let blocking = com_select_sync(&mut sync) - before;

        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        for _ in 0..2 {
            lockkit::asynchronous::with_lock(
                &mut conn,
                1,
                LockOptions::default(),
                async |conn, _: Item| {
                    lockkit::asynchronous::outbox::enqueue(conn, "orders", "1")
                        .await
                        .map(|_| ())
                },
            )
            .await
            .unwrap();
        }
        let before = com_select_async(&mut conn).await;
        lockkit::asynchronous::with_lock(
            &mut conn,
            1,
            LockOptions::default(),
            async |conn, _: Item| {
                lockkit::asynchronous::outbox::enqueue(conn, "orders", "1")
                    .await
                    .map(|_| ())
            },
        )
        .await
        .unwrap();
        let asynchronous = com_select_async(&mut conn).await - before;
        assert_eq!(
            asynchronous, blocking,
            "SELECTs sent by one with_lock with an outbox message: async {asynchronous}, blocking {blocking}"
        );
    }
}
