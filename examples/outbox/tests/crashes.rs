//! The outbox under real crashes: relay and consumer processes exit at the exact
//! point of each at-least-once window, against NATS JetStream and a real
//! database, and the audit checks every order applied exactly once. And under
//! what a consumer meets in a real run: messages it can never apply, deadlocks
//! and a busy database, and two order services at once.
//!
//! Each test runs in an empty database of its own ([`lockkit_tests::TestDb::empty`])
//! and a JetStream stream of its own, deleted at the end. NATS is `NATS_URL`
//! (default `nats://127.0.0.1:4222`); a broker that cannot be reached fails the
//! test, nothing is skipped. The restart test starts a `nats-server -js` of its
//! own (on a free port, with its own store directory), kills it with SIGKILL in
//! the middle of the run and starts it again; it needs `nats-server` on the
//! `PATH` (or `NATS_SERVER`), and fails saying so without it.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use lockkit::outbox::schema::{lockkit_inbox, lockkit_outbox};
use lockkit_tests::support::AnyConnection;
use outbox::{Audit, Backend, BrokerConfig, ConsumerReport, CRASH_EXIT};

diesel::table! { stock (item_id) { item_id -> Integer, reserved -> Integer } }

/// The test's stream, named after the test and the backend, deleted on drop.
struct Stream(BrokerConfig);

impl Stream {
    fn new(test: &str, url: &str) -> Stream {
        let stream = format!(
            "OUTBOX_{}_{}_{}",
            test,
            Backend::from_url(url).name(),
            std::process::id()
        );
        Stream(BrokerConfig {
            stream,
            ..BrokerConfig::default()
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = outbox::delete_stream(&self.0);
    }
}

/// `outbox --role ROLE ARGS..` on the test's database and stream.
fn spawn(url: &str, broker: &BrokerConfig, role: &str, args: &[&str]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .args(["--role", role, "--stream", &broker.stream])
        .args(args);
    lockkit_tests::support::point_at_database(&mut command, url);
    command
        .env("NATS_URL", &broker.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("spawn the outbox binary")
}

/// Waits for every child; returns (exit code, stdout + stderr) per child.
fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<(Option<i32>, String)> {
    lockkit_tests::support::wait_all(children, limit)
        .into_iter()
        .map(|(status, stdout, stderr)| {
            let out = stdout + &stderr;
            eprint!("{out}");
            (status.code(), out)
        })
        .collect()
}

/// Runs one process to its end; asserts its exit code.
fn run(url: &str, broker: &BrokerConfig, role: &str, args: &[&str], expect: i32) -> String {
    let (code, out) = wait_all(
        vec![spawn(url, broker, role, args)],
        Duration::from_secs(120),
    )
    .remove(0);
    assert_eq!(code, Some(expect), "{role} {args:?}:\n{out}");
    out
}

fn consumer_report(out: &str) -> ConsumerReport {
    ConsumerReport::from_output(out).unwrap_or_else(|| panic!("no consumer report in {out:?}"))
}

/// Runs a consumer until it has been idle for 500 ms; returns its report.
fn consume_the_rest(url: &str, broker: &BrokerConfig) -> ConsumerReport {
    consumer_report(&run(url, broker, "consumer", &["--idle-ms", "500"], 0))
}

/// Sets up with 3 items, places `orders` orders; returns the test's stream.
fn prepare(test: &str, url: &str, orders: u32) -> Stream {
    prepare_stocked(test, url, 3, orders)
}

/// Sets up with `items` items, places `orders` orders; returns the test's stream.
fn prepare_stocked(test: &str, url: &str, items: i32, orders: u32) -> Stream {
    let stream = Stream::new(test, url);
    outbox::setup(url, &stream.0, items).unwrap_or_else(|e| panic!("setup {url}: {e}"));
    let ids = outbox::place_orders(url, &stream.0, orders).unwrap();
    assert_eq!(ids.len(), orders as usize);
    stream
}

fn audit(url: &str, broker: &BrokerConfig) -> Audit {
    let audit = outbox::audit(url, broker).unwrap();
    eprintln!("{url}:\n{audit}");
    audit
}

/// A relay exits after JetStream acked its second batch of 5 and before the
/// marks commit: the next relay publishes those 5 again, and the consumer's
/// inbox absorbs exactly those 5 duplicates.
fn a_relay_killed_between_publish_and_mark(url: &str) {
    let stream = prepare("relay_kill", url, 20);
    let broker = &stream.0;
    run(
        url,
        broker,
        "relay",
        &["--batch", "5", "--crash-after-publish", "2"],
        CRASH_EXIT,
    );
    let after_crash = audit(url, broker);
    assert_eq!(
        (after_crash.stream_messages, after_crash.unpublished),
        (10, 15),
        "batch 1 marked, batch 2 published but not marked"
    );
    run(url, broker, "relay", &["--batch", "5"], 0);
    let consumed = consume_the_rest(url, broker);
    let audit = audit(url, broker);
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(
        audit.stream_messages, 25,
        "20 messages and the 5 of the dead relay's batch again"
    );
    assert_eq!(audit.duplicates_published(), 5);
    // Exact, up to redeliveries JetStream adds when an ack takes over its
    // ack wait (each one absorbed too).
    let extra = consumed.redelivered;
    assert_eq!(
        consumed,
        ConsumerReport {
            delivered: 25 + extra,
            redelivered: extra,
            applied: 20,
            absorbed: 5 + extra,
            rejected: 0,
            retried: 0,
        },
        "every duplicate delivered and absorbed"
    );
}

/// A consumer exits after the effect of its third message committed and
/// before the ack: JetStream redelivers it (and the rest of the fetched batch)
/// to the next consumer, whose inbox absorbs exactly that one message.
fn a_consumer_killed_between_effect_and_ack(url: &str) {
    let stream = prepare("consumer_kill", url, 20);
    let broker = &stream.0;
    run(url, broker, "relay", &["--batch", "5"], 0);
    let died = run(
        url,
        broker,
        "consumer",
        &["--crash-after-effect", "3"],
        CRASH_EXIT,
    );
    assert!(
        died.contains("crashing after the effect of order-service/"),
        "{died}"
    );
    let mid = audit(url, broker);
    assert_eq!(
        (mid.inbox, mid.reservations),
        (3, 3),
        "three effects committed, two of them acked"
    );
    let consumed = consume_the_rest(url, broker);
    let audit = audit(url, broker);
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(audit.stream_messages, 20, "no duplicate published");
    // 18 messages not acked by the first consumer; deliveries beyond those are
    // redeliveries after an ack wait, each one absorbed.
    assert_eq!(consumed.applied, 17, "{consumed}");
    assert!(consumed.delivered >= 18, "{consumed}");
    assert_eq!(
        consumed.absorbed,
        1 + (consumed.delivered - 18),
        "the unacked effect, redelivered and absorbed: {consumed}"
    );
    assert!(
        consumed.redelivered >= 1,
        "JetStream redelivered after its ack wait: {consumed}"
    );
}

/// Two relays at once, one of which dies between publish and mark, with the
/// consumer running alongside; then a last relay and consumer finish. No
/// message lost, every duplicate published is absorbed.
fn two_relays_at_once_lose_nothing(url: &str) {
    const ORDERS: u32 = 200;
    let stream = prepare("two_relays", url, ORDERS);
    let broker = &stream.0;
    let children = vec![
        spawn(
            url,
            broker,
            "relay",
            &["--name", "r1", "--batch", "5", "--pause-ms", "20"],
        ),
        spawn(
            url,
            broker,
            "relay",
            &[
                "--name",
                "r2",
                "--batch",
                "5",
                "--pause-ms",
                "20",
                "--crash-after-publish",
                "2",
            ],
        ),
        spawn(url, broker, "consumer", &["--idle-ms", "1000"]),
    ];
    let outputs = wait_all(children, Duration::from_secs(120));
    assert_eq!(outputs[0].0, Some(0), "{}", outputs[0].1);
    assert_eq!(outputs[1].0, Some(CRASH_EXIT), "{}", outputs[1].1);
    assert_eq!(outputs[2].0, Some(0), "{}", outputs[2].1);
    // Whatever was published after the first consumer stopped.
    let last = consume_the_rest(url, broker);
    let consumed = consumer_report(&outputs[2].1) + last;
    let audit = audit(url, broker);
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(
        audit.duplicates_published(),
        5,
        "exactly the dead relay's batch twice: {audit}"
    );
    assert_eq!(consumed.applied, u64::from(ORDERS), "{consumed}");
    assert_eq!(
        consumed.delivered,
        audit.stream_messages + consumed.redelivered,
        "every message in the stream delivered: {consumed}"
    );
    assert_eq!(
        consumed.absorbed,
        consumed.delivered - u64::from(ORDERS),
        "every duplicate absorbed: {consumed}"
    );
    eprintln!("{url}: consumers {consumed}");
}

/// A `nats-server -js` of the test's own, on a free port, with its own store
/// directory; killed (and the directory removed) on drop.
struct OwnNats {
    port: u16,
    store: PathBuf,
    server: Option<Child>,
}

impl OwnNats {
    fn start(name: &str) -> OwnNats {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let store =
            std::env::temp_dir().join(format!("lockkit-nats-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&store);
        let mut nats = OwnNats {
            port,
            store,
            server: None,
        };
        nats.restart();
        nats
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again, on the same port and store) and waits until
    /// it takes connections.
    fn restart(&mut self) {
        let program = std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let server = Command::new(&program)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `{program}` (install nats-server, or set NATS_SERVER): {e}")
            });
        self.server = Some(server);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown, no goodbye to the clients.
    fn kill(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill().expect("kill nats-server");
            server.wait().expect("reap nats-server");
        }
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// A `nats-server` of the test's own with a stream on it, both named after the
/// test and the backend, and the example's tables set up in `url` with `items`
/// items.
fn own_broker(test: &str, url: &str, on_disk: bool, items: i32) -> (OwnNats, BrokerConfig) {
    let name = format!("{test}_{}", Backend::from_url(url).name());
    let nats = OwnNats::start(&name);
    let config = BrokerConfig {
        url: nats.url(),
        stream: format!("OUTBOX_{name}"),
        on_disk,
    };
    outbox::setup(url, &config, items).unwrap_or_else(|e| panic!("setup {url}: {e}"));
    (nats, config)
}

/// The `failed=` count of a relay's report line.
fn relay_failed(out: &str) -> u64 {
    out.lines()
        .rev()
        .find(|l| l.starts_with("relay ") && l.contains("failed="))
        .and_then(|l| {
            l.split("failed=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no relay report in {out:?}"))
}

/// The broker is killed (SIGKILL) while a relay publishes and a consumer
/// applies, and comes back a second later with its stream on disk. The client
/// reconnects; a publish without an ack counts as failed and is retried after
/// its backoff, one the client sent again after reconnecting is a duplicate;
/// the consumer rides out fetch and ack errors, and an ack lost with the
/// connection comes back as a redelivery. Nothing is lost: every order is
/// applied exactly once, every duplicate absorbed.
fn the_broker_restarting_mid_run_loses_nothing(url: &str) {
    const ORDERS: u32 = 200;
    let (mut nats, broker) = own_broker("restart", url, true, 3);
    let broker = &broker;
    assert_eq!(
        outbox::place_orders(url, broker, ORDERS).unwrap().len(),
        ORDERS as usize
    );
    let mut children = vec![
        spawn(
            url,
            broker,
            "relay",
            &["--name", "r1", "--batch", "5", "--pause-ms", "40"],
        ),
        spawn(url, broker, "consumer", &["--idle-ms", "3000"]),
    ];
    std::thread::sleep(Duration::from_millis(600));
    for child in &mut children {
        // The relay stops only once nothing is left unpublished.
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "the relay and the consumer are still at work when the broker dies"
        );
    }
    nats.kill();
    // Shorter than a publish's ack wait (5 s): on SQLite a relay waiting for
    // acks holds the database's write lock, and a much longer outage would
    // outlast the consumer's busy timeout (10 s) under load.
    std::thread::sleep(Duration::from_secs(1));
    nats.restart();
    let outputs = wait_all(children, Duration::from_secs(180));
    assert_eq!(outputs[0].0, Some(0), "{}", outputs[0].1);
    assert_eq!(outputs[1].0, Some(0), "{}", outputs[1].1);
    // Whatever was redelivered after the first consumer stopped.
    let last = consume_the_rest(url, broker);
    let consumed = consumer_report(&outputs[1].1) + last;
    let audit = audit(url, broker);
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(consumed.applied, u64::from(ORDERS), "{consumed}");
    assert_eq!(
        consumed.absorbed,
        consumed.delivered - u64::from(ORDERS),
        "every duplicate absorbed: {consumed}"
    );
    eprintln!(
        "{url}: broker restarted mid-run: relay failed={}, stream {} messages, consumers {consumed}",
        relay_failed(&outputs[0].1),
        audit.stream_messages
    );
}

/// JetStream's publish-ack timeout (the client's default), which a publish
/// waits for before it counts as failed.
const PUBLISH_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// A relay waits for its batch's acks inside the transaction that claimed the
/// batch, and on SQLite that transaction holds the database's write lock. So a
/// broker that dies mid-batch must cost the batch one ack timeout, not one per
/// message: five acks waited one after the other held the lock for 25 s, past
/// the consumer's 10 s busy timeout, and the consumer stopped with "lock wait
/// timed out" in the broker-restart test.
fn a_dead_broker_costs_a_batch_one_ack_timeout(url: &str) {
    const BATCH: u32 = 5;
    let (mut nats, config) = own_broker("dead_acks", url, false, 1);
    let config = &config;
    outbox::place_orders(url, config, BATCH).expect("place the orders");
    let broker = outbox::broker::Broker::connect(&config.url, &config.stream).expect("connect");
    nats.kill();
    let mut conn = lockkit_tests::support::AnyConnection::open(url).expect("open");
    let started = Instant::now();
    let relayed = lockkit::outbox::Relay::default()
        .publish_batch(&mut conn, i64::from(BATCH), |batch| {
            Ok::<_, lockkit::Error>(broker.publish_confirmed(batch))
        })
        .expect("the batch's failures are marked, not an error");
    let held = started.elapsed();
    assert_eq!(
        (relayed.claimed, relayed.failed),
        (BATCH as usize, BATCH as usize),
        "no broker, no ack: {relayed:?}"
    );
    assert!(
        held < PUBLISH_ACK_TIMEOUT * 2,
        "the relay held its batch of {BATCH} for {held:?} waiting for acks from a dead broker"
    );
}

/// Publishes `payload` to the stream's order subject as no relay would: with
/// `Outbox-Id: id` when given, without the header otherwise.
fn publish_raw(broker: &BrokerConfig, id: Option<&str>, payload: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let client = async_nats::connect(&broker.url)
            .await
            .expect("connect to NATS");
        let jetstream = async_nats::jetstream::new(client);
        let subject = outbox::broker::Broker::subject(&broker.stream);
        let sent = match id {
            Some(id) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(outbox::broker::MESSAGE_ID_HEADER, id);
                jetstream
                    .publish_with_headers(subject, headers, payload.to_vec().into())
                    .await
            }
            None => jetstream.publish(subject, payload.to_vec().into()).await,
        };
        sent.expect("publish").await.expect("JetStream stored it");
    });
}

/// A message that is not an order's, and an order's body without its
/// `Outbox-Id` header, sit at the head of the stream. No delivery of either can
/// ever be applied: the consumer terminates both (JetStream delivers them no
/// more), counts them as rejected, and applies every order behind them.
fn a_bad_message_does_not_stop_the_consumer(url: &str) {
    let stream = Stream::new("bad_message", url);
    let broker = &stream.0;
    outbox::setup(url, broker, 3).unwrap_or_else(|e| panic!("setup {url}: {e}"));
    publish_raw(broker, Some("junk/1"), b"not an order");
    publish_raw(broker, None, br#"{"order":1,"item":1,"qty":1}"#);
    assert_eq!(outbox::place_orders(url, broker, 5).unwrap().len(), 5);
    run(url, broker, "relay", &["--batch", "5"], 0);
    let consumed = consume_the_rest(url, broker);
    let audit = audit(url, broker);
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(audit.stream_messages, 7, "5 orders and the 2 bad messages");
    assert_eq!(
        (consumed.applied, consumed.rejected),
        (5, 2),
        "each bad message rejected once, never redelivered: {consumed}"
    );
}

/// An order for an item the stock service does not carry (no `stock` row) is
/// not applied: the inbox's transaction rolls back, so nothing records it, and
/// the message is rejected rather than acked as done.
fn an_order_for_an_unknown_item_is_rejected(url: &str) {
    let stream = prepare_stocked("unknown_item", url, 0, 1);
    let broker = &stream.0;
    run(url, broker, "relay", &[], 0);
    let consumed = consume_the_rest(url, broker);
    let audit = audit(url, broker);
    assert_eq!(
        (consumed.applied, consumed.rejected),
        (0, 1),
        "no stock row, nothing reserved: {consumed}"
    );
    assert_eq!(
        (audit.inbox, audit.reservations, audit.reserved_qty),
        (0, 0, 0),
        "nothing recorded: {audit}"
    );
    assert!(!audit.is_exactly_once(), "{audit}");
}

/// Two order services at once (two `--role orders` processes, here two
/// threads): both place all their orders, each with its own id, and each
/// message names its own order.
fn two_order_services_at_once(url: &str) {
    const EACH: u32 = 20;
    let stream = Stream::new("two_services", url);
    let broker = &stream.0;
    outbox::setup(url, broker, 3).unwrap_or_else(|e| panic!("setup {url}: {e}"));
    let placed: Vec<_> = std::thread::scope(|s| {
        let services: Vec<_> = (0..2)
            .map(|_| s.spawn(|| outbox::place_orders(url, broker, EACH)))
            .collect();
        services
            .into_iter()
            .map(|t| t.join().expect("an order service panicked"))
            .collect()
    });
    let mut ids = Vec::new();
    for result in placed {
        ids.extend(result.unwrap_or_else(|e| panic!("an order service failed: {e}")));
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        2 * EACH as usize,
        "every order its own id: {ids:?}"
    );
    run(url, broker, "relay", &["--batch", "10"], 0);
    let consumed = consume_the_rest(url, broker);
    let audit = audit(url, broker);
    assert_eq!(audit.orders, i64::from(2 * EACH), "{audit}");
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(consumed.applied, u64::from(2 * EACH), "{consumed}");
}

/// Whether a transaction in the test's database (other than `conn`'s) waits
/// for a row lock: on MySQL/MariaDB, whether the consumer's `UPDATE stock`
/// runs (it can only wait). PostgreSQL and MySQL/MariaDB.
fn a_transaction_waits(conn: &mut AnyConnection) -> bool {
    let query = match conn.backend() {
        Backend::Postgres => {
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'"
        }
        // A row lock's wait shows as the statement that waits, still running.
        // (`information_schema.innodb_trx` is a snapshot MariaDB refreshes
        // when it likes.)
        _ => {
            "SELECT count(*) FROM information_schema.processlist \
             WHERE db = DATABASE() AND info LIKE 'UPDATE `stock`%'"
        }
    };
    diesel::select(diesel::dsl::sql::<BigInt>(&format!("({query})")))
        .get_result::<i64>(conn)
        .expect("read the lock waits")
        > 0
}

/// A retryable database error while the consumer applies a message leaves the
/// message unacked, and the consumer goes on: the message comes again and is
/// applied once. On PostgreSQL and MySQL/MariaDB the error is a deadlock: the
/// test's transaction holds the item's `stock` row, waits until the consumer
/// waits for it (its inbox row written), then writes the same inbox row; the
/// server picks the consumer as the victim (on PostgreSQL the test's session
/// looks for deadlocks only after 10 s, the consumer's after 1 s; MySQL/MariaDB
/// roll back the transaction that wrote less). On SQLite the test holds the
/// database's write lock past the consumer's busy timeout (10 s).
fn a_retryable_error_does_not_stop_the_consumer(url: &str) {
    let stream = prepare("retryable", url, 1);
    let broker = &stream.0;
    run(url, broker, "relay", &[], 0);
    let mut holder = AnyConnection::open(url).expect("open");
    let outbox_id: i64 = lockkit_outbox::table
        .select(lockkit_outbox::id)
        .first(&mut holder)
        .expect("the order's message");
    let message_id = outbox::broker::message_id(outbox_id);
    let consumer;
    let held: Result<(), diesel::result::Error> = if holder.backend() == Backend::Sqlite {
        // Plain SQL: the enum has no `immediate_transaction`.
        diesel::sql_query("BEGIN IMMEDIATE")
            .execute(&mut holder)
            .expect("the write lock");
        consumer = spawn(url, broker, "consumer", &["--idle-ms", "500"]);
        std::thread::sleep(Duration::from_secs(12));
        diesel::sql_query("ROLLBACK")
            .execute(&mut holder)
            .expect("rollback");
        Err(diesel::result::Error::RollbackTransaction)
    } else {
        if holder.backend() == Backend::Postgres {
            diesel::sql_query("SELECT set_config('deadlock_timeout', '10s', false)")
                .execute(&mut holder)
                .expect("deadlock_timeout");
        }
        let mut watcher = AnyConnection::open(url).expect("open");
        let mut spawned = None;
        let held = holder.transaction(|conn| {
            // Every item, so that this transaction has written more than the
            // consumer's when the deadlock forms.
            diesel::update(stock::table)
                .set(stock::reserved.eq(stock::reserved + 1000))
                .execute(conn)?;
            let consumer = spawned.insert(spawn(url, broker, "consumer", &["--idle-ms", "500"]));
            let deadline = Instant::now() + Duration::from_secs(30);
            while !a_transaction_waits(&mut watcher) {
                if Instant::now() > deadline {
                    let _ = consumer.kill();
                    panic!("the consumer never waited for the stock row");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            diesel::insert_into(lockkit_inbox::table)
                .values((
                    lockkit_inbox::consumer.eq("stock"),
                    lockkit_inbox::message_id.eq(&message_id),
                    lockkit_inbox::received_at.eq(0_i64),
                ))
                .execute(conn)?;
            Err(diesel::result::Error::RollbackTransaction)
        });
        consumer = spawned.expect("the consumer");
        held
    };
    assert!(
        matches!(held, Err(diesel::result::Error::RollbackTransaction)),
        "the test's transaction was not the victim: {held:?}"
    );
    let (code, out) = wait_all(vec![consumer], Duration::from_secs(120)).remove(0);
    assert_eq!(code, Some(0), "{out}");
    let consumed = consumer_report(&out);
    let audit = audit(url, broker);
    assert!(audit.is_exactly_once(), "{audit}");
    assert_eq!(consumed.applied, 1, "{consumed}");
    assert!(consumed.retried >= 1, "{consumed}");
    assert_eq!(consumed.rejected, 0, "{consumed}");
}

lockkit_tests::url_tests! {
    fn a_retryable_error_does_not_stop_the_consumer(url) {
        super::a_retryable_error_does_not_stop_the_consumer(url)
    }
    fn a_bad_message_does_not_stop_the_consumer(url) {
        super::a_bad_message_does_not_stop_the_consumer(url)
    }
    fn an_order_for_an_unknown_item_is_rejected(url) {
        super::an_order_for_an_unknown_item_is_rejected(url)
    }
    fn two_order_services_at_once(url) {
        super::two_order_services_at_once(url)
    }
    fn a_dead_broker_costs_a_batch_one_ack_timeout(url) {
        super::a_dead_broker_costs_a_batch_one_ack_timeout(url)
    }
    fn the_broker_restarting_mid_run_loses_nothing(url) {
        super::the_broker_restarting_mid_run_loses_nothing(url)
    }
    fn a_relay_killed_between_publish_and_mark(url) {
        super::a_relay_killed_between_publish_and_mark(url)
    }
    fn a_consumer_killed_between_effect_and_ack(url) {
        super::a_consumer_killed_between_effect_and_ack(url)
    }
    fn two_relays_at_once_lose_nothing(url) {
        super::two_relays_at_once_lose_nothing(url)
    }
}
