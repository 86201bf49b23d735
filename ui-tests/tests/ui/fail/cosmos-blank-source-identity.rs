use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases", monitored_source = "", lease_source = "   ")]
#[partition_key(path = "/order_id")]
struct CreateOrder {
    order_id: String,
}

fn main() {}
