//! Conflicts over HTTP: ETags and `If-Match`, axum glue, idempotency keys.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`etag`] | ETag / `If-Match` / `If-None-Match` parsing and the status of each lockkit error, framework-free |
//! | `bound_etag` | resource-bound, opaque ETags, re-exported by [`etag`] (feature `bound-etags`) |
//! | `axum` | extractors and responses for axum (feature `axum`) |
//! | `idempotency` | run a request's work at most once per client key (feature `idempotency`) |

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
#[cfg(feature = "bound-etags")]
mod bound_etag;
pub mod etag;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;
