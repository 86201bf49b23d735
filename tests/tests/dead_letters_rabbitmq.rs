//! Poison commands through the machine's RabbitMQ land in the command's dead-letter queue
//! (`<destination>.dead-letter`) with their reason, and a healthy command behind them is handled.
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::broker::Broker;
use chatter_runtime::message::BrokeredMessage;
use chatter_runtime::registry::Registry;
use chatter_runtime::{
    ATTEMPTS_CONTEXT_KEY, BoxError, DEAD_LETTER_REASON_CONTEXT_KEY, DocumentReliable,
    HandlerContext, Runtime, dead_letter_destination, handler,
};
use chatter_tests::broker::next_delivery;
use chatter_tests::rabbitmq;
use chatter_tests::store::{embedded, find_document, provisioned};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// Registers a user; its handler fails for the name "always-fails".
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(destination = "chatter-test-register-user", max_delivery_attempts = 2)]
#[serde(rename_all = "camelCase")]
pub struct RegisterUser {
    pub user_id: String,
}

#[handler]
async fn register_user(command: RegisterUser, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if command.user_id == "always-fails" {
        return Err("the user directory is read-only".into());
    }
    ctx.upsert(json!({ "id": command.user_id, "userId": command.user_id }))?;
    Ok(())
}

/// A command whose destination leaves no room for `.dead-letter` in an AMQP queue name.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(
    destination = "chatter-test-a-destination-so-long-that-its-dead-letter-queue-name-would-be-longer-than-the-255-bytes-amqp-allows-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
)]
#[serde(rename_all = "camelCase")]
pub struct RenameUser {
    pub user_id: String,
}

#[handler]
async fn rename_user(_command: RenameUser, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

/// The registry of this binary holding only `command`.
fn only(command: &str) -> Registry {
    use chatter_runtime::__private::{CommandRegistration, HandlerRegistration, inventory};
    Registry::build(
        inventory::iter::<CommandRegistration>
            .into_iter()
            .filter(|c| c.command_name == command),
        inventory::iter::<HandlerRegistration>
            .into_iter()
            .filter(|h| (h.command)().command_name == command),
    )
    .unwrap()
}

// A command whose dead letters the broker could never carry would redeliver a poison forever:
// the runtime refuses to start, naming it.
#[tokio::test]
async fn start_refuses_a_command_whose_dead_letters_rabbitmq_could_never_carry() {
    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let direct = rabbitmq::connect(WAIT).await;
    let err = Runtime::builder()
        .registry(only("RenameUser"))
        .cosmos(cosmos)
        .broker(direct)
        .without_relay()
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the dead letters of command `RenameUser` could never be published"),
        "{err}"
    );
}

#[tokio::test]
async fn poison_commands_are_dead_lettered_with_their_reason_and_healthy_ones_are_handled() {
    let cosmos = embedded().await;
    let users = provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let direct = rabbitmq::connect(WAIT).await;
    let commands = RegisterUser::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(commands);
    for queue in [commands, dead_letters.as_str()] {
        rabbitmq::delete_queue(&direct, queue, WAIT).await;
    }
    let runtime = Runtime::builder()
        .registry(only("RegisterUser"))
        .cosmos(cosmos.clone())
        .broker(direct.clone())
        .without_relay()
        .redelivery_delay(Duration::from_millis(50))
        .start()
        .await
        .unwrap();

    let command = |id: &str, body: String| BrokeredMessage::json(id, commands, body);
    for message in [
        command("not-json", "{{{".into()),
        command("hopeless", json!({ "userId": "always-fails" }).to_string()),
        command("healthy", json!({ "userId": "u-1" }).to_string()),
    ] {
        direct.publish(message).await.unwrap();
    }

    let mut letters = rabbitmq::subscribe(&direct, &dead_letters, WAIT).await;
    let mut found = Vec::new();
    for _ in 0..2 {
        let delivery = next_delivery(&mut letters, WAIT).await;
        found.push(delivery.message.clone());
        delivery.ack().await.unwrap();
    }
    found.sort_by(|a, b| a.message_id.cmp(&b.message_id));
    let (hopeless, not_json) = (&found[0], &found[1]);
    assert_eq!(not_json.message_id, "not-json");
    assert_eq!(not_json.body, "{{{", "the body is kept");
    let why = not_json.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(why.contains("is not JSON"), "{why}");
    assert_eq!(not_json.context[ATTEMPTS_CONTEXT_KEY], 1);
    assert_eq!(hopeless.message_id, "hopeless");
    assert_eq!(
        hopeless.context[ATTEMPTS_CONTEXT_KEY], 2,
        "the command's own limit"
    );
    let why = hopeless.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(why.contains("the user directory is read-only"), "{why}");

    eventually(
        WAIT,
        Duration::from_millis(50),
        "the healthy command is handled",
        || async {
            find_document(&users, &[json!("u-1")], "u-1")
                .await
                .is_some()
        },
    )
    .await;
    runtime.shutdown().await;
    drop(letters);
    for queue in [commands, dead_letters.as_str()] {
        assert_eq!(
            rabbitmq::delete_queue(&direct, queue, WAIT).await,
            0,
            "{queue} is empty"
        );
    }
}
