//! The items API over real HTTP, on every backend: the server (diesel-async
//! underneath, on its own multi-threaded tokio runtime) listens on 127.0.0.1
//! (port 0, so the tests run in parallel) and blocking `ureq` clients talk to
//! it, each from its own thread when they race.
//!
//! Each test runs in an empty database of its own from
//! [`lockkit_tests::TestDb::empty`]: a temporary SQLite file, or a database on the
//! PostgreSQL and MySQL/MariaDB servers named by `PG_DATABASE_URL` and
//! `MYSQL_DATABASE_URL`, removed at the end. A server that cannot be reached fails
//! the test; nothing is skipped.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The service, on its own tokio runtime, listening on 127.0.0.1 at a free port.
struct Server {
    base: String,
    runtime: Option<tokio::runtime::Runtime>,
}

/// The tests' configuration: a pool of 8, 10 s to wait for a connection.
fn config() -> http_api::Config {
    http_api::Config {
        pool_size: 8,
        connection_timeout: Duration::from_secs(10),
        ..http_api::Config::default()
    }
}

impl Server {
    fn start(url: &str) -> Server {
        Server::start_with(url, config())
    }

    /// Starts the service on `url` holding one item, `name` with `stock` units;
    /// returns it and the item's id.
    fn with_item(url: &str, name: &str, stock: i64) -> (Server, i64) {
        let server = Server::start(url);
        let (id, _) = server.client().create(name, stock);
        (server, id)
    }

    fn start_with(url: &str, config: http_api::Config) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let app = runtime
            .block_on(http_api::connect(url, &config))
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        runtime.spawn(async move { http_api::serve(listener, app).await });
        Server {
            base: format!("http://{addr}"),
            runtime: Some(runtime),
        }
    }

    /// A new client: its own agent, and a new connection per request (a kept-alive
    /// one can be closed by the server just as the client reuses it).
    fn client(&self) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .timeout_global(Some(Duration::from_secs(30)))
            .build();
        Client {
            agent: config.into(),
            base: self.base.clone(),
        }
    }

    /// [`race`] with a client of its own for each thread: runs
    /// `each(i, client, start)` on `n` threads at once.
    fn race_clients<T: Send>(
        &self,
        n: usize,
        each: impl Fn(usize, &Client, &Barrier) -> T + Sync,
    ) -> Vec<T> {
        race(n, |i, start| each(i, &self.client(), start))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// A blocking HTTP client of the API.
struct Client {
    agent: ureq::Agent,
    base: String,
}

/// What came back.
#[derive(Debug)]
struct Reply {
    status: u16,
    etag: Option<String>,
    content_type: Option<String>,
    location: Option<String>,
    body: Value,
}

impl Client {
    fn send(&self, method: &str, path: &str, if_match: Option<&str>, body: Option<Value>) -> Reply {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(tag) = if_match {
            request = request.header("If-Match", tag);
        }
        let body = match body {
            Some(body) => {
                request = request.header("Content-Type", "application/json");
                body.to_string()
            }
            None => String::new(),
        };
        let request = request.body(body).expect("request");
        let response = self
            .agent
            .run(request)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().expect("ASCII header").to_owned())
        };
        let (etag, content_type, location) =
            (header("etag"), header("content-type"), header("location"));
        let status = response.status().as_u16();
        let text = response
            .into_body()
            .read_to_string()
            .expect("response body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Reply {
            status,
            etag,
            content_type,
            location,
            body,
        }
    }

    fn get(&self, id: i64) -> Reply {
        self.send("GET", &format!("/items/{id}"), None, None)
    }

    fn put(&self, id: i64, if_match: Option<&str>, name: &str, stock: i64) -> Reply {
        self.put_via(ASYNC, id, if_match, name, stock)
    }

    /// `PUT {route}/items/{id}`: [`ASYNC`] or [`BLOCKING`].
    fn put_via(
        &self,
        route: &str,
        id: i64,
        if_match: Option<&str>,
        name: &str,
        stock: i64,
    ) -> Reply {
        let body = json!({ "name": name, "stock": stock });
        self.send("PUT", &format!("{route}/items/{id}"), if_match, Some(body))
    }

    /// `POST /items/{id}/{action}` with `{"quantity": quantity}`: `sell` or `restock`.
    fn stock(&self, action: &str, id: i64, quantity: i64) -> Reply {
        let body = json!({ "quantity": quantity });
        self.send("POST", &format!("/items/{id}/{action}"), None, Some(body))
    }

    fn delete(&self, id: i64, if_match: Option<&str>) -> Reply {
        self.send("DELETE", &format!("/items/{id}"), if_match, None)
    }

    /// Creates an item and returns its id and `ETag`.
    fn create(&self, name: &str, stock: i64) -> (i64, String) {
        let reply = self.send(
            "POST",
            "/items",
            None,
            Some(json!({ "name": name, "stock": stock })),
        );
        assert_eq!(reply.status, 201, "{reply:?}");
        let id = reply.body["id"].as_i64().expect("id");
        assert_eq!(reply.location.as_deref(), Some(&*format!("/items/{id}")));
        assert_eq!(reply.etag.as_deref(), Some("\"v0\""), "{reply:?}");
        assert_eq!(
            reply.body,
            json!({ "id": id, "name": name, "stock": stock })
        );
        (id, reply.etag.unwrap())
    }
}

/// The prefix of the `PUT` on diesel-async, and of the one on blocking Diesel.
const ASYNC: &str = "";
const BLOCKING: &str = "/blocking";

/// A refusal: the status, problem+json, and the body's `status` field.
#[track_caller]
fn assert_problem(reply: &Reply, status: u16) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(
        reply.content_type.as_deref(),
        Some("application/problem+json"),
        "{reply:?}"
    );
    assert_eq!(reply.body["status"], status, "{reply:?}");
    assert!(reply.body["title"].is_string(), "{reply:?}");
    assert!(reply.body["detail"].is_string(), "{reply:?}");
}

/// How many clients the racing tests run at once, each on its own thread.
const CLIENTS: usize = 8;

/// Runs `each(i, start)` on `n` threads at once, `i` in `0..n`; `start` is a
/// barrier of all `n`, for the moment the race begins. Their results, in order.
fn race<T: Send>(n: usize, each: impl Fn(usize, &Barrier) -> T + Sync) -> Vec<T> {
    let start = Barrier::new(n);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (each, start) = (&each, &start);
                scope.spawn(move || each(i, start))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Two clients read the same item and both write with the `ETag` they read, at the
/// same moment: one wins, the other gets `412` with the current `ETag`, re-reads,
/// re-applies its change and succeeds. Both sales are in the final stock. Client
/// `i` writes through `routes[i]`: both on diesel-async, or one of them on the
/// blocking route.
fn two_clients_one_wins(url: &str, routes: [&str; 2]) {
    let (server, id) = Server::with_item(url, "widget", 10);
    let clients = [server.client(), server.client()];
    let sales = [3_i64, 5];

    let reads: Vec<Reply> = clients.iter().map(|client| client.get(id)).collect();
    for read in &reads {
        assert_eq!(read.status, 200, "{read:?}");
        assert_eq!(read.etag.as_deref(), Some("\"v0\""));
        assert_eq!(
            read.body,
            json!({ "id": id, "name": "widget", "stock": 10 })
        );
    }

    let writes: Vec<Reply> = race(2, |i, start| {
        let (client, read) = (&clients[i], &reads[i]);
        let stock = read.body["stock"].as_i64().unwrap() - sales[i];
        start.wait();
        client.put_via(routes[i], id, read.etag.as_deref(), "widget", stock)
    });
    let statuses: Vec<u16> = writes.iter().map(|w| w.status).collect();
    let winner = statuses
        .iter()
        .position(|&s| s == 200)
        .unwrap_or_else(|| panic!("one PUT must win: {writes:?}"));
    let loser = 1 - winner;
    assert_eq!(
        statuses[loser], 412,
        "exactly one 200 and one 412: {writes:?}"
    );

    let won = &writes[winner];
    assert_eq!(won.etag.as_deref(), Some("\"v1\""), "{won:?}");
    assert_eq!(won.body["stock"], 10 - sales[winner]);

    let lost = &writes[loser];
    assert_problem(lost, 412);
    assert_eq!(lost.body["title"], "Precondition Failed");
    assert_eq!(lost.body["current_etag"], "\"v1\"", "{lost:?}");
    assert_eq!(lost.etag.as_deref(), Some("\"v1\""), "{lost:?}");

    // The row holds the winner's write, not a mix and not the loser's.
    let now = clients[loser].get(id);
    assert_eq!(now.etag.as_deref(), Some("\"v1\""));
    assert_eq!(now.body["stock"], 10 - sales[winner], "{now:?}");

    // The loser re-reads and re-applies its sale: nothing is lost.
    let stock = now.body["stock"].as_i64().unwrap() - sales[loser];
    let retried = clients[loser].put_via(routes[loser], id, now.etag.as_deref(), "widget", stock);
    assert_eq!(retried.status, 200, "{retried:?}");
    assert_eq!(retried.etag.as_deref(), Some("\"v2\""));
    let last = clients[winner].get(id);
    assert_eq!(last.body["stock"], 10 - sales[0] - sales[1], "{last:?}");
    assert_eq!(last.etag.as_deref(), Some("\"v2\""));
}

/// What `If-Match` must look like, for `PUT` and `DELETE`.
fn preconditions(url: &str) {
    let server = Server::start(url);
    let client = server.client();
    let (id, v0) = client.create("gadget", 5);
    let unchanged = |client: &Client, etag: &str| {
        let now = client.get(id);
        assert_eq!(now.etag.as_deref(), Some(etag), "{now:?}");
        now
    };

    for route in [ASYNC, BLOCKING] {
        // No If-Match: 428, nothing written.
        let reply = client.put_via(route, id, None, "gadget", 1);
        assert_problem(&reply, 428);
        assert_eq!(reply.etag, None);
        assert_eq!(unchanged(&client, &v0).body["stock"], 5);

        // Malformed: 400.
        for bad in ["v0", "\"v0", "\"v0\" \"v1\"", "*, \"v0\""] {
            assert_problem(&client.put_via(route, id, Some(bad), "gadget", 1), 400);
        }
        // Only weak or foreign tags: 412, even though W/"v0" names the version.
        for unmatchable in ["W/\"v0\"", "\"0\"", "\"abc\"", "\"v99999999999\""] {
            assert_problem(
                &client.put_via(route, id, Some(unmatchable), "gadget", 1),
                412,
            );
        }
        // A stale tag: 412 with the current ETag.
        let reply = client.put_via(route, id, Some("\"v7\""), "gadget", 1);
        assert_problem(&reply, 412);
        assert_eq!(reply.body["current_etag"], "\"v0\"", "{reply:?}");
        unchanged(&client, &v0);
    }

    // The right tag, alone or in a list.
    let reply = client.put(id, Some("\"v7\", \"v0\""), "gadget", 4);
    assert_eq!(
        (reply.status, reply.etag.as_deref()),
        (200, Some("\"v1\"")),
        "{reply:?}"
    );
    assert_eq!(
        reply.body,
        json!({ "id": id, "name": "gadget", "stock": 4 })
    );
    // A list without the current version: 412 with the current ETag.
    let reply = client.put(id, Some("\"v0\", \"v7\""), "gadget", 3);
    assert_problem(&reply, 412);
    assert_eq!(reply.body["current_etag"], "\"v1\"");

    // `*`: any version; the blocking route's too.
    let reply = client.put(id, Some("*"), "renamed", 2);
    assert_eq!(
        (reply.status, reply.etag.as_deref()),
        (200, Some("\"v2\"")),
        "{reply:?}"
    );
    assert_eq!(unchanged(&client, "\"v2\"").body["name"], "renamed");
    let reply = client.put_via(BLOCKING, id, Some("*"), "renamed", 2);
    assert_eq!(reply.etag.as_deref(), Some("\"v3\""), "{reply:?}");
    let reply = client.put_via(BLOCKING, id, Some("\"v1\", \"v3\""), "renamed", 2);
    assert_eq!(reply.etag.as_deref(), Some("\"v4\""), "{reply:?}");
    let reply = client.put_via(BLOCKING, 999_999, Some("*"), "renamed", 2);
    assert_problem(&reply, 404);
    let reply = client.put(id, Some("\"v4\""), "renamed", 2);
    assert_eq!(reply.etag.as_deref(), Some("\"v5\""), "{reply:?}");

    // The body is checked after the precondition.
    let reply = client.put(id, Some("\"v5\""), "renamed", -1);
    assert_problem(&reply, 422);
    let reply = client.send(
        "PUT",
        &format!("/items/{id}"),
        Some("\"v5\""),
        Some(json!({ "name": "x", "stock": 1, "lock_version": 0 })),
    );
    assert_problem(&reply, 422);
    unchanged(&client, "\"v5\"");

    // DELETE: without If-Match 428, with a stale tag 412 and the row stays.
    assert_problem(&client.delete(id, None), 428);
    let reply = client.delete(id, Some(&v0));
    assert_problem(&reply, 412);
    assert_eq!(reply.body["current_etag"], "\"v5\"");
    assert_eq!(reply.etag.as_deref(), Some("\"v5\""));
    assert_eq!(unchanged(&client, "\"v5\"").status, 200);
    assert_problem(&client.delete(id, Some("W/\"v5\"")), 412);

    // With the current tag: 204, then it is gone.
    let reply = client.delete(id, Some("\"v5\""));
    assert_eq!(reply.status, 204, "{reply:?}");
    assert_problem(&client.get(id), 404);
    assert_problem(&client.put(id, Some("\"v5\""), "gadget", 1), 404);
    assert_problem(&client.put(id, Some("*"), "gadget", 1), 404);
    assert_problem(&client.delete(id, Some("\"v5\"")), 404);

    // `*` deletes whatever the version.
    let (other, _) = client.create("other", 1);
    assert_eq!(client.put(other, Some("\"v0\""), "other", 2).status, 200);
    assert_eq!(client.delete(other, Some("*")).status, 204);
    assert_problem(&client.get(other), 404);
}

/// `CLIENTS` threads each sell one unit: GET, then PUT `stock - 1` with the ETag,
/// again from the GET on `412`. The first round starts together, so all but one
/// lose it. Every sale lands: the final stock is the initial one less `CLIENTS`.
fn concurrent_decrements(url: &str) {
    const INITIAL: i64 = 100;
    const MAX_ATTEMPTS: u32 = 200;

    let (server, id) = Server::with_item(url, "popular", INITIAL);
    let conflicts: Vec<u32> = server.race_clients(CLIENTS, |_, client, first_read| {
        let mut conflicts = 0;
        for attempt in 1..=MAX_ATTEMPTS {
            let read = client.get(id);
            if attempt == 1 {
                first_read.wait(); // everyone has read the same version
            }
            assert_eq!(read.status, 200, "{read:?}");
            let stock = read.body["stock"].as_i64().unwrap() - 1;
            let write = client.put(id, read.etag.as_deref(), "popular", stock);
            match write.status {
                200 => return conflicts,
                412 => {
                    assert_problem(&write, 412);
                    conflicts += 1;
                    thread::sleep(Duration::from_micros(fastrand::u64(0..2000)));
                }
                _ => panic!("only 200 or 412 expected: {write:?}"),
            }
        }
        panic!("no success in {MAX_ATTEMPTS} attempts");
    });
    let total: u32 = conflicts.iter().sum();
    eprintln!("{url}: {CLIENTS} clients, {total} conflicts (412) on the way");
    assert!(
        total as usize >= CLIENTS - 1,
        "the first round, read together, has one winner: {conflicts:?}"
    );

    let last = server.client().get(id);
    assert_eq!(last.body["stock"], INITIAL - CLIENTS as i64, "{last:?}");
    assert_eq!(
        last.etag,
        Some(format!("\"v{CLIENTS}\"")),
        "one write per client"
    );
}

/// `CLIENTS` threads sell one unit each, `ROUNDS` times, all at once, with no
/// `If-Match`: each sale is `with_lock` on the server. There are fewer units than
/// sales: exactly `INITIAL` succeed, the others are `409` with nothing written,
/// and the stock ends at zero, never below. Every sale advances the version.
fn sales_never_oversell(url: &str) {
    const ROUNDS: usize = 4;
    const INITIAL: i64 = 20;

    let (server, id) = Server::with_item(url, "scarce", INITIAL);
    let sold: Vec<i64> = server.race_clients(CLIENTS, |_, client, start| {
        start.wait();
        let mut sold = 0;
        for _ in 0..ROUNDS {
            let reply = client.stock("sell", id, 1);
            match reply.status {
                200 => sold += 1,
                409 => assert_problem(&reply, 409),
                _ => panic!("only 200 or 409 expected: {reply:?}"),
            }
        }
        sold
    });
    let total: i64 = sold.iter().sum();
    eprintln!("{url}: {} sales asked, {total} made", CLIENTS * ROUNDS);
    assert_eq!(total, INITIAL, "every unit sold once, no more: {sold:?}");
    let last = server.client().get(id);
    assert_eq!(last.body["stock"], 0, "{last:?}");
    assert_eq!(last.etag, Some(format!("\"v{INITIAL}\"")), "{last:?}");

    // A client holding the ETag from before the sales is refused.
    let reply = server.client().put(id, Some("\"v0\""), "scarce", 100);
    assert_problem(&reply, 412);
    // Bad quantities: 422, nothing written.
    assert_problem(&server.client().stock("sell", id, 0), 422);
    assert_problem(&server.client().stock("restock", id, -3), 422);
    assert_problem(&server.client().stock("sell", 999_999, 1), 404);
}

/// `CLIENTS` threads restock at once, `ROUNDS` times each: a read and an
/// optimistic write in `transaction_with_retry`, run again on conflict. A `503`
/// (every attempt met a conflict) wrote nothing and is sent again. The stock
/// ends at the initial one plus every restock that got `200`, the version one
/// higher per restock.
fn restocks_add_up(url: &str) {
    const ROUNDS: i64 = 5;
    const MAX_SENDS: u32 = 100;

    let (server, id) = Server::with_item(url, "restocked", 0);
    let refused: Vec<u32> = server.race_clients(CLIENTS, |i, client, start| {
        start.wait();
        let mut refused = 0;
        for _ in 0..ROUNDS {
            for send in 1..=MAX_SENDS {
                let reply = client.stock("restock", id, i as i64 + 1);
                match reply.status {
                    200 => break,
                    503 => {
                        assert_problem(&reply, 503);
                        refused += 1;
                        assert!(send < MAX_SENDS, "no restock in {MAX_SENDS} sends");
                    }
                    _ => panic!("only 200 or 503 expected: {reply:?}"),
                }
            }
        }
        refused
    });
    let expected: i64 = (1..=CLIENTS as i64).map(|q| q * ROUNDS).sum();
    eprintln!(
        "{url}: {} restocks, {} refused after every retry",
        CLIENTS as i64 * ROUNDS,
        refused.iter().sum::<u32>()
    );
    let last = server.client().get(id);
    assert_eq!(last.body["stock"], expected, "{last:?}");
    assert_eq!(
        last.etag,
        Some(format!("\"v{}\"", CLIENTS as i64 * ROUNDS)),
        "one write per restock"
    );
}

/// A client sends a sale and goes away while its handler holds the row's lock
/// (`with_lock`, in a sale that waits a minute before it writes). Its handler's
/// future is dropped with the transaction open; the pool closes that connection,
/// which ends the transaction. The next sale, through a second server on the same
/// database, gets the row long before the minute is up, and the abandoned sale
/// wrote nothing.
fn client_gone_mid_sale(url: &str) {
    let slow = Server::start_with(
        url,
        http_api::Config {
            sale_delay: Duration::from_secs(60),
            ..config()
        },
    );
    let other = Server::start_with(
        url,
        http_api::Config {
            lock_timeout: Duration::from_secs(1),
            ..config()
        },
    );
    let client = other.client();
    let (id, _) = client.create("contended", 10);

    // The sale that will be abandoned, on a raw connection we can drop.
    let addr = slow.base.trim_start_matches("http://");
    let mut gone = TcpStream::connect(addr).expect("connect");
    let body = r#"{"quantity": 5}"#;
    write!(
        gone,
        "POST /items/{id}/sell HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");

    // Wait until it holds the lock: a sale of more than the stock is `409`
    // (nothing written) while the row is free, `503` once it is locked.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reply = client.stock("sell", id, 1000);
        match reply.status {
            503 => break,
            409 => {}
            _ => panic!("only 409 or 503 expected: {reply:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the slow sale never took the lock"
        );
        thread::sleep(Duration::from_millis(20));
    }

    // The client goes away: no response ever reached it.
    gone.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0; 1];
    assert!(gone.read(&mut buf).is_err(), "the slow sale answered early");
    drop(gone);
    let dropped = Instant::now();

    // The next sale gets the row, within seconds rather than the minute.
    let sold = loop {
        let reply = client.stock("sell", id, 3);
        match reply.status {
            200 => break reply,
            503 => assert!(
                dropped.elapsed() < Duration::from_secs(20),
                "the row stayed locked after the client left: {reply:?}"
            ),
            _ => panic!("only 200 or 503 expected: {reply:?}"),
        }
    };
    eprintln!(
        "{url}: the row was free again {:?} after the client left",
        dropped.elapsed()
    );
    assert_eq!(
        sold.body["stock"], 7,
        "the abandoned sale wrote nothing: {sold:?}"
    );
    // The abandoned sale's version bump (v0 -> v1) was rolled back with its
    // connection; lockkit's journal never commits a number a rolled-back write
    // left behind, so the next sale may land past v1. The client is told the
    // version it now has.
    assert_ne!(sold.etag.as_deref(), Some("\"v0\""), "{sold:?}");
    let now = client.get(id);
    assert_eq!(now.body["stock"], 7, "{now:?}");
    assert_eq!(now.etag, sold.etag, "{now:?}");
}

/// Names no column can hold are a `422`, on `POST` and both `PUT` routes, and
/// nothing is written: longer than 255 characters (MySQL/MariaDB's
/// `VARCHAR(255)` refuses the 256th), or with a NUL (PostgreSQL's `text`
/// refuses it). The limit counts characters, not bytes: 255 two-byte ones fit.
/// Without the check the database refused them, a `500`, on those backends.
fn names_no_column_can_hold(url: &str) {
    let (server, id) = Server::with_item(url, "gadget", 5);
    let client = server.client();
    let fits = "é".repeat(255);
    let bad = ["x".repeat(256), "é".repeat(256), "a\u{0}b".to_owned()];
    for name in &bad {
        let reply = client.send(
            "POST",
            "/items",
            None,
            Some(json!({ "name": name, "stock": 1 })),
        );
        assert_problem(&reply, 422);
        for route in [ASYNC, BLOCKING] {
            assert_problem(&client.put_via(route, id, Some("\"v0\""), name, 1), 422);
        }
    }
    let now = client.get(id);
    assert_eq!(now.etag.as_deref(), Some("\"v0\""), "{now:?}");
    assert_eq!(now.body["name"], "gadget", "{now:?}");
    // Only the item made at the start: no refused `POST` wrote a row.
    assert_problem(&client.get(id + 1), 404);

    let (long, _) = client.create(&fits, 1);
    assert_eq!(client.get(long).body["name"], fits.as_str());
    // Any script, also beyond the Basic Multilingual Plane: on MySQL/MariaDB
    // the table is `utf8mb4` whatever the database's default character set.
    let (crab, _) = client.create("🦀 mug", 1);
    assert_eq!(client.get(crab).body["name"], "🦀 mug");
    let reply = client.put(id, Some("\"v0\""), &fits, 2);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(client.get(id).body["name"], fits.as_str());
}

lockkit_tests::url_tests! {
    fn names_no_column_can_hold(url) { super::names_no_column_can_hold(url) }
    fn two_clients_one_wins(url) { super::two_clients_one_wins(url, [super::ASYNC, super::ASYNC]) }
    fn two_clients_one_wins_one_blocking(url) { super::two_clients_one_wins(url, [super::ASYNC, super::BLOCKING]) }
    fn preconditions(url) { super::preconditions(url) }
    fn concurrent_decrements(url) { super::concurrent_decrements(url) }
    fn sales_never_oversell(url) { super::sales_never_oversell(url) }
    fn restocks_add_up(url) { super::restocks_add_up(url) }
    fn client_gone_mid_sale(url) { super::client_gone_mid_sale(url) }
}
