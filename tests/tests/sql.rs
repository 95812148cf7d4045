//! The exact SQL of every statement lockkit builds, per backend, pinned by
//! snapshots (`tests/snapshots/`). The README's SQL is copied from these.

use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::RowLock;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;

fn item() -> Item {
    Item {
        id: 1,
        name: "widget".into(),
        stock: 2,
        lock_version: 7,
    }
}

macro_rules! statements {
    ($backend:ty) => {{
        let item = item();
        let line = OrderLine {
            order_id: 1,
            line_no: 2,
            qty: 3,
            lock_version: 4,
        };
        let mut out = String::new();
        let mut show = |name: &str, sql: String| out.push_str(&format!("-- {name}\n{sql}\n\n"));
        show(
            "update_versioned",
            diesel::debug_query::<$backend, _>(&item.update_versioned_statement()).to_string(),
        );
        show(
            "update_versioned_with(items::stock.eq(items::stock - 1))",
            diesel::debug_query::<$backend, _>(&Item::update_statement(
                1,
                7,
                items::stock.eq(items::stock - 1),
            ))
            .to_string(),
        );
        show(
            "delete_versioned",
            diesel::debug_query::<$backend, _>(&item.delete_versioned_statement()).to_string(),
        );
        show(
            "touch_versioned",
            diesel::debug_query::<$backend, _>(&item.touch_versioned_statement()).to_string(),
        );
        show(
            "update_by_version (composite key)",
            diesel::debug_query::<$backend, _>(&OrderLine::update_statement(
                (1, 2),
                4,
                order_lines::qty.eq(5),
            ))
            .to_string(),
        );
        show(
            "update_versioned (composite key)",
            diesel::debug_query::<$backend, _>(&line.update_versioned_statement()).to_string(),
        );
        out
    }};
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_statements() {
    let mut out = statements!(diesel::pg::Pg);
    let lock = |lock: RowLock| {
        diesel::debug_query::<diesel::pg::Pg, _>(
            &diesel::query_dsl::methods::LockingDsl::with_lock(
                items::table.find(1).select(Item::as_select()),
                lock,
            ),
        )
        .to_string()
    };
    out.push_str(&format!("-- with_lock\n{}\n\n", lock(RowLock::update())));
    out.push_str(&format!(
        "-- with_lock_opts(nowait)\n{}\n\n",
        lock(RowLock::update().nowait())
    ));
    out.push_str(&format!(
        "-- queue::claim\n{}\n",
        lock(RowLock::update().skip_locked())
    ));
    insta::assert_snapshot!(out);
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_statements() {
    let mut out = statements!(diesel::mysql::Mysql);
    let lock = |lock: RowLock| {
        diesel::debug_query::<diesel::mysql::Mysql, _>(
            &diesel::query_dsl::methods::LockingDsl::with_lock(
                items::table.find(1).select(Item::as_select()),
                lock,
            ),
        )
        .to_string()
    };
    out.push_str(&format!("-- with_lock\n{}\n\n", lock(RowLock::update())));
    out.push_str(&format!(
        "-- with_lock_opts(nowait)\n{}\n\n",
        lock(RowLock::update().nowait())
    ));
    out.push_str(&format!(
        "-- queue::claim\n{}\n",
        lock(RowLock::update().skip_locked())
    ));
    insta::assert_snapshot!(out);
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_statements() {
    let mut out = statements!(diesel::sqlite::Sqlite);
    out.push_str(&format!(
        "-- with_lock (inside BEGIN IMMEDIATE)\n{}\n",
        diesel::debug_query::<diesel::sqlite::Sqlite, _>(
            &items::table.find(1).select(Item::as_select())
        )
    ));
    insta::assert_snapshot!(out);
}
