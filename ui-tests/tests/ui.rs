//! Compile-fail and compile-pass cases for `#[derive(DocumentReliable)]` and `#[handler]`.
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test -p chatter-ui-tests`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    // The passing cases share one crate: one compilation, not one per case.
    t.pass("tests/ui/pass/registrations.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
