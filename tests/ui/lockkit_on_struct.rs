#[derive(lockkit::Versioned)]
#[lockkit(version)]
pub struct Item {
    pub id: i32,
    pub lock_version: i32,
}

fn main() {}
