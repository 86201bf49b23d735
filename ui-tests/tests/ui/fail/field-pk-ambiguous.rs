use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/tenant", path = "/region")]
struct CreateOrder {
    #[partition_key]
    tenant_id: String,
    region: String,
}

fn main() {}
