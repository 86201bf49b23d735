//! A relay-only chatter process for the multi-process tests (`tests/relay_kill_restart.rs`):
//! `cargo build -p chatter-tests --features rabbitmq --bin relay_worker`.
//!
//! Connects to the Cosmos endpoint in `CHATTER_COSMOS_ENDPOINT` (e.g. a `chatter-emulator`
//! server) and to RabbitMQ at `CHATTER_RABBITMQ_URI` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), registers the same `PlaceOrder` command as the
//! test, and runs the change-feed relay (no consumers) until its stdin is closed.
//!
//! - `CHATTER_NATS_URL` (feature `nats`): publish through NATS JetStream at that URL instead of
//!   RabbitMQ.
//! - `CHATTER_TEST_LEASE_EXPIRY_MS`: the lease expiry (default 3000 ms); the renew interval is
//!   a quarter of it, so a killed worker's leases are taken over soon after.
//! - `CHATTER_TEST_HANG_AFTER_PUBLISH=1`: publish through [`HangAfterPublish`], a test double
//!   that, once RabbitMQ confirmed a message, prints `published <message id>` on stdout and never
//!   returns, so the relay never stamps the outbox document. The test kills the process then.
//!
//! Prints `started` on stdout once the runtime runs.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::{Broker, BrokerError, RabbitMqBroker, Subscription};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::{BoxError, Runtime};
use chatter_tests::process::env;
use chatter_tests::rabbitmq::URI as DEFAULT_RABBITMQ_URI;
use chatter_tests::relay::fast_relay;
use futures::FutureExt;
use futures::future::BoxFuture;

// `PlaceOrder`, shared with the tests that run this worker (the same monitored container).
include!("../relay_commands/place_order.rs");

/// Test double (a fault the real parts cannot produce at a precise moment): the process
/// "dies" between the broker's confirm and the delivered stamp. Publishes through the real
/// RabbitMQ broker; after the confirm, prints `published <message id>` and never returns.
struct HangAfterPublish(RabbitMqBroker);

impl Broker for HangAfterPublish {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        async move {
            let message_id = message.message_id.clone();
            self.0.publish(message).await?;
            {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "published {message_id}");
                let _ = stdout.flush();
            }
            futures::future::pending::<()>().await;
            Ok(())
        }
        .boxed()
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.0.subscribe(destination)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("relay_worker: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let endpoint = env("CHATTER_COSMOS_ENDPOINT").ok_or("CHATTER_COSMOS_ENDPOINT is not set")?;
    let uri = env("CHATTER_RABBITMQ_URI").unwrap_or_else(|| DEFAULT_RABBITMQ_URI.to_owned());
    let expiry_ms: u64 = match env("CHATTER_TEST_LEASE_EXPIRY_MS") {
        Some(ms) => ms.parse()?,
        None => 3000,
    };
    let hang = env("CHATTER_TEST_HANG_AFTER_PUBLISH").as_deref() == Some("1");

    let expiry = Duration::from_millis(expiry_ms);
    let options = fast_relay(expiry).lease_renew_interval(expiry / 4);
    let cosmos = CosmosConnection::connect(&endpoint, None).await?;
    let builder = Runtime::builder()
        .cosmos(cosmos)
        .consume(false)
        .relay_options(options);
    // It may start while the broker is cut off (the chaos test): wait for it.
    #[cfg(feature = "nats")]
    if let Some(url) = env("CHATTER_NATS_URL") {
        let nats =
            chatter_runtime::broker::NatsBroker::connect_retrying(&url, Duration::from_secs(60))
                .await?;
        return serve(builder.broker(nats), false).await;
    }
    let rabbitmq = RabbitMqBroker::connect_retrying(&uri, Duration::from_secs(60)).await?;
    let builder = if hang {
        builder.broker(HangAfterPublish(rabbitmq))
    } else {
        builder.broker(rabbitmq)
    };
    serve(builder, hang).await
}

/// Starts the runtime, prints `started`, and runs until stdin closes.
async fn serve(builder: chatter_runtime::RuntimeBuilder, hang: bool) -> Result<(), BoxError> {
    let runtime = builder.start().await?;
    println!("started");

    // Run until the parent closes stdin (or dies); killing the process is the other way out.
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    if hang {
        // A publish that never returns keeps a graceful shutdown from finishing.
        std::process::exit(0);
    }
    tokio::time::timeout(Duration::from_secs(30), runtime.shutdown())
        .await
        .map_err(|_| "the runtime did not shut down within 30 s")?;
    Ok(())
}
