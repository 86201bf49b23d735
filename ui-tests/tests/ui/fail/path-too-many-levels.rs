use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/a", path = "/b", path = "/c", path = "/d")]
struct CreateOrder {
    a: String,
    b: String,
    c: String,
    d: String,
}

fn main() {}
