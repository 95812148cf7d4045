//! Conflicts over HTTP: ETags and `If-Match`, axum glue, idempotency keys.
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`etag`] | ETag / `If-Match` / `If-None-Match` parsing and the status of each lockkit error, framework-free; resource-bound, opaque ETags (its file `bound.rs`, feature `bound-etags`) |
//! | `axum` | extractors and responses for axum (feature `axum`) |
//! | `idempotency` | run a request's work at most once per client key (feature `idempotency`) |

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;
pub mod etag;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub mod idempotency;

/// `bytes` as lowercase hex digits (idempotency fingerprints, bound ETags).
#[cfg(any(feature = "bound-etags", feature = "idempotency"))]
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}
