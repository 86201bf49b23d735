//! The command most tests need, declared in one line: [`event_command!`](crate::event_command)
//! expands, in the test binary that invokes it, to a `#[derive(DocumentReliable)]` command and
//! its `#[handler]` (this library declares none itself: see the crate docs).

use chatter_runtime::{BoxError, HandlerContext};
use serde_json::{Map, Value};

/// What an [`event_command!`](crate::event_command) handler does: upserts the document
/// `{ "id": key, <field>: key }` and sends one JSON event `{message id}:{event}` carrying
/// `{ <field>: key }` to `destination`, in the command's one batch.
pub fn write_and_send(
    ctx: &mut HandlerContext,
    field: &str,
    key: &str,
    event: &str,
    destination: &str,
) -> Result<(), BoxError> {
    let body = Value::Object(Map::from_iter([(field.to_owned(), Value::from(key))]));
    ctx.upsert(Value::Object(Map::from_iter([
        ("id".to_owned(), Value::from(key)),
        (field.to_owned(), Value::from(key)),
    ])))?;
    let event_id = format!("{}:{event}", ctx.message_id());
    ctx.send_json(&event_id, destination, &body)?;
    Ok(())
}

/// Declares a command with one key field and its handler, which writes one document and sends
/// one event (see [`write_and_send`]):
///
/// ```ignore
/// chatter_tests::event_command! {
///     /// Places an order and emits `OrderPlaced` to `order-events`.
///     PlaceOrder { order_id as "orderId" } on ("shop", "orders", "orders-leases") at "/orderId",
///     handled by place_order, sends "OrderPlaced" to "order-events"
/// }
/// ```
///
/// The key field is a `String` serialized as the given JSON name, which the partition-key path
/// names. `to events` instead of a destination gives the command a second field, `events`, naming
/// the queue each command's event goes to.
#[macro_export]
macro_rules! event_command {
    (
        $(#[$doc:meta])*
        $command:ident { $key:ident as $field:literal }
        on ($database:literal, $container:literal, $lease:literal) at $path:literal,
        handled by $handler:ident, sends $event:literal to events
    ) => {
        $crate::event_command! {
            @declare $(#[$doc])* $command { $key as $field, events }
            on ($database, $container, $lease) at $path,
            $handler, $event, |command: &$command| command.events.clone()
        }
    };
    (
        $(#[$doc:meta])*
        $command:ident { $key:ident as $field:literal }
        on ($database:literal, $container:literal, $lease:literal) at $path:literal,
        handled by $handler:ident, sends $event:literal to $destination:expr
    ) => {
        $crate::event_command! {
            @declare $(#[$doc])* $command { $key as $field }
            on ($database, $container, $lease) at $path,
            $handler, $event, |_: &$command| ::std::string::String::from($destination)
        }
    };
    // The command (with an `events` field when asked) and its handler, sending to what
    // `$destination` (a closure of the command) names.
    (
        @declare $(#[$doc:meta])* $command:ident { $key:ident as $field:literal $(, $events:ident)? }
        on ($database:literal, $container:literal, $lease:literal) at $path:literal,
        $handler:ident, $event:literal, $destination:expr
    ) => {
        $(#[$doc])*
        #[derive(
            Debug,
            Clone,
            ::serde::Serialize,
            ::serde::Deserialize,
            ::chatter_runtime::DocumentReliable
        )]
        #[cosmos(database = $database, container = $container, lease = $lease)]
        #[partition_key(path = $path)]
        pub struct $command {
            #[serde(rename = $field)]
            pub $key: String,
            $(pub $events: String,)?
        }

        #[::chatter_runtime::handler]
        async fn $handler(
            command: $command,
            ctx: &mut ::chatter_runtime::HandlerContext,
        ) -> Result<(), ::chatter_runtime::BoxError> {
            let destination: String = ($destination)(&command);
            $crate::commands::write_and_send(ctx, $field, &command.$key, $event, &destination)
        }
    };
}
