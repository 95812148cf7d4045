//! The outbox under real crashes: relay and consumer processes exit at the exact
//! point of each at-least-once window, against NATS JetStream and a real
//! database, and the audit checks every order applied exactly once.
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

use outbox::{Audit, Backend, BrokerConfig, ConsumerReport, CRASH_EXIT};

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

/// Sets up, places `orders` orders; returns the test's stream.
fn prepare(test: &str, url: &str, orders: u32) -> Stream {
    let stream = Stream::new(test, url);
    outbox::setup(url, &stream.0, 3).unwrap_or_else(|e| panic!("setup {url}: {e}"));
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
            absorbed: 5 + extra
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

lockkit_tests::url_tests! {
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
