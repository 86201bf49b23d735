//! Compile-fail and compile-pass cases for `#[derive(DocumentReliable)]` live under `tests/ui/`.
