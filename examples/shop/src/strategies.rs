//! The purchase strategies, written once: every statement runs on
//! [`AnyConnection`], Diesel's `#[derive(MultiConnection)]` over the backends
//! whose cargo feature is on, and lockkit takes it as it takes a `PgConnection`.
//!
//! To add a strategy: a variant of [`Strategy`](crate::Strategy), a function
//! `fn name(conn, purchase, config, counters) -> Result<Outcome, ShopError>`
//! (`basket: &[NewOrder]` instead of `purchase` for a basket strategy), and an
//! arm in the `match` of [`buy`] or [`buy_basket`].
//!
//! The one statement the enum cannot send is `basket-naive`'s row lock:
//! `.for_update()` does not exist for SQLite queries. [`lock_item`] sends it to
//! the connection inside the enum, where lockkit adds the backend's clause
//! (`FOR UPDATE` on PostgreSQL and MySQL; none on SQLite, where the surrounding
//! `BEGIN IMMEDIATE` transaction already holds the database's write lock).

use std::ops::AddAssign;

use diesel::prelude::*;
use diesel::query_dsl::methods::LockingDsl;
use lockkit::pessimistic::row_lock::ForUpdate;
use lockkit::prelude::*;
use lockkit::{LockOptions, LockingConnection};
use lockkit_tests::support::{AnyConnection, Migrations};

use crate::models::{Item, NewOrder};
use crate::schema::{items, orders};
use crate::{Backend, Config, ShopError, Strategy, Tally};

/// What one purchase attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The order was accepted and the stock written.
    Bought,
    /// Fewer units are left than the buyer wanted; a smaller order may still work.
    NotEnough,
    /// Nothing is left (of the item; of the whole shop, for a basket): the buyer
    /// goes home.
    SoldOut,
    /// The strategy gave up (retries exhausted); the buyer may try again.
    GaveUp,
}

impl Outcome {
    /// `Some` when `stock` cannot serve `qty`.
    pub(crate) fn refuse(stock: i32, qty: i32) -> Option<Outcome> {
        if stock <= 0 {
            Some(Outcome::SoldOut)
        } else if stock < qty {
            Some(Outcome::NotEnough)
        } else {
            None
        }
    }
}

/// What a buyer saw on the way, summed over all buyers for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Version-checked writes refused as stale (`lockkit::Error::Stale`), or rows
    /// found locked under `NOWAIT` (`lockkit::Error::Busy`).
    pub conflicts: u64,
    /// Transactions aborted by the server to break a deadlock
    /// (`lockkit::Error::Deadlock`).
    pub deadlocks: u64,
    /// Attempts after the first, made by `lockkit::retry`.
    pub retries: u64,
    /// Purchases abandoned because the retries ran out.
    pub exhausted: u64,
}

impl AddAssign for Counters {
    fn add_assign(&mut self, other: Counters) {
        self.conflicts += other.conflicts;
        self.deadlocks += other.deadlocks;
        self.retries += other.retries;
        self.exhausted += other.exhausted;
    }
}

/// The fresh (locked) row of each line's item, in the basket's order. `rows` may
/// come in any order (`lock_all` returns them by key).
fn rows_of_basket<'r>(
    basket: &[NewOrder],
    rows: &'r [Item],
) -> Result<Vec<&'r Item>, lockkit::Error> {
    basket
        .iter()
        .map(|line| {
            rows.iter()
                .find(|row| row.id == line.item_id)
                .ok_or(lockkit::Error::NotFound)
        })
        .collect()
}

/// Whether every line of the basket can be served by its item's stock.
fn basket_fits(basket: &[NewOrder], rows: &[&Item]) -> bool {
    basket
        .iter()
        .zip(rows)
        .all(|(line, row)| row.stock >= line.qty)
}

/// The failed attempts a strategy that retries counts for the report.
#[derive(Debug, Clone, Copy)]
enum Counted {
    /// `Error::Stale`, as a conflict (`optimistic`).
    Stale,
    /// `Error::Busy`, as a conflict (`nowait`).
    Busy,
    /// `Error::Deadlock`, as a deadlock (the basket strategies).
    Deadlock,
}

/// Runs `attempt` inside `lockkit::retry`, counting the attempts after the
/// first and the failures `counted` names. Exhausted retries are counted, and
/// the buyer may try again.
fn retry_counted(
    config: &Config,
    counters: &mut Counters,
    counted: Counted,
    mut attempt: impl FnMut() -> Result<Outcome, lockkit::Error>,
) -> Result<Outcome, ShopError> {
    let result = lockkit::retry(&config.retry, |n| {
        if n > 1 {
            counters.retries += 1;
        }
        let outcome = attempt();
        match (counted, &outcome) {
            (Counted::Stale, Err(lockkit::Error::Stale(_)))
            | (Counted::Busy, Err(lockkit::Error::Busy)) => counters.conflicts += 1,
            (Counted::Deadlock, Err(lockkit::Error::Deadlock)) => counters.deadlocks += 1,
            _ => {}
        }
        outcome
    });
    match result {
        Err(lockkit::Error::RetriesExhausted { .. }) => {
            counters.exhausted += 1;
            Ok(Outcome::GaveUp)
        }
        other => Ok(other?),
    }
}

/// The shop's tables, per backend.
pub(crate) const MIGRATIONS: Migrations = Migrations {
    postgres: Some(diesel_migrations::embed_migrations!("migrations/postgres")),
    mysql: Some(diesel_migrations::embed_migrations!("migrations/mysql")),
    sqlite: Some(diesel_migrations::embed_migrations!("migrations/sqlite")),
};

/// PostgreSQL: `deadlock_timeout` for this session (the lock wait after which
/// the server looks for a deadlock), the value bound. Needs a superuser or
/// `GRANT SET ON PARAMETER deadlock_timeout`. A no-op elsewhere: MySQL/MariaDB
/// detect deadlocks at once, SQLite has none.
pub(crate) fn set_deadlock_timeout(
    conn: &mut AnyConnection,
    timeout: std::time::Duration,
) -> QueryResult<()> {
    if conn.backend() != Backend::Postgres {
        return Ok(());
    }
    let millis = timeout.as_millis().clamp(1, i32::MAX as u128);
    diesel::sql_query("SELECT set_config('deadlock_timeout', $1, false)")
        .bind::<diesel::sql_types::Text, _>(format!("{millis}ms"))
        .execute(conn)
        .map(drop)
}

/// One purchase of one item with `strategy` (a basket strategy buys a basket of
/// this one line).
pub(crate) fn buy(
    conn: &mut AnyConnection,
    strategy: Strategy,
    purchase: NewOrder,
    config: &Config,
    counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    match strategy {
        Strategy::Naive => naive(conn, purchase, config, counters),
        Strategy::Optimistic => optimistic(conn, purchase, config, counters),
        Strategy::Pessimistic => pessimistic(conn, purchase, config, counters),
        Strategy::Atomic => atomic(conn, purchase, config, counters),
        Strategy::Nowait => nowait(conn, purchase, config, counters),
        Strategy::BasketNaive | Strategy::BasketLockAll => {
            buy_basket(conn, strategy, &[purchase], config, counters)
        }
    }
}

/// One basket, all lines or none, with a basket `strategy`.
pub(crate) fn buy_basket(
    conn: &mut AnyConnection,
    strategy: Strategy,
    basket: &[NewOrder],
    config: &Config,
    counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    match strategy {
        Strategy::BasketNaive => basket_naive(conn, basket, config, counters),
        Strategy::BasketLockAll => basket_lock_all(conn, basket, config, counters),
        _ => Err(ShopError::Usage(format!("{strategy} does not buy baskets"))),
    }
}

/// Counts orders, units sold and the stock left, over all items.
pub(crate) fn tally(conn: &mut AnyConnection) -> Result<Tally, ShopError> {
    let stocks: Vec<i32> = items::table.select(items::stock).load(conn)?;
    let versions: Vec<i32> = items::table.select(items::lock_version).load(conn)?;
    // Summed here: SUM(INTEGER) has a different SQL type on every backend.
    let lines: Vec<(i32, Option<i32>)> = orders::table
        .select((orders::qty, orders::basket_id))
        .load(conn)?;
    let single = lines.iter().filter(|(_, basket)| basket.is_none()).count();
    let baskets: std::collections::BTreeSet<i32> =
        lines.iter().filter_map(|&(_, basket)| basket).collect();
    Ok(Tally {
        orders: (single + baskets.len()) as i64,
        units_sold: lines.iter().map(|&(qty, _)| i64::from(qty)).sum(),
        final_stock: stocks.iter().map(|&s| i64::from(s)).sum(),
        lowest_stock: stocks.iter().copied().min().map_or(0, i64::from),
        order_lines: lines.len() as i64,
        version_moves: versions.iter().map(|&v| i64::from(v)).sum(),
    })
}

/// `SELECT .. FROM items WHERE id = $1 FOR UPDATE`: waits for, then holds, the
/// row lock until the transaction ends. Sent to the connection inside the enum,
/// with the backend's clause; SQLite has none, and the caller's `BEGIN
/// IMMEDIATE` already holds the write lock of the whole database, so a plain
/// read is as good as locked.
fn lock_item(conn: &mut AnyConnection, id: i32) -> QueryResult<Item> {
    lockkit_tests::on_inner!(conn, |inner| {
        let query = items::table.find(id).select(Item::as_select());
        // lockkit's `FOR UPDATE` type: a fixed clause, so the statement is
        // prepared once per connection, as Diesel's `.for_update()` was.
        with_backend_lock(inner, query, ForUpdate).first(inner)
    })
}

/// `query` with the row-lock clause of `conn`'s backend.
fn with_backend_lock<C: LockingConnection, Q: LockingDsl<L>, L>(
    _conn: &C,
    query: Q,
    lock: L,
) -> C::Locked<Q, L> {
    C::apply_lock(query, lock)
}

/// Records the order; the caller's transaction makes it atomic with the
/// stock write.
fn insert_order(conn: &mut AnyConnection, purchase: NewOrder) -> QueryResult<()> {
    diesel::insert_into(orders::table)
        .values(&purchase)
        .execute(conn)
        .map(drop)
}

/// Read, check, think, write `stock = <what I read> - qty`. Whoever
/// writes between the read and the write is overwritten: a lost update,
/// and units sold twice.
fn naive(
    conn: &mut AnyConnection,
    purchase: NewOrder,
    config: &Config,
    _counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    let stock: i32 = items::table
        .find(purchase.item_id)
        .select(items::stock)
        .first(conn)?;
    if let Some(refused) = Outcome::refuse(stock, purchase.qty) {
        return Ok(refused);
    }
    std::thread::sleep(config.think);
    conn.transaction(|conn| {
        diesel::update(items::table.find(purchase.item_id))
            .set(items::stock.eq(stock - purchase.qty))
            .execute(conn)?;
        insert_order(conn, purchase)
    })?;
    Ok(Outcome::Bought)
}

/// Reload, check, think, `update_versioned` (and the order) in a
/// transaction, all inside `lockkit::retry`. A write that lost the race
/// is `Error::Stale`, writes nothing, and is retried from the reload.
///
/// The read is outside the transaction: no lock is held while thinking,
/// and on SQLite the transaction starts with its write.
fn optimistic(
    conn: &mut AnyConnection,
    purchase: NewOrder,
    config: &Config,
    counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    retry_counted(config, counters, Counted::Stale, || {
        let mut item = items::table
            .find(purchase.item_id)
            .select(Item::as_select())
            .first(conn)?;
        if let Some(refused) = Outcome::refuse(item.stock, purchase.qty) {
            return Ok(refused);
        }
        std::thread::sleep(config.think);
        item.stock -= purchase.qty;
        conn.transaction(|conn| {
            item.update_versioned(conn)?;
            insert_order(conn, purchase)?;
            Ok(Outcome::Bought)
        })
    })
}

/// The part of `pessimistic` and `nowait` that runs while the row is
/// locked: check the fresh stock, think, write it, record the order.
fn sell_locked(
    conn: &mut AnyConnection,
    purchase: NewOrder,
    fresh: Item,
    config: &Config,
) -> Result<Outcome, lockkit::Error> {
    if let Some(refused) = Outcome::refuse(fresh.stock, purchase.qty) {
        return Ok(refused);
    }
    std::thread::sleep(config.think);
    diesel::update(items::table.find(fresh.id))
        .set(items::stock.eq(fresh.stock - purchase.qty))
        .execute(conn)?;
    insert_order(conn, purchase)?;
    Ok(Outcome::Bought)
}

/// The buyer's view of the item, unlocked and possibly stale: only its
/// key matters to `with_lock`, which re-reads the row locked.
fn product_page(conn: &mut AnyConnection, purchase: NewOrder) -> QueryResult<Item> {
    items::table
        .find(purchase.item_id)
        .select(Item::as_select())
        .first(conn)
}

/// `item.with_lock`: `SELECT .. FOR UPDATE` (SQLite: `BEGIN IMMEDIATE`),
/// then check, think and write on the fresh row while holding the lock.
/// Buyers queue at the lock; nothing is retried.
fn pessimistic(
    conn: &mut AnyConnection,
    purchase: NewOrder,
    config: &Config,
    _counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    let item = product_page(conn, purchase)?;
    let outcome = item.with_lock(conn, |conn, fresh| {
        sell_locked(conn, purchase, fresh, config)
    })?;
    Ok(outcome)
}

/// One conditional `UPDATE .. SET stock = stock - qty, lock_version =
/// lock_version + 1 WHERE id = ? AND stock >= qty` and the order, in one
/// transaction. Nothing is read
/// before the write; only a refused update (`NoRowMatched`) reads the
/// stock, to tell "sold out" from "not enough". The think pause is
/// before the transaction: no lock is held while thinking.
fn atomic(
    conn: &mut AnyConnection,
    purchase: NewOrder,
    config: &Config,
    _counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    std::thread::sleep(config.think);
    let sold = conn.transaction(|conn| {
        // `Item::update_if`, not the free `atomic::update_if`: `items` is
        // versioned, and the sale moves the version, so an edit form that read
        // the item before cannot write the old stock back.
        Item::update_if(
            conn,
            purchase.item_id,
            items::stock.ge(purchase.qty),
            items::stock.eq(items::stock - purchase.qty),
        )?;
        insert_order(conn, purchase)?;
        Ok::<_, lockkit::Error>(())
    });
    match sold {
        Ok(()) => Ok(Outcome::Bought),
        Err(lockkit::Error::NoRowMatched) => {
            let stock: i32 = items::table
                .find(purchase.item_id)
                .select(items::stock)
                .first(conn)?;
            // The stock only goes down, so it is still short.
            Ok(Outcome::refuse(stock, purchase.qty).unwrap_or(Outcome::NotEnough))
        }
        Err(e) => Err(e.into()),
    }
}

/// `lockkit::with_lock(.., item.id, nowait(), ..)` inside `lockkit::retry`: a
/// row that someone else holds is `Error::Busy` at once (counted as a
/// conflict), and the retry backs off and tries again.
fn nowait(
    conn: &mut AnyConnection,
    purchase: NewOrder,
    config: &Config,
    counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    let item = product_page(conn, purchase)?;
    retry_counted(config, counters, Counted::Busy, || {
        let nowait = LockOptions::default().nowait();
        lockkit::with_lock(conn, item.id, nowait, |conn, fresh: Item| {
            sell_locked(conn, purchase, fresh, config)
        })
    })
}

/// The end of both basket strategies, with every row of the basket
/// locked: check all lines, think (unless the caller already did),
/// write every item's stock and insert every line. A basket that does
/// not fit is refused whole; `SoldOut` means the shop is empty.
fn sell_basket(
    conn: &mut AnyConnection,
    basket: &[NewOrder],
    rows: &[Item],
    think: Option<std::time::Duration>,
) -> Result<Outcome, lockkit::Error> {
    let fresh = rows_of_basket(basket, rows)?;
    if !basket_fits(basket, &fresh) {
        return sold_out_or_not_enough(conn);
    }
    if let Some(think) = think {
        std::thread::sleep(think);
    }
    for (line, row) in basket.iter().zip(fresh) {
        // Version-checked and bumped: the row is locked, so the check cannot
        // fail, and the bump refuses a versioned writer that read it before
        // (`basket-naive`'s locks are Diesel's, which bump nothing).
        Item::update_by_version(
            conn,
            row.id,
            row.lock_version,
            items::stock.eq(row.stock - line.qty),
        )?;
        insert_order(conn, *line)?;
    }
    Ok(Outcome::Bought)
}

/// An unlocked look at the shelf before any lock is taken. The stock only
/// goes down, so a basket that does not fit now never will: it is
/// refused without locking anything (`Some`). `None`: it may fit, and
/// the locked check decides.
fn shelf_refuses(
    conn: &mut AnyConnection,
    basket: &[NewOrder],
) -> Result<Option<Outcome>, lockkit::Error> {
    let ids: Vec<i32> = basket.iter().map(|line| line.item_id).collect();
    let rows: Vec<Item> = items::table
        .filter(items::id.eq_any(ids))
        .select(Item::as_select())
        .load(conn)?;
    if basket_fits(basket, &rows_of_basket(basket, &rows)?) {
        return Ok(None);
    }
    sold_out_or_not_enough(conn).map(Some)
}

/// A refused basket: `SoldOut` if no item of the shop is left.
fn sold_out_or_not_enough(conn: &mut AnyConnection) -> Result<Outcome, lockkit::Error> {
    let in_stock: i64 = items::table
        .filter(items::stock.gt(0))
        .count()
        .get_result(conn)?;
    Ok(if in_stock == 0 {
        Outcome::SoldOut
    } else {
        Outcome::NotEnough
    })
}

/// Runs a basket strategy's locked `attempt` inside `lockkit::retry`,
/// after the shelf check, counting deadlocks and retries.
fn retry_basket(
    conn: &mut AnyConnection,
    basket: &[NewOrder],
    config: &Config,
    counters: &mut Counters,
    mut attempt: impl FnMut(&mut AnyConnection) -> Result<Outcome, lockkit::Error>,
) -> Result<Outcome, ShopError> {
    retry_counted(config, counters, Counted::Deadlock, || {
        if let Some(refused) = shelf_refuses(conn, basket)? {
            return Ok(refused);
        }
        attempt(conn)
    })
}

/// Locks the basket's items one at a time, in the buyer's order, and
/// thinks after the first lock: two buyers who want the same two items
/// in opposite orders each hold one and wait for the other. The server
/// aborts one (`Error::Deadlock`) and `lockkit::retry` runs it again.
/// On SQLite `BEGIN IMMEDIATE` serializes the buyers: no deadlock.
fn basket_naive(
    conn: &mut AnyConnection,
    basket: &[NewOrder],
    config: &Config,
    counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    retry_basket(conn, basket, config, counters, |conn| {
        lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
            let mut rows = Vec::with_capacity(basket.len());
            for (n, line) in basket.iter().enumerate() {
                rows.push(lock_item(conn, line.item_id)?);
                if n == 0 {
                    // The window in which the other buyer takes its first lock.
                    std::thread::sleep(config.think);
                }
            }
            sell_basket(conn, basket, &rows, None)
        })
    })
}

/// `Item::lock_all` in `lockkit::locked_transaction`: one statement
/// locks every item of the basket in key order, so no two buyers ever
/// wait for each other in a circle. Retried like `basket_naive`, to
/// show that there is nothing to retry.
fn basket_lock_all(
    conn: &mut AnyConnection,
    basket: &[NewOrder],
    config: &Config,
    counters: &mut Counters,
) -> Result<Outcome, ShopError> {
    let ids: Vec<i32> = basket.iter().map(|line| line.item_id).collect();
    retry_basket(conn, basket, config, counters, |conn| {
        lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
            let rows = Item::lock_all(conn, &ids)?;
            sell_basket(conn, basket, &rows, Some(config.think))
        })
    })
}
