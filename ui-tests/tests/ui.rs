//! Compile-fail cases for `#[derive(DocumentReliable)]` and `#[handler]` (the passing ones are
//! `tests/registrations.rs`, an ordinary test). Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p chatter-ui-tests`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    // Failing cases only: trybuild then type-checks them (`cargo check`, no code generated or
    // linked); one passing case would make it build every case and every dependency.
    t.compile_fail("tests/ui/fail/*.rs");
}
