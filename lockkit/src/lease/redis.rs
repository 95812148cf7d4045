//! The Redis lease store (feature `redis`): leases in Redis, fences from Redis,
//! fenced writes in the database.
//!
//! Each lease name has two keys, after the store's prefix:
//!
//! | key | holds |
//! | --- | --- |
//! | `<prefix>lease:<name>` | the holder's owner token, expiring after the TTL (`PX`) |
//! | `<prefix>fence:<name>` | the name's fence counter, never expiring |
//!
//! Every call is one Lua script (`EVALSHA`, loaded with `SCRIPT LOAD` on the
//! first `NOSCRIPT`), so each is atomic on the server:
//!
//! * **acquire**: `SET lease token NX PX ttl`, and only when that set the key,
//!   the next fence: the counter plus one, or the server's clock (`TIME`) in
//!   microseconds when that is larger. The well-known recipe takes the lock and
//!   an `INCR`ed fence in two calls; a holder that pauses between them (or a
//!   client that dies there) would leave a grant without a fence, or take a
//!   fence after a newer holder's. One script issues both at once. The clock
//!   is what keeps a fence from being issued twice when Redis loses the counter
//!   (a restart without persistence) or takes it back (a restart from an older
//!   snapshot, a replica promoted before the last grants reached it): the next
//!   grant is past every fence issued before, as long as the clock of the
//!   server that grants it is past the last one (not set back, and after a
//!   failover not behind the old primary's).
//! * **renew**: `PEXPIRE lease ttl` only when `GET lease` is the caller's token
//!   (compare and extend).
//! * **release**: `DEL lease` only when `GET lease` is the caller's token
//!   (compare and delete): a holder whose lease ran out never deletes its
//!   successor's.
//!
//! The scripts are in the repository's `docs/SQL.md`. They name both keys in
//! `KEYS`, so the two keys must live on one server: a single Redis (or one with
//! replicas), not Redis Cluster; Redis 5 or later (a script that reads `TIME`
//! and then writes). See the [limits](super#what-a-lease-does-not-give-the-limits)
//! for what a restart without persistence does.
//!
//! ```no_run
//! use std::time::Duration;
//! use lockkit::lease::{self, redis::RedisStore};
//! let mut store = RedisStore::open("redis://127.0.0.1:6379/", "myapp:").unwrap();
//! let held = lease::acquire(&mut store, "nightly-report", Duration::from_secs(30)).unwrap();
//! println!("fence {}", held.fence());
//! ```

use std::sync::LazyLock;

use ::redis::{ConnectionLike, Script};

use super::{check_name, Error, Fence, LeaseStore};

/// The `redis` client crate lockkit uses, for building connections of the same
/// version.
pub use ::redis as client;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_LUA));

/// KEYS: lease, fence. ARGV: token, TTL in ms. The new fence, or nil when held.
///
/// The fence is the counter plus one, or the server's clock in microseconds
/// when that is larger: a counter that a restart forgot, or a snapshot or a
/// promoted replica took back, starts again past every fence issued before.
/// A counter at 2^53 - 1 (raised there by hand) grants no more: an error,
/// never a fence issued twice.
pub const ACQUIRE_LUA: &str = "\
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if fence < clock then
  fence = clock
end
if fence >= 9007199254740992 then
  return redis.error_reply('lockkit: the fence counter reached 2^53')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], string.format('%.0f', fence))
  return fence
end
return false";

/// KEYS: lease. ARGV: token, TTL in ms. 1 when extended, 0 when not the holder's.
pub const RENEW_LUA: &str = "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

/// KEYS: lease. ARGV: token. 1 when deleted, 0 when not the holder's.
pub const RELEASE_LUA: &str = "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// The largest fence [`RedisStore::raise_fence`] sets: Lua's numbers are
/// doubles, exact below 2^53, where [`ACQUIRE_LUA`] stops granting (an error,
/// never a fence issued twice). The clock reaches it in the year 2255.
const MAX_FENCE: i64 = (1 << 53) - 1;

/// KEYS: fence. ARGV: the least fence. The counter afterwards.
pub const RAISE_FENCE_LUA: &str = "\
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
return current";

/// A lease store on one Redis connection, with a key prefix (use one per
/// application, so that names do not collide on a shared server). Two stores on
/// one server need prefixes neither of which starts the other: with `app:` and
/// `app:lease:`, the lease of the name `fence:x` in the first is the fence
/// counter of `x` in the second.
///
/// `C` is any sync `redis` connection: a [`client::Connection`], or a pooled one.
pub struct RedisStore<C = client::Connection> {
    conn: C,
    prefix: String,
}

impl RedisStore<client::Connection> {
    /// Connects to `url` (`redis://host:port/db`).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when the URL is invalid or the server cannot be reached.
    pub fn open(url: &str, prefix: impl Into<String>) -> Result<Self, Error> {
        let conn = client::Client::open(url)?.get_connection()?;
        Ok(Self::new(conn, prefix))
    }
}

impl<C: ConnectionLike> RedisStore<C> {
    /// A store on `conn`, its keys starting with `prefix`.
    pub fn new(conn: C, prefix: impl Into<String>) -> Self {
        RedisStore {
            conn,
            prefix: prefix.into(),
        }
    }

    /// The connection.
    pub fn connection(&mut self) -> &mut C {
        &mut self.conn
    }

    /// The key holding the lease `name`'s owner token.
    pub fn lease_key(&self, name: &str) -> String {
        format!("{}lease:{name}", self.prefix)
    }

    /// The key holding the lease `name`'s fence counter.
    pub fn fence_key(&self, name: &str) -> String {
        format!("{}fence:{name}", self.prefix)
    }

    /// Raises `name`'s fence counter to at least `at_least`, and returns it: the
    /// next grant gets a larger fence. A grant's fence is already past the
    /// server's clock in microseconds, so a restart that forgot the counter
    /// needs nothing while the fences stay behind the clock. Raise it by hand
    /// (to `SELECT MAX(fence) FROM lockkit_fences`) when the clock may be
    /// behind the fences recorded: after the server's clock was set back, after
    /// a failover to a replica whose clock is behind the old primary's, when
    /// another store issued fences for the same resources, and after a restart
    /// that forgot a counter raised ahead of the clock.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or a fence outside 0 to 2^53 - 1
    /// (Lua counts in doubles; nothing is sent), or [`Error::Redis`].
    pub fn raise_fence(&mut self, name: &str, at_least: Fence) -> Result<Fence, Error> {
        check_name(name)?;
        if !(0..=MAX_FENCE).contains(&at_least.0) {
            return Err(Error::InvalidInput(
                "Redis fences are 0 to 2^53 - 1 (Lua counts in doubles)",
            ));
        }
        let fence = RAISE_FENCE
            .key(self.fence_key(name))
            .arg(at_least.0)
            .invoke::<i64>(&mut self.conn)?;
        Ok(Fence(fence))
    }
}

impl<C> crate::sealed::Sealed for RedisStore<C> {}

impl<C: ConnectionLike> LeaseStore for RedisStore<C> {
    fn grant(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<Option<i64>, Error> {
        Ok(ACQUIRE
            .key(self.lease_key(name))
            .key(self.fence_key(name))
            .arg(token)
            .arg(ttl_ms)
            .invoke::<Option<i64>>(&mut self.conn)?)
    }

    fn extend(&mut self, name: &str, token: &str, ttl_ms: i64) -> Result<bool, Error> {
        let extended = RENEW
            .key(self.lease_key(name))
            .arg(token)
            .arg(ttl_ms)
            .invoke::<i64>(&mut self.conn)?;
        Ok(extended == 1)
    }

    fn revoke(&mut self, name: &str, token: &str) -> Result<bool, Error> {
        let deleted = RELEASE
            .key(self.lease_key(name))
            .arg(token)
            .invoke::<i64>(&mut self.conn)?;
        Ok(deleted == 1)
    }
}

/// Shows the prefix, not the connection.
impl<C> std::fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
