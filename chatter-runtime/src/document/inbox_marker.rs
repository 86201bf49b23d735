//! The Batched Inbox Marker (op 0 of every aggregate batch) and the genuine-marker check that
//! confirms a marker conflict. (The Claimed Inbox Marker of the standalone inbox comes with
//! that inbox.)

use serde_json::{Map, Value};
use time::OffsetDateTime;

use super::outbox::{DISCRIMINATOR_FIELD, ID_FIELD, MESSAGE_ID_FIELD};
use super::{DocumentError, format_utc_timestamp, id};

/// The field holding the instant the marker was stamped.
pub(crate) const RECEIVED_AT_UTC_FIELD: &str = "ReceivedAtUtc";

/// The root fields a partition-key path must not target on an Inbox Marker, in the
/// C# declaration order. `ttl` and `Completed` are deliberately not reserved.
pub(crate) const INBOX_MARKER_RESERVED_ROOT_FIELDS: [&str; 4] = [
    ID_FIELD,
    DISCRIMINATOR_FIELD,
    MESSAGE_ID_FIELD,
    RECEIVED_AT_UTC_FIELD,
];

/// The top-level fields of an Inbox Marker, without the partition leaves.
fn base_marker(
    message_id: &str,
    received_at: OffsetDateTime,
) -> Result<Map<String, Value>, DocumentError> {
    let mut doc = Map::new();
    doc.insert(
        ID_FIELD.to_owned(),
        Value::String(id::inbox_id(message_id)?),
    );
    doc.insert(
        DISCRIMINATOR_FIELD.to_owned(),
        Value::String(id::INBOX_KIND.to_owned()),
    );
    doc.insert(
        MESSAGE_ID_FIELD.to_owned(),
        Value::String(message_id.to_owned()),
    );
    doc.insert(
        RECEIVED_AT_UTC_FIELD.to_owned(),
        Value::String(format_utc_timestamp(received_at)?),
    );
    Ok(doc)
}

/// The Batched Inbox Marker (0.3): `id`, `_chatterType`, `MessageId`, `ReceivedAtUtc`, then the
/// aggregate's partition values at `pk_paths`. No `status`, `ttl` or `Completed`.
///
/// # Errors
/// [`DocumentError::IdTooLong`], [`DocumentError::TimestampOutOfRange`], or a stamping error
/// (reserved roots: [`INBOX_MARKER_RESERVED_ROOT_FIELDS`]).
pub(crate) fn inbox_marker(
    message_id: &str,
    pk_paths: &[impl AsRef<str>],
    pk_values: &[Value],
    received_at: OffsetDateTime,
) -> Result<Value, DocumentError> {
    let mut doc = base_marker(message_id, received_at)?;
    crate::partition_key::stamp(
        &mut doc,
        pk_paths,
        pk_values,
        &INBOX_MARKER_RESERVED_ROOT_FIELDS,
    )?;
    Ok(Value::Object(doc))
}

/// The field a Claimed Inbox Marker's second phase sets to `true`.
pub(crate) const COMPLETED_FIELD: &str = "Completed";

/// The field of a positive marker time-to-live (Cosmos's own `ttl`).
pub(crate) const TTL_FIELD: &str = "ttl";

/// chatter's own field of a Claimed Inbox Marker (not in the .NET shape, which ignores it): for
/// how many seconds after the marker was written (`_ts`, the service's clock) the claimant may
/// still be running its handler, which it bounds by as much. `0` once the claimant's attempt
/// ended without completing (its handler failed): nothing runs under it any more.
pub(crate) const CLAIM_SECONDS_FIELD: &str = "ClaimSeconds";

/// The root fields a standalone inbox's partition-key path must not target: the marker's own,
/// `Completed`, which the second phase patches, and `ClaimSeconds`, which a failed attempt
/// patches.
pub(crate) const CLAIMED_MARKER_RESERVED_ROOT_FIELDS: [&str; 6] = [
    ID_FIELD,
    DISCRIMINATOR_FIELD,
    MESSAGE_ID_FIELD,
    RECEIVED_AT_UTC_FIELD,
    COMPLETED_FIELD,
    CLAIM_SECONDS_FIELD,
];

/// The Claimed Inbox Marker (0.4) of the standalone inbox, first phase: `id`, `_chatterType`,
/// `MessageId`, `ReceivedAtUtc`, `ttl` (only when `ttl_seconds` is positive), `Completed: false`,
/// chatter's `ClaimSeconds`, then the message id at `pk_path` (the marker's partition value is
/// the message id).
///
/// # Errors
/// [`DocumentError::IdTooLong`], [`DocumentError::TimestampOutOfRange`], or a stamping error.
pub(crate) fn claimed_marker(
    message_id: &str,
    pk_path: &str,
    ttl_seconds: Option<i64>,
    claim_seconds: u64,
    received_at: OffsetDateTime,
) -> Result<Value, DocumentError> {
    let mut doc = base_marker(message_id, received_at)?;
    if let Some(ttl) = ttl_seconds.filter(|ttl| *ttl > 0) {
        doc.insert(TTL_FIELD.to_owned(), Value::from(ttl));
    }
    doc.insert(COMPLETED_FIELD.to_owned(), Value::Bool(false));
    doc.insert(CLAIM_SECONDS_FIELD.to_owned(), Value::from(claim_seconds));
    crate::partition_key::stamp(
        &mut doc,
        &[pk_path],
        &[Value::String(message_id.to_owned())],
        &CLAIMED_MARKER_RESERVED_ROOT_FIELDS,
    )?;
    Ok(Value::Object(doc))
}

/// Whether a genuine marker says its message was handled (`Completed` is JSON `true`; false,
/// absent or anything else is a pending claim).
pub(crate) fn is_completed(doc: &Value) -> bool {
    doc.get(COMPLETED_FIELD) == Some(&Value::Bool(true))
}

/// Whether a conflicting document is a genuine Chatter Inbox Marker for `message_id`: a JSON
/// object whose `_chatterType` is the string `"inbox"` and whose `MessageId` is the string
/// `message_id` (ordinal). Anything else is not.
pub(crate) fn is_genuine_inbox_marker(doc: &Value, message_id: &str) -> bool {
    let Some(object) = doc.as_object() else {
        return false;
    };
    object.get(DISCRIMINATOR_FIELD).and_then(Value::as_str) == Some(id::INBOX_KIND)
        && object.get(MESSAGE_ID_FIELD).and_then(Value::as_str) == Some(message_id)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;
    use crate::document::to_json_string;

    const AT: OffsetDateTime = datetime!(2026-06-15 00:00:00.1234567 UTC);

    // 0.3 golden
    #[test]
    fn batched_marker_serializes_byte_for_byte_to_the_catalog_shape() {
        let doc = inbox_marker("msg-1", &["/tenantId"], &[json!("tenant-1")], AT).unwrap();
        assert_eq!(
            to_json_string(&doc),
            r#"{"id":"inbox:bXNnLTE","_chatterType":"inbox","MessageId":"msg-1","ReceivedAtUtc":"2026-06-15T00:00:00.1234567Z","tenantId":"tenant-1"}"#
        );
    }

    #[test]
    fn batched_marker_on_a_whole_second_has_no_fraction() {
        let doc = inbox_marker(
            "msg-1",
            &["/tenantId"],
            &[json!("t")],
            datetime!(2026-06-15 00:00:00 UTC),
        )
        .unwrap();
        assert_eq!(doc["ReceivedAtUtc"], "2026-06-15T00:00:00Z");
    }

    // R2.02, R2.03, R2.86
    #[test]
    fn batched_marker_has_no_status_ttl_ts_or_completed() {
        let doc = inbox_marker("msg-1", &["/tenantId"], &[json!("tenant-1")], AT).unwrap();
        assert_eq!(doc["_chatterType"], "inbox");
        assert_eq!(doc["id"], id::inbox_id("msg-1").unwrap());
        assert_eq!(doc["MessageId"], "msg-1");
        assert_eq!(doc["tenantId"], "tenant-1");
        for absent in ["status", "ttl", "_ts", "Completed", "completed"] {
            assert!(doc.get(absent).is_none(), "{absent}");
        }
    }

    // R2.86 (ReceivedAtUtc within the build window)
    #[test]
    fn batched_marker_received_at_is_the_given_instant_in_utc() {
        let before = OffsetDateTime::now_utc();
        let doc = inbox_marker("m", &["/p"], &[json!(1)], OffsetDateTime::now_utc()).unwrap();
        let after = OffsetDateTime::now_utc();
        let stamped = doc["ReceivedAtUtc"].as_str().unwrap();
        assert!(stamped.ends_with('Z'));
        let parsed =
            OffsetDateTime::parse(stamped, &time::format_description::well_known::Rfc3339).unwrap();
        let tick = time::Duration::nanoseconds(100);
        assert!(parsed >= before - tick && parsed <= after, "{stamped}");
    }

    // R2.04
    #[test]
    fn batched_marker_stamps_a_hierarchical_key_nested() {
        let doc = inbox_marker(
            "msg-1",
            &["/tenant/id", "/region"],
            &[json!("acme"), json!("us-east")],
            AT,
        )
        .unwrap();
        assert_eq!(doc["tenant"]["id"], "acme");
        assert_eq!(doc["region"], "us-east");
        assert_eq!(doc["_chatterType"], "inbox");
    }

    // R2.89
    #[test]
    fn two_markers_from_one_value_list_are_both_correct() {
        let values = [json!("acme"), json!(7)];
        let first = inbox_marker("m1", &["/t/id", "/n"], &values, AT).unwrap();
        let second = inbox_marker("m2", &["/t/id", "/n"], &values, AT).unwrap();
        assert_eq!(
            (first["t"]["id"].clone(), first["n"].clone()),
            (json!("acme"), json!(7))
        );
        assert_eq!(
            (second["t"]["id"].clone(), second["n"].clone()),
            (json!("acme"), json!(7))
        );
    }

    // R2.90
    #[test]
    fn marker_reserved_roots_are_rejected_but_ttl_and_completed_are_not() {
        for path in [
            "/id",
            "/_chatterType",
            "/MessageId",
            "/ReceivedAtUtc",
            "/ReceivedAtUtc/x",
        ] {
            let err = inbox_marker("m", &[path], &[json!(1)], AT).unwrap_err();
            assert!(
                matches!(
                    err,
                    DocumentError::PartitionKey(
                        crate::partition_key::PartitionKeyError::ReservedPartitionKeyPath { .. }
                    )
                ),
                "{path}"
            );
            assert!(
                err.to_string()
                    .contains("one of [id, _chatterType, MessageId, ReceivedAtUtc] without"),
                "{err}"
            );
        }
        for path in ["/ttl", "/Completed", "/status"] {
            assert!(
                inbox_marker("m", &[path], &[json!(1)], AT).is_ok(),
                "{path}"
            );
        }
    }

    #[test]
    fn marker_with_a_too_long_message_id_is_rejected() {
        let err = inbox_marker(&"x".repeat(1000), &["/p"], &[json!(1)], AT).unwrap_err();
        assert!(matches!(err, DocumentError::IdTooLong { .. }));
    }

    // R2.15, R7.21
    #[test]
    fn genuine_marker_for_the_same_message_is_confirmed() {
        assert!(is_genuine_inbox_marker(
            &json!({"_chatterType": "inbox", "MessageId": "msg-1"}),
            "msg-1"
        ));
        let built = inbox_marker("msg-1", &["/p"], &[json!(1)], AT).unwrap();
        assert!(is_genuine_inbox_marker(&built, "msg-1"));
    }

    // R2.16, R2.17, R2.20, R7.24, R7.25
    #[test]
    fn anything_but_a_genuine_marker_for_the_same_message_is_not_confirmed() {
        let not_genuine = [
            json!({"_chatterType": "order", "id": "inbox:forged", "MessageId": "msg-1"}),
            json!({"_chatterType": "outbox", "MessageId": "msg-1"}),
            json!({"_chatterType": "inbox", "MessageId": "msg-1-other"}),
            json!({"_chatterType": "Inbox", "MessageId": "msg-1"}),
            json!({"_chatterType": "inbox", "MessageId": "MSG-1"}),
            json!({"_chatterType": "inbox"}),
            json!({"MessageId": "msg-1"}),
            json!({"_chatterType": ["inbox"], "MessageId": "msg-1"}),
            json!({"_chatterType": "inbox", "MessageId": 1}),
            json!({"_chatterType": "inbox", "MessageId": null}),
            json!([{"_chatterType": "inbox", "MessageId": "msg-1"}]),
            json!("inbox"),
            Value::Null,
        ];
        for doc in not_genuine {
            assert!(!is_genuine_inbox_marker(&doc, "msg-1"), "{doc}");
        }
    }
}
