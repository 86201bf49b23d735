//! Serves the Azure Cosmos DB SDK's in-memory emulator over plain HTTP on a loopback address.
//!
//! The SDK's in-memory emulator (`azure_data_cosmos_driver::in_memory_emulator`) normally lives
//! inside one process, as the HTTP transport of one client. This crate puts a small hyper server
//! in front of [`InMemoryEmulatorHttpClient::execute_request`], so several processes (a relay
//! that is killed and restarted, several instances sharing leases, a Python script) can share
//! one store that outlives each of them. Data lives in the server's memory only: it is lost
//! when the server stops.
//!
//! **Fault injection** (off by default): [`Faults`] refuses one kind of request (an HTTP method,
//! e.g. `PATCH`, which is what the relay's stamps are) with a given status for a period, and adds
//! latency to every request, so tests can produce real store failures over real HTTP. Reach it
//! with [`EmulatorServer::faults`] / [`RunningEmulator::faults`], or from the command line
//! (`chatter-emulator --refuse PATCH:403:90 --latency-ms 5`). An [`Injector`] decides per
//! request ([`Injection`]); an [`Observer`] is told every answer's status. A request the server
//! has read is handled on a task of its own: a client that gives up or dies does not stop it.
//!
//! **Ports and regions:** [`RunningEmulator::port`] opens another port onto the same store with
//! faults of its own (one per process of a test); [`EmulatorServer::with_read_region`] serves an
//! account with a lagging read region, at a chosen consistency level.
//!
//! Any Cosmos client that accepts an `http://` loopback endpoint works against it: the Rust SDK
//! (`azure_data_cosmos` treats loopback hosts as emulator hosts) and Python `azure-cosmos`.
//! Authentication headers are accepted and not verified.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = chatter_emulator::EmulatorServer::from_listener(listener)?;
//! println!("serving on {}", server.endpoint());
//! let running = server.spawn();
//! // ... connect clients to running.endpoint() ...
//! drop(running); // stops the server
//! # Ok(())
//! # }
//! ```

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use azure_core::http::headers::{HeaderName, HeaderValue};
use azure_core::http::{Method, Request, Url};
/// The account's default consistency level, for [`EmulatorServer::with_read_region`].
pub use azure_data_cosmos_driver::in_memory_emulator::ConsistencyLevel;
use azure_data_cosmos_driver::in_memory_emulator::{
    EmulatorStore, InMemoryEmulatorHttpClient, ReplicationConfig, VirtualAccountConfig,
    VirtualRegion,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The port the Azure Cosmos DB emulator listens on by default; `chatter-emulator` uses it too.
pub const DEFAULT_PORT: u16 = 8081;

/// The name of the single virtual region the served account has (its write region when it has
/// two).
pub const REGION_NAME: &str = "East US";

/// The name of the read region of an account served by [`EmulatorServer::with_read_region`].
pub const READ_REGION_NAME: &str = "West US";

/// An in-memory Cosmos account bound to a TCP listener, ready to serve.
///
/// The account has one region whose gateway URL is [`EmulatorServer::endpoint`]: the account
/// document the server returns names that URL, and clients then dial it for every request.
pub struct EmulatorServer {
    listener: TcpListener,
    /// The URL this server's account document names: clients dial it.
    endpoint: Url,
    /// The region's gateway URL the emulator routes by (the first port's endpoint).
    region: Url,
    emulator: Arc<InMemoryEmulatorHttpClient>,
    counts: Arc<RequestCounts>,
    faults: Faults,
    /// A read region's catch-up steps (`catch_up_in_steps`), run beside the server.
    catch_up: Option<(std::ops::RangeInclusive<Duration>, u64)>,
}

/// Faults a server injects into its answers; clones share one set. Off until told otherwise.
///
/// A refused request never reaches the store: the client gets the status with a JSON error body
/// (`"code":"InjectedFault"`), exactly as a real account answering that status would look on the
/// wire. Latency delays every request (refused ones too) before it is handled; a late answer
/// ([`Faults::answer_late`]) is handled at once and only its answer is held back.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Mutex<FaultState>>);

#[derive(Default)]
struct FaultState {
    /// Decides per request (a simulation's seeded schedule); asked before the fixed faults.
    injector: Option<Injector>,
    /// Told the status of every answer (a simulation's history).
    observer: Option<Observer>,
    refusals: Vec<Refusal>,
    latency: Duration,
    /// Late answers by HTTP method.
    answer_delays: Vec<(String, Duration)>,
}

impl std::fmt::Debug for FaultState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultState")
            .field("injector", &self.injector.is_some())
            .field("observer", &self.observer.is_some())
            .field("refusals", &self.refusals)
            .field("latency", &self.latency)
            .field("answer_delays", &self.answer_delays)
            .finish()
    }
}

/// What an [`Injector`] answers for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// Refuse it with `status` and, when given, the `x-ms-substatus` (e.g. 410/1002, a
    /// partition gone) and the `x-ms-retry-after-ms` a 429 carries: it never reaches the store.
    Refuse {
        /// The HTTP status.
        status: u16,
        /// The Cosmos sub-status, if any.
        sub_status: Option<u32>,
        /// The wait a throttled client is told to keep.
        retry_after: Option<Duration>,
    },
    /// Handle it, then answer `status` instead of the store's answer: the write took effect and
    /// the client hears that it failed, as when the answer is lost on the way.
    LoseAnswer {
        /// The HTTP status the client gets instead.
        status: u16,
    },
    /// Hold the request back this long, then handle it: a client that gives up (or dies)
    /// meanwhile does not stop it, as a request already on its way to the service is not
    /// stopped.
    Delay(Duration),
    /// Handle it at once, then hold the answer back this long: past the client's timeout, the
    /// write took effect and the client heard nothing.
    AnswerLate(Duration),
}

/// Decides, per request, from its HTTP method and path, what fault (if any) it meets; called
/// once per request, before the fixed faults. A simulation drives it from its seed.
pub type Injector = Arc<dyn Fn(&str, &str) -> Option<Injection> + Send + Sync>;

/// Told, for every request, its HTTP method, its path and the status (and `x-ms-substatus`,
/// if any) of the answer the client gets, just before it is sent: what a request came to,
/// injected or not (a store that answered 410/1007 during a split, say). Not told of a request
/// whose client gave up before its answer.
pub type Observer = Arc<dyn Fn(&str, &str, u16, Option<u32>) + Send + Sync>;

#[derive(Debug)]
struct Refusal {
    method: String,
    status: u16,
    until: Instant,
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers every request with HTTP `method` (e.g. `"PATCH"`, case-insensitive) with `status`
    /// for the next `period`, replacing an earlier refusal of that method.
    pub fn refuse(&self, method: &str, status: u16, period: Duration) {
        let method = method.to_ascii_uppercase();
        let mut state = self.state();
        state.refusals.retain(|r| r.method != method);
        state.refusals.push(Refusal {
            method,
            status,
            // A period too long to add is as good as forever (a century).
            until: Instant::now()
                .checked_add(period)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)),
        });
    }

    /// Adds `latency` before every answer (`Duration::ZERO` for none).
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Handles every request with HTTP `method` (case-insensitive) at once but holds its answer
    /// back for `delay` (`Duration::ZERO` for none), replacing an earlier delay of that method:
    /// the store has done the work and the client hears of it late or not at all, as when an
    /// answer is lost on the way.
    pub fn answer_late(&self, method: &str, delay: Duration) {
        let method = method.to_ascii_uppercase();
        let mut state = self.state();
        state.answer_delays.retain(|(m, _)| *m != method);
        state.answer_delays.push((method, delay));
    }

    /// Asks `injector` about every request from now on (`None`: stop asking). A request it
    /// answers `Some` for meets that fault instead of the fixed ones.
    pub fn inject_with(&self, injector: Option<Injector>) {
        self.state().injector = injector;
    }

    /// Tells `observer` about every answer from now on (`None`: stop telling).
    pub fn observe_with(&self, observer: Option<Observer>) {
        self.state().observer = observer;
    }

    fn observer(&self) -> Option<Observer> {
        self.state().observer.clone()
    }

    /// What the injector (if any) decides for a request with `method` and `path`; asked outside
    /// the lock, so an injector may take its time.
    fn injected(&self, method: &str, path: &str) -> Option<Injection> {
        let injector = self.state().injector.clone()?;
        injector(method, path)
    }

    /// Ends every refusal, the latency, late answers and the injector.
    pub fn clear(&self) {
        let mut state = self.state();
        state.injector = None;
        state.observer = None;
        state.refusals.clear();
        state.latency = Duration::ZERO;
        state.answer_delays.clear();
    }

    /// The latency to add, the status to refuse `method` with (if any) and the delay of the
    /// answer.
    fn decide(&self, method: &str) -> (Duration, Option<u16>, Duration) {
        let now = Instant::now();
        let mut state = self.state();
        state.refusals.retain(|r| r.until > now);
        let status = state
            .refusals
            .iter()
            .find(|r| r.method.eq_ignore_ascii_case(method))
            .map(|r| r.status);
        let answer_delay = state
            .answer_delays
            .iter()
            .find(|(m, _)| m.eq_ignore_ascii_case(method))
            .map_or(Duration::ZERO, |(_, delay)| *delay);
        (state.latency, status, answer_delay)
    }
}

/// Requests served so far, per HTTP method (bounded: one counter per method).
#[derive(Debug, Default)]
struct RequestCounts(std::sync::Mutex<std::collections::BTreeMap<String, u64>>);

impl RequestCounts {
    /// Counts the request per method, and per method and path when the path names a feed
    /// (`/dbs/shop/colls/orders/docs`: an odd number of segments), not one resource: the
    /// feeds of an account are few, so the counters stay bounded.
    fn record(&self, method: &str, path: &str) {
        let method = method.to_ascii_uppercase();
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let segments = path.trim_matches('/').split('/').count();
        if segments % 2 == 1 {
            *counts
                .entry(format!("{method} /{}", path.trim_matches('/')))
                .or_default() += 1;
        }
        *counts.entry(method).or_default() += 1;
    }

    /// Counts the scheme of a request's `Authorization` header (its `type`: `master` for an
    /// account key, `aad` for an Entra ID token, `resource` for a resource token), never the
    /// signature or token itself.
    fn record_authorization(&self, header: Option<&hyper::header::HeaderValue>) {
        // The known schemes only, so what a client sends cannot grow the counters.
        let scheme = match header
            .and_then(|value| value.to_str().ok())
            .and_then(authorization_scheme)
            .as_deref()
        {
            Some(scheme @ ("master" | "aad" | "resource")) => scheme.to_owned(),
            Some(_) => "other".to_owned(),
            None => "none".to_owned(),
        };
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(format!("authorization {scheme}")).or_default() += 1;
    }

    /// The count of `method`'s requests, or of its requests to the feed `path` too.
    fn get(&self, method: &str, path: Option<&str>) -> u64 {
        let method = method.to_ascii_uppercase();
        let key = match path {
            Some(path) => format!("{method} /{}", path.trim_matches('/')),
            None => method,
        };
        self.count(&key)
    }

    /// The count under `key` (0 if none).
    fn count(&self, key: &str) -> u64 {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(key).copied().unwrap_or(0)
    }

    /// The count of requests whose `Authorization` scheme is `scheme`.
    fn authorizations(&self, scheme: &str) -> u64 {
        self.count(&format!("authorization {scheme}"))
    }
}

impl EmulatorServer {
    /// Binds `addr` and prepares an empty in-memory account behind it.
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        Self::from_listener(TcpListener::bind(addr).await?)
    }

    /// Prepares an empty in-memory account served on an already bound listener (bind port 0 to
    /// let the OS pick a free port, then read [`EmulatorServer::endpoint`]).
    pub fn from_listener(listener: TcpListener) -> io::Result<Self> {
        let endpoint = endpoint_for(listener.local_addr()?);
        let config =
            VirtualAccountConfig::new(vec![VirtualRegion::new(REGION_NAME, endpoint.clone())])
                .map_err(|e| io::Error::other(format!("invalid in-memory emulator account: {e}")))?
                .with_consistency(ConsistencyLevel::Session);
        let emulator =
            Arc::new(InMemoryEmulatorHttpClient::try_new(config).map_err(|e| {
                io::Error::other(format!("cannot start the in-memory emulator: {e}"))
            })?);
        Ok(Self::serving(listener, endpoint, emulator))
    }

    /// An account with two regions: [`REGION_NAME`], which takes the writes, served on
    /// `write_region`, and [`READ_REGION_NAME`], served on `read_region`, which catches up with
    /// it in steps, one every `lag` (each drawn within it, from `seed`): a step applies every
    /// write made since the last one at once. So the read region is always behind by up to
    /// `lag`'s end and always holds a **prefix of the write region's history**, in the order
    /// the writes were made and a transactional batch whole, as Cosmos DB replicates (by LSN).
    /// `consistency` is the account's default: a client reading in the read region (its
    /// preferred region) reads what has replicated there, as the level allows (Eventual and
    /// Consistent Prefix: possibly older data; Session: at least its own session's writes).
    /// Returns the two servers, write region first; the steps run while the read region's
    /// server does (on a current-thread runtime for the "at once": on a multi-thread runtime a
    /// step can be seen half done, and the server warns), and once it stops every write
    /// replicates at once.
    pub fn with_read_region(
        write_region: TcpListener,
        read_region: TcpListener,
        consistency: ConsistencyLevel,
        lag: std::ops::RangeInclusive<Duration>,
        seed: u64,
    ) -> io::Result<(Self, Self)> {
        let write_url = endpoint_for(write_region.local_addr()?);
        let read_url = endpoint_for(read_region.local_addr()?);
        let config = VirtualAccountConfig::new(vec![
            VirtualRegion::new(REGION_NAME, write_url.clone()),
            VirtualRegion::new(READ_REGION_NAME, read_url.clone()),
        ])
        .map_err(|e| io::Error::other(format!("invalid in-memory emulator account: {e}")))?
        .with_consistency(consistency)
        // Each write goes at once into the paused read region's buffer; the steps apply it.
        .with_replication_config(ReplicationConfig::immediate());
        let emulator =
            Arc::new(InMemoryEmulatorHttpClient::try_new(config).map_err(|e| {
                io::Error::other(format!("cannot start the in-memory emulator: {e}"))
            })?);
        emulator.store().pause_replication(READ_REGION_NAME);
        let mut read = Self::serving(read_region, read_url, Arc::clone(&emulator));
        read.catch_up = Some((lag, seed));
        Ok((Self::serving(write_region, write_url, emulator), read))
    }

    /// A server of `emulator`'s region `region` on `listener`.
    fn serving(
        listener: TcpListener,
        region: Url,
        emulator: Arc<InMemoryEmulatorHttpClient>,
    ) -> Self {
        Self {
            listener,
            endpoint: region.clone(),
            region,
            emulator,
            counts: Arc::default(),
            faults: Faults::default(),
            catch_up: None,
        }
    }

    /// The faults this server injects (none until set).
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// The account endpoint clients connect to, e.g. `http://127.0.0.1:8081/`.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// The emulator's store, for inspection in tests.
    pub fn store(&self) -> Arc<EmulatorStore> {
        self.emulator.store()
    }

    /// How many requests with HTTP `method` (e.g. `"PATCH"`) this server has answered.
    pub fn request_count(&self, method: &str) -> u64 {
        self.counts.get(method, None)
    }

    /// Serves requests until the returned future is dropped or accepting connections fails
    /// persistently. Each connection is served on its own task.
    pub async fn run(self) -> io::Result<()> {
        let Self {
            listener,
            endpoint,
            region,
            emulator,
            counts,
            faults,
            catch_up,
        } = self;
        // Stopped with the server: dropping the guard aborts it and lets replication run free.
        let _catching_up = catch_up.map(|(lag, seed)| {
            if tokio::runtime::Handle::current().runtime_flavor()
                != tokio::runtime::RuntimeFlavor::CurrentThread
            {
                tracing::warn!(
                    "chatter-emulator: a read region's catch-up steps on a multi-thread runtime \
                     can be seen half applied (a batch in part)"
                );
            }
            CatchingUp {
                task: tokio::spawn(catch_up_in_steps(emulator.store(), lag, seed)),
                store: emulator.store(),
            }
        });
        let urls = Arc::new(Urls { endpoint, region });
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) if is_transient_accept_error(&e) => {
                    tracing::warn!(error = %e, "chatter-emulator: accept failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // An answer written in more than one segment must not wait for the client's
            // delayed ACK (Nagle's algorithm: 40 ms on Linux), as no Cosmos gateway makes it.
            let _ = stream.set_nodelay(true);
            let emulator = Arc::clone(&emulator);
            let urls = Arc::clone(&urls);
            let counts = Arc::clone(&counts);
            let faults = faults.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<Incoming>| {
                    let emulator = Arc::clone(&emulator);
                    let urls = Arc::clone(&urls);
                    counts.record(request.method().as_str(), request.uri().path());
                    counts
                        .record_authorization(request.headers().get(hyper::header::AUTHORIZATION));
                    let (latency, refusal, answer_delay) = faults.decide(request.method().as_str());
                    let injected = faults.injected(request.method().as_str(), request.uri().path());
                    let observed = faults.observer().map(|observer| {
                        (
                            observer,
                            request.method().to_string(),
                            request.uri().path().to_owned(),
                        )
                    });
                    async move {
                        if !latency.is_zero() {
                            tokio::time::sleep(latency).await;
                        }
                        let response = match (injected, refusal) {
                            (
                                Some(Injection::Refuse {
                                    status,
                                    sub_status,
                                    retry_after,
                                }),
                                _,
                            ) => injected_refusal(status, sub_status, retry_after),
                            (Some(Injection::LoseAnswer { status }), _) => {
                                // The store does the work; the client hears only the failure.
                                drop(handle(emulator, urls, request, Duration::ZERO).await);
                                injected_refusal(status, None, None)
                            }
                            (Some(Injection::Delay(delay)), _) => {
                                handle(emulator, urls, request, delay).await
                            }
                            (Some(Injection::AnswerLate(delay)), _) => {
                                let response =
                                    handle(emulator, urls, request, Duration::ZERO).await;
                                tokio::time::sleep(delay).await;
                                response
                            }
                            (None, Some(status)) => error_response(
                                status,
                                "InjectedFault",
                                "chatter-emulator fault injection refused this request",
                            ),
                            (None, None) => handle(emulator, urls, request, Duration::ZERO).await,
                        };
                        if !answer_delay.is_zero() {
                            tokio::time::sleep(answer_delay).await;
                        }
                        if let Some((observer, method, path)) = observed {
                            let sub_status = response
                                .headers()
                                .get("x-ms-substatus")
                                .and_then(|v| v.to_str().ok())
                                .and_then(|v| v.parse().ok());
                            observer(&method, &path, response.status().as_u16(), sub_status);
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                // HTTP/1.1 (Python azure-cosmos, curl) and HTTP/2 with prior knowledge (the
                // Rust SDK's default) on the same port.
                if let Err(e) = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "chatter-emulator: connection ended with an error");
                }
            });
        }
    }

    /// Serves on a background task; the server stops when the returned handle is dropped.
    pub fn spawn(self) -> RunningEmulator {
        let endpoint = self.endpoint.to_string();
        let store = self.store();
        let counts = Arc::clone(&self.counts);
        let faults = self.faults();
        let region = self.region.clone();
        let emulator = Arc::clone(&self.emulator);
        let task = tokio::spawn(self.run());
        RunningEmulator {
            endpoint,
            region,
            emulator,
            store,
            counts,
            faults,
            task,
        }
    }
}

/// A server started with [`EmulatorServer::spawn`]; dropping it stops the server (the data is
/// lost).
pub struct RunningEmulator {
    endpoint: String,
    region: Url,
    emulator: Arc<InMemoryEmulatorHttpClient>,
    store: Arc<EmulatorStore>,
    counts: Arc<RequestCounts>,
    faults: Faults,
    task: JoinHandle<io::Result<()>>,
}

impl RunningEmulator {
    /// The account endpoint clients connect to, e.g. `http://127.0.0.1:41234/`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates database `database` (which must not exist yet: the store cannot be asked, and a
    /// database created again loses its containers' link) and in it each of `containers`:
    /// its name, partition-key path(s) and number of physical partitions, as an account whose
    /// containers grew has them (a container created through the API gets 4). For tests of
    /// containers past the SDK's default cross-partition fan-out of 100.
    pub fn create_partitioned(
        &self,
        database: &str,
        containers: &[(&str, &[&str], u32)],
    ) -> Result<(), String> {
        use azure_data_cosmos_driver::in_memory_emulator::ContainerConfig;
        use azure_data_cosmos_driver::models::PartitionKeyDefinition;
        // Every configuration is checked before anything is created.
        let mut made = Vec::with_capacity(containers.len());
        for (container, paths, partitions) in containers {
            let config = ContainerConfig::new()
                .with_partition_count(*partitions)
                .build()
                .map_err(|e| format!("{container}: {e}"))?;
            let paths = paths.iter().map(|path| (*path).to_owned().into()).collect();
            made.push((container, PartitionKeyDefinition::new(paths), config));
        }
        self.store.create_database(database);
        for (container, key, config) in made {
            self.store
                .create_container_with_config(database, container, key, config);
        }
        Ok(())
    }

    /// The emulator's store, for inspection in tests.
    pub fn store(&self) -> Arc<EmulatorStore> {
        Arc::clone(&self.store)
    }

    /// How many requests with HTTP `method` (e.g. `"PATCH"`) this server has answered.
    pub fn request_count(&self, method: &str) -> u64 {
        self.counts.get(method, None)
    }

    /// How many requests this server has answered whose `Authorization` header has `scheme`:
    /// `"master"` (signed with an account key), `"aad"` (an Entra ID token), `"resource"` (a
    /// resource token), `"other"` (another type) or `"none"` (no header, or one that names no
    /// type).
    pub fn authorization_count(&self, scheme: &str) -> u64 {
        self.counts.authorizations(scheme)
    }

    /// How many requests with HTTP `method` to the feed `path` (e.g. `"GET"` and
    /// `"dbs/shop/colls/orders/docs"`: the container's change feed) this server has answered.
    pub fn feed_request_count(&self, method: &str, path: &str) -> u64 {
        self.counts.get(method, Some(path))
    }

    /// The faults this server injects (none until set).
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// Another port onto this server's account, on `listener`: the same store, with an
    /// endpoint, request counts and faults of its own (its account document names its own
    /// endpoint, so a client that connects to it keeps dialling it). Give each process of a
    /// test its own port to fault it alone: slow it, refuse its requests, cut it off.
    pub fn port(&self, listener: TcpListener) -> io::Result<EmulatorServer> {
        Ok(EmulatorServer {
            endpoint: endpoint_for(listener.local_addr()?),
            listener,
            region: self.region.clone(),
            emulator: Arc::clone(&self.emulator),
            counts: Arc::default(),
            faults: Faults::default(),
            // One catch-up per account: the read region's own server runs it.
            catch_up: None,
        })
    }

    /// Merges the four physical partitions a container starts with into one, before anything
    /// is written to it: one feed range, as most containers have (under 50 GB and 10,000
    /// RU/s). Fails when the container does not have exactly the four it starts with.
    pub async fn merge_into_one_partition(
        &self,
        database: &str,
        container: &str,
    ) -> io::Result<()> {
        let lock = Duration::from_millis(1);
        let merge = |a, b| {
            self.store
                .merge_partitions_and_wait(database, container, a, b, lock)
        };
        let failed = |e| {
            io::Error::other(format!(
                "cannot merge the partitions of {database}/{container}: {e}"
            ))
        };
        let left = merge(0, 1).await.map_err(failed)?;
        let right = merge(2, 3).await.map_err(failed)?;
        merge(left, right).await.map_err(failed)?;
        Ok(())
    }
}

impl Drop for RunningEmulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for RunningEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningEmulator")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for EmulatorServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatorServer")
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

/// Serves a fresh in-memory account on `listener` until the future is dropped.
pub async fn serve(listener: TcpListener) -> io::Result<()> {
    EmulatorServer::from_listener(listener)?.run().await
}

/// Has the read region catch up with the write region in steps, one drawn (from `seed`) within
/// `lag` after the other, until the server task ends: replication to it is paused, and each
/// step resumes it, which applies everything written since the last step in one go (in one
/// poll: no request is served in between), then pauses it again. So the read region always
/// holds a prefix of the write region's history, whole batches included: Cosmos replicates by
/// LSN, and a batch is one LSN. (The emulator's own delayed replication puts each document on
/// a timer of its own: a read between two documents of one batch saw part of it, and the change
/// feed's continuation, past their LSN, passed over the rest.) "In one go" holds on a
/// current-thread runtime; on a multi-thread one a request served on another thread, or a
/// batch written there, can meet a step half done (the server warns when it starts so).
async fn catch_up_in_steps(
    store: Arc<EmulatorStore>,
    lag: std::ops::RangeInclusive<Duration>,
    seed: u64,
) {
    let mut x = seed | 1;
    let spread = lag.end().saturating_sub(*lag.start());
    loop {
        // xorshift64: enough to spread the steps, the same for the same seed.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let wait = (*lag.start() + spread.mul_f64((x % 1_000_000) as f64 / 1_000_000.0))
            .max(Duration::from_millis(1));
        tokio::time::sleep(wait).await;
        store.resume_replication(READ_REGION_NAME);
        store.pause_replication(READ_REGION_NAME);
    }
}

/// A read region's catch-up steps, until the server stops: then replication to it resumes
/// and stays on (writes replicate at once), so the write region never fills the paused
/// region's buffer (past 10,000 writes the emulator refuses every write with 429/3075).
struct CatchingUp {
    task: JoinHandle<()>,
    store: Arc<EmulatorStore>,
}

impl Drop for CatchingUp {
    fn drop(&mut self) {
        self.task.abort();
        self.store.resume_replication(READ_REGION_NAME);
    }
}

/// The URL clients dial for a listener bound to `addr` (an unspecified address is served on
/// loopback).
fn endpoint_for(addr: SocketAddr) -> Url {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let text = format!("http://{}/", SocketAddr::new(ip, addr.port()));
    Url::parse(&text).expect("a socket address always forms a valid URL")
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || e
        .raw_os_error()
        .is_some_and(|code| code == 23 || code == 24) // ENFILE, EMFILE
}

/// The URLs of one port: the one its account document names, and the region's.
#[derive(Debug)]
struct Urls {
    endpoint: Url,
    region: Url,
}

/// Translates one hyper request into an emulator request, has the emulator handle it after
/// `delay`, and translates its answer back. The handling runs on a task of its own: once the
/// request is read, a client that gives up or disconnects does not stop it (a request that
/// reached Cosmos is applied whether or not its answer is awaited).
async fn handle(
    emulator: Arc<InMemoryEmulatorHttpClient>,
    urls: Arc<Urls>,
    request: hyper::Request<Incoming>,
    delay: Duration,
) -> hyper::Response<Full<Bytes>> {
    let emulator_request = match prepare(&urls.region, request).await {
        Ok(prepared) => prepared,
        Err(refused) => return refused,
    };
    // Another port of the account names itself in the account document, so that its clients
    // keep dialling it.
    let rename =
        (emulator_request.url().path() == "/" && urls.endpoint != urls.region).then(|| {
            (
                urls.region.as_str().trim_end_matches('/').to_owned(),
                urls.endpoint.as_str().trim_end_matches('/').to_owned(),
            )
        });
    let handled = tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        execute(&emulator, &emulator_request, rename).await
    });
    match handled.await {
        Ok(response) => response,
        Err(e) => error_response(500, "InternalServerError", &format!("handling failed: {e}")),
    }
}

/// The emulator request for one hyper request, addressed to the region `region` routes by.
async fn prepare(
    region: &Url,
    request: hyper::Request<Incoming>,
) -> Result<Request, hyper::Response<Full<Bytes>>> {
    let (parts, body) = request.into_parts();

    let Ok(method) = parts.method.as_str().parse::<Method>() else {
        return Err(error_response(
            405,
            "MethodNotAllowed",
            "unsupported HTTP method",
        ));
    };

    // Always address the configured region, whatever host name the client dialled
    // (`localhost` vs `127.0.0.1`): the emulator routes by the region's gateway URL.
    let mut url = region.clone();
    let path = parts.uri.path();
    let trimmed = path.trim_end_matches('/');
    url.set_path(if trimmed.is_empty() { "/" } else { trimmed });
    url.set_query(parts.uri.query());

    let mut emulator_request = Request::new(url, method);
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        emulator_request.headers_mut().insert(
            HeaderName::from(name.as_str().to_owned()),
            HeaderValue::from(value),
        );
    }
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return Err(error_response(
                400,
                "BadRequest",
                &format!("cannot read request body: {e}"),
            ));
        }
    };
    if !body.is_empty() {
        emulator_request.set_body(body.to_vec());
    }
    Ok(emulator_request)
}

/// The emulator's answer to `emulator_request`, as a hyper response; `rename` replaces one URL
/// by another in its body.
async fn execute(
    emulator: &InMemoryEmulatorHttpClient,
    emulator_request: &Request,
    rename: Option<(String, String)>,
) -> hyper::Response<Full<Bytes>> {
    let response = match emulator.execute_request(emulator_request).await {
        Ok(response) => response,
        Err(e) => {
            let status = u16::from(e.status().status_code());
            let status = if (100..=599).contains(&status) {
                status
            } else {
                500
            };
            return error_response(status, "EmulatorError", &e.to_string());
        }
    };
    let raw = match response.try_into_raw_response().await {
        Ok(raw) => raw,
        Err(e) => {
            return error_response(
                500,
                "InternalServerError",
                &format!("cannot read emulator response: {e}"),
            );
        }
    };

    let mut builder = hyper::Response::builder().status(u16::from(raw.status()));
    for (name, value) in raw.headers().iter() {
        let name = name.as_str();
        if name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding")
        {
            continue;
        }
        builder = builder.header(name, value.as_str());
    }
    let body = match rename {
        Some((from, to)) => Bytes::from(
            String::from_utf8_lossy(raw.body().as_ref())
                .replace(&from, &to)
                .into_bytes(),
        ),
        None => Bytes::copy_from_slice(raw.body().as_ref()),
    };
    builder.body(Full::new(body)).unwrap_or_else(|e| {
        error_response(
            500,
            "InternalServerError",
            &format!("cannot encode emulator response: {e}"),
        )
    })
}

/// An injected failure as the service answers it: the status, the sub-status and the wait a
/// throttled client is told to keep.
fn injected_refusal(
    status: u16,
    sub_status: Option<u32>,
    retry_after: Option<Duration>,
) -> hyper::Response<Full<Bytes>> {
    let mut response = error_response(
        status,
        "InjectedFault",
        "chatter-emulator fault injection failed this request",
    );
    let headers = response.headers_mut();
    if let Some(sub_status) = sub_status {
        headers.insert(
            "x-ms-substatus",
            hyper::header::HeaderValue::from(sub_status),
        );
    }
    if let Some(wait) = retry_after {
        let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        headers.insert(
            "x-ms-retry-after-ms",
            hyper::header::HeaderValue::from(millis),
        );
    }
    response
}

fn error_response(status: u16, code: &str, message: &str) -> hyper::Response<Full<Bytes>> {
    let body = format!(
        "{{\"code\":{},\"message\":{}}}",
        json_string(code),
        json_string(message)
    );
    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The `type` of a Cosmos DB `Authorization` header (`type=master&ver=1.0&sig=...`, sent
/// percent-encoded).
fn authorization_scheme(header: &str) -> Option<String> {
    let decoded = percent_decode(header);
    decoded
        .split('&')
        .find_map(|part| part.strip_prefix("type="))
        .map(|scheme| scheme.to_ascii_lowercase())
}

/// `%XX` escapes decoded; anything else kept as it is.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = (bytes[at] == b'%')
            .then(|| text.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                at += 3;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorization_scheme_is_read_from_the_percent_encoded_header() {
        assert_eq!(
            authorization_scheme("type%3Daad%26ver%3D1.0%26sig%3Deyj0").as_deref(),
            Some("aad")
        );
        assert_eq!(
            authorization_scheme("type=master&ver=1.0&sig=abc%2B%3D").as_deref(),
            Some("master")
        );
        assert_eq!(authorization_scheme("Bearer x%Z"), None);
    }

    #[test]
    fn unspecified_listen_address_is_served_on_loopback() {
        let addr: SocketAddr = "0.0.0.0:8081".parse().unwrap();
        assert_eq!(endpoint_for(addr).as_str(), "http://127.0.0.1:8081/");
        let addr: SocketAddr = "[::]:9000".parse().unwrap();
        assert_eq!(endpoint_for(addr).as_str(), "http://[::1]:9000/");
    }

    #[test]
    fn refusals_and_late_answers_apply_to_their_method_and_a_refusal_for_its_period_only() {
        let none = Duration::ZERO;
        let faults = Faults::default();
        assert_eq!(faults.decide("PATCH"), (none, None, none));
        faults.refuse("patch", 403, Duration::from_secs(60));
        faults.set_latency(Duration::from_millis(5));
        faults.answer_late("patch", Duration::from_millis(7));
        let late = Duration::from_millis(7);
        assert_eq!(
            faults.decide("PATCH"),
            (Duration::from_millis(5), Some(403), late)
        );
        assert_eq!(faults.decide("GET"), (Duration::from_millis(5), None, none));
        faults.refuse("PATCH", 503, Duration::ZERO);
        assert_eq!(faults.decide("PATCH").1, None, "an elapsed refusal ends");
        faults.refuse("PUT", 429, Duration::from_secs(60));
        faults.clear();
        assert_eq!(faults.decide("PUT"), (none, None, none));
    }

    #[test]
    fn error_bodies_are_valid_json_strings() {
        assert_eq!(json_string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
