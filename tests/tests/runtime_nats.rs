//! A runtime on NATS JetStream end to end, on a `nats-server` of the test's own (its
//! `max_payload` is 2 MB, as chatter's start-time check needs): the relay publishes the
//! handlers' events through JetStream, the consumers retry a failed delivery by a delayed `nak`
//! counted by the server and dead-letter one that ran out of attempts (reason and attempts in
//! its context, the original `term`ed); `start()` refuses a stream whose duplicate window the
//! relay could outlast.
#![cfg(feature = "nats")]

use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::stream::Config;
use chatter_runtime::broker::{Broker, NatsBroker};
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Runtime,
    broker::dead_letter_destination, constants::ATTEMPTS_CONTEXT_KEY,
    constants::DEAD_LETTER_REASON_CONTEXT_KEY, error::StartError, handler,
};
use chatter_tests::broker::{acked, assert_quiet_for};
use chatter_tests::nats::{self, NatsServer};
use chatter_tests::relay::fast_relay;
use chatter_tests::store::{embedded, find_document, provisioned_with_leases};
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const EVENTS: &str = "nats-user-events";

/// Registers a user and emits `UserRegistered`; always fails for "always-fails", fails its
/// first attempt for "flaky".
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "accounts", container = "users", lease = "users-leases")]
#[partition_key(path = "/userId")]
#[chatter(destination = "nats-register-user", max_delivery_attempts = 2)]
#[serde(rename_all = "camelCase")]
pub struct RegisterUser {
    pub user_id: String,
}

/// The attempts each message id saw: (attempt as the handler saw it redelivered or not).
static SEEN: Mutex<Vec<(String, bool)>> = Mutex::new(Vec::new());

#[handler]
async fn register_user(command: RegisterUser, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let attempt = {
        let mut seen = SEEN.lock().unwrap();
        seen.push((command.user_id.clone(), ctx.redelivered()));
        seen.iter().filter(|(id, _)| *id == command.user_id).count()
    };
    if command.user_id == "always-fails" || (command.user_id == "flaky" && attempt == 1) {
        return Err("the user directory is read-only".into());
    }
    ctx.upsert(json!({ "id": command.user_id, "userId": command.user_id }))?;
    ctx.send_json(
        &format!("{}:UserRegistered", ctx.message_id()),
        EVENTS,
        &json!({ "userId": command.user_id }),
    )?;
    Ok(())
}

/// A stream on `broker` storing the command's subjects and the events, with `duplicate_window`.
async fn stream(broker: &NatsBroker, duplicate_window: Duration) {
    let commands = RegisterUser::DOCUMENT_RELIABILITY.destination;
    broker
        .jetstream()
        .create_stream(Config {
            name: "CHATTER".into(),
            subjects: vec![commands.into(), format!("{commands}.>"), EVENTS.into()],
            duplicate_window,
            ..Config::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn start_refuses_a_stream_whose_duplicate_window_the_relay_can_outlast() {
    let server = NatsServer::start().await;
    let broker = nats::connect(&server.url()).await;
    stream(&broker, Duration::from_secs(30)).await;
    let cosmos = embedded().await;
    provisioned_with_leases(&cosmos, "accounts", "users", &["/userId"], "users-leases").await;
    let error = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker)
        .relay_options(fast_relay(Duration::from_secs(20)))
        .start()
        .await
        .unwrap_err();
    assert!(matches!(error, StartError::Broker { .. }), "{error}");
    let chain = format!("{error}: {}", std::error::Error::source(&error).unwrap());
    assert!(
        chain.contains("`duplicate_window` of stream `CHATTER`"),
        "{chain}"
    );
    assert!(
        chain.contains("80s"),
        "lease expiry 20 s + the 60 s suspension window: {chain}"
    );
}

#[tokio::test]
async fn commands_through_jetstream_are_retried_by_delayed_nak_dead_lettered_and_their_events_relayed()
 {
    let server = NatsServer::start().await;
    let broker = nats::connect(&server.url()).await;
    stream(&broker, Duration::from_secs(300)).await;
    let cosmos = embedded().await;
    let users =
        provisioned_with_leases(&cosmos, "accounts", "users", &["/userId"], "users-leases").await;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker.clone())
        .relay_options(fast_relay(Duration::from_secs(20)))
        .redelivery_delay(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let commands = RegisterUser::DOCUMENT_RELIABILITY.destination;
    let dead_letters = dead_letter_destination(commands);
    let mut events = nats::subscribe(&broker, EVENTS).await;
    let mut letters = nats::subscribe(&broker, &dead_letters).await;

    let command = |id: &str, user: &str| {
        BrokeredMessage::json(id, commands, json!({ "userId": user }).to_string())
    };
    for message in [
        command("m-healthy", "healthy"),
        command("m-flaky", "flaky"),
        command("m-hopeless", "always-fails"),
        BrokeredMessage::json("m-not-json", commands, "{{{"),
    ] {
        broker.publish(message).await.unwrap();
    }

    // Two dead letters: the poison after its 2 attempts, the non-JSON body at once.
    let found = acked(&mut letters, 2, WAIT).await;
    let (hopeless, not_json) = (&found[0], &found[1]);
    assert_eq!(hopeless.message_id, "m-hopeless");
    assert_eq!(
        hopeless.context[ATTEMPTS_CONTEXT_KEY], 2,
        "counted by the server"
    );
    let why = hopeless.context[DEAD_LETTER_REASON_CONTEXT_KEY]
        .as_str()
        .unwrap();
    assert!(why.contains("the user directory is read-only"), "{why}");
    assert_eq!(not_json.message_id, "m-not-json");
    assert_eq!(not_json.context[ATTEMPTS_CONTEXT_KEY], 1);

    // The healthy and the flaky user each produce one event, relayed through JetStream.
    let relayed: Vec<String> = acked(&mut events, 2, WAIT)
        .await
        .into_iter()
        .map(|message| message.message_id)
        .collect();
    assert_eq!(
        relayed,
        ["m-flaky:UserRegistered", "m-healthy:UserRegistered"]
    );
    for user in ["healthy", "flaky"] {
        assert!(find_document(&users, &[json!(user)], user).await.is_some());
    }
    let seen = SEEN.lock().unwrap().clone();
    let attempts_of = |user: &str| -> Vec<bool> {
        seen.iter()
            .filter(|(id, _)| id == user)
            .map(|(_, again)| *again)
            .collect()
    };
    assert_eq!(
        attempts_of("flaky"),
        [false, true],
        "the retry came back marked redelivered"
    );
    assert_eq!(
        attempts_of("always-fails"),
        [false, true],
        "two attempts, no more"
    );

    // Termed and acked: nothing comes back.
    eventually(
        WAIT,
        Duration::from_millis(100),
        "the relay is idle",
        || async { runtime.relay_idle(Duration::from_secs(1)).await.is_ok() },
    )
    .await;
    assert_quiet_for(&mut letters, Duration::from_secs(1)).await;
    assert_quiet_for(&mut events, Duration::from_secs(1)).await;
    runtime.shutdown().await;
    // Every delivery of every durable consumer was settled for good (acked or termed): none is
    // waiting for its ack or to be delivered again.
    let mut stream = broker.jetstream().get_stream("CHATTER").await.unwrap();
    let names = nats::consumer_names(&stream).await;
    assert_eq!(
        names.len(),
        3,
        "commands, their dead letters, the events: {names:?}"
    );
    for name in names {
        let info = stream.consumer_info(&name).await.unwrap();
        assert_eq!((info.num_ack_pending, info.num_pending), (0, 0), "{name}");
    }
    let _ = stream.info().await;
}
