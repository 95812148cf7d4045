diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(lockkit::Versioned)]
pub enum Item {
    Row { id: i32, lock_version: i32 },
}

fn main() {}
