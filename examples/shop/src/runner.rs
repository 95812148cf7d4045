//! One run: pool, schema reset, buyer threads, tally. Generic over the backend;
//! the per-backend parts are [`ShopConnection`]'s methods.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};

use crate::models::NewOrder;
use crate::report::Report;
use crate::strategies::{Counters, Outcome, ShopConnection};
use crate::{Config, ShopError, Strategy, ITEM_ID};

/// Applies the session settings to every connection the pool opens.
#[derive(Debug)]
struct SessionSettings;

impl<C: ShopConnection> CustomizeConnection<C, diesel::r2d2::Error> for SessionSettings {
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        conn.configure_session()
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

pub(crate) fn run_on<C: ShopConnection>(
    url: &str,
    strategy: Strategy,
    config: &Config,
) -> Result<Report, ShopError> {
    let size = u32::try_from(config.buyers)
        .map_err(|_| ShopError::Usage(format!("too many buyers: {}", config.buyers)))?;

    // One direct connection first: an unreachable server fails at once with its
    // own message, instead of after the pool's connection timeout.
    let mut setup = C::establish(url)?;
    setup.configure_session()?;
    setup.migrate()?;
    reset(&mut setup, config.stock)?;
    drop(setup);

    let pool = Pool::builder()
        .max_size(size)
        .connection_timeout(Duration::from_secs(30))
        .connection_customizer(Box::new(SessionSettings))
        .build(ConnectionManager::<C>::new(url))?;

    // Every buyer gets its connection before the start, so a pool failure is an
    // error here and not a thread stuck at the barrier.
    let conns = (0..config.buyers)
        .map(|_| pool.get())
        .collect::<Result<Vec<_>, _>>()?;
    let start_line = Barrier::new(config.buyers + 1);
    let (results, elapsed) = thread::scope(|scope| {
        let buyers: Vec<_> = conns
            .into_iter()
            .map(|conn| {
                let start_line = &start_line;
                scope.spawn(move || buyer::<C>(conn, start_line, strategy, config))
            })
            .collect();
        start_line.wait();
        let started = Instant::now();
        let results: Vec<_> = buyers.into_iter().map(|b| b.join()).collect();
        (results, started.elapsed())
    });
    let mut counters = Counters::default();
    for result in results {
        counters += result.map_err(|_| ShopError::BuyerPanicked)??;
    }

    let tally = pool.get()?.tally()?;
    Ok(Report {
        strategy,
        backend: C::BACKEND,
        buyers: config.buyers,
        initial_stock: i64::from(config.stock),
        orders: tally.orders,
        units_sold: tally.units_sold,
        final_stock: tally.final_stock,
        conflicts: counters.conflicts,
        retries: counters.retries,
        exhausted: counters.exhausted,
        elapsed,
    })
}

/// Empties both tables and puts the one item on sale (same SQL on every backend).
fn reset<C: ShopConnection>(conn: &mut C, stock: i32) -> Result<(), ShopError> {
    conn.batch_execute(&format!(
        "DELETE FROM orders; DELETE FROM items; \
         INSERT INTO items (id, name, stock, lock_version) VALUES ({ITEM_ID}, 'widget', {stock}, 0);"
    ))?;
    Ok(())
}

/// One buyer: waits for the start, then buys random quantities (1 to 3) until the
/// item is sold out or `config.attempts` purchases were tried.
fn buyer<C: ShopConnection>(
    mut conn: PooledConnection<ConnectionManager<C>>,
    start_line: &Barrier,
    strategy: Strategy,
    config: &Config,
) -> Result<Counters, ShopError> {
    let mut counters = Counters::default();
    start_line.wait();
    for _ in 0..config.attempts {
        let purchase = NewOrder {
            item_id: ITEM_ID,
            qty: fastrand::i32(1..=3),
        };
        if C::buy(&mut conn, strategy, purchase, config, &mut counters)? == Outcome::SoldOut {
            break;
        }
    }
    Ok(counters)
}
