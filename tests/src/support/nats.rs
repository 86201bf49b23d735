//! NATS JetStream for the tests: the machine's shared server (127.0.0.1:4222, JetStream on;
//! `.ci/run` starts it when it is down), streams of a test's own on it, and servers of a test's
//! own (`nats-server` processes on free ports, with the `max_payload` chatter needs) for what
//! the shared server cannot show: a start that passes chatter's checks.
//! Every call is bounded so no test hangs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream::stream::Config;
use chatter_runtime::broker::{Broker, NatsBroker, Subscription};
use tokio::time::timeout;

/// The machine's shared NATS server.
pub const URL: &str = "nats://127.0.0.1:4222";

const WITHIN: Duration = Duration::from_secs(30);

/// Connects to `url`; panics if that takes longer than 30 s or fails.
pub async fn connect(url: &str) -> NatsBroker {
    timeout(WITHIN, NatsBroker::connect(url))
        .await
        .expect("connecting to NATS takes less than the bound")
        .unwrap_or_else(|e| panic!("NATS runs at {url}: {e}"))
}

/// A stream of the test's own on `broker`'s server, storing every subject under a fresh prefix
/// (`<prefix>.>`), kept for at most 10 minutes so a test that panics leaves nothing behind for
/// long.
#[derive(Debug, Clone)]
pub struct TestStream {
    /// The stream's name.
    pub name: String,
    /// Its subjects' prefix: destinations are `<prefix>.<name>`.
    pub prefix: String,
}

impl TestStream {
    /// A destination stored by this stream.
    pub fn subject(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    /// Creates the stream with `duplicate_window`; panics if that fails.
    pub async fn create(broker: &NatsBroker, duplicate_window: Duration) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let stream = Self {
            name: format!("CHATTER_TEST_{id}"),
            prefix: format!("chatter-test-{id}"),
        };
        let config = Config {
            name: stream.name.clone(),
            subjects: vec![format!("{}.>", stream.prefix)],
            duplicate_window,
            max_age: Duration::from_secs(600),
            ..Config::default()
        };
        timeout(WITHIN, broker.jetstream().create_stream(config))
            .await
            .expect("creating a stream takes less than the bound")
            .expect("the stream is created");
        stream
    }

    /// Deletes the stream (best effort).
    pub async fn delete(&self, broker: &NatsBroker) {
        let _ = timeout(WITHIN, broker.jetstream().delete_stream(&self.name)).await;
    }
}

/// Starts consuming `destination`; panics if that takes longer than 30 s or fails.
pub async fn subscribe(broker: &NatsBroker, destination: &str) -> Subscription {
    timeout(WITHIN, broker.subscribe(destination))
        .await
        .expect("subscribing takes less than the bound")
        .expect("the consumer starts")
}

/// A `nats-server -js` of the test's own on a free port of 127.0.0.1, with `max_payload` 2 MB
/// (the 1 MB default cannot carry a Cosmos document); killed, its store removed, on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl NatsServer {
    /// Starts it and waits until it answers; panics if it does not within 30 s.
    pub async fn start() -> Self {
        Self::with_max_payload("2MB").await
    }

    /// [`start`](Self::start) with another `max_payload` (e.g. the server default, `1MB`).
    pub async fn with_max_payload(max_payload: &str) -> Self {
        Self::configured(max_payload, true).await
    }

    /// A server whose JetStream never answers (it is not enabled): what a client sees of one
    /// whose JetStream is still recovering after a restart, for as long as the test needs.
    pub async fn without_jetstream() -> Self {
        Self::configured("2MB", false).await
    }

    async fn configured(max_payload: &str, jetstream: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("chatter-nats-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a store directory");
        let config = dir.join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "host: 127.0.0.1\nport: {port}\nmax_payload: {max_payload}\n{}",
                if jetstream {
                    format!(
                        "jetstream {{ store_dir: \"{}\" }}\n",
                        dir.join("store").display()
                    )
                } else {
                    String::new()
                }
            ),
        )
        .expect("a server configuration");
        let child = Command::new(server_binary())
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts (it is installed on these machines)");
        let server = Self { child, port, dir };
        let answered = timeout(WITHIN, async {
            loop {
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        answered.expect("the test's nats-server answers");
        server
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its address, for a [`TcpProxy`](crate::proxy::TcpProxy) in front of it.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `nats-server` from `PATH`, or Debian's `/usr/sbin/nats-server`.
fn server_binary() -> PathBuf {
    let debian = PathBuf::from("/usr/sbin/nats-server");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("nats-server")
    }
}

/// The names of the consumers of `stream`; panics if they cannot be listed.
pub async fn consumer_names(stream: &async_nats::jetstream::stream::Stream) -> Vec<String> {
    use futures::StreamExt;
    stream
        .consumer_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|name| name.expect("the consumers are listed"))
        .collect()
}
