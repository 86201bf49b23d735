// `PlaceOrder` and its handler for the relay benches (`relay_throughput`, `relay_latency`,
// `relay_store_latency`): one order in the database `bench`, one `{message id}:created` event to
// `destination()`. Not a module of the support library: a registration there would be collected
// by every test binary. Pulled in with `include!`; the including file defines
// `fn destination() -> &'static str` and imports `BoxError`, `DocumentReliable`,
// `HandlerContext`, `handler`, `Serialize`, `Deserialize` and `json`.

/// The dispatched command: one order, one event.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "bench", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
}

#[handler]
async fn place_order(command: PlaceOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id, "status": "placed" }))?;
    ctx.send_json(
        &format!("{}:created", ctx.message_id()),
        destination(),
        &json!({ "orderId": command.order_id }),
    )?;
    Ok(())
}

/// The `n`th order of a bench: `order-{n}`.
fn order(n: usize) -> PlaceOrder {
    PlaceOrder {
        order_id: format!("order-{n}"),
    }
}
