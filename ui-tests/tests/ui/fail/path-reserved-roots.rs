//! Every root field chatter writes on the documents it puts in a command's container (the Outbox
//! Document, its delivered stamp, the inbox marker) refused as a partition-key root. The list is
//! tied to the runtime's: `tests/tests/relay_contract.rs` compares the paths below with the
//! fields the runtime reserves (not the operator's reason, which only a give-up writes).

use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/id")]
struct Command0 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/_chatterType/tenant")]
struct Command1 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/status")]
struct Command2 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/ttl/tenant")]
struct Command3 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/MessageId")]
struct Command4 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/Destination/tenant")]
struct Command5 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/MessageBody")]
struct Command6 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/MessageContentType/tenant")]
struct Command7 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/MessageContext")]
struct Command8 {
    tenant: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/ReceivedAtUtc/tenant")]
struct Command9 {
    tenant: String,
}

fn main() {}
