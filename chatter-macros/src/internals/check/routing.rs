//! The `#[chatter(...)]` rules, which every command has whatever its tier (batch or standalone
//! inbox): the command's name (default: the type's name), its destination queue (default: the
//! name) and `max_delivery_attempts` (a whole number from 1). They belong together because they
//! decide how the command is known on the broker, and both tiers read them as one [`Routing`].

use super::super::attr::{ChatterArgs, Command};
use super::super::ctxt::Ctxt;
use super::names::{is_a_resource_name, is_not_blank};

/// The `#[chatter(...)]` part every command has, whatever its tier.
pub(super) struct Routing {
    pub(super) command_name: String,
    /// The queue its deliveries come from (default: the command's name).
    pub(super) destination: String,
    pub(super) max_delivery_attempts: Option<u32>,
}

/// Checks `#[chatter(name, destination, max_delivery_attempts)]` (every rule reports its error;
/// `None` when the name could not be decided).
pub(super) fn routing(cx: &Ctxt, cmd: &Command) -> Option<Routing> {
    let chatter = cmd.chatter.as_ref().map(|c| &c.args);
    let command_name = command_name(cx, cmd, chatter);
    let destination = chatter.and_then(|c| destination(cx, c));
    let max_delivery_attempts = chatter.and_then(|c| max_delivery_attempts(cx, c));
    let command_name = command_name?;
    Some(Routing {
        destination: destination.unwrap_or_else(|| command_name.clone()),
        command_name,
        max_delivery_attempts,
    })
}

/// The command's name: `#[chatter(name = ...)]` if given (non-blank, no forbidden character),
/// else the type's name.
fn command_name(cx: &Ctxt, cmd: &Command, chatter: Option<&ChatterArgs>) -> Option<String> {
    match chatter.and_then(|c| c.name.as_ref()) {
        Some(name) => (is_not_blank(cx, name, "name", "chatter")
            && is_a_resource_name(cx, name, "name", "chatter"))
        .then(|| name.as_str().to_owned()),
        None => Some(cmd.ident.to_string()),
    }
}

/// `#[chatter(destination = ...)]`, when given: non-blank, no forbidden character.
fn destination(cx: &Ctxt, chatter: &ChatterArgs) -> Option<String> {
    let destination = chatter.destination.as_ref()?;
    (is_not_blank(cx, destination, "destination", "chatter")
        && is_a_resource_name(cx, destination, "destination", "chatter"))
    .then(|| destination.as_str().to_owned())
}

/// `max_delivery_attempts = N`, when given: a whole number from 1 to `u32::MAX`.
fn max_delivery_attempts(cx: &Ctxt, chatter: &ChatterArgs) -> Option<u32> {
    let lit = chatter.max_delivery_attempts.as_ref()?;
    let parsed = match lit {
        syn::Lit::Int(int) => int.base10_parse::<u32>().ok(),
        _ => None,
    };
    match parsed {
        Some(0) => cx.error(
            lit.span(),
            "`#[chatter(max_delivery_attempts = ...)]` must be at least 1: the first delivery is an attempt",
        ),
        Some(n) => return Some(n),
        None => cx.error(
            lit.span(),
            "`#[chatter(max_delivery_attempts = ...)]` expects a whole number of deliveries, e.g. `max_delivery_attempts = 5`",
        ),
    }
    None
}
