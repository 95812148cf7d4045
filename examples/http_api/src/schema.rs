//! The service's table (`migrations/<backend>/` creates it).

diesel::table! {
    /// Things in stock; `lock_version` is the optimistic-locking version, sent to
    /// clients as the `ETag` `"v<lock_version>"`.
    items (id) {
        /// Primary key.
        id -> Integer,
        /// Display name.
        name -> Text,
        /// Units in stock.
        stock -> Integer,
        /// Bumped by every version-checked write.
        lock_version -> Integer,
    }
}
