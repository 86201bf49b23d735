//! The Outbox Document Contract is total: generated documents (arbitrary JSON, and valid documents
//! with fields removed, retyped or garbled) never make `verify` panic, and every verdict is
//! consistent with the document.
//!
//! CI runs 20 000 cases; the million:
//! `PROPTEST_CASES=1000000 cargo test --release -p chatter-tests --test outbox_contract_fuzz`.

use chatter_runtime::testing::verify_outbox_document as verify;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        tricky_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((tricky_string(), inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// Strings near the contract's edges: blank, dates, JSON-looking text, unicode, and random.
fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("   ".to_owned()),
        Just("\u{a0}\u{2003}".to_owned()),
        Just("null".to_owned()),
        Just("2026-09-03T12:00:00Z".to_owned()),
        Just("2024-02-29".to_owned()),
        Just("2026-09-03T12:00:00.".to_owned()),
        Just("application/json".to_owned()),
        Just("Chatter.ContentType".to_owned()),
        Just("Chatter.Infrastructure.Type".to_owned()),
        "[0-9T:.Z+-]{0,30}",
        any::<String>(),
    ]
}

/// A `MessageContext` value: absent-like, garbled, or a JSON object carrying the keys the
/// contract reads, with values of any kind.
fn context_field() -> impl Strategy<Value = Value> {
    let object = (
        prop::option::of(any_json()),
        prop::option::of(any_json()),
        prop::collection::vec((tricky_string(), any_json()), 0..3),
    )
        .prop_map(|(content_type, infrastructure, extra)| {
            let mut map: Map<String, Value> = extra.into_iter().collect();
            if let Some(v) = content_type {
                map.insert("Chatter.ContentType".into(), v);
            }
            if let Some(v) = infrastructure {
                map.insert("Chatter.Infrastructure.Type".into(), v);
            }
            Value::String(Value::Object(map).to_string())
        });
    prop_oneof![
        3 => object,
        1 => any_json().prop_map(|v| Value::String(v.to_string())),
        1 => tricky_string().prop_map(Value::String),
        1 => any_json(),
    ]
}

/// One field of a mutated valid document: kept, removed, or replaced.
#[derive(Debug, Clone)]
enum Mutation {
    Keep,
    Remove,
    Replace(Value),
}

fn mutation(replacement: impl Strategy<Value = Value>) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => Just(Mutation::Keep),
        1 => Just(Mutation::Remove),
        2 => replacement.prop_map(Mutation::Replace),
    ]
}

fn mutated_valid_document() -> impl Strategy<Value = Value> {
    let string_or_any = || prop_oneof![tricky_string().prop_map(Value::String), any_json()];
    (
        mutation(string_or_any()),
        mutation(string_or_any()),
        mutation(string_or_any()),
        mutation(string_or_any()),
        mutation(context_field()),
    )
        .prop_map(|(message_id, destination, body, content_type, context)| {
            let mut doc = json!({
                "id": "outbox:bXNnLTE",
                "_chatterType": "outbox",
                "status": "pending",
                "MessageId": "msg-1",
                "Destination": "orders",
                "MessageBody": "{\"orderId\":1}",
                "MessageContentType": "application/json",
                "MessageContext": "{\"Chatter.Infrastructure.Type\":\"rabbitmq\"}",
                "tenantId": "t-1",
            });
            let object = doc.as_object_mut().expect("an object");
            for (field, change) in [
                ("MessageId", message_id),
                ("Destination", destination),
                ("MessageBody", body),
                ("MessageContentType", content_type),
                ("MessageContext", context),
            ] {
                match change {
                    Mutation::Keep => {}
                    Mutation::Remove => {
                        object.shift_remove(field);
                    }
                    Mutation::Replace(value) => {
                        object.insert(field.to_owned(), value);
                    }
                }
            }
            doc
        })
}

fn blank(text: &str) -> bool {
    text.chars().all(char::is_whitespace)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(20_000),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn verify_never_panics_and_its_verdict_matches_the_document(
        doc in prop_oneof![3 => mutated_valid_document(), 1 => any_json()]
    ) {
        let verdict = verify(&doc);
        // Pure: a second evaluation is identical.
        prop_assert_eq!(&verdict, &verify(&doc));
        match verdict {
            Ok(verified) => {
                prop_assert!(!blank(&verified.destination));
                prop_assert!(!blank(&verified.content_type));
                prop_assert_eq!(Some(verified.destination.as_str()), doc["Destination"].as_str());
                prop_assert_eq!(Some(verified.body.as_str()), doc["MessageBody"].as_str());
            }
            Err(violations) => {
                prop_assert!(!violations.violations.is_empty());
                let message = violations.to_string();
                let id = doc.get("MessageId").and_then(Value::as_str).unwrap_or_default();
                let quoted = format!("'{id}'");
                prop_assert!(message.contains(&quoted));
            }
        }
    }
}
