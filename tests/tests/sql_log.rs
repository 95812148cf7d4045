//! Every statement lockkit sends, captured from a real connection of each backend
//! (Diesel's instrumentation) while a script calls each lockkit operation once.
//! The log is pinned by a snapshot per backend, and `docs/SQL.md` is generated
//! from the same log: `UPDATE_DOCS=1 cargo test -p lockkit-tests --test sql_log`
//! rewrites it, and the test fails when the file and the code disagree.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::compare_and_set::expect;
use lockkit::lease::{self, Fence};
use lockkit::prelude::*;
use lockkit::{locked_transaction, queue, Error, LockOptions, RetryPolicy};
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{create_notes, exec, seed_items};

/// A titled group of statements.
type Section = (String, Vec<String>);

/// Collects the SQL of every statement, section by section.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Section>>>);

impl Log {
    fn section(&self, title: &str) {
        self.0.lock().unwrap().push((title.to_owned(), Vec::new()));
    }

    fn instrumentation(&self) -> impl Instrumentation {
        let log = self.clone();
        move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                let mut sections = log.0.lock().unwrap();
                if let Some((_, lines)) = sections.last_mut() {
                    lines.push(normalize(&query.to_string()));
                }
            }
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (title, lines) in self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, lines)| !lines.is_empty())
        {
            out.push_str(&format!("-- {title}\n"));
            for line in lines {
                out.push_str(line);
                out.push('\n');
            }
            out.push('\n');
        }
        out
    }
}

/// Timestamps (Unix milliseconds) and lease owner tokens (32 hexadecimal digits
/// in quotes) vary from run to run.
fn normalize(sql: &str) -> String {
    let sql: Vec<&str> = sql.split('"').collect();
    let is_token = |part: &&str| part.len() == 32 && part.chars().all(|c| c.is_ascii_hexdigit());
    let sql = sql
        .iter()
        .map(|part| if is_token(part) { "<token>" } else { *part })
        .collect::<Vec<_>>()
        .join("\"");
    let mut out = String::with_capacity(sql.len());
    let mut digits = String::new();
    for c in sql.chars().chain(std::iter::once('\u{0}')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if digits.len() == 13 {
            out.push_str("<unix-ms>");
        } else {
            out.push_str(&digits);
        }
        digits.clear();
        if c != '\u{0}' {
            out.push(c);
        }
    }
    marks(out.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// A mark's number is the process's count of the writes it recorded, and its
/// slot the connection's count of marks: both vary with the tests that ran
/// before. In a statement of marks, the last bound number is the mark's, the
/// ones before it its slot (`1024`, the marks a connection keeps, stays).
fn marks(line: String) -> String {
    let Some((sql, binds)) = line.split_once("-- binds: [") else {
        return line;
    };
    if !sql.contains("lockkit_marks") && !sql.contains("lockkit.marks") {
        return line;
    }
    let binds = binds.trim_end_matches(']');
    let values: Vec<&str> = binds.split(", ").collect();
    let last = values.iter().rposition(|v| *v != "1024");
    let values: Vec<&str> = values
        .iter()
        .enumerate()
        .map(|(i, v)| match (Some(i) == last, *v) {
            (_, "1024") => "1024",
            (true, _) => "<mark>",
            (false, _) => "<slot>",
        })
        .collect();
    format!("{sql}-- binds: [{}]", values.join(", "))
}

/// Writes or checks the section of `docs/SQL.md` for one backend.
fn check_docs(backend: &str, log: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SQL.md");
    let begin = format!("<!-- {backend}: begin -->");
    let end = format!("<!-- {backend}: end -->");
    let docs = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = format!("{begin}\n```sql\n{log}```\n{end}");
    let current = match (docs.find(&begin), docs.find(&end)) {
        (Some(b), Some(e)) => docs[b..e + end.len()].to_owned(),
        _ => String::new(),
    };
    if current == generated {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = if current.is_empty() {
            format!("{docs}\n## {backend}\n\n{generated}\n")
        } else {
            docs.replace(&current, &generated)
        };
        std::fs::write(&path, updated).unwrap();
    } else {
        panic!("docs/SQL.md is out of date for {backend}; run UPDATE_DOCS=1 cargo test -p lockkit-tests --test sql_log");
    }
}

lockkit_tests::backend_tests! {
    fn every_statement_lockkit_sends(db) {
        let mut conn = db.connect();
        conn.run_pending_migrations(match BACKEND {
            "postgres" => lockkit::idempotency::POSTGRES_MIGRATIONS,
            "mysql" => lockkit::idempotency::MYSQL_MIGRATIONS,
            _ => lockkit::idempotency::SQLITE_MIGRATIONS,
        })
        .unwrap();
        conn.run_pending_migrations(lockkit_tests::lease_migrations(BACKEND)).unwrap();
        conn.run_pending_migrations(lockkit_tests::outbox_migrations(BACKEND)).unwrap();
        seed_items(&mut conn, &[(1, 10), (2, 10), (3, 10)]);
        exec(&mut conn, "INSERT INTO jobs (id, payload, done) VALUES (1, 'a', false), (2, 'b', false)");
        create_notes(&mut conn, BACKEND);
        exec(&mut conn, "INSERT INTO notes VALUES (1, 'a', NULL, 0)");
        let log = Log::default();
        // Wrapped in lockkit's journal, as an application with its own
        // instrumentation should do, so that lockkit sees commits.
        conn.set_instrumentation(lockkit::journal::Journal::wrap(log.instrumentation()));

        log.section("item.update_versioned(&mut conn)");
        let mut item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        item.stock = 9;
        item.update_versioned(&mut conn).unwrap();

        log.section("a stale item.update_versioned(&mut conn): the update, then one SELECT on the failure path");
        let mut stale = item.clone();
        stale.lock_version = 0;
        assert!(stale.update_versioned(&mut conn).is_err());

        log.section("item.update_versioned_with(&mut conn, items::stock.eq(items::stock - 1))");
        item.update_versioned_with(&mut conn, items::stock.eq(items::stock - 1)).unwrap();

        log.section("item.touch_versioned(&mut conn)");
        item.touch_versioned(&mut conn).unwrap();

        log.section("Item::update_by_version(&mut conn, 2, 0, items::name.eq(\"from a form\"))");
        Item::update_by_version(&mut conn, 2, 0, items::name.eq("from a form")).unwrap();

        log.section("Item::update_all_by_version(&mut conn, &[(2, 1), (3, 0)], items::stock.eq(0))");
        Item::update_all_by_version(&mut conn, &[(2, 1), (3, 0)], items::stock.eq(0)).unwrap();

        log.section("item.delete_versioned(&mut conn)");
        let three = items::table.find(3).first::<Item>(&mut db.conn()).unwrap();
        three.delete_versioned(&mut conn).unwrap();

        log.section("item.with_lock(&mut conn, ..)");
        item.with_lock(&mut conn, |_, _| Ok::<_, lockkit::Error>(())).unwrap();

        log.section("lockkit::with_lock(&mut conn, item.id, LockOptions::default().nowait(), ..)");
        lockkit::with_lock(&mut conn, item.id, LockOptions::default().nowait(), |_, _: Item| Ok::<_, Error>(())).unwrap();

        log.section("lockkit::with_lock(&mut conn, item.id, LockOptions::default().timeout(Duration::from_millis(250)), ..)");
        lockkit::with_lock(&mut conn, item.id, LockOptions::default().timeout(Duration::from_millis(250)), |_, _: Item| Ok::<_, Error>(())).unwrap();

        log.section("conn.transaction(|conn| lockkit::with_lock(conn, item.id, LockOptions::default().timeout(Duration::from_millis(250)), ..)): nested");
        conn.transaction(|conn| lockkit::with_lock(conn, item.id, LockOptions::default().timeout(Duration::from_millis(250)), |_, _: Item| Ok::<_, Error>(())))
            .unwrap();

        log.section("conn.transaction(|conn| lockkit::with_lock(conn, 42, ..)) on a missing row: PostgreSQL reads it once more (a row deleted and inserted again by a transaction the read waited for is seen only by a statement of its own), and a nested call that fails asks MySQL whether the transaction is still open");
        let missing = conn.transaction(|conn| lockkit::with_lock(conn, 42, lockkit::LockOptions::default(), |_, _: Item| Ok(())));
        assert!(matches!(missing, Err(Error::NotFound)));

        log.section("lockkit::with_lock(&mut conn, 42, LockOptions::default().skip_locked(), ..) on a missing row");
        let missing = lockkit::with_lock(&mut conn, 42, LockOptions::default().skip_locked(), |_, _: Item| Ok(()));
        assert!(matches!(missing, Err(Error::NotFound)));

        log.section("locked_transaction(.., |conn| Item::lock_all(conn, &[2, 1]))");
        locked_transaction(&mut conn, LockOptions::default(), |conn| Item::lock_all(conn, &[2, 1])).unwrap();

        let mut two = items::table.find(2).first::<Item>(&mut db.conn()).unwrap();
        log.section("conn.transaction(|conn| item.lock(conn)): MySQL first asks whether the transaction is still open");
        conn.transaction(|conn| two.lock(conn)).unwrap();
        log.section("item.reload(&mut conn)");
        two.reload(&mut conn).unwrap();

        log.section("locked_transaction(.., |conn| queue::claim(conn, jobs.filter(done = false).order(id), 10))");
        locked_transaction(&mut conn, LockOptions::default(), |conn| {
            queue::claim::<Job, _, _>(conn, jobs::table.filter(jobs::done.eq(false)).order(jobs::id).select(Job::as_select()), 10)
        })
        .unwrap();

        log.section("lockkit::serializable(&mut conn, &policy, ..)");
        lockkit::serializable(&mut conn, &RetryPolicy::default(), |conn| {
            Ok::<_, lockkit::Error>(items::table.count().get_result::<i64>(conn)?)
        })
        .unwrap();

        log.section("lockkit::atomic::update_if(&mut conn, UPDATE items SET stock = stock - 1 WHERE id = 1 AND stock >= 1)");
        lockkit::atomic::update_if(
            &mut conn,
            diesel::update(items::table.find(1).filter(items::stock.ge(1))).set(items::stock.eq(items::stock - 1)),
        )
        .unwrap();

        log.section("Item::compare_and_set(&mut conn, 1, (expect(items::name, ..), expect(items::stock, ..)), items::name.eq(\"renamed\"))");
        let read = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        Item::compare_and_set(&mut conn, 1, (expect(items::name, read.name.clone()), expect(items::stock, read.stock)), items::name.eq("renamed")).unwrap();

        log.section("the same compare_and_set again: refused, then one SELECT of the expected columns on the failure path");
        let refused = Item::compare_and_set(&mut conn, 1, (expect(items::name, read.name), expect(items::stock, read.stock)), items::name.eq("renamed"));
        assert!(matches!(refused, Err(Error::StaleColumns(_))));

        log.section("lockkit::atomic::update_counters(&mut conn, items::table.find(1), counter(items::stock, 1))");
        lockkit::atomic::update_counters(&mut conn, items::table.find(1), lockkit::atomic::counter(items::stock, 1)).unwrap();

        log.section("note.update_versioned(&mut conn) with a #[lockkit(updated_at)] field");
        let mut note = Note { id: 1, body: "b".into(), updated_at: None, lock_version: 0 };
        note.update_versioned(&mut conn).unwrap();

        log.section("note.touch_versioned(&mut conn) with a #[lockkit(updated_at)] field");
        note.touch_versioned(&mut conn).unwrap();

        log.section("Idempotency::default().run(&mut conn, \"tenant-1\", \"order-1\", \"POST /orders\", ..) twice: run, then replay");
        let keys = lockkit::idempotency::Idempotency::default();
        keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", |_| Ok::<_, lockkit::Error>("201".to_owned())).unwrap();
        keys.run(&mut conn, "tenant-1", "order-1", "POST /orders", |_| Ok::<_, lockkit::Error>("201".to_owned())).unwrap();

        log.section("lease::acquire(&mut conn, \"nightly-report\", Duration::from_secs(30)), then .renew() and .release()");
        let mut held = lease::acquire(&mut conn, "nightly-report", Duration::from_secs(30)).unwrap();
        held.renew().unwrap();
        held.release().unwrap();

        let mut other = db.connect();
        let other_holds = lease::acquire(&mut other, "nightly-report", Duration::from_secs(30)).unwrap();
        log.section("lease::acquire(&mut conn, \"nightly-report\", ..) while another holder has it: Error::Busy");
        assert!(matches!(lease::acquire(&mut conn, "nightly-report", Duration::from_secs(30)), Err(Error::Busy)));
        drop(other_holds);

        log.section("lease::fenced(&mut conn, \"report\", Fence(2), ..)");
        lease::fenced(&mut conn, "report", Fence(2), |_| Ok::<_, Error>(())).unwrap();

        log.section("lease::fenced(&mut conn, \"report\", Fence(1), ..) after fence 2: Error::Fenced, one SELECT on the failure path");
        let refused = lease::fenced(&mut conn, "report", Fence(1), |_| Ok::<_, Error>(()));
        assert!(matches!(refused, Err(Error::Fenced { .. })));

        log.section("conn.transaction(|conn| lockkit::outbox::enqueue(conn, \"orders\", \"{..}\"))");
        conn.transaction(|conn| lockkit::outbox::enqueue(conn, "orders", "{\"order\":1}")).unwrap();
        log.section("Relay::default().publish_batch(&mut conn, 10, ..): one message confirmed");
        let relay = lockkit::outbox::Relay::default();
        relay.publish_batch(&mut conn, 10, |batch| Ok::<_, Error>(vec![Ok(()); batch.len()])).unwrap();
        conn.transaction(|conn| lockkit::outbox::enqueue(conn, "orders", "{\"order\":2}")).unwrap();
        log.section("Relay::default().publish_batch(&mut conn, 10, ..): one message refused");
        relay.publish_batch(&mut conn, 10, |_| Ok::<_, Error>(vec![Err("nack".to_owned())])).unwrap();
        log.section("lockkit::outbox::dead_letters(&mut conn, 10)");
        lockkit::outbox::dead_letters(&mut conn, 10).unwrap();
        log.section("lockkit::outbox::requeue(&mut conn, id): not a dead letter, nothing changes");
        lockkit::outbox::requeue(&mut conn, 2).unwrap();
        log.section("lockkit::outbox::purge_published(&mut conn, age)");
        lockkit::outbox::purge_published(&mut conn, Duration::from_secs(86_400)).unwrap();
        let inbox = lockkit::outbox::Inbox::new("stock").unwrap();
        log.section("inbox.receive(&mut conn, \"m-1\", ..) twice: applied, then a duplicate");
        inbox.receive(&mut conn, "m-1", |_| Ok::<_, Error>(())).unwrap();
        inbox.receive(&mut conn, "m-1", |_| Ok::<_, Error>(())).unwrap();
        log.section("inbox.purge_older_than(&mut conn, age)");
        inbox.purge_older_than(&mut conn, Duration::from_secs(86_400)).unwrap();

        ServerStatements::run(&mut conn, &log);
        ReplicaStatements::run(&mut conn, &log);

        // Last: without the journal, lockkit asks what it cannot see.
        log.section("conn.transaction(|conn| item.update_versioned(conn)) twice, on a connection whose own instrumentation is not wrapped in Journal::wrap: each write is marked in its transaction, and the second first asks whether the first's mark stands");
        conn.set_instrumentation(log.instrumentation());
        let mut one = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
        for _ in 0..2 {
            conn.transaction(|c| one.update_versioned(c)).unwrap();
        }

        let rendered = log.render();
        insta::assert_snapshot!(format!("sql_log_{BACKEND}"), rendered);
        check_docs(BACKEND, &rendered);
    }
}

/// Advisory locks and the lock-wait view: PostgreSQL and MySQL only.
trait ServerStatements {
    fn run(&mut self, log: &Log);
}

impl ServerStatements for diesel::SqliteConnection {
    fn run(&mut self, _log: &Log) {}
}

macro_rules! server_statements {
    ($($conn:ty),*) => {$(
        impl ServerStatements for $conn {
            fn run(&mut self, log: &Log) {
                log.section("lockkit::advisory::try_lock(&mut conn, \"nightly-report\") and the guard's drop");
                drop(lockkit::advisory::try_lock(self, "nightly-report").unwrap());
                log.section("lockkit::advisory::lock(&mut conn, 42_i64), then .unlock()");
                lockkit::advisory::lock(self, 42_i64).unwrap().unlock().unwrap();
                log.section("conn.transaction(|conn| lockkit::advisory::lock(conn, 42_i64)): inside a transaction (PostgreSQL: a transaction lock)");
                // MySQL/MariaDB refuse it (the session lock would be released
                // before COMMIT): nothing is sent.
                let inside = self.transaction(|conn| lockkit::advisory::lock(conn, 42_i64).map(drop));
                assert!(inside.is_ok() || matches!(inside, Err(lockkit::Error::AlreadyInTransaction)), "{inside:?}");
                log.section("lockkit::lock_waits::session_id(&mut conn)");
                lockkit::lock_waits::session_id(self).unwrap();
                log.section("lockkit::lock_waits::blocked_sessions(&mut conn)");
                lockkit::lock_waits::blocked_sessions(self).unwrap();
                log.section("lockkit::lock_waits::current(&mut conn)");
                lockkit::lock_waits::current(self).unwrap();
            }
        }
    )*};
}

server_statements!(diesel::PgConnection, diesel::MysqlConnection);

/// Read-your-writes (`lockkit::replica`): PostgreSQL only. Run on the test's
/// primary, so `route` finds no standby and says so after one look.
trait ReplicaStatements {
    fn run(&mut self, _log: &Log) {}
}

impl ReplicaStatements for diesel::SqliteConnection {}
impl ReplicaStatements for diesel::MysqlConnection {}

impl ReplicaStatements for diesel::PgConnection {
    fn run(&mut self, log: &Log) {
        use lockkit::replica::{self, Policy, Route};
        log.section("lockkit::replica::commit_lsn(&mut primary)");
        let written = replica::commit_lsn(self).unwrap();
        log.section("lockkit::replica::route(&mut replica, Some(lsn), Policy::WaitThenPrimary(..)): one look per wait step (here on a server that is not a standby)");
        let route = replica::route(
            self,
            Some(written),
            Policy::WaitThenPrimary(Duration::from_millis(5)),
        )
        .unwrap();
        assert!(matches!(route, Route::PrimaryNotAStandby), "{route:?}");
    }
}

/// PostgreSQL and MySQL/MariaDB: on SQLite the other connection's open
/// transaction would hold the whole file.
mod whatever_others_recorded {
    use super::*;

    lockkit_tests::server_tests! {
        /// What a connection sends does not depend on what other connections of
        /// the process have recorded: a connection asks what it learns once (the
        /// database, the schema of a table its `table!` names none for) at its
        /// first versioned write, in a transaction or not. Here the same script on
        /// two new connections, the second while another connection's versioned
        /// write waits in an open transaction, sends the same statements.
        fn a_connection_sends_the_same_statements_whatever_other_connections_recorded(db) {
            seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
            let script = || {
                let log = Log::default();
                let mut conn = db.connect();
                conn.set_instrumentation(lockkit::journal::Journal::wrap(log.instrumentation()));
                log.section("item.update_versioned(&mut conn), then in a transaction");
                let mut item = items::table.find(1).first::<Item>(&mut db.conn()).unwrap();
                item.stock -= 1;
                item.update_versioned(&mut conn).unwrap();
                item.stock -= 1;
                conn.transaction(|conn| item.update_versioned(conn)).unwrap();
                // The versions bound differ from run to run; the statements may not.
                log.render().lines().map(|line| line.split(" -- binds:").next().unwrap().to_owned()).collect::<Vec<_>>()
            };
            let before = script();
            let mut other = db.connect();
            let beside = other
                .transaction(|other| {
                    let mut two = items::table.find(2).first::<Item>(other)?;
                    two.stock -= 1;
                    two.update_versioned(other)?;
                    Ok::<_, Error>(script())
                })
                .unwrap();
            assert_eq!(before, beside);
        }
    }
}
