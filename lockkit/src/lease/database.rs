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

use std::marker::PhantomData;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use diesel::backend::Backend;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use diesel::serialize::ToSql;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use diesel::sql_types::{BigInt, Text};

use super::fence::{FenceStore, Raise};
use super::{Error, LeaseStore};
use crate::migrations::Words;
use crate::optimistic::version_trigger::Dialect;

/// `CREATE TABLE lockkit_leases` and `lockkit_fences` in the words of one
/// dialect.
fn lease_tables(_dialect: Dialect, words: &Words) -> String {
    let Words {
        key, end, clock, ..
    } = words;
    format!(
        r#"-- lockkit leases (see lockkit::lease): one row per lease name, kept after a
-- release so that the name's fence only grows. expires_at is the {clock} clock,
-- in Unix milliseconds; owner is the holder's random token, NULL when released.
-- Names are compared byte for byte: "Job" and "job " are two leases.
CREATE TABLE lockkit_leases (
    name {key} PRIMARY KEY,
    owner VARCHAR(64),
    fence BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
{end};
-- The highest fence that fenced writes to each resource have seen
-- (see lockkit::lease::fenced): an older fence is refused.
CREATE TABLE lockkit_fences (
    resource {key} PRIMARY KEY,
    fence BIGINT NOT NULL
{end};
"#
    )
}

crate::migrations::shipped_tables! {
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
    up: lease_tables,
    down: "DROP TABLE lockkit_fences;\nDROP TABLE lockkit_leases;\n",
}

/// One backend's statements on the lease tables, for the blocking and the
/// async connections, which only run them: each is bound by its method, with
/// its parameters in their order.
#[allow(dead_code)] // the statements of backends whose feature is off
pub(crate) struct Statements<DB> {
    ensure: &'static str,
    grant: &'static str,
    read_fence: &'static str,
    extend: &'static str,
    /// Whether the token still holds the lease, unexpired: asked when
    /// `extend` reports no row, on a MySQL/MariaDB connection that reports the
    /// rows a statement changed, not those it matched (made without
    /// `CLIENT_FOUND_ROWS`, as `AsyncMysqlConnection::try_from` may be),
    /// where a renew in the millisecond of the last one changes nothing.
    held: &'static str,
    revoke: &'static str,
    /// A fenced write's record of its fence in `lockkit_fences`.
    raise: Raise,
    /// The fence `lockkit_fences` holds for a resource, for the report of a
    /// refused write: the latest commit's, also inside a transaction that read
    /// before (MySQL/MariaDB: a locking read, not the transaction's snapshot).
    current_fence: &'static str,
    backend: PhantomData<DB>,
}

/// A statement of [`Statements`] with its parameters bound.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) type Bound<'a, DB> = BoxedSqlQuery<'a, DB, SqlQuery>;

/// A parameter of a lease statement.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[derive(Clone, Copy)]
enum Param<'a> {
    Text(&'a str),
    BigInt(i64),
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
impl<DB> Statements<DB>
where
    DB: Backend,
    str: ToSql<Text, DB>,
    i64: ToSql<BigInt, DB>,
{
    /// `sql` with `params` bound, in their order.
    fn bind<'a>(sql: &'static str, params: &[Param<'a>]) -> Bound<'a, DB> {
        params.iter().fold(
            diesel::sql_query(sql).into_boxed(),
            |query, param| match *param {
                Param::Text(value) => query.bind::<Text, _>(value),
                Param::BigInt(value) => query.bind::<BigInt, _>(value),
            },
        )
    }

    /// Creates the row of `name` if it is missing.
    pub(crate) fn ensure<'a>(&self, name: &'a str) -> Bound<'a, DB> {
        Self::bind(self.ensure, &[Param::Text(name)])
    }

    /// Grants `name` to `token` for `ttl_ms` where it is free or expired.
    pub(crate) fn grant<'a>(&self, name: &'a str, token: &'a str, ttl_ms: i64) -> Bound<'a, DB> {
        let params = [Param::Text(token), Param::BigInt(ttl_ms), Param::Text(name)];
        Self::bind(self.grant, &params)
    }

    /// The fence of `name` while `token` holds it.
    pub(crate) fn read_fence<'a>(&self, name: &'a str, token: &'a str) -> Bound<'a, DB> {
        Self::bind(self.read_fence, &[Param::Text(name), Param::Text(token)])
    }

    /// Moves the expiry of `name` to `ttl_ms` from now while `token` holds it.
    pub(crate) fn extend<'a>(&self, name: &'a str, token: &'a str, ttl_ms: i64) -> Bound<'a, DB> {
        let params = [Param::BigInt(ttl_ms), Param::Text(name), Param::Text(token)];
        Self::bind(self.extend, &params)
    }

    /// The fence of `name` while `token` holds it, unexpired.
    pub(crate) fn held<'a>(&self, name: &'a str, token: &'a str) -> Bound<'a, DB> {
        Self::bind(self.held, &[Param::Text(name), Param::Text(token)])
    }

    /// Frees `name` if `token` holds it.
    pub(crate) fn revoke<'a>(&self, name: &'a str, token: &'a str) -> Bound<'a, DB> {
        Self::bind(self.revoke, &[Param::Text(name), Param::Text(token)])
    }

    /// What records `fence` for `resource` ([`Raise`]): the statement that
    /// creates the row first where the backend needs one, then the one that
    /// affects one row when the fence was recorded.
    pub(crate) fn raise<'a>(
        &self,
        resource: &'a str,
        fence: i64,
    ) -> (Option<Bound<'a, DB>>, Bound<'a, DB>) {
        let record = [Param::Text(resource), Param::BigInt(fence)];
        match self.raise {
            Raise::Upsert(upsert) => (None, Self::bind(upsert, &record)),
            Raise::EnsureThenUpdate { ensure, update } => {
                let update_params = [
                    Param::BigInt(fence),
                    Param::Text(resource),
                    Param::BigInt(fence),
                ];
                (
                    Some(Self::bind(ensure, &record)),
                    Self::bind(update, &update_params),
                )
            }
        }
    }

    /// The fence recorded for `resource`.
    pub(crate) fn current_fence<'a>(&self, resource: &'a str) -> Bound<'a, DB> {
        Self::bind(self.current_fence, &[Param::Text(resource)])
    }
}

#[cfg(feature = "postgres")]
pub(crate) const POSTGRES: Statements<diesel::pg::Pg> = Statements {
    ensure: "INSERT INTO lockkit_leases (name, fence, expires_at) VALUES ($1, 0, 0) ON CONFLICT (name) DO NOTHING",
    grant: "UPDATE lockkit_leases SET owner = $1, fence = fence + 1, \
            expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint + $2 \
            WHERE name = $3 AND (owner IS NULL OR expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint)",
    read_fence: "SELECT fence FROM lockkit_leases WHERE name = $1 AND owner = $2",
    extend: "UPDATE lockkit_leases SET expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint + $1 \
             WHERE name = $2 AND owner = $3 AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint",
    held: "SELECT fence FROM lockkit_leases WHERE name = $1 AND owner = $2 \
           AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint",
    revoke: "UPDATE lockkit_leases SET owner = NULL, expires_at = 0 WHERE name = $1 AND owner = $2",
    raise: Raise::Upsert("INSERT INTO lockkit_fences (resource, fence) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence WHERE lockkit_fences.fence <= excluded.fence"),
    current_fence: "SELECT fence FROM lockkit_fences WHERE resource = $1",
    backend: PhantomData,
};

/// `UTC_TIMESTAMP`, not `NOW()`: the session's time zone plays no part.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL: Statements<diesel::mysql::Mysql> = Statements {
    ensure: "INSERT INTO lockkit_leases (name, fence, expires_at) VALUES (?, 0, 0) ON DUPLICATE KEY UPDATE name = name",
    grant: "UPDATE lockkit_leases SET owner = ?, fence = fence + 1, \
            expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000 + ? \
            WHERE name = ? AND (owner IS NULL OR expires_at <= TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)",
    read_fence: "SELECT fence FROM lockkit_leases WHERE name = ? AND owner = ?",
    extend: "UPDATE lockkit_leases SET expires_at = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000 + ? \
             WHERE name = ? AND owner = ? AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000",
    held: "SELECT fence FROM lockkit_leases WHERE name = ? AND owner = ? \
           AND expires_at > TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000",
    revoke: "UPDATE lockkit_leases SET owner = NULL, expires_at = 0 WHERE name = ? AND owner = ?",
    raise: Raise::EnsureThenUpdate {
        ensure: "INSERT INTO lockkit_fences (resource, fence) VALUES (?, ?) ON DUPLICATE KEY UPDATE resource = resource",
        update: "UPDATE lockkit_fences SET fence = ? WHERE resource = ? AND fence <= ?",
    },
    current_fence: "SELECT fence FROM lockkit_fences WHERE resource = ? LOCK IN SHARE MODE",
    backend: PhantomData,
};

/// SQLite's `julianday('now')`, in Unix milliseconds (it runs on the
/// application's machine: that is the clock). Past the largest integer SQLite
/// makes `fence + 1` a float, read back as the largest integer again: the
/// grant sets NULL there instead, which the column refuses (PostgreSQL and
/// MySQL/MariaDB refuse the sum themselves), so no fence is handed out twice.
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE: Statements<diesel::sqlite::Sqlite> = Statements {
    ensure: "INSERT INTO lockkit_leases (name, fence, expires_at) VALUES (?, 0, 0) ON CONFLICT (name) DO NOTHING",
    grant: "UPDATE lockkit_leases SET owner = ?, \
            fence = CASE WHEN fence < 9223372036854775807 THEN fence + 1 END, \
            expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ? \
            WHERE name = ? AND (owner IS NULL OR expires_at <= CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))",
    read_fence: "SELECT fence FROM lockkit_leases WHERE name = ? AND owner = ?",
    extend: "UPDATE lockkit_leases SET expires_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ? \
             WHERE name = ? AND owner = ? AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    held: "SELECT fence FROM lockkit_leases WHERE name = ? AND owner = ? \
           AND expires_at > CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    revoke: "UPDATE lockkit_leases SET owner = NULL, expires_at = 0 WHERE name = ? AND owner = ?",
    raise: Raise::Upsert("INSERT INTO lockkit_fences (resource, fence) VALUES (?, ?) ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence WHERE lockkit_fences.fence <= excluded.fence"),
    current_fence: "SELECT fence FROM lockkit_fences WHERE resource = ?",
    backend: PhantomData,
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
                use diesel::{OptionalExtension, RunQueryDsl};
                $sql.ensure(name).execute(self)?;
                let granted = $sql.grant(name, token, ttl_ms).execute(self)?;
                if granted == 0 {
                    return Ok(None);
                }
                // Tokens are unique: the row with ours carries the fence granted
                // with it (none if the lease already ran out and was taken over).
                Ok($sql
                    .read_fence(name, token)
                    .get_result::<FenceRow>(self)
                    .optional()?
                    .map(|row| row.fence))
            }

            fn extend(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<bool, Error> {
                use diesel::{OptionalExtension, RunQueryDsl};
                if $sql.extend(name, token, ttl_ms).execute(self)? == 1 {
                    return Ok(true);
                }
                // No row changed: lost, or renewed in the millisecond of the
                // last renew on a connection that reports changed rows.
                Ok($sql
                    .held(name, token)
                    .get_result::<FenceRow>(self)
                    .optional()?
                    .is_some())
            }

            fn revoke(&mut self, name: &str, token: &str) -> Result<bool, Error> {
                use diesel::RunQueryDsl;
                let rows = $sql.revoke(name, token).execute(self)?;
                Ok(rows == 1)
            }

            fn in_transaction(&mut self) -> bool {
                use diesel::connection::{Connection, TransactionManager};
                type Manager = <$conn as Connection>::TransactionManager;
                crate::transaction::may_be_in_transaction(Manager::transaction_manager_status_mut(
                    self,
                ))
            }
        }

        impl FenceStore for $conn {
            fn raise(conn: &mut Self, resource: &str, fence: i64) -> Result<Option<i64>, Error> {
                use diesel::RunQueryDsl;
                let (create, raise) = $sql.raise(resource, fence);
                if let Some(create) = create {
                    create.execute(conn)?;
                }
                if raise.execute(conn)? == 1 {
                    return Ok(None);
                }
                let current = $sql.current_fence(resource).get_result::<FenceRow>(conn)?;
                Ok(newer(current.fence, fence))
            }
        }
    };
}

/// What a raise that reported no row means, from the fence it then read
/// (locked): refused when a larger one stands. A MySQL/MariaDB connection that
/// reports the rows a statement changed, not those it matched (one made
/// without `CLIENT_FOUND_ROWS`, as `AsyncMysqlConnection::try_from` may be),
/// reports none for the same fence written again, which is admitted.
pub(crate) fn newer(current: i64, fence: i64) -> Option<i64> {
    (current > fence).then_some(current)
}

#[cfg(feature = "postgres")]
lease_store!(diesel::PgConnection, POSTGRES);
#[cfg(feature = "mysql")]
lease_store!(diesel::MysqlConnection, MYSQL);
#[cfg(feature = "sqlite")]
lease_store!(diesel::SqliteConnection, SQLITE);
