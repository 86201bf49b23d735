use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/order_id")]
struct CreateOrder {
    order_id: String,
}

#[handler]
fn create_order(_command: CreateOrder, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {}
