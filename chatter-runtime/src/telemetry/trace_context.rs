//! W3C trace context through the outbox: `ctx.send` persists the current context with the
//! message, the consumer continues a command's trace under a `process` span, and the relay
//! publishes each Outbox Document under a Producer span `send {destination}` parented to the
//! persisted context.
//!
//! The context rides in the message context (`MessageContext`) under [`TRACEPARENT`], the W3C
//! header name, which the brokers carry as a header. `tracestate` is not carried.

use std::borrow::Cow;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    Link, Span, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};
use serde_json::Value;

use crate::broker::Broker;
use crate::document::outbox::INFRASTRUCTURE_TYPE_CONTEXT_KEY;
use crate::message::BrokeredMessage;

/// The message-context key of the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";

/// The span attribute keys (OpenTelemetry messaging semantic conventions).
mod attribute {
    pub(super) const SYSTEM: &str = "messaging.system";
    pub(super) const DESTINATION: &str = "messaging.destination.name";
    pub(super) const OPERATION_TYPE: &str = "messaging.operation.type";
    pub(super) const OPERATION_NAME: &str = "messaging.operation.name";
    pub(super) const BATCH_COUNT: &str = "messaging.batch.message_count";
    pub(super) const MESSAGE_ID: &str = "messaging.message.id";
    pub(super) const ERROR_TYPE: &str = "error.type";
}

/// A `traceparent` (`00-{trace id}-{span id}-{flags}`, lowercase hex) as a remote span context;
/// `None` unless it is well formed with non-zero ids. Versions above 00 are read by their first
/// four fields, as the W3C recommendation asks; version `ff` is invalid.
pub(crate) fn parse(traceparent: &str) -> Option<SpanContext> {
    let mut fields = traceparent.trim().split('-');
    let (version, trace_id, span_id, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let hex = |field: &str, len: usize| {
        field.len() == len
            && field
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !hex(version, 2) || version == "ff" || (version == "00" && fields.next().is_some()) {
        return None;
    }
    if !(hex(trace_id, 32) && hex(span_id, 16) && hex(flags, 2)) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
    let context = SpanContext::new(trace_id, span_id, flags, true, TraceState::NONE);
    context.is_valid().then_some(context)
}

/// `context` as a version-00 `traceparent`.
pub(crate) fn format(context: &SpanContext) -> String {
    format!(
        "00-{:032x}-{:016x}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags()
    )
}

/// The context of the `traceparent` a message carries, as a remote parent; an empty context
/// when it carries none (or a malformed one).
fn carried(message: &BrokeredMessage) -> Context {
    message
        .context
        .get(TRACEPARENT)
        .and_then(Value::as_str)
        .and_then(parse)
        .map_or_else(Context::new, |parent| {
            Context::new().with_remote_span_context(parent)
        })
}

/// Persists the current trace context with `message` (what `ctx.send` does): the span of the
/// handler's delivery, or the caller's span around `Runtime::dispatch`. A `traceparent` the
/// handler set itself is kept, and without a current span nothing is added.
pub(crate) fn persist_current(message: &mut BrokeredMessage) {
    if message.context.contains_key(TRACEPARENT) {
        return;
    }
    let current = Context::current();
    let span = current.span();
    let context = span.span_context();
    if context.is_valid() {
        message
            .context
            .insert(TRACEPARENT.to_owned(), Value::String(format(context)));
    }
}

/// The `messaging.system` of a span for `message`: the infrastructure its context names
/// (`Chatter.Infrastructure.Type`, as the .NET writer records it), else the broker's.
fn messaging_system(message: &BrokeredMessage, broker: &dyn Broker) -> Cow<'static, str> {
    match message
        .context
        .get(INFRASTRUCTURE_TYPE_CONTEXT_KEY)
        .and_then(Value::as_str)
        .map(str::trim)
    {
        Some(named) if !named.is_empty() => Cow::Owned(named.to_owned()),
        _ => Cow::Borrowed(broker.messaging_system()),
    }
}

/// The tracer chatter's spans are started on, or none (tracing off).
pub(crate) type SharedTracer = Option<std::sync::Arc<BoxedTracer>>;

/// The context a delivery of `message` is handled in.
///
/// With a tracer: a new Consumer span `process {destination}` whose parent is the message's
/// `traceparent` (a new root without one), to be ended by [`end`]. Without one (or without a
/// `traceparent` either), the message's own context, so `ctx.send` carries the command's trace
/// on even when this process records no spans.
pub(crate) fn process_context(
    tracer: &SharedTracer,
    message: &BrokeredMessage,
    broker: &dyn Broker,
) -> Context {
    let parent = carried(message);
    let Some(tracer) = tracer else {
        return parent;
    };
    let span = tracer
        .span_builder(format!("process {}", message.destination))
        .with_kind(SpanKind::Consumer)
        .with_attributes([
            KeyValue::new(attribute::SYSTEM, messaging_system(message, broker)),
            KeyValue::new(attribute::DESTINATION, message.destination.clone()),
            KeyValue::new(attribute::OPERATION_TYPE, "process"),
            KeyValue::new(attribute::OPERATION_NAME, "process"),
            KeyValue::new(attribute::MESSAGE_ID, message.message_id.clone()),
        ])
        .start_with_context(tracer.as_ref(), &parent);
    parent.with_span(span)
}

/// Ends the span of `context` (a `process` or a `send` span), with an Error status and
/// `error.type` for a failure.
pub(crate) fn end(context: &Context, failure: Option<(&'static str, String)>) {
    let span = context.span();
    if let Some((error_type, description)) = failure {
        span.set_attribute(KeyValue::new(attribute::ERROR_TYPE, error_type));
        span.set_status(Status::Error {
            description: Cow::Owned(description),
        });
    }
    span.end();
}

/// A relay publish's Producer span: `send {destination}`, parented to the document's persisted
/// `traceparent` (a new root without one) and linked to the `ambient` context the drain runs in
/// (the change feed did not cause the message, so it is no parent).
///
/// When the span records, `message` (the outgoing copy; the persisted document is never
/// written) carries the span's `traceparent` instead, so a consumer continues from the hop that
/// put the message on the broker. A span sampled out leaves the persisted `traceparent` as it
/// is. The span is returned in a context, to be ended by [`end`].
pub(crate) fn start_send(
    tracer: &BoxedTracer,
    message: &mut BrokeredMessage,
    ambient: &Context,
    broker: &dyn Broker,
) -> Context {
    let parent = carried(message);
    let ambient = ambient.span().span_context().clone();
    let links = if ambient.is_valid() {
        vec![Link::with_context(ambient)]
    } else {
        Vec::new()
    };
    let span = tracer
        .span_builder(format!("send {}", message.destination))
        .with_kind(SpanKind::Producer)
        .with_links(links)
        .with_attributes([
            KeyValue::new(attribute::SYSTEM, messaging_system(message, broker)),
            KeyValue::new(attribute::DESTINATION, message.destination.clone()),
            KeyValue::new(attribute::OPERATION_TYPE, "send"),
            KeyValue::new(attribute::OPERATION_NAME, "send"),
            KeyValue::new(attribute::BATCH_COUNT, 1_i64),
            KeyValue::new(attribute::MESSAGE_ID, message.message_id.clone()),
        ])
        .start_with_context(tracer, &parent);
    if span.is_recording() {
        message.context.insert(
            TRACEPARENT.to_owned(),
            Value::String(format(span.span_context())),
        );
    }
    parent.with_span(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERSISTED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips() {
        let context = parse(PERSISTED).unwrap();
        assert_eq!(
            context.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(
            context.span_id(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        );
        assert!(context.is_sampled() && context.is_remote());
        assert_eq!(format(&context), PERSISTED);
    }

    #[test]
    fn malformed_or_zero_traceparents_are_no_context() {
        for bad in [
            "",
            "00-abc-def-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert!(parse(bad).is_none(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(parse(later).is_some());
    }

    #[test]
    fn an_unsampled_traceparent_keeps_its_flag() {
        let context = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!context.is_sampled());
    }
}
