use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

/// Posts a ledger entry.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "finance", container = "ledger", lease = "ledger-leases")]
#[partition_key(path = "/account")]
#[chatter(name = "ledger.post", destination = "ledger-commands")]
pub struct PostLedgerEntry {
    #[serde(rename = "account")]
    pub account_number: String,
    pub amount_cents: i64,
}

#[handler]
async fn post(_command: PostLedgerEntry, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    let r = PostLedgerEntry::registration();
    assert_eq!(r.command_name, "ledger.post");
    assert_eq!(r.destination, "ledger-commands");
    assert_eq!(r.partition_key.iter().map(|level| level.pointer).collect::<Vec<_>>(), &["/account"]);
}
