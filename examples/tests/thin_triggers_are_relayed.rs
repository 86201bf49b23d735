//! The thin-triggers example runs to completion and publishes each invoice with the body its
//! resolver read from the other container.

use std::process::Command;

use chatter_tests::process::stdout_of_success;

#[test]
fn every_thin_trigger_is_published_with_its_resolved_body() {
    let stdout = stdout_of_success(
        Command::new(env!("CARGO_BIN_EXE_thin_triggers")).env_remove("CHATTER_COSMOS_ENDPOINT"),
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
