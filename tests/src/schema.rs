//! The test schema: the tables as Diesel sees them, and [`create_tables`], the
//! SQL that creates them on each server, written once. The example programs and
//! the benchmark use its `items` table too (each creates it its own way).

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

/// Tables of another schema, named with it in their `table!` (as
/// `diesel print-schema --schema lockkit_archive` writes them); made by
/// [`create_archive`](crate::create_archive), not by the migrations.
pub mod archive {
    diesel::table! {
        /// An `items` beside the connection's own, in the schema
        /// `lockkit_archive` (on MySQL/MariaDB a database, on SQLite an attached
        /// one), declared with a key the database does not enforce there.
        lockkit_archive.items (id) {
            id -> Integer,
            name -> Text,
            stock -> Integer,
            lock_version -> Integer,
        }
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
    /// lockkit's idempotency table (its shipped migration creates it), to
    /// read back and to stage rows in.
    lockkit_idempotency_keys (principal, idempotency_key) {
        principal -> Text,
        idempotency_key -> Text,
        fingerprint -> Text,
        state -> Text,
        response -> Nullable<Text>,
        started_at -> BigInt,
        finished_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// The one row fenced writers write in the lease tests: a body, a counter
    /// and the fence of its last write; made by
    /// [`create_docs`](crate::create_docs), not by the migrations.
    docs (id) {
        id -> Integer,
        body -> Text,
        counter -> Integer,
        last_fence -> BigInt,
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

/// `CREATE TABLE` for every table above except `notes`, in `dialect`: what a
/// [`TestDb`](crate::TestDb) runs on its fresh database. Written once; the
/// servers differ in three words (MySQL cannot key or index a `TEXT` column),
/// and `tickets` is PostgreSQL's alone.
pub fn create_tables(dialect: lockkit::version_trigger::Dialect) -> String {
    use lockkit::version_trigger::Dialect;
    let (text, serial, end) = match dialect {
        Dialect::Postgres => ("TEXT", "SERIAL PRIMARY KEY", ")"),
        Dialect::Mysql => (
            "VARCHAR(255)",
            "INTEGER PRIMARY KEY AUTO_INCREMENT",
            ") ENGINE = InnoDB",
        ),
        // SQLite (`Dialect` is non-exhaustive).
        _ => ("TEXT", "INTEGER PRIMARY KEY AUTOINCREMENT", ")"),
    };
    let mut sql = format!(
        r#"CREATE TABLE items (
    id {serial},
    name {text} NOT NULL,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
{end};
CREATE TABLE gadgets (
    id INTEGER PRIMARY KEY,
    label {text} NOT NULL,
    version SMALLINT NOT NULL DEFAULT 0
{end};
CREATE TABLE documents (
    id BIGINT PRIMARY KEY,
    title {text} NOT NULL,
    note TEXT,
    lock_version BIGINT NOT NULL DEFAULT 0
{end};
CREATE TABLE order_lines (
    order_id INTEGER NOT NULL,
    line_no INTEGER NOT NULL,
    qty INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (order_id, line_no)
{end};
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    payload {text} NOT NULL,
    done BOOLEAN NOT NULL DEFAULT FALSE
{end};
CREATE TABLE doctors (
    id INTEGER PRIMARY KEY,
    name {text} NOT NULL,
    on_call BOOLEAN NOT NULL
{end};
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    item_id INTEGER REFERENCES items (id),
    qty INTEGER NOT NULL
{end};
-- A table whose declared key is not unique in the database (no constraint).
CREATE TABLE twins (
    id INTEGER NOT NULL,
    label {text} NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
{end};
-- A string key (on MySQL under the server's default, case-insensitive, collation).
CREATE TABLE sku_codes (
    code VARCHAR(64) PRIMARY KEY,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
{end};
"#
    );
    if dialect == Dialect::Postgres {
        sql.push_str(
            r#"-- A UUID key, for `lock_all` with the `uuid` feature.
CREATE TABLE tickets (
    id UUID PRIMARY KEY,
    title TEXT NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
);
"#,
        );
    }
    sql
}
