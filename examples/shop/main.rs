//! The shop example: `cargo run -p chatter-examples --bin shop`.
//!
//! Registers one command, `CreateOrder`, and handles it.

use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

/// Places an order for a quantity of one product.
#[derive(Debug, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    /// The order's id, also its partition key.
    pub order_id: String,
    /// How many items.
    pub quantity: u32,
}

#[handler]
async fn create_order(command: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    println!(
        "handled CreateOrder {} (quantity {}) under message id {}",
        command.order_id,
        command.quantity,
        ctx.message_id()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let runtime = chatter_runtime::start().await?;
    for command in runtime.registry().commands() {
        let r = command.registration;
        println!(
            "registered {} -> {}/{} (lease {}), partition key {:?}",
            r.command_name, r.database, r.container, r.lease, r.partition_key_paths
        );
    }
    runtime
        .dispatch(
            CreateOrder {
                order_id: "order-1".into(),
                quantity: 3,
            },
            "msg-order-1",
        )
        .await?;
    runtime.shutdown().await;
    Ok(())
}
