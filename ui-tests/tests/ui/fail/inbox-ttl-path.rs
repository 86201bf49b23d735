use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "mail", container = "idempotency", partition_key = "/ttl", marker_ttl = 604800)]
pub struct SendReceipt {
    pub order_id: String,
}

fn main() {}
