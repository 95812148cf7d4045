//! Idempotency keys: run a request's work at most once per client key
//! (feature `idempotency`).
//!
//! A client that retries a `POST` after a timeout cannot know whether the first
//! attempt went through. With an idempotency key (e.g. the `Idempotency-Key`
//! header) the server runs the work once and answers every repeat with the stored
//! result.
//!
//! | situation | result | HTTP |
//! | --- | --- | --- |
//! | first request for the key | the work runs; its response is stored | 2xx |
//! | repeat after it completed | [`Outcome::Replayed`] with the stored response; the work does not run | the status your handler gives a replay: store the first answer's status and headers (`Location`, `ETag`) in the response to answer the same |
//! | same key from another principal | a key of its own: the work runs for that principal | 2xx |
//! | repeat while the first still runs | [`Error::IdempotencyInProgress`] | 409 |
//! | same key, different request (fingerprint: method, path or body) | [`Error::IdempotencyKeyReused`] | 422 |
//! | the work failed (an error, or a panic, which then goes on) | the key is released: the next attempt runs it again | the error's |
//! | the process died between start and finish | after the lease (default 60 s) the next attempt takes the key over and runs the work | |
//! | the work's transaction ended under it and statements of the work committed on their own (MySQL/MariaDB: it let a deadlock go and wrote on; a statement that commits implicitly) | the key is kept running: repeats get [`Error::IdempotencyInProgress`] until the lease runs out, then as after a crash (a run inside your transaction: the key's row went with that transaction) | lockkit's error, not retryable (or the work's panic, which goes on) |
//!
//! The lease counts from when the request got the key. A request whose take
//! waited for another's uncommitted take of it (a run inside a transaction of
//! the caller's, which then rolled back) stamps the key again once it has it,
//! when the wait was longer than a tenth of the lease.
//!
//! **Repeats inside a transaction of yours:** a run inside your transaction
//! reads the key in that transaction's snapshot. Under `REPEATABLE READ`
//! (MySQL/MariaDB's default; PostgreSQL's `REPEATABLE READ` and
//! `SERIALIZABLE`) a repeat that waits for the first request
//! (`wait_while_running`) never sees it finish, and ends in
//! [`Error::IdempotencyInProgress`] (409) where it would have replayed. On
//! MySQL/MariaDB its failed insert also keeps a lock on the key's row until
//! your transaction ends, which the first request's final write waits for:
//! the first request is held up for the repeat's whole wait, or fails with
//! `LockTimeout` after its work. Run keys outside your transactions, or keep
//! `wait_while_running` at zero there.
//!
//! **Whose key:** keys are scoped by a principal that you pass: the tenant, user
//! or API key that the request authenticated as (never a value the client
//! chooses freely). The same key from two principals is two keys, so one client
//! can never replay another's stored response, as the IETF `Idempotency-Key`
//! draft and Stripe require.
//!
//! **Which request:** the fingerprint tells a repeat from another request under
//! the same key; [`fingerprint`] hashes method, path and body, so the same key and
//! body sent to another endpoint is refused.
//!
//! **Expiry:** a completed key is kept for the retention period (default 24 h)
//! after it finished; a repeat after that runs the work again, and
//! [`Idempotency::purge_expired`] deletes such keys (run it from a periodic job).
//! A key the purge would delete is free for any request, whenever the purge
//! last ran: one with another body runs too.
//! Times come from the application's clock (Unix milliseconds), so keep server
//! clocks in sync to within a small fraction of the lease.
//!
//! **Exactly once:** the work runs in a transaction together with the write that
//! marks the key completed. If the lease ran out and another request took the key
//! over in the meantime, that final write matches nothing and the work is rolled
//! back ([`Error::IdempotencyInProgress`]), so the database sees it at most once.
//!
//! The table's SQL comes as plain strings, [`up_sql`] and [`down_sql`] per
//! [`Dialect`], to copy into your own migrations. With the feature
//! `idempotency-migrations` it also ships as a Diesel migration: run
//! `conn.run_pending_migrations(lockkit::idempotency::POSTGRES_MIGRATIONS)` (or
//! `MYSQL_MIGRATIONS`, `SQLITE_MIGRATIONS`) with `diesel_migrations::MigrationHarness`.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! # use diesel::prelude::*;
//! use diesel::connection::SimpleConnection;
//! use lockkit::idempotency::{fingerprint, up_sql, Dialect, Idempotency, Outcome};
//! let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! conn.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
//!
//! let keys = Idempotency::default();
//! let request = fingerprint("POST", "/orders", br#"{"qty":1}"#);
//! let first = keys.run(&mut conn, "tenant-1", "order-42", &request, |_conn| Ok::<_, lockkit::Error>("201 order 7".to_owned())).unwrap();
//! assert_eq!(first, Outcome::Ran("201 order 7".to_owned()));
//! let again = keys.run(&mut conn, "tenant-1", "order-42", &request, |_conn| -> Result<String, lockkit::Error> { unreachable!() }).unwrap();
//! assert_eq!(again, Outcome::Replayed("201 order 7".to_owned()));
//! // Another principal's "order-42" is another key.
//! let other = keys.run(&mut conn, "tenant-2", "order-42", &request, |_conn| Ok::<_, lockkit::Error>("201 order 8".to_owned())).unwrap();
//! assert_eq!(other, Outcome::Ran("201 order 8".to_owned()));
//! // The same key and body sent to another endpoint is another request.
//! let elsewhere = fingerprint("POST", "/refunds", br#"{"qty":1}"#);
//! let refused = keys.run(&mut conn, "tenant-1", "order-42", &elsewhere, |_conn| Ok::<_, lockkit::Error>(String::new()));
//! assert!(matches!(refused, Err(lockkit::Error::IdempotencyKeyReused)));
//! # }
//! ```
//!
//! Principals and keys are 1 to 255 characters, fingerprints 0 to 255, all
//! without NUL (PostgreSQL cannot store it), checked before anything is sent, and
//! always travel as bound parameters.

// Without a backend feature nothing implements the store: the feature still builds.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code, unused_imports)
)]

use std::ops::ControlFlow;
use std::thread;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::clock::{millis, now_millis};
use crate::error::Error;
use crate::migrations::Words;
use crate::pessimistic::connection::AsLockingConnection;
use crate::transaction::{self, Failure};

pub use crate::optimistic::version_trigger::Dialect;

/// `CREATE TABLE lockkit_idempotency_keys` in the words of one dialect.
fn keys_table(_dialect: Dialect, words: &Words) -> String {
    let Words { key, text, end, .. } = words;
    format!(
        r#"-- lockkit idempotency keys: one row per client key of each principal (see
-- lockkit::idempotency). The same key from two principals is two keys.
-- Principal and key are compared byte for byte.
CREATE TABLE lockkit_idempotency_keys (
    principal {key} NOT NULL,
    idempotency_key {key} NOT NULL,
    fingerprint VARCHAR(255) NOT NULL,
    state VARCHAR(16) NOT NULL,
    response {text},
    started_at BIGINT NOT NULL,
    finished_at BIGINT,
    PRIMARY KEY (principal, idempotency_key)
{end};
"#
    )
}

crate::migrations::shipped_tables! {
    /// `CREATE TABLE lockkit_idempotency_keys`, the table [`Idempotency`] uses, for
    /// `dialect`: put it in a migration.
    ///
    /// ```
    /// use lockkit::idempotency::{up_sql, Dialect};
    /// assert!(up_sql(Dialect::Postgres).contains("CREATE TABLE lockkit_idempotency_keys"));
    /// ```
    tables: "the idempotency table",
    feature: "idempotency-migrations",
    migration: "2026-12-01-000000_lockkit_idempotency",
    up: keys_table,
    down: "DROP TABLE lockkit_idempotency_keys;\n",
}

mod schema {
    diesel::table! {
    lockkit_idempotency_keys (principal, idempotency_key) {
        principal -> Text,
        idempotency_key -> Text,
        fingerprint -> Text,
        state -> Text,
        response -> Nullable<Text>,
        started_at -> BigInt,
        finished_at -> Nullable<BigInt>,
    }
    }
}

use schema::lockkit_idempotency_keys as keys;

const RUNNING: &str = "running";
const DONE: &str = "done";
/// The longest principal, key or fingerprint, in characters.
pub const MAX_LEN: usize = 255;

/// A request's fingerprint for [`Idempotency::run`]: `sha256:` and the hex
/// SHA-256 of its method, path and body (71 characters).
///
/// Each part is length-prefixed before hashing, so no two different
/// `(method, path, body)` triples hash alike by moving bytes between parts. Pass
/// the path with its query string if the query selects what the request does.
///
/// ```
/// use lockkit::idempotency::fingerprint;
/// let a = fingerprint("POST", "/orders", b"{\"qty\":1}");
/// assert_eq!(a, fingerprint("POST", "/orders", b"{\"qty\":1}"));
/// assert_ne!(a, fingerprint("POST", "/refunds", b"{\"qty\":1}"));
/// assert_ne!(a, fingerprint("PUT", "/orders", b"{\"qty\":1}"));
/// assert_ne!(a, fingerprint("POST", "/orders", b"{\"qty\":2}"));
/// assert!(a.starts_with("sha256:") && a.len() == 71);
/// ```
pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    for part in [method.as_bytes(), path.as_bytes(), body] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    format!("sha256:{}", super::hex(&hash.finalize()))
}

/// The key of an `Idempotency-Key` header value: a structured-field string
/// (`"8e03978e-40d5"`, as the IETF draft writes it, with `\"` and `\\` escapes) or
/// a bare token (`8e03978e-40d5`, as Stripe's clients send it). The axum
/// extractor [`IdempotencyKey`](crate::axum::IdempotencyKey) reads it this way.
///
/// ```
/// use lockkit::idempotency::key_from_header;
/// assert_eq!(key_from_header(b"\"order-42\"").unwrap(), "order-42");
/// assert_eq!(key_from_header(b" order-42 ").unwrap(), "order-42");
/// assert_eq!(key_from_header(b"\"a \\\"b\\\"\"").unwrap(), "a \"b\"");
/// assert!(key_from_header(b"").is_err());
/// assert!(key_from_header(b"two words").is_err());
/// assert!(key_from_header(b"\"unterminated").is_err());
/// ```
///
/// # Errors
///
/// [`Error::InvalidInput`] (`400`) when the value is empty, has characters
/// outside visible ASCII (and spaces, inside quotes), is not one string or
/// token, or is longer than [`MAX_LEN`].
pub fn key_from_header(value: &[u8]) -> Result<String, Error> {
    const MALFORMED: Error = Error::InvalidInput(
        "the Idempotency-Key header must be one quoted string or token of 1 to 255 visible ASCII characters",
    );
    let value = value.trim_ascii();
    let key = match value.strip_prefix(b"\"") {
        Some(quoted) => {
            let mut key = String::new();
            let mut bytes = quoted.iter();
            loop {
                match bytes.next() {
                    Some(b'"') if bytes.as_slice().is_empty() => break key,
                    Some(b'\\') => match bytes.next() {
                        Some(&escaped @ (b'"' | b'\\')) => key.push(char::from(escaped)),
                        _ => return Err(MALFORMED),
                    },
                    Some(&byte @ b' '..=b'~') if byte != b'"' => key.push(char::from(byte)),
                    _ => return Err(MALFORMED),
                }
            }
        }
        None if value
            .iter()
            .all(|byte| (b'!'..=b'~').contains(byte) && *byte != b'"') =>
        {
            value.iter().map(|&byte| char::from(byte)).collect()
        }
        None => return Err(MALFORMED),
    };
    if key.is_empty() || key.len() > MAX_LEN {
        return Err(MALFORMED);
    }
    Ok(key)
}

/// What [`Idempotency::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome<T> {
    /// The work ran now; this is its response (now stored).
    Ran(T),
    /// The work had already run for this key; this is the stored response.
    Replayed(T),
}

impl<T> Outcome<T> {
    /// The response either way.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Ran(value) | Outcome::Replayed(value) => value,
        }
    }
}

/// Idempotency settings: the lease of a running key and the retention of a
/// completed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency {
    /// How long a running key is protected before another request may take it
    /// over (it must exceed the longest run of the work). Default 60 s.
    pub lease: Duration,
    /// How long a completed key is kept. Default 24 h.
    pub retention: Duration,
    /// How long a repeat waits for the request that holds the key to finish,
    /// then replays its response, instead of being refused at once with
    /// [`Error::IdempotencyInProgress`] (which it still is when the wait runs
    /// out). When the first request fails, its key is released and the waiting
    /// repeat runs the work itself. It looks again after 10 ms, then doubles the
    /// pause up to 200 ms, holding no transaction of its own meanwhile. Default
    /// zero: refuse at once. Keep it under your clients' timeout.
    pub wait_while_running: Duration,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            wait_while_running: Duration::ZERO,
        }
    }
}

/// The first pause of [`Idempotency::wait_while_running`]; each next one doubles,
/// up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two looks at a running key.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// A stored key, as [`IdempotencyStore`] reads it.
#[doc(hidden)]
#[derive(Debug, Clone, diesel::Queryable)]
pub struct StoredKey {
    pub fingerprint: String,
    pub state: String,
    pub response: Option<String>,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

/// A key of a principal: the table's primary key.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Scoped<'a> {
    pub(crate) principal: &'a str,
    pub(crate) key: &'a str,
}

impl<'a> Scoped<'a> {
    /// The key of `principal`, once the three inputs are checked.
    pub(crate) fn checked(
        principal: &'a str,
        key: &'a str,
        fingerprint: &str,
    ) -> Result<Self, Error> {
        let valid = |text: &str| text.chars().count() <= MAX_LEN && !text.contains('\0');
        let named = |text: &str| !text.is_empty() && valid(text);
        if !named(principal) || !named(key) || !valid(fingerprint) {
            return Err(Error::InvalidInput(
                "idempotency principals and keys are 1 to 255 characters, fingerprints up to 255, without NUL",
            ));
        }
        Ok(Scoped { principal, key })
    }
}

/// How a request starts: it owns the key (from `started_at`) or replays.
pub(crate) enum Start {
    Owned { started_at: i64 },
    Replay(String),
}

impl Idempotency {
    /// Runs `work` at most once for `key` of `principal`; see the [module docs](self).
    ///
    /// `principal` is whose key it is: the tenant, user or API key the request
    /// authenticated as (a constant such as `"public"` when the API has no
    /// clients to tell apart). The same key from another principal is another
    /// key. `fingerprint` identifies the request ([`fingerprint`] hashes method,
    /// path and body): a key reused for another request is refused. `work` returns the
    /// response to store and replay: any `Serialize + DeserializeOwned` value,
    /// stored as JSON. Its error type is yours, as in Diesel's `transaction`: any
    /// `E` that a [`lockkit::Error`](Error) converts into.
    ///
    /// # Errors
    ///
    /// lockkit's errors reach you converted into `E`:
    ///
    /// * [`Error::InvalidInput`] when `principal` or `key` is empty, or any of the
    ///   three is longer than 255 characters or contains NUL; nothing is sent.
    /// * [`Error::IdempotencyKeyReused`] when the key was used for a request with
    ///   another fingerprint.
    /// * [`Error::IdempotencyInProgress`] when another request holds the key (its
    ///   lease has not run out), or took it over while `work` ran (which is then
    ///   rolled back).
    /// * whatever `work` returns, untouched; its transaction is rolled back and
    ///   the key released, so a retry runs it again; unless statements of the
    ///   work ran after its transaction ended under it, and committed on their
    ///   own: then the key is kept running until its lease runs out (see the
    ///   [module](self)'s table).
    /// * [`Error::Database`] with Diesel's `SerializationError` when the response
    ///   cannot be written as JSON, or its JSON does not read back as `R` (a
    ///   non-finite `f64` is written as `null`): the work is rolled back and the
    ///   key released, as for `work`'s own error. `DeserializationError` when a
    ///   stored one does not read as `R` (the response type changed since it was
    ///   stored). A response is replayed as its JSON reads back: `Some(())` and
    ///   `Some(None)` come back as `None`.
    /// * a classified database error; see [`classify`](crate::classify()).
    pub fn run<C, R, E, F>(
        &self,
        conn: &mut C,
        principal: &str,
        key: &str,
        fingerprint: &str,
        work: F,
    ) -> Result<Outcome<R>, E>
    where
        C: AsLockingConnection,
        C::Conn: IdempotencyStore,
        R: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(&mut C::Conn) -> Result<R, E>,
    {
        let key = Scoped::checked(principal, key, fingerprint)?;
        let conn = conn.locking_connection();
        transaction::require_live(conn)?;
        let started_at = match self.start(conn, key, fingerprint)? {
            Start::Replay(stored) => return Ok(Outcome::Replayed(replayed(&stored)?)),
            Start::Owned { started_at } => started_at,
        };
        // Statements of the work that ran after its transaction ended, in
        // autocommit, or that a statement committing implicitly took with it
        // (a nested call reported it): they committed, and the key is kept.
        let mut committed_on_own = false;
        // A panic of the work is caught here only to release the key (the work
        // was rolled back, and a retry must run it again), then goes on;
        // unless statements of the work committed on their own before it
        // panicked: then the key is kept, as for an error.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            transaction::run(&mut *conn, |conn| {
                let worked =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut *conn)));
                let sqlite_own = !matches!(worked, Ok(Ok(_))) && confirm_end(conn);
                committed_on_own = sqlite_own || transaction::journal::committed_on_own(conn);
                let worked = worked.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                let response = worked.map_err(|err| Failure::Closure(RunError::Work(err)))?;
                // The work let a statement end the transaction (a deadlock's
                // victim on MySQL/MariaDB): the key's `Finish` would commit on its
                // own, for work the server threw away.
                if let Some(cause) = transaction::ended_by_statement(conn) {
                    return Err(Failure::Lockkit(transaction::ended_under_work(conn, cause)));
                }
                let stored = stored(&response)?;
                let finish = Write::Finish {
                    started_at,
                    response: &stored,
                    now: now_millis(),
                };
                finished(C::Conn::write(conn, key, finish)?)?;
                Ok(response)
            })
        }));
        let result = match run {
            Ok(result) => result,
            Err(panic) => {
                if !committed_on_own {
                    release(conn, key, started_at);
                }
                std::panic::resume_unwind(panic);
            }
        };
        let (result, kept) = RunError::settle(result, committed_on_own);
        if result.is_err() && !kept {
            release(conn, key, started_at);
        }
        result.map(Outcome::Ran)
    }

    fn start<C: IdempotencyStore>(
        &self,
        conn: &mut C,
        key: Scoped<'_>,
        fingerprint: &str,
    ) -> Result<Start, Error> {
        let mut looks = self.looks();
        loop {
            let now = now_millis();
            let taken = match C::insert_running(conn, key, fingerprint, now)? {
                true => Start::Owned { started_at: now },
                false => {
                    let seen = self.decide(C::load(conn, key)?, fingerprint, now)?;
                    let matched = match seen.write(now) {
                        Some(write) => C::write(conn, key, write)?,
                        None => false,
                    };
                    match looks.after(seen, matched, now)? {
                        ControlFlow::Break(start) => start,
                        ControlFlow::Continue(pause) => {
                            if !pause.is_zero() {
                                thread::sleep(pause);
                            }
                            continue;
                        }
                    }
                }
            };
            let taken_at = match taken {
                Start::Owned { started_at } => started_at,
                replay => return Ok(replay),
            };
            let now = now_millis();
            let Some(write) = self.stamp_again(taken_at, now) else {
                return Ok(taken);
            };
            match C::write(conn, key, write) {
                Ok(true) => return Ok(Start::Owned { started_at: now }),
                // Taken over meanwhile: look again.
                Ok(false) => {}
                Err(err) => {
                    // The key is this request's: give it up, so that a retry
                    // does not wait out the lease.
                    release(conn, key, taken_at);
                    return Err(err);
                }
            }
        }
    }

    /// A key this request took (inserted, or took over) with `started_at`,
    /// whose statement returned at `now`. That statement waits for another
    /// session's uncommitted take of the same key until that session's
    /// transaction ends, and when it rolls back, the row holds the
    /// `started_at` the statement was sent with: past a tenth of the lease,
    /// the write that stamps it again with `now` (if still as taken), so that
    /// a repeat during the run finds it running, not abandoned. The one place
    /// for the blocking and the async side.
    pub(crate) fn stamp_again(&self, started_at: i64, now: i64) -> Option<Write<'static>> {
        let waited = now.saturating_sub(started_at);
        (waited > millis(self.lease) / 10).then_some(Write::TakeOver {
            seen_started_at: started_at,
            now,
        })
    }

    /// What a stored row (or its absence) means for a request with
    /// `fingerprint` at `now`: the one place that reads a key's state, for the
    /// blocking and the async side.
    pub(crate) fn decide(
        &self,
        row: Option<StoredKey>,
        fingerprint: &str,
        now: i64,
    ) -> Result<Seen, Error> {
        let Some(row) = row else {
            return Ok(Seen::Gone); // released meanwhile: try to insert again
        };
        // What the purge would delete is gone for any request, whenever the
        // purge last ran: also for one with another fingerprint.
        if self.purge_before_at(now).takes(&row) {
            return Ok(Seen::Expired {
                started_at: row.started_at,
                state: if row.state == DONE { DONE } else { RUNNING },
            });
        }
        if row.fingerprint != fingerprint {
            return Err(Error::IdempotencyKeyReused);
        }
        Ok(match row.state.as_str() {
            DONE => Seen::Done(Start::Replay(row.response.unwrap_or_default())),
            _ if row.started_at < now - millis(self.lease) => Seen::Abandoned {
                started_at: row.started_at,
            },
            _ => Seen::Running,
        })
    }

    /// The schedule of a request's looks at a key it could not insert.
    pub(crate) fn looks(&self) -> Looks {
        Looks {
            // A wait too long for the clock (`Duration::MAX`) waits a century.
            deadline: Instant::now()
                .checked_add(self.wait_while_running)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)),
            pause: FIRST_PAUSE,
            races: 0,
        }
    }

    /// Deletes completed keys older than the retention, and running keys
    /// started longer ago than the retention and the lease (their owner is
    /// long gone, and no request with another fingerprint could ever use the
    /// key); returns how many. Run it from a periodic job.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use std::time::Duration;
    /// use diesel::connection::SimpleConnection;
    /// use diesel::prelude::*;
    /// use lockkit::idempotency::{fingerprint, up_sql, Dialect, Idempotency};
    ///
    /// let mut conn = SqliteConnection::establish(":memory:").unwrap();
    /// conn.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
    /// let keys = Idempotency { retention: Duration::from_millis(1), ..Idempotency::default() };
    /// let request = fingerprint("POST", "/orders", b"{}");
    /// keys.run(&mut conn, "tenant-1", "order-42", &request, |_conn| Ok::<_, lockkit::Error>("201".to_owned()))
    ///     .unwrap();
    ///
    /// // Under the default retention (24 h) the completed key is kept.
    /// assert_eq!(Idempotency::default().purge_expired(&mut conn).unwrap(), 0);
    /// // Past this policy's retention it goes.
    /// std::thread::sleep(Duration::from_millis(5));
    /// assert_eq!(keys.purge_expired(&mut conn).unwrap(), 1);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A classified database error; see [`classify`](crate::classify()).
    pub fn purge_expired<C>(&self, conn: &mut C) -> Result<usize, Error>
    where
        C: AsLockingConnection,
        C::Conn: IdempotencyStore,
    {
        C::Conn::purge(conn.locking_connection(), self.purge_before())
    }

    /// What [`purge_expired`](Self::purge_expired) deletes, now.
    pub(crate) fn purge_before(&self) -> PurgeBefore {
        self.purge_before_at(now_millis())
    }

    /// What [`purge_expired`](Self::purge_expired) deletes at `now`.
    fn purge_before_at(&self, now: i64) -> PurgeBefore {
        PurgeBefore {
            finished: now - millis(self.retention),
            started: now - millis(self.retention.max(self.lease)),
        }
    }
}

/// A run's error before it is the caller's: the work's own, or lockkit's,
/// which may say that statements of the work committed on their own.
pub(crate) enum RunError<E> {
    Work(E),
    Lockkit(Error),
}

impl<E> From<Error> for RunError<E> {
    fn from(error: Error) -> Self {
        RunError::Lockkit(error)
    }
}

impl<E: From<Error>> RunError<E> {
    /// The run's result for its caller, and whether its key is kept instead
    /// of released: where statements of the work may have committed on their
    /// own after its transaction ended under it (`committed_on_own`, which the
    /// journal saw, or an error that says so,
    /// [`transaction::may_have_committed`]), a retry must
    /// not run the work again. The key stays running until its lease runs
    /// out, as after a crash.
    pub(crate) fn settle<R>(
        result: Result<R, Self>,
        committed_on_own: bool,
    ) -> (Result<R, E>, bool) {
        match result {
            Ok(response) => (Ok(response), false),
            Err(RunError::Work(err)) => (Err(err), committed_on_own),
            Err(RunError::Lockkit(err)) => {
                let kept = committed_on_own || transaction::may_have_committed(&err);
                (Err(E::from(err)), kept)
            }
        }
    }
}

/// After work that failed or panicked, before its key is kept for statements
/// that committed on their own: an end of the transaction that the journal
/// is not sure of (a lock wait timeout the work let go, which ends it only on
/// a server started with `--innodb-rollback-on-timeout`) is asked of the
/// server, so that the statements the work sent after it count as committed
/// only if it did end. Nothing is sent where the journal saw no such end.
/// (Work that succeeded asks before the key's `Finish`.) On SQLite, where the
/// work wrote after a statement failed: whether that statement had rolled the
/// whole transaction back, so that the writes committed on their own (asked
/// with lockkit's probe); the returned `true`.
fn confirm_end<C: transaction::Control>(conn: &mut C) -> bool {
    if unsure_end(conn.ends(), transaction::journal::ended_by(conn)) {
        let _ = transaction::ended_by_statement(conn);
    }
    transaction::journal::wrote_after_failed(conn) && transaction::ended_on_sqlite(conn).is_some()
}

/// Whether `ended_by`, the end the journal saw on a backend that ends
/// transactions as `ends` says, is one the server is asked about before a
/// failed run's key is kept: a lock wait timeout on MySQL/MariaDB. (Only
/// there do statements after an end commit on their own; elsewhere, and
/// after a deadlock, nothing is asked, and the work's error stands.) For the
/// blocking and the async run.
pub(crate) fn unsure_end(ends: transaction::journal::Ends, ended_by: Option<Error>) -> bool {
    ends == transaction::journal::Ends::OnDeadlock && matches!(ended_by, Some(Error::LockTimeout))
}

/// Releases the key of a run that failed, so that a retry runs the work
/// again; a no-op when another request took it over (its `started_at` is not
/// this run's).
fn release<C: IdempotencyStore>(conn: &mut C, key: Scoped<'_>, started_at: i64) {
    let _ = C::write(conn, key, Write::Release { started_at });
}

/// The keys [`Idempotency::purge_expired`] deletes: completed ones that
/// finished before `finished`, running ones started before `started`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct PurgeBefore {
    pub finished: i64,
    pub started: i64,
}

impl PurgeBefore {
    /// Whether the purge deletes `row` (the statement's rule, read in Rust).
    fn takes(&self, row: &StoredKey) -> bool {
        match row.state.as_str() {
            DONE => row.finished_at.unwrap_or(row.started_at) < self.finished,
            _ => row.started_at < self.started,
        }
    }
}

/// What a stored key means to a request that could not insert it.
pub(crate) enum Seen {
    /// Completed within the retention: replay it.
    Done(Start),
    /// Gone since the insert failed (released): insert again.
    Gone,
    /// What the purge would delete (completed past the retention, or running
    /// past the retention and the lease): delete it (if still this one),
    /// insert again.
    Expired {
        started_at: i64,
        state: &'static str,
    },
    /// Running past its lease: take it over (if still this one).
    Abandoned { started_at: i64 },
    /// Running within its lease: wait for it, or refuse.
    Running,
}

impl Seen {
    /// The write a request makes on the key it saw at `now`, before
    /// [`Looks::after`]: an expired key is deleted, an abandoned one (its
    /// owner died, or overran its lease) taken over, each only if it is still
    /// as seen.
    pub(crate) fn write(&self, now: i64) -> Option<Write<'static>> {
        match *self {
            Seen::Expired { started_at, state } => {
                Some(Write::DeleteIfAsSeen { started_at, state })
            }
            Seen::Abandoned { started_at } => Some(Write::TakeOver {
                seen_started_at: started_at,
                now,
            }),
            Seen::Done(_) | Seen::Gone | Seen::Running => None,
        }
    }
}

/// The looks of one request at a key it could not insert: a few lost races
/// at most (each means another request just inserted, released or expired
/// the key), and waiting for a running key (`wait_while_running`), which is
/// not a race and not counted.
pub(crate) struct Looks {
    deadline: Instant,
    pause: Duration,
    races: u32,
}

impl Looks {
    /// What follows a look at `now` that saw `seen`, once its
    /// [`write`](Seen::write) `matched` (or there was none): the request
    /// starts (`Break`), or pauses this long (zero: not at all) and tries to
    /// insert the key again (`Continue`).
    pub(crate) fn after(
        &mut self,
        seen: Seen,
        matched: bool,
        now: i64,
    ) -> Result<ControlFlow<Start, Duration>, Error> {
        Ok(match seen {
            Seen::Done(start) => ControlFlow::Break(start),
            Seen::Abandoned { .. } if matched => {
                ControlFlow::Break(Start::Owned { started_at: now })
            }
            Seen::Gone | Seen::Expired { .. } | Seen::Abandoned { .. } => {
                ControlFlow::Continue(self.raced()?)
            }
            Seen::Running => ControlFlow::Continue(self.wait()?),
        })
    }

    /// A lost race: look again at once, or give up after five.
    fn raced(&mut self) -> Result<Duration, Error> {
        self.races += 1;
        match self.races < 5 {
            true => Ok(Duration::ZERO),
            false => Err(Error::IdempotencyInProgress),
        }
    }

    /// The key is running: how long to pause before the next look, or
    /// [`Error::IdempotencyInProgress`] when the wait ran out.
    fn wait(&mut self) -> Result<Duration, Error> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::IdempotencyInProgress);
        }
        let pause = self.pause.min(left);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        Ok(pause)
    }
}

/// A stored response read back as `R`.
pub(crate) fn replayed<R: DeserializeOwned>(stored: &str) -> Result<R, Error> {
    serde_json::from_str(stored)
        .map_err(|err| Error::Database(diesel::result::Error::DeserializationError(Box::new(err))))
}

/// A response as it is stored, once it is known to read back as `R`: JSON
/// writes a non-finite `f64` as `null`, which does not, and a key stored so
/// would fail every repeat for its whole retention, after work that committed.
pub(crate) fn stored<R: Serialize + DeserializeOwned>(response: &R) -> Result<String, Error> {
    let refused = |err: Box<dyn std::error::Error + Send + Sync>| {
        Error::Database(diesel::result::Error::SerializationError(err))
    };
    let json = serde_json::to_string(response).map_err(|err| refused(Box::new(err)))?;
    match serde_json::from_str::<R>(&json) {
        Ok(_) => Ok(json),
        Err(err) => Err(refused(
            format!(
                "the response would not replay: its JSON `{json:.80}` does not read back: {err}"
            )
            .into(),
        )),
    }
}

/// What the final write's row count means: `false`, the lease ran out and
/// another request took the key, so the work must be undone.
pub(crate) fn finished(matched: bool) -> Result<(), Error> {
    match matched {
        true => Ok(()),
        false => Err(Error::IdempotencyInProgress),
    }
}

/// What the `INSERT` of a running key means: `false` when the key exists.
pub(crate) fn inserted(result: diesel::QueryResult<usize>) -> Result<bool, Error> {
    use diesel::result::{DatabaseErrorKind, Error as DieselError};
    match result {
        Ok(_) => Ok(true),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// A write on a key's row that finds it only as this request left it (or saw
/// it): the store runs its statement, and it matched when it changed one row.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// Takes over a running key whose owner's lease ran out, if it still has
    /// the `started_at` that was seen.
    TakeOver { seen_started_at: i64, now: i64 },
    /// Marks this request's running key done, with its response.
    Finish {
        started_at: i64,
        response: &'a str,
        now: i64,
    },
    /// Deletes this request's running key, so that a retry runs the work again.
    Release { started_at: i64 },
    /// Deletes an expired key, if it still has the `started_at` and the state
    /// that were seen: a running key that its owner finished meanwhile is
    /// not expired any more (its retention starts at its finish).
    DeleteIfAsSeen {
        started_at: i64,
        state: &'static str,
    },
}

/// The statements behind [`Idempotency`], built once for the blocking and the
/// async side (which only execute them).
#[allow(clippy::needless_lifetimes)]
pub(crate) mod statements {
    use diesel::dsl::{auto_type, delete, insert_into, update};
    use diesel::prelude::*;

    use super::keys;

    #[auto_type(no_type_alias)]
    pub(crate) fn insert_running<'a>(
        principal: &'a str,
        key: &'a str,
        fingerprint: &'a str,
        now: i64,
    ) -> _ {
        let running: &'static str = super::RUNNING;
        insert_into(keys::table).values((
            keys::principal.eq(principal),
            keys::idempotency_key.eq(key),
            keys::fingerprint.eq(fingerprint),
            keys::state.eq(running),
            keys::started_at.eq(now),
        ))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn load<'a>(principal: &'a str, key: &'a str) -> _ {
        keys::table.find((principal, key)).select((
            keys::fingerprint,
            keys::state,
            keys::response,
            keys::started_at,
            keys::finished_at,
        ))
    }

    /// The key's row while it runs since `started_at`: what the owner's writes
    /// and a take-over find only as they left (or saw) it.
    #[auto_type]
    pub(crate) fn running_since<'a>(principal: &'a str, key: &'a str, started_at: i64) -> _ {
        let running: &'static str = super::RUNNING;
        keys::table
            .find((principal, key))
            .filter(keys::state.eq(running))
            .filter(keys::started_at.eq(started_at))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn take_over<'a>(
        principal: &'a str,
        key: &'a str,
        seen_started_at: i64,
        now: i64,
    ) -> _ {
        let row: running_since<'a> = running_since(principal, key, seen_started_at);
        update(row).set(keys::started_at.eq(now))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn finish<'a>(
        principal: &'a str,
        key: &'a str,
        started_at: i64,
        response: &'a str,
        now: i64,
    ) -> _ {
        let row: running_since<'a> = running_since(principal, key, started_at);
        let done: &'static str = super::DONE;
        update(row).set((
            keys::state.eq(done),
            keys::response.eq(response),
            keys::finished_at.eq(now),
        ))
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn release<'a>(principal: &'a str, key: &'a str, started_at: i64) -> _ {
        let row: running_since<'a> = running_since(principal, key, started_at);
        delete(row)
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn delete_if_as_seen<'a>(
        principal: &'a str,
        key: &'a str,
        started_at: i64,
        state: &'static str,
    ) -> _ {
        delete(
            keys::table
                .find((principal, key))
                .filter(keys::started_at.eq(started_at))
                .filter(keys::state.eq(state)),
        )
    }

    #[auto_type(no_type_alias)]
    pub(crate) fn purge(finished_before: i64, started_before: i64) -> _ {
        let done: &'static str = super::DONE;
        let running: &'static str = super::RUNNING;
        delete(
            keys::table.filter(
                keys::state
                    .eq(done)
                    .and(keys::finished_at.lt(finished_before))
                    .or(keys::state
                        .eq(running)
                        .and(keys::started_at.lt(started_before))),
            ),
        )
    }
}

/// The statements behind [`Idempotency`], per connection type.
///
/// Sealed: implemented by lockkit for each backend feature's connection; name it
/// only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's idempotency keys do not support `{Self}`",
    label = "not a connection lockkit's idempotency keys support",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums over them that implement `lockkit::multi::Dispatch`"
)]
pub trait IdempotencyStore: diesel::Connection + crate::sealed::Sealed + Sized {
    #[doc(hidden)]
    fn insert_running(
        conn: &mut Self,
        key: Scoped<'_>,
        fingerprint: &str,
        now: i64,
    ) -> Result<bool, Error>;
    #[doc(hidden)]
    fn load(conn: &mut Self, key: Scoped<'_>) -> Result<Option<StoredKey>, Error>;
    /// Runs `write` on `key`'s row: whether it matched.
    #[doc(hidden)]
    fn write(conn: &mut Self, key: Scoped<'_>, write: Write<'_>) -> Result<bool, Error>;
    #[doc(hidden)]
    fn purge(conn: &mut Self, before: PurgeBefore) -> Result<usize, Error>;
}

#[allow(unused_macros)] // used once per enabled backend
macro_rules! idempotency_store {
    ($conn:ty) => {
        impl IdempotencyStore for $conn {
            fn insert_running(
                conn: &mut Self,
                key: Scoped<'_>,
                fingerprint: &str,
                now: i64,
            ) -> Result<bool, Error> {
                use diesel::prelude::*;
                // A savepoint when nested: a failed INSERT must not poison the caller's transaction.
                inserted(conn.transaction(|conn| {
                    statements::insert_running(key.principal, key.key, fingerprint, now)
                        .execute(conn)
                }))
            }

            fn load(conn: &mut Self, key: Scoped<'_>) -> Result<Option<StoredKey>, Error> {
                use diesel::prelude::*;
                Ok(statements::load(key.principal, key.key)
                    .first::<StoredKey>(conn)
                    .optional()?)
            }

            fn write(conn: &mut Self, key: Scoped<'_>, write: Write<'_>) -> Result<bool, Error> {
                use diesel::RunQueryDsl;
                let Scoped { principal, key } = key;
                let rows = match write {
                    Write::TakeOver {
                        seen_started_at,
                        now,
                    } => statements::take_over(principal, key, seen_started_at, now).execute(conn),
                    Write::Finish {
                        started_at,
                        response,
                        now,
                    } => {
                        statements::finish(principal, key, started_at, response, now).execute(conn)
                    }
                    Write::Release { started_at } => {
                        statements::release(principal, key, started_at).execute(conn)
                    }
                    Write::DeleteIfAsSeen { started_at, state } => {
                        statements::delete_if_as_seen(principal, key, started_at, state)
                            .execute(conn)
                    }
                };
                Ok(rows? == 1)
            }

            fn purge(conn: &mut Self, before: PurgeBefore) -> Result<usize, Error> {
                use diesel::RunQueryDsl;
                Ok(statements::purge(before.finished, before.started).execute(conn)?)
            }
        }
    };
}

#[cfg(feature = "postgres")]
idempotency_store!(diesel::PgConnection);
#[cfg(feature = "mysql")]
idempotency_store!(diesel::MysqlConnection);
#[cfg(feature = "sqlite")]
idempotency_store!(diesel::SqliteConnection);
