//! What the MySQL/MariaDB cases of `tests/idempotency.rs` and `tests/outbox.rs`
//! share: a database with lockkit's tables (every such case's), and, for the
//! deadlock cases, the request's work beside
//! `lockkit_tests::aborts::beside_neighbour`, whose best-effort extra is the
//! deadlock's victim.

use diesel::prelude::*;
use diesel::MysqlConnection;
use diesel_migrations::MigrationHarness;
use lockkit::migrations::ShippedMigration;
use lockkit_tests::aborts::Cue;
use lockkit_tests::models::Item;
use lockkit_tests::schema::items;
use lockkit_tests::TestDb;

/// The test database `name`, with lockkit's shipped `migrations` for MySQL run
/// on it.
pub fn database_with(
    name: &str,
    migrations: fn(&str) -> ShippedMigration,
) -> TestDb<MysqlConnection> {
    let db = TestDb::<MysqlConnection>::new(name);
    db.conn()
        .run_pending_migrations(migrations("mysql"))
        .unwrap();
    db
}

/// Sells `qty` units of item 1 under its row lock.
pub fn sell_from_item_1(conn: &mut MysqlConnection, qty: i32) -> QueryResult<()> {
    let item: Item = items::table.find(1).for_update().first(conn)?;
    diesel::update(items::table.find(1))
        .set(items::stock.eq(item.stock - qty))
        .execute(conn)?;
    Ok(())
}

/// Waits for `cue`, then locks item 2 as a best-effort extra whose failure the
/// work ignores: that read must be the deadlock's victim.
pub fn extra_on_item_2_is_the_victim(conn: &mut MysqlConnection, cue: &Cue) {
    cue.wait();
    let extra = items::table.find(2).for_update().first::<Item>(conn);
    assert!(extra.is_err(), "the extra was the deadlock's victim");
}
