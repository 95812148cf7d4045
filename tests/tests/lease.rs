//! Leases with fencing tokens on real servers: the database store on every
//! backend, the Redis store with fenced writes into every backend; a holder
//! paused past its TTL (without fencing its write lands over its successor's,
//! with fencing it is refused), contending holders, owner-only release, renewal,
//! hostile names.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::lease::{self, Fence, FenceStore, LeaseStore};
use lockkit::{AsLockingConnection, Error};
use lockkit_tests::schema::docs;
use lockkit_tests::{exec, lease_migrations, TestRedis};

/// The data the holders write: one row, a body and a counter.
trait Docs: Connection + FenceStore + AsLockingConnection<Conn = Self> {
    fn body(&mut self) -> String;
    fn counter(&mut self) -> i32;
    fn last_fence(&mut self) -> i64;
}

macro_rules! docs {
    ($($conn:ty),*) => {$(
        impl Docs for $conn {
            fn body(&mut self) -> String {
                docs::table.find(1).select(docs::body).first(self).unwrap()
            }
            fn counter(&mut self) -> i32 {
                docs::table.find(1).select(docs::counter).first(self).unwrap()
            }
            fn last_fence(&mut self) -> i64 {
                docs::table.find(1).select(docs::last_fence).first(self).unwrap()
            }
        }
    )*};
}
docs!(
    diesel::PgConnection,
    diesel::MysqlConnection,
    diesel::SqliteConnection
);

/// The lease and fence tables, and `docs` row 1.
fn setup<C: Connection + MigrationHarness<C::Backend>>(conn: &mut C, backend: &str) {
    conn.run_pending_migrations(lease_migrations(backend))
        .unwrap();
    lockkit_tests::create_docs(conn);
}

/// Writes `body` into `docs` row 1: a plain write, or fenced with `fence`.
fn write_body<C: Docs>(
    conn: &mut C,
    fence: Option<Fence>,
    body: &'static str,
) -> Result<(), Error> {
    let sql = format!("UPDATE docs SET body = '{body}' WHERE id = 1"); // test constants only
    match fence {
        None => Ok(conn.batch_execute(&sql)?),
        Some(fence) => lease::fenced(conn, "doc-1", fence, |conn| Ok(conn.batch_execute(&sql)?)),
    }
}

/// Holder A takes the lease and pauses past its TTL; B takes it over and writes;
/// A wakes, still believing it holds the lease, and writes. Returns A's write.
fn paused_holder_writes<S: LeaseStore, C: Docs>(
    a: &mut S,
    b: &mut S,
    data: &mut C,
    fencing: bool,
) -> Result<(), Error> {
    let ttl = Duration::from_millis(150);
    let held_by_a = lease::acquire(a, "doc", ttl).unwrap();
    let fence_a = held_by_a.fence();
    thread::sleep(ttl + Duration::from_millis(100)); // A pauses (GC, swap, a slow call)
    let held_by_b =
        lease::acquire(b, "doc", Duration::from_secs(30)).expect("the lease ran out: B takes it");
    assert!(
        held_by_b.fence() > fence_a,
        "{:?} after {fence_a}",
        held_by_b.fence()
    );
    write_body(data, fencing.then_some(held_by_b.fence()), "written by B").unwrap();
    let written_by_a = write_body(data, fencing.then_some(fence_a), "written by A");
    // A's release is a compare and delete: B's lease stays.
    assert!(matches!(held_by_a.release(), Err(Error::LeaseLost)));
    assert!(matches!(lease::acquire(a, "doc", ttl), Err(Error::Busy)));
    drop(held_by_b);
    written_by_a
}

fn without_fencing<S: LeaseStore, C: Docs>(a: &mut S, b: &mut S, data: &mut C) {
    paused_holder_writes(a, b, data, false).unwrap();
    assert_eq!(
        data.body(),
        "written by A",
        "the naive baseline: A's late write lands over B's"
    );
}

fn with_fencing<S: LeaseStore, C: Docs>(a: &mut S, b: &mut S, data: &mut C) {
    let refused = paused_holder_writes(a, b, data, true).unwrap_err();
    let Error::Fenced {
        resource,
        fence,
        current,
    } = &refused
    else {
        panic!("expected Error::Fenced, got {refused:?}");
    };
    assert_eq!(resource, "doc-1", "{refused}");
    assert!(current > fence, "B's newer fence stands: {refused}");
    assert_eq!(data.body(), "written by B", "B's data stands");
    assert_eq!(lockkit::etag::status_for(&refused), 409);
}

/// Exclusive while held, renewable, released by its owner only, fences growing.
fn lifecycle<S: LeaseStore>(a: &mut S, b: &mut S) {
    let ttl = Duration::from_millis(1000);
    let mut first = lease::acquire(a, "job", ttl).unwrap();
    let fence = first.fence();
    assert!(matches!(lease::acquire(b, "job", ttl), Err(Error::Busy)));
    // Renewed twice, it outlives its first TTL.
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(600));
        first.renew().unwrap();
    }
    assert!(matches!(lease::acquire(b, "job", ttl), Err(Error::Busy)));
    first.release().unwrap();

    let second = lease::acquire(b, "job", ttl).unwrap();
    assert!(
        second.fence() > fence,
        "{:?} after {fence:?}",
        second.fence()
    );
    let fence = second.fence();
    assert!(matches!(lease::acquire(a, "job", ttl), Err(Error::Busy)));
    drop(second); // released by the guard
    let mut third = lease::acquire(a, "job", Duration::from_millis(50)).unwrap();
    assert!(third.fence() > fence, "{:?} after {fence:?}", third.fence());
    // Past its TTL it cannot be renewed, even with nobody else holding it.
    thread::sleep(Duration::from_millis(150));
    assert!(matches!(third.renew(), Err(Error::LeaseLost)));
    drop(third);

    // Names are separate leases, compared exactly.
    let held = lease::acquire(a, "job", ttl).unwrap();
    let fence = held.fence();
    for other in ["Job", "job "] {
        drop(lease::acquire(b, other, ttl).expect("another name is another lease"));
    }
    drop(held);

    // The closure form releases on every path.
    let err = lease::with_lease(a, "job", ttl, |_| Err::<(), _>(Error::NoRowMatched)).unwrap_err();
    assert!(matches!(err, Error::NoRowMatched));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lease::with_lease(a, "job", ttl, |_| -> Result<(), Error> {
            panic!("in the work")
        })
    }));
    assert!(panicked.is_err());
    let last = lease::with_lease(b, "job", ttl, |held| Ok::<_, Error>(held.fence()))
        .expect("released after the error and the panic");
    assert!(last > fence, "{last:?} after {fence:?}");

    let long = "n".repeat(256);
    for (name, ttl) in [
        ("", ttl),
        (long.as_str(), ttl),
        ("a\0b", ttl),
        ("job", Duration::ZERO),
        ("job", Duration::MAX),
    ] {
        assert!(
            matches!(lease::acquire(a, name, ttl), Err(Error::InvalidInput(_))),
            "{name:?} {ttl:?}"
        );
    }
}

/// A holder whose lease ran out and was taken can neither renew nor release
/// it, also when the application seeded the same random generator before each
/// grant (for reproducible jitter), as forked workers share one: the grant's
/// token is not drawn from it.
fn tokens_are_the_grants_own<S: LeaseStore>(a: &mut S, b: &mut S) {
    fastrand::seed(7);
    let mut late = lease::acquire(a, "tokens", Duration::from_millis(50)).unwrap();
    thread::sleep(Duration::from_millis(150));
    fastrand::seed(7);
    let taken = lease::acquire(b, "tokens", Duration::from_secs(30)).unwrap();
    assert_ne!(late.token(), taken.token());
    assert!(matches!(late.renew(), Err(Error::LeaseLost)));
    drop(late);
    assert!(
        matches!(
            lease::acquire(a, "tokens", Duration::from_secs(30)),
            Err(Error::Busy)
        ),
        "the late holder's release freed the lease its successor holds"
    );
    drop(taken);
}

/// One holder's turn in [`contend`]: a fenced read of the counter, a pause (one
/// in four past the TTL), a fenced write of the read plus one and the fence.
/// Counts the writes that find a newer holder's fence in the row.
fn read_pause_write<C: Docs>(
    data: &mut C,
    fence: Fence,
    older_after_newer: &AtomicUsize,
) -> Result<(), Error> {
    let read = lease::fenced(data, "counter", fence, |conn| {
        Ok::<_, Error>(conn.counter())
    })?;
    let pause = if fastrand::u8(0..4) == 0 {
        40..70
    } else {
        0..10
    };
    thread::sleep(Duration::from_millis(fastrand::u64(pause)));
    lease::fenced(data, "counter", fence, |conn| {
        // What the data itself says: the last writer's fence.
        if conn.last_fence() > fence.0 {
            older_after_newer.fetch_add(1, Ordering::SeqCst);
        }
        let sql = format!(
            "UPDATE docs SET counter = {}, last_fence = {} WHERE id = 1",
            read + 1,
            fence.0
        );
        Ok(conn.batch_execute(&sql)?)
    })
}

/// Threads contend for one lease with a short TTL; each holder reads the counter
/// through a fenced read, pauses for a random while (one in four past its
/// TTL, so holders overlap), and writes back its read plus one through a fenced
/// write, with its fence. The counter must end equal to the writes that landed,
/// and no write may find a newer holder's fence in the row it overwrites.
///
/// The threads contend for at least 2.5 s, and on until the run proves
/// something (writes landed, holders overlapped, a late write was refused),
/// for at most a minute: a loaded machine may take longer to get there.
fn contend<S: LeaseStore, C: Docs>(store: impl Fn() -> S + Sync, data: impl Fn() -> C + Sync) {
    const THREADS: usize = 6;
    let ttl = Duration::from_millis(30);
    let started = Instant::now();
    let (at_least, at_most) = (Duration::from_millis(2500), Duration::from_secs(60));
    let landed = AtomicI64::new(0);
    let refused = AtomicUsize::new(0);
    let older_after_newer = AtomicUsize::new(0);
    let believers = AtomicUsize::new(0);
    let most_believers = AtomicUsize::new(0);
    let others = Mutex::new(Vec::new());
    // Whether the run has shown enough: the last three assertions below hold.
    let enough = || {
        landed.load(Ordering::SeqCst) >= 10
            && refused.load(Ordering::SeqCst) > 0
            && most_believers.load(Ordering::SeqCst) >= 2
    };
    let go_on = || {
        let elapsed = started.elapsed();
        elapsed < at_least || (elapsed < at_most && !enough())
    };
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let (mut store, mut data) = (store(), data());
                while go_on() {
                    let held = match lease::acquire(&mut store, "counter", ttl) {
                        Ok(held) => held,
                        Err(Error::Busy) => {
                            thread::sleep(Duration::from_millis(fastrand::u64(1..4)));
                            continue;
                        }
                        Err(err) => panic!("acquire: {err}"),
                    };
                    let now = believers.fetch_add(1, Ordering::SeqCst) + 1;
                    most_believers.fetch_max(now, Ordering::SeqCst);
                    let fence = held.fence();
                    let outcome = read_pause_write(&mut data, fence, &older_after_newer);
                    believers.fetch_sub(1, Ordering::SeqCst);
                    drop(held);
                    match outcome {
                        Ok(()) => drop(landed.fetch_add(1, Ordering::SeqCst)),
                        Err(Error::Fenced { .. }) => drop(refused.fetch_add(1, Ordering::SeqCst)),
                        // SQLite's busy database, InnoDB's deadlocks: rolled back, nothing landed.
                        Err(err) if err.is_retryable() => {
                            others.lock().unwrap().push(err.to_string())
                        }
                        Err(err) => panic!("fenced: {err}"),
                    }
                }
            });
        }
    });
    let landed = landed.into_inner();
    let counter = data().counter();
    let (refused, most) = (refused.into_inner(), most_believers.into_inner());
    eprintln!(
        "landed {landed}, refused {refused}, at most {most} believed they held it, others {:?}",
        others.lock().unwrap()
    );
    assert_eq!(
        i64::from(counter),
        landed,
        "no write of a holder that overran its lease landed over a newer one"
    );
    assert_eq!(
        older_after_newer.into_inner(),
        0,
        "a holder wrote after a newer holder had written"
    );
    assert!(landed >= 10, "landed {landed}");
    assert!(
        most >= 2,
        "holders never overlapped: the test would prove nothing"
    );
    assert!(
        refused > 0,
        "no late write was refused: the test would prove nothing"
    );
}

lockkit_tests::backend_tests! {
    fn db_lease_without_fencing_a_paused_holder_overwrites_its_successor(db) {
        setup(&mut db.connect(), BACKEND);
        without_fencing(&mut db.connect(), &mut db.connect(), &mut db.connect());
    }

    fn db_lease_with_fencing_a_paused_holder_is_refused(db) {
        setup(&mut db.connect(), BACKEND);
        with_fencing(&mut db.connect(), &mut db.connect(), &mut db.connect());
    }

    fn db_lease_is_exclusive_renewable_and_released_by_its_owner_only(db) {
        setup(&mut db.connect(), BACKEND);
        lifecycle(&mut db.connect(), &mut db.connect());
    }

    fn db_lease_tokens_are_the_grants_own(db) {
        setup(&mut db.connect(), BACKEND);
        tokens_are_the_grants_own(&mut db.connect(), &mut db.connect());
    }

    fn db_lease_contending_holders_never_both_write(db) {
        setup(&mut db.connect(), BACKEND);
        contend(|| db.connect(), || db.connect());
    }

    fn redis_lease_without_fencing_a_paused_holder_overwrites_its_successor(db) {
        setup(&mut db.connect(), BACKEND);
        let redis = TestRedis::new(&format!("{BACKEND}_baseline"));
        without_fencing(&mut redis.store(), &mut redis.store(), &mut db.connect());
    }

    fn redis_lease_with_fencing_a_paused_holder_is_refused(db) {
        setup(&mut db.connect(), BACKEND);
        let redis = TestRedis::new(&format!("{BACKEND}_fenced"));
        with_fencing(&mut redis.store(), &mut redis.store(), &mut db.connect());
    }

    fn redis_lease_contending_holders_never_both_write(db) {
        setup(&mut db.connect(), BACKEND);
        let redis = TestRedis::new(&format!("{BACKEND}_contend"));
        contend(|| redis.store(), || db.connect());
    }

    fn redis_lease_tokens_are_the_grants_own(db) {
        let redis = TestRedis::new(&format!("{BACKEND}_tokens"));
        tokens_are_the_grants_own(&mut redis.store(), &mut redis.store());
    }

    fn redis_restart_without_persistence_never_hands_a_fence_out_again(db) {
        use lockkit::lease::redis::client::Commands;
        let mut data = db.connect();
        setup(&mut data, BACKEND);
        let redis = TestRedis::new(&format!("{BACKEND}_restart"));
        let (mut store, mut other) = (redis.store(), redis.store());
        let keys = [store.lease_key("doc"), store.fence_key("doc")];
        let first = lease::acquire(&mut store, "doc", Duration::from_secs(30)).unwrap().fence();
        for _ in 0..2 {
            let held = lease::acquire(&mut store, "doc", Duration::from_secs(30)).unwrap();
            write_body(&mut data, Some(held.fence()), "before the restart").unwrap();
        }
        // A holder from before the restart, still working.
        let old = lease::acquire(&mut other, "doc", Duration::from_secs(30)).unwrap();
        write_body(&mut data, Some(old.fence()), "by the old holder").unwrap();
        // A restart of a Redis that keeps nothing: both keys are gone, and the
        // next grant goes to a new holder.
        let mut conn = client(&redis);
        let _: i64 = conn.del(&keys).unwrap();
        let new = lease::acquire(&mut store, "doc", Duration::from_secs(30)).unwrap();
        assert!(new.fence() > old.fence(), "{:?} after {:?}", new.fence(), old.fence());
        write_body(&mut data, Some(new.fence()), "by the new holder").unwrap();
        // The old holder writes again: refused, the new holder's data stands.
        let late = write_body(&mut data, Some(old.fence()), "by the old holder, late");
        assert!(matches!(late, Err(Error::Fenced { .. })), "{late:?}");
        assert_eq!(data.body(), "by the new holder");
        let (old_fence, new_fence) = (old.fence(), new.fence());
        drop(new);
        drop(old);

        // A Redis restored from an older snapshot (or a replica promoted
        // before the last grants reached it): the counter is back at the
        // first fence. The next grant is still past every fence issued.
        let _: () = conn.set(&keys[1], first.0).unwrap();
        let restored = lease::acquire(&mut other, "doc", Duration::from_secs(30)).unwrap();
        assert!(restored.fence() > new_fence, "{:?} after {new_fence:?}", restored.fence());
        write_body(&mut data, Some(restored.fence()), "after the restore").unwrap();
        assert!(matches!(write_body(&mut data, Some(old_fence), "late"), Err(Error::Fenced { .. })));
        assert_eq!(data.body(), "after the restore");
    }

    fn db_lease_fence_at_its_maximum_is_never_handed_out_again(db) {
        // An operator raised the fence (after a restore) to just below the
        // maximum: the next grant gets the maximum, and the one after must
        // fail, not hand the maximum out again (SQLite would turn the sum into
        // a float, read back as the maximum).
        setup(&mut db.connect(), BACKEND);
        let mut conn = db.connect();
        let first = lease::acquire(&mut conn, "job", Duration::from_secs(5)).unwrap();
        first.release().unwrap();
        exec(&mut conn, "UPDATE lockkit_leases SET fence = 9223372036854775806 WHERE name = 'job'");
        let at_max = lease::acquire(&mut conn, "job", Duration::from_secs(5)).unwrap();
        assert_eq!(at_max.fence(), Fence(i64::MAX));
        at_max.release().unwrap();
        let again = lease::acquire(&mut conn, "job", Duration::from_secs(5));
        assert!(again.is_err(), "{:?}", again.as_ref().map(|lease| lease.fence()));
    }

    fn db_lease_is_refused_inside_a_transaction(db) {
        setup(&mut db.connect(), BACKEND);
        let mut conn = db.connect();
        let inside = conn.transaction(|conn| match lease::acquire(conn, "job", Duration::from_secs(1)) {
            Err(err) => Err(err),
            Ok(_) => Ok(()),
        });
        assert!(matches!(inside, Err(Error::AlreadyInTransaction)), "{inside:?}");
        let mut held = lease::acquire(&mut conn, "job", Duration::from_secs(5)).unwrap();
        assert_eq!(held.fence(), Fence(1), "nothing was granted inside");
        // The guard derefs to the connection: a transaction opened on it.
        use diesel::connection::{AnsiTransactionManager, TransactionManager};
        AnsiTransactionManager::begin_transaction(&mut *held).unwrap();
        assert!(matches!(held.renew(), Err(Error::AlreadyInTransaction)));
        AnsiTransactionManager::rollback_transaction(&mut *held).unwrap();
        held.renew().unwrap();
    }

    fn fenced_writes_roll_back_with_their_work_and_take_hostile_names(db) {
        let mut conn = db.connect();
        setup(&mut conn, BACKEND);
        let hostile = "'; DROP TABLE lockkit_fences; --";
        // Work that fails records no fence.
        let failed = lease::fenced(&mut conn, hostile, Fence(9), |conn| {
            conn.batch_execute("UPDATE docs SET counter = 99 WHERE id = 1")?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(failed, Err(Error::NoRowMatched)));
        assert_eq!(conn.counter(), 0);
        lease::fenced(&mut conn, hostile, Fence(3), |_| Ok::<_, Error>(())).unwrap();
        // The same holder writes again under its fence; a newer one raises it.
        lease::fenced(&mut conn, hostile, Fence(3), |_| Ok::<_, Error>(())).unwrap();
        let refused = lease::fenced(&mut conn, hostile, Fence(2), |_| -> Result<(), Error> { panic!("must not run") });
        assert!(matches!(refused, Err(Error::Fenced { fence: 2, current: 3, .. })), "{refused:?}");
        // Another resource has fences of its own; a pooled connection works too.
        lease::fenced(&mut db.conn(), "other", Fence(1), |_| Ok::<_, Error>(())).unwrap();
        let held = lease::acquire(&mut conn, hostile, Duration::from_secs(5)).unwrap();
        assert_eq!(held.fence(), Fence(1));
        drop(held);
        assert!(matches!(lease::fenced(&mut conn, "", Fence(1), |_| Ok::<_, Error>(())), Err(Error::InvalidInput(_))));
        exec(&mut conn, "SELECT COUNT(*) FROM lockkit_fences");
    }
}

/// A plain Redis connection to the test's server.
fn client(redis: &TestRedis) -> lockkit::lease::redis::client::Connection {
    let client = lockkit::lease::redis::client::Client::open(redis.url.as_str()).unwrap();
    client.get_connection().unwrap()
}

#[test]
fn redis_lease_is_exclusive_renewable_and_released_by_its_owner_only() {
    let redis = TestRedis::new("redis_lifecycle");
    lifecycle(&mut redis.store(), &mut redis.store());
}

#[test]
fn redis_keys_are_the_documented_ones_and_the_fence_outlives_the_lease() {
    use lockkit::lease::redis::client::Commands;
    let redis = TestRedis::new("redis_keys");
    let mut store = redis.store();
    let held = lease::acquire(&mut store, "report", Duration::from_secs(10)).unwrap();
    let token = held.token().to_owned();
    let held_fence = held.fence();
    drop(held);
    let lease_key = format!("{}lease:report", redis.prefix);
    let fence_key = format!("{}fence:report", redis.prefix);
    assert_eq!(
        (store.lease_key("report"), store.fence_key("report")),
        (lease_key.clone(), fence_key.clone())
    );
    let mut conn = client(&redis);
    let held_now: Option<String> = conn.get(&lease_key).unwrap();
    assert_eq!(held_now, None, "released: the lease key is gone");
    let fence: i64 = conn.get(&fence_key).unwrap();
    assert_eq!(Fence(fence), held_fence, "the fence counter stays");
    assert_eq!(token.len(), 32);

    // raise_fence puts the counter ahead of the server's clock (fences a
    // store with a slower clock issued): the next grant follows it.
    let _: i64 = conn.del(&fence_key).unwrap();
    let ahead = Fence(held_fence.0 + 3_600_000_000); // an hour of microseconds
    assert_eq!(store.raise_fence("report", ahead).unwrap(), ahead);
    assert_eq!(
        store.raise_fence("report", Fence(7)).unwrap(),
        ahead,
        "never lowered"
    );
    for beyond in [Fence(-1), Fence(1 << 53), Fence(i64::MAX)] {
        assert!(
            matches!(
                store.raise_fence("report", beyond),
                Err(Error::InvalidInput(_))
            ),
            "{beyond:?}"
        );
    }
    let held = lease::acquire(&mut store, "report", Duration::from_secs(10)).unwrap();
    assert_eq!(held.fence(), Fence(ahead.0 + 1));
    let ttl: i64 = conn.pttl(&lease_key).unwrap();
    assert!((1..=10_000).contains(&ttl), "PX ttl {ttl}");
    drop(held);

    // Lua counts in doubles: at 2^53 the counter grants no more, and takes no
    // lease, rather than issue one fence twice.
    let last = Fence((1 << 53) - 1);
    assert_eq!(store.raise_fence("report", last).unwrap(), last);
    for _ in 0..2 {
        let exhausted = lease::acquire(&mut store, "report", Duration::from_secs(10));
        assert!(matches!(exhausted, Err(Error::Redis(_))), "{exhausted:?}");
    }
    let held_now: Option<String> = conn.get(&lease_key).unwrap();
    assert_eq!(held_now, None, "no lease without a fence");
}

#[test]
fn docs_sql_md_lists_the_redis_scripts_lockkit_sends() {
    use lockkit::lease::redis::{ACQUIRE_LUA, RAISE_FENCE_LUA, RELEASE_LUA, RENEW_LUA};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SQL.md");
    let docs = std::fs::read_to_string(path).unwrap();
    let redis = docs
        .split("## redis")
        .nth(1)
        .expect("docs/SQL.md has a redis section");
    for script in [ACQUIRE_LUA, RENEW_LUA, RELEASE_LUA, RAISE_FENCE_LUA] {
        assert!(redis.contains(script), "docs/SQL.md lacks:\n{script}");
    }
}

/// Fences racing on a resource nobody fenced before.
mod first_fence {
    use std::sync::Barrier;
    use std::thread;
    use std::time::Duration;

    use diesel::prelude::*;
    use diesel_migrations::MigrationHarness;
    use lockkit::lease::{self, Fence};
    use lockkit::Error;
    use lockkit_tests::schema::items;
    use lockkit_tests::{lease_migrations, seed_items, stock_of};

    lockkit_tests::backend_tests! {
        fn an_older_fence_racing_a_newer_one_on_a_new_resource_never_writes_after_it(db) {
            // Holders 7 and 8 write a resource nobody fenced before, at once:
            // 8 first (it holds the fence's row until it commits), then 7, which
            // must be refused (on MySQL/MariaDB the row is created, then raised).
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let barrier = Barrier::new(2);
            let db = &db;
            let (newer, older) = thread::scope(|s| {
                let newer = s.spawn(|| {
                    lease::fenced(&mut db.connect(), "report", Fence(8), |c| {
                        barrier.wait();
                        thread::sleep(Duration::from_millis(300));
                        diesel::update(items::table.find(1)).set(items::stock.eq(8)).execute(c)?;
                        Ok::<_, Error>(())
                    })
                });
                let older = s.spawn(|| {
                    barrier.wait();
                    lease::fenced(&mut db.connect(), "report", Fence(7), |c| {
                        diesel::update(items::table.find(1)).set(items::stock.eq(7)).execute(c)?;
                        Ok::<_, Error>(())
                    })
                });
                (newer.join().unwrap(), older.join().unwrap())
            });
            newer.unwrap();
            assert!(matches!(older, Err(Error::Fenced { fence: 7, current: 8, .. })), "{older:?}");
            assert_eq!(stock_of!(&mut db.conn()), 8, "the newer holder's write stands");
        }
    }
}

/// A fenced write inside the caller's transaction, which read before it (on
/// MySQL/MariaDB that read fixes the transaction's REPEATABLE READ snapshot):
/// a newer holder fenced the resource after that read. The older write is
/// refused, and the refusal is `Error::Fenced` naming the newer fence, as
/// `fenced` documents.
mod nested_in_a_transaction_that_read {
    use diesel::prelude::*;
    use diesel_migrations::MigrationHarness;
    use lockkit::lease::{self, Fence};
    use lockkit::Error;
    use lockkit_tests::schema::items;
    use lockkit_tests::{lease_migrations, seed_items, stock_of};

    lockkit_tests::server_tests! {
        fn an_older_fence_is_refused_as_fenced_with_the_newer_one(db) {
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let older = conn
                .transaction(|c| {
                    let read = stock_of!(c); // the caller's own read
                    assert_eq!(read, 10);
                    // Meanwhile the newer holder writes the resource.
                    lease::fenced(&mut db.connect(), "report", Fence(8), |n| {
                        diesel::update(items::table.find(1)).set(items::stock.eq(8)).execute(n)?;
                        Ok::<_, Error>(())
                    })
                    .unwrap();
                    Ok::<_, Error>(lease::fenced(c, "report", Fence(7), |c| {
                        diesel::update(items::table.find(1)).set(items::stock.eq(7)).execute(c)?;
                        Ok::<_, Error>(())
                    }))
                })
                .unwrap();
            assert_eq!(stock_of!(&mut db.conn()), 8, "the newer holder's write stands");
            assert!(matches!(older, Err(Error::Fenced { fence: 7, current: 8, .. })), "{older:?}");
        }

        fn an_older_fence_is_refused_with_the_newer_one_when_the_caller_saw_an_older_one(db) {
            // The resource had fence 5 when the caller read; 8 since.
            db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            lease::fenced(&mut db.connect(), "report", Fence(5), |_| Ok::<_, Error>(())).unwrap();
            let mut conn = db.connect();
            let older = conn
                .transaction(|c| {
                    let _ = stock_of!(c);
                    lease::fenced(&mut db.connect(), "report", Fence(8), |_| Ok::<_, Error>(())).unwrap();
                    Ok::<_, Error>(lease::fenced(c, "report", Fence(7), |_| Ok::<_, Error>(())))
                })
                .unwrap();
            assert!(matches!(older, Err(Error::Fenced { fence: 7, current: 8, .. })), "{older:?}");
        }
    }
}
