//! Operating lockkit: version triggers for writers that bypass it, versioned
//! bulk updates, and conflict metrics.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::version_trigger::{down_sql, up_sql, Dialect};
use lockkit::{retry, CurrentState, Error, RetryPolicy};
use lockkit_tests::models::*;
use lockkit_tests::observe::observe;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, seed_items};

/// The two version columns of the table `vt_a_b`.
#[derive(QueryableByName)]
struct VtVersions {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    c_v: i32,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    b_c_v: i32,
}

fn dialect(backend: &str) -> Dialect {
    match backend {
        "postgres" => Dialect::Postgres,
        "mysql" => Dialect::Mysql,
        _ => Dialect::Sqlite,
    }
}

lockkit_tests::backend_tests! {
    fn a_version_trigger_whose_name_another_already_has_is_refused(db) {
        // `vt_a_b`.`c_v` and `vt_a`.`b_c_v` make the same trigger name. The
        // second is refused (on PostgreSQL too, where the function's name is
        // the database's, not the table's), and the first still bumps its
        // own column, not the other's that its table also has.
        let mut conn = db.conn();
        exec(&mut conn, "CREATE TABLE vt_a_b (id INTEGER PRIMARY KEY, c_v INTEGER NOT NULL, b_c_v INTEGER NOT NULL, name VARCHAR(20))");
        exec(&mut conn, "CREATE TABLE vt_a (id INTEGER PRIMARY KEY, b_c_v INTEGER NOT NULL)");
        exec(&mut conn, "INSERT INTO vt_a_b (id, c_v, b_c_v, name) VALUES (1, 0, 0, 'a')");
        exec(&mut conn, &up_sql(dialect(BACKEND), "vt_a_b", "c_v").unwrap());
        let second = up_sql(dialect(BACKEND), "vt_a", "b_c_v").unwrap();
        assert!(conn.batch_execute(&second).is_err(), "a second trigger of that name was installed");
        exec(&mut conn, "UPDATE vt_a_b SET name = 'b' WHERE id = 1");
        let versions: (i32, i32) = diesel::sql_query("SELECT c_v, b_c_v FROM vt_a_b WHERE id = 1")
            .get_result::<VtVersions>(&mut conn)
            .map(|row| (row.c_v, row.b_c_v))
            .unwrap();
        assert_eq!(versions, (1, 0));
    }

    fn a_version_trigger_on_a_table_named_by_a_reserved_word_bumps_the_version(db) {
        // `order` is reserved on every backend (`groups` too on MySQL 8):
        // Diesel quotes such names, and so must the trigger's SQL.
        let mut conn = db.conn();
        let q = |name: &str| if BACKEND == "mysql" { format!("`{name}`") } else { format!("\"{name}\"") };
        exec(&mut conn, &format!("CREATE TABLE {} (id INTEGER PRIMARY KEY, {} INTEGER NOT NULL, note VARCHAR(20))", q("order"), q("group")));
        exec(&mut conn, &format!("INSERT INTO {} (id, {}, note) VALUES (1, 0, 'a')", q("order"), q("group")));
        exec(&mut conn, &up_sql(dialect(BACKEND), "order", "group").unwrap());
        exec(&mut conn, &format!("UPDATE {} SET note = 'b' WHERE id = 1", q("order")));
        let version = diesel::sql_query(format!("SELECT {} AS c_v, 0 AS b_c_v FROM {} WHERE id = 1", q("group"), q("order")))
            .get_result::<VtVersions>(&mut conn)
            .unwrap()
            .c_v;
        assert_eq!(version, 1, "the trigger bumped the version");
        exec(&mut conn, &down_sql(dialect(BACKEND), "order", "group").unwrap());
    }

    fn a_version_trigger_makes_raw_writers_visible(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        exec(&mut conn, &up_sql(dialect(BACKEND), "items", "lock_version").unwrap());
        let mut stale = items::table.find(1).first::<Item>(&mut conn).unwrap();

        // Someone else writes with raw SQL and never mentions the version.
        exec(&mut conn, "UPDATE items SET stock = 5 WHERE id = 1");
        let err = stale.update_versioned(&mut conn).unwrap_err();
        assert_eq!(err.as_stale().unwrap().current, CurrentState::Version(1));

        // lockkit's own bump is not doubled: exactly one per update.
        let mut fresh = items::table.find(1).first::<Item>(&mut conn).unwrap();
        fresh.stock -= 1;
        fresh.update_versioned(&mut conn).unwrap();
        fresh.touch_versioned(&mut conn).unwrap();
        let stored = items::table.find(1).first::<Item>(&mut conn).unwrap();
        assert_eq!((stored.stock, stored.lock_version, fresh.lock_version), (4, 3, 3));

        // A writer that sets the version itself is left alone.
        exec(&mut conn, "UPDATE items SET lock_version = 10 WHERE id = 1");
        assert_eq!(items::table.find(1).select(items::lock_version).first::<i32>(&mut conn).unwrap(), 10);

        exec(&mut conn, &down_sql(dialect(BACKEND), "items", "lock_version").unwrap());
        exec(&mut conn, "UPDATE items SET stock = 1 WHERE id = 1");
        assert_eq!(items::table.find(1).select(items::lock_version).first::<i32>(&mut conn).unwrap(), 10);
        stale.lock_version = 10;
        stale.update_versioned(&mut conn).unwrap();
    }

    fn bulk_updates_write_all_rows_or_none_and_name_every_stale_key(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10), (3, 10)]);
        let versions = Item::update_all_by_version(&mut conn, &[(1, 0), (2, 0), (3, 0)], items::stock.eq(items::stock - 1)).unwrap();
        assert_eq!(versions, vec![1, 1, 1]);

        exec(&mut conn, "UPDATE items SET lock_version = 5 WHERE id = 3");
        exec(&mut conn, "DELETE FROM items WHERE id = 2");
        let err = Item::update_all_by_version(&mut conn, &[(1, 1), (2, 1), (3, 1)], items::stock.eq(0)).unwrap_err();
        let Error::StaleRows(stale) = &err else { panic!("{err:?}") };
        let keys: Vec<(&str, CurrentState)> = stale.iter().map(|s| (s.key.as_str(), s.current)).collect();
        assert_eq!(keys, vec![("2", CurrentState::Deleted), ("3", CurrentState::Version(5))]);
        assert!(err.is_retryable());
        assert_eq!(err.to_string(), "2 of the rows were changed by someone else; nothing was written: items 2, 3");
        let row1: (i32, i32) = items::table.find(1).select((items::stock, items::lock_version)).first(&mut conn).unwrap();
        assert_eq!(row1, (9, 1), "row 1 matched, but the transaction rolled back");
    }

    fn conflicts_are_counted(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let before = lockkit::metrics::snapshot();
        let mut stale = items::table.find(1).first::<Item>(&mut conn).unwrap();
        exec(&mut conn, "UPDATE items SET lock_version = lock_version + 1 WHERE id = 1");
        // What this thread reports, and nothing from the tests running beside it.
        let ((), seen) = observe(|| {
            let result: Result<(), Error> = retry(&RetryPolicy::immediate(3), |_| stale.update_versioned(&mut conn));
            assert!(matches!(result, Err(Error::RetriesExhausted { attempts: 3, .. })));
            lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |_, _: Item| Ok::<_, lockkit::Error>(())).unwrap();
        });
        // The `metrics` facade.
        assert_eq!(seen.counter("lockkit_stale_writes_total{table=items}"), 3, "{seen:?}");
        assert_eq!(seen.counter("lockkit_retries_total"), 2, "{seen:?}");
        assert_eq!(seen.counter("lockkit_retries_exhausted_total"), 1, "{seen:?}");
        assert_eq!(seen.counter("lockkit_locks_acquired_total{table=items}"), 1, "{seen:?}");
        assert_eq!(seen.histogram("lockkit_lock_acquire_seconds{table=items}").len(), 1, "{seen:?}");
        // The `tracing` events, with what they say.
        let stale_writes = seen.events_named("stale write");
        assert_eq!(stale_writes.len(), 3, "{:?}", seen.events);
        for event in &stale_writes {
            assert_eq!(event.level, tracing::Level::INFO);
            assert_eq!((event.field("table"), event.field("key"), event.field("expected")), (Some("items"), Some("1"), Some("0")));
            assert_eq!(event.field("operation"), Some("update"));
            assert_eq!(event.field("current"), Some(CurrentState::Version(1).to_string().as_str()), "{event:?}");
        }
        let retries: Vec<Option<&str>> = seen.events_named("retrying").iter().map(|e| e.field("attempt")).collect();
        assert_eq!(retries, vec![Some("1"), Some("2")]);
        let exhausted = seen.events_named("retries exhausted");
        assert_eq!(exhausted.len(), 1);
        assert_eq!((exhausted[0].level, exhausted[0].field("attempts")), (tracing::Level::WARN, Some("3")));
        // The process-wide counters also saw them (other tests add theirs).
        let delta = lockkit::metrics::snapshot().since(&before);
        assert!(delta.stale_writes >= 3, "{delta}");
        assert!(delta.retries >= 2, "{delta}");
        assert!(delta.retries_exhausted >= 1, "{delta}");
        assert!(delta.locks_acquired >= 1, "{delta}");
    }

    fn a_held_row_that_skip_locked_passes_over_is_counted_busy(db) {
        // `with_lock` with `skip_locked()` on a held row is `Busy`, as under
        // `nowait()`: counted as one, whichever way lockkit learned it.
        seed_items(&mut db.conn(), &[(1, 10)]);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let db = &db;
            s.spawn(move || {
                lockkit::with_lock(&mut db.conn(), 1, lockkit::LockOptions::default(), |_, _: Item| {
                    locked_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok::<_, Error>(())
                })
                .unwrap();
            });
            locked_rx.recv().unwrap();
            let mut conn = db.conn();
            let (outcome, seen) = observe(|| {
                lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default().skip_locked(), |_, _: Item| Ok::<_, Error>(()))
            });
            release_tx.send(()).unwrap();
            assert!(matches!(outcome, Err(Error::Busy)), "{outcome:?}");
            assert_eq!(seen.counter("lockkit_lock_errors_total{kind=busy}"), 1, "{seen:?}");
        });
    }
}
