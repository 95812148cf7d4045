//! What the example programs, the torture test and the benchmark need besides
//! lockkit itself, written once: which backend a URL names and the URL
//! arithmetic around it, the examples' error type, the start and the end of
//! their `main`, and the session settings of their connections.
//!
//! * [`AnyConnection`]: the programs' connection, a
//!   `#[derive(diesel::MultiConnection)]` enum lockkit takes through
//!   `lockkit::multi::Dispatch` (with a backend feature); [`worker_connections`],
//!   a pool of them and one checked out for each of a program's workers.
//! * [`Backend`]: PostgreSQL, MySQL/MariaDB or SQLite, from a URL
//!   ([`Backend::from_url`]) or a short name ([`Backend::parse`]).
//! * [`connection_url`]: what to hand to `Connection::establish` (a SQLite URL
//!   loses its `sqlite://`).
//! * [`admin_url`]: the server database named by `PG_DATABASE_URL` or
//!   `MYSQL_DATABASE_URL`, next to which tests and benchmarks create their own;
//!   [`with_database`] names another database on the same server.
//! * [`drop_orphans`] and [`drop_database_sql`]: those databases, dropped when
//!   done or, when their process was killed first, by the next process.
//! * [`redact`]: a URL fit for printing, without its password.
//! * [`ProgramError`]: the error type of the example programs;
//!   [`database_url`] and [`exit_code`], the start and the end of their `main`.
//! * [`SessionSettings`]: what every pooled connection runs once it is open
//!   ([`sqlite_session_settings`] with the `sqlite` feature).
//! * [`sqlite_files`] and [`remove_sqlite_files`]: a SQLite database's file and
//!   its `-wal`, `-shm` and `-journal` companions.
//! * [`point_at_database`] and [`wait_all`]: the examples' tests run them as
//!   processes.
//! * [`galera_nodes`] and [`create_galera_database`] (feature `mysql`): a
//!   database of a test's own on the Galera cluster `GALERA_URLS` lists.
//! * [`on_inner!`](crate::on_inner): a statement the `MultiConnection` enum
//!   cannot send, sent to the connection inside it.
//!
//! This module builds without the `harness` feature and without any backend
//! feature. A program that depends on `lockkit-tests` with
//! `default-features = false` for it, and forwards its own backend features,
//! links no database client library it did not ask for.
//!
//! ```
//! use lockkit_tests::support::{connection_url, redact, with_database, Backend};
//!
//! let url = "postgres://app:secret@db:5432/shop";
//! assert_eq!(Backend::from_url(url), Backend::Postgres);
//! assert_eq!(redact(url), "postgres://app:***@db:5432/shop");
//! assert_eq!(with_database(url, "lk_test"), "postgres://app:secret@db:5432/lk_test");
//! assert_eq!(Backend::from_url("sqlite://shop.sqlite"), Backend::Sqlite);
//! assert_eq!(connection_url("sqlite://shop.sqlite"), "shop.sqlite");
//! ```

mod backend;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod connection;
mod databases;
mod error;
#[cfg(feature = "mysql")]
mod galera;
mod processes;
mod program;
mod session;
mod sqlite_files;
mod url;

pub use backend::Backend;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[doc(hidden)]
pub use connection::{__if_mysql, __if_postgres, __if_sqlite};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use connection::{worker_connections, AnyConnection, AnyPool, AnyPooled, Migrations};
pub use databases::{drop_database_sql, drop_orphans, DatabaseName};
pub use error::ProgramError;
#[cfg(feature = "mysql")]
pub use galera::{create_galera_database, galera_nodes};
pub use processes::{point_at_database, wait_all};
pub use program::{database_url, exit_code};
#[cfg(feature = "sqlite")]
pub use session::sqlite_session_settings;
pub use session::SessionSettings;
pub use sqlite_files::{remove_sqlite_files, sqlite_files};
pub use url::{admin_url, admin_url_var, connection_url, redact, with_database};
