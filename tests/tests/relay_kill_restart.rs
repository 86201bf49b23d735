//! A relay process killed between the broker's confirm and the delivered stamp loses nothing:
//! the document stays pending, and a restarted relay takes the dead instance's lease once it
//! expires, publishes the message again and stamps the document delivered.
//!
//! Real parts: a `chatter-emulator` server in this process (port 0) is the store both
//! processes share, RabbitMQ at 127.0.0.1:5672 (guest/guest; `rabbitmq-server -detached`) is
//! the broker, and `relay_worker` (`tests/src/bin/relay_worker.rs`) is the relay process. Its
//! `CHATTER_TEST_HANG_AFTER_PUBLISH` mode is the one test double: it makes the process stop
//! exactly after the confirm, which no real part can do at that moment.
//!
//! No timed assertions: every wait is bounded with a generous timeout. Every spawned worker is
//! killed when its guard drops, also when the test fails.
#![cfg(feature = "rabbitmq")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chatter_runtime::broker::{Broker, RabbitMqBroker};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection, provision};
use chatter_runtime::message::BrokeredMessage;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::timeout;

const URI: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const DB: &str = "relay-kill";
const CONTAINER: &str = "orders";
const LEASES: &str = "orders-leases";
/// The workers' lease expiry: the restarted worker takes the killed one's lease after it.
const LEASE_EXPIRY_MS: &str = "3000";
/// Generous bound for anything that should happen "soon" on a noisy shared machine (a worker
/// start included).
const WAIT: Duration = Duration::from_secs(120);

/// The same declaration as in `relay_worker`, so both register the same monitored container.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "relay-kill", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
    pub events: String,
}

#[handler]
async fn place_order(command: PlaceOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id }))?;
    let event = format!("{}:OrderPlaced", ctx.message_id());
    ctx.send(BrokeredMessage::json(
        event,
        command.events,
        json!({ "orderId": command.order_id }).to_string(),
    ))?;
    Ok(())
}

/// A running `relay_worker`: its stdout lines, and a guard that kills it on drop.
struct Worker {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Worker {
    fn spawn(endpoint: &str, hang_after_publish: bool) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_relay_worker"));
        command
            .env("CHATTER_COSMOS_ENDPOINT", endpoint)
            .env("CHATTER_RABBITMQ_URI", URI)
            .env("CHATTER_TEST_LEASE_EXPIRY_MS", LEASE_EXPIRY_MS)
            .env_remove("CHATTER_COSMOS_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if hang_after_publish {
            command.env("CHATTER_TEST_HANG_AFTER_PUBLISH", "1");
        } else {
            command.env_remove("CHATTER_TEST_HANG_AFTER_PUBLISH");
        }
        let mut child = command.spawn().expect("relay_worker starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits for a stdout line starting with `prefix`; panics if the worker exits first.
    async fn line_starting_with(&mut self, prefix: &str) -> String {
        let wait = async {
            while let Some(line) = self.lines.recv().await {
                if line.starts_with(prefix) {
                    return line;
                }
            }
            panic!(
                "relay_worker exited before printing `{prefix}`: {:?}",
                self.child.try_wait()
            );
        };
        timeout(WAIT, wait)
            .await
            .unwrap_or_else(|_| panic!("relay_worker printed `{prefix}` within {WAIT:?}"))
    }

    /// SIGKILL, and reap the process.
    fn kill(mut self) {
        self.child.kill().expect("the worker is killed");
        self.child.wait().expect("the killed worker is reaped");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every message id delivered on one queue, with how often (each delivery is acked).
#[derive(Clone, Default)]
struct Deliveries(Arc<Mutex<BTreeMap<String, usize>>>);

impl Deliveries {
    async fn consume(broker: &RabbitMqBroker, queue: &str) -> Self {
        let deliveries = Self::default();
        let mut subscription = timeout(WAIT, broker.subscribe(queue))
            .await
            .expect("subscribing takes less than the bound")
            .expect("RabbitMQ runs at 127.0.0.1:5672 (`rabbitmq-server -detached`)");
        let sink = deliveries.clone();
        tokio::spawn(async move {
            while let Some(delivery) = subscription.next().await {
                let delivery = delivery.expect("the relay publishes Brokered Messages");
                *sink
                    .0
                    .lock()
                    .unwrap()
                    .entry(delivery.message.message_id.clone())
                    .or_default() += 1;
                delivery.ack().await.unwrap();
            }
        });
        deliveries
    }

    fn count(&self, message_id: &str) -> usize {
        self.0.lock().unwrap().get(message_id).copied().unwrap_or(0)
    }
}

async fn outbox_document(orders: &ContainerClient, order_id: &str, message_id: &str) -> Value {
    let id = chatter_runtime::document::outbox_id(message_id).unwrap();
    cosmos::read_item(
        orders,
        cosmos::partition_key(&[json!(order_id)]).unwrap(),
        &id,
    )
    .await
    .unwrap()
    .into_document()
    .unwrap_or_else(|| panic!("outbox document {id} exists"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_publishing_and_before_stamping_is_republished_by_its_successor() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let emulator = chatter_emulator::EmulatorServer::from_listener(listener)
        .unwrap()
        .spawn();
    let cosmos = CosmosConnection::connect(emulator.endpoint(), None)
        .await
        .unwrap();
    provision::ensure_container(&cosmos, DB, CONTAINER, &["/orderId"])
        .await
        .unwrap();
    provision::ensure_lease_container(&cosmos, DB, LEASES)
        .await
        .unwrap();
    let orders = cosmos.container(DB, CONTAINER).await.unwrap();

    let rabbitmq = timeout(WAIT, RabbitMqBroker::connect(URI))
        .await
        .expect("connecting to RabbitMQ takes less than the bound")
        .expect("RabbitMQ runs at 127.0.0.1:5672 (`rabbitmq-server -detached`)");
    let queue = format!("chatter-test-relay-kill-{}", uuid::Uuid::new_v4());
    let deliveries = Deliveries::consume(&rabbitmq, &queue).await;

    // The outbox document, written by a process that does not relay.
    let writer = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(rabbitmq.clone())
        .consume(false)
        .without_relay()
        .start()
        .await
        .unwrap();
    let order_id = "order-1";
    let command_id = format!("{order_id}:place");
    let event_id = format!("{command_id}:OrderPlaced");
    writer
        .dispatch(
            PlaceOrder {
                order_id: order_id.into(),
                events: queue.clone(),
            },
            command_id,
        )
        .await
        .unwrap();
    assert_eq!(
        outbox_document(&orders, order_id, &event_id).await["status"],
        "pending"
    );

    // The first relay publishes (RabbitMQ confirmed it) and dies before stamping.
    let mut first = Worker::spawn(emulator.endpoint(), true);
    let published = first.line_starting_with("published ").await;
    assert_eq!(published, format!("published {event_id}"));
    first.kill();
    let doc = outbox_document(&orders, order_id, &event_id).await;
    assert_eq!(
        doc["status"], "pending",
        "a relay killed before stamping leaves the document pending: {doc}"
    );
    assert!(doc.get("ttl").is_none(), "{doc}");

    // Its successor takes the expired lease, publishes again and stamps.
    let mut second = Worker::spawn(emulator.endpoint(), false);
    second.line_starting_with("started").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let doc = outbox_document(&orders, order_id, &event_id).await;
        if doc["status"] == "delivered" && deliveries.count(&event_id) >= 2 {
            assert_eq!(doc["ttl"], json!(86400), "{doc}");
            break;
        }
        assert_eq!(doc["status"], "pending", "{doc}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT:?}: the message arrived {} times and the document is {doc}",
            deliveries.count(&event_id)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        deliveries.count(&event_id) >= 2,
        "the message was published before the kill and again after the restart"
    );

    drop(second);
    writer.shutdown().await;
    timeout(WAIT, rabbitmq.delete_queue(&queue))
        .await
        .expect("deleting the queue takes less than the bound")
        .expect("the test queue is deleted");
}
