//! `with_lock` on a versioned model advances the version under the lock: what
//! that promises on every backend, whichever statements carry it.
//!
//! * an optimistic reader who read before a `with_lock` is stale after it, also
//!   when the closure writes nothing;
//! * the closure sees the advanced version; a rolled-back `with_lock` leaves the
//!   version as it was;
//! * a missing row is [`Error::NotFound`]; a version at its type's maximum is
//!   [`Error::VersionOverflow`] and the row is left as it was;
//! * a version trigger does not advance the version twice;
//! * eight threads decrementing one hot row lose nothing;
//! * on PostgreSQL the lock and the bump are one statement (`UPDATE ..
//!   RETURNING`, whose `EXISTS (SELECT .. FOR UPDATE)` keeps the lock a
//!   `FOR UPDATE`), elsewhere two.

use std::sync::{Arc, Mutex};

use diesel::connection::{Instrumentation, InstrumentationEvent, SimpleConnection};
use diesel::prelude::*;
use lockkit::journal::Journal;
use lockkit::prelude::*;
use lockkit::version_trigger::{up_sql, Dialect};
use lockkit::{Error, LockOptions};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, item, seed_items};

/// Records the statements a connection sends, other than transaction control.
#[derive(Clone, Default)]
struct Counter(Arc<Mutex<Vec<String>>>);

impl Counter {
    fn instrumentation(&self) -> impl Instrumentation {
        let counter = self.clone();
        move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                let sql = query.to_string();
                let control = [
                    "BEGIN",
                    "START TRANSACTION",
                    "COMMIT",
                    "ROLLBACK",
                    "SAVEPOINT",
                    "RELEASE",
                ];
                if !control.iter().any(|c| sql.starts_with(c)) {
                    counter.0.lock().unwrap().push(sql);
                }
            }
        }
    }

    /// The statements sent while `f` ran.
    fn during(&self, f: impl FnOnce()) -> Vec<String> {
        self.0.lock().unwrap().clear();
        f();
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

lockkit_tests::backend_tests! {
    fn a_reader_before_with_lock_is_stale_after_it_even_when_nothing_is_written(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut reader = item!(&mut conn, 1);
        reader.with_lock(&mut conn, |_, _| Ok::<_, Error>(())).unwrap();
        reader.stock = 1;
        let err = reader.update_versioned(&mut conn).unwrap_err();
        assert!(matches!(err, Error::Stale(_)), "{err:?}");
        let stored = item!(&mut conn, 1);
        assert_eq!((stored.stock, stored.lock_version), (10, 1));
    }

    fn the_closure_sees_the_advanced_version_and_a_rollback_undoes_it(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let held = item!(&mut conn, 1);
        let seen = held.with_lock(&mut conn, |c, fresh| {
            assert_eq!(item!(c, 1).lock_version, fresh.lock_version, "the row as written");
            Ok::<_, Error>(fresh)
        }).unwrap();
        assert_eq!(seen.lock_version, 1);
        assert_eq!(seen, item!(&mut conn, 1));
        // A versioned write inside works on the fresh row's version.
        let written = held.with_lock(&mut conn, |c, mut fresh| {
            fresh.stock -= 1;
            fresh.update_versioned(c)?;
            Ok::<_, Error>(fresh)
        }).unwrap();
        assert_eq!((written.stock, written.lock_version), (9, 3));
        assert_eq!(written, item!(&mut conn, 1));

        let rolled_back = held.with_lock(&mut conn, |c, fresh| {
            assert_eq!(fresh.lock_version, 4);
            diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(c)?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(rolled_back, Err(Error::NoRowMatched)), "{rolled_back:?}");
        let stored = item!(&mut conn, 1);
        assert_eq!((stored.stock, stored.lock_version), (9, 3), "as it was");
        // The struct the closure saw writes nothing over the row afterwards,
        // and the next with_lock starts from the row as it is.
        let next = held.with_lock(&mut conn, |_, fresh| Ok::<_, Error>(fresh)).unwrap();
        assert!(next.lock_version > 3, "{next:?}");
        assert_eq!(next, item!(&mut conn, 1));
    }

    fn a_missing_row_is_not_found_with_every_wait_mode(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        for options in [
            LockOptions::default(),
            LockOptions::default().timeout(std::time::Duration::from_millis(250)),
            LockOptions::default().nowait(),
            LockOptions::default().skip_locked(),
        ] {
            let missing = lockkit::with_lock(&mut conn, 42, options, |_, _: Item| Ok::<_, Error>(()));
            assert!(matches!(missing, Err(Error::NotFound)), "{options:?}: {missing:?}");
            let nested = conn.transaction(|c| lockkit::with_lock(c, 42, options, |_, _: Item| Ok::<_, Error>(())));
            assert!(matches!(nested, Err(Error::NotFound)), "{options:?}: {nested:?}");
        }
        assert_eq!(item!(&mut conn, 1).lock_version, 0);
    }

    fn a_version_at_its_maximum_is_an_overflow_and_nothing_changes(db) {
        let mut conn = db.conn();
        exec(&mut conn, &format!("INSERT INTO gadgets (id, label, version) VALUES (1, 'g', {})", i16::MAX));
        for options in [LockOptions::default(), LockOptions::default().nowait()] {
            let err = lockkit::with_lock(&mut conn, 1, options, |_, _: Gadget| Ok::<_, Error>(())).unwrap_err();
            assert!(
                matches!(err, Error::VersionOverflow { version, .. } if version == i64::from(i16::MAX)),
                "{options:?}: {err:?}"
            );
        }
        let stored = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
        assert_eq!((stored.label.as_str(), stored.revision), ("g", i16::MAX));
        // One below the maximum: the last number it can take.
        exec(&mut conn, &format!("UPDATE gadgets SET version = {} WHERE id = 1", i16::MAX - 1));
        let fresh = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |_, g: Gadget| Ok::<_, Error>(g)).unwrap();
        assert_eq!(fresh.revision, i16::MAX);
    }

    fn a_version_trigger_does_not_advance_the_version_twice(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let dialect = [Dialect::Postgres, Dialect::Mysql, Dialect::Sqlite][["postgres", "mysql", "sqlite"].iter().position(|b| *b == BACKEND).unwrap()];
        conn.batch_execute(&up_sql(dialect, "items", "lock_version").unwrap()).unwrap();
        let mut reader = item!(&mut conn, 1);
        let seen = reader.with_lock(&mut conn, |_, fresh| Ok::<_, Error>(fresh)).unwrap();
        assert_eq!(seen.lock_version, 1);
        assert_eq!(item!(&mut conn, 1).lock_version, 1, "one bump, not two");
        let seen = reader.with_lock(&mut conn, |c, fresh| {
            diesel::update(items::table.find(1)).set(items::stock.eq(fresh.stock - 1)).execute(c)?;
            Ok::<_, Error>(fresh)
        }).unwrap();
        assert_eq!(seen.lock_version, 2);
        // The trigger's own bump for the plain write inside.
        assert_eq!(item!(&mut conn, 1).lock_version, 3);
        reader.stock = 0;
        assert!(matches!(reader.update_versioned(&mut conn), Err(Error::Stale(_))));
    }

    fn eight_threads_decrementing_one_hot_row_lose_nothing(db) {
        const THREADS: usize = 8;
        const EACH: i32 = 15;
        seed_items(&mut db.conn(), &[(1, 1000)]);
        let versions = db.race(THREADS, |conn, _, barrier| {
            barrier.wait();
            let mut seen = Vec::new();
            for _ in 0..EACH {
                let version = lockkit::with_lock(conn, 1, LockOptions::default(), |c, fresh: Item| {
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(fresh.stock - 1))
                        .execute(c)?;
                    Ok::<_, Error>(fresh.lock_version)
                })
                .unwrap();
                seen.push(version);
            }
            seen
        });
        let stored = item!(&mut db.conn(), 1);
        assert_eq!(stored.stock, 1000 - THREADS as i32 * EACH);
        assert_eq!(stored.lock_version, THREADS as i32 * EACH);
        let mut all: Vec<i32> = versions.into_iter().flatten().collect();
        all.sort_unstable();
        assert_eq!(all, (1..=THREADS as i32 * EACH).collect::<Vec<_>>(), "each lock saw a version of its own");
    }

    fn the_lock_and_the_bump_are_one_statement_where_the_backend_allows(db) {
        let mut conn = db.connect();
        seed_items(&mut conn, &[(1, 10)]);
        let counter = Counter::default();
        conn.set_instrumentation(Journal::wrap(counter.instrumentation()));
        let run = |conn: &mut Conn, options: LockOptions| {
            lockkit::with_lock(conn, 1, options, |_, fresh: Item| Ok::<_, Error>(fresh)).unwrap()
        };
        // The first call also reads what the journal caches per connection.
        run(&mut conn, LockOptions::default());
        let on_items = |sent: &[String]| sent.iter().filter(|s| s.contains("items")).count();
        let folded = if BACKEND == "postgres" { 1 } else { 2 };
        let sent = counter.during(|| {
            run(&mut conn, LockOptions::default());
        });
        assert_eq!(sent.len(), folded, "{sent:#?}");
        if BACKEND == "postgres" {
            assert!(sent[0].starts_with(r#"UPDATE "items" SET "lock_version""#), "{sent:#?}");
            assert!(sent[0].contains("FOR UPDATE) RETURNING"), "{sent:#?}");
        }
        // With a timeout: its setting, then the same.
        let sent = counter.during(|| {
            run(&mut conn, LockOptions::default().timeout(std::time::Duration::from_millis(250)));
        });
        assert_eq!(on_items(&sent), folded, "{sent:#?}");
        if BACKEND == "postgres" {
            assert_eq!(sent.len(), 2, "set_config and the folded statement: {sent:#?}");
        }
        // NOWAIT and a shared lock keep the locked read; only NOWAIT bumps.
        let sent = counter.during(|| {
            run(&mut conn, LockOptions::default().nowait());
        });
        assert!(sent.iter().any(|s| s.starts_with("SELECT")), "{sent:#?}");
        assert_eq!(sent.iter().filter(|s| s.starts_with("UPDATE")).count(), 1, "{sent:#?}");
        let sent = counter.during(|| {
            run(&mut conn, LockOptions::default().share());
        });
        assert_eq!(sent.iter().filter(|s| s.starts_with("UPDATE")).count(), 0, "{sent:#?}");
        assert_eq!(item!(&mut conn, 1).lock_version, 4);
    }

    fn a_lock_inside_a_transaction_advances_the_version_once(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let mut held = item!(&mut conn, 1);
        conn.transaction(|c| {
            held.lock(c)?;
            assert_eq!(held.lock_version, 1);
            assert_eq!(item!(c, 1).lock_version, 1);
            Ok::<_, Error>(())
        })
        .unwrap();
        let missing = conn.transaction(|c| {
            let mut gone = held.clone();
            gone.id = 42;
            gone.lock(c)
        });
        assert!(matches!(missing, Err(Error::NotFound)), "{missing:?}");
    }

    fn a_key_the_database_does_not_enforce_is_locked_as_before(db) {
        let mut conn = db.conn();
        exec(&mut conn, "INSERT INTO twins (id, label, lock_version) VALUES (1, 'a', 0)");
        let seen = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |_, t: Twin| Ok::<_, Error>(t)).unwrap();
        assert_eq!(seen.lock_version, 1);
        exec(&mut conn, "INSERT INTO twins (id, label, lock_version) VALUES (1, 'b', 1)");
        let err = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |_, t: Twin| Ok::<_, Error>(t)).unwrap_err();
        assert!(matches!(err, Error::AmbiguousKey { .. }), "{err:?}");
        let versions: Vec<i32> = twins::table.select(twins::lock_version).load(&mut conn).unwrap();
        assert_eq!(versions, [1, 1], "nothing written");
    }
}

mod postgres_locks {
    use super::*;

    /// Whether another connection can insert an order pointing at item 1 (its
    /// foreign key check takes `FOR KEY SHARE` on the item) while `options`
    /// hold item 1.
    #[cfg(feature = "postgres")]
    fn order_insert_while_held(options: LockOptions, name: &str) -> Result<(), Error> {
        let db = lockkit_tests::TestDb::<PgConnection>::new(name);
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut inserter = db.connect();
        exec(&mut inserter, "SET lock_timeout = '300ms'");
        db.while_holding(
            |conn, wait| {
                lockkit::with_lock(conn, 1, options, |_, _: Item| {
                    wait();
                    Ok::<_, Error>(())
                })
                .unwrap();
            },
            || {
                inserter
                    .batch_execute("INSERT INTO orders (id, item_id, qty) VALUES (1, 1, 1)")
                    .map_err(lockkit::classify)
            },
        )
    }

    /// The folded statement still takes `FOR UPDATE`: a plain `UPDATE` would
    /// take only `FOR NO KEY UPDATE`, which lets the insert through.
    #[cfg(feature = "postgres")]
    #[test]
    fn the_folded_lock_is_still_for_update() {
        let blocked = order_insert_while_held(LockOptions::default(), "fold_for_update");
        assert!(matches!(blocked, Err(Error::LockTimeout)), "{blocked:?}");
        let timeout = LockOptions::default().timeout(std::time::Duration::from_secs(5));
        let blocked = order_insert_while_held(timeout, "fold_for_update_timeout");
        assert!(matches!(blocked, Err(Error::LockTimeout)), "{blocked:?}");
        let through =
            order_insert_while_held(LockOptions::default().no_key_update(), "fold_no_key");
        assert!(through.is_ok(), "{through:?}");
    }

    /// A `with_lock` that waits behind another one gets the row as that one
    /// left it, its version advanced once more.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_waiting_with_lock_sees_the_holders_write() {
        let db = lockkit_tests::TestDb::<PgConnection>::new("fold_waits");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut waiter = db.connect();
        let seen = std::thread::scope(|s| {
            let (locked_tx, locked_rx) = std::sync::mpsc::channel();
            let db = &db;
            let holder = s.spawn(move || {
                let mut conn = db.connect();
                lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, fresh: Item| {
                    locked_tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(fresh.stock - 3))
                        .execute(c)?;
                    Ok::<_, Error>(())
                })
                .unwrap();
            });
            locked_rx.recv().unwrap();
            let seen =
                lockkit::with_lock(&mut waiter, 1, LockOptions::default(), |_, fresh: Item| {
                    Ok::<_, Error>(fresh)
                })
                .unwrap();
            holder.join().unwrap();
            seen
        });
        assert_eq!((seen.stock, seen.lock_version), (7, 2), "{seen:?}");
    }
}
