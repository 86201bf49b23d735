use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/order_id")]
#[chatter(max_delivery_attempts = "five")]
struct CreateOrder {
    order_id: String,
}

fn main() {}
