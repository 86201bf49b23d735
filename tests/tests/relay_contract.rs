//! The Monitored Container Contract (catalog §4.1) against real containers of the SDK's
//! in-memory emulator: what the service reports back for a container's partition-key paths and
//! default time-to-live, checked by `relay::contract::verify` / `verify_all`.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use azure_data_cosmos::models::{ContainerProperties, PartitionKeyDefinition, TimeToLive};
use chatter_runtime::cosmos::{ContainerClient, CosmosConnection};
use chatter_runtime::error::{
    MonitoredContainerError, MonitoredContainerViolation, MonitoredContainersError,
};
use chatter_runtime::provision::{ensure_container, ensure_database};
use chatter_runtime::registration::PartitionKeyPath;
use chatter_runtime::testing::{RelaySource, SourceIdentity, verify, verify_all};
use chatter_tests::store::embedded;

/// The start-time bound `verify_all` is given here: far above what the embedded store takes.
const STORE_TIMEOUT: Duration = Duration::from_secs(30);

const DATABASE: &str = "shop";

const TTL_0_MESSAGE: &str = "The Cosmos outbox relay cannot monitor container 'orders' in database 'shop': its default time-to-live is 0, and a pending outbox document carries no ttl field, so Cosmos would delete it before the relay ever published it — the only accepted values are -1 (on, items without a ttl field never expire) and unset. Correct the container or the relay registration and restart.";

const READ_FAILURE_MESSAGE: &str = "The Cosmos outbox relay could not read the properties of monitored container 'orders' in database 'shop'. The relay verifies that container's partition-key path and default time-to-live at start, so it requires metadata read access on the monitored container.";

/// Creates `DATABASE/name` with exactly these partition-key paths and default TTL through the
/// SDK's control plane (provisioning always uses `defaultTtl = -1`), and derives its handle.
async fn container_with(
    connection: &CosmosConnection,
    name: &str,
    paths: &[&str],
    default_ttl: TimeToLive,
) -> Arc<ContainerClient> {
    ensure_database(connection, DATABASE).await.unwrap();
    let paths: Vec<Cow<'static, str>> = paths.iter().map(|p| Cow::Owned((*p).to_owned())).collect();
    let properties = ContainerProperties::new(name.to_owned(), PartitionKeyDefinition::new(paths))
        .with_default_ttl(default_ttl);
    connection
        .client()
        .database_client(DATABASE)
        .create_container(properties, None)
        .await
        .expect("the container is created");
    connection.container(DATABASE, name).await.unwrap()
}

/// Verifies a fresh `shop/orders` container with `actual` paths and `default_ttl` against
/// `declared`.
async fn verify_orders(
    actual: &[&str],
    default_ttl: TimeToLive,
    declared: &[&str],
) -> Result<(), MonitoredContainerError> {
    let connection = embedded().await;
    let orders = container_with(&connection, "orders", actual, default_ttl).await;
    verify(&orders, DATABASE, "orders", declared).await
}

fn violations(error: &MonitoredContainerError) -> &[MonitoredContainerViolation] {
    match error {
        MonitoredContainerError::Violated { violations, .. } => violations,
        other => panic!("expected a contract violation, got: {other}"),
    }
}

// R4.01
#[tokio::test]
async fn matching_partition_key_path_and_ttl_minus_one_pass() {
    verify_orders(&["/tenantId"], TimeToLive::NoDefault, &["/tenantId"])
        .await
        .unwrap();
}

// R4.01, hierarchical
#[tokio::test]
async fn matching_hierarchical_paths_pass() {
    verify_orders(
        &["/tenantId", "/region"],
        TimeToLive::NoDefault,
        &["/tenantId", "/region"],
    )
    .await
    .unwrap();
}

// R4.04
#[tokio::test]
async fn declared_path_without_leading_slash_passes() {
    verify_orders(&["/tenantId"], TimeToLive::NoDefault, &["tenantId"])
        .await
        .unwrap();
    verify_orders(&["/tenantId"], TimeToLive::NoDefault, &["//tenantId/"])
        .await
        .unwrap();
}

// R4.03
#[tokio::test]
async fn case_difference_is_a_mismatch_naming_both_paths() {
    let error = verify_orders(&["/tenantId"], TimeToLive::NoDefault, &["/TenantId"])
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "The Cosmos outbox relay cannot monitor container 'orders' in database 'shop': its declared \
         partition-key path [/TenantId] does not match the container's actual partition-key path \
         [/tenantId] (compared in order, segment for segment, case-sensitively). Correct the \
         container or the relay registration and restart."
    );
    assert_eq!(violations(&error).len(), 1);
}

// R4.05
#[tokio::test]
async fn order_difference_is_a_mismatch() {
    let error = verify_orders(
        &["/region", "/tenantId"],
        TimeToLive::NoDefault,
        &["/tenantId", "/region"],
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("[/tenantId, /region]"), "{message}");
    assert!(message.contains("[/region, /tenantId]"), "{message}");
}

// R4.06
#[tokio::test]
async fn segment_count_difference_is_a_mismatch() {
    let fewer_declared = verify_orders(
        &["/tenantId", "/region"],
        TimeToLive::NoDefault,
        &["/tenantId"],
    )
    .await
    .unwrap_err();
    assert!(matches!(
        violations(&fewer_declared),
        [MonitoredContainerViolation::PartitionKeyPathMismatch { .. }]
    ));
    let more_declared = verify_orders(
        &["/tenantId"],
        TimeToLive::NoDefault,
        &["/tenantId", "/region"],
    )
    .await
    .unwrap_err();
    assert!(matches!(
        violations(&more_declared),
        [MonitoredContainerViolation::PartitionKeyPathMismatch { .. }]
    ));
}

// R4.07
#[tokio::test]
async fn unset_default_ttl_passes() {
    verify_orders(&["/tenantId"], TimeToLive::Forever, &["/tenantId"])
        .await
        .unwrap();
}

// R4.09
#[tokio::test]
async fn default_ttl_zero_is_rejected_with_the_verbatim_text() {
    let error = verify_orders(&["/tenantId"], TimeToLive::Seconds(0), &["/tenantId"])
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), TTL_0_MESSAGE);
    assert_eq!(
        violations(&error),
        [MonitoredContainerViolation::DefaultTimeToLive { seconds: 0 }]
    );
}

// R4.08, R4.31
#[tokio::test]
async fn positive_default_ttls_are_rejected() {
    for seconds in [3600, 86400] {
        let error = verify_orders(&["/tenantId"], TimeToLive::Seconds(seconds), &["/tenantId"])
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            TTL_0_MESSAGE.replace("is 0,", &format!("is {seconds},"))
        );
    }
}

// R4.13
#[tokio::test]
async fn status_partition_key_is_rejected() {
    let error = verify_orders(&["/status"], TimeToLive::NoDefault, &["/status"])
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "The Cosmos outbox relay cannot monitor container 'orders' in database 'shop': its actual \
         partition-key path includes '/status', which the relay patches on every drain — the stamp \
         could never land on a document's partition-key path, so every published document would \
         stay pending and publish again on the next pass, forever (this container's relay is \
         already failing that way today; the check surfaces that defect rather than introducing \
         it). Correct the container or the relay registration and restart."
    );
}

// R4.12
#[tokio::test]
async fn ttl_partition_key_is_rejected() {
    let error = verify_orders(&["/ttl"], TimeToLive::NoDefault, &["/ttl"])
        .await
        .unwrap_err();
    assert_eq!(
        violations(&error),
        [MonitoredContainerViolation::StampedPartitionKeyPath { path: "/ttl" }]
    );
    assert!(error.to_string().contains("includes '/ttl'"));
}

// R4.14
#[tokio::test]
async fn ttl_as_a_hierarchical_level_is_rejected() {
    let error = verify_orders(
        &["/tenantId", "/ttl"],
        TimeToLive::NoDefault,
        &["/tenantId", "/ttl"],
    )
    .await
    .unwrap_err();
    assert_eq!(
        violations(&error),
        [MonitoredContainerViolation::StampedPartitionKeyPath { path: "/ttl" }]
    );
}

// R4.15
#[tokio::test]
async fn capitalized_ttl_partition_key_passes() {
    verify_orders(&["/Ttl"], TimeToLive::NoDefault, &["/Ttl"])
        .await
        .unwrap();
}

// R4.16
#[tokio::test]
async fn mismatch_and_stamped_path_are_reported_in_one_message() {
    let error = verify_orders(&["/ttl"], TimeToLive::NoDefault, &["/tenantId"])
        .await
        .unwrap_err();
    let message = error.to_string();
    assert_eq!(violations(&error).len(), 2);
    assert!(
        message.contains(
            "[/tenantId] does not match the container's actual partition-key path [/ttl] \
             (compared in order, segment for segment, case-sensitively); and its actual \
             partition-key path includes '/ttl'"
        ),
        "{message}"
    );
}

// R4.10
#[tokio::test]
async fn several_violations_are_joined_by_and_in_one_error() {
    let error = verify_orders(&["/tenantId"], TimeToLive::Seconds(86400), &["/TenantId"])
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("/TenantId"), "{message}");
    assert!(message.contains("/tenantId"), "{message}");
    assert!(message.contains("86400"), "{message}");
    assert!(
        message.contains("case-sensitively); and its default time-to-live is 86400, "),
        "{message}"
    );
    assert_eq!(message.matches("; and ").count(), 1, "{message}");
    assert!(message.starts_with(
        "The Cosmos outbox relay cannot monitor container 'orders' in database 'shop': "
    ));
    assert!(message.ends_with(". Correct the container or the relay registration and restart."));
}

// All three checks at once, in check order.
#[tokio::test]
async fn all_three_violations_are_reported_in_check_order() {
    let error = verify_orders(&["/status"], TimeToLive::Seconds(0), &["/tenantId"])
        .await
        .unwrap_err();
    assert_eq!(
        violations(&error),
        [
            MonitoredContainerViolation::PartitionKeyPathMismatch {
                declared: vec!["/tenantId".to_owned()],
                actual: vec!["/status".to_owned()],
            },
            MonitoredContainerViolation::DefaultTimeToLive { seconds: 0 },
            MonitoredContainerViolation::StampedPartitionKeyPath { path: "/status" },
        ]
    );
}

// R4.11
#[tokio::test]
async fn a_missing_container_gives_the_read_failure_error_with_the_store_error() {
    let connection = embedded().await;
    let orders = container_with(&connection, "orders", &["/tenantId"], TimeToLive::NoDefault).await;
    orders.delete(None).await.expect("the container is deleted");

    let error = verify(&orders, DATABASE, "orders", &["/tenantId"])
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), READ_FAILURE_MESSAGE);
    let MonitoredContainerError::Unreadable { source, .. } = &error else {
        panic!("expected the read failure, got: {error}");
    };
    assert_eq!(source.status(), Some(404), "{source}");
    assert!(error.source().is_some(), "the store error is the source");
}

fn source_over(container: &'static str, paths: &'static [&'static str]) -> RelaySource {
    let identity = SourceIdentity::GroundTruth {
        monitored_endpoint: "embedded".to_owned(),
        monitored_database: DATABASE.to_owned(),
        monitored_container: container.to_owned(),
        lease_endpoint: "embedded".to_owned(),
        lease_database: DATABASE.to_owned(),
        lease_container: "leases".to_owned(),
    };
    RelaySource {
        processor_name: identity.processor_name(),
        identity,
        database: DATABASE,
        container,
        lease: "leases",
        partition_key_paths: Box::leak(
            paths
                .iter()
                .map(|&path| PartitionKeyPath {
                    path,
                    pointer: path,
                })
                .collect(),
        ),
        commands: vec!["command"],
    }
}

// R4.32–R4.34
#[tokio::test]
async fn verify_all_passes_when_every_container_keeps_the_contract() {
    let connection = embedded().await;
    ensure_container(&connection, DATABASE, "orders", &["/tenantId"])
        .await
        .unwrap();
    ensure_container(&connection, DATABASE, "invoices", &["/tenantId", "/region"])
        .await
        .unwrap();
    verify_all(
        &connection,
        &[
            source_over("orders", &["/tenantId"]),
            source_over("invoices", &["tenantId", "/region"]),
        ],
        STORE_TIMEOUT,
    )
    .await
    .unwrap();
    verify_all(&connection, &[], STORE_TIMEOUT).await.unwrap();
}

// R4.32: the relay never starts degraded, and every failing container is named at once.
#[tokio::test]
async fn verify_all_reports_every_violating_container_in_one_error() {
    let connection = embedded().await;
    container_with(
        &connection,
        "orders",
        &["/tenantId"],
        TimeToLive::Seconds(0),
    )
    .await;
    ensure_container(&connection, DATABASE, "valid", &["/tenantId"])
        .await
        .unwrap();
    container_with(&connection, "invoices", &["/status"], TimeToLive::NoDefault).await;

    let MonitoredContainersError { errors } = verify_all(
        &connection,
        &[
            source_over("orders", &["/tenantId"]),
            source_over("valid", &["/tenantId"]),
            source_over("invoices", &["/status"]),
            source_over("missing", &["/tenantId"]),
        ],
        STORE_TIMEOUT,
    )
    .await
    .unwrap_err();
    assert_eq!(errors.len(), 3);
    assert_eq!(errors[0].to_string(), TTL_0_MESSAGE);
    assert!(
        matches!(&errors[1], MonitoredContainerError::Violated { container, .. } if container == "invoices")
    );
    assert!(
        matches!(&errors[2], MonitoredContainerError::Unreadable { container, source, .. }
            if container == "missing" && source.status() == Some(404)),
        "{}",
        errors[2]
    );

    let joined = MonitoredContainersError { errors }.to_string();
    let lines: Vec<&str> = joined.lines().collect();
    assert_eq!(lines.len(), 3, "{joined}");
    assert_eq!(lines[0], TTL_0_MESSAGE);
    assert!(lines[2].starts_with(
        "The Cosmos outbox relay could not read the properties of monitored container 'missing'"
    ));
}

// A single failing container reads exactly as the contract's own message.
#[tokio::test]
async fn verify_all_with_one_missing_container_gives_the_read_failure_text() {
    let connection = embedded().await;
    ensure_database(&connection, DATABASE).await.unwrap();
    let error = verify_all(
        &connection,
        &[source_over("orders", &["/tenantId"])],
        STORE_TIMEOUT,
    )
    .await
    .unwrap_err();
    assert_eq!(error.to_string(), READ_FAILURE_MESSAGE);
}

/// The derive refuses as a partition-key root exactly the fields the runtime reserves on the
/// documents it puts in a command's container (those it creates them with, and the delivered
/// stamp's; not the operator's reason, which only `chatter outbox give-up` writes). The macro
/// crate cannot import the runtime's list: its compile-fail case names every root (and
/// trybuild checks each is refused), and this test holds the case to the runtime's list.
#[test]
fn the_derive_refuses_every_root_field_the_runtime_writes() {
    let case = include_str!("../../ui-tests/tests/ui/fail/path-reserved-roots.rs");
    let refused: BTreeSet<&str> = case
        .lines()
        .filter_map(|line| line.trim().strip_prefix("#[partition_key(path = \"/"))
        .filter_map(|rest| rest.split(['/', '"']).next())
        .collect();
    let written = chatter_runtime::testing::reserved_root_fields();
    assert_eq!(refused, written);
}
