//! Leases with fencing tokens: one holder at a time for a while, and writes that
//! a holder who overran its lease cannot land (feature `lease`).
//!
//! A lock with a time to live is not safe by itself. Its holder can pause (a GC
//! pause, swapping, a slow call) past the TTL, while another process takes the
//! lease over, and then wake up and write, believing it still holds it. The cure is
//! a **fencing token**: every grant of a lease carries a number, its [`Fence`],
//! larger than every fence granted before for that name, and the storage refuses
//! a write whose fence is older than one it has already seen. lockkit owns the
//! database writes, so it does the refusing too: [`fenced`].
//!
//! | call | what it does |
//! | --- | --- |
//! | [`acquire`] | takes the lease `name` for `ttl`, or [`Error::Busy`] while another holder has it; the [`Lease`] guard holds a random owner token and the fence |
//! | [`Lease::renew`] | extends the lease by its TTL from now, only while this holder still has it ([`Error::LeaseLost`] after the TTL ran out) |
//! | [`Lease::release`], dropping the guard | gives the lease up, only if this holder still has it (compare and delete) |
//! | [`with_lease`] | runs a closure under the lease and releases it on every path, a panic included |
//! | [`fenced`] | runs a closure in a database transaction that first records the fence for a resource, and refuses ([`Error::Fenced`]) when a newer one was recorded |
//!
//! Two stores issue leases:
//!
//! * **The database** (PostgreSQL, MySQL/MariaDB, SQLite): one table,
//!   `lockkit_leases`, a row per lease name, on the connection you pass. Its SQL
//!   comes as [`up_sql`] / [`down_sql`] per [`Dialect`] for your migrations, and
//!   with the feature `lease-migrations` as a Diesel migration
//!   (`lockkit::lease::POSTGRES_MIGRATIONS`, `MYSQL_MIGRATIONS`, `SQLITE_MIGRATIONS`).
//!   The same migration creates `lockkit_fences`, the table of [`fenced`].
//! * **Redis** (feature `redis`): [`redis::RedisStore`], `SET key token NX PX ttl`
//!   and the next fence in one Lua script, compare-and-delete and compare-and-extend
//!   scripts. Fenced writes still go to the database.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use std::time::Duration;
//! use diesel::prelude::*;
//! use diesel::connection::SimpleConnection;
//! use lockkit::lease::{self, up_sql, Dialect};
//! let mut leases = SqliteConnection::establish(":memory:").unwrap();
//! leases.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
//! let mut data = SqliteConnection::establish(":memory:").unwrap();
//! data.batch_execute(up_sql(Dialect::Sqlite)).unwrap(); // lockkit_fences
//! data.batch_execute("CREATE TABLE report (id INTEGER PRIMARY KEY, body TEXT NOT NULL)").unwrap();
//!
//! let lease = lease::acquire(&mut leases, "nightly-report", Duration::from_secs(30)).unwrap();
//! let fence = lease.fence();
//! // ... a long computation; then write only if no newer holder has written:
//! lease::fenced(&mut data, "report", fence, |conn| {
//!     diesel::sql_query("INSERT INTO report (id, body) VALUES (1, 'done')").execute(conn)?;
//!     Ok::<_, lockkit::Error>(())
//! })
//! .unwrap();
//! lease.release().unwrap();
//!
//! // The next holder gets a larger fence.
//! let next = lease::acquire(&mut leases, "nightly-report", Duration::from_secs(30)).unwrap();
//! assert!(next.fence() > fence);
//! # }
//! ```
//!
//! # Fenced writes
//!
//! [`fenced`] opens a transaction (a savepoint inside one), raises the fence
//! recorded for `resource` in `lockkit_fences` to the caller's in one upsert
//! (PostgreSQL and SQLite; MySQL inserts the row if missing, then updates it),
//! `INSERT .. ON CONFLICT (resource) DO UPDATE SET fence = $mine WHERE fence <= $mine`,
//! and runs the closure only when that wrote the row. The write holds the row's
//! lock until the transaction ends, so fenced transactions on one resource take
//! turns, and one whose fence is older than a committed one is refused with
//! [`Error::Fenced`], its closure not run. The same fence may write many times.
//!
//! Record the fence **before you read** what you will write back: run the read in
//! [`fenced`] too (as soon as you hold the lease). From then on the older holders'
//! writes are refused, so nothing they write can slip in between your read and
//! your write. The raise is a write like any other: nested in a transaction of
//! yours that rolls back, it goes with it, and the older holders are admitted
//! again; read under a fence in a transaction that commits (or in its own
//! [`fenced`] call at the top level). A holder that only writes, with a fence the resource has not seen
//! yet, is not refused: fencing stops *older* holders, it does not order readers.
//! On MySQL/MariaDB, do not nest [`fenced`] in a `REPEATABLE READ` transaction of
//! yours that has already read: its plain reads see that transaction's snapshot,
//! taken before the fence was raised, and miss what an older holder wrote
//! meanwhile (PostgreSQL refuses the raise there with a serialization failure).
//!
//! A table of your own can carry the fence per row instead, with a conditional
//! update ([`atomic::update_if`](crate::atomic::update_if)):
//! `UPDATE docs SET body = $1, fence = $f WHERE id = $2 AND fence <= $f`, refused
//! when it matches no row.
//!
//! # What a lease does not give: the limits
//!
//! * **Clocks.** A lease's TTL is measured by the store's clock: the database
//!   server's for the database store (`clock_timestamp()`, `UTC_TIMESTAMP(6)`,
//!   SQLite's `julianday('now')`, which is the application's own machine), Redis's
//!   own for Redis. The holder measures nothing: it cannot know, from its own
//!   clock, that its lease still runs (it may have been paused since it last
//!   looked). Treat the TTL as a hint for liveness, never as a guarantee that you
//!   still hold the lease; the fence is what protects the data.
//! * **Fencing protects only the writes that check it.** Writes through
//!   [`fenced`] (or your own `fence <= $f` condition) into the database that
//!   records the fence. An e-mail sent, a file written or an API called by a holder
//!   that overran its lease is not stopped.
//! * **Redis without persistence or replication** forgets its leases when it
//!   restarts, so a second holder gets the lease while the first still works:
//!   only fenced writes stop the first. Redis also forgets the fence counter
//!   then (or takes it back, restarted from an older snapshot or failed over
//!   to a replica that lacked the last grants), so each grant's fence is the
//!   counter plus one or the server's clock in microseconds, whichever is
//!   larger: the next grant is past every fence issued before, unless the
//!   granting server's clock is behind the last one (set back, or a promoted
//!   replica's clock behind the old primary's). Then raise the counter past the
//!   recorded fences ([`redis::RedisStore::raise_fence`]) before any grant. A database store restored from a backup may likewise
//!   lack the last grants: raise `lockkit_leases.fence` there. So may one that
//!   failed over to a replica the last grants had not reached (asynchronous
//!   replication), or lost commits it had acknowledged (PostgreSQL's
//!   `synchronous_commit = off`, InnoDB's `innodb_flush_log_at_trx_commit = 2`):
//!   then a fence is handed out twice, and both holders' fenced writes are
//!   admitted. Keep the leases on a store that commits durably and replicates
//!   synchronously, or raise the fences after a failover. Run Redis with
//!   AOF (`appendfsync always`) if a second holder for a while matters, or keep
//!   the leases in the database. Without fenced writes, a restart means two
//!   holders writing.
//! * **Redis evicting keys.** A lease is a key with a TTL: under a `maxmemory`
//!   policy that evicts such keys (`volatile-*`, `allkeys-*`), a full Redis may
//!   drop a lease before its time, and the next `acquire` takes it while its
//!   holder still works (its `renew` then says [`Error::LeaseLost`]). Only
//!   fenced writes stop the first holder. Give the leases a Redis with
//!   `maxmemory-policy noeviction`, or one of their own with room to spare.
//! * **The database store's grant is committed on its own**: [`acquire`] and
//!   [`Lease::renew`] refuse to run inside a transaction
//!   ([`Error::AlreadyInTransaction`]): a grant rolled back with its transaction
//!   would hand the same fence out twice.
//! * **A single store.** No Redlock over several Redis servers: lockkit does not
//!   implement it (its safety rests on timing assumptions, which fencing makes
//!   unnecessary).
//!
//! Lease names (and fenced resources) are 1 to 255 characters without NUL,
//! compared exactly, and travel as bound parameters (Redis: inside the key, after
//! the store's prefix). TTLs are 1 ms to 365 days.

// Without a backend or the redis feature nothing implements the stores.
#![cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite",
        feature = "redis"
    )),
    allow(dead_code, unused_imports)
)]

pub(crate) mod database;
pub(crate) mod fence;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;

pub use crate::optimistic::version_trigger::Dialect;
// `up_sql`, `down_sql` and the migrations of the enabled backends.
pub use database::*;
pub use fence::{fenced, FenceStore};

const MAX_NAME_LEN: usize = 255;
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// A fencing token: the number a lease was granted with. Every grant of a name
/// gets a larger one than all grants before it, so a larger fence is a later
/// holder. The database stores count from 1; the Redis store's first grant is
/// the server's clock in microseconds (see `lease::redis`), so read nothing
/// into a fence's size. Pass it to [`fenced`], or to another service that
/// checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub i64);

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A store that grants leases: the database connections of the backend features
/// (`PgConnection`, `MysqlConnection`, `SqliteConnection`, and
/// [`Dispatch`](crate::multi::Dispatch) enums over them) and, with the feature
/// `redis`, [`redis::RedisStore`].
///
/// Sealed: implemented by lockkit; name it only in `where` clauses
/// ([`bounds`](crate::bounds)). For an r2d2 pooled connection pass
/// `&mut *pooled`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not store lockkit leases",
    label = "not a lease store",
    note = "lockkit's lease stores are `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`; pass `&mut *pooled` for a pooled one), `#[derive(diesel::MultiConnection)]` enums over them that implement `lockkit::multi::Dispatch`, and `lockkit::lease::redis::RedisStore` (feature `redis`)"
)]
pub trait LeaseStore: crate::sealed::Sealed {
    /// Grants `name` to `token` for `ttl_ms` if nobody holds it; the new fence.
    #[doc(hidden)]
    fn grant(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<Option<i64>, Error>;
    /// Extends `name` by `ttl_ms` from now if `token` still holds it.
    #[doc(hidden)]
    fn extend(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<bool, Error>;
    /// Releases `name` if `token` still holds it.
    #[doc(hidden)]
    fn revoke(&mut self, name: &str, token: &str) -> Result<bool, Error>;
    /// Whether a grant here could be undone with an open transaction (one is
    /// open, or the connection's transaction manager is broken).
    #[doc(hidden)]
    fn in_transaction(&mut self) -> bool {
        false
    }
}

/// A held lease. Derefs to its store (for the database store: the connection).
/// Released when dropped, or with [`Lease::release`].
#[must_use = "the lease is released when the guard is dropped"]
pub struct Lease<'s, S: LeaseStore> {
    store: &'s mut S,
    grant: Grant,
    held: bool,
}

/// What a grant gave its holder, the same in [`Lease`] and in the async guard.
pub(crate) struct Grant {
    pub(crate) name: String,
    pub(crate) token: String,
    pub(crate) fence: Fence,
    pub(crate) ttl_ms: i64,
}

impl Grant {
    /// The grant of `name` to `token` for `ttl_ms`, with the fence the store
    /// answered (`None`: another holder has it, [`Error::Busy`]).
    pub(crate) fn new(
        name: &str,
        token: String,
        ttl_ms: i64,
        fence: Option<i64>,
    ) -> Result<Self, Error> {
        Ok(Grant {
            name: name.to_owned(),
            token,
            fence: Fence(fence.ok_or(Error::Busy)?),
            ttl_ms,
        })
    }
}

/// A lease guard's accessors, its `Debug` and its `Deref` to the store, for
/// [`Lease`] and the async guard: `$guard<'_, S: $store>` with the fields
/// `store: &mut S`, `grant: Grant` and `held: bool`.
macro_rules! lease_guard {
    ($guard:ident, $store:ident) => {
        impl<S: $store> $guard<'_, S> {
            /// The lease's name.
            pub fn name(&self) -> &str {
                &self.grant.name
            }

            /// The fencing token of this grant: carry it on every write ([`fenced`]).
            pub fn fence(&self) -> Fence {
                self.grant.fence
            }

            /// The owner token: 32 random hexadecimal digits, unique to this grant
            /// (it identifies the holder to the store; it is not a secret).
            pub fn token(&self) -> &str {
                &self.grant.token
            }

            /// The TTL it was granted (and is renewed) for.
            pub fn ttl(&self) -> Duration {
                Duration::from_millis(self.grant.ttl_ms.unsigned_abs())
            }
        }

        /// Shows the name, fence and whether it is held, not the store or the token.
        impl<S: $store> std::fmt::Debug for $guard<'_, S> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($guard))
                    .field("name", &self.grant.name)
                    .field("fence", &self.grant.fence)
                    .field("held", &self.held)
                    .finish_non_exhaustive()
            }
        }

        impl<S: $store> std::ops::Deref for $guard<'_, S> {
            type Target = S;
            fn deref(&self) -> &S {
                self.store
            }
        }

        impl<S: $store> std::ops::DerefMut for $guard<'_, S> {
            fn deref_mut(&mut self) -> &mut S {
                self.store
            }
        }
    };
}
#[cfg(feature = "async")]
pub(crate) use lease_guard;

lease_guard!(Lease, LeaseStore);

impl<S: LeaseStore> Lease<'_, S> {
    /// Extends the lease by its TTL from now (the store's clock), keeping the
    /// fence. Call it from long work, well before the TTL runs out.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use std::time::Duration;
    /// use diesel::connection::SimpleConnection;
    /// use diesel::prelude::*;
    /// use lockkit::lease::{self, up_sql, Dialect};
    ///
    /// let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// conn.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
    /// let mut held = lease::acquire(&mut conn, "import", Duration::from_secs(30)).unwrap();
    /// let fence = held.fence();
    /// // ... part of the work ...
    /// held.renew().unwrap(); // 30 s from now, same fence
    /// assert_eq!(held.fence(), fence);
    /// held.release().unwrap();
    ///
    /// // A lease that ran out cannot be renewed: stop writing.
    /// let mut short = lease::acquire(&mut conn, "import", Duration::from_millis(1)).unwrap();
    /// std::thread::sleep(Duration::from_millis(20));
    /// assert!(matches!(short.renew(), Err(lockkit::Error::LeaseLost)));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// * [`Error::LeaseLost`] when the lease ran out (even if nobody took it over
    ///   yet) or another holder has it; nothing changed. Stop writing.
    /// * [`Error::AlreadyInTransaction`] on a database connection with an open
    ///   transaction; nothing is sent.
    /// * the store's error ([`Error::Redis`], or a classified database error).
    pub fn renew(&mut self) -> Result<(), Error> {
        check_own_commit(self.store.in_transaction())?;
        let grant = &self.grant;
        let renewed = renewed(self.store.extend(&grant.name, &grant.token, grant.ttl_ms)?);
        self.held = renewed.is_ok();
        renewed
    }

    /// Gives the lease up now, only if this holder still has it.
    ///
    /// # Errors
    ///
    /// * [`Error::LeaseLost`] when it had run out and another holder may have it
    ///   (whose lease stays untouched). On a database store a lease that ran
    ///   out but that nobody took is released with `Ok`, where Redis answers
    ///   `LeaseLost`: either way nobody else held it.
    /// * the store's error.
    ///
    /// On a database connection the release (and the guard's, on drop) is sent
    /// in the transaction open there, if any: it takes effect when that
    /// transaction commits, and a transaction left open (a Diesel `transaction`
    /// that a panic unwound) keeps the lease's row locked, so that other
    /// acquirers wait. Release it outside transactions.
    pub fn release(mut self) -> Result<(), Error> {
        self.held = false;
        released(self.store.revoke(&self.grant.name, &self.grant.token)?)
    }
}

impl<S: LeaseStore> Drop for Lease<'_, S> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let grant = &self.grant;
        match self.store.revoke(&grant.name, &grant.token) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(target: "lockkit", lease = %grant.name, fence = grant.fence.0, "the lease had run out before its release")
            }
            // The lease runs out by itself after its TTL.
            Err(err) => {
                tracing::warn!(target: "lockkit", lease = %grant.name, error = %crate::error::Chain(&err), "lease release failed")
            }
        }
    }
}

/// Checks a lease name or fenced resource: 1 to 255 characters, no NUL.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.chars().count() > MAX_NAME_LEN || name.contains('\0') {
        return Err(Error::InvalidInput(
            "lease names and fenced resources are 1 to 255 characters, without NUL",
        ));
    }
    Ok(())
}

/// A TTL in milliseconds: 1 ms to 365 days.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<i64, Error> {
    if ttl < Duration::from_millis(1) || ttl > MAX_TTL {
        return Err(Error::InvalidInput("lease TTLs are 1 ms to 365 days"));
    }
    Ok(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
}

/// What an extension's outcome means: refused, the lease ran out or another
/// holder has it.
pub(crate) fn renewed(extended: bool) -> Result<(), Error> {
    match extended {
        true => Ok(()),
        false => Err(Error::LeaseLost),
    }
}

/// What a release's outcome means: refused, the lease had run out (and another
/// holder may have it).
pub(crate) fn released(revoked: bool) -> Result<(), Error> {
    match revoked {
        true => Ok(()),
        false => Err(Error::LeaseLost),
    }
}

/// Checks what [`acquire`] is asked for, before anything is sent: the name,
/// the TTL in milliseconds, and no open transaction on a database store.
pub(crate) fn check_acquire(name: &str, ttl: Duration, in_transaction: bool) -> Result<i64, Error> {
    check_name(name)?;
    let ttl_ms = ttl_millis(ttl)?;
    check_own_commit(in_transaction)?;
    Ok(ttl_ms)
}

/// Refuses a grant or an extension on a database store with an open
/// transaction ([`Error::AlreadyInTransaction`]), before anything is sent: it
/// must commit on its own, as a grant rolled back with its transaction would
/// hand the same fence out twice. A connection whose transaction manager is
/// broken counts as in one: a dropped async call may have left its
/// transaction open on the server. For [`acquire`] and [`Lease::renew`],
/// blocking and async.
pub(crate) fn check_own_commit(in_transaction: bool) -> Result<(), Error> {
    crate::transaction::refuse_transaction(in_transaction)
}

/// 128 bits from the operating system's random source, as 32 hexadecimal
/// digits: unique to the grant whatever the application does with its own
/// generators (`fastrand::seed`), and after a `fork()`. Should the system
/// refuse, the process id and a counter keep it apart from every other grant
/// on this host, and the clock and `fastrand` from most elsewhere.
pub(crate) fn new_token() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        let unique = (u64::from(std::process::id()) << 32) ^ NEXT.fetch_add(1, Relaxed);
        bytes[..8].copy_from_slice(&(nanos ^ fastrand::u64(..)).to_le_bytes());
        bytes[8..].copy_from_slice(&unique.to_le_bytes());
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Takes the lease `name` for `ttl` if nobody holds it; see the
/// [module docs](self).
///
/// It does not wait: wrap it in [`retry`](crate::retry()) to wait with backoff
/// ([`Error::Busy`] is retryable).
///
/// # Errors
///
/// * [`Error::Busy`] while another holder has the lease (its TTL has not run out
///   and it did not release it); on SQLite also when the database stayed locked
///   by another writer past the connection's `busy_timeout`.
/// * [`Error::InvalidInput`] when `name` is empty, longer than 255 characters or
///   contains NUL, or `ttl` is under 1 ms or over 365 days; nothing is sent.
/// * [`Error::AlreadyInTransaction`] on a database connection with an open
///   transaction; nothing is sent.
/// * the store's error ([`Error::Redis`], or a classified database error; see
///   [`classify`](crate::classify())).
pub fn acquire<'s, S: LeaseStore>(
    store: &'s mut S,
    name: &str,
    ttl: Duration,
) -> Result<Lease<'s, S>, Error> {
    let ttl_ms = check_acquire(name, ttl, store.in_transaction())?;
    let token = new_token();
    let fence = store.grant(name, &token, ttl_ms)?;
    Ok(Lease {
        grant: Grant::new(name, token, ttl_ms, fence)?,
        store,
        held: true,
    })
}

/// Runs `work` under the lease `name` and releases it afterwards, on every path:
/// `Ok`, `Err` or a panic (which goes on after the release).
///
/// `work` gets the [`Lease`]: its [`fence`](Lease::fence) for the writes, and
/// [`renew`](Lease::renew) for long work. A release that finds the lease already
/// lost is logged (`tracing`, target `lockkit`), not returned: `work` has
/// finished, and its fenced writes were refused if a newer holder had written.
///
/// # Errors
///
/// Those of [`acquire`] (converted into `E`), or `work`'s own error, untouched.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use std::time::Duration;
/// use diesel::prelude::*;
/// use diesel::connection::SimpleConnection;
/// use lockkit::lease::{self, up_sql, Dialect};
/// let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// conn.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
/// let fence = lease::with_lease(&mut conn, "cron", Duration::from_secs(10), |lease| {
///     Ok::<_, lockkit::Error>(lease.fence())
/// })
/// .unwrap();
/// assert_eq!(fence, lease::Fence(1));
/// // Released: the next one gets it at once.
/// let again = lease::acquire(&mut conn, "cron", Duration::from_secs(10)).unwrap();
/// assert_eq!(again.fence(), lease::Fence(2));
/// # }
/// ```
pub fn with_lease<S, T, E, F>(store: &mut S, name: &str, ttl: Duration, work: F) -> Result<T, E>
where
    S: LeaseStore,
    E: From<Error>,
    F: FnOnce(&mut Lease<'_, S>) -> Result<T, E>,
{
    // A panic in `work` unwinds through `lease`, whose drop releases it.
    let mut lease = acquire(store, name, ttl)?;
    work(&mut lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ttls_are_checked() {
        assert!(check_name("a").is_ok());
        assert!(check_name(&"é".repeat(255)).is_ok());
        assert!(check_name("").is_err());
        assert!(check_name(&"a".repeat(256)).is_err());
        assert!(check_name("a\0b").is_err());
        assert_eq!(ttl_millis(Duration::from_millis(1)).unwrap(), 1);
        assert!(ttl_millis(Duration::from_micros(999)).is_err());
        assert!(ttl_millis(MAX_TTL).is_ok());
        assert!(ttl_millis(Duration::MAX).is_err());
    }

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
