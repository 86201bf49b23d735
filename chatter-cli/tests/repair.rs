//! `chatter outbox requeue` and `chatter outbox give-up` against `chatter-emulator` served over
//! HTTP: the change shown before it is made, asked for unless `--yes`, never made with
//! `--dry-run`; a document that still violates the contract refused unless `--force`; the
//! operator's reason kept and shown; a document changed since the plan read it left alone.

mod common;

use chatter_emulator::RunningEmulator;
use chatter_runtime::BrokeredMessage;
use chatter_runtime::cosmos::{CosmosConnection, ReadOutcome, partition_key, read_item};
use chatter_runtime::operator::{OPERATOR_REASON_FIELD, Selection, apply, plan_give_up};
use chatter_runtime::testing::{OutboxDocument, create_item, patch_item};
use common::{DB, chatter, chatter_answering, served_store, stderr, stdout};
use serde_json::{Value, json};

const CONTAINER: &str = "orders";
const AT: [&str; 4] = ["--database", DB, "--container", CONTAINER];

fn args<'a>(command: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    command.iter().chain(&AT).chain(more).copied().collect()
}

fn document(message_id: &str, destination: &str) -> Value {
    let message = BrokeredMessage::json(message_id, destination, r#"{"orderId":"o-1"}"#);
    OutboxDocument::build(&message, &["/orderId"], &[json!("o-1")]).unwrap()
}

/// `shop/orders` with: `m-fixed` undeliverable but passing the contract now (its cause was
/// fixed), `m-poison` undeliverable with a blank destination, `m-pay` pending for `payments`,
/// and `m-foreign`, which only looks pending.
async fn store() -> (RunningEmulator, CosmosConnection) {
    let (emulator, cosmos) = served_store(CONTAINER).await;
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    let mut fixed = document("m-fixed", "order-events");
    fixed["status"] = json!("undeliverable");
    let mut poison = document("m-poison", "order-events");
    poison["Destination"] = json!(" ");
    poison["status"] = json!("undeliverable");
    let mut foreign = document("m-foreign", "payments");
    foreign["id"] = json!("not-an-outbox-id");
    for doc in [fixed, poison, document("m-pay", "payments"), foreign] {
        create_item(&orders, partition_key(&[json!("o-1")]).unwrap(), &doc)
            .await
            .unwrap();
    }
    (emulator, cosmos)
}

/// The stored document of `message_id` (minted id).
async fn stored(cosmos: &CosmosConnection, message_id: &str) -> Value {
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    let id = document(message_id, "x")["id"].as_str().unwrap().to_owned();
    match read_item(&orders, partition_key(&[json!("o-1")]).unwrap(), &id)
        .await
        .unwrap()
    {
        ReadOutcome::Found { document, .. } => document,
        ReadOutcome::NotFound => panic!("{message_id} is gone"),
    }
}

async fn status(cosmos: &CosmosConnection, message_id: &str) -> String {
    stored(cosmos, message_id).await["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn requeue_shows_the_change_and_makes_it_only_when_confirmed() {
    let (emulator, cosmos) = store().await;
    let endpoint = Some(emulator.endpoint());
    let requeue = args(&["outbox", "requeue"], &["--id", "m-fixed"]);

    let declined = chatter_answering(endpoint, None, &requeue, Some("n\n")).await;
    assert_eq!(declined.status.code(), Some(1), "{}", stderr(&declined));
    let shown = stdout(&declined);
    assert!(shown.contains("requeue will change 1 document:"), "{shown}");
    assert!(
        shown.contains("m-fixed") && shown.contains("undeliverable -> pending"),
        "{shown}"
    );
    assert!(stderr(&declined).contains("apply this change? [y/N]"));
    assert!(stderr(&declined).contains("nothing was changed"));
    assert_eq!(status(&cosmos, "m-fixed").await, "undeliverable");

    // No answer at all (standard input closed) is no, too.
    let unanswered = chatter(endpoint, None, &requeue).await;
    assert_eq!(unanswered.status.code(), Some(1));
    let mut dry = requeue.clone();
    dry.push("--dry-run");
    let dry = chatter(endpoint, None, &dry).await;
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(stdout(&dry).contains("dry run: nothing was written"));
    assert_eq!(status(&cosmos, "m-fixed").await, "undeliverable");

    let confirmed = chatter_answering(endpoint, None, &requeue, Some("y\n")).await;
    assert_eq!(confirmed.status.code(), Some(0), "{}", stderr(&confirmed));
    assert!(stdout(&confirmed).contains("1 of 1 document changed"));
    assert_eq!(status(&cosmos, "m-fixed").await, "pending");
}

#[tokio::test(flavor = "multi_thread")]
async fn requeue_refuses_a_document_that_still_violates_the_contract_unless_forced() {
    let (emulator, cosmos) = store().await;
    let endpoint = Some(emulator.endpoint());

    let refused = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "requeue"],
            &["--violation", "destination", "--yes"],
        ),
    )
    .await;
    assert_eq!(refused.status.code(), Some(1));
    let text = stdout(&refused);
    assert!(
        text.contains("refused m-poison") && text.contains("it still violates the contract"),
        "{text}"
    );
    assert!(text.contains("force it"), "{text}");
    assert_eq!(status(&cosmos, "m-poison").await, "undeliverable");

    let missing = chatter(
        endpoint,
        None,
        &args(&["outbox", "requeue"], &["--id", "nope", "--yes"]),
    )
    .await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stdout(&missing).contains("not found: nope"),
        "{}",
        stdout(&missing)
    );

    let forced = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "requeue"],
            &["--id", "m-poison", "--force", "--yes", "--json"],
        ),
    )
    .await;
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    let report: Value = serde_json::from_str(&stdout(&forced)).unwrap();
    assert_eq!(report["plan"]["changes"][0]["message_id"], "m-poison");
    assert_eq!(report["applied"][0]["failed"], Value::Null);
    assert_eq!(status(&cosmos, "m-poison").await, "pending");
    assert_eq!(
        status(&cosmos, "m-fixed").await,
        "undeliverable",
        "not selected"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn give_up_stamps_pending_documents_with_the_operator_reason_and_requeue_undoes_it() {
    let (emulator, cosmos) = store().await;
    let endpoint = Some(emulator.endpoint());
    let before = stored(&cosmos, "m-pay").await;

    let given_up = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "give-up"],
            &[
                "--destination",
                "payments",
                "--reason",
                "the broker refuses it",
                "--yes",
            ],
        ),
    )
    .await;
    assert_eq!(given_up.status.code(), Some(0), "{}", stderr(&given_up));
    assert!(
        stdout(&given_up).contains("give-up will change 1 document:"),
        "{}",
        stdout(&given_up)
    );
    let after = stored(&cosmos, "m-pay").await;
    assert_eq!(after["status"], "undeliverable");
    assert_eq!(after[OPERATOR_REASON_FIELD], "the broker refuses it");
    for field in [
        "id",
        "MessageId",
        "Destination",
        "MessageBody",
        "MessageContext",
        "orderId",
    ] {
        assert_eq!(after[field], before[field], "{field} is kept");
    }
    assert_eq!(
        stored_foreign_status(&cosmos).await,
        "pending",
        "a document that only looks pending is no candidate"
    );

    let listed = chatter(endpoint, None, &args(&["outbox", "undeliverable"], &[])).await;
    assert!(
        stdout(&listed).contains("given up by an operator: the broker refuses it"),
        "{}",
        stdout(&listed)
    );

    let requeued = chatter(
        endpoint,
        None,
        &args(&["outbox", "requeue"], &["--id", "m-pay", "--yes"]),
    )
    .await;
    assert_eq!(requeued.status.code(), Some(0), "{}", stderr(&requeued));
    let back = stored(&cosmos, "m-pay").await;
    assert_eq!(back["status"], "pending");
    assert!(back.get(OPERATOR_REASON_FIELD).is_none(), "{back}");
}

async fn stored_foreign_status(cosmos: &CosmosConnection) -> String {
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    match read_item(
        &orders,
        partition_key(&[json!("o-1")]).unwrap(),
        "not-an-outbox-id",
    )
    .await
    .unwrap()
    {
        ReadOutcome::Found { document, .. } => document["status"].as_str().unwrap().to_owned(),
        ReadOutcome::NotFound => panic!("gone"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repair_without_a_selection_or_a_reason_is_bad_input() {
    let (emulator, _cosmos) = store().await;
    let endpoint = Some(emulator.endpoint());
    let unselected = chatter(endpoint, None, &args(&["outbox", "requeue"], &["--yes"])).await;
    assert_eq!(unselected.status.code(), Some(2));
    let blank = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "give-up"],
            &["--id", "m-pay", "--reason", " ", "--yes"],
        ),
    )
    .await;
    assert_eq!(blank.status.code(), Some(2));
    assert!(stderr(&blank).contains("--reason"), "{}", stderr(&blank));
    let both = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "requeue"],
            &["--id", "m-fixed", "--yes", "--dry-run"],
        ),
    )
    .await;
    assert_eq!(both.status.code(), Some(2));
}

// The relay stamps a document between the plan and its application: the operator's patch is
// conditional on what the plan read, so the relay's stamp stands.
#[tokio::test(flavor = "multi_thread")]
async fn a_document_changed_since_the_plan_read_it_is_left_as_it_is() {
    let (_emulator, cosmos) = store().await;
    let plan = plan_give_up(
        &cosmos,
        DB,
        CONTAINER,
        &Selection::Ids(vec!["m-pay".into()]),
        "stuck",
    )
    .await
    .unwrap();
    assert_eq!(plan.changes.len(), 1);
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    let id = document("m-pay", "x")["id"].as_str().unwrap().to_owned();
    patch_item(
        &orders,
        partition_key(&[json!("o-1")]).unwrap(),
        &id,
        &[("/status", json!("delivered")), ("/ttl", json!(86_400))],
    )
    .await
    .unwrap();
    let applied = apply(&cosmos, DB, CONTAINER, &plan).await.unwrap();
    let why = applied[0].failed.as_deref().expect("not applied");
    assert!(why.contains("changed since it was read"), "{why}");
    assert_eq!(status(&cosmos, "m-pay").await, "delivered");
}

// One message id in two logical partitions: an id must name one document, so neither is taken.
#[tokio::test(flavor = "multi_thread")]
async fn an_id_that_several_documents_have_is_refused_for_each() {
    let (emulator, cosmos) = store().await;
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    for key in ["o-1", "o-2"] {
        let message = BrokeredMessage::json("m-twin", "payments", r#"{"orderId":"x"}"#);
        let doc = OutboxDocument::build(&message, &["/orderId"], &[json!(key)]).unwrap();
        create_item(&orders, partition_key(&[json!(key)]).unwrap(), &doc)
            .await
            .unwrap();
    }
    let output = chatter(
        Some(emulator.endpoint()),
        None,
        &args(
            &["outbox", "give-up"],
            &["--id", "m-twin", "--reason", "stuck", "--yes"],
        ),
    )
    .await;
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(text.matches("refused m-twin").count(), 2, "{text}");
    assert!(text.contains("several documents"), "{text}");
    assert!(
        text.contains("[\"o-1\"]") && text.contains("[\"o-2\"]"),
        "{text}"
    );
}

/// A thin trigger a body-resolver relay publishes: nothing but its identity and key.
fn thin_trigger(message_id: &str) -> Value {
    json!({
        "id": chatter_runtime::cosmos::outbox_id(message_id).unwrap(),
        "_chatterType": "outbox",
        "status": "pending",
        "MessageId": message_id,
        "orderId": "o-1",
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thin_trigger_given_up_is_requeued_with_body_resolver_and_its_refusal_names_the_flag() {
    let (emulator, cosmos) = store().await;
    let endpoint = Some(emulator.endpoint());
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();
    create_item(
        &orders,
        partition_key(&[json!("o-1")]).unwrap(),
        &thin_trigger("m-thin"),
    )
    .await
    .unwrap();
    let given_up = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "give-up"],
            &["--id", "m-thin", "--reason", "resolver down", "--yes"],
        ),
    )
    .await;
    assert_eq!(given_up.status.code(), Some(0), "{}", stderr(&given_up));

    // Read as a verbatim relay's container, a thin trigger violates the contract: refused, and
    // the refusal says where the contract is not checked.
    let refused = chatter(
        endpoint,
        None,
        &args(&["outbox", "requeue"], &["--id", "m-thin", "--yes"]),
    )
    .await;
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let text = stdout(&refused);
    assert!(text.contains("refused m-thin"), "{text}");
    assert!(text.contains("--body-resolver"), "{text}");
    assert_eq!(status(&cosmos, "m-thin").await, "undeliverable");

    // Listed for a body-resolver relay's container: no contract violation is claimed.
    let listed = chatter(
        endpoint,
        None,
        &args(&["outbox", "undeliverable"], &["--body-resolver", "--json"]),
    )
    .await;
    assert_eq!(listed.status.code(), Some(1), "{}", stderr(&listed));
    let survey: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let thin = survey["undeliverable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|doc| doc["message_id"] == "m-thin")
        .unwrap();
    assert_eq!(thin["violations"], json!([]), "{survey}");
    assert_eq!(thin["operator_reason"], "resolver down");

    let requeued = chatter(
        endpoint,
        None,
        &args(
            &["outbox", "requeue"],
            &["--id", "m-thin", "--body-resolver", "--yes"],
        ),
    )
    .await;
    assert_eq!(requeued.status.code(), Some(0), "{}", stderr(&requeued));
    assert!(stdout(&requeued).contains("1 of 1 document changed"));
    let document = stored(&cosmos, "m-thin").await;
    assert_eq!(document["status"], "pending");
    assert!(document.get(OPERATOR_REASON_FIELD).is_none(), "{document}");
}
