//! The tables lockkit ships (idempotency keys, leases and fences, the outbox
//! and inbox): their SQL for each [`Dialect`](crate::version_trigger::Dialect), and the Diesel migrations that
//! run it.
//!
//! Each table is written once, in the module that uses it, and the few words in
//! which the servers differ are decided here:
//!
//! | | PostgreSQL | MySQL/MariaDB | SQLite |
//! |---|---|---|---|
//! | a name or key, compared byte for byte | `VARCHAR(255)` | `VARBINARY(1020)` (VARCHAR's default collation would make `"a"`, `"A"` and `"a "` one key) | `VARCHAR(255)` |
//! | an increasing id | `BIGSERIAL PRIMARY KEY` | `BIGINT AUTO_INCREMENT PRIMARY KEY` | `INTEGER PRIMARY KEY AUTOINCREMENT` |
//! | a table's end | `);` | `) ENGINE = InnoDB;` | `);` |
//!
//! Each module gives the SQL as `up_sql(dialect)` and `down_sql(dialect)`, to
//! copy into your own migrations, and with its `*-migrations` feature as
//! `POSTGRES_MIGRATIONS`, `MYSQL_MIGRATIONS` and `SQLITE_MIGRATIONS`, each a
//! [`ShippedMigration`] for `diesel_migrations`' `run_pending_migrations`.

use std::fmt;

use diesel::backend::Backend;
use diesel::connection::BoxableConnection;
use diesel::migration::{self, Migration, MigrationMetadata, MigrationName};
use diesel::migration::{MigrationSource, MigrationVersion};

/// One of lockkit's tables as a Diesel migration: a [`MigrationSource`] that
/// holds one migration, for `run_pending_migrations`.
///
/// Diesel records an applied migration by its version alone (the date before
/// the name's first `_`, without dashes), so each set has a version of its own,
/// and the version is the same as when these migrations shipped as
/// `diesel_migrations::EmbeddedMigrations`: a database that applied them then
/// does not apply them again.
///
/// ```
/// # #[cfg(all(feature = "idempotency-migrations", feature = "sqlite"))] {
/// use diesel::migration::{MigrationName, MigrationSource};
/// use diesel::sqlite::Sqlite;
///
/// let shipped = lockkit::idempotency::SQLITE_MIGRATIONS;
/// let migrations = MigrationSource::<Sqlite>::migrations(&shipped).unwrap();
/// assert_eq!(migrations[0].name().version().to_string(), "20261201000000");
/// assert!(shipped.up_sql().contains("CREATE TABLE lockkit_idempotency_keys"));
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ShippedMigration {
    name: &'static str,
    up: &'static str,
    down: &'static str,
}

impl ShippedMigration {
    #[allow(dead_code)] // used by the modules behind optional features
    pub(crate) const fn new(name: &'static str, up: &'static str, down: &'static str) -> Self {
        ShippedMigration { name, up, down }
    }

    /// The migration's name, as a Diesel migration folder would be named:
    /// `2026-12-01-000000_lockkit_idempotency`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The SQL the migration runs.
    pub fn up_sql(&self) -> &'static str {
        self.up
    }

    /// The SQL that reverts it.
    pub fn down_sql(&self) -> &'static str {
        self.down
    }

    fn execute<DB: Backend>(
        &self,
        conn: &mut dyn BoxableConnection<DB>,
        sql: &str,
    ) -> migration::Result<()> {
        conn.batch_execute(sql).map_err(|source| {
            Box::new(MigrationFailed {
                name: self.name,
                source,
            }) as _
        })
    }
}

/// A statement of a [`ShippedMigration`] failed.
#[derive(Debug, thiserror::Error)]
#[error("lockkit's migration {name} failed: {source}")]
struct MigrationFailed {
    name: &'static str,
    source: diesel::result::Error,
}

impl<DB: Backend> MigrationSource<DB> for ShippedMigration {
    fn migrations(&self) -> migration::Result<Vec<Box<dyn Migration<DB>>>> {
        Ok(vec![Box::new(*self)])
    }
}

impl<DB: Backend> Migration<DB> for ShippedMigration {
    fn run(&self, conn: &mut dyn BoxableConnection<DB>) -> migration::Result<()> {
        self.execute(conn, self.up)
    }

    fn revert(&self, conn: &mut dyn BoxableConnection<DB>) -> migration::Result<()> {
        self.execute(conn, self.down)
    }

    fn metadata(&self) -> &dyn MigrationMetadata {
        self
    }

    fn name(&self) -> &dyn MigrationName {
        self
    }
}

/// Runs in a transaction, as Diesel's default.
impl MigrationMetadata for ShippedMigration {}

impl MigrationName for ShippedMigration {
    fn version(&self) -> MigrationVersion<'_> {
        let date = self.name.split('_').next().unwrap_or(self.name);
        MigrationVersion::from(date.replace('-', ""))
    }
}

impl fmt::Display for ShippedMigration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// A word of the shipped tables' SQL in `$dialect` (`postgres`, `mysql` or
/// `sqlite`), as the module documentation's table decides it: `key`, `serial`,
/// `end` (a table's closing parenthesis), or `clock` (whose clock a stored time
/// is read from, for the comments).
#[allow(unused_macros)] // used by the modules behind optional features
macro_rules! word {
    (postgres, key) => {
        "VARCHAR(255)"
    };
    (mysql, key) => {
        "VARBINARY(1020)"
    };
    (sqlite, key) => {
        "VARCHAR(255)"
    };
    (postgres, serial) => {
        "BIGSERIAL PRIMARY KEY"
    };
    (mysql, serial) => {
        "BIGINT AUTO_INCREMENT PRIMARY KEY"
    };
    (sqlite, serial) => {
        "INTEGER PRIMARY KEY AUTOINCREMENT"
    };
    (mysql, end) => {
        ") ENGINE = InnoDB;"
    };
    ($other:ident, end) => {
        ");"
    };
    (sqlite, clock) => {
        "database's"
    };
    ($other:ident, clock) => {
        "server's"
    };
}
#[allow(unused_imports)]
pub(crate) use word;

/// `up_sql` and `down_sql` for each `Dialect`, and with `$feature` (plus a
/// backend's) the migrations `POSTGRES_MIGRATIONS`, `MYSQL_MIGRATIONS` and
/// `SQLITE_MIGRATIONS`, of the tables that `$up!(dialect)` creates. Written once
/// for every module that ships a table.
#[allow(unused_macros)] // used by the modules behind optional features
macro_rules! shipped_tables {
    (
        $(#[$up_doc:meta])*
        tables: $what:literal,
        feature: $feature:literal,
        migration: $migration:literal,
        up: $up:ident,
        down: $down:literal $(,)?
    ) => {
        $(#[$up_doc])*
        pub fn up_sql(dialect: $crate::version_trigger::Dialect) -> &'static str {
            match dialect {
                $crate::version_trigger::Dialect::Postgres => $up!(postgres),
                $crate::version_trigger::Dialect::Mysql => $up!(mysql),
                $crate::version_trigger::Dialect::Sqlite => $up!(sqlite),
            }
        }

        #[doc = concat!("Drops ", $what, " that [`up_sql`] creates (a migration's `down.sql`): the same for every dialect.")]
        pub fn down_sql(_dialect: $crate::version_trigger::Dialect) -> &'static str {
            $down
        }

        $crate::migrations::shipped_tables!(@embed $what, $feature, "postgres", POSTGRES_MIGRATIONS, "PostgreSQL", $migration, $up!(postgres), $down);
        $crate::migrations::shipped_tables!(@embed $what, $feature, "mysql", MYSQL_MIGRATIONS, "MySQL/MariaDB", $migration, $up!(mysql), $down);
        $crate::migrations::shipped_tables!(@embed $what, $feature, "sqlite", SQLITE_MIGRATIONS, "SQLite", $migration, $up!(sqlite), $down);
    };
    (@embed $what:literal, $feature:literal, $backend:literal, $name:ident, $server:literal, $migration:literal, $up:expr, $down:literal) => {
        #[doc = concat!("The migration of ", $what, " for ", $server, ".")]
        #[cfg(all(feature = $feature, feature = $backend))]
        #[cfg_attr(docsrs, doc(cfg(all(feature = $feature, feature = $backend))))]
        pub const $name: $crate::migrations::ShippedMigration =
            $crate::migrations::ShippedMigration::new($migration, $up, $down);
    };
}
#[allow(unused_imports)]
pub(crate) use shipped_tables;
