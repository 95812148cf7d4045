//! lockkit on a multi-primary MariaDB Galera cluster: three nodes that all take
//! writes (`GALERA_URLS`, one URL a node; `scripts/galera.sh start` makes one,
//! `scripts/test.sh` does so for the suite). Each test has a database of its
//! own on the cluster and spreads its connections over the nodes.
//!
//! Galera certifies a transaction's write set against every other node's at
//! `COMMIT`: the first to commit wins and the other fails with 1213 (`Deadlock
//! found`, SQLSTATE 40001), or at its next statement if the winner's write set
//! reached its node first. Row locks, `NOWAIT`, `SKIP LOCKED` and `GET_LOCK`
//! stay on the node that took them. What holds across nodes is what the
//! certification checks: versioned writes, and locked writes that retry.
//!
//! Except one thing the server does now and then under these tests' load
//! (MariaDB 10.11): it ends a transaction for another node's write without
//! failing any statement, runs the transaction's later statements on their
//! own, each committed at once, and reports every one of them a success. A
//! locked write's stale `UPDATE` then commits over other nodes' increments,
//! whatever the client does next. lockkit cannot stop that; where it asks the
//! server before `COMMIT` it finds no transaction open and reports it, not
//! retryable ([`ended_silently`]), instead of running the work again or
//! reporting it committed.

#![cfg(feature = "mysql")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::MysqlConnection;
use lockkit::bounds::LockRow;
use lockkit::prelude::*;
use lockkit::{advisory, locked_transaction, queue, Error, LockOptions, RetryPolicy};
use lockkit_tests::aborts::{ended_silently, open_a_stand_in};
use lockkit_tests::db::TestBackend;
use lockkit_tests::models::{Item, Job};
use lockkit_tests::schema::{items, jobs};
use lockkit_tests::support::{create_galera_database, galera_nodes};

/// How long a node keeps a connection that sends nothing; see [`Cluster::node`].
const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// A database of its own on the Galera cluster, reachable through every node.
struct Cluster {
    /// The database's URL on each node.
    urls: Vec<String>,
    /// Each node's URL as given (its database `test`).
    nodes: Vec<String>,
    name: String,
    /// Whether [`spread`]'s writers make their sessions read-only outside
    /// lockkit's transactions ([`Cluster::writer`]).
    read_only_writers: bool,
}

impl Cluster {
    fn new(test: &str) -> Cluster {
        let nodes = galera_nodes();
        let name = format!("lk_galera_{test}_{}", std::process::id());
        let urls = create_galera_database(&nodes, &name);
        MysqlConnection::migrate(&mut establish(&urls[0]));
        let cluster = Cluster {
            urls,
            nodes,
            name,
            read_only_writers: false,
        };
        cluster.sync();
        cluster
    }

    /// [`Cluster::new`] with the one row the tests fight over: items row 1
    /// (`'hot'`), stock 0, version 0.
    fn with_hot_item(test: &str) -> Cluster {
        let cluster = Cluster::new(test);
        cluster.seed("INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'hot', 0, 0)");
        cluster
    }

    /// A new connection to node `node` (counted modulo the number of nodes).
    ///
    /// MariaDB 10.11's Galera sometimes answers a prepared statement (Diesel
    /// prepares every statement with binds) that it aborted for another node's
    /// write with a reply the client misreads, and the client then waits for a
    /// reply that never comes (mysql-wsrep#287 describes the mechanism). The
    /// node, meanwhile, sees an idle connection: a short `wait_timeout` makes it
    /// close the connection, and the client reports a lost connection
    /// ([`Error::ConnectionLost`]) instead of hanging.
    fn node(&self, node: usize) -> MysqlConnection {
        let mut conn = establish(&self.urls[node % self.urls.len()]);
        conn.batch_execute(&format!(
            "SET SESSION wait_timeout = {}",
            IDLE_TIMEOUT.as_secs()
        ))
        .expect("wait_timeout");
        conn
    }

    /// A connection for writer `t` of [`spread`]: [`Cluster::node`], made
    /// read-only outside lockkit's transactions when the cluster says so.
    fn writer(&self, t: usize) -> MysqlConnection {
        let mut conn = self.node(t);
        if self.read_only_writers {
            lockkit::read_only_outside_transactions(&mut conn).expect("read-only session");
        }
        conn
    }

    fn nodes(&self) -> usize {
        self.urls.len()
    }

    /// Waits until every node has applied every write set committed so far
    /// (Galera applies another node's writes, even `CREATE DATABASE`, shortly
    /// after they commit).
    fn sync(&self) {
        for node in &self.nodes {
            establish(node)
                .batch_execute(&format!(
                    "SET SESSION wsrep_sync_wait = 15; SELECT COUNT(*) FROM {}.items",
                    self.name
                ))
                .unwrap_or_else(|e| panic!("{node} did not catch up: {e}"));
        }
    }

    /// A connection to `node` whose reads first wait for the node to catch up
    /// (`wsrep_sync_wait`): what the checks of the totals read through.
    fn synced(&self, node: usize) -> MysqlConnection {
        let mut conn = self.node(node);
        conn.batch_execute("SET SESSION wsrep_sync_wait = 1")
            .expect("wsrep_sync_wait");
        conn
    }

    fn seed(&self, sql: &str) {
        self.node(0).batch_execute(sql).expect("seed");
        self.sync();
    }

    /// Row 1 of `items` (stock, version) as every node sees it once caught up;
    /// the nodes must agree.
    fn item(&self) -> (i32, i32) {
        let read = |node| {
            items::table
                .find(1)
                .select((items::stock, items::lock_version))
                .first::<(i32, i32)>(&mut self.synced(node))
                .unwrap()
        };
        let first = read(0);
        for node in 1..self.nodes() {
            assert_eq!(read(node), first, "node {} disagrees with node 1", node + 1);
        }
        first
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(mut conn) = MysqlConnection::establish(&self.urls[0]) {
            let _ = conn.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.name));
        }
    }
}

fn establish(url: &str) -> MysqlConnection {
    MysqlConnection::establish(url).unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}

/// Patient enough for a few writers per node on one hot row.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(200)
        .base_delay(Duration::from_millis(2))
        .max_delay(Duration::from_millis(50))
}

const WRITERS: usize = 6;
const WRITES: i32 = 20;

/// What a run of [`spread`] counted.
#[derive(Debug, Default)]
struct Counts {
    /// Attempts that failed with a conflict and ran again.
    retries: AtomicU32,
    /// Connections the node stopped answering, replaced (see [`Cluster::node`]).
    lost: AtomicU32,
    /// Writes whose transaction the server ended without failing a statement
    /// ([`ended_silently`]): lockkit reported it, and their outcome is unknown.
    silently_ended: AtomicU32,
}

/// Runs `write` `WRITES` times on each of `WRITERS` threads, the threads spread
/// over the nodes (thread `t` on node `t % nodes`), all starting together.
/// `write` gets the thread's number. A write whose connection was lost (the
/// node stopped answering after aborting its transaction, see [`Cluster::node`])
/// runs again on a new connection: the exact totals the tests check would show
/// it if that write had committed after all.
fn spread(
    cluster: &Cluster,
    write: impl Fn(&mut MysqlConnection, usize, &Counts) -> Result<(), Error> + Sync,
) -> Counts {
    let barrier = Barrier::new(WRITERS);
    let counts = Counts::default();
    thread::scope(|s| {
        for t in 0..WRITERS {
            let (barrier, counts, write) = (&barrier, &counts, &write);
            s.spawn(move || {
                let mut conn = cluster.writer(t);
                barrier.wait();
                for _ in 0..WRITES {
                    loop {
                        match write(&mut conn, t, counts) {
                            Ok(()) => break,
                            Err(Error::ConnectionLost) | Err(Error::RetriesExhausted { .. })
                                if !conn_alive(&mut conn) =>
                            {
                                counts.lost.fetch_add(1, Ordering::Relaxed);
                                conn = cluster.writer(t);
                            }
                            Err(err) if ended_silently(&err) => {
                                counts.silently_ended.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            Err(err) => panic!("writer {t}: {err:?}"),
                        }
                    }
                }
            });
        }
    });
    counts
}

fn conn_alive(conn: &mut MysqlConnection) -> bool {
    conn.batch_execute("SELECT 1").is_ok()
}

/// Counts every attempt after the first.
fn count(counts: &Counts, attempt: u32) {
    if attempt > 1 {
        counts.retries.fetch_add(1, Ordering::Relaxed);
    }
}

/// Checks that the writers of a [`spread`] run on different nodes met (some
/// attempt ran again), and reports the run as `galera {label}: ..`.
fn the_writers_met(cluster: &Cluster, label: &str, total: i32, counts: &Counts, started: Instant) {
    assert!(
        counts.retries.load(Ordering::Relaxed) > 0,
        "the writers on different nodes never met"
    );
    eprintln!(
        "galera {label}: {total} increments on {} nodes, {counts:?}, {:?}",
        cluster.nodes(),
        started.elapsed()
    );
}

#[test]
fn versioned_writes_on_every_node_add_up_exactly() {
    let cluster = Cluster::with_hot_item("versioned");
    let started = Instant::now();
    let counts = spread(&cluster, |conn, _, counts| {
        lockkit::retry(&policy(), |attempt| {
            count(counts, attempt);
            let mut item = items::table.find(1).first::<Item>(conn)?;
            item.stock += 1;
            item.update_versioned(conn)
        })
    });
    let total = WRITERS as i32 * WRITES;
    assert_eq!(
        cluster.item(),
        (total, total),
        "every increment once, one version each"
    );
    the_writers_met(&cluster, "versioned", total, &counts, started);
}

#[test]
fn a_naive_read_modify_write_across_nodes_loses_updates() {
    // The baseline the versioned writes above are measured against: read, then
    // write the absolute value. Galera refuses (1213) or re-runs
    // (`wsrep_retry_autocommit`) an UPDATE that another node's write overtook,
    // but a re-run UPDATE still writes the stale sum, and so do writers on one node.
    let cluster = Cluster::with_hot_item("naive");
    let counts = spread(&cluster, |conn, _, counts| loop {
        // A naive writer that at least tries again when the cluster refuses it.
        let stock = items::table
            .find(1)
            .select(items::stock)
            .first::<i32>(conn)
            .unwrap();
        thread::sleep(Duration::from_millis(1));
        match diesel::update(items::table.find(1))
            .set(items::stock.eq(stock + 1))
            .execute(conn)
            .map_err(Error::from)
        {
            Ok(_) => break Ok(()),
            Err(Error::Deadlock) => count(counts, 2),
            Err(err) => break Err(err),
        }
    });
    let total = WRITERS as i32 * WRITES;
    let (stock, _) = cluster.item();
    assert!(stock < total, "no update lost: {stock} of {total}");
    eprintln!(
        "galera naive: {} of {total} increments lost in silence ({counts:?}: refused and redone)",
        total - stock
    );
}

/// Takes `with_lock` on items row 1 on node 1 and, while it holds the row
/// (after `work` ran in its transaction), runs `meanwhile`; then lets node 1's
/// transaction go on to `COMMIT`. Returns node 1's result and `meanwhile`'s.
fn while_node_1_holds_row_1<T: Send>(
    cluster: &Cluster,
    work: impl Fn(&mut MysqlConnection) -> Result<(), Error> + Send + Sync,
    after: impl Fn(&mut MysqlConnection) -> Result<(), Error> + Send + Sync,
    meanwhile: impl FnOnce() -> T,
) -> (Result<(), Error>, T) {
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (work, after) = (&work, &after);
    thread::scope(|s| {
        let holder = s.spawn(move || {
            let mut conn = cluster.node(0);
            lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn, _: Item| {
                work(conn)?;
                locked_tx.send(()).unwrap();
                let _ = release_rx.recv();
                after(conn)
            })
        });
        locked_rx.recv().expect("node 1 took the lock");
        let out = meanwhile();
        release_tx.send(()).unwrap();
        (holder.join().unwrap(), out)
    })
}

fn add_stock(conn: &mut MysqlConnection, n: i32) -> Result<(), Error> {
    diesel::update(items::table.find(1))
        .set(items::stock.eq(items::stock + n))
        .execute(conn)?;
    Ok(())
}

/// Node 2's `with_lock` on row 1, adding 10, and how long it took.
fn node_2_adds_10(cluster: &Cluster) -> (Result<(), Error>, Duration) {
    let mut conn = cluster.node(1);
    let started = Instant::now();
    let options = LockOptions::default().timeout(Duration::from_secs(5));
    let result = lockkit::with_lock(&mut conn, 1, options, |conn, _: Item| add_stock(conn, 10));
    (result, started.elapsed())
}

/// [`while_node_1_holds_row_1`] with node 1 adding 1 to row 1 and node 2
/// adding 10 ([`node_2_adds_10`]) meanwhile; node 1 then runs `after` and goes
/// on to `COMMIT`. Node 1's result and node 2's.
fn node_2_adds_10_while_node_1_holds_row_1(
    cluster: &Cluster,
    after: impl Fn(&mut MysqlConnection) -> Result<(), Error> + Send + Sync,
) -> (Result<(), Error>, (Result<(), Error>, Duration)) {
    while_node_1_holds_row_1(
        cluster,
        |conn| add_stock(conn, 1),
        after,
        || node_2_adds_10(cluster),
    )
}

/// Waits until node 2's write set (its 10 on row 1) reached node 1, as a read
/// on another connection to node 1 shows.
fn node_1_sees_node_2s_10(cluster: &Cluster) -> Result<(), Error> {
    let mut observer = cluster.node(0);
    while items::table
        .find(1)
        .select(items::stock)
        .first::<i32>(&mut observer)?
        < 10
    {
        thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

#[test]
fn with_lock_on_another_node_does_not_wait_and_the_later_commit_fails_retryably() {
    let cluster = Cluster::with_hot_item("commit_abort");
    let (node_1, (node_2, waited)) = node_2_adds_10_while_node_1_holds_row_1(&cluster, |_| Ok(()));
    // No bound on `waited`: node 1 holds the row until node 2's call has
    // returned, so a node 2 that waited for node 1's lock would fail with
    // its lock timeout (5 s), not lock, write and commit.
    node_2.expect("node 2 locks, writes and commits while node 1 holds the row");
    let err = node_1.expect_err("node 1's COMMIT after node 2's must fail");
    assert!(matches!(err, Error::Deadlock), "{err:?}");
    assert!(err.is_retryable());
    // Node 2's write stands; node 1's was rolled back and reported, not lost in
    // silence. Node 2's write found the row below the number node 1's open
    // write gave it, so lockkit moved the row past that number (version 2):
    // the struct node 1 read under lock holds it.
    assert_eq!(cluster.item(), (10, 2));
    eprintln!("galera with_lock: node 2 locked the row node 1 held in {waited:?}");
}

#[test]
fn a_struct_rolled_back_on_one_node_never_writes_over_a_commit_on_another() {
    // README, Guarantees: a struct whose versioned write was rolled back never
    // succeeds over somebody else's later write. The nodes name themselves
    // apart (`@@hostname`, `@@port`); the row is one row.
    let cluster = Cluster::with_hot_item("rolled_back_across_nodes");
    let (mut one, mut two) = (cluster.synced(0), cluster.synced(1));
    lockkit_tests::rolled_back_on_one_retried_on_the_other!(
        &mut one,
        &mut two,
        |conn: &mut MysqlConnection| items::table.find(1).first::<Item>(conn).unwrap(),
        "node 2"
    );
    assert_eq!(cluster.item().0, 7, "every node has B's 7");
}

#[test]
fn a_transaction_overtaken_by_another_node_fails_at_its_next_statement() {
    let cluster = Cluster::with_hot_item("next_statement");
    let (node_1, (node_2, _)) = node_2_adds_10_while_node_1_holds_row_1(&cluster, |conn| {
        node_1_sees_node_2s_10(&cluster)?;
        add_stock(conn, 1)
    });
    node_2.unwrap();
    let err = node_1.expect_err("node 1's next statement after node 2's commit must fail");
    assert!(matches!(err, Error::Deadlock), "{err:?}");
    // Version 2: node 2's write moved the row past node 1's open number, as above.
    assert_eq!(cluster.item(), (10, 2));
}

// A nested `with_lock` (with a lock timeout: saves and sets the session's
// lock wait timeout) takes a savepoint, works, releases the savepoint (and
// puts the timeout back). Node 2's commit of row 1 aborts node 1's
// transaction, and one of those statements is the first to learn it: the call
// must fail as its work's own statement would have, the stand-in open, or the
// caller's next write commits on its own.

/// The lock timeout of the nested calls that set one.
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(5));

#[test]
fn a_nested_lock_whose_timeout_restore_finds_the_transaction_aborted_reports_it() {
    nested_lock_after_an_abort("restore_after_release", "RELEASE SAVEPOINT", TIMEOUT);
}

#[test]
fn a_nested_lock_whose_timeout_setting_finds_the_transaction_aborted_reports_it() {
    nested_lock_after_an_abort("setting_after_abort", "INSERT INTO orders", TIMEOUT);
}

#[test]
fn a_nested_lock_whose_savepoint_finds_the_transaction_aborted_reports_it() {
    nested_lock_after_an_abort("savepoint_after_abort", "INSERT INTO orders", None);
}

#[cfg(feature = "async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_nested_lock_whose_timeout_restore_finds_the_transaction_aborted_reports_it() {
    async_nested_lock_after_an_abort("async_restore_after_release", "RELEASE SAVEPOINT", TIMEOUT)
        .await;
}

#[cfg(feature = "async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_nested_lock_whose_timeout_setting_finds_the_transaction_aborted_reports_it() {
    async_nested_lock_after_an_abort("async_setting_after_abort", "INSERT INTO orders", TIMEOUT)
        .await;
}

#[cfg(feature = "async")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_nested_lock_whose_savepoint_finds_the_transaction_aborted_reports_it() {
    async_nested_lock_after_an_abort("async_savepoint_after_abort", "INSERT INTO orders", None)
        .await;
}

/// What node 1's transaction writes before its nested lock call, and after.
const ROW_1: &str = "UPDATE items SET stock = stock + 1 WHERE id = 1";
const ORDER_LINE_1: &str = "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)";
const ORDER_LINE_2: &str = "INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)";

/// Node 1's transaction writes row 1 and order line 1, runs a nested
/// `with_lock` of row 1 (with the lock `timeout`), then writes order line 2;
/// node 2 commits row 1 after node 1's first statement that starts with
/// `abort_after`.
fn nested_lock_after_an_abort(test: &str, abort_after: &'static str, timeout: Option<Duration>) {
    let cluster = Cluster::with_hot_item(test);
    let mut node_1 = cluster.node(0);
    node_1.set_instrumentation(lockkit::journal::Journal::wrap(
        node_2_commits_after_the_first(&cluster, abort_after),
    ));
    let mut nested = None;
    let mut after = None;
    let outcome: Result<(), Error> = node_1.transaction(|conn| {
        conn.batch_execute(ROW_1)?;
        conn.batch_execute(ORDER_LINE_1)?;
        let options =
            timeout.map_or_else(LockOptions::default, |t| LockOptions::default().timeout(t));
        nested = Some(lockkit::with_lock(conn, 1, options, |conn, _: Item| {
            add_stock(conn, 1)
        }));
        after = Some(conn.batch_execute(ORDER_LINE_2).map_err(Error::from));
        Ok(())
    });
    nothing_of_node_1_committed(&cluster, nested.unwrap(), after.unwrap(), &outcome);
}

/// [`nested_lock_after_an_abort`] on diesel-async.
#[cfg(feature = "async")]
async fn async_nested_lock_after_an_abort(
    test: &str,
    abort_after: &'static str,
    timeout: Option<Duration>,
) {
    use diesel_async::{AsyncConnection, AsyncMysqlConnection, SimpleAsyncConnection};
    let cluster = Cluster::with_hot_item(test);
    let mut node_1 = AsyncMysqlConnection::establish(&cluster.urls[0])
        .await
        .unwrap();
    node_1.set_instrumentation(lockkit::journal::Journal::wrap(
        node_2_commits_after_the_first(&cluster, abort_after),
    ));
    let mut nested = None;
    let mut after = None;
    let outcome = lockkit::asynchronous::locked_transaction(
        &mut node_1,
        LockOptions::default(),
        async |conn: &mut AsyncMysqlConnection| {
            conn.batch_execute(ROW_1).await?;
            conn.batch_execute(ORDER_LINE_1).await?;
            let options =
                timeout.map_or_else(LockOptions::default, |t| LockOptions::default().timeout(t));
            nested = Some(
                lockkit::asynchronous::with_lock(conn, 1, options, async |conn, _: Item| {
                    conn.batch_execute(ROW_1).await?;
                    Ok::<_, Error>(())
                })
                .await,
            );
            after = Some(conn.batch_execute(ORDER_LINE_2).await.map_err(Error::from));
            Ok::<_, Error>(())
        },
    )
    .await;
    nothing_of_node_1_committed(&cluster, nested.unwrap(), after.unwrap(), &outcome);
}

/// The nested call failed as aborted, the write after it was refused, and
/// nothing of node 1's transaction committed: no order line, and row 1 holds
/// node 2's 10 only. `outcome`: what node 1's transaction returned.
fn nothing_of_node_1_committed(
    cluster: &Cluster,
    nested: Result<(), Error>,
    after: Result<(), Error>,
    outcome: &Result<(), Error>,
) {
    assert!(
        matches!(nested, Err(Error::TransactionAborted(_))),
        "{nested:?}"
    );
    assert!(after.is_err(), "the caller's next write ran in autocommit");
    let lines: i64 = lockkit_tests::schema::orders::table
        .count()
        .get_result(&mut cluster.synced(0))
        .unwrap();
    assert_eq!(
        lines, 0,
        "nothing of node 1's transaction committed; it returned {outcome:?}"
    );
    assert_eq!(cluster.item().0, 10, "node 2's 10 stands");
}

/// Instrumentation for node 1: after its first successful statement that
/// starts with `after`, node 2 adds 10 to row 1 and node 1 applies it
/// (aborting node 1's open transaction, which wrote row 1).
fn node_2_commits_after_the_first(
    cluster: &Cluster,
    after: &'static str,
) -> impl FnMut(diesel::connection::InstrumentationEvent<'_>) + Send + 'static {
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (on_node_2, on_node_1) = (cluster.urls[1].clone(), cluster.urls[0].clone());
    move |event| {
        let diesel::connection::InstrumentationEvent::FinishQuery {
            query, error: None, ..
        } = event
        else {
            return;
        };
        if query.to_string().starts_with(after) && !fired.swap(true, Ordering::SeqCst) {
            establish(&on_node_2)
                .batch_execute("UPDATE items SET stock = stock + 10 WHERE id = 1")
                .unwrap();
            establish(&on_node_1)
                .batch_execute("SET SESSION wsrep_sync_wait = 15; SELECT COUNT(*) FROM items")
                .unwrap();
        }
    }
}

#[test]
fn transaction_with_retry_reruns_a_transaction_another_node_aborted() {
    // with_lock nested in transaction_with_retry: node 2 overtakes the first
    // attempt, whose nested call reports the whole transaction gone
    // (TransactionAborted); the outer call runs it again, and it commits.
    let cluster = Cluster::with_hot_item("rerun");
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let nested_errors = std::sync::Mutex::new(Vec::new());
    let (cluster, nested_errors) = (&cluster, &nested_errors);
    let attempts = thread::scope(|s| {
        let holder = s.spawn(move || {
            let mut conn = cluster.node(0);
            let mut attempts = 0;
            lockkit::transaction_with_retry(&mut conn, &policy(), |conn| {
                attempts += 1;
                let nested =
                    lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _: Item| {
                        add_stock(conn, 1)?;
                        if attempts == 1 {
                            locked_tx.send(()).unwrap();
                            let _ = release_rx.recv();
                            node_1_sees_node_2s_10(cluster)?;
                        }
                        add_stock(conn, 1)
                    });
                if let Err(err) = &nested {
                    nested_errors.lock().unwrap().push(format!("{err:?}"));
                }
                nested
            })
            .map(|()| attempts)
        });
        locked_rx.recv().unwrap();
        node_2_adds_10(cluster).0.unwrap();
        release_tx.send(()).unwrap();
        holder.join().unwrap()
    });
    assert_eq!(attempts.unwrap(), 2);
    let errors = nested_errors.lock().unwrap();
    assert!(
        errors.len() == 1 && errors[0].starts_with("TransactionAborted(Deadlock"),
        "{errors:?}"
    );
    // Node 2's 10, then the rerun's 1 + 1; two locks, two versions (three when
    // node 2's write skipped the number the aborted attempt had bumped to: a
    // number an uncommitted write holds is never committed).
    let (stock, version) = cluster.item();
    assert_eq!(stock, 12);
    assert!((2..=3).contains(&version), "version {version}");
}

#[test]
fn retried_locked_writes_on_every_node_add_up_exactly() {
    retried_locked_writes("retry_locked", "locked writes", Stress::None);
}

#[test]
fn retried_locked_writes_on_read_only_sessions_add_up_exactly_even_when_ended_silently() {
    // The guard the module's docs give for the silent end: the writers'
    // sessions refuse a write outside lockkit's transactions, so nothing of
    // a transaction the server ended in silence commits on its own, and
    // lockkit reports the end as retryable. The total is exact.
    retried_locked_writes(
        "retry_locked_read_only",
        "locked writes, read-only sessions",
        Stress::ReadOnly,
    );
}

#[test]
fn retried_locked_writes_add_up_while_another_connection_opens_stand_ins() {
    // The same writers while another connection of the process keeps opening
    // stand-ins (as a concurrent test's nested call does): every writer's
    // transaction then asks the server before COMMIT whether it is still its
    // own, and a writer that another node overtook after its last statement
    // meets the abort's 1213 at that question.
    retried_locked_writes(
        "retry_locked_stand_ins",
        "locked writes, stand-ins",
        Stress::StandIns,
    );
}

/// What [`retried_locked_writes`] adds to its writers.
#[derive(Clone, Copy, PartialEq)]
enum Stress {
    None,
    /// Another connection opens stand-ins ([`open_a_stand_in`]) over and
    /// over while they write.
    StandIns,
    /// Their sessions are read-only outside lockkit's transactions
    /// ([`lockkit::read_only_outside_transactions`]): no write of theirs
    /// runs in autocommit, and the total must be exact.
    ReadOnly,
}

/// Half the writers retry `with_lock`, half run `transaction_with_retry` around
/// a `FOR UPDATE` read: the losers of each certification run again, under
/// `stress`.
fn retried_locked_writes(test: &str, label: &str, stress: Stress) {
    let mut cluster = Cluster::with_hot_item(test);
    cluster.read_only_writers = stress == Stress::ReadOnly;
    let started = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let counts = thread::scope(|s| {
        if stress == Stress::StandIns {
            let (done, mut other) = (&done, cluster.node(0));
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    open_a_stand_in(&mut other);
                    thread::sleep(Duration::from_millis(1));
                }
            });
        }
        let counts = spread(&cluster, |conn, t, counts| {
            if t % 2 == 0 {
                lockkit::retry(&policy(), |attempt| {
                    count(counts, attempt);
                    lockkit::with_lock(conn, 1, LockOptions::default(), |conn, item: Item| {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(item.stock + 1))
                            .execute(conn)?;
                        Ok::<_, Error>(())
                    })
                })
            } else {
                let mut attempt = 0;
                lockkit::transaction_with_retry(conn, &policy(), |conn| {
                    attempt += 1;
                    count(counts, attempt);
                    let stock = items::table
                        .find(1)
                        .select(items::stock)
                        .for_update()
                        .first::<i32>(conn)?;
                    diesel::update(items::table.find(1))
                        .set(items::stock.eq(stock + 1))
                        .execute(conn)?;
                    Ok::<_, Error>(())
                })
            }
        });
        done.store(true, Ordering::Relaxed);
        counts
    });
    let total = WRITERS as i32 * WRITES;
    let (stock, version) = cluster.item();
    let silently_ended = counts.silently_ended.load(Ordering::Relaxed);
    if stress == Stress::ReadOnly {
        assert_eq!(
            silently_ended, 0,
            "a silent end reported as unknown: {counts:?}"
        );
    }
    if silently_ended > 0 {
        // The server may have committed statements of those transactions on
        // their own (the module's docs), over other writers' increments:
        // increments may be missing, never one more (each write's statements
        // add one to what they read, and a reported write is not run again),
        // and the caller of each such write was told. Most often nothing of it
        // had committed, and the total lacks exactly those writes.
        assert!(stock <= total, "{stock} increments of {total}, {counts:?}");
        eprintln!("galera {label}: the server ended {silently_ended} transactions silently; {stock} of {total}");
        return;
    }
    assert_eq!(stock, total, "every increment once");
    // Only `with_lock` on a versioned model advances the version: once per
    // locked write, plus at most one skipped number per retried (aborted) one.
    let retries = counts.retries.load(Ordering::Relaxed) as i32;
    assert!(
        (total / 2..=total / 2 + retries).contains(&version),
        "version {version}, {retries} retries"
    );
    the_writers_met(&cluster, label, total, &counts, started);
}

#[test]
fn nowait_sees_only_the_locks_of_its_own_node() {
    let cluster = Cluster::with_hot_item("nowait");
    let nowait = |node| {
        let mut conn = cluster.node(node);
        lockkit::with_lock(
            &mut conn,
            1,
            LockOptions::default().nowait(),
            |_, item: Item| Ok::<_, Error>(item.id),
        )
    };
    let (_, (same_node, other_node)) =
        while_node_1_holds_row_1(&cluster, |_| Ok(()), |_| Ok(()), || (nowait(0), nowait(1)));
    assert!(matches!(same_node, Err(Error::Busy)), "{same_node:?}");
    assert_eq!(other_node.expect("node 2 gets the row node 1 holds"), 1);
}

#[test]
fn skip_locked_hands_another_node_the_row_one_node_holds() {
    let cluster = Cluster::new("skip_locked");
    cluster.seed("INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false), (2, 'b', false)");
    let claim = |node| {
        let mut conn = cluster.node(node);
        locked_transaction(&mut conn, LockOptions::default(), |conn| {
            let jobs: Vec<Job> = queue::claim(
                conn,
                jobs::table.order(jobs::id).select(Job::as_select()),
                1,
            )?;
            Ok::<_, Error>(jobs.iter().map(|job| job.id).collect::<Vec<_>>())
        })
        .unwrap()
    };
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let cluster = &cluster;
    let (held, same_node, other_node) = thread::scope(|s| {
        let holder = s.spawn(move || {
            let mut conn = cluster.node(0);
            locked_transaction(&mut conn, LockOptions::default(), |conn| {
                let jobs: Vec<Job> = queue::claim(
                    conn,
                    jobs::table.order(jobs::id).select(Job::as_select()),
                    1,
                )?;
                locked_tx.send(()).unwrap();
                let _ = release_rx.recv();
                Ok::<_, Error>(jobs.iter().map(|job| job.id).collect::<Vec<_>>())
            })
            .unwrap()
        });
        locked_rx.recv().unwrap();
        let (same_node, other_node) = (claim(0), claim(1));
        release_tx.send(()).unwrap();
        (holder.join().unwrap(), same_node, other_node)
    });
    assert_eq!(held, [1]);
    assert_eq!(same_node, [2], "node 1 skips the job node 1 holds");
    assert_eq!(other_node, [1], "node 2 claims the job node 1 holds");
}

#[test]
fn get_lock_is_granted_on_two_nodes_at_once() {
    let cluster = Cluster::new("get_lock");
    let (mut one, mut same, mut two) = (cluster.node(0), cluster.node(0), cluster.node(1));
    let held = advisory::try_lock(&mut one, "galera-job").unwrap();
    assert!(held.is_some());
    assert!(
        advisory::try_lock(&mut same, "galera-job")
            .unwrap()
            .is_none(),
        "one node excludes"
    );
    let also = advisory::try_lock(&mut two, "galera-job").unwrap();
    assert!(also.is_some(), "node 2 is granted the lock node 1 holds");
}

/// Retries `with_lock` on row 1 through `conn` (on node 1), adding 1 with
/// `add_1`: node 2 overtakes the first attempt while its closure does no
/// database work, and the closure then gives up (a retryable error of its own).
/// The node answers the ROLLBACK with 1213 as well, and Diesel's transaction
/// manager calls the connection broken, although no transaction is open: lockkit
/// asks the server and carries on, so the retry on the same connection runs.
fn a_retried_lock_after_a_refused_rollback<C>(
    cluster: &Cluster,
    conn: &mut C,
    add_1: impl Fn(&mut C::Conn) -> Result<(), Error>,
) where
    C: lockkit::AsLockingConnection,
    Item: LockRow<C::Conn>,
{
    let result = lockkit::retry(&RetryPolicy::immediate(3), |attempt| {
        lockkit::with_lock(&mut *conn, 1, LockOptions::default(), |conn, _: Item| {
            add_1(conn)?;
            if attempt == 1 {
                node_2_adds_10(cluster).0.unwrap();
                node_1_sees_node_2s_10(cluster)?;
                return Err(Error::Busy);
            }
            Ok(attempt)
        })
    });
    assert_eq!(result.unwrap(), 2);
    // Node 2's write moved the row past the first attempt's open number (2),
    // and the retry's lock bumped it once more.
    assert_eq!(cluster.item(), (11, 3));
}

#[test]
fn a_retried_lock_reuses_a_connection_whose_rollback_the_node_refused() {
    let cluster = Cluster::with_hot_item("refused_rollback");
    a_retried_lock_after_a_refused_rollback(&cluster, &mut cluster.node(0), |conn| {
        add_stock(conn, 1)
    });
}

#[test]
fn a_retried_lock_reuses_a_multi_connection_whose_rollback_the_node_refused() {
    // The same refused ROLLBACK, through a `#[derive(MultiConnection)]` enum:
    // lockkit puts the transaction manager of the connection inside the enum
    // back in order too.
    use lockkit_tests::support::AnyConnection;
    let cluster = Cluster::with_hot_item("refused_rollback_multi");
    let mut one = AnyConnection::Mysql(cluster.node(0));
    a_retried_lock_after_a_refused_rollback(&cluster, &mut one, |conn| {
        diesel::update(items::table.find(1))
            .set(items::stock.eq(items::stock + 1))
            .execute(conn)?;
        Ok(())
    });
}

#[test]
fn a_locked_write_overtaken_while_its_work_ends_is_not_reported_committed() {
    // Node 2 overtakes node 1's with_lock after its last statement, while its
    // work is still running; meanwhile another connection of the process opens
    // a stand-in, so node 1's with_lock asks the server before COMMIT whether
    // its transaction survived. The node answers that question with the abort's
    // 1213: the transaction is gone, and the COMMIT after it commits nothing.
    let cluster = Cluster::with_hot_item("overtaken_at_the_question");
    let mut conn = cluster.node(0);
    let result = lockkit::with_lock(&mut conn, 1, LockOptions::default(), |conn, _: Item| {
        add_stock(conn, 1)?;
        node_2_adds_10(&cluster).0.unwrap();
        node_1_sees_node_2s_10(&cluster)?;
        open_a_stand_in(&mut cluster.node(0));
        Ok::<_, Error>(())
    });
    let (stock, _) = cluster.item();
    assert!(
        matches!(result, Err(Error::Deadlock)),
        "with_lock returned {result:?}, the stock is {stock} (node 1's 1 {})",
        if stock == 11 { "committed" } else { "lost" }
    );
    assert_eq!(stock, 10, "node 2's 10 stands, node 1's 1 was rolled back");
}
