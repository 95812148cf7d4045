//! The service's table (`migrations/<backend>/` creates it).

/// Things in stock: the `items` table of lockkit's test suite. `lock_version` is
/// the optimistic-locking version, sent to clients as the `ETag`
/// `"v<lock_version>"`.
pub use lockkit_tests::schema::items;
