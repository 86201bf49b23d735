use chatter_runtime::DocumentReliable;
use serde::{Deserialize, Serialize};

/// Charges a card; a failing charge is tried at most twice before it is dead-lettered.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "payments", lease = "payments-leases")]
#[partition_key(path = "/paymentId")]
#[chatter(name = "ChargeCard", max_delivery_attempts = 2)]
#[serde(rename_all = "camelCase")]
pub struct ChargeCard {
    pub payment_id: String,
}

fn main() {
    assert_eq!(ChargeCard::DOCUMENT_RELIABILITY.max_delivery_attempts, Some(2));
}
