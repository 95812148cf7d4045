//! lockkit's axum glue over real HTTP, on every backend: an axum router on a
//! tokio runtime listening on 127.0.0.1 (port 0), blocking `ureq` clients, each
//! racing client on its own thread, and the rows and idempotency keys in a real
//! database of the test's own.
//!
//! * bound ETags: a tag fits only its own resource at its version; forged,
//!   altered and plain tags are refused; racing writers with one tag: one wins,
//!   nothing is lost; `If-None-Match` answers 304;
//! * idempotency keys per principal through the `Idempotency-Key` extractor;
//! * a version from the body is 409; a busy row is 503 with `Retry-After`.

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel_migrations::MigrationHarness;
use lockkit::axum::{BodyVersionError, HttpError, IdempotencyKey, IfMatchTags, IfNoneMatch};
use lockkit::etag::{ETagSecret, ResourceTags};
use lockkit::idempotency::{fingerprint, Idempotency, Outcome};
use lockkit::prelude::*;
use lockkit::LockOptions;
use lockkit_tests::models::Item;
use lockkit_tests::schema::items;
use lockkit_tests::{idempotency_migrations, seed_items, stock_of};
use serde_json::{json, Value};

/// A router served on its own tokio runtime at 127.0.0.1 on a free port; dropping
/// it stops the server.
struct Server {
    base: String,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    fn start(app: Router) -> Server {
        let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"));
        let listener = listener.expect("bind 127.0.0.1:0");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        runtime.spawn(async move { axum::serve(listener, app).await });
        Server {
            base,
            _runtime: runtime,
        }
    }

    /// One request on a fresh connection: status, `ETag`, `Retry-After`, body.
    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(0)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = agent
            .run(request.body(body.to_owned()).expect("request"))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let header = |name: &str| {
            let value = response.headers().get(name)?;
            Some(value.to_str().expect("ASCII").to_owned())
        };
        let (etag, retry_after) = (header("etag"), header("retry-after"));
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().expect("body");
        Reply {
            status,
            etag,
            retry_after,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    etag: Option<String>,
    retry_after: Option<String>,
    body: Value,
}

const SECRET: &[u8] = b"the test server's ETag secret, 32+ bytes";

fn tags_of(id: i32) -> ResourceTags {
    ETagSecret::new(SECRET).unwrap().resource("items", id)
}

/// Runs blocking database work off the async workers.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.expect("no panic")
}

/// The principal: in a real service, who the request authenticated as.
fn principal(headers: &HeaderMap) -> Result<String, HttpError> {
    headers
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or(HttpError(lockkit::Error::InvalidInput("no client")))
}

/// A `PUT` of item 1 on `$conn` sent with item 1's bound tag at version 0,
/// whose write also runs `$other` (on `$c`, its connection), a stale write of
/// a row at version 5: refused with 412, and never with item 1's tag at 5. A
/// client handed that tag, never read, would write over other writers'
/// changes once they bring item 1 to 5. Evaluates to item 1's tags.
macro_rules! refused_without_the_other_rows_tag {
    ($conn:ident, |$c:ident| $other:block) => {{
        let tags = tags_of(1);
        let read = |c: &mut Conn| -> Result<i32, lockkit::Error> {
            Ok(items::table.find(1).select(items::lock_version).first(c)?)
        };
        let write_both = |$c: &mut Conn, v: i32| {
            $c.transaction(|$c| {
                Item::update_by_version($c, 1, v, items::stock.eq(1))?;
                $other
            })
        };
        let sent = IfMatchTags(tags.etag(0).to_string().parse().unwrap());
        let refused = sent
            .apply(&tags, &mut *$conn, read, write_both)
            .unwrap_err();
        assert_eq!(refused.status, 412, "{refused:?}");
        assert_ne!(
            refused.current_etag,
            Some(tags.etag(5).to_string()),
            "the other row's version, bound to item 1"
        );
        diesel::sql_query("UPDATE items SET stock = 3, lock_version = 5 WHERE id = 1")
            .execute(&mut *$conn)
            .unwrap();
        if let Some(handed) = refused.current_etag {
            let again = IfMatchTags(handed.parse().unwrap());
            let overwrite = again.apply(&tags, &mut *$conn, read, |c, v| {
                Item::update_by_version(c, 1, v, items::stock.eq(0))
            });
            assert!(overwrite.is_err(), "{overwrite:?}");
        }
        assert_eq!(
            stock_of!(&mut *$conn, 1),
            3,
            "the other writers' change stands"
        );
        tags
    }};
}

lockkit_tests::backend_tests! {
    fn bound_etags_fit_their_own_resource_only(db) {
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        type Db = Pool<ConnectionManager<Conn>>;

        /// `GET /items/{id}`: the stock with the item's bound tag, or 304.
        async fn get_item(State(db): State<Db>, Path(id): Path<i32>, if_none_match: IfNoneMatch) -> Result<Response, HttpError> {
            let item: Item = blocking(move || items::table.find(id).first(&mut db.get().unwrap())).await.map_err(lockkit::Error::from)?;
            let tags = tags_of(id);
            if if_none_match.not_modified_bound(&tags, item.lock_version) {
                return Ok((StatusCode::NOT_MODIFIED, tags.etag(item.lock_version)).into_response());
            }
            Ok((tags.etag(item.lock_version), Json(json!({ "stock": item.stock }))).into_response())
        }

        /// `PUT /items/{id}/stock/{stock}` with the item's bound tag in `If-Match`.
        async fn set_stock(State(db): State<Db>, Path((id, stock)): Path<(i32, i32)>, if_match: IfMatchTags) -> Response {
            blocking(move || {
                let tags = tags_of(id);
                let written = if_match.apply(
                    &tags,
                    &mut *db.get().unwrap(),
                    |conn| Ok(items::table.find(id).select(items::lock_version).first(conn)?),
                    |conn, expected| Item::update_by_version(conn, id, expected, items::stock.eq(stock)),
                );
                match written {
                    Ok(version) => tags.etag(version).into_response(),
                    Err(problem) => problem.into_response(),
                }
            })
            .await
        }

        let server = Server::start(
            Router::new()
                .route("/items/{id}", get(get_item))
                .route("/items/{id}/stock/{stock}", put(set_stock))
                .with_state(db.pool()),
        );
        let tag_of = |id: i32| server.send("GET", &format!("/items/{id}"), &[], "").etag.unwrap();
        let (tag_1, tag_2) = (tag_of(1), tag_of(2));
        assert_ne!(tag_1, tag_2, "both at version 0, but two resources");
        assert!(!tag_1.contains("v0"), "{tag_1}: no version inside");

        // 304 for the current tag, 200 for another.
        let fresh = server.send("GET", "/items/1", &[("If-None-Match", &tag_1)], "");
        assert_eq!((fresh.status, fresh.etag.as_deref()), (304, Some(&*tag_1)));
        let other = server.send("GET", "/items/1", &[("If-None-Match", &tag_2)], "");
        assert_eq!((other.status, &other.body), (200, &json!({ "stock": 10 })));

        // Item 1's tag on item 2 (same version): refused, item 2 untouched.
        let refused = server.send("PUT", "/items/2/stock/0", &[("If-Match", &tag_1)], "");
        assert_eq!((refused.status, refused.etag.as_deref()), (412, Some(&*tag_2)), "{refused:?}");
        assert_eq!(stock_of!(&mut db.conn(), 2), 10);
        assert!(!refused.body.to_string().contains("v0"), "{}", refused.body);

        // Forged, altered, plain and weak tags: 412; no header 428; garbage 400.
        let mut altered = tag_1.clone();
        let last = if altered.ends_with("0\"") { "1\"" } else { "0\"" };
        altered.replace_range(altered.len() - 2.., last);
        let forged = format!("\"{}\"", "ab".repeat(16));
        let weak = format!("W/{tag_1}");
        for (header, status) in [
            (Some(&*altered), 412),
            (Some(&*forged), 412),
            (Some("\"v0\""), 412),
            (Some(&*weak), 412),
            (None, 428),
            (Some("v0"), 400),
        ] {
            let headers: Vec<(&str, &str)> = header.map(|h| ("If-Match", h)).into_iter().collect();
            let reply = server.send("PUT", "/items/1/stock/0", &headers, "");
            assert_eq!(reply.status, status, "{header:?}: {reply:?}");
        }
        assert_eq!(stock_of!(&mut db.conn(), 1), 10, "nothing was written");

        // Racing writers holding the same tag: exactly one writes; the others are
        // told their copy is old; the row holds the winner's value.
        const CLIENTS: i32 = 6;
        let barrier = Barrier::new(CLIENTS as usize);
        let replies: Vec<(i32, Reply)> = thread::scope(|s| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|n| {
                    let (server, barrier, tag) = (&server, &barrier, &tag_1);
                    s.spawn(move || {
                        barrier.wait();
                        (100 + n, server.send("PUT", &format!("/items/1/stock/{}", 100 + n), &[("If-Match", tag)], ""))
                    })
                })
                .collect();
            clients.into_iter().map(|c| c.join().unwrap()).collect()
        });
        let winners: Vec<_> = replies.iter().filter(|(_, r)| r.status == 200).collect();
        assert_eq!(winners.len(), 1, "{replies:?}");
        assert!(replies.iter().all(|(_, r)| r.status == 200 || r.status == 412), "{replies:?}");
        assert_eq!(stock_of!(&mut db.conn(), 1), winners[0].0, "the winner's write stands");
        let new_tag = winners[0].1.etag.clone().unwrap();
        assert_eq!(tag_of(1), new_tag);
        let next = server.send("PUT", "/items/1/stock/7", &[("If-Match", &new_tag)], "");
        assert_eq!(next.status, 200, "{next:?}");
        let star = server.send("PUT", "/items/2/stock/8", &[("If-Match", "*")], "");
        assert_eq!(star.status, 200, "{star:?}");
        assert_eq!((stock_of!(&mut db.conn(), 1), stock_of!(&mut db.conn(), 2)), (7, 8));
    }

    fn idempotency_keys_over_http_belong_to_their_client(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        type Db = Pool<ConnectionManager<Conn>>;

        /// `POST /orders` (and `/orders/express`): sells one of item 1, once per key
        /// of each client.
        async fn order(State(db): State<Db>, method: Method, uri: Uri, headers: HeaderMap, key: IdempotencyKey, body: Bytes) -> Result<(StatusCode, Json<Value>), HttpError> {
            let client = principal(&headers)?;
            let request = fingerprint(method.as_str(), uri.path(), &body);
            let outcome = blocking(move || {
                Idempotency::default().run(&mut db.get().unwrap(), &client, &key.0, &request, |conn| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1)).execute(conn)?;
                    let left: i32 = items::table.find(1).select(items::stock).first(conn)?;
                    Ok::<_, lockkit::Error>(json!({ "for": client, "left": left }))
                })
            })
            .await?;
            let status = if matches!(outcome, Outcome::Ran(_)) { StatusCode::CREATED } else { StatusCode::OK };
            Ok((status, Json(outcome.into_inner())))
        }

        let server = Server::start(
            Router::new()
                .route("/orders", post(order))
                .route("/orders/express", post(order))
                .with_state(db.pool()),
        );
        let body = r#"{"item":1,"qty":1}"#;
        let post = |client: &str, path: &str, key: Option<&str>| {
            let mut headers = vec![("X-Client", client)];
            headers.extend(key.map(|k| ("Idempotency-Key", k)));
            server.send("POST", path, &headers, body)
        };
        let a = post("a", "/orders", Some("\"order-1\""));
        assert_eq!((a.status, &a.body), (201, &json!({ "for": "a", "left": 9 })));
        // Client B sends A's key with the same body: its own order, not A's response.
        let b = post("b", "/orders", Some("order-1"));
        assert_eq!((b.status, &b.body), (201, &json!({ "for": "b", "left": 8 })));
        // Each repeat replays its own client's response; nothing more is sold.
        assert_eq!(post("a", "/orders", Some("order-1")).body, json!({ "for": "a", "left": 9 }));
        assert_eq!(post("b", "/orders", Some("order-1")).body, json!({ "for": "b", "left": 8 }));
        // The same key and body on another endpoint is another request: 422.
        let elsewhere = post("a", "/orders/express", Some("order-1"));
        assert_eq!(elsewhere.status, 422, "{elsewhere:?}");
        // No key, or a malformed one: 400 before anything runs.
        for key in [None, Some(""), Some("two words"), Some("\"open")] {
            let reply = post("a", "/orders", key);
            assert_eq!(reply.status, 400, "{key:?}: {reply:?}");
            assert_eq!(reply.body["title"], "Bad Request");
        }
        assert_eq!(stock_of!(&mut db.conn(), 1), 8, "two orders, one per client");
    }

    fn body_versions_are_409_and_busy_rows_503_with_retry_after(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        type Db = Pool<ConnectionManager<Conn>>;

        /// `PUT /items/{id}` with `{"version": n, "stock": s}`.
        async fn put_item(State(db): State<Db>, Path(id): Path<i32>, Json(form): Json<Value>) -> Result<Json<Value>, BodyVersionError> {
            let version = form["version"].as_i64().unwrap_or(-1) as i32;
            let stock = form["stock"].as_i64().unwrap_or(0) as i32;
            let new = blocking(move || Item::update_by_version(&mut db.get().unwrap(), id, version, items::stock.eq(stock))).await?;
            Ok(Json(json!({ "version": new })))
        }

        /// `POST /items/{id}/sell`: sells one under a row lock, NOWAIT.
        async fn sell(State(db): State<Db>, Path(id): Path<i32>) -> Result<Json<Value>, HttpError> {
            let left = blocking(move || {
                lockkit::with_lock(&mut db.get().unwrap(), id, LockOptions::default().nowait(), |conn, item: Item| {
                    diesel::update(items::table.find(id)).set(items::stock.eq(items::stock - 1)).execute(conn)?;
                    Ok::<_, lockkit::Error>(item.stock - 1)
                })
            })
            .await?;
            Ok(Json(json!({ "left": left })))
        }

        let server = Server::start(
            Router::new()
                .route("/items/{id}", put(put_item))
                .route("/items/{id}/sell", post(sell))
                .with_state(db.pool()),
        );
        let json_body = [("Content-Type", "application/json")];
        let ok = server.send("PUT", "/items/1", &json_body, r#"{"version":0,"stock":5}"#);
        assert_eq!((ok.status, &ok.body), (200, &json!({ "version": 1 })));
        let stale = server.send("PUT", "/items/1", &json_body, r#"{"version":0,"stock":6}"#);
        assert_eq!(stale.status, 409, "{stale:?}");
        assert_eq!((stale.body["title"].as_str(), stale.body["current_version"].as_i64()), (Some("Conflict"), Some(1)));
        assert_eq!(stale.retry_after, None);
        assert_eq!(stock_of!(&mut db.conn(), 1), 5, "the stale write lost nothing");

        // Another connection holds the row: NOWAIT is Busy, 503 with Retry-After.
        let busy = db.while_holding(
            |conn, wait| {
                lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| {
                    wait();
                    Ok::<_, lockkit::Error>(())
                })
                .unwrap();
            },
            || server.send("POST", "/items/1/sell", &[], ""),
        );
        assert_eq!((busy.status, busy.retry_after.as_deref()), (503, Some("1")), "{busy:?}");
        assert_eq!(busy.body["title"], "Service Unavailable");
        let sold = server.send("POST", "/items/1/sell", &[], "");
        assert_eq!((sold.status, &sold.body), (200, &json!({ "left": 4 })));
    }

    /// What a client sends can make a write fail, never the server: a bulk
    /// write of rows another client changed is 412 (409 with the versions in
    /// the body), a row named twice 400, and a made-up tag at the version
    /// type's maximum 409. None of them is a 500, and none writes anything.
    fn a_clients_versions_are_refused_with_4xx_never_500(db) {
        use lockkit::etag::{self, Problem, VersionIn};
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10)]);
        Item::update_by_version(&mut conn, 2, 0, items::stock.eq(9)).unwrap();

        let stale_rows = Item::update_all_by_version(&mut conn, &[(1, 0), (2, 0)], items::stock.eq(0)).unwrap_err();
        assert!(matches!(stale_rows, lockkit::Error::StaleRows(_)), "{stale_rows:?}");
        let problem = Problem::from_error(&stale_rows);
        assert_eq!((problem.status, problem.title), (412, "Precondition Failed"), "{problem:?}");
        assert!(!problem.detail.contains("items"), "no table names for clients: {}", problem.detail);
        assert_eq!(etag::status_for_version_in(&stale_rows, VersionIn::Body), 409);

        let twice = Item::update_all_by_version(&mut conn, &[(1, 0), (1, 0)], items::stock.eq(0)).unwrap_err();
        assert!(matches!(twice, lockkit::Error::DuplicateKey { .. }), "{twice:?}");
        assert_eq!(Problem::from_error(&twice).status, 400);

        let made_up = etag::expected_version::<i32>(Some("\"v2147483647\"")).unwrap();
        let overflow = made_up
            .apply(&mut conn, |c| items::table.find(1).select(items::lock_version).first(c).map_err(lockkit::Error::from), |c, v| Item::update_by_version(c, 1, v, items::stock.eq(0)))
            .unwrap_err();
        assert!(matches!(overflow, lockkit::Error::VersionOverflow { .. }), "{overflow:?}");
        let problem = Problem::from_error(&overflow);
        assert_eq!(problem.status, 409, "{problem:?}");
        assert!(!problem.detail.contains("items"), "no table names for clients: {}", problem.detail);
        // A list of tags, none current, one of them made up at the maximum:
        // the precondition is false, as for any stale list (412 with the
        // current ETag), not a tag no write can follow (409).
        let listed = etag::expected_version::<i32>(Some("\"v5\", \"v2147483647\"")).unwrap();
        let stale = listed
            .apply(&mut conn, |c| items::table.find(1).select(items::lock_version).first(c).map_err(lockkit::Error::from), |c, v| Item::update_by_version(c, 1, v, items::stock.eq(0)))
            .unwrap_err();
        assert!(matches!(stale, lockkit::Error::Stale(_)), "{stale:?}");
        assert_eq!(Problem::from_error(&stale).status, 412);
        assert_eq!((stock_of!(&mut conn, 1), stock_of!(&mut conn, 2)), (10, 9), "nothing written");
    }
    /// A 412 hands a bound tag only for the resource's own row: a handler's
    /// write that also writes another row from a stale copy must not give the
    /// client this resource's tag at the other row's version.
    fn a_refusal_never_binds_another_rows_version_to_this_resource(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10)]);
        diesel::sql_query("UPDATE items SET lock_version = 5 WHERE id = 2").execute(&mut conn).unwrap();
        refused_without_the_other_rows_tag!(conn, |c| {
            Item::update_by_version(c, 2, 0, items::stock.eq(1)) // a stale copy of item 2
        });
    }

    /// Another row the write also wrote, deleted meanwhile: the refusal is a
    /// failed precondition (412, no tag), not this resource's 404, which the
    /// client would take for "item 1 is gone".
    fn a_refusal_for_another_rows_deletion_is_not_this_resources_404(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10)]);
        diesel::sql_query("DELETE FROM items WHERE id = 2").execute(&mut conn).unwrap();
        let tags = tags_of(1);
        let read = |c: &mut Conn| -> Result<i32, lockkit::Error> { Ok(items::table.find(1).select(items::lock_version).first(c)?) };
        let sent = IfMatchTags(tags.etag(0).to_string().parse().unwrap());
        let refused = sent
            .apply(&tags, &mut *conn, read, |c, v| {
                c.transaction(|c| {
                    Item::update_by_version(c, 1, v, items::stock.eq(1))?;
                    Item::update_by_version(c, 2, 0, items::stock.eq(1)) // item 2, deleted
                })
            })
            .unwrap_err();
        assert_eq!((refused.status, refused.current_etag.clone()), (412, None), "{refused:?}");
        assert_eq!(stock_of!(&mut conn, 1), 10, "nothing written");
        // Item 1's own deletion is still its 404.
        let gone = IfMatchTags(tags.etag(0).to_string().parse().unwrap())
            .apply(&tags, &mut *conn, |_| Ok(0), |c, v| {
                diesel::sql_query("DELETE FROM items WHERE id = 1").execute(c)?;
                Item::update_by_version(c, 1, v, items::stock.eq(1))
            })
            .unwrap_err();
        assert_eq!(gone.status, 404, "{gone:?}");
    }

    /// As above, for a row of another table that the application's Rust code
    /// names as this one: a `table!` module also called `items` (another
    /// schema's, or one that `sql_name` renames) is another table, and its
    /// row 1 is not this resource.
    fn a_refusal_never_binds_another_tables_version_to_this_resource(db) {
        mod archive {
            diesel::table! {
                #[sql_name = "items_archive"]
                items (id) {
                    id -> Integer,
                    stock -> Integer,
                    lock_version -> Integer,
                }
            }
        }
        #[derive(Queryable, Selectable, Identifiable, AsChangeset, Versioned)]
        #[diesel(table_name = archive::items)]
        struct ArchivedItem {
            id: i32,
            stock: i32,
            lock_version: i32,
        }
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        diesel::sql_query("CREATE TABLE items_archive (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL, lock_version INTEGER NOT NULL)").execute(&mut conn).unwrap();
        diesel::sql_query("INSERT INTO items_archive (id, stock, lock_version) VALUES (1, 10, 5)").execute(&mut conn).unwrap();
        let tags = refused_without_the_other_rows_tag!(conn, |c| {
            ArchivedItem::update_by_version(c, 1, 0, archive::items::stock.eq(1)) // a stale copy of the archived row 1
        });
        let read = |c: &mut Conn| -> Result<i32, lockkit::Error> { Ok(items::table.find(1).select(items::lock_version).first(c)?) };
        // The resource's own stale report (another writer got in between the
        // check and the write) still hands out its current tag.
        let own = IfMatchTags(tags.etag(5).to_string().parse().unwrap());
        let raced = own.apply(&tags, &mut *conn, read, |c, v| {
            diesel::sql_query("UPDATE items SET lock_version = 6 WHERE id = 1").execute(c)?;
            Item::update_by_version(c, 1, v, items::stock.eq(0))
        });
        let refused = raced.unwrap_err();
        assert_eq!((refused.status, refused.current_etag), (412, Some(tags.etag(6).to_string())));
    }
}
