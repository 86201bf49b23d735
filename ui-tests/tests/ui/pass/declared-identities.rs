use chatter_runtime::{DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

/// Reserves stock.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "shop",
    container = "stock",
    lease = "stock-leases",
    monitored_source = "stock-source",
    lease_source = "stock-lease-source"
)]
#[partition_key(path = "/sku")]
pub struct ReserveStock {
    pub sku: String,
}

/// Posts a ledger entry. A declared source identity is an opaque token, not a Cosmos resource
/// name: `/` (and any other non-blank text) is fine.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(
    database = "finance",
    container = "ledger",
    lease = "ledger-leases",
    monitored_source = "fin/ledger",
    lease_source = "fin/ledger-leases?#\\"
)]
#[partition_key(path = "/account")]
pub struct PostEntry {
    pub account: String,
}

#[handler]
async fn post(_command: PostEntry, _ctx: &mut HandlerContext) -> Result<(), std::io::Error> {
    Ok(())
}

#[handler]
async fn reserve(_command: ReserveStock, _ctx: &mut HandlerContext) -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {
    let declared = ReserveStock::registration().declared_source_identity.unwrap();
    assert_eq!((declared.monitored, declared.lease), ("stock-source", "stock-lease-source"));
    let declared = PostEntry::registration().declared_source_identity.unwrap();
    assert_eq!(
        (declared.monitored, declared.lease),
        ("fin/ledger", "fin/ledger-leases?#\\")
    );
}
