use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "mail", container = "idempotency")]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/order_id")]
pub struct SendReceipt {
    pub order_id: String,
}

fn main() {}
