// The model's key must be the `table!`'s primary key, in its order: lockkit
// finds the row with `table.find(key)`, and `order_lines` is keyed
// `(order_id, line_no)`, so `(line_no, order_id)` would write another line.
use diesel::prelude::*;
use lockkit_tests::schema::order_lines;

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = order_lines, primary_key(line_no, order_id))]
pub struct OrderLine {
    pub line_no: i32,
    pub order_id: i32,
    pub qty: i32,
    pub lock_version: i32,
}

fn main() {}
