use chatter_runtime::{DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct Customer {
    pub id: String,
}

/// Opens an account for a customer.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "bank", container = "accounts", lease = "accounts-leases")]
#[partition_key(path = "/customer/id")]
pub struct OpenAccount {
    pub customer: Customer,
}

#[handler]
async fn open(_command: OpenAccount, _ctx: &mut HandlerContext) {}

fn main() {
    let r = OpenAccount::registration();
    assert_eq!(r.partition_key_paths().collect::<Vec<_>>(), &["/customer/id"]);
    let json = serde_json::json!({ "customer": { "id": "c-1" } });
    assert_eq!(r.resolve_partition_key(&json), Some(vec![serde_json::json!("c-1")]));
}
