//! A Brokered Message as AMQP and back: queue names, properties, headers.

/// The AMQP header carrying a Brokered Message's `context`, as a JSON object string.
pub const CONTEXT_HEADER: &str = "chatter-context";

/// The AMQP header a dead-lettered delivery that is not a Brokered Message carries its reason in.
pub const DEAD_LETTER_REASON_HEADER: &str = "chatter-dead-letter-reason";

/// The header a quorum queue counts a message's earlier deliveries in.
pub(super) const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The `message-id` property, or `<none>`, as logs and errors name a message.
pub(super) fn message_id_or_none(properties: &BasicProperties) -> String {
    properties
        .message_id()
        .as_ref()
        .map_or("<none>", |id| id.as_str())
        .to_owned()
}

/// The `delivery-mode` of a persistent message.
pub(super) const PERSISTENT: u8 = 2;

use lapin::BasicProperties;
use lapin::message::Delivery as AmqpDelivery;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::{Map, Value};

use crate::broker::BrokerError;
use crate::message::BrokeredMessage;

/// `destination` as an AMQP queue name: non-blank, at most 255 bytes (a short string), and not
/// in the `amq.` namespace the server reserves (declaring one is refused with 403).
pub(super) fn queue_name(destination: &str) -> Result<ShortString, BrokerError> {
    let invalid = |reason: String| BrokerError::InvalidDestination {
        destination: destination.to_owned(),
        reason,
    };
    if destination.trim().is_empty() {
        return Err(invalid("a destination must not be empty or blank".into()));
    }
    if destination.starts_with("amq.") {
        return Err(invalid(
            "queue names starting with `amq.` are reserved by RabbitMQ".into(),
        ));
    }
    ShortString::try_new(destination).map_err(|e| invalid(format!("not an AMQP queue name: {e}")))
}

/// The AMQP properties of `message`, or why AMQP cannot carry them (a field that is no short
/// string, a context that cannot be rendered).
pub(super) fn properties(message: &BrokeredMessage) -> Result<BasicProperties, BrokerError> {
    let invalid = |reason: String| BrokerError::InvalidMessage {
        message_id: message.message_id.clone(),
        destination: message.destination.clone(),
        reason,
    };
    let message_id = ShortString::try_new(message.message_id.as_str())
        .map_err(|e| invalid(format!("the message id is not an AMQP short string: {e}")))?;
    let context = serde_json::to_string(&message.context)
        .map_err(|e| invalid(format!("the context cannot be rendered as JSON: {e}")))?;
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from(CONTEXT_HEADER),
        AMQPValue::LongString(LongString::from(context)),
    );
    let mut properties = BasicProperties::default()
        .with_message_id(message_id)
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers);
    if !message.content_type.is_empty() {
        let content_type = ShortString::try_new(message.content_type.as_str())
            .map_err(|e| invalid(format!("the content type is not an AMQP short string: {e}")))?;
        properties = properties.with_content_type(content_type);
    }
    Ok(properties)
}

/// The delivery as a Brokered Message of `destination`, or why it is not one.
pub(super) fn decode(
    destination: &str,
    delivery: &AmqpDelivery,
) -> Result<BrokeredMessage, String> {
    let properties = &delivery.properties;
    let message_id = properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned())
        .ok_or("it has no message-id property")?;
    let body = String::from_utf8(delivery.data.clone())
        .map_err(|e| format!("its body is not UTF-8: {e}"))?;
    let content_type = properties
        .content_type()
        .as_ref()
        .map(|ct| ct.as_str().to_owned())
        .unwrap_or_default();
    let context = match properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(CONTEXT_HEADER))
    {
        None => Map::new(),
        Some(AMQPValue::LongString(json)) => parse_context(json.as_bytes())?,
        Some(AMQPValue::ShortString(json)) => parse_context(json.as_str().as_bytes())?,
        Some(other) => {
            return Err(format!(
                "its `{CONTEXT_HEADER}` header is not a string but {other:?}"
            ));
        }
    };
    Ok(BrokeredMessage {
        message_id,
        destination: destination.to_owned(),
        body,
        content_type,
        context,
    })
}

fn parse_context(json: &[u8]) -> Result<Map<String, Value>, String> {
    crate::broker::context_from_header(CONTEXT_HEADER, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(body: &[u8], properties: BasicProperties) -> AmqpDelivery {
        let mut delivery = AmqpDelivery::mock(
            1,
            ShortString::default(),
            ShortString::from("orders"),
            false,
            body.to_vec(),
        );
        delivery.properties = properties;
        delivery
    }

    fn context_header(value: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from(CONTEXT_HEADER), value);
        headers
    }

    #[test]
    fn decode_reads_properties_body_and_the_json_context_header() {
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from("m-1"))
            .with_content_type(ShortString::from("application/json"))
            .with_headers(context_header(AMQPValue::LongString(LongString::from(
                r#"{"a":{"b":[1,null]}}"#,
            ))));
        let message = decode("orders", &amqp(b"{}", properties)).unwrap();
        assert_eq!(message.message_id, "m-1");
        assert_eq!(message.destination, "orders");
        assert_eq!(message.body, "{}");
        assert_eq!(message.content_type, "application/json");
        assert_eq!(message.context["a"], serde_json::json!({ "b": [1, null] }));
    }

    #[test]
    fn decode_reports_what_a_foreign_message_lacks() {
        let with_id = || BasicProperties::default().with_message_id(ShortString::from("m-1"));
        let no_id = decode("orders", &amqp(b"{}", BasicProperties::default())).unwrap_err();
        assert!(no_id.contains("message-id"), "{no_id}");
        let binary = decode("orders", &amqp(&[0xff, 0xfe], with_id())).unwrap_err();
        assert!(binary.contains("UTF-8"), "{binary}");
        let not_json =
            with_id().with_headers(context_header(AMQPValue::LongString(LongString::from("{"))));
        let error = decode("orders", &amqp(b"{}", not_json)).unwrap_err();
        assert!(error.contains("not JSON"), "{error}");
        let not_object = with_id().with_headers(context_header(AMQPValue::LongString(
            LongString::from("[1]"),
        )));
        let error = decode("orders", &amqp(b"{}", not_object)).unwrap_err();
        assert!(error.contains("not an object"), "{error}");
        let not_string = with_id().with_headers(context_header(AMQPValue::Boolean(true)));
        let error = decode("orders", &amqp(b"{}", not_string)).unwrap_err();
        assert!(error.contains("not a string"), "{error}");
    }

    #[test]
    fn decode_without_context_header_or_content_type_gives_empty_ones() {
        let properties = BasicProperties::default().with_message_id(ShortString::from("m-1"));
        let message = decode("orders", &amqp(b"x", properties)).unwrap();
        assert!(message.context.is_empty());
        assert_eq!(message.content_type, "");
    }
}
