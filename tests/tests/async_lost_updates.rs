//! `lost_updates.rs` on diesel-async: the same promises, the same holes.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use diesel::QueryDsl;
use diesel_async::RunQueryDsl;
use lockkit::asynchronous::locked_transaction;
use lockkit::asynchronous::prelude::*;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::{Item, Twin};
use lockkit_tests::schema::items;
use lockkit_tests::seed_items;

async_backend_tests! {
    /// The blocking side's `two_structs_written_in_one_rolled_back_transaction_never_write_over_each_others_retry`.
    async fn two_structs_written_in_one_rolled_back_transaction_never_write_over_each_others_retry(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let a1 = tokio::sync::Mutex::new(item!(&mut conn, 1));
        let a2 = tokio::sync::Mutex::new(None::<Item>);
        let rolled_back = locked_transaction(&mut conn, LockOptions::default(), async |c| {
            let mut first = a1.lock().await;
            first.stock = 9;
            first.update_versioned(c).await?; // v0 -> v1
            let mut second = item!(&mut *c, 1); // reads v1
            second.name = "renamed".into();
            second.update_versioned(c).await?; // v1 -> v2
            *a2.lock().await = Some(second);
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());
        let (mut a1, mut a2) = (a1.into_inner(), a2.into_inner().unwrap());

        a1.stock = 8;
        a1.update_versioned(&mut conn).await.unwrap();
        let again = a2.update_versioned(&mut conn).await;
        let stock = item!(&mut conn, 1).stock;
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock == 8,
            "a2's rolled-back version 2 was restored to 1, which a1's retry had just \
             committed: {again:?}, stock {stock} (a1's 8 lost)"
        );
    }

    /// README: "a struct whose async versioned write was rolled back ... writes
    /// as if its version had been restored, and never over somebody else's later
    /// write". A versioned delete that is rolled back in between must not change
    /// that.
    async fn a_rolled_back_delete_does_not_make_the_journal_forget_a_rolled_back_write(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut a_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut b_conn: Async = async_common::connect(&db.url, BACKEND).await;

        // A writes v0 -> v1 in a transaction that rolls back: `a` holds 1.
        let mut a = item!(&mut a_conn, 1);
        let rolled_back = locked_transaction(&mut a_conn, LockOptions::default(), async |c| {
            a.stock = 5;
            a.update_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());

        // D deletes the row (v0) in a transaction that rolls back too.
        let d = item!(&mut b_conn, 1);
        let undone = locked_transaction(&mut b_conn, LockOptions::default(), async |c| {
            d.delete_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(undone.is_err());
        assert_eq!(item!(&mut b_conn, 1).lock_version, 0, "the delete was undone");

        // B reads v0, writes its 7 and commits; A writes again from its
        // rolled-back 1: it must not land over B's.
        b_commits_then_a_is_stale!(
            &mut a_conn,
            &mut b_conn,
            a,
            "a rolled-back delete had cleared the journal"
        );
    }

    /// The blocking side's twin (`lost_updates.rs`): a delete that commits,
    /// and the row inserted again past the old version, at the number a
    /// rolled-back write left in `a`: `a`'s write must not land on it.
    async fn a_committed_delete_does_not_make_the_journal_forget_a_rolled_back_write(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut a = item!(&mut conn, 1);
        let rolled_back = locked_transaction(&mut conn, LockOptions::default(), async |c| {
            a.stock = 5;
            a.update_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());
        item!(&mut conn, 1).delete_versioned(&mut conn).await.unwrap();
        lockkit_tests::exec(
            &mut db.conn(),
            "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'new', 99, 1)",
        );
        a.stock = 3;
        let written = a.update_versioned(&mut conn).await;
        assert!(matches!(written, Err(Error::Stale(_))), "{written:?}");
        assert_eq!(item!(&mut conn, 1).stock, 99, "the new row stands");
    }
}

#[cfg(feature = "mysql")]
mod mysql_aborted {
    use super::*;
    use crate::async_common::order_line;
    use diesel::{Connection, ExpressionMethods};
    use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};
    use lockkit::RetryPolicy;
    use lockkit_tests::aborts::assert_refused;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{mpsc, Mutex};

    type Async = AsyncMysqlConnection;
    type Blocking = diesel::MysqlConnection;

    /// The stage of a provoked deadlock on diesel-async (the blocking side's
    /// `aborts::beside_neighbour`): items seeded, the heavier neighbour on a
    /// thread of its own.
    struct Stage {
        db: lockkit_tests::TestDb<Blocking>,
        neighbour: std::thread::JoinHandle<()>,
        locked: Mutex<mpsc::Receiver<()>>,
        go: mpsc::Sender<()>,
    }

    impl Stage {
        fn new(name: &str) -> Self {
            Self::beside(name, |conn, locked, go| {
                lockkit_tests::aborts::heavier_neighbour(conn, "mysql", locked, go);
            })
        }

        /// [`new`](Self::new) with `neighbour` as the heavier side: on a
        /// connection of its own, it says on its sender when it holds what the
        /// victim will wait for, then waits on its receiver for the cue.
        fn beside(
            name: &str,
            neighbour: fn(&mut Blocking, mpsc::Sender<()>, mpsc::Receiver<()>),
        ) -> Self {
            let db = lockkit_tests::TestDb::<Blocking>::new(name);
            lockkit_tests::aborts::seed_for_deadlock(&mut db.conn());
            let (locked_tx, locked) = mpsc::channel::<()>();
            let (go, go_rx) = mpsc::channel::<()>();
            let url = db.url.clone();
            let neighbour = std::thread::spawn(move || {
                neighbour(&mut Blocking::establish(&url).unwrap(), locked_tx, go_rx);
            });
            Stage {
                db,
                neighbour,
                locked: Mutex::new(locked),
                go,
            }
        }

        async fn connect(&self) -> Async {
            async_common::connect(&self.db.url, "mysql").await
        }

        /// Waits for the neighbour's lock on item 2, then lets it go on: the
        /// caller's next lock on item 2 is the deadlock's victim.
        fn cue(&self) {
            tokio::task::block_in_place(|| self.locked.lock().unwrap().recv()).unwrap();
            self.go.send(()).unwrap();
        }

        /// Item 2's stock and the count of order lines, once the neighbour is
        /// done.
        async fn sold_and_lines(self) -> (i32, i64) {
            let mut fresh = self.connect().await;
            tokio::task::block_in_place(|| self.neighbour.join()).unwrap();
            stock_and_lines!(&mut fresh, 2)
        }
    }

    /// How [`sell_two`] writes.
    #[derive(Clone, Copy, Debug)]
    enum Sell {
        /// Re-read, change, `update_versioned`.
        Versioned,
        /// `atomic::update_if`, one conditional statement.
        Conditional,
    }

    /// A nested `retry` sells one unit of item 2, whose UPDATE is a
    /// deadlock's victim on the first run.
    async fn sell_two(conn: &mut Async, how: Sell) -> Result<(), Error> {
        let conn = tokio::sync::Mutex::new(conn);
        lockkit::asynchronous::retry(&RetryPolicy::default(), |_| async {
            let mut conn = conn.lock().await;
            match how {
                Sell::Versioned => {
                    let mut two = item!(&mut **conn, 2);
                    two.stock -= 1;
                    two.update_versioned(&mut **conn).await
                }
                Sell::Conditional => {
                    let target = items::table.find(2).filter(items::stock.ge(1));
                    let sale = diesel::update(target).set(items::stock.eq(items::stock - 1));
                    lockkit::asynchronous::atomic::update_if(&mut **conn, sale)
                        .await
                        .map(drop)
                }
            }
        })
        .await
    }

    /// Run `runs + 1` of an owner's work, which holds item 1 (the blocking
    /// side's `record_and_sell`): records its order line, waits for the cue on
    /// the first run, then [`sell_two`] as `how` says, whose UPDATE is then the
    /// deadlock's victim.
    async fn record_and_sell(
        conn: &mut Async,
        runs: &AtomicU32,
        stage: &Stage,
        how: Sell,
    ) -> Result<(), Error> {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        order_line(conn, run).await?;
        if run == 1 {
            stage.cue();
        }
        sell_two(conn, how).await
    }

    /// The whole transaction ran again after the deadlock: `Ok`, one order
    /// line, one unit of item 2 sold.
    async fn assert_retried_whole(stage: Stage, runs: &AtomicU32, outcome: Result<(), Error>) {
        let runs = AtomicU32::load(runs, Ordering::SeqCst);
        let (stock, lines) = stage.sold_and_lines().await;
        assert!(
            outcome.is_ok() && (stock, lines) == (9, 1),
            "item 2's stock {stock}, order lines {lines} after {runs} runs of the outer \
             transaction; the caller got {outcome:?}"
        );
    }

    /// The blocking side's `a_deadlocked_versioned_write_under_a_nested_retry_is_not_applied_twice_by_the_owners_retry`,
    /// on diesel-async: the owner (`transaction_with_retry`) records an order
    /// line and locks item 1, then [`sell_two`] as `how` says. One order line, one
    /// unit sold.
    async fn not_applied_twice(name: &str, how: Sell) {
        let stage = Stage::new(name);
        let runs = AtomicU32::new(0);
        let mut conn = stage.connect().await;
        let outcome = lockkit::asynchronous::transaction_with_retry(
            &mut conn,
            &RetryPolicy::default(),
            async |conn| {
                conn.batch_execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
                    .await?;
                record_and_sell(conn, &runs, &stage, how).await
            },
        )
        .await;
        let runs = AtomicU32::load(&runs, Ordering::SeqCst);
        let (stock, lines) = stage.sold_and_lines().await;
        assert!(
            10 - i64::from(stock) == lines,
            "{how:?}: {} units of item 2 sold for {lines} order lines (runs of the outer \
             transaction: {runs}; the caller got {outcome:?})",
            10 - stock,
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_deadlocked_versioned_write_under_a_nested_retry_is_not_applied_twice() {
        not_applied_twice("async_owner_retry_versioned_deadlock", Sell::Versioned).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_deadlocked_conditional_update_under_a_nested_retry_is_not_applied_twice() {
        not_applied_twice("async_owner_retry_update_if_deadlock", Sell::Conditional).await;
    }

    /// The blocking side's `a_write_after_a_caught_abort_of_a_versioned_write_is_refused`,
    /// on diesel-async: in the caller's own transaction, which holds item 1,
    /// [`sell_two`] is the deadlock's victim; the caller catches its
    /// `TransactionAborted` and records an order line, which must not commit
    /// on its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_after_a_caught_abort_of_a_versioned_write_is_refused() {
        use diesel_async::AsyncConnection;
        let stage = Stage::new("async_caught_versioned_abort_write");
        let mut conn = stage.connect().await;
        let mut caught = None;
        let outcome: Result<(), Error> = conn
            .transaction(async |conn| {
                conn.batch_execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
                    .await?;
                stage.cue();
                caught = Some(sell_two(conn, Sell::Versioned).await);
                order_line(conn, 1).await
            })
            .await;
        let (stock, lines) = stage.sold_and_lines().await;
        let rows = format!("item 2's stock {stock}, order lines {lines}");
        assert_refused(&caught, true, &outcome, (stock, lines) == (10, 0), &rows);
    }

    /// The blocking side's
    /// `a_trigger_refusal_worded_like_a_deadlock_leaves_the_callers_transaction_to_roll_back`,
    /// on diesel-async: a trigger's `SIGNAL` in InnoDB's words ends nothing, so
    /// lockkit must not open its stand-in (which would commit the caller's
    /// order line) and the caller's rollback leaves nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trigger_refusal_worded_like_a_deadlock_leaves_the_callers_transaction_to_roll_back()
    {
        use diesel_async::AsyncConnection;
        let db = lockkit_tests::TestDb::<Blocking>::new("async_deadlock_worded_refusal");
        lockkit_tests::aborts::seed_for_deadlock(&mut db.conn());
        lockkit_tests::exec(
            &mut db.conn(),
            lockkit_tests::aborts::DEADLOCK_WORDED_REFUSAL,
        );
        let mut conn: Async = async_common::connect(&db.url, "mysql").await;
        let mut refused = None;
        let outcome: Result<(), Error> = after_order_line_1!(conn, {
            let mut two = item!(&mut *conn, 2);
            two.stock = -1;
            refused = Some(two.update_versioned(conn).await);
            Err(Error::NoRowMatched)
        });
        let mut fresh: Async = async_common::connect(&db.url, "mysql").await;
        let (stock, lines) = stock_and_lines!(&mut fresh, 2);
        let rows = format!("item 2's stock {stock}, order lines {lines}");
        assert_refused(&refused, false, &outcome, (stock, lines) == (10, 0), &rows);
    }

    /// The blocking side's `caught_twin_abort`, on diesel-async: in the
    /// caller's own transaction at `isolation` (the server's default when
    /// `None`), which records order line 1 and holds item 1, a versioned write
    /// of `twin` (a model whose key the database does not enforce) is the
    /// deadlock's victim beside `aborts::twin_holder`; the caller catches its error
    /// and records order line 2, which must not commit on its own.
    async fn caught_twin_abort(name: &str, isolation: Option<&str>, mut twin: Twin) {
        use diesel_async::AsyncConnection;
        let stage = Stage::beside(name, lockkit_tests::aborts::twin_holder);
        let mut conn = stage.connect().await;
        if let Some(level) = isolation {
            let set = format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}");
            conn.batch_execute(&set).await.unwrap();
        }
        let mut caught = None;
        let outcome: Result<(), Error> = after_order_line_1!(conn, {
            conn.batch_execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
                .await?;
            stage.cue();
            twin.label = "sold".into();
            caught = Some(twin.update_versioned(conn).await);
            order_line(conn, 2).await
        });
        let (_, lines) = stage.sold_and_lines().await;
        let rows = format!("order lines {lines}");
        assert_refused(&caught, true, &outcome, lines == 0, &rows);
    }

    /// The blocking side's `a_write_after_a_caught_abort_of_a_stale_writes_follow_up_read_is_refused`:
    /// under READ COMMITTED the stale UPDATE skips the neighbour's row, and the
    /// follow-up read of the current version is the deadlock's victim.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_after_a_caught_abort_of_a_stale_writes_follow_up_read_is_refused() {
        let stale = Twin {
            id: 1,
            label: "a".into(),
            lock_version: 0,
        };
        let name = "async_caught_follow_up_read_abort";
        caught_twin_abort(name, Some("READ COMMITTED"), stale).await;
    }

    /// The blocking side's `a_write_after_a_caught_abort_of_a_write_in_a_savepoint_is_refused`:
    /// the twin's UPDATE, in a savepoint, is the deadlock's victim.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_write_after_a_caught_abort_of_a_write_in_a_savepoint_is_refused() {
        let fresh = Twin {
            id: 1,
            label: "a".into(),
            lock_version: 1,
        };
        caught_twin_abort("async_caught_savepoint_write_abort", None, fresh).await;
    }

    /// The blocking side's `a_retry_around_the_callers_transaction_runs_it_again_after_a_deadlocked_versioned_write`,
    /// on diesel-async: `retry` around the caller's own transaction, which
    /// records an order line and then [`sell_two`]; the abort is settled by the
    /// caller's rollback, and the retry runs the transaction again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retry_around_the_callers_transaction_runs_it_again_after_a_deadlocked_versioned_write(
    ) {
        use diesel_async::AsyncConnection;
        let stage = Stage::new("async_retry_around_own_transaction");
        let runs = AtomicU32::new(0);
        let conn = tokio::sync::Mutex::new(stage.connect().await);
        let outcome = lockkit::asynchronous::retry(&RetryPolicy::default(), |_| async {
            let mut conn = conn.lock().await;
            conn.transaction::<_, Error, _>(async |conn| {
                conn.batch_execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
                    .await?;
                record_and_sell(conn, &runs, &stage, Sell::Versioned).await
            })
            .await
        })
        .await;
        assert_retried_whole(stage, &runs, outcome).await;
    }

    /// The blocking side's `a_deadlocked_bulk_versioned_update_outside_a_transaction_is_retried`,
    /// on diesel-async: `update_all_by_version` owns its transaction, whose
    /// UPDATE of item 2 is the deadlock's victim; the `retry` around it runs it
    /// again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_deadlocked_bulk_versioned_update_outside_a_transaction_is_retried() {
        let stage = Stage::new("async_bulk_versioned_deadlock_retry");
        let attempts = AtomicU32::new(0);
        let conn = tokio::sync::Mutex::new(stage.connect().await);
        stage.cue();
        let outcome = lockkit::asynchronous::retry(&RetryPolicy::default(), |_| async {
            attempts.fetch_add(1, Ordering::SeqCst);
            let mut conn = conn.lock().await;
            let one = item!(&mut *conn, 1).lock_version;
            let two = item!(&mut *conn, 2).lock_version;
            let sale = items::stock.eq(items::stock - 1);
            Item::update_all_by_version(&mut *conn, &[(1, one), (2, two)], sale)
                .await
                .map(drop)
        })
        .await;
        let attempts = AtomicU32::load(&attempts, Ordering::SeqCst);
        let mut fresh = stage.connect().await;
        let stock = |id: i32| items::table.find(id).select(items::stock);
        let stocks: (i32, i32) = (
            stock(1).first(&mut fresh).await.unwrap(),
            stock(2).first(&mut fresh).await.unwrap(),
        );
        stage.sold_and_lines().await;
        assert!(
            outcome.is_ok() && stocks == (9, 9),
            "stocks of items 1 and 2: {stocks:?} after {attempts} attempts; the caller got \
             {outcome:?}"
        );
    }

    /// The blocking side's `a_deadlocked_versioned_write_in_an_outermost_with_lock_is_retried_whole`,
    /// on diesel-async: `with_lock` on item 1 inside `retry` owns the
    /// transaction, records an order line, then [`sell_two`]. The outer retry
    /// runs it again whole: `Ok`, one order line, one unit sold.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_deadlocked_versioned_write_in_an_outermost_with_lock_is_retried_whole() {
        let stage = Stage::new("async_with_lock_retry_versioned_deadlock");
        let runs = AtomicU32::new(0);
        let conn = tokio::sync::Mutex::new(stage.connect().await);
        let outcome = lockkit::asynchronous::retry(&RetryPolicy::default(), |_| async {
            let mut conn = conn.lock().await;
            lockkit::asynchronous::with_lock(
                &mut *conn,
                1,
                LockOptions::default(),
                async |conn, _one: Item| {
                    record_and_sell(conn, &runs, &stage, Sell::Versioned).await
                },
            )
            .await
        })
        .await;
        assert_retried_whole(stage, &runs, outcome).await;
    }

    /// A database `name` whose item 1 has 10 units, and a connection to it.
    async fn item_1_at_10(name: &str) -> (lockkit_tests::TestDb<Blocking>, Async) {
        let db = async_common::seeded::<Blocking>(name, &[(1, 10)]);
        let conn = async_common::connect(&db.url, "mysql").await;
        (db, conn)
    }

    /// `work` under `transaction_with_retry` (up to three attempts) on `conn`:
    /// what that returned, and how many attempts ran. Each attempt runs a copy
    /// of `work`, which captures only references.
    async fn counting_attempts<F>(conn: &mut Async, work: F) -> (Result<(), Error>, u32)
    where
        F: for<'r> lockkit::asynchronous::work::AsyncAttempt<
                &'r mut Async,
                Result<(), Error>,
                Fut: Send,
            > + Clone
            + Send
            + Sync,
    {
        let attempts = AtomicU32::new(0);
        let outcome = lockkit::asynchronous::transaction_with_retry(
            conn,
            &RetryPolicy::immediate(3),
            async |conn: &mut Async| {
                attempts.fetch_add(1, Ordering::SeqCst);
                let mut work = work.clone();
                work(conn).await
            },
        )
        .await;
        (outcome, AtomicU32::load(&attempts, Ordering::SeqCst))
    }

    /// Item 1's stock, read on a connection of its own (outside every
    /// transaction the test left).
    async fn stock_on_a_fresh_connection(url: &str) -> i32 {
        let mut fresh: Async = async_common::connect(url, "mysql").await;
        items::table
            .find(1)
            .select(items::stock)
            .first(&mut fresh)
            .await
            .unwrap()
    }

    /// The blocking side's `work_whose_transaction_ended_without_a_failed_statement_is_not_run_again`,
    /// on diesel-async: the work sells, a statement commits the transaction
    /// implicitly, the work sells again (committed on its own) while another
    /// connection of the process opens a stand-in. lockkit asks before COMMIT,
    /// finds no transaction open, and must not run the work again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_whose_transaction_ended_without_a_failed_statement_is_not_run_again() {
        let (db, mut conn) = item_1_at_10("async_ended_without_a_failed_statement").await;
        let other = Mutex::new(db.connect());
        let (outcome, attempts) = counting_attempts(&mut conn, async |conn| {
            let sell = diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1));
            sell.clone().execute(conn).await?;
            conn.batch_execute("CREATE TABLE IF NOT EXISTS committed_implicitly (id INT)")
                .await?;
            sell.execute(conn).await?;
            lockkit_tests::aborts::open_a_stand_in(&mut other.lock().unwrap());
            Ok::<_, Error>(())
        })
        .await;
        let stock = stock_on_a_fresh_connection(&db.url).await;
        lockkit_tests::aborts::assert_not_run_again(attempts, &outcome, stock);
    }

    /// The blocking side's `a_nested_call_after_an_implicit_commit_is_never_retried`,
    /// on diesel-async: a nested call fails after a statement of it committed
    /// the transaction implicitly; the owner must not run the committed sale
    /// again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_call_after_an_implicit_commit_is_never_retried() {
        let (db, mut conn) = item_1_at_10("async_nested_implicit_commit").await;
        let (outcome, attempts) = counting_attempts(&mut conn, async |conn| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)
                .await?;
            lockkit::asynchronous::transaction_with_retry(
                conn,
                &RetryPolicy::immediate(3),
                async |conn| {
                    conn.batch_execute(
                        "CREATE TABLE IF NOT EXISTS nested_committed_implicitly (id INT)",
                    )
                    .await?;
                    Err::<(), _>(Error::NotFound)
                },
            )
            .await
        })
        .await;
        let stock = stock_on_a_fresh_connection(&db.url).await;
        assert!(
            attempts == 1 && stock == 9 && outcome.as_ref().is_err_and(|e| !e.is_retryable()),
            "{attempts} attempt(s), stock {stock}: {outcome:?}"
        );
    }

    /// The blocking side's `a_key_is_kept_for_work_that_wrote_after_innodb_rolled_it_back`
    /// (`idempotency.rs`), on diesel-async: the work holds item 1, lets its
    /// lock on item 2 be the deadlock's victim, then sells one unit of item 2
    /// in autocommit, which commits on its own, and returns or panics. The key
    /// must not be released for the client's retry to sell again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_idempotency_key_is_kept_for_work_that_wrote_after_innodb_rolled_it_back() {
        use diesel_migrations::MigrationHarness;
        use lockkit::idempotency::Idempotency;
        for panics in [false, true] {
            let stage = Stage::new(&format!("async_idempotency_wrote_after_end_{panics}"));
            stage
                .db
                .conn()
                .run_pending_migrations(lockkit_tests::idempotency_migrations("mysql"))
                .unwrap();
            let keys = Idempotency::default();
            let mut conn = stage.connect().await;
            let outcome = async_common::caught_panic(async_common::run_order_1(
                &keys,
                &mut conn,
                async |conn: &mut Async| {
                    conn.batch_execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
                        .await?;
                    stage.cue();
                    let victim = items::table.find(2).for_update().first::<Item>(conn).await;
                    assert!(
                        victim.is_err(),
                        "the lock on item 2 was the deadlock's victim"
                    );
                    sell_item_2!(conn)?; // in autocommit
                    if panics {
                        panic!("a bug in the handler");
                    }
                    Ok::<_, Error>("201 sold".to_owned())
                },
            ))
            .await;
            match &outcome {
                Err(_) => assert!(panics, "a panic without one"),
                Ok(outcome) => assert!(
                    outcome.as_ref().is_err_and(|err| !err.is_retryable()),
                    "{outcome:?}"
                ),
            }
            let context = format!("panics: {panics}:");
            async_common::assert_retry_in_progress(
                &keys,
                &mut conn,
                &context,
                async |conn: &mut Async| {
                    sell_item_2!(conn)?;
                    Ok::<_, Error>("201 sold".to_owned())
                },
            )
            .await;
            let (stock, _) = stage.sold_and_lines().await;
            assert_eq!(stock, 9, "the unit sold once");
        }
    }

    /// The blocking side's `a_key_is_released_for_work_that_failed_after_a_lock_wait_timeout_it_let_go`
    /// (`idempotency.rs`), on diesel-async: a lock wait timeout ends no
    /// transaction on this server, so what the work wrote after it went with
    /// the rollback of its error or panic, and the key is released.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_idempotency_key_is_released_for_work_that_failed_after_a_lock_wait_timeout_it_let_go(
    ) {
        use diesel_migrations::MigrationHarness;
        use lockkit::asynchronous::idempotency;
        use lockkit::idempotency::{Idempotency, Outcome};
        let db = lockkit_tests::TestDb::<diesel::MysqlConnection>::new(
            "async_idempotency_after_lock_wait_timeout",
        );
        db.conn()
            .run_pending_migrations(lockkit_tests::idempotency_migrations("mysql"))
            .unwrap();
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut holder = db.connect();
        lockkit_tests::exec(&mut holder, "BEGIN");
        lockkit_tests::exec(&mut holder, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
        let keys = Idempotency::default();
        let mut conn: AsyncMysqlConnection = async_common::connect(&db.url, "mysql").await;
        conn.batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
            .await
            .unwrap();
        for panics in [false, true] {
            let key = if panics {
                "order-panics"
            } else {
                "order-fails"
            };
            let failed = async_common::caught_panic(idempotency::run(
                &keys,
                &mut conn,
                "tenant-1",
                key,
                "f",
                async |c: &mut AsyncMysqlConnection| -> Result<String, Error> {
                    let timed_out = diesel::update(items::table.find(1))
                        .set(items::stock.eq(items::stock - 1))
                        .execute(c)
                        .await;
                    assert!(timed_out.is_err(), "item 1 is held: {timed_out:?}");
                    // In the transaction, which lives on.
                    diesel::update(items::table.find(2))
                        .set(items::stock.eq(items::stock - 1))
                        .execute(c)
                        .await?;
                    if panics {
                        panic!("a bug in the handler");
                    }
                    Err(Error::InvalidInput("the handler gave up"))
                },
            ))
            .await;
            assert_eq!(failed.is_err(), panics, "{key}");
            let stock: i32 = items::table
                .find(2)
                .select(items::stock)
                .first(&mut conn)
                .await
                .unwrap();
            assert_eq!(stock, 10, "{key}: the work was rolled back");
            let again = idempotency::run(
                &keys,
                &mut conn,
                "tenant-1",
                key,
                "f",
                async |_: &mut AsyncMysqlConnection| Ok::<_, Error>("ok".to_owned()),
            )
            .await;
            assert!(
                matches!(again, Ok(Outcome::Ran(_))),
                "{key}: the retry got {again:?}"
            );
        }
        lockkit_tests::exec(&mut holder, "ROLLBACK");
    }
}
