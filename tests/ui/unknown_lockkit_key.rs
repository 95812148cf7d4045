#[derive(lockkit::Versioned)]
pub struct Item {
    pub id: i32,
    #[lockkit(foo)]
    pub lock_version: i32,
}

fn main() {}
