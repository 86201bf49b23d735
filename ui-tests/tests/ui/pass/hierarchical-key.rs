use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

/// Records a meter reading.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "iot", container = "readings", lease = "readings-leases")]
#[partition_key(path = "/tenant", path = "/site", path = "/meter")]
#[serde(rename_all = "camelCase")]
pub struct RecordReading {
    pub tenant: String,
    pub site: String,
    #[partition_key(path = "/meter")]
    pub meter_number: u64,
    pub value: f64,
}

#[handler]
async fn record(_command: RecordReading, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let r = RecordReading::registration();
    assert_eq!(r.partition_key_paths().collect::<Vec<_>>(), &["/tenant", "/site", "/meter"]);
    assert_eq!(r.partition_key.iter().map(|level| level.pointer).collect::<Vec<_>>(), &["/tenant", "/site", "/meterNumber"]);
}
