//! The shop example reports a failure the way a person reads it: one sentence naming what failed,
//! followed by its causes, and a failing exit status; never a `Debug` dump of the error.

use std::net::TcpListener;
use std::process::Command;

#[test]
fn an_unreachable_store_is_reported_as_a_sentence_with_its_cause() {
    // A port that was free a moment ago and has no listener now: connecting is refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}/");
    let output = Command::new(env!("CARGO_BIN_EXE_shop"))
        .env("CHATTER_COSMOS_ENDPOINT", &endpoint)
        .env_remove("CHATTER_COSMOS_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let report = stderr
        .lines()
        .find(|line| line.starts_with("shop: "))
        .unwrap_or_else(|| panic!("no error report in:\n{stderr}"));
    assert!(
        report.starts_with(&format!("shop: cannot reach Cosmos DB at {endpoint}: ")),
        "{report}"
    );
    assert!(report.contains("Connection refused"), "{report}");
    // The SDK's diagnostics are for a debug log, not for this line.
    assert!(!stderr.contains("Request {"), "{stderr}");
    assert!(report.len() < 400, "{} characters: {report}", report.len());
}
