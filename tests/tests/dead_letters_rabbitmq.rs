//! Poison commands through the machine's RabbitMQ land in the command's dead-letter queue
//! (`<destination>.dead-letter`) with their reason, and a healthy command behind them is handled.
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::Broker;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, broker::dead_letter_destination,
    constants::ATTEMPTS_CONTEXT_KEY, constants::DEAD_LETTER_REASON_CONTEXT_KEY, handler,
};
use chatter_tests::broker::{acked, next_delivery};
use chatter_tests::rabbitmq;
use chatter_tests::runtime::registry_named;
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

/// Archives a user; its dead-letter queue is declared otherwise by another service in a test.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(destination = "chatter-test-archive-user")]
#[serde(rename_all = "camelCase")]
pub struct ArchiveUser {
    pub user_id: String,
}

#[handler]
async fn archive_user(_command: ArchiveUser, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

/// Ships an order through a quorum queue declared by another service; `max_delivery_attempts`
/// 3.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(destination = "chatter-test-quorum-ship", max_delivery_attempts = 3)]
#[serde(rename_all = "camelCase")]
pub struct ShipOrder {
    pub user_id: String,
}

#[handler]
async fn ship_order(command: ShipOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.user_id, "userId": command.user_id }))?;
    Ok(())
}

/// Ships a parcel; its quorum queue's delivery limit leaves no room above its 3 attempts.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(destination = "chatter-test-quorum-parcel", max_delivery_attempts = 3)]
#[serde(rename_all = "camelCase")]
pub struct ShipParcel {
    pub user_id: String,
}

#[handler]
async fn ship_parcel(_command: ShipParcel, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

/// Holds an order; its dead-letter queue refuses every message in a test.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(destination = "chatter-test-quorum-held", max_delivery_attempts = 3)]
#[serde(rename_all = "camelCase")]
pub struct HoldOrder {
    pub user_id: String,
}

#[handler]
async fn hold_order(command: HoldOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.user_id, "userId": command.user_id }))?;
    Ok(())
}

/// Declares `queue` afresh as another service would: a quorum queue with `delivery_limit`
/// (`x-delivery-limit`, when given).
async fn declare_quorum(queue: &str, delivery_limit: Option<i32>) {
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

    let foreign = rabbitmq::foreign_channel(WAIT).await;
    foreign
        .queue_delete(ShortString::from(queue), QueueDeleteOptions::default())
        .await
        .unwrap();
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    if let Some(limit) = delivery_limit {
        arguments.insert(
            ShortString::from("x-delivery-limit"),
            AMQPValue::LongInt(limit),
        );
    }
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    foreign
        .queue_declare(ShortString::from(queue), durable, arguments)
        .await
        .unwrap();
}

// A quorum queue drops a message delivered more often than its delivery limit, and chatter
// dead-letters the last delivery unrun: a limit not above the command's attempts would cut
// them short for a message that crashes its consumer, so the start refuses, naming both
// numbers.
#[tokio::test]
async fn start_refuses_a_quorum_queue_whose_delivery_limit_is_not_above_max_delivery_attempts() {
    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let queue = ShipParcel::DOCUMENT_RELIABILITY.destination;
    declare_quorum(queue, Some(3)).await;
    let error = Runtime::builder()
        .registry(registry_named("ShipParcel"))
        .cosmos(cosmos)
        .broker(rabbitmq::connect(WAIT).await)
        .without_relay()
        .start()
        .await
        .unwrap_err();
    let text = chatter_runtime::error::ErrorChain(&error).to_string();
    assert!(
        matches!(error, chatter_runtime::error::StartError::Broker { .. }),
        "{text}"
    );
    assert!(
        text.contains(&format!("`x-delivery-limit` of the quorum queue `{queue}`"))
            && text.contains("is 3, not above the 3 delivery attempts")
            && text.contains("with `x-delivery-limit` above 3"),
        "{text}"
    );
    let direct = rabbitmq::connect(WAIT).await;
    rabbitmq::delete_queue(&direct, queue, WAIT).await;
}

/// Takes every message waiting on `queue` (`count` of them) on a channel of its own and closes
/// it without settling them, as a consumer that crashes while holding them: the queue counts a
/// delivery of each.
async fn crash_holding(queue: &str, count: usize) {
    use lapin::options::BasicGetOptions;
    use lapin::types::ShortString;

    let crashing = rabbitmq::foreign_channel(WAIT).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut held = 0;
    while held < count {
        let got = crashing
            .basic_get(ShortString::from(queue), BasicGetOptions::default())
            .await
            .unwrap();
        if got.is_some() {
            held += 1;
        } else {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} holds {count} messages"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    crashing
        .close(200, ShortString::from("crash"))
        .await
        .unwrap();
}

// A quorum queue with room above the attempts is taken as it is: commands are published to it
// and consumed from it. A message its consumers took without ever settling it (each crashed
// while holding it) as often as the queue's delivery limit is on its last delivery, which the
// queue drops unless settled: it is dead-lettered without running its handler. One returned
// fewer times is handled, even past its attempts (a return at a shutdown is no failure).
#[tokio::test]
async fn a_quorum_queue_is_consumed_and_its_last_delivery_of_a_message_is_dead_lettered_unrun() {
    let cosmos = embedded().await;
    let users = provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let queue = ShipOrder::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(queue);
    let direct = rabbitmq::connect(WAIT).await;
    rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
    // Above the command's 3 attempts.
    declare_quorum(queue, Some(4)).await;
    let command = |id: &str| {
        BrokeredMessage::json(
            id,
            queue,
            json!({ "userId": format!("user-{id}") }).to_string(),
        )
    };
    direct.publish(command("crashes-each-time")).await.unwrap();
    crash_holding(queue, 1).await;
    direct.publish(command("returned-thrice")).await.unwrap();
    for _ in 0..3 {
        crash_holding(queue, 2).await;
    }

    let runtime = Runtime::builder()
        .registry(registry_named("ShipOrder"))
        .cosmos(cosmos.clone())
        .broker(direct.clone())
        .without_relay()
        .start()
        .await
        .unwrap();
    let mut letters = rabbitmq::subscribe(&direct, &dead_letters, WAIT).await;
    let found = acked(&mut letters, 1, WAIT).await;
    assert_eq!(found[0].message_id, "crashes-each-time");
    assert_eq!(
        found[0].context[ATTEMPTS_CONTEXT_KEY], 5,
        "four deliveries never settled, and this one"
    );
    let why = found[0].context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(
        why.contains("the broker delivered it 5 times without its being settled"),
        "{why}"
    );
    eventually(
        WAIT,
        Duration::from_millis(50),
        "the command returned three times is handled",
        || async {
            find_document(
                &users,
                &[json!("user-returned-thrice")],
                "user-returned-thrice",
            )
            .await
            .is_some()
        },
    )
    .await;
    assert!(
        find_document(
            &users,
            &[json!("user-crashes-each-time")],
            "user-crashes-each-time"
        )
        .await
        .is_none(),
        "the handler did not run the dead-lettered delivery"
    );
    runtime.shutdown().await;
    drop(letters);
    rabbitmq::delete_emptied(&direct, &[queue, dead_letters.as_str()], WAIT).await;
}

// The queue's last delivery of a message whose dead letter cannot be published (the
// dead-letter queue refuses every message, by a policy) is published to the back of its queue
// again, where the queue counts the copy afresh: returned, the queue would drop it. The copy of
// a command is handled (dead-lettered instead, it would not be: so the refusal did happen); the
// copy of a message that is no Brokered Message is dead-lettered once the policy is lifted.
#[tokio::test]
async fn a_last_delivery_whose_dead_letter_is_refused_goes_back_as_a_fresh_copy() {
    let cosmos = embedded().await;
    let users = provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let queue = HoldOrder::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(queue);
    let direct = rabbitmq::connect(WAIT).await;
    rabbitmq::delete_queue(&direct, &dead_letters, WAIT).await;
    declare_quorum(queue, Some(4)).await;
    let refusing = rabbitmq::Policy::set(
        "chatter-test-quorum-held",
        &dead_letters,
        r#"{"max-length":0,"overflow":"reject-publish"}"#,
    );
    let message = BrokeredMessage::json("held", queue, json!({ "userId": "u-held" }).to_string());
    direct.publish(message).await.unwrap();
    let foreign = foreign_channel().await;
    publish_foreign(&foreign, queue, b"no brokered message").await;
    for _ in 0..4 {
        crash_holding(queue, 2).await;
    }

    let runtime = Runtime::builder()
        .registry(registry_named("HoldOrder"))
        .cosmos(cosmos)
        .broker(direct.clone())
        .without_relay()
        .start()
        .await
        .unwrap();
    eventually(
        WAIT,
        Duration::from_millis(50),
        "the copy is handled",
        || async {
            find_document(&users, &[json!("u-held")], "u-held")
                .await
                .is_some()
        },
    )
    .await;
    drop(refusing);
    let letter = pull(&dead_letters).await;
    assert_eq!(letter.data, b"no brokered message");
    let headers = letter.properties.headers().clone().unwrap_or_default();
    assert!(
        !headers.contains_key("x-delivery-count"),
        "a copy does not carry the queue's count of the original: {headers:?}"
    );
    eventually(
        WAIT,
        Duration::from_millis(100),
        "the queue settled all",
        || async { rabbitmq::messages(queue) == Some(0) },
    )
    .await;
    runtime.shutdown().await;
    rabbitmq::delete_emptied(&direct, &[queue, dead_letters.as_str()], WAIT).await;
}

// A command whose dead letters the broker could never carry would redeliver a poison forever:
// the runtime refuses to start, naming it.
#[tokio::test]
async fn start_refuses_a_command_whose_dead_letters_rabbitmq_could_never_carry() {
    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let direct = rabbitmq::connect(WAIT).await;
    let err = Runtime::builder()
        .registry(registry_named("RenameUser"))
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

// Another service declared a command's dead-letter queue otherwise (non-durable): the start
// refuses, naming the queue and the fix, instead of the first poison message finding out.
#[tokio::test]
async fn start_refuses_a_dead_letter_queue_declared_otherwise() {
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::{FieldTable, ShortString};

    let cosmos = embedded().await;
    provisioned(&cosmos, "accounts", "users", &["/userId"]).await;
    let dead_letters = dead_letter_destination(ArchiveUser::DOCUMENT_RELIABILITY.destination);
    let foreign = rabbitmq::foreign_channel(WAIT).await;
    let _ = foreign
        .queue_delete(
            ShortString::from(dead_letters.as_str()),
            QueueDeleteOptions::default(),
        )
        .await;
    let foreign = rabbitmq::foreign_channel(WAIT).await;
    foreign
        .queue_declare(
            ShortString::from(dead_letters.as_str()),
            QueueDeclareOptions {
                durable: false,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let error = Runtime::builder()
        .registry(registry_named("ArchiveUser"))
        .cosmos(cosmos)
        .broker(rabbitmq::connect(WAIT).await)
        .without_relay()
        .start()
        .await
        .unwrap_err();
    let text = chatter_runtime::error::ErrorChain(&error).to_string();
    assert!(
        matches!(error, chatter_runtime::error::StartError::Broker { .. }),
        "{text}"
    );
    assert!(
        text.contains(&dead_letters) && text.contains("delete it or declare it so"),
        "{text}"
    );
    foreign
        .queue_delete(
            ShortString::from(dead_letters.as_str()),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
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
        .registry(registry_named("RegisterUser"))
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
    let found = acked(&mut letters, 2, WAIT).await;
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
    rabbitmq::delete_emptied(&direct, &[commands, dead_letters.as_str()], WAIT).await;
}

/// A raw AMQP channel: a foreign client publishing what chatter itself never would.
async fn foreign_channel() -> lapin::Channel {
    let connection =
        lapin::Connection::connect(rabbitmq::URI, lapin::ConnectionProperties::default())
            .await
            .unwrap();
    // The connection lives as long as the channel needs it.
    let connection = Box::leak(Box::new(connection));
    connection.create_channel().await.unwrap()
}

/// Publishes a message without a message id (so no Brokered Message), non-persistent and
/// expiring, to `queue`.
async fn publish_foreign(channel: &lapin::Channel, queue: &str, body: &[u8]) {
    use lapin::options::BasicPublishOptions;
    use lapin::types::ShortString;
    let properties = lapin::BasicProperties::default().with_expiration(ShortString::from("600000"));
    channel
        .basic_publish(
            ShortString::default(),
            ShortString::from(queue),
            BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// The next message on `queue`, pulled raw on a channel of its own; panics if none arrives
/// within the wait. A queue not declared yet (its first message is on its way) is waited for.
async fn pull(queue: &str) -> lapin::message::Delivery {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    use lapin::types::ShortString;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut channel = foreign_channel().await;
    loop {
        match channel
            .basic_get(ShortString::from(queue), BasicGetOptions::default())
            .await
        {
            Ok(Some(message)) => {
                message
                    .delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .unwrap();
                return message.delivery;
            }
            Ok(None) => {}
            // 404 closed the channel.
            Err(error) if error.to_string().contains("NOT_FOUND") => {
                channel = foreign_channel().await;
            }
            Err(error) => panic!("basic.get `{queue}`: {error}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing arrived on {queue}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// A delivery that is no Brokered Message (a foreign client's message without a message id) is
// moved verbatim to the dead-letter queue with its reason, persistent and without its expiration,
// and the queue behind it keeps flowing; a dead-letter queue deleted meanwhile is declared again.
#[tokio::test]
async fn a_delivery_that_is_no_brokered_message_is_moved_verbatim_to_the_dead_letter_queue() {
    let consumer = rabbitmq::connect(WAIT).await;
    let admin = rabbitmq::connect(WAIT).await;
    let queue = format!("chatter-test-foreign-{}", uuid::Uuid::new_v4().simple());
    let dead_letters = dead_letter_destination(&queue);
    let mut subscription = rabbitmq::subscribe(&consumer, &queue, WAIT).await;
    let foreign = foreign_channel().await;

    for round in ["first", "after the dead-letter queue was deleted"] {
        publish_foreign(&foreign, &queue, round.as_bytes()).await;
        let item = tokio::time::timeout(WAIT, subscription.next())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(
                item,
                Err(chatter_runtime::broker::BrokerError::Undecodable { .. })
            ),
            "{item:?}"
        );
        let letter = pull(&dead_letters).await;
        assert_eq!(letter.data, round.as_bytes(), "the body is kept");
        assert_eq!(*letter.properties.delivery_mode(), Some(2), "persistent");
        assert_eq!(*letter.properties.expiration(), None, "does not expire");
        let reason = match letter.properties.headers().as_ref().and_then(|h| {
            h.inner()
                .get(chatter_runtime::broker::DEAD_LETTER_REASON_HEADER)
                .cloned()
        }) {
            Some(lapin::types::AMQPValue::LongString(text)) => {
                String::from_utf8_lossy(text.as_bytes()).into_owned()
            }
            other => panic!("no reason header: {other:?}"),
        };
        assert!(reason.contains("no message-id"), "{reason}");
        // The next round finds the dead-letter queue gone (the consumer's broker declared it).
        rabbitmq::delete_queue(&admin, &dead_letters, WAIT).await;
    }
    // A Brokered Message behind them is delivered as usual.
    consumer
        .publish(BrokeredMessage::json("fine", &queue, "{}"))
        .await
        .unwrap();
    let delivery = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(delivery.message.message_id, "fine");
    delivery.ack().await.unwrap();
    drop(subscription);
    assert_eq!(rabbitmq::delete_queue(&admin, &queue, WAIT).await, 0);
}
