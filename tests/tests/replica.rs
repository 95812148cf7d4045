//! Replicas (`lockkit::replica`) on a real PostgreSQL primary and its streaming
//! standby: reads that see their own writes, stale reads whose versioned writes
//! are refused (never a lost update), and writes the standby refuses. Lag is made
//! real by pausing the standby's replay (`pg_wal_replay_pause()`).
#![cfg(feature = "postgres")]

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::replica::{self, Lsn, Policy, Route};
use lockkit::{Error, LockOptions};
use lockkit_tests::models::Item;
use lockkit_tests::replica::{assert_replica_behind, ReplayPaused};
use lockkit_tests::schema::items;
use lockkit_tests::{item, seed_items, stock_of, TestReplicas};
use proptest::prelude::*;

/// [`stock_of!`] as a function, taking the `PgConnection` a routed one derefs to.
fn stock(conn: &mut PgConnection) -> i32 {
    stock_of!(conn)
}

/// [`item!`] of row 1 as a function, taking the `PgConnection` a routed one derefs to.
fn item(conn: &mut PgConnection) -> Item {
    item!(conn, 1)
}

/// Sells one of item 1 with a blind write: `stock = <what was read> - 1`.
fn sell_blind(conn: &mut PgConnection, read: &Item) {
    diesel::update(items::table.find(1))
        .set(items::stock.eq(read.stock - 1))
        .execute(conn)
        .unwrap();
}

#[test]
fn a_read_after_a_write_sees_it_while_the_replica_lags() {
    let db = TestReplicas::new("read_after_write");
    db.seed_replicated(&[(1, 10)]);
    let router = db.router(Policy::WaitThenPrimary(Duration::from_millis(100)));

    let paused = db.pause_replay();
    let ((), written) = router
        .write(|conn| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(9))
                .execute(conn)?;
            Ok::<_, Error>(())
        })
        .unwrap();

    // The lag is real: the replica still shows the old stock.
    let mut naive = router.read(None).unwrap();
    assert_eq!(
        naive.route(),
        Route::Replica {
            waited: Duration::ZERO
        }
    );
    assert_eq!(
        stock(&mut naive),
        10,
        "the paused replica shows the write already"
    );
    drop(naive);

    // With the write's position, the read waits 100 ms, then reads the primary.
    let mut read = router.read(Some(written)).unwrap();
    let Route::PrimaryReplicaBehind { replayed, waited } = read.route() else {
        panic!("expected the primary, got {:?}", read.route());
    };
    assert!(replayed < written, "{replayed} < {written}");
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert_eq!(stock(&mut read), 9);
    drop(read);

    // Other policies, same lag.
    let mut replica = db.standby();
    assert_eq!(
        replica::route(&mut replica, Some(written), Policy::Primary).unwrap(),
        Route::PrimaryByPolicy
    );
    let wait = Duration::from_millis(20);
    let failed = replica::route(&mut replica, Some(written), Policy::WaitOrFail(wait));
    assert_replica_behind(failed, written, wait);

    // Replay resumed: the same position now reads on the replica, which shows the write.
    paused.resume();
    let mut read = router.read(Some(written)).unwrap();
    assert!(read.route().is_replica(), "{:?}", read.route());
    assert_eq!(stock(&mut read), 9);
}

/// Item 1 seeded at 10, replay paused, then item 1 set to 9 on the primary:
/// the pause (resume it to let the standby catch up) and the write's position.
fn written_while_replay_is_paused(db: &TestReplicas) -> (ReplayPaused, Lsn) {
    seed_items(&mut db.primary(), &[(1, 10)]);
    let paused = db.pause_replay();
    let mut primary = db.primary();
    diesel::update(items::table.find(1))
        .set(items::stock.eq(9))
        .execute(&mut primary)
        .unwrap();
    (paused, replica::commit_lsn(&mut primary).unwrap())
}

#[test]
fn a_read_waits_for_the_replica_to_replay_the_write() {
    use diesel::connection::InstrumentationEvent;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc};
    let db = TestReplicas::new("read_waits");
    let (paused, written) = written_while_replay_is_paused(&db);
    let mut replica = db.standby();
    // Each look of the route at the replica's replay, counted and signalled.
    let looks = Arc::new(AtomicUsize::new(0));
    let (looked_tx, looked) = mpsc::channel();
    {
        let looks = looks.clone();
        replica.set_instrumentation(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::FinishQuery { query, .. } = event {
                if query.to_string().contains("pg_last_wal_replay_lsn") {
                    looks.fetch_add(1, Ordering::SeqCst);
                    let _ = looked_tx.send(());
                }
            }
        });
    }
    let (route, done, resumed_at) = thread::scope(|s| {
        let resumer = s.spawn(move || {
            // Once the route has found the replay behind (it is paused), and
            // so waits for it, however late the route began.
            looked
                .recv_timeout(Duration::from_secs(30))
                .expect("the route looked at the replica");
            let resumed_at = Instant::now();
            paused.resume();
            resumed_at
        });
        let route = replica::route(
            &mut replica,
            Some(written),
            Policy::WaitThenPrimary(Duration::from_secs(10)),
        )
        .unwrap();
        (route, Instant::now(), resumer.join().unwrap())
    });
    let Route::Replica { waited } = route else {
        panic!("expected the replica, got {route:?}");
    };
    // The route found the replay behind, and returned only after replay
    // resumed, at a later look: it waited for the replay.
    let looks = looks.load(Ordering::SeqCst);
    assert!(
        looks >= 2,
        "the route went to the replica after {looks} look(s)"
    );
    assert!(
        done >= resumed_at,
        "released before replay resumed ({waited:?})"
    );
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(stock(&mut replica), 9);
}

#[test]
fn a_write_with_synchronous_commit_off_is_seen_too() {
    let db = TestReplicas::new("async_commit");
    seed_items(&mut db.primary(), &[(1, 10)]);
    let mut primary = db.primary();
    primary
        .batch_execute("SET synchronous_commit = off")
        .unwrap();
    let mut replica = db.standby();
    let mut on_primary = 0;
    for n in 1..=20 {
        diesel::update(items::table.find(1))
            .set(items::stock.eq(10 + n))
            .execute(&mut primary)
            .unwrap();
        let written = replica::commit_lsn(&mut primary).unwrap();
        let route = replica::route(
            &mut replica,
            Some(written),
            Policy::WaitThenPrimary(Duration::from_secs(2)),
        )
        .unwrap();
        // The insert position may be past the last record; then the read goes to
        // the primary after the wait. Either way it sees the write.
        let seen = if route.is_replica() {
            stock(&mut replica)
        } else {
            stock(&mut primary)
        };
        assert_eq!(seen, 10 + n, "{route:?}");
        on_primary += u32::from(!route.is_replica());
    }
    println!(
        "synchronous_commit = off: {on_primary} of 20 reads went to the primary after the wait"
    );
}

/// Several clients write and read their own rows at once through the router;
/// every read shows the client's last write. The replica is not paused: this
/// measures real streaming lag on this machine.
#[test]
fn concurrent_clients_read_their_own_writes() {
    const CLIENTS: i32 = 4;
    const ROUNDS: i32 = 50;
    let db = TestReplicas::new("concurrent_ryw");
    let seeds: Vec<(i32, i32)> = (1..=CLIENTS).map(|id| (id, 0)).collect();
    db.seed_replicated(&seeds);
    let router = db.router(Policy::WaitThenPrimary(Duration::from_secs(2)));
    let barrier = Barrier::new(CLIENTS as usize);
    let results: Vec<(Vec<Duration>, u32, u32)> = thread::scope(|s| {
        let handles: Vec<_> = (1..=CLIENTS)
            .map(|id| {
                let (router, barrier) = (&router, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let (mut waits, mut on_primary, mut naive_stale) = (Vec::new(), 0, 0);
                    for round in 1..=ROUNDS {
                        let ((), written) = router
                            .write(|conn| {
                                diesel::update(items::table.find(id))
                                    .set(items::stock.eq(round))
                                    .execute(conn)?;
                                Ok::<_, Error>(())
                            })
                            .unwrap();
                        // The naive read: the replica, right away, no position.
                        let mut naive = router.read(None).unwrap();
                        let seen: i32 = items::table
                            .find(id)
                            .select(items::stock)
                            .first(&mut *naive)
                            .unwrap();
                        naive_stale += u32::from(seen != round);
                        drop(naive);
                        let started = Instant::now();
                        let mut read = router.read(Some(written)).unwrap();
                        let seen: i32 = items::table
                            .find(id)
                            .select(items::stock)
                            .first(&mut *read)
                            .unwrap();
                        assert_eq!(seen, round, "client {id} read {:?}", read.route());
                        match read.route() {
                            Route::Replica { .. } => waits.push(started.elapsed()),
                            _ => on_primary += 1,
                        }
                    }
                    (waits, on_primary, naive_stale)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut waits: Vec<Duration> = results.iter().flat_map(|r| r.0.iter().copied()).collect();
    let on_primary: u32 = results.iter().map(|r| r.1).sum();
    let naive_stale: u32 = results.iter().map(|r| r.2).sum();
    waits.sort();
    let at = |q: f64| waits[((waits.len() - 1) as f64 * q) as usize];
    println!(
        "read-your-writes, {} reads: {} on the replica (route + wait: p50 {:?}, p99 {:?}, max {:?}), \
         {on_primary} on the primary; naive reads right after the write that missed it: {naive_stale}",
        CLIENTS * ROUNDS,
        waits.len(),
        at(0.5),
        at(0.99),
        at(1.0),
    );
    assert_eq!(waits.len() as u32 + on_primary, (CLIENTS * ROUNDS) as u32);
}

/// A read on the lagging replica, then a versioned write on the primary: the
/// write is refused as stale. The naive read and blind write loses a sale.
#[test]
fn a_stale_read_from_the_replica_cannot_lose_an_update() {
    let db = TestReplicas::new("stale_read_versioned");
    db.seed_replicated(&[(1, 10)]);
    let mut primary = db.primary();
    let mut replica = db.standby();

    // Naive: two sales, each read on the lagging replica, each a blind write.
    let paused = db.pause_replay();
    let first = item(&mut replica);
    sell_blind(&mut primary, &first);
    let second = item(&mut replica); // still stock 10: replay is paused
    assert_eq!(second.stock, 10);
    sell_blind(&mut primary, &second);
    assert_eq!(
        stock(&mut primary),
        9,
        "two sales, one lost: 9 instead of 8"
    );
    paused.resume();

    // Versioned: the same two sales.
    primary
        .batch_execute("UPDATE items SET stock = 10, lock_version = 0 WHERE id = 1")
        .unwrap();
    db.wait_for_standby(&mut primary);
    let paused = db.pause_replay();
    let mut first = item(&mut replica);
    first.stock -= 1;
    first.update_versioned(&mut primary).unwrap();
    let mut second = item(&mut replica);
    assert_eq!(
        (second.stock, second.lock_version),
        (10, 0),
        "the replica lags"
    );
    second.stock -= 1;
    let refused = second.update_versioned(&mut primary).unwrap_err();
    let stale = refused
        .as_stale()
        .unwrap_or_else(|| panic!("expected Stale, got {refused:?}"));
    assert_eq!(stale.expected_version, 0);
    assert_eq!(stale.current, lockkit::CurrentState::Version(1));
    // update_by_version with the stale version is refused the same way.
    let by_version =
        Item::update_by_version(&mut primary, 1, second.lock_version, items::stock.eq(9));
    assert!(matches!(by_version, Err(Error::Stale(_))), "{by_version:?}");
    assert_eq!(
        stock(&mut primary),
        9,
        "the first sale stands, nothing lost"
    );

    // Re-read where the write is visible (the primary), and the second sale lands.
    let mut second = item(&mut primary);
    second.stock -= 1;
    second.update_versioned(&mut primary).unwrap();
    assert_eq!(stock(&mut primary), 8);
    paused.resume();
}

/// Several sellers read from the replica (paused, so every first read is
/// stale) and write versioned on the primary, re-reading through the router
/// with their last position after a refusal: every sale is counted. The same
/// sellers with blind writes lose sales.
#[test]
fn concurrent_sellers_reading_a_lagging_replica_lose_nothing() {
    const SELLERS: usize = 4;
    const SALES: i32 = 5;
    let db = TestReplicas::new("concurrent_sellers");
    let start = 100;
    db.seed_replicated(&[(1, start)]);
    let router = db.router(Policy::WaitThenPrimary(Duration::from_millis(20)));

    // Naive baseline: each seller reads the lagging replica and writes blind.
    let paused = db.pause_replay();
    let barrier = Barrier::new(SELLERS);
    thread::scope(|s| {
        for _ in 0..SELLERS {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..SALES {
                    let read = item(&mut router.read(None).unwrap());
                    sell_blind(&mut router.primary().unwrap(), &read);
                }
            });
        }
    });
    let naive_left = stock(&mut router.primary().unwrap());
    println!(
        "naive: {} sales from a lagging replica left stock {naive_left}, {} sales lost",
        SELLERS as i32 * SALES,
        naive_left - (start - SELLERS as i32 * SALES)
    );
    assert_eq!(
        naive_left,
        start - 1,
        "every blind write wrote the replica's 100 - 1"
    );
    paused.resume();

    // Versioned: the same sellers, a refused write re-reads with its position.
    router
        .primary()
        .unwrap()
        .batch_execute(&format!(
            "UPDATE items SET stock = {start}, lock_version = 0 WHERE id = 1"
        ))
        .unwrap();
    db.wait_for_standby(&mut db.primary());
    let paused = db.pause_replay();
    let refusals: usize = thread::scope(|s| {
        let handles: Vec<_> = (0..SELLERS)
            .map(|_| {
                let (router, barrier) = (&router, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut refused = 0;
                    let mut written: Option<Lsn> = None;
                    for _ in 0..SALES {
                        loop {
                            let mut read = item(&mut router.read(written).unwrap());
                            read.stock -= 1;
                            let mut primary = router.primary().unwrap();
                            match read.update_versioned(&mut *primary) {
                                Ok(()) => {
                                    written = Some(replica::commit_lsn(&mut primary).unwrap());
                                    break;
                                }
                                Err(Error::Stale(_)) => {
                                    refused += 1;
                                    // What the primary has now is what the next read must see.
                                    written = Some(replica::commit_lsn(&mut primary).unwrap());
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                    refused
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    paused.resume();
    let left = stock(&mut router.primary().unwrap());
    println!("versioned: stock {left}, {refusals} stale writes refused and retried");
    assert_eq!(left, start - SELLERS as i32 * SALES, "every sale counted");
    assert!(
        refusals >= SELLERS - 1,
        "all first reads were stale: {refusals} refusals"
    );
}

#[test]
fn the_standby_refuses_writes_and_locks_with_a_typed_error() {
    let db = TestReplicas::new("standby_read_only");
    db.seed_replicated(&[(1, 10)]);
    let router = db.router(Policy::Primary);
    let mut replica = router.read(None).unwrap();
    assert!(replica.route().is_replica());

    let blind = diesel::update(items::table.find(1))
        .set(items::stock.eq(1))
        .execute(&mut *replica);
    assert!(matches!(blind.map_err(Error::from), Err(Error::ReadOnly)));

    let mut read = item(&mut replica);
    read.stock = 1;
    let versioned = read.update_versioned(&mut *replica);
    assert!(matches!(versioned, Err(Error::ReadOnly)), "{versioned:?}");

    let locked = read.with_lock(&mut *replica, |_, item: Item| Ok::<_, Error>(item.stock));
    assert!(matches!(locked, Err(Error::ReadOnly)), "{locked:?}");
    let locked = lockkit::with_lock(&mut *replica, 1, LockOptions::default(), |_, item: Item| {
        Ok::<_, Error>(item.stock)
    });
    assert!(matches!(locked, Err(Error::ReadOnly)), "{locked:?}");
    assert!(!Error::ReadOnly.is_retryable());

    // Advisory locks too: a standby's would be its own, excluding no one who
    // takes the same key on the primary.
    let advisory = lockkit::advisory::try_lock(&mut *replica, 42).map(|guard| guard.is_some());
    assert!(matches!(advisory, Err(Error::ReadOnly)), "{advisory:?}");
    let advisory = lockkit::advisory::lock(&mut *replica, 42).map(drop);
    assert!(matches!(advisory, Err(Error::ReadOnly)), "{advisory:?}");
    let advisory = replica.transaction(|conn| lockkit::advisory::xact_lock(conn, 42));
    assert!(matches!(advisory, Err(Error::ReadOnly)), "{advisory:?}");

    // Locks go to the primary, which has the latest row even while replay is paused.
    let paused = db.pause_replay();
    let mut primary = router.primary().unwrap();
    diesel::update(items::table.find(1))
        .set(items::stock.eq(7))
        .execute(&mut *primary)
        .unwrap();
    let locked = lockkit::with_lock(&mut *primary, 1, LockOptions::default(), |_, item: Item| {
        Ok::<_, Error>(item.stock)
    });
    assert_eq!(locked.unwrap(), 7);
    assert_eq!(stock(&mut replica), 10);
    paused.resume();
    assert_eq!(stock(&mut primary), 7);
}

/// What the tests of a committed write whose own connection cannot read the
/// position run in the work: a function of the work's schema, first on the
/// session's search path, hides the one the position is read with.
const HIDE_THE_POSITION: &str = "CREATE SCHEMA lockkit_hide; \
     CREATE FUNCTION lockkit_hide.pg_current_wal_insert_lsn() RETURNS pg_lsn \
     AS $$ BEGIN RAISE EXCEPTION 'no position on this session'; END $$ LANGUAGE plpgsql; \
     SET search_path = lockkit_hide, pg_catalog, public";

/// A write that committed is not reported as failed when its own connection
/// cannot read the position afterwards (it broke, or its session settings
/// refuse): any position read on the primary after the `COMMIT` covers it,
/// and the router reads one on another connection. A caller that retried an
/// error would have written twice.
#[test]
fn a_committed_write_whose_connection_cannot_read_the_position_still_gets_one() {
    let db = TestReplicas::new("position_elsewhere");
    db.seed_replicated(&[(1, 10)]);
    let router = db.router(Policy::WaitThenPrimary(Duration::from_secs(10)));
    let (sold, written) = router
        .write(|conn| {
            conn.batch_execute(HIDE_THE_POSITION)?;
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)?;
            Ok::<_, Error>(1)
        })
        .unwrap();
    assert_eq!(sold, 1);
    let mut read = router.read(Some(written)).unwrap();
    assert_eq!(stock(&mut read), 9);
    drop(read);

    // With a pool of one connection too: the write's goes back to the pool,
    // which discards it, before the router asks for another (not a wait for
    // the pool's timeout, and not the same connection again).
    let one = |url: &str| {
        diesel::r2d2::Pool::builder()
            .max_size(1)
            .connection_timeout(Duration::from_secs(5))
            .build(diesel::r2d2::ConnectionManager::<PgConnection>::new(url))
            .unwrap()
    };
    let router = lockkit::replica::Router::new(
        one(&db.primary_url),
        one(&db.standby_url),
        Policy::WaitThenPrimary(Duration::from_secs(10)),
    );
    let started = Instant::now();
    let (_, written) = router
        .write(|conn| {
            conn.batch_execute("SET search_path = lockkit_hide, pg_catalog, public")?;
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)?;
            Ok::<_, Error>(1)
        })
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "{took:?}");
    let mut read = router.read(Some(written)).unwrap();
    assert_eq!(stock(&mut read), 8);
}

/// A write that rolls back gives no position, and neither does one the
/// server threw away: the work let a failed statement go, so PostgreSQL
/// answers its `COMMIT` with `ROLLBACK`, which the router must not report as
/// committed. Then a write's position reads the primary under
/// `Policy::Primary`.
#[test]
fn a_rolled_back_write_gives_no_position_and_the_primary_policy_reads_the_primary() {
    let db = TestReplicas::new("router_write_rollback");
    db.seed_replicated(&[(1, 10)]);
    let router = db.router(Policy::Primary);

    for let_go in [false, true] {
        let failed = router.write(|conn| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(1))
                .execute(conn)?;
            if let_go {
                assert!(diesel::sql_query("SELECT 1 / 0").execute(conn).is_err());
                return Ok(());
            }
            Err(Error::InvalidInput("the caller changed its mind"))
        });
        let stock = stock(&mut router.primary().unwrap());
        assert!(
            (let_go || matches!(failed, Err(Error::InvalidInput(_))))
                && failed.is_err()
                && stock == 10,
            "Router::write returned {failed:?} for a write that did not commit; stock {stock}"
        );
    }

    let paused = db.pause_replay();
    let (sold, written) = router
        .write(|conn| {
            let mut item = item(conn);
            item.stock -= 1;
            item.update_versioned(conn)?;
            Ok::<_, Error>(item.stock)
        })
        .unwrap();
    assert_eq!(sold, 9);
    let mut read = router.read(Some(written)).unwrap();
    assert_eq!(read.route(), Route::PrimaryByPolicy);
    assert_eq!(stock(&mut read), 9);
    let mut without = router.read(None).unwrap();
    assert!(without.route().is_replica());
    assert_eq!(stock(&mut without), 10, "the paused replica");
    paused.resume();
}

#[test]
fn read_only_transactions_on_the_primary_are_read_only_too() {
    let db = TestReplicas::new("read_only_transaction");
    seed_items(&mut db.primary(), &[(1, 10)]);
    let mut primary = db.primary();
    let refused = primary.build_transaction().read_only().run(|conn| {
        diesel::update(items::table.find(1))
            .set(items::stock.eq(1))
            .execute(conn)?;
        Ok::<_, Error>(())
    });
    assert!(matches!(refused, Err(Error::ReadOnly)), "{refused:?}");
    assert_eq!(stock(&mut primary), 10);
}

/// The replica is looked at outside a transaction only: inside one (REPEATABLE
/// READ) the read would see the snapshot of the transaction's first statement,
/// from before the replay the look found.
#[test]
fn a_route_inside_a_transaction_on_the_replica_is_refused() {
    let db = TestReplicas::new("route_in_transaction");
    let (paused, written) = written_while_replay_is_paused(&db);
    let mut replica = db.standby();
    let seen = thread::scope(|s| {
        s.spawn(move || {
            thread::sleep(Duration::from_millis(300));
            paused.resume();
        });
        replica
            .build_transaction()
            .repeatable_read()
            .read_only()
            .run(|conn| {
                let route = replica::route(
                    conn,
                    Some(written),
                    Policy::WaitThenPrimary(Duration::from_secs(10)),
                )?;
                Ok::<_, Error>((route, stock(conn)))
            })
    });
    assert!(matches!(seen, Err(Error::AlreadyInTransaction)), "{seen:?}");

    // A route that looks at nothing (no position to see) is no question of
    // snapshots: it is answered inside a transaction too.
    let route = replica.transaction(|conn| {
        replica::route(conn, None, Policy::WaitThenPrimary(Duration::from_secs(1)))
    });
    assert!(matches!(route, Ok(Route::Replica { .. })), "{route:?}");
}

#[test]
fn positions_are_taken_after_the_commit_and_only_from_a_standby() {
    let db = TestReplicas::new("positions");
    let mut primary = db.primary();
    let inside = primary.transaction(|conn| Ok::<_, Error>(replica::commit_lsn(conn)));
    assert!(
        matches!(inside, Ok(Err(Error::AlreadyInTransaction))),
        "{inside:?}"
    );

    let before = replica::commit_lsn(&mut primary).unwrap();
    seed_items(&mut primary, &[(1, 10)]);
    let after = replica::commit_lsn(&mut primary).unwrap();
    assert!(after > before, "{after} > {before}");

    // The primary is not a standby: it has no replay position, and a "replica"
    // that is not in recovery is never read.
    assert_eq!(replica::replayed_lsn(&mut primary).unwrap(), None);
    let route = replica::route(
        &mut primary,
        Some(after),
        Policy::WaitThenPrimary(Duration::from_secs(1)),
    )
    .unwrap();
    assert_eq!(route, Route::PrimaryNotAStandby);
    // A standby is.
    db.wait_for_standby(&mut primary);
    let replayed = replica::replayed_lsn(&mut db.standby()).unwrap().unwrap();
    assert!(replayed >= after, "{replayed} >= {after}");
    // No position to see: the replica at once, without asking it.
    assert_eq!(
        replica::route(&mut primary, None, Policy::Primary).unwrap(),
        Route::Replica {
            waited: Duration::ZERO
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Whatever a client sends as its token, parsing returns, and what parses
    /// prints back as the same position.
    #[test]
    fn any_token_text_parses_or_is_refused_without_a_panic(text in "\\PC{0,24}") {
        if let Ok(lsn) = text.parse::<Lsn>() {
            prop_assert_eq!(lsn.to_string().parse::<Lsn>(), Ok(lsn));
        }
    }

    #[test]
    fn every_position_round_trips_through_its_token(position in any::<u64>()) {
        let lsn = Lsn::from(position);
        let text = lsn.to_string();
        prop_assert!(text.bytes().all(|b| b.is_ascii_hexdigit() || b == b'/'));
        prop_assert_eq!(text.parse::<Lsn>(), Ok(lsn));
    }
}

/// `commit_lsn` after a write made with `SET LOCAL synchronous_commit = off`
/// (the usual way to make one write cheap; the setting is back at `on` by the
/// time `commit_lsn` runs): the position must still be past the commit, here
/// past the WAL insert position read just before `COMMIT`, in each of 100
/// rounds. A replica that replayed to a position before the commit would be
/// read without the write.
#[test]
fn the_commit_position_is_past_a_commit_made_with_set_local_synchronous_commit_off() {
    #[derive(diesel::QueryableByName)]
    struct Position {
        #[diesel(sql_type = diesel::sql_types::Text)]
        lsn: String,
    }
    let db = lockkit_tests::TestDb::<PgConnection>::new("commit_lsn_set_local_off");
    seed_items(&mut db.conn(), &[(1, 1_000)]);
    let mut conn = db.connect();
    let mut before_commit = Vec::new();
    for round in 0..100 {
        // The commit record begins after the insert position read in the
        // transaction, so a position that covers the commit is beyond it.
        let pre_commit: Lsn = conn
            .transaction(|conn| {
                conn.batch_execute("SET LOCAL synchronous_commit = off")?;
                diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1")
                    .execute(conn)?;
                diesel::sql_query("SELECT pg_current_wal_insert_lsn()::text AS lsn")
                    .get_result::<Position>(conn)
            })
            .unwrap()
            .lsn
            .parse()
            .unwrap();
        let token = replica::commit_lsn(&mut conn).unwrap();
        if token <= pre_commit {
            before_commit.push((round, token.to_string(), pre_commit.to_string()));
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert!(
        before_commit.is_empty(),
        "commit_lsn returned a position before the commit it follows (round, position, insert \
         position before COMMIT) in {} of 100 rounds: {:?}",
        before_commit.len(),
        &before_commit[..before_commit.len().min(5)]
    );
}

/// A connection Diesel marked broken (a call dropped in a transaction there,
/// which may still be open on the server with its old snapshot): `route` and
/// `commit_lsn` refuse it before they send anything, blocking and async.
#[test]
fn route_and_commit_lsn_refuse_a_broken_connection() {
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    let broken = |result: Result<String, Error>| {
        assert!(
            matches!(
                result,
                Err(Error::Database(
                    diesel::result::Error::BrokenTransactionManager
                ))
            ),
            "{result:?}"
        );
    };
    let db = lockkit_tests::TestDb::<PgConnection>::new("replica_broken");
    let mut conn = db.connect();
    let written = replica::commit_lsn(&mut conn).unwrap();
    AnsiTransactionManager::transaction_manager_status_mut(&mut conn).set_in_error();
    let wait = Policy::WaitThenPrimary(Duration::from_secs(1));
    broken(replica::route(&mut conn, Some(written), wait).map(|r| format!("{r:?}")));
    broken(replica::commit_lsn(&mut conn).map(|p| p.to_string()));

    #[cfg(feature = "async")]
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            use diesel_async::{AnsiTransactionManager, AsyncConnection, TransactionManager};
            let mut conn = diesel_async::AsyncPgConnection::establish(&db.url)
                .await
                .unwrap();
            AnsiTransactionManager::transaction_manager_status_mut(&mut conn).set_in_error();
            let route = replica::asynchronous::route(&mut conn, Some(written), wait).await;
            broken(route.map(|r| format!("{r:?}")));
            broken(
                replica::asynchronous::commit_lsn(&mut conn)
                    .await
                    .map(|p| p.to_string()),
            );
        });
}

/// MySQL/MariaDB refuse a write in a `READ ONLY` transaction with 1792, which
/// lockkit reports as it reports a PostgreSQL standby's refusal.
#[cfg(feature = "mysql")]
#[test]
fn mysql_read_only_transactions_are_read_only() {
    use diesel::MysqlConnection;
    let db = lockkit_tests::TestDb::<MysqlConnection>::new("mysql_read_only");
    let mut conn = db.connect();
    seed_items(&mut conn, &[(1, 10)]);
    conn.batch_execute("START TRANSACTION READ ONLY").unwrap();
    let refused = diesel::update(items::table.find(1))
        .set(items::stock.eq(1))
        .execute(&mut conn);
    conn.batch_execute("ROLLBACK").unwrap();
    assert!(matches!(refused.map_err(Error::from), Err(Error::ReadOnly)));
    assert_eq!(stock_of!(&mut conn), 10);
}

/// A server started with `--read-only` refuses a user without `SUPER` with error
/// 1290, which Diesel gives no kind of its own. The suite's MySQL server is
/// shared and its root bypasses `read_only`, so the server's message is built
/// here, as MariaDB 10.11 sends it.
#[test]
fn a_read_only_server_message_is_read_only() {
    #[derive(Debug)]
    struct Refused;
    impl diesel::result::DatabaseErrorInformation for Refused {
        fn message(&self) -> &str {
            "The MariaDB server is running with the --read-only option so it cannot execute this statement"
        }
        fn details(&self) -> Option<&str> {
            None
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            None
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            None
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }
    let err = diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::Unknown,
        Box::new(Refused),
    );
    assert!(matches!(lockkit::classify(err), Error::ReadOnly));
}

/// A primary and a streaming standby of one test's own
/// (`scripts/pg-standby.sh`, on free ports), stopped and removed on drop.
struct OwnPair {
    dir: std::path::PathBuf,
    standby_port: u16,
}

impl OwnPair {
    /// Started on two ports free a moment before (another test's connection
    /// may take one meanwhile: then on two others, up to three times; each
    /// start stops what a failed one left in the folder).
    fn start(name: &str) -> OwnPair {
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port()
        };
        let dir = std::env::temp_dir().join(format!("lockkit-{name}-{}", std::process::id()));
        for _ in 0..3 {
            let pair = OwnPair {
                dir: dir.clone(),
                standby_port: free_port(),
            };
            let primary_port = free_port().to_string();
            if pair.run(&["start", &primary_port, &pair.standby_port.to_string()]) {
                return pair;
            }
        }
        panic!("scripts/pg-standby.sh could not start a pair in three tries (its log is above)");
    }

    /// `scripts/pg-standby.sh COMMAND DIR ARGS..`: whether it succeeded.
    fn run(&self, args: &[&str]) -> bool {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-standby.sh");
        let (command, rest) = args.split_first().expect("a command");
        std::process::Command::new(script)
            .arg(command)
            .arg(&self.dir)
            .args(rest)
            .status()
            .is_ok_and(|status| status.success())
    }

    fn standby(&self) -> PgConnection {
        let url = format!("postgres://postgres@127.0.0.1:{}/test", self.standby_port);
        PgConnection::establish(&url).expect("connect to the pair's standby")
    }
}

impl Drop for OwnPair {
    fn drop(&mut self) {
        // Never a panic here: a failed stop must not abort the test binary.
        let _ = self.run(&["stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A promoted standby keeps the last position it replayed
/// (`pg_last_wal_replay_lsn` stays put once recovery ends), but it is a
/// primary now, whose writes no other server replays: a read with a position
/// never goes to it, however far that position is behind.
#[test]
fn a_promoted_standby_is_not_read_as_a_replica() {
    let pair = OwnPair::start("promoted");
    let mut standby = pair.standby();
    let replayed = replica::replayed_lsn(&mut standby).unwrap();
    assert!(replayed.is_some(), "a standby in recovery has a position");
    assert!(
        pair.run(&["promote"]),
        "scripts/pg-standby.sh promote failed"
    );
    let mut promoted = pair.standby();
    assert_eq!(replica::replayed_lsn(&mut promoted).unwrap(), None);
    let route = replica::route(
        &mut promoted,
        Some("0/1".parse::<Lsn>().unwrap()),
        Policy::WaitThenPrimary(Duration::from_millis(100)),
    )
    .unwrap();
    assert_eq!(route, Route::PrimaryNotAStandby);
}
