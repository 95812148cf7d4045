//! The service's errors: at start-up, and per request (as problem+json responses).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lockkit::axum::HttpError;
use lockkit::etag::Problem;

/// Why the service could not start: a backend without its cargo feature, a
/// database that could not be reached or migrated, a pool that could not be built.
pub type SetupError = lockkit_tests::support::ProgramError;

/// Why a request failed. Every variant is a `application/problem+json` response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A lockkit error: `412` (stale, with the current `ETag`), `404`, `503`, ...
    /// as [`lockkit::etag::status_for`] says.
    #[error(transparent)]
    Lock(#[from] lockkit::Error),

    /// No pooled connection became free in time, or none could be opened: `503`.
    #[error("no database connection available: {0}")]
    Pool(#[from] diesel_async::pooled_connection::bb8::RunError),

    /// As [`Pool`](Self::Pool), for the blocking route's r2d2 pool: `503`.
    #[error("no database connection available: {0}")]
    BlockingPool(#[from] diesel::r2d2::PoolError),

    /// A sale of more than the stock: `409`, nothing written.
    #[error("only {stock} in stock, {wanted} wanted")]
    Insufficient {
        /// The stock, read under the row's lock.
        stock: i32,
        /// The quantity asked for.
        wanted: i32,
    },

    /// The request is well-formed but its content is not acceptable: `422`.
    #[error("{0}")]
    Invalid(String),

    /// axum refused the path or body (`400`, `415`, `422`, ...), with its reason.
    #[error("{detail}")]
    Rejected {
        /// axum's status for the rejection.
        status: StatusCode,
        /// axum's explanation.
        detail: String,
    },

    /// A bug or a crash: `500`. The body says nothing more; the cause is logged.
    #[error("{0}")]
    Internal(String),
}

impl From<diesel::result::Error> for ApiError {
    fn from(err: diesel::result::Error) -> Self {
        ApiError::Lock(err.into())
    }
}

/// So that lockkit's retrying calls (`retry`, `transaction_with_retry`) take
/// the handlers' error: they retry what its lockkit error says is retryable.
impl lockkit::RetryableError for ApiError {
    fn lockkit_error(&self) -> Option<&lockkit::Error> {
        match self {
            ApiError::Lock(error) => Some(error),
            _ => None,
        }
    }

    /// As lockkit's own error: `Error::RetriesExhausted` (`503`) with the last one.
    fn retries_exhausted(self, attempts: u32) -> Self {
        match self {
            ApiError::Lock(error) => ApiError::Lock(error.retries_exhausted(attempts)),
            other => other,
        }
    }
}

impl ApiError {
    /// The status of the response.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Lock(error) => StatusCode::from_u16(lockkit::etag::status_for(error))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            ApiError::Pool(_) | ApiError::BlockingPool(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Insufficient { .. } => StatusCode::CONFLICT,
            ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Rejected { status, .. } => *status,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            eprintln!("http_api: {status}: {self}");
        }
        let problem =
            |title: &'static str, detail: String| Problem::new(status.as_u16(), title, detail);
        match self {
            ApiError::Lock(error) => HttpError(error).into_response(),
            ApiError::Insufficient { .. } => problem("Conflict", self.to_string()).into_response(),
            ApiError::Pool(_) | ApiError::BlockingPool(_) => problem(
                "Service Unavailable",
                "no database connection became available; try again".to_owned(),
            )
            .into_response(),
            ApiError::Invalid(detail) => problem("Unprocessable Content", detail).into_response(),
            ApiError::Rejected { detail, .. } => {
                problem(status.canonical_reason().unwrap_or("Bad Request"), detail).into_response()
            }
            ApiError::Internal(_) => problem(
                "Internal Server Error",
                "the request could not be completed".to_owned(),
            )
            .into_response(),
        }
    }
}
