//! A simulated chatter process: a thread with a Tokio runtime of its own, running one
//! `chatter_runtime::Runtime` (its consumers, its pipeline relay and the inbox's relay) against
//! the run's store (through the instance's own port) and broker.
//!
//! **A crash** drops that Tokio runtime: every task stops at the await it was at, nothing is
//! settled, nothing released, no lease given up, no claim released. What the process held the
//! others find as a dead process leaves it (its unsettled deliveries go back to their queue,
//! as a closed connection's do; its leases and claims run out).
//!
//! **A pause** blocks the instance's thread: every task stops where it stands and its timers
//! stand still, then all of it resumes at once, leases and claims it believes it holds
//! included (a zombie: a process stopped by a GC pause, a VM migration, a `SIGSTOP`).
//!
//! **A stop** is graceful: `Runtime::shutdown`, as a rolling restart does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use chatter_runtime::testing::MonotonicClock;
use chatter_runtime::{Runtime, relay::RelayOptions};
use tokio::sync::{mpsc, oneshot};

use super::broker::SimBroker;
use super::commands::Recorder;

/// How long an instance waits for one publish (its broker confirm included).
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(3);

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
        .publish_timeout(PUBLISH_TIMEOUT)
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
    /// The port it dials (its own faults).
    pub endpoint: String,
    /// The account's endpoint, as every instance names it: their relays are one processor per
    /// container, sharing its leases (the processor's name holds the endpoint).
    pub account: String,
    pub broker: SimBroker,
    pub recorder: Arc<Recorder>,
    /// How far this instance's clock is off, in milliseconds (within [`CLOCK_MARGIN`]).
    pub skew_ms: i64,
    /// Whether it publishes its commands' Outbox Documents right after their commit.
    pub after_commit: bool,
    /// The documents the sweep found stranded, by every incarnation of every instance (each
    /// adds what its health counts): a drain's defect when not 0.
    pub stranded: Arc<AtomicU64>,
    /// Whether it reads in the account's read region (its preferred region), where replicas
    /// lag behind the write region.
    pub read_region: bool,
}

/// What the harness tells a running instance.
enum Control {
    /// Block the instance's thread this long.
    Pause(Duration),
}

/// The bound the instances assume between their clocks and the store's (the inbox's clock
/// margin); their skews stay within it.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// A running instance; dropping it crashes it.
pub struct Instance {
    kill: Option<oneshot::Sender<()>>,
    /// Asks for a graceful stop.
    stop: Option<oneshot::Sender<()>>,
    control: mpsc::UnboundedSender<Control>,
    thread: Option<JoinHandle<()>>,
    /// Whether its runtime started (`start()` returned `Ok`) before it was killed.
    started: Arc<AtomicBool>,
    /// Why its last start failed, if one did.
    pub last_start_error: Arc<std::sync::Mutex<Option<String>>>,
}

impl Instance {
    pub fn start(name: String, setup: Setup) -> Self {
        let (kill, killed) = oneshot::channel::<()>();
        let (stop, stopped) = oneshot::channel::<()>();
        let (control, controls) = mpsc::unbounded_channel();
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
                    tokio::spawn(obey(controls));
                    tokio::select! {
                        _ = killed => {}
                        () = serve(setup, started_tx, start_error, stopped) => {}
                    }
                });
                // The crash: every task of this process dropped where it stands.
                tokio.shutdown_background();
            })
            .expect("an instance thread");
        Self {
            kill: Some(kill),
            stop: Some(stop),
            control,
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

    /// Blocks its thread for `period` (from the moment its runtime gets to the order).
    pub fn pause(&self, period: Duration) {
        let _ = self.control.send(Control::Pause(period));
    }

    /// Stops it gracefully (`Runtime::shutdown`) and waits until its thread is gone; crashes it
    /// if it has not stopped within `bound`.
    pub fn stop(mut self, bound: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let deadline = std::time::Instant::now() + bound;
        while self.thread.as_ref().is_some_and(|t| !t.is_finished())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
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

/// Carries out the harness's orders on the instance's own thread.
async fn obey(mut controls: mpsc::UnboundedReceiver<Control>) {
    while let Some(control) = controls.recv().await {
        match control {
            // Blocks the current-thread runtime: nothing of this instance runs meanwhile.
            Control::Pause(period) => std::thread::sleep(period),
        }
    }
}

/// Starts the runtime (again and again while the store refuses its start) and serves until
/// killed or stopped; adds what its health counts as stranded to the run's count.
async fn serve(
    setup: Setup,
    started: Arc<AtomicBool>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
    mut stopped: oneshot::Receiver<()>,
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
    // Polled so that a crash loses at most one interval's count; per lease, as a lease's count
    // starts again at 0 when it comes back.
    let mut counted: std::collections::BTreeMap<(String, String), u64> = Default::default();
    loop {
        tokio::select! {
            _ = &mut stopped => {
                runtime.shutdown().await;
                return;
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        let leases = runtime.health().await.leases;
        counted.retain(|(processor, token), _| {
            leases
                .iter()
                .any(|l| l.processor == *processor && l.lease_token == *token)
        });
        for lease in leases {
            let before = counted
                .entry((lease.processor, lease.lease_token))
                .or_default();
            if lease.stranded > *before {
                setup
                    .stranded
                    .fetch_add(lease.stranded - *before, Ordering::SeqCst);
            }
            *before = lease.stranded;
        }
    }
}

async fn start(setup: &Setup) -> Result<Runtime, chatter_runtime::BoxError> {
    let cosmos = chatter_tests::store::connection_through(
        &setup.endpoint,
        &setup.account,
        setup.read_region,
    )
    .await?;
    let triggers = super::triggers::relay(&cosmos, relay_options(60)).await?;
    let runtime = Runtime::builder()
        .cosmos(cosmos)
        .standalone_relay(triggers)
        .broker(setup.broker.clone())
        .state(Arc::clone(&setup.recorder))
        .redelivery_delay(Duration::from_millis(5))
        // A handler may run 3 s (the delivery timeout less the store timeout) under a claim of
        // 1 s renewed every 250 ms: most runs of a reservation end within one renewal, its
        // long first runs renew a dozen times, and a pause past the claim loses it (the
        // resumed zombie's handler is stopped, its completion refused).
        .delivery_timeout(Duration::from_secs(8))
        .inbox_claim_period(Duration::from_secs(1))
        .inbox_renewal_interval(Duration::from_millis(250))
        .inbox_clock_margin(CLOCK_MARGIN)
        .relay_options(relay_options(60))
        .publish_after_commit(setup.after_commit)
        .without_metrics()
        .without_tracing()
        .start()
        .await?;
    Ok(runtime)
}
