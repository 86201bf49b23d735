//! The RabbitMQ server of this project's machines (127.0.0.1:5672, guest/guest; start it with
//! `rabbitmq-server -detached`), with every call bounded so no test hangs.

use std::time::Duration;

use chatter_runtime::broker::{Broker, RabbitMqBroker, Subscription};
use tokio::time::timeout;

/// The RabbitMQ every test and `relay_worker` use by default.
pub const URI: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Connects to [`URI`]; panics if that takes longer than `within` or fails.
pub async fn connect(within: Duration) -> RabbitMqBroker {
    timeout(within, RabbitMqBroker::connect(URI))
        .await
        .expect("connecting to RabbitMQ takes less than the bound")
        .expect("RabbitMQ runs at 127.0.0.1:5672 (`rabbitmq-server -detached`)")
}

/// Starts consuming `queue`; panics if that takes longer than `within` or fails.
pub async fn subscribe(broker: &RabbitMqBroker, queue: &str, within: Duration) -> Subscription {
    timeout(within, broker.subscribe(queue))
        .await
        .expect("subscribing takes less than the bound")
        .expect("the consumer starts")
}

/// Deletes `queue` and returns how many messages were still in it; panics if that takes longer
/// than `within` or fails.
pub async fn delete_queue(broker: &RabbitMqBroker, queue: &str, within: Duration) -> u32 {
    timeout(within, broker.delete_queue(queue))
        .await
        .expect("deleting the queue takes less than the bound")
        .expect("the queue is deleted")
}

/// Deletes each of `queues`, asserting it held nothing more: every message was settled.
pub async fn delete_emptied(broker: &RabbitMqBroker, queues: &[&str], within: Duration) {
    for queue in queues {
        assert_eq!(
            delete_queue(broker, queue, within).await,
            0,
            "{queue} is empty"
        );
    }
}

/// The RabbitMQ server's address, for a [`TcpProxy`](crate::proxy::TcpProxy) in front of it.
pub fn server_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 5672))
}

/// The URI of RabbitMQ reached through `proxy`.
pub fn uri_through(proxy: &crate::proxy::TcpProxy) -> String {
    format!("amqp://guest:guest@{}/%2f", proxy.addr())
}

/// A channel of a connection of its own: another client of the broker than chatter, e.g. to ask
/// the server about a queue or to declare one as another service would. The connection lives as
/// long as the test process. Panics if connecting takes longer than `within` or fails.
pub async fn foreign_channel(within: Duration) -> lapin::Channel {
    let connection = timeout(
        within,
        lapin::Connection::connect(URI, lapin::ConnectionProperties::default()),
    )
    .await
    .expect("connecting to RabbitMQ takes less than the bound")
    .expect("RabbitMQ runs at 127.0.0.1:5672 (`rabbitmq-server -detached`)");
    let connection = Box::leak(Box::new(connection));
    connection
        .create_channel()
        .await
        .expect("a channel of the new connection")
}

/// A policy on the machine's RabbitMQ (set with `rabbitmqctl`), cleared when dropped: how an
/// operator changes a queue's limits without declaring it again, e.g. to have it refuse
/// messages for a while. Each test names its own, matching only its own queues.
pub struct Policy {
    name: String,
}

impl Policy {
    /// Sets policy `name` on the queue named exactly `queue` to `definition` (JSON), above any
    /// other policy; panics if `rabbitmqctl` fails.
    pub fn set(name: &str, queue: &str, definition: &str) -> Self {
        let pattern = format!("^{}$", queue.replace('.', "\\."));
        rabbitmqctl(&[
            "set_policy",
            name,
            &pattern,
            definition,
            "--apply-to",
            "queues",
            "--priority",
            "100",
        ])
        .unwrap();
        Self {
            name: name.to_owned(),
        }
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        let cleared = rabbitmqctl(&["clear_policy", &self.name]);
        // A second panic while the test already fails would abort the whole binary.
        if !std::thread::panicking() {
            cleared.unwrap();
        }
    }
}

/// Runs `rabbitmqctl` (the machine's RabbitMQ, as root); `Err` with its output if it fails.
fn rabbitmqctl(arguments: &[&str]) -> Result<(), String> {
    let output = std::process::Command::new(program())
        .args(arguments)
        .output()
        .map_err(|e| format!("rabbitmqctl does not run: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rabbitmqctl {arguments:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// How many messages `queue` holds, ready or delivered and not yet settled (`rabbitmqctl
/// list_queues`, which sees the unsettled ones AMQP does not); `None` when it does not exist.
pub fn messages(queue: &str) -> Option<u64> {
    queue_figure(queue, "messages")
}

/// How many of `queue`'s messages are delivered and not yet settled, as the server counts them;
/// `None` when it does not exist.
pub fn unsettled(queue: &str) -> Option<u64> {
    queue_figure(queue, "messages_unacknowledged")
}

/// One `rabbitmqctl list_queues` column of `queue`.
fn queue_figure(queue: &str, column: &str) -> Option<u64> {
    let output = std::process::Command::new(program())
        .args(["-q", "list_queues", "name", column])
        .output()
        .expect("rabbitmqctl runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .find(|(name, _)| *name == queue)
        .and_then(|(_, count)| count.trim().parse().ok())
}

/// `rabbitmqctl`, where Debian puts it (a CI shell's `PATH` may lack `/usr/sbin`).
fn program() -> &'static str {
    if std::path::Path::new("/usr/sbin/rabbitmqctl").exists() {
        "/usr/sbin/rabbitmqctl"
    } else {
        "rabbitmqctl"
    }
}
