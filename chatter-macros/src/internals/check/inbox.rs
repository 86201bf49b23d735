//! The rules of a standalone-inbox command (`#[inbox(...)]`): none of the batch tier's attributes
//! (`#[cosmos]`, `#[partition_key]`); the idempotency container's database and container named,
//! the relay's lease optional; a marker ttl that is a whole number of seconds; a partition-key path
//! of one segment, not rooted at a field of the Claimed Inbox Marker (nor, with a lease, of an
//! Outbox Document) and not `/ttl` beside a positive ttl. They belong together because an
//! `#[inbox]` command takes these rules in place of the batch tier's `#[cosmos]` and
//! partition-key rules; only the `#[chatter]` rules ([`routing`](mod@super::routing)) are shared.

use darling::util::SpannedValue;

use super::super::attr::{Attr, Command, InboxArgs};
use super::super::ctxt::Ctxt;
use super::Checked;
use super::names::{is_a_resource_name, is_not_blank};
use super::partition_key::RESERVED_ROOTS;
use super::routing::{Routing, routing};

/// The roots a standalone inbox's partition-key path must not have: the Claimed Inbox Marker's
/// own fields and the ones its later phases patch.
const INBOX_RESERVED_ROOTS: [&str; 6] = [
    "id",
    "_chatterType",
    "MessageId",
    "ReceivedAtUtc",
    "Completed",
    "ClaimSeconds",
];

/// Every rule of a standalone-inbox command (`#[inbox(...)]`): no batch attributes, the
/// idempotency container named, a single-segment partition-key path no marker field owns, a
/// marker ttl that is an integer and does not collide with a `/ttl` path.
pub(super) fn inbox_command(cx: &Ctxt, cmd: &Command, inbox: &Attr<InboxArgs>) -> Option<Checked> {
    no_cosmos_attribute(cx, cmd);
    no_partition_key_attribute(cx, cmd);
    let database = required_name(
        cx,
        inbox,
        &inbox.args.database,
        "database",
        "the database of the idempotency container",
    );
    let container = required_name(
        cx,
        inbox,
        &inbox.args.container,
        "container",
        "the idempotency container",
    );
    let lease = optional_lease(cx, &inbox.args);
    let ttl = marker_ttl(cx, &inbox.args);
    let path = inbox_path(cx, inbox.args.partition_key.as_ref(), ttl.flatten());
    path_is_not_an_outbox_field(cx, &inbox.args);
    let Routing {
        command_name,
        destination,
        max_delivery_attempts,
    } = routing(cx, cmd)?;
    Some(Checked {
        destination,
        max_delivery_attempts,
        command_name,
        database: database?,
        container: container?,
        lease: lease?,
        declared_source_identity: None,
        partition_key_paths: Vec::new(),
        partition_key_sources: Vec::new(),
        partition_key_fields: Vec::new(),
        inbox: Some((path?, ttl?)),
    })
}

/// A standalone-inbox command has no `#[cosmos]`: it has no batch container.
fn no_cosmos_attribute(cx: &Ctxt, cmd: &Command) {
    if let Some(cosmos) = &cmd.cosmos {
        cx.error(
            cosmos.span,
            "a standalone-inbox command (`#[inbox]`) has no batch container: remove `#[cosmos]` (its handler's writes are not in Cosmos; the inbox keeps one marker per message id)",
        );
    }
}

/// A standalone-inbox command has no `#[partition_key]`, on the struct or on a field: it is
/// partitioned by its message id.
fn no_partition_key_attribute(cx: &Ctxt, cmd: &Command) {
    let field_keys = cmd
        .fields
        .iter()
        .filter_map(|f| f.partition_key.as_ref().map(|k| k.span));
    for span in cmd.partition_key.iter().map(|k| k.span).chain(field_keys) {
        cx.error(
            span,
            "a standalone-inbox command is partitioned by its message id in the idempotency container: remove `#[partition_key]` (set `#[inbox(partition_key = \"...\")]` for the container's path)",
        );
    }
}

/// A required `#[inbox]` name (`database`, `container`): given (reported only when the attribute's
/// syntax parsed), non-blank, and a valid Cosmos resource name.
fn required_name(
    cx: &Ctxt,
    inbox: &Attr<InboxArgs>,
    value: &Option<SpannedValue<String>>,
    key: &str,
    what: &str,
) -> Option<String> {
    if value.is_none() && inbox.parsed {
        cx.error(
            inbox.span,
            format!("`#[inbox]` is missing `{key} = \"...\"`: {what}"),
        );
    }
    let value = value.as_ref()?;
    (is_not_blank(cx, value, key, "inbox") && is_a_resource_name(cx, value, key, "inbox"))
        .then(|| value.as_str().to_owned())
}

/// Optional: the lease container of the relay that publishes what the handler sends; when given,
/// non-blank and a valid Cosmos resource name. Without one, the empty name.
fn optional_lease(cx: &Ctxt, inbox: &InboxArgs) -> Option<String> {
    match &inbox.lease {
        None => Some(String::new()),
        Some(value) => (is_not_blank(cx, value, "lease", "inbox")
            && is_a_resource_name(cx, value, "lease", "inbox"))
        .then(|| value.as_str().to_owned()),
    }
}

/// `marker_ttl = N`, when given: a whole number of seconds that fits an i64. `Some(None)` without
/// one, `None` when it is something else (reported).
fn marker_ttl(cx: &Ctxt, inbox: &InboxArgs) -> Option<Option<i64>> {
    match &inbox.marker_ttl {
        None => Some(None),
        Some(syn::Lit::Int(int)) => match int.base10_parse::<i64>() {
            Ok(ttl) => Some(Some(ttl)),
            Err(_) => {
                cx.error(
                    int.span(),
                    "`marker_ttl` is a number of seconds that fits an i64",
                );
                None
            }
        },
        Some(other) => {
            cx.error(
                other.span(),
                "`marker_ttl` is a number of seconds, e.g. `marker_ttl = 604800`",
            );
            None
        }
    }
}

/// The idempotency container's partition-key path (default `/idempotencyKey`): one segment (the
/// partition value is the message id), not rooted at a marker field, not `/ttl` beside a positive
/// marker ttl.
fn inbox_path(cx: &Ctxt, path: Option<&SpannedValue<String>>, ttl: Option<i64>) -> Option<String> {
    let Some(path) = path else {
        return Some("/idempotencyKey".to_owned());
    };
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let error = if segments.is_empty() || segments.iter().any(|s| s.trim().is_empty()) {
        Some(
            "`#[inbox(partition_key = ...)]` must name a path, e.g. \"/idempotencyKey\"".to_owned(),
        )
    } else if segments.len() > 1 {
        Some(format!(
            "the standalone inbox supports only a single-segment partition-key path (the partition value is the inbound message id); `{}` has {} segments",
            path.as_str(),
            segments.len()
        ))
    } else if INBOX_RESERVED_ROOTS.contains(&segments[0]) {
        Some(format!(
            "`/{}` is a field of the Claimed Inbox Marker itself: the partition-value stamp would overwrite it; use another path (default \"/idempotencyKey\")",
            segments[0]
        ))
    } else if segments[0] == "ttl" && ttl.is_some_and(|t| t > 0) {
        Some("a positive `marker_ttl` stamps the Cosmos-reserved 'ttl' field, which collides with a partition-key path rooted at '/ttl' (the partition-value stamp would overwrite the numeric TTL); use a non-'/ttl' partition-key path (default '/idempotencyKey') or leave `marker_ttl` unset".to_owned())
    } else {
        None
    };
    match error {
        Some(message) => {
            cx.error(path.span(), message);
            None
        }
        None => Some(format!("/{}", segments[0])),
    }
}

/// With a lease, the container holds Outbox Documents too, stamped at the same path: a declared
/// path is not rooted at one of their fields (the marker's own are [`inbox_path`]'s to report).
fn path_is_not_an_outbox_field(cx: &Ctxt, inbox: &InboxArgs) {
    if let (Some(declared), Some(_)) = (&inbox.partition_key, &inbox.lease) {
        let root = declared
            .split('/')
            .find(|s| !s.is_empty())
            .unwrap_or_default();
        if RESERVED_ROOTS.contains(&root) && !INBOX_RESERVED_ROOTS.contains(&root) {
            cx.error(
                declared.span(),
                format!(
                    "`/{root}` is a field of the Outbox Documents this command's sent messages become (it names a `lease`): the partition-value stamp would overwrite it; use another path (default \"/idempotencyKey\")"
                ),
            );
        }
    }
}
