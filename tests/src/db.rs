//! One fresh database per test, on a real server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier, Once};
use std::thread;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::query_builder::SqlQuery;
use diesel::query_dsl::LoadQuery;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection, R2D2Connection};
use diesel::Connection;

use crate::support::{
    admin_url, admin_url_var, drop_database_sql, drop_orphans, with_database, Backend, DatabaseName,
};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A backend the suite runs on.
pub trait TestBackend: R2D2Connection + Connection + Sized + 'static {
    /// Creates an empty database for one test; returns its URL and how to remove it.
    fn create_database(name: &str) -> (String, Cleanup);
    /// Applies the test schema.
    fn migrate(conn: &mut Self);
    /// Session settings for every pooled connection.
    fn on_acquire(_conn: &mut Self) -> diesel::QueryResult<()> {
        Ok(())
    }
}

/// How a test database is removed when the test ends.
pub enum Cleanup {
    /// `DROP DATABASE` through a connection to the admin URL.
    Drop {
        admin_url: String,
        statement: String,
    },
    /// Remove the SQLite files.
    Files(Vec<std::path::PathBuf>),
}

/// A database of its own for one test, with a pool of connections to it.
pub struct TestDb<C: TestBackend> {
    /// The database's URL (pass it to other processes or examples).
    pub url: String,
    pool: Option<Pool<ConnectionManager<C>>>,
    cleanup: Option<Cleanup>,
}

impl<C: TestBackend> TestDb<C> {
    /// Creates the database, applies the schema and opens a pool (up to 16 connections).
    pub fn new(test_name: &str) -> Self {
        Self::create(test_name, true)
    }

    /// Creates an empty database (no schema) for a program that brings its own
    /// migrations, e.g. the example apps' tests: pass it [`TestDb::url`].
    pub fn empty(test_name: &str) -> Self {
        Self::create(test_name, false)
    }

    fn create(test_name: &str, migrate: bool) -> Self {
        let name = unique_name(test_name);
        let (url, cleanup) = C::create_database(&name);
        let mut db = TestDb {
            url,
            pool: None,
            cleanup: Some(cleanup),
        };
        let mut conn = db.connect();
        if migrate {
            C::migrate(&mut conn);
        }
        drop(conn);
        db.pool = Some(
            Pool::builder()
                .max_size(16)
                .min_idle(Some(0))
                .connection_timeout(Duration::from_secs(20))
                .connection_customizer(Box::new(OnAcquire))
                .build(ConnectionManager::<C>::new(&db.url))
                .unwrap_or_else(|e| panic!("cannot open a pool on {}: {e}", db.url)),
        );
        db
    }

    /// The pool (cheap to clone; share it with threads).
    pub fn pool(&self) -> Pool<ConnectionManager<C>> {
        self.pool.clone().expect("pool is open")
    }

    /// A pooled connection.
    pub fn conn(&self) -> PooledConnection<ConnectionManager<C>> {
        self.pool().get().expect("pooled connection")
    }

    /// A dedicated connection outside the pool.
    pub fn connect(&self) -> C {
        let mut conn = C::establish(&self.url)
            .unwrap_or_else(|e| panic!("cannot connect to test database {}: {e}", self.url));
        C::on_acquire(&mut conn).expect("session settings");
        conn
    }

    /// Runs `during` on this thread while another thread holds a lock. That
    /// thread calls `hold` with a connection of its own and `wait`: `hold` takes
    /// the lock, calls `wait()`, which returns once `during` has returned, and
    /// then lets the lock go (commits or rolls back).
    pub fn while_holding<T>(
        &self,
        hold: impl FnOnce(&mut C, &dyn Fn()) + Send,
        during: impl FnOnce() -> T,
    ) -> T
    where
        Self: Sync,
    {
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        thread::scope(|s| {
            let holder = s.spawn(move || {
                let wait = || {
                    locked_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                };
                hold(&mut self.connect(), &wait);
            });
            locked_rx.recv().expect("the holder took its lock");
            let out = during();
            let _ = release_tx.send(());
            holder.join().unwrap();
            out
        })
    }

    /// Runs `racer` on `threads` threads at once, each with a connection of its
    /// own ([`connect`](Self::connect)), its number (`0..threads`) and a barrier
    /// that all of them wait on: a racer reads, waits on the barrier, then
    /// writes, so that every read comes before any write. Returns the racers'
    /// results in thread order.
    pub fn race<T: Send>(
        &self,
        threads: usize,
        racer: impl Fn(&mut C, usize, &Barrier) -> T + Sync,
    ) -> Vec<T>
    where
        Self: Sync,
    {
        let barrier = Barrier::new(threads);
        thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|n| {
                    let (racer, barrier) = (&racer, &barrier);
                    s.spawn(move || racer(&mut self.connect(), n, barrier))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

impl<C: TestBackend> Drop for TestDb<C> {
    fn drop(&mut self) {
        drop(self.pool.take());
        match self.cleanup.take() {
            Some(Cleanup::Drop {
                admin_url,
                statement,
            }) => {
                if let Ok(mut admin) = C::establish(&admin_url) {
                    let _ = admin.batch_execute(&statement);
                }
            }
            Some(Cleanup::Files(files)) => {
                for file in files {
                    let _ = std::fs::remove_file(file);
                }
            }
            None => {}
        }
    }
}

#[derive(Debug)]
struct OnAcquire;

impl<C: TestBackend> diesel::r2d2::CustomizeConnection<C, diesel::r2d2::Error> for OnAcquire {
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        C::on_acquire(conn).map_err(diesel::r2d2::Error::QueryError)
    }
}

/// `lk_<test>_<pid>_<n>`: unique across threads and processes, a valid identifier.
pub(crate) fn unique_name(test_name: &str) -> String {
    let cleaned: String = test_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    format!(
        "lk_{cleaned}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The pid inside a test database name, if the name is ours.
fn owner_pid(database: &str) -> Option<u32> {
    let rest = database.strip_prefix("lk_")?;
    let mut parts = rest.rsplitn(3, '_');
    let _counter = parts.next()?;
    parts.next()?.parse().ok()
}

/// A server the tests create their databases on.
struct Server {
    backend: Backend,
    /// The first database a process creates sweeps the orphans first.
    sweep: Once,
}

impl Server {
    /// Creates the empty database `name` on the server. The first call in a
    /// process first drops the databases of test processes that no longer run.
    fn create_database<C>(&self, name: &str) -> (String, Cleanup)
    where
        C: Connection,
        for<'a> SqlQuery: LoadQuery<'a, C, DatabaseName>,
    {
        let backend = self.backend;
        let admin_url = admin_url(backend).expect("a server backend");
        let mut conn = C::establish(&admin_url).unwrap_or_else(|e| {
            panic!(
                "cannot reach {} at {admin_url} ({e}). Set {}, or run scripts/test.sh, \
                 which finds, starts or installs the server",
                backend.title(),
                admin_url_var(backend).expect("a server backend"),
            )
        });
        self.sweep.call_once(|| {
            let _ = drop_orphans(&mut conn, backend, "lk_", owner_pid);
        });
        conn.batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {admin_url}: {e}"));
        (
            with_database(&admin_url, name),
            Cleanup::Drop {
                statement: drop_database_sql(backend, name),
                admin_url,
            },
        )
    }
}

/// The [`TestBackend`] of a server: its migrations, and its [`Server`].
macro_rules! server_backend {
    ($feature:literal, $module:ident, $conn:ident, $dialect:expr, $backend:expr) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            static SERVER: Server = Server {
                backend: $backend,
                sweep: Once::new(),
            };

            impl TestBackend for diesel::$conn {
                fn create_database(name: &str) -> (String, Cleanup) {
                    SERVER.create_database::<Self>(name)
                }

                fn migrate(conn: &mut Self) {
                    conn.batch_execute(&crate::schema::create_tables($dialect))
                        .expect("the test schema");
                }
            }
        }
    };
}

server_backend!(
    "postgres",
    postgres,
    PgConnection,
    lockkit::version_trigger::Dialect::Postgres,
    Backend::Postgres
);

server_backend!(
    "mysql",
    mysql,
    MysqlConnection,
    lockkit::version_trigger::Dialect::Mysql,
    Backend::Mysql
);

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use crate::support::{remove_sqlite_files, sqlite_files};
    use diesel::SqliteConnection;

    impl TestBackend for SqliteConnection {
        fn create_database(name: &str) -> (String, Cleanup) {
            let path = std::env::temp_dir().join(format!("{name}.sqlite"));
            let _ = remove_sqlite_files(&path);
            let files = sqlite_files(&path).to_vec();
            (path.display().to_string(), Cleanup::Files(files))
        }

        fn migrate(conn: &mut Self) {
            conn.batch_execute("PRAGMA journal_mode = WAL;")
                .expect("WAL");
            conn.batch_execute(&crate::schema::create_tables(
                lockkit::version_trigger::Dialect::Sqlite,
            ))
            .expect("the test schema");
        }

        fn on_acquire(conn: &mut Self) -> diesel::QueryResult<()> {
            // Writers queue for up to 10 s instead of failing at once with SQLITE_BUSY.
            conn.batch_execute("PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON;")
        }
    }
}

/// A SQLite database of a test's own in rollback-journal mode (SQLite's
/// default: a `COMMIT` waits for the readers; [`TestDb`]'s databases use WAL),
/// with the test schema and these items. Its files go when it is dropped.
#[cfg(feature = "sqlite")]
pub struct RollbackJournalDb {
    path: std::path::PathBuf,
    /// The database's path, as a connection URL.
    pub url: String,
}

#[cfg(feature = "sqlite")]
impl RollbackJournalDb {
    /// Creates the database `name` (with the process id) in the temporary
    /// directory, items `(id, stock)` seeded.
    pub fn new(name: &str, items: &[(i32, i32)]) -> Self {
        let path = std::env::temp_dir().join(format!("{name}_{}.sqlite", std::process::id()));
        let _ = crate::support::remove_sqlite_files(&path);
        let db = RollbackJournalDb {
            url: path.display().to_string(),
            path,
        };
        let mut conn = db.connect();
        conn.batch_execute("PRAGMA journal_mode = DELETE")
            .expect("rollback journal");
        conn.batch_execute(&crate::schema::create_tables(
            lockkit::version_trigger::Dialect::Sqlite,
        ))
        .expect("the test schema");
        crate::seed_items(&mut conn, items);
        db
    }

    /// A new connection to it.
    pub fn connect(&self) -> diesel::SqliteConnection {
        diesel::SqliteConnection::establish(&self.url).expect("connect to the test database")
    }
}

#[cfg(feature = "sqlite")]
impl Drop for RollbackJournalDb {
    fn drop(&mut self) {
        let _ = crate::support::remove_sqlite_files(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_recognised_by_pid() {
        assert_eq!(owner_pid("lk_lost_update_123_7"), Some(123));
        assert_eq!(owner_pid("lk_a_b_c_99_0"), Some(99));
        assert_eq!(owner_pid("test"), None);
    }
}
