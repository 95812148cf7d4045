//! A database of its own on a PostgreSQL primary and its streaming standby, for
//! the replica tests.
//!
//! The servers come from `PG_PRIMARY_URL` and `PG_STANDBY_URL` (defaults:
//! `postgres://postgres@127.0.0.1:5441/test` and `…:5442/test`, where
//! `scripts/pg-standby.sh` starts them). The standby must stream from that
//! primary; the tests pause and resume its replay.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::Text;
use diesel::{Connection, PgConnection, RunQueryDsl};

use crate::db::{unique_name, TestBackend};
use crate::seed_items;
use crate::support::with_database;
use lockkit::replica::{Lsn, Policy, Route, Router};

/// Pausing replay stops it for every database on the standby: the tests that
/// use it run one at a time.
static STANDBY: Mutex<()> = Mutex::new(());

/// An r2d2 pool of PostgreSQL connections.
pub type PgPool = Pool<ConnectionManager<PgConnection>>;

/// One test's database, created on the primary with the test schema, and seen
/// replayed on the standby before [`TestReplicas::new`] returns. Dropping it
/// resumes replay (a failed test may have left it paused) and drops the database.
pub struct TestReplicas {
    /// The database on the primary.
    pub primary_url: String,
    /// The same database on the standby.
    pub standby_url: String,
    primary_admin: String,
    standby_admin: String,
    name: String,
    _one_at_a_time: MutexGuard<'static, ()>,
}

fn server_url(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn connect(url: &str, var: &str) -> PgConnection {
    PgConnection::establish(url).unwrap_or_else(|e| {
        panic!(
            "cannot reach the PostgreSQL server at {url} ({e}). Set {var}, or run \
             scripts/test.sh (or scripts/pg-standby.sh), which starts a primary and a standby"
        )
    })
}

#[derive(diesel::QueryableByName)]
struct Row {
    #[diesel(sql_type = Text)]
    value: String,
}

impl TestReplicas {
    /// Creates the database on the primary and waits (up to 30 s) until the
    /// standby has replayed it.
    pub fn new(test_name: &str) -> Self {
        let one_at_a_time = STANDBY.lock().unwrap_or_else(|e| e.into_inner());
        let primary_admin = server_url("PG_PRIMARY_URL", "postgres://postgres@127.0.0.1:5441/test");
        let standby_admin = server_url("PG_STANDBY_URL", "postgres://postgres@127.0.0.1:5442/test");
        let name = unique_name(test_name);
        let mut admin = connect(&primary_admin, "PG_PRIMARY_URL");
        let mut standby = connect(&standby_admin, "PG_STANDBY_URL");
        let in_recovery: Row = diesel::sql_query("SELECT pg_is_in_recovery()::text AS value")
            .get_result(&mut standby)
            .expect("pg_is_in_recovery");
        assert_eq!(
            in_recovery.value, "true",
            "{standby_admin} is not a standby"
        );
        // A previous test that failed while replay was paused.
        standby
            .batch_execute("SELECT pg_wal_replay_resume()")
            .expect("pg_wal_replay_resume");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {primary_admin}: {e}"));
        let replicas = TestReplicas {
            primary_url: with_database(&primary_admin, &name),
            standby_url: with_database(&standby_admin, &name),
            primary_admin,
            standby_admin,
            name,
            _one_at_a_time: one_at_a_time,
        };
        let mut primary = replicas.primary();
        <PgConnection as TestBackend>::migrate(&mut primary);
        replicas.wait_for_standby(&mut primary);
        replicas
    }

    /// A new connection to the test's database on the primary.
    pub fn primary(&self) -> PgConnection {
        connect(&self.primary_url, "PG_PRIMARY_URL")
    }

    /// A new connection to the test's database on the standby.
    pub fn standby(&self) -> PgConnection {
        connect(&self.standby_url, "PG_STANDBY_URL")
    }

    /// A pool on the primary (up to 16 connections).
    pub fn primary_pool(&self) -> PgPool {
        pool(&self.primary_url)
    }

    /// A pool on the standby (up to 16 connections).
    pub fn standby_pool(&self) -> PgPool {
        pool(&self.standby_url)
    }

    /// Inserts `items` rows `(id, stock)` on the primary ([`seed_items`]) and
    /// waits until the standby has replayed them.
    pub fn seed_replicated(&self, rows: &[(i32, i32)]) {
        let mut primary = self.primary();
        seed_items(&mut primary, rows);
        self.wait_for_standby(&mut primary);
    }

    /// A [`Router`] that writes through [`primary_pool`](Self::primary_pool) and
    /// reads through [`standby_pool`](Self::standby_pool) as `policy` says.
    pub fn router(&self, policy: Policy) -> Router {
        Router::new(self.primary_pool(), self.standby_pool(), policy)
    }

    /// Waits (up to 30 s) until the standby has replayed everything `primary`
    /// had written when this was called.
    pub fn wait_for_standby(&self, primary: &mut PgConnection) {
        let written: Row = diesel::sql_query("SELECT pg_current_wal_lsn()::text AS value")
            .get_result(primary)
            .expect("pg_current_wal_lsn");
        let mut standby = connect(&self.standby_admin, "PG_STANDBY_URL");
        let started = Instant::now();
        loop {
            let caught_up: Row = diesel::sql_query(format!(
                "SELECT (pg_last_wal_replay_lsn() >= '{}'::pg_lsn)::text AS value",
                written.value
            ))
            .get_result(&mut standby)
            .expect("pg_last_wal_replay_lsn");
            if caught_up.value == "true" {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the standby did not replay {} within 30 s",
                written.value
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops replay on the standby until the guard drops: WAL still arrives
    /// (`pg_last_wal_receive_lsn` moves), but nothing more becomes visible there.
    /// Returns once the standby reports `paused`.
    pub fn pause_replay(&self) -> ReplayPaused {
        let mut standby = connect(&self.standby_admin, "PG_STANDBY_URL");
        standby
            .batch_execute("SELECT pg_wal_replay_pause()")
            .expect("pg_wal_replay_pause");
        let started = Instant::now();
        loop {
            let state: Row = diesel::sql_query("SELECT pg_get_wal_replay_pause_state() AS value")
                .get_result(&mut standby)
                .expect("pg_get_wal_replay_pause_state");
            if state.value == "paused" {
                return ReplayPaused { standby };
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "replay did not pause"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Replay paused on the standby; resumed when dropped (see
/// [`TestReplicas::pause_replay`]).
pub struct ReplayPaused {
    standby: PgConnection,
}

impl ReplayPaused {
    /// Resumes replay now.
    pub fn resume(self) {}
}

impl Drop for ReplayPaused {
    fn drop(&mut self) {
        let _ = self.standby.batch_execute("SELECT pg_wal_replay_resume()");
    }
}

fn pool(url: &str) -> PgPool {
    Pool::builder()
        .max_size(16)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_secs(20))
        .build(ConnectionManager::new(url))
        .unwrap_or_else(|e| panic!("cannot open a pool on {url}: {e}"))
}

impl Drop for TestReplicas {
    fn drop(&mut self) {
        if let Ok(mut standby) = PgConnection::establish(&self.standby_admin) {
            let _ = standby.batch_execute("SELECT pg_wal_replay_resume()");
        }
        if let Ok(mut admin) = PgConnection::establish(&self.primary_admin) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// Checks what a route asked to read `written` under
/// `Policy::WaitOrFail(wait)` answers while replay is paused: a retryable
/// `Error::ReplicaBehind` naming `written`, an older replayed position and a wait
/// of `wait` at least.
#[track_caller]
pub fn assert_replica_behind(failed: lockkit::Result<Route>, written: Lsn, wait: Duration) {
    match failed {
        Err(
            e @ lockkit::Error::ReplicaBehind {
                wanted,
                replayed,
                waited,
            },
        ) => {
            assert_eq!(wanted, written);
            assert!(replayed < wanted);
            assert!(waited >= wait);
            assert!(e.is_retryable());
            // Over HTTP as lockkit's other retryable errors: 503 with
            // `Retry-After` (a client's far-ahead position makes it too), not
            // a 500.
            let problem = lockkit::etag::Problem::from_error(&e);
            assert_eq!(
                (problem.status, problem.retry_after),
                (503, Some(1)),
                "{problem:?}"
            );
        }
        other => panic!("expected ReplicaBehind, got {other:?}"),
    }
}
