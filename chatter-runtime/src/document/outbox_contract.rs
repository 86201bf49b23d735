//! The Outbox Document Contract (catalog area 5.1): whether a pending Outbox Document's own
//! persisted fields can ever be reconstructed into a Brokered Message.
//!
//! [`verify`] is **total** (it never panics, for any JSON) and **pure** (the document is its only
//! input). It judges only what the bytes prove, so a document it rejects would fail identically
//! on every redrain: the relay stamps it `undeliverable` instead of wedging its lease. It consults
//! no broker and no configuration, because those can be fixed by a redeploy and giving up on a
//! document for them would discard a good message. Every violation is named at once, in the
//! catalog's fixed order, so an operator does not discover them one wedged lease at a time.
//!
//! A verified document yields a [`VerifiedOutboxDocument`]: the closed set of values the relay's
//! verbatim path publishes, so nothing unverified reaches the broker.

use std::fmt;

use serde_json::{Map, Value};

use super::outbox::{
    CONTENT_TYPE_CONTEXT_KEY, DESTINATION_FIELD, INFRASTRUCTURE_TYPE_CONTEXT_KEY,
    MESSAGE_BODY_FIELD, MESSAGE_CONTENT_TYPE_FIELD, MESSAGE_CONTEXT_FIELD, MESSAGE_ID_FIELD,
};
use crate::message::BrokeredMessage;

/// Everything the verbatim path publishes, read once from a document the contract accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedOutboxDocument {
    /// `MessageId`, verbatim.
    pub message_id: String,
    /// `Destination`: a non-blank string.
    pub destination: String,
    /// `MessageBody` (may be empty).
    pub body: String,
    /// `MessageContentType`, or the context's `Chatter.ContentType` when the field is blank.
    pub content_type: String,
    /// The materialized `MessageContext` (empty when absent or blank).
    pub context: Map<String, Value>,
    /// The context's `Chatter.Infrastructure.Type`; `None` when absent, null or blank.
    pub messaging_system: Option<String>,
}

impl VerifiedOutboxDocument {
    /// The Brokered Message the document carries.
    pub fn into_message(self) -> BrokeredMessage {
        BrokeredMessage {
            message_id: self.message_id,
            destination: self.destination,
            body: self.body,
            content_type: self.content_type,
            context: self.context,
        }
    }
}

/// One fact a document's bytes prove about why it can never be published (the .NET module's text, verbatim
/// texts in `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContractViolation {
    /// `Destination` is absent, not a string, or blank.
    Destination,
    /// `MessageBody` is absent or not a string.
    MessageBody,
    /// `MessageContext` is not JSON that materializes into a context; carries the parser's message.
    MessageContext(String),
    /// `MessageContext` is the literal `null`.
    MessageContextNull,
    /// No content type is resolvable from the document or its context.
    ContentType,
    /// The context's `Chatter.Infrastructure.Type` is persisted as a non-string value.
    MessagingSystem,
}

impl fmt::Display for ContractViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Destination => write!(
                f,
                "its '{DESTINATION_FIELD}' is absent, not a JSON string, or blank, and a brokered \
                 message requires a destination"
            ),
            Self::MessageBody => write!(
                f,
                "its '{MESSAGE_BODY_FIELD}' is absent or not a JSON string, so there is no \
                 persisted body to publish"
            ),
            Self::MessageContext(parser) => write!(
                f,
                "its '{MESSAGE_CONTEXT_FIELD}' is not JSON that materializes into a message \
                 context ({parser})"
            ),
            Self::MessageContextNull => write!(
                f,
                "its '{MESSAGE_CONTEXT_FIELD}' materializes to no message context at all"
            ),
            Self::ContentType => write!(
                f,
                "a content type is resolvable from neither its '{MESSAGE_CONTENT_TYPE_FIELD}' nor \
                 its message context, so its body can never be serialized for publish"
            ),
            Self::MessagingSystem => write!(
                f,
                "its message context's '{INFRASTRUCTURE_TYPE_CONTEXT_KEY}' is persisted as a \
                 non-string value, so the messaging infrastructure it names can never be read"
            ),
        }
    }
}

/// Every violation one document proves, in a fixed order; `Display` is the .NET module's
/// violation message, naming the `MessageId`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ContractViolations {
    /// The document's `MessageId` (empty when it carries none).
    pub message_id: String,
    /// At least one violation, in check order.
    pub violations: Vec<ContractViolation>,
}

impl fmt::Display for ContractViolations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "The Cosmos outbox relay cannot reconstruct outbox document '{}' into a brokered \
             message: ",
            self.message_id
        )?;
        for (i, violation) in self.violations.iter().enumerate() {
            if i > 0 {
                f.write_str("; and ")?;
            }
            write!(f, "{violation}")?;
        }
        f.write_str(
            ". The document's own persisted fields prove this, so redraining it would fail \
             identically; correct the writer that produced it.",
        )
    }
}

/// Verifies `doc` against the Outbox Document Contract: the verified values to publish, or every
/// violation its bytes prove. Never panics.
///
/// Checks, all evaluated, in this order: `Destination` (a non-blank string), `MessageBody` (a
/// string, `""` allowed), `MessageContext` (absent, null or blank is an empty context; otherwise a
/// string holding a JSON object; the literal `null` is a violation), the content type
/// (`MessageContentType` if non-blank, else the context's `Chatter.ContentType` read as a
/// string), and the context's `Chatter.Infrastructure.Type` (absent, null or blank is fine; a
/// string is the messaging system; anything else, including a strict ISO-8601 date string, is a
/// violation because the .NET materializer reads it as a date).
pub fn verify(doc: &Value) -> Result<VerifiedOutboxDocument, ContractViolations> {
    let text = |field: &str| doc.as_object()?.get(field)?.as_str();
    let message_id = text(MESSAGE_ID_FIELD).unwrap_or_default();
    let destination = text(DESTINATION_FIELD).filter(|d| !is_blank(d));
    let body = text(MESSAGE_BODY_FIELD);

    let mut violations = Vec::new();
    if destination.is_none() {
        violations.push(ContractViolation::Destination);
    }
    if body.is_none() {
        violations.push(ContractViolation::MessageBody);
    }
    let context = match materialize_context(text(MESSAGE_CONTEXT_FIELD)) {
        Ok(context) => Some(context),
        Err(violation) => {
            violations.push(violation);
            None
        }
    };
    let content_type = text(MESSAGE_CONTENT_TYPE_FIELD)
        .filter(|c| !is_blank(c))
        .or_else(|| {
            context
                .as_ref()
                .and_then(|c| persisted_string(c.get(CONTENT_TYPE_CONTEXT_KEY)?))
                .filter(|c| !is_blank(c))
        })
        .map(str::to_owned);
    if content_type.is_none() {
        violations.push(ContractViolation::ContentType);
    }
    let messaging_system = match context
        .as_ref()
        .and_then(|c| c.get(INFRASTRUCTURE_TYPE_CONTEXT_KEY))
    {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match persisted_string(value) {
            Some(name) if is_blank(name) => Ok(None),
            Some(name) => Ok(Some(name.to_owned())),
            None => Err(ContractViolation::MessagingSystem),
        },
    };
    let messaging_system = messaging_system.unwrap_or_else(|violation| {
        violations.push(violation);
        None
    });

    match (destination, body, context, content_type) {
        (Some(destination), Some(body), Some(context), Some(content_type))
            if violations.is_empty() =>
        {
            Ok(VerifiedOutboxDocument {
                message_id: message_id.to_owned(),
                destination: destination.to_owned(),
                body: body.to_owned(),
                content_type,
                context,
                messaging_system,
            })
        }
        _ => Err(ContractViolations {
            message_id: message_id.to_owned(),
            violations,
        }),
    }
}

/// .NET's `string.IsNullOrWhiteSpace` for a present string (Unicode white space).
fn is_blank(text: &str) -> bool {
    text.chars().all(char::is_whitespace)
}

/// The persisted context as the .NET materializer reads it: absent, JSON null (here: no string)
/// or blank is empty; otherwise it must parse as a JSON object.
fn materialize_context(persisted: Option<&str>) -> Result<Map<String, Value>, ContractViolation> {
    let Some(text) = persisted.filter(|t| !is_blank(t)) else {
        return Ok(Map::new());
    };
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(context)) => Ok(context),
        Ok(Value::Null) => Err(ContractViolation::MessageContextNull),
        Ok(other) => Err(ContractViolation::MessageContext(format!(
            "the JSON value could not be converted to a message context: it is {}, not an object",
            kind(&other)
        ))),
        Err(error) => Err(ContractViolation::MessageContext(error.to_string())),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A context value read *as a string* the way the .NET materializer hands it over: a JSON string
/// that is not a strict ISO-8601 date/time (which it materializes as a `DateTime`).
fn persisted_string(value: &Value) -> Option<&str> {
    value.as_str().filter(|text| !is_iso8601_date_time(text))
}

/// Whether System.Text.Json would read `text` as a `DateTime`: its ISO 8601-1:2019 extended
/// profile, `yyyy-MM-dd` optionally followed by `THH:mm`, `:ss`, `.f…` and an offset (`Z`,
/// `±HH`, `±HH:mm`), with real calendar and clock ranges.
pub(crate) fn is_iso8601_date_time(text: &str) -> bool {
    // System.Text.Json refuses anything longer than its maximum escaped date-time length.
    if text.len() > 42 || !text.is_ascii() {
        return false;
    }
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let slice = b.get(range)?;
        slice.iter().try_fold(0u32, |acc, c| {
            c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
        })
    };
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if year == 0 || day == 0 || day > days_in_month {
        return false;
    }
    if b.len() == 10 {
        return true;
    }
    if b[10] != b'T' {
        return false;
    }
    let (Some(hour), Some(minute)) = (digits(11..13), digits(14..16)) else {
        return false;
    };
    if b.get(13) != Some(&b':') || hour > 23 || minute > 59 {
        return false;
    }
    let mut at = 16;
    if b.get(at) == Some(&b':') {
        match digits(17..19) {
            Some(second) if second <= 59 => at = 19,
            _ => return false,
        }
        if b.get(at) == Some(&b'.') {
            let fraction = b[at + 1..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            if fraction == 0 {
                return false;
            }
            at += 1 + fraction;
        }
    }
    match &b[at..] {
        [] | [b'Z'] => true,
        [sign, rest @ ..] if *sign == b'+' || *sign == b'-' => {
            let offset_hours = |h: &[u8]| {
                h.len() == 2
                    && h.iter().all(u8::is_ascii_digit)
                    && (h[0] - b'0') * 10 + (h[1] - b'0') <= 14
            };
            match rest {
                [h1, h2] => offset_hours(&[*h1, *h2]),
                [h1, h2, b':', m1, m2] => {
                    offset_hours(&[*h1, *h2])
                        && m1.is_ascii_digit()
                        && m2.is_ascii_digit()
                        && (m1 - b'0') * 10 + (m2 - b'0') <= 59
                }
                _ => false,
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn valid() -> Value {
        json!({
            "id": "outbox:bXNnLTE",
            "_chatterType": "outbox",
            "status": "pending",
            "MessageId": "msg-1",
            "Destination": "dest",
            "MessageBody": "{}",
            "MessageContentType": "application/json",
            "MessageContext": "{}",
        })
    }

    fn with(field: &str, value: Value) -> Value {
        let mut doc = valid();
        doc[field] = value;
        doc
    }

    fn without(field: &str) -> Value {
        let mut doc = valid();
        doc.as_object_mut().unwrap().shift_remove(field);
        doc
    }

    fn context(ctx: Value) -> Value {
        with("MessageContext", json!(ctx.to_string()))
    }

    fn violations(doc: &Value) -> Vec<ContractViolation> {
        verify(doc)
            .expect_err("the document violates the contract")
            .violations
    }

    fn texts(doc: &Value) -> Vec<String> {
        violations(doc).iter().map(ToString::to_string).collect()
    }

    // R5.01
    #[test]
    fn a_full_valid_document_is_satisfied_with_its_descriptor() {
        let verified = verify(&valid()).unwrap();
        assert_eq!(
            verified,
            VerifiedOutboxDocument {
                message_id: "msg-1".into(),
                destination: "dest".into(),
                body: "{}".into(),
                content_type: "application/json".into(),
                context: Map::new(),
                messaging_system: None,
            }
        );
    }

    // R5.02
    #[test]
    fn the_context_is_materialized_into_the_descriptor() {
        let verified = verify(&context(json!({ "tenant": "acme" }))).unwrap();
        assert_eq!(verified.context["tenant"], "acme");
    }

    // R5.03
    #[test]
    fn a_blank_content_type_falls_back_to_the_context_content_type() {
        for content_type in [Value::Null, json!(""), json!("   ")] {
            let mut doc = context(json!({ "Chatter.ContentType": "application/json" }));
            doc["MessageContentType"] = content_type;
            assert_eq!(verify(&doc).unwrap().content_type, "application/json");
        }
        let mut absent = context(json!({ "Chatter.ContentType": "text/plain" }));
        absent
            .as_object_mut()
            .unwrap()
            .shift_remove("MessageContentType");
        assert_eq!(verify(&absent).unwrap().content_type, "text/plain");
    }

    // R5.04
    #[test]
    fn an_absent_null_blank_or_non_string_destination_is_one_violation() {
        let mut docs: Vec<Value> = [Value::Null, json!(""), json!("   "), json!(7), json!({})]
            .into_iter()
            .map(|d| with("Destination", d))
            .collect();
        docs.push(without("Destination"));
        for doc in docs {
            let found = texts(&doc);
            assert_eq!(found.len(), 1, "{doc}: {found:?}");
            assert!(found[0].contains("Destination"), "{found:?}");
        }
    }

    // R5.05, R5.06
    #[test]
    fn the_body_must_be_a_string_and_may_be_empty() {
        for doc in [
            without("MessageBody"),
            with("MessageBody", json!(7)),
            with("MessageBody", Value::Null),
        ] {
            let found = texts(&doc);
            assert_eq!(found.len(), 1, "{found:?}");
            assert!(found[0].contains("MessageBody"), "{found:?}");
        }
        assert_eq!(verify(&with("MessageBody", json!(""))).unwrap().body, "");
    }

    // R5.07, R5.08
    #[test]
    fn a_context_that_is_not_a_json_object_or_is_null_is_one_violation() {
        for text in ["not json", "[1,2]", "5", "null", "\"text\""] {
            let found = texts(&with("MessageContext", json!(text)));
            assert_eq!(found.len(), 1, "{text}: {found:?}");
            assert!(found[0].contains("MessageContext"), "{found:?}");
        }
        assert_eq!(
            violations(&with("MessageContext", json!("null"))),
            [ContractViolation::MessageContextNull]
        );
        // The parser's own message rides along.
        assert!(texts(&with("MessageContext", json!("not json")))[0].contains("expected"));
    }

    // R5.09
    #[test]
    fn an_absent_or_blank_context_is_an_empty_context() {
        for doc in [
            without("MessageContext"),
            with("MessageContext", Value::Null),
            with("MessageContext", json!("")),
            with("MessageContext", json!("   ")),
        ] {
            assert!(verify(&doc).unwrap().context.is_empty(), "{doc}");
        }
    }

    // R5.10, R5.11
    #[test]
    fn an_unresolvable_content_type_is_one_violation() {
        let mut none = without("MessageContentType");
        none["MessageContext"] = json!("{}");
        let mut non_string = context(json!({ "Chatter.ContentType": 7 }));
        non_string["MessageContentType"] = Value::Null;
        let mut date = context(json!({ "Chatter.ContentType": "2026-09-03" }));
        date["MessageContentType"] = json!(" ");
        for doc in [none, non_string, date] {
            let found = texts(&doc);
            assert_eq!(found.len(), 1, "{doc}: {found:?}");
            assert!(found[0].contains("MessageContentType"), "{found:?}");
        }
    }

    // R5.12
    #[test]
    fn a_document_content_type_is_enough_when_the_context_fails() {
        assert_eq!(
            violations(&with("MessageContext", json!("not json"))).len(),
            1,
            "only the context violation"
        );
    }

    // R5.13
    #[test]
    fn a_non_string_infrastructure_type_is_one_violation() {
        for value in [
            json!(7),
            json!(1.5),
            json!(true),
            json!({ "name": "asb" }),
            json!(["asb"]),
            json!("2026-09-03T12:00:00Z"),
        ] {
            let found = texts(&context(json!({ "Chatter.Infrastructure.Type": value })));
            assert_eq!(found.len(), 1, "{value}: {found:?}");
            assert!(
                found[0].contains("Chatter.Infrastructure.Type"),
                "{found:?}"
            );
        }
    }

    // R5.14, R5.15
    #[test]
    fn an_absent_null_or_blank_infrastructure_type_names_no_messaging_system() {
        for ctx in [
            json!({}),
            json!({ "Chatter.Infrastructure.Type": null }),
            json!({ "Chatter.Infrastructure.Type": "" }),
            json!({ "Chatter.Infrastructure.Type": "   " }),
        ] {
            assert_eq!(verify(&context(ctx)).unwrap().messaging_system, None);
        }
        let named = verify(&context(json!({ "Chatter.Infrastructure.Type": "asb" }))).unwrap();
        assert_eq!(named.messaging_system.as_deref(), Some("asb"));
    }

    // R5.16
    #[test]
    fn several_violations_come_in_the_catalog_order() {
        let mut doc =
            context(json!({ "Chatter.ContentType": 7, "Chatter.Infrastructure.Type": 7 }));
        doc["Destination"] = Value::Null;
        doc["MessageContentType"] = Value::Null;
        assert_eq!(
            violations(&doc),
            [
                ContractViolation::Destination,
                ContractViolation::ContentType,
                ContractViolation::MessagingSystem
            ]
        );
    }

    // R5.17
    #[test]
    fn four_violations_are_all_named_in_one_message() {
        let doc = json!({
            "MessageId": "msg-4",
            "Destination": null,
            "MessageBody": null,
            "MessageContentType": null,
            "MessageContext": "not json",
        });
        let found = texts(&doc);
        assert_eq!(found.len(), 4, "{found:?}");
        for (text, field) in found.iter().zip([
            "Destination",
            "MessageBody",
            "MessageContext",
            "MessageContentType",
        ]) {
            assert!(text.contains(field), "{text} names {field}");
        }
    }

    // R5.18, and the message's exact shape.
    #[test]
    fn the_violation_message_names_the_message_id_and_every_violation() {
        let mut doc = without("Destination");
        doc["MessageBody"] = json!(1);
        let message = verify(&doc).unwrap_err().to_string();
        assert_eq!(
            message,
            "The Cosmos outbox relay cannot reconstruct outbox document 'msg-1' into a brokered \
             message: its 'Destination' is absent, not a JSON string, or blank, and a brokered \
             message requires a destination; and its 'MessageBody' is absent or not a JSON \
             string, so there is no persisted body to publish. The document's own persisted \
             fields prove this, so redraining it would fail identically; correct the writer \
             that produced it."
        );
    }

    // R5.19
    #[test]
    fn any_json_is_verified_without_panicking_and_is_not_satisfied() {
        for doc in [
            Value::Null,
            json!(5),
            json!([]),
            json!("text"),
            json!({}),
            json!({ "Destination": { "nested": true } }),
        ] {
            assert!(verify(&doc).is_err(), "{doc}");
        }
    }

    // R5.20
    #[test]
    fn verification_is_deterministic() {
        let doc = json!({ "MessageContext": "[1", "Destination": " " });
        assert_eq!(verify(&doc), verify(&doc));
    }

    #[test]
    fn strict_iso8601_dates_are_recognised_and_other_strings_are_not() {
        for date in [
            "2026-09-03",
            "2026-09-03T12:00",
            "2026-09-03T12:00:00",
            "2026-09-03T12:00:00Z",
            "2026-09-03T12:00:00.1234567Z",
            "2024-02-29T00:00:00+01:00",
            "2026-09-03T12:00:00-05",
        ] {
            assert!(is_iso8601_date_time(date), "{date}");
        }
        for text in [
            "asb",
            "",
            "2026-9-3",
            "2026-02-30",
            "2025-02-29",
            "2026-13-01",
            "2026-09-03 12:00:00",
            "2026-09-03T24:00",
            "2026-09-03T12:00:00.",
            "2026-09-03T12:00:00Zjunk",
            "0000-01-01",
            "2026-09-03T12:00:00+1",
        ] {
            assert!(!is_iso8601_date_time(text), "{text}");
        }
    }
}
