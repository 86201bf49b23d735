use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, handler};
use serde::{Deserialize, Serialize};

/// Registers a tenant's user; the container is partitioned by `/tenantId`.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "identity", container = "users", lease = "users-leases")]
#[partition_key(path = "/tenantId")]
pub struct RegisterUser {
    #[partition_key]
    pub organisation: String,
    pub email: String,
}

#[handler]
async fn register(_command: RegisterUser, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

fn main() {
    assert_eq!(RegisterUser::registration().partition_key.iter().map(|level| level.pointer).collect::<Vec<_>>(), &["/organisation"]);
}
