//! Unit tests of the derive's rules, run as the macro runs them: parsed input through
//! [`super::command`]. They cover what a valid command checks to and the messages of rules across
//! the families: every error at once, reserved roots, suggestions, no cascade after a syntax error.

use super::partition_key::RESERVED_ROOTS;
use super::*;
use syn::{DeriveInput, parse_quote};

fn run(input: DeriveInput) -> Result<Checked, Vec<String>> {
    let cx = Ctxt::new();
    let parsed = super::super::attr::parse(&cx, &input);
    let checked = command(&cx, &parsed);
    match cx.check() {
        Ok(()) => Ok(checked.expect("no errors means checked")),
        Err(e) => Err(e.into_iter().map(|e| e.to_string()).collect()),
    }
}

#[test]
fn plain_registration_reads_every_attribute() {
    let checked = run(parse_quote! {
        #[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
        #[partition_key(path = "/orderId")]
        #[serde(rename_all = "camelCase")]
        struct CreateOrder { order_id: String, quantity: u32 }
    })
    .unwrap();
    assert_eq!(checked.command_name, "CreateOrder");
    assert_eq!(checked.destination, "CreateOrder");
    assert_eq!(
        (checked.database.as_str(), checked.container.as_str()),
        ("shop", "orders")
    );
    assert_eq!(checked.lease, "orders-leases");
    assert_eq!(checked.partition_key_paths, ["/orderId"]);
    assert_eq!(checked.partition_key_sources, ["/orderId"]);
    assert_eq!(checked.partition_key_fields, ["order_id"]);
    assert_eq!(checked.declared_source_identity, None);
}

#[test]
fn name_and_destination_override_the_type_name() {
    let checked = run(parse_quote! {
        #[cosmos(database = "shop", container = "orders", lease = "l")]
        #[partition_key(path = "/id2")]
        #[chatter(name = "orders.create", destination = "orders-in")]
        struct CreateOrder { id2: String }
    })
    .unwrap();
    assert_eq!(checked.command_name, "orders.create");
    assert_eq!(checked.destination, "orders-in");
}

#[test]
fn nested_path_reads_the_nested_value() {
    let checked = run(parse_quote! {
        #[cosmos(database = "d", container = "c", lease = "l")]
        #[partition_key(path = "/customer/id")]
        struct OpenAccount { customer: Customer }
    })
    .unwrap();
    assert_eq!(checked.partition_key_sources, ["/customer/id"]);
}

#[test]
fn field_marker_supplies_a_differently_named_path() {
    let checked = run(parse_quote! {
        #[cosmos(database = "d", container = "c", lease = "l")]
        #[partition_key(path = "/tenant/id", path = "/region")]
        struct S {
            #[partition_key(path = "/tenant/id")]
            #[serde(rename = "tenant~x")]
            tenant: String,
            region: String,
        }
    })
    .unwrap();
    // RFC 6901 escapes `~` in the pointer.
    assert_eq!(checked.partition_key_sources, ["/tenant~0x", "/region"]);
    assert_eq!(checked.partition_key_fields, ["tenant", "region"]);
}

#[test]
fn declared_identities_are_kept_as_a_pair() {
    let checked = run(parse_quote! {
        #[cosmos(database = "d", container = "c", lease = "l", monitored_source = "m", lease_source = "ls")]
        #[partition_key(path = "/k")]
        struct S { k: String }
    })
    .unwrap();
    assert_eq!(
        checked.declared_source_identity,
        Some(("m".into(), "ls".into()))
    );
}

#[test]
fn declared_identities_are_opaque_tokens_not_resource_names() {
    let checked = run(parse_quote! {
        #[cosmos(database = "d", container = "c", lease = "l", monitored_source = "fin/ledger", lease_source = "a\\b?#c")]
        #[partition_key(path = "/k")]
        struct S { k: String }
    })
    .unwrap();
    assert_eq!(
        checked.declared_source_identity,
        Some(("fin/ledger".into(), "a\\b?#c".into()))
    );
}

#[test]
fn blank_declared_identities_are_rejected_each() {
    let errors = run(parse_quote! {
        #[cosmos(database = "d", container = "c", lease = "l", monitored_source = "", lease_source = " \t")]
        #[partition_key(path = "/k")]
        struct S { k: String }
    })
    .unwrap_err();
    assert_eq!(
        errors,
        [
            "`#[cosmos(monitored_source = ...)]` must not be empty or whitespace",
            "`#[cosmos(lease_source = ...)]` must not be empty or whitespace",
        ]
    );
}

#[test]
fn resource_names_still_refuse_a_slash() {
    let errors = run(parse_quote! {
        #[cosmos(database = "d", container = "fin/ledger", lease = "l")]
        #[partition_key(path = "/k")]
        struct S { k: String }
    })
    .unwrap_err();
    assert_eq!(
        errors,
        [
            "`#[cosmos(container = ...)]` contains `/`, which Cosmos DB does not allow in a resource name"
        ]
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let errors = run(parse_quote! {
        #[cosmos(database = " ", container = "orders")]
        #[partition_key(path = "orderId")]
        #[chatter(destination = "")]
        struct S { order_id: String }
    })
    .unwrap_err();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    assert!(errors.iter().any(|e| e.contains("must start with `/`")));
    assert!(errors.iter().any(|e| e.contains("missing `lease")));
}

#[test]
fn reserved_roots_are_rejected_but_case_differs_is_allowed() {
    for root in RESERVED_ROOTS {
        let path = format!("/{root}");
        let input: DeriveInput = parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l")]
            #[partition_key(path = #path)]
            struct S { x: String }
        };
        let errors = run(input).unwrap_err();
        assert!(
            errors[0].contains("a field chatter owns"),
            "{root}: {errors:?}"
        );
    }
    // `/Ttl` is not `/ttl`: Cosmos paths are case-sensitive (catalog Top 15, item 14).
    assert!(
        run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l")]
            #[partition_key(path = "/Ttl")]
            struct S { #[serde(rename = "Ttl")] ttl: u32 }
        })
        .is_ok()
    );
}

#[test]
fn unknown_root_suggests_the_closest_serialized_name() {
    let errors = run(parse_quote! {
        #[cosmos(database = "d", container = "c", lease = "l")]
        #[partition_key(path = "/orderid")]
        #[serde(rename_all = "camelCase")]
        struct S { order_id: String }
    })
    .unwrap_err();
    assert!(errors[0].contains("did you mean `/orderId`?"), "{errors:?}");
}

#[test]
fn syntax_errors_do_not_cascade_into_missing_key_errors() {
    let errors = run(parse_quote! {
        #[cosmos(databse = "d", container = "c", lease = "l")]
        #[partition_key(path = "/k")]
        struct S { k: String }
    })
    .unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("Did you mean `database`?"), "{errors:?}");
}
