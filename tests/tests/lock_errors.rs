//! Lock calls that fail, nest or wait, on real servers: a deadlock inside a nested
//! retry, `NOWAIT` through `?`, lock options of nested calls, SQLite's write lock
//! in deferred transactions, advisory locks in aborted transactions, and what
//! the metrics and `tracing` events say about each (observed on the calling
//! thread only, so the counts are exact).

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use lockkit::bounds::LockRow;
use lockkit::prelude::*;
use lockkit::{queue, retry, Error, LockOptions, RetryPolicy};
use lockkit_tests::aborts::order_line;
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::*;
use lockkit_tests::observe::observe;
use lockkit_tests::schema::*;
use lockkit_tests::{exec, item, seed_items, stock_of, TestDb};

/// Items 1 and 2 (stock 10 each), and a MySQL/MariaDB connection whose lock
/// waits time out after 1 s.
fn two_items_one_second_lock_waits<C: TestBackend>(db: &TestDb<C>) -> C {
    seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
    let mut conn = db.connect();
    exec(&mut conn, "SET SESSION innodb_lock_wait_timeout = 1");
    conn
}

/// Holds `with_lock` on items row 1 (SQLite: the database's write lock) on another
/// connection for `hold`, then commits; `during` runs once the lock is held.
/// Only for a call meant to wait and then succeed; one that must fail on the
/// held row uses [`while_item_1_locked`].
fn item_1_locked_for<C, T>(db: &TestDb<C>, hold: Duration, during: impl FnOnce() -> T) -> T
where
    C: TestBackend + lockkit::LockingConnection + lockkit::AsLockingConnection<Conn = C>,
    Item: LockRow<C>,
{
    item_1_held(db, Some(hold), during)
}

/// Holds `with_lock` on items row 1 (SQLite: the database's write lock) on another
/// connection until `during` has returned (or panicked), then commits; `during`
/// runs once the lock is held. For calls that must fail on the held row: the
/// holder never lets go before they reach it, however slow the machine.
fn while_item_1_locked<C, T>(db: &TestDb<C>, during: impl FnOnce() -> T) -> T
where
    C: TestBackend + lockkit::LockingConnection + lockkit::AsLockingConnection<Conn = C>,
    Item: LockRow<C>,
{
    item_1_held(db, None, during)
}

/// Item 1 held on another connection while `during` runs: for `hold`, or
/// (`None`) until `during` has returned.
fn item_1_held<C, T>(db: &TestDb<C>, hold: Option<Duration>, during: impl FnOnce() -> T) -> T
where
    C: TestBackend + lockkit::LockingConnection + lockkit::AsLockingConnection<Conn = C>,
    Item: LockRow<C>,
{
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let holder = s.spawn(move || {
            lockkit::with_lock(
                &mut db.connect(),
                1,
                lockkit::LockOptions::default(),
                |_, _: Item| {
                    locked_tx.send(()).unwrap();
                    match hold {
                        Some(hold) => thread::sleep(hold),
                        // A message, or the sender dropped by a panic in
                        // `during`; at most 30 s, so that a call that waits
                        // (PostgreSQL has no lock timeout here) fails instead
                        // of waiting forever.
                        None => drop(release_rx.recv_timeout(Duration::from_secs(30))),
                    }
                    Ok::<_, lockkit::Error>(())
                },
            )
            .unwrap();
        });
        locked_rx.recv().unwrap();
        let out = {
            let _release = release_tx;
            during()
        };
        holder.join().unwrap();
        out
    })
}

/// How many order lines exist.
macro_rules! order_lines {
    ($conn:expr) => {
        orders::table.count().get_result::<i64>($conn).unwrap()
    };
}

/// Empties `orders` and `items`, seeds items 1 to 12 (stock 10), then provokes a deadlock whose victim is the
/// first attempt of `$work` (run on `$conn` by `$run`): that attempt locks item 1,
/// then waits for item 2, which a heavier
/// transaction on another connection holds while it waits for item 1. InnoDB
/// rolls back the transaction with fewer changed rows; PostgreSQL's deadlock
/// check runs in the session that waited `deadlock_timeout` first, and the other
/// session's is set far higher. Later attempts only take item 1.
macro_rules! deadlock_first_attempt {
    ($db:expr, |$conn:ident, $work:ident| $run:expr) => {{
        let db = &$db;
        exec(&mut db.conn(), "DELETE FROM orders");
        exec(&mut db.conn(), "DELETE FROM items");
        lockkit_tests::aborts::seed_for_deadlock(&mut db.conn());
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        thread::scope(|s| {
            let neighbour = s.spawn(move || {
                lockkit_tests::aborts::heavier_neighbour(&mut db.connect(), BACKEND, b_tx, a_rx);
            });
            let mut attempts = 0;
            let mut $work = |conn: &mut Conn, attempt: u32| -> Result<(), Error> {
                attempts += 1;
                let item: Item = items::table.find(1).for_update().first(conn)?;
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(conn)?;
                if attempt == 1 {
                    a_tx.send(()).unwrap();
                    b_rx.recv().unwrap();
                    let _: Item = items::table.find(2).for_update().first(conn)?;
                }
                Ok(())
            };
            let mut $conn = db.connect();
            let outcome: Result<(), Error> = $run;
            neighbour.join().unwrap();
            (outcome, attempts, $conn)
        })
    }};
}

/// Runs `f` in a transaction on `conn` that first inserts order line 1: the
/// outer transaction whose fate a deadlock inside `f` decides.
fn after_order_line_1<C, T, E>(conn: &mut C, f: impl FnOnce(&mut C) -> Result<T, E>) -> Result<T, E>
where
    C: Connection,
    E: From<diesel::result::Error>,
{
    conn.transaction(|conn| {
        exec(
            conn,
            "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
        );
        f(conn)
    })
}

/// Inserts order line 1 in the transaction open on `conn`, and queues setting
/// `confirmed` for after it commits: what tells whether the caller was told the
/// order went through.
fn order_line_1_confirmed_on_commit<C: Connection + lockkit::AsLockingConnection>(
    conn: &mut C,
    confirmed: &std::rc::Rc<std::cell::Cell<bool>>,
) -> Result<(), Error> {
    exec(
        conn,
        "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
    );
    let confirmed = confirmed.clone();
    lockkit::after_commit(conn, move || confirmed.set(true))
}

/// Checks what [`deadlock_first_attempt!`] left when its work ran inside the
/// outer transaction of [`after_order_line_1`], from `counts` (attempts, item
/// 1's stock, order lines). PostgreSQL: the savepoint rollback undid attempt 1
/// only, attempt 2 ran inside the same outer transaction, which committed
/// (returns `true`). MySQL/MariaDB: InnoDB rolled back the whole transaction,
/// nothing is retried in it and nothing committed (returns `false`).
fn outer_transaction_committed(
    backend: &str,
    counts: (i32, i32, i64),
    context: &dyn std::fmt::Debug,
) -> bool {
    if backend == "postgres" {
        assert_eq!(counts, (2, 9, 1), "{context:?}");
        true
    } else {
        assert_eq!(counts, (1, 10, 0), "nothing committed: {context:?}");
        false
    }
}

/// A top-level `transaction_with_retry` whose attempt `n` records order line
/// `n`, then sells under `sell(conn, n)`: the owner of the outermost
/// transaction, which may run it again.
fn orders_with_retry<C, E>(
    conn: &mut C,
    mut sell: impl FnMut(&mut C::Conn, u32) -> Result<(), E>,
) -> Result<(), E>
where
    C: lockkit::AsLockingConnection,
    E: lockkit::RetryableError,
{
    let mut attempt = 0;
    lockkit::transaction_with_retry(conn, &RetryPolicy::default(), |conn| {
        attempt += 1;
        exec(
            conn,
            &format!("INSERT INTO orders (id, item_id, qty) VALUES ({attempt}, NULL, 1)"),
        );
        sell(conn, attempt)
    })
}

/// An error type of the caller's that hides lockkit's error from lockkit:
/// `Opaque` keeps only its text, and says it is retryable when `retryable`.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("opaque: {message}")]
    Opaque { message: String, retryable: bool },
    #[error(transparent)]
    Lock(#[from] Error),
}

impl AppError {
    fn opaque(err: Error, retryable: bool) -> Self {
        AppError::Opaque {
            message: err.to_string(),
            retryable,
        }
    }
}

impl From<diesel::result::Error> for AppError {
    fn from(err: diesel::result::Error) -> Self {
        AppError::Lock(err.into())
    }
}

impl lockkit::RetryableError for AppError {
    fn lockkit_error(&self) -> Option<&Error> {
        match self {
            AppError::Lock(err) => Some(err),
            AppError::Opaque { .. } => None,
        }
    }
    fn is_retryable(&self) -> bool {
        match self {
            AppError::Lock(err) => err.is_retryable(),
            AppError::Opaque { retryable, .. } => *retryable,
        }
    }
}

mod servers {
    use super::*;

    lockkit_tests::server_tests! {
        fn a_deadlock_inside_a_nested_retry_commits_nothing(db) {
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                after_order_line_1(&mut conn, |conn| {
                    retry(&RetryPolicy::default(), |attempt| {
                        lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, _: Item| work(conn, attempt))
                    })
                })
            });
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            let counts = (attempts, stock_of!(&mut conn), order_lines!(&mut conn));
            if outer_transaction_committed(BACKEND, counts, &outcome) {
                assert!(outcome.is_ok(), "{outcome:?}");
            } else {
                // The owner of the outer transaction gets the deadlock, settled
                // by its rollback: retryable around the whole transaction.
                match &outcome {
                    Err(Error::TransactionAborted(cause)) => assert!(matches!(**cause, Error::Deadlock), "{cause:?}"),
                    other => panic!("{other:?}"),
                }
                assert!(outcome.as_ref().unwrap_err().is_retryable());
            }
        }

        fn a_deadlock_hidden_in_the_callers_error_type_still_commits_nothing(db) {
            // The closure's error type hides lockkit's error from lockkit, and the
            // caller's `is_retryable` says yes to anything: lockkit asks the server
            // whether the transaction survived, instead of trusting the error.
            let mut seen = None;
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                let result = after_order_line_1(&mut conn, |conn| {
                    retry(&RetryPolicy::default(), |attempt| {
                        lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| {
                            work(conn, attempt).map_err(|err| AppError::opaque(err, true)) // careless, on purpose
                        })
                    })
                });
                let outcome = result.as_ref().map(drop).map_err(|err| Error::InvalidInput(if matches!(err, AppError::Opaque { .. }) { "opaque" } else { "lock" }));
                seen = Some(result);
                outcome
            });
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            let counts = (attempts, stock_of!(&mut conn), order_lines!(&mut conn));
            if outer_transaction_committed(BACKEND, counts, &seen) {
                assert!(outcome.is_ok(), "{seen:?}");
            } else {
                match seen {
                    Some(Err(AppError::Lock(Error::TransactionAborted(cause)))) => {
                        assert!(matches!(*cause, Error::Deadlock), "{cause:?}")
                    }
                    other => panic!("{other:?}"),
                }
            }
        }

        fn a_deadlock_inside_a_nested_transaction_with_retry_commits_nothing(db) {
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                after_order_line_1(&mut conn, |conn| {
                    let mut attempt = 0;
                    lockkit::transaction_with_retry(conn, &RetryPolicy::default(), |conn| {
                        attempt += 1;
                        work(conn, attempt)
                    })
                })
            });
            let counts = (attempts, stock_of!(&mut conn), order_lines!(&mut conn));
            if outer_transaction_committed(BACKEND, counts, &outcome) {
                assert!(outcome.is_ok(), "{outcome:?}");
            } else {
                assert!(matches!(outcome, Err(Error::TransactionAborted(_))), "{outcome:?}");
            }
        }

        fn a_deadlock_through_the_owners_lock_is_retried_by_the_owner(db) {
            // Two orders, each a `transaction_with_retry` that sells one of
            // its first item, then one of its second in a nested
            // `transaction_with_retry`: the nested calls deadlock on the
            // locks the outer transactions took. Retried in its savepoint, the
            // victim waits again for the same lock, and only the owner's
            // rollback lets it go: both orders must go through.
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let both_hold_their_first = std::sync::Barrier::new(2);
            let order = |first: i32, second: i32| {
                let mut conn = db.connect();
                if BACKEND == "postgres" {
                    // The deadlock check, once per wait: faster than the default 1 s.
                    exec(&mut conn, "SET deadlock_timeout = '100ms'");
                }
                let sell = |conn: &mut Conn, id: i32| -> Result<(), Error> {
                    let item: Item = items::table.find(id).for_update().first(conn)?;
                    diesel::update(items::table.find(id)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                    Ok(())
                };
                let mut attempts = 0;
                let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::default(), |conn| {
                    attempts += 1;
                    sell(conn, first)?;
                    if attempts == 1 {
                        both_hold_their_first.wait();
                    }
                    lockkit::transaction_with_retry(conn, &RetryPolicy::default(), |conn| sell(conn, second))
                });
                (outcome, attempts)
            };
            let (a, b) = thread::scope(|s| {
                let a = s.spawn(|| order(1, 2));
                let b = order(2, 1);
                (a.join().unwrap(), b)
            });
            assert!(a.0.is_ok() && b.0.is_ok(), "{a:?} {b:?}");
            // One of them ran again, from its owner's new transaction (under load
            // the retry in the savepoint may meet the deadlock again with the
            // other as its victim, and then both owners run again).
            assert!((3..=4).contains(&(a.1 + b.1)), "{a:?} {b:?}");
            let mut conn = db.conn();
            assert_eq!((stock_of!(&mut conn, 1), stock_of!(&mut conn, 2)), (8, 8));
        }

        fn lock_all_after_a_plain_read_finds_a_row_deleted_since_missing(db) {
            // A plain read opened the transaction's snapshot (InnoDB's
            // REPEATABLE READ); another session then deletes item 2. The locked
            // read sees the latest commit, without item 2: whether the key has a
            // row is asked of the latest commit too, not of the snapshot.
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let mut conn = db.connect();
            let outcome = lockkit::locked_transaction(&mut conn, LockOptions::default(), |c| {
                let _ = lockkit_tests::item!(c, 1);
                exec(&mut db.connect(), "DELETE FROM items WHERE id = 2");
                Item::lock_all(c, &[1, 2])
            });
            assert!(matches!(outcome, Err(Error::NotFound)), "{outcome:?}");
        }

        fn a_write_after_a_nested_abort_the_caller_swallows_is_refused(db) {
            // The caller's transaction records order line 1, tries to sell under
            // `with_lock`, ignores the failure (a fallback of its own) and records
            // order line 2. On MariaDB the deadlock ended the whole transaction:
            // line 2 must not be committed on its own.
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                after_order_line_1(&mut conn, |conn| {
                    let _ = lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| work(conn, 1)); // swallowed
                    diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)").execute(conn)?;
                    Ok::<_, Error>(())
                })
            });
            assert_eq!(attempts, 1);
            // What committed, seen from a new connection.
            let mut fresh = db.connect();
            let (stock, lines) = (stock_of!(&mut fresh), order_lines!(&mut fresh));
            lockkit_tests::aborts::assert_swallowed_abort(BACKEND, &outcome, stock, lines);
            // The caller's rollback ended it all: the connection is as new.
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            lockkit::with_lock(&mut conn, 1, LockOptions::default(), |_, _: Item| Ok::<_, Error>(())).unwrap();
        }

        fn a_top_level_transaction_with_retry_reruns_after_a_nested_abort(db) {
            // The owner of the outermost transaction may retry: the server rolled
            // everything back, and the next attempt is a new transaction.
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                orders_with_retry(&mut conn, |conn, attempt| {
                    lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, _: Item| work(conn, attempt))
                })
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            assert_eq!((attempts, stock_of!(&mut conn), order_lines!(&mut conn)), (2, 9, 1));
        }

        fn a_top_level_transaction_with_retry_whose_work_swallows_a_nested_abort_runs_again(db) {
            // The work catches the nested call's failure (a fallback of its own,
            // against the docs' advice) and returns `Ok`. On MariaDB the server
            // has thrown order line 1 away with the rest of the transaction: the
            // owner of the outermost transaction must not report success for it,
            // but run it again.
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                orders_with_retry(&mut conn, |conn, attempt| {
                    let _ = lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| work(conn, attempt)); // swallowed
                    Ok::<_, Error>(())
                })
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            let counts = (attempts, stock_of!(&mut conn), order_lines!(&mut conn));
            if BACKEND == "postgres" {
                // Only the savepoint went: order line 1 committed, nothing sold.
                assert_eq!(counts, (1, 10, 1));
            } else {
                assert_eq!(counts, (2, 9, 1), "the thrown-away attempt reported as done");
            }
        }

        fn a_top_level_locked_transaction_whose_work_swallows_a_nested_abort_reports_the_deadlock(db) {
            // Not a retrying call: the caller gets the deadlock, retryable, and
            // nothing of the thrown-away transaction is said to have committed:
            // not to the caller, not to the work queued for after the commit.
            let confirmed = std::rc::Rc::new(std::cell::Cell::new(false));
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                    order_line_1_confirmed_on_commit(conn, &confirmed)?;
                    let _ = lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| work(conn, 1)); // swallowed
                    Ok::<_, Error>(())
                })
            });
            assert_eq!(attempts, 1);
            let counts = (stock_of!(&mut conn), order_lines!(&mut conn));
            if BACKEND == "postgres" {
                assert!(outcome.is_ok(), "{outcome:?}");
                assert_eq!(counts, (10, 1));
            } else {
                // Retryable: the server ended the transaction, a new one may begin.
                assert!(matches!(outcome, Err(Error::Deadlock)), "{outcome:?}");
                assert_eq!(counts, (10, 0));
            }
            assert_eq!(confirmed.get(), outcome.is_ok(), "the order confirmed: {outcome:?}");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
        }

        fn a_top_level_locked_transaction_whose_work_lets_its_own_deadlock_go_reports_it(db) {
            // The work's own statement is the deadlock's victim and the work
            // lets the error go (a best-effort extra of its own). PostgreSQL has
            // aborted the transaction and answers `COMMIT` with `ROLLBACK`;
            // InnoDB has rolled it back. Either way nothing commits, and the
            // caller must not be told otherwise.
            let confirmed = std::rc::Rc::new(std::cell::Cell::new(false));
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                    order_line_1_confirmed_on_commit(conn, &confirmed)?;
                    let _ = work(conn, 1); // let go
                    Ok::<_, Error>(())
                })
            });
            assert_eq!(attempts, 1);
            assert!(matches!(outcome, Err(Error::Deadlock)), "{outcome:?}");
            assert_eq!((stock_of!(&mut conn), order_lines!(&mut conn)), (10, 0));
            assert!(!confirmed.get(), "the order confirmed after commit");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
        }

        fn a_top_level_locked_transaction_whose_work_lets_its_own_deadlock_go_on_an_instrumented_connection_reports_it(db) {
            // As above, on a connection with instrumentation of its own (not
            // wrapped in `Journal::wrap`): no journal saw the deadlock, so lockkit
            // asks the server before `COMMIT`.
            let confirmed = std::rc::Rc::new(std::cell::Cell::new(false));
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
                lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                    order_line_1_confirmed_on_commit(conn, &confirmed)?;
                    let _ = work(conn, 1); // let go
                    Ok::<_, Error>(())
                })
            });
            // Not retryable: unseen, a deadlock cannot be told from a statement
            // that committed the transaction implicitly.
            assert_eq!(attempts, 1);
            assert!(outcome.as_ref().is_err_and(|err| !err.is_retryable()), "{outcome:?}");
            assert_eq!((stock_of!(&mut conn), order_lines!(&mut conn)), (10, 0));
            assert!(!confirmed.get(), "the order confirmed after commit");
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
        }

        fn a_top_level_transaction_with_retry_whose_work_lets_its_own_deadlock_go_runs_again(db) {
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                orders_with_retry(&mut conn, |conn, attempt| {
                    let _ = work(conn, attempt); // let go
                    Ok::<_, Error>(())
                })
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            assert_eq!((attempts, stock_of!(&mut conn), order_lines!(&mut conn)), (2, 9, 1));
        }

        fn a_top_level_transaction_with_retry_whose_work_writes_after_letting_its_deadlock_go_is_not_run_again(db) {
            // The work lets its own deadlock go, then writes an order line of
            // its own. On MySQL/MariaDB no transaction is open any more: that
            // line commits on its own, and a rerun would write it twice.
            // PostgreSQL refuses it in the aborted transaction: rerun, once.
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                orders_with_retry(&mut conn, |conn, attempt| {
                    let _ = work(conn, attempt); // let go
                    let line = format!("INSERT INTO orders (id, item_id, qty) VALUES ({}, NULL, 1)", 100 + attempt);
                    let _ = diesel::sql_query(line).execute(conn);
                    Ok::<_, Error>(())
                })
            });
            let counts = (stock_of!(&mut conn), order_lines!(&mut conn));
            if BACKEND == "postgres" {
                assert!(outcome.is_ok(), "{outcome:?}");
                assert_eq!((attempts, counts), (2, (9, 2)));
            } else {
                assert_eq!(attempts, 1, "{outcome:?}");
                assert!(outcome.as_ref().is_err_and(|err| !err.is_retryable()), "{outcome:?}");
                // The line written after the deadlock committed, once.
                assert_eq!(counts, (10, 1));
            }
            assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
        }

        fn a_write_that_starts_like_a_read_after_letting_a_deadlock_go_is_not_run_again(db) {
            // Two ways to write an order line whose first word reads like a
            // read: MariaDB's `SET STATEMENT .. FOR <statement>`, which runs
            // the statement after `FOR`, and a batch of statements whose first
            // one reads. Sent after the work let its deadlock go, the line
            // commits on its own, as the plain INSERT above does, and a rerun
            // would write it twice.
            if BACKEND != "mysql" {
                return;
            }
            for set_statement in [true, false] {
                let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                    orders_with_retry(&mut conn, |conn, attempt| {
                        let _ = work(conn, attempt); // let go
                        let insert = format!("INSERT INTO orders (id, item_id, qty) VALUES ({}, NULL, 1)", 100 + attempt);
                        if set_statement {
                            diesel::sql_query(format!("SET STATEMENT max_statement_time = 5 FOR {insert}")).execute(conn)?;
                        } else {
                            diesel::connection::SimpleConnection::batch_execute(conn, &format!("SET @line = 1; {insert}"))?;
                        }
                        Ok::<_, Error>(())
                    })
                });
                assert_eq!(attempts, 1, "set_statement: {set_statement}, {outcome:?}");
                assert!(outcome.as_ref().is_err_and(|err| !err.is_retryable()), "{outcome:?}");
                let counts = (stock_of!(&mut conn), order_lines!(&mut conn));
                assert_eq!(counts, (10, 1), "set_statement: {set_statement}: the line, once");
                assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            }
        }

        fn a_write_after_a_let_go_lock_wait_timeout_counts_only_if_it_follows_the_deadlock(db) {
            // MySQL/MariaDB: a lock wait timeout (let go) ends the statement
            // only, and the deadlock that follows ends the transaction. An
            // order line written between the two is in the live transaction
            // and goes with it: the attempt runs again, once. One written
            // after the deadlock runs in autocommit and commits on its own: a
            // rerun would write it twice, so the owner's error is final.
            if BACKEND != "mysql" {
                return;
            }
            for after_the_deadlock in [false, true] {
                let mut holder = None;
                let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                    let mut held = db.connect();
                    // An order line inserted, not committed: a locking read of it waits.
                    exec(&mut held, "BEGIN; INSERT INTO orders (id, item_id, qty) VALUES (999, NULL, 1)");
                    holder = Some(held);
                    exec(&mut conn, "SET SESSION innodb_lock_wait_timeout = 1");
                    orders_with_retry(&mut conn, |conn, attempt| {
                        if attempt == 1 {
                            let waited = diesel::sql_query("SELECT id FROM orders WHERE id = 999 FOR UPDATE").execute(conn);
                            assert!(waited.is_err(), "{waited:?}"); // let go
                        }
                        let line = format!("INSERT INTO orders (id, item_id, qty) VALUES ({}, NULL, 1)", 100 + attempt);
                        if !after_the_deadlock {
                            diesel::sql_query(&line).execute(conn)?;
                        }
                        let _ = work(conn, attempt); // let go
                        if after_the_deadlock {
                            diesel::sql_query(&line).execute(conn)?;
                        }
                        Ok::<_, Error>(())
                    })
                });
                drop(holder);
                let counts = (attempts, stock_of!(&mut conn), order_lines!(&mut conn));
                if after_the_deadlock {
                    assert!(outcome.as_ref().is_err_and(|err| !err.is_retryable()), "{outcome:?}");
                    assert_eq!(counts, (1, 10, 1), "the line written after the deadlock, once");
                } else {
                    assert!(outcome.is_ok(), "{outcome:?}");
                    assert_eq!(counts, (2, 9, 2));
                }
            }
        }

        fn a_nested_transaction_with_retry_that_its_savepoint_cannot_save_hands_its_error_on(db) {
            // The outer transaction's first read fixes its snapshot (InnoDB's
            // REPEATABLE READ); another session then commits a sale. The
            // nested transaction_with_retry reads item 1 from that snapshot on
            // every attempt, and every write is stale: its last error must
            // stay retryable, for the owner to run the whole transaction again
            // in a new snapshot. PostgreSQL's READ COMMITTED sees the sale at
            // the nested call's first read.
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let mut other = db.connect();
            let (mut outer_runs, mut inner_runs) = (0, 0);
            let outcome = lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(5), |c| {
                outer_runs += 1;
                let _ = item!(c, 1);
                if outer_runs == 1 {
                    exec(&mut other, "UPDATE items SET stock = stock - 1, lock_version = lock_version + 1 WHERE id = 1");
                }
                lockkit::transaction_with_retry(c, &RetryPolicy::immediate(5), |c| {
                    inner_runs += 1;
                    let mut item = item!(c, 1);
                    item.stock -= 1;
                    item.update_versioned(c)
                })
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            assert_eq!(stock_of!(&mut conn), 8);
            match BACKEND {
                "postgres" => assert_eq!((outer_runs, inner_runs), (1, 1)),
                _ => assert_eq!((outer_runs, inner_runs), (2, 6)),
            }
        }

        fn a_nested_with_lock_after_the_caller_let_its_own_deadlock_go_commits_nothing(db) {
            // The caller's own statement is the deadlock's victim and the caller
            // goes on to sell under `with_lock`. On MariaDB no transaction is
            // open any more: the savepoint is accepted in autocommit, the lock
            // would end with its statement and the sale would commit on its
            // own, without order line 1. Either the connection served lockkit
            // before, and lockkit's journal saw the deadlock, or the nested
            // call installs the journal and asks the server before it begins.
            for served_before in [true, false] {
                let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                    if served_before {
                        lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
                    }
                    after_order_line_1(&mut conn, |conn| {
                        let _ = work(conn, 1); // let go
                        lockkit::with_lock(conn, 1, LockOptions::default(), |conn, item: Item| {
                            diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                            exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)");
                            Ok::<_, Error>(())
                        })
                    })
                });
                assert_eq!(attempts, 1);
                // Every unit sold has its order lines, both of them.
                assert_eq!((stock_of!(&mut conn), order_lines!(&mut conn)), (10, 0), "served lockkit before: {served_before}; {outcome:?}");
                match &outcome {
                    Err(Error::TransactionAborted(cause)) => assert!(matches!(**cause, Error::Deadlock), "{cause:?}"),
                    // PostgreSQL refuses the savepoint in the aborted transaction.
                    Err(_) if BACKEND == "postgres" => {}
                    other => panic!("served lockkit before: {served_before}; {other:?}"),
                }
                assert!(!lockkit::LockingConnection::in_transaction(&mut conn));
            }
        }

        fn a_top_level_transaction_with_retry_reruns_after_an_abort_two_levels_down_hidden_in_the_callers_error(db) {
            // The middle call's closure turns lockkit's error into one of the
            // caller's own (not retryable): lockkit cannot look inside it and
            // asks the server whether the transaction survived, as one level
            // down. The owner of the outermost transaction must learn that it
            // ended, and run it again.
            let (outcome, attempts, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                orders_with_retry(&mut conn, |conn, attempt| {
                    lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| {
                        lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| work(conn, attempt))
                            .map_err(|err| AppError::opaque(err, false))
                    })
                })
                .map_err(|err| Error::InvalidInput(if matches!(err, AppError::Opaque { .. }) { "opaque" } else { "lock" }))
            });
            if BACKEND == "postgres" {
                // Only the innermost savepoint went: the caller's own error,
                // not retryable, is its choice.
                assert!(matches!(outcome, Err(Error::InvalidInput("opaque"))), "{outcome:?}");
                assert_eq!((attempts, stock_of!(&mut conn), order_lines!(&mut conn)), (1, 10, 0));
            } else {
                // InnoDB ended the whole transaction: run it again.
                assert!(outcome.is_ok(), "{outcome:?}");
                assert_eq!((attempts, stock_of!(&mut conn), order_lines!(&mut conn)), (2, 9, 1));
            }
        }

        fn a_serialization_failure_inside_a_nested_transaction_with_retry_reruns_the_serializable_transaction(db) {
            // PostgreSQL: a serializable transaction whose snapshot predates another
            // connection's commit to item 1 cannot write item 1, in any savepoint:
            // only a new transaction can. The nested retry must leave that to the
            // owner (`serializable`), which runs the transaction again.
            if BACKEND != "postgres" {
                return; // InnoDB's SERIALIZABLE locks instead: nothing to fail here.
            }
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let (mut outer, mut inner) = (0, 0);
            let outcome: Result<(), Error> = lockkit::serializable(&mut conn, &RetryPolicy::immediate(5), |conn| {
                let _: Item = items::table.find(1).first(conn)?;
                outer += 1;
                if outer == 1 {
                    // Another connection sells one unit after this snapshot.
                    exec(&mut db.connect(), "UPDATE items SET stock = stock - 1 WHERE id = 1");
                }
                lockkit::transaction_with_retry(conn, &RetryPolicy::immediate(5), |conn| {
                    inner += 1;
                    diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1)).execute(conn)?;
                    Ok::<_, Error>(())
                })
            });
            assert!(outcome.is_ok(), "{outcome:?} after {outer} serializable and {inner} nested attempts");
            assert_eq!(outer, 2, "{inner} nested attempts");
            assert_eq!(stock_of!(&mut conn), 8);
        }

        fn our_nowait_through_the_question_mark_is_busy(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let (err, seen) = while_item_1_locked(&db, || {
                observe(|| {
                    let started = Instant::now();
                    // Twice: the second statement comes from the prepared-statement cache.
                    let errors: Vec<Error> = (0..2)
                        .map(|_| {
                            conn.transaction(|conn| -> Result<Item, Error> {
                                Ok(items::table.find(1).for_update().nowait().first::<Item>(conn)?)
                            })
                            .unwrap_err()
                        })
                        .collect();
                    assert!(started.elapsed() < Duration::from_secs(1), "NOWAIT did not wait");
                    errors
                })
            });
            assert!(err.iter().all(|e| matches!(e, Error::Busy)), "{err:?}");
            assert_eq!(seen.counter("lockkit_lock_errors_total{kind=busy}"), 2);
            assert_eq!(seen.counter("lockkit_lock_errors_total{kind=lock_timeout}"), 0);
            // A real lock wait timeout right after it is still a lock timeout.
            exec(&mut conn, if BACKEND == "postgres" { "SET lock_timeout = '1s'" } else { "SET SESSION innodb_lock_wait_timeout = 1" });
            let err = while_item_1_locked(&db, || {
                let _ = conn.transaction(|conn| -> Result<Item, Error> {
                    Ok(items::table.find(2).for_update().nowait().first::<Item>(conn)?)
                });
                conn.transaction(|conn| -> Result<Item, Error> {
                    Ok(items::table.find(1).for_update().first::<Item>(conn)?)
                })
                .unwrap_err()
            });
            assert!(matches!(err, Error::LockTimeout), "{err:?}");
        }

        fn a_nested_lock_timeout_applies_to_that_call_only(db) {
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let mut conn = db.connect();
            let outcome = conn.transaction::<_, Error, _>(|conn| {
                lockkit::with_lock(conn, 2, LockOptions::default().timeout(Duration::from_millis(100)), |_, _: Item| Ok::<_, lockkit::Error>(()))?;
                // A plain lock later in the same transaction waits as long as the
                // session allows (well over the 100 ms above).
                item_1_locked_for(&db, Duration::from_millis(700), || {
                    lockkit::with_lock(conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
                        diesel::update(items::table.find(1)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
                        Ok(())
                    })
                })
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            assert_eq!(stock_of!(&mut conn), 9);
        }

        fn an_advisory_lock_never_outlives_an_aborted_transaction(db) {
            let mut a = db.connect();
            let mut b = db.connect();
            let key = lockkit::advisory::AdvisoryKey::from_name("aborted");
            if BACKEND == "mysql" {
                // A session lock inside a transaction is refused: its guard
                // would release it before COMMIT.
                let refused = a.transaction(|a| lockkit::advisory::lock(a, key).map(drop));
                assert!(matches!(refused, Err(Error::AlreadyInTransaction)), "{refused:?}");
                return;
            }
            let outcome = a.transaction(|a| {
                let mut guard = lockkit::advisory::lock(a, key)?;
                assert!(lockkit::advisory::try_lock(&mut b, key)?.is_none(), "held");
                // A failed statement: PostgreSQL aborts the transaction.
                let _ = exec_fallible(&mut *guard, "INSERT INTO items (id, name, stock) VALUES (NULL, NULL, NULL)");
                drop(guard);
                Err::<(), _>(Error::NoRowMatched)
            });
            assert!(matches!(outcome, Err(Error::NoRowMatched)), "{outcome:?}");
            let again = lockkit::advisory::try_lock(&mut b, key).unwrap();
            assert!(again.is_some(), "the lock ended with a's transaction");
        }
    }

    fn exec_fallible<C: diesel::connection::SimpleConnection>(
        conn: &mut C,
        sql: &str,
    ) -> diesel::QueryResult<()> {
        conn.batch_execute(sql)
    }
}

mod all {
    use super::*;

    lockkit_tests::backend_tests! {
        fn a_nested_nowait_fails_while_another_connection_holds_the_lock(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let outcome = while_item_1_locked(&db, || {
                conn.transaction(|conn| {
                    lockkit::with_lock(conn, 1, LockOptions::default().nowait(), |_, item: Item| Ok(item.stock))
                })
            });
            assert!(matches!(outcome, Err(Error::Busy)), "{outcome:?}");
        }

        fn claims_in_a_plain_transaction_never_share_a_job(db) {
            exec(&mut db.conn(), "INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false), (2, 'b', false)");
            let (claimed_tx, claimed_rx) = mpsc::channel::<()>();
            let claim_one = |conn: &mut Conn| -> Result<Vec<i32>, Error> {
                let ids: Vec<i32> = queue::claim(conn, jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(jobs::id), 1)?;
                for id in &ids {
                    diesel::update(jobs::table.find(id)).set(jobs::done.eq(true)).execute(conn)?;
                }
                Ok(ids)
            };
            let (first, second) = thread::scope(|s| {
                let db = &db;
                let first = s.spawn(move || {
                    db.connect().transaction(|conn| {
                        let ids = claim_one(conn)?;
                        claimed_tx.send(()).unwrap();
                        thread::sleep(Duration::from_millis(300));
                        Ok::<_, Error>(ids)
                    })
                });
                claimed_rx.recv().unwrap();
                let second = db.connect().transaction(|conn| claim_one(conn));
                (first.join().unwrap(), second)
            });
            assert_eq!((first.unwrap(), second.unwrap()), (vec![1], vec![2]), "each job claimed once");
        }

        fn a_lock_timeout_is_counted_once_as_a_lock_timeout(db) {
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            let (err, seen) = while_item_1_locked(&db, || {
                observe(|| {
                    lockkit::with_lock(&mut conn, 1, LockOptions::default().timeout(Duration::from_millis(100)), |_, _: Item| Ok(()))
                        .unwrap_err()
                })
            });
            assert!(matches!(err, Error::LockTimeout), "{err:?}");
            assert_eq!(seen.counter("lockkit_lock_errors_total{kind=lock_timeout}"), 1);
            assert_eq!(seen.counter("lockkit_lock_errors_total{kind=busy}"), 0);
            let events = seen.events_named("lock error");
            assert_eq!(events.len(), 1, "{:?}", seen.events);
            assert_eq!(events[0].field("kind"), Some("lock_timeout"));
        }

        fn lock_waits_are_recorded_for_claims(db) {
            exec(&mut db.conn(), "INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false), (2, 'b', false)");
            let mut conn = db.connect();
            let (claimed, seen) = observe(|| {
                lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                    queue::claim::<i32, _, _>(conn, jobs::table.order(jobs::id).select(jobs::id), 5)
                })
                .unwrap()
            });
            assert_eq!(claimed, vec![1, 2]);
            assert_eq!(seen.counter("lockkit_locks_acquired_total{table=queue}"), 2, "{seen:?}");
            assert_eq!(seen.histogram("lockkit_lock_acquire_seconds{table=queue}").len(), 1, "{seen:?}");
            // SQLite's lock is the transaction's: BEGIN IMMEDIATE, counted once.
            let database_locks = if BACKEND == "sqlite" { 1 } else { 0 };
            assert_eq!(seen.counter("lockkit_locks_acquired_total{table=database}"), database_locks, "{seen:?}");
        }
    }
}

/// MySQL/MariaDB probes of the stand-in for an aborted transaction (a review's
/// proofs; each test states what must hold).
mod stand_in_probes {
    use super::*;

    /// `SELECT @lockkit_aborted IS NOT NULL` on `conn` (MySQL/MariaDB).
    macro_rules! marked {
        ($conn:expr) => {
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "CAST(@lockkit_aborted IS NOT NULL AS SIGNED)",
            ))
            .get_result::<i64>($conn)
            .unwrap()
                != 0
        };
    }

    lockkit_tests::server_tests! {
        fn a_stale_mark_and_a_savepoint_of_the_callers_named_lockkit_aborted_commit_nothing_the_caller_rolled_back(db) {
            // A connection on which a stand-in was once opened keeps the mark
            // (set by hand here). A later live transaction that has a savepoint
            // of that name, and a nested call that fails with the closure's own
            // error: the probe must not roll back to it, and nothing may be
            // committed behind the caller's back.
            if BACKEND != "mysql" {
                return;
            }
            seed_items(&mut db.conn(), &[(1, 10)]);
            let mut conn = db.connect();
            exec(&mut conn, "SET @lockkit_aborted = 1");
            let mut nested = None;
            let outcome: Result<(), Error> = conn.transaction(|conn| {
                exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)");
                exec(conn, "SAVEPOINT lockkit_aborted");
                exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)");
                nested = Some(lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| {
                    Err::<(), _>(Error::InvalidInput("the work fails"))
                }));
                Err(Error::InvalidInput("the caller rolls back"))
            });
            let mut fresh = db.connect();
            let lines = order_lines!(&mut fresh);
            assert_eq!(lines, 0, "the caller rolled back, yet {lines} order line(s) committed; nested: {nested:?}, outcome: {outcome:?}");
            assert!(matches!(nested, Some(Err(Error::InvalidInput(_)))), "{nested:?}");
        }

        fn a_stale_mark_is_cleared_by_a_nested_failure_in_a_live_transaction(db) {
            // After a swallowed abort and the caller's rollback the mark stays;
            // in the next transaction a nested failure of the closure's own must
            // come back as it is, the transaction stay alive, the mark go.
            if BACKEND != "mysql" {
                return;
            }
            let (_, _, mut conn) = deadlock_first_attempt!(db, |conn, work| {
                after_order_line_1(&mut conn, |conn| {
                    let _ = lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| work(conn, 1));
                    Err::<(), _>(Error::InvalidInput("the caller rolls back"))
                })
            });
            assert!(marked!(&mut conn), "a stand-in was opened: the mark is set");
            let mut nested = None;
            let outcome: Result<(), Error> = conn.transaction(|conn| {
                exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (5, NULL, 1)");
                nested = Some(lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| {
                    Err::<(), _>(Error::InvalidInput("the work fails"))
                }));
                exec(conn, "INSERT INTO orders (id, item_id, qty) VALUES (6, NULL, 1)");
                Ok(())
            });
            assert!(outcome.is_ok(), "{outcome:?}");
            assert!(matches!(nested, Some(Err(Error::InvalidInput(_)))), "{nested:?}");
            assert_eq!(order_lines!(&mut conn), 2);
            assert!(!marked!(&mut conn), "the stale mark was cleared");
        }

        fn lock_all_and_claim_after_a_swallowed_deadlock_refuse_and_keep_later_writes_out(db) {
            // As Lockable::lock: the caller's own statement is the deadlock's
            // victim and it calls on. With no transaction open on the server,
            // lock_all and claim would lock in autocommit, releasing at once
            // what they return as locked. The connection served lockkit
            // before, so lockkit's journal watches it.
            if BACKEND != "mysql" {
                return;
            }
            exec(&mut db.conn(), "INSERT INTO jobs (id, payload) VALUES (1, 'job')");
            let (mut locked, mut claimed) = (None, None);
            let (outcome, _, _conn) = deadlock_first_attempt!(db, |conn, work| {
                lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
                after_order_line_1(&mut conn, |conn| {
                    let _ = work(conn, 1); // the caller's own statement, swallowed
                    locked = Some(Item::lock_all(conn, &[3]).map(|rows| rows.len()));
                    claimed = Some(queue::claim::<Job, _, _>(conn, jobs::table.filter(jobs::done.eq(false)).select(Job::as_select()), 1).map(|rows| rows.len()));
                    order_line(conn, 2)?;
                    Ok::<_, Error>(())
                })
            });
            let mut fresh = db.connect();
            let lines = order_lines!(&mut fresh);
            assert!(
                matches!(locked, Some(Err(Error::TransactionAborted(_)))) && matches!(claimed, Some(Err(Error::TransactionAborted(_)))),
                "lock_all: {locked:?}, claim: {claimed:?}"
            );
            assert_eq!(lines, 0, "order line 2 committed on its own; outcome {outcome:?}");
        }

        fn single_writes_after_a_swallowed_deadlock_refuse_and_keep_later_writes_out(db) {
            // As lock_all and claim: the caller's own statement is the
            // deadlock's victim and it writes on with lockkit's single writes
            // (a versioned write, update_if). With no transaction open on the
            // server, each would commit on its own. Either the connection
            // served lockkit before, and lockkit's journal saw the deadlock,
            // or it did not (a fresh one, a pool's on its first checkout): the
            // versioned write installs the journal after the deadlock and asks
            // the server once.
            if BACKEND != "mysql" {
                return;
            }
            for served_before in [true, false] {
                let (mut versioned, mut conditional) = (None, None);
                let (outcome, _, _conn) = deadlock_first_attempt!(db, |conn, work| {
                    if served_before {
                        lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
                    }
                    after_order_line_1(&mut conn, |conn| {
                        let _ = work(conn, 1); // the caller's own statement, swallowed
                        let mut three: Item = items::table.find(3).first(conn)?;
                        three.stock -= 1;
                        versioned = Some(three.update_versioned(conn));
                        conditional = Some(Item::update_if(conn, 4, items::stock.ge(1), items::stock.eq(items::stock - 1)));
                        order_line(conn, 2)?;
                        Ok::<_, Error>(())
                    })
                });
                let mut fresh = db.connect();
                let stocks: Vec<i32> = items::table.filter(items::id.eq_any([3, 4])).order(items::id).select(items::stock).load(&mut fresh).unwrap();
                let lines = order_lines!(&mut fresh);
                assert!(
                    matches!(versioned, Some(Err(Error::TransactionAborted(_)))) && matches!(conditional, Some(Err(Error::TransactionAborted(_)))),
                    "served lockkit before: {served_before}; update_versioned: {versioned:?}, update_if: {conditional:?}"
                );
                assert_eq!((stocks, lines), (vec![10, 10], 0), "a write committed on its own (served lockkit before: {served_before}); outcome {outcome:?}");
            }
        }

        fn a_retry_around_your_transaction_whose_write_followed_a_swallowed_deadlock_runs_once(db) {
            // Diesel's own transaction under lockkit's `retry`: the work lets
            // its deadlock go, writes item 3 with a statement of its own (on
            // MariaDB in autocommit: it commits), then meets the end through
            // lockkit: a conditional write or a lock of item 4 refuses, or the
            // work, inside a nested lockkit transaction, fails and that
            // call's end finds the caller's transaction gone. Unnested, the
            // connection is new to lockkit, whose journal sees nothing before
            // the call; nested, it sees the deadlock. Either way the error
            // must say that a write may have committed on its own, so that
            // the retry does not run the work again (which would sell item 3
            // twice).
            if BACKEND != "mysql" {
                return;
            }
            let cases = [(false, "update_if"), (false, "lock_all"), (true, "update_if"), (true, "its own error")];
            for (nested, then) in cases {
                let mut runs = 0;
                let (outcome, _, _conn) = deadlock_first_attempt!(db, |conn, work| {
                    retry(&RetryPolicy::immediate(5), |attempt| {
                        runs += 1;
                        conn.transaction(|conn| {
                            let mut sale = |conn: &mut Conn| -> Result<(), Error> {
                                let _ = work(conn, attempt); // the caller's own statement, swallowed
                                diesel::update(items::table.find(3)).set(items::stock.eq(items::stock - 1)).execute(conn)?;
                                match then {
                                    "update_if" => {
                                        Item::update_if(conn, 4, items::stock.ge(1), items::stock.eq(items::stock - 1))?;
                                    }
                                    "lock_all" => {
                                        Item::lock_all(conn, &[4])?;
                                    }
                                    _ => return Err(Error::NoRowMatched),
                                }
                                Ok(())
                            };
                            match nested {
                                true => lockkit::locked_transaction(conn, LockOptions::default(), sale),
                                false => sale(conn),
                            }
                        })
                    })
                });
                let mut fresh = db.connect();
                let stocks: Vec<i32> = items::table.filter(items::id.eq_any([3, 4])).order(items::id).select(items::stock).load(&mut fresh).unwrap();
                let case = format!("nested: {nested}, then {then}");
                assert_eq!((runs, stocks), (1, vec![9, 10]), "{case}: the work ran again after its write committed on its own: {outcome:?}");
                let err = outcome.expect_err("the transaction had ended under the work");
                assert!(!err.is_retryable(), "{case}: {err:?}");
            }
        }

        fn each_lock_timeout_the_caller_let_go_costs_the_next_call_one_question(db) {
            // After a lock wait timeout in a transaction, lockkit's next call
            // asks the server whether the transaction is still open (under
            // `innodb_rollback_on_timeout` it is not: rollback_on_timeout.rs).
            // This server keeps it, and the call goes on. The answer stands
            // for that timeout only: a metadata lock's timeout, in the same
            // code and words, ends nothing even where a row lock's ends the
            // transaction. So each timeout costs one question, and a call
            // after none costs none.
            if BACKEND != "mysql" {
                return;
            }
            let mut conn = two_items_one_second_lock_waits(&db);
            // An earlier lockkit call on the connection installed its journal.
            lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
            let selects = |conn: &mut Conn| -> i64 {
                diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    "(SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.SESSION_STATUS \
                     WHERE VARIABLE_NAME = 'COM_SELECT')",
                ))
                .get_result::<i64>(conn)
                .unwrap()
            };
            let asked = while_item_1_locked(&db, || {
                conn.transaction(|conn| {
                    // Once, so that the row's first lock fills lockkit's caches.
                    lockkit::with_lock(conn, 2, LockOptions::default(), |_, _: Item| Ok::<_, Error>(()))?;
                    let mut sent = vec![];
                    for timed_out_first in [false, true, true] {
                        if timed_out_first {
                            let timed_out = diesel::connection::SimpleConnection::batch_execute(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                            assert!(timed_out.is_err());
                        }
                        let before = selects(conn);
                        lockkit::with_lock(conn, 2, LockOptions::default(), |_, _: Item| Ok::<_, Error>(()))?;
                        sent.push(selects(conn) - before);
                    }
                    Ok::<_, Error>(sent)
                })
            })
            .unwrap();
            let plain = asked[0];
            assert_eq!(asked, [plain, plain + 1, plain + 1], "SELECTs sent by each nested call");
        }

        fn a_nested_lock_timeout_the_caller_caught_leaves_its_commit_a_commit(db) {
            // The caller writes item 2 with a version check, then a nested
            // with_lock on item 1 times out (held elsewhere); the server keeps
            // the transaction, the caller catches the timeout and commits. The
            // write committed: the struct's next write must go through, not be
            // taken for one whose transaction rolled back (a false Stale).
            if BACKEND != "mysql" {
                return;
            }
            let mut conn = two_items_one_second_lock_waits(&db);
            let mut two: Item = items::table.find(2).first(&mut conn).unwrap();
            let committed = while_item_1_locked(&db, || {
                conn.transaction(|conn| {
                    two.stock -= 1;
                    two.update_versioned(conn)?;
                    let timed_out = lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| Ok::<_, Error>(()));
                    assert!(matches!(timed_out, Err(Error::LockTimeout)), "{timed_out:?}");
                    Ok::<_, Error>(())
                })
            });
            assert!(committed.is_ok(), "{committed:?}");
            two.stock -= 1;
            let again = two.update_versioned(&mut conn);
            assert!(again.is_ok(), "the second write after a committed first: {again:?}");
            assert_eq!(stock_of!(&mut conn, 2), 8);
        }

        fn lock_that_finds_the_transaction_ended_keeps_later_writes_out(db) {
            // The caller's own statement is the deadlock's victim; it swallows
            // the error and calls Lockable::lock, which finds the transaction
            // ended. A write after that must not commit on its own.
            if BACKEND != "mysql" {
                return;
            }
            let mut locked = None;
            let (outcome, _, _conn) = deadlock_first_attempt!(db, |conn, work| {
                after_order_line_1(&mut conn, |conn| {
                    let _ = work(conn, 1); // the caller's own statement, swallowed
                    let mut item: Item = items::table.find(3).first(conn)?;
                    locked = Some(item.lock(conn));
                    order_line(conn, 2)?;
                    Ok::<_, Error>(())
                })
            });
            let mut fresh = db.connect();
            let lines = order_lines!(&mut fresh);
            assert!(matches!(locked, Some(Err(Error::TransactionAborted(_)))), "{locked:?}");
            assert_eq!(lines, 0, "order line 2 committed on its own; outcome {outcome:?}");
        }
    }
}

/// Runs `during` while another connection holds item 2 of `db` `FOR UPDATE`
/// (PostgreSQL), until `during` calls the release it gets (which returns once
/// the holder has committed), or returns.
#[cfg(feature = "postgres")]
fn item_2_held<T>(db: &TestDb<PgConnection>, during: impl FnOnce(&dyn Fn()) -> T) -> T {
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (locked_tx, locked_rx) = mpsc::channel::<()>();
    let (released_tx, released_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        s.spawn(move || {
            let mut holder = db.connect();
            holder
                .transaction(|c| {
                    items::table
                        .find(2)
                        .for_update()
                        .select(items::stock)
                        .first::<i32>(c)?;
                    locked_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok::<_, diesel::result::Error>(())
                })
                .unwrap();
            let _ = released_tx.send(());
        });
        locked_rx.recv().unwrap();
        let release = || {
            if release_tx.send(()).is_ok() {
                let _ = released_rx.recv();
            }
        };
        let out = during(&release);
        // The holder waits for its release however `during` ended.
        let _ = release_tx.send(());
        out
    })
}

/// Items 1 and 2 (stock 10) in a new database `name`, and `run` on a
/// connection of its own while another holds item 2 ([`item_2_held`]): its
/// result, and the two stocks after it.
#[cfg(feature = "postgres")]
fn while_item_2_held<T>(
    name: &str,
    run: impl FnOnce(&mut PgConnection, &dyn Fn()) -> T,
) -> (T, Vec<i32>) {
    let db = TestDb::<PgConnection>::new(name);
    seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
    let mut conn = db.connect();
    let out = item_2_held(&db, |release| run(&mut conn, release));
    let stocks = items::table
        .order(items::id)
        .select(items::stock)
        .load(&mut db.conn())
        .unwrap();
    (out, stocks)
}

/// [`while_item_2_held`] for work that is tried again: `run` calls
/// `attempt()` at the start of each attempt, which counts it and releases item
/// 2 before the second. The outcome must be `Ok` after two attempts, with the
/// stocks `stocks`.
#[cfg(feature = "postgres")]
fn succeeds_at_the_second_attempt<T: std::fmt::Debug>(
    name: &str,
    stocks: [i32; 2],
    run: impl FnOnce(&mut PgConnection, &mut dyn FnMut()) -> Result<T, Error>,
) {
    let mut attempts = 0;
    let (outcome, now) = while_item_2_held(name, |conn, release| {
        let mut attempt = || {
            attempts += 1;
            if attempts == 2 {
                release();
            }
        };
        run(conn, &mut attempt)
    });
    assert!(
        outcome.is_ok() && attempts == 2 && now == stocks,
        "{outcome:?} after {attempts} attempt(s); stocks {now:?}"
    );
}

/// `with_lock` on item 1, waiting 200 ms at most for any lock in it.
#[cfg(feature = "postgres")]
fn with_lock_on_1<T>(
    conn: &mut PgConnection,
    work: impl FnOnce(&mut PgConnection, Item) -> Result<T, Error>,
) -> Result<T, Error> {
    let wait = LockOptions::default().timeout(Duration::from_millis(200));
    lockkit::with_lock(conn, 1, wait, work)
}

/// Sells 2 of item 2: a lock timeout while [`item_2_held`] holds it.
#[cfg(feature = "postgres")]
fn sell_2_of_item_2(conn: &mut PgConnection) -> Result<(), Error> {
    diesel::update(items::table.find(2))
        .set(items::stock.eq(items::stock - 2))
        .execute(conn)?;
    Ok(())
}

/// Sells 2 of item 1, which [`with_lock_on_1`] handed over as `item`: its
/// stock set 2 below the one read.
#[cfg(feature = "postgres")]
fn sell_2_of_locked_item_1(conn: &mut PgConnection, item: &Item) -> Result<(), Error> {
    diesel::update(items::table.find(1))
        .set(items::stock.eq(item.stock - 2))
        .execute(conn)?;
    Ok(())
}

/// PostgreSQL ends the usefulness of a transaction at any failed statement: a
/// `retry` inside `with_lock` that meets a lock timeout runs its work again in
/// the aborted transaction, where every statement fails (25P02). `with_lock`,
/// which owns the transaction, must hand back the retryable cause the journal
/// saw, so that a `retry` around it runs the whole transaction again, not the
/// "current transaction is aborted" error, which no retry takes up.
#[cfg(feature = "postgres")]
#[test]
fn a_retry_inside_with_lock_that_met_a_lock_timeout_lets_the_retry_around_it_run_again() {
    succeeds_at_the_second_attempt("retry_inside_aborted", [8, 8], |conn, attempt| {
        retry(&RetryPolicy::immediate(3), |_| {
            attempt();
            with_lock_on_1(conn, |c, item| {
                retry(&RetryPolicy::immediate(3), |_| sell_2_of_item_2(c))?;
                sell_2_of_locked_item_1(c, &item)
            })
        })
    });
}

/// As above, with the caller's own Diesel transaction, which lets the lock
/// timeout go and calls `with_lock`: the nested call's `SAVEPOINT` would fail
/// with "current transaction is aborted", a plain database error that no retry
/// takes up. The call reports the cause the journal saw
/// (`TransactionAborted(LockTimeout)`, retryable once the caller's transaction
/// rolled back), and a `retry` around that transaction runs it again.
#[cfg(feature = "postgres")]
#[test]
fn a_nested_call_after_a_lock_timeout_the_caller_let_go_lets_the_retry_around_run_again() {
    succeeds_at_the_second_attempt("nested_after_aborted", [8, 8], |conn, attempt| {
        // The journal watches the connection from here on.
        lockkit::locked_transaction(conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
        retry(&RetryPolicy::immediate(3), |_| {
            attempt();
            conn.transaction(|c| {
                exec(c, "SET LOCAL lock_timeout = '200ms'");
                let _ = sell_2_of_item_2(c); // let go
                with_lock_on_1(c, |c, item| sell_2_of_locked_item_1(c, &item))
            })
        })
    });
}

/// A nested lockkit transaction whose work lets a lock timeout go and
/// returns `Ok`: PostgreSQL refuses the nested call's `RELEASE SAVEPOINT` in
/// the aborted transaction ("current transaction is aborted", which no retry
/// takes up). The nested call must hand back the cause the journal saw, once
/// its savepoint is rolled back (which revives the transaction around it), so
/// that a `transaction_with_retry` runs it again there.
#[cfg(feature = "postgres")]
#[test]
fn a_nested_call_whose_work_let_a_lock_timeout_go_is_run_again_by_its_retry() {
    succeeds_at_the_second_attempt("nested_swallowed_timeout", [10, 8], |conn, attempt| {
        lockkit::transaction_with_retry(conn, &RetryPolicy::immediate(1), |c| {
            lockkit::transaction_with_retry(c, &RetryPolicy::immediate(3), |c| {
                attempt();
                exec(c, "SET LOCAL lock_timeout = '200ms'");
                let _ = sell_2_of_item_2(c); // let go
                Ok::<_, Error>(())
            })
        })
    });
}

/// And what that must not take: an error that aborts nothing (Diesel's
/// empty query, answered without an abort) let go in a nested call's work,
/// which returns `Ok`, leaves the call's work to commit with the caller's.
#[cfg(feature = "postgres")]
#[test]
fn a_nested_call_whose_work_let_an_error_go_that_aborted_nothing_commits() {
    let db = TestDb::<PgConnection>::new("nested_error_aborted_nothing");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = db.connect();
    // The journal watches the connection from here on.
    lockkit::locked_transaction(&mut conn, LockOptions::default(), |_| Ok::<_, Error>(())).unwrap();
    let outcome = conn.transaction(|c| {
        lockkit::transaction_with_retry(c, &RetryPolicy::immediate(1), |c| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(9))
                .execute(c)?;
            let empty = diesel::connection::SimpleConnection::batch_execute(c, "-- nothing");
            assert!(empty.is_err(), "an empty query is an error: {empty:?}");
            Ok::<_, Error>(())
        })
    });
    let stock = stock_of!(&mut db.conn());
    assert!(outcome.is_ok() && stock == 9, "{outcome:?}; stock {stock}");
}

/// And what that must not take away: a work that returns at the failed
/// statement, with an error of its own, gets that error back.
#[cfg(feature = "postgres")]
#[test]
fn a_work_that_returns_its_own_error_at_a_lock_timeout_gets_it_back() {
    let (outcome, stocks) = while_item_2_held("own_error_at_timeout", |conn, _| {
        with_lock_on_1(conn, |c, _| match sell_2_of_item_2(c) {
            Err(Error::LockTimeout) => Err(Error::InvalidInput("item 2 is busy")),
            other => other,
        })
    });
    assert!(
        matches!(outcome, Err(Error::InvalidInput("item 2 is busy"))) && stocks == [10, 10],
        "{outcome:?}; stocks {stocks:?}"
    );
}

/// A work that recovers from the timeout with a savepoint of its own, in SQL,
/// and then fails for another reason (a duplicate key) gets that failure, not
/// the timeout it recovered from: a retry around it must not run a failure
/// that no new attempt can cure again and again.
#[cfg(feature = "postgres")]
#[test]
fn a_work_that_recovered_from_a_lock_timeout_and_then_failed_otherwise_gets_its_failure() {
    let (outcome, stocks) = while_item_2_held("recovered_then_failed", |conn, _| {
        with_lock_on_1(conn, |c, _| {
            exec(c, "SAVEPOINT best_effort");
            let timed_out = sell_2_of_item_2(c);
            assert!(
                matches!(timed_out, Err(Error::LockTimeout)),
                "{timed_out:?}"
            );
            exec(c, "ROLLBACK TO SAVEPOINT best_effort");
            diesel::sql_query(
                "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'dup', 0, 0)",
            )
            .execute(c)?;
            Ok(())
        })
    });
    assert!(
        matches!(&outcome, Err(err) if !err.is_retryable() && !matches!(err, Error::LockTimeout))
            && stocks == [10, 10],
        "{outcome:?}; stocks {stocks:?}"
    );
}

/// SQLite in its default rollback-journal mode: `COMMIT` waits for the readers
/// of the database to finish (it needs the exclusive lock). `nowait()` and
/// `timeout(..)` bound the wait for the write lock at `BEGIN IMMEDIATE`, not
/// that one: a reader that holds the database for a moment must not fail a
/// `with_lock` whose work is done, after the work ran.
#[cfg(feature = "sqlite")]
#[test]
fn sqlite_with_lock_commits_behind_a_reader_whatever_its_wait_for_the_lock() {
    let db = lockkit_tests::db::RollbackJournalDb::new("commit_behind_a_reader", &[(1, 10)]);
    let waits = [
        LockOptions::default().nowait(),
        LockOptions::default().timeout(Duration::from_millis(50)),
    ];
    for options in waits {
        let (reading_tx, reading_rx) = mpsc::channel();
        let outcome = thread::scope(|s| {
            s.spawn(|| {
                let mut reader = db.connect();
                reader
                    .transaction(|r| {
                        let _ = stock_of!(r); // holds the shared lock until its end
                        reading_tx.send(()).unwrap();
                        thread::sleep(Duration::from_millis(300));
                        Ok::<_, diesel::result::Error>(())
                    })
                    .unwrap();
            });
            reading_rx.recv().unwrap();
            let mut conn = db.connect();
            exec(&mut conn, "PRAGMA busy_timeout = 5000");
            lockkit::with_lock(&mut conn, 1, options, |c, item: Item| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(c)?;
                Ok::<_, Error>(())
            })
        });
        assert!(outcome.is_ok(), "{options:?}: {outcome:?}");
    }
    assert_eq!(stock_of!(&mut db.connect()), 8);
}

/// SQLite in WAL mode: your own deferred transaction read (its snapshot is
/// fixed), another connection committed a sale since, and a `with_lock`
/// nested there, under a `retry`, needs the write lock: SQLite refuses it at
/// once (the snapshot is stale) on every attempt, as the README says, and
/// nothing is written from the stale row; the other sale stands.
#[cfg(feature = "sqlite")]
#[test]
fn sqlite_a_nested_lock_in_a_transaction_whose_snapshot_went_stale_writes_nothing() {
    use diesel::SqliteConnection;
    let db = TestDb::<SqliteConnection>::new("stale_snapshot_nested_lock");
    seed_items(&mut db.conn(), &[(1, 10)]);
    let mut conn = db.connect();
    let mut other = db.connect();
    let mut attempts = 0;
    let outcome = conn.transaction(|c| {
        let seen = stock_of!(c); // fixes the transaction's snapshot
        exec(
            &mut other,
            "UPDATE items SET stock = stock - 3 WHERE id = 1",
        );
        let sold = lockkit::retry(&RetryPolicy::immediate(3), |_| {
            attempts += 1;
            lockkit::with_lock(c, 1, LockOptions::default(), |c, item: Item| {
                diesel::update(items::table.find(1))
                    .set(items::stock.eq(item.stock - 1))
                    .execute(c)?;
                Ok::<_, Error>(item.stock)
            })
        });
        Ok::<_, Error>((seen, sold))
    });
    let (seen, sold) = outcome.unwrap();
    assert_eq!(seen, 10);
    // SQLite's refusal (`SQLITE_BUSY_SNAPSHOT`) reads as a lock error.
    let refused = |last: &Error| matches!(last, Error::LockTimeout);
    let exhausted =
        matches!(&sold, Err(Error::RetriesExhausted { attempts: 3, last }) if refused(last));
    assert!(exhausted, "{sold:?}");
    assert_eq!(attempts, 3, "every attempt refused: {sold:?}");
    assert_eq!(
        stock_of!(&mut db.connect()),
        7,
        "the other sale stands, nothing stale written"
    );
    // A new transaction sees the sale and sells from it.
    lockkit::with_lock(&mut conn, 1, LockOptions::default(), |c, item: Item| {
        diesel::update(items::table.find(1))
            .set(items::stock.eq(item.stock - 1))
            .execute(c)?;
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(stock_of!(&mut db.connect()), 6);
}
