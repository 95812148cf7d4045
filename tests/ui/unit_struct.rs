diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(lockkit::Versioned)]
pub struct Item;

fn main() {}
