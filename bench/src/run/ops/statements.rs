//! The statements the hand-written twins and the closures send, built once for
//! both clients: blocking Diesel executes them with `diesel::RunQueryDsl`,
//! diesel-async with its own `RunQueryDsl`. Only the execution differs.
//!
//! The atomic case's `UPDATE` and the queue's mark-done come two ways from one
//! target and one changeset:
//! `diesel::update` for the hand-written twins, and `lockkit::atomic::update`
//! (the same SQL, prepared once per connection) for lockkit's side. The write
//! inside `with_lock`'s closure, [`set_stock`], is user code: the same
//! `diesel::update` on both sides, as lockkit's docs write it.

use diesel::dsl::auto_type;
use diesel::prelude::*;

use crate::vocabulary::schema::{items, jobs};

/// `lockkit::atomic::update(target).set(changes)`'s statement.
type Prepared<Target, Changes> = lockkit::atomic::PreparedUpdate<
    items::table,
    <Target as diesel::query_builder::IntoUpdateTarget>::WhereClause,
    <Changes as diesel::query_builder::AsChangeset>::Changeset,
>;

/// `.. WHERE id = $1`: one item.
#[auto_type]
fn item(id: i32) -> _ {
    items::table.find(id)
}

/// `SET stock = $1`.
#[auto_type]
fn stock_to(stock: i32) -> _ {
    items::stock.eq(stock)
}

/// `UPDATE items SET stock = $1 WHERE id = $2`: the write of a read-modify-write.
#[auto_type]
pub fn set_stock(id: i32, stock: i32) -> _ {
    let (target, changes): (item, stock_to) = (item(id), stock_to(stock));
    diesel::dsl::update(target).set(changes)
}

/// `.. WHERE id = $1 AND stock >= $2`: the item, while it has `qty` in stock.
#[auto_type]
fn stocked(id: i32, qty: i32) -> _ {
    items::table.find(id).filter(items::stock.ge(qty))
}

/// `SET stock = stock - $1`.
#[auto_type]
fn take(qty: i32) -> _ {
    items::stock.eq(items::stock - qty)
}

/// `UPDATE items SET stock = stock - $1 WHERE id = $2 AND stock >= $3`: the
/// atomic sale, no read.
#[auto_type]
pub fn sell_if_stocked(id: i32, qty: i32) -> _ {
    let (target, changes): (stocked, take) = (stocked(id, qty), take(qty));
    diesel::dsl::update(target).set(changes)
}

/// [`sell_if_stocked`], prepared once per connection.
pub fn sell_if_stocked_prepared(id: i32, qty: i32) -> Prepared<stocked, take> {
    lockkit::atomic::update(stocked(id, qty)).set(take(qty))
}

/// `SELECT id FROM jobs WHERE done = $1 ORDER BY id` (`false`): the queue's
/// pending jobs, to be claimed with `LIMIT n FOR UPDATE SKIP LOCKED`.
#[auto_type]
pub fn pending_jobs() -> _ {
    let pending: bool = false;
    jobs::table
        .filter(jobs::done.eq(pending))
        .order(jobs::id)
        .select(jobs::id)
}

/// `.. WHERE id = $1`: one job.
#[auto_type]
fn job(id: i32) -> _ {
    jobs::table.find(id)
}

/// `SET done = $1` (`true`).
#[auto_type]
fn done() -> _ {
    let done: bool = true;
    jobs::done.eq(done)
}

/// `UPDATE jobs SET done = $1 WHERE id = $2` (`true`): one claimed job, by key.
#[auto_type]
pub fn mark_done(id: i32) -> _ {
    let (target, changes): (job, done) = (job(id), done());
    diesel::dsl::update(target).set(changes)
}

/// `.. WHERE id = $1 AND lock_version = $2`: the row as it was read, which a
/// hand-written versioned write targets.
#[auto_type]
pub fn versioned_row(id: i32, version: i32) -> _ {
    items::table
        .filter(items::id.eq(id))
        .filter(items::lock_version.eq(version))
}

/// The hand-written versioned write in lockkit's shape: `UPDATE items SET name =
/// $1, stock = $2, lock_version = lock_version + 1 WHERE id = $3 AND
/// lock_version = $4`.
#[auto_type]
pub fn versioned_write<'a>(id: i32, version: i32, name: &'a str, stock: i32) -> _ {
    let one: i32 = 1;
    let row: versioned_row = versioned_row(id, version);
    diesel::dsl::update(row).set((
        items::name.eq(name),
        items::stock.eq(stock),
        items::lock_version.eq(items::lock_version + one),
    ))
}

/// The hand-written versioned write that binds the next version, as users
/// write it: `UPDATE items SET name = $1, stock = $2, lock_version = $3 WHERE
/// id = $4 AND lock_version = $5`, `$3` being the version read plus one.
#[auto_type]
pub fn versioned_write_next<'a>(id: i32, version: i32, name: &'a str, stock: i32) -> _ {
    let next: i32 = version + 1;
    let row: versioned_row = versioned_row(id, version);
    diesel::dsl::update(row).set((
        items::name.eq(name),
        items::stock.eq(stock),
        items::lock_version.eq(next),
    ))
}
