//! A simulated chatter process: a thread with a Tokio runtime of its own, running one
//! `chatter_runtime::Runtime` (its consumers, its pipeline relay and the inbox's relay) against
//! the run's store and broker.
//!
//! **A crash** drops that Tokio runtime: every task stops at the await it was at, nothing is
//! settled, nothing released, no lease given up, no claim released. What the process held the
//! others find as a dead process leaves it (its unsettled deliveries go back to their queue,
//! as a closed connection's do; its leases and claims run out).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::testing::MonotonicClock;
use chatter_runtime::{Runtime, relay::RelayOptions};
use tokio::sync::oneshot;

use super::broker::SimBroker;
use super::commands::Recorder;

/// The timings of every instance: production's, compressed so that a run takes seconds. Their
/// ratios keep the checks `start()` makes.
pub fn relay_options(compression: u32) -> RelayOptions {
    RelayOptions::default()
        .poll_interval(Duration::from_millis(100))
        // Short enough that a crashed instance's leases move within the run, long enough that
        // a machine busy with other tests does not expire every lease every second.
        .lease_renew_interval(Duration::from_millis(500))
        .lease_expiry(Duration::from_secs(3))
        .lease_acquire_interval(Duration::from_millis(300))
        .store_timeout(Duration::from_secs(5))
        .publish_timeout(Duration::from_secs(3))
        .handler_timeout(Duration::from_secs(10))
        .max_backoff(Duration::from_millis(100))
        .backlog_interval(Duration::from_millis(1000))
        // The sweep runs in every run: a document it finds stranded is a violation.
        .sweep_interval(Duration::from_millis(500))
        .stranded_after(Duration::from_secs(2))
        .suspension_clock(Arc::new(Compressed::new(compression)))
}

/// A monotonic clock running `factor` times faster than the real one: the Drain Suspension
/// window (60 s) passes in 60/`factor` s.
#[derive(Debug)]
pub struct Compressed {
    origin: std::time::Instant,
    factor: u32,
}

impl Compressed {
    pub fn new(factor: u32) -> Self {
        Self {
            origin: std::time::Instant::now(),
            factor,
        }
    }
}

impl MonotonicClock for Compressed {
    fn now(&self) -> Duration {
        self.origin.elapsed() * self.factor
    }
}

/// What an instance is started with.
#[derive(Clone)]
pub struct Setup {
    pub endpoint: String,
    pub broker: SimBroker,
    pub recorder: Arc<Recorder>,
    /// How far this instance's clock is off, in milliseconds (within [`CLOCK_MARGIN`]).
    pub skew_ms: i64,
    /// Whether it publishes its commands' Outbox Documents right after their commit.
    pub after_commit: bool,
}

/// The bound the instances assume between their clocks and the store's (the inbox's clock
/// margin); their skews stay within it.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// A running instance; dropping it crashes it.
pub struct Instance {
    kill: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Whether its runtime started (`start()` returned `Ok`) before it was killed.
    started: Arc<AtomicBool>,
    /// Why its last start failed, if one did.
    pub last_start_error: Arc<std::sync::Mutex<Option<String>>>,
}

impl Instance {
    pub fn start(name: String, setup: Setup) -> Self {
        let (kill, killed) = oneshot::channel::<()>();
        let started = Arc::new(AtomicBool::new(false));
        let started_tx = Arc::clone(&started);
        let last_start_error = Arc::default();
        let start_error = Arc::clone(&last_start_error);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let tokio = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a Tokio runtime");
                // Every task of this instance runs on this thread: its clock is off by this much.
                chatter_runtime::testing::skew_clock(setup.skew_ms);
                tokio.block_on(async move {
                    tokio::select! {
                        _ = killed => {}
                        () = serve(setup, started_tx, start_error) => {}
                    }
                });
                // The crash: every task of this process dropped where it stands.
                tokio.shutdown_background();
            })
            .expect("an instance thread");
        Self {
            kill: Some(kill),
            thread: Some(thread),
            started,
            last_start_error,
        }
    }

    /// Whether its runtime has started.
    pub fn has_started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// Crashes it and waits until its thread is gone.
    pub fn crash(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Starts the runtime (again and again while the store refuses its start) and serves until
/// killed.
async fn serve(
    setup: Setup,
    started: Arc<AtomicBool>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
) {
    let runtime = loop {
        match start(&setup).await {
            Ok(runtime) => break runtime,
            Err(error) => {
                tracing::debug!(%error, "a simulated instance could not start; trying again");
                *last_error.lock().unwrap() = Some(error.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    started.store(true, Ordering::SeqCst);
    // Held until the crash drops it.
    let _runtime = runtime;
    std::future::pending::<()>().await;
}

async fn start(setup: &Setup) -> Result<Runtime, chatter_runtime::BoxError> {
    let cosmos = CosmosConnection::connect(&setup.endpoint, None).await?;
    let triggers = super::triggers::relay(&cosmos, relay_options(60)).await?;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .standalone_relay(triggers)
        .broker(setup.broker.clone())
        .state(Arc::clone(&setup.recorder))
        .redelivery_delay(Duration::from_millis(5))
        // A claim of 3 s (the delivery timeout less the store timeout).
        .delivery_timeout(Duration::from_secs(8))
        .inbox_clock_margin(CLOCK_MARGIN)
        .relay_options(relay_options(60))
        .publish_after_commit(setup.after_commit)
        .without_metrics()
        .without_tracing()
        .start()
        .await?;
    Ok(runtime)
}
