//! Compile-fail and compile-pass cases for `#[derive(DocumentReliable)]` live under `tests/ui/`.
//!
//! The library holds what the cases share: [`CreateOrder`], the well-formed command that the
//! `handler-*` compile-fail cases put under a malformed `#[handler]`.

use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

/// A valid command: the `handler-*` compile-fail cases import it, so that each case fails only on
/// its handler.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/order_id")]
pub struct CreateOrder {
    /// The partition key.
    pub order_id: String,
}
