//! The shop's tables (`migrations/<backend>/` creates them).

/// Things for sale: the `items` table of lockkit's test suite, `id`, `name`,
/// `stock` and the optimistic-locking version `lock_version`.
pub use lockkit_tests::schema::items;

diesel::table! {
    /// One row per accepted purchase, or per line of an accepted basket.
    orders (id) {
        /// Primary key.
        id -> Integer,
        /// The item bought (no query joins it to `items`).
        item_id -> Integer,
        /// Units bought.
        qty -> Integer,
        /// The basket this line belongs to (`NULL` for a single-item purchase).
        basket_id -> Nullable<Integer>,
    }
}
