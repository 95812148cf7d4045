//! One run: pool, schema reset, buyer threads, tally.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::r2d2::CustomizeConnection;
use lockkit_tests::support::{worker_connections, AnyConnection, AnyPooled};

use crate::models::NewOrder;
use crate::report::Report;
use crate::strategies::{self, Counters, Outcome};
use crate::{Backend, Config, ShopError, Strategy, ITEM_ID};

/// Applies the session settings to every connection the pool opens.
#[derive(Debug)]
struct SessionSettings {
    /// PostgreSQL's `deadlock_timeout`, when the server accepted it.
    deadlock_timeout: Option<Duration>,
}

impl CustomizeConnection<AnyConnection, diesel::r2d2::Error> for SessionSettings {
    fn on_acquire(&self, conn: &mut AnyConnection) -> Result<(), diesel::r2d2::Error> {
        conn.configure_session()
            .map_err(diesel::r2d2::Error::QueryError)?;
        if let Some(timeout) = self.deadlock_timeout {
            strategies::set_deadlock_timeout(conn, timeout)
                .map_err(diesel::r2d2::Error::QueryError)?;
        }
        Ok(())
    }
}

pub(crate) fn run_on(url: &str, strategy: Strategy, config: &Config) -> Result<Report, ShopError> {
    let size = u32::try_from(config.buyers)
        .map_err(|_| ShopError::Usage(format!("too many buyers: {}", config.buyers)))?;
    let items = if strategy.is_basket() {
        config.items
    } else {
        1
    };
    let items_i32 =
        i32::try_from(items).map_err(|_| ShopError::Usage(format!("too many items: {items}")))?;
    // Basket ids are i32 and count up from 1: one per attempt at most.
    if (config.buyers as u64).saturating_mul(u64::from(config.attempts)) >= i32::MAX as u64 {
        return Err(ShopError::Usage("too many buyers × attempts".into()));
    }

    // One direct connection first: an unreachable server fails at once with its
    // own message, instead of after the pool's connection timeout.
    let mut setup = AnyConnection::open(url)?;
    setup.configure_session()?;
    setup.migrate(strategies::MIGRATIONS)?;
    let backend = setup.backend();
    reset(&mut setup, items_i32, config.stock)?;
    // Only basket-naive deadlocks; both basket strategies get the same setting so
    // that their timings compare. Best effort: a role that may not change it keeps
    // the server's value, and the report says so.
    let mut note = None;
    let deadlock_timeout = match config.deadlock_timeout {
        Some(timeout) if strategy.is_basket() && backend == Backend::Postgres => {
            match strategies::set_deadlock_timeout(&mut setup, timeout) {
                Ok(()) => Some(timeout),
                Err(e) => {
                    note = Some(format!(
                        "PostgreSQL refused deadlock_timeout = {} ms ({e}); every deadlock \
                         waited the server's deadlock_timeout (1 s by default) before it was \
                         found. Run as a superuser, or GRANT SET ON PARAMETER deadlock_timeout.",
                        timeout.as_millis()
                    ));
                    None
                }
            }
        }
        _ => None,
    };
    drop(setup);

    let (pool, conns) = worker_connections(url, size, SessionSettings { deadlock_timeout })?;
    let start_line = Barrier::new(config.buyers + 1);
    let next_basket = AtomicI32::new(1);
    let (results, elapsed) = thread::scope(|scope| {
        let buyers: Vec<_> = conns
            .into_iter()
            .map(|conn| {
                let (start_line, next_basket) = (&start_line, &next_basket);
                scope.spawn(move || {
                    buyer(conn, start_line, next_basket, items_i32, strategy, config)
                })
            })
            .collect();
        start_line.wait();
        let started = Instant::now();
        let results: Vec<_> = buyers.into_iter().map(|b| b.join()).collect();
        (results, started.elapsed())
    });
    let mut counters = Counters::default();
    for result in results {
        counters += result.map_err(|_| ShopError::Panicked("buyer"))??;
    }

    Ok(Report {
        strategy,
        backend,
        buyers: config.buyers,
        items,
        initial_stock: i64::from(config.stock) * i64::from(items_i32),
        tally: strategies::tally(&mut *pool.get()?)?,
        conflicts: counters.conflicts,
        deadlocks: counters.deadlocks,
        retries: counters.retries,
        exhausted: counters.exhausted,
        elapsed,
        note,
    })
}

/// Empties both tables and puts items `1..=items` on sale with `stock` units each
/// (same SQL on every backend).
fn reset(conn: &mut AnyConnection, items: i32, stock: i32) -> Result<(), ShopError> {
    let rows: Vec<String> = (ITEM_ID..ITEM_ID + items)
        .map(|id| format!("({id}, 'widget {id}', {stock}, 0)"))
        .collect();
    conn.batch_execute(&format!(
        "DELETE FROM orders; DELETE FROM items; \
         INSERT INTO items (id, name, stock, lock_version) VALUES {};",
        rows.join(", ")
    ))?;
    Ok(())
}

/// One buyer: waits for the start, then buys until the stock is sold out or
/// `config.attempts` purchases were tried: random quantities (1 to 3) of
/// [`ITEM_ID`], or for a basket strategy baskets from [`random_basket`].
fn buyer(
    mut conn: AnyPooled,
    start_line: &Barrier,
    next_basket: &AtomicI32,
    items: i32,
    strategy: Strategy,
    config: &Config,
) -> Result<Counters, ShopError> {
    let mut counters = Counters::default();
    start_line.wait();
    for _ in 0..config.attempts {
        let outcome = if strategy.is_basket() {
            let basket = random_basket(items, next_basket.fetch_add(1, Ordering::Relaxed));
            strategies::buy_basket(&mut conn, strategy, &basket, config, &mut counters)?
        } else {
            let purchase = NewOrder {
                item_id: ITEM_ID,
                qty: fastrand::i32(1..=3),
                basket_id: None,
            };
            strategies::buy(&mut conn, strategy, purchase, config, &mut counters)?
        };
        if outcome == Outcome::SoldOut {
            break;
        }
    }
    Ok(counters)
}

/// 2 or 3 distinct items of `1..=items` (fewer if there are fewer), in random
/// order, 1 to 3 units of each: the lines of basket `basket_id`.
fn random_basket(items: i32, basket_id: i32) -> Vec<NewOrder> {
    let mut ids: Vec<i32> = (ITEM_ID..ITEM_ID + items).collect();
    fastrand::shuffle(&mut ids);
    ids.truncate(fastrand::usize(2..=3));
    ids.into_iter()
        .map(|item_id| NewOrder {
            item_id,
            qty: fastrand::i32(1..=3),
            basket_id: Some(basket_id),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baskets_hold_two_or_three_distinct_items() {
        for _ in 0..200 {
            let basket = random_basket(4, 7);
            assert!((2..=3).contains(&basket.len()), "{basket:?}");
            let mut ids: Vec<i32> = basket.iter().map(|line| line.item_id).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), basket.len(), "{basket:?}");
            for line in &basket {
                assert!((1..=4).contains(&line.item_id) && (1..=3).contains(&line.qty));
                assert_eq!(line.basket_id, Some(7));
            }
        }
        assert_eq!(random_basket(2, 1).len(), 2);
    }
}
