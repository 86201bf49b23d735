//! Inbox Markers: the Batched Inbox Marker (catalog 0.3, op 0 of the aggregate batch), the
//! Claimed Inbox Marker of the Standalone Inbox Gate (0.4), and the genuine-marker check that
//! confirms a marker conflict (R2.15–R2.20, Area 7).

use serde_json::{Map, Value};
use time::OffsetDateTime;

use super::outbox::{DISCRIMINATOR_FIELD, ID_FIELD, MESSAGE_ID_FIELD, TTL_FIELD};
use super::{DocumentError, format_utc_timestamp, id};

/// The field holding the instant the marker was stamped.
pub const RECEIVED_AT_UTC_FIELD: &str = "ReceivedAtUtc";
/// The two-phase completion flag of a Claimed Inbox Marker.
pub const COMPLETED_FIELD: &str = "Completed";
/// The default partition-key path of the standalone inbox's idempotency container.
pub const DEFAULT_IDEMPOTENCY_KEY_PATH: &str = "/idempotencyKey";

/// The root fields a partition-key path must not target on an Inbox Marker (0.3, R2.90), in the
/// C# declaration order. `ttl` and `Completed` are deliberately not reserved.
pub const INBOX_MARKER_RESERVED_ROOT_FIELDS: [&str; 4] = [
    ID_FIELD,
    DISCRIMINATOR_FIELD,
    MESSAGE_ID_FIELD,
    RECEIVED_AT_UTC_FIELD,
];

/// The top-level fields of an Inbox Marker, without the partition leaves.
fn base_marker(
    message_id: &str,
    received_at: OffsetDateTime,
    ttl_seconds: Option<i32>,
    completed: Option<bool>,
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
    if let Some(ttl) = ttl_seconds.filter(|ttl| *ttl > 0) {
        doc.insert(TTL_FIELD.to_owned(), Value::from(ttl));
    }
    if let Some(completed) = completed {
        doc.insert(COMPLETED_FIELD.to_owned(), Value::Bool(completed));
    }
    Ok(doc)
}

/// The Batched Inbox Marker (0.3): `id`, `_chatterType`, `MessageId`, `ReceivedAtUtc`, then the
/// aggregate's partition values at `pk_paths`. No `status`, `ttl` or `Completed`.
///
/// # Errors
/// [`DocumentError::IdTooLong`], [`DocumentError::TimestampOutOfRange`], or a stamping error
/// (reserved roots: [`INBOX_MARKER_RESERVED_ROOT_FIELDS`]).
pub fn inbox_marker(
    message_id: &str,
    pk_paths: &[impl AsRef<str>],
    pk_values: &[Value],
    received_at: OffsetDateTime,
) -> Result<Value, DocumentError> {
    let mut doc = base_marker(message_id, received_at, None, None)?;
    crate::partition_key::stamp(
        &mut doc,
        pk_paths,
        pk_values,
        &INBOX_MARKER_RESERVED_ROOT_FIELDS,
    )?;
    Ok(Value::Object(doc))
}

/// The Claimed Inbox Marker (0.4) of the standalone inbox: the marker fields, `ttl` only when
/// `ttl_seconds` is positive, `Completed`, then the raw message id as the partition value at the
/// single-segment `pk_path` (default [`DEFAULT_IDEMPOTENCY_KEY_PATH`]).
///
/// # Errors
/// As [`inbox_marker`]; a path rooted at a marker field is a stamping error (R7.11).
pub fn claimed_inbox_marker(
    message_id: &str,
    pk_path: &str,
    received_at: OffsetDateTime,
    ttl_seconds: Option<i32>,
    completed: bool,
) -> Result<Value, DocumentError> {
    let mut doc = base_marker(message_id, received_at, ttl_seconds, Some(completed))?;
    let value = Value::String(message_id.to_owned());
    crate::partition_key::stamp(
        &mut doc,
        &[pk_path],
        &[value],
        &INBOX_MARKER_RESERVED_ROOT_FIELDS,
    )?;
    Ok(Value::Object(doc))
}

/// The root fields the standalone inbox must reject as a partition-key root at registration: every
/// field a Claimed Inbox Marker renders, so `ttl` only when a positive TTL is configured.
pub fn standalone_reserved_root_fields(ttl_seconds: Option<i32>) -> Vec<&'static str> {
    let mut fields = INBOX_MARKER_RESERVED_ROOT_FIELDS.to_vec();
    if ttl_seconds.is_some_and(|ttl| ttl > 0) {
        fields.push(TTL_FIELD);
    }
    fields.push(COMPLETED_FIELD);
    fields
}

/// Whether a conflicting document is a genuine Chatter Inbox Marker for `message_id`: a JSON
/// object whose `_chatterType` is the string `"inbox"` and whose `MessageId` is the string
/// `message_id` (ordinal). Anything else is not (R2.15–R2.20, R7.24, R7.25).
pub fn is_genuine_inbox_marker(doc: &Value, message_id: &str) -> bool {
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
                matches!(err, DocumentError::ReservedPartitionKeyPath { .. }),
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

    // 0.4 golden; R7.36
    #[test]
    fn claimed_marker_serializes_byte_for_byte_to_the_catalog_shape() {
        let doc =
            claimed_inbox_marker("msg-1", DEFAULT_IDEMPOTENCY_KEY_PATH, AT, None, false).unwrap();
        assert_eq!(
            to_json_string(&doc),
            r#"{"id":"inbox:bXNnLTE","_chatterType":"inbox","MessageId":"msg-1","ReceivedAtUtc":"2026-06-15T00:00:00.1234567Z","Completed":false,"idempotencyKey":"msg-1"}"#
        );
    }

    // R7.37, R2.88
    #[test]
    fn claimed_marker_carries_a_positive_ttl_as_an_integer_before_completed() {
        let doc =
            claimed_inbox_marker("msg-1", "/idempotencyKey", AT, Some(604_800), false).unwrap();
        assert_eq!(
            to_json_string(&doc),
            r#"{"id":"inbox:bXNnLTE","_chatterType":"inbox","MessageId":"msg-1","ReceivedAtUtc":"2026-06-15T00:00:00.1234567Z","ttl":604800,"Completed":false,"idempotencyKey":"msg-1"}"#
        );
        assert!(doc["ttl"].is_i64());
    }

    // R7.38, R2.88
    #[test]
    fn claimed_marker_omits_a_zero_or_negative_ttl() {
        for ttl in [Some(0), Some(-1), None] {
            let doc = claimed_inbox_marker("m", "/idempotencyKey", AT, ttl, false).unwrap();
            assert!(doc.get("ttl").is_none(), "{ttl:?}");
        }
    }

    // R2.87
    #[test]
    fn claimed_marker_completed_flag_is_rendered_as_given() {
        let done = claimed_inbox_marker("m", "/idempotencyKey", AT, None, true).unwrap();
        assert_eq!(done["Completed"], json!(true));
        let pending = claimed_inbox_marker("m", "/idempotencyKey", AT, None, false).unwrap();
        assert_eq!(pending["Completed"], json!(false));
    }

    // R7.11
    #[test]
    fn claimed_marker_rejects_a_reserved_marker_root() {
        assert!(claimed_inbox_marker("m", "/MessageId", AT, None, false).is_err());
    }

    // R7.09, R7.10, R7.12
    #[test]
    fn standalone_reserved_roots_include_ttl_only_with_a_positive_ttl() {
        assert_eq!(
            standalone_reserved_root_fields(None),
            [
                "id",
                "_chatterType",
                "MessageId",
                "ReceivedAtUtc",
                "Completed"
            ]
        );
        assert_eq!(
            standalone_reserved_root_fields(Some(0)),
            standalone_reserved_root_fields(None)
        );
        assert_eq!(
            standalone_reserved_root_fields(Some(3600)),
            [
                "id",
                "_chatterType",
                "MessageId",
                "ReceivedAtUtc",
                "ttl",
                "Completed"
            ]
        );
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
        let claimed = claimed_inbox_marker("msg-1", "/idempotencyKey", AT, None, true).unwrap();
        assert!(is_genuine_inbox_marker(&claimed, "msg-1"));
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
