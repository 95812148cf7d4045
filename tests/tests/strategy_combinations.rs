//! lockkit's tools combined on one hot row, from several threads at once,
//! where no single strategy's tests go: idempotency keys whose work nests a
//! versioned write, `with_lock` or a versioned `update_if`, under
//! `transaction_with_retry` or outermost with a lease the work overruns, each
//! key sent by two clients; ETag writes (`If-Match: *` inside the caller's
//! transaction, an exact version from outside) racing with `with_lock`,
//! versioned structs, `update_if` and writers that roll back, and the same
//! race with blind HTTP writers, which must lose sales (the baseline);
//! `lock_all` with nested `with_lock` calls of other lock options whose
//! savepoints roll back, followed by plain writes, against optimistic sellers.
//!
//! Every sale writes one `orders` row in the transaction of its stock change,
//! so `stock + orders = initial` holds exactly when nothing was lost or
//! applied twice; each idempotency key's work is applied once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::etag::Expected;
use lockkit::idempotency::{Idempotency, Outcome};
use lockkit::prelude::*;
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{idempotency_migrations, seed_items, stock_of};

/// The retries for these races: many attempts, short jittered waits.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(50)
        .base_delay(Duration::from_millis(2))
        .max_delay(Duration::from_millis(40))
}

/// Errors a client answers by sending the request again.
fn resend(err: &Error) -> bool {
    matches!(
        err,
        Error::IdempotencyInProgress
            | Error::RetriesExhausted { .. }
            | Error::TransactionAborted(..)
    ) || err.is_retryable()
}

/// An item's stock before a race; how many clients send the idempotent sales.
const INITIAL: i32 = 10_000;
const THREADS: usize = 8;

/// The idempotency table, and item 1 at [`INITIAL`].
macro_rules! seed_for_keys {
    ($db:expr) => {{
        let mut conn = $db.conn();
        conn.run_pending_migrations(idempotency_migrations(BACKEND))
            .unwrap();
        seed_items(&mut conn, &[(1, INITIAL)]);
    }};
}

/// An order of item `$item` with `qty` `$qty` (what each test's audit counts
/// by), in the transaction of `$c`; `Result<(), lockkit::Error>`.
macro_rules! order {
    ($c:expr, $item:expr, $qty:expr) => {
        diesel::insert_into(orders::table)
            .values((
                orders::id.eq(lockkit_tests::next_order_id()),
                orders::item_id.eq($item),
                orders::qty.eq($qty),
            ))
            .execute($c)
            .map(drop)
            .map_err(Error::from)
    };
}

/// Client threads sending the requests of the idempotency keys `0..keys`,
/// each key by two of them at about the same time (thread `t` sends the keys
/// `k` with `k % 4 == t % 4`), each on its own connection: `send(conn, key,
/// k)` until answered, as a client does: again after an error [`resend`]
/// takes, for up to a minute. Returns the answers and how many were resent.
fn clients_send_every_key_twice<C, F>(
    db: &lockkit_tests::TestDb<C>,
    threads: usize,
    keys: i32,
    send: F,
) -> (lockkit_tests::KeyAnswers, usize)
where
    C: lockkit_tests::db::TestBackend,
    F: Fn(&mut C, &str, i32) -> Result<Outcome<String>, Error> + Sync,
{
    let barrier = Barrier::new(threads);
    let outcomes = Mutex::new(Vec::new());
    let resent = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..threads {
            let (barrier, outcomes, resent, send) = (&barrier, &outcomes, &resent, &send);
            s.spawn(move || {
                let mut conn = db.connect();
                barrier.wait();
                for k in (0..keys).filter(|k| (*k as usize) % 4 == t % 4) {
                    let key = format!("order-{k}");
                    let deadline = Instant::now() + Duration::from_secs(60);
                    loop {
                        match send(&mut conn, &key, k) {
                            Ok(outcome) => break outcomes.lock().unwrap().push((k, outcome)),
                            Err(err) if resend(&err) && Instant::now() < deadline => {
                                resent.fetch_add(1, Ordering::Relaxed);
                                thread::sleep(Duration::from_millis(fastrand::u64(1..20)));
                            }
                            Err(err) => panic!("key {k}: {err:?}"),
                        }
                    }
                }
            });
        }
    });
    (outcomes.into_inner().unwrap(), resent.into_inner())
}

/// Sells one unit of item 1 on `$c` in the way `$k` picks: a versioned
/// struct, a nested `with_lock` with a plain write, or a versioned
/// `update_if`. A macro: Diesel checks each statement per backend.
macro_rules! sell_one_as {
    ($c:expr, $k:expr) => {{
        let c = $c;
        match $k % 3 {
            0 => {
                let mut item = items::table.find(1).first::<Item>(c)?;
                item.stock -= 1;
                item.update_versioned(c)?;
            }
            1 => {
                lockkit::with_lock(c, 1, LockOptions::default(), |c, item: Item| {
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(item.stock - 1))
                        .execute(c)?;
                    Ok::<_, Error>(())
                })?;
            }
            _ => Item::update_if(c, 1, items::stock.ge(1), items::stock.eq(items::stock - 1))?,
        }
    }};
}

mod idempotent {
    use super::*;

    lockkit_tests::backend_tests! {
        fn idempotent_sales_nesting_locks_and_versioned_writes_under_retry_apply_once(db) {
            // 16 request keys, each sent by two clients at about the same time;
            // each request's work sells one unit of item 1 in one of three ways
            // (a versioned struct, a nested with_lock with a plain write, a
            // versioned update_if) and writes its order, inside the key's run,
            // inside the caller's transaction_with_retry. Stale and lock
            // conflicts roll back attempts and release keys meanwhile.
            const KEYS: i32 = 16;
            seed_for_keys!(db);
            let keys = Idempotency {
                wait_while_running: Duration::ZERO,
                ..Idempotency::default()
            };
            let (outcomes, resent) = clients_send_every_key_twice(&db, THREADS, KEYS, |conn, key, k| {
                lockkit::transaction_with_retry(conn, &policy(), |c| {
                    keys.run(c, "tenant", key, "POST /orders", |c| {
                        sell_one_as!(&mut *c, k);
                        thread::sleep(Duration::from_micros(fastrand::u64(0..5000)));
                        order!(c, 1, k)?; // the key is its qty
                        Ok::<_, Error>(format!("order for key {k}"))
                    })
                })
            });
            let mut conn = db.conn();
            let stock = stock_of!(&mut conn);
            let orders: Vec<i32> = orders::table.select(orders::qty).load(&mut conn).unwrap();
            eprintln!("{BACKEND}: {} outcomes, {} resends, stock {stock}, {} orders", outcomes.len(), resent, orders.len());
            lockkit_tests::audit_idempotent_sales(INITIAL, KEYS, stock, &orders, &outcomes, true);
        }

        fn idempotent_sales_whose_work_overruns_a_short_lease_apply_once(db) {
            // Outermost runs, a 60 ms lease, and work that now and then takes
            // longer than the lease: duplicates take over abandoned keys while
            // the first owner still runs; its final write must then match
            // nothing and its sale roll back. Each key sent by two clients.
            const KEYS: i32 = 24;
            seed_for_keys!(db);
            let keys = Idempotency {
                lease: Duration::from_millis(60),
                wait_while_running: Duration::from_millis(30),
                ..Idempotency::default()
            };
            let overran = AtomicUsize::new(0);
            let (outcomes, resent) = clients_send_every_key_twice(&db, THREADS, KEYS, |conn, key, k| {
                keys.run(conn, "tenant", key, "POST /orders", |c| {
                    lockkit::retry(&policy(), |_| -> Result<(), Error> {
                        sell_one_as!(&mut *c, k);
                        Ok(())
                    })?;
                    order!(c, 1, k)?; // the key is its qty
                    if fastrand::u8(0..3) == 0 {
                        overran.fetch_add(1, Ordering::Relaxed);
                        thread::sleep(Duration::from_millis(90));
                    }
                    Ok::<_, Error>(format!("order for key {k}"))
                })
            });
            let mut conn = db.conn();
            let stock = stock_of!(&mut conn);
            let orders: Vec<i32> = orders::table.select(orders::qty).load(&mut conn).unwrap();
            eprintln!(
                "{BACKEND}: {} outcomes, {} resends, {} overruns, stock {stock}, {} orders",
                outcomes.len(), resent, overran.load(Ordering::Relaxed), orders.len()
            );
            lockkit_tests::audit_idempotent_sales(INITIAL, KEYS, stock, &orders, &outcomes, true);
        }
    }
}

/// The ways of selling one unit of item 1 that race in
/// `etag_writes_racing_every_other_writer_lose_no_sale`, chosen by `$kind`;
/// each writes its order in the transaction of its stock change. `$naive`:
/// the HTTP-style writers write blindly (no version check), the baseline.
macro_rules! sell_by_kind {
    ($conn:expr, $kind:expr, $naive:expr) => {{
        let conn = $conn;
        let order = |c: &mut Conn| order!(c, 1, 1);
        match $kind {
            // `If-Match: *` inside the caller's retried transaction, whose
            // snapshot (REPEATABLE READ on MariaDB) was taken before the
            // write; the new stock comes from that snapshot.
            // Under heavy contention `*` gives up after its attempts
            // (`RetriesExhausted`, a 503): the client sends it again.
            0 => loop {
                let result = lockkit::transaction_with_retry(conn, &policy(), |c| {
                    let _seen = items::table.find(1).first::<Item>(c)?;
                    thread::sleep(Duration::from_micros(fastrand::u64(0..3000)));
                    Expected::<i32>::Any.apply(
                        c,
                        |c| {
                            Ok::<_, Error>(
                                items::table
                                    .find(1)
                                    .select(items::lock_version)
                                    .first::<i32>(c)?,
                            )
                        },
                        |c, v| {
                            let stock: i32 = items::table.find(1).select(items::stock).first(c)?;
                            Item::update_by_version(c, 1, v, items::stock.eq(stock - 1))
                        },
                    )?;
                    order(c)
                });
                match result {
                    Ok(()) => break,
                    Err(Error::RetriesExhausted { .. }) => continue,
                    Err(err) => panic!("If-Match *: {err:?}"),
                }
            },
            // An HTTP client: GET (the version as its ETag), then PUT with
            // `If-Match` of exactly that version; on 412 GET again.
            1 => loop {
                let seen = items::table.find(1).first::<Item>(conn).unwrap();
                thread::sleep(Duration::from_micros(fastrand::u64(0..3000)));
                let result = conn.transaction::<_, Error, _>(|c| {
                    if $naive {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(seen.stock - 1))
                            .execute(c)?;
                    } else {
                        Expected::Version(seen.lock_version).apply(
                            c,
                            |_| -> Result<i32, Error> { unreachable!("one tag reads nothing") },
                            |c, v| {
                                Item::update_by_version(c, 1, v, items::stock.eq(seen.stock - 1))
                            },
                        )?;
                    }
                    order(c)
                });
                match result {
                    Ok(()) => break,
                    Err(err) if err.is_retryable() => continue,
                    Err(err) => panic!("If-Match v: {err:?}"),
                }
            },
            // with_lock; a quarter of them fail after their write (rolled back).
            2 => loop {
                let fail = fastrand::u8(0..4) == 0;
                let result =
                    lockkit::with_lock(conn, 1, LockOptions::default(), |c, item: Item| {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(item.stock - 1))
                            .execute(c)?;
                        order(c)?;
                        match fail {
                            true => Err(Error::NoRowMatched),
                            false => Ok(()),
                        }
                    });
                match result {
                    Ok(()) => break,
                    Err(Error::NoRowMatched) => continue,
                    Err(err) if err.is_retryable() => continue,
                    Err(err) => panic!("with_lock: {err:?}"),
                }
            },
            // A versioned struct whose first write rolls back a third of the
            // time, written again (restored) in a new transaction.
            3 => loop {
                let mut item = items::table.find(1).first::<Item>(conn).unwrap();
                item.stock -= 1;
                thread::sleep(Duration::from_micros(fastrand::u64(0..2000)));
                if fastrand::u8(0..3) == 0 {
                    let rolled = conn.transaction::<(), Error, _>(|c| {
                        item.update_versioned(c)?;
                        order(c)?;
                        Err(Error::NoRowMatched)
                    });
                    assert!(rolled.is_err());
                }
                let result = conn.transaction::<_, Error, _>(|c| {
                    item.update_versioned(c)?;
                    order(c)
                });
                match result {
                    Ok(()) => break,
                    Err(err) if err.is_retryable() => continue,
                    Err(err) => panic!("versioned: {err:?}"),
                }
            },
            // A versioned conditional update.
            _ => {
                lockkit::transaction_with_retry(conn, &policy(), |c| {
                    Item::update_if(c, 1, items::stock.ge(1), items::stock.eq(items::stock - 1))?;
                    order(c)
                })
                .unwrap_or_else(|err| panic!("update_if: {err:?}"));
            }
        }
    }};
}

/// Item 1 at [`INITIAL`], then 10 threads, each making 15 sales of its kind
/// (thread % 5) on `$db`; returns (stock, orders).
macro_rules! run_etag_race {
    ($db:expr, $naive:expr) => {{
        const RACERS: usize = 10;
        seed_items(&mut $db.conn(), &[(1, INITIAL)]);
        let db = &$db;
        let barrier = Barrier::new(RACERS);
        thread::scope(|s| {
            for t in 0..RACERS {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut conn = db.connect();
                    barrier.wait();
                    for _ in 0..15 {
                        sell_by_kind!(&mut conn, t % 5, $naive);
                    }
                });
            }
        });
        let mut conn = db.conn();
        let stock = stock_of!(&mut conn);
        let orders: i64 = orders::table.count().get_result(&mut conn).unwrap();
        eprintln!(
            "{BACKEND} (naive: {}): stock {stock}, orders {orders}",
            $naive
        );
        (stock, orders as i32)
    }};
}

mod etag {
    use super::*;

    lockkit_tests::backend_tests! {
        fn etag_writes_racing_every_other_writer_lose_no_sale(db) {
            let (stock, orders) = run_etag_race!(db, false);
            assert_eq!(orders, 150, "every sale made");
            assert_eq!(stock + orders, INITIAL, "stock + sold must equal the initial stock");
        }
    }
}

mod baseline {
    use super::*;

    lockkit_tests::server_tests! {
        fn baseline_blind_http_writers_do_lose_sales(db) {
            // The same race with the HTTP-style writers writing blindly: the
            // audit must see lost sales, or it could not see them above.
            let (stock, orders) = run_etag_race!(db, true);
            assert!(stock + orders > INITIAL, "blind writers lost no sale: stock {stock}, orders {orders}");
        }
    }
}

/// Sells one unit of item `$id` optimistically (struct read, versioned write
/// with its order in one transaction), re-reading on a conflict.
macro_rules! optimistic_sale {
    ($conn:expr, $id:expr) => {{
        let conn = $conn;
        loop {
            let mut item = items::table.find($id).first::<Item>(conn).unwrap();
            thread::sleep(Duration::from_micros(fastrand::u64(0..2000)));
            item.stock -= 1;
            let result = conn.transaction::<_, Error, _>(|c| {
                item.update_versioned(c)?;
                order!(c, $id, $id)
            });
            match result {
                Ok(()) => break,
                Err(err) if err.is_retryable() => continue,
                Err(err) => panic!("optimistic: {err:?}"),
            }
        }
    }};
}

mod lock_all_nested {
    use super::*;

    lockkit_tests::backend_tests! {
        fn lock_all_with_nested_lock_rollbacks_then_plain_writes_lose_nothing(db) {
            // Lockers: lock_all of items 1 and 2; a nested with_lock of item 1
            // (NOWAIT, held already by this transaction) sells one and then
            // half the time fails (its savepoint rolled back, the error let go);
            // a nested with_lock of item 2 with a timeout sells one and commits
            // with the transaction; then plain writes on both items (no version
            // check, relying on the locks' bumps). Optimistic sellers of both
            // items race with them.
            seed_items(&mut db.conn(), &[(1, INITIAL), (2, INITIAL)]);
            let db = &db;
            let barrier = Barrier::new(8);
            thread::scope(|s| {
                for t in 0..8 {
                    let barrier = &barrier;
                    s.spawn(move || {
                        let mut conn = db.connect();
                        barrier.wait();
                        for n in 0..12 {
                            if t % 2 == 1 {
                                optimistic_sale!(&mut conn, 1 + (n % 2));
                                continue;
                            }
                            let order = |c: &mut Conn, id: i32| order!(c, id, id);
                            lockkit::transaction_with_retry(&mut conn, &policy(), |c| {
                                let rows = Item::lock_all(c, &[1, 2])?;
                                assert_eq!(rows.len(), 2);
                                let fail = fastrand::bool();
                                let nested = lockkit::with_lock(c, 1, LockOptions::default().nowait(), |c, item: Item| {
                                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(c)?;
                                    order(c, 1)?;
                                    match fail {
                                        true => Err(Error::NoRowMatched),
                                        false => Ok(()),
                                    }
                                });
                                match nested {
                                    Ok(()) | Err(Error::NoRowMatched) => {}
                                    Err(err) => return Err(err),
                                }
                                lockkit::with_lock(c, 2, LockOptions::default().timeout(Duration::from_secs(2)), |c, item: Item| {
                                    diesel::update(items::table.find(2)).set(items::stock.eq(item.stock - 1)).execute(c)?;
                                    order(c, 2)
                                })?;
                                for id in [1, 2] {
                                    let stock: i32 = items::table.find(id).select(items::stock).first(c)?;
                                    diesel::update(items::table.find(id)).set(items::stock.eq(stock - 1)).execute(c)?;
                                    order(c, id)?;
                                }
                                Ok::<_, Error>(())
                            })
                            .unwrap_or_else(|err| panic!("locker: {err:?}"));
                        }
                    });
                }
            });
            let mut conn = db.conn();
            for id in [1, 2] {
                let stock = stock_of!(&mut conn, id);
                let sold: i64 = orders::table.filter(orders::qty.eq(id)).count().get_result(&mut conn).unwrap();
                eprintln!("{BACKEND}: item {id}: stock {stock}, sold {sold}");
                assert_eq!(stock + sold as i32, INITIAL, "item {id}: stock + sold must equal the initial stock");
            }
        }
    }
}
