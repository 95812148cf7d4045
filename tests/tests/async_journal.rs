//! The rollback journal on diesel-async, on PostgreSQL, MariaDB and SQLite: a
//! struct whose versioned write was rolled back with its transaction (or
//! savepoint) writes as if its version had been restored, never over somebody
//! else's later write; a rolled-back `with_lock` leaves the next `with_lock`
//! on the row writable; and structs retried on other connections of a pool
//! write as restored.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_common::on_tasks;
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_async::SimpleAsyncConnection;
use lockkit::asynchronous::prelude::*;
use lockkit::asynchronous::{locked_transaction, transaction_with_retry, with_lock};
use lockkit::{CurrentState, Error, LockOptions, RetryPolicy};
use lockkit_tests::models::{Archived, Item};
use lockkit_tests::schema::items;
use lockkit_tests::seed_items;

/// Runs `update_versioned` on `$item` in a transaction that then rolls back.
macro_rules! write_and_roll_back {
    ($conn:expr, $item:expr) => {{
        let rolled_back = locked_transaction($conn, LockOptions::default(), async |c| {
            $item.update_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(
            matches!(rolled_back, Err(Error::NoRowMatched)),
            "{rolled_back:?}"
        );
    }};
}

/// `$item` deletes its row on `$conn`, which leaves `items` empty.
macro_rules! deletes_the_only_row {
    ($conn:expr, $item:expr) => {{
        $item.delete_versioned($conn).await.unwrap();
        assert_eq!(
            items::table.count().get_result::<i64>($conn).await.unwrap(),
            0
        );
    }};
}

/// Item 1 seeded; A's and B's connections; A's struct of item 1, whose write
/// of stock 5 was rolled back.
macro_rules! a_write_rolled_back {
    ($db:expr) => {{
        seed_items(&mut $db.conn(), &[(1, 10)]);
        let mut a_conn: Async = async_common::connect(&$db.url, BACKEND).await;
        let b_conn: Async = async_common::connect(&$db.url, BACKEND).await;
        let mut a = item!(&mut a_conn, 1);
        a.stock = 5;
        write_and_roll_back!(&mut a_conn, a);
        (a_conn, b_conn, a)
    }};
}

/// The blocking side's `assert_stale_after_a_rolled_back_move_past`
/// (`combined`) on diesel-async: A's write rolls back; another instance
/// commits v1 (stock 7); in diesel-async's own transaction A's write moves
/// the row past its number (v2) and is stale, A reloads and, when `$writes`,
/// sells one (v3); the transaction rolls back. The other instance then
/// commits v2 (stock 6): the reloaded struct must be stale.
macro_rules! stale_after_a_rolled_back_move_past {
    ($db:expr, $writes:expr) => {{
        use diesel_async::AsyncConnection;
        let (mut a_conn, mut b_conn, mut a) = a_write_rolled_back!($db);
        let other = |sql: &'static str| diesel::sql_query(sql);
        other("UPDATE items SET stock = 7, lock_version = 1 WHERE id = 1 AND lock_version = 0")
            .execute(&mut b_conn)
            .await
            .unwrap();
        let mut kept = None;
        let rolled_back = a_conn
            .transaction::<(), Error, _>(async |c| {
                a.stock = 5;
                let stale = a.update_versioned(c).await;
                assert!(matches!(stale, Err(Error::Stale(_))), "{stale:?}");
                let mut reloaded = item!(c, 1);
                assert_eq!(
                    (reloaded.stock, reloaded.lock_version),
                    (7, 2),
                    "moved past A's number"
                );
                if $writes {
                    reloaded.stock -= 1;
                    reloaded.update_versioned(c).await?;
                }
                kept = Some(reloaded);
                Err(Error::NoRowMatched)
            })
            .await;
        assert!(rolled_back.is_err());
        other("UPDATE items SET stock = 6, lock_version = 2 WHERE id = 1 AND lock_version = 1")
            .execute(&mut b_conn)
            .await
            .unwrap();
        let mut held = kept.unwrap();
        held.stock = 1;
        let again = held.update_versioned(&mut a_conn).await;
        let stock = item!(&mut b_conn, 1).stock;
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock == 6,
            "the reloaded struct wrote over the other's commit: {again:?}, stock {stock}"
        );
    }};
}

/// Writes `$item` (item `$id`) with its stock one higher in a locked
/// transaction on a connection of `$pool`, until one commits: the first
/// attempt rolled back when `$roll_back_first`, a stale struct reloaded, a
/// retryable error tried again. The struct's stock moves only with the commit;
/// how many attempts were stale. A macro: the versioned write's trait bounds
/// are per connection type.
macro_rules! increment_until_committed {
    ($pool:expr, $item:expr, $id:expr, $roll_back_first:expr) => {{
        let mut roll_back = $roll_back_first;
        let mut stale = 0;
        loop {
            let mut conn = $pool.get().await.unwrap();
            let result = locked_transaction(&mut *conn, LockOptions::default(), async |c| {
                $item.stock += 1;
                let written = $item.update_versioned(c).await;
                $item.stock -= 1;
                written?;
                tokio::task::yield_now().await;
                if roll_back {
                    return Err(Error::NoRowMatched);
                }
                Ok(())
            })
            .await;
            drop(conn);
            match result {
                Ok(()) => {
                    $item.stock += 1;
                    break stale;
                }
                Err(Error::NoRowMatched) => roll_back = false,
                Err(Error::Stale(_)) => {
                    stale += 1;
                    $item = item!(&mut *$pool.get().await.unwrap(), $id);
                }
                Err(err) if err.is_retryable() => {}
                Err(err) => panic!("{err}"),
            }
        }
    }};
}

async_backend_tests! {
    /// The blocking side's test of the same name (`combined`), on diesel-async:
    /// on a connection with instrumentation of its own, a struct rolled back
    /// in a plain transaction, retried in another plain transaction after
    /// another instance's commit, must be stale.
    async fn a_rolled_back_struct_never_writes_over_another_instances_commit_in_a_later_plain_transaction_on_a_connection_with_its_own_instrumentation(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut own: Async = async_common::connect(&db.url, BACKEND).await;
        diesel_async::AsyncConnection::set_instrumentation(&mut own, |_: diesel::connection::InstrumentationEvent<'_>| {});
        let mut a = item!(&mut own, 1); // v0
        let rolled_back = diesel_async::AsyncConnection::transaction(&mut own, async |c| {
            a.stock = 5;
            a.update_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());
        // Another instance of the application writes v0 -> v1 (stock 7) and commits.
        lockkit_tests::exec(
            &mut db.conn(),
            "UPDATE items SET stock = 7, lock_version = lock_version + 1 \
             WHERE id = 1 AND lock_version = 0",
        );
        a.stock = 3;
        let again =
            diesel_async::AsyncConnection::transaction(&mut own, async |c| a.update_versioned(c).await)
                .await;
        let stock = stock!(&mut own);
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock == 7,
            "A's rolled-back version 1 matched the other instance's committed 1: \
             {again:?}, stock {stock} (its 7 lost)"
        );
    }

    /// And what that must not cost: a struct whose write committed writes on,
    /// in the next plain transaction and outside one.
    async fn a_struct_written_in_a_committed_plain_transaction_writes_on_on_a_connection_with_its_own_instrumentation(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut own: Async = async_common::connect(&db.url, BACKEND).await;
        diesel_async::AsyncConnection::set_instrumentation(&mut own, |_: diesel::connection::InstrumentationEvent<'_>| {});
        let mut a = item!(&mut own, 1);
        for _ in 0..2 {
            diesel_async::AsyncConnection::transaction(&mut own, async |c| {
                a.stock -= 1;
                a.update_versioned(c).await
            })
            .await
            .unwrap();
        }
        a.stock -= 1;
        a.update_versioned(&mut own).await.unwrap();
        let stored = item!(&mut own, 1);
        assert_eq!((stored.stock, stored.lock_version), (7, 3));
        assert_eq!(stored, a);
    }

    /// The blocking side's `with_lock_reports_what_committed_when_the_work_lets_a_failed_statement_go`
    /// (`swallowed_errors`), on diesel-async: on a connection with
    /// instrumentation of its own, no journal sees the statement that failed,
    /// and lockkit asks the server before it commits. PostgreSQL has aborted
    /// the transaction (its `COMMIT` is a `ROLLBACK`): the caller must not be
    /// told the sale went through.
    async fn with_lock_reports_what_committed_when_the_work_lets_a_failed_statement_go(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut own: Async = async_common::connect(&db.url, BACKEND).await;
        diesel_async::AsyncConnection::set_instrumentation(&mut own, |_: diesel::connection::InstrumentationEvent<'_>| {});
        let result = with_lock(&mut own, 1, LockOptions::default(), async |c, item: Item| {
            diesel::update(items::table.find(item.id))
                .set(items::stock.eq(item.stock - 1))
                .execute(c)
                .await?;
            let duplicate = diesel::sql_query(
                "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'dup', 0, 0)",
            )
            .execute(c)
            .await;
            assert!(duplicate.is_err());
            Ok::<_, Error>(())
        })
        .await;
        let stock = item!(&mut own, 1).stock;
        assert!(
            result.is_ok() == (stock == 9) && (BACKEND != "postgres" || stock == 10),
            "with_lock returned {result:?}; stock {stock}"
        );
    }

    /// A form's save is rolled back; the form (the struct) is kept and opened
    /// twice (cloned): alice saves first, as restored; bob, who never saw
    /// alice's save, must be stale. The restored write committed the
    /// rolled-back number, which bob's copy holds too, before it moved past it.
    async fn a_copy_of_a_rolled_back_struct_never_writes_over_the_restored_write(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut a_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut b_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let form = tokio::sync::Mutex::new(item!(&mut a_conn, 1));
        let rolled_back = locked_transaction(&mut a_conn, LockOptions::default(), async |c| {
            let mut form = form.lock().await;
            form.stock = 9;
            form.update_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());
        let form = form.into_inner();
        let (mut alice, mut bob) = (form.clone(), form);
        alice.stock = 7;
        alice.update_versioned(&mut a_conn).await.unwrap();
        bob.name = "bob's rename".into();
        let saved = bob.update_versioned(&mut b_conn).await;
        let row = item!(&mut b_conn, 1);
        assert!(
            matches!(saved, Err(Error::Stale(_))) && row.stock == 7,
            "bob's copy of the rolled-back struct matched alice's restored write: {saved:?}, \
             row {row:?} (alice's 7 lost)"
        );
    }

    /// A's write is rolled back, B then writes the row (0 -> 1, B's data), and
    /// A writes again holding 1: without the journal that matched B's version
    /// and overwrote B's data.
    async fn a_rolled_back_write_never_overwrites_a_later_writer(db) {
        let (mut a_conn, mut b_conn, mut a) = a_write_rolled_back!(db);
        assert_eq!(item!(&mut a_conn, 1).lock_version, 0, "the row is back at version 0");

        let mut b = item!(&mut b_conn, 1);
        b.stock = 7;
        b.update_versioned(&mut b_conn).await.unwrap();

        a.stock = 3;
        let err = a.update_versioned(&mut a_conn).await.unwrap_err();
        assert!(matches!(err, Error::Stale(_)), "{err:?}");
        let stored = item!(&mut a_conn, 1);
        assert_eq!((stored.stock, stored.lock_version), (7, 2), "B's write stands; the version moved past the reused number");
        // B's write moved the row past A's rolled-back number at once: B's
        // struct holds the number after and writes again; A, reloaded, too.
        assert_eq!(b.lock_version, 2);
        b.stock = 6;
        b.update_versioned(&mut b_conn).await.unwrap();
        let mut a = item!(&mut a_conn, 1);
        a.stock = 5;
        a.update_versioned(&mut a_conn).await.unwrap();
        assert_eq!(item!(&mut a_conn, 1).lock_version, 4);
    }

    /// The blocking side's `a_write_to_a_table_of_another_schema_..`
    /// (`lost_updates`): a committed write to row 1 of `lockkit_archive.items`
    /// (a `table!` named with its schema) is not a write to the `items` row 1
    /// A's rolled-back write left, and must not make the journal forget it.
    async fn a_write_to_a_table_of_another_schema_does_not_make_the_journal_forget_a_rolled_back_write(db) {
        let (mut a_conn, mut b_conn, mut a) = a_write_rolled_back!(db);
        a_conn.batch_execute(&lockkit_tests::archive_sql(BACKEND, 1)).await.unwrap();
        let mut archived = Archived { id: 1, name: "archived".into(), stock: 9, lock_version: 0 };
        archived.update_versioned(&mut a_conn).await.unwrap();
        b_commits_then_a_is_stale!(
            &mut a_conn,
            &mut b_conn,
            a,
            "the archive's write had cleared the journal"
        );
    }

    /// As above, but B writes inside a transaction of its own, which commits:
    /// B's write must not commit the number A's rolled-back write gave A (1),
    /// or A's next write, expecting 1, lands over B's.
    async fn a_rolled_back_number_is_never_committed_by_a_later_writer_in_a_transaction(db) {
        let (mut a_conn, mut b_conn, mut a) = a_write_rolled_back!(db);

        let mut b = item!(&mut b_conn, 1);
        locked_transaction(&mut b_conn, LockOptions::default(), async |c| {
            b.stock = 6;
            b.update_versioned(c).await
        })
        .await
        .unwrap();

        a.stock = 3;
        let err = a.update_versioned(&mut a_conn).await.unwrap_err();
        assert!(matches!(err, Error::Stale(_)), "{err:?}");
        assert_eq!(item!(&mut a_conn, 1).stock, 6, "B's write stands");
        b.stock = 4;
        b.update_versioned(&mut b_conn).await.unwrap();
        let stored = item!(&mut a_conn, 1);
        assert_eq!((stored.stock, stored.lock_version), (4, b.lock_version));
    }

    /// A conflict after the write rolls the attempt back; the retry writes the
    /// same struct again. Without the journal it held the rolled-back number:
    /// stale on every attempt, so the retry gave up.
    async fn a_struct_retried_after_a_rollback_writes_as_if_restored(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let a = tokio::sync::Mutex::new(item!(&mut conn, 1));
        let attempts = AtomicUsize::new(0);
        transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), async |c| {
            let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
            let mut a = a.lock().await;
            a.stock = 9;
            a.update_versioned(c).await?;
            if attempt == 1 {
                return Err(Error::Deadlock); // a conflict after the write
            }
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(AtomicUsize::load(&attempts, Ordering::SeqCst), 2);
        let stored = item!(&mut conn, 1);
        let mut a = a.into_inner();
        // One committed write; the number the rolled-back attempt left (1) is
        // skipped: a copy of the struct may hold it.
        assert_eq!((stored.stock, stored.lock_version), (9, 2));
        assert_eq!(a, stored);

        // Without a retry the struct keeps working after the rollback as well,
        // and every kind of versioned write is restored the same way.
        a.stock = 1;
        write_and_roll_back!(&mut conn, a);
        a.stock = 8;
        a.update_versioned(&mut conn).await.unwrap();
        assert_eq!(item!(&mut conn, 1), a);
        let rolled_back = locked_transaction(&mut conn, LockOptions::default(), async |c| {
            a.touch_versioned(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());
        a.update_versioned_with(&mut conn, items::stock.eq(items::stock + 1)).await.unwrap();
        let stored = item!(&mut conn, 1);
        // 2, then 3 rolled back and skipped (4), then 5 rolled back and skipped.
        assert_eq!((stored.stock, stored.lock_version), (9, 6));
        assert_eq!(a.lock_version, 6);
        a.stock = 9;
        deletes_the_only_row!(&mut conn, a);
    }

    /// A version from outside (a form's field, `If-Match`) naming a number a
    /// rolled-back write left is stale, never restored as a held struct is.
    async fn a_version_from_outside_naming_a_rolled_back_number_is_stale(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut a = item!(&mut conn, 1);
        a.stock = 5;
        write_and_roll_back!(&mut conn, a);
        let err = Item::update_by_version(&mut conn, 1, 1, items::stock.eq(3)).await.unwrap_err();
        assert!(matches!(err, Error::Stale(_)), "{err:?}");
        let err = Item::delete_by_version(&mut conn, 1, 1).await.unwrap_err();
        assert!(matches!(err, Error::Stale(_)), "{err:?}");
        assert_eq!(item!(&mut conn, 1).stock, 10, "nothing written");
        // The held struct is restored, and deletes.
        deletes_the_only_row!(&mut conn, a);
    }

    /// A committed transaction leaves its versions as they are: the struct
    /// writes on, and a struct that read the row before it is stale.
    async fn a_committed_transaction_leaves_the_struct_writable(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut a = item!(&mut conn, 1);
        let mut old = a.clone();
        locked_transaction(&mut conn, LockOptions::default(), async |c| {
            a.stock = 5;
            a.update_versioned(c).await?;
            a.stock = 4;
            a.update_versioned(c).await
        })
        .await
        .unwrap();
        a.stock = 3;
        a.update_versioned(&mut conn).await.unwrap();
        let stored = item!(&mut conn, 1);
        assert_eq!((stored.stock, stored.lock_version), (3, 3));
        old.stock = 0;
        let err = old.update_versioned(&mut conn).await.unwrap_err();
        assert!(matches!(&err, Error::Stale(s) if s.current == CurrentState::Version(3)), "{err}");
    }

    /// A savepoint rolled back inside a transaction that commits: the struct
    /// is restored to the version before the savepoint's write.
    async fn a_rolled_back_savepoint_is_tracked_like_a_transaction(db) {
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut a_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut b_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut a = item!(&mut a_conn, 1);
        locked_transaction(&mut a_conn, LockOptions::default(), async |c| {
            let inner = locked_transaction(c, LockOptions::default(), async |c| {
                a.stock = 5;
                a.update_versioned(c).await?;
                Err::<(), _>(Error::NoRowMatched)
            })
            .await;
            assert!(inner.is_err());
            diesel::update(items::table.find(2)).set(items::stock.eq(1)).execute(c).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
        let mut b = item!(&mut b_conn, 1);
        b.stock = 7;
        b.update_versioned(&mut b_conn).await.unwrap();
        a.stock = 3;
        assert!(matches!(a.update_versioned(&mut a_conn).await, Err(Error::Stale(_))));
        assert_eq!(item!(&mut a_conn, 1).stock, 7);
        assert_eq!(item!(&mut a_conn, 2).stock, 1, "the outer transaction committed");
    }

    /// A's `with_lock` bumps the version (0 -> 1) and rolls back; B, a writer
    /// A's process does not hear from, moves the row to 1. A's next `with_lock`
    /// reads the row under lock: its version is the row's own, so it locks and
    /// writes (on the blocking side it once "restored" to 0, found 1 and
    /// reported Stale in the transaction that Stale rolled back: Stale forever).
    async fn with_lock_after_a_rolled_back_lock_reads_the_row_afresh(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut a_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let mut b_conn: Async = async_common::connect(&db.url, BACKEND).await;
        let rolled_back = with_lock(&mut a_conn, 1, LockOptions::default(), async |c, item: Item| {
            diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(c).await?;
            Err::<(), _>(Error::NoRowMatched)
        })
        .await;
        assert!(rolled_back.is_err());
        diesel::sql_query("UPDATE items SET stock = stock + 2, lock_version = lock_version + 1 WHERE id = 1")
            .execute(&mut b_conn)
            .await
            .unwrap();
        with_lock(&mut a_conn, 1, LockOptions::default(), async |c, item: Item| {
            diesel::update(items::table.find(1)).set(items::stock.eq(item.stock + 3)).execute(c).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
        let stored = item!(&mut a_conn, 1);
        assert_eq!((stored.stock, stored.lock_version), (15, 2), "B's and A's writes, one bump each");
    }

    /// A's versioned write (v0 -> v1) rolls back; another instance commits its
    /// own v1. A reads the row afresh in `transaction_with_retry` and writes:
    /// the read holds the other's 1, so the write lands, after a retry that
    /// reads again (the first attempt's move past the number, which its
    /// rollback undid, is made again outside it), and the struct that holds
    /// the rolled-back 1 still never writes.
    async fn a_fresh_read_in_a_retried_transaction_writes_over_a_number_another_instance_committed(db) {
        let (mut a_conn, mut b_conn, mut held) = a_write_rolled_back!(db);
        diesel::sql_query("UPDATE items SET stock = 7, lock_version = lock_version + 1 WHERE id = 1 AND lock_version = 0")
            .execute(&mut b_conn)
            .await
            .unwrap();
        let sold = transaction_with_retry(&mut a_conn, &RetryPolicy::immediate(3), async |c| {
            let mut item = item!(c, 1);
            item.stock -= 1;
            item.update_versioned(c).await?;
            Ok::<_, Error>(item.stock)
        })
        .await;
        let stored = item!(&mut b_conn, 1);
        assert!(
            matches!(sold, Ok(6)) && (stored.stock, stored.lock_version) == (6, 3),
            "a fresh read of the other's commit was refused: {sold:?}, row {stored:?}"
        );
        held.stock = 2;
        let again = held.update_versioned(&mut a_conn).await;
        let stock = item!(&mut b_conn, 1).stock;
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock == 6,
            "the rolled-back struct wrote: {again:?}, stock {stock}"
        );
    }

    async fn a_struct_written_after_a_move_past_in_a_rolled_back_transaction_is_stale(db) {
        stale_after_a_rolled_back_move_past!(db, true);
    }

    async fn a_struct_read_after_a_move_past_in_a_rolled_back_transaction_is_stale(db) {
        stale_after_a_rolled_back_move_past!(db, false);
    }

    /// A's write is rolled back (A holds 1, the row is back at 0); B's
    /// `with_lock` then bumps the row it locks to 1, A's rolled-back number, and
    /// must move it past (on PostgreSQL the bump is folded into the locking
    /// read), or A's next write, expecting 1, lands over B's.
    async fn a_with_lock_bump_moves_past_a_rolled_back_number(db) {
        let (mut a_conn, mut b_conn, mut a) = a_write_rolled_back!(db);
        with_lock(&mut b_conn, 1, LockOptions::default(), async |c, item: Item| {
            diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 4)).execute(c).await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
        a.stock = 3;
        let written = a.update_versioned(&mut a_conn).await;
        let stored = item!(&mut a_conn, 1);
        assert!(
            matches!(written, Err(Error::Stale(_))) && stored.stock == 6,
            "A's rolled-back number matched the row B's with_lock left: {written:?}, row {stored:?} \
             (B's stock 6 overwritten)"
        );
    }

    /// Six tasks on two rows of a pool of 3: each increment is first written in
    /// a transaction that rolls back, then the same struct again in one that
    /// commits (reloaded when stale). A struct holding a rolled-back number
    /// could match another task's commit of that number: 1 to 9 of 72
    /// increments were lost before writes moved rows past such numbers.
    async fn tasks_that_roll_back_and_retry_on_shared_rows_lose_nothing(db) {
        const TASKS: i32 = 6;
        const ROUNDS: i32 = 20;
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 3).await;
        on_tasks(TASKS as usize, |task| {
            let pool = pool.clone();
            async move {
                let id = 1 + task as i32 % 2;
                for _ in 0..ROUNDS {
                    let mut item = item!(&mut *pool.get().await.unwrap(), id);
                    increment_until_committed!(pool, item, id, true);
                }
            }
        })
        .await;
        let mut conn = pool.get().await.unwrap();
        let stock = each_item!(&mut *conn, stock);
        assert_eq!(stock, vec![10 + TASKS / 2 * ROUNDS; 2], "no increment lost");
    }

    /// Tasks share a bb8 pool smaller than their number, so a struct written
    /// on one pooled connection is retried on whichever the pool hands out
    /// next. Each task holds the struct of its own row; every other round its
    /// write is rolled back and the same struct is written again in a new
    /// transaction, without a reload. Every retry writes as restored: no stale
    /// write, one committed change per round. (Without the journal
    /// every retry was stale.)
    async fn structs_retried_on_other_pooled_connections_write_as_restored(db) {
        const TASKS: usize = 6;
        const ROUNDS: usize = 12;
        let rows: Vec<(i32, i32)> = (1..=TASKS as i32).map(|id| (id, 10)).collect();
        seed_items(&mut db.conn(), &rows);
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, 3).await;
        let stale = Arc::new(AtomicUsize::new(0));
        let held = on_tasks(TASKS, |task| {
            let (pool, stale) = (pool.clone(), stale.clone());
            async move {
                let id = 1 + task as i32;
                let mut mine = item!(&mut *pool.get().await.unwrap(), id);
                for round in 0..ROUNDS {
                    stale.fetch_add(increment_until_committed!(pool, mine, id, round % 2 == 0), Ordering::SeqCst);
                }
                mine
            }
        })
        .await;
        let mut conn = pool.get().await.unwrap();
        let rows: Vec<Item> = items::table.order(items::id).load(&mut *conn).await.unwrap();
        assert_eq!(AtomicUsize::load(&stale, Ordering::SeqCst), 0, "a retry was stale");
        for (row, mine) in rows.iter().zip(&held) {
            // One bump per round, and one more for each rolled-back number
            // skipped (every other round rolls back once first).
            let version = (ROUNDS + ROUNDS / 2) as i32;
            assert_eq!((row.stock, row.lock_version), (10 + ROUNDS as i32, version));
            assert_eq!(row, mine, "the struct is the row");
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres_search_path {
    use super::*;
    use diesel_async::AsyncPgConnection;
    use lockkit_tests::TestDb;

    /// The blocking side's test of the same name (`combined.rs`): a savepoint
    /// of diesel-async's own whose work let a failed statement go, which
    /// rolls back to the savepoint, and the versioned write in it with it.
    /// Unlike Diesel's, diesel-async's transaction did not announce a release
    /// here even before the journal waited for the `RELEASE` to succeed: the
    /// test keeps the two sides in step.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_in_a_savepoint_whose_release_failed_never_writes_over_a_later_commit() {
        use diesel_async::AsyncConnection;
        let (db, mut a_conn) = async_common::seeded_pg("async_release_failed", &[(1, 10)]).await;
        let mut b_conn: AsyncPgConnection = async_common::connect(&db.url, "postgres").await;
        let mut a = item!(&mut a_conn, 1);
        let a_ref = &mut a;
        a_conn
            .transaction(async |c| {
                let inner = c
                    .transaction(async |c| {
                        a_ref.stock = 5;
                        a_ref.update_versioned(c).await?;
                        let _ = diesel::sql_query("SELECT 1 / 0").execute(c).await;
                        Ok::<_, Error>(())
                    })
                    .await;
                assert!(inner.is_err(), "{inner:?}");
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        assert_eq!(
            item!(&mut b_conn, 1).stock,
            10,
            "the savepoint's write rolled back"
        );
        b_commits_then_a_is_stale!(
            &mut a_conn,
            &mut b_conn,
            a,
            "a savepoint whose RELEASE failed"
        );
    }

    /// The blocking side's `shared_table_through_search_paths`
    /// (`lost_updates`): schema-per-tenant connections (`search_path`
    /// tenant_N, public) reach the shared `public.items` through a `table!`
    /// without a schema. A's write rolls back on tenant 1's connection, B
    /// commits on tenant 2's, A retries on B's: one row, so A must be stale.
    /// `prepare` readies each tenant's connection, before the shared table is
    /// there (it is created, as a migration would, right after).
    async fn shared_table_through_search_paths(
        name: &str,
        prepare: impl AsyncFn(&mut AsyncPgConnection),
    ) {
        let db = TestDb::<diesel::PgConnection>::new(name);
        lockkit_tests::exec(
            &mut db.conn(),
            "CREATE SCHEMA tenant_1; CREATE SCHEMA tenant_2; ALTER TABLE items RENAME TO items_later",
        );
        let tenant = async |schema: &str| {
            let mut conn: AsyncPgConnection = async_common::connect(&db.url, "postgres").await;
            conn.batch_execute(&format!("SET search_path TO {schema}, public"))
                .await
                .unwrap();
            prepare(&mut conn).await;
            conn
        };
        let (mut a_conn, mut b_conn) = (tenant("tenant_1").await, tenant("tenant_2").await);
        lockkit_tests::exec(&mut db.conn(), "ALTER TABLE items_later RENAME TO items");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut a = item!(&mut a_conn, 1);
        a.stock = 5;
        write_and_roll_back!(&mut a_conn, a);
        // A retries on B's connection: tenant 2's.
        b_commits_then_a_is_stale!(
            &mut b_conn,
            &mut b_conn,
            a,
            "retried through tenant 2's connection"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_table_found_through_the_search_path_is_one_table_to_every_tenant() {
        // The connections' journals learn the schema with the key check.
        shared_table_through_search_paths("async_shared_table_across_search_paths", async |_| {})
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_table_created_after_a_tenants_first_write_to_it_is_one_table_to_every_tenant()
    {
        // An application that serves while its migrations run: each
        // connection's first versioned write finds no `items` and fails.
        shared_table_through_search_paths("async_shared_table_created_later", async |conn| {
            let mut early = Item {
                id: 1,
                name: "item 1".into(),
                stock: 1,
                lock_version: 0,
            };
            let refused = early.update_versioned(conn).await;
            assert!(
                refused.is_err(),
                "a write to a table not there yet: {refused:?}"
            );
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_table_found_through_the_search_path_is_one_table_on_connections_lockkit_cannot_watch(
    ) {
        // With instrumentation of their own, the connections keep no journal:
        // the schema is asked at each write that names its row.
        shared_table_through_search_paths("async_shared_table_unwatched", async |conn| {
            diesel_async::AsyncConnection::set_instrumentation(
                conn,
                |_: diesel::connection::InstrumentationEvent<'_>| {},
            );
        })
        .await;
    }
}
