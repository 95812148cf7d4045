//! axum glue for [`etag`] (feature `axum`).
//!
//! * [`IfMatchVersion<V>`]: an extractor that reads `If-Match` into the
//!   [`Expected`] version, or refuses the request with `428`, `400` or `412` and a
//!   `application/problem+json` body. `Option<IfMatchVersion<V>>` makes the header
//!   optional (a malformed one is still refused).
//! * [`IfMatchVersion::apply`]: runs a version-checked write for any `If-Match`
//!   (one tag, a list of tags, or `*`).
//! * [`HttpError`]: wraps a [`lockkit::Error`](crate::Error) as a response: the
//!   status of [`status_for`](etag::status_for), the [`Problem`] as
//!   `application/problem+json`, and an `ETag` header with the current version
//!   when the error knows it.
//! * [`ETag`] is a response part: return `(ETag::from_version(v), body)` to set the
//!   header on a success response. [`Problem`] and [`IfMatchError`] are responses.
//!
//! A `PUT` handler (Diesel is synchronous: in a real service run the database work
//! in `tokio::task::spawn_blocking` with a connection pool; a mutex keeps this
//! example short):
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
use http::header::{CONTENT_TYPE, ETAG, IF_MATCH};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::etag::{self, ETag, Expected, IfMatchError, Problem};
use crate::{Error, VersionNumber};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfMatchVersion<V>(pub Expected<V>);

impl<V: VersionNumber> IfMatchVersion<V> {
    /// Parses the `If-Match` field lines of `headers`, as the extractor does.
    ///
    /// # Errors
    ///
    /// * [`IfMatchError::Missing`] without the header (`428`).
    /// * [`IfMatchError::Malformed`] when a line is not UTF-8, or not `*` or a
    ///   list of entity tags (`400`).
    /// * [`IfMatchError::NoMatch`] when no strong lockkit tag in it fits `V` (`412`).
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, IfMatchError> {
        match if_match_value(headers)? {
            Some(value) => etag::expected_version(Some(&value)).map(IfMatchVersion),
            None => Err(IfMatchError::Missing),
        }
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
    ///
    /// # Errors
    ///
    /// As [`Expected::apply`].
    pub fn apply<C: ?Sized, T>(
        &self,
        conn: &mut C,
        current: impl FnMut(&mut C) -> Result<V, Error>,
        write: impl FnMut(&mut C, V) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.0.apply(conn, current, write)
    }
}

/// The `If-Match` field lines joined with `", "` (RFC 9110 §5.3), `None` without
/// any. A value that is not UTF-8 is malformed.
fn if_match_value(headers: &HeaderMap) -> Result<Option<String>, IfMatchError> {
    let mut joined: Option<String> = None;
    for line in headers.get_all(IF_MATCH) {
        let text = std::str::from_utf8(line.as_bytes())
            .map_err(|_| IfMatchError::Malformed("If-Match is not valid UTF-8"))?;
        match &mut joined {
            Some(joined) => {
                joined.push_str(", ");
                joined.push_str(text);
            }
            None => joined = Some(text.to_owned()),
        }
    }
    Ok(joined)
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
        match IfMatchVersion::from_headers(&parts.headers) {
            Ok(if_match) => Ok(Some(if_match)),
            Err(IfMatchError::Missing) => Ok(None),
            Err(other) => Err(other),
        }
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
    /// The problem's status, the problem as `application/problem+json`, and its
    /// `current_etag` as the `ETag` header.
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
pub struct HttpError(pub Error);

impl From<Error> for HttpError {
    fn from(error: Error) -> Self {
        HttpError(error)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        Problem::from_error(&self.0).into_response()
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
    use crate::etag::ANY_MATCH_ATTEMPTS;
    use crate::CurrentState;
    use crate::{Operation, StaleObjectError};

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
            key: "1".into(),
            version_column: "lock_version",
            operation: Operation::Update,
            expected_version: 3,
            current,
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
        assert!(
            matches!(extract(&[b"\"\xe9\""]), Err(IfMatchError::Malformed(_))),
            "not UTF-8"
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
            Some((version, _)) => Err(stale(CurrentState::Version(i64::from(*version)))),
            None => Err(stale(CurrentState::Deleted)),
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
    fn matches_follows_the_header() {
        assert!(IfMatchVersion(Expected::Any).matches(5));
        assert!(IfMatchVersion(Expected::Version(5)).matches(5));
        assert!(!IfMatchVersion(Expected::Version(4)).matches(5));
        assert!(IfMatchVersion(Expected::OneOf(vec![4, 5])).matches(5));
        assert!(!IfMatchVersion(Expected::OneOf(vec![3, 4])).matches(5));
    }
}
