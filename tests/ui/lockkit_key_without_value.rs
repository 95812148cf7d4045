#[derive(lockkit::Versioned)]
pub struct Item {
    pub id: i32,
    #[lockkit(version = )]
    pub revision: i32,
}

fn main() {}
