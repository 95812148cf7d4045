//! The database lease store: the `lockkit_leases` table on the connection's own
//! server, its time from the server's clock.
//!
//! [`acquire`](super::acquire) sends three statements, each committed on its own:
//! the name's row is created if missing (fence 0), then one `UPDATE` grants it
//! (owner, fence + 1 and expiry at once, only where the row is free or expired),
//! then the fence is read back by the owner token. The `UPDATE` is the atomic
//! step: the server runs it under the row's lock, so two grants of one name
//! never both match, and the fence moves with the grant.
//!
//! Each backend's statements on `lockkit_fences`, for [`fenced`](super::fenced)
//! writes, are here too: a connection is both stores at once.

use super::fence::{FenceStore, Raise};
use super::{Error, LeaseStore};

crate::shipped_tables! {
    /// `CREATE TABLE lockkit_leases` (the database lease store) and `CREATE TABLE
    /// lockkit_fences` (the fences of [`fenced`](super::fenced) writes, needed
    /// with the Redis store too), for `dialect`: put it in a migration.
    ///
    /// ```
    /// use lockkit::lease::{up_sql, Dialect};
    /// assert!(up_sql(Dialect::Mysql).contains("CREATE TABLE lockkit_leases"));
    /// assert!(up_sql(Dialect::Mysql).contains("CREATE TABLE lockkit_fences"));
    /// ```
    tables: "the lease and fence tables",
    feature: "lease-migrations",
    migration: "2026-12-01-000100_lockkit_leases",
    postgres: "migrations/lease/postgres",
    mysql: "migrations/lease/mysql",
    sqlite: "migrations/lease/sqlite",
}

/// One backend's statements on the lease tables, for the blocking and the
/// async connections; the binds are listed with each.
#[allow(dead_code)] // the statements of backends whose feature is off
pub(crate) struct Statements {
    /// name
    pub(crate) ensure: &'static str,
    /// token, ttl (ms), name
    pub(crate) grant: &'static str,
    /// name, token
    pub(crate) read_fence: &'static str,
    /// ttl (ms), name, token
    pub(crate) extend: &'static str,
    /// name, token
    pub(crate) revoke: &'static str,
    /// A fenced write's record of its fence in `lockkit_fences`.
    pub(crate) raise: Raise,
    /// The fence `lockkit_fences` holds for a resource: resource
    pub(crate) current_fence: &'static str,
}

#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: Statements = Statements {
    ensure: "INSERT INTO lockkit_leases (name, fence, expires_at) VALUES ($1, 0, 0) ON CONFLICT (name) DO NOTHING",
    grant: "UPDATE lockkit_leases SET owner = $1, fence = fence + 1, \
            expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint + $2 \
            WHERE name = $3 AND (owner IS NULL OR expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint)",
    read_fence: "SELECT fence FROM lockkit_leases WHERE name = $1 AND owner = $2",
    extend: "UPDATE lockkit_leases SET expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint + $1 \
             WHERE name = $2 AND owner = $3 AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint",
    revoke: "UPDATE lockkit_leases SET owner = NULL, expires_at = 0 WHERE name = $1 AND owner = $2",
    raise: Raise::Upsert("INSERT INTO lockkit_fences (resource, fence) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence WHERE lockkit_fences.fence <= excluded.fence"),
    current_fence: "SELECT fence FROM lockkit_fences WHERE resource = $1",
};

/// `UTC_TIMESTAMP`, not `NOW()`: the session's time zone plays no part.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL: Statements = Statements {
    ensure: "INSERT INTO lockkit_leases (name, fence, expires_at) VALUES (?, 0, 0) ON DUPLICATE KEY UPDATE name = name",
    grant: "UPDATE lockkit_leases SET owner = ?, fence = fence + 1, \
            expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000 + ? \
            WHERE name = ? AND (owner IS NULL OR expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)",
    read_fence: "SELECT fence FROM lockkit_leases WHERE name = ? AND owner = ?",
    extend: "UPDATE lockkit_leases SET expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000 + ? \
             WHERE name = ? AND owner = ? AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000",
    revoke: "UPDATE lockkit_leases SET owner = NULL, expires_at = 0 WHERE name = ? AND owner = ?",
    raise: Raise::EnsureThenUpdate {
        ensure: "INSERT INTO lockkit_fences (resource, fence) VALUES (?, ?) ON DUPLICATE KEY UPDATE resource = resource",
        update: "UPDATE lockkit_fences SET fence = ? WHERE resource = ? AND fence <= ?",
    },
    current_fence: "SELECT fence FROM lockkit_fences WHERE resource = ?",
};

/// SQLite's `julianday('now')`, in Unix milliseconds (it runs on the
/// application's machine: that is the clock).
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: Statements = Statements {
    ensure: "INSERT INTO lockkit_leases (name, fence, expires_at) VALUES (?, 0, 0) ON CONFLICT (name) DO NOTHING",
    grant: "UPDATE lockkit_leases SET owner = ?, fence = fence + 1, \
            expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ? \
            WHERE name = ? AND (owner IS NULL OR expires_at <= CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))",
    read_fence: "SELECT fence FROM lockkit_leases WHERE name = ? AND owner = ?",
    extend: "UPDATE lockkit_leases SET expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ? \
             WHERE name = ? AND owner = ? AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    revoke: "UPDATE lockkit_leases SET owner = NULL, expires_at = 0 WHERE name = ? AND owner = ?",
    raise: Raise::Upsert("INSERT INTO lockkit_fences (resource, fence) VALUES (?, ?) ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence WHERE lockkit_fences.fence <= excluded.fence"),
    current_fence: "SELECT fence FROM lockkit_fences WHERE resource = ?",
};

/// A fence read back.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[derive(diesel::QueryableByName)]
pub(crate) struct FenceRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(crate) fence: i64,
}

/// A backend's connection as the lease store and as the fence store of
/// [`fenced`](super::fenced) writes, with `$sql`, its statements.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! lease_store {
    ($conn:ty, $sql:ident) => {
        impl LeaseStore for $conn {
            fn grant(
                &mut self,
                name: &str,
                token: &str,
                ttl_ms: i64,
            ) -> Result<Option<i64>, Error> {
                use diesel::sql_types::{BigInt, Text};
                use diesel::{OptionalExtension, RunQueryDsl};
                diesel::sql_query($sql.ensure)
                    .bind::<Text, _>(name)
                    .execute(self)?;
                let granted = diesel::sql_query($sql.grant)
                    .bind::<Text, _>(token)
                    .bind::<BigInt, _>(ttl_ms)
                    .bind::<Text, _>(name)
                    .execute(self)?;
                if granted == 0 {
                    return Ok(None);
                }
                // Tokens are unique: the row with ours carries the fence granted
                // with it (none if the lease already ran out and was taken over).
                Ok(diesel::sql_query($sql.read_fence)
                    .bind::<Text, _>(name)
                    .bind::<Text, _>(token)
                    .get_result::<FenceRow>(self)
                    .optional()?
                    .map(|row| row.fence))
            }

            fn extend(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<bool, Error> {
                use diesel::sql_types::{BigInt, Text};
                use diesel::RunQueryDsl;
                let rows = diesel::sql_query($sql.extend)
                    .bind::<BigInt, _>(ttl_ms)
                    .bind::<Text, _>(name)
                    .bind::<Text, _>(token)
                    .execute(self)?;
                Ok(rows == 1)
            }

            fn revoke(&mut self, name: &str, token: &str) -> Result<bool, Error> {
                use diesel::sql_types::Text;
                use diesel::RunQueryDsl;
                let rows = diesel::sql_query($sql.revoke)
                    .bind::<Text, _>(name)
                    .bind::<Text, _>(token)
                    .execute(self)?;
                Ok(rows == 1)
            }

            fn in_transaction(&mut self) -> bool {
                crate::transaction::in_transaction(self)
            }
        }

        impl FenceStore for $conn {
            fn raise(conn: &mut Self, resource: &str, fence: i64) -> Result<Option<i64>, Error> {
                use diesel::sql_types::{BigInt, Text};
                use diesel::RunQueryDsl;
                let raised = match $sql.raise {
                    Raise::Upsert(upsert) => diesel::sql_query(upsert)
                        .bind::<Text, _>(resource)
                        .bind::<BigInt, _>(fence)
                        .execute(conn)?,
                    Raise::EnsureThenUpdate { ensure, update } => {
                        diesel::sql_query(ensure)
                            .bind::<Text, _>(resource)
                            .bind::<BigInt, _>(fence)
                            .execute(conn)?;
                        diesel::sql_query(update)
                            .bind::<BigInt, _>(fence)
                            .bind::<Text, _>(resource)
                            .bind::<BigInt, _>(fence)
                            .execute(conn)?
                    }
                };
                if raised == 1 {
                    return Ok(None);
                }
                let current = diesel::sql_query($sql.current_fence)
                    .bind::<Text, _>(resource)
                    .get_result::<FenceRow>(conn)?;
                Ok(Some(current.fence))
            }
        }
    };
}

#[cfg(feature = "postgres")]
lease_store!(diesel::PgConnection, POSTGRES);
#[cfg(feature = "mysql")]
lease_store!(diesel::MysqlConnection, MYSQL);
#[cfg(feature = "sqlite")]
lease_store!(diesel::SqliteConnection, SQLITE);
