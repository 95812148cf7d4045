diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(lockkit::Versioned)]
pub struct Item(pub i32, pub i32);

fn main() {}
