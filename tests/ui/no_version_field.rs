#[derive(lockkit::Versioned)]
pub struct Item {
    pub id: i32,
    pub name: String,
}

fn main() {}
