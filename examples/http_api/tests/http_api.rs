//! The items API over real HTTP, on every backend: the server listens on
//! 127.0.0.1 (port 0, so the tests run in parallel) and blocking `ureq` clients
//! talk to it, each from its own thread when they race.
//!
//! Each test runs in an empty database of its own from
//! [`lockkit_tests::TestDb::empty`]: a temporary SQLite file, or a database on the
//! PostgreSQL and MySQL/MariaDB servers named by `PG_DATABASE_URL` and
//! `MYSQL_DATABASE_URL`, removed at the end. A server that cannot be reached fails
//! the test; nothing is skipped.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

/// The service, on its own tokio runtime, listening on 127.0.0.1 at a free port.
struct Server {
    base: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Server {
    fn start(url: &str) -> Server {
        let config = http_api::Config {
            pool_size: 8,
            connection_timeout: Duration::from_secs(10),
        };
        let app = http_api::connect(url, &config).unwrap_or_else(|e| panic!("{url}: {e}"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
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
        let body = json!({ "name": name, "stock": stock });
        self.send("PUT", &format!("/items/{id}"), if_match, Some(body))
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

/// Two clients read the same item and both write with the `ETag` they read, at the
/// same moment: one wins, the other gets `412` with the current `ETag`, re-reads,
/// re-applies its change and succeeds. Both sales are in the final stock.
fn two_clients_one_wins(url: &str) {
    let server = Server::start(url);
    let (id, _) = server.client().create("widget", 10);
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

    let start = Barrier::new(2);
    let writes: Vec<Reply> = thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let (client, read, start) = (&clients[i], &reads[i], &start);
                scope.spawn(move || {
                    let stock = read.body["stock"].as_i64().unwrap() - sales[i];
                    start.wait();
                    client.put(id, read.etag.as_deref(), "widget", stock)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
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
    let retried = clients[loser].put(id, now.etag.as_deref(), "widget", stock);
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

    // No If-Match: 428, nothing written.
    let reply = client.put(id, None, "gadget", 1);
    assert_problem(&reply, 428);
    assert_eq!(reply.etag, None);
    assert_eq!(unchanged(&client, &v0).body["stock"], 5);

    // Malformed: 400.
    for bad in ["v0", "\"v0", "\"v0\" \"v1\"", "*, \"v0\""] {
        assert_problem(&client.put(id, Some(bad), "gadget", 1), 400);
    }
    // Only weak or foreign tags: 412, even though W/"v0" names the version.
    for unmatchable in ["W/\"v0\"", "\"0\"", "\"abc\"", "\"v99999999999\""] {
        assert_problem(&client.put(id, Some(unmatchable), "gadget", 1), 412);
    }
    unchanged(&client, &v0);

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

    // `*`: any version.
    let reply = client.put(id, Some("*"), "renamed", 2);
    assert_eq!(
        (reply.status, reply.etag.as_deref()),
        (200, Some("\"v2\"")),
        "{reply:?}"
    );
    assert_eq!(unchanged(&client, "\"v2\"").body["name"], "renamed");

    // The body is checked after the precondition.
    let reply = client.put(id, Some("\"v2\""), "renamed", -1);
    assert_problem(&reply, 422);
    let reply = client.send(
        "PUT",
        &format!("/items/{id}"),
        Some("\"v2\""),
        Some(json!({ "name": "x", "stock": 1, "lock_version": 0 })),
    );
    assert_problem(&reply, 422);
    unchanged(&client, "\"v2\"");

    // DELETE: without If-Match 428, with a stale tag 412 and the row stays.
    assert_problem(&client.delete(id, None), 428);
    let reply = client.delete(id, Some(&v0));
    assert_problem(&reply, 412);
    assert_eq!(reply.body["current_etag"], "\"v2\"");
    assert_eq!(reply.etag.as_deref(), Some("\"v2\""));
    assert_eq!(unchanged(&client, "\"v2\"").status, 200);
    assert_problem(&client.delete(id, Some("W/\"v2\"")), 412);

    // With the current tag: 204, then it is gone.
    let reply = client.delete(id, Some("\"v2\""));
    assert_eq!(reply.status, 204, "{reply:?}");
    assert_problem(&client.get(id), 404);
    assert_problem(&client.put(id, Some("\"v2\""), "gadget", 1), 404);
    assert_problem(&client.put(id, Some("*"), "gadget", 1), 404);
    assert_problem(&client.delete(id, Some("\"v2\"")), 404);

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
    const CLIENTS: usize = 8;
    const INITIAL: i64 = 100;
    const MAX_ATTEMPTS: u32 = 200;

    let server = Server::start(url);
    let (id, _) = server.client().create("popular", INITIAL);
    let first_read = Barrier::new(CLIENTS);
    let conflicts: Vec<u32> = thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (server, first_read) = (&server, &first_read);
                scope.spawn(move || {
                    let client = server.client();
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
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
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

lockkit_tests::url_tests! {
    fn two_clients_one_wins(url) { super::two_clients_one_wins(url) }
    fn preconditions(url) { super::preconditions(url) }
    fn concurrent_decrements(url) { super::concurrent_decrements(url) }
}
