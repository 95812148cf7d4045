// `lock_all` takes single-column keys only: a composite key must not compile.
use diesel::prelude::*;
use lockkit::prelude::*;

diesel::table! {
    order_lines (order_id, line) {
        order_id -> Integer,
        line -> Integer,
        qty -> Integer,
    }
}

#[derive(Queryable, Selectable, Lockable)]
#[diesel(table_name = order_lines, primary_key(order_id, line))]
pub struct OrderLine {
    pub order_id: i32,
    pub line: i32,
    pub qty: i32,
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    // The connection named, so that the message names it too (rustc reports
    // the bound before it has inferred the connection from the arguments).
    let _ = OrderLine::lock_all::<SqliteConnection>(&mut conn, &[(1, 1), (1, 2)]);
}
