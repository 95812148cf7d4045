//! Idempotency keys on real servers: concurrent duplicates, failures, reuse,
//! crashes between start and finish, expiry, hostile keys, keys of several
//! principals.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::idempotency::{fingerprint, Idempotency, Outcome};
use lockkit::Error;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, idempotency_migrations, seed_items, stock_of};

#[cfg(feature = "mysql")]
mod mysql_deadlock;

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Where every test here starts: lockkit's idempotency table, and item 1 with a
/// stock of 100. A connection of `$db`'s pool, for the tests that use one.
macro_rules! prepare {
    ($db:expr) => {{
        let mut conn = $db.conn();
        conn.run_pending_migrations(idempotency_migrations(BACKEND))
            .unwrap();
        seed_items(&mut conn, &[(1, 100)]);
        conn
    }};
}

/// When the request that owns key `$key` took it, as `$conn` reads it.
macro_rules! started_at_of {
    ($conn:expr, $key:expr) => {
        lockkit_idempotency_keys::table
            .filter(lockkit_idempotency_keys::idempotency_key.eq($key))
            .select(lockkit_idempotency_keys::started_at)
            .first::<i64>($conn)
            .unwrap()
    };
}

/// The work of a request: sell one unit, in the idempotency transaction.
fn sell_one<C: Connection>(conn: &mut C) -> Result<String, Error> {
    conn.batch_execute("UPDATE items SET stock = stock - 1 WHERE id = 1")?;
    Ok("201 sold".to_owned())
}

lockkit_tests::backend_tests! {
    fn a_repeat_that_may_wait_replays_the_running_request(db) {
        prepare!(db);
        let first_holds_the_key = Barrier::new(4);
        let patient = Idempotency { wait_while_running: Duration::from_secs(10), ..Idempotency::default() };
        let brief = Idempotency { wait_while_running: Duration::from_millis(50), ..Idempotency::default() };
        let impatient = Idempotency::default();
        let repeat = |keys: &Idempotency| {
            let mut conn = db.conn();
            first_holds_the_key.wait();
            keys.run(&mut conn, "tenant-1", "order-9", "POST /orders qty=1", |_| -> Result<String, Error> {
                panic!("a repeat must not run the work while the first request holds the key")
            })
        };
        // The first request holds the key until the two repeats that do not
        // wait it out have returned (or died: a repeat that ran the work
        // panics), however late their threads run; 30 s at most.
        let (returned, repeats_returned) = std::sync::mpsc::channel::<()>();
        let (first, waited, gave_up, refused) = thread::scope(|s| {
            let (db, first_holds_the_key) = (&db, &first_holds_the_key);
            let first = s.spawn(move || {
                let mut conn = db.conn();
                Idempotency::default().run(&mut conn, "tenant-1", "order-9", "POST /orders qty=1", |conn| {
                    first_holds_the_key.wait();
                    for _ in 0..2 {
                        let _ = repeats_returned.recv_timeout(Duration::from_secs(30));
                    }
                    sell_one(conn)
                })
            });
            let waited = s.spawn(|| repeat(&patient));
            let (to_first, repeat) = (returned.clone(), &repeat);
            let gave_up = s.spawn(move || {
                let outcome = repeat(&brief);
                let _ = to_first.send(());
                outcome
            });
            let refused = s.spawn(move || {
                let outcome = repeat(&impatient);
                let _ = returned.send(());
                outcome
            });
            (first.join().unwrap(), waited.join().unwrap(), gave_up.join().unwrap(), refused.join().unwrap())
        });
        assert_eq!(first.unwrap(), Outcome::Ran("201 sold".to_owned()));
        assert_eq!(waited.unwrap(), Outcome::Replayed("201 sold".to_owned()), "the patient repeat waited and replayed");
        assert!(matches!(gave_up, Err(Error::IdempotencyInProgress)), "a 50 ms wait runs out: {gave_up:?}");
        assert!(matches!(refused, Err(Error::IdempotencyInProgress)), "no wait: refused at once: {refused:?}");
        assert_eq!(stock_of!(&mut db.conn()), 99, "the work ran exactly once");
    }

    fn a_waiting_repeat_runs_the_work_when_the_first_request_fails(db) {
        prepare!(db);
        let first_holds_the_key = Barrier::new(2);
        let patient = Idempotency { wait_while_running: Duration::from_secs(10), ..Idempotency::default() };
        let (first, waited) = thread::scope(|s| {
            let first = s.spawn(|| {
                let mut conn = db.conn();
                Idempotency::default().run(&mut conn, "tenant-1", "order-10", "fp", |conn| {
                    first_holds_the_key.wait();
                    thread::sleep(Duration::from_millis(200));
                    sell_one(conn)?;
                    Err::<String, _>(Error::NoRowMatched) // fails after writing: rolled back
                })
            });
            let waited = s.spawn(|| {
                let mut conn = db.conn();
                first_holds_the_key.wait();
                patient.run(&mut conn, "tenant-1", "order-10", "fp", sell_one)
            });
            (first.join().unwrap(), waited.join().unwrap())
        });
        assert!(matches!(first, Err(Error::NoRowMatched)), "{first:?}");
        assert_eq!(waited.unwrap(), Outcome::Ran("201 sold".to_owned()));
        assert_eq!(stock_of!(&mut db.conn()), 99, "the failed run wrote nothing, the repeat's run once");
    }

    fn concurrent_duplicates_run_the_work_once(db) {
        prepare!(db);
        const CLIENTS: usize = 8;
        let barrier = Barrier::new(CLIENTS);
        let keys = Idempotency::default();
        let outcomes: Vec<Result<Outcome<String>, Error>> = thread::scope(|s| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|_| s.spawn(|| {
                    let mut conn = db.conn();
                    barrier.wait();
                    keys.run(&mut conn, "tenant-1", "order-1", "POST /orders qty=1", |conn| {
                        thread::sleep(Duration::from_millis(200)); // the others arrive meanwhile
                        sell_one(conn)
                    })
                }))
                .collect();
            clients.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let ran = outcomes.iter().filter(|o| matches!(o, Ok(Outcome::Ran(_)))).count();
        let others_ok = outcomes.iter().all(|o| {
            matches!(o, Ok(Outcome::Ran(_)) | Ok(Outcome::Replayed(_)) | Err(Error::IdempotencyInProgress))
        });
        assert_eq!(ran, 1, "{outcomes:?}");
        assert!(others_ok, "{outcomes:?}");
        let stock = stock_of!(&mut db.conn());
        assert_eq!(stock, 99, "the work ran exactly once");
        let again = keys.run(&mut db.conn(), "tenant-1", "order-1", "POST /orders qty=1", |_| -> Result<String, Error> { panic!("must not run") });
        assert_eq!(again.unwrap(), Outcome::Replayed("201 sold".to_owned()));
        assert_eq!(lockkit::etag::status_for(&Error::IdempotencyInProgress), 409);
    }

    fn a_failed_run_releases_the_key(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let err = keys
            .run(&mut conn, "tenant-1", "k", "fp", |conn| {
                sell_one(conn)?;
                Err::<String, _>(Error::NoRowMatched)
            })
            .unwrap_err();
        assert!(matches!(err, Error::NoRowMatched));
        assert_eq!(stock_of!(&mut conn), 100, "rolled back");
        let retried = keys.run(&mut conn, "tenant-1", "k", "fp", sell_one).unwrap();
        assert_eq!(retried, Outcome::Ran("201 sold".to_owned()));
        assert_eq!(stock_of!(&mut conn), 99);
    }

    fn a_key_reused_for_another_request_is_refused(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        keys.run(&mut conn, "tenant-1", "k", "POST /orders qty=1", sell_one).unwrap();
        let err = keys.run(&mut conn, "tenant-1", "k", "POST /orders qty=5", sell_one).unwrap_err();
        assert!(matches!(err, Error::IdempotencyKeyReused));
        assert_eq!(lockkit::etag::status_for(&err), 422);
        assert_eq!(stock_of!(&mut conn), 99);
    }

    fn a_crash_between_start_and_finish_is_recovered_after_the_lease(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        // A process inserted its key and died: its row says "running" forever.
        exec(&mut conn, &format!(
            "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, started_at) \
             VALUES ('tenant-1', 'fresh', 'fp', 'running', {}), ('tenant-1', 'dead', 'fp', 'running', {})",
            now_millis(),
            now_millis() - 120_000
        ));
        assert!(matches!(keys.run(&mut conn, "tenant-1", "fresh", "fp", sell_one), Err(Error::IdempotencyInProgress)));
        assert_eq!(keys.run(&mut conn, "tenant-1", "dead", "fp", sell_one).unwrap(), Outcome::Ran("201 sold".to_owned()));
        assert_eq!(stock_of!(&mut conn), 99);
    }

    fn an_owner_that_overruns_its_lease_is_rolled_back(db) {
        prepare!(db);
        let keys = Idempotency { lease: Duration::from_millis(100), ..Idempotency::default() };
        // The slow owner has its key when the fast one starts, past the
        // lease, and goes on until the fast one has taken the key over,
        // however late either thread runs.
        let (claimed, has_claimed) = std::sync::mpsc::channel();
        let (starts, fast_starts) = std::sync::mpsc::channel::<()>();
        let (slow, fast) = thread::scope(|s| {
            let (keys, db) = (&keys, &db);
            let slow = s.spawn(move || {
                keys.run(&mut db.conn(), "tenant-1", "k", "fp", |conn| {
                    let out = sell_one(conn);
                    let claimed_at = started_at_of!(&mut db.conn(), "k");
                    claimed.send(()).unwrap();
                    fast_starts.recv().unwrap();
                    if BACKEND == "sqlite" {
                        // The take-over waits for this transaction: it
                        // needs the database's write lock.
                        thread::sleep(Duration::from_millis(300));
                    } else {
                        lockkit_tests::lock_waits::look_until(
                            Duration::from_secs(30),
                            "the fast request never took the key over",
                            || (started_at_of!(&mut db.conn(), "k") != claimed_at).then_some(()),
                        );
                    }
                    out
                })
            });
            has_claimed.recv().unwrap();
            thread::sleep(Duration::from_millis(300));
            starts.send(()).unwrap();
            let fast = keys.run(&mut db.conn(), "tenant-1", "k", "fp", sell_one);
            (slow.join().unwrap(), fast)
        });
        if BACKEND == "sqlite" {
            // SQLite serializes writers: the takeover waits for the slow owner's
            // commit, then finds the key done.
            assert_eq!(slow.unwrap(), Outcome::Ran("201 sold".to_owned()));
            assert_eq!(fast.unwrap(), Outcome::Replayed("201 sold".to_owned()));
        } else {
            assert_eq!(fast.unwrap(), Outcome::Ran("201 sold".to_owned()), "took the expired lease over");
            assert!(matches!(slow, Err(Error::IdempotencyInProgress)), "{slow:?}");
        }
        assert_eq!(stock_of!(&mut db.conn()), 99, "sold once");
    }

    fn completed_keys_expire_after_the_retention(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let old = now_millis() - 25 * 3600 * 1000;
        exec(&mut conn, &format!(
            "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, response, started_at, finished_at) \
             VALUES ('tenant-1', 'old', 'fp', 'done', 'stored', {old}, {old}), ('tenant-1', 'older', 'fp', 'done', 'stored', {old}, {old})"
        ));
        assert_eq!(keys.run(&mut conn, "tenant-1", "old", "fp", sell_one).unwrap(), Outcome::Ran("201 sold".to_owned()));
        assert_eq!(keys.purge_expired(&mut conn).unwrap(), 1, "`older` is purged, `old` ran again and is fresh");
        assert_eq!(keys.run(&mut conn, "tenant-1", "old", "fp", sell_one).unwrap(), Outcome::Replayed("201 sold".to_owned()));
    }

    fn running_keys_abandoned_past_the_retention_are_purged(db) {
        // A run whose process died holds its key as running for ever: every
        // request with another fingerprint is refused (422), and the table
        // grows. Past the retention (and the lease) the purge takes it.
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let old = now_millis() - 25 * 3600 * 1000;
        let lately = now_millis() - 2 * 60 * 1000;
        exec(&mut conn, &format!(
            "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, started_at) \
             VALUES ('tenant-1', 'crashed', 'fp', 'running', {old}), ('tenant-1', 'crashed-lately', 'fp', 'running', {lately})"
        ));
        assert_eq!(keys.purge_expired(&mut conn).unwrap(), 1, "only the run abandoned past the retention");
        assert_eq!(keys.run(&mut conn, "tenant-1", "crashed", "another fp", sell_one).unwrap(), Outcome::Ran("201 sold".to_owned()));
        let lately = keys.run(&mut conn, "tenant-1", "crashed-lately", "another fp", sell_one);
        assert!(matches!(lately, Err(Error::IdempotencyKeyReused)), "{lately:?}");
    }

    fn a_key_the_purge_would_take_is_free_for_another_request_before_it_runs(db) {
        // Whether a request with another body may use a key that expired
        // must not depend on when the purge last ran: what it would delete is
        // gone for every request already.
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let old = now_millis() - 25 * 3600 * 1000;
        exec(&mut conn, &format!(
            "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, response, started_at, finished_at) \
             VALUES ('tenant-1', 'done-long-ago', 'fp', 'done', 'stored', {old}, {old}), ('tenant-1', 'crashed', 'fp', 'running', NULL, {old}, NULL)"
        ));
        for key in ["done-long-ago", "crashed"] {
            let ran = keys.run(&mut conn, "tenant-1", key, "another fp", sell_one);
            assert_eq!(ran.unwrap(), Outcome::Ran("201 sold".to_owned()), "{key}");
            let again = keys.run(&mut conn, "tenant-1", key, "another fp", sell_one);
            assert_eq!(again.unwrap(), Outcome::Replayed("201 sold".to_owned()), "{key}");
        }
        assert_eq!(keys.purge_expired(&mut conn).unwrap(), 0, "both keys ran again and are fresh");
        assert_eq!(stock_of!(&mut db.conn()), 98, "sold once per key");
    }

    fn a_key_belongs_to_its_principal(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", br#"{"item":1,"qty":1}"#);
        let sell = |conn: &mut _, who: &str| {
            sell_one(conn)?;
            Ok::<_, Error>(format!("201 order for {who}"))
        };
        let a = keys.run(&mut conn, "client-a", "order-1", &request, |conn| sell(conn, "a")).unwrap();
        assert_eq!(a, Outcome::Ran("201 order for a".to_owned()));
        // Client B sends A's key with the same request: B's own key, B's own order,
        // never A's stored response.
        let b = keys.run(&mut conn, "client-b", "order-1", &request, |conn| sell(conn, "b")).unwrap();
        assert_eq!(b, Outcome::Ran("201 order for b".to_owned()));
        assert_eq!(stock_of!(&mut conn), 98, "both orders ran");
        // Each replays its own.
        for (who, response) in [("client-a", "201 order for a"), ("client-b", "201 order for b")] {
            let again = keys.run(&mut conn, who, "order-1", &request, |_| -> Result<String, Error> { panic!("ran twice") });
            assert_eq!(again.unwrap(), Outcome::Replayed(response.to_owned()));
        }
        // Principals are compared exactly too.
        let c = keys.run(&mut conn, "CLIENT-A", "order-1", &request, |conn| sell(conn, "c")).unwrap();
        assert_eq!(c, Outcome::Ran("201 order for c".to_owned()));
        for bad in ["", "\0"] {
            let refused = keys.run(&mut conn, bad, "order-1", &request, sell_one);
            assert!(matches!(refused, Err(Error::InvalidInput(_))), "{bad:?}: {refused:?}");
        }
        assert_eq!(stock_of!(&mut conn), 97);
    }

    fn concurrent_clients_sharing_a_key_each_run_once(db) {
        prepare!(db);
        const CLIENTS: usize = 3;
        const REPEATS: usize = 3;
        let barrier = Barrier::new(CLIENTS * REPEATS);
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", b"qty=1");
        let outcomes: Vec<(usize, Result<Outcome<String>, Error>)> = thread::scope(|s| {
            let threads: Vec<_> = (0..CLIENTS * REPEATS)
                .map(|n| {
                    let (barrier, keys, request, db) = (&barrier, &keys, &request, &db);
                    let client = n % CLIENTS;
                    s.spawn(move || {
                        let mut conn = db.conn();
                        barrier.wait();
                        let ran = keys.run(&mut conn, &format!("client-{client}"), "order-1", request, |conn| {
                            thread::sleep(Duration::from_millis(100));
                            sell_one(conn)?;
                            Ok::<_, Error>(format!("201 for client-{client}"))
                        });
                        (client, ran)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        lockkit_tests::audit_clients_sharing_a_key(CLIENTS, &outcomes);
        assert_eq!(stock_of!(&mut db.conn()), 100 - CLIENTS as i32, "once per client");
    }

    fn the_same_key_and_body_on_another_endpoint_is_refused(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let body = br#"{"item":1,"qty":1}"#;
        keys.run(&mut conn, "tenant-1", "k", &fingerprint("POST", "/orders", body), sell_one).unwrap();
        for (method, path) in [("POST", "/refunds"), ("PUT", "/orders"), ("POST", "/orders?dry-run")] {
            let err = keys.run(&mut conn, "tenant-1", "k", &fingerprint(method, path, body), sell_one).unwrap_err();
            assert!(matches!(err, Error::IdempotencyKeyReused), "{method} {path}: {err}");
        }
        let err = keys.run(&mut conn, "tenant-1", "k", &fingerprint("POST", "/orders", br#"{"item":1,"qty":2}"#), sell_one).unwrap_err();
        assert!(matches!(err, Error::IdempotencyKeyReused), "another body: {err}");
        assert_eq!(stock_of!(&mut conn), 99, "only the first ran");
    }

    fn keys_are_data_not_sql(db) {
        let mut conn = prepare!(db);
        let keys = Idempotency::default();
        let hostile = "'); DROP TABLE items; -- \" ` \\ é";
        assert_eq!(keys.run(&mut conn, hostile, hostile, hostile, sell_one).unwrap(), Outcome::Ran("201 sold".to_owned()));
        assert_eq!(keys.run(&mut conn, hostile, hostile, hostile, sell_one).unwrap(), Outcome::Replayed("201 sold".to_owned()));
        assert_eq!(items::table.count().get_result::<i64>(&mut conn).unwrap(), 1);
        for bad in ["".to_owned(), "k".repeat(256), "nul\u{0}byte".to_owned()] {
            assert!(matches!(keys.run(&mut conn, "tenant-1", &bad, "fp", sell_one), Err(Error::InvalidInput(_))));
        }
    }
}

/// A new connection of `db` holding item 1 locked in a transaction it keeps
/// open, for work to meet the held row.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn holding_item_1<C: lockkit_tests::db::TestBackend>(db: &lockkit_tests::TestDb<C>) -> C {
    let mut holder = db.connect();
    exec(&mut holder, "BEGIN");
    exec(&mut holder, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
    holder
}

/// PostgreSQL: work that meets a failed statement (a `NOWAIT` on a held row),
/// which aborts the transaction, and returns an error of its own gets that
/// error back untouched, as `run` promises, not the statement's.
#[cfg(feature = "postgres")]
#[test]
fn work_that_returns_its_own_error_after_a_failed_statement_gets_it_back_on_postgres() {
    use diesel::PgConnection;
    use lockkit_tests::TestDb;
    let db = TestDb::<PgConnection>::new("idempotency_own_error_after_nowait");
    db.conn()
        .run_pending_migrations(idempotency_migrations("postgres"))
        .unwrap();
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut holder = holding_item_1(&db);
    let keys = Idempotency::default();
    let mut conn = db.connect();
    let ran = keys.run(
        &mut conn,
        "tenant-1",
        "order-1",
        "f",
        |c| -> Result<String, Error> {
            let busy =
                diesel::sql_query("SELECT id FROM items WHERE id = 1 FOR UPDATE NOWAIT").execute(c);
            assert!(busy.is_err(), "item 1 is held: {busy:?}");
            Err(Error::InvalidInput("the handler gave up"))
        },
    );
    exec(&mut holder, "ROLLBACK");
    assert!(
        matches!(ran, Err(Error::InvalidInput("the handler gave up"))),
        "{ran:?}"
    );
}

#[cfg(feature = "mysql")]
mod mysql_only {
    use super::*;
    use lockkit_tests::failed_work::fail_under_a_key;
    use mysql_deadlock::{database_with, extra_on_item_2_is_the_victim, sell_from_item_1};

    /// The request's work sells one unit of item 1, then touches item 2 as a
    /// best-effort extra whose failure it ignores. That touch is a deadlock's
    /// victim: InnoDB rolls back the whole transaction, the sale with it. The
    /// `UPDATE` that marks the key done, lockkit's own statement, then runs
    /// with no transaction open on the server and commits on its own: the key
    /// replays "201 sold" for ever, and the unit was never sold.
    #[test]
    fn a_key_is_not_marked_done_for_work_innodb_rolled_back() {
        let db = database_with("idempotency_deadlock_let_go", idempotency_migrations);
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", b"{\"item\":1}");
        let outcome = lockkit_tests::aborts::beside_neighbour(&db, "mysql", |conn, cue| {
            keys.run(conn, "tenant-1", "order-1", &request, |c| {
                sell_from_item_1(c, 1)?;
                extra_on_item_2_is_the_victim(c, cue);
                Ok::<_, Error>("201 sold".to_owned())
            })
        });
        let mut conn = db.connect();
        let stock = stock_of!(&mut conn);
        assert!(matches!(outcome, Err(Error::Deadlock)), "{outcome:?}");
        assert_eq!(stock, 10);
        // The client retries with the same key.
        let again = keys.run(&mut conn, "tenant-1", "order-1", &request, |c| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(c)?;
            Ok::<_, Error>("201 sold".to_owned())
        });
        let stock = stock_of!(&mut conn);
        assert!(
            matches!(again, Ok(Outcome::Ran(_))),
            "the retry replayed {again:?}"
        );
        assert_eq!(stock, 9, "the unit sold once");
    }

    /// As above, but the work sells after letting the deadlock go: the sale
    /// runs with no transaction open and commits on its own. lockkit refuses
    /// to retry that (nothing may be applied twice); the key must not be
    /// released for the client's retry to sell again, whether the work then
    /// returns or panics (the panic goes on).
    #[test]
    fn a_key_is_kept_for_work_that_wrote_after_innodb_rolled_it_back() {
        for panics in [false, true] {
            let name = format!("idempotency_wrote_after_end_{panics}");
            let db = database_with(&name, idempotency_migrations);
            let keys = Idempotency::default();
            let request = fingerprint("POST", "/orders", b"{\"item\":1}");
            let outcome = lockkit_tests::aborts::beside_neighbour(&db, "mysql", |conn, cue| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    keys.run(conn, "tenant-1", "order-1", &request, |c| {
                        sell_from_item_1(c, 1)?;
                        extra_on_item_2_is_the_victim(c, cue);
                        sell_from_item_1(c, 1)?; // in autocommit
                        if panics {
                            panic!("a bug in the handler");
                        }
                        Ok::<_, Error>("201 sold".to_owned())
                    })
                }))
            });
            match &outcome {
                Err(_) => assert!(panics, "a panic without one"),
                Ok(outcome) => assert!(
                    outcome.as_ref().is_err_and(|err| !err.is_retryable()),
                    "{outcome:?}"
                ),
            }
            let mut conn = db.connect();
            assert_eq!(stock_of!(&mut conn), 9, "the sale committed on its own");
            // The client retries with the same key.
            let again = keys.run(&mut conn, "tenant-1", "order-1", &request, |c| {
                sell_from_item_1(c, 1)?;
                Ok::<_, Error>("201 sold".to_owned())
            });
            assert!(
                matches!(again, Err(Error::IdempotencyInProgress)),
                "panics: {panics}: {again:?}"
            );
            assert_eq!(stock_of!(&mut conn), 9, "the unit sold once");
        }
    }

    /// A lock wait timeout the work lets go ends no transaction on a server
    /// started without `--innodb-rollback-on-timeout` (the default): what the
    /// work wrote after it went with the rollback of its failure (an error,
    /// or a panic), and the key is released for the client's retry, not kept
    /// as if those writes had committed on their own.
    #[test]
    fn a_key_is_released_for_work_that_failed_after_a_lock_wait_timeout_it_let_go() {
        let db = database_with(
            "idempotency_after_lock_wait_timeout",
            idempotency_migrations,
        );
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut holder = holding_item_1(&db);
        let keys = Idempotency::default();
        let mut conn = db.connect();
        exec(&mut conn, "SET SESSION innodb_lock_wait_timeout = 1");
        for panics in [false, true] {
            let gave_up = Error::InvalidInput("the handler gave up");
            let (key, failed) = fail_under_a_key(&keys, &mut conn, panics, gave_up, |c| {
                let timed_out = diesel::update(items::table.find(1))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(c);
                assert!(timed_out.is_err(), "item 1 is held: {timed_out:?}");
                // In the transaction, which lives on.
                diesel::update(items::table.find(2))
                    .set(items::stock.eq(items::stock - 1))
                    .execute(c)?;
                Ok(())
            });
            assert_eq!(failed.is_err(), panics, "{key}: {failed:?}");
            assert_eq!(
                stock_of!(&mut conn, 2),
                10,
                "{key}: the work was rolled back"
            );
            // The client retries with the same key.
            let again = keys.run(&mut conn, "tenant-1", key, "f", |_| {
                Ok::<_, Error>("ok".to_owned())
            });
            assert!(
                matches!(again, Ok(Outcome::Ran(_))),
                "{key}: the retry got {again:?}"
            );
        }
        exec(&mut holder, "ROLLBACK");
    }

    /// The work sells, then a nested call's DDL commits the transaction
    /// implicitly; the nested call's error (not retryable: statements may
    /// have committed on their own) is the work's. The sale committed: the
    /// key must not be released for the client's retry to sell again.
    #[test]
    fn a_key_is_kept_for_work_whose_nested_call_found_an_implicit_commit() {
        let db = database_with("idempotency_implicit_commit", idempotency_migrations);
        lockkit_tests::seed_items(&mut db.conn(), &[(1, 10)]);
        let keys = Idempotency::default();
        let request = fingerprint("POST", "/orders", b"{\"item\":1}");
        let mut conn = db.connect();
        let work = |c: &mut diesel::MysqlConnection| {
            sell_from_item_1(c, 1)?;
            lockkit::transaction_with_retry(c, &lockkit::RetryPolicy::immediate(3), |c| {
                diesel::sql_query(
                    "CREATE TABLE IF NOT EXISTS idempotency_implicit_commit (id INT)",
                )
                .execute(c)?;
                Err::<(), _>(Error::NotFound)
            })?;
            Ok::<_, Error>("201 sold".to_owned())
        };
        let outcome = keys.run(&mut conn, "tenant-1", "order-1", &request, work);
        assert!(
            outcome.as_ref().is_err_and(|err| !err.is_retryable()),
            "{outcome:?}"
        );
        assert_eq!(stock_of!(&mut conn), 9, "the sale committed with the DDL");
        let again = keys.run(&mut conn, "tenant-1", "order-1", &request, work);
        assert!(
            matches!(again, Err(Error::IdempotencyInProgress)),
            "{again:?}"
        );
        assert_eq!(stock_of!(&mut conn), 9, "the unit sold once");
    }
}

/// Keys inside the caller's transaction: a retried one, and one a duplicate
/// must wait for.
mod in_the_callers_transaction {
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use diesel::prelude::*;
    use diesel_migrations::MigrationHarness;
    use lockkit::idempotency::{Idempotency, Outcome};
    use lockkit::{Error, RetryPolicy};
    use lockkit_tests::{idempotency_migrations, seed_items, stock_of};

    fn sell_one<C: Connection>(conn: &mut C) -> Result<String, Error> {
        conn.batch_execute("UPDATE items SET stock = stock - 1 WHERE id = 1")?;
        Ok("201 sold".to_owned())
    }

    lockkit_tests::backend_tests! {
        fn an_idempotency_run_inside_a_retried_transaction_counts_once_in_the_attempt_that_commits(db) {
            // The run's key and work commit with the caller's transaction: an
            // attempt rolled back after the run takes them both back, and the
            // retry runs the work again, once.
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let keys = Idempotency::default();
            let mut attempt = 0;
            let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::default(), |c| {
                attempt += 1;
                let outcome = keys.run(c, "tenant-1", "order-1", "POST /orders", sell_one)?;
                match attempt {
                    1 => Err(Error::Deadlock), // the caller's transaction fails after the run
                    _ => Ok(outcome),
                }
            })
            .unwrap();
            assert_eq!((attempt, outcome), (2, Outcome::Ran("201 sold".to_owned())));
            assert_eq!(stock_of!(&mut conn), 9, "the work counted once");
            let again = keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", |_| -> Result<String, Error> { panic!("must not run") });
            assert_eq!(again.unwrap(), Outcome::Replayed("201 sold".to_owned()));
        }

        fn a_duplicate_of_a_key_held_by_an_open_outer_transaction_waits_and_replays(db) {
            // A runs the key inside its own transaction and has not committed;
            // B's duplicate waits on the key's row and replays A's response.
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let keys = Idempotency::default();
            let (ran, ran_rx) = mpsc::channel();
            let db = &db;
            let (a, b) = thread::scope(|s| {
                let a = s.spawn(move || {
                    let mut conn = db.connect();
                    conn.transaction(|c| {
                        let outcome = keys.run(c, "tenant-1", "order-1", "POST /orders", sell_one)?;
                        ran.send(()).unwrap();
                        thread::sleep(Duration::from_millis(300));
                        Ok::<_, Error>(outcome)
                    })
                });
                ran_rx.recv().unwrap();
                let b = keys.run(&mut db.connect(), "tenant-1", "order-1", "POST /orders", sell_one);
                (a.join().unwrap(), b)
            });
            assert_eq!(a.unwrap(), Outcome::Ran("201 sold".to_owned()));
            assert_eq!(b.unwrap(), Outcome::Replayed("201 sold".to_owned()));
            assert_eq!(stock_of!(&mut db.conn()), 9);
        }
    }

    /// On the servers, where a take of a key waits for another session's
    /// uncommitted take of it.
    mod a_take_that_waited {
        use super::*;

        lockkit_tests::server_tests! {
            fn a_repeat_while_a_key_whose_take_waited_past_the_lease_runs_is_refused(db) {
                // A takes the key in its own transaction, holds it past the
                // lease and rolls back. B's take waited all that while behind
                // A's, then got the key: during B's run, a repeat must find the
                // key running, not abandoned since B's take was sent. A take
                // is an insert, or the take-over of an abandoned key.
                db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
                seed_items(&mut db.conn(), &[(1, 10)]);
                lockkit_tests::insert_abandoned_key(&mut db.conn());
                let keys = Idempotency {
                    lease: Duration::from_secs(1),
                    ..Idempotency::default()
                };
                for key in ["new", "abandoned"] {
                    let (taken, taken_rx) = mpsc::channel();
                    let (running, running_rx) = mpsc::channel();
                    let (repeated, repeated_rx) = mpsc::channel::<()>();
                    let db = &db;
                    let (b, repeat) = thread::scope(|s| {
                        let a = s.spawn(move || {
                            let mut conn = db.connect();
                            let _ = conn.transaction(|c| {
                                keys.run(c, "tenant-1", key, "POST /orders", sell_one)?;
                                taken.send(()).unwrap();
                                thread::sleep(Duration::from_millis(1_500));
                                Err::<(), _>(Error::NoRowMatched)
                            });
                        });
                        taken_rx.recv().unwrap();
                        let b = s.spawn(move || {
                            keys.run(&mut db.connect(), "tenant-1", key, "POST /orders", |c| {
                                running.send(()).unwrap();
                                repeated_rx.recv().unwrap();
                                sell_one(c)
                            })
                        });
                        running_rx.recv().unwrap();
                        let repeat = keys.run(&mut db.connect(), "tenant-1", key, "POST /orders", sell_one);
                        repeated.send(()).unwrap();
                        a.join().unwrap();
                        (b.join().unwrap(), repeat)
                    });
                    assert!(
                        matches!(repeat, Err(Error::IdempotencyInProgress)),
                        "the repeat while B ran ({key} key): {repeat:?}"
                    );
                    assert_eq!(b.unwrap(), Outcome::Ran("201 sold".to_owned()), "{key} key");
                }
                assert_eq!(stock_of!(&mut db.conn()), 8, "sold once per key");
            }
        }
    }
}

/// A key the purge would take, deleted by a repeat to run again, while its
/// owner finishes: on the servers, where the repeat's statements wait for the
/// owner's row lock.
mod an_expired_key_finished_meanwhile {
    use std::thread;
    use std::time::{Duration, Instant};

    use diesel::prelude::*;
    use diesel_migrations::MigrationHarness;
    use lockkit::idempotency::{Idempotency, Outcome};
    use lockkit::lock_waits;
    use lockkit::Error;
    use lockkit_tests::{exec, idempotency_migrations, seed_items, stock_of};

    use super::{now_millis, sell_one};

    lockkit_tests::server_tests! {
        fn a_key_completed_while_a_repeat_deletes_it_as_expired_is_replayed(db) {
            // With a retention no longer than the lease, a running key past
            // both is expired to a repeat, which deletes it and runs the work
            // again. Its owner overran, and finishes while the repeat's delete
            // waits for the row: the delete must not take the completed key,
            // or the work runs twice.
            db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut db.conn(), &[(1, 10)]);
            let keys = Idempotency {
                lease: Duration::from_secs(60),
                retention: Duration::from_secs(60),
                ..Idempotency::default()
            };
            exec(&mut db.conn(), &format!(
                "INSERT INTO lockkit_idempotency_keys (principal, idempotency_key, fingerprint, state, started_at) \
                 VALUES ('tenant-1', 'order-1', 'POST /orders', 'running', {})",
                now_millis() - 600_000
            ));
            let mut owner = db.connect();
            let mut repeat_conn = db.connect();
            let repeat_id = lock_waits::session_id(&mut repeat_conn).unwrap();
            let mut watcher = db.connect();
            let repeat = thread::scope(|s| {
                owner
                    .transaction(|c| {
                        // The owner's row lock, as its finish takes it.
                        exec(c, "SELECT state FROM lockkit_idempotency_keys WHERE idempotency_key = 'order-1' FOR UPDATE");
                        let repeat = s.spawn(|| keys.run(&mut repeat_conn, "tenant-1", "order-1", "POST /orders", sell_one));
                        // Until the repeat waits for the row (MariaDB does not
                        // always list an insert's wait: at most a second).
                        let deadline = Instant::now() + Duration::from_secs(1);
                        while Instant::now() < deadline
                            && !lock_waits::current(&mut watcher).unwrap().iter().any(|w| w.session == repeat_id)
                        {
                            assert!(!repeat.is_finished(), "the repeat did not wait for the owner's row: {:?}", repeat.join());
                            thread::sleep(Duration::from_millis(20));
                        }
                        // The owner's work (its sale) and finish.
                        sell_one(c)?;
                        exec(c, &format!(
                            "UPDATE lockkit_idempotency_keys SET state = 'done', response = '\"201 sold\"', finished_at = {} \
                             WHERE idempotency_key = 'order-1'",
                            now_millis()
                        ));
                        Ok::<_, Error>(repeat)
                    })
                    .unwrap()
                    .join()
                    .unwrap()
            });
            assert_eq!(repeat.unwrap(), Outcome::Replayed("201 sold".to_owned()));
            assert_eq!(stock_of!(&mut db.conn()), 9, "sold once");
        }
    }
}

/// Responses are "any `Serialize + DeserializeOwned` value, stored as JSON"
/// (`Idempotency::run`): a list response of 100 KiB runs once and replays.
mod large_responses {
    use super::*;

    lockkit_tests::backend_tests! {
        fn a_response_of_100_kib_is_stored_and_replayed(db) {
            let mut conn = prepare!(db);
            let keys = Idempotency::default();
            let body: Vec<String> = (0..2048).map(|n| format!("line item {n:>40}")).collect();
            let ran = keys.run(&mut conn, "tenant-1", "order-big", "POST /orders", |conn| {
                sell_one(conn)?;
                Ok::<_, Error>(body.clone())
            });
            assert!(matches!(&ran, Ok(Outcome::Ran(b)) if *b == body), "the first run: {:?}", ran.as_ref().map(|_| "a response").map_err(|e| e.to_string()));
            let again = keys.run(&mut conn, "tenant-1", "order-big", "POST /orders", |_| -> Result<Vec<String>, Error> {
                panic!("a completed key must not run its work again")
            });
            assert!(matches!(&again, Ok(Outcome::Replayed(b)) if *b == body));
            assert_eq!(stock_of!(&mut conn), 99, "sold once");
        }

        fn a_response_that_would_not_replay_is_refused_and_its_work_undone(db) {
            // JSON writes NaN as `null`, which does not read back as `f64`:
            // stored, every repeat would fail for the whole retention, after
            // work that committed. The run fails instead, and undoes it.
            let mut conn = prepare!(db);
            let keys = Idempotency::default();
            let average = |conn: &mut _| {
                sell_one(conn)?;
                Ok::<_, Error>(f64::NAN)
            };
            let ran = keys.run(&mut conn, "tenant-1", "order-avg", "POST /orders", average);
            assert!(
                matches!(&ran, Err(Error::Database(diesel::result::Error::SerializationError(_)))),
                "{ran:?}"
            );
            assert_eq!(stock_of!(&mut conn), 100, "the work is undone");
            let again = keys.run(&mut conn, "tenant-1", "order-avg", "POST /orders", |conn| {
                sell_one(conn)?;
                Ok::<_, Error>(1.5)
            });
            assert_eq!(again.unwrap(), Outcome::Ran(1.5), "the key is free for the retry");
            assert_eq!(stock_of!(&mut conn), 99, "sold once");
        }
    }
}

/// A MySQL/MariaDB database whose default character set is `latin1` (the
/// default of MariaDB before 11.6 and of MySQL 5.7): a stored response in any
/// script is replayed as it was, and the run that stores it does not fail
/// after its work.
#[cfg(feature = "mysql")]
mod on_a_latin1_database {
    use super::*;
    use diesel::connection::SimpleConnection;
    use lockkit_tests::TestDb;

    const RESPONSE: &str = "201 售出: 山田 😀";

    #[test]
    fn a_response_in_any_script_is_stored_and_replayed() {
        let db = TestDb::<MysqlConnection>::new("idempotency_latin1");
        let mut conn = db.connect();
        conn.batch_execute("ALTER DATABASE CHARACTER SET latin1 COLLATE latin1_swedish_ci")
            .unwrap();
        conn.run_pending_migrations(idempotency_migrations("mysql"))
            .unwrap();
        seed_items(&mut conn, &[(1, 100)]);
        let keys = Idempotency::default();
        let ran = keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", |conn| {
            sell_one(conn)?;
            Ok::<_, Error>(RESPONSE.to_owned())
        });
        assert!(
            matches!(&ran, Ok(Outcome::Ran(r)) if r == RESPONSE),
            "{ran:?}"
        );
        let again = keys.run(
            &mut conn,
            "tenant-1",
            "order-1",
            "POST /orders",
            |_| -> Result<String, Error> { panic!("a completed key must not run its work again") },
        );
        assert!(
            matches!(&again, Ok(Outcome::Replayed(r)) if r == RESPONSE),
            "{again:?}"
        );
        assert_eq!(stock_of!(&mut conn), 99, "sold once");
    }
}

/// A run whose work panics: the panic guard rolls the work back, and the
/// process lives on (a web framework catches a handler's panic and answers
/// 500). The key is left `running`, as if the process had died, so the
/// client's retry is refused for the whole lease instead of running the work
/// again as after any other failure ("the work failed: the key is released").
mod a_panicking_work {
    use super::*;

    lockkit_tests::backend_tests! {
        fn a_work_that_panics_releases_its_key_for_the_retry(db) {
            let mut conn = prepare!(db);
            let keys = Idempotency::default();
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                keys.run(&mut conn, "tenant-1", "order-7", "POST /orders", |conn| -> Result<String, Error> {
                    sell_one(conn)?;
                    panic!("a bug in the handler");
                })
            }));
            assert!(panicked.is_err(), "the panic went on");
            assert_eq!(stock_of!(&mut conn), 100, "the work was rolled back");
            // The client retries at once.
            let retry = keys.run(&mut conn, "tenant-1", "order-7", "POST /orders", sell_one);
            assert!(
                matches!(&retry, Ok(Outcome::Ran(_))),
                "the retry after a rolled-back run: {retry:?}"
            );
            assert_eq!(stock_of!(&mut conn), 99);
        }
    }
}

/// `wait_while_running` is "how long a repeat waits"; a caller who means
/// "as long as it takes" writes `Duration::MAX`. `run` then panics on every
/// call, the first request's included (`Instant + Duration` overflows),
/// before it sends anything.
mod an_unbounded_wait {
    use super::*;

    lockkit_tests::backend_tests! {
        fn a_wait_of_duration_max_runs_the_work(db) {
            let mut conn = prepare!(db);
            let keys = Idempotency { wait_while_running: Duration::MAX, ..Idempotency::default() };
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", sell_one)
            }));
            assert!(matches!(&ran, Ok(Ok(Outcome::Ran(_)))), "run panicked: {:?}", ran.as_ref().err().and_then(|p| p.downcast_ref::<String>()));
        }
    }
}

/// An idempotency run nested in the caller's lockkit transaction
/// (`transaction_with_retry`), after the caller's own best-effort extra was a
/// deadlock's victim and its error let go: InnoDB rolled back the whole
/// transaction. The run's key `INSERT` (in a Diesel savepoint, not a lockkit
/// call) then runs with no transaction open on the server and commits on its
/// own, `running`; Diesel's `RELEASE SAVEPOINT` fails, and
/// `transaction_with_retry` returns that error as it is (not the deadlock, so
/// it does not retry). The work never ran, and every repeat of the request is
/// refused (`IdempotencyInProgress`) until the key's lease runs out.
#[cfg(feature = "mysql")]
mod nested_after_a_deadlock_the_caller_let_go {
    use super::*;
    use lockkit_tests::models::Item;
    use mysql_deadlock::{database_with, extra_on_item_2_is_the_victim};

    #[derive(QueryableByName)]
    struct StateRow {
        #[diesel(sql_type = diesel::sql_types::Text)]
        body: String,
    }

    #[test]
    fn the_retried_transaction_runs_the_work_once() {
        let db = database_with("idempotency_nested_after_deadlock", idempotency_migrations);
        let keys = Idempotency::default();
        let mut attempt = 0;
        let outcome = lockkit_tests::aborts::beside_neighbour(&db, "mysql", |conn, cue| {
            lockkit::transaction_with_retry(conn, &lockkit::RetryPolicy::default(), |c| {
                attempt += 1;
                let _item: Item = items::table.find(1).for_update().first(c)?;
                if attempt == 1 {
                    extra_on_item_2_is_the_victim(c, cue);
                }
                keys.run(c, "tenant-1", "order-1", "POST /orders", sell_one)
            })
        });
        let mut conn = db.connect();
        let stock = stock_of!(&mut conn);
        let key: Vec<String> =
            diesel::sql_query("SELECT state AS body FROM lockkit_idempotency_keys")
                .load::<StateRow>(&mut conn)
                .unwrap()
                .into_iter()
                .map(|row| row.body)
                .collect();
        // The client repeats the request with its key.
        let repeat = keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", sell_one);
        assert!(
            matches!(&outcome, Ok(Outcome::Ran(_))),
            "after {attempt} attempts: {outcome:?}; stock {stock}, the key {key:?}; the repeat: {repeat:?}"
        );
        assert_eq!(stock, 9, "sold once");
    }
}
