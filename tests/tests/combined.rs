//! Where strategies meet, transactions roll back and keys misbehave: every way a
//! user could combine lockkit's documented tools, each checked for the update it
//! must not lose.
//!
//! * a write under a pessimistic lock (or a versioned conditional update) makes a
//!   stale optimistic writer stale;
//! * a versioned write that was rolled back never succeeds over somebody else's
//!   later write (the "rollback ABA"), and a struct retried after a rollback
//!   writes as Rails would (its version restored);
//! * the version trigger never lets a raw writer move the version back;
//! * a key that matches several rows is an error and writes nothing;
//! * a stale report inside a transaction shows the latest commit;
//! * `lock_all` takes any number of keys, in key order across statements;
//! * a bulk update naming a row twice is refused.

use std::sync::Barrier;
use std::thread;

use diesel::prelude::*;
use lockkit::etag::Expected;
use lockkit::journal::Journal;
use lockkit::prelude::*;
use lockkit::version_trigger::{up_sql, Dialect};
use lockkit::{locked_transaction, CurrentState, Error, LockOptions, RetryPolicy};
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{b_commits_then_a_is_stale, exec, item, seed_items, stock_of, TestDb};

/// `items` declared a second time, under another Rust name.
mod alias {
    diesel::table! {
        #[sql_name = "items"]
        stock_items (id) {
            id -> Integer,
            name -> Text,
            stock -> Integer,
            lock_version -> Integer,
        }
    }
}

/// An `items` row through [`alias::stock_items`].
#[derive(Debug, Queryable, Selectable, Identifiable, AsChangeset, Versioned)]
#[diesel(table_name = alias::stock_items)]
struct StockItem {
    id: i32,
    name: String,
    stock: i32,
    lock_version: i32,
}

/// Row 1 of `items` as a [`StockItem`].
macro_rules! stock_item {
    ($conn:expr) => {
        alias::stock_items::table
            .find(1)
            .first::<StockItem>($conn)
            .unwrap()
    };
}

fn dialect(backend: &str) -> Dialect {
    match backend {
        "postgres" => Dialect::Postgres,
        "mysql" => Dialect::Mysql,
        _ => Dialect::Sqlite,
    }
}

/// Item row 1 read on `$conn`, then written (stock 5) in a transaction that
/// rolls back. Returns the struct as that write left it.
macro_rules! rolled_back_write {
    ($conn:ident) => {{
        let mut a = item!(&mut $conn, 1);
        lockkit_tests::write_rolled_back!($conn, a, 5);
        a
    }};
}

/// Item 1 seeded; A's connection and the other instance's; A's struct of
/// item 1 whose write (v0 -> v1) rolled back; then the other instance commits
/// its own v1 ([`another_instance_commits`]).
macro_rules! rolled_back_then_committed_elsewhere {
    ($db:ident) => {{
        let (mut a_conn, mut other) = item_1_on_two_conns(&$db);
        let held = rolled_back_write!(a_conn);
        another_instance_commits(&mut other);
        (a_conn, other, held)
    }};
}

/// The struct `$held`, holding a rolled-back number, writes on `$conn`: it
/// must be stale, and the row's stock 6 (A's sale over the other's 7) stay.
macro_rules! assert_never_writes {
    ($held:ident, $conn:ident, $other:ident) => {{
        $held.stock = 2;
        let again = $held.update_versioned(&mut $conn);
        let stock = stock_of!(&mut $other);
        assert!(
            matches!(again, Err(Error::Stale(_))) && stock == 6,
            "the rolled-back struct wrote: {again:?}, stock {stock}"
        );
    }};
}

/// Writes `$a` (stock 5) in a savepoint on `$conn`, whose work then ends with
/// `$last` (`$c`: the savepoint's connection): the savepoint must fail, and
/// the transaction around it commit.
macro_rules! write_in_a_failed_savepoint {
    ($conn:ident, $a:ident, |$c:ident| $last:block) => {{
        $conn
            .transaction(|c| {
                let inner: Result<(), Error> = c.transaction(|$c| {
                    $a.stock = 5;
                    $a.update_versioned($c)?;
                    $last
                });
                assert!(inner.is_err(), "{inner:?}");
                Ok::<_, Error>(())
            })
            .unwrap();
    }};
}

/// Gadget 1 inserted at the version type's maximum less one, read on `$conn`,
/// then written (to the maximum) in a transaction that rolls back. Returns the
/// struct as that write left it, holding the rolled-back maximum.
macro_rules! gadget_rolled_back_onto_the_maximum {
    ($conn:ident) => {{
        exec(
            &mut $conn,
            &format!(
                "INSERT INTO gadgets (id, label, version) VALUES (1, 'g', {})",
                i16::MAX - 1
            ),
        );
        let mut a = gadgets::table.find(1).first::<Gadget>(&mut $conn).unwrap();
        let rolled_back = $conn.transaction(|c| {
            a.label = "a".into();
            a.update_versioned(c)?;
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(rolled_back.is_err());
        a
    }};
}

/// Gives `conn` instrumentation of its own (the application's query logger),
/// not wrapped in `Journal::wrap`: lockkit sees no `BEGIN`, `COMMIT` or
/// `ROLLBACK` on it, and asks the server instead.
fn unwatched(conn: &mut impl diesel::Connection) {
    conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
}

/// A pooled connection of a test database.
type Pooled<C> = diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>>;

/// Two pooled connections of `db`, the first of which then seeds item 1
/// (stock 10): A's, and another writer's.
fn item_1_on_two_conns<C: TestBackend>(db: &TestDb<C>) -> (Pooled<C>, Pooled<C>) {
    let mut a = db.conn();
    let other = db.conn();
    seed_items(&mut a, &[(1, 10)]);
    (a, other)
}

/// Seeds item 1 (stock 10) on `db` and opens two connections to it: this
/// application's, [`unwatched`], and another instance's.
fn own_unwatched_and_other<C: TestBackend>(db: &TestDb<C>) -> (C, C) {
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut own = db.connect();
    unwatched(&mut own);
    (own, db.connect())
}

/// Another instance of the application writes item 1 as docs/SQL.md shows
/// `update_versioned` (stock 7, v0 -> v1), and commits.
fn another_instance_commits(conn: &mut impl diesel::Connection) {
    exec(
        conn,
        "UPDATE items SET stock = 7, lock_version = lock_version + 1 WHERE id = 1 AND lock_version = 0",
    );
}

/// A struct holding a rolled-back write's number wrote `again` after another
/// instance committed that number: it must be stale, and the other's stock 7
/// stay. `what` names what held the number.
fn assert_stale_over_the_other(again: Result<(), Error>, stock: i32, what: &str) {
    assert!(
        matches!(again, Err(Error::Stale(_))) && stock == 7,
        "{what}'s rolled-back version matched the same number the other instance \
         committed: {again:?}, stock {stock} (its 7 lost)"
    );
}

/// Asserts that a versioned write was refused as stale.
#[track_caller]
fn assert_stale(outcome: Result<(), Error>) {
    assert!(matches!(outcome, Err(Error::Stale(_))), "{outcome:?}");
}

/// Item 1 written (v0 -> v1) by a struct in a transaction on a connection
/// with instrumentation of its own, which is then dropped with the
/// transaction open (a request cancelled, a pool that closes it): the server
/// rolls it back. A new connection takes its place in the same slot (a
/// pool's, a struct field), so at the same address, by which lockkit tells
/// connections it cannot watch apart; `$prepare` readies it. Another instance
/// commits v1, and the struct, retried in a transaction on the new connection
/// at the old one's depth, must be stale.
macro_rules! dropped_and_replaced {
    ($db:ident, $prepare:expr) => {{
        use diesel::connection::TransactionManager;
        type Manager = <Conn as diesel::Connection>::TransactionManager;
        seed_items(&mut $db.conn(), &[(1, 10)]);
        let mut other: Conn = $db.connect();
        let mut slot: Option<Conn> = Some($db.connect());
        let own = slot.as_mut().unwrap();
        unwatched(own);
        let mut a = item!(&mut *own, 1); // v0
        Manager::begin_transaction(own).unwrap();
        a.stock = 5;
        a.update_versioned(own).unwrap(); // v1, in the open transaction
        slot = Some($db.connect());
        let own = slot.as_mut().unwrap();
        ($prepare)(own);
        another_instance_commits(&mut other);
        a.stock = 3;
        let again = own.transaction(|c| a.update_versioned(c));
        assert_stale_over_the_other(again, stock_of!(&mut other), "the dropped connection");
    }};
}

/// Inserts items `1..=n` (stock 10, version 0) in one statement.
fn seed_many(conn: &mut impl diesel::Connection, backend: &str, n: usize) {
    let generate = match backend {
        "postgres" => format!(
            "INSERT INTO items (id, name, stock, lock_version) \
             SELECT n, 'item', 10, 0 FROM generate_series(1, {n}) AS n"
        ),
        "mysql" => {
            exec(conn, "SET SESSION max_recursive_iterations = 10000000");
            format!(
                "INSERT INTO items (id, name, stock, lock_version) \
                 WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < {n}) \
                 SELECT n, 'item', 10, 0 FROM seq"
            )
        }
        _ => format!(
            "INSERT INTO items (id, name, stock, lock_version) \
             WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < {n}) \
             SELECT n, 'item', 10, 0 FROM seq"
        ),
    };
    exec(conn, &generate);
}

/// Runs `$first` in a transaction on `$conn`, which then reads item 1, renames
/// it with a versioned write and rolls back: gives that struct, which holds a
/// number only the rolled-back transaction had.
macro_rules! renamed_then_rolled_back {
    ($conn:expr, |$c:ident| $first:block) => {{
        let mut kept = None;
        let rolled_back = $conn.transaction(|$c| {
            $first
            let mut a = item!($c, 1);
            a.name = "renamed".into();
            a.update_versioned($c)?;
            kept = Some(a);
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(rolled_back.is_err());
        kept.unwrap()
    }};
}

/// A's write of item 1 (v0 -> v1) rolls back; another instance commits v1
/// (stock 7). In a transaction on `$conn`, A's write finds the row at its own
/// rolled-back number, moves it past (v1 -> v2) and reports stale; A reloads
/// (v2) and, when `$writes`, sells one (v2 -> v3); the transaction rolls back
/// (v1 again). The other instance then sells one and commits v2 (stock 6):
/// the reloaded struct, holding a number only the rolled-back transaction
/// had, must be stale, and the other's sale stand.
macro_rules! assert_stale_after_a_rolled_back_move_past {
    ($db:ident, $writes:expr) => {{
        let (mut conn, mut other) = item_1_on_two_conns(&$db);
        let mut a = rolled_back_write!(conn);
        another_instance_commits(&mut other);
        let mut kept = None;
        let rolled_back = conn.transaction(|c| {
            a.stock = 5;
            assert_stale(a.update_versioned(c));
            let mut reloaded = item!(c, 1);
            assert_eq!(
                (reloaded.stock, reloaded.lock_version),
                (7, 2),
                "moved past A's number"
            );
            if $writes {
                reloaded.stock -= 1;
                reloaded.update_versioned(c)?;
            }
            kept = Some(reloaded);
            Err::<(), _>(Error::NoRowMatched)
        });
        assert!(rolled_back.is_err());
        exec(
            &mut other,
            "UPDATE items SET stock = 6, lock_version = 2 WHERE id = 1 AND lock_version = 1",
        );
        let mut held = kept.unwrap();
        held.stock = 1;
        assert_stale(held.update_versioned(&mut conn));
        assert_eq!(stock_of!(&mut other), 6, "the other instance's sale stands");
    }};
}

/// `Expected::apply`'s `current` for item 1: reads its version, counting the
/// reads in `$reads`; after the first, `$other` sells 2 and commits a newer
/// version, which a snapshot fixed by that read cannot see.
macro_rules! read_then_the_other_sells_2 {
    ($reads:ident, $other:ident) => {
        |c| {
            let version: i32 = items::table.find(1).select(items::lock_version).first(c)?;
            $reads += 1;
            if $reads == 1 {
                Item::update_by_version(
                    &mut $other,
                    1,
                    version,
                    items::stock.eq(items::stock - 2),
                )?;
            }
            Ok::<_, Error>(version)
        }
    };
}

mod all {
    use super::*;

    lockkit_tests::backend_tests! {
        // --- 1. a write under a lock advances the version -------------------------

        fn a_write_under_with_lock_makes_a_stale_optimistic_writer_stale(db) {
            let (mut a, mut b) = item_1_on_two_conns(&db);
            let mut o = item!(&mut a, 1);
            // The README's own with_lock example: a plain Diesel update in the closure.
            o.with_lock(&mut b, |c, fresh| {
                diesel::update(items::table.find(fresh.id))
                    .set(items::stock.eq(fresh.stock - 8))
                    .execute(c)?;
                Ok::<_, lockkit::Error>(())
            })
            .unwrap();
            o.stock -= 1;
            let err = o.update_versioned(&mut a).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err:?}");
            let stored = item!(&mut a, 1);
            assert_eq!((stored.stock, stored.lock_version), (2, 1), "eight sold once, version advanced once");
        }

        fn with_lock_and_a_versioned_write_inside_bump_once(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let o = item!(&mut conn, 1);
            let after = o
                .with_lock(&mut conn, |c, mut fresh| {
                    fresh.stock -= 1;
                    fresh.update_versioned(c)?;
                    Ok::<_, lockkit::Error>(fresh)
                })
                .unwrap();
            let stored = item!(&mut conn, 1);
            assert_eq!(stored, after, "the struct handed back is what is stored");
            assert_eq!(stored.stock, 9);
        }

        fn a_shared_lock_is_a_read_and_leaves_the_version(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut o = item!(&mut conn, 1);
            let seen = lockkit::with_lock(&mut conn, o.id, LockOptions::default().share(), |_, fresh: Item| Ok::<_, Error>(fresh.lock_version)).unwrap();
            assert_eq!(seen, 0);
            o.stock -= 1;
            o.update_versioned(&mut conn).unwrap();
        }

        fn lock_all_then_a_plain_update_makes_a_stale_optimistic_writer_stale(db) {
            let mut a = db.conn();
            let mut b = db.conn();
            seed_items(&mut a, &[(1, 10), (2, 10)]);
            let mut o = item!(&mut a, 2);
            let locked = locked_transaction(&mut b, LockOptions::default(), |c| {
                let rows = Item::lock_all(c, &[2, 1])?;
                for row in &rows {
                    diesel::update(items::table.find(row.id)).set(items::stock.eq(row.stock - 8)).execute(c)?;
                }
                Ok::<_, lockkit::Error>(rows)
            })
            .unwrap();
            assert_eq!(locked.iter().map(|r| r.lock_version).collect::<Vec<_>>(), vec![1, 1], "the rows carry their new version");
            o.stock -= 1;
            assert!(matches!(o.update_versioned(&mut a), Err(Error::Stale(_))));
            // A row handed out by lock_all can be written with a versioned write.
            let again = locked_transaction(&mut b, LockOptions::default(), |c| {
                let mut rows = Item::lock_all(c, &[1])?;
                rows[0].stock = 0;
                rows[0].update_versioned(c)?;
                Ok::<_, lockkit::Error>(rows.remove(0))
            })
            .unwrap();
            assert_eq!(item!(&mut a, 1), again);
        }

        fn a_versioned_conditional_update_makes_a_stale_optimistic_writer_stale(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut o = item!(&mut conn, 1);
            Item::update_if(&mut conn, 1, items::stock.ge(8), items::stock.eq(items::stock - 8)).unwrap();
            assert!(matches!(
                Item::update_if(&mut conn, 1, items::stock.ge(8), items::stock.eq(items::stock - 8)),
                Err(Error::NoRowMatched)
            ));
            o.stock -= 1;
            assert!(matches!(o.update_versioned(&mut conn), Err(Error::Stale(_))));
            let stored = item!(&mut conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (2, 1));
        }

        fn a_first_update_if_in_a_transaction_waits_for_another_writer(db) {
            // `update_if` asks the catalog whether the key is enforced once
            // per connection. Asked before its `UPDATE`, in a deferred SQLite
            // transaction that read made the `UPDATE` fail `Busy` at once
            // while another connection wrote, instead of waiting its turn.
            let mut holder = db.conn();
            seed_items(&mut holder, &[(1, 10)]);
            let mut buyer = db.connect(); // a connection that never asked
            let held = Barrier::new(2);
            let sold = thread::scope(|s| {
                s.spawn(|| {
                    holder
                        .transaction(|c| {
                            exec(c, "UPDATE items SET stock = stock - 1 WHERE id = 1");
                            held.wait();
                            thread::sleep(std::time::Duration::from_millis(300));
                            Ok::<_, Error>(())
                        })
                        .unwrap();
                });
                held.wait();
                buyer.transaction(|c| {
                    Item::update_if(c, 1, items::stock.ge(8), items::stock.eq(items::stock - 8))
                })
            });
            assert!(sold.is_ok(), "the first update_if on a connection, in a transaction: {sold:?}");
            assert_eq!(stock_of!(&mut db.conn(), 1), 1, "both writes stand");
        }

        // --- 2. a rolled-back write is never mistaken for a committed one ---------

        fn a_rolled_back_write_never_overwrites_a_later_writer(db) {
            let (mut a_conn, mut b_conn) = item_1_on_two_conns(&db);
            let mut a = rolled_back_write!(a_conn);
            assert_eq!(item!(&mut a_conn, 1).lock_version, 0, "the row is back at version 0");

            let mut b = item!(&mut b_conn, 1);
            b.stock = 7;
            b.update_versioned(&mut b_conn).unwrap();

            a.stock = 3;
            let err = a.update_versioned(&mut a_conn).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err:?}");
            let stored = item!(&mut a_conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (7, 2), "B's write stands; the version moved past the reused number");
            // B's write did not commit the number A's rolled-back write gave A: it
            // moved the row past it at once, and B's struct holds the number after,
            // so B writes again without a reload.
            assert_eq!(b.lock_version, 2);
            b.stock = 6;
            b.update_versioned(&mut b_conn).unwrap();
            // A, reloaded, writes too.
            let mut a = item!(&mut a_conn, 1);
            a.stock = 5;
            a.update_versioned(&mut a_conn).unwrap();
        }

        fn a_rolled_back_number_is_never_committed_by_a_later_writer_in_a_transaction(db) {
            // As above, but B writes inside a transaction of its own: B's write
            // would commit the very number A's rolled-back write gave A (1), and
            // A's next write, expecting 1, would land over B's.
            let (mut a_conn, mut b_conn) = item_1_on_two_conns(&db);
            let mut a = rolled_back_write!(a_conn);

            let mut b = item!(&mut b_conn, 1);
            b_conn.transaction(|c| {
                b.stock = 6;
                b.update_versioned(c)
            }).unwrap();
            assert_eq!(item!(&mut b_conn, 1).stock, 6);

            a.stock = 3;
            let err = a.update_versioned(&mut a_conn).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err:?}");
            let stored = item!(&mut a_conn, 1);
            assert_eq!(stored.stock, 6, "B's write stands");
            // B's struct holds what its commit left (moved past A's number): it
            // writes again.
            b.stock = 4;
            b.update_versioned(&mut b_conn).unwrap();
            let stored = item!(&mut a_conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (4, b.lock_version));
        }

        fn a_struct_of_another_declaration_of_the_table_read_in_a_rolled_back_transaction_is_stale(db) {
            // `items` declared twice (`StockItem`'s `stock_items` is `items` by
            // its SQL name). A's `Item` write rolls back, with a `StockItem`
            // read after it; B's `StockItem` write then commits the number that
            // struct holds. The journal names the row as the database does, so
            // B moves past it and the struct is stale, whichever declaration
            // wrote and read.
            let (mut a_conn, mut b_conn) = item_1_on_two_conns(&db);
            let mut read_then = None;
            let rolled_back: Result<(), Error> = a_conn.transaction(|c| {
                let mut a = item!(c, 1);
                a.stock = 5;
                a.update_versioned(c)?;
                read_then = Some(stock_item!(c));
                Err(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            let mut held = read_then.unwrap();
            assert_eq!(held.lock_version, 1, "read after the rolled-back write");

            let mut b = stock_item!(&mut b_conn);
            b.stock = 9;
            b.update_versioned(&mut b_conn).unwrap();

            held.stock = 3;
            let err = held.update_versioned(&mut a_conn).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err:?}");
            assert_eq!(stock_of!(&mut a_conn, 1), 9, "B's write stands");
        }

        fn a_version_from_outside_naming_a_rolled_back_number_is_stale(db) {
            // A client's tag (a form's field, `If-Match`) names a number it read
            // from a committed row. One a rolled-back write of this process left
            // is not such a number (another row's tag, a guess): where a held
            // struct is restored, `update_by_version` is stale, and writes
            // nothing over content the client never read.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let _held = rolled_back_write!(conn);
            let err = Item::update_by_version(&mut conn, 1, 1, items::stock.eq(3)).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err:?}");
            let err = Item::update_all_by_version(&mut conn, &[(1, 1)], items::stock.eq(3)).unwrap_err();
            assert!(matches!(err, Error::StaleRows(_)), "{err:?}");
            let err = Item::delete_by_version(&mut conn, 1, 1).unwrap_err();
            assert!(matches!(err, Error::Stale(_)), "{err:?}");
            let stored = item!(&mut conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (10, 0), "nothing written");
            // The committed number writes.
            Item::update_by_version(&mut conn, 1, 0, items::stock.eq(3)).unwrap();
            assert_eq!(stock_of!(&mut conn, 1), 3);
        }

        fn a_struct_deleted_after_its_write_rolled_back_deletes_as_if_restored(db) {
            // A held struct, unlike a version from outside: restored.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let a = rolled_back_write!(conn);
            a.delete_versioned(&mut conn).unwrap();
            assert_eq!(items::table.count().get_result::<i64>(&mut conn).unwrap(), 0);
        }

        fn writers_that_roll_back_and_retry_on_shared_rows_lose_nothing(db) {
            // Six threads on two rows: each increment is first written in a
            // transaction that rolls back, then the same struct is written again
            // in a transaction that commits (reloaded when stale). Before the
            // journal moved rows past rolled-back numbers, a struct holding one
            // could match another thread's commit of that number: 1 to 9 of 72
            // increments were lost (12 per thread).
            const THREADS: i32 = 6;
            const INCREMENTS: i32 = 25;
            seed_items(&mut db.conn(), &[(1, 0), (2, 0)]);
            thread::scope(|s| {
                for t in 0..THREADS {
                    let db = &db;
                    s.spawn(move || {
                        let mut conn = db.conn();
                        let id = 1 + t % 2;
                        for _ in 0..INCREMENTS {
                            let mut item = item!(&mut conn, id);
                            let rolled_back: Result<(), Error> = conn.transaction(|c| {
                                item.stock += 1;
                                item.update_versioned(c)?;
                                Err(Error::NoRowMatched)
                            });
                            assert!(rolled_back.is_err());
                            item.stock -= 1;
                            loop {
                                item.stock += 1;
                                match conn.transaction(|c| item.update_versioned(c)) {
                                    Ok(()) => break,
                                    Err(Error::Stale(_)) => item = item!(&mut conn, id),
                                    Err(err) if err.is_retryable() => item = item!(&mut conn, id),
                                    Err(err) => panic!("{err}"),
                                }
                            }
                        }
                    });
                }
            });
            let stock: Vec<i32> = items::table.order(items::id).select(items::stock).load(&mut db.conn()).unwrap();
            assert_eq!(stock, vec![THREADS / 2 * INCREMENTS; 2], "no increment lost");
        }

        fn with_lock_after_a_rolled_back_lock_reads_the_row_afresh(db) {
            // A's `with_lock` bumps the version (0 -> 1) and rolls back; B, another
            // process (whose lockkit A's does not hear from), locks and commits the
            // same number. A's next `with_lock` reads the row under lock:
            // its version is the row's, not the one A's rollback left behind, so it
            // locks. (It used to "restore" to 0, find 1, move the row to 2 and report
            // Stale, in the transaction that Stale then rolled back: Stale forever.)
            let (mut a_conn, mut b_conn) = item_1_on_two_conns(&db);
            let lock = |conn: &mut _, add: i32| {
                lockkit::with_lock(conn, 1, LockOptions::default(), |conn, item: Item| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(item.stock + add)).execute(conn)?;
                    if add < 0 {
                        return Err(Error::NoRowMatched); // roll back
                    }
                    Ok(())
                })
            };
            assert!(lock(&mut a_conn, -1).is_err());
            exec(&mut b_conn, "UPDATE items SET stock = stock + 2, lock_version = lock_version + 1 WHERE id = 1");
            lock(&mut a_conn, 3).unwrap();
            let stored = item!(&mut a_conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (15, 2), "B's and A's writes, one bump each");
        }

        fn a_fresh_read_in_a_retried_transaction_writes_over_a_number_another_instance_committed(db) {
            // A's versioned write (v0 -> v1) rolls back; another instance commits
            // its own v1. A then reads the row afresh in `transaction_with_retry`
            // and writes: the struct holds the row's 1, the other's, not the one
            // A's rollback left behind, so the write must land, at the latest
            // after a retry that reads again. (Each attempt used to take the read
            // for the rolled-back struct, find the row past 0 and report Stale, in
            // the transaction that Stale then rolled back: Stale on every retry.)
            let (mut a_conn, mut other, mut held) = rolled_back_then_committed_elsewhere!(db);
            let sold = lockkit::transaction_with_retry(&mut a_conn, &RetryPolicy::immediate(3), |c| {
                let mut item = item!(c, 1);
                item.stock -= 1;
                item.update_versioned(c)?;
                Ok::<_, Error>(item.stock)
            });
            // The first attempt moved the row past the number (1 -> 2, data
            // untouched), which its rollback undid and lockkit made again outside
            // it; the second attempt read 2 and wrote 3.
            let stored = item!(&mut other, 1);
            assert!(
                matches!(sold, Ok(6)) && (stored.stock, stored.lock_version) == (6, 3),
                "a fresh read of the other's commit was refused: {sold:?}, row {stored:?}"
            );
            assert_never_writes!(held, a_conn, other);
        }

        fn a_bulk_write_retried_after_its_rollback_undid_its_move_past_writes(db) {
            // As above, with `update_all_by_version`, which opens a
            // transaction of its own: its stale report's move past (1 -> 2)
            // goes with its rollback, and must be made again, or every retry
            // that reads the row afresh finds the other's 1 again and is
            // stale, attempt after attempt.
            let (mut a_conn, mut other, mut held) = rolled_back_then_committed_elsewhere!(db);
            let sold = lockkit::retry(&RetryPolicy::immediate(3), |_| {
                let version = item!(&mut a_conn, 1).lock_version;
                Item::update_all_by_version(&mut a_conn, &[(1, version)], items::stock.eq(items::stock - 1))
            });
            let stored = item!(&mut other, 1);
            assert!(
                sold.is_ok() && (stored.stock, stored.lock_version) == (6, 3),
                "a fresh read of the other's commit was refused: {sold:?}, row {stored:?}"
            );
            assert_never_writes!(held, a_conn, other);
        }

        fn a_move_past_undone_by_a_nested_rollback_is_made_again_when_the_outer_transaction_commits(db) {
            // As above, but the stale write runs in a nested call whose savepoint
            // rolls back, inside a lockkit transaction that then commits: the
            // move past is made again after the commit, so that a fresh read in
            // a transaction of the application's own writes at once.
            let (mut a_conn, mut other, mut held) = rolled_back_then_committed_elsewhere!(db);
            lockkit::locked_transaction(&mut a_conn, LockOptions::default(), |c| {
                let nested = lockkit::transaction_with_retry(c, &RetryPolicy::immediate(1), |c| {
                    let mut item = item!(c, 1);
                    item.stock -= 1;
                    item.update_versioned(c)
                });
                assert!(matches!(nested, Err(Error::Stale(_))), "{nested:?}");
                Ok::<_, Error>(())
            })
            .unwrap();
            let moved = item!(&mut other, 1);
            assert_eq!((moved.stock, moved.lock_version), (7, 2), "moved past the number, data untouched");
            let sold = a_conn.transaction(|c| {
                let mut item = item!(c, 1);
                item.stock -= 1;
                item.update_versioned(c)?;
                Ok::<_, Error>(item.stock)
            });
            assert!(matches!(sold, Ok(6)), "{sold:?}");
            assert_never_writes!(held, a_conn, other);
        }

        fn a_with_lock_bump_moves_past_a_rolled_back_number(db) {
            // A's write is rolled back (A holds 1, the row is back at 0); B's
            // `with_lock` then bumps the row it locks to 1, A's rolled-back
            // number, and must move it past, or A's next write, expecting 1,
            // lands over B's.
            let (mut a_conn, mut b_conn) = item_1_on_two_conns(&db);
            let mut a = rolled_back_write!(a_conn);
            lockkit::with_lock(&mut b_conn, 1, LockOptions::default(), |conn, item: Item| {
                diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 4)).execute(conn)?;
                Ok::<_, Error>(())
            })
            .unwrap();
            a.stock = 3;
            let written = a.update_versioned(&mut a_conn);
            let stored = item!(&mut a_conn, 1);
            assert!(
                matches!(written, Err(Error::Stale(_))) && stored.stock == 6,
                "A's rolled-back number matched the row B's with_lock left: {written:?}, row {stored:?} \
                 (B's stock 6 overwritten)"
            );
        }

        fn a_struct_retried_after_a_rollback_writes_as_if_restored(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut a = item!(&mut conn, 1);
            let mut attempts = 0;
            lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
                attempts += 1;
                a.stock = 9;
                a.update_versioned(c)?;
                if attempts == 1 {
                    return Err(Error::Deadlock); // a conflict after the write
                }
                Ok(())
            })
            .unwrap();
            assert_eq!(attempts, 2);
            let stored = item!(&mut conn, 1);
            // One committed write; the number the rolled-back attempt left (1) is
            // skipped: a copy of the struct may hold it.
            assert_eq!((stored.stock, stored.lock_version), (9, 2));
            assert_eq!(a, stored);
            // Without a retry, the struct keeps working after the rollback as well.
            let _ = conn.transaction(|c| {
                a.stock = 1;
                a.update_versioned(c)?;
                Err::<(), _>(Error::NoRowMatched)
            });
            a.stock = 8;
            a.update_versioned(&mut conn).unwrap();
            assert_eq!(item!(&mut conn, 1), a);
        }

        fn a_struct_read_after_an_update_if_in_a_rolled_back_transaction_is_never_restored(db) {
            // `update_if` moves the version without a number lockkit knows
            // (v0 -> v1); a struct read after it writes v1 -> v2, and the
            // transaction rolls back (the row is at v0 again). Restored to v1,
            // the struct would match the next writer's commit of v1, here
            // another process's, which lockkit's record never sees.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut a = renamed_then_rolled_back!(conn, |c| {
                Item::update_if(c, 1, items::stock.ge(1), items::stock.eq(items::stock - 1))?;
            });
            exec(&mut db.conn(), "UPDATE items SET stock = 5, lock_version = 1 WHERE id = 1 AND lock_version = 0");
            assert_stale(a.update_versioned(&mut conn));
            assert_eq!(stock_of!(&mut conn), 5, "the other writer's sale stands");
        }

        fn a_struct_only_read_after_an_update_if_in_a_rolled_back_transaction_is_stale(db) {
            // `update_if` moves the version (v0 -> v1) and a struct read after
            // it holds v1 without writing; the transaction rolls back (v0
            // again), and another connection's versioned write commits v1. The
            // struct must not match that commit.
            let (mut conn, mut other) = item_1_on_two_conns(&db);
            let mut kept = None;
            let rolled_back = conn.transaction(|c| {
                Item::update_if(c, 1, items::stock.ge(1), items::stock.eq(items::stock - 1))?;
                kept = Some(item!(c, 1));
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            let mut b = kept.unwrap();
            assert_eq!(b.lock_version, 1);
            let mut f = item!(&mut other, 1);
            f.stock = 3;
            f.update_versioned(&mut other).unwrap();
            b.stock = 7;
            assert_stale(b.update_versioned(&mut conn));
            assert_eq!(stock_of!(&mut other), 3, "the other writer's sale stands");
        }

        fn if_match_any_writes_again_only_for_its_own_rows_stale_report(db) {
            // `*` writes again when its row moved on between the read and the
            // write. A `write` that also writes another row from a stale copy
            // (here: item 2 at a version it no longer has) reports that row's
            // staleness: not a reason to write item 1 again, which committed.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10), (2, 10)]);
            exec(&mut conn, "UPDATE items SET lock_version = 3 WHERE id = 2");
            let outcome = Expected::Any.apply(
                &mut *conn,
                |c| Ok::<i32, Error>(items::table.find(1).select(items::lock_version).first(c)?),
                |c, version| {
                    Item::update_by_version(c, 1, version, items::stock.eq(items::stock - 1))?;
                    Item::update_by_version(c, 2, 1, items::stock.eq(items::stock - 1))
                },
            );
            assert!(matches!(&outcome, Err(Error::Stale(stale)) if stale.expected_version == 1), "{outcome:?}");
            assert_eq!(lockkit::etag::status_for(&outcome.unwrap_err()), 412);
            assert_eq!((stock_of!(&mut conn, 1), stock_of!(&mut conn, 2)), (9, 10), "item 1 written once");
        }

        fn an_update_if_committed_in_a_transaction_never_hands_a_rolled_back_number_on(db) {
            // A's write (v0 -> v1) rolls back; an `update_if` in a committed
            // transaction then moves the row from v0: it must not commit A's
            // number 1, which A's write would match.
            let (mut conn, mut other) = item_1_on_two_conns(&db);
            let mut a = rolled_back_write!(conn);
            other
                .transaction(|c| Item::update_if(c, 1, items::stock.ge(1), items::stock.eq(items::stock - 1)))
                .unwrap();
            a.stock = 2;
            assert_stale(a.update_versioned(&mut conn));
            assert_eq!(stock_of!(&mut other), 9, "the sale stands");
        }

        fn a_stale_report_keeps_the_rolled_back_number_the_row_holds_again(db) {
            // A's write (v0 -> v1) rolls back; another process moves the row to
            // v2; B reads v2 and its write (v2 -> v3) rolls back; the other
            // process commits v3 with its sale. A's write is stale, and must
            // not forget B's rolled-back 3, which the row now holds: B's write
            // would match it.
            let (mut conn, mut other) = item_1_on_two_conns(&db);
            let mut a = rolled_back_write!(conn);
            exec(&mut other, "UPDATE items SET lock_version = 2 WHERE id = 1");
            let mut b = rolled_back_write!(conn);
            assert_eq!(b.lock_version, 3);
            exec(&mut other, "UPDATE items SET stock = 2, lock_version = 3 WHERE id = 1 AND lock_version = 2");
            a.stock = 1;
            assert_stale(a.update_versioned(&mut conn));
            b.stock = 4;
            assert_stale(b.update_versioned(&mut conn));
            assert_eq!(stock_of!(&mut other), 2, "the other writer's sale stands");
        }

        fn a_struct_written_after_a_move_past_in_a_rolled_back_transaction_is_stale(db) {
            assert_stale_after_a_rolled_back_move_past!(db, true);
        }

        fn a_struct_read_after_a_move_past_in_a_rolled_back_transaction_is_stale(db) {
            assert_stale_after_a_rolled_back_move_past!(db, false);
        }

        fn a_write_onto_the_maximum_a_rolled_back_write_left_commits_and_reports_so(db) {
            // A's write (MAX-1 -> MAX) rolls back; a fresh reader's write then
            // commits MAX, a number A holds, and there is no number past it.
            // The fresh write stands and says so; A is refused.
            let mut conn = db.conn();
            let mut a = gadget_rolled_back_onto_the_maximum!(conn);
            let mut fresh = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
            fresh.label = "fresh".into();
            let outcome = fresh.update_versioned(&mut conn);
            assert!(outcome.is_ok(), "{outcome:?}");
            let stored = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
            assert_eq!((stored.label.as_str(), stored.revision), ("fresh", i16::MAX));
            assert_eq!(fresh, stored);
            a.label = "again".into();
            let outcome = a.update_versioned(&mut conn);
            assert!(outcome.is_err(), "{outcome:?}");
            assert_eq!(gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap(), stored);
        }

        fn a_write_in_a_transaction_onto_the_maximum_a_rolled_back_write_left_is_refused(db) {
            // As above, but the fresh write runs in a transaction: there it is
            // refused before the commit. Recorded and committed, its record
            // would have replaced the rolled-back maximum's, and A's delete,
            // which needs no number past it, would have matched the commit.
            let mut conn = db.conn();
            let a = gadget_rolled_back_onto_the_maximum!(conn);
            let outcome = conn.transaction(|c| {
                let mut fresh = gadgets::table.find(1).first::<Gadget>(c)?;
                fresh.label = "fresh".into();
                fresh.update_versioned(c)
            });
            assert!(matches!(outcome, Err(Error::VersionOverflow { .. })), "{outcome:?}");
            let outcome = conn.transaction(|c| {
                let mut fresh = gadgets::table.find(1).first::<Gadget>(c)?;
                fresh.label = "fresh".into();
                let _ = fresh.update_versioned(c); // let go: the write stands in the transaction
                Ok::<_, Error>(())
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            let stored = gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap();
            assert_eq!((stored.label.as_str(), stored.revision), ("fresh", i16::MAX));
            let deleted = a.delete_versioned(&mut conn);
            assert!(deleted.is_err(), "{deleted:?}");
            assert_eq!(gadgets::table.find(1).first::<Gadget>(&mut conn).unwrap(), stored);
        }

        fn a_struct_retried_after_a_rollback_writes_although_update_if_moved_another_row(db) {
            // `update_if` on item 2 says nothing of item 1's number: the struct
            // of item 1, read before the transaction, is restored as usual.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10), (2, 10)]);
            let mut a = item!(&mut conn, 1);
            let mut attempts = 0;
            let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
                attempts += 1;
                Item::update_if(c, 2, items::stock.ge(1), items::stock.eq(items::stock - 1))?;
                a.stock = 9;
                a.update_versioned(c)?;
                if attempts == 1 {
                    return Err(Error::Deadlock); // a conflict after the writes
                }
                Ok(())
            });
            assert!(outcome.is_ok() && attempts == 2, "{outcome:?} after {attempts}");
            assert_eq!((stock_of!(&mut conn, 1), stock_of!(&mut conn, 2)), (9, 9));
        }

        fn a_struct_read_after_a_trigger_bump_in_a_rolled_back_transaction_is_never_restored(db) {
            // With the version trigger, a plain `UPDATE` in `with_lock`'s
            // closure moves the version past the lock's own bump (v0 -> v1 ->
            // v2) without a number lockkit knows; a struct read after it writes
            // v2 -> v3, and the transaction rolls back (v0 again). Another
            // process then commits two writes (v2).
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            exec(&mut conn, &up_sql(dialect(BACKEND), "items", "lock_version").unwrap());
            let mut a = renamed_then_rolled_back!(conn, |c| {
                lockkit::with_lock(c, 1, LockOptions::default(), |c, _: Item| {
                    exec(c, "UPDATE items SET stock = stock - 1 WHERE id = 1");
                    Ok::<_, Error>(())
                })?;
            });
            exec(&mut db.conn(), "UPDATE items SET stock = 6 WHERE id = 1");
            exec(&mut db.conn(), "UPDATE items SET stock = 5 WHERE id = 1");
            assert_eq!(item!(&mut conn, 1).lock_version, 2);
            assert_stale(a.update_versioned(&mut conn));
            assert_eq!(stock_of!(&mut conn), 5, "the other writer's sale stands");
        }

        fn a_rolled_back_savepoint_is_tracked_like_a_transaction(db) {
            let (mut a_conn, mut b_conn) = item_1_on_two_conns(&db);
            let mut a = item!(&mut a_conn, 1);
            write_in_a_failed_savepoint!(a_conn, a, |c| { Err(Error::NoRowMatched) });
            b_commits_then_a_is_stale!(&mut a_conn, &mut b_conn, a, "a savepoint rolled back");
        }

        fn a_committed_transaction_leaves_the_struct_writable(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut a = item!(&mut conn, 1);
            conn.transaction(|c| {
                a.stock = 5;
                a.update_versioned(c)?;
                a.stock = 4;
                a.update_versioned(c)
            })
            .unwrap();
            a.stock = 3;
            a.update_versioned(&mut conn).unwrap();
            let stored = item!(&mut conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (3, 3));
        }

        fn the_journal_watches_bare_and_pooled_connections(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut bare = db.connect();
            let mut pooled = db.conn();
            let mut a = item!(&mut bare, 1);
            bare.transaction(|c| a.update_versioned(c)).unwrap();
            assert!(bare.instrumentation().is::<Journal>(), "bare connection");
            let mut b = item!(&mut pooled, 1);
            pooled.transaction(|c| b.update_versioned(c)).unwrap();
            assert!(pooled.instrumentation().is::<Journal>(), "pooled connection");
            // The committed structs write on.
            b.update_versioned(&mut pooled).unwrap();
            a = item!(&mut bare, 1);
            a.update_versioned(&mut bare).unwrap();
        }

        fn a_connection_with_its_own_instrumentation_keeps_it_and_never_loses_an_update(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counter = seen.clone();
            let mut own = db.connect();
            own.set_instrumentation(move |_: diesel::connection::InstrumentationEvent<'_>| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
            let mut other = db.connect();
            let mut a = item!(&mut own, 1);
            let _ = own.transaction(|c| {
                a.update_versioned(c)?;
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(!own.instrumentation().is::<Journal>(), "the user's instrumentation stays");
            let mut b = item!(&mut other, 1);
            b.stock = 7;
            b.update_versioned(&mut other).unwrap();
            assert!(matches!(a.update_versioned(&mut own), Err(Error::Stale(_))), "never over B");
            assert_eq!(item!(&mut other, 1).stock, 7);
            assert!(seen.load(std::sync::atomic::Ordering::Relaxed) > 0);

            // Wrapped in a journal, it sees every event and lockkit sees commits.
            let counter = seen.clone();
            own.set_instrumentation(Journal::wrap(move |_: diesel::connection::InstrumentationEvent<'_>| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }));
            let before = seen.load(std::sync::atomic::Ordering::Relaxed);
            let mut c = item!(&mut own, 1);
            own.transaction(|conn| c.update_versioned(conn)).unwrap();
            c.update_versioned(&mut own).unwrap();
            assert!(seen.load(std::sync::atomic::Ordering::Relaxed) > before);
        }

        fn a_rolled_back_struct_never_writes_over_a_later_commit_on_a_connection_with_its_own_instrumentation(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            // One connection, as a pool of one hands it to request after request,
            // with the application's query logger as its instrumentation.
            let mut own: Conn = db.connect();
            unwatched(&mut own);
            // Request A reads v0 and writes it in a transaction that rolls back:
            // the row is back at v0, `a` holds 1.
            let mut a = rolled_back_write!(own);
            // Request B reads v0, sets the stock to 7 and commits: v1, B's data.
            own.transaction(|c| {
                let mut b = item!(c, 1);
                b.stock = 7;
                b.update_versioned(c)
            })
            .unwrap();
            // Request A tries again in a transaction: its 1 was rolled back, the
            // row's 1 is B's. It must be stale, and B's 7 must stay.
            a.stock = 3;
            let again = own.transaction(|c| a.update_versioned(c));
            let stock = stock_of!(&mut own);
            assert!(
                matches!(again, Err(Error::Stale(_))) && stock == 7,
                "A's rolled-back version 1 matched B's committed 1: {again:?}, stock {stock} (B's 7 lost)"
            );
        }

        fn a_retried_transaction_never_writes_over_another_instances_commit_on_a_connection_with_its_own_instrumentation(db) {
            let (mut own, mut other) = own_unwatched_and_other(&db);
            let mut a = item!(&mut own, 1); // v0
            let mut attempt = 0;
            let policy = RetryPolicy::default().max_attempts(3);
            let result = lockkit::transaction_with_retry(&mut own, &policy, |c| {
                attempt += 1;
                if attempt == 2 {
                    // Between the attempts another instance of the application
                    // writes the row: its `update_versioned`, as docs/SQL.md shows
                    // it (stock 7, v0 -> v1).
                    another_instance_commits(&mut other);
                }
                a.stock = 3;
                a.update_versioned(c)?;
                match attempt {
                    1 => Err(Error::Deadlock), // the first attempt is rolled back and retried
                    _ => Ok(()),
                }
            });
            // The struct is stale from the second attempt on (`Stale`, and the
            // retries run out on it: `RetriesExhausted`), and the other write stays.
            let stock = stock_of!(&mut other);
            assert!(
                result.is_err() && stock == 7,
                "the retry wrote with the rolled-back version 1 over the other instance's 1: \
                 {result:?}, stock {stock} (its 7 lost)"
            );
        }

        fn a_rolled_back_struct_never_writes_over_another_instances_commit_in_a_later_plain_transaction_on_a_connection_with_its_own_instrumentation(db) {
            // One connection, as a pool of one hands it to request after
            // request, with the application's query logger: lockkit sees no
            // `BEGIN`, `COMMIT` or `ROLLBACK` on it.
            let (mut own, mut other) = own_unwatched_and_other(&db);
            // Request A reads v0 and writes it in a plain Diesel transaction
            // that rolls back: the row is back at v0, `a` holds 1.
            let mut a = rolled_back_write!(own);
            another_instance_commits(&mut other);
            // Request A tries again in a plain transaction at the same depth:
            // its 1 was rolled back, the row's 1 is the other instance's.
            a.stock = 3;
            let again = own.transaction(|c| a.update_versioned(c));
            assert_stale_over_the_other(again, stock_of!(&mut other), "request A");
        }

        fn a_struct_written_on_a_dropped_connection_never_writes_over_a_commit_on_the_one_that_took_its_place(db) {
            dropped_and_replaced!(db, unwatched);
        }

        fn a_struct_written_on_a_dropped_connection_never_writes_over_a_commit_on_a_watched_one_that_took_its_place(db) {
            // The new connection has no instrumentation: lockkit installs its
            // journal there, and must still not take the old one's write for
            // its own transaction's.
            dropped_and_replaced!(db, |_: &mut Conn| {});
        }

        fn a_struct_written_in_a_committed_plain_transaction_writes_on_on_a_connection_with_its_own_instrumentation(db) {
            // What lockkit asks such a connection must not cost: a struct whose
            // write committed writes on, in the next transaction and outside one.
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut own: Conn = db.connect();
            unwatched(&mut own);
            let mut a = item!(&mut own, 1);
            for _ in 0..2 {
                own.transaction(|c| {
                    a.stock -= 1;
                    a.update_versioned(c)
                })
                .unwrap();
            }
            a.stock -= 1;
            a.update_versioned(&mut own).unwrap();
            let stored = item!(&mut own, 1);
            assert_eq!((stored.stock, stored.lock_version), (7, 3));
            assert_eq!(stored, a);
        }

        fn a_connection_with_its_own_instrumentation_writes_a_struct_twice_in_one_transaction(db) {
            // What the rules above must not cost: writes of one struct that
            // follow each other in one transaction (the bump of `with_lock`,
            // then the save; two saves in a plain Diesel transaction) are not
            // taken for a rolled-back write.
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut own: Conn = db.connect();
            unwatched(&mut own);
            lockkit::with_lock(&mut own, 1, LockOptions::default(), |c, mut item: Item| {
                item.stock -= 1;
                item.update_versioned(c)
            })
            .unwrap();
            let mut a = item!(&mut own, 1);
            own.transaction(|c| {
                a.stock -= 1;
                a.update_versioned(c)?;
                a.stock -= 1;
                a.update_versioned(c)
            })
            .unwrap();
            assert_eq!(stock_of!(&mut own), 7);
        }

        fn a_connection_with_its_own_instrumentation_works_on_past_the_marks_it_keeps(db) {
            // A pooled connection lives for hours. Past the latest 1024 marks
            // it keeps (`Mark::KEPT`), the newest must be the ones kept: a
            // struct written in a committed transaction a few writes ago
            // writes on, and a rolled-back one is still stale.
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let mut own: Conn = db.connect();
            unwatched(&mut own);
            let mut other: Conn = db.connect();
            let mut busy = item!(&mut own, 2);
            let mut write_busy = |own: &mut Conn, times: usize| {
                for n in 0..times {
                    own.transaction(|c| {
                        busy.stock += 1;
                        busy.update_versioned(c)
                    })
                    .unwrap_or_else(|e| panic!("write {n} of a struct that committed each: {e:?}"));
                }
            };
            write_busy(&mut own, 1100);

            let mut a = item!(&mut own, 1);
            own.transaction(|c| {
                a.stock = 9;
                a.update_versioned(c)
            })
            .unwrap();
            write_busy(&mut own, 10);
            a.stock = 8;
            own.transaction(|c| a.update_versioned(c))
                .expect("a struct whose write committed ten marks ago writes on");

            let mut rolled_back = rolled_back_write!(own);
            write_busy(&mut own, 10);
            exec(
                &mut other,
                "UPDATE items SET stock = 7, lock_version = lock_version + 1 WHERE id = 1",
            );
            rolled_back.stock = 3;
            let again = own.transaction(|c| rolled_back.update_versioned(c));
            assert_stale_over_the_other(again, stock_of!(&mut other), "a struct rolled back past 1100 marks");
        }

        fn a_struct_ahead_of_the_row_is_reported_as_such(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut a = item!(&mut conn, 1);
            a.lock_version = 4; // a version the row never had
            let err = a.update_versioned(&mut conn).unwrap_err();
            let stale = err.as_stale().expect("stale");
            assert_eq!(stale.current, CurrentState::Behind(0));
            assert!(err.to_string().contains("behind"), "{err}");
        }

        // --- 4. the version trigger only moves forward -----------------------------

        fn the_version_trigger_never_lets_a_raw_writer_move_the_version_back(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            exec(&mut conn, &up_sql(dialect(BACKEND), "items", "lock_version").unwrap());
            let mut stale = item!(&mut conn, 1); // v0
            exec(&mut conn, "UPDATE items SET stock = 2 WHERE id = 1"); // v1
            // A plain save of an old struct writes its old version back.
            exec(&mut conn, "UPDATE items SET stock = 3, lock_version = 0 WHERE id = 1");
            exec(&mut conn, "UPDATE items SET stock = 4, lock_version = lock_version WHERE id = 1");
            let stored = item!(&mut conn, 1);
            assert_eq!((stored.stock, stored.lock_version), (4, 3), "every raw write advanced it");
            stale.stock = 1;
            assert!(matches!(stale.update_versioned(&mut conn), Err(Error::Stale(_))));
            // lockkit's own write still bumps exactly once.
            let mut fresh = item!(&mut conn, 1);
            fresh.update_versioned(&mut conn).unwrap();
            assert_eq!(item!(&mut conn, 1).lock_version, 4);
        }

        // --- 5. a key that matches several rows -------------------------------------

        fn a_key_matching_several_rows_is_an_error_and_writes_nothing(db) {
            let mut conn = db.conn();
            exec(&mut conn, "INSERT INTO twins (id, label, lock_version) VALUES (1, 'a', 0)");
            exec(&mut conn, "INSERT INTO twins (id, label, lock_version) VALUES (1, 'b', 0)");
            let mut twin = Twin { id: 1, label: "c".into(), lock_version: 0 };
            let labels = |conn: &mut _| twins::table.order(twins::label).select((twins::label, twins::lock_version)).load::<(String, i32)>(conn).unwrap();
            let before = labels(&mut conn);

            let err = twin.update_versioned(&mut conn).unwrap_err();
            assert!(matches!(err, Error::AmbiguousKey { table: "twins", .. }), "{err:?}");
            assert_eq!(twin.lock_version, 0);
            assert_eq!(labels(&mut conn), before, "nothing was written");

            let err = twin.delete_versioned(&mut conn).unwrap_err();
            assert!(matches!(err, Error::AmbiguousKey { .. }), "{err:?}");
            assert_eq!(labels(&mut conn), before, "nothing was deleted");

            let err = Twin::update_if(&mut conn, 1, twins::lock_version.ge(0), twins::label.eq("c")).unwrap_err();
            assert!(matches!(err, Error::AmbiguousKey { table: "twins", .. }), "update_if: {err:?}");
            assert_eq!(labels(&mut conn), before, "nothing was written by update_if");

            // Inside a transaction the statement is undone too, and the transaction goes on.
            conn.transaction(|c| {
                assert!(matches!(twin.touch_versioned(c), Err(Error::AmbiguousKey { .. })));
                let err = Twin::update_if(c, 1, twins::lock_version.ge(0), twins::label.eq("d")).unwrap_err();
                assert!(matches!(err, Error::AmbiguousKey { .. }), "update_if in a transaction: {err:?}");
                exec(c, "INSERT INTO twins (id, label, lock_version) VALUES (2, 'z', 0)");
                Ok::<_, Error>(())
            })
            .unwrap();
            assert_eq!(labels(&mut conn)[..2], before[..]);
            // A key that matches one row writes as usual.
            let mut single = Twin { id: 2, label: "y".into(), lock_version: 0 };
            single.update_versioned(&mut conn).unwrap();
            assert_eq!(single.lock_version, 1);
        }

        fn a_key_unique_in_the_connections_table_of_that_name_is_not_unique_in_the_archive(db) {
            // `lockkit_archive.items` enforces no key; the connection's own
            // `items` enforces its primary key. The question whether the key is
            // unique is asked of the table the write goes to, so the write
            // matching two archived rows is refused, as on `twins` above.
            let mut conn = db.conn();
            exec(&mut conn, &lockkit_tests::archive_sql(BACKEND, 2));
            exec(&mut conn, "INSERT INTO lockkit_archive.items VALUES (2, 'twin', 10, 0)");
            // Asked first of the connection's `items`, whose key is unique.
            seed_items(&mut conn, &[(2, 10)]);
            item!(&mut conn, 2).update_versioned(&mut conn).unwrap();

            let mut archived = Archived { id: 2, name: "c".into(), stock: 0, lock_version: 0 };
            let err = archived.update_versioned(&mut conn).unwrap_err();
            assert!(matches!(err, Error::AmbiguousKey { table: "items", .. }), "{err:?}");
            let stored: Vec<(String, i32)> = lockkit_tests::archived(2).load(&mut conn).unwrap();
            assert_eq!(stored, [("archived".into(), 0), ("twin".into(), 0)], "nothing was written");
            // A stale report names the table as the database does: the
            // `table!`'s Rust name, `items`, is the connection's table's too.
            exec(&mut conn, "DELETE FROM lockkit_archive.items WHERE name = 'twin'");
            let mut behind = Archived { id: 2, name: "c".into(), stock: 0, lock_version: 5 };
            let Err(Error::Stale(stale)) = behind.update_versioned(&mut conn) else { panic!("not stale") };
            assert_eq!((stale.table, stale.database_table), ("items", Some("lockkit_archive.items")));
        }

        // --- 10. any number of keys ---------------------------------------------------

        fn lock_all_takes_any_number_of_keys(db) {
            const N: usize = 70_001;
            let mut conn = db.conn();
            seed_many(&mut conn, BACKEND, N);
            let keys: Vec<i32> = (1..=N as i32).rev().collect();
            let rows = locked_transaction(&mut conn, LockOptions::default(), |c| Item::lock_all(c, &keys)).unwrap();
            assert_eq!(rows.len(), N);
            assert!(rows.windows(2).all(|w| w[0].id < w[1].id), "key order");
            assert!(rows.iter().all(|r| r.lock_version == 1));
            let bumped: i64 = items::table.filter(items::lock_version.eq(1)).count().get_result(&mut conn).unwrap();
            assert_eq!(bumped, N as i64);
            let mut missing = keys.clone();
            missing.push(N as i32 + 1);
            let err = locked_transaction(&mut conn, LockOptions::default(), |c| Item::lock_all(c, &missing)).unwrap_err();
            assert!(matches!(err, Error::NotFound), "{err:?}");
        }

        // --- 11. a bulk update naming a row twice ---------------------------------------

        fn a_bulk_update_naming_a_row_twice_is_refused(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10), (2, 10)]);
            for rows in [[(1, 0), (2, 0), (1, 1)], [(1, 0), (2, 0), (1, 0)]] {
                let err = Item::update_all_by_version(&mut conn, &rows, items::stock.eq(items::stock - 1)).unwrap_err();
                assert!(matches!(&err, Error::DuplicateKey { table: "items", key } if key == "1"), "{err:?}");
            }
            let stored: Vec<(i32, i32)> = items::table.order(items::id).select((items::stock, items::lock_version)).load(&mut conn).unwrap();
            assert_eq!(stored, vec![(10, 0), (10, 0)], "nothing written");
        }
    }
}

/// On a connection lockkit cannot watch, a versioned write in a transaction
/// marks itself there (a row of `temp.lockkit_marks`), so that the mark stands
/// exactly as long as the write. A mark whose statement failed for another
/// reason than a missing table (a trigger's `RAISE(ROLLBACK)` here, which ends
/// the whole transaction; a Galera certification abort) is the write's
/// failure: sent again, it committed on its own in autocommit and stood for a
/// write that was rolled back, whose number then matched another instance's.
#[cfg(feature = "sqlite")]
#[test]
fn a_mark_that_failed_for_another_reason_than_its_table_is_not_sent_again() {
    let db = TestDb::<diesel::SqliteConnection>::new("mark_failed_otherwise");
    let (mut own, mut other) = own_unwatched_and_other(&db);
    exec(
        &mut own,
        "CREATE TEMP TABLE IF NOT EXISTS lockkit_marks (slot INTEGER PRIMARY KEY, mark INTEGER NOT NULL)",
    );
    exec(
        &mut own,
        "CREATE TEMP TRIGGER refuse_the_mark BEFORE INSERT ON lockkit_marks \
         WHEN (SELECT lock_version FROM main.items WHERE id = 1) = 1 \
         BEGIN SELECT RAISE(ROLLBACK, 'the mark is refused'); END",
    );
    let mut a = item!(&mut own, 1); // v0
    a.stock = 9;
    let written = own.transaction(|c| a.update_versioned(c));
    assert!(
        written.is_err(),
        "the write's transaction ended under its mark: {written:?}"
    );
    assert_eq!(item!(&mut other, 1).lock_version, 0, "rolled back");
    another_instance_commits(&mut other); // v0 -> v1, stock 7
    a.stock = 8;
    let again = a.update_versioned(&mut own);
    assert_stale_over_the_other(
        again,
        stock_of!(&mut other),
        "a struct whose mark was sent again",
    );
}

/// A connection's first `Versioned::update_if` of a table writes in a
/// savepoint (the key check comes after it). A trigger that answers the
/// `UPDATE` with `RAISE(ROLLBACK, ..)` rolls SQLite's whole transaction back:
/// the caller gets the trigger's error, not the failed rollback's "cannot
/// rollback - no transaction is active".
#[cfg(feature = "sqlite")]
#[test]
fn update_if_answers_a_triggers_rollback_with_its_own_error() {
    let db = TestDb::<diesel::SqliteConnection>::new("update_if_raise_rollback");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = db.connect();
    exec(
        &mut conn,
        "CREATE TEMP TRIGGER refuse_the_sale BEFORE UPDATE ON main.items \
         WHEN NEW.stock < 5 BEGIN SELECT RAISE(ROLLBACK, 'out of stock'); END",
    );
    let err = Item::update_if(
        &mut conn,
        1,
        items::stock.ge(8),
        items::stock.eq(items::stock - 8),
    )
    .unwrap_err();
    assert!(err.to_string().contains("out of stock"), "{err}");
    assert_eq!(stock_of!(&mut conn, 1), 10, "nothing written");
    // The connection goes on.
    Item::update_if(
        &mut conn,
        1,
        items::stock.ge(1),
        items::stock.eq(items::stock - 1),
    )
    .unwrap();
    assert_eq!(stock_of!(&mut conn, 1), 9);
}

mod servers {
    use super::*;

    lockkit_tests::server_tests! {
        // --- 6. the stale report shows the latest commit --------------------------------

        fn a_stale_report_inside_a_transaction_shows_the_latest_commit(db) {
            let mut a_conn = db.conn();
            let mut b_conn = db.conn();
            seed_items(&mut a_conn, &[(1, 10), (2, 10)]);
            a_conn
                .transaction(|c| {
                    // The transaction has read both rows: under REPEATABLE READ its
                    // snapshot is fixed from here on.
                    let mut one = item!(c, 1);
                    let two = item!(c, 2);
                    exec(&mut b_conn, "UPDATE items SET stock = 1, lock_version = 1 WHERE id = 1");
                    exec(&mut b_conn, "DELETE FROM items WHERE id = 2");
                    one.stock = 0;
                    let err = one.update_versioned(c).unwrap_err();
                    assert_eq!(err.as_stale().unwrap().current, CurrentState::Version(1), "{err}");
                    let err = two.delete_versioned(c).unwrap_err();
                    assert_eq!(err.as_stale().unwrap().current, CurrentState::Deleted, "{err}");
                    Ok::<_, Error>(())
                })
                .unwrap();
        }

        fn if_match_any_in_a_retried_transaction_writes_over_a_commit_after_its_read(db) {
            // `If-Match: *` writes again when another writer got in between. In
            // a transaction whose snapshot its first read fixed (MySQL/MariaDB's
            // REPEATABLE READ), reading again finds the same old version: the
            // owner must run the transaction again, or every attempt fails. Nor
            // may a write take the latest version with values read in the old
            // snapshot (`reads_stock`): that would undo the other's sale.
            for reads_stock in [false, true] {
                let mut conn = db.conn();
                let mut other = db.conn();
                exec(&mut conn, "DELETE FROM items");
                seed_items(&mut conn, &[(1, 10)]);
                let mut reads = 0;
                let written = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
                    Expected::Any.apply(
                        c,
                        read_then_the_other_sells_2!(reads, other),
                        |c, version| match reads_stock {
                            true => {
                                let stock: i32 = items::table.find(1).select(items::stock).first(c)?;
                                Item::update_by_version(c, 1, version, items::stock.eq(stock - 1))
                            }
                            false => Item::update_by_version(c, 1, version, items::stock.eq(items::stock - 1)),
                        },
                    )
                });
                assert_eq!(written.unwrap(), 2, "written over the other's commit (reads stock: {reads_stock})");
                assert_eq!(stock_of!(&mut other), 7, "both sales stand (reads stock: {reads_stock})");
            }
            // In a plain transaction no owner runs again: on MySQL/MariaDB the
            // call gives up retryable (503), never a 412, which `*` never is
            // while the row exists.
            let mut conn = db.conn();
            let mut other = db.conn();
            let mut reads = 0;
            let plain = conn.transaction(|c| {
                Expected::Any.apply(
                    c,
                    read_then_the_other_sells_2!(reads, other),
                    |c, version| Item::update_by_version(c, 1, version, items::stock.eq(items::stock - 1)),
                )
            });
            match plain {
                Ok(_) => assert_eq!(stock_of!(&mut other), 4, "both sales stand"),
                Err(err) => {
                    assert!(matches!(err, Error::SerializationFailure), "{err:?}");
                    assert_eq!(lockkit::etag::status_for(&err), 503);
                    assert_eq!(stock_of!(&mut other), 5, "the other's sale stands");
                }
            }
        }

        fn lock_all_locks_chunks_in_key_order_so_opposite_orders_never_deadlock(db) {
            // Keys in opposite orders, more than one statement's worth: if lock_all
            // locked chunk by chunk in the order given, the two would deadlock.
            const N: usize = 2 * lockkit::pessimistic::lockable::MAX_KEYS_PER_STATEMENT + 1;
            seed_many(&mut db.conn(), BACKEND, N);
            let up: Vec<i32> = (1..=N as i32).collect();
            let down: Vec<i32> = up.iter().rev().copied().collect();
            let db = &db;
            for _round in 0..3 {
                let barrier = Barrier::new(2);
                let results: Vec<Result<usize, Error>> = thread::scope(|s| {
                    [&up, &down]
                        .map(|keys| {
                            let barrier = &barrier;
                            s.spawn(move || {
                                let mut conn = db.conn();
                                barrier.wait();
                                locked_transaction(&mut conn, LockOptions::default(), |c| {
                                    Item::lock_all(c, keys).map(|rows| rows.len())
                                })
                            })
                        })
                        .into_iter()
                        .map(|h| h.join().unwrap())
                        .collect()
                });
                for result in results {
                    assert_eq!(result.unwrap(), N);
                }
            }
        }
    }
}

mod mysql_only {
    use super::*;
    use diesel::MysqlConnection;
    use lockkit_tests::TestDb;

    /// A versioned write in a transaction on a connection lockkit cannot
    /// watch marks itself in a temporary table the connection creates at its
    /// first mark. Whether the mark failed for want of that table is asked of
    /// the server, not read from its message, which a server speaking another
    /// language words its own way.
    #[test]
    fn the_table_of_marks_is_created_whatever_language_the_server_speaks() {
        let db = TestDb::<MysqlConnection>::new("marks_in_german");
        let (mut own, mut other) = own_unwatched_and_other(&db);
        exec(&mut own, "SET SESSION lc_messages = 'de_DE'");
        let mut a = item!(&mut own, 1);
        a.stock = 9;
        own.transaction(|c| a.update_versioned(c)).unwrap();
        assert_eq!(item!(&mut other, 1).lock_version, 1);
        a.stock = 8;
        own.transaction(|c| a.update_versioned(c)).unwrap();
        assert_eq!(
            (stock_of!(&mut other), item!(&mut other, 1).lock_version),
            (8, 2)
        );
    }

    /// A unique index with an expression part (MySQL 8.0.13 and later)
    /// holds its columns unique only where the expression is not NULL, the
    /// usual stand-in for a partial index (live rows unique, archived rows
    /// not): it does not make the key unique, and a key matching a live and
    /// an archived row writes nothing. MariaDB has no expression parts: there
    /// the index cannot be made, so no such table can mislead the check.
    #[test]
    fn a_unique_index_with_an_expression_part_does_not_make_the_key_unique() {
        let db = TestDb::<MysqlConnection>::new("expression_index");
        let mut conn = db.conn();
        let made = diesel::sql_query(
            "ALTER TABLE twins ADD COLUMN archived INTEGER NULL, \
             ADD UNIQUE KEY live_twin ((IF(archived IS NULL, 1, NULL)), id)",
        )
        .execute(&mut conn);
        let version: String =
            diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>("VERSION()"))
                .get_result(&mut conn)
                .unwrap();
        if version.contains("MariaDB") {
            let err = made
                .expect_err("MariaDB made an index with an expression part: run the case on it");
            assert!(err.to_string().contains("syntax"), "{err}");
            return;
        }
        made.unwrap();
        exec(
            &mut conn,
            "INSERT INTO twins (id, label, lock_version, archived) VALUES (1, 'live', 1, NULL)",
        );
        exec(
            &mut conn,
            "INSERT INTO twins (id, label, lock_version, archived) VALUES (1, 'archived', 1, 1)",
        );
        let labels = |conn: &mut MysqlConnection| {
            twins::table
                .order(twins::label)
                .select((twins::label, twins::lock_version))
                .load::<(String, i32)>(conn)
                .unwrap()
        };
        let before = labels(&mut conn);
        let mut live = Twin {
            id: 1,
            label: "edited".into(),
            lock_version: 1,
        };
        let err = live.update_versioned(&mut conn).unwrap_err();
        assert!(
            matches!(err, Error::AmbiguousKey { table: "twins", .. }),
            "{err:?}"
        );
        assert_eq!(labels(&mut conn), before, "nothing was written");
        let err = live.delete_versioned(&mut conn).unwrap_err();
        assert!(matches!(err, Error::AmbiguousKey { .. }), "{err:?}");
        assert_eq!(labels(&mut conn), before, "nothing was deleted");
    }

    #[test]
    fn lock_all_with_keys_equal_under_the_collation_returns_the_one_row() {
        let db = TestDb::<MysqlConnection>::new("collation_keys");
        let mut conn = db.conn();
        exec(
            &mut conn,
            "INSERT INTO sku_codes (code, stock, lock_version) VALUES ('k', 5, 0)",
        );
        let rows = locked_transaction(&mut conn, LockOptions::default(), |c| {
            Sku::lock_all(c, &["K".to_owned(), "k".to_owned()])
        })
        .unwrap();
        assert_eq!(rows.len(), 1, "one row, found by both keys");
        assert_eq!((rows[0].code.as_str(), rows[0].lock_version), ("k", 1));
        let err = locked_transaction(&mut conn, LockOptions::default(), |c| {
            Sku::lock_all(c, &["k".to_owned(), "missing".to_owned()])
        })
        .unwrap_err();
        assert!(matches!(err, Error::NotFound), "{err:?}");
    }

    /// Item `id` as read on `c`; if `moves`, `other` then commits stock
    /// `stock` to it with a new version, past the snapshot that read fixed.
    fn read_then_moved(
        c: &mut MysqlConnection,
        other: &mut Pooled<MysqlConnection>,
        moves: bool,
        id: i32,
        stock: i32,
    ) -> Item {
        let item = item!(c, id);
        if moves {
            exec(
                other,
                &format!(
                    "UPDATE items SET stock = {stock}, lock_version = lock_version + 1 WHERE id = {id}"
                ),
            );
        }
        item
    }

    /// MariaDB's `innodb_snapshot_isolation` (the default from 11.6.2): a
    /// write to a row changed since the transaction's snapshot fails with
    /// 1020, which rolls back the whole transaction, as a deadlock does. The
    /// retried transaction runs again on a fresh snapshot, also when its work
    /// let the error go.
    #[test]
    fn a_write_past_the_snapshot_under_snapshot_isolation_is_a_deadlock() {
        let db = TestDb::<MysqlConnection>::new("snapshot_isolation");
        let mut conn = db.conn();
        let mut other = db.conn();
        seed_items(&mut conn, &[(1, 10), (2, 10)]);
        if let Err(err) =
            diesel::sql_query("SET SESSION innodb_snapshot_isolation = ON").execute(&mut conn)
        {
            // An older server (MariaDB before 10.6.18 or 10.11.8, MySQL) never
            // sends 1020 so: its words alone are checked.
            eprintln!("no innodb_snapshot_isolation on this server ({err}): checking 1020's classification only");
            let info =
                "Record has changed since last read in table 'items'; try restarting transaction"
                    .to_owned();
            let err = diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::Unknown,
                Box::new(info),
            );
            assert!(matches!(lockkit::classify(err), Error::Deadlock));
            return;
        }
        let mut attempts = 0;
        let sold = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
            attempts += 1;
            let mut item = read_then_moved(c, &mut other, attempts == 1, 1, 7);
            item.stock -= 1;
            item.update_versioned(c)?;
            Ok::<_, Error>(item.stock)
        });
        assert_eq!(
            (attempts, sold.unwrap()),
            (2, 6),
            "retried on a fresh snapshot"
        );

        // Work that lets the error go: its next write meets the read-only
        // stand-in lockkit opened where the transaction was, not autocommit,
        // and the owner runs the work again whole.
        let mut attempts = 0;
        let let_go = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
            attempts += 1;
            let mut item = read_then_moved(c, &mut other, attempts == 1, 2, 5);
            item.stock -= 1;
            let _ = item.update_versioned(c);
            let _ = diesel::connection::SimpleConnection::batch_execute(
                c,
                "UPDATE items SET stock = stock + 100 WHERE id = 1",
            );
            Ok::<_, Error>(())
        });
        assert_eq!((attempts, let_go.is_ok()), (2, true), "{let_go:?}");
        assert_eq!(
            (stock_of!(&mut other, 1), stock_of!(&mut other, 2)),
            (106, 4),
            "each write once"
        );

        // The same in a nested call, whose `RELEASE SAVEPOINT` then fails
        // (the transaction is gone) and which Diesel keeps counting open: the
        // owner rolls it back with its own and runs the work again.
        let mut attempts = 0;
        let nested = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |c| {
            attempts += 1;
            lockkit::transaction_with_retry(c, &RetryPolicy::immediate(3), |c| {
                let mut item = read_then_moved(c, &mut other, attempts == 1, 2, 3);
                item.stock -= 1;
                let _ = item.update_versioned(c);
                Ok::<_, Error>(())
            })
        });
        assert_eq!((attempts, nested.is_ok()), (2, true), "{nested:?}");
        assert_eq!(stock_of!(&mut other, 2), 2, "sold once");
    }
}

#[cfg(feature = "postgres")]
mod postgres_only {
    use super::*;
    use diesel::PgConnection;
    use lockkit_tests::TestDb;

    /// Diesel quotes every name, so a table or column with capitals is named
    /// with them on PostgreSQL: the trigger must name them so too, or it
    /// cannot be created, or (a column) fails every update of the table.
    #[test]
    fn a_version_trigger_on_names_with_capitals_bumps_the_version() {
        let db = TestDb::<PgConnection>::new("trigger_capitals");
        let mut conn = db.conn();
        exec(&mut conn, "CREATE TABLE \"Gadgets\" (id INTEGER PRIMARY KEY, label TEXT NOT NULL, \"lockVersion\" INTEGER NOT NULL DEFAULT 0)");
        exec(
            &mut conn,
            "INSERT INTO \"Gadgets\" (id, label) VALUES (1, 'a')",
        );
        exec(
            &mut conn,
            &up_sql(Dialect::Postgres, "Gadgets", "lockVersion").unwrap(),
        );
        exec(&mut conn, "UPDATE \"Gadgets\" SET label = 'b' WHERE id = 1");
        let version: i32 =
            diesel::sql_query("SELECT \"lockVersion\" AS v FROM \"Gadgets\" WHERE id = 1")
                .get_result::<Version>(&mut conn)
                .unwrap()
                .v;
        assert_eq!(version, 1, "the trigger bumped the version");
        exec(
            &mut conn,
            &lockkit::version_trigger::down_sql(Dialect::Postgres, "Gadgets", "lockVersion")
                .unwrap(),
        );
    }

    #[derive(QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        v: i32,
    }

    /// A child table (`INHERITS`) holds a row with item 1's key: the parent's
    /// primary key does not cover it, and `UPDATE items` writes both rows.
    /// The key is not unique in the database's eyes, so the write runs in a
    /// savepoint and is undone.
    #[test]
    fn a_key_matching_a_row_of_an_inheriting_table_is_ambiguous_and_writes_nothing() {
        let db = TestDb::<PgConnection>::new("inherited_key");
        seed_items(&mut db.conn(), &[(1, 10)]);
        exec(
            &mut db.conn(),
            "CREATE TABLE items_child () INHERITS (items)",
        );
        exec(
            &mut db.conn(),
            "INSERT INTO items_child (id, name, stock, lock_version) VALUES (1, 'child', 10, 0)",
        );
        let mut conn = db.connect();
        let mut a = item!(&mut conn, 1);
        a.stock = 3;
        let outcome = a.update_versioned(&mut conn);
        assert!(
            matches!(outcome, Err(Error::AmbiguousKey { .. })),
            "{outcome:?}"
        );
        let stocks: Vec<i32> = items::table.select(items::stock).load(&mut conn).unwrap();
        assert_eq!(stocks, vec![10, 10], "nothing was written");
    }

    /// A savepoint whose work let a failed statement go: PostgreSQL refuses
    /// its `RELEASE`, and Diesel rolls it back to the savepoint instead. The
    /// versioned write in it was rolled back, though Diesel announced the
    /// release before it failed; the outer transaction then commits.
    #[test]
    fn a_write_in_a_savepoint_whose_release_failed_never_writes_over_a_later_commit() {
        let db = TestDb::<PgConnection>::new("release_failed");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let (mut a_conn, mut b_conn) = (db.connect(), db.connect());
        let mut a = item!(&mut a_conn, 1);
        write_in_a_failed_savepoint!(a_conn, a, |c| {
            let _ = diesel::sql_query("SELECT 1 / 0").execute(c);
            Ok(())
        });
        assert_eq!(
            stock_of!(&mut b_conn),
            10,
            "the savepoint's write rolled back"
        );
        b_commits_then_a_is_stale!(
            &mut a_conn,
            &mut b_conn,
            a,
            "a savepoint whose RELEASE failed"
        );
    }

    #[test]
    fn a_session_that_carries_another_processs_marks_never_takes_one_for_this_processs() {
        let db = TestDb::<PgConnection>::new("unwatched_foreign_marks");
        let (mut own, mut other) = own_unwatched_and_other(&db);
        let mut a = rolled_back_write!(own);
        // A pooler (PgBouncer's transaction pooling) hands the server session
        // to another process, whose lockkit counted its writes from 1 as well
        // and marked them here.
        exec(
            &mut own,
            "SELECT set_config('lockkit.marks', ',' || string_agg(i::text, ',') || ',', false) \
             FROM generate_series(1, 300000) AS i",
        );
        another_instance_commits(&mut other);
        a.stock = 3;
        let again = own.transaction(|c| a.update_versioned(c));
        let what = "the struct (another process's mark taken for its write's)";
        assert_stale_over_the_other(again, stock_of!(&mut other), what);
    }

    #[test]
    fn a_struct_rolled_back_with_a_plain_savepoint_never_writes_over_another_instances_commit() {
        let db = TestDb::<PgConnection>::new("unwatched_savepoint");
        let (mut own, mut other) = own_unwatched_and_other(&db);
        let mut a = item!(&mut own, 1); // v0
        let result = own.transaction(|c| {
            // A nested plain Diesel transaction (a savepoint) writes v0 -> v1 and
            // rolls back: PostgreSQL lets the row go with it.
            let rolled_back = c.transaction(|c| {
                a.stock = 5;
                a.update_versioned(c)?;
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            another_instance_commits(&mut other);
            // A second savepoint, at the depth of the first, tries again: the
            // row's 1 is the other instance's.
            a.stock = 3;
            c.transaction(|c| a.update_versioned(c))
        });
        assert_stale_over_the_other(result, stock_of!(&mut other), "the savepoint");
    }

    #[test]
    fn a_versioned_write_postgres_rolled_back_at_commit_never_lands_over_a_later_commit() {
        let db = TestDb::<PgConnection>::new("aborted_at_commit_journal");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let mut own = db.connect(); // lockkit installs its journal
        let mut other = db.connect();
        let policy = RetryPolicy::default();
        // A writes v0 -> v1 in a transaction that PostgreSQL rolls back at
        // COMMIT: the row is still v0, `a` holds 1.
        let mut a = item!(&mut own, 1);
        let _ = lockkit::transaction_with_retry(&mut own, &policy, |c| {
            a.stock = 5;
            a.update_versioned(c)?;
            // A statement whose error the work lets go: PostgreSQL aborts the
            // transaction, and answers the COMMIT with ROLLBACK.
            assert!(diesel::sql_query("SELECT 1 / 0").execute(c).is_err());
            Ok::<_, Error>(())
        });
        assert_eq!(
            stock_of!(&mut other),
            10,
            "nothing of A's transaction committed"
        );
        // B reads v0, writes its 7 and commits: v1, B's data. A writes again:
        // its 1 never committed, the row's 1 is B's.
        b_commits_then_a_is_stale!(
            &mut own,
            &mut other,
            a,
            "PostgreSQL rolled A's transaction back at COMMIT"
        );
    }
}
