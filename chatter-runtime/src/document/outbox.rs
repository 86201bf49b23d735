//! The Outbox Document: a brokered message staged in the aggregate's
//! batch, drained and published by the relay.

use serde_json::{Map, Value};

use super::{DocumentError, id, to_json_string};
use crate::message::BrokeredMessage;

/// The document-id field (Cosmos requires `id`).
pub(crate) const ID_FIELD: &str = "id";
/// The Chatter discriminator field.
pub(crate) const DISCRIMINATOR_FIELD: &str = "_chatterType";
/// The delivery-state field.
pub(crate) const STATUS_FIELD: &str = "status";
/// The initial delivery state: the relay publishes only pending documents.
pub(crate) const STATUS_PENDING: &str = "pending";
/// The default delivered state the relay stamps after a publish.
pub(crate) const STATUS_DELIVERED: &str = "delivered";
/// The state the relay stamps on a document the Outbox Document Contract rejects.
pub(crate) const STATUS_UNDELIVERABLE: &str = "undeliverable";
/// The verbatim message-id field.
pub(crate) const MESSAGE_ID_FIELD: &str = "MessageId";
/// The destination field.
pub(crate) const DESTINATION_FIELD: &str = "Destination";
/// The body field (the body rendered as a string).
pub(crate) const MESSAGE_BODY_FIELD: &str = "MessageBody";
/// The content-type field.
pub(crate) const MESSAGE_CONTENT_TYPE_FIELD: &str = "MessageContentType";
/// The message-context field: a JSON *string* holding the serialized context.
pub(crate) const MESSAGE_CONTEXT_FIELD: &str = "MessageContext";
/// The property an operator's give-up leaves its reason in (the relay's own undeliverable stamp
/// writes none: it keeps the .NET document shape); a requeue removes it.
pub const OPERATOR_REASON_FIELD: &str = "chatterOperatorReason";
/// The context key carrying the content type.
pub(crate) const CONTENT_TYPE_CONTEXT_KEY: &str = "Chatter.ContentType";
/// The context key naming the messaging infrastructure.
pub(crate) const INFRASTRUCTURE_TYPE_CONTEXT_KEY: &str = "Chatter.Infrastructure.Type";

/// The root fields a partition-key path must not target on an Outbox Document, in the
/// C# declaration order (the order its error message lists them in).
pub(crate) const OUTBOX_RESERVED_ROOT_FIELDS: [&str; 8] = [
    ID_FIELD,
    DISCRIMINATOR_FIELD,
    STATUS_FIELD,
    MESSAGE_ID_FIELD,
    DESTINATION_FIELD,
    MESSAGE_BODY_FIELD,
    MESSAGE_CONTENT_TYPE_FIELD,
    MESSAGE_CONTEXT_FIELD,
];

/// The path of the delivery-state stamp.
pub(crate) const STATUS_PATH: &str = "/status";
/// The time-to-live field stamped with a delivered state (positive; chatter writes none on a
/// pending or `undeliverable` document, though another writer may).
pub(crate) const TTL_FIELD: &str = "ttl";
/// The path of the time-to-live stamped with a delivered state.
pub(crate) const TTL_PATH: &str = "/ttl";

/// The paths the relay patches on every drained document; a container partitioned on one of
/// them can never be stamped.
pub(crate) const RELAY_STAMPED_PATHS: [&str; 2] = [STATUS_PATH, TTL_PATH];

/// The patch that marks a published document delivered: its state and a ttl, so Cosmos DB
/// purges it, in one request.
pub(crate) fn delivered_stamp(status: &str, ttl_seconds: i64) -> [(&'static str, Value); 2] {
    [
        (STATUS_PATH, Value::from(status)),
        (TTL_PATH, Value::from(ttl_seconds)),
    ]
}

/// Whether two versions of a document hold the same message: equal but for the fields a stamp,
/// an operator's repair or the store writes (`status`, `ttl`, [`OPERATOR_REASON_FIELD`], and the
/// system fields `_rid`, `_self`, `_etag`, `_attachments`, `_ts`, `_lsn`). A version written
/// since by the sweep or a requeue is the same message; one written with another body is not.
pub(crate) fn same_message(a: &Value, b: &Value) -> bool {
    fn message(doc: &Value) -> Option<Map<String, Value>> {
        const NOT_THE_MESSAGE: [&str; 9] = [
            STATUS_FIELD,
            TTL_FIELD,
            OPERATOR_REASON_FIELD,
            "_rid",
            "_self",
            "_etag",
            "_attachments",
            "_ts",
            "_lsn",
        ];
        let mut fields = doc.as_object()?.clone();
        fields.retain(|name, _| !NOT_THE_MESSAGE.contains(&name.as_str()));
        Some(fields)
    }
    matches!((message(a), message(b)), (Some(a), Some(b)) if a == b)
}

/// The patch that marks a document undeliverable: the state alone, no ttl, so it stays for a
/// person to inspect.
pub(crate) fn undeliverable_stamp() -> [(&'static str, Value); 1] {
    [(STATUS_PATH, Value::from(STATUS_UNDELIVERABLE))]
}

/// The fields every pending Outbox Document starts with, in the catalog's order: `id`,
/// `_chatterType`, `status`, `MessageId`.
fn pending_header(id: String, message_id: String) -> Map<String, Value> {
    let mut doc = Map::new();
    doc.insert(ID_FIELD.to_owned(), Value::String(id));
    doc.insert(
        DISCRIMINATOR_FIELD.to_owned(),
        Value::String(id::OUTBOX_KIND.to_owned()),
    );
    doc.insert(
        STATUS_FIELD.to_owned(),
        Value::String(STATUS_PENDING.to_owned()),
    );
    doc.insert(MESSAGE_ID_FIELD.to_owned(), Value::String(message_id));
    doc
}

/// The fields of an Outbox Document, without the partition-key leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxDocument {
    /// `outbox:{encode(message_id)}`.
    pub id: String,
    /// The raw message id, verbatim.
    pub message_id: String,
    /// Where the relay publishes it.
    pub destination: String,
    /// The body rendered as a string.
    pub message_body: String,
    /// The content type; `None` is written (and read) as JSON `null` or absent.
    pub message_content_type: Option<String>,
    /// The serialized message context, a JSON object in a string; `None` is JSON `null` or absent.
    pub message_context: Option<String>,
}

impl OutboxDocument {
    /// The document for `message`: id minted from its message id, context serialized compactly
    /// with ChatterJson escaping.
    ///
    /// # Errors
    /// [`DocumentError::IdTooLong`] when the message id is too long for a Cosmos item id.
    pub fn from_message(message: &BrokeredMessage) -> Result<Self, DocumentError> {
        Ok(Self {
            id: id::outbox_id(&message.message_id)?,
            message_id: message.message_id.clone(),
            destination: message.destination.clone(),
            message_body: message.body.clone(),
            message_content_type: Some(message.content_type.clone()),
            message_context: Some(to_json_string(&Value::Object(message.context.clone()))),
        })
    }

    /// The JSON body, keys in the order the .NET module writes them, partition values stamped at `pk_paths`.
    ///
    /// # Errors
    /// The stamping errors of `partition_key::stamp`, with the outbox reserved
    /// roots (`OUTBOX_RESERVED_ROOT_FIELDS`).
    pub fn to_json(
        &self,
        pk_paths: &[impl AsRef<str>],
        pk_values: &[Value],
    ) -> Result<Value, DocumentError> {
        let optional = |value: &Option<String>| value.clone().map_or(Value::Null, Value::String);
        let mut doc = pending_header(self.id.clone(), self.message_id.clone());
        doc.insert(
            DESTINATION_FIELD.to_owned(),
            Value::String(self.destination.clone()),
        );
        doc.insert(
            MESSAGE_BODY_FIELD.to_owned(),
            Value::String(self.message_body.clone()),
        );
        doc.insert(
            MESSAGE_CONTENT_TYPE_FIELD.to_owned(),
            optional(&self.message_content_type),
        );
        doc.insert(
            MESSAGE_CONTEXT_FIELD.to_owned(),
            optional(&self.message_context),
        );
        crate::partition_key::stamp(&mut doc, pk_paths, pk_values, &OUTBOX_RESERVED_ROOT_FIELDS)?;
        Ok(Value::Object(doc))
    }

    /// The Outbox Document for `message`, ready to stage: [`Self::from_message`] then [`Self::to_json`].
    ///
    /// # Errors
    /// See [`Self::from_message`] and [`Self::to_json`].
    pub fn build(
        message: &BrokeredMessage,
        pk_paths: &[impl AsRef<str>],
        pk_values: &[Value],
    ) -> Result<Value, DocumentError> {
        Self::from_message(message)?.to_json(pk_paths, pk_values)
    }

    #[cfg(any(test, feature = "test-support"))]
    /// Reads the fields of a persisted Outbox Document (extra fields, such as the partition
    /// leaves and Cosmos's `_ts`, are ignored).
    ///
    /// This is a structural read; whether a drained document may be published is the Outbox
    /// Document Contract's decision, which also accepts an absent body or destination
    /// only to reject it with its own messages.
    ///
    /// # Errors
    /// [`DocumentError::MalformedOutboxDocument`] when the document is not an object, or `id`,
    /// `MessageId`, `Destination` or `MessageBody` is absent or not a string, or
    /// `MessageContentType` / `MessageContext` is neither a string nor null.
    pub fn from_json(doc: &Value) -> Result<Self, DocumentError> {
        let Some(object) = doc.as_object() else {
            return Err(malformed("it is not a JSON object"));
        };
        let required = |field: &str| match object.get(field) {
            Some(Value::String(text)) => Ok(text.clone()),
            _ => Err(malformed(&format!(
                "its '{field}' is absent or not a JSON string"
            ))),
        };
        let optional = |field: &str| match object.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(malformed(&format!(
                "its '{field}' is neither a JSON string nor null"
            ))),
        };
        Ok(Self {
            id: required(ID_FIELD)?,
            message_id: required(MESSAGE_ID_FIELD)?,
            destination: required(DESTINATION_FIELD)?,
            message_body: required(MESSAGE_BODY_FIELD)?,
            message_content_type: optional(MESSAGE_CONTENT_TYPE_FIELD)?,
            message_context: optional(MESSAGE_CONTEXT_FIELD)?,
        })
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The brokered message this document carries, verbatim: the context is parsed back from its
    /// JSON string (absent, null or blank means an empty context); a missing content type falls
    /// back to the context's `Chatter.ContentType` string, as the contract does.
    ///
    /// # Errors
    /// [`DocumentError::MalformedOutboxDocument`] when the context is not a JSON object (including
    /// the literal `null`), or no content type is resolvable.
    pub fn to_message(&self) -> Result<BrokeredMessage, DocumentError> {
        let context = match self.message_context.as_deref() {
            None => Map::new(),
            Some(text) if text.trim().is_empty() => Map::new(),
            Some(text) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => map,
                Ok(_) => return Err(malformed("its 'MessageContext' is not a JSON object")),
                Err(error) => {
                    return Err(malformed(&format!(
                        "its 'MessageContext' is not JSON ({error})"
                    )));
                }
            },
        };
        let content_type = match self.message_content_type.as_deref() {
            Some(text) if !text.trim().is_empty() => text.to_owned(),
            _ => match context.get(CONTENT_TYPE_CONTEXT_KEY) {
                Some(Value::String(text)) if !text.trim().is_empty() => text.clone(),
                _ => {
                    return Err(malformed(
                        "a content type is resolvable from neither its 'MessageContentType' nor its message context",
                    ));
                }
            },
        };
        Ok(BrokeredMessage {
            message_id: self.message_id.clone(),
            destination: self.destination.clone(),
            body: self.message_body.clone(),
            content_type,
            context,
        })
    }
}

#[cfg(any(test, feature = "test-support"))]
fn malformed(reason: &str) -> DocumentError {
    DocumentError::MalformedOutboxDocument {
        reason: reason.to_owned(),
    }
}

/// The relay's pending gate: an object whose `_chatterType` is the string
/// `"outbox"`, whose `status` is the string `"pending"`, and whose `id` is exactly the id Chatter
/// mints for its non-empty string `MessageId`. Ordinal comparisons; never fails.
pub(crate) fn is_pending_outbox(doc: &Value) -> bool {
    let Some(object) = doc.as_object() else {
        return false;
    };
    let text = |field: &str| object.get(field).and_then(Value::as_str);
    if text(DISCRIMINATOR_FIELD) != Some(id::OUTBOX_KIND)
        || text(STATUS_FIELD) != Some(STATUS_PENDING)
    {
        return false;
    }
    let (Some(doc_id), Some(message_id)) = (text(ID_FIELD), text(MESSAGE_ID_FIELD)) else {
        return false;
    };
    // An id Chatter could never have minted (e.g. too long) means "not ours": not pending.
    !message_id.is_empty() && id::outbox_id(message_id).is_ok_and(|expected| expected == doc_id)
}

/// A document that looks like a pending Outbox Document (`_chatterType` `"outbox"`, `status`
/// `"pending"`) but that the pending gate turns away because its `id` is not the id Chatter
/// mints for its `MessageId` (another writer's mistake, or a `MessageId` that is missing, empty
/// or too long for an id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdMismatch<'a> {
    /// Its `id` (`""` when it is not a string).
    pub(crate) id: &'a str,
    /// Its `MessageId`, when a string.
    pub(crate) message_id: Option<&'a str>,
    /// The id it should have: `outbox:` and the unpadded base64url of its `MessageId`; `None`
    /// when no id can be minted for it.
    pub(crate) expected: Option<String>,
}

/// The [`IdMismatch`] of `doc`, when it looks pending and the pending gate still turns it away.
pub(crate) fn id_mismatch(doc: &Value) -> Option<IdMismatch<'_>> {
    let object = doc.as_object()?;
    let text = |field: &str| object.get(field).and_then(Value::as_str);
    if text(DISCRIMINATOR_FIELD) != Some(id::OUTBOX_KIND)
        || text(STATUS_FIELD) != Some(STATUS_PENDING)
        || is_pending_outbox(doc)
    {
        return None;
    }
    let message_id = text(MESSAGE_ID_FIELD);
    Some(IdMismatch {
        id: text(ID_FIELD).unwrap_or_default(),
        message_id,
        expected: message_id
            .filter(|m| !m.is_empty())
            .and_then(|m| id::outbox_id(m).ok()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_same_message_is_told_apart_from_what_stamps_repairs_and_the_store_write() {
        let written = json!({
            "id": "outbox:bTE", "_chatterType": "outbox", "status": "pending",
            "MessageId": "m1", "Destination": "orders", "MessageBody": "{}", "tenantId": "t",
        });
        let mut stamped = written.clone();
        stamped["status"] = json!("delivered");
        stamped["ttl"] = json!(60);
        stamped[OPERATOR_REASON_FIELD] = json!("given up");
        for (field, value) in [
            ("_etag", "\"2\""),
            ("_rid", "r"),
            ("_self", "s"),
            ("_ts", "1"),
        ] {
            stamped[field] = json!(value);
        }
        assert!(same_message(&written, &stamped));
        let mut other_body = written.clone();
        other_body["MessageBody"] = json!("{\"orderId\":8}");
        assert!(!same_message(&written, &other_body));
        let mut other_kind = written.clone();
        other_kind["_chatterType"] = json!("inbox");
        assert!(
            !same_message(&written, &other_kind),
            "only the system fields are skipped"
        );
        assert!(!same_message(&written, &json!("not an object")));
    }

    fn message() -> BrokeredMessage {
        let mut message = BrokeredMessage::json("msg-1", "destination-queue", r#"{"orderId":42}"#);
        message
            .context
            .insert("Chatter.ContentType".into(), json!("application/json"));
        message
            .context
            .insert("custom-header".into(), json!("value"));
        message
    }

    #[test]
    fn a_document_that_looks_pending_under_a_foreign_id_is_an_id_mismatch_naming_the_expected_id() {
        let mut doc = pending("msg-1");
        assert_eq!(id_mismatch(&doc), None, "a genuine one is admitted");
        doc["id"] = json!("python-1");
        assert_eq!(
            id_mismatch(&doc),
            Some(IdMismatch {
                id: "python-1",
                message_id: Some("msg-1"),
                expected: Some("outbox:bXNnLTE".to_owned()),
            })
        );
        doc["MessageId"] = json!("");
        assert_eq!(id_mismatch(&doc).unwrap().expected, None);
        doc["status"] = json!("delivered");
        assert_eq!(id_mismatch(&doc), None, "not pending");
        let inbox = json!({ "id": "x", "_chatterType": "inbox", "status": "pending" });
        assert_eq!(id_mismatch(&inbox), None, "not an outbox document");
    }

    // 0.2 golden: exact key order, MessageContext double-encoded, pk leaf last.
    #[test]
    fn outbox_document_serializes_byte_for_byte_to_the_catalog_shape() {
        let doc = OutboxDocument::build(&message(), &["/tenantId"], &[json!("tenant-1")]).unwrap();
        assert_eq!(
            to_json_string(&doc),
            r#"{"id":"outbox:bXNnLTE","_chatterType":"outbox","status":"pending","MessageId":"msg-1","#.to_owned()
                + r#""Destination":"destination-queue","MessageBody":"{\"orderId\":42}","#
                + r#""MessageContentType":"application/json","#
                + r#""MessageContext":"{\"Chatter.ContentType\":\"application/json\",\"custom-header\":\"value\"}","#
                + r#""tenantId":"tenant-1"}"#
        );
    }

    #[test]
    fn hierarchical_outbox_document_serializes_byte_for_byte() {
        let mut message = BrokeredMessage::json("msg-1", "q", "");
        message.content_type = "text/plain".into();
        let doc = OutboxDocument::build(
            &message,
            &["/tenant/id", "/region"],
            &[json!("acme"), json!(7)],
        )
        .unwrap();
        assert_eq!(
            to_json_string(&doc),
            r#"{"id":"outbox:bXNnLTE","_chatterType":"outbox","status":"pending","MessageId":"msg-1","Destination":"q","MessageBody":"","MessageContentType":"text/plain","MessageContext":"{}","tenant":{"id":"acme"},"region":7}"#
        );
    }

    // 0 intro: ChatterJson leaves `+<>&'/` and non-ASCII literal, at both encoding levels.
    #[test]
    fn risky_characters_stay_literal_in_body_and_double_encoded_context() {
        let mut message = BrokeredMessage::json("m+<>&'/é", "dest/é", "a+b<c>&'/ éü😀");
        message
            .context
            .insert("k".into(), json!("+<>&'/ éü😀 \"q\""));
        let text = to_json_string(&OutboxDocument::build(&message, &["/p"], &[json!(1)]).unwrap());
        assert!(text.contains(r#""MessageId":"m+<>&'/é""#), "{text}");
        assert!(text.contains(r#""Destination":"dest/é""#), "{text}");
        assert!(text.contains(r#""MessageBody":"a+b<c>&'/ éü😀""#), "{text}");
        assert!(
            text.contains(r#""MessageContext":"{\"k\":\"+<>&'/ éü😀 \\\"q\\\"\"}""#),
            "{text}"
        );
        assert!(!text.contains("\\u"), "{text}");
    }

    // R2.60, R2.61, R2.62
    #[test]
    fn document_carries_raw_message_id_and_minted_id_and_no_partition_key_field() {
        let raw = "msg/with?reserved#chars";
        let doc = OutboxDocument::build(
            &BrokeredMessage::json(raw, "d", "{}"),
            &["/tenantId"],
            &[json!("tenant-1")],
        )
        .unwrap();
        assert_eq!(doc["_chatterType"], "outbox");
        assert_eq!(doc["status"], "pending");
        let doc_id = doc["id"].as_str().unwrap();
        assert_eq!(doc_id, id::outbox_id(raw).unwrap());
        assert!(doc_id.starts_with("outbox:"));
        assert!(!doc_id.contains(['/', '\\', '?', '#']));
        assert_eq!(doc["MessageId"], raw);
        assert_eq!(doc["tenantId"], "tenant-1");
        assert!(doc.get("partitionKey").is_none());
    }

    // R2.64
    #[test]
    fn message_fields_and_context_string_are_carried() {
        let mut message = BrokeredMessage::json("msg-1", "destination-queue", r#"{"a":1}"#);
        message
            .context
            .insert("custom-header".into(), json!("value"));
        let doc = OutboxDocument::build(&message, &["/tenantId"], &[json!("t")]).unwrap();
        assert_eq!(doc["Destination"], "destination-queue");
        assert_eq!(doc["MessageBody"], r#"{"a":1}"#);
        assert_eq!(doc["MessageContentType"], "application/json");
        assert!(
            doc["MessageContext"].is_string(),
            "MessageContext is a JSON string, not an object"
        );
        assert_eq!(doc["MessageContext"], r#"{"custom-header":"value"}"#);
    }

    // R2.63
    #[test]
    fn hierarchical_key_is_stamped_nested() {
        let doc = OutboxDocument::build(
            &message(),
            &["/tenant/id", "/region"],
            &[json!("acme"), json!("us-east")],
        )
        .unwrap();
        assert_eq!(doc["tenant"]["id"], "acme");
        assert_eq!(doc["region"], "us-east");
    }

    // R2.67
    #[test]
    fn partition_values_keep_their_kind() {
        let one = |value: Value| {
            OutboxDocument::build(&message(), &["/pk"], &[value]).unwrap()["pk"].clone()
        };
        assert_eq!(one(json!(42)), json!(42));
        assert_eq!(one(json!(true)), json!(true));
        assert_eq!(one(Value::Null), Value::Null);
        let doc =
            OutboxDocument::build(&message(), &["/a", "/b"], &[json!("acme"), json!(7)]).unwrap();
        assert_eq!(
            (doc["a"].clone(), doc["b"].clone()),
            (json!("acme"), json!(7))
        );
    }

    // R2.68
    #[test]
    fn reserved_root_paths_are_rejected_with_the_full_reserved_list() {
        for path in [
            "/id",
            "/_chatterType",
            "/status",
            "/MessageId",
            "/Destination",
            "/MessageBody",
            "/MessageContentType",
            "/MessageContext",
            "/MessageContext/tenant",
        ] {
            let err = OutboxDocument::build(&message(), &[path], &[json!("x")]).unwrap_err();
            let root = path.split('/').nth(1).unwrap();
            assert_eq!(
                err.to_string(),
                format!(
                    "The container partition-key path '{path}' targets the Chatter-reserved field '{root}'. A \
                     co-resident document cannot be stamped on a partition-key path whose root segment is one of \
                     [id, _chatterType, status, MessageId, Destination, MessageBody, MessageContentType, \
                     MessageContext] without overwriting a required field. Use a non-reserved partition-key path \
                     for the container."
                )
            );
        }
        // `ttl` and `_ts` are not reserved on the outbox document.
        assert!(OutboxDocument::build(&message(), &["/ttl"], &[json!("x")]).is_ok());
    }

    // R2.69
    #[test]
    fn many_documents_from_one_value_list_are_each_stamped() {
        let values = [json!("acme"), json!("us-east")];
        let paths = ["/tenant/id", "/region"];
        let first = OutboxDocument::build(&BrokeredMessage::json("m1", "d", "{}"), &paths, &values)
            .unwrap();
        let second =
            OutboxDocument::build(&BrokeredMessage::json("m2", "d", "{}"), &paths, &values)
                .unwrap();
        assert_eq!(first["tenant"]["id"], "acme");
        assert_eq!(second["tenant"]["id"], "acme");
        assert_ne!(first["id"], second["id"]);
    }

    #[test]
    fn too_long_message_id_is_rejected() {
        let err = OutboxDocument::build(
            &BrokeredMessage::json("x".repeat(1000), "d", "{}"),
            &["/p"],
            &[json!(1)],
        );
        assert!(matches!(err, Err(DocumentError::IdTooLong { .. })));
    }

    #[test]
    fn built_document_reads_back_to_the_same_message() {
        let mut original = message();
        original.context.insert("n".into(), json!(7));
        original
            .context
            .insert("nested".into(), json!({"z": [1, "é"], "a": null}));
        let doc = OutboxDocument::build(&original, &["/tenantId"], &[json!("t")]).unwrap();
        let read = OutboxDocument::from_json(&doc).unwrap();
        assert_eq!(read, OutboxDocument::from_message(&original).unwrap());
        let rebuilt = read.to_message().unwrap();
        assert_eq!(rebuilt, original);
        // Context key order survives the round trip too.
        let keys: Vec<&String> = rebuilt.context.keys().collect();
        assert_eq!(
            keys,
            ["Chatter.ContentType", "custom-header", "n", "nested"]
        );
    }

    #[test]
    fn from_json_rejects_structurally_malformed_documents() {
        let good = OutboxDocument::build(&message(), &["/p"], &[json!(1)]).unwrap();
        assert!(OutboxDocument::from_json(&json!([1])).is_err());
        for field in ["id", "MessageId", "Destination", "MessageBody"] {
            let mut doc = good.clone();
            doc.as_object_mut().unwrap().remove(field);
            assert!(
                OutboxDocument::from_json(&doc)
                    .unwrap_err()
                    .to_string()
                    .contains(field),
                "{field}"
            );
            doc[field] = json!(5);
            assert!(OutboxDocument::from_json(&doc).is_err(), "{field}");
        }
        let mut doc = good.clone();
        doc["MessageContext"] = json!({"not": "a string"});
        assert!(OutboxDocument::from_json(&doc).is_err());
    }

    #[test]
    fn to_message_treats_absent_null_or_blank_context_as_empty() {
        let mut doc = OutboxDocument::build(&message(), &["/p"], &[json!(1)]).unwrap();
        for context in [Value::Null, json!(""), json!("   ")] {
            doc["MessageContext"] = context;
            let message = OutboxDocument::from_json(&doc)
                .unwrap()
                .to_message()
                .unwrap();
            assert!(message.context.is_empty());
        }
        doc.as_object_mut().unwrap().remove("MessageContext");
        assert!(
            OutboxDocument::from_json(&doc)
                .unwrap()
                .to_message()
                .unwrap()
                .context
                .is_empty()
        );
    }

    // R5.07, R5.08 (the contract's own verdicts live with the relay; reconstruction agrees)
    #[test]
    fn to_message_rejects_a_context_that_is_not_a_json_object() {
        let mut doc = OutboxDocument::build(&message(), &["/p"], &[json!(1)]).unwrap();
        for context in ["not json", "[1,2]", "5", "null"] {
            doc["MessageContext"] = json!(context);
            let err = OutboxDocument::from_json(&doc)
                .unwrap()
                .to_message()
                .unwrap_err();
            assert!(
                err.to_string().contains("MessageContext"),
                "{context}: {err}"
            );
        }
    }

    // R5.03, R5.10, R5.11
    #[test]
    fn to_message_falls_back_to_the_context_content_type() {
        let mut doc = OutboxDocument::build(&message(), &["/p"], &[json!(1)]).unwrap();
        doc["MessageContentType"] = json!("  ");
        doc["MessageContext"] = json!(r#"{"Chatter.ContentType":"application/xml"}"#);
        let read = OutboxDocument::from_json(&doc)
            .unwrap()
            .to_message()
            .unwrap();
        assert_eq!(read.content_type, "application/xml");
        doc["MessageContext"] = json!(r#"{"Chatter.ContentType":7}"#);
        assert!(
            OutboxDocument::from_json(&doc)
                .unwrap()
                .to_message()
                .is_err()
        );
        doc["MessageContentType"] = Value::Null;
        doc["MessageContext"] = json!("{}");
        assert!(
            OutboxDocument::from_json(&doc)
                .unwrap()
                .to_message()
                .is_err()
        );
    }

    fn pending(message_id: &str) -> Value {
        json!({
            "id": id::outbox_id(message_id).unwrap(),
            "_chatterType": "outbox",
            "status": "pending",
            "MessageId": message_id,
        })
    }

    // R3.01
    #[test]
    fn genuine_pending_document_is_pending() {
        assert!(is_pending_outbox(&pending("msg-1")));
        assert!(is_pending_outbox(
            &OutboxDocument::build(&message(), &["/p"], &[json!(1)]).unwrap()
        ));
    }

    // R3.02
    #[test]
    fn other_discriminators_are_not_pending() {
        for kind in [json!("inbox"), json!("aggregate"), json!("other")] {
            let mut doc = pending("msg-1");
            doc["_chatterType"] = kind;
            assert!(!is_pending_outbox(&doc));
        }
        let mut doc = pending("msg-1");
        doc.as_object_mut().unwrap().remove("_chatterType");
        assert!(!is_pending_outbox(&doc));
    }

    // R3.03
    #[test]
    fn other_statuses_are_not_pending() {
        for status in ["delivered", "undeliverable", "", "   "] {
            let mut doc = pending("msg-1");
            doc["status"] = json!(status);
            assert!(!is_pending_outbox(&doc), "{status}");
        }
        let mut doc = pending("msg-1");
        doc.as_object_mut().unwrap().remove("status");
        assert!(!is_pending_outbox(&doc));
    }

    // R3.04, R3.05
    #[test]
    fn ids_chatter_did_not_mint_for_the_message_id_are_not_pending() {
        let mut doc = pending("msg-1");
        doc["id"] = json!("app-authored-id");
        assert!(!is_pending_outbox(&doc));
        doc["id"] = json!(id::outbox_id("some-other-message").unwrap());
        assert!(!is_pending_outbox(&doc));
        doc["id"] = json!(id::inbox_id("msg-1").unwrap());
        assert!(!is_pending_outbox(&doc));
    }

    // R3.06
    #[test]
    fn malformed_documents_are_not_pending_and_never_fail() {
        for doc in [
            Value::Null,
            json!(5),
            json!("text"),
            json!([pending("msg-1")]),
            json!({}),
        ] {
            assert!(!is_pending_outbox(&doc));
        }
        for field in ["_chatterType", "status", "id", "MessageId"] {
            for wrong in [
                json!(1),
                Value::Null,
                json!(true),
                json!(["x"]),
                json!({"v": "x"}),
            ] {
                let mut doc = pending("msg-1");
                doc[field] = wrong;
                assert!(!is_pending_outbox(&doc), "{field}");
            }
        }
        let mut doc = pending("msg-1");
        doc["MessageId"] = json!("");
        doc["id"] = json!("outbox:");
        assert!(!is_pending_outbox(&doc));
        let long = "x".repeat(1000);
        let mut doc = pending("msg-1");
        doc["MessageId"] = json!(long);
        doc["id"] = json!(format!("outbox:{}", id::encode(&long)));
        assert!(!is_pending_outbox(&doc));
    }

    // R3.07
    #[test]
    fn pending_comparisons_are_ordinal_and_case_sensitive() {
        for (field, value) in [
            ("status", "Pending"),
            ("_chatterType", "Outbox"),
            ("status", "pending "),
        ] {
            let mut doc = pending("msg-1");
            doc[field] = json!(value);
            assert!(!is_pending_outbox(&doc), "{field}={value}");
        }
    }
}
