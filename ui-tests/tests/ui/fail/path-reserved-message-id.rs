use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/MessageId/tenant")]
struct CreateOrder {
    #[serde(rename = "MessageId")]
    message_id: String,
}

fn main() {}
