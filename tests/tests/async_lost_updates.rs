//! `lost_updates.rs` on diesel-async: the same promises, the same holes.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use lockkit::asynchronous::locked_transaction;
use lockkit::asynchronous::prelude::*;
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;
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

        // B reads v0, writes its 7 and commits.
        let mut b = item!(&mut b_conn, 1);
        b.stock = 7;
        b.update_versioned(&mut b_conn).await.unwrap();

        // A writes again from its rolled-back 1: it must not land over B's.
        a.stock = 3;
        let again = a.update_versioned(&mut a_conn).await;
        let stock = item!(&mut b_conn, 1).stock;
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock == 7,
            "A's rolled-back version 1 matched B's committed 1 once a rolled-back \
             delete had cleared the journal: {again:?}, stock {stock} (B's 7 lost)"
        );
    }
}
