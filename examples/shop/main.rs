//! The shop example: `cargo run -p chatter-examples --bin shop`.
//!
//! Receives `CreateOrder` commands through the broker; the handler writes the order and sends an
//! `OrderCreated` message through the outbox, and both commit in one Cosmos TransactionalBatch with
//! the inbox marker. One command is delivered twice: the second delivery is deduplicated. Then the
//! first order is cancelled (`CancelOrder` reads the order and writes it back only if it did not
//! change meanwhile) and cancelled again, which the handler rejects for good: that delivery is
//! dead-lettered at once with the reason. Right after each commit the handling process publishes
//! the `OrderCreated` and `OrderCancelled` messages to the `order-events` destination, where a
//! consumer receives them, and stamps each outbox document delivered with a one-day TTL; the
//! change-feed relay publishes whatever that missed (a crash, a broker outage).
//!
//! Uses the embedded in-memory Cosmos emulator, or the store named by `CHATTER_COSMOS_ENDPOINT`
//! (e.g. a `chatter-emulator` started with `cargo run -p chatter-emulator`). Exits by itself once
//! every outbox document it wrote is stamped delivered; with `--serve` it keeps receiving and
//! relaying (outbox documents other writers put in its container too) until Ctrl-C or SIGTERM,
//! then shuts down gracefully, releasing its leases.
//!
//! With `--telemetry` it installs OpenTelemetry providers that print to stdout: the relay's
//! drain metrics at exit, and each span as it ends (the consumer's `process CreateOrder`, and
//! the relay's `send order-events` in the same trace).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, InMemoryBroker, Subscription};
use chatter_runtime::cosmos::{self, ContainerClient, CosmosConnection, ReadOutcome};
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Rejection, Report, Runtime,
    broker::dead_letter_destination, constants::DEAD_LETTER_REASON_CONTEXT_KEY, handler,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Places an order for a quantity of one product.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    /// The order's id, also its partition key.
    pub order_id: String,
    /// How many items.
    pub quantity: u32,
}

/// The event the handler emits through the outbox.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct OrderCreated<'a> {
    order_id: &'a str,
    quantity: u32,
}

static HANDLER_RUNS: AtomicUsize = AtomicUsize::new(0);

#[handler]
async fn create_order(command: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    HANDLER_RUNS.fetch_add(1, Ordering::SeqCst);
    println!(
        "  handler: CreateOrder {} x{} (message {}{})",
        command.order_id,
        command.quantity,
        ctx.message_id(),
        if ctx.redelivered() {
            ", redelivered"
        } else {
            ""
        }
    );
    // Staged, not written: the order and the event commit together after the handler returns.
    ctx.upsert(json!({
        "id": command.order_id,
        "orderId": command.order_id,
        "quantity": command.quantity,
        "state": "placed",
    }))?;
    let event = OrderCreated {
        order_id: &command.order_id,
        quantity: command.quantity,
    };
    ctx.send_json(
        &format!("{}:OrderCreated", ctx.message_id()),
        "order-events",
        &event,
    )?;
    Ok(())
}

/// Cancels a placed order.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CancelOrder {
    /// The order to cancel.
    pub order_id: String,
}

/// An order document, as `create_order` writes it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Order {
    id: String,
    order_id: String,
    quantity: u32,
    state: String,
}

#[handler]
async fn cancel_order(command: CancelOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    // A read sees what is committed; the write below commits only if it is still that version.
    let Some(mut order) = ctx.read::<Order>(&command.order_id).await? else {
        return Err(Rejection::new(format!("order {} does not exist", command.order_id)).into());
    };
    if order.document.state == "cancelled" {
        // Wrong for good: never retried, dead-lettered at once with this reason.
        return Err(
            Rejection::new(format!("order {} is already cancelled", command.order_id)).into(),
        );
    }
    println!("  handler: CancelOrder {}", command.order_id);
    order.document.state = "cancelled".into();
    ctx.replace_if_match(&command.order_id, &order.document, &order.etag)?;
    ctx.send_json(
        &format!("{}:OrderCancelled", ctx.message_id()),
        "order-events",
        &json!({ "orderId": command.order_id }),
    )?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A `Report` prints as a sentence with its causes, not a `Debug` dump.
            eprintln!("shop: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Report> {
    let cosmos = open_store().await?;
    let serve = std::env::args().any(|a| a == "--serve");
    // Installed before `start()`, which takes the global providers it finds then.
    let telemetry = std::env::args()
        .any(|a| a == "--telemetry")
        .then(telemetry::install);
    let broker = InMemoryBroker::new();
    let received = watch_events(&broker).await?;
    // An operator's view of the commands refused for good.
    let mut refused = broker
        .subscribe(&dead_letter_destination("CancelOrder"))
        .await?;
    let runtime = Runtime::builder()
        .cosmos(cosmos.clone())
        .broker(broker.clone())
        .start()
        .await?;
    print_registrations(&runtime);

    // A run id keeps message ids unique when the store outlives this process.
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let orders = [(format!("order-{run}-1"), 3), (format!("order-{run}-2"), 1)];
    create_orders(&broker, &orders).await?;
    let container = cosmos.container("shop", "orders").await?;
    let (committed, mut outbox_ids) = read_back(&container, &orders).await?;
    let first_id = &orders[0].0;
    cancel_twice(&broker, &mut refused, first_id).await?;
    outbox_ids.push((
        first_id.clone(),
        chatter_runtime::cosmos::outbox_id(&format!("{first_id}:cancel:OrderCancelled"))?,
    ));

    let runs = HANDLER_RUNS.load(Ordering::SeqCst);
    println!(
        "handler ran {runs} times for 3 deliveries; the store holds {committed} documents \
         (2 orders, 2 inbox markers, 2 OrderCreated outbox documents): the duplicate committed nothing"
    );
    wait_delivered(&container, &outbox_ids).await?;
    // Publish happens before the stamp; the consumer may still be printing.
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while received.load(Ordering::SeqCst) < outbox_ids.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let events = received.load(Ordering::SeqCst);
    println!("the consumer received {events} events");

    if serve {
        println!(
            "serving until Ctrl-C or SIGTERM (publish to `CreateOrder`; outbox documents in shop/orders are relayed)"
        );
        shutdown_signal().await;
        println!("shutting down: finishing deliveries in flight and releasing leases");
    }
    runtime.shutdown().await;
    if let Some(telemetry) = telemetry {
        println!("telemetry recorded:");
        telemetry.shutdown();
    }
    if committed != 6 || runs != 3 || events < outbox_ids.len() {
        return Err(format!(
            "expected 6 documents, 3 handler runs and {} events; found {committed}, {runs} and {events}",
            outbox_ids.len()
        )
        .into());
    }
    Ok(())
}

/// The store from the environment, with the containers the commands name.
async fn open_store() -> Result<CosmosConnection, Report> {
    let cosmos = CosmosConnection::resolve().await?;
    println!(
        "store: {}",
        if cosmos.is_embedded() {
            "embedded in-memory emulator".to_owned()
        } else {
            cosmos.endpoint().to_owned()
        }
    );
    // Containers are the application's; in development the provisioning helper creates them.
    provision::ensure_container(&cosmos, "shop", "orders", &["/orderId"]).await?;
    provision::ensure_lease_container(&cosmos, "shop", "orders-leases").await?;
    Ok(cosmos)
}

/// A downstream service: consumes the events published from the outbox, and counts them.
async fn watch_events(broker: &InMemoryBroker) -> Result<Arc<AtomicUsize>, Report> {
    let mut events = broker.subscribe("order-events").await?;
    let received = Arc::new(AtomicUsize::new(0));
    let consumer_count = received.clone();
    tokio::spawn(async move {
        while let Some(delivery) = events.next().await {
            match delivery {
                Ok(delivery) => {
                    println!(
                        "  consumer: {} {}",
                        delivery.message.message_id, delivery.message.body
                    );
                    consumer_count.fetch_add(1, Ordering::SeqCst);
                    let _ = delivery.ack().await;
                }
                Err(error) => eprintln!("  consumer: undeliverable message: {error}"),
            }
        }
    });
    Ok(received)
}

fn print_registrations(runtime: &Runtime) {
    for r in runtime.commands() {
        println!(
            "registered {} <- destination `{}`, container {}/{} (lease {}), partition key {:?}",
            r.command_name,
            r.destination,
            r.database,
            r.container,
            r.lease,
            r.partition_key_paths().collect::<Vec<_>>()
        );
    }
}

/// Publishes a `CreateOrder` per order, the first one twice, and waits until every delivery is
/// settled (acked).
async fn create_orders(broker: &InMemoryBroker, orders: &[(String, u32)]) -> Result<(), Report> {
    println!(
        "publishing {} CreateOrder commands, the first one twice",
        orders.len()
    );
    for (order_id, quantity) in orders.iter().chain(&orders[..1]) {
        let body = serde_json::to_string(&CreateOrder {
            order_id: order_id.clone(),
            quantity: *quantity,
        })?;
        broker
            .publish(BrokeredMessage::json(
                format!("{order_id}:create"),
                "CreateOrder",
                body,
            ))
            .await?;
    }
    settled(
        broker,
        "CreateOrder",
        "the deliveries were not settled within 60 s",
    )
    .await
}

/// Waits until `destination` holds no delivery that is not settled.
async fn settled(
    broker: &InMemoryBroker,
    destination: &str,
    late: &'static str,
) -> Result<(), Report> {
    tokio::time::timeout(Duration::from_secs(60), async {
        while broker.pending_count(destination) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .map_err(|_| late)?;
    Ok(())
}

/// Reads back what each order's batch wrote: the order, its inbox marker, its outbox
/// document. How many were found, and each order's outbox document id.
async fn read_back(
    container: &ContainerClient,
    orders: &[(String, u32)],
) -> Result<(usize, Vec<(String, String)>), Report> {
    let mut committed = 0;
    let mut outbox_ids = Vec::new();
    for (order_id, _) in orders {
        let message_id = format!("{order_id}:create");
        let ids = [
            order_id.clone(),
            chatter_runtime::cosmos::inbox_id(&message_id)?,
            chatter_runtime::cosmos::outbox_id(&format!("{message_id}:OrderCreated"))?,
        ];
        for id in &ids {
            match cosmos::read_item(container, cosmos::partition_key(&[json!(order_id)])?, id)
                .await?
            {
                ReadOutcome::Found { document, .. } => {
                    committed += 1;
                    let kind = document
                        .get("_chatterType")
                        .and_then(|t| t.as_str())
                        .unwrap_or("order");
                    println!("  stored {kind:<6} {id}");
                }
                ReadOutcome::NotFound => println!("  MISSING {id}"),
            }
        }
        outbox_ids.push((order_id.clone(), ids[2].clone()));
    }
    Ok((committed, outbox_ids))
}

/// Cancels the first order, then cancels it again: the second is refused for good, and its
/// dead letter says why.
async fn cancel_twice(
    broker: &InMemoryBroker,
    refused: &mut Subscription,
    order_id: &str,
) -> Result<(), Report> {
    for attempt in ["cancel", "cancel-again"] {
        let body = serde_json::to_string(&CancelOrder {
            order_id: order_id.to_owned(),
        })?;
        broker
            .publish(BrokeredMessage::json(
                format!("{order_id}:{attempt}"),
                "CancelOrder",
                body,
            ))
            .await?;
        settled(
            broker,
            "CancelOrder",
            "the cancellations were not settled within 60 s",
        )
        .await?;
    }
    let letter = tokio::time::timeout(Duration::from_secs(10), refused.next())
        .await
        .map_err(|_| "the second cancellation was not dead-lettered within 10 s")?
        .ok_or("the dead-letter subscription closed")??;
    let reason = letter
        .message
        .context
        .get(DEAD_LETTER_REASON_CONTEXT_KEY)
        .and_then(|r| r.as_str())
        .unwrap_or_default()
        .to_owned();
    println!("  refused {}: {reason}", letter.message.message_id);
    letter.ack().await?;
    Ok(())
}

/// Each outbox document is published (right after its commit, or by the relay), then stamped
/// delivered: waits for every stamp.
async fn wait_delivered(
    container: &ContainerClient,
    outbox_ids: &[(String, String)],
) -> Result<(), Report> {
    println!("waiting for every outbox document to be published and stamped delivered");
    tokio::time::timeout(Duration::from_secs(60), async {
        for (order_id, id) in outbox_ids {
            loop {
                let key = cosmos::partition_key(&[json!(order_id)])?;
                let doc = cosmos::read_item(container, key, id).await?.into_document();
                if let Some(doc) = doc.filter(|d| d["status"] == "delivered") {
                    println!(
                        "  outbox {id}: status {}, ttl {}",
                        doc["status"], doc["ttl"]
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok::<_, BoxError>(())
    })
    .await
    .map_err(|_| "not every outbox document was stamped delivered within 60 s")??;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// OpenTelemetry providers printing to stdout (`--telemetry`). Point a real backend at chatter by
/// building these providers with an OTLP exporter (crate `opentelemetry-otlp`) instead.
mod telemetry {
    use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    pub(crate) struct Providers {
        meters: SdkMeterProvider,
        tracers: SdkTracerProvider,
    }

    /// Sets stdout providers as the global ones.
    pub(crate) fn install() -> Providers {
        let meters = SdkMeterProvider::builder()
            .with_reader(
                PeriodicReader::builder(opentelemetry_stdout::MetricExporter::default()).build(),
            )
            .build();
        let tracers = SdkTracerProvider::builder()
            .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
            .build();
        opentelemetry::global::set_meter_provider(meters.clone());
        opentelemetry::global::set_tracer_provider(tracers.clone());
        Providers { meters, tracers }
    }

    impl Providers {
        /// Prints what is left (the metrics) and stops.
        pub(crate) fn shutdown(self) {
            if let Err(error) = self.meters.shutdown() {
                eprintln!("shop: the metrics could not be printed: {error}");
            }
            if let Err(error) = self.tracers.shutdown() {
                eprintln!("shop: the spans could not be printed: {error}");
            }
        }
    }
}
