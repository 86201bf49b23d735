//! A Brokered Message as a NATS message and back: subjects, headers, the `Nats-Msg-Id`.

use async_nats::HeaderMap;
use bytes::Bytes;
use serde_json::Map;

use crate::broker::BrokerError;
use crate::message::BrokeredMessage;
use crate::message::DEAD_LETTER_REASON_CONTEXT_KEY;

/// The header carrying a Brokered Message's `context`, as a JSON object string.
pub const CONTEXT_HEADER: &str = "Chatter-Context";

/// The header carrying a Brokered Message's `message_id` (its `Nats-Msg-Id` is qualified by
/// the destination, and a dead letter's has a random suffix).
pub const MESSAGE_ID_HEADER: &str = "Chatter-Message-Id";

/// The header a dead-lettered delivery that is not a Brokered Message carries its reason in.
pub const DEAD_LETTER_REASON_HEADER: &str = "Chatter-Dead-Letter-Reason";

/// JetStream's deduplication header.
pub(super) const NATS_MSG_ID: &str = "Nats-Msg-Id";

const CONTENT_TYPE: &str = "Content-Type";

/// `destination` as a NATS subject chatter publishes to: non-blank, no whitespace, no empty
/// token, no wildcard (a message goes to one subject).
pub(super) fn subject(destination: &str) -> Result<(), BrokerError> {
    let invalid = |reason: &str| BrokerError::InvalidDestination {
        destination: destination.to_owned(),
        reason: reason.to_owned(),
    };
    if destination.trim().is_empty() {
        return Err(invalid("a destination must not be empty or blank"));
    }
    if destination.chars().any(char::is_whitespace) {
        return Err(invalid("a NATS subject cannot hold whitespace"));
    }
    if destination.split('.').any(str::is_empty) {
        return Err(invalid(
            "a NATS subject cannot start or end with `.` or hold `..`",
        ));
    }
    if destination
        .split('.')
        .any(|token| token == "*" || token == ">")
    {
        return Err(invalid(
            "a NATS subject chatter publishes to cannot hold the wildcards `*` or `>`",
        ));
    }
    Ok(())
}

/// The `Nats-Msg-Id` JetStream deduplicates `message` by: its destination and message id
/// (`<destination>/<message id>`), so a republish by the relay (a page published again after a
/// crash, a lease taken over) is dropped within the stream's duplicate window, while a message
/// of the same id for another subject of the same stream (JetStream deduplicates per stream,
/// across its subjects) is stored. The destination is escaped ([`escaped_subject`]) so the
/// first `/` always ends it: `a/b` + `c` and `a` + `b/c` are two ids. A dead letter (its
/// context carries `Chatter.DeadLetter.Reason`) gets a random suffix besides: a message
/// dead-lettered again after a replay must be stored again (at worst a dead letter is stored
/// twice, never lost).
pub(super) fn nats_message_id(message: &BrokeredMessage) -> String {
    let id = qualified_id(&message.destination, &message.message_id);
    if message.context.contains_key(DEAD_LETTER_REASON_CONTEXT_KEY) {
        format!("{id}:dead-letter:{}", uuid::Uuid::new_v4())
    } else {
        id
    }
}

/// `<escaped destination>/<message id>`: one `Nats-Msg-Id` per (destination, message id).
pub(super) fn qualified_id(destination: &str, message_id: &str) -> String {
    format!("{}/{message_id}", escaped_subject(destination))
}

/// `destination` with `%` as `%25` and `/` as `%2F`: holds no `/`, and is `destination` itself
/// for every subject without those two characters (so ids made before stay the same).
fn escaped_subject(destination: &str) -> std::borrow::Cow<'_, str> {
    if destination.contains(['%', '/']) {
        destination.replace('%', "%25").replace('/', "%2F").into()
    } else {
        destination.into()
    }
}

/// The headers of `message`, or why NATS cannot carry them (a header value with a line break,
/// a context that cannot be rendered).
pub(super) fn headers(message: &BrokeredMessage) -> Result<HeaderMap, BrokerError> {
    let invalid = |reason: String| BrokerError::InvalidMessage {
        message_id: message.message_id.clone(),
        destination: message.destination.clone(),
        reason,
    };
    let line_break = |value: &str| value.contains(['\r', '\n']);
    if message.message_id.is_empty() || line_break(&message.message_id) {
        return Err(invalid(
            "the message id is empty or holds a line break, which a NATS header cannot carry"
                .into(),
        ));
    }
    if line_break(&message.content_type) {
        return Err(invalid(
            "the content type holds a line break, which a NATS header cannot carry".into(),
        ));
    }
    // Compact JSON escapes every line break inside strings.
    let context = serde_json::to_string(&message.context)
        .map_err(|e| invalid(format!("the context cannot be rendered as JSON: {e}")))?;
    let mut headers = HeaderMap::new();
    headers.insert(NATS_MSG_ID, nats_message_id(message).as_str());
    headers.insert(MESSAGE_ID_HEADER, message.message_id.as_str());
    headers.insert(CONTEXT_HEADER, context.as_str());
    if !message.content_type.is_empty() {
        headers.insert(CONTENT_TYPE, message.content_type.as_str());
    }
    Ok(headers)
}

/// The message `payload` with `headers` on `destination` as a Brokered Message, or why it is
/// not one.
pub(super) fn decode(
    destination: &str,
    headers: Option<&HeaderMap>,
    payload: &Bytes,
) -> Result<BrokeredMessage, String> {
    let header = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    let message_id = header(MESSAGE_ID_HEADER)
        .or_else(|| header(NATS_MSG_ID))
        .filter(|id| !id.is_empty())
        .ok_or("it has neither a `Chatter-Message-Id` nor a `Nats-Msg-Id` header")?
        .to_owned();
    let body = String::from_utf8(payload.to_vec())
        .map_err(|e| format!("its payload is not UTF-8: {e}"))?;
    let content_type = header(CONTENT_TYPE).unwrap_or_default().to_owned();
    let context = match header(CONTEXT_HEADER) {
        None => Map::new(),
        Some(json) => crate::broker::context_from_header(CONTEXT_HEADER, json.as_bytes())?,
    };
    Ok(BrokeredMessage {
        message_id,
        destination: destination.to_owned(),
        body,
        content_type,
        context,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> BrokeredMessage {
        let mut message = BrokeredMessage::json("m-1", "orders.placed", r#"{"a":1}"#);
        message.context.insert(
            "nested".into(),
            serde_json::json!({ "b": [1, null, "x\ny"] }),
        );
        message
    }

    #[test]
    fn a_message_comes_back_as_it_went_through_its_headers() {
        let message = message();
        let headers = headers(&message).unwrap();
        let payload = Bytes::from(message.body.clone());
        let back = decode("orders.placed", Some(&headers), &payload).unwrap();
        assert_eq!(back, message);
        assert_eq!(
            headers.get(NATS_MSG_ID).unwrap().as_str(),
            "orders.placed/m-1"
        );
    }

    #[test]
    fn a_dead_letter_is_never_deduplicated_against_its_original() {
        let mut letter = message();
        letter.context.insert(
            DEAD_LETTER_REASON_CONTEXT_KEY.into(),
            serde_json::Value::from("poison"),
        );
        let first = nats_message_id(&letter);
        let second = nats_message_id(&letter);
        assert!(
            first.starts_with("orders.placed/m-1:dead-letter:"),
            "{first}"
        );
        assert_ne!(first, second);
        assert_eq!(nats_message_id(&message()), "orders.placed/m-1");
    }

    #[test]
    fn two_different_messages_never_share_a_nats_msg_id() {
        let id = |destination: &str, message_id: &str| {
            nats_message_id(&BrokeredMessage::json(message_id, destination, "{}"))
        };
        assert_ne!(id("a/b", "c"), id("a", "b/c"));
        assert_ne!(id("a%2Fb", "c"), id("a/b", "c"));
        // An id without ambiguity keeps the form it had, so a publish retried across an upgrade
        // is still deduplicated.
        assert_eq!(id("orders.placed", "m/1"), "orders.placed/m/1");
    }

    #[test]
    fn subjects_chatter_cannot_publish_to_are_invalid_destinations() {
        for bad in ["", " ", "a b", ".a", "a.", "a..b", "a.*", "a.>", ">"] {
            let error = subject(bad).unwrap_err();
            assert!(error.is_permanent(), "{bad:?}: {error}");
        }
        subject("orders.placed.dead-letter").unwrap();
    }

    #[test]
    fn a_line_break_in_a_header_value_is_an_invalid_message() {
        let mut message = message();
        message.message_id = "m\r\n-1".into();
        assert!(headers(&message).unwrap_err().is_permanent());
    }

    #[test]
    fn decode_reports_what_a_foreign_message_lacks() {
        let payload = Bytes::from_static(b"{}");
        let none = decode("orders", None, &payload).unwrap_err();
        assert!(none.contains("Nats-Msg-Id"), "{none}");
        let mut with_id = HeaderMap::new();
        with_id.insert(NATS_MSG_ID, "m-1");
        let binary = decode("orders", Some(&with_id), &Bytes::from_static(&[0xff])).unwrap_err();
        assert!(binary.contains("UTF-8"), "{binary}");
        let mut not_object = with_id.clone();
        not_object.insert(CONTEXT_HEADER, "[1]");
        let error = decode("orders", Some(&not_object), &payload).unwrap_err();
        assert!(error.contains("not an object"), "{error}");
        let foreign = decode("orders", Some(&with_id), &payload).unwrap();
        assert_eq!(foreign.message_id, "m-1");
        assert!(foreign.context.is_empty());
    }
}
