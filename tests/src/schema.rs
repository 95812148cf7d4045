//! The test schema: the tables as Diesel sees them, and [`create_tables!`], the
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

/// A word of [`create_tables!`] in `$dialect`: `text` (MySQL cannot key or
/// index a `TEXT` column), `serial` (an increasing `INTEGER` key) or `end` (a
/// table's closing parenthesis).
macro_rules! word {
    (mysql, text) => {
        "VARCHAR(255)"
    };
    ($other:ident, text) => {
        "TEXT"
    };
    (postgres, serial) => {
        "SERIAL PRIMARY KEY"
    };
    (mysql, serial) => {
        "INTEGER PRIMARY KEY AUTO_INCREMENT"
    };
    (sqlite, serial) => {
        "INTEGER PRIMARY KEY AUTOINCREMENT"
    };
    (mysql, end) => {
        ") ENGINE = InnoDB;"
    };
    ($other:ident, end) => {
        ");"
    };
}
pub(crate) use word;

/// `CREATE TABLE` for every table above except `notes`, in `$dialect`
/// (`postgres`, `mysql` or `sqlite`): what a [`TestDb`](crate::TestDb) runs on
/// its fresh database. `tickets` is PostgreSQL's alone.
macro_rules! create_tables {
    ($dialect:ident) => {
        concat!(
            "CREATE TABLE items (\n",
            "    id ",
            $crate::schema::word!($dialect, serial),
            ",\n",
            "    name ",
            $crate::schema::word!($dialect, text),
            " NOT NULL,\n",
            "    stock INTEGER NOT NULL,\n",
            "    lock_version INTEGER NOT NULL DEFAULT 0\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "CREATE TABLE gadgets (\n",
            "    id INTEGER PRIMARY KEY,\n",
            "    label ",
            $crate::schema::word!($dialect, text),
            " NOT NULL,\n",
            "    version SMALLINT NOT NULL DEFAULT 0\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "CREATE TABLE documents (\n",
            "    id BIGINT PRIMARY KEY,\n",
            "    title ",
            $crate::schema::word!($dialect, text),
            " NOT NULL,\n",
            "    note TEXT,\n",
            "    lock_version BIGINT NOT NULL DEFAULT 0\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "CREATE TABLE order_lines (\n",
            "    order_id INTEGER NOT NULL,\n",
            "    line_no INTEGER NOT NULL,\n",
            "    qty INTEGER NOT NULL,\n",
            "    lock_version INTEGER NOT NULL DEFAULT 0,\n",
            "    PRIMARY KEY (order_id, line_no)\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "CREATE TABLE jobs (\n",
            "    id INTEGER PRIMARY KEY,\n",
            "    payload ",
            $crate::schema::word!($dialect, text),
            " NOT NULL,\n",
            "    done BOOLEAN NOT NULL DEFAULT FALSE\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "CREATE TABLE doctors (\n",
            "    id INTEGER PRIMARY KEY,\n",
            "    name ",
            $crate::schema::word!($dialect, text),
            " NOT NULL,\n",
            "    on_call BOOLEAN NOT NULL\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "CREATE TABLE orders (\n",
            "    id INTEGER PRIMARY KEY,\n",
            "    item_id INTEGER REFERENCES items (id),\n",
            "    qty INTEGER NOT NULL\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "-- A table whose declared key is not unique in the database (no constraint).\n",
            "CREATE TABLE twins (\n",
            "    id INTEGER NOT NULL,\n",
            "    label ",
            $crate::schema::word!($dialect, text),
            " NOT NULL,\n",
            "    lock_version INTEGER NOT NULL DEFAULT 0\n",
            $crate::schema::word!($dialect, end),
            "\n",
            "-- A string key (on MySQL under the server's default, case-insensitive, collation).\n",
            "CREATE TABLE sku_codes (\n",
            "    code VARCHAR(64) PRIMARY KEY,\n",
            "    stock INTEGER NOT NULL,\n",
            "    lock_version INTEGER NOT NULL DEFAULT 0\n",
            $crate::schema::word!($dialect, end),
            "\n",
            $crate::schema::only_on!(
                $dialect,
                postgres,
                "-- A UUID key, for `lock_all` with the `uuid` feature.\n",
                "CREATE TABLE tickets (\n",
                "    id UUID PRIMARY KEY,\n",
                "    title TEXT NOT NULL,\n",
                "    lock_version INTEGER NOT NULL DEFAULT 0\n",
                ");\n",
            ),
        )
    };
}
pub(crate) use create_tables;

/// The text after the second name on `$dialect`, if it is the same dialect,
/// else nothing.
macro_rules! only_on {
    (postgres, postgres, $($text:literal),* $(,)?) => { concat!($($text),*) };
    ($dialect:ident, postgres, $($text:literal),* $(,)?) => { "" };
}
pub(crate) use only_on;
