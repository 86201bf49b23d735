//! Check: the rules on the parsed input, one named function per rule, each reporting its
//! violation into the [`Ctxt`] spanned on the offending token. [`command`] and [`handler`] are the
//! lists of rules; the order of a list is the order its errors are reported in. The rules live in
//! one module per family: [`cosmos`] (where a batch command's documents live),
//! [`partition_key`](mod@partition_key) (the declared paths), [`markers`] (which field supplies a
//! path), [`serialized`] (a path against serde's names), [`inbox`] (a standalone-inbox command),
//! [`routing`](mod@routing) (`#[chatter]`, every command) and [`names`] (the naming rules they
//! share) for the derive; [`signature`] for `#[handler]`.

mod cosmos;
mod inbox;
mod markers;
mod names;
mod partition_key;
mod routing;
mod serialized;
mod signature;
#[cfg(test)]
mod tests;

use proc_macro2::TokenStream;
use syn::{ItemFn, Type};

use self::cosmos::{cosmos_attribute_is_present, declared_source_identity, resource_name};
use self::inbox::inbox_command;
use self::partition_key::partition_key;
use self::routing::{Routing, routing};
pub(crate) use self::signature::HANDLER_SHAPE;
use self::signature::{
    command_parameter, context_parameter, handler_is_async, handler_is_not_generic,
    handler_takes_no_arguments, handler_takes_two_or_three_parameters, state_parameter,
};
use super::attr::Command;
use super::ctxt::Ctxt;

/// A command whose attributes passed every check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checked {
    pub command_name: String,
    pub destination: String,
    /// `None`: the runtime's default.
    pub max_delivery_attempts: Option<u32>,
    pub database: String,
    pub container: String,
    pub lease: String,
    pub declared_source_identity: Option<(String, String)>,
    pub partition_key_paths: Vec<String>,
    /// JSON pointer into the serialized command, per path.
    pub partition_key_sources: Vec<String>,
    /// The Rust field supplying each path, for the generated docs.
    pub partition_key_fields: Vec<String>,
    /// `#[inbox]`: the idempotency container's partition-key path and the marker ttl.
    pub inbox: Option<(String, Option<i64>)>,
}

/// Every rule of `#[derive(DocumentReliable)]`. `None` when a rule could not produce its part of
/// the result (it reported why); errors of the other rules are reported all the same.
pub(crate) fn command(cx: &Ctxt, cmd: &Command) -> Option<Checked> {
    if let Some(inbox) = &cmd.inbox {
        return inbox_command(cx, cmd, inbox);
    }
    let cosmos = cosmos_attribute_is_present(cx, cmd);
    let database = cosmos.and_then(|c| {
        resource_name(
            cx,
            c,
            &c.args.database,
            "database",
            "the Cosmos database of the command's container",
        )
    });
    let container = cosmos.and_then(|c| {
        resource_name(
            cx,
            c,
            &c.args.container,
            "container",
            "the container holding the handler's writes and the outbox",
        )
    });
    let lease = cosmos.and_then(|c| {
        resource_name(
            cx,
            c,
            &c.args.lease,
            "lease",
            "the lease container of the change-feed relay",
        )
    });
    let declared_source_identity = cosmos.and_then(|c| declared_source_identity(cx, &c.args));
    let routing = routing(cx, cmd);
    let partition_key = partition_key(cx, cmd);

    let Routing {
        command_name,
        destination,
        max_delivery_attempts,
    } = routing?;
    Some(Checked {
        destination,
        max_delivery_attempts,
        command_name,
        database: database?,
        container: container?,
        lease: lease?,
        declared_source_identity,
        partition_key_paths: partition_key.paths,
        partition_key_sources: partition_key.sources,
        partition_key_fields: partition_key.fields,
        inbox: None,
    })
}

/// What `#[handler]` binds: the command type (the first parameter's) and the application state
/// type (inside the third parameter's `State<..>`), if any.
pub(crate) struct CheckedHandler<'a> {
    pub(crate) command: &'a Type,
    pub(crate) state: Option<&'a Type>,
}

/// Every rule of `#[handler]`. `None` when there is nothing to bind (a rule reported why).
pub(crate) fn handler<'a>(
    cx: &Ctxt,
    args: &TokenStream,
    function: &'a ItemFn,
) -> Option<CheckedHandler<'a>> {
    let sig = &function.sig;
    handler_takes_no_arguments(cx, args);
    handler_is_async(cx, sig);
    handler_is_not_generic(cx, sig);
    handler_takes_two_or_three_parameters(cx, sig);
    let command = command_parameter(cx, sig);
    context_parameter(cx, sig);
    let state = state_parameter(cx, sig);
    Some(CheckedHandler {
        command: command?,
        state: state?,
    })
}
