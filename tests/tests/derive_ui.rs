//! Compile-fail tests for `#[derive(Versioned)]`: each mistake must be reported
//! once, at the right place, with a `help:` line, and add no errors at the calls
//! that use the model. Keep each `.stderr` short: check a bound where it is
//! narrowest (see `for_update_of_on_sqlite.rs`) rather than pin rustc's dump of
//! Diesel's query types, which changes with Diesel. Regenerate the `.stderr`
//! files with `TRYBUILD=overwrite cargo test -p lockkit-tests --test derive_ui`
//! and review every change. No database is needed: the passing model runs on
//! in-memory SQLite.

#[test]
fn derive_ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui/pass/*.rs");
}
