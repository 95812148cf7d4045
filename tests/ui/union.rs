diesel::table! {
    items (id) {
        id -> Integer,
        lock_version -> Integer,
    }
}

#[derive(lockkit::Versioned)]
pub union Item {
    pub id: i32,
    pub lock_version: i32,
}

fn main() {}
