//! The closures of lockkit's calls return the caller's own error type, as Diesel's
//! `transaction` does: a `thiserror` enum with a `#[from] lockkit::Error` variant
//! flows through every closure-taking call untouched (the locks, the retries,
//! idempotency keys, `If-Match`, the adaptive update, the outbox's relay and
//! inbox, leases and fenced writes, the replica router's write), the call's
//! transaction is rolled back on it (and on a panic), a lease is released, and
//! the retrying calls ask it which errors are worth another attempt. lockkit's
//! own errors reach the caller inside it. That type is [`ShopError`], with its
//! `RetryableError` impl. `tests/async_user_errors.rs` shows the same for the
//! diesel-async calls (`async_locking.rs` for the async `with_lock`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use diesel::prelude::*;
use lockkit::adaptive::AdaptivePolicy;
use lockkit::axum::{IfMatchTags, IfMatchVersion};
use lockkit::etag::{ETagSecret, Expected};
use lockkit::idempotency::{Idempotency, Outcome};
use lockkit::lease::{self, Fence};
use lockkit::outbox::schema::lockkit_outbox;
use lockkit::outbox::{self, Inbox, OutboxMessage, Received, Relay};
use lockkit::prelude::*;
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{lease_migrations, outbox_migrations, seed_items, stock_of, ShopError};

/// A response stored by an idempotency key: any `Serialize + DeserializeOwned`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: i64,
    left: i32,
    note: String,
}

/// Takes 8 of item `id` under its row lock, or refuses with the caller's error.
macro_rules! take_eight {
    ($conn:expr, $id:expr) => {{
        let id: i32 = $id;
        lockkit::with_lock($conn, id, LockOptions::default(), |conn, item: Item| {
            if item.stock < 8 {
                return Err(ShopError::NotEnough(item.stock));
            }
            diesel::update(items::table.find(id))
                .set(items::stock.eq(item.stock - 8))
                .execute(conn)?;
            Ok(item.stock - 8)
        })
    }};
}

lockkit_tests::backend_tests! {
    fn with_lock_hands_back_the_callers_error_and_rolls_back(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        assert_eq!(take_eight!(&mut conn, 1).unwrap(), 2);
        // The closure wrote before refusing: the write is rolled back.
        let item: Item = items::table.find(1).first(&mut conn).unwrap();
        let refused = item.with_lock(&mut conn, |conn, fresh| {
            diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(conn)?;
            Err::<(), _>(ShopError::NotEnough(fresh.stock))
        });
        assert!(matches!(refused, Err(ShopError::NotEnough(2))), "{refused:?}");
        assert_eq!(stock_of!(&mut conn, 1), 2, "rolled back");
        // lockkit's own errors arrive in the caller's type.
        let missing = take_eight!(&mut conn, 99);
        assert!(matches!(missing, Err(ShopError::Lock(Error::NotFound))), "{missing:?}");
    }

    fn concurrent_buyers_with_their_own_error_type_lose_nothing(db) {
        seed_items(&mut db.conn(), &[(1, 80)]);
        let (sold, refused) = thread::scope(|s| {
            let buyers: Vec<_> = (0..4)
                .map(|_| {
                    let db = &db;
                    s.spawn(move || {
                        let mut conn = db.connect();
                        let (mut sold, mut refused) = (0, 0);
                        for _ in 0..4 {
                            match take_eight!(&mut conn, 1) {
                                Ok(_) => sold += 8,
                                Err(ShopError::NotEnough(_)) => refused += 1,
                                Err(other) => panic!("{other:?}"),
                            }
                        }
                        (sold, refused)
                    })
                })
                .collect();
            buyers.into_iter().map(|b| b.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
        });
        assert_eq!((sold, refused), (80, 6));
        assert_eq!(stock_of!(&mut db.conn(), 1), 0);
    }

    fn a_panic_with_the_callers_error_type_still_rolls_back(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Result<(), ShopError> = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(conn)?;
                panic!("in the closure");
            });
        }));
        assert!(panicked.is_err());
        assert!(!lockkit::LockingConnection::in_transaction(&mut *conn));
        assert_eq!(stock_of!(&mut conn, 1), 10);
    }

    fn locked_transaction_returns_the_callers_error_untouched(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 3)]);
        let result = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
            let rows = Item::lock_all(conn, &[1, 2])?;
            for row in &rows {
                diesel::update(items::table.find(row.id)).set(items::stock.eq(row.stock - 5)).execute(conn)?;
                if row.stock < 5 {
                    return Err(ShopError::NotEnough(row.stock));
                }
            }
            Ok(())
        });
        assert!(matches!(result, Err(ShopError::NotEnough(3))), "{result:?}");
        assert_eq!((stock_of!(&mut conn, 1), stock_of!(&mut conn, 2)), (10, 3), "both rolled back");
    }

    fn retries_ask_the_callers_type_what_is_retryable(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        // A stale write inside the caller's type is retried; the next attempt re-reads.
        let attempts = AtomicU32::new(0);
        let stale_once = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |conn| {
            let mut item: Item = items::table.find(1).first(conn)?;
            if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                // someone else's write since the read
                diesel::update(items::table.find(1)).set(items::lock_version.eq(items::lock_version + 1)).execute(conn)?;
            }
            item.stock -= 1;
            item.update_versioned(conn)?;
            Ok::<_, ShopError>(item.stock)
        });
        assert_eq!(stale_once.unwrap(), 9);
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        // The caller's own refusal is not retryable: one attempt, rolled back.
        let attempts = AtomicU32::new(0);
        let refused: Result<(), ShopError> = lockkit::serializable(&mut conn, &RetryPolicy::immediate(3), |conn| {
            attempts.fetch_add(1, Ordering::SeqCst);
            diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(conn)?;
            Err(ShopError::NotEnough(0))
        });
        assert!(matches!(refused, Err(ShopError::NotEnough(0))));
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
        assert_eq!(stock_of!(&mut conn, 1), 9);
        // Retries that run out hand back the last error as the caller's type says.
        let always: Result<(), ShopError> = lockkit::retry(&RetryPolicy::immediate(3), |_| Err(Error::Deadlock.into()));
        assert!(matches!(always, Err(ShopError::Lock(Error::Deadlock))), "{always:?}");
        let lockkit_own: Result<(), Error> = lockkit::retry(&RetryPolicy::immediate(3), |_| Err(Error::Deadlock));
        assert!(matches!(lockkit_own, Err(Error::RetriesExhausted { attempts: 3, .. })), "{lockkit_own:?}");
    }

    fn idempotency_stores_and_replays_any_serde_response(db) {
        use diesel_migrations::MigrationHarness;
        let mut conn = db.conn();
        conn.run_pending_migrations(lockkit_tests::idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut conn, &[(1, 10)]);
        let keys = Idempotency::default();
        let order = |conn: &mut Conn| -> Result<Receipt, ShopError> {
            let left = take_eight!(conn, 1)?;
            Ok(Receipt { order: 7, left, note: "first \"run\"".to_owned() })
        };
        let ran = keys.run(&mut conn, "tenant-1", "order-7", "POST /orders", order).unwrap();
        let receipt = Receipt { order: 7, left: 2, note: "first \"run\"".to_owned() };
        assert_eq!(ran, Outcome::Ran(receipt.clone()));
        let replayed = keys.run(&mut conn, "tenant-1", "order-7", "POST /orders", order).unwrap();
        assert_eq!(replayed, Outcome::Replayed(receipt));
        assert_eq!(stock_of!(&mut conn, 1), 2, "the work ran once");
        // The caller's error: the work is rolled back and the key released, so a
        // later attempt runs it again.
        let refused = keys.run(&mut conn, "tenant-1", "order-8", "POST /orders", order);
        assert!(matches!(refused, Err(ShopError::NotEnough(2))), "{refused:?}");
        seed_items(&mut conn, &[(2, 0)]);
        diesel::update(items::table.find(1)).set(items::stock.eq(8)).execute(&mut conn).unwrap();
        let again = keys.run(&mut conn, "tenant-1", "order-8", "POST /orders", order).unwrap();
        assert!(matches!(again, Outcome::Ran(Receipt { left: 0, .. })), "{again:?}");
        // A stored response that no longer reads as the type asked for.
        let wrong: Result<Outcome<i64>, Error> = keys.run(&mut conn, "tenant-1", "order-8", "POST /orders", |_| unreachable!());
        assert!(matches!(wrong, Err(Error::Database(diesel::result::Error::DeserializationError(_)))), "{wrong:?}");
    }

    fn if_match_applies_with_the_callers_error_type(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let read = |conn: &mut Conn| -> Result<i32, ShopError> {
            Ok(items::table.find(1).select(items::lock_version).first(conn)?)
        };
        let write = |conn: &mut Conn, v: i32| -> Result<i32, ShopError> {
            Ok(Item::update_by_version(conn, 1, v, items::stock.eq(items::stock - 1))?)
        };
        assert_eq!(Expected::Any.apply(&mut *conn, read, write).unwrap(), 1);
        let stale = Expected::Version(0).apply(&mut *conn, read, write);
        assert!(matches!(stale, Err(ShopError::Lock(Error::Stale(_)))), "{stale:?}");
        assert_eq!(stock_of!(&mut conn, 1), 9);

        // The axum extractors' `apply`, from `If-Match: "v1"`.
        let if_match = IfMatchVersion(Expected::Version(1));
        assert_eq!(if_match.apply(&mut *conn, read, write).unwrap(), 2);
        let stale = if_match.apply(&mut *conn, read, write);
        assert!(matches!(stale, Err(ShopError::Lock(Error::Stale(_)))), "{stale:?}");
        let refuse = |_: &mut Conn, _: i32| -> Result<i32, ShopError> { Err(ShopError::NotEnough(0)) };
        let refused = if_match.apply(&mut *conn, read, refuse);
        assert!(matches!(refused, Err(ShopError::NotEnough(0))), "{refused:?}");

        // With bound tags: the caller's refusal is the problem its type makes,
        // lockkit's the one lockkit makes.
        let tags = ETagSecret::new(&[7; 32]).unwrap().resource("items", 1);
        let current = IfMatchTags(tags.etag(2).to_string().parse().unwrap());
        let refused = current.apply(&tags, &mut *conn, read, refuse).unwrap_err();
        assert_eq!((refused.status, refused.detail.as_str()), (409, "only 0 left"));
        assert_eq!(current.apply(&tags, &mut *conn, read, write).unwrap(), 3);
        let old = current.apply(&tags, &mut *conn, read, write).unwrap_err();
        assert_eq!(old.status, 412, "{old:?}");
        assert_eq!(old.current_etag, Some(tags.etag(3).to_string()));
        // lockkit's error inside the caller's, from `write` (the header was
        // current, the write's version was not): rendered with the bound tag,
        // not as a plain `"v3"`.
        let now = IfMatchTags(tags.etag(3).to_string().parse().unwrap());
        let behind = |conn: &mut Conn, v: i32| -> Result<i32, ShopError> {
            Ok(Item::update_by_version(conn, 1, v - 1, items::stock.eq(0))?)
        };
        let stale = now.apply(&tags, &mut *conn, read, behind).unwrap_err();
        assert_eq!(
            (stale.status, stale.current_etag),
            (412, Some(tags.etag(3).to_string())),
            "{}",
            stale.detail
        );
        assert_eq!(stock_of!(&mut conn, 1), 7);
    }

    fn adaptive_update_hands_back_the_callers_error_on_either_path(db) {
        let mut conn = db.conn();
        seed_items(&mut conn, &[(1, 10)]);
        let policy = AdaptivePolicy::new().max_optimistic_attempts(1);
        let take_eight = |item: &mut Item| {
            if item.stock < 8 {
                return Err(ShopError::NotEnough(item.stock));
            }
            item.stock -= 8;
            Ok(())
        };
        // Optimistic: the change refuses, nothing is written.
        let refused = policy.update(&mut conn, 1, |item: &mut Item| {
            item.stock -= 3;
            take_eight(item)
        });
        assert!(matches!(refused, Err(ShopError::NotEnough(7))), "{refused:?}");
        assert_eq!(lockkit_tests::item!(&mut conn, 1), Item { id: 1, name: "item 1".into(), stock: 10, lock_version: 0 });
        // Another buyer takes 7 while the first change runs: that race is lost,
        // and the change runs again under the row lock, where it refuses, and
        // lockkit writes nothing after it.
        let mut runs = 0;
        let refused = policy.update(&mut conn, 1, |item: &mut Item| {
            runs += 1;
            if runs == 1 {
                diesel::update(items::table.find(1))
                    .set((items::stock.eq(3), items::lock_version.eq(items::lock_version + 1)))
                    .execute(&mut db.conn())
                    .unwrap();
            }
            take_eight(item)
        });
        assert!(matches!(refused, Err(ShopError::NotEnough(3))), "{refused:?}");
        assert_eq!(runs, 2, "the second run was the locked one");
        assert_eq!(lockkit_tests::item!(&mut conn, 1).lock_version, 1, "only the other buyer's write");
        let missing = policy.update(&mut conn, 99, take_eight);
        assert!(matches!(missing, Err(ShopError::Lock(Error::NotFound))), "{missing:?}");
    }

    fn relay_publish_batch_hands_back_the_callers_error_and_marks_nothing(db) {
        use diesel_migrations::MigrationHarness;
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        for order in 0..2 {
            conn.transaction(|conn| outbox::enqueue(conn, "orders", &format!("{{\"order\":{order}}}"))).unwrap();
        }
        let relay = Relay::default();
        // The broker client fails as a whole: no message is marked, none gets
        // an attempt or a backoff.
        let refused = relay.publish_batch(&mut conn, 10, |batch| -> Result<Vec<Result<(), String>>, ShopError> {
            Err(ShopError::NotEnough(batch.len() as i32))
        });
        assert!(matches!(refused, Err(ShopError::NotEnough(2))), "{refused:?}");
        let attempts: Vec<i32> = lockkit_outbox::table.order(lockkit_outbox::id).select(lockkit_outbox::attempts).load(&mut conn).unwrap();
        assert_eq!(attempts, [0, 0], "nothing marked");
        // Claimable again at once.
        let relayed = relay
            .publish_batch(&mut conn, 10, |batch: &[OutboxMessage]| Ok::<_, ShopError>(vec![Ok(()); batch.len()]))
            .unwrap();
        assert_eq!((relayed.claimed, relayed.published), (2, 2));
        // lockkit's refusal, in the caller's type: nothing is claimed.
        let invalid = relay.publish_batch(&mut conn, 0, |_| -> Result<Vec<Result<(), String>>, ShopError> {
            panic!("nothing is claimed")
        });
        assert!(matches!(invalid, Err(ShopError::Lock(Error::InvalidInput(_)))), "{invalid:?}");
    }

    fn inbox_receive_hands_back_the_callers_error_and_leaves_the_message_to_its_redelivery(db) {
        use diesel_migrations::MigrationHarness;
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        seed_items(&mut conn, &[(1, 10)]);
        let inbox = Inbox::new("stock").unwrap();
        // Takes `qty` of item 1, then refuses if there was not that much.
        let take = |conn: &mut Conn, qty: i32| -> Result<i32, ShopError> {
            let stock = stock_of!(&mut *conn, 1);
            diesel::update(items::table.find(1)).set(items::stock.eq(stock - qty)).execute(conn)?;
            if stock < qty {
                return Err(ShopError::NotEnough(stock));
            }
            Ok(stock - qty)
        };
        let refused = inbox.receive(&mut conn, "m-1", |conn| take(conn, 12));
        assert!(matches!(refused, Err(ShopError::NotEnough(10))), "{refused:?}");
        assert_eq!(stock_of!(&mut conn, 1), 10, "rolled back");
        // The id went with it: the redelivery applies the message, once.
        assert_eq!(inbox.receive(&mut conn, "m-1", |conn| take(conn, 4)).unwrap(), Received::Applied(6));
        assert_eq!(inbox.receive(&mut conn, "m-1", |conn| take(conn, 4)).unwrap(), Received::Duplicate);
        let invalid = inbox.receive(&mut conn, "", |conn| take(conn, 4));
        assert!(matches!(invalid, Err(ShopError::Lock(Error::InvalidInput(_)))), "{invalid:?}");
        assert_eq!(stock_of!(&mut conn, 1), 6);
    }

    fn fenced_and_with_lease_hand_back_the_callers_error(db) {
        use diesel_migrations::MigrationHarness;
        let mut conn = db.connect();
        conn.run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        seed_items(&mut conn, &[(1, 10)]);
        let ttl = Duration::from_secs(30);
        // Empties item 1 under `fence`, then refuses.
        let empty_then_refuse = |conn: &mut Conn, fence: Fence| {
            lease::fenced(conn, "item-1", fence, |conn| {
                diesel::update(items::table.find(1)).set(items::stock.eq(0)).execute(conn)?;
                Err::<(), _>(ShopError::NotEnough(10))
            })
        };
        // Under a lease: the work's error comes back untouched, and the lease
        // is released all the same.
        let refused = lease::with_lease(&mut conn, "restock", ttl, |held| {
            let fence = held.fence();
            empty_then_refuse(held, fence)
        });
        assert!(matches!(refused, Err(ShopError::NotEnough(10))), "{refused:?}");
        assert_eq!(stock_of!(&mut conn, 1), 10, "rolled back");
        let mut other = db.connect();
        let next = lease::acquire(&mut other, "restock", ttl).unwrap();
        assert_eq!(next.fence(), Fence(2), "released: taken at once");
        // Held by another: lockkit's `Busy`, in the caller's type; the work did not run.
        let busy = lease::with_lease(&mut conn, "restock", ttl, |_| -> Result<(), ShopError> { panic!("must not run") });
        assert!(matches!(busy, Err(ShopError::Lock(Error::Busy))), "{busy:?}");
        next.release().unwrap();

        // The fenced write and its fence roll back together: fence 5 was not
        // recorded, so fence 3 still writes.
        let refused = empty_then_refuse(&mut conn, Fence(5));
        assert!(matches!(refused, Err(ShopError::NotEnough(10))), "{refused:?}");
        assert_eq!(stock_of!(&mut conn, 1), 10, "rolled back");
        lease::fenced(&mut conn, "item-1", Fence(3), |_| Ok::<_, ShopError>(())).unwrap();
        let fenced_out = lease::fenced(&mut conn, "item-1", Fence(2), |_| -> Result<(), ShopError> { panic!("must not run") });
        assert!(matches!(fenced_out, Err(ShopError::Lock(Error::Fenced { fence: 2, current: 3, .. }))), "{fenced_out:?}");
    }
}

/// The replica router's write, with both pools on the one test database: a
/// write needs only the primary, whose commit position PostgreSQL reports
/// without a standby.
#[cfg(feature = "postgres")]
mod replica_router {
    use super::*;
    use diesel::r2d2::{ConnectionManager, Pool};
    use lockkit::replica::{Policy, Router};

    #[test]
    fn router_write_hands_back_the_callers_error_and_rolls_back() {
        let db = lockkit_tests::TestDb::<PgConnection>::new("router_write_user_error");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let router = Router::new(db.pool(), db.pool(), Policy::Primary);
        let refused = router.write(|conn| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(0))
                .execute(conn)?;
            Err::<(), _>(ShopError::NotEnough(10))
        });
        assert!(
            matches!(refused, Err(ShopError::NotEnough(10))),
            "{refused:?}"
        );
        assert_eq!(stock_of!(&mut db.conn(), 1), 10, "rolled back");
        // lockkit's own error, in the caller's type: the primary's pool has no
        // connection to give. Its one connection is taken with time to spare;
        // the write waits 50 ms for another.
        let one = Pool::builder()
            .max_size(1)
            .connection_timeout(Duration::from_millis(50))
            .build_unchecked(ConnectionManager::<PgConnection>::new(&db.url));
        let taken = one.get_timeout(Duration::from_secs(20)).unwrap();
        let starved = Router::new(one.clone(), one.clone(), Policy::Primary)
            .write(|_| -> Result<(), ShopError> { panic!("no connection to run on") });
        assert!(
            matches!(starved, Err(ShopError::Lock(Error::Pool(_)))),
            "{starved:?}"
        );
        drop(taken);
    }
}
