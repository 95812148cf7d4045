//! Conflicts over HTTP: ETags and `If-Match`, axum glue, idempotency keys.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`etag`] | ETag / `If-Match` parsing and the status of each lockkit error, framework-free |
//! | `axum` | extractors and responses for axum (feature `axum`) |
//! | `idempotency` | run a request's work at most once per client key (feature `idempotency`) |

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
pub mod etag;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
