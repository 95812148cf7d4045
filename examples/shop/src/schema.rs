//! The shop's tables (`migrations/<backend>/` creates them).

diesel::table! {
    /// Things for sale; `lock_version` is the optimistic-locking version.
    items (id) {
        /// Primary key.
        id -> Integer,
        /// Display name.
        name -> Text,
        /// Units left.
        stock -> Integer,
        /// Bumped by every version-checked write.
        lock_version -> Integer,
    }
}

diesel::table! {
    /// One row per accepted purchase, or per line of an accepted basket.
    orders (id) {
        /// Primary key.
        id -> Integer,
        /// The item bought.
        item_id -> Integer,
        /// Units bought.
        qty -> Integer,
        /// The basket this line belongs to (`NULL` for a single-item purchase).
        basket_id -> Nullable<Integer>,
    }
}

diesel::joinable!(orders -> items (item_id));
diesel::allow_tables_to_appear_in_same_query!(items, orders);
