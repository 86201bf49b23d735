//! A consumer process of one standalone-inbox command, for `tests/inbox_kill_race.rs`:
//! `cargo build -p chatter-tests --features rabbitmq --bin inbox_worker`.
//!
//! Connects to the Cosmos endpoint in `CHATTER_COSMOS_ENDPOINT` (a `chatter-emulator` server) and
//! RabbitMQ at `CHATTER_RABBITMQ_URI`, and consumes `ChargeCard` from the queue named by
//! `CHATTER_TEST_QUEUE` (no relay) until its stdin is closed. Its handler prints
//! `handled <message id>` for every run (the side effect the test counts). With
//! `CHATTER_TEST_HOLD=<message id>` the handler of that id prints `holding <message id>` after
//! it and never returns: the test SIGKILLs the process there, mid-handler. With
//! `CHATTER_TEST_HANDLER_MS=<n>` every handler takes `n` ms, printing `holding <message id>` as
//! it starts. `CHATTER_TEST_DELIVERY_TIMEOUT_MS` sets the runtime's delivery timeout (and so the
//! inbox claim's length).
//!
//! Prints `started` on stdout once it consumes.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use chatter_runtime::broker::RabbitMqBroker;
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, Runtime, handler};
use chatter_tests::process::env;
use chatter_tests::rabbitmq::URI as DEFAULT_RABBITMQ_URI;
use chatter_tests::runtime::registry_at;
use serde::{Deserialize, Serialize};

/// Charges a card: a side effect outside Cosmos, guarded by the standalone inbox.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "cards", container = "idempotency")]
pub struct ChargeCard {
    pub amount: u32,
}

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

#[handler]
async fn charge_card(_command: ChargeCard, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    let id = ctx.message_id().to_owned();
    say(&format!("handled {id}"));
    if std::env::var("CHATTER_TEST_HOLD").is_ok_and(|hold| hold == id) {
        say(&format!("holding {id}"));
        futures::future::pending::<()>().await;
    }
    if let Some(ms) = env("CHATTER_TEST_HANDLER_MS").and_then(|ms| ms.parse().ok()) {
        say(&format!("holding {id}"));
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("inbox_worker: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let endpoint = env("CHATTER_COSMOS_ENDPOINT").ok_or("CHATTER_COSMOS_ENDPOINT is not set")?;
    let uri = env("CHATTER_RABBITMQ_URI").unwrap_or_else(|| DEFAULT_RABBITMQ_URI.to_owned());
    let queue = env("CHATTER_TEST_QUEUE").ok_or("CHATTER_TEST_QUEUE is not set")?;
    let cosmos = CosmosConnection::connect(&endpoint, None).await?;
    let rabbitmq = RabbitMqBroker::connect_retrying(&uri, Duration::from_secs(60)).await?;
    let delivery_timeout = env("CHATTER_TEST_DELIVERY_TIMEOUT_MS")
        .and_then(|ms| ms.parse().ok())
        .map_or(
            chatter_runtime::constants::DEFAULT_DELIVERY_TIMEOUT,
            Duration::from_millis,
        );
    let runtime = Runtime::builder()
        .delivery_timeout(delivery_timeout)
        .cosmos(cosmos)
        .broker(rabbitmq)
        .registry(registry_at::<ChargeCard>(&queue))
        .without_relay()
        .redelivery_delay(Duration::from_millis(50))
        .start()
        .await?;
    say("started");
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    tokio::time::timeout(Duration::from_secs(30), runtime.shutdown())
        .await
        .map_err(|_| "the runtime did not shut down within 30 s")?;
    Ok(())
}
