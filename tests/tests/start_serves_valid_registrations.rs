//! A binary with valid registrations starts, and dispatch runs the bound handler in process.

use std::sync::Mutex;

use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;
use chatter_runtime::{
    BoxError, DocumentReliable, HandlerContext, Runtime, error::DispatchError, error::ErrorChain,
    error::StartError, handler,
};
use chatter_runtime::{Outcome, error::PipelineError};
use serde::{Deserialize, Serialize};

/// Places an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrder {
    pub order_id: String,
    pub quantity: u32,
}

static SEEN: Mutex<Vec<(CreateOrder, String)>> = Mutex::new(Vec::new());

#[handler]
async fn create_order(command: CreateOrder, ctx: &mut HandlerContext) -> Result<(), BoxError> {
    if command.quantity == 0 {
        return Err("quantity must be positive".into());
    }
    SEEN.lock()
        .unwrap()
        .push((command, ctx.message_id().to_owned()));
    Ok(())
}

/// A type the runtime does not know.
#[derive(Serialize, Deserialize)]
pub struct NotACommand {
    pub x: u32,
}

async fn start() -> Runtime {
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_container(&cosmos, "shop", "orders", &["/orderId"])
        .await
        .unwrap();
    Runtime::builder()
        .cosmos(cosmos)
        .without_relay()
        .start()
        .await
        .expect("valid registrations start")
}

#[tokio::test]
async fn start_collects_the_registration_with_its_handler() {
    let runtime = start().await;
    let commands = runtime.registry().commands();
    assert_eq!(commands.len(), 1);
    assert_eq!(commands[0].registration.command_name, "CreateOrder");
    assert!(commands[0].handler.handler_name.ends_with("::create_order"));
    assert!(runtime.registry().get::<CreateOrder>().is_some());
    assert!(runtime.registry().get::<NotACommand>().is_none());
}

#[tokio::test]
async fn dispatch_decodes_the_command_and_runs_its_handler() {
    let runtime = start().await;
    let command = CreateOrder {
        order_id: "o-1".into(),
        quantity: 2,
    };
    let outcome = runtime.dispatch(command.clone(), "msg-1").await.unwrap();
    assert_eq!(outcome, Outcome::Committed { operations: 1 });
    assert!(
        SEEN.lock()
            .unwrap()
            .contains(&(command, "msg-1".to_owned()))
    );
}

#[tokio::test]
async fn handler_error_surfaces_with_the_command_name() {
    let runtime = start().await;
    let err = runtime
        .dispatch(
            CreateOrder {
                order_id: "o-2".into(),
                quantity: 0,
            },
            "msg-2",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            DispatchError::Pipeline(PipelineError::Handler {
                command: "CreateOrder",
                ..
            })
        ),
        "{err}"
    );
    assert!(
        ErrorChain(&err)
            .to_string()
            .contains("quantity must be positive")
    );
}

#[test]
fn partition_key_resolves_from_the_serialized_command() {
    let json = serde_json::to_value(CreateOrder {
        order_id: "o-3".into(),
        quantity: 1,
    })
    .unwrap();
    let values = CreateOrder::registration().resolve_partition_key(&json);
    assert_eq!(values, Some(vec![serde_json::json!("o-3")]));
}

#[tokio::test]
async fn start_fails_naming_a_missing_container() {
    // chatter never creates containers: an unprovisioned store fails the start.
    let cosmos = CosmosConnection::embedded().await.unwrap();
    let err = Runtime::builder().cosmos(cosmos).start().await.unwrap_err();
    assert!(
        matches!(
            err,
            StartError::Container {
                command: "CreateOrder",
                container: "orders",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("ensure_container"), "{err}");
}
