//! A standalone-inbox command's last attempt whose completion landed although the attempt did
//! not hear so (its answer came after the store timeout): the marker shows it completed, so the
//! delivery is acknowledged as handled, never dead-lettered. And a send from a standalone-inbox
//! command that names no lease container is refused with the fix.
//!
//! Real parts: a `chatter-emulator` server that does the PATCH at once and holds its answer
//! back (a lost answer), the in-memory broker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker};
use chatter_runtime::cosmos::inbox_id;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, broker::dead_letter_destination, handler,
    relay::RelayOptions,
};
use chatter_tests::broker::{publish_command, settled};
use chatter_tests::store::{emulator_server, find_document};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Sends a text message: a side effect outside Cosmos, one attempt only.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "sms", container = "idempotency")]
#[chatter(max_delivery_attempts = 1)]
pub struct SendText {
    pub to: String,
}

static TEXTS: AtomicUsize = AtomicUsize::new(0);

#[handler]
async fn send_text(_command: SendText, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    TEXTS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_last_attempt_whose_completion_landed_unheard_is_acknowledged_not_dead_lettered() {
    let (emulator, cosmos) = emulator_server().await;
    provision::ensure_for::<SendText>(&cosmos).await.unwrap();
    provision::ensure_for::<SendAnnouncedText>(&cosmos)
        .await
        .unwrap();
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .relay_options(RelayOptions::default().store_timeout(Duration::from_secs(1)))
        .start()
        .await
        .unwrap();
    // The completion patch lands at once; its answer comes after the store timeout.
    emulator
        .faults()
        .answer_late("PATCH", Duration::from_secs(3));
    publish_command(&broker, "SendText", "text-1", &json!({ "to": "+15550100" })).await;
    settled(&broker, "SendText").await;
    emulator.faults().clear();
    assert_eq!(TEXTS.load(Ordering::SeqCst), 1);
    let c = cosmos.container("sms", "idempotency").await.unwrap();
    let marker = find_document(&c, &[json!("text-1")], &inbox_id("text-1").unwrap()).await;
    assert_eq!(marker.unwrap()["Completed"], true);
    assert_eq!(
        broker.published_count(&dead_letter_destination("SendText")),
        0,
        "a completed message id is acknowledged on its last attempt"
    );
    runtime.shutdown().await;
}

/// Sends a text and tells someone: a standalone-inbox command without a lease container.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "sms", container = "idempotency-announced")]
pub struct SendAnnouncedText {
    pub to: String,
}

#[handler]
async fn send_announced_text(
    command: SendAnnouncedText,
    ctx: &mut HandlerContext,
) -> Result<(), BoxError> {
    ctx.send_json(
        &format!("{}:Sent", ctx.message_id()),
        "texts-sent",
        &json!({ "to": command.to }),
    )?;
    Ok(())
}

// A standalone-inbox command that names no lease container cannot send: its sent messages
// commit as Outbox Documents that only a relay publishes. The send is refused with the fix,
// nothing is published, and the delivery is dead-lettered at once (a retry would only repeat
// the handler's side effect).
#[tokio::test]
async fn a_send_from_an_inbox_command_without_a_lease_is_refused_with_the_fix() {
    let (_emulator, cosmos) = emulator_server().await;
    provision::ensure_for::<SendText>(&cosmos).await.unwrap();
    provision::ensure_for::<SendAnnouncedText>(&cosmos)
        .await
        .unwrap();
    let broker = InMemoryBroker::new();
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .start()
        .await
        .unwrap();
    let mut dead = broker
        .subscribe(&dead_letter_destination("SendAnnouncedText"))
        .await
        .unwrap();
    publish_command(
        &broker,
        "SendAnnouncedText",
        "text-2",
        &json!({ "to": "+15550101" }),
    )
    .await;
    let letter = chatter_tests::broker::next_delivery(&mut dead, Duration::from_secs(30)).await;
    let reason = letter.message.context[chatter_runtime::constants::DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("names no lease container"), "{reason}");
    assert!(reason.contains("lease = \"...\""), "{reason}");
    assert_eq!(
        letter.message.context.get("Chatter.Delivery.Attempts"),
        Some(&json!(1)),
        "dead-lettered on its first attempt"
    );
    assert_eq!(broker.published_count("texts-sent"), 0);
    runtime.shutdown().await;
}
