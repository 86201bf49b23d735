use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "mail", container = "idempotency", lease = "leases", partition_key = "/Destination")]
pub struct SendReceipt {
    pub order_id: String,
}

fn main() {}
