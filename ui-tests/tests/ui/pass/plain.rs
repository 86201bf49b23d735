use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

/// Places an order.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    pub order_id: String,
    pub quantity: u32,
}

#[handler]
async fn create_order(_command: CreateOrder, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let registration = <CreateOrder as DocumentReliable>::registration();
    assert_eq!(registration.command_name, "CreateOrder");
    assert_eq!(registration.destination, "CreateOrder");
    assert_eq!(registration.partition_key_paths().collect::<Vec<_>>(), &["/orderId"]);
    assert_eq!(registration.partition_key.iter().map(|level| level.pointer).collect::<Vec<_>>(), &["/orderId"]);
    assert!(CreateOrder::DOCUMENT_RELIABILITY.declared_source_identity.is_none());
}
