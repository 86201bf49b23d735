//! `start()` rejects conflicting registrations with one error that names every problem and both
//! source locations of each. This binary holds only the conflicting registrations below.

use chatter_runtime::error::RegistrationProblem;
use chatter_runtime::{BoxError, DocumentReliable, HandlerContext, error::StartError, handler};
use serde::{Deserialize, Serialize};

/// Claims the name `orders.create`.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[chatter(name = "orders.create", destination = "orders-a")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrderA {
    pub order_id: String,
}

/// Claims the same name from another type.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
#[partition_key(path = "/orderId")]
#[chatter(name = "orders.create", destination = "orders-b")]
#[serde(rename_all = "camelCase")]
pub struct CreateOrderB {
    pub order_id: String,
}

/// Shares `shop/orders` with `CreateOrderA` but declares another partition-key path and lease.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "orders", lease = "other-leases")]
#[partition_key(path = "/customerId")]
#[serde(rename_all = "camelCase")]
pub struct CancelOrder {
    pub customer_id: String,
}

/// Has two handlers.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "payments", lease = "payments-leases")]
#[partition_key(path = "/paymentId")]
#[serde(rename_all = "camelCase")]
pub struct CapturePayment {
    pub payment_id: String,
}

/// Has no handler.
#[derive(Serialize, Deserialize, DocumentReliable)]
#[cosmos(database = "shop", container = "shipments", lease = "shipments-leases")]
#[partition_key(path = "/shipmentId")]
#[serde(rename_all = "camelCase")]
pub struct ShipOrder {
    pub shipment_id: String,
}

#[handler]
async fn create_a(_c: CreateOrderA, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

#[handler]
async fn create_b(_c: CreateOrderB, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

#[handler]
async fn cancel(_c: CancelOrder, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

#[handler]
async fn capture_first(_c: CapturePayment, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

#[handler]
async fn capture_second(_c: CapturePayment, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

async fn start_error() -> (Vec<RegistrationProblem>, String) {
    match chatter_runtime::start().await {
        Err(StartError::Registry(e)) => (e.problems.clone(), e.to_string()),
        Err(other) => panic!("expected a registry error, got {other}"),
        Ok(_) => panic!("start() accepted conflicting registrations"),
    }
}

/// `file:line` in this file. The lines below are those of the `pub struct` / `async fn` lines the
/// registrations point at: keep them in step when editing the items above.
fn here(line: u32) -> String {
    format!("{}:{line}", file!())
}

#[tokio::test]
async fn duplicate_command_name_names_both_types_and_locations() {
    let (problems, message) = start_error().await;
    let duplicate = problems
        .iter()
        .find_map(|p| match p {
            RegistrationProblem::DuplicateCommandName {
                name,
                first,
                second,
                ..
            } => Some((*name, *first, *second)),
            _ => None,
        })
        .expect("a duplicate-name problem");
    assert_eq!(duplicate.0, "orders.create");
    assert_eq!(duplicate.1.to_string(), here(14));
    assert_eq!(duplicate.2.to_string(), here(24));
    assert!(
        message.contains(&here(14)) && message.contains(&here(24)),
        "{message}"
    );
    assert!(
        message.contains("CreateOrderA") && message.contains("CreateOrderB"),
        "{message}"
    );
}

#[tokio::test]
async fn second_handler_names_both_handlers_and_locations() {
    let (problems, message) = start_error().await;
    assert!(
        problems.iter().any(|p| matches!(p,
            RegistrationProblem::DuplicateHandler { command: "CapturePayment", first, second, .. }
                if first.to_string() == here(71) && second.to_string() == here(76))),
        "{message}"
    );
    assert!(
        message.contains("capture_first") && message.contains("capture_second"),
        "{message}"
    );
}

#[tokio::test]
async fn command_without_handler_is_rejected_with_its_location() {
    let (problems, message) = start_error().await;
    assert!(
        problems.iter().any(|p| matches!(p,
            RegistrationProblem::MissingHandler { command: "ShipOrder", location, .. }
                if location.to_string() == here(51))),
        "{message}"
    );
}

#[tokio::test]
async fn container_shared_with_another_partition_key_path_and_lease_is_rejected() {
    let (problems, message) = start_error().await;
    let settings: Vec<&str> = problems
        .iter()
        .filter_map(|p| match p {
            RegistrationProblem::ConflictingContainer {
                setting,
                container: "orders",
                ..
            } => Some(*setting),
            _ => None,
        })
        .collect();
    assert_eq!(
        settings,
        ["partition-key path", "lease container"],
        "{message}"
    );
    assert!(
        message.contains("[/orderId]") && message.contains("[/customerId]"),
        "{message}"
    );
}

#[tokio::test]
async fn every_problem_is_reported_in_one_error() {
    let (problems, message) = start_error().await;
    // duplicate name, duplicate handler, missing handler, two container conflicts; the handler of
    // the rejected duplicate `CreateOrderB` is reported as handling an unregistered command.
    assert_eq!(problems.len(), 6, "{message}");
    assert!(
        message.starts_with("chatter found 6 registration problems:"),
        "{message}"
    );
}

/// Two standalone-inbox commands on one idempotency container (below the items whose lines the
/// tests above quote).
#[derive(Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "mail", container = "idempotency")]
pub struct SendReceipt {
    pub order_id: String,
}

#[derive(Serialize, Deserialize, DocumentReliable)]
#[inbox(database = "mail", container = "idempotency")]
pub struct SendInvoice {
    pub order_id: String,
}

#[handler]
async fn send_receipt(_c: SendReceipt, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

#[handler]
async fn send_invoice(_c: SendInvoice, _ctx: &mut HandlerContext) -> Result<(), BoxError> {
    Ok(())
}

// Markers are keyed by message id alone: two standalone-inbox commands sharing an idempotency
// container would skip each other's ids, so start() refuses them, naming both.
#[tokio::test]
async fn two_inbox_commands_on_one_idempotency_container_are_refused() {
    use chatter_runtime::__private::{HandlerRegistration, inventory};
    use chatter_runtime::cosmos::CosmosConnection;
    use chatter_runtime::provision;
    let cosmos = CosmosConnection::embedded().await.unwrap();
    provision::ensure_for::<SendReceipt>(&cosmos).await.unwrap();
    let inbox_commands = [SendReceipt::registration(), SendInvoice::registration()];
    let registry = chatter_runtime::testing::Registry::build(
        inbox_commands,
        inventory::iter::<HandlerRegistration>
            .into_iter()
            .filter(|h| {
                let name = (h.command)().command_name;
                name == "SendReceipt" || name == "SendInvoice"
            }),
    )
    .unwrap();
    let error = chatter_runtime::Runtime::builder()
        .cosmos(cosmos)
        .registry(registry)
        .start()
        .await
        .unwrap_err();
    let StartError::SharedIdempotencyContainer { first, second, .. } = &error else {
        panic!("{error:?}");
    };
    let mut both = [*first, *second];
    both.sort_unstable();
    assert_eq!(both, ["SendInvoice", "SendReceipt"]);
    assert!(error.to_string().contains("mail/idempotency"), "{error}");
}
