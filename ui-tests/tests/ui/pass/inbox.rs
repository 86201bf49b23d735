//! A standalone-inbox command and its handler.

use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "mail", container = "idempotency", marker_ttl = 604800)]
pub struct SendReceipt {
    pub order_id: String,
}

#[handler]
async fn send_receipt(_command: SendReceipt, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let declared = SendReceipt::DOCUMENT_RELIABILITY.standalone_inbox.unwrap();
    assert_eq!(declared.partition_key_path, "/idempotencyKey");
    assert_eq!(declared.marker_ttl_seconds, Some(604800));
}
