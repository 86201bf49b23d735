use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "", container = "orders")]
#[partition_key(path = "orderId")]
#[chatter(destination = "")]
struct CreateOrder {
    order_id: String,
}

fn main() {}
