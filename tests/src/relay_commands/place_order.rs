// `PlaceOrder` and its handler, shared by `relay_worker` and the tests that run it, so every one
// registers the same monitored container (and so the same relay processor). Not a module of
// the support library: a registration there would be collected by every test binary. Pulled
// in with `include!`; the including file imports `BoxError`, `BrokeredMessage`,
// `DocumentReliable`, `HandlerContext`, `handler`, `Serialize`, `Deserialize` and `json`.

/// Places an order and sends `OrderPlaced` to the queue named by `events`.
#[derive(Debug, Clone, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "relay-kill", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct PlaceOrder {
    pub order_id: String,
    pub events: String,
}

#[handler]
async fn place_order(command: PlaceOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    ctx.upsert(json!({ "id": command.order_id, "orderId": command.order_id }))?;
    let event = format!("{}:OrderPlaced", ctx.message_id());
    ctx.send(BrokeredMessage::json(
        event,
        command.events,
        json!({ "orderId": command.order_id }).to_string(),
    ))?;
    Ok(())
}
