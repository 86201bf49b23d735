//! `chatter dead-letters list|replay|discard` against the machine's RabbitMQ (127.0.0.1:5672)
//! and NATS (127.0.0.1:4222, a stream of the test's own): dead letters listed with their reason
//! and attempts, replayed to the destination with the message id kept and the attempt count
//! reset, discarded; a foreign message refused a replay; the broker's password never printed.

mod common;

use std::time::Duration;

use async_nats::jetstream::stream::Config;
use chatter_runtime::broker::{Broker, NatsBroker, RabbitMqBroker, Subscription};
use chatter_runtime::{
    BrokeredMessage, broker::dead_letter_destination, constants::ATTEMPTS_CONTEXT_KEY,
    constants::DEAD_LETTER_REASON_CONTEXT_KEY,
};
use common::{chatter_on_broker, stderr, stdout};
use serde_json::Value;

const RABBITMQ: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const NATS: &str = "nats://127.0.0.1:4222";
const WAIT: Duration = Duration::from_secs(30);

/// A dead letter as chatter's consumer writes one.
fn letter(id: &str, destination: &str, reason: &str) -> BrokeredMessage {
    let mut message = BrokeredMessage::json(
        id,
        dead_letter_destination(destination),
        format!(r#"{{"orderId":"{id}"}}"#),
    );
    message
        .context
        .insert(DEAD_LETTER_REASON_CONTEXT_KEY.into(), Value::from(reason));
    message
        .context
        .insert(ATTEMPTS_CONTEXT_KEY.into(), Value::from(5));
    message
}

async fn next(subscription: &mut Subscription) -> BrokeredMessage {
    let delivery = tokio::time::timeout(WAIT, subscription.next())
        .await
        .expect("a delivery arrives")
        .unwrap()
        .unwrap();
    let message = delivery.message.clone();
    delivery.ack().await.unwrap();
    message
}

fn args<'a>(
    command: &'a str,
    broker: &'a str,
    destination: &'a str,
    more: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "dead-letters",
        command,
        "--broker",
        broker,
        "--destination",
        destination,
    ];
    args.extend_from_slice(more);
    args
}

/// A stream of the test's own on `broker`'s server storing `<prefix>.>`: its name and prefix.
async fn test_stream(broker: &NatsBroker) -> (String, String) {
    let prefix = format!("chatter-test-dl-{}", uuid::Uuid::new_v4().simple());
    let stream = format!("CHATTER_TEST_DL_{}", uuid::Uuid::new_v4().simple());
    broker
        .jetstream()
        .create_stream(Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(300),
            max_age: Duration::from_secs(600),
            ..Config::default()
        })
        .await
        .unwrap();
    (stream, prefix)
}

#[tokio::test(flavor = "multi_thread")]
async fn rabbitmq_dead_letters_are_listed_replayed_with_their_id_and_discarded() {
    let broker = RabbitMqBroker::connect(RABBITMQ).await.unwrap();
    let destination = format!("chatter-test-dl-{}", uuid::Uuid::new_v4().simple());
    let d = destination.as_str();
    // A reason as the consumer writes it: what an operator needs comes at its end, past any
    // width a table cell would be cut to.
    let failed = "it failed on each of its 5 delivery attempts; the last: the handler \
                  `export_order` failed: the directory is read-only";
    for (id, reason) in [("d-1", failed), ("d-2", "poison")] {
        broker.publish(letter(id, d, reason)).await.unwrap();
    }

    let listed = chatter_on_broker(RABBITMQ, &args("list", "rabbitmq", d, &[]), None).await;
    assert_eq!(listed.status.code(), Some(1), "{}", stderr(&listed));
    let text = stdout(&listed);
    assert!(
        text.contains("d-1") && text.contains("the directory is read-only"),
        "{text}"
    );
    assert!(text.contains("2 dead letters"), "{text}");

    // Declined, then a dry run: nothing moves.
    let declined = chatter_on_broker(
        RABBITMQ,
        &args("replay", "rabbitmq", d, &["--id", "d-1"]),
        Some("n\n"),
    )
    .await;
    assert_eq!(declined.status.code(), Some(1));
    let dry = chatter_on_broker(
        RABBITMQ,
        &args("discard", "rabbitmq", d, &["--all", "--dry-run"]),
        None,
    )
    .await;
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(stdout(&dry).contains("discard will take these 2 dead letters"));

    let mut commands = broker.subscribe(d).await.unwrap();
    let replayed = chatter_on_broker(
        RABBITMQ,
        &args(
            "replay",
            "rabbitmq",
            d,
            &["--id", "d-1", "--id", "nope", "--yes"],
        ),
        None,
    )
    .await;
    assert_eq!(
        replayed.status.code(),
        Some(1),
        "a missing id is reported: {}",
        stdout(&replayed)
    );
    assert!(stdout(&replayed).contains("not found: nope"));
    assert!(
        stdout(&replayed).contains("1 dead letter replayed"),
        "{}",
        stdout(&replayed)
    );
    let again = next(&mut commands).await;
    assert_eq!(again.message_id, "d-1", "the message id is kept");
    assert_eq!(again.destination, d);
    assert!(
        !again.context.contains_key(ATTEMPTS_CONTEXT_KEY),
        "attempts reset"
    );
    assert!(!again.context.contains_key(DEAD_LETTER_REASON_CONTEXT_KEY));

    let json = chatter_on_broker(RABBITMQ, &args("list", "rabbitmq", d, &[]), None).await;
    assert!(
        !stdout(&json).contains("d-1") && stdout(&json).contains("d-2"),
        "{}",
        stdout(&json)
    );
    let discarded = chatter_on_broker(
        RABBITMQ,
        &args("discard", "rabbitmq", d, &["--all", "--yes"]),
        None,
    )
    .await;
    assert_eq!(discarded.status.code(), Some(0), "{}", stderr(&discarded));
    let empty = chatter_on_broker(RABBITMQ, &args("list", "rabbitmq", d, &[]), None).await;
    assert_eq!(empty.status.code(), Some(0));
    assert!(stdout(&empty).contains("no dead letters"));
    drop(commands);
    broker.delete_queue(d).await.unwrap();
    broker
        .delete_queue(&dead_letter_destination(d))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_dead_letters_are_replayed_each_time_and_a_foreign_one_can_only_be_discarded() {
    let broker = NatsBroker::connect(NATS).await.unwrap();
    let (stream, prefix) = test_stream(&broker).await;
    let destination = format!("{prefix}.orders");
    let d = destination.as_str();
    broker.publish(letter("d-1", d, "poison")).await.unwrap();
    broker
        .jetstream()
        .publish(dead_letter_destination(d), "foreign".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let mut commands = broker.subscribe(d).await.unwrap();

    // Replayed twice (dead-lettered again in between): stored both times, although the stream
    // still holds the first replay within its duplicate window.
    for round in 1..=2 {
        let replayed = chatter_on_broker(
            NATS,
            &args("replay", "nats", d, &["--id", "d-1", "--yes"]),
            None,
        )
        .await;
        assert_eq!(
            replayed.status.code(),
            Some(0),
            "round {round}: {}{}",
            stdout(&replayed),
            stderr(&replayed)
        );
        let again = next(&mut commands).await;
        assert_eq!(again.message_id, "d-1");
        assert!(!again.context.contains_key(ATTEMPTS_CONTEXT_KEY));
        if round == 1 {
            broker
                .publish(letter("d-1", d, "poison again"))
                .await
                .unwrap();
        }
    }

    let listed = chatter_on_broker(NATS, &args("list", "nats", d, &["--json"]), None).await;
    assert_eq!(listed.status.code(), Some(1));
    let letters: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(letters.as_array().unwrap().len(), 1, "{letters}");
    assert_eq!(letters[0]["replayable"], false);
    assert_eq!(letters[0]["body"], "foreign");

    let refused =
        chatter_on_broker(NATS, &args("replay", "nats", d, &["--all", "--yes"]), None).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stdout(&refused).contains("it is no Brokered Message: discard it"),
        "{}",
        stdout(&refused)
    );
    let discarded =
        chatter_on_broker(NATS, &args("discard", "nats", d, &["--all", "--yes"]), None).await;
    assert_eq!(discarded.status.code(), Some(0), "{}", stderr(&discarded));
    let empty = chatter_on_broker(NATS, &args("list", "nats", d, &[]), None).await;
    assert_eq!(empty.status.code(), Some(0), "{}", stdout(&empty));
    drop(commands);
    let _ = broker.jetstream().delete_stream(&stream).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_password_is_never_printed_and_a_missing_url_is_bad_input() {
    let secret = "s3cr3t-pa55word";
    let url = format!("amqp://guest:{secret}@127.0.0.1:5672/%2f");
    let refused = chatter_on_broker(&url, &args("list", "rabbitmq", "orders", &[]), None).await;
    assert_eq!(refused.status.code(), Some(3), "{}", stderr(&refused));
    let all = format!("{}{}", stdout(&refused), stderr(&refused));
    assert!(!all.contains(secret), "{all}");
    assert!(all.contains("cannot reach the broker"), "{all}");

    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_chatter"));
    command
        .args(args("list", "nats", "orders", &[]))
        .env_remove("CHATTER_BROKER_URL");
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("CHATTER_BROKER_URL"),
        "{}",
        stderr(&output)
    );
}

// `dead-letters` reads the broker only: its help offers no Cosmos account flags, and they are
// refused, while the commands that read the store keep them.
#[test]
fn dead_letters_offers_only_the_broker_flags_and_the_store_commands_the_account_flags() {
    let help = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatter"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    for verb in ["list", "replay", "discard"] {
        let shown = help(&["dead-letters", verb, "--help"]);
        assert!(shown.contains("--broker-url-file"), "{shown}");
        assert!(
            !shown.contains("--endpoint") && !shown.contains("--key-file"),
            "dead-letters {verb} offers the account flags: {shown}"
        );
    }
    for command in [&["outbox", "pending"][..], &["leases"], &["relay"]] {
        let shown = help(&[command, &["--help"]].concat());
        assert!(
            shown.contains("--endpoint") && shown.contains("--key-file"),
            "{command:?}: {shown}"
        );
    }
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_chatter"))
        .args(args(
            "list",
            "rabbitmq",
            "orders",
            &["--endpoint", "http://127.0.0.1:1"],
        ))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}

// A replay or a discard takes exactly the dead letters that were listed (and shown): one that
// arrives between the listing and the settling stays where it is.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_that_arrives_after_the_listing_is_not_taken() {
    use chatter_runtime::broker::{DeadLetterAction, DeadLetters};

    let rabbitmq = RabbitMqBroker::connect(RABBITMQ).await.unwrap();
    let nats = NatsBroker::connect(NATS).await.unwrap();
    let (stream, prefix) = test_stream(&nats).await;
    let destination = format!("{prefix}.orders");
    let d = destination.as_str();
    let brokers: [(&dyn DeadLetters, &dyn Broker); 2] = [(&rabbitmq, &rabbitmq), (&nats, &nats)];
    for (dead_letters, broker) in brokers {
        for id in ["d-1", "d-2"] {
            broker.publish(letter(id, d, "poison")).await.unwrap();
        }
        let listed = dead_letters.list(d, 100).await.unwrap();
        assert_eq!(listed.len(), 2);
        broker.publish(letter("d-late", d, "poison")).await.unwrap();
        let outcome = dead_letters
            .settle(d, &listed, DeadLetterAction::Discard)
            .await
            .unwrap();
        assert_eq!(outcome.done, ["d-1", "d-2"]);
        assert!(
            outcome.refused.is_empty() && outcome.failed.is_none(),
            "{outcome:?}"
        );
        let left = dead_letters.list(d, 100).await.unwrap();
        let ids: Vec<&str> = left.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(ids, ["d-late"]);
        // Listed again and settled twice: the second finds it gone, and says so.
        let outcome = dead_letters
            .settle(d, &left, DeadLetterAction::Discard)
            .await
            .unwrap();
        assert_eq!(outcome.done, ["d-late"]);
        let again = dead_letters
            .settle(d, &left, DeadLetterAction::Discard)
            .await
            .unwrap();
        assert!(
            again.done.is_empty() && again.refused.len() == 1,
            "{again:?}"
        );
    }
    rabbitmq
        .delete_queue(&dead_letter_destination(d))
        .await
        .unwrap();
    let _ = nats.jetstream().delete_stream(&stream).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_url_without_slashes_is_never_printed_with_its_password() {
    // Nothing listens on port 1: each attempt fails, and its error names the URL.
    for (broker, url) in [
        ("rabbitmq", "amqp:guest:s3cret@127.0.0.1:1/%2f"),
        ("rabbitmq", "guest:s3cret@127.0.0.1:1"),
        ("nats", "nats:guest:s3cret@127.0.0.1:1"),
        ("nats", "guest:s3cret@127.0.0.1:1"),
    ] {
        let output = chatter_on_broker(
            url,
            &[
                "dead-letters",
                "list",
                "--broker",
                broker,
                "--destination",
                "x",
            ],
            None,
        )
        .await;
        let text = format!("{}{}", stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(3), "{text}");
        assert!(text.contains("127.0.0.1:1"), "it names the host: {text}");
        assert!(!text.contains("s3cret"), "{url}: {text}");
    }
}

/// Runs `chatter` with `args` against `broker_url`; once it asks its question, calls `cut` and
/// answers `y`. Its output, or `None` when it had not ended `bound` after the answer (then it is
/// killed).
async fn answered_after(
    broker_url: &str,
    args: &[&str],
    cut: impl FnOnce(),
    bound: Duration,
) -> Option<std::process::Output> {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_chatter"))
        .args(args)
        .env("CHATTER_BROKER_URL", broker_url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (asked, question) = tokio::sync::oneshot::channel();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut asked = Some(asked);
        let mut buffer = [0u8; 256];
        while let Ok(n) = stderr.read(&mut buffer) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&seen).contains("[y/N]")
                && let Some(asked) = asked.take()
            {
                let _ = asked.send(());
            }
        }
        seen
    });
    question
        .await
        .expect("chatter asks before it changes anything");
    cut();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"y\n").unwrap();
    drop(stdin);
    let waited = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        loop {
            if child.try_wait().unwrap().is_some() {
                return Some(child);
            }
            if started.elapsed() > bound {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap()?;
    let mut output = waited.wait_with_output().unwrap();
    output.stderr = reader.join().unwrap();
    Some(output)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_whose_broker_stops_answering_ends_with_exit_code_3_and_loses_nothing() {
    use chatter_tests::proxy::TcpProxy;
    use chatter_tests::rabbitmq;

    let broker = RabbitMqBroker::connect(RABBITMQ).await.unwrap();
    let destination = format!("chatter-test-dl-{}", uuid::Uuid::new_v4().simple());
    let d = destination.as_str();
    broker
        .publish(letter("d-1", d, "the directory is read-only"))
        .await
        .unwrap();
    let proxy = TcpProxy::start(rabbitmq::server_addr()).await;

    // A generous bound, far above the broker's own timeouts: the test fails on a hang only.
    // Heartbeats off: nothing but chatter's own bounds notices a silent connection.
    let output = answered_after(
        &format!("{}?heartbeat=0", rabbitmq::uri_through(&proxy)),
        &args("replay", "rabbitmq", d, &["--id", "d-1"]),
        // Its connection goes silent, never closed.
        || proxy.freeze(),
        Duration::from_secs(180),
    )
    .await
    .expect("the replay ends by itself when the broker stops answering");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let said = stderr(&output);
    assert!(said.contains("broker"), "{said}");
    assert!(!said.contains("guest:guest"), "no password printed: {said}");

    // Nothing was lost: the dead letter is still there.
    let listed = chatter_on_broker(RABBITMQ, &args("list", "rabbitmq", d, &[]), None).await;
    assert_eq!(listed.status.code(), Some(1), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("d-1"), "{}", stdout(&listed));
    let discarded = chatter_on_broker(
        RABBITMQ,
        &args("discard", "rabbitmq", d, &["--all", "--yes"]),
        None,
    )
    .await;
    assert_eq!(discarded.status.code(), Some(0), "{}", stderr(&discarded));
}
