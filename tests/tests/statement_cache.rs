//! lockkit's statements are prepared once per connection: Diesel's statement cache
//! keeps them, so the server (or SQLite) parses and plans each one once, not on
//! every call. Diesel reports each statement it puts in its cache
//! (`InstrumentationEvent::CacheQuery`); PostgreSQL also lists the connection's
//! prepared statements in `pg_prepared_statements`.

use std::sync::{Arc, Mutex};

use diesel::connection::InstrumentationEvent;
use diesel::prelude::*;
use lockkit::journal::Journal;
use lockkit::prelude::*;
use lockkit::LockOptions;
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, seed_items, TestDb};

/// The SQL of every statement Diesel put in the connection's cache, in order.
#[derive(Clone, Default)]
struct Cached(Arc<Mutex<Vec<String>>>);

impl Cached {
    /// Installs itself on `conn`, under lockkit's journal.
    fn watch(conn: &mut impl Connection) -> Self {
        let cached = Cached::default();
        let log = cached.clone();
        conn.set_instrumentation(Journal::wrap(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::CacheQuery { sql, .. } = event {
                log.0.lock().unwrap().push(sql.to_owned());
            }
        }));
        cached
    }

    /// The cached statements that start with `prefix`.
    fn starting_with(&self, prefix: &str) -> Vec<String> {
        let all = self.0.lock().unwrap();
        all.iter()
            .filter(|sql| sql.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Exactly two `UPDATE`s were cached, and they differ: the shapes with and
    /// without a column whose `None` a changeset skips, each prepared once.
    fn assert_two_update_shapes(&self) {
        let updates = self.starting_with("UPDATE");
        assert_eq!(updates.len(), 2, "{updates:#?}");
        assert_ne!(updates[0], updates[1]);
    }
}

/// A new connection to `db` with document 1 (title `a`, its note the SQL
/// `note`, version 0) inserted, and what it caches from then on.
fn watched_document<C: TestBackend>(db: &TestDb<C>, note: &str) -> (C, Cached) {
    let mut conn = db.connect();
    exec(
        &mut conn,
        &format!(
            "INSERT INTO documents (id, title, note, lock_version) VALUES (1, 'a', {note}, 0)"
        ),
    );
    let cached = Cached::watch(&mut conn);
    (conn, cached)
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// PostgreSQL: how many prepared statements of this session start with `$prefix`.
macro_rules! pg_prepared {
    ($conn:expr, $prefix:expr) => {
        diesel::sql_query(
            "SELECT COUNT(*)::bigint AS n FROM pg_prepared_statements WHERE starts_with(statement, $1)",
        )
        .bind::<diesel::sql_types::Text, _>($prefix)
        .get_result::<Count>($conn)
        .unwrap()
        .n
    };
}

lockkit_tests::backend_tests! {
    fn versioned_writes_are_prepared_once_per_connection(db) {
        let mut conn = db.connect();
        seed_items(&mut conn, &[(1, 100), (2, 100), (3, 100)]);
        let cached = Cached::watch(&mut conn);

        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
        for _ in 0..5 {
            item.stock -= 1;
            item.update_versioned(&mut conn).unwrap();
            item.touch_versioned(&mut conn).unwrap();
        }
        let mut version = 0;
        for _ in 0..5 {
            version = Item::update_by_version(&mut conn, 2, version, items::stock.eq(items::stock - 1)).unwrap();
        }
        for key in [3, 2] {
            let row = items::table.find(key).first::<Item>(&mut conn).unwrap();
            row.delete_versioned(&mut conn).unwrap();
        }
        assert_eq!(item.lock_version, 10);
        assert_eq!(version, 5);

        // Three UPDATE shapes (the model's fields, the version alone, a changeset
        // of the caller's), each cached once, and one DELETE.
        let updates = cached.starting_with("UPDATE");
        assert_eq!(updates.len(), 3, "{updates:#?}");
        assert!(updates[0].contains("name") && updates[0].contains("stock"), "{updates:#?}");
        assert!(!updates[1].contains("stock"), "{updates:#?}");
        assert!(updates[2].contains("stock") && !updates[2].contains("name"), "{updates:#?}");
        assert_eq!(cached.starting_with("DELETE").len(), 1);

        if BACKEND == "postgres" {
            // The server holds them as named prepared statements of this session.
            assert_eq!(pg_prepared!(&mut conn, "UPDATE \"items\""), 3);
        }
    }

    fn a_changeset_that_skips_none_is_cached_once_per_shape(db) {
        let (mut conn, cached) = watched_document(&db, "NULL");

        let mut doc = documents::table.find(1).first::<Document>(&mut conn).unwrap();
        for i in 0..6 {
            doc.note = (i % 2 == 0).then(|| format!("note {i}"));
            doc.update_versioned(&mut conn).unwrap();
        }
        let stored = documents::table.find(1).first::<Document>(&mut conn).unwrap();
        // The last write had `None`: the note of the write before stays.
        assert_eq!((stored.note.as_deref(), stored.lock_version), (Some("note 4"), 6));

        // With and without `note`: two statements, each prepared once.
        cached.assert_two_update_shapes();
    }

    fn atomic_update_is_prepared_once_where_diesels_update_is_not(db) {
        let mut conn = db.connect();
        seed_items(&mut conn, &[(1, 100)]);
        let cached = Cached::watch(&mut conn);

        let sell = |qty: i32| {
            lockkit::atomic::update(items::table.find(1).filter(items::stock.ge(qty)))
                .set(items::stock.eq(items::stock - qty))
        };
        for qty in 1..=5 {
            assert_eq!(lockkit::atomic::update_if(&mut conn, sell(qty)).unwrap(), 1);
            // The same kind of statement through Diesel: parsed again every time.
            diesel::update(items::table.find(1)).set(items::stock.eq(items::stock + qty)).execute(&mut conn).unwrap();
        }
        assert!(matches!(lockkit::atomic::update_if(&mut conn, sell(101)), Err(lockkit::Error::NoRowMatched)));
        assert_eq!(sell(10).execute(&mut conn).unwrap(), 1);
        let stock: i32 = items::table.find(1).select(items::stock).first(&mut conn).unwrap();
        assert_eq!(stock, 90);

        // lockkit's UPDATE once (seven runs), Diesel's never.
        let updates = cached.starting_with("UPDATE");
        assert_eq!(updates.len(), 1, "{updates:#?}");
        assert!(updates[0].contains(">=") && updates[0].contains(" - "), "{updates:#?}");
        if BACKEND == "postgres" {
            assert_eq!(pg_prepared!(&mut conn, "UPDATE \"items\""), 1);
        }
    }

    fn atomic_update_that_skips_none_is_cached_once_per_shape(db) {
        let (mut conn, cached) = watched_document(&db, "'first'");

        for i in 0..6i64 {
            let note = (i % 2 == 0).then(|| format!("note {i}"));
            let written = lockkit::atomic::update(documents::table.find(1))
                .set((documents::title.eq(format!("title {i}")), note.map(|n| documents::note.eq(n))))
                .execute(&mut conn)
                .unwrap();
            assert_eq!(written, 1);
            let stored: (String, Option<String>) =
                documents::table.find(1).select((documents::title, documents::note)).first(&mut conn).unwrap();
            // A `None` leaves the column as it was: the note of the write before.
            assert_eq!(stored, (format!("title {i}"), Some(format!("note {}", i - i % 2))));
        }

        cached.assert_two_update_shapes();
    }

    fn lock_all_is_prepared_once_per_padded_length(db) {
        let mut conn = db.connect();
        seed_items(&mut conn, &(1..=6).map(|id| (id, 100)).collect::<Vec<_>>());
        let cached = Cached::watch(&mut conn);

        for _ in 0..2 {
            for n in 1..=6 {
                let keys: Vec<i32> = (1..=n).rev().collect();
                let rows = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                    Item::lock_all(conn, &keys)
                })
                .unwrap();
                // The padding repeats a key: still one row per key, in key order.
                assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
            }
        }

        let reads: Vec<String> = cached
            .starting_with("SELECT")
            .into_iter()
            .filter(|sql| sql.contains("ORDER BY"))
            .collect();
        if BACKEND == "postgres" {
            // One array bind: one statement for every length.
            assert_eq!(reads.len(), 1, "{reads:#?}");
            assert!(reads[0].contains("= ANY($1)"), "{reads:#?}");
        } else {
            // Lengths 1 to 6 padded to 1, 2, 4 and 8 keys: four statements, each
            // prepared once over the two rounds.
            let lengths: Vec<usize> = reads.iter().map(|sql| sql.matches('?').count()).collect();
            assert_eq!(lengths, [1, 2, 4, 8], "{reads:#?}");
        }
    }

    fn each_lock_clause_is_prepared_once_per_connection(db) {
        let mut conn = db.connect();
        seed_items(&mut conn, &[(1, 100), (2, 100)]);
        let cached = Cached::watch(&mut conn);

        let clauses = [LockOptions::default(), LockOptions::default().nowait(), LockOptions::default().skip_locked(), LockOptions::default().share()];
        for options in clauses {
            for key in [1, 2, 1] {
                lockkit::with_lock(&mut conn, key, options, |_conn, item: Item| Ok::<_, lockkit::Error>(item.stock)).unwrap();
            }
        }

        let reads: Vec<String> = cached
            .starting_with("SELECT")
            .into_iter()
            .filter(|sql| sql.contains("WHERE") && sql.contains("lock_version") && !sql.contains("unique_key"))
            .collect();
        // One locked read per clause (SQLite has no clause: one read in all;
        // PostgreSQL reads and bumps under the default clause in one UPDATE).
        let expected = match BACKEND {
            "sqlite" => 1,
            "postgres" => clauses.len() - 1,
            _ => clauses.len(),
        };
        assert_eq!(reads.len(), expected, "{reads:#?}");
        // The version bump of the exclusive locks, once (PostgreSQL: and the
        // read and bump of the default clause, once).
        let bumps = if BACKEND == "postgres" { 2 } else { 1 };
        assert_eq!(cached.starting_with("UPDATE").len(), bumps);
    }
}
