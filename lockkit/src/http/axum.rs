//! axum glue for [`etag`](crate::etag) (feature `axum`).
//!
//! * [`IfMatchVersion<V>`]: an extractor that reads `If-Match` into the
//!   [`Expected`] version, or refuses the request with `428`, `400` or `412` and a
//!   `application/problem+json` body. `Option<IfMatchVersion<V>>` makes the header
//!   optional (a malformed one is still refused).
//! * [`IfMatchVersion::apply`]: runs a version-checked write for any `If-Match`
//!   (one tag, a list of tags, or `*`).
//! * [`HttpError`]: wraps a [`lockkit::Error`](crate::Error) as a response: the
//!   status of [`status_for`](crate::etag::status_for), the [`Problem`] as
//!   `application/problem+json`, and an `ETag` header with the current version
//!   when the error knows it.
//! * [`ETag`] is a response part: return `(ETag::from_version(v), body)` to set the
//!   header on a success response. [`Problem`] and [`IfMatchError`] are responses;
//!   a `503` from contention carries `Retry-After`.
//! * [`BodyVersionError`]: as [`HttpError`] for a version that came in the request
//!   body: a stale write is `409 Conflict` with the current version.
//! * Bound ETags ([`ETagSecret`](crate::etag::ETagSecret)): [`IfMatchTags`] reads
//!   `If-Match` as it was sent, [`IfMatchTags::apply`] checks it against the
//!   resource's [`ResourceTags`] and writes; a [`BoundETag`] is a response part too.
//! * [`IfNoneMatch`]: `304 Not Modified` on a `GET` whose client copy is current.
//! * [`IdempotencyKey`]: the `Idempotency-Key` header (features `axum` and
//!   `idempotency`).
//!
//! A `PUT` handler on blocking Diesel (in a real service run the database work
//! in `tokio::task::spawn_blocking` with an r2d2 pool; a mutex keeps this
//! example short). On diesel-async (feature `async`) the extractors are the
//! same and the write is `lockkit::asynchronous`'s:
//! `examples/http_api` does both, with a bb8 pool.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use axum::extract::{Path, State};
//! use axum::routing::put;
//! use axum::Router;
//! use diesel::prelude::*;
//! use lockkit::axum::{HttpError, IfMatchVersion};
//! use lockkit::etag::ETag;
//! use lockkit::prelude::*;
//!
//! diesel::table! {
//!     items (id) { id -> Integer, name -> Text, stock -> Integer, lock_version -> Integer }
//! }
//!
//! #[derive(Queryable, Selectable, Identifiable, Versioned)]
//! #[diesel(table_name = items)]
//! pub struct Item { pub id: i32, pub name: String, pub stock: i32, pub lock_version: i32 }
//!
//! type Db = Arc<Mutex<SqliteConnection>>;
//!
//! /// `PUT /items/{id}/stock/{stock}` with `If-Match: "v<version>"`: `200` with the
//! /// new `ETag`, or `412` with the current one, `428`, `400`, `404`.
//! async fn set_stock(
//!     State(db): State<Db>,
//!     Path((id, stock)): Path<(i32, i32)>,
//!     if_match: IfMatchVersion<i32>,
//! ) -> Result<ETag, HttpError> {
//!     let mut conn = db.lock().expect("poisoned");
//!     let version = if_match.apply(
//!         &mut *conn,
//!         |conn| Ok(items::table.find(id).select(items::lock_version).first(conn)?),
//!         |conn, expected| Item::update_by_version(conn, id, expected, items::stock.eq(stock)),
//!     )?;
//!     Ok(ETag::from_version(version))
//! }
//!
//! let conn = SqliteConnection::establish(":memory:").unwrap();
//! let app: Router = Router::new()
//!     .route("/items/{id}/stock/{stock}", put(set_stock))
//!     .with_state(Arc::new(Mutex::new(conn)));
//! # drop(app);
//! ```
//!
//! The responses, without a server:
//!
//! ```
//! use axum::http::{header, StatusCode};
//! use axum::response::IntoResponse;
//! use lockkit::axum::HttpError;
//! use lockkit::etag::ETag;
//! use lockkit::{CurrentState, Error, Operation, StaleObjectError};
//!
//! let ok = (ETag::from_version(8_i32), "saved").into_response();
//! assert_eq!(ok.headers()[header::ETAG], "\"v8\"");
//!
//! let stale = Error::Stale(StaleObjectError::new(
//!     "items",
//!     "1",
//!     "lock_version",
//!     Operation::Update,
//!     7,
//!     CurrentState::Version(8),
//! ));
//! let refused = HttpError(stale).into_response();
//! assert_eq!(refused.status(), StatusCode::PRECONDITION_FAILED);
//! assert_eq!(refused.headers()[header::CONTENT_TYPE], "application/problem+json");
//! assert_eq!(refused.headers()[header::ETAG], "\"v8\"");
//! ```

use std::convert::Infallible;

use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use http::header::{HeaderName, CONTENT_TYPE, ETAG, IF_MATCH, IF_NONE_MATCH, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::error::Error;
use crate::http::etag::{
    BoundETag, ETag, Expected, IfMatch, IfMatchError, Problem, ResourceTags, VersionIn,
};
use crate::optimistic::version::VersionNumber;
use crate::retry::RetryableError;

/// The media type of [`Problem`] bodies (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `If-Match` header of a request, as the version(s) a write may go over.
///
/// Rejects the request with [`IfMatchError`] as a response: `428 Precondition
/// Required` without the header, `400 Bad Request` when it is not a list of entity
/// tags, `412 Precondition Failed` when no strong lockkit tag (`"v<n>"` that fits
/// `V`) is in it. Several `If-Match` field lines are combined, as RFC 9110 says.
///
/// `Option<IfMatchVersion<V>>` is `None` without the header and still rejects a
/// malformed or unmatchable one.
///
/// `V` is the model's version type (`i16`, `i32`, `i64`): a tag too large for it
/// names no version and can never match.
///
/// For resource-bound, opaque tags ([`ETagSecret`](crate::etag::ETagSecret)),
/// whose version the header cannot tell, extract [`IfMatchTags`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfMatchVersion<V>(pub Expected<V>);

impl<V: VersionNumber> IfMatchVersion<V> {
    /// Parses the `If-Match` field lines of `headers`, as the extractor does.
    ///
    /// # Errors
    ///
    /// * [`IfMatchError::Missing`] without the header (`428`).
    /// * [`IfMatchError::Malformed`] when the lines are not `*` or a
    ///   list of entity tags (`400`).
    /// * [`IfMatchError::NoMatch`] when no strong lockkit tag in it fits `V` (`412`).
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, IfMatchError> {
        IfMatchTags::from_headers(headers)?
            .0
            .expected()
            .map(IfMatchVersion)
    }
}

impl<V: VersionNumber> IfMatchVersion<V> {
    /// The expected version(s).
    pub fn expected(&self) -> &Expected<V> {
        &self.0
    }

    /// The version when the header named exactly one (`If-Match: "v7"`).
    pub fn version(&self) -> Option<V> {
        match &self.0 {
            Expected::Version(version) => Some(*version),
            Expected::Any | Expected::OneOf(_) => None,
        }
    }

    /// Whether a row at version `current` satisfies the header; see
    /// [`Expected::matches`].
    pub fn matches(&self, current: V) -> bool {
        self.0.matches(current)
    }

    /// Runs a version-checked write for this header; see [`Expected::apply`].
    /// The closures return your error type, as there.
    ///
    /// # Errors
    ///
    /// As [`Expected::apply`].
    pub fn apply<C: ?Sized, T, E>(
        &self,
        conn: &mut C,
        current: impl FnMut(&mut C) -> Result<V, E>,
        write: impl FnMut(&mut C, V) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: RetryableError,
    {
        self.0.apply(conn, current, write)
    }
}

/// The field lines of `name` joined with `", "` (RFC 9110 §5.3), `None` without
/// any. Bytes that are not UTF-8 (RFC 9110's obs-text, which an entity tag may
/// hold) are read as U+FFFD: inside a tag they make one that names no version,
/// outside one a malformed header.
fn joined_value(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    let mut joined: Option<String> = None;
    for line in headers.get_all(name) {
        let text = String::from_utf8_lossy(line.as_bytes());
        let text = text.as_ref();
        match &mut joined {
            Some(joined) => {
                joined.push_str(", ");
                joined.push_str(text);
            }
            None => joined = Some(text.to_owned()),
        }
    }
    joined
}

/// The `If-Match` header of a request as it was sent, for resources with bound
/// ETags ([`ETagSecret`](crate::etag::ETagSecret)), whose versions the header
/// cannot tell: [`apply`](IfMatchTags::apply) checks it against the resource.
///
/// Rejects the request without the header (`428`) or with one that is not `*` or
/// a list of entity tags (`400`), as [`IfMatchError`]. `Option<IfMatchTags>` is
/// `None` without the header and still rejects a malformed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfMatchTags(pub IfMatch);

impl IfMatchTags {
    /// Parses the `If-Match` field lines of `headers`, as the extractor does.
    ///
    /// # Errors
    ///
    /// * [`IfMatchError::Missing`] without the header (`428`).
    /// * [`IfMatchError::Malformed`] when the lines are not `*` or a
    ///   list of entity tags (`400`).
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, IfMatchError> {
        match joined_value(headers, IF_MATCH) {
            Some(value) => value.parse().map(IfMatchTags),
            None => Err(IfMatchError::Missing),
        }
    }

    /// Runs a version-checked write on a resource with bound ETags: reads its
    /// version with `current`, checks the header against it
    /// ([`ResourceTags::expected`]), then writes as [`Expected::apply`] does
    /// (`write` must write only if the row is still at the version it is given).
    ///
    /// # Errors
    ///
    /// A [`Problem`] for the response, with the resource's current bound tag when
    /// known ([`ResourceTags::problem`]): `412` when no tag in the header is the
    /// resource's current one (an old copy, another resource's tag, a forged or
    /// altered one) or the row changed in between, `404` when it does not exist,
    /// and the status of any other lockkit error of `current` or `write` (under
    /// `If-Match: *`, see [`Expected::apply`] for what the last of its attempts
    /// returns). The closures may return your error type: one that carries no
    /// lockkit error ([`RetryableError::lockkit_error`]) becomes the problem
    /// your `Into<Problem>` makes of it.
    // The error is the response a refused request gets, built once per request.
    #[allow(clippy::result_large_err)]
    pub fn apply<C: ?Sized, V: VersionNumber, T, E>(
        &self,
        tags: &ResourceTags,
        conn: &mut C,
        mut current: impl FnMut(&mut C) -> Result<V, E>,
        write: impl FnMut(&mut C, V) -> Result<T, E>,
    ) -> Result<T, Problem>
    where
        E: RetryableError + Into<Problem>,
    {
        let problem = |error: E| match error.lockkit_error() {
            Some(lockkit) => tags.problem(lockkit),
            None => error.into(),
        };
        let now = current(conn).map_err(problem)?;
        let expected = tags
            .expected(&self.0, now)
            .map_err(|error| tags.if_match_problem(&error, now))?;
        expected.apply(conn, current, write).map_err(problem)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfMatchTags {
    type Rejection = IfMatchError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, IfMatchError> {
        IfMatchTags::from_headers(&parts.headers)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for IfMatchTags {
    type Rejection = IfMatchError;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, IfMatchError> {
        optional_if_match(IfMatchTags::from_headers(&parts.headers))
    }
}

/// The `If-None-Match` header of a `GET` (RFC 9110 §13.1.2): answer `304 Not
/// Modified` when it holds the current tag. Never rejects: a missing, non-UTF-8
/// or malformed header is `IfNoneMatch(None)`, which matches nothing (a full
/// `200`).
///
/// ```
/// use axum::http::StatusCode;
/// use axum::response::{IntoResponse, Response};
/// use lockkit::axum::IfNoneMatch;
/// use lockkit::etag::ETag;
///
/// async fn get_item(if_none_match: IfNoneMatch) -> Response {
///     let current = ETag::from_version(7_i32); // the row's version, read from the database
///     if if_none_match.not_modified(current) {
///         return (StatusCode::NOT_MODIFIED, current).into_response();
///     }
///     (current, "the item").into_response()
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IfNoneMatch(pub Option<IfMatch>);

impl IfNoneMatch {
    /// Reads the `If-None-Match` field lines of `headers`, as the extractor does.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let value = joined_value(headers, IF_NONE_MATCH);
        IfNoneMatch(value.and_then(|value| value.parse().ok()))
    }

    /// Whether the client's copy has the current plain tag (weak comparison).
    pub fn not_modified(&self, current: ETag) -> bool {
        self.0
            .as_ref()
            .is_some_and(|header| header.contains_weakly(&current.opaque()))
    }

    /// Whether the client's copy is the resource at version `current`, for bound
    /// tags (weak comparison).
    pub fn not_modified_bound<V: VersionNumber>(&self, tags: &ResourceTags, current: V) -> bool {
        self.0
            .as_ref()
            .is_some_and(|header| tags.not_modified(header, current))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IfNoneMatch {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(IfNoneMatch::from_headers(&parts.headers))
    }
}

/// The `Idempotency-Key` header of a request (features `axum` and `idempotency`),
/// read by [`key_from_header`](crate::idempotency::key_from_header): a quoted
/// string or a bare token, 1 to 255 visible ASCII characters. Pass it to
/// [`Idempotency::run`](crate::idempotency::Idempotency::run) with the principal the
/// request authenticated as.
///
/// Rejects the request with `400` ([`HttpError`] of [`Error::InvalidInput`]) when
/// the header is missing, repeated or malformed. `Option<IdempotencyKey>` is `None`
/// without the header and still rejects a malformed one.
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub String);

#[cfg(feature = "idempotency")]
impl IdempotencyKey {
    /// The header's name.
    pub const HEADER: &'static str = "idempotency-key";

    /// Reads the `Idempotency-Key` header of `headers`, as the extractor does;
    /// `Ok(None)` without it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when the header is repeated or malformed.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, Error> {
        let mut lines = headers.get_all(Self::HEADER).iter();
        let Some(line) = lines.next() else {
            return Ok(None);
        };
        if lines.next().is_some() {
            return Err(Error::InvalidInput(
                "send one Idempotency-Key header, not several",
            ));
        }
        crate::http::idempotency::key_from_header(line.as_bytes())
            .map(|key| Some(IdempotencyKey(key)))
    }
}

#[cfg(feature = "idempotency")]
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        IdempotencyKey::from_headers(&parts.headers)?.ok_or(HttpError(Error::InvalidInput(
            "this request requires an Idempotency-Key header",
        )))
    }
}

#[cfg(feature = "idempotency")]
impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, HttpError> {
        Ok(IdempotencyKey::from_headers(&parts.headers)?)
    }
}

impl<S, V> FromRequestParts<S> for IfMatchVersion<V>
where
    S: Send + Sync,
    V: VersionNumber,
{
    type Rejection = IfMatchError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, IfMatchError> {
        IfMatchVersion::from_headers(&parts.headers)
    }
}

impl<S, V> OptionalFromRequestParts<S> for IfMatchVersion<V>
where
    S: Send + Sync,
    V: VersionNumber,
{
    type Rejection = IfMatchError;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, IfMatchError> {
        optional_if_match(IfMatchVersion::from_headers(&parts.headers))
    }
}

/// What an optional `If-Match` extractor makes of the header read as
/// required: no header is `None`; a header that does not read still rejects
/// the request.
fn optional_if_match<T>(required: Result<T, IfMatchError>) -> Result<Option<T>, IfMatchError> {
    match required {
        Ok(if_match) => Ok(Some(if_match)),
        Err(IfMatchError::Missing) => Ok(None),
        Err(other) => Err(other),
    }
}

impl IntoResponse for IfMatchError {
    /// `428`, `400` or `412` with [`Problem::from_if_match`] as
    /// `application/problem+json`.
    fn into_response(self) -> Response {
        Problem::from_if_match(&self).into_response()
    }
}

impl IntoResponse for Problem {
    /// The problem's status, the problem as `application/problem+json`, its
    /// `current_etag` as the `ETag` header and its `retry_after` as `Retry-After`.
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let etag = self
            .current_etag
            .as_deref()
            .and_then(|tag| HeaderValue::from_str(tag).ok());
        let body = match serde_json::to_vec(&self) {
            Ok(body) => body,
            // A `Problem` is strings and numbers; this cannot fail.
            Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        };
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(etag) = etag {
            headers.insert(ETAG, etag);
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A [`lockkit::Error`](crate::Error) as a response: the status of [`status_for`],
/// [`Problem::from_error`] as `application/problem+json`, and for a stale write the
/// row's current `ETag`, so the client knows its copy is old. `?` converts.
///
/// The body of a `500` says nothing about the cause; log the error yourself if you
/// need it (`HttpError.0`).
///
/// [`status_for`]: crate::etag::status_for
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct HttpError(#[from] pub Error);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        Problem::from_error(&self.0).into_response()
    }
}

/// A [`lockkit::Error`](crate::Error) as a response, for a handler that took the
/// version from the request body rather than `If-Match`: as [`HttpError`], but a
/// stale write is `409 Conflict` with the row's current version in the problem's
/// `current_version` ([`VersionIn::Body`]). `?` converts.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BodyVersionError(#[from] pub Error);

impl IntoResponse for BodyVersionError {
    fn into_response(self) -> Response {
        Problem::from_error_in(&self.0, VersionIn::Body).into_response()
    }
}

impl IntoResponseParts for BoundETag {
    type Error = Infallible;

    /// Sets the `ETag` header: `(tags.etag(v), Json(row))`.
    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Infallible> {
        // Quotes around 32 hex digits: always a valid header value.
        if let Ok(value) = HeaderValue::try_from(self.to_string()) {
            res.headers_mut().insert(ETAG, value);
        }
        Ok(res)
    }
}

impl IntoResponse for BoundETag {
    /// `200 OK` with the `ETag` header and no body.
    fn into_response(self) -> Response {
        (self, ()).into_response()
    }
}

impl IntoResponseParts for ETag {
    type Error = Infallible;

    /// Sets the `ETag` header: `(ETag::from_version(v), Json(row))`.
    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Infallible> {
        res.headers_mut().insert(ETAG, etag_value(self));
        Ok(res)
    }
}

impl IntoResponse for ETag {
    /// `200 OK` with the `ETag` header and no body.
    fn into_response(self) -> Response {
        (self, ()).into_response()
    }
}

/// The `ETag` header value of a tag: `"v7"`.
pub fn etag_value(tag: ETag) -> HeaderValue {
    // `"v` + an optional `-` + digits + `"`: always a valid header value.
    HeaderValue::try_from(tag.to_string()).expect("an ETag is visible ASCII")
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use http::Request;

    use super::*;
    use crate::error::CurrentState;
    use crate::error::{Operation, StaleObjectError};
    use crate::http::etag::{self, ANY_MATCH_ATTEMPTS};

    /// Polls a future that needs no I/O to completion (extractors, full bodies).
    fn ready<F: Future>(future: F) -> F::Output {
        let mut cx = Context::from_waker(Waker::noop());
        match pin!(future).poll(&mut cx) {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("the future is not ready"),
        }
    }

    fn parts(if_match: &[&[u8]]) -> Parts {
        let mut request = Request::builder().method("PUT").uri("/items/1");
        for value in if_match {
            request = request.header(IF_MATCH, HeaderValue::from_bytes(value).unwrap());
        }
        request.body(()).unwrap().into_parts().0
    }

    fn extract(if_match: &[&[u8]]) -> Result<IfMatchVersion<i32>, IfMatchError> {
        ready(
            <IfMatchVersion<i32> as FromRequestParts<()>>::from_request_parts(
                &mut parts(if_match),
                &(),
            ),
        )
    }

    fn extract_optional(if_match: &[&[u8]]) -> Result<Option<IfMatchVersion<i32>>, IfMatchError> {
        ready(
            <Option<IfMatchVersion<i32>> as FromRequestParts<()>>::from_request_parts(
                &mut parts(if_match),
                &(),
            ),
        )
    }

    /// Status, content type, `ETag` header and JSON body of a response.
    fn inspect(response: Response) -> (u16, String, Option<String>, serde_json::Value) {
        let status = response.status().as_u16();
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v: &HeaderValue| v.to_str().unwrap().to_owned())
        };
        let content_type = header(CONTENT_TYPE).unwrap_or_default();
        let etag = header(ETAG);
        let bytes = ready(axum::body::to_bytes(response.into_body(), usize::MAX)).unwrap();
        let body = if content_type.contains("json") {
            serde_json::from_slice(&bytes).unwrap()
        } else {
            serde_json::Value::String(String::from_utf8(bytes.to_vec()).unwrap())
        };
        (status, content_type, etag, body)
    }

    fn stale(current: CurrentState) -> Error {
        Error::Stale(StaleObjectError {
            table: "items",
            database_table: None,
            key: "1".into(),
            version_column: "lock_version",
            operation: Operation::Update,
            expected_version: 3,
            current,
            record: None,
        })
    }

    #[test]
    fn the_extractor_reads_versions() {
        assert_eq!(
            extract(&[b"\"v3\""]),
            Ok(IfMatchVersion(Expected::Version(3)))
        );
        assert_eq!(extract(&[b"*"]), Ok(IfMatchVersion(Expected::Any)));
        assert_eq!(
            extract(&[b"\"v1\"", b"W/\"v9\", \"v2\""]),
            Ok(IfMatchVersion(Expected::OneOf(vec![1, 2]))),
            "field lines are combined"
        );
        assert_eq!(extract(&[b"\"v3\""]).unwrap().version(), Some(3));
        assert_eq!(extract(&[b"*"]).unwrap().version(), None);
    }

    #[test]
    fn the_extractor_rejects_with_the_right_status() {
        assert_eq!(extract(&[]), Err(IfMatchError::Missing));
        assert!(matches!(extract(&[b"v3"]), Err(IfMatchError::Malformed(_))));
        assert_eq!(
            extract(&[b"\"\xe9\""]),
            Err(IfMatchError::NoMatch),
            "obs-text in a tag: a valid tag that names no version"
        );
        assert!(
            matches!(extract(&[b"\xe9"]), Err(IfMatchError::Malformed(_))),
            "obs-text outside a tag"
        );
        assert!(matches!(
            extract(&[b"*", b"\"v1\""]),
            Err(IfMatchError::Malformed(_))
        ));
        assert_eq!(extract(&[b"W/\"v3\""]), Err(IfMatchError::NoMatch));
        assert_eq!(
            extract(&[b"\"v99999999999\""]),
            Err(IfMatchError::NoMatch),
            "too big for i32"
        );

        for (header, status, title) in [
            (&[][..], 428, "Precondition Required"),
            (&[&b"v3"[..]][..], 400, "Bad Request"),
            (&[&b"W/\"v3\""[..]][..], 412, "Precondition Failed"),
        ] {
            let (got, content_type, etag, body) =
                inspect(extract(header).unwrap_err().into_response());
            assert_eq!(got, status, "{header:?}");
            assert_eq!(content_type, PROBLEM_JSON);
            assert_eq!(etag, None);
            assert_eq!(body["status"], status);
            assert_eq!(body["title"], title);
            assert!(
                body["detail"].as_str().is_some_and(|d| !d.is_empty()),
                "{body}"
            );
            assert!(body.get("current_etag").is_none(), "{body}");
        }
    }

    #[test]
    fn the_optional_extractor_allows_only_a_missing_header() {
        assert_eq!(extract_optional(&[]), Ok(None));
        assert_eq!(
            extract_optional(&[b"\"v0\""]),
            Ok(Some(IfMatchVersion(Expected::Version(0))))
        );
        assert!(matches!(
            extract_optional(&[b"\"v0"]),
            Err(IfMatchError::Malformed(_))
        ));
        assert_eq!(extract_optional(&[b"W/\"v0\""]), Err(IfMatchError::NoMatch));

        // The same for the tags of bound ETags.
        let tags = |if_match: &[&[u8]]| {
            ready(
                <Option<IfMatchTags> as FromRequestParts<()>>::from_request_parts(
                    &mut parts(if_match),
                    &(),
                ),
            )
        };
        assert_eq!(tags(&[]), Ok(None));
        assert!(matches!(tags(&[b"\"v0\""]), Ok(Some(_))));
        assert!(matches!(tags(&[b"\"v0"]), Err(IfMatchError::Malformed(_))));
    }

    #[test]
    fn http_errors_carry_status_problem_and_current_etag() {
        let (status, content_type, etag, body) =
            inspect(HttpError(stale(CurrentState::Version(4))).into_response());
        assert_eq!((status, content_type.as_str()), (412, PROBLEM_JSON));
        assert_eq!(etag.as_deref(), Some("\"v4\""));
        assert_eq!(body["current_etag"], "\"v4\"");
        assert_eq!(body["title"], "Precondition Failed");

        let (status, _, etag, body) =
            inspect(HttpError(stale(CurrentState::Deleted)).into_response());
        assert_eq!((status, etag), (404, None));
        assert_eq!(body["title"], "Not Found");

        for (error, status) in [
            (Error::NotFound, 404),
            (Error::Deadlock, 503),
            (Error::NoRowMatched, 409),
        ] {
            let (got, content_type, etag, body) = inspect(HttpError::from(error).into_response());
            assert_eq!(
                (got, content_type.as_str(), etag),
                (status, PROBLEM_JSON, None)
            );
            assert_eq!(body["status"], status);
        }
    }

    #[test]
    fn etags_are_response_parts() {
        let (status, _, etag, body) = inspect((ETag::from_version(7_i64), "body").into_response());
        assert_eq!(
            (status, etag.as_deref(), body.as_str()),
            (200, Some("\"v7\""), Some("body"))
        );
        let (status, _, etag, _) =
            inspect((StatusCode::CREATED, ETag::from_version(-2_i16), "x").into_response());
        assert_eq!((status, etag.as_deref()), (201, Some("\"v-2\"")));
        let (status, _, etag, _) = inspect(ETag::from_version(0_i32).into_response());
        assert_eq!((status, etag.as_deref()), (200, Some("\"v0\"")));
    }

    /// A row in memory: `(version, value)`, `None` when deleted.
    type Row = Option<(i32, &'static str)>;

    fn current(row: &mut Row) -> Result<i32, Error> {
        row.map(|(version, _)| version).ok_or(Error::NotFound)
    }

    fn write(row: &mut Row, expected: i32) -> Result<i32, Error> {
        match row {
            Some((version, value)) if *version == expected => {
                *version += 1;
                *value = "written";
                Ok(*version)
            }
            Some((version, _)) => Err(stale_from(
                expected,
                CurrentState::Version(i64::from(*version)),
            )),
            None => Err(stale_from(expected, CurrentState::Deleted)),
        }
    }

    /// The stale report of a write that expected `expected`.
    fn stale_from(expected: i32, current: CurrentState) -> Error {
        match stale(current) {
            Error::Stale(report) => Error::Stale(StaleObjectError {
                expected_version: i64::from(expected),
                ..report
            }),
            other => other,
        }
    }

    #[test]
    fn apply_handles_every_kind_of_if_match() {
        let apply = |expected: Expected<i32>, mut row: Row| {
            let result = IfMatchVersion(expected).apply(&mut row, current, write);
            (result.map_err(|e| etag::status_for(&e)), row)
        };
        assert_eq!(
            apply(Expected::Version(3), Some((3, "a"))),
            (Ok(4), Some((4, "written")))
        );
        assert_eq!(
            apply(Expected::Version(2), Some((3, "a"))),
            (Err(412), Some((3, "a")))
        );
        assert_eq!(
            apply(Expected::OneOf(vec![1, 3]), Some((3, "a"))),
            (Ok(4), Some((4, "written")))
        );
        assert_eq!(
            apply(Expected::OneOf(vec![1, 2]), Some((3, "a"))),
            (Err(412), Some((3, "a")))
        );
        assert_eq!(
            apply(Expected::Any, Some((9, "a"))),
            (Ok(10), Some((10, "written")))
        );
        assert_eq!(apply(Expected::Any, None), (Err(404), None));
        assert_eq!(apply(Expected::Version(0), None), (Err(404), None));

        // `*` while others keep writing: re-read and retry, then give up.
        let mut row: Row = Some((0, "a"));
        let mut reads = 0;
        let result = IfMatchVersion::<i32>(Expected::Any).apply(
            &mut row,
            |row| {
                reads += 1;
                current(row)
            },
            |row, expected| {
                if let Some((version, _)) = row {
                    *version += 1; // someone else wrote first
                }
                write(row, expected)
            },
        );
        let error = result.unwrap_err();
        assert!(
            matches!(
                error,
                Error::RetriesExhausted {
                    attempts: ANY_MATCH_ATTEMPTS,
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(reads, ANY_MATCH_ATTEMPTS);
        assert_eq!(etag::status_for(&error), 503);
    }

    #[test]
    fn contention_is_503_with_retry_after_and_nothing_else_is() {
        for error in [
            Error::Busy,
            Error::Deadlock,
            Error::SerializationFailure,
            Error::LockTimeout,
        ] {
            let response = HttpError(error).into_response();
            assert_eq!(response.status(), 503);
            assert_eq!(response.headers()[RETRY_AFTER], "1");
        }
        for error in [
            stale(CurrentState::Version(4)),
            Error::NotFound,
            Error::NoRowMatched,
        ] {
            let response = HttpError(error).into_response();
            assert!(
                response.headers().get(RETRY_AFTER).is_none(),
                "{response:?}"
            );
        }
    }

    #[test]
    fn a_version_from_the_body_is_a_409_with_the_current_version() {
        let (status, content_type, etag, body) =
            inspect(BodyVersionError(stale(CurrentState::Version(4))).into_response());
        assert_eq!(
            (status, content_type.as_str(), etag),
            (409, PROBLEM_JSON, None)
        );
        assert_eq!(body["title"], "Conflict");
        assert_eq!(body["current_version"], 4);
        assert!(
            body["detail"].as_str().unwrap().contains("version 3"),
            "{body}"
        );
        assert_eq!(
            etag::status_for_version_in(&stale(CurrentState::Version(4)), VersionIn::Body),
            409
        );
        // Everything else as with If-Match.
        let (status, ..) = inspect(BodyVersionError(stale(CurrentState::Deleted)).into_response());
        assert_eq!(status, 404);
        let (status, ..) = inspect(BodyVersionError(Error::Deadlock).into_response());
        assert_eq!(status, 503);
    }

    #[test]
    fn problems_carry_type_and_instance() {
        let problem = Problem::from_error(&Error::NotFound)
            .with_type("https://example.com/problems/not-found")
            .with_instance("/items/9");
        let (_, _, _, body) = inspect(problem.into_response());
        assert_eq!(
            body,
            serde_json::json!({
                "type": "https://example.com/problems/not-found",
                "title": "Not Found",
                "status": 404,
                "detail": "the resource does not exist",
                "instance": "/items/9",
            })
        );
        let (_, _, _, body) = inspect(Problem::from_error(&Error::NotFound).into_response());
        assert!(
            body.get("type").is_none() && body.get("instance").is_none(),
            "{body}"
        );
    }

    fn secret() -> crate::http::etag::ETagSecret {
        crate::http::etag::ETagSecret::new(b"0123456789abcdef0123456789abcdef").unwrap()
    }

    fn with_headers(name: HeaderName, values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(name.clone(), HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn bound_tags_write_only_their_own_resource_at_its_version() {
        let item_1 = secret().resource("items", 1);
        let item_2 = secret().resource("items", 2);
        let apply = |tags: &ResourceTags, header: &str, mut row: Row| {
            let if_match = IfMatchTags::from_headers(&with_headers(IF_MATCH, &[header.as_bytes()]))
                .map_err(|e| e.status());
            let result = if_match.and_then(|h| {
                h.apply(tags, &mut row, current, write)
                    .map_err(|problem| problem.status)
            });
            (result, row)
        };
        let tag = item_1.etag(3_i32).to_string();
        assert_eq!(
            apply(&item_1, &tag, Some((3, "a"))),
            (Ok(4), Some((4, "written")))
        );
        // Item 2 at the same version: item 1's tag does not fit it.
        assert_eq!(
            apply(&item_2, &tag, Some((3, "a"))),
            (Err(412), Some((3, "a")))
        );
        // An old copy; a forged one; the plain form; weak.
        assert_eq!(
            apply(&item_1, &tag, Some((4, "a"))),
            (Err(412), Some((4, "a")))
        );
        let forged = format!("\"{}\"", "0".repeat(32));
        assert_eq!(
            apply(&item_1, &forged, Some((3, "a"))),
            (Err(412), Some((3, "a")))
        );
        assert_eq!(
            apply(&item_1, "\"v3\"", Some((3, "a"))),
            (Err(412), Some((3, "a")))
        );
        assert_eq!(
            apply(&item_1, &format!("W/{tag}"), Some((3, "a"))),
            (Err(412), Some((3, "a")))
        );
        assert_eq!(
            apply(&item_1, "*", Some((9, "a"))),
            (Ok(10), Some((10, "written")))
        );
        assert_eq!(apply(&item_1, &tag, None), (Err(404), None));
        assert_eq!(
            apply(&item_1, "bad", Some((3, "a"))),
            (Err(400), Some((3, "a")))
        );
        assert_eq!(
            IfMatchTags::from_headers(&HeaderMap::new()),
            Err(IfMatchError::Missing)
        );

        // The refusal names the current tag, bound, and no version.
        let mut row: Row = Some((5, "a"));
        let refused = IfMatchTags(tag.parse().unwrap())
            .apply(&item_1, &mut row, current, write)
            .unwrap_err();
        let (status, _, etag, body) = inspect(refused.into_response());
        assert_eq!(status, 412);
        assert_eq!(etag.as_deref(), Some(&*item_1.etag(5_i32).to_string()));
        assert_eq!(body["current_etag"], item_1.etag(5_i32).to_string());
        let detail = body["detail"].as_str().unwrap();
        assert!(!detail.contains('5') && !detail.contains("v3"), "{detail}");
        let problem = item_1.problem(&stale(CurrentState::Version(6)));
        assert_eq!(problem.current_etag, Some(item_1.etag(6_i32).to_string()));
        assert!(
            !problem.detail.contains('6') && !problem.detail.contains('3'),
            "{}",
            problem.detail
        );

        let (status, _, etag, _) = inspect((item_1.etag(8_i64), "x").into_response());
        assert_eq!((status, etag), (200, Some(item_1.etag(8_i32).to_string())));
    }

    #[test]
    fn if_none_match_answers_not_modified() {
        let get =
            |values: &[&[u8]]| IfNoneMatch::from_headers(&with_headers(IF_NONE_MATCH, values));
        assert!(get(&[b"\"v7\""]).not_modified(ETag::from_version(7_i32)));
        assert!(get(&[b"\"v1\"", b"W/\"v7\""]).not_modified(ETag::from_version(7_i32)));
        assert!(get(&[b"*"]).not_modified(ETag::from_version(7_i32)));
        assert!(!get(&[b"\"v6\""]).not_modified(ETag::from_version(7_i32)));
        assert!(!get(&[]).not_modified(ETag::from_version(7_i32)));
        assert_eq!(get(&[b"v7"]), IfNoneMatch(None), "malformed: ignored");
        assert!(
            !get(&[b"\"\xe9\""]).not_modified(ETag::from_version(7_i32)),
            "obs-text in a tag: names no version"
        );
        let tags = secret().resource("items", 1);
        let sent = get(&[tags.etag(7_i32).to_string().as_bytes()]);
        assert!(sent.not_modified_bound(&tags, 7_i32));
        assert!(!sent.not_modified_bound(&tags, 8_i32));
        assert!(!sent.not_modified_bound(&secret().resource("items", 2), 7_i32));
        let extracted = ready(<IfNoneMatch as FromRequestParts<()>>::from_request_parts(
            &mut parts(&[]),
            &(),
        ));
        assert_eq!(extracted, Ok(IfNoneMatch(None)));
    }

    #[cfg(feature = "idempotency")]
    #[test]
    fn the_idempotency_key_extractor() {
        let read = |values: &[&[u8]]| {
            let mut request = Request::builder().method("POST").uri("/orders");
            for value in values {
                request = request.header(
                    IdempotencyKey::HEADER,
                    HeaderValue::from_bytes(value).unwrap(),
                );
            }
            let mut parts = request.body(()).unwrap().into_parts().0;
            ready(<IdempotencyKey as FromRequestParts<()>>::from_request_parts(&mut parts, &()))
        };
        assert_eq!(
            read(&[b"\"order-42\""]).unwrap(),
            IdempotencyKey("order-42".into())
        );
        assert_eq!(
            read(&[b"order-42"]).unwrap(),
            IdempotencyKey("order-42".into())
        );
        for bad in [
            &[][..],
            &[&b""[..]],
            &[b"a", b"b"],
            &[b"\"open"],
            &[b"two words"],
            &[b"\"\xe9\""],
        ] {
            let refused = read(bad).unwrap_err();
            let (status, content_type, _, body) = inspect(refused.into_response());
            assert_eq!(
                (status, content_type.as_str()),
                (400, PROBLEM_JSON),
                "{bad:?}"
            );
            assert_eq!(body["title"], "Bad Request");
        }
        let long = "k".repeat(crate::http::idempotency::MAX_LEN + 1);
        assert!(read(&[long.as_bytes()]).is_err());
    }

    #[test]
    fn matches_follows_the_header() {
        assert!(IfMatchVersion(Expected::Any).matches(5));
        assert!(IfMatchVersion(Expected::Version(5)).matches(5));
        assert!(!IfMatchVersion(Expected::Version(4)).matches(5));
        assert!(IfMatchVersion(Expected::OneOf(vec![4, 5])).matches(5));
        assert!(!IfMatchVersion(Expected::OneOf(vec![3, 4])).matches(5));
    }
}
