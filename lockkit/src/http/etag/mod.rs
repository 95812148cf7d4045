//! ETag / `If-Match` for HTTP APIs (RFC 9110 §8.8.3, §13.1.1), free of any web
//! framework.
//!
//! Optimistic locking over HTTP: `GET` returns the row with a strong ETag made
//! from its version; the client sends it back in `If-Match` on `PUT`/`DELETE`; the
//! handler turns the header into the expected version and calls
//! [`Versioned::update_by_version`](crate::Versioned::update_by_version). A client
//! that edited an old copy gets `412 Precondition Failed` instead of overwriting
//! someone else's change.
//!
//! | request | outcome | status |
//! | --- | --- | --- |
//! | `If-Match: "v7"` and the row is at version 7 | the write happens | 200 / 204 |
//! | `If-Match: "v6"` (stale), or only weak / foreign tags | [`Error::Stale`] or [`IfMatchError::NoMatch`] | 412 |
//! | `If-Match: *` | any version matches (the row must exist) | 200 / 404 |
//! | no `If-Match` where one is required | [`IfMatchError::Missing`] | 428 |
//! | a header that is not a list of entity tags | [`IfMatchError::Malformed`] | 400 |
//!
//! A version sent in the request body instead (a `"version"` field) is refused
//! with `409 Conflict` rather than `412`: [`VersionIn::Body`]. Tags bound to their
//! resource, that say nothing about the write count, come with the feature
//! `bound-etags` ([`ETagSecret`]). `GET` answers `304 Not Modified` when
//! `If-None-Match` holds the current tag ([`not_modified`]).
//!
//! A tag names a version of a row, not the row's life: a row deleted and
//! created again under the same key at the same version (a natural key, a
//! client that creates with `PUT`) takes the tags of the old one, plain and
//! bound alike. Create it again with a version past the old one's.
//!
//! ```
//! use lockkit::etag::{self, ETag, Expected};
//!
//! let tag = ETag::from_version(7_i32);
//! assert_eq!(tag.to_string(), "\"v7\"");
//! assert_eq!(etag::expected_version::<i32>(Some("\"v7\"")), Ok(Expected::Version(7)));
//! assert_eq!(etag::expected_version::<i32>(Some("*")), Ok(Expected::Any));
//! assert!(etag::expected_version::<i32>(Some("W/\"v7\"")).is_err()); // weak never matches
//! assert!(etag::expected_version::<i32>(None).is_err());             // 428
//! ```

#[cfg(feature = "bound-etags")]
mod bound;

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

use crate::error::{CurrentState, Error, StaleObjectError};
use crate::optimistic::version::VersionNumber;
use crate::retry::{retry_while, Spent};
use crate::retry::{RetryPolicy, RetryableError};
#[cfg(feature = "bound-etags")]
#[cfg_attr(docsrs, doc(cfg(feature = "bound-etags")))]
pub use bound::{BoundETag, ETagSecret, ResourceTags, SecretTooShort, MIN_SECRET_LEN};

/// A strong entity tag made from a row's version: `"v<version>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ETag(i64);

impl ETag {
    /// The tag of a version.
    pub fn from_version<V: VersionNumber>(version: V) -> Self {
        ETag(version.to_i64())
    }

    /// The version inside.
    pub fn version(self) -> i64 {
        self.0
    }
}

impl fmt::Display for ETag {
    /// The header value, quotes included: `"v7"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"v{}\"", self.0)
    }
}

impl FromStr for ETag {
    type Err = IfMatchError;

    /// Parses a strong lockkit tag, quotes included: `"v7"`.
    fn from_str(value: &str) -> Result<Self, IfMatchError> {
        match value.parse::<IfMatch>()?.expected::<i64>()? {
            Expected::Version(version) => Ok(ETag(version)),
            _ => Err(IfMatchError::Malformed("not a single lockkit entity tag")),
        }
    }
}

impl ETag {
    /// The tag without quotes: `v7`.
    pub(crate) fn opaque(self) -> String {
        format!("v{}", self.0)
    }
}

/// One entity tag of a header, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTag {
    /// `W/` prefix: weak tags never match under `If-Match`.
    pub weak: bool,
    /// The opaque tag, without quotes.
    pub opaque: String,
}

/// A parsed `If-Match` header value (also the grammar of `If-None-Match`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `*`: matches any current representation.
    Any,
    /// A list of entity tags (never empty).
    Tags(Vec<EntityTag>),
}

/// Why an `If-Match` header cannot lead to a write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IfMatchError {
    /// No `If-Match` header where one is required: 428 Precondition Required.
    #[error("this request requires an If-Match header with the resource's ETag")]
    Missing,
    /// Not a valid `If-Match` value: 400 Bad Request.
    #[error("malformed If-Match header: {0}")]
    Malformed(&'static str),
    /// No strong lockkit tag in the list, so nothing can match: 412.
    #[error("no entity tag in If-Match can match the current version")]
    NoMatch,
}

impl IfMatchError {
    /// The HTTP status code this error maps to.
    pub fn status(&self) -> u16 {
        match self {
            IfMatchError::Missing => 428,
            IfMatchError::Malformed(_) => 400,
            IfMatchError::NoMatch => 412,
        }
    }
}

impl fmt::Display for EntityTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.weak {
            f.write_str("W/")?;
        }
        write!(f, "\"{}\"", self.opaque)
    }
}

/// The header value, as it would be sent: `*` or the tags separated by `, `
/// (parses back to the same value).
impl fmt::Display for IfMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IfMatch::Any => f.write_str("*"),
            IfMatch::Tags(tags) => {
                for (i, tag) in tags.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{tag}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for IfMatch {
    type Err = IfMatchError;

    /// Parses `*` or `#entity-tag` (RFC 9110): comma-separated, optional
    /// whitespace, empty list elements ignored, `W/` for weak, `etagc` characters
    /// inside the quotes (`!`, `#`..`~`, and bytes from 0x80).
    fn from_str(value: &str) -> Result<Self, IfMatchError> {
        let value = value.trim_matches(is_ows);
        if value == "*" {
            return Ok(IfMatch::Any);
        }
        let mut tags = Vec::new();
        let mut rest = value;
        loop {
            rest = rest.trim_start_matches(|c| is_ows(c) || c == ',');
            if rest.is_empty() {
                break;
            }
            let (weak, after_prefix) = match rest.strip_prefix("W/") {
                Some(after) => (true, after),
                None => (false, rest),
            };
            let inner = after_prefix
                .strip_prefix('"')
                .ok_or(IfMatchError::Malformed("an entity tag must be quoted"))?;
            let end = inner
                .find('"')
                .ok_or(IfMatchError::Malformed("unterminated entity tag"))?;
            let opaque = &inner[..end];
            if !opaque.chars().all(is_etagc) {
                return Err(IfMatchError::Malformed(
                    "invalid character in an entity tag",
                ));
            }
            tags.push(EntityTag {
                weak,
                opaque: opaque.to_owned(),
            });
            rest = inner[end + 1..].trim_start_matches(is_ows);
            if !rest.is_empty() && !rest.starts_with(',') {
                return Err(IfMatchError::Malformed(
                    "entity tags must be separated by commas",
                ));
            }
        }
        if tags.is_empty() {
            return Err(IfMatchError::Malformed("no entity tag"));
        }
        Ok(IfMatch::Tags(tags))
    }
}

fn is_ows(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn is_etagc(c: char) -> bool {
    c == '\x21' || ('\x23'..='\x7e').contains(&c) || c >= '\u{80}'
}

/// The version(s) a request may write over.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expected<V> {
    /// `If-Match: *`: any version (write with the current one, the row must exist).
    Any,
    /// Exactly one strong lockkit tag: write if the row is still at this version.
    Version(V),
    /// Several strong lockkit tags: write if the row is at any of them.
    OneOf(Vec<V>),
}

impl IfMatch {
    /// The versions named by strong lockkit tags (`"v<n>"` that fits `V`). Weak
    /// tags and tags lockkit did not make are ignored: under `If-Match` they can
    /// never match.
    ///
    /// # Errors
    ///
    /// [`IfMatchError::NoMatch`] when no tag names a version (`412`).
    pub fn expected<V: VersionNumber>(&self) -> Result<Expected<V>, IfMatchError> {
        let tags = match self {
            IfMatch::Any => return Ok(Expected::Any),
            IfMatch::Tags(tags) => tags,
        };
        let mut versions: Vec<V> = tags
            .iter()
            .filter(|tag| !tag.weak)
            .filter_map(|tag| tag.opaque.strip_prefix('v'))
            .filter_map(|digits| {
                // Compared character by character with the tag lockkit makes
                // (RFC 9110's strong comparison): `"v07"`, `"v+7"` and `"v-0"`
                // name no version, as lockkit never sent them.
                let n = digits.parse::<i64>().ok()?;
                (n.to_string() == digits).then_some(n)
            })
            .filter_map(V::from_i64)
            .collect();
        versions.sort();
        versions.dedup();
        match versions.len() {
            0 => Err(IfMatchError::NoMatch),
            1 => Ok(Expected::Version(versions[0])),
            _ => Ok(Expected::OneOf(versions)),
        }
    }
}

impl IfMatch {
    /// Whether the list holds `opaque` (a tag without quotes) under the weak
    /// comparison of `If-None-Match` (RFC 9110 §8.8.3.2: `W/` does not matter);
    /// `*` holds every tag.
    pub fn contains_weakly(&self, opaque: &str) -> bool {
        match self {
            IfMatch::Any => true,
            IfMatch::Tags(tags) => tags.iter().any(|tag| tag.opaque == opaque),
        }
    }
}

/// `If-None-Match` on a `GET` (RFC 9110 §13.1.2) against the resource's current
/// plain tag: whether the client's copy is current, so the answer is
/// `304 Not Modified` (with the `ETag`, without a body). A missing or malformed
/// header is `false`: a full `200`. For bound tags see
/// [`ResourceTags::not_modified`](crate::etag::ResourceTags::not_modified) (feature
/// `bound-etags`).
///
/// ```
/// use lockkit::etag::{not_modified, ETag};
/// let current = ETag::from_version(7_i32);
/// assert!(not_modified(Some("\"v7\""), current));
/// assert!(not_modified(Some("W/\"v6\", W/\"v7\""), current)); // weak comparison
/// assert!(not_modified(Some("*"), current));
/// assert!(!not_modified(Some("\"v6\""), current));
/// assert!(!not_modified(None, current));
/// assert!(!not_modified(Some("v7"), current)); // malformed: a full response
/// ```
pub fn not_modified(if_none_match: Option<&str>, current: ETag) -> bool {
    if_none_match
        .and_then(|value| value.parse::<IfMatch>().ok())
        .is_some_and(|header| header.contains_weakly(&current.opaque()))
}

/// How many times [`Expected::apply`] re-reads and retries a write under
/// `If-Match: *` when other writers keep changing the row in between.
pub const ANY_MATCH_ATTEMPTS: u32 = 5;

impl<V: VersionNumber> Expected<V> {
    /// Whether a row at version `current` satisfies the `If-Match` header.
    pub fn matches(&self, current: V) -> bool {
        match self {
            Expected::Any => true,
            Expected::Version(version) => *version == current,
            Expected::OneOf(versions) => versions.contains(&current),
        }
    }

    /// Runs a version-checked write for this `If-Match`: `write(conn, expected)` must
    /// write only if the row is still at `expected` (e.g.
    /// [`Versioned::update_by_version`](crate::Versioned::update_by_version)) and
    /// report [`Error::Stale`] otherwise; `current(conn)` reads the row's version
    /// ([`Error::NotFound`] when it does not exist). Under `*`, `write` runs
    /// again after a stale report of its own write (expecting the version
    /// read): one that writes more than the row (a parent it touches, say)
    /// must have written nothing when it reports that, so make it one
    /// statement or give it its own transaction (a savepoint in yours), or
    /// its earlier writes run again. A stale report of another row (another
    /// expected version) comes back as it is; `apply` tells the write's own
    /// report by its expected version alone, so one of another row that
    /// expected the same number is taken for the write's own. Such a report
    /// names that row's version: see [`Problem::from_error`] before turning
    /// it into a `412`.
    ///
    /// * one tag: `write` with it; `current` is not called.
    /// * several tags: `current`, then `write` with it if it is listed, else with a
    ///   listed version, which the database refuses as stale (`412` with the
    ///   current `ETag`) unless the row got there in between.
    /// * `*`: `current`, then `write` with it; when another writer got in between
    ///   (stale, row still there), again, up to [`ANY_MATCH_ATTEMPTS`] times, then
    ///   the last stale error through [`RetryableError::retries_exhausted`]: for
    ///   lockkit's own error type [`Error::RetriesExhausted`] (`503`), for yours
    ///   by default the stale error itself (`412`). A missing row is `404`.
    ///   When `current` reads again the version the last write found stale,
    ///   it reads a snapshot older than the other writer's commit (a
    ///   transaction at `REPEATABLE READ`, MySQL/MariaDB's default):
    ///   [`Error::SerializationFailure`] (`503`, retryable), for the
    ///   transaction's owner ([`transaction_with_retry`](crate::transaction_with_retry))
    ///   to run again on a fresh snapshot.
    ///
    /// An empty `OneOf` (the parser never makes one) writes nothing and is
    /// [`Error::NoRowMatched`].
    ///
    /// # Errors
    ///
    /// * whatever `current` or `write` return: [`Error::Stale`] when the row is
    ///   not at an expected version, [`Error::NotFound`] when it is gone, ...
    /// * under `*`, when every one of [`ANY_MATCH_ATTEMPTS`] writes found the
    ///   row changed in between: the last stale error through
    ///   [`RetryableError::retries_exhausted`] ([`Error::RetriesExhausted`] for
    ///   lockkit's own error type).
    /// * [`Error::NoRowMatched`] for an empty `OneOf`.
    pub fn apply<C: ?Sized, T, E>(
        &self,
        conn: &mut C,
        mut current: impl FnMut(&mut C) -> Result<V, E>,
        mut write: impl FnMut(&mut C, V) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: RetryableError,
    {
        match self {
            Expected::Version(version) => write(conn, *version),
            Expected::OneOf(versions) => {
                let now = current(conn)?;
                if versions.contains(&now) {
                    return write(conn, now);
                }
                // A listed version the row is not at, for the database to
                // refuse as stale (412 with the current ETag); not one at the
                // type's maximum, which no write can follow (409), unless
                // every listed one is.
                let listed = versions
                    .iter()
                    .rev()
                    .find(|v| v.checked_next().is_some())
                    .or(versions.last());
                match listed {
                    Some(&listed) => write(conn, listed),
                    // The parser never makes an empty list; one built by hand
                    // matches nothing.
                    None => Err(E::from(Error::NoRowMatched)),
                }
            }
            // Another writer got in between: read the new version and write
            // again.
            Expected::Any => {
                let tried = Cell::new(None);
                retry_while(
                    &RetryPolicy::immediate(ANY_MATCH_ATTEMPTS),
                    |_| {
                        let now = current(conn)?;
                        // Reading again found the version the last write found
                        // stale: the reads see a snapshot taken before the
                        // other writer's commit (a transaction at REPEATABLE
                        // READ), as every further one would. A serialization
                        // failure: retryable, for the transaction's owner to run
                        // again (`*` is never a 412 while the row exists). A
                        // write with the version the stale report found would
                        // match, with values `write` may have read in the old
                        // snapshot: the other writer's update lost.
                        if tried.replace(Some(now)) == Some(now) {
                            return Err(E::from(Error::SerializationFailure));
                        }
                        write(conn, now)
                    },
                    // Written again only when the stale report is this write's
                    // own (it expected the version read, the row is past it):
                    // one about another row `write` touched goes back as it is.
                    |err: &E, _| match (err.lockkit_error(), tried.get()) {
                        (Some(Error::Stale(stale)), Some(now)) => {
                            let now = now.to_i64();
                            stale.expected_version == now
                                && matches!(stale.current, CurrentState::Version(current) if current > now)
                        }
                        _ => false,
                    },
                    Spent::Exhausted,
                )
            }
        }
    }
}

/// From the raw `If-Match` header (`None` when absent) to the expected version:
/// parse, then [`IfMatch::expected`].
///
/// # Errors
///
/// * [`IfMatchError::Missing`] without a header (`428`).
/// * [`IfMatchError::Malformed`] when it is not `*` or a list of entity tags
///   (`400`).
/// * [`IfMatchError::NoMatch`] when no strong lockkit tag in it fits `V` (`412`).
pub fn expected_version<V: VersionNumber>(
    header: Option<&str>,
) -> Result<Expected<V>, IfMatchError> {
    header
        .ok_or(IfMatchError::Missing)?
        .parse::<IfMatch>()?
        .expected()
}

/// The HTTP status for a lockkit error in a write handler whose version came in
/// `If-Match`: `Stale` → 412 (the client's copy is old; 404 when the row is gone),
/// and `StaleRows` (some of a bulk write's rows changed) → 412, `NotFound` →
/// 404, a conditional update that matched nothing, an idempotency key in use, a
/// fenced write refused for an older fence or a version at its type's maximum
/// (a tag the client made up, or a row no write can follow) → 409, a reused
/// idempotency key → 422, invalid input or a row named twice → 400, lock
/// contention or a replica behind the read's position → 503 (try again, with
/// `Retry-After`), a transaction the server rolled back → the status of what
/// rolled it back, anything else → 500.
pub fn status_for(error: &Error) -> u16 {
    status_for_version_in(error, VersionIn::IfMatch)
}

/// [`status_for`] for a version that came from `version_in`: with
/// [`VersionIn::Body`] a stale write is `409 Conflict`.
pub fn status_for_version_in(error: &Error, version_in: VersionIn) -> u16 {
    Refusal::of(error, version_in).status()
}

/// Where the client sent the version it read, which decides the status of a stale
/// write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum VersionIn {
    /// As an ETag in `If-Match`: a stale write is `412 Precondition Failed`
    /// (RFC 9110 §13.1.1), the current `ETag` in the problem and its header.
    #[default]
    IfMatch,
    /// In the request body (a `"version"` field): a stale write is `409
    /// Conflict`, the current version in the problem's `current_version`.
    Body,
}

/// Seconds a client should wait before retrying a `503` caused by lock
/// contention, a deadlock or a serialization failure (the `Retry-After` header).
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// How the versions of a refused write are shown to the client.
#[derive(Clone, Copy)]
pub(crate) enum Rendering<'a> {
    /// Plain tags, `"v7"`.
    Plain,
    /// Version numbers (the client sent one in the body).
    Body,
    /// The resource's bound tags; no version is shown.
    #[cfg(feature = "bound-etags")]
    Bound(&'a ResourceTags),
    #[cfg(not(feature = "bound-etags"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'a ()>),
}

/// How each lockkit error is refused over HTTP, decided here once: the status
/// ([`status_for`]) and the problem's title and detail ([`Problem::from_error`])
/// both read it.
enum Refusal<'a> {
    /// 412 (409 for a version from the body): the row changed since the client
    /// read it.
    Changed(&'a StaleObjectError, VersionIn),
    /// 412 (409 for versions from the body): some of the rows of a bulk write
    /// changed since the client read them; nothing was written.
    RowsChanged(VersionIn),
    /// 409: no write can follow the version the client sent (its type's
    /// maximum).
    Unwritable,
    /// 400: the client named one row twice.
    NamedTwice,
    /// 404: the row is gone, or never was.
    NotFound,
    /// 409: a condition did not hold, the same key is still running, or a newer
    /// lease holder has written.
    Conflict,
    /// 422: an idempotency key reused for another request.
    KeyReused,
    /// 400: a value from the client out of range.
    BadRequest,
    /// 503: a conflict with other transactions that a retry may get past.
    Busy,
    /// 500: anything else.
    Failed,
}

/// The stale report of a versioned write behind `error`, also inside a
/// [`TransactionAborted`](Error::TransactionAborted).
#[cfg(feature = "bound-etags")]
fn stale_report(error: &Error) -> Option<&StaleObjectError> {
    match error {
        Error::Stale(stale) => Some(stale),
        Error::TransactionAborted(aborted) => stale_report(aborted.cause()),
        _ => None,
    }
}

impl<'a> Refusal<'a> {
    fn of(error: &'a Error, version_in: VersionIn) -> Self {
        match error {
            Error::Stale(stale) if stale.current == CurrentState::Deleted => Refusal::NotFound,
            Error::Stale(stale) => Refusal::Changed(stale, version_in),
            Error::StaleColumns(stale) if stale.deleted => Refusal::NotFound,
            Error::NotFound => Refusal::NotFound,
            Error::StaleColumns(_)
            | Error::NoRowMatched
            | Error::IdempotencyInProgress
            | Error::Fenced { .. } => Refusal::Conflict,
            Error::StaleRows(_) => Refusal::RowsChanged(version_in),
            Error::VersionOverflow { .. } => Refusal::Unwritable,
            Error::DuplicateKey { .. } => Refusal::NamedTwice,
            Error::TransactionAborted(aborted) => Refusal::of(aborted.cause(), version_in),
            Error::IdempotencyKeyReused => Refusal::KeyReused,
            Error::InvalidInput(_) => Refusal::BadRequest,
            Error::Busy
            | Error::LockTimeout
            | Error::Deadlock
            | Error::SerializationFailure
            | Error::RetriesExhausted { .. } => Refusal::Busy,
            // A replica behind the read's position (or a client's position
            // far ahead): retryable, as contention is.
            _ if error.is_replica_behind() => Refusal::Busy,
            _ => Refusal::Failed,
        }
    }

    fn status(&self) -> u16 {
        match self {
            Refusal::Changed(_, VersionIn::IfMatch) => 412,
            Refusal::Changed(_, VersionIn::Body) => 409,
            Refusal::RowsChanged(VersionIn::IfMatch) => 412,
            Refusal::RowsChanged(VersionIn::Body) => 409,
            Refusal::NotFound => 404,
            Refusal::Conflict | Refusal::Unwritable => 409,
            Refusal::KeyReused => 422,
            Refusal::BadRequest | Refusal::NamedTwice => 400,
            Refusal::Busy => 503,
            Refusal::Failed => 500,
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Refusal::Changed(_, VersionIn::IfMatch) => "Precondition Failed",
            Refusal::Changed(_, VersionIn::Body) => "Conflict",
            Refusal::RowsChanged(VersionIn::IfMatch) => "Precondition Failed",
            Refusal::RowsChanged(VersionIn::Body) => "Conflict",
            Refusal::NotFound => "Not Found",
            Refusal::Conflict | Refusal::Unwritable => "Conflict",
            Refusal::KeyReused => "Unprocessable Content",
            Refusal::BadRequest | Refusal::NamedTwice => "Bad Request",
            Refusal::Busy => "Service Unavailable",
            Refusal::Failed => "Internal Server Error",
        }
    }

    /// The `Retry-After` seconds: only contention, which a retry may get past.
    fn retry_after(&self) -> Option<u32> {
        match self {
            Refusal::Busy => Some(RETRY_AFTER_SECONDS),
            _ => None,
        }
    }
}

/// A response body for a refused write, in the shape of RFC 9457 problem details.
/// Serialize it with your framework (`serde` feature).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Problem {
    /// RFC 9457 `type`: a URI reference that names the kind of problem
    /// ([`with_type`](Problem::with_type)); absent means `about:blank`, whose
    /// title is the status phrase, as lockkit's titles are.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "type", skip_serializing_if = "Option::is_none")
    )]
    pub type_uri: Option<String>,
    /// A short, stable summary.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What happened and what to do.
    pub detail: String,
    /// RFC 9457 `instance`: a URI reference for this occurrence
    /// ([`with_instance`](Problem::with_instance)), e.g. the request's path or a
    /// log id.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub instance: Option<String>,
    /// The current ETag when known: re-read the resource to get the new state.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub current_etag: Option<String>,
    /// The current version, for a stale write whose version came in the body
    /// ([`VersionIn::Body`]).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub current_version: Option<i64>,
    /// Seconds to wait before trying again (the `Retry-After` header, not part of
    /// the body): set on a `503` from lock contention, a deadlock or a
    /// serialization failure.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub retry_after: Option<u32>,
}

/// `503 Service Unavailable: ..`: the status, the title and the detail, for
/// logs and error chains (a `Problem` is an error: `?` takes it into
/// `Box<dyn Error>` or `anyhow`).
///
/// ```
/// use lockkit::etag::Problem;
///
/// let problem = Problem::from_error(&lockkit::Error::Busy);
/// assert_eq!(problem.status, 503);
/// assert_eq!(problem.retry_after, Some(1));
/// assert!(problem.to_string().starts_with("503 Service Unavailable: "));
///
/// let own = Problem::new(404, "Not Found", "no item 7").with_instance("/items/7");
/// assert_eq!(own.to_string(), "404 Not Found: no item 7");
/// let boxed: Box<dyn std::error::Error + Send + Sync> = own.into();
/// # let _ = boxed;
/// ```
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.title, self.detail)
    }
}

impl std::error::Error for Problem {}

/// [`Problem::from_error`]: the problem for a lockkit error in a handler whose
/// version came in `If-Match` as a plain tag (`"v7"`), which it shows. For a
/// resource with bound ETags, build the problem with `ResourceTags::problem`
/// (feature `bound-etags`), which shows its bound tag and no version, rather
/// than with `?` or `into()`.
impl From<Error> for Problem {
    fn from(error: Error) -> Self {
        Problem::from_error(&error)
    }
}

impl Problem {
    /// A problem of your own (for errors that are not lockkit's), without a
    /// current ETag.
    pub fn new(status: u16, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            type_uri: None,
            title,
            status,
            detail: detail.into(),
            instance: None,
            current_etag: None,
            current_version: None,
            retry_after: None,
        }
    }

    /// With an RFC 9457 `type`: a URI reference that names this kind of problem.
    #[must_use]
    pub fn with_type(mut self, type_uri: impl Into<String>) -> Self {
        self.type_uri = Some(type_uri.into());
        self
    }

    /// With an RFC 9457 `instance`: a URI reference for this occurrence.
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// The problem for a lockkit error in a handler whose version came in
    /// `If-Match` (plain tags).
    ///
    /// A plain tag names a number, not a row: a stale report becomes a `412`
    /// whose `ETag` is the version the report found, whichever row it is of.
    /// Where the handler's write also writes other versioned rows (whose
    /// stale reports [`Expected::apply`] returns as they are), answer their
    /// reports yourself (a `409`, say) rather than with this, or use bound
    /// ETags (feature `bound-etags`), whose problem shows a tag only for a
    /// report of the resource itself: otherwise the client is handed another
    /// row's version as this resource's tag, good as soon as the resource
    /// reaches that number.
    pub fn from_error(error: &Error) -> Self {
        Problem::render(error, Rendering::Plain)
    }

    /// The problem for a lockkit error, for a version that came from
    /// `version_in`: with [`VersionIn::Body`] a stale write is `409 Conflict`
    /// with the current version in `current_version`.
    pub fn from_error_in(error: &Error, version_in: VersionIn) -> Self {
        match version_in {
            VersionIn::IfMatch => Problem::render(error, Rendering::Plain),
            VersionIn::Body => Problem::render(error, Rendering::Body),
        }
    }

    pub(crate) fn render(error: &Error, rendering: Rendering<'_>) -> Self {
        let version_in = match rendering {
            Rendering::Body => VersionIn::Body,
            _ => VersionIn::IfMatch,
        };
        let refusal = Refusal::of(error, version_in);
        // A resource with bound tags knows its own row: a stale report of
        // another row, deleted, that the request also wrote is not this
        // resource's `404` (the client would take it for gone), but a
        // precondition that failed, as for another row that changed.
        #[cfg(feature = "bound-etags")]
        let refusal = match (&rendering, refusal) {
            (Rendering::Bound(tags), Refusal::NotFound) => match stale_report(error) {
                Some(stale) if !tags.names(stale) => Refusal::Changed(stale, version_in),
                _ => Refusal::NotFound,
            },
            (_, refusal) => refusal,
        };
        // The row's version now, where the refusal is that it changed.
        let current = match &refusal {
            Refusal::Changed(stale, _) => match stale.current {
                CurrentState::Version(v) | CurrentState::Behind(v) => Some(v),
                CurrentState::Deleted | CurrentState::NullVersion => None,
            },
            _ => None,
        };
        let show = |version: i64| match rendering {
            Rendering::Plain => Some(ETag(version).to_string()),
            Rendering::Body => Some(format!("version {version}")),
            _ => None,
        };
        let detail = match &refusal {
            Refusal::Changed(stale, _) => match (show(stale.expected_version), current) {
                (Some(sent), Some(now)) => format!(
                    "the resource was changed by someone else after you read it (you sent {sent}, it is now {}); \
                     re-read it (GET) and apply your change to the current version",
                    show(now).unwrap_or_default()
                ),
                (Some(sent), None) => format!(
                    "the resource was changed by someone else after you read it (you sent {sent}, it is now unversioned); \
                     re-read it (GET) and apply your change to the current version"
                ),
                (None, _) => "the resource was changed by someone else after you read it; \
                     re-read it (GET) and apply your change to the current version"
                    .to_owned(),
            },
            Refusal::RowsChanged(_) => "some of the resources were changed by someone else after you read them, \
                 and nothing was written; re-read them (GET) and apply your change to their current versions"
                .to_owned(),
            Refusal::Unwritable => "the version cannot go higher: no write can follow it; re-read the resource (GET)".to_owned(),
            Refusal::NamedTwice => "the request names one resource more than once; nothing was written".to_owned(),
            Refusal::NotFound => "the resource does not exist".to_owned(),
            Refusal::Conflict => conflict_detail(error),
            Refusal::KeyReused | Refusal::BadRequest => error.to_string(),
            Refusal::Busy => "the resource is busy with other changes; try again".to_owned(),
            Refusal::Failed => "the request could not be completed".to_owned(),
        };
        let (current_etag, current_version) = match rendering {
            Rendering::Plain => (current.map(|v| ETag(v).to_string()), None),
            Rendering::Body => (None, current),
            #[cfg(feature = "bound-etags")]
            Rendering::Bound(tags) => match &refusal {
                Refusal::Changed(stale, _) if tags.names(stale) => {
                    (current.map(|v| tags.etag_of(v).to_string()), None)
                }
                _ => (None, None),
            },
            #[cfg(not(feature = "bound-etags"))]
            Rendering::Never(_) => (None, None),
        };
        Problem {
            current_etag,
            current_version,
            retry_after: refusal.retry_after(),
            ..Problem::new(refusal.status(), refusal.title(), detail)
        }
    }

    /// The problem for an unusable `If-Match` header.
    pub fn from_if_match(error: &IfMatchError) -> Self {
        let title = match error {
            IfMatchError::Missing => "Precondition Required",
            IfMatchError::Malformed(_) => "Bad Request",
            IfMatchError::NoMatch => "Precondition Failed",
        };
        let detail = match error {
            IfMatchError::Missing => "send If-Match with the ETag from your last GET".to_owned(),
            IfMatchError::NoMatch => {
                "no strong ETag in If-Match names a version of this resource; re-read it (GET)"
                    .to_owned()
            }
            other => other.to_string(),
        };
        Problem::new(error.status(), title, detail)
    }
}

/// What a 409 tells the client: in its terms, never the table, the key or
/// the stored values that a compare-and-set's or a fence's error names for
/// the log.
fn conflict_detail(error: &Error) -> String {
    match error {
        Error::StaleColumns(_) => "the resource was changed by someone else after you read it, \
             and nothing was written; re-read it (GET) and apply your change to what it holds now"
            .to_owned(),
        Error::Fenced { .. } => {
            "a newer holder of the resource's lease has written to it; this write was refused"
                .to_owned()
        }
        Error::TransactionAborted(aborted) => conflict_detail(aborted.cause()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<IfMatch, IfMatchError> {
        value.parse()
    }

    fn strong(opaque: &str) -> EntityTag {
        EntityTag {
            weak: false,
            opaque: opaque.into(),
        }
    }

    #[test]
    fn parses_the_forms_of_rfc_9110() {
        assert_eq!(parse("*"), Ok(IfMatch::Any));
        assert_eq!(parse(" * "), Ok(IfMatch::Any));
        assert_eq!(parse("\"v1\""), Ok(IfMatch::Tags(vec![strong("v1")])));
        assert_eq!(
            parse("\"v1\" ,W/\"v2\",  , \"\""),
            Ok(IfMatch::Tags(vec![
                strong("v1"),
                EntityTag {
                    weak: true,
                    opaque: "v2".into()
                },
                strong(""),
            ]))
        );
        assert_eq!(parse("\"é\""), Ok(IfMatch::Tags(vec![strong("é")])));
    }

    #[test]
    fn malformed_headers_are_errors_not_panics() {
        for bad in [
            "",
            " ",
            ",",
            "v1",
            "\"v1",
            "\"v1\" \"v2\"",
            "W/v1",
            "w/\"v1\"",
            "\"a b\"",
            "**",
            "*, \"v1\"",
            "\"\u{7f}\"",
        ] {
            assert!(
                matches!(parse(bad), Err(IfMatchError::Malformed(_))),
                "{bad:?}: {:?}",
                parse(bad)
            );
        }
    }

    #[test]
    fn only_strong_lockkit_tags_name_versions() {
        let expected = |h: &str| expected_version::<i32>(Some(h));
        assert_eq!(expected("\"v7\""), Ok(Expected::Version(7)));
        assert_eq!(expected("\"v-3\""), Ok(Expected::Version(-3)));
        assert_eq!(expected("W/\"v7\""), Err(IfMatchError::NoMatch));
        assert_eq!(
            expected("\"7\", \"abc\", \"v\", \"v+1\", \"v1x\""),
            Err(IfMatchError::NoMatch)
        );
        assert_eq!(
            expected("\"v99999999999\""),
            Err(IfMatchError::NoMatch),
            "too big for i32"
        );
        assert_eq!(
            expected("\"v2\", W/\"v3\", \"v1\", \"v2\""),
            Ok(Expected::OneOf(vec![1, 2]))
        );
        assert_eq!(expected_version::<i16>(None), Err(IfMatchError::Missing));
        assert_eq!(expected("bad").unwrap_err().status(), 400);
        assert_eq!(IfMatchError::Missing.status(), 428);
        assert_eq!(IfMatchError::NoMatch.status(), 412);
    }

    #[test]
    fn a_conflict_names_no_table_key_or_stored_value() {
        let stale = crate::error::StaleColumnsError {
            table: "orders",
            key: "5".to_owned(),
            deleted: false,
            columns: vec![crate::error::ColumnValue {
                column: "state",
                expected: "\"pending\"".to_owned(),
                current: Some("\"shipped\"".to_owned()),
            }],
        };
        let columns = Error::StaleColumns(stale.clone());
        let fenced = Error::Fenced {
            resource: "orders/5".to_owned(),
            fence: 6,
            current: 7,
        };
        let aborted =
            Error::TransactionAborted(crate::error::Aborted::new(Error::StaleColumns(stale)));
        for error in [&columns, &fenced, &aborted] {
            let problem = Problem::from_error(error);
            assert_eq!((problem.status, problem.title), (409, "Conflict"));
            for secret in ["orders", "5", "state", "pending", "shipped", "6", "7"] {
                assert!(
                    !problem.detail.contains(secret),
                    "{secret:?} in the detail of {error}: {}",
                    problem.detail
                );
            }
        }
    }

    #[test]
    fn etags_round_trip() {
        for version in [0_i64, 1, -5, i64::MAX, i64::MIN] {
            let header = ETag::from_version(version).to_string();
            assert_eq!(
                expected_version::<i64>(Some(&header)),
                Ok(Expected::Version(version))
            );
        }
    }

    #[test]
    fn errors_map_to_statuses_and_problems() {
        let stale = Error::Stale(crate::error::StaleObjectError {
            table: "items",
            database_table: None,
            key: "1".into(),
            version_column: "lock_version",
            operation: crate::error::Operation::Update,
            expected_version: 3,
            current: CurrentState::Version(4),
            record: None,
        });
        let problem = Problem::from_error(&stale);
        assert_eq!(
            (problem.status, problem.title),
            (412, "Precondition Failed")
        );
        assert_eq!(problem.current_etag.as_deref(), Some("\"v4\""));
        assert_eq!(
            problem.detail,
            "the resource was changed by someone else after you read it (you sent \"v3\", it is now \"v4\"); \
             re-read it (GET) and apply your change to the current version"
        );
        assert!(
            !problem.detail.contains("items"),
            "no table names for clients"
        );
        assert_eq!("\"v4\"".parse::<ETag>(), Ok(ETag(4)));
        assert!("W/\"v4\"".parse::<ETag>().is_err());
        assert_eq!(status_for(&Error::NotFound), 404);
        assert_eq!(status_for(&Error::Deadlock), 503);
        // A deadlock that rolled back the caller's own transaction: the status
        // of the deadlock, which a retry of the whole request may get past.
        let aborted = Error::TransactionAborted(crate::error::Aborted::new(Error::Deadlock));
        assert_eq!(
            Problem::from_error(&aborted).retry_after,
            Some(RETRY_AFTER_SECONDS)
        );
        assert_eq!(status_for(&aborted), 503);
        assert_eq!(Problem::from_if_match(&IfMatchError::Missing).status, 428);
    }
}
