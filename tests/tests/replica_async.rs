//! Replicas on diesel-async (`lockkit::replica::asynchronous`) on a real
//! PostgreSQL primary and its streaming standby: reads routed by a write's
//! position see it from several tasks at once, a waiting route yields to other
//! tasks and is released when replay resumes, and a stale read followed by a
//! versioned write is refused, never a lost update. Lag is made real by pausing
//! the standby's replay (`pg_wal_replay_pause()`), as in `tests/replica.rs`.
#![cfg(all(feature = "postgres", feature = "async"))]

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use lockkit::asynchronous::prelude::*;
use lockkit::replica::asynchronous as replica;
use lockkit::replica::asynchronous::{AsyncPgPool, Router};
use lockkit::replica::{Lsn, Policy, Route};
use lockkit::Error;
use lockkit_tests::models::Item;
use lockkit_tests::replica::assert_replica_behind;
use lockkit_tests::schema::items;
use lockkit_tests::{seed_items, TestReplicas};
use tokio::sync::Barrier;

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

async fn stock_of(conn: &mut AsyncPgConnection, id: i32) -> i32 {
    items::table
        .find(id)
        .select(items::stock)
        .first(conn)
        .await
        .unwrap()
}

async fn item(conn: &mut AsyncPgConnection) -> Item {
    items::table.find(1).first(conn).await.unwrap()
}

/// Sets item `id`'s stock on the primary and returns the commit's position.
async fn write(primary: &mut AsyncPgConnection, id: i32, stock: i32) -> Lsn {
    diesel::update(items::table.find(id))
        .set(items::stock.eq(stock))
        .execute(primary)
        .await
        .unwrap();
    replica::commit_lsn(primary).await.unwrap()
}

/// Sets item `id`'s stock through `router` (a transaction on the primary) and
/// returns the commit's position.
async fn write_through<P: AsyncPgPool>(router: &Router<P>, id: i32, stock: i32) -> Lsn {
    let ((), written) = router
        .write(async |conn| {
            diesel::update(items::table.find(id))
                .set(items::stock.eq(stock))
                .execute(conn)
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    written
}

/// Several tasks on a multi-threaded runtime write their own row and read it
/// back routed by the write's position: every read shows the write. Replay is
/// not paused: the waits are this machine's real streaming lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_read_their_own_writes() {
    const TASKS: i32 = 8;
    const ROUNDS: i32 = 40;
    let db = TestReplicas::new("async_read_own_writes");
    let seeds: Vec<(i32, i32)> = (1..=TASKS).map(|id| (id, 0)).collect();
    seed_items(&mut db.primary(), &seeds);
    db.wait_for_standby(&mut db.primary());
    let barrier = Arc::new(Barrier::new(TASKS as usize));
    let tasks: Vec<_> = (1..=TASKS)
        .map(|id| {
            let barrier = barrier.clone();
            let (primary_url, standby_url) = (db.primary_url.clone(), db.standby_url.clone());
            tokio::spawn(async move {
                let mut primary = connect(&primary_url).await;
                let mut standby = connect(&standby_url).await;
                barrier.wait().await;
                let (mut waits, mut on_primary, mut naive_stale) = (Vec::new(), 0u32, 0u32);
                for round in 1..=ROUNDS {
                    let written = write(&mut primary, id, round).await;
                    // The naive read: the replica, right away, no position.
                    naive_stale += u32::from(stock_of(&mut standby, id).await != round);
                    let started = Instant::now();
                    let policy = Policy::WaitThenPrimary(Duration::from_secs(2));
                    let route = replica::route(&mut standby, Some(written), policy)
                        .await
                        .unwrap();
                    let seen = if route.is_replica() {
                        waits.push(started.elapsed());
                        stock_of(&mut standby, id).await
                    } else {
                        on_primary += 1;
                        stock_of(&mut primary, id).await
                    };
                    assert_eq!(seen, round, "task {id} read {route:?}");
                }
                (waits, on_primary, naive_stale)
            })
        })
        .collect();
    let (mut waits, mut on_primary, mut naive_stale) = (Vec::new(), 0, 0);
    for task in tasks {
        let (w, p, n) = task.await.unwrap();
        waits.extend(w);
        on_primary += p;
        naive_stale += n;
    }
    waits.sort();
    assert_eq!(waits.len() as u32 + on_primary, (TASKS * ROUNDS) as u32);
    let at = |q: f64| waits[((waits.len() - 1) as f64 * q) as usize];
    println!(
        "async read-your-writes, {} reads by {TASKS} tasks: {} on the replica (route + wait: \
         p50 {:?}, p99 {:?}, max {:?}), {on_primary} on the primary; naive reads right after \
         the write that missed it: {naive_stale}",
        TASKS * ROUNDS,
        waits.len(),
        at(0.5),
        at(0.99),
        at(1.0),
    );
}

/// While replay is paused, every task's write is missing on the replica (the
/// naive read shows the old stock), and the routed read goes to the primary and
/// sees it; `WaitOrFail` fails with `ReplicaBehind`. Once replay resumes, the
/// same positions read on the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_replay_is_paused_routed_reads_go_to_the_primary() {
    const TASKS: i32 = 4;
    let db = TestReplicas::new("async_paused");
    let seeds: Vec<(i32, i32)> = (1..=TASKS).map(|id| (id, 10)).collect();
    seed_items(&mut db.primary(), &seeds);
    db.wait_for_standby(&mut db.primary());
    let paused = db.pause_replay();
    let tasks: Vec<_> = (1..=TASKS)
        .map(|id| {
            let (primary_url, standby_url) = (db.primary_url.clone(), db.standby_url.clone());
            tokio::spawn(async move {
                let mut primary = connect(&primary_url).await;
                let mut standby = connect(&standby_url).await;
                let written = write(&mut primary, id, 9).await;
                assert_eq!(stock_of(&mut standby, id).await, 10, "the lag is real");

                let policy = Policy::WaitThenPrimary(Duration::from_millis(100));
                let route = replica::route(&mut standby, Some(written), policy)
                    .await
                    .unwrap();
                let Route::PrimaryReplicaBehind { replayed, waited } = route else {
                    panic!("expected the primary, got {route:?}");
                };
                assert!(replayed < written, "{replayed} < {written}");
                assert!(waited >= Duration::from_millis(100), "{waited:?}");
                assert_eq!(stock_of(&mut primary, id).await, 9);

                let wait = Duration::from_millis(20);
                let policy = Policy::WaitOrFail(wait);
                let failed = replica::route(&mut standby, Some(written), policy).await;
                assert_replica_behind(failed, written, wait);
                assert_eq!(
                    replica::route(&mut standby, Some(written), Policy::Primary)
                        .await
                        .unwrap(),
                    Route::PrimaryByPolicy
                );
                (standby, written)
            })
        })
        .collect();
    let mut routed = Vec::new();
    for task in tasks {
        routed.push(task.await.unwrap());
    }

    paused.resume();
    for (id, (mut standby, written)) in (1..).zip(routed) {
        let policy = Policy::WaitOrFail(Duration::from_secs(10));
        let route = replica::route(&mut standby, Some(written), policy)
            .await
            .unwrap();
        assert!(route.is_replica(), "{route:?}");
        assert_eq!(stock_of(&mut standby, id).await, 9);
    }
}

/// On a runtime with ONE thread, several routes wait for a paused replica while
/// another task resumes replay after 300 ms, and a third ticks every
/// millisecond: the waits must leave the thread to the others. A blocking sleep
/// between two looks (up to 20 ms each, four readers) lets the ticker run about
/// 15 times in those 300 ms; tokio's timer lets it run well over 100 times.
#[tokio::test(flavor = "current_thread")]
async fn a_waiting_route_yields_and_is_released_when_replay_resumes() {
    const READERS: usize = 4;
    let db = TestReplicas::new("async_released");
    seed_items(&mut db.primary(), &[(1, 10)]);
    db.wait_for_standby(&mut db.primary());
    let paused = db.pause_replay();
    let mut primary = connect(&db.primary_url).await;
    let written = write(&mut primary, 1, 9).await;
    let mut standbys = Vec::new();
    for _ in 0..READERS {
        standbys.push(connect(&db.standby_url).await);
    }

    let resumed_at = Arc::new(std::sync::Mutex::new(None::<(Instant, Instant)>));
    let resumer = {
        let resumed_at = resumed_at.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let resuming_at = Instant::now();
            paused.resume();
            *resumed_at.lock().unwrap() = Some((resuming_at, Instant::now()));
        })
    };
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let started = Instant::now();
    let readers: Vec<_> = standbys
        .into_iter()
        .map(|mut standby| {
            tokio::spawn(async move {
                let policy = Policy::WaitOrFail(Duration::from_secs(10));
                let began = Instant::now();
                let route = replica::route(&mut standby, Some(written), policy).await;
                let seen = stock_of(&mut standby, 1).await;
                (route, seen, began, Instant::now())
            })
        })
        .collect();
    resumer.await.unwrap();
    let ticked = std::sync::atomic::AtomicU32::load(&ticks, std::sync::atomic::Ordering::Relaxed);
    ticker.abort();
    let (resuming_at, resumed_at) = resumed_at.lock().unwrap().expect("replay resumed");
    for reader in readers {
        let (route, seen, began, done) = reader.await.unwrap();
        let Ok(Route::Replica { waited }) = route else {
            panic!("expected the replica after the resume, got {route:?}");
        };
        assert!(done >= resumed_at, "released before replay resumed");
        // The route's clock starts when it is called, and it can see the
        // replay only after the resume was sent: the wait it reports covers
        // the whole time up to the resume, however late the reader began.
        assert!(
            began + waited >= resuming_at,
            "reported {waited:?}, began {:?} before the resume",
            resuming_at - began
        );
        assert!(
            began + waited <= done,
            "reported {waited:?}, more than the call took"
        );
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        assert_eq!(seen, 9);
    }
    println!(
        "{READERS} routes released {:?} after they began waiting (replay resumed at 300 ms); \
         the 1 ms ticker ran {ticked} times meanwhile",
        started.elapsed()
    );
    assert!(
        ticked >= 50,
        "the waits held the thread: {ticked} ticks in 300 ms"
    );
}

/// A read on the paused replica, then the async `update_versioned` on the
/// primary: refused as stale, never a lost update. The naive read and blind
/// write loses a sale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_from_the_replica_cannot_lose_an_update() {
    let db = TestReplicas::new("async_stale_read");
    seed_items(&mut db.primary(), &[(1, 10)]);
    db.wait_for_standby(&mut db.primary());
    let mut primary = connect(&db.primary_url).await;
    let mut standby = connect(&db.standby_url).await;

    // Naive: two sales, each read on the lagging replica, each a blind write.
    let paused = db.pause_replay();
    for _ in 0..2 {
        let read = item(&mut standby).await;
        assert_eq!(read.stock, 10, "the replica lags");
        diesel::update(items::table.find(1))
            .set(items::stock.eq(read.stock - 1))
            .execute(&mut primary)
            .await
            .unwrap();
    }
    assert_eq!(
        stock_of(&mut primary, 1).await,
        9,
        "two sales, one lost: 9 instead of 8"
    );
    paused.resume();

    // Versioned: the same two sales.
    diesel::update(items::table.find(1))
        .set((items::stock.eq(10), items::lock_version.eq(0)))
        .execute(&mut primary)
        .await
        .unwrap();
    db.wait_for_standby(&mut db.primary());
    let paused = db.pause_replay();
    let mut first = item(&mut standby).await;
    first.stock -= 1;
    first.update_versioned(&mut primary).await.unwrap();
    let written = replica::commit_lsn(&mut primary).await.unwrap();
    let mut second = item(&mut standby).await;
    assert_eq!(
        (second.stock, second.lock_version),
        (10, 0),
        "the replica lags"
    );
    second.stock -= 1;
    let refused = second.update_versioned(&mut primary).await.unwrap_err();
    let stale = refused
        .as_stale()
        .unwrap_or_else(|| panic!("expected Stale, got {refused:?}"));
    assert_eq!(stale.expected_version, 0);
    assert_eq!(stale.current, lockkit::CurrentState::Version(1));
    assert_eq!(stock_of(&mut primary, 1).await, 9, "the first sale stands");

    // Re-read where the first sale is visible, as the route says: the primary
    // while replay is paused, and the second sale lands.
    let policy = Policy::WaitThenPrimary(Duration::from_millis(20));
    let route = replica::route(&mut standby, Some(written), policy)
        .await
        .unwrap();
    assert!(!route.is_replica(), "{route:?}");
    let mut second = item(&mut primary).await;
    second.stock -= 1;
    second.update_versioned(&mut primary).await.unwrap();
    assert_eq!(stock_of(&mut primary, 1).await, 8, "both sales counted");
    paused.resume();
}

/// Positions are taken after the commit only, and a server that is not a
/// standby is never read.
#[tokio::test(flavor = "current_thread")]
async fn positions_are_taken_after_the_commit_and_only_from_a_standby() {
    use diesel_async::TransactionManager;
    type Manager = <AsyncPgConnection as AsyncConnection>::TransactionManager;
    let db = TestReplicas::new("async_positions");
    let mut primary = connect(&db.primary_url).await;
    Manager::begin_transaction(&mut primary).await.unwrap();
    let inside = replica::commit_lsn(&mut primary).await;
    Manager::rollback_transaction(&mut primary).await.unwrap();
    assert!(
        matches!(inside, Err(Error::AlreadyInTransaction)),
        "{inside:?}"
    );

    // Nor is a replica looked at inside a transaction, whose snapshot may
    // predate the replay the look would find.
    let mut standby = connect(&db.standby_url).await;
    Manager::begin_transaction(&mut standby).await.unwrap();
    let policy = Policy::WaitThenPrimary(Duration::from_secs(1));
    let inside = replica::route(&mut standby, Some(Lsn::from(0)), policy).await;
    // Without a position to see, nothing is looked at: no refusal.
    let nothing_to_see = replica::route(&mut standby, None, policy).await;
    Manager::rollback_transaction(&mut standby).await.unwrap();
    assert!(
        matches!(inside, Err(Error::AlreadyInTransaction)),
        "{inside:?}"
    );
    assert!(
        matches!(nothing_to_see, Ok(Route::Replica { .. })),
        "{nothing_to_see:?}"
    );
    // And a standby takes no advisory lock: it would exclude no one on the
    // primary.
    let advisory = lockkit::asynchronous::advisory::try_with_lock(&mut standby, 42, async |_| {
        Ok::<_, Error>(())
    })
    .await;
    assert!(matches!(advisory, Err(Error::ReadOnly)), "{advisory:?}");

    let before = replica::commit_lsn(&mut primary).await.unwrap();
    seed_items(&mut db.primary(), &[(1, 10)]);
    let after = replica::commit_lsn(&mut primary).await.unwrap();
    assert!(after > before, "{after} > {before}");

    assert_eq!(replica::replayed_lsn(&mut primary).await.unwrap(), None);
    let policy = Policy::WaitThenPrimary(Duration::from_secs(1));
    assert_eq!(
        replica::route(&mut primary, Some(after), policy)
            .await
            .unwrap(),
        Route::PrimaryNotAStandby
    );
    db.wait_for_standby(&mut db.primary());
    let mut standby = connect(&db.standby_url).await;
    let replayed = replica::replayed_lsn(&mut standby).await.unwrap().unwrap();
    assert!(replayed >= after, "{replayed} >= {after}");
    assert_eq!(
        replica::route(&mut primary, None, Policy::Primary)
            .await
            .unwrap(),
        Route::Replica {
            waited: Duration::ZERO
        }
    );
}

/// Tasks write through the async `Router` (a transaction on the primary, then
/// the commit's position) and read through it with that position: every read
/// sees its own write, on the replica when it has replayed it.
async fn router_reads_own_writes<P: AsyncPgPool>(router: Router<P>, db: &TestReplicas) {
    const TASKS: i32 = 6;
    const ROUNDS: i32 = 20;
    let seeds: Vec<(i32, i32)> = (1..=TASKS).map(|id| (id, 0)).collect();
    seed_items(&mut db.primary(), &seeds);
    db.wait_for_standby(&mut db.primary());
    let tasks: Vec<_> = (1..=TASKS)
        .map(|id| {
            let router = router.clone();
            tokio::spawn(async move {
                let mut on_replica = 0;
                for round in 1..=ROUNDS {
                    let written = write_through(&router, id, round).await;
                    let mut conn = router.read(Some(written)).await.unwrap();
                    let route = conn.route();
                    assert_eq!(
                        stock_of(&mut conn, id).await,
                        round,
                        "task {id} read {route:?}"
                    );
                    on_replica += u32::from(route.is_replica());
                }
                on_replica
            })
        })
        .collect();
    let mut on_replica = 0;
    for task in tasks {
        on_replica += task.await.unwrap();
    }
    println!(
        "async Router: {} write-then-read by {TASKS} tasks, every read saw its write, \
         {on_replica} on the replica",
        TASKS * ROUNDS
    );
}

/// With replay paused, the async `Router`'s policies route a read that carries
/// a position: `WaitThenPrimary` to the primary (which shows the write),
/// `WaitOrFail` fails with `ReplicaBehind`, `Primary` goes to the primary
/// without a look; a read without a position goes to the lagging replica.
async fn router_policies_while_replay_is_paused<P: AsyncPgPool>(
    primary: P,
    replica: P,
    db: &TestReplicas,
) {
    seed_items(&mut db.primary(), &[(1, 10)]);
    db.wait_for_standby(&mut db.primary());
    let router = |policy| Router::new(primary.clone(), replica.clone(), policy);
    let then_primary = router(Policy::WaitThenPrimary(Duration::from_millis(50)));
    let paused = db.pause_replay();
    let written = write_through(&then_primary, 1, 9).await;

    // Each routed connection goes back to its pool before the next is taken
    // (pools of two).
    {
        let mut conn = then_primary.read(Some(written)).await.unwrap();
        assert!(
            matches!(conn.route(), Route::PrimaryReplicaBehind { replayed, .. } if replayed < written),
            "{:?}",
            conn.route()
        );
        assert_eq!(stock_of(&mut conn, 1).await, 9);
    }
    {
        let mut conn = then_primary.read(None).await.unwrap();
        assert!(conn.route().is_replica());
        assert_eq!(stock_of(&mut conn, 1).await, 10, "the lag is real");
    }
    let err = router(Policy::WaitOrFail(Duration::from_millis(20)))
        .read(Some(written))
        .await
        .err()
        .expect("ReplicaBehind");
    assert!(
        matches!(err, Error::ReplicaBehind { wanted, .. } if wanted == written),
        "{err:?}"
    );
    {
        let mut conn = router(Policy::Primary).read(Some(written)).await.unwrap();
        assert_eq!(conn.route(), Route::PrimaryByPolicy);
        assert_eq!(stock_of(&mut conn, 1).await, 9);
    }
    // A write refused on the primary returns its error and no position.
    let refused = then_primary
        .write(async |_conn| Err::<(), _>(Error::NoRowMatched))
        .await;
    assert!(matches!(refused, Err(Error::NoRowMatched)), "{refused:?}");

    paused.resume();
    let mut conn = router(Policy::WaitOrFail(Duration::from_secs(10)))
        .read(Some(written))
        .await
        .unwrap();
    assert!(conn.route().is_replica(), "{:?}", conn.route());
    assert_eq!(stock_of(&mut conn, 1).await, 9);
}

async fn bb8_pool(
    url: &str,
    size: u32,
) -> diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection> {
    diesel_async::pooled_connection::bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(Duration::from_millis(500))
        .build(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url))
        .await
        .unwrap()
}

/// A `Router` over bb8 pools of `size` connections to `db`'s primary and standby.
async fn bb8_router(
    db: &TestReplicas,
    size: u32,
    policy: Policy,
) -> Router<diesel_async::pooled_connection::bb8::Pool<AsyncPgConnection>> {
    Router::new(
        bb8_pool(&db.primary_url, size).await,
        bb8_pool(&db.standby_url, size).await,
        policy,
    )
}

fn deadpool_pool(
    url: &str,
    size: usize,
) -> diesel_async::pooled_connection::deadpool::Pool<AsyncPgConnection> {
    diesel_async::pooled_connection::deadpool::Pool::builder(AsyncDieselConnectionManager::<
        AsyncPgConnection,
    >::new(url))
    .max_size(size)
    .build()
    .unwrap()
}

/// As `tests/replica.rs` shows on the blocking router: a committed write
/// whose own connection cannot read the position gets one read on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_write_whose_connection_cannot_read_the_position_still_gets_one() {
    use diesel_async::SimpleAsyncConnection;
    let db = TestReplicas::new("async_position_elsewhere");
    db.seed_replicated(&[(1, 10)]);
    let router = bb8_router(&db, 2, Policy::WaitThenPrimary(Duration::from_secs(10))).await;
    let (sold, written) = router
        .write(async |conn| {
            conn.batch_execute(
                "CREATE SCHEMA lockkit_hide; \
                 CREATE FUNCTION lockkit_hide.pg_current_wal_insert_lsn() RETURNS pg_lsn \
                 AS $$ BEGIN RAISE EXCEPTION 'no position on this session'; END $$ LANGUAGE plpgsql; \
                 SET search_path = lockkit_hide, pg_catalog, public",
            )
            .await?;
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)
                .await?;
            Ok::<_, Error>(1)
        })
        .await
        .unwrap();
    assert_eq!(sold, 1);
    let mut read = router.read(Some(written)).await.unwrap();
    assert_eq!(stock_of(&mut read, 1).await, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_router_over_bb8_pools_reads_own_writes() {
    let db = TestReplicas::new("async_router_bb8");
    let router = bb8_router(&db, 4, Policy::WaitThenPrimary(Duration::from_secs(2))).await;
    router_reads_own_writes(router, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_router_over_deadpool_pools_reads_own_writes() {
    let db = TestReplicas::new("async_router_deadpool");
    let router = Router::new(
        deadpool_pool(&db.primary_url, 4),
        deadpool_pool(&db.standby_url, 4),
        Policy::WaitThenPrimary(Duration::from_secs(2)),
    );
    router_reads_own_writes(router, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_over_bb8_pools_applies_its_policy() {
    let db = TestReplicas::new("async_router_bb8_policy");
    let (primary, replica) = (
        bb8_pool(&db.primary_url, 2).await,
        bb8_pool(&db.standby_url, 2).await,
    );
    router_policies_while_replay_is_paused(primary, replica, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_over_deadpool_pools_applies_its_policy() {
    let db = TestReplicas::new("async_router_deadpool_policy");
    let (primary, replica) = (
        deadpool_pool(&db.primary_url, 2),
        deadpool_pool(&db.standby_url, 2),
    );
    router_policies_while_replay_is_paused(primary, replica, &db).await;
}

/// A pool with no connection to give (bb8's wait ran out) is a typed error,
/// never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_is_an_error() {
    let db = TestReplicas::new("async_router_exhausted");
    let router = bb8_router(&db, 1, Policy::Primary).await;
    let held = router.primary().await.unwrap();
    let err = router
        .read(Some(Lsn::from(1)))
        .await
        .err()
        .expect("no connection");
    assert!(matches!(err, Error::AsyncPool(_)), "{err:?}");
    drop(held);
    assert_eq!(
        router.read(Some(Lsn::from(1))).await.unwrap().route(),
        Route::PrimaryByPolicy
    );
}
