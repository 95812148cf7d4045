//! The test schema; the SQL is in `migrations/<backend>/`. The example programs
//! and the benchmark use its `items` table too (each creates it its own way).

diesel::table! {
    /// Things in stock; `lock_version` is the optimistic-locking version.
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
    gadgets (id) {
        id -> Integer,
        label -> Text,
        version -> SmallInt,
    }
}

diesel::table! {
    documents (id) {
        id -> BigInt,
        title -> Text,
        note -> Nullable<Text>,
        lock_version -> BigInt,
    }
}

diesel::table! {
    order_lines (order_id, line_no) {
        order_id -> Integer,
        line_no -> Integer,
        qty -> Integer,
        lock_version -> Integer,
    }
}

diesel::table! {
    jobs (id) {
        id -> Integer,
        payload -> Text,
        done -> Bool,
    }
}

diesel::table! {
    doctors (id) {
        id -> Integer,
        name -> Text,
        on_call -> Bool,
    }
}

diesel::table! {
    orders (id) {
        id -> Integer,
        item_id -> Nullable<Integer>,
        qty -> Integer,
    }
}

diesel::joinable!(orders -> items (item_id));
diesel::allow_tables_to_appear_in_same_query!(items, orders);

diesel::table! {
    /// Declared with a key the database does not enforce (no constraint).
    twins (id) {
        id -> Integer,
        label -> Text,
        lock_version -> Integer,
    }
}

diesel::table! {
    sku_codes (code) {
        code -> Text,
        stock -> Integer,
        lock_version -> Integer,
    }
}

diesel::table! {
    /// A model stamped by the database's clock (`#[lockkit(updated_at)]`);
    /// made by [`create_notes`](crate::create_notes), not by the migrations.
    notes (id) {
        id -> Integer,
        body -> Text,
        updated_at -> Nullable<Timestamp>,
        lock_version -> Integer,
    }
}

#[cfg(all(feature = "harness", feature = "postgres"))]
diesel::table! {
    /// A UUID key (PostgreSQL only: Diesel maps UUIDs on no other backend).
    tickets (id) {
        id -> Uuid,
        title -> Text,
        lock_version -> Integer,
    }
}
