use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/tenant")]
struct CreateOrder {
    #[partition_key]
    #[partition_key]
    tenant_id: String,
}

fn main() {}
