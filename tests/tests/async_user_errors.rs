//! `user_errors.rs` on diesel-async: the caller's own error type
//! ([`ShopError`], a `thiserror` enum with a `#[from] lockkit::Error` variant)
//! returned from the `async` closures of lockkit's calls comes back untouched,
//! and what the closure wrote before it refused is rolled back; lockkit's own
//! errors reach the caller inside it. The transactions, the retries,
//! idempotency keys, the outbox's relay and inbox, leases and fenced writes and
//! advisory locks on every backend that has them, and the replica router's
//! write on PostgreSQL.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_common::in_transaction;
use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_migrations::MigrationHarness;
use lockkit::asynchronous::prelude::*;
use lockkit::asynchronous::{idempotency, lease, locked_transaction, outbox};
use lockkit::idempotency::{Idempotency, Outcome};
use lockkit::lease::Fence;
use lockkit::outbox::{Inbox, OutboxMessage, Received, Relay};
use lockkit::{Error, LockOptions, RetryPolicy};
use lockkit_tests::schema::items;
use lockkit_tests::{
    idempotency_migrations, lease_migrations, outbox_migrations, seed_items, ShopError,
};

/// Sets item 1's stock to `$stock` on `$conn`: the write a refusal must take
/// back. A `QueryResult`, for `?`.
macro_rules! set_stock {
    ($conn:expr, $stock:expr) => {
        diesel::update(items::table.find(1))
            .set(items::stock.eq($stock))
            .execute($conn)
            .await
    };
}

/// Empties item 1 on `$conn`, then refuses: the closure body whose write a
/// refusal must take back.
macro_rules! empty_then_refuse {
    ($conn:expr) => {{
        set_stock!($conn, 0)?;
        Err(ShopError::NotEnough(10))
    }};
}

/// The refusal of [`empty_then_refuse!`], come back untouched.
macro_rules! assert_refused {
    ($result:expr) => {
        let result = $result;
        assert!(
            matches!(result, Err(ShopError::NotEnough(10))),
            "{result:?}"
        );
    };
}

/// Runs `$call` (`serializable` or `transaction_with_retry`) with work that
/// empties item 1, then refuses: the refusal comes back untouched after one
/// attempt, rolled back.
macro_rules! refused_once {
    ($call:path, $conn:expr) => {{
        let attempts = AtomicU32::new(0);
        let refused = $call(
            $conn,
            &RetryPolicy::immediate(3),
            async |conn: &mut Async| -> Result<(), ShopError> {
                attempts.fetch_add(1, Ordering::SeqCst);
                empty_then_refuse!(conn)
            },
        )
        .await;
        assert_refused!(refused);
        assert_eq!(count(&attempts), 1);
        assert_eq!(stock!($conn), 10, "rolled back");
    }};
}

/// Reads item 1, moves its version behind the struct's back, then writes the
/// struct: lockkit's `Error::Stale`, in the caller's type through `?`.
macro_rules! stale_write {
    ($conn:expr) => {{
        let mut item = item!(&mut *$conn, 1);
        diesel::update(items::table.find(1))
            .set(items::lock_version.eq(items::lock_version + 1))
            .execute(&mut *$conn)
            .await?;
        item.stock = 0;
        item.update_versioned($conn).await?;
        Ok(())
    }};
}

/// `$call` (`with_lock` or `try_with_lock`) on a connection a dropped call
/// left broken: lockkit's refusal, in the caller's type; the work does not run.
macro_rules! refuses_on_a_broken_connection {
    ($call:path, $conn:expr, $key:expr) => {{
        let broken = $call(
            $conn,
            $key,
            async |_: &mut Async| -> Result<(), ShopError> { panic!("must not run") },
        )
        .await;
        assert!(
            matches!(
                broken,
                Err(ShopError::Lock(Error::Database(
                    diesel::result::Error::BrokenTransactionManager
                )))
            ),
            "{broken:?}"
        );
    }};
}

/// How often a counter was bumped (`AtomicU32::load`, which diesel-async's
/// `RunQueryDsl::load` hides as a method).
fn count(counter: &AtomicU32) -> u32 {
    counter.load(Ordering::SeqCst)
}

async_backend_tests! {
    async fn locked_transaction_hands_back_the_callers_error_and_rolls_back(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let refused = locked_transaction(&mut conn, LockOptions::default(), async |conn: &mut Async| -> Result<(), ShopError> {
            empty_then_refuse!(conn)
        })
        .await;
        assert_refused!(refused);
        assert_eq!(stock!(&mut conn), 10, "rolled back");
        assert!(!in_transaction(&mut conn));
        // A stale write inside: lockkit's error, in the caller's type.
        let stale = locked_transaction(&mut conn, LockOptions::default(), async |conn: &mut Async| -> Result<(), ShopError> {
            stale_write!(conn)
        })
        .await;
        assert!(matches!(stale, Err(ShopError::Lock(Error::Stale(_)))), "{stale:?}");
        assert_eq!(stock_and_version!(&mut conn), (10, 0), "rolled back");
    }

    async fn the_retrying_calls_hand_back_the_callers_error_and_ask_it_what_is_retryable(db) {
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        // The caller's refusal is not retryable: one attempt, rolled back.
        refused_once!(lockkit::asynchronous::serializable, &mut conn);
        refused_once!(lockkit::asynchronous::transaction_with_retry, &mut conn);
        let runs = AtomicU32::new(0);
        let refused: Result<(), ShopError> = lockkit::asynchronous::retry(&RetryPolicy::immediate(3), |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err(ShopError::NotEnough(10)) }
        })
        .await;
        assert_refused!(refused);
        assert_eq!(count(&runs), 1);

        // lockkit's retryable errors inside the caller's type are retried;
        // once the attempts run out, the last one comes back as the caller's
        // type says (as itself), each attempt rolled back.
        let attempts = AtomicU32::new(0);
        let stale = lockkit::asynchronous::transaction_with_retry(&mut conn, &RetryPolicy::immediate(2), async |conn: &mut Async| -> Result<(), ShopError> {
            attempts.fetch_add(1, Ordering::SeqCst);
            stale_write!(conn)
        })
        .await;
        assert!(matches!(stale, Err(ShopError::Lock(Error::Stale(_)))), "{stale:?}");
        assert_eq!(count(&attempts), 2);
        assert_eq!(stock_and_version!(&mut conn), (10, 0), "rolled back");
        let attempts = AtomicU32::new(0);
        let failed = lockkit::asynchronous::serializable(&mut conn, &RetryPolicy::immediate(2), async |_: &mut Async| -> Result<(), ShopError> {
            attempts.fetch_add(1, Ordering::SeqCst);
            Err(Error::SerializationFailure.into())
        })
        .await;
        assert!(matches!(failed, Err(ShopError::Lock(Error::SerializationFailure))), "{failed:?}");
        assert_eq!(count(&attempts), 2);
        let runs = AtomicU32::new(0);
        let deadlocked: Result<(), ShopError> = lockkit::asynchronous::retry(&RetryPolicy::immediate(3), |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err(Error::Deadlock.into()) }
        })
        .await;
        assert!(matches!(deadlocked, Err(ShopError::Lock(Error::Deadlock))), "{deadlocked:?}");
        assert_eq!(count(&runs), 3);
    }

    async fn idempotency_run_hands_back_the_callers_error_and_releases_the_key(db) {
        db.conn().run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let keys = Idempotency::default();
        let refused = idempotency::run(&keys, &mut conn, "tenant-1", "order-1", "f", async |conn: &mut Async| -> Result<i32, ShopError> {
            empty_then_refuse!(conn)
        })
        .await;
        assert_refused!(refused);
        assert_eq!(stock!(&mut conn), 10, "rolled back");
        // The key was released: the retry runs the work.
        let ran = idempotency::run(&keys, &mut conn, "tenant-1", "order-1", "f", async |conn: &mut Async| -> Result<i32, ShopError> {
            set_stock!(conn, 2)?;
            Ok(2)
        })
        .await
        .unwrap();
        assert_eq!(ran, Outcome::Ran(2));
        // lockkit's refusal, in the caller's type: the key reused for another request.
        let reused = idempotency::run(&keys, &mut conn, "tenant-1", "order-1", "g", async |_: &mut Async| -> Result<i32, ShopError> {
            panic!("must not run")
        })
        .await;
        assert!(matches!(reused, Err(ShopError::Lock(Error::IdempotencyKeyReused))), "{reused:?}");
        assert_eq!(stock!(&mut conn), 2);
    }

    async fn outbox_relay_and_inbox_hand_back_the_callers_error(db) {
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        for order in 0..2 {
            diesel::Connection::transaction(&mut *db.conn(), |conn| {
                lockkit::outbox::enqueue(conn, "orders", &order.to_string())
            })
            .unwrap();
        }
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        // The broker client fails as a whole: nothing is marked, and the batch
        // is claimable again at once, with no attempt counted.
        let relay = Relay::default();
        let refused = outbox::publish_batch(&relay, &mut conn, 10, async |batch: &[OutboxMessage]| -> Result<Vec<Result<(), String>>, ShopError> {
            Err(ShopError::NotEnough(batch.len() as i32))
        })
        .await;
        assert!(matches!(refused, Err(ShopError::NotEnough(2))), "{refused:?}");
        let relayed = outbox::publish_batch(&relay, &mut conn, 10, async |batch: &[OutboxMessage]| -> Result<Vec<Result<(), String>>, ShopError> {
            assert!(batch.iter().all(|m| m.attempts == 0), "{batch:?}");
            Ok(vec![Ok(()); batch.len()])
        })
        .await
        .unwrap();
        assert_eq!((relayed.claimed, relayed.published), (2, 2));
        let invalid = outbox::publish_batch(&relay, &mut conn, 0, async |_: &[OutboxMessage]| -> Result<Vec<Result<(), String>>, ShopError> {
            panic!("nothing is claimed")
        })
        .await;
        assert!(matches!(invalid, Err(ShopError::Lock(Error::InvalidInput(_)))), "{invalid:?}");

        // The inbox: the effect and the message's id roll back together, so
        // the redelivery applies it.
        let inbox = Inbox::new("stock").unwrap();
        let refused = outbox::receive(&inbox, &mut conn, "m-1", async |conn: &mut Async| -> Result<i32, ShopError> {
            empty_then_refuse!(conn)
        })
        .await;
        assert_refused!(refused);
        assert_eq!(stock!(&mut conn), 10, "rolled back");
        let applied = outbox::receive(&inbox, &mut conn, "m-1", async |conn: &mut Async| -> Result<i32, ShopError> {
            set_stock!(conn, 6)?;
            Ok(6)
        })
        .await
        .unwrap();
        assert_eq!(applied, Received::Applied(6));
        let invalid = outbox::receive(&inbox, &mut conn, "", async |_: &mut Async| -> Result<i32, ShopError> {
            panic!("must not run")
        })
        .await;
        assert!(matches!(invalid, Err(ShopError::Lock(Error::InvalidInput(_)))), "{invalid:?}");
        assert_eq!(stock!(&mut conn), 6);
    }

    async fn with_lease_and_fenced_hand_back_the_callers_error(db) {
        db.conn().run_pending_migrations(lease_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let ttl = Duration::from_secs(30);
        // Under a lease, a fenced write that refuses: the work's error comes
        // back untouched, the write is rolled back, the lease released.
        let refused = lease::with_lease(&mut conn, "restock", ttl, async |held: &mut lease::AsyncLease<'_, Async>| -> Result<(), ShopError> {
            let fence = held.fence();
            lease::fenced(&mut **held, "item-1", fence, async |conn: &mut Async| -> Result<(), ShopError> {
                empty_then_refuse!(conn)
            })
            .await
        })
        .await;
        assert_refused!(refused);
        assert_eq!(stock!(&mut conn), 10, "rolled back");
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let next = lease::acquire(&mut other, "restock", ttl).await.unwrap();
        assert_eq!(next.fence(), Fence(2), "released: taken at once");
        // Held by another: lockkit's `Busy`, in the caller's type; the work did not run.
        let busy = lease::with_lease(&mut conn, "restock", ttl, async |_: &mut lease::AsyncLease<'_, Async>| -> Result<(), ShopError> {
            panic!("must not run")
        })
        .await;
        assert!(matches!(busy, Err(ShopError::Lock(Error::Busy))), "{busy:?}");
        next.release().await.unwrap();

        // A refused fenced write records no fence: fence 5 rolled back with
        // the write, so fence 3 still writes, and fence 2 is then refused.
        let refused = lease::fenced(&mut conn, "item-1", Fence(5), async |conn: &mut Async| -> Result<(), ShopError> {
            empty_then_refuse!(conn)
        })
        .await;
        assert_refused!(refused);
        assert_eq!(stock!(&mut conn), 10, "rolled back");
        lease::fenced(&mut conn, "item-1", Fence(3), async |_: &mut Async| Ok::<_, ShopError>(())).await.unwrap();
        let fenced_out = lease::fenced(&mut conn, "item-1", Fence(2), async |_: &mut Async| -> Result<(), ShopError> {
            panic!("must not run")
        })
        .await;
        assert!(matches!(fenced_out, Err(ShopError::Lock(Error::Fenced { fence: 2, current: 3, .. }))), "{fenced_out:?}");
    }
}

/// Advisory locks: PostgreSQL and MariaDB only.
mod advisory_locks {
    use super::*;

    async_server_tests! {
        async fn advisory_locks_hand_back_the_callers_error_and_release_the_lock(db) {
            use lockkit::asynchronous::advisory::{self, AdvisoryKey};
            seed_items(&mut db.conn(), &[(1, 10)]);
            // Advisory keys are server-wide: one per test database.
            let key = AdvisoryKey::from_name(&db.url);
            let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
            let mut other: Async = async_common::connect(&db.url, BACKEND).await;
            // The work's transaction runs inside the session lock, as the
            // advisory docs advise; its refusal comes back through both.
            let refused = advisory::with_lock(&mut conn, key, async |conn: &mut Async| -> Result<(), ShopError> {
                locked_transaction(conn, LockOptions::default(), async |conn: &mut Async| -> Result<(), ShopError> {
                    empty_then_refuse!(conn)
                })
                .await
            })
            .await;
            assert_refused!(refused);
            assert_eq!(stock!(&mut conn), 10, "rolled back");
            let refused = advisory::try_with_lock(&mut conn, key, async |_: &mut Async| -> Result<(), ShopError> {
                Err(ShopError::NotEnough(10))
            })
            .await;
            assert_refused!(refused);
            let free = advisory::try_with_lock(&mut other, key, async |_: &mut Async| Ok::<_, ShopError>(())).await.unwrap();
            assert!(free.is_some(), "released after the caller's error");

            // lockkit's refusal, in the caller's type: a connection a dropped call
            // left in its transaction takes no advisory lock, and the work does not run.
            async_common::drop_a_call_in_its_work(&mut conn).await;
            refuses_on_a_broken_connection!(advisory::with_lock, &mut conn, key);
            refuses_on_a_broken_connection!(advisory::try_with_lock, &mut conn, key);
        }
    }
}

/// The replica router's write on diesel-async, with both bb8 pools on the one
/// test database: a write needs only the primary, whose commit position
/// PostgreSQL reports without a standby.
#[cfg(feature = "postgres")]
mod replica_router {
    use super::*;
    use diesel_async::pooled_connection::bb8::Pool;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::AsyncPgConnection;
    use lockkit::replica::asynchronous::Router;
    use lockkit::replica::Policy;

    /// A bb8 pool of up to `size` connections to `url`, which waits `timeout`
    /// for one.
    async fn pool(url: &str, size: u32, timeout: Duration) -> Pool<AsyncPgConnection> {
        Pool::builder()
            .max_size(size)
            .connection_timeout(timeout)
            .build(AsyncDieselConnectionManager::new(url))
            .await
            .expect("bb8 pool")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn router_write_hands_back_the_callers_error_and_rolls_back() {
        let db = async_common::seeded::<diesel::PgConnection>(
            "async_router_write_user_error",
            &[(1, 10)],
        );
        let both = pool(&db.url, 2, Duration::from_secs(30)).await;
        let router = Router::new(both.clone(), both.clone(), Policy::Primary);
        let refused = router
            .write(
                async |conn: &mut AsyncPgConnection| -> Result<(), ShopError> {
                    empty_then_refuse!(conn)
                },
            )
            .await;
        assert_refused!(refused);
        assert_eq!(stock!(&mut *both.get().await.unwrap()), 10, "rolled back");
        // lockkit's own error, in the caller's type: the primary's pool has no
        // connection to give.
        // Its one connection is taken with time to spare (a connect that
        // outlasts one 50 ms wait goes on, and a later look finds it); the
        // write waits 50 ms for another.
        let one = pool(&db.url, 1, Duration::from_millis(50)).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let taken = loop {
            match one.get().await {
                Ok(taken) => break taken,
                Err(err) => assert!(std::time::Instant::now() < deadline, "no connection: {err}"),
            }
        };
        let starved = Router::new(one.clone(), one.clone(), Policy::Primary)
            .write(async |_: &mut AsyncPgConnection| -> Result<(), ShopError> {
                panic!("no connection to run on")
            })
            .await;
        assert!(
            matches!(starved, Err(ShopError::Lock(Error::AsyncPool(_)))),
            "{starved:?}"
        );
        drop(taken);
    }
}
