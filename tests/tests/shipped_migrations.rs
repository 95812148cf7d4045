//! lockkit's shipped tables as Diesel migrations (`lockkit::migrations`), on
//! every backend: each set runs once, under the version it had when it shipped
//! as embedded migrations, and each has a version of its own (Diesel keys an
//! applied migration by its version alone, so two sets sharing one would make
//! an application that runs both skip the second one's tables); they revert and
//! run again; a statement that fails names its migration and records nothing.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_migrations::MigrationHarness;
use lockkit::migrations::ShippedMigration;
use lockkit_tests::{idempotency_migrations, lease_migrations, outbox_migrations};

#[derive(QueryableByName)]
struct Version {
    #[diesel(sql_type = Text)]
    version: String,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The applied versions of lockkit's migrations (the test database's own are
/// dated earlier).
macro_rules! applied {
    ($conn:expr) => {
        diesel::sql_query("SELECT version FROM __diesel_schema_migrations ORDER BY version")
            .load::<Version>($conn)
            .unwrap()
            .into_iter()
            .map(|v| v.version)
            .filter(|v| v.starts_with("202612"))
            .collect::<Vec<String>>()
    };
}

fn shipped(backend: &str) -> [ShippedMigration; 3] {
    [
        idempotency_migrations(backend),
        lease_migrations(backend),
        outbox_migrations(backend),
    ]
}

lockkit_tests::backend_tests! {
    fn the_shipped_tables_migrate_once_revert_and_migrate_again(db) {
        let mut conn = db.connect();
        for set in shipped(BACKEND) {
            assert_eq!(conn.run_pending_migrations(set).unwrap().len(), 1, "{set}");
        }
        assert_eq!(applied!(&mut conn), ["20261201000000", "20261201000100", "20261201000200"]);
        for set in shipped(BACKEND) {
            assert!(conn.run_pending_migrations(set).unwrap().is_empty(), "{set} ran twice");
        }

        // The outbox's ids increase by themselves on every backend.
        let enqueue = "INSERT INTO lockkit_outbox (topic, payload, created_at, next_attempt_at) \
                       VALUES ('t', 'p', 0, 0)";
        conn.batch_execute(&format!("{enqueue}; {enqueue};")).unwrap();
        let ids: Vec<i64> = diesel::sql_query("SELECT id FROM lockkit_outbox ORDER BY id")
            .load::<Id>(&mut conn)
            .unwrap()
            .into_iter()
            .map(|row| row.id)
            .collect();
        assert_eq!(ids, [1, 2]);

        for set in shipped(BACKEND).into_iter().rev() {
            conn.revert_last_migration(set).unwrap();
        }
        assert!(applied!(&mut conn).is_empty());
        for table in ["lockkit_outbox", "lockkit_inbox", "lockkit_leases", "lockkit_fences", "lockkit_idempotency_keys"] {
            assert!(conn.batch_execute(&format!("SELECT 1 FROM {table}")).is_err(), "{table} is still there");
        }
        for set in shipped(BACKEND) {
            conn.run_pending_migrations(set).unwrap();
        }
        assert_eq!(applied!(&mut conn).len(), 3);
    }

    fn a_failing_migration_names_itself_and_records_nothing(db) {
        let mut conn = db.connect();
        conn.batch_execute("CREATE TABLE lockkit_leases (taken INTEGER)").unwrap();
        let err = conn.run_pending_migrations(lease_migrations(BACKEND)).unwrap_err();
        assert!(err.to_string().contains("2026-12-01-000100_lockkit_leases"), "{err}");
        assert!(applied!(&mut conn).is_empty());
    }
}
