//! `shop --telemetry` prints what chatter recorded: the drain instruments at exit, and the
//! `send` spans of the relayed events parented to the `process` spans of their commands.

use std::collections::BTreeMap;
use std::process::Command;

use chatter_tests::process::stdout_of_success;

/// Every span the stdout exporter printed: name -> (span id, parent span id) pairs.
fn spans(stdout: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut spans: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut name = None;
    let mut id = None;
    for line in stdout.lines().map(str::trim) {
        let field = |key: &str| {
            line.strip_prefix(key)
                .map(|rest| rest.trim_start().trim_start_matches(':').trim().to_owned())
        };
        if let Some(value) = field("Name         ") {
            name = Some(value);
        } else if let Some(value) = field("SpanId       ") {
            id = Some(value);
        } else if let Some(parent) = field("ParentSpanId ")
            && let (Some(name), Some(id)) = (name.take(), id.take())
        {
            spans.entry(name).or_default().push((id, parent));
        }
    }
    spans
}

#[test]
fn the_example_prints_the_drain_instruments_and_the_send_spans_in_their_commands_traces() {
    let stdout = stdout_of_success(
        Command::new(env!("CARGO_BIN_EXE_shop"))
            .arg("--telemetry")
            .env_remove("CHATTER_COSMOS_ENDPOINT"),
    );
    for instrument in [
        "chatter.messaging.outbox.drain.lag",
        "chatter.messaging.outbox.drain.documents",
        "chatter.messaging.outbox.drain.batch.size",
        "chatter.messaging.outbox.drain.batches",
    ] {
        assert!(
            stdout.contains(instrument),
            "{instrument} missing:\n{stdout}"
        );
    }
    let spans = spans(&stdout);
    let process: Vec<&String> = ["process CreateOrder", "process CancelOrder"]
        .iter()
        .flat_map(|name| spans[*name].iter().map(|(id, _)| id))
        .collect();
    let sends = &spans["send order-events"];
    // Two OrderCreated and one OrderCancelled.
    assert_eq!(sends.len(), 3, "one send span per relayed event: {spans:?}");
    for (_, parent) in sends {
        assert!(
            process.contains(&parent),
            "a send span's parent is a command's process span: {spans:?}"
        );
    }
}
