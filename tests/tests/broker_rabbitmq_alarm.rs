//! RabbitMQ blocks a connection that publishes during a resource alarm and stops reading it
//! until the alarm clears: a consumer's acknowledgements must not travel on that connection.
//!
//! The alarm is a disk alarm raised on the machine's shared RabbitMQ for the test's own few
//! seconds (`rabbitmqctl set_disk_free_limit` above the free disk) and restored by a guard even
//! when the test fails; the server is never restarted. While it lasts every publisher of the
//! machine is blocked, so the test runs alone in its nextest group (`.config/nextest.toml`).
#![cfg(feature = "rabbitmq")]

use std::time::Duration;

use chatter_runtime::BrokeredMessage;
use chatter_runtime::broker::Broker;
use chatter_tests::broker::next_delivery;
use chatter_tests::rabbitmq;
use chatter_tests::wait::eventually;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);
/// The longest the alarm lasts: the machine's other publishers wait that long at worst.
const ALARM_BOUND: Duration = Duration::from_secs(8);
const POLL: Duration = Duration::from_millis(50);

fn rabbitmqctl(arguments: &[&str]) -> String {
    let program = if std::path::Path::new("/usr/sbin/rabbitmqctl").exists() {
        "/usr/sbin/rabbitmqctl"
    } else {
        "rabbitmqctl"
    };
    let output = std::process::Command::new(program)
        .args(arguments)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        output.status.success(),
        "rabbitmqctl {arguments:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A disk alarm on the machine's RabbitMQ, raised by setting the free-disk limit far above the
/// free disk; dropping it sets the limit in effect before back (in bytes, exactly), also when the
/// test panics.
struct DiskAlarm {
    previous_limit: String,
}

impl DiskAlarm {
    fn raise() -> Self {
        let previous_limit = rabbitmqctl(&["eval", "rabbit_disk_monitor:get_disk_free_limit()."]);
        assert!(
            previous_limit.parse::<u64>().is_ok(),
            "the free-disk limit in effect is a number of bytes, not {previous_limit:?}"
        );
        // 1 PB: more than any disk of this machine has free.
        rabbitmqctl(&["set_disk_free_limit", "1000000000000000"]);
        Self { previous_limit }
    }
}

impl Drop for DiskAlarm {
    fn drop(&mut self) {
        rabbitmqctl(&["set_disk_free_limit", &self.previous_limit]);
    }
}

/// The local ports of this process's TCP connections to RabbitMQ (from `/proc`): the server
/// sees them as the connections' peer ports.
fn own_ports() -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd is readable")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let server_port = format!(":{:04X}", rabbitmq::server_addr().port());
    let table = std::fs::read_to_string("/proc/self/net/tcp").expect("/proc/self/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
            if !remote.ends_with(&server_port) || !inodes.iter().any(|i| i == inode) {
                return None;
            }
            u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
        })
        .collect()
}

/// Whether the server has blocked one of this process's connections.
fn own_connection_blocked() -> bool {
    let ours = own_ports();
    rabbitmqctl(&["-q", "list_connections", "peer_port", "state"])
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .any(|(port, state)| {
            state.trim() == "blocked" && port.trim().parse().is_ok_and(|p: u16| ours.contains(&p))
        })
}

#[tokio::test]
async fn a_consumer_acks_while_a_publish_is_blocked_by_a_resource_alarm() {
    let broker = rabbitmq::connect(WAIT).await;
    let destination = format!("chatter-test-alarm-{}", uuid::Uuid::new_v4().simple());
    broker
        .publish(BrokeredMessage::json(
            "before-the-alarm",
            &destination,
            "{}",
        ))
        .await
        .expect("published before the alarm");
    let mut subscription = rabbitmq::subscribe(&broker, &destination, WAIT).await;
    let delivery = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(
        rabbitmq::messages(&destination),
        Some(1),
        "delivered, unacked"
    );

    let acked = {
        let _alarm = DiskAlarm::raise();
        let publishing = broker.clone();
        let during = BrokeredMessage::json("during-the-alarm", &destination, "{}");
        let blocked = tokio::spawn(async move { publishing.publish(during).await });
        eventually(
            ALARM_BOUND,
            POLL,
            "the server blocked this process's publishing connection",
            || async { own_connection_blocked() },
        )
        .await;
        timeout(ALARM_BOUND, delivery.ack())
            .await
            .expect("the ack is sent in time")
            .expect("the ack is sent");
        // The server counts the message until it has read the ack.
        let mut settled = false;
        let deadline = tokio::time::Instant::now() + ALARM_BOUND;
        while !settled && tokio::time::Instant::now() < deadline {
            settled = rabbitmq::messages(&destination) == Some(0);
            if !settled {
                tokio::time::sleep(POLL).await;
            }
        }
        assert!(
            !blocked.is_finished(),
            "the publish was still blocked by the alarm when the ack was read"
        );
        (settled, blocked)
    };
    let (settled, blocked) = acked;
    assert!(
        settled,
        "the server read the consumer's ack while a publish was blocked by the alarm (it stalled \
         behind the blocked connection)"
    );
    // Once the alarm is over the blocked publish is confirmed.
    timeout(WAIT, blocked)
        .await
        .expect("the publish returns after the alarm")
        .expect("the publishing task did not panic")
        .expect("the publish is confirmed after the alarm");
    let after = next_delivery(&mut subscription, WAIT).await;
    assert_eq!(after.message.message_id, "during-the-alarm");
    after.ack().await.expect("acked");
    rabbitmq::delete_queue(&broker, &destination, WAIT).await;
}
