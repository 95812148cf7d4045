// compare_and_set reports the values it finds in the expectations' own types:
// an expected `&str` cannot hold what a `Text` column loads.
use diesel::prelude::*;
use lockkit::compare_and_set::expect;
use lockkit::prelude::*;

diesel::table! { orders (id) { id -> Integer, state -> Text } }

#[derive(Queryable, Selectable, Lockable)]
#[diesel(table_name = orders)]
pub struct Order {
    pub id: i32,
    pub state: String,
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let _ = Order::compare_and_set(&mut conn, 5, expect(orders::state, "pending"), orders::state.eq("paid"));
}
