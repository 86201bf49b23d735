// `PlaceOrder` and its handler, shared by `relay_worker` and the tests that run it, so every one
// registers the same monitored container (and so the same relay processor). Not a module of
// the support library: a registration there would be collected by every test binary. Pulled
// in with `include!`.

chatter_tests::event_command! {
    /// Places an order and sends `OrderPlaced` to the queue named by `events`.
    PlaceOrder { order_id as "orderId" }
    on ("relay-kill", "orders", "orders-leases") at "/orderId",
    handled by place_order, sends "OrderPlaced" to events
}
