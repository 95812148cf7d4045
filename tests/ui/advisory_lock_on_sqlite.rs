// SQLite has no advisory locks: `advisory::lock` must not compile there.
use diesel::prelude::*;

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let _ = lockkit::advisory::lock(&mut conn, "nightly-report");
}
