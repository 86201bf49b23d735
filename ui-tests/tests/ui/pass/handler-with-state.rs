//! A handler taking application state as its third parameter.

use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, State, handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/order_id")]
pub struct PlaceOrder {
    pub order_id: String,
}

pub struct Pricing {
    pub cents: u32,
}

#[handler]
async fn place_order(
    command: PlaceOrder,
    ctx: &mut HandlerContext,
    pricing: State<Pricing>,
) -> Result<(), BoxError> {
    ctx.send_json(
        &format!("priced-{}", command.order_id),
        "OrderPriced",
        &pricing.cents,
    )?;
    Ok(())
}

fn main() {}
