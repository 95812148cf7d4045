//! The tables lockkit ships (idempotency keys, leases and fences, the outbox
//! and inbox): their SQL for each [`Dialect`], and the Diesel migrations that
//! run it.
//!
//! Each table is written once, in the module that uses it, and the few words in
//! which the servers differ are decided here:
//!
//! | | PostgreSQL | MySQL/MariaDB | SQLite |
//! |---|---|---|---|
//! | a name or key, compared byte for byte | `VARCHAR(255)` | `VARBINARY(1020)` (VARCHAR's default collation would make `"a"`, `"A"` and `"a "` one key) | `VARCHAR(255)` |
//! | text of any length (a payload, a stored response, an error) | `TEXT` | `LONGTEXT` (`TEXT` stops at 64 KiB, and outside strict mode cuts what is longer without an error) | `TEXT` |
//! | an increasing id | `BIGSERIAL PRIMARY KEY` | `BIGINT AUTO_INCREMENT PRIMARY KEY` | `INTEGER PRIMARY KEY AUTOINCREMENT` |
//! | a table's end | `);` | `) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;` (the database's default character set may be `latin1`, which cannot hold what Diesel sends as `utf8mb4`: refused, or stored as `?` outside strict mode) | `);` |
//!
//! Each module gives the SQL as `up_sql(dialect)` and `down_sql(dialect)`, to
//! copy into your own migrations, and with its `*-migrations` feature as
//! `POSTGRES_MIGRATIONS`, `MYSQL_MIGRATIONS` and `SQLITE_MIGRATIONS`, each a
//! [`ShippedMigration`] for `diesel_migrations`' `run_pending_migrations`.
//! Each runs in a transaction, which on MySQL/MariaDB does not cover `CREATE
//! TABLE` (see [`ShippedMigration`]).
//!
//! Diesel's reverts (`diesel migration revert` and `redo`, a harness's
//! `revert_last_migration` and `revert_all_migrations`) take the newest version
//! applied to the database and look it up in the one source they are given.
//! Once a set of lockkit's is applied with a version newer than your own
//! migrations', reverting yours that way fails with `UnknownMigrationVersion`.
//! Where you revert with Diesel's tools, copy `up_sql` and `down_sql` into a
//! migration of your own instead.

use std::fmt;
use std::sync::OnceLock;

use diesel::backend::Backend;
use diesel::connection::BoxableConnection;
use diesel::migration::{self, Migration, MigrationMetadata, MigrationName};
use diesel::migration::{MigrationSource, MigrationVersion};

use crate::optimistic::version_trigger::Dialect;

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
#[derive(Clone, Copy)]
pub struct ShippedMigration {
    name: &'static str,
    dialect: Dialect,
    up: fn(Dialect) -> &'static str,
    down: &'static str,
}

impl ShippedMigration {
    #[allow(dead_code)] // used by the modules behind optional features
    pub(crate) const fn new(
        name: &'static str,
        dialect: Dialect,
        up: fn(Dialect) -> &'static str,
        down: &'static str,
    ) -> Self {
        ShippedMigration {
            name,
            dialect,
            up,
            down,
        }
    }

    /// The migration's name, as a Diesel migration folder would be named:
    /// `2026-12-01-000000_lockkit_idempotency`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The SQL the migration runs.
    pub fn up_sql(&self) -> &'static str {
        (self.up)(self.dialect)
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

impl fmt::Debug for ShippedMigration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShippedMigration")
            .field("name", &self.name)
            .field("dialect", &self.dialect)
            .finish_non_exhaustive()
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
        self.execute(conn, self.up_sql())
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

/// Runs in a transaction, as Diesel's default. MySQL/MariaDB commit each
/// `CREATE TABLE` on its own: there a migration that failed at its second
/// table (one of that name already exists) keeps its first, and is not
/// recorded as run; drop what it created before running it again.
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

/// The words in which the shipped tables' SQL differs between servers, as the
/// module documentation's table decides them.
#[allow(dead_code)] // used by the modules behind optional features
pub(crate) struct Words {
    /// A name or key, compared byte for byte.
    pub(crate) key: &'static str,
    /// Text of any length.
    pub(crate) text: &'static str,
    /// An increasing `BIGINT` id, the primary key.
    pub(crate) serial: &'static str,
    /// A table's closing parenthesis, with what follows it.
    pub(crate) end: &'static str,
    /// Whose clock a stored time is read from, for the comments.
    pub(crate) clock: &'static str,
}

#[allow(dead_code)] // used by the modules behind optional features
impl Words {
    pub(crate) fn of(dialect: Dialect) -> Words {
        match dialect {
            Dialect::Postgres => Words {
                key: "VARCHAR(255)",
                text: "TEXT",
                serial: "BIGSERIAL PRIMARY KEY",
                end: ")",
                clock: "server's",
            },
            Dialect::Mysql => Words {
                key: "VARBINARY(1020)",
                text: "LONGTEXT",
                serial: "BIGINT AUTO_INCREMENT PRIMARY KEY",
                end: ") ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
                clock: "server's",
            },
            Dialect::Sqlite => Words {
                key: "VARCHAR(255)",
                text: "TEXT",
                serial: "INTEGER PRIMARY KEY AUTOINCREMENT",
                end: ")",
                clock: "database's",
            },
        }
    }
}

/// The SQL `tables` writes for each dialect, written once per process: what
/// each module's `up_sql` returns.
#[allow(dead_code)] // used by the modules behind optional features
pub(crate) fn written(
    sql: &'static OnceLock<[String; 3]>,
    tables: fn(Dialect, &Words) -> String,
    dialect: Dialect,
) -> &'static str {
    let all = sql.get_or_init(|| {
        [Dialect::Postgres, Dialect::Mysql, Dialect::Sqlite].map(|d| tables(d, &Words::of(d)))
    });
    match dialect {
        Dialect::Postgres => &all[0],
        Dialect::Mysql => &all[1],
        Dialect::Sqlite => &all[2],
    }
}

/// `up_sql` and `down_sql` for each `Dialect`, and with `$feature` (plus a
/// backend's) the migrations `POSTGRES_MIGRATIONS`, `MYSQL_MIGRATIONS` and
/// `SQLITE_MIGRATIONS`, of the tables that `$tables(dialect, &words)` writes.
/// Written once for every module that ships a table.
#[allow(unused_macros)] // used by the modules behind optional features
macro_rules! shipped_tables {
    (
        $(#[$up_doc:meta])*
        tables: $what:literal,
        feature: $feature:literal,
        migration: $migration:literal,
        up: $tables:path,
        down: $down:literal $(,)?
    ) => {
        $(#[$up_doc])*
        pub fn up_sql(dialect: $crate::version_trigger::Dialect) -> &'static str {
            static SQL: ::std::sync::OnceLock<[String; 3]> = ::std::sync::OnceLock::new();
            $crate::migrations::written(&SQL, $tables, dialect)
        }

        #[doc = concat!("Drops ", $what, " that [`up_sql`] creates (a migration's `down.sql`): the same for every dialect.")]
        pub fn down_sql(_dialect: $crate::version_trigger::Dialect) -> &'static str {
            $down
        }

        $crate::migrations::shipped_tables!(@embed $what, $feature, "postgres", POSTGRES_MIGRATIONS, "PostgreSQL", Postgres, $migration, $down);
        $crate::migrations::shipped_tables!(@embed $what, $feature, "mysql", MYSQL_MIGRATIONS, "MySQL/MariaDB", Mysql, $migration, $down);
        $crate::migrations::shipped_tables!(@embed $what, $feature, "sqlite", SQLITE_MIGRATIONS, "SQLite", Sqlite, $migration, $down);
    };
    (@embed $what:literal, $feature:literal, $backend:literal, $name:ident, $server:literal, $dialect:ident, $migration:literal, $down:literal) => {
        #[doc = concat!("The migration of ", $what, " for ", $server, ".")]
        #[cfg(all(feature = $feature, feature = $backend))]
        #[cfg_attr(docsrs, doc(cfg(all(feature = $feature, feature = $backend))))]
        pub const $name: $crate::migrations::ShippedMigration = $crate::migrations::ShippedMigration::new(
            $migration,
            $crate::version_trigger::Dialect::$dialect,
            up_sql,
            $down,
        );
    };
}
#[allow(unused_imports)]
pub(crate) use shipped_tables;
