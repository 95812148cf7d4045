//! Compile-fail tests for `#[derive(Versioned)]`: each mistake must be reported
//! at the right place, with a `help:` line. Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p lockkit-tests --test derive_ui` and review
//! every change. No database is needed: the passing model runs on in-memory SQLite.

#[test]
fn derive_ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui/pass/*.rs");
}
