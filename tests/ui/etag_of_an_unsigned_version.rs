// Versions are `i16`, `i32` or `i64`: an ETag of a `u32` must not compile, and
// the error must say which types a version is.
fn main() {
    let _ = lockkit::etag::ETag::from_version(7u32);
}
