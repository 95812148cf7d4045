//! Optimistic locking (`#[derive(Versioned)]`) on every backend.

use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::{retry, CurrentState, Error, Operation, RetryPolicy};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, seed_items};

/// A facade crate that re-exports lockkit, as an application's own `db`
/// crate does: its users may have no `lockkit` dependency of their own.
mod facade {
    pub use lockkit as locks;
}

/// A model that reaches lockkit through the facade only.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, facade::locks::Versioned)]
#[diesel(table_name = items)]
#[lockkit(crate = "crate::facade::locks")]
struct FacadeItem {
    id: i32,
    name: String,
    stock: i32,
    lock_version: i32,
}

lockkit_tests::backend_tests! {
    fn a_model_that_reaches_lockkit_through_a_facade_is_versioned(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut alice = items::table.find(1).select(FacadeItem::as_select()).first(&mut *conn).unwrap();
        let mut bob = alice.clone();
        alice.stock = 2;
        alice.update_versioned(&mut conn).unwrap();
        bob.stock = 3;
        assert!(matches!(bob.update_versioned(&mut conn), Err(Error::Stale(_))));
        let stored = items::table.find(1).select(FacadeItem::as_select()).first(&mut *conn).unwrap();
        assert_eq!(stored, alice);
        assert_eq!(stored.lock_version, 1);
    }

    fn update_versioned_writes_every_field_and_bumps_the_version(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        item.name = "renamed".into();
        item.stock = 7;
        item.update_versioned(&mut conn).unwrap();
        assert_eq!(item.lock_version, 1);
        let stored = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!(stored, Item { id: 1, name: "renamed".into(), stock: 7, lock_version: 1 });

        item.stock = 6;
        item.update_versioned(&mut conn).unwrap();
        assert_eq!(items::table.find(1).first::<Item>(&mut conn).unwrap(), item);
        assert_eq!(item.lock_version, 2);
    }

    fn a_stale_update_is_refused_and_leaves_row_and_struct_unchanged(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut alice = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let mut bob = alice.clone();

        alice.stock = 2;
        alice.update_versioned(&mut conn).unwrap();

        bob.stock = 3;
        let before = bob.clone();
        let err = bob.update_versioned(&mut conn).unwrap_err();
        assert_eq!(bob, before, "the struct is left exactly as it was");
        let Error::Stale(stale) = err else { panic!("expected Stale, got {err:?}") };
        assert_eq!(stale.table, "items");
        assert_eq!(stale.key, "1");
        assert_eq!(stale.version_column, "lock_version");
        assert_eq!(stale.operation, Operation::Update);
        assert_eq!(stale.expected_version, 0);
        assert_eq!(stale.current, CurrentState::Version(1));
        assert_eq!(
            stale.to_string(),
            "stale update of items 1: expected lock_version = 0, found 1 (changed by someone else)"
        );
        let stored = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!(stored, alice, "the winner's write survives");
    }

    fn a_write_to_a_deleted_row_reports_it_gone(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        exec(&mut conn, "DELETE FROM items WHERE id = 1");
        let err = item.update_versioned(&mut conn).unwrap_err();
        assert_eq!(err.as_stale().unwrap().current, CurrentState::Deleted);
        assert!(err.to_string().ends_with("but the row was deleted"), "{err}");
    }

    fn the_version_is_bumped_once_whatever_the_models_as_changeset_does(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10)]);
        // `Item`'s AsChangeset includes lock_version; `ItemSkippingVersion`'s skips it.
        let mut with = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let mut without = items::table.find(2).first::<ItemSkippingVersion>(&mut conn).unwrap();
        with.update_versioned(&mut conn).unwrap();
        without.update_versioned(&mut conn).unwrap();
        let versions: Vec<i32> = items::table.order(items::id).select(items::lock_version).load(&mut conn).unwrap();
        assert_eq!(versions, vec![1, 1]);
        assert_eq!((with.lock_version, without.lock_version), (1, 1));

        let sql = diesel::debug_query::<Backend, _>(&with.update_versioned_statement()).to_string();
        assert_eq!(sql.matches("lock_version").count(), 3, "SET once (twice named), WHERE once: {sql}");
    }

    fn update_versioned_with_applies_a_custom_changeset(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let stale = item.clone();
        item.update_versioned_with(&mut conn, items::stock.eq(items::stock - 1)).unwrap();
        assert_eq!(item.lock_version, 1);
        let stored = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!((stored.stock, stored.lock_version), (9, 1));

        let mut stale = stale;
        let err = stale.update_versioned_with(&mut conn, items::stock.eq(items::stock - 1)).unwrap_err();
        assert!(matches!(err, Error::Stale(_)));
        assert_eq!(stale.lock_version, 0);
        assert_eq!(items::table.find(1).select(items::stock).first::<i32>(&mut conn).unwrap(), 9);
    }

    fn delete_versioned_checks_the_version(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10)]);
        let one = items::table.find(1).first::<Item>(&mut conn).unwrap();
        one.delete_versioned(&mut conn).unwrap();
        assert_eq!(items::table.find(1).first::<Item>(&mut conn).optional().unwrap(), None);

        let two = items::table.find(2).first::<Item>(&mut conn).unwrap();
        exec(&mut conn, "UPDATE items SET stock = 1, lock_version = lock_version + 1 WHERE id = 2");
        let err = two.delete_versioned(&mut conn).unwrap_err();
        let stale = err.as_stale().expect("stale");
        assert_eq!(stale.operation, Operation::Delete);
        assert_eq!(stale.current, CurrentState::Version(1));
        assert!(items::table.find(2).first::<Item>(&mut conn).optional().unwrap().is_some(), "not deleted");
    }

    fn touch_versioned_bumps_only_the_version(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let mut other = item.clone();
        item.stock = 99; // not written by touch
        item.touch_versioned(&mut conn).unwrap();
        assert_eq!(item.lock_version, 1);
        let stored = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!((stored.stock, stored.lock_version), (10, 1));
        // The touch makes every other holder of version 0 stale.
        other.stock = 1;
        let err = other.update_versioned(&mut conn).unwrap_err();
        assert_eq!(err.as_stale().unwrap().current, CurrentState::Version(1));
        let err = other.touch_versioned(&mut conn).unwrap_err();
        assert_eq!(err.as_stale().unwrap().operation, Operation::Touch);
    }

    fn update_by_version_takes_the_version_from_outside(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let next = Item::update_by_version(&mut conn, 1, 0, items::name.eq("from a form")).unwrap();
        assert_eq!(next, 1);
        let err = Item::update_by_version(&mut conn, 1, 0, items::name.eq("late")).unwrap_err();
        assert_eq!(err.as_stale().unwrap().current, CurrentState::Version(1));
        let err = Item::update_by_version(&mut conn, 42, 0, items::name.eq("nobody")).unwrap_err();
        assert_eq!(err.as_stale().unwrap().current, CurrentState::Deleted);
        assert_eq!(err.as_stale().unwrap().key, "42");
        let stored = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!((stored.name.as_str(), stored.lock_version), ("from a form", 1));
    }

    fn composite_keys_are_checked_on_every_column(db) {
        let mut conn = db.conn();
        exec(&mut conn, "INSERT INTO order_lines (order_id, line_no, qty) VALUES (1, 1, 5), (1, 2, 5), (2, 1, 5)");
        let mut line = order_lines::table.find((1, 2)).first::<OrderLine>(&mut conn).unwrap();
        let mut stale = line.clone();
        line.qty = 4;
        line.update_versioned(&mut conn).unwrap();
        let rows: Vec<(i32, i32, i32, i32)> = order_lines::table
            .order((order_lines::order_id, order_lines::line_no))
            .load::<OrderLine>(&mut conn)
            .unwrap()
            .into_iter()
            .map(|l| (l.order_id, l.line_no, l.qty, l.lock_version))
            .collect();
        assert_eq!(rows, vec![(1, 1, 5, 0), (1, 2, 4, 1), (2, 1, 5, 0)]);
        stale.qty = 3;
        let err = stale.update_versioned(&mut conn).unwrap_err();
        assert_eq!(err.as_stale().unwrap().key, "(1, 2)");
        line.delete_versioned(&mut conn).unwrap();
        assert_eq!(order_lines::table.count().get_result::<i64>(&mut conn).unwrap(), 2);
    }

    fn a_marked_i16_version_with_a_renamed_column(db) {
        let mut conn = db.conn();
        exec(&mut conn, "INSERT INTO gadgets (id, label, version) VALUES (1, 'knob', 0)");
        let mut gadget = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
        gadget.label = "dial".into();
        gadget.update_versioned(&mut conn).unwrap();
        assert_eq!(gadget.revision, 1);
        assert_eq!(gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap(), gadget);
        let sql = diesel::debug_query::<Backend, _>(&gadget.update_versioned_statement()).to_string();
        assert!(sql.contains("version"), "{sql}");
        assert!(!sql.contains("revision"), "{sql}");
    }

    fn versions_at_the_types_maximum_are_refused_before_any_write(db) {
        let mut conn = db.conn();
        exec(&mut conn, &format!("INSERT INTO gadgets (id, label, version) VALUES (1, 'max', {})", i16::MAX));
        exec(&mut conn, &format!("INSERT INTO documents (id, title, lock_version) VALUES (1, 'max', {})", i64::MAX));
        exec(&mut conn, &format!("INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'max', 1, {})", i32::MAX));

        let mut gadget = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
        gadget.label = "changed".into();
        let err = gadget.update_versioned(&mut conn).unwrap_err();
        assert!(matches!(err, Error::VersionOverflow { version, .. } if version == i64::from(i16::MAX)), "{err:?}");
        assert_eq!(gadget.revision, i16::MAX);
        assert_eq!(gadgets::table.find(1).select(gadgets::label).first::<String>(&mut conn).unwrap(), "max");

        let mut document = documents::table.find(1).first::<Document>(&mut conn).unwrap();
        assert!(matches!(document.touch_versioned(&mut conn), Err(Error::VersionOverflow { .. })));
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert!(matches!(item.update_versioned(&mut conn), Err(Error::VersionOverflow { .. })));
        assert!(matches!(
            Item::update_by_version(&mut conn, 1, i32::MAX, items::stock.eq(0)),
            Err(Error::VersionOverflow { .. })
        ));
        assert_eq!(items::table.find(1).first::<Item>(&mut conn).unwrap(), item);
        // Deleting needs no new version.
        item.delete_versioned(&mut conn).unwrap();

        // One below the maximum still works, and lands exactly on it.
        exec(&mut conn, &format!("UPDATE gadgets SET version = {} WHERE id = 1", i16::MAX - 1));
        let mut gadget = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
        gadget.update_versioned(&mut conn).unwrap();
        assert_eq!(gadgets::table.find(1).select(gadgets::version).first::<i16>(&mut conn).unwrap(), i16::MAX);
    }

    fn negative_versions_are_ordinary_versions(db) {
        let mut conn = db.conn();
        exec(&mut conn, "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'neg', 1, -1)");
        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        item.update_versioned(&mut conn).unwrap();
        assert_eq!(item.lock_version, 0);
    }

    fn option_fields_follow_diesel_none_is_skipped_unless_treated_as_null(db) {
        let mut conn = db.conn();
        exec(&mut conn, "INSERT INTO documents (id, title, note) VALUES (1, 'a', 'keep me')");
        let mut doc = documents::table.find(1).first::<Document>(&mut conn).unwrap();
        doc.note = None;
        doc.title = "b".into();
        doc.update_versioned(&mut conn).unwrap();
        let stored = documents::table.find(1).first::<Document>(&mut conn).unwrap();
        assert_eq!((stored.title.as_str(), stored.note.as_deref(), stored.lock_version), ("b", Some("keep me"), 1));

        let mut nullable = documents::table.find(1).first::<DocumentNullable>(&mut conn).unwrap();
        nullable.note = None;
        nullable.update_versioned(&mut conn).unwrap();
        let stored = documents::table.find(1).first::<Document>(&mut conn).unwrap();
        assert_eq!((stored.note, stored.lock_version), (None, 2));
    }

    fn lost_update_naive_read_modify_write_oversells(db) {
        // The baseline the suite must be able to fail on: without a check, both
        // buyers succeed and sixteen units leave a stock of ten.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let outcomes: Vec<QueryResult<usize>> = db.race(2, |conn, _, barrier| {
            let item = items::table.find(1).first::<Item>(conn).unwrap();
            barrier.wait();
            assert!(item.stock >= 8);
            diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 8)).execute(conn)
        });
        let sold = 8 * outcomes.iter().filter(|o| matches!(o, Ok(1))).count() as i32;
        let stock = items::table.find(1).select(items::stock).first::<i32>(&mut db.conn()).unwrap();
        assert_eq!(sold, 16, "both buyers succeeded");
        assert_eq!(stock, 2);
        assert_ne!(sold + stock, 10, "an update was lost");
    }

    fn lost_update_prevented_by_update_versioned(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let outcomes: Vec<Result<(), Error>> = db.race(2, |conn, _, barrier| {
            let mut item = items::table.find(1).first::<Item>(conn).unwrap();
            barrier.wait();
            assert!(item.stock >= 8);
            item.stock -= 8;
            item.update_versioned(conn)
        });
        let ok = outcomes.iter().filter(|o| o.is_ok()).count();
        let stale: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert_eq!(ok, 1, "exactly one buyer wins: {outcomes:?}");
        assert_eq!(stale.len(), 1);
        let loser = stale[0].as_stale().expect("the loser gets Stale");
        assert_eq!((loser.expected_version, loser.current), (0, CurrentState::Version(1)));
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!((item.stock, item.lock_version), (2, 1));
        assert_eq!(8 + item.stock, 10, "units sold + stock = initial");
    }

    fn concurrent_increments_with_retry_lose_nothing(db) {
        const THREADS: usize = 6;
        const INCREMENTS: usize = 15;
        seed_items(&mut db.conn(), &[(1, 0)]);
        let policy = RetryPolicy::default().max_attempts(30);
        let conflicts: usize = db.race(THREADS, |conn, _, barrier| {
            let mut conflicts = 0;
            for _ in 0..INCREMENTS {
                let attempts = retry(&policy, |attempt| {
                    let mut item = items::table.find(1).first::<Item>(conn)?;
                    if attempt == 1 {
                        barrier.wait(); // every thread holds the same version
                    }
                    item.stock += 1;
                    item.update_versioned(conn)?;
                    Ok::<_, lockkit::Error>(attempt)
                })
                .unwrap();
                conflicts += attempts as usize - 1;
            }
            conflicts
        })
        .into_iter()
        .sum();
        let item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        assert_eq!(item.stock, (THREADS * INCREMENTS) as i32, "no increment lost");
        assert_eq!(item.lock_version, (THREADS * INCREMENTS) as i32);
        assert!(conflicts >= INCREMENTS * (THREADS - 1), "the race really happened: {conflicts} conflicts");
    }

    fn concurrent_naive_increments_lose_updates(db) {
        const THREADS: usize = 6;
        const INCREMENTS: usize = 15;
        seed_items(&mut db.conn(), &[(1, 0)]);
        db.race(THREADS, |conn, _, barrier| {
            for _ in 0..INCREMENTS {
                let item = items::table.find(1).first::<Item>(conn).unwrap();
                barrier.wait();
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock + 1))
                    .execute(conn)
                    .unwrap();
            }
        });
        let stock = items::table.find(1).select(items::stock).first::<i32>(&mut db.conn()).unwrap();
        assert!(stock < (THREADS * INCREMENTS) as i32, "naive writes lose updates: {stock}");
    }

    fn transaction_with_retry_reruns_the_whole_transaction(db) {
        seed_items(&mut db.conn(), &[(1, 10), (2, 0)]);
        let mut conn = db.conn();
        let mut interfered = false;
        let attempts = lockkit::transaction_with_retry(&mut *conn, &RetryPolicy::immediate(3), |conn| {
            let mut from = items::table.find(1).first::<Item>(conn)?;
            let mut to = items::table.find(2).first::<Item>(conn)?;
            if !interfered {
                interfered = true;
                // Another client changes `to` between our read and our write.
                let mut other = db.connect();
                exec(&mut other, "UPDATE items SET lock_version = lock_version + 1 WHERE id = 2");
            }
            from.stock -= 3;
            from.update_versioned(conn)?;
            to.stock += 3;
            to.update_versioned(conn)?;
            Ok::<_, lockkit::Error>(from.lock_version)
        })
        .unwrap();
        // On PostgreSQL and MariaDB the first attempt's write to `from` (0 -> 1)
        // was rolled back. The second attempt's struct cannot be told from the
        // first one's, which still holds 1: its write moves the row past 1, so
        // that no struct holding a rolled-back number ever matches a committed
        // one. (On SQLite the first attempt's write fails before it is made: its
        // snapshot is older than the other client's commit.)
        let from = if BACKEND == "sqlite" { 1 } else { 2 };
        assert_eq!(attempts, from, "the first attempt's write to `from` was rolled back");
        let rows: Vec<(i32, i32)> = items::table.order(items::id).select((items::stock, items::lock_version)).load(&mut *conn).unwrap();
        assert_eq!(rows, vec![(7, from), (3, 2)]);
    }
}
