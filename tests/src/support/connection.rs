//! The programs' connection: one `#[derive(diesel::MultiConnection)]` enum over
//! the backends whose cargo feature is on, which lockkit takes as it takes a
//! `PgConnection` (through [`Dispatch`]). A program writes its statements once,
//! against [`AnyConnection`], and the URL picks the backend at run time.
//!
//! What the enum cannot express goes to the connection inside it, matched on
//! the enum (or on [`Dispatch::dispatch`]): a row-lock clause on a query of your
//! own, `RETURNING` with MySQL among the backends, `Model::as_select()` in a
//! query handed to `lockkit::queue::claim`.

use std::time::Duration;

use diesel::migration::MigrationSource;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PoolError, PooledConnection};
use diesel::{Connection, QueryResult};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};
use lockkit::multi::{BackendConn, Dispatch};

use super::{connection_url, Backend, ProgramError};

/// A connection to whichever backend the URL names.
#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Pg(diesel::PgConnection),
    /// MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(diesel::MysqlConnection),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(diesel::SqliteConnection),
}

/// A pool of [`AnyConnection`]s.
pub type AnyPool = Pool<ConnectionManager<AnyConnection>>;
/// A connection of an [`AnyPool`]; lockkit takes it as it is.
pub type AnyPooled = PooledConnection<ConnectionManager<AnyConnection>>;

/// A pool of `workers` connections to the database `url` names, each set up by
/// `settings` when it opens (a wait for a free one gives up after 30 s), and
/// one of them for each worker, checked out now: a pool failure is an error
/// before the workers start, not a thread stuck at their start barrier.
pub fn worker_connections(
    url: &str,
    workers: u32,
    settings: impl CustomizeConnection<AnyConnection, diesel::r2d2::Error>,
) -> Result<(AnyPool, Vec<AnyPooled>), PoolError> {
    let pool = Pool::builder()
        .max_size(workers)
        .connection_timeout(Duration::from_secs(30))
        .connection_customizer(Box::new(settings))
        .build(ConnectionManager::new(connection_url(url)))?;
    let conns = (0..workers).map(|_| pool.get()).collect::<Result<_, _>>()?;
    Ok((pool, conns))
}

impl Dispatch for AnyConnection {
    fn dispatch(&mut self) -> BackendConn<'_> {
        match self {
            #[cfg(feature = "postgres")]
            AnyConnection::Pg(conn) => BackendConn::Pg(conn),
            #[cfg(feature = "mysql")]
            AnyConnection::Mysql(conn) => BackendConn::Mysql(conn),
            #[cfg(feature = "sqlite")]
            AnyConnection::Sqlite(conn) => BackendConn::Sqlite(conn),
        }
    }
}

impl AnyConnection {
    /// Connects to `url` as [`Backend::from_url`] reads it (a SQLite URL loses
    /// its `sqlite://`), without session settings. Diesel's `establish` on the
    /// enum tries each backend in turn and reports the last one's error; this
    /// reports the named backend's. A backend whose `lockkit-tests` feature is
    /// off is [`ProgramError::Unsupported`].
    pub fn open(url: &str) -> Result<Self, ProgramError> {
        let backend = Backend::from_url(url);
        #[allow(unused_variables)] // no backend feature
        let url = connection_url(url);
        Ok(match backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => AnyConnection::Pg(diesel::PgConnection::establish(url)?),
            #[cfg(feature = "mysql")]
            Backend::Mysql => AnyConnection::Mysql(diesel::MysqlConnection::establish(url)?),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => AnyConnection::Sqlite(diesel::SqliteConnection::establish(url)?),
            #[allow(unreachable_patterns)]
            backend => return Err(ProgramError::Unsupported(backend)),
        })
    }

    /// Which backend this connection is to.
    pub fn backend(&self) -> Backend {
        match self {
            #[cfg(feature = "postgres")]
            AnyConnection::Pg(_) => Backend::Postgres,
            #[cfg(feature = "mysql")]
            AnyConnection::Mysql(_) => Backend::Mysql,
            #[cfg(feature = "sqlite")]
            AnyConnection::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The examples' session settings: SQLite's
    /// [`sqlite_session_settings`](super::sqlite_session_settings); the servers
    /// need none.
    pub fn configure_session(&mut self) -> QueryResult<()> {
        match self {
            #[cfg(feature = "sqlite")]
            AnyConnection::Sqlite(conn) => super::sqlite_session_settings(conn),
            #[allow(unreachable_patterns)]
            _ => Ok(()),
        }
    }
}

/// A program's migrations, one set per backend; `None` for a backend the
/// program does not run on. `S` is the program's own embedded migrations, or
/// the tables lockkit ships (`lockkit::migrations::ShippedMigration`).
#[allow(missing_debug_implementations)] // `EmbeddedMigrations` has no `Debug`
pub struct Migrations<S = EmbeddedMigrations> {
    /// For PostgreSQL.
    pub postgres: Option<S>,
    /// For MySQL/MariaDB.
    pub mysql: Option<S>,
    /// For SQLite.
    pub sqlite: Option<S>,
}

impl AnyConnection {
    /// Applies the pending migrations of this connection's backend. A set
    /// without this backend's migrations is [`ProgramError::Unsupported`].
    pub fn migrate<S>(&mut self, set: Migrations<S>) -> Result<(), ProgramError>
    where
        S: MigrationSource<<Self as Connection>::Backend>,
    {
        let backend = self.backend();
        let migrations = match backend {
            Backend::Postgres => set.postgres,
            Backend::Mysql => set.mysql,
            Backend::Sqlite => set.sqlite,
        }
        .ok_or(ProgramError::Unsupported(backend))?;
        self.run_pending_migrations(migrations)
            .map_err(|e| ProgramError::Migration(e.to_string()))?;
        Ok(())
    }
}

/// Runs `$body` with `$inner` bound to the connection inside the
/// [`AnyConnection`] `$conn` (`&mut PgConnection`, `&mut MysqlConnection` or
/// `&mut SqliteConnection`), for the statements Diesel's `MultiConnection`
/// cannot express: a batch `INSERT` of several rows, a row-lock clause,
/// `RETURNING` with MySQL among the backends. `$body` is compiled once per
/// backend, so each sends its backend's own SQL.
///
/// ```ignore
/// lockkit_tests::on_inner!(conn, |inner| diesel::insert_into(jobs::table).values(rows).execute(inner))?;
/// ```
#[macro_export]
macro_rules! on_inner {
    ($conn:expr, |$inner:ident| $body:expr) => {{
        let conn: &mut $crate::support::AnyConnection = $conn;
        'inner: {
            $crate::support::__if_postgres! {
                if let $crate::support::AnyConnection::Pg($inner) = &mut *conn {
                    break 'inner $body;
                }
            }
            $crate::support::__if_mysql! {
                if let $crate::support::AnyConnection::Mysql($inner) = &mut *conn {
                    break 'inner $body;
                }
            }
            $crate::support::__if_sqlite! {
                if let $crate::support::AnyConnection::Sqlite($inner) = &mut *conn {
                    break 'inner $body;
                }
            }
            unreachable!("AnyConnection has no other variant")
        }
    }};
}

// `on_inner!`'s arms, one per variant of `AnyConnection`: expanded in the
// calling crate, so `#[cfg(feature = ..)]` would read that crate's features;
// `__if_postgres!`, `__if_mysql!` and `__if_sqlite!` carry this crate's instead,
// each `__keep!` where the feature is on and `__drop!` where it is off.
#[doc(hidden)]
#[macro_export]
macro_rules! __keep { ($($t:tt)*) => { $($t)* }; }
#[doc(hidden)]
#[macro_export]
macro_rules! __drop {
    ($($t:tt)*) => {};
}

/// Names `__keep!` or `__drop!` as `$gate`, as this crate has `$feature` or not.
macro_rules! feature_gates {
    ($($gate:ident: $feature:literal),*) => {$(
        #[doc(hidden)]
        #[cfg(feature = $feature)]
        pub use crate::__keep as $gate;
        #[doc(hidden)]
        #[cfg(not(feature = $feature))]
        pub use crate::__drop as $gate;
    )*};
}
feature_gates!(__if_postgres: "postgres", __if_mysql: "mysql", __if_sqlite: "sqlite");
