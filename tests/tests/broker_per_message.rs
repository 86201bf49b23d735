//! A broker per message (R3.29, R3.30, R3.46): the relay publishes each Outbox Document through
//! the broker its message context's `Chatter.Infrastructure.Type` names
//! (`RuntimeBuilder::broker_for`), and through the default broker when it names none. Once
//! brokers are given by name, a name without a broker is a broker refusal: the document stays
//! pending, the lease shows as blocked naming the missing system, and a runtime given that
//! broker publishes it. Without `broker_for`, every document goes to the one broker.
//! What a handler sends outside the relay follows the same choice (issue 32 item 8): a command
//! whose key does not resolve publishes its messages directly through the broker they name, and
//! `ctx.send` checks a message against that broker, not the default.

use std::sync::Arc;
use std::time::Duration;

use chatter_runtime::broker::{Broker, InMemoryBroker, MessagingSystems, Refusal};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, BrokeredMessage, DocumentReliable, HandlerContext, Outcome, Runtime,
    error::StartError, handler,
};
use chatter_tests::broker::Received;
use chatter_tests::relay::fast_relay;
use chatter_tests::wait::eventually;
use serde::{Deserialize, Serialize};
use serde_json::json;

const INFRASTRUCTURE: &str = "Chatter.Infrastructure.Type";
const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// Ships an order; its event goes through the messaging system the command names (none: the
/// default broker).
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "per-message",
    container = "orders",
    lease = "orders-leases"
)]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct ShipOrder {
    pub order_id: String,
    pub messaging_system: Option<String>,
}

#[handler]
async fn ship(command: ShipOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id }))?;
    let mut event = BrokeredMessage::json(
        format!("{}:Shipped", ctx.message_id()),
        "order-events",
        json!({ "orderId": command.order_id }).to_string(),
    );
    if let Some(system) = command.messaging_system {
        event.context.insert(INFRASTRUCTURE.into(), json!(system));
    }
    ctx.send(event)?;
    Ok(())
}

/// Notifies a customer; its event goes to the destination and messaging system the command
/// names. Without an order id its key does not resolve: the handler runs outside any batch and
/// its event is published directly.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "per-message",
    container = "orders",
    lease = "orders-leases"
)]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct NotifyCustomer {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<String>,
    pub destination: String,
    pub messaging_system: String,
}

#[handler]
async fn notify(command: NotifyCustomer, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let mut event = BrokeredMessage::json(
        format!("{}:Notified", ctx.message_id()),
        command.destination,
        "{}",
    );
    event
        .context
        .insert(INFRASTRUCTURE.into(), json!(command.messaging_system));
    ctx.send(event)?;
    Ok(())
}

fn notify_customer(order_id: Option<&str>, destination: &str, system: &str) -> NotifyCustomer {
    NotifyCustomer {
        order_id: order_id.map(str::to_owned),
        destination: destination.to_owned(),
        messaging_system: system.to_owned(),
    }
}

async fn store() -> CosmosConnection {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    for container in ["orders", "orders-leases"] {
        let path = if container == "orders" {
            "/orderId"
        } else {
            "/id"
        };
        provision::ensure_container(&cosmos, "per-message", container, &[path])
            .await
            .unwrap();
    }
    cosmos
}

fn ship_order(order_id: &str, messaging_system: Option<&str>) -> ShipOrder {
    ShipOrder {
        order_id: order_id.to_owned(),
        messaging_system: messaging_system.map(str::to_owned),
    }
}

#[tokio::test]
async fn each_document_is_published_through_the_broker_its_context_names_else_the_default() {
    let cosmos = store().await;
    let (default, audit) = (InMemoryBroker::new(), InMemoryBroker::new());
    let (to_default, to_audit) = (
        Received::on(&default, "order-events").await,
        Received::on(&audit, "order-events").await,
    );
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(default.clone())
        .broker_for("audit-bus", audit.clone())
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();

    for (message_id, system) in [
        ("named", Some("audit-bus")),
        // Matched ignoring ASCII case, as the .NET writer may spell it otherwise.
        ("named-otherwise", Some("Audit-Bus")),
        ("unnamed", None),
        ("blank", Some("  ")),
    ] {
        runtime
            .dispatch(ship_order(message_id, system), message_id)
            .await
            .unwrap();
    }
    runtime.relay_idle(WAIT).await.unwrap();

    let ids = |received: &Received| received.ids().into_iter().collect::<Vec<_>>();
    eventually(WAIT, POLL, "every event arrived", || async {
        to_default.distinct() + to_audit.distinct() == 4
    })
    .await;
    assert_eq!(
        ids(&to_audit),
        ["named-otherwise:Shipped", "named:Shipped"],
        "the messages naming the audit bus"
    );
    assert_eq!(
        ids(&to_default),
        ["blank:Shipped", "unnamed:Shipped"],
        "the messages naming no messaging system"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_document_naming_a_system_without_a_broker_blocks_its_lease_until_a_runtime_has_one() {
    let cosmos = store().await;
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(InMemoryBroker::new())
        .broker_for("audit-bus", InMemoryBroker::new())
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    runtime
        .dispatch(ship_order("to-nats", Some("nats")), "to-nats")
        .await
        .unwrap();

    let blocked = || async {
        runtime
            .health()
            .await
            .leases
            .into_iter()
            .find_map(|lease| lease.blocked)
    };
    eventually(WAIT, POLL, "the lease is blocked", || async {
        blocked().await.is_some()
    })
    .await;
    let blocked = blocked().await.unwrap_or_default();
    assert!(blocked.contains("`nats`"), "{blocked}");
    assert!(blocked.contains("broker_for"), "names the fix: {blocked}");
    assert!(!runtime.health().await.is_healthy());
    runtime.shutdown().await;

    // Not undeliverable: a runtime that has the broker publishes it.
    let nats = InMemoryBroker::new();
    let to_nats = Received::on(&nats, "order-events").await;
    let fixed = Runtime::builder()
        .cosmos(cosmos)
        .broker(InMemoryBroker::new())
        .broker_for("nats", nats.clone())
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    fixed.relay_idle(WAIT).await.unwrap();
    eventually(WAIT, POLL, "the event arrived", || async {
        to_nats.distinct() == 1
    })
    .await;
    assert_eq!(to_nats.count("to-nats:Shipped"), 1);
    fixed.shutdown().await;
}

#[tokio::test]
async fn without_brokers_by_name_every_document_goes_to_the_one_broker_whatever_it_names() {
    let cosmos = store().await;
    let broker = InMemoryBroker::new();
    let received = Received::on(&broker, "order-events").await;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(broker.clone())
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();

    // As a .NET writer names its own messaging system.
    runtime
        .dispatch(ship_order("dotnet", Some("RabbitMQ")), "dotnet")
        .await
        .unwrap();
    runtime.relay_idle(WAIT).await.unwrap();

    eventually(WAIT, POLL, "the event arrived", || async {
        received.distinct() == 1
    })
    .await;
    assert_eq!(received.count("dotnet:Shipped"), 1);
    runtime.shutdown().await;
}

#[tokio::test]
async fn start_refuses_a_blank_or_repeated_messaging_system() {
    for (names, problem) in [(&[" "][..], "blank"), (&["nats", "NATS"][..], "twice")] {
        let builder = names.iter().fold(
            Runtime::builder().broker(InMemoryBroker::new()),
            |builder, name| builder.broker_for(*name, InMemoryBroker::new()),
        );
        // Refused before anything connects: no store is configured here.
        let error = builder.start().await.unwrap_err();
        assert!(
            matches!(error, StartError::MessagingSystem { .. }),
            "{names:?}: {error}"
        );
        assert!(error.to_string().contains(problem), "{error}");
    }
}

#[tokio::test]
async fn a_message_naming_no_known_system_is_refused_not_rejected_for_good() {
    let systems = MessagingSystems::new(Arc::new(InMemoryBroker::new()))
        .with("audit-bus", Arc::new(InMemoryBroker::new()));
    let mut message = BrokeredMessage::json("m-1", "order-events", "{}");
    message.context.insert(INFRASTRUCTURE.into(), json!("nats"));

    let error = systems.publish(message.clone()).await.unwrap_err();

    assert_eq!(error.refusal(), Some(Refusal::UnknownMessagingSystem));
    assert!(!error.is_permanent(), "{error}");
    assert!(
        error.to_string().contains("audit-bus"),
        "names the known systems: {error}"
    );
    // What a handler's send checks passes: registering the broker is the fix.
    systems.check(&message).unwrap();
    // A non-string name can never be read: refused for good (the contract stamps such a
    // document undeliverable before it gets here).
    message.context.insert(INFRASTRUCTURE.into(), json!(7));
    assert!(systems.publish(message).await.unwrap_err().is_permanent());
}

#[tokio::test]
async fn a_command_whose_key_does_not_resolve_publishes_through_the_broker_its_message_names() {
    let cosmos = store().await;
    let (default, audit) = (InMemoryBroker::new(), InMemoryBroker::new());
    let (to_default, to_audit) = (
        Received::on(&default, "customer-events").await,
        Received::on(&audit, "customer-events").await,
    );
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(default.clone())
        .broker_for("audit-bus", audit.clone())
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();

    let outcome = runtime
        .dispatch(
            notify_customer(None, "customer-events", "audit-bus"),
            "keyless",
        )
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::HandledAtLeastOnce, "published directly");
    eventually(WAIT, POLL, "the event arrived", || async {
        to_default.distinct() + to_audit.distinct() == 1
    })
    .await;
    assert_eq!(to_audit.count("keyless:Notified"), 1, "on the audit bus");
    assert_eq!(to_default.distinct(), 0, "nothing on the default broker");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_send_is_checked_against_the_broker_its_message_names_not_the_default() {
    let cosmos = store().await;
    // A server of the test's own: the shared one's `max_payload` fails chatter's start check.
    let server = chatter_tests::nats::NatsServer::start().await;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .broker(InMemoryBroker::new())
        .broker_for("nats", chatter_tests::nats::connect(&server.url()).await)
        .consume(false)
        .relay_options(fast_relay(Duration::from_secs(5)))
        .start()
        .await
        .unwrap();

    // The in-memory default takes any named queue; NATS never a subject with a space. Checked
    // for a participant (its Outbox Document is never written) and for a keyless command.
    for (message_id, order_id) in [("participant", Some("o-1")), ("keyless", None)] {
        let error = runtime
            .dispatch(
                notify_customer(order_id, "customer events", "nats"),
                message_id,
            )
            .await
            .unwrap_err();
        let chain = chatter_runtime::error::ErrorChain(&error).to_string();
        assert!(chain.contains("whitespace"), "{message_id}: {chain}");
    }
    runtime.shutdown().await;
}
