#[derive(lockkit::Versioned)]
pub struct Item {
    #[lockkit(version)]
    pub id: i32,
    pub name: String,
}

fn main() {}
