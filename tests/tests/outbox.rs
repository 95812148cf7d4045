//! The transactional outbox and the inbox on real servers: a rolled-back change
//! leaves no message, concurrent relays publish each message once (twice only
//! when a relay dies before marking), failed publishes back off (and become
//! dead letters after `max_attempts`, until requeued), and the inbox
//! applies a message once under concurrent redelivery, where a consumer without
//! it applies every delivery.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::Duration;

use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::outbox::schema::{lockkit_inbox, lockkit_outbox};
use lockkit::outbox::{self, Inbox, OutboxMessage, Received, Relay};
use lockkit::Error;
use lockkit_tests::{outbox_migrations, seed_items, stock_of, unpublished_count};

#[cfg(feature = "mysql")]
mod mysql_deadlock;

/// A stand-in broker: every message it was handed, with the relay that handed it.
#[derive(Default)]
struct Broker(Mutex<Vec<(usize, i64)>>);

impl Broker {
    /// Accepts a batch from `relay` and confirms every message.
    fn confirm_all(&self, relay: usize, batch: &[OutboxMessage]) -> Vec<Result<(), String>> {
        self.0
            .lock()
            .unwrap()
            .extend(batch.iter().map(|m| (relay, m.id)));
        vec![Ok(()); batch.len()]
    }

    /// How often each message id was published.
    fn copies(&self) -> BTreeMap<i64, usize> {
        let mut copies = BTreeMap::new();
        for (_, id) in self.0.lock().unwrap().iter() {
            *copies.entry(*id).or_default() += 1;
        }
        copies
    }

    fn published_by(&self, relay: usize) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| *r == relay)
            .count()
    }
}

/// Enqueues `count` messages, one committed transaction each; returns their ids.
fn enqueue_many<C>(conn: &mut C, count: usize) -> Vec<i64>
where
    C: lockkit::AsLockingConnection + Connection,
    C::Conn: outbox::OutboxStore,
{
    (0..count)
        .map(|n| {
            conn.transaction(|conn| outbox::enqueue(conn, "orders", &format!("{{\"order\":{n}}}")))
                .unwrap()
        })
        .collect()
}

/// Publishes one batch of up to 10 messages, each confirmed by the broker;
/// returns the messages as the relay handed them to the broker.
fn publish_one_batch<C>(conn: &mut C) -> Vec<OutboxMessage>
where
    C: lockkit::AsLockingConnection,
    C::Conn: outbox::OutboxStore,
{
    let mut published = Vec::new();
    Relay::default()
        .publish_batch(conn, 10, |batch| {
            published.extend_from_slice(batch);
            Ok::<_, Error>(vec![Ok(()); batch.len()])
        })
        .unwrap();
    published
}

/// Drains the outbox as relay number `relay`; returns how many batches it took.
fn drain<C>(
    conn: &mut C,
    relay: usize,
    broker: &Broker,
    in_flight: &AtomicUsize,
    overlap: &AtomicUsize,
) -> usize
where
    C: lockkit::AsLockingConnection,
    C::Conn: outbox::OutboxStore,
{
    let mut batches = 0;
    loop {
        let relayed = Relay::default()
            .publish_batch(conn, 5, |batch| {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                overlap.fetch_max(now, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(20)); // the broker's confirms
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Error>(broker.confirm_all(relay, batch))
            })
            .unwrap();
        if relayed.claimed == 0 {
            return batches;
        }
        assert_eq!(relayed.published, relayed.claimed);
        batches += 1;
    }
}

lockkit_tests::backend_tests! {
    fn a_rolled_back_change_leaves_no_message(db) {
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        seed_items(&mut conn, &[(1, 10)]);
        let rolled_back = conn.transaction(|conn| {
            diesel::sql_query("UPDATE items SET stock = stock - 2 WHERE id = 1").execute(conn)?;
            outbox::enqueue(conn, "orders", r#"{"order":1,"qty":2}"#)?;
            Err::<(), _>(Error::NoRowMatched) // the order fails after both writes
        });
        assert!(matches!(rolled_back, Err(Error::NoRowMatched)));
        assert_eq!(stock_of!(&mut conn), 10);
        assert_eq!(lockkit_outbox::table.count().get_result::<i64>(&mut conn).unwrap(), 0, "no message without its change");

        let id = conn.transaction(|conn| {
            diesel::sql_query("UPDATE items SET stock = stock - 2 WHERE id = 1").execute(conn)?;
            outbox::enqueue(conn, "orders", r#"{"order":2,"qty":2}"#)
        }).unwrap();
        assert_eq!(stock_of!(&mut conn), 8);
        let stored: (String, String, i32, Option<i64>) = lockkit_outbox::table
            .find(id)
            .select((lockkit_outbox::topic, lockkit_outbox::payload, lockkit_outbox::attempts, lockkit_outbox::published_at))
            .first(&mut conn)
            .unwrap();
        assert_eq!(stored, ("orders".to_owned(), r#"{"order":2,"qty":2}"#.to_owned(), 0, None));

        // Outside a transaction the message could commit without its change.
        assert!(matches!(outbox::enqueue(&mut conn, "orders", "{}"), Err(Error::NotInTransaction)));
        assert_eq!(lockkit_outbox::table.count().get_result::<i64>(&mut conn).unwrap(), 1);
        // A claim checks its limit first, then the transaction (as queue::claim, and the async claim).
        assert!(matches!(outbox::claim(&mut conn, -1), Err(Error::InvalidInput(_))));
        assert!(matches!(outbox::claim(&mut conn, 1), Err(Error::NotInTransaction)));
    }

    fn two_relays_publish_every_message_once(db) {
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let ids = enqueue_many(&mut db.conn(), 100);
        let broker = Broker::default();
        let (in_flight, overlap) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let barrier = Barrier::new(2);
        let batches: Vec<usize> = thread::scope(|s| {
            let relays: Vec<_> = (0..2)
                .map(|relay| {
                    let (broker, in_flight, overlap, barrier) = (&broker, &in_flight, &overlap, &barrier);
                    let mut conn = db.conn();
                    s.spawn(move || {
                        barrier.wait();
                        drain(&mut conn, relay, broker, in_flight, overlap)
                    })
                })
                .collect();
            relays.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let copies = broker.copies();
        assert_eq!(copies.keys().copied().collect::<Vec<_>>(), ids, "every message published");
        assert!(copies.values().all(|&n| n == 1), "none twice: {copies:?}");
        assert_eq!(batches.iter().sum::<usize>(), 20);
        let unpublished = unpublished_count().get_result::<i64>(&mut db.conn()).unwrap();
        assert_eq!(unpublished, 0);
        if BACKEND != "sqlite" {
            // Row locks: both relays held batches at the same time, and both worked.
            assert_eq!(overlap.load(Ordering::SeqCst), 2, "the relays ran side by side");
            assert!(broker.published_by(0) > 0 && broker.published_by(1) > 0, "{batches:?}");
        } else {
            // SQLite: the relays take turns (BEGIN IMMEDIATE).
            assert_eq!(overlap.load(Ordering::SeqCst), 1);
        }
    }

    fn a_relay_that_dies_before_marking_publishes_its_batch_again(db) {
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let ids = enqueue_many(&mut db.conn(), 5);
        let broker = Broker::default();
        // Relay 0 hands a batch of 3 to the broker, which confirms it, and dies
        // before its transaction commits the marks.
        let died = thread::scope(|s| {
            s.spawn(|| {
                let mut conn = db.conn();
                Relay::default().publish_batch(&mut conn, 3, |batch| -> Result<Vec<Result<(), String>>, Error> {
                    broker.confirm_all(0, batch);
                    panic!("the relay dies between publish and mark");
                })
            })
            .join()
        });
        assert!(died.is_err(), "the relay thread panicked");
        let unpublished = unpublished_count().get_result::<i64>(&mut db.conn()).unwrap();
        assert_eq!(unpublished, 5, "its marks were rolled back with it");
        // Relay 1 drains the outbox: the dead relay's batch goes out a second time.
        let (in_flight, overlap) = (AtomicUsize::new(0), AtomicUsize::new(0));
        drain(&mut db.conn(), 1, &broker, &in_flight, &overlap);
        let copies = broker.copies();
        let expected: BTreeMap<i64, usize> =
            ids.iter().enumerate().map(|(n, &id)| (id, if n < 3 { 2 } else { 1 })).collect();
        assert_eq!(copies, expected, "at least once: exactly the dead relay's batch twice");
    }

    fn a_relay_inside_a_transaction_is_refused_before_it_claims(db) {
        // Inside your transaction its claim would see the transaction's own
        // messages, uncommitted, and publish them though it rolls back.
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let mut sent = Vec::new();
        let outcome = conn.transaction(|conn| {
            outbox::enqueue(conn, "orders", "not committed")?;
            let relayed = Relay::default().publish_batch(conn, 10, |batch| {
                sent.extend_from_slice(batch);
                Ok::<_, Error>(vec![Ok(()); batch.len()])
            });
            assert!(matches!(relayed, Err(Error::AlreadyInTransaction)), "{relayed:?}");
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(outcome.is_err());
        assert!(sent.is_empty(), "published a rolled-back message: {sent:?}");
    }

    fn a_failed_publish_backs_off_and_is_retried(db) {
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let ids = enqueue_many(&mut conn, 3);
        let relay = Relay { base_delay: Duration::from_secs(3600), max_delay: Duration::from_secs(3600), ..Relay::default() };
        // The broker refuses the first message and confirms the second; the
        // third gets no outcome at all.
        let relayed = relay
            .publish_batch(&mut conn, 10, |batch| {
                assert_eq!(batch.len(), 3);
                Ok::<_, Error>(vec![Err("nack: queue full".to_owned()), Ok(())])
            })
            .unwrap();
        assert_eq!((relayed.claimed, relayed.published, relayed.failed), (3, 1, 2));
        let rows: Vec<(i64, i32, Option<String>, bool)> = lockkit_outbox::table
            .order(lockkit_outbox::id)
            .select((lockkit_outbox::id, lockkit_outbox::attempts, lockkit_outbox::last_error, lockkit_outbox::published_at.is_not_null()))
            .load(&mut conn)
            .unwrap();
        assert_eq!(rows, vec![
            (ids[0], 1, Some("nack: queue full".to_owned()), false),
            (ids[1], 0, None, true),
            (ids[2], 1, Some("no outcome reported".to_owned()), false),
        ]);
        // Waiting out their backoff (up to an hour), the failed ones are not due.
        let relayed = relay.publish_batch(&mut conn, 10, |_| -> Result<Vec<Result<(), String>>, Error> {
            panic!("nothing is due")
        });
        assert_eq!(relayed.unwrap().claimed, 0);
        // Once due, they are claimed again with their attempts, and published.
        diesel::update(lockkit_outbox::table).set(lockkit_outbox::next_attempt_at.eq(0_i64)).execute(&mut conn).unwrap();
        let relayed = relay
            .publish_batch(&mut conn, 10, |batch| {
                assert_eq!(batch.iter().map(|m| (m.id, m.attempts)).collect::<Vec<_>>(), vec![(ids[0], 1), (ids[2], 1)]);
                Ok::<_, Error>(vec![Ok(()); batch.len()])
            })
            .unwrap();
        assert_eq!((relayed.claimed, relayed.published), (2, 2));
        // Age zero purges everything published so far, even a message marked
        // in this very millisecond.
        assert_eq!(outbox::purge_published(&mut conn, Duration::ZERO).unwrap(), 3);
    }

    fn a_message_that_keeps_failing_becomes_a_dead_letter_until_requeued(db) {
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let ids = enqueue_many(&mut conn, 2);
        // No backoff to wait out: every failure makes the message due again at once.
        let relay = Relay { base_delay: Duration::ZERO, max_delay: Duration::ZERO, max_attempts: Some(3) };
        // The broker refuses the first message every time and confirms the second.
        let refuse_first = |batch: &[OutboxMessage]| {
            Ok::<_, Error>(batch.iter().map(|m| if m.id == ids[0] { Err(format!("nack {}", m.attempts + 1)) } else { Ok(()) }).collect())
        };
        let first = relay.publish_batch(&mut conn, 10, refuse_first).unwrap();
        assert_eq!((first.claimed, first.published, first.failed, first.dead), (2, 1, 1, 0));
        let second = relay.publish_batch(&mut conn, 10, refuse_first).unwrap();
        assert_eq!((second.claimed, second.failed, second.dead), (1, 1, 0));
        assert!(outbox::dead_letters(&mut conn, 10).unwrap().is_empty(), "two failures of three");
        let third = relay.publish_batch(&mut conn, 10, refuse_first).unwrap();
        assert_eq!((third.claimed, third.failed, third.dead), (1, 1, 1));
        // Out of the relays' way: not claimed again, however long they wait.
        let relayed = relay.publish_batch(&mut conn, 10, |_| -> Result<Vec<Result<(), String>>, Error> {
            panic!("a dead letter is never claimed")
        });
        assert_eq!(relayed.unwrap().claimed, 0);
        assert_eq!(unpublished_count().get_result::<i64>(&mut conn).unwrap(), 1, "still in the outbox, unpublished");
        let dead = outbox::dead_letters(&mut conn, 10).unwrap();
        assert_eq!(dead.len(), 1);
        // A negative limit is no limit on SQLite, an error elsewhere: refused.
        let negative = outbox::dead_letters(&mut conn, -1);
        assert!(matches!(negative, Err(Error::InvalidInput(_))), "{negative:?}");
        assert_eq!((dead[0].id, dead[0].attempts, dead[0].last_error.as_deref()), (ids[0], 3, Some("nack 3")));
        assert_eq!((dead[0].topic.as_str(), dead[0].payload.as_str()), ("orders", "{\"order\":0}"));
        // Only a dead letter is requeued: not a published message, not an unknown id.
        assert!(!outbox::requeue(&mut conn, ids[1]).unwrap());
        assert!(!outbox::requeue(&mut conn, ids[1] + 1000).unwrap());
        assert!(outbox::requeue(&mut conn, ids[0]).unwrap());
        assert!(!outbox::requeue(&mut conn, ids[0]).unwrap(), "no longer a dead letter");
        assert!(outbox::dead_letters(&mut conn, 10).unwrap().is_empty());
        // Requeued: due at once, with its attempts counted from zero.
        let relayed = relay
            .publish_batch(&mut conn, 10, |batch| {
                assert_eq!(batch.iter().map(|m| (m.id, m.attempts)).collect::<Vec<_>>(), vec![(ids[0], 0)]);
                Ok::<_, Error>(vec![Ok(())])
            })
            .unwrap();
        assert_eq!((relayed.claimed, relayed.published), (1, 1));
        assert_eq!(unpublished_count().get_result::<i64>(&mut conn).unwrap(), 0);
    }

    fn the_inbox_applies_each_message_once_under_concurrent_redelivery(db) {
        db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        seed_items(&mut db.conn(), &[(1, 1000)]);
        const MESSAGES: usize = 10;
        const COPIES: usize = 4; // each message delivered 4 times at once
        let inbox = Inbox::new("stock").unwrap();
        let barrier = Barrier::new(COPIES);
        let outcomes: Vec<Received<()>> = thread::scope(|s| {
            let consumers: Vec<_> = (0..COPIES)
                .map(|_| {
                    let (inbox, barrier) = (&inbox, &barrier);
                    let mut conn = db.conn();
                    s.spawn(move || {
                        (0..MESSAGES)
                            .map(|m| {
                                barrier.wait();
                                inbox
                                    .receive(&mut conn, &format!("order-service:{m}"), |conn| {
                                        diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(conn)?;
                                        thread::sleep(Duration::from_millis(30)); // the others arrive meanwhile
                                        Ok::<_, Error>(())
                                    })
                                    .unwrap()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            consumers.into_iter().flat_map(|c| c.join().unwrap()).collect()
        });
        let applied = outcomes.iter().filter(|o| matches!(o, Received::Applied(()))).count();
        let absorbed = outcomes.iter().filter(|o| matches!(o, Received::Duplicate)).count();
        assert_eq!((applied, absorbed), (MESSAGES, MESSAGES * (COPIES - 1)));
        assert_eq!(stock_of!(&mut db.conn()), 1000 - MESSAGES as i32, "each message applied once");
        let recorded: i64 = lockkit_inbox::table.count().get_result(&mut db.conn()).unwrap();
        assert_eq!(recorded, MESSAGES as i64);
    }

    fn a_consumer_without_the_inbox_applies_every_delivery(db) {
        seed_items(&mut db.conn(), &[(1, 1000)]);
        const MESSAGES: usize = 10;
        const COPIES: usize = 4;
        let barrier = Barrier::new(COPIES);
        thread::scope(|s| {
            for _ in 0..COPIES {
                let barrier = &barrier;
                let mut conn = db.conn();
                s.spawn(move || {
                    for _ in 0..MESSAGES {
                        barrier.wait();
                        conn.transaction(|conn| {
                            diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(conn)
                        })
                        .unwrap();
                    }
                });
            }
        });
        assert_eq!(stock_of!(&mut db.conn()), 1000 - (MESSAGES * COPIES) as i32, "every redelivery applied again");
    }

    fn a_failed_effect_leaves_the_message_to_its_redelivery(db) {
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        seed_items(&mut conn, &[(1, 10)]);
        let inbox = Inbox::new("stock").unwrap();
        let failed = inbox.receive(&mut conn, "m-1", |conn| {
            diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(conn)?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(matches!(failed, Err(Error::NoRowMatched)));
        assert_eq!(stock_of!(&mut conn), 10);
        let apply = |conn: &mut Conn| {
            diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(conn)?;
            Ok::<_, Error>(())
        };
        assert_eq!(inbox.receive(&mut conn, "m-1", apply).unwrap(), Received::Applied(()));
        assert_eq!(inbox.receive(&mut conn, "m-1", apply).unwrap(), Received::Duplicate);
        // Ids are exact, and per consumer.
        assert_eq!(inbox.receive(&mut conn, "M-1 ", apply).unwrap(), Received::Applied(()));
        let other = Inbox::new("billing").unwrap();
        assert_eq!(other.receive(&mut conn, "m-1", apply).unwrap(), Received::Applied(()));
        assert_eq!(stock_of!(&mut conn), 7);
        assert_eq!(inbox.purge_older_than(&mut conn, Duration::ZERO).unwrap(), 2);
        assert_eq!(inbox.receive(&mut conn, "m-1", apply).unwrap(), Received::Applied(()), "purged: applied again");
    }

    fn hostile_names_are_refused_or_stored_verbatim(db) {
        let mut conn = db.conn();
        conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
        let long = "x".repeat(256);
        for topic in ["", "a\0b", long.as_str()] {
            let refused = conn.transaction(|conn| outbox::enqueue(conn, topic, "{}"));
            assert!(matches!(refused, Err(Error::InvalidInput(_))), "{topic:?}");
        }
        assert!(matches!(conn.transaction(|conn| outbox::enqueue(conn, "t", "a\0b")), Err(Error::InvalidInput(_))));
        for name in ["", "a\0b", long.as_str()] {
            assert!(matches!(Inbox::new(name), Err(Error::InvalidInput(_))));
            let refused = Inbox::new("c").unwrap().receive(&mut conn, name, |_| Ok::<_, Error>(()));
            assert!(matches!(refused, Err(Error::InvalidInput(_))));
        }
        assert!(matches!(
            Relay::default().publish_batch(&mut conn, 0, |_| Ok::<_, Error>(vec![])),
            Err(Error::InvalidInput(_))
        ));
        let evil = "'); DROP TABLE lockkit_outbox; --";
        let id = conn.transaction(|conn| outbox::enqueue(conn, evil, evil)).unwrap();
        let stored: (String, String) = lockkit_outbox::table.find(id).select((lockkit_outbox::topic, lockkit_outbox::payload)).first(&mut conn).unwrap();
        assert_eq!(stored, (evil.to_owned(), evil.to_owned()));
        let inbox = Inbox::new(evil).unwrap();
        assert_eq!(inbox.receive(&mut conn, evil, |_| Ok::<_, Error>(())).unwrap(), Received::Applied(()));
        assert_eq!(inbox.receive(&mut conn, evil, |_| Ok::<_, Error>(())).unwrap(), Received::Duplicate);
    }
}

/// Payloads are "any text without NUL" (the module docs): a message as large as
/// an event with a few hundred line items is enqueued, claimed and published as
/// it was written, on every backend.
mod large_payloads {
    use super::*;

    lockkit_tests::backend_tests! {
        fn a_payload_of_100_kib_is_enqueued_and_published_verbatim(db) {
            let mut conn = db.conn();
            conn.run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
            // Over 100 KiB of JSON, ASCII only: as many bytes as characters on every server.
            let items: Vec<String> = (0..4096).map(|n| format!("{{\"sku\":{n:>20}}}")).collect();
            let payload = format!("[{}]", items.join(","));
            assert!(payload.len() > 100 * 1024);
            let enqueued = conn.transaction(|conn| outbox::enqueue(conn, "orders", &payload));
            let id = enqueued.unwrap_or_else(|e| panic!("a {}-byte payload was refused: {e}", payload.len()));
            let published = publish_one_batch(&mut conn);
            assert_eq!(published.len(), 1);
            assert_eq!(published[0].id, id);
            assert!(published[0].payload == payload, "the payload published is {} bytes, not the {} enqueued", published[0].payload.len(), payload.len());
        }
    }

    /// On a MySQL/MariaDB server whose `sql_mode` is not strict (MySQL 5.6's
    /// default, and many a tuned server's), `TEXT` does not refuse what is too
    /// long: it cuts it at 65,535 bytes with a warning, and the relay publishes
    /// a message that is not the one the transaction committed.
    #[cfg(feature = "mysql")]
    #[test]
    fn without_strict_mode_a_large_payload_is_not_published_cut() {
        let db =
            crate::mysql_deadlock::database_with("outbox_payload_not_strict", outbox_migrations);
        let mut conn = db.connect();
        diesel::connection::SimpleConnection::batch_execute(&mut conn, "SET SESSION sql_mode = ''")
            .unwrap();
        let payload = "x".repeat(70_000);
        let id = conn
            .transaction(|conn| outbox::enqueue(conn, "orders", &payload))
            .unwrap();
        let published: Vec<(i64, usize)> = publish_one_batch(&mut conn)
            .iter()
            .map(|m| (m.id, m.payload.len()))
            .collect();
        assert_eq!(
            published,
            vec![(id, payload.len())],
            "the message published is not the one enqueued"
        );
    }
}

/// A MySQL/MariaDB database whose default character set is `latin1` (the
/// default of MariaDB before 11.6 and of MySQL 5.7): the shipped tables must
/// still keep any text, since Diesel sends it as `utf8mb4`.
#[cfg(feature = "mysql")]
mod on_a_latin1_database {
    use super::*;
    use diesel::connection::SimpleConnection;
    use lockkit_tests::TestDb;

    const PAYLOAD: &str = r#"{"customer":"山田 😀","note":"Ærø"}"#;

    fn latin1_outbox(name: &str) -> (TestDb<MysqlConnection>, MysqlConnection) {
        let db = TestDb::<MysqlConnection>::new(name);
        let mut conn = db.connect();
        conn.batch_execute("ALTER DATABASE CHARACTER SET latin1 COLLATE latin1_swedish_ci")
            .unwrap();
        conn.run_pending_migrations(outbox_migrations("mysql"))
            .unwrap();
        (db, conn)
    }

    #[test]
    fn a_payload_in_any_script_is_published_as_enqueued() {
        let (_db, mut conn) = latin1_outbox("outbox_latin1_payload");
        let id = conn
            .transaction(|conn| outbox::enqueue(conn, "orders", PAYLOAD))
            .unwrap_or_else(|e| panic!("a valid payload was refused: {e}"));
        let published = publish_one_batch(&mut conn);
        assert_eq!(published.len(), 1);
        assert_eq!(
            (published[0].id, published[0].payload.as_str()),
            (id, PAYLOAD)
        );
    }

    /// Outside strict mode the server does not refuse what it cannot store:
    /// it writes `?` in its place, and the relay would publish another message.
    #[test]
    fn without_strict_mode_a_payload_is_not_published_changed() {
        let (_db, mut conn) = latin1_outbox("outbox_latin1_not_strict");
        conn.batch_execute("SET SESSION sql_mode = ''").unwrap();
        conn.transaction(|conn| outbox::enqueue(conn, "orders", PAYLOAD))
            .unwrap();
        let published = publish_one_batch(&mut conn);
        assert_eq!(published.len(), 1);
        assert_eq!(
            published[0].payload, PAYLOAD,
            "the message published is not the one enqueued"
        );
    }

    /// A broker's refusal in another language is the message's last error: the
    /// relay records it and counts the attempt, so that the message backs off
    /// and ends as a dead letter, instead of failing the whole batch's marks
    /// and being published again on every pass.
    #[test]
    fn a_failure_reason_in_any_script_is_recorded() {
        let (_db, mut conn) = latin1_outbox("outbox_latin1_reason");
        conn.transaction(|conn| outbox::enqueue(conn, "orders", "{}"))
            .unwrap();
        let failed = Relay::default().publish_batch(&mut conn, 10, |batch| {
            Ok::<_, Error>(vec![Err("代理拒绝了消息".to_owned()); batch.len()])
        });
        assert!(failed.is_ok(), "the relay's pass failed: {failed:?}");
        let (attempts, last_error): (i32, Option<String>) = lockkit_outbox::table
            .select((lockkit_outbox::attempts, lockkit_outbox::last_error))
            .first(&mut conn)
            .unwrap();
        assert_eq!(
            (attempts, last_error.as_deref()),
            (1, Some("代理拒绝了消息"))
        );
    }
}

/// The order and its message in a lockkit transaction that retries
/// (`transaction_with_retry`). Its work does a best-effort extra whose failure
/// it ignores, and that extra is a deadlock's victim: InnoDB rolls back the
/// whole transaction, the order with it. lockkit's own `enqueue` then runs
/// with no transaction open on the server and commits on its own (no stand-in
/// was opened, and `enqueue` does not ask the journal, as nested lockkit calls
/// do); the retry writes the order and a second message. One order, two
/// messages with two ids, so the consumer's inbox applies it twice.
#[cfg(feature = "mysql")]
mod an_enqueue_after_a_deadlock_the_work_let_go {
    use super::*;
    use mysql_deadlock::{database_with, extra_on_item_2_is_the_victim, sell_from_item_1};

    #[test]
    fn the_message_commits_only_with_its_order() {
        let db = database_with("outbox_enqueue_after_deadlock", outbox_migrations);
        let mut attempt = 0;
        let outcome = lockkit_tests::aborts::beside_neighbour(&db, "mysql", |conn, cue| {
            lockkit::transaction_with_retry(conn, &lockkit::RetryPolicy::default(), |c| {
                attempt += 1;
                // The order: two units of item 1.
                sell_from_item_1(c, 2)?;
                if attempt == 1 {
                    extra_on_item_2_is_the_victim(c, cue);
                }
                outbox::enqueue(c, "orders", r#"{"order":1,"item":1,"qty":2}"#)?;
                Ok::<_, Error>(())
            })
        });
        let mut conn = db.connect();
        outcome.unwrap();
        assert_eq!(stock_of!(&mut conn), 8, "the order committed once");
        let messages: Vec<i64> = lockkit_outbox::table
            .select(lockkit_outbox::id)
            .load(&mut conn)
            .unwrap();
        assert_eq!(
            messages.len(),
            1,
            "one order, one message: {messages:?} after {attempt} attempts"
        );
    }
}

/// The relay holds its batch while the broker confirms (a round trip, or a
/// timeout when the broker is away). The order service's transactions, which
/// enqueue new messages, must not wait for it: they touch no row of the batch.
mod an_enqueue_beside_a_relay {
    use super::*;
    use lockkit_tests::db::TestBackend;
    use lockkit_tests::TestDb;
    use std::sync::mpsc;

    /// How long the relay's broker takes at most to answer: a bound for a
    /// test gone wrong, since it answers as soon as the order is done.
    const BROKER_AT_MOST: Duration = Duration::from_secs(30);

    /// Enqueues one message, then runs `order` on a connection of its own
    /// while a relay, on another, holds that message's batch before its
    /// broker answers: confirmed when `confirms`, else timed out. The broker
    /// answers once `order` is done, or after [`BROKER_AT_MOST`]. What `order`
    /// returned, and whether it was done before the broker answered: while
    /// the relay still held its batch, so without waiting for it.
    fn beside_a_relay_waiting_on_its_broker<C, T>(
        db: &TestDb<C>,
        confirms: bool,
        order: impl FnOnce(&mut C) -> T,
    ) -> (T, bool)
    where
        C: TestBackend + lockkit::AsLockingConnection,
        C::Conn: outbox::OutboxStore,
    {
        enqueue_many(&mut db.connect(), 1);
        let (claimed, claimed_rx) = mpsc::channel();
        let (done, done_rx) = mpsc::channel::<()>();
        thread::scope(|s| {
            let relay = s.spawn(move || {
                let mut order_done_first = false;
                Relay::default()
                    .publish_batch(&mut db.connect(), 10, |batch| {
                        claimed.send(()).unwrap();
                        order_done_first = done_rx.recv_timeout(BROKER_AT_MOST).is_ok();
                        let answer = if confirms {
                            Ok(())
                        } else {
                            Err("publish timed out".to_owned())
                        };
                        Ok::<_, Error>(vec![answer; batch.len()])
                    })
                    .unwrap();
                order_done_first
            });
            claimed_rx.recv().unwrap();
            let outcome = order(&mut db.connect());
            let _ = done.send(());
            (outcome, relay.join().unwrap())
        })
    }

    lockkit_tests::server_tests! {
        fn an_enqueue_does_not_wait_for_a_relay_waiting_on_its_broker(db) {
            db.conn().run_pending_migrations(outbox_migrations(BACKEND)).unwrap();
            // The broker is slow to confirm: it confirms only once the order is
            // done. An order that waited for the relay would be done only after
            // the broker gave up waiting for it, whatever the time either took;
            // so no bound on the order's time.
            let ((), done_first) = beside_a_relay_waiting_on_its_broker(&db, true, |conn| {
                conn.transaction(|c| outbox::enqueue(c, "orders", r#"{"order":2}"#)).unwrap();
            });
            assert!(done_first, "the order's transaction waited {BROKER_AT_MOST:?} for the relay's broker");
        }
    }

    /// The same on MySQL/MariaDB, with the broker away until the order is
    /// done, so longer than the order service's lock wait timeout (here 1 s;
    /// InnoDB's default is 50 s) if the order waits: it then fails, although
    /// it shares no row with the relay's batch.
    #[cfg(feature = "mysql")]
    #[test]
    fn an_order_is_not_refused_while_a_relay_waits_for_its_broker() {
        let db =
            crate::mysql_deadlock::database_with("outbox_enqueue_beside_relay", outbox_migrations);
        // The broker does not answer (until the order is done).
        let (order, _) = beside_a_relay_waiting_on_its_broker(&db, false, |conn| {
            diesel::connection::SimpleConnection::batch_execute(
                conn,
                "SET SESSION innodb_lock_wait_timeout = 1",
            )
            .unwrap();
            conn.transaction(|c| {
                // .. insert the order ..
                outbox::enqueue(c, "orders", r#"{"order":2}"#)
            })
        });
        assert!(order.is_ok(), "the order: {order:?}");
    }
}
