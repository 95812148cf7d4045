//! The transactional outbox and the inbox on diesel-async, on PostgreSQL,
//! MariaDB and SQLite, with tasks of a multi-threaded runtime on a bb8 pool:
//! orders enqueued in transactions, some rolled back; a relay step dropped
//! after the broker got its batch; relays that then deliver exactly the
//! committed orders (the dropped batch twice); and an inbox that applies every
//! order once, however often it is delivered.

#![cfg(feature = "async")]

#[macro_use]
mod async_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::{ExpressionMethods, QueryDsl};
use diesel_async::RunQueryDsl;
use diesel_migrations::MigrationHarness;
use lockkit::asynchronous::{locked_transaction, outbox};
use lockkit::outbox::{Inbox, OutboxMessage, Received, Relay};
use lockkit::{Error, LockOptions};
use lockkit_tests::schema::items;
use lockkit_tests::{outbox_migrations, unpublished_count};

const ORDERS: i32 = 24;
const POOL: u32 = 8;

/// An in-test broker: every (message id, payload) it was handed.
#[derive(Default, Clone)]
struct Sink(Arc<Mutex<Vec<(i64, String)>>>);

impl Sink {
    fn take(&self, batch: &[OutboxMessage]) -> Vec<Result<(), String>> {
        self.0
            .lock()
            .unwrap()
            .extend(batch.iter().map(|m| (m.id, m.payload.clone())));
        vec![Ok(()); batch.len()]
    }

    fn deliveries(&self) -> Vec<(i64, String)> {
        self.0.lock().unwrap().clone()
    }
}

async_backend_tests! {
    async fn the_relay_delivers_the_committed_orders_and_the_inbox_applies_each_once(db) {
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let pool = async_common::bb8_pool::<Async>(&db.url, BACKEND, POOL).await;

        // Orders, each with its message, in one transaction; every third rolls back.
        let tasks: Vec<_> = (1..=ORDERS)
            .map(|order| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut conn = pool.get().await.unwrap();
                    locked_transaction(&mut *conn, LockOptions::default(), async |conn: &mut Async| {
                        diesel::insert_into(items::table)
                            .values((items::id.eq(order), items::name.eq("order"), items::stock.eq(0), items::lock_version.eq(0)))
                            .execute(conn)
                            .await?;
                        outbox::enqueue(conn, "orders", &order.to_string()).await?;
                        match order % 3 {
                            0 => Err(Error::InvalidInput("payment declined")),
                            _ => Ok(()),
                        }
                    })
                    .await
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await.unwrap();
        }
        let committed: BTreeSet<String> = (1..=ORDERS).filter(|o| o % 3 != 0).map(|o| o.to_string()).collect();
        let mut conn = pool.get().await.unwrap();
        assert_eq!(unpublished_count().get_result::<i64>(&mut *conn).await.unwrap(), committed.len() as i64, "the rolled-back orders left no message");
        drop(conn);

        // A relay step dropped after the broker got its batch, before it marked it.
        let sink = Sink::default();
        let relay = Relay::default();
        {
            let mut conn = pool.get().await.unwrap();
            // Dropped once the broker has the batch (as a timeout firing
            // then would), however long the step took to get there.
            let handed = tokio::sync::Notify::new();
            let step = outbox::publish_batch(&relay, &mut *conn, 5, async |batch: &[OutboxMessage]| {
                sink.take(batch);
                handed.notify_one();
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, Error>(vec![Ok(()); batch.len()])
            });
            tokio::select! {
                () = handed.notified() => {} // drops the step
                outcome = step => panic!("the relay step returned {outcome:?} before it was dropped"),
            }
        }
        assert_eq!(sink.deliveries().len(), 5, "the broker got the dropped batch");

        // Three relays drain the outbox.
        let relays: Vec<_> = (0..3)
            .map(|_| {
                let (pool, sink) = (pool.clone(), sink.clone());
                tokio::spawn(async move {
                    let mut published = 0;
                    loop {
                        let mut conn = pool.get().await.unwrap();
                        let relayed = outbox::publish_batch(&relay, &mut *conn, 4, async |batch: &[OutboxMessage]| {
                            Ok::<_, Error>(sink.take(batch))
                        })
                        .await
                        .unwrap();
                        published += relayed.published;
                        if relayed.claimed == 0 {
                            return published;
                        }
                    }
                })
            })
            .collect();
        let mut published = 0;
        for relay in relays {
            published += relay.await.unwrap();
        }
        assert_eq!(published, committed.len(), "each committed message marked published once");
        let deliveries = sink.deliveries();
        let mut copies: BTreeMap<i64, (String, usize)> = BTreeMap::new();
        for (id, payload) in &deliveries {
            copies.entry(*id).or_insert((payload.clone(), 0)).1 += 1;
        }
        let delivered: BTreeSet<String> = copies.values().map(|(p, _)| p.clone()).collect();
        assert_eq!(delivered, committed, "exactly the committed orders reached the broker");
        assert_eq!(copies.values().filter(|(_, n)| *n == 2).count(), 5, "the dropped batch was delivered again");
        assert!(copies.values().all(|(_, n)| *n <= 2));
        let mut conn = pool.get().await.unwrap();
        assert_eq!(unpublished_count().get_result::<i64>(&mut *conn).await.unwrap(), 0);
        drop(conn);

        // The consumer gets every delivery, and each message once more, concurrently.
        let inbox = Arc::new(Inbox::new("stock").unwrap());
        let mut deliveries = deliveries;
        deliveries.extend(copies.iter().map(|(id, (payload, _))| (*id, payload.clone())));
        let consumers: Vec<_> = deliveries
            .into_iter()
            .map(|(id, payload)| {
                let (pool, inbox) = (pool.clone(), inbox.clone());
                tokio::spawn(async move {
                    let order: i32 = payload.parse().unwrap();
                    loop {
                        let mut conn = pool.get().await.unwrap();
                        let received = outbox::receive(&inbox, &mut *conn, &id.to_string(), async |conn: &mut Async| {
                            diesel::update(items::table.find(order))
                                .set(items::stock.eq(items::stock + 1))
                                .execute(conn)
                                .await?;
                            Ok::<_, Error>(())
                        })
                        .await;
                        match received {
                            Ok(received) => return received,
                            // Not acked: the broker redelivers.
                            Err(Error::Deadlock | Error::Busy) => continue,
                            Err(other) => panic!("receive: {other}"),
                        }
                    }
                })
            })
            .collect();
        let mut applied = 0;
        for consumer in consumers {
            if consumer.await.unwrap() == Received::Applied(()) {
                applied += 1;
            }
        }
        assert_eq!(applied, committed.len(), "each message applied once");
        let mut conn = pool.get().await.unwrap();
        let stocks: Vec<(i32, i32)> = items::table.select((items::id, items::stock)).order(items::id).load(&mut *conn).await.unwrap();
        assert_eq!(stocks.len(), committed.len());
        assert!(stocks.iter().all(|&(_, stock)| stock == 1), "{stocks:?}");
        assert_eq!(outbox::purge_received(&inbox, &mut *conn, Duration::ZERO).await.unwrap(), committed.len());
        assert_eq!(outbox::purge_published(&mut *conn, Duration::ZERO).await.unwrap(), committed.len());
    }

    async fn a_relay_inside_a_transaction_is_refused_before_it_claims(db) {
        // As on the blocking side: its claim would see the transaction's own
        // uncommitted messages.
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let relayed = locked_transaction(&mut conn, LockOptions::default(), async |conn: &mut Async| {
            outbox::enqueue(conn, "orders", "not committed").await?;
            let relay = Relay::default();
            let relayed = outbox::publish_batch(&relay, conn, 10, async |batch: &[OutboxMessage]| {
                Ok::<_, Error>(vec![Ok(()); batch.len()])
            })
            .await;
            Err::<(), _>(relayed.err().unwrap_or(Error::NoRowMatched))
        })
        .await;
        assert!(matches!(relayed, Err(Error::AlreadyInTransaction)), "{relayed:?}");
    }

    async fn failed_publishes_become_dead_letters_until_requeued(db) {
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let outside = outbox::enqueue(&mut conn, "orders", "1").await;
        assert!(matches!(outside, Err(Error::NotInTransaction)), "{outside:?}");
        // A claim checks its limit first, then the transaction, as the blocking claim.
        let negative = outbox::claim(&mut conn, -1).await;
        assert!(matches!(negative, Err(Error::InvalidInput(_))), "{negative:?}");
        assert!(matches!(outbox::claim(&mut conn, 1).await, Err(Error::NotInTransaction)));
        let id = locked_transaction(&mut conn, LockOptions::default(), async |conn: &mut Async| {
            outbox::enqueue(conn, "orders", "1").await
        })
        .await
        .unwrap();
        let relay = Relay { max_attempts: Some(1), ..Relay::default() };
        let relayed = outbox::publish_batch(&relay, &mut conn, 10, async |_batch: &[OutboxMessage]| {
            Ok::<_, Error>(vec![Err("broker down".to_owned())])
        })
        .await
        .unwrap();
        assert_eq!((relayed.claimed, relayed.failed, relayed.dead), (1, 1, 1));
        let dead = outbox::dead_letters(&mut conn, 10).await.unwrap();
        assert_eq!(dead.len(), 1);
        let negative = outbox::dead_letters(&mut conn, -1).await;
        assert!(matches!(negative, Err(Error::InvalidInput(_))), "{negative:?}");
        assert_eq!((dead[0].id, dead[0].last_error.as_deref()), (id, Some("broker down")));
        let idle = outbox::publish_batch(&relay, &mut conn, 10, async |_batch: &[OutboxMessage]| -> Result<Vec<Result<(), String>>, Error> {
            panic!("a dead letter is not claimed")
        })
        .await
        .unwrap();
        assert_eq!(idle.claimed, 0);
        assert!(outbox::requeue(&mut conn, id).await.unwrap());
        let relayed = outbox::publish_batch(&relay, &mut conn, 10, async |batch: &[OutboxMessage]| {
            Ok::<_, Error>(vec![Ok(()); batch.len()])
        })
        .await
        .unwrap();
        assert_eq!((relayed.claimed, relayed.published), (1, 1));
        assert!(!outbox::requeue(&mut conn, id).await.unwrap(), "published: not a dead letter");
        assert!(matches!(outbox::publish_batch(&relay, &mut conn, 0, async |_b: &[OutboxMessage]| Ok::<_, Error>(vec![])).await, Err(Error::InvalidInput(_))));
    }

    async fn housekeeping_after_a_dropped_call_is_not_sent_in_the_abandoned_transaction(db) {
        // A dropped lockkit call leaves its transaction open on the server and
        // the connection marked broken: a requeue or a purge sent there would
        // answer as done and never commit, and would keep its rows locked
        // while the connection lives.
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        let id = locked_transaction(&mut conn, LockOptions::default(), async |conn: &mut Async| {
            outbox::enqueue(conn, "orders", "1").await
        })
        .await
        .unwrap();
        let relay = Relay { max_attempts: Some(1), ..Relay::default() };
        outbox::publish_batch(&relay, &mut conn, 10, async |_batch: &[OutboxMessage]| {
            Ok::<_, Error>(vec![Err("broker down".to_owned())])
        })
        .await
        .unwrap();
        async_common::drop_a_call_in_its_work(&mut conn).await;
        let broken = |result: &Result<usize, Error>| {
            matches!(result, Err(Error::Database(diesel::result::Error::BrokenTransactionManager)))
        };
        let requeued = outbox::requeue(&mut conn, id).await.map(usize::from);
        assert!(broken(&requeued), "{requeued:?}");
        // Not `NotInTransaction`, whose help is wrong on a broken connection.
        let enqueued = outbox::enqueue(&mut conn, "orders", "2").await.map(|id| id as usize);
        assert!(broken(&enqueued), "{enqueued:?}");
        let purged = outbox::purge_published(&mut conn, Duration::ZERO).await;
        assert!(broken(&purged), "{purged:?}");
        let purged = outbox::purge_received(&Inbox::new("audit").unwrap(), &mut conn, Duration::ZERO).await;
        assert!(broken(&purged), "{purged:?}");
        drop(conn);
        let mut other: Async = async_common::connect(&db.url, BACKEND).await;
        let dead = outbox::dead_letters(&mut other, 10).await.unwrap();
        assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), [id], "still a dead letter");
    }
}

#[cfg(all(feature = "async", feature = "mysql"))]
mod mysql_only {
    use super::*;
    use diesel::QueryableByName;
    use lockkit_tests::models::Item;

    type Async = diesel_async::AsyncMysqlConnection;
    const BACKEND: &str = "mysql";

    /// The session's `Com_select` (the question counts one more).
    const COM_SELECT: &str = "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n \
        FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'COM_SELECT'";

    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }

    /// [`COM_SELECT`] read on a blocking connection.
    fn com_select(conn: &mut diesel::MysqlConnection) -> i64 {
        diesel::RunQueryDsl::get_result::<N>(diesel::sql_query(COM_SELECT), conn)
            .unwrap()
            .n
    }

    /// [`COM_SELECT`] read on diesel-async.
    async fn com_select_async(conn: &mut Async) -> i64 {
        diesel::sql_query(COM_SELECT)
            .get_result::<N>(conn)
            .await
            .unwrap()
            .n
    }

    /// One `with_lock` on item 1 that enqueues an outbox message, blocking.
    fn sell_blocking(conn: &mut diesel::MysqlConnection) {
        lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| {
            lockkit::outbox::enqueue(conn, "orders", "1").map(|_| ())
        })
        .unwrap();
    }

    /// The same on diesel-async.
    async fn sell_async(conn: &mut Async) {
        lockkit::asynchronous::with_lock(conn, 1, LockOptions::default(), async |conn, _: Item| {
            outbox::enqueue(conn, "orders", "1").await.map(|_| ())
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn async_with_lock_with_an_outbox_message_sends_no_more_selects_than_blocking() {
        // `with_lock`'s own locking read by key got all its rows: it hid no
        // deadlock, and `enqueue` after it asks the server nothing more than
        // on the blocking connection.
        let db = lockkit_tests::TestDb::<diesel::MysqlConnection>::new("outbox_hidden_read_cost");
        db.conn()
            .run_pending_migrations(outbox_migrations(BACKEND))
            .unwrap();
        lockkit_tests::seed_items(&mut db.conn(), &[(1, 10)]);

        let mut sync = db.connect();
        // Warmed up: the journal installed, the statements prepared.
        sell_blocking(&mut sync);
        sell_blocking(&mut sync);
        let before = com_select(&mut sync);
        sell_blocking(&mut sync);
        let blocking = com_select(&mut sync) - before;

        let mut conn: Async = async_common::connect(&db.url, BACKEND).await;
        sell_async(&mut conn).await;
        sell_async(&mut conn).await;
        let before = com_select_async(&mut conn).await;
        sell_async(&mut conn).await;
        let asynchronous = com_select_async(&mut conn).await - before;
        assert_eq!(
            asynchronous, blocking,
            "SELECTs sent by one with_lock with an outbox message: async {asynchronous}, blocking {blocking}"
        );
    }
}
