//! The statements the hand-written twins and the closures send, built once for
//! both clients: blocking Diesel executes them with `diesel::RunQueryDsl`,
//! diesel-async with its own `RunQueryDsl`. Only the execution differs.

use diesel::dsl::auto_type;
use diesel::prelude::*;

use crate::vocabulary::schema::{items, jobs};

/// `UPDATE items SET stock = $1 WHERE id = $2`: the write of a read-modify-write.
#[auto_type]
pub fn set_stock(id: i32, stock: i32) -> _ {
    diesel::dsl::update(items::table.find(id)).set(items::stock.eq(stock))
}

/// `UPDATE items SET stock = stock - $1 WHERE id = $2 AND stock >= $3`: the
/// atomic sale, no read.
#[auto_type]
pub fn sell_if_stocked(id: i32, qty: i32) -> _ {
    diesel::dsl::update(items::table.find(id).filter(items::stock.ge(qty)))
        .set(items::stock.eq(items::stock - qty))
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

/// `UPDATE jobs SET done = $1 WHERE id = $2` (`true`): one claimed job, by key.
#[auto_type]
pub fn mark_done(id: i32) -> _ {
    let done: bool = true;
    diesel::dsl::update(jobs::table.find(id)).set(jobs::done.eq(done))
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
