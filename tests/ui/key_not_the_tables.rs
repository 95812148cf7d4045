// The model's key must be the `table!`'s primary key, in its order: lockkit
// finds the row with `table.find(key)`, so `(line_no, order_id)` would write
// the line `(order_id = line_no, line_no = order_id)`.
use diesel::prelude::*;

diesel::table! {
    order_lines (order_id, line_no) {
        order_id -> Integer,
        line_no -> Integer,
        qty -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Queryable, lockkit::Versioned)]
#[diesel(table_name = order_lines, primary_key(line_no, order_id))]
pub struct OrderLine {
    pub line_no: i32,
    pub order_id: i32,
    pub qty: i32,
    pub lock_version: i32,
}

fn main() {}
