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

#[handler]
async fn reserve(_command: ReserveStock, _ctx: &mut HandlerContext) -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {
    let declared = ReserveStock::registration().declared_source_identity.unwrap();
    assert_eq!((declared.monitored, declared.lease), ("stock-source", "stock-lease-source"));
}
