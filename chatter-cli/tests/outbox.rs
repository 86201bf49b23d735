//! The `chatter` binary against `chatter-emulator` served over HTTP: its tables, its JSON, its
//! exit codes (0 done, 1 undeliverable documents found, 2 bad input, 3 the store unreadable),
//! and an account key that never reaches its output.

mod common;

use chatter_emulator::RunningEmulator;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::cosmos::partition_key;
use chatter_runtime::testing::{OutboxDocument, create_item};
use common::{DB, chatter, served_store, stderr, stdout};
use serde_json::{Value, json};

const CONTAINER: &str = "orders";

/// A served emulator whose `shop/orders` holds two pending documents for `order-events`, one
/// for `payments`, one stamped undeliverable because its destination is blank, and one for
/// `payments` that only looks pending.
async fn store() -> RunningEmulator {
    let (emulator, cosmos) = served_store(CONTAINER).await;
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    let write = |message_id: &str, destination: &str| {
        let message = BrokeredMessage::json(message_id, destination, r#"{"orderId":"o-1"}"#);
        OutboxDocument::build(&message, &["/orderId"], &[json!("o-1")]).unwrap()
    };
    let mut docs = vec![
        write("m-1", "order-events"),
        write("m-2", "order-events"),
        write("m-3", "payments"),
    ];
    let mut poison = write("m-poison", "order-events");
    poison["Destination"] = json!(" ");
    poison["status"] = json!("undeliverable");
    docs.push(poison);
    // Only looks pending: an id chatter never mints for its message id. The relay skips it, so
    // it is no backlog.
    let mut foreign = write("m-foreign", "payments");
    foreign["id"] = json!("not-an-outbox-id");
    docs.push(foreign);
    for doc in &docs {
        create_item(&orders, partition_key(&[json!("o-1")]).unwrap(), doc)
            .await
            .unwrap();
    }
    emulator
}

const AT: [&str; 4] = ["--database", DB, "--container", CONTAINER];

fn args<'a>(command: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    command.iter().chain(&AT).chain(more).copied().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pending_counts_each_destination_with_its_oldest_document() {
    let emulator = store().await;

    let table = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "pending"], &[]),
    )
    .await;
    assert_eq!(table.status.code(), Some(0), "{}", stderr(&table));
    let text = stdout(&table);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("DESTINATION"), "{text}");
    assert!(
        lines[1].starts_with("order-events") && lines[1].contains(" 2 "),
        "{text}"
    );
    assert!(
        lines[2].starts_with("payments") && lines[2].contains(" 1 "),
        "{text}"
    );
    assert_eq!(lines[3], "3 pending in all", "{text}");

    let json = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "pending"], &["--json"]),
    )
    .await;
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let survey: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(survey["pending"]["order-events"]["count"], 2);
    assert_eq!(survey["pending"]["payments"]["count"], 1);
    assert_eq!(survey["pending"]["payments"]["oldest_message_id"], "m-3");
    assert!(survey["pending"]["payments"]["oldest_written_at"].is_i64());
}

// Issue 31 item 7: a document that looks pending under an id that is not the outbox id of its
// MessageId is never relayed; it is listed apart, with the id it should have, in the table and
// in the JSON.
#[tokio::test(flavor = "multi_thread")]
async fn pending_lists_documents_under_a_foreign_id_apart_with_the_expected_id() {
    let emulator = store().await;
    let expected = chatter_runtime::cosmos::outbox_id("m-foreign").unwrap();

    let table = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "pending"], &[]),
    )
    .await;
    assert_eq!(table.status.code(), Some(0), "{}", stderr(&table));
    let text = stdout(&table);
    let (relayed, apart) = text
        .split_once("3 pending in all\n")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!relayed.contains("not-an-outbox-id"), "{text}");
    let row = apart
        .lines()
        .find(|line| line.starts_with("not-an-outbox-id"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        row.contains("m-foreign") && row.contains(&expected),
        "{text}"
    );

    let json = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "pending"], &["--json"]),
    )
    .await;
    let survey: Value = serde_json::from_slice(&json.stdout).unwrap();
    let foreign = survey["id_mismatches"].as_array().unwrap();
    assert_eq!(foreign.len(), 1, "{survey}");
    assert_eq!(foreign[0]["id"], "not-an-outbox-id");
    assert_eq!(foreign[0]["message_id"], "m-foreign");
    assert_eq!(foreign[0]["expected_id"], expected.as_str());
    assert_eq!(foreign[0]["destination"], "payments");
}

#[tokio::test(flavor = "multi_thread")]
async fn undeliverable_names_each_documents_violations_and_exits_1() {
    let emulator = store().await;

    let table = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "undeliverable"], &[]),
    )
    .await;
    assert_eq!(table.status.code(), Some(1), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(text.contains("m-poison"), "{text}");
    assert!(text.contains("Destination"), "names the violation: {text}");
    assert!(text.ends_with("1 undeliverable\n"), "{text}");

    let json = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "undeliverable"], &["--json"]),
    )
    .await;
    let survey: Value = serde_json::from_slice(&json.stdout).unwrap();
    let found = survey["undeliverable"].as_array().unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["message_id"], "m-poison");
    assert!(!found[0]["violations"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_outbox_has_nothing_undeliverable_and_exits_0() {
    let (emulator, _cosmos) = served_store(CONTAINER).await;

    let output = chatter(
        Some(emulator.endpoint()),
        None,
        &args(&["outbox", "undeliverable"], &[]),
    )
    .await;

    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "no undeliverable outbox documents\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_exits_2_with_a_message_never_a_panic() {
    let emulator = store().await;
    let cases: [(Option<&str>, Vec<&str>, &str); 5] = [
        // No endpoint anywhere.
        (
            None,
            args(&["outbox", "pending"], &[]),
            "CHATTER_COSMOS_ENDPOINT",
        ),
        // A missing flag.
        (
            Some(emulator.endpoint()),
            vec!["outbox", "pending", "--database", DB],
            "--container",
        ),
        // An unknown command.
        (Some(emulator.endpoint()), vec!["outbox", "purge"], "purge"),
        // A container that does not exist.
        (
            Some(emulator.endpoint()),
            vec![
                "outbox",
                "pending",
                "--database",
                DB,
                "--container",
                "ordres",
            ],
            "ordres",
        ),
        // Not an endpoint.
        (
            Some("not a url"),
            args(&["outbox", "pending"], &[]),
            "not a url",
        ),
    ];
    for (endpoint, argv, named) in cases {
        let output = chatter(endpoint, None, &argv).await;
        let error = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{argv:?}: {error}");
        assert!(error.contains(named), "{argv:?} names {named}: {error}");
        assert!(!error.contains("panicked"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_store_exits_3_and_never_prints_the_key() {
    const SECRET: &str = "c2VjcmV0LWFjY291bnQta2V5LW5ldmVyLXByaW50ZWQ=";
    // Nothing listens on port 9 of this machine (discard, not served here).
    let output = chatter(
        Some("http://127.0.0.1:9/"),
        Some(SECRET),
        &args(&["outbox", "pending"], &[]),
    )
    .await;

    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("127.0.0.1:9"),
        "{}",
        stderr(&output)
    );
    for text in [stdout(&output), stderr(&output)] {
        assert!(!text.contains(SECRET), "the key was printed: {text}");
    }
}
