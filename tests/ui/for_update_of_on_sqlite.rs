// Row-lock clauses do not exist on SQLite: `FOR UPDATE OF` has no SQL there, so
// no query that carries it, such as
// `items::table.for_update_of(items::table).load(&mut sqlite_conn)`, compiles.
// The clause is checked on its own: a whole query's error also lists every
// clause type of Diesel's `SelectStatement`, which changes with Diesel releases.
use diesel::query_builder::QueryFragment;
use diesel::sqlite::Sqlite;
use lockkit::pessimistic::row_lock::LockOf;

diesel::table! {
    items (id) {
        id -> Integer,
    }
}

/// The bound that loading a query on SQLite puts on its lock clause.
fn sql_on_sqlite<Clause: QueryFragment<Sqlite>>() {}

fn main() {
    sql_on_sqlite::<LockOf<items::table>>();
}
