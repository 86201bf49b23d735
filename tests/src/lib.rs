//! Integration tests for chatter live under `tests/`.
