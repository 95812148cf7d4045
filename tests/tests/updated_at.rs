//! `#[lockkit(updated_at)]` on every backend: each versioned write sets the column
//! to the database's clock in the same statement, and nothing else changes for
//! models without it.

use diesel::dsl::sql;
use diesel::prelude::*;
use diesel::sql_types::Bool;
use lockkit::prelude::*;
use lockkit_tests::models::Note;
use lockkit_tests::schema::notes;
use lockkit_tests::{create_notes, exec};

/// The same table without the attribute.
#[derive(Debug, Clone, Identifiable, Versioned)]
#[diesel(table_name = notes)]
struct UnstampedNote {
    id: i32,
    body: String,
    #[diesel(skip_update)]
    #[allow(dead_code)]
    updated_at: Option<String>,
    lock_version: i32,
}

const LONG_AGO: &str = "UPDATE notes SET updated_at = '2000-01-01 00:00:00'";

fn create<C: Connection>(conn: &mut C, backend: &str) {
    create_notes(conn, backend);
    exec(
        conn,
        "INSERT INTO notes VALUES (1, 'a', NULL, 0), (2, 'b', NULL, 0)",
    );
    exec(conn, LONG_AGO);
}

fn note(id: i32, version: i32) -> Note {
    // A value in the struct that must never reach the row.
    Note {
        id,
        body: "edited".into(),
        updated_at: Some("1999-01-01 00:00:00".into()),
        lock_version: version,
    }
}

/// Whether row `id`'s `updated_at` was set since `LONG_AGO`, by a clock in this
/// century (compared in SQL: the test crate maps no timestamp type).
fn stamped<C>(conn: &mut C, id: i32) -> bool
where
    C: Connection,
    diesel::dsl::Count<
        diesel::dsl::Filter<
            diesel::dsl::Find<notes::table, i32>,
            diesel::expression::SqlLiteral<Bool>,
        >,
    >: diesel::query_dsl::LoadQuery<'static, C, i64>,
{
    notes::table
        .find(id)
        .filter(sql::<Bool>("updated_at > '2020-01-01 00:00:00'"))
        .count()
        .get_result::<i64>(conn)
        .unwrap()
        == 1
}

lockkit_tests::backend_tests! {
    fn every_versioned_write_sets_updated_at_from_the_database_clock(db) {
        let mut conn = db.connect();
        create(&mut conn, BACKEND);
        assert!(!stamped(&mut conn, 1));

        let mut n = note(1, 0);
        let sql = diesel::debug_query::<Backend, _>(&n.update_versioned_statement()).to_string();
        assert!(sql.contains("= CURRENT_TIMESTAMP"), "{sql}");
        n.update_versioned(&mut conn).unwrap();
        assert!(stamped(&mut conn, 1));
        assert!(!stamped(&mut conn, 2), "only the written row");
        let body = notes::table.find(1).select(notes::body).first::<String>(&mut conn).unwrap();
        assert_eq!(body, "edited");

        for write in 0..4 {
            exec(&mut conn, LONG_AGO);
            match write {
                0 => n.update_versioned_with(&mut conn, notes::body.eq("with")).unwrap(),
                1 => n.touch_versioned(&mut conn).unwrap(),
                2 => n.lock_version = Note::update_by_version(&mut conn, 1, n.lock_version, notes::body.eq("by version")).unwrap(),
                _ => {
                    let versions = Note::update_all_by_version(&mut conn, &[(1, n.lock_version)], notes::body.eq("all")).unwrap();
                    n.lock_version = versions[0];
                }
            }
            assert!(stamped(&mut conn, 1), "write {write}");
        }
        assert_eq!(n.lock_version, 5);
    }

    fn a_stale_write_sets_nothing(db) {
        let mut conn = db.connect();
        create(&mut conn, BACKEND);
        let mut stale = note(1, 3);
        assert!(matches!(stale.update_versioned(&mut conn), Err(lockkit::Error::Stale(_))));
        assert!(!stamped(&mut conn, 1));
    }

    fn without_the_attribute_updated_at_is_left_alone(db) {
        let mut conn = db.connect();
        create(&mut conn, BACKEND);
        let mut n = UnstampedNote { id: 1, body: "x".into(), updated_at: None, lock_version: 0 };
        n.update_versioned(&mut conn).unwrap();
        n.touch_versioned(&mut conn).unwrap();
        assert!(!stamped(&mut conn, 1));
        let sql = diesel::debug_query::<Backend, _>(&n.touch_versioned_statement()).to_string();
        assert!(!sql.contains("updated_at"), "{sql}");
    }
}
