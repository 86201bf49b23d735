//! The thin-triggers example runs to completion and publishes each invoice with the body its
//! resolver read from the other container.

use std::process::Command;

#[test]
fn every_thin_trigger_is_published_with_its_resolved_body() {
    let output = Command::new(env!("CARGO_BIN_EXE_thin_triggers"))
        .env_remove("CHATTER_COSMOS_ENDPOINT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut published: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("published "))
        .map(|rest| rest.split_once(": ").map_or(rest, |(_, body)| body))
        .collect();
    published.sort_unstable();
    assert_eq!(
        published,
        [r#"{"amount":120}"#, r#"{"amount":300}"#, r#"{"amount":80}"#],
        "{stdout}"
    );
}
