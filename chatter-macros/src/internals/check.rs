//! Check: the rules on the parsed input, one named function per rule, each reporting its
//! violation into the [`Ctxt`] spanned on the offending token. [`command`] and [`handler`] are the
//! lists of rules; the order of a list is the order its errors are reported in.

use darling::util::SpannedValue;
use proc_macro2::TokenStream;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Signature, Type};

use super::attr::{
    Attr, ChatterArgs, Command, CosmosArgs, Field, FieldPartitionKeyArgs, InboxArgs,
};
use super::ctxt::Ctxt;

/// Root fields chatter writes on its documents: a partition-key path rooted at
/// one of them would overwrite a required field. `status` and `ttl` are patched by the relay.
pub(crate) const RESERVED_ROOTS: &[&str] = &[
    "id",
    "_chatterType",
    "status",
    "ttl",
    "MessageId",
    "Destination",
    "MessageBody",
    "MessageContentType",
    "MessageContext",
    "ReceivedAtUtc",
];

/// Cosmos DB allows at most three levels in a hierarchical partition key.
const MAX_PARTITION_KEY_PATHS: usize = 3;

/// The shape every handler must have, quoted by the handler's errors.
pub(crate) const HANDLER_SHAPE: &str = "a chatter handler is `async fn name(command: YourCommand, ctx: &mut HandlerContext) -> Result<(), BoxError>`, with application state as an optional third parameter `state: State<YourState>`";

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

/// The partition-key part of [`Checked`], one entry per path in all three.
#[derive(Debug, Default)]
struct PartitionKey {
    paths: Vec<String>,
    sources: Vec<String>,
    fields: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// `#[derive(DocumentReliable)]`
// ---------------------------------------------------------------------------------------------

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
fn inbox_command(cx: &Ctxt, cmd: &Command, inbox: &Attr<InboxArgs>) -> Option<Checked> {
    if let Some(cosmos) = &cmd.cosmos {
        cx.error(
            cosmos.span,
            "a standalone-inbox command (`#[inbox]`) has no batch container: remove `#[cosmos]` (its handler's writes are not in Cosmos; the inbox keeps one marker per message id)",
        );
    }
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
    let name = |value: &Option<SpannedValue<String>>, key: &str, what: &str| {
        if value.is_none() && inbox.parsed {
            cx.error(
                inbox.span,
                format!("`#[inbox]` is missing `{key} = \"...\"`: {what}"),
            );
        }
        let value = value.as_ref()?;
        (is_not_blank(cx, value, key, "inbox") && is_a_resource_name(cx, value, key, "inbox"))
            .then(|| value.as_str().to_owned())
    };
    let database = name(
        &inbox.args.database,
        "database",
        "the database of the idempotency container",
    );
    let container = name(
        &inbox.args.container,
        "container",
        "the idempotency container",
    );
    // Optional: the lease container of the relay that publishes what the handler sends.
    let lease = match &inbox.args.lease {
        None => Some(String::new()),
        Some(value) => (is_not_blank(cx, value, "lease", "inbox")
            && is_a_resource_name(cx, value, "lease", "inbox"))
        .then(|| value.as_str().to_owned()),
    };
    let ttl = match &inbox.args.marker_ttl {
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
    };
    let path = inbox_path(cx, inbox.args.partition_key.as_ref(), ttl.flatten());
    // With a lease, the container holds Outbox Documents too, stamped at the same path.
    if let (Some(declared), Some(_)) = (&inbox.args.partition_key, &inbox.args.lease) {
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

/// The command has a `#[cosmos(...)]` attribute.
fn cosmos_attribute_is_present<'a>(cx: &Ctxt, cmd: &'a Command) -> Option<&'a Attr<CosmosArgs>> {
    let ident = &cmd.ident;
    if cmd.cosmos.is_none() {
        cx.error(
            ident.span(),
            format!(
                "`{ident}` is missing `#[cosmos(database = \"...\", container = \"...\", lease = \"...\")]`: it names where the command's documents live"
            ),
        );
    }
    cmd.cosmos.as_ref()
}

/// A database, container or lease name: given, non-blank, and a valid Cosmos resource name.
fn resource_name(
    cx: &Ctxt,
    cosmos: &Attr<CosmosArgs>,
    value: &Option<SpannedValue<String>>,
    key: &str,
    what: &str,
) -> Option<String> {
    let value = key_is_given(cx, cosmos, value, key, what)?;
    (is_not_blank(cx, value, key, "cosmos") && is_a_resource_name(cx, value, key, "cosmos"))
        .then(|| value.as_str().to_owned())
}

/// A required `#[cosmos]` key is there. When the attribute's syntax was already reported its keys
/// are unknown, and a "missing key" error would only repeat the first error.
fn key_is_given<'a>(
    cx: &Ctxt,
    cosmos: &Attr<CosmosArgs>,
    value: &'a Option<SpannedValue<String>>,
    key: &str,
    what: &str,
) -> Option<&'a SpannedValue<String>> {
    if value.is_none() && cosmos.parsed {
        cx.error(
            cosmos.span,
            format!("`#[cosmos]` is missing `{key} = \"...\"`: {what}"),
        );
    }
    value.as_ref()
}

/// A name is not empty and not only whitespace.
fn is_not_blank(cx: &Ctxt, value: &SpannedValue<String>, key: &str, attr: &str) -> bool {
    let blank = value.trim().is_empty();
    if blank {
        cx.error(
            value.span(),
            format!("`#[{attr}({key} = ...)]` must not be empty or whitespace"),
        );
    }
    !blank
}

/// A name holds none of the characters Cosmos DB forbids in a resource name.
fn is_a_resource_name(cx: &Ctxt, value: &SpannedValue<String>, key: &str, attr: &str) -> bool {
    let forbidden = value.chars().find(|c| matches!(c, '/' | '\\' | '?' | '#'));
    if let Some(c) = forbidden {
        cx.error(
            value.span(),
            format!(
                "`#[{attr}({key} = ...)]` contains `{c}`, which Cosmos DB does not allow in a resource name"
            ),
        );
    }
    forbidden.is_none()
}

/// `monitored_source` and `lease_source` come as a pair, each non-blank. A declared identity is an
/// opaque token, not a resource name: any other text is accepted, `/` included.
fn declared_source_identity(cx: &Ctxt, cosmos: &CosmosArgs) -> Option<(String, String)> {
    match (&cosmos.monitored_source, &cosmos.lease_source) {
        (Some(monitored), Some(lease)) => {
            let monitored_ok = is_not_blank(cx, monitored, "monitored_source", "cosmos");
            let lease_ok = is_not_blank(cx, lease, "lease_source", "cosmos");
            (monitored_ok && lease_ok)
                .then(|| (monitored.as_str().to_owned(), lease.as_str().to_owned()))
        }
        (Some(only), None) => {
            cx.error(
                only.span(),
                "`monitored_source` needs `lease_source` too: declare both change-feed source identities or neither",
            );
            None
        }
        (None, Some(only)) => {
            cx.error(
                only.span(),
                "`lease_source` needs `monitored_source` too: declare both change-feed source identities or neither",
            );
            None
        }
        (None, None) => None,
    }
}

/// The command's name: `#[chatter(name = ...)]` if given (non-blank, no forbidden character),
/// else the type's name.
/// The `#[chatter(...)]` part every command has, whatever its tier.
struct Routing {
    command_name: String,
    /// The queue its deliveries come from (default: the command's name).
    destination: String,
    max_delivery_attempts: Option<u32>,
}

/// Checks `#[chatter(name, destination, max_delivery_attempts)]` (every rule reports its error;
/// `None` when the name could not be decided).
fn routing(cx: &Ctxt, cmd: &Command) -> Option<Routing> {
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

/// The partition-key rules: the paths, where each value is read from, and which field supplies it.
fn partition_key(cx: &Ctxt, cmd: &Command) -> PartitionKey {
    let mut out = PartitionKey::default();
    let Some(paths) = partition_key_paths_are_declared(cx, cmd) else {
        return out;
    };
    at_most_three_paths(cx, paths);
    no_path_listed_twice(cx, paths);
    let markers = field_markers(cx, cmd, paths);
    for path in paths {
        let Some(segments) = path_syntax(cx, path) else {
            continue;
        };
        let Some((source, field)) = path_source(cx, cmd, &markers, path, &segments) else {
            continue;
        };
        if !supplying_field_is_serialized(cx, field, path) {
            continue;
        }
        out.paths.push(path.as_str().to_owned());
        out.sources.push(source);
        out.fields.push(field.ident.to_string());
    }
    out
}

/// The command has `#[partition_key(path = ...)]` with at least one path.
fn partition_key_paths_are_declared<'a>(
    cx: &Ctxt,
    cmd: &'a Command,
) -> Option<&'a [SpannedValue<String>]> {
    let ident = &cmd.ident;
    let Some(pk) = &cmd.partition_key else {
        cx.error(
            ident.span(),
            format!(
                "`{ident}` is missing `#[partition_key(path = \"/...\")]`: name the container's partition-key path, e.g. `#[partition_key(path = \"/orderId\")]`"
            ),
        );
        return None;
    };
    if pk.args.path.is_empty() {
        cx.error(
            pk.span,
            "`#[partition_key]` needs `path = \"/...\"`, e.g. `#[partition_key(path = \"/orderId\")]`",
        );
        return None;
    }
    Some(&pk.args.path)
}

/// A hierarchical partition key has at most three levels.
fn at_most_three_paths(cx: &Ctxt, paths: &[SpannedValue<String>]) {
    if let Some(extra) = paths.get(MAX_PARTITION_KEY_PATHS) {
        cx.error(
            extra.span(),
            format!(
                "a hierarchical partition key has at most {MAX_PARTITION_KEY_PATHS} paths in Cosmos DB"
            ),
        );
    }
}

/// No path is listed twice.
fn no_path_listed_twice(cx: &Ctxt, paths: &[SpannedValue<String>]) {
    for (i, path) in paths.iter().enumerate() {
        if paths[..i]
            .iter()
            .any(|earlier| earlier.as_str() == path.as_str())
        {
            cx.error(
                path.span(),
                format!("partition-key path `{}` is listed twice", path.as_str()),
            );
        }
    }
}

/// Which field supplies which path through a field-level `#[partition_key]`.
struct Markers<'a> {
    supplied: Vec<(&'a str, &'a Field)>,
    /// A marker that was itself in error may have been meant for any path: then a path that names
    /// no field is not worth a second error.
    failed: bool,
}

/// The field-level `#[partition_key]` markers: each names one of the listed paths (it may leave
/// the path out when there is only one), and no path is supplied by two fields.
fn field_markers<'a>(
    cx: &Ctxt,
    cmd: &'a Command,
    paths: &'a [SpannedValue<String>],
) -> Markers<'a> {
    let mut markers = Markers {
        supplied: Vec::new(),
        failed: false,
    };
    for field in &cmd.fields {
        let Some(attr) = &field.partition_key else {
            continue;
        };
        if !attr.parsed {
            markers.failed = true;
            continue;
        }
        let Some(target) = marker_target(cx, attr, paths) else {
            markers.failed = true;
            continue;
        };
        if !path_is_supplied_once(cx, &markers, attr, target) {
            continue;
        }
        markers.supplied.push((target, field));
    }
    markers
}

/// The path a field marker supplies: the one it names, which must be listed, or the only one.
fn marker_target<'a>(
    cx: &Ctxt,
    attr: &Attr<FieldPartitionKeyArgs>,
    paths: &'a [SpannedValue<String>],
) -> Option<&'a str> {
    match &attr.args.path {
        Some(p) => {
            let found = paths.iter().find(|q| q.as_str() == p.as_str());
            if found.is_none() {
                let listed: Vec<&str> = paths.iter().map(|q| q.as_str()).collect();
                cx.error(
                    p.span(),
                    format!(
                        "`{}` is not one of this command's partition-key paths [{}]",
                        p.as_str(),
                        listed.join(", ")
                    ),
                );
            }
            found.map(|q| q.as_str())
        }
        None if paths.len() == 1 => Some(paths[0].as_str()),
        None => {
            cx.error(
                attr.span,
                "with several partition-key paths, say which one this field supplies: `#[partition_key(path = \"/...\")]`",
            );
            None
        }
    }
}

/// No two field markers supply the same path.
fn path_is_supplied_once(
    cx: &Ctxt,
    markers: &Markers<'_>,
    attr: &Attr<FieldPartitionKeyArgs>,
    target: &str,
) -> bool {
    match markers.supplied.iter().find(|(t, _)| *t == target) {
        Some((_, first)) => {
            cx.error(
                attr.span,
                format!(
                    "partition-key path `{target}` is already supplied by field `{}`",
                    first.ident
                ),
            );
            false
        }
        None => true,
    }
}

/// One partition-key path's syntax; returns its segments.
fn path_syntax(cx: &Ctxt, path: &SpannedValue<String>) -> Option<Vec<String>> {
    if !(path_is_not_blank(cx, path) && path_starts_with_slash(cx, path)) {
        return None;
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    if !(path_has_no_empty_segment(cx, path, &segments)
        && path_root_is_not_reserved(cx, path, segments[0]))
    {
        return None;
    }
    Some(segments.into_iter().map(str::to_owned).collect())
}

/// A path is not empty.
fn path_is_not_blank(cx: &Ctxt, path: &SpannedValue<String>) -> bool {
    let blank = path.trim().is_empty();
    if blank {
        cx.error(
            path.span(),
            "`#[partition_key(path = ...)]` must not be empty: name the container's partition-key path, e.g. `\"/orderId\"`",
        );
    }
    !blank
}

/// A path starts with `/`.
fn path_starts_with_slash(cx: &Ctxt, path: &SpannedValue<String>) -> bool {
    let starts = path.starts_with('/');
    if !starts {
        cx.error(
            path.span(),
            format!(
                "`#[partition_key(path = ...)]` must start with `/`: write `\"/{}\"`",
                path.as_str()
            ),
        );
    }
    starts
}

/// A path has no empty segment (no doubled or trailing `/`).
fn path_has_no_empty_segment(cx: &Ctxt, path: &SpannedValue<String>, segments: &[&str]) -> bool {
    let empty = segments.iter().any(|s| s.trim().is_empty());
    if empty {
        cx.error(
            path.span(),
            format!(
                "`#[partition_key(path = \"{}\")]` has an empty segment: remove the doubled or trailing `/`",
                path.as_str()
            ),
        );
    }
    !empty
}

/// A path is not rooted at a field chatter writes on its documents.
fn path_root_is_not_reserved(cx: &Ctxt, path: &SpannedValue<String>, root: &str) -> bool {
    let reserved = RESERVED_ROOTS.contains(&root);
    if reserved {
        let why = if root == "status" || root == "ttl" {
            "the relay patches `/status` and `/ttl` on every outbox document it delivers"
        } else {
            "chatter writes that field on its outbox documents and inbox markers"
        };
        cx.error(
            path.span(),
            format!(
                "`#[partition_key(path = \"{}\")]` is rooted at `{root}`, a field chatter owns: {why}; partition the container by a field of your own",
                path.as_str()
            ),
        );
    }
    !reserved
}

/// Where a path's value is read from (a JSON pointer into the serialized command) and the field
/// that supplies it: a marked field, else the field whose serialized name is the path's root.
fn path_source<'a>(
    cx: &Ctxt,
    cmd: &'a Command,
    markers: &Markers<'a>,
    path: &SpannedValue<String>,
    segments: &[String],
) -> Option<(String, &'a Field)> {
    if let Some((_, field)) = markers.supplied.iter().find(|(t, _)| *t == path.as_str()) {
        return Some((
            format!("/{}", pointer_segment(&field.serialized_name)),
            *field,
        ));
    }
    let field = path_names_a_field(cx, cmd, markers, path, &segments[0])?;
    let pointer: Vec<String> = segments.iter().map(|s| pointer_segment(s)).collect();
    Some((format!("/{}", pointer.join("/")), field))
}

/// An unmarked path's root is the serialized name of a field; if not, the closest name is
/// suggested.
fn path_names_a_field<'a>(
    cx: &Ctxt,
    cmd: &'a Command,
    markers: &Markers<'_>,
    path: &SpannedValue<String>,
    root: &str,
) -> Option<&'a Field> {
    let field = cmd.fields.iter().find(|f| f.serialized_name == root);
    if field.is_none() && !cmd.fields.is_empty() && !markers.failed {
        report_unknown_root(cx, cmd, path, root);
    }
    field
}

/// The field supplying a path is in the command's JSON: not skipped or flattened by serde.
fn supplying_field_is_serialized(cx: &Ctxt, field: &Field, path: &SpannedValue<String>) -> bool {
    if !(field.serde.skipped || field.serde.flatten) {
        return true;
    }
    let why = if field.serde.skipped {
        "skipped by serde"
    } else {
        "flattened by serde"
    };
    cx.error(
        field.ident.span(),
        format!(
            "field `{}` supplies partition-key path `{}` but is {why}, so the value would not be in the command's JSON",
            field.ident,
            path.as_str()
        ),
    );
    false
}

fn report_unknown_root(cx: &Ctxt, cmd: &Command, path: &SpannedValue<String>, root: &str) {
    let names: Vec<&str> = cmd
        .fields
        .iter()
        .map(|f| f.serialized_name.as_str())
        .collect();
    let suggestion = names
        .iter()
        .map(|n| (edit_distance(&n.to_lowercase(), &root.to_lowercase()), *n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| format!("; did you mean `/{n}`?"))
        .unwrap_or_default();
    cx.error(
        path.span(),
        format!(
            "`#[partition_key(path = \"{}\")]` names no field of `{}`: its serialized fields are {}{suggestion} \
             (if the value is in a field named differently, mark that field `#[partition_key]`)",
            path.as_str(),
            cmd.ident,
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
    );
}

/// Escapes one segment for a JSON pointer (RFC 6901).
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == cb {
                prev
            } else {
                1 + prev.min(row[j]).min(cur)
            };
            prev = cur;
        }
    }
    row[b.len()]
}

// ---------------------------------------------------------------------------------------------
// `#[handler]`
// ---------------------------------------------------------------------------------------------

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

/// `#[handler]` has no arguments of its own.
fn handler_takes_no_arguments(cx: &Ctxt, args: &TokenStream) {
    if !args.is_empty() {
        cx.error(
            args.span(),
            "`#[handler]` takes no arguments: the command type comes from the first parameter",
        );
    }
}

/// A handler is an `async fn`.
fn handler_is_async(cx: &Ctxt, sig: &Signature) {
    if sig.asyncness.is_none() {
        cx.error(
            sig.fn_token.span(),
            format!("a chatter handler must be `async`: {HANDLER_SHAPE}"),
        );
    }
}

/// A handler has no generic parameters.
fn handler_is_not_generic(cx: &Ctxt, sig: &Signature) {
    if !sig.generics.params.is_empty() {
        cx.error(
            sig.generics.params.span(),
            "a chatter handler cannot be generic: the registry binds it to one concrete command type",
        );
    }
}

/// A handler takes the command and the context, and optionally the application state.
fn handler_takes_two_or_three_parameters(cx: &Ctxt, sig: &Signature) {
    if !(2..=3).contains(&sig.inputs.len()) {
        cx.error(
            sig.inputs.span(),
            format!(
                "a chatter handler takes two or three parameters, the command, the context and optionally the state: {HANDLER_SHAPE}"
            ),
        );
    }
}

/// Whether `ty` is a reference to a type named `HandlerContext` (the context in the wrong place).
fn is_context_reference(ty: &Type) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    matches!(&*reference.elem, Type::Path(path)
        if path.path.segments.last().is_some_and(|s| s.ident == "HandlerContext"))
}

/// The second parameter is the context, taken as `&mut` (the handler stages writes on it).
fn context_parameter(cx: &Ctxt, sig: &Signature) {
    // Swapped parameters are reported once, on the first.
    if matches!(sig.inputs.first(), Some(FnArg::Typed(first)) if is_context_reference(&first.ty)) {
        return;
    }
    let Some(FnArg::Typed(t)) = sig.inputs.iter().nth(1) else {
        return;
    };
    match &*t.ty {
        Type::Reference(reference) if reference.mutability.is_some() => {}
        Type::Reference(reference) => cx.syn_error(syn::Error::new_spanned(
            reference,
            "take the context as `&mut HandlerContext`: a handler stages its writes and messages on it, which a shared `&HandlerContext` cannot do",
        )),
        other => cx.error(
            other.span(),
            "take the context as `&mut HandlerContext`: the runtime lends the delivery's context to the handler, it does not give it away",
        ),
    }
}

/// The third parameter, if any, is `State<T>`; returns `Some(None)` without one, `None` when it
/// is something else (reported).
fn state_parameter<'a>(cx: &Ctxt, sig: &'a Signature) -> Option<Option<&'a Type>> {
    let Some(third) = sig.inputs.iter().nth(2) else {
        return Some(None);
    };
    let refuse = || {
        cx.syn_error(syn::Error::new_spanned(
            third,
            "the third parameter of a chatter handler is the application state, `State<YourState>` (given to the runtime with `RuntimeBuilder::state`)",
        ));
        None
    };
    let FnArg::Typed(t) = third else {
        return refuse();
    };
    let Type::Path(path) = &*t.ty else {
        return refuse();
    };
    let Some(last) = path.path.segments.last().filter(|s| s.ident == "State") else {
        return refuse();
    };
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return refuse();
    };
    match args.args.first() {
        Some(syn::GenericArgument::Type(state)) if args.args.len() == 1 => Some(Some(state)),
        _ => refuse(),
    }
}

/// The first parameter is the command, taken by value (not `self`, not a reference); any pattern
/// is fine.
fn command_parameter<'a>(cx: &Ctxt, sig: &'a Signature) -> Option<&'a Type> {
    match sig.inputs.first()? {
        FnArg::Receiver(r) => {
            cx.error(
                r.span(),
                "a chatter handler is a free `async fn`, not a method: it cannot take `self`",
            );
            None
        }
        FnArg::Typed(t) if is_context_reference(&t.ty) => {
            cx.syn_error(syn::Error::new_spanned(
                &t.ty,
                "the command comes first, then the context: `async fn name(command: YourCommand, ctx: &mut HandlerContext)`",
            ));
            None
        }
        FnArg::Typed(t) if matches!(&*t.ty, Type::Reference(_)) => {
            cx.error(
                t.ty.span(),
                "take the command by value: the handler owns the decoded command",
            );
            None
        }
        FnArg::Typed(t) => Some(&t.ty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::{DeriveInput, parse_quote};

    fn run(input: DeriveInput) -> Result<Checked, Vec<String>> {
        let cx = Ctxt::new();
        let parsed = super::super::attr::parse(&cx, &input);
        let checked = command(&cx, &parsed);
        match cx.check() {
            Ok(()) => Ok(checked.expect("no errors means checked")),
            Err(e) => Err(e.into_iter().map(|e| e.to_string()).collect()),
        }
    }

    #[test]
    fn plain_registration_reads_every_attribute() {
        let checked = run(parse_quote! {
            #[cosmos(database = "shop", container = "orders", lease = "orders-leases")]
            #[partition_key(path = "/orderId")]
            #[serde(rename_all = "camelCase")]
            struct CreateOrder { order_id: String, quantity: u32 }
        })
        .unwrap();
        assert_eq!(checked.command_name, "CreateOrder");
        assert_eq!(checked.destination, "CreateOrder");
        assert_eq!(
            (checked.database.as_str(), checked.container.as_str()),
            ("shop", "orders")
        );
        assert_eq!(checked.lease, "orders-leases");
        assert_eq!(checked.partition_key_paths, ["/orderId"]);
        assert_eq!(checked.partition_key_sources, ["/orderId"]);
        assert_eq!(checked.partition_key_fields, ["order_id"]);
        assert_eq!(checked.declared_source_identity, None);
    }

    #[test]
    fn name_and_destination_override_the_type_name() {
        let checked = run(parse_quote! {
            #[cosmos(database = "shop", container = "orders", lease = "l")]
            #[partition_key(path = "/id2")]
            #[chatter(name = "orders.create", destination = "orders-in")]
            struct CreateOrder { id2: String }
        })
        .unwrap();
        assert_eq!(checked.command_name, "orders.create");
        assert_eq!(checked.destination, "orders-in");
    }

    #[test]
    fn nested_path_reads_the_nested_value() {
        let checked = run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l")]
            #[partition_key(path = "/customer/id")]
            struct OpenAccount { customer: Customer }
        })
        .unwrap();
        assert_eq!(checked.partition_key_sources, ["/customer/id"]);
    }

    #[test]
    fn field_marker_supplies_a_differently_named_path() {
        let checked = run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l")]
            #[partition_key(path = "/tenant/id", path = "/region")]
            struct S {
                #[partition_key(path = "/tenant/id")]
                #[serde(rename = "tenant~x")]
                tenant: String,
                region: String,
            }
        })
        .unwrap();
        // RFC 6901 escapes `~` in the pointer.
        assert_eq!(checked.partition_key_sources, ["/tenant~0x", "/region"]);
        assert_eq!(checked.partition_key_fields, ["tenant", "region"]);
    }

    #[test]
    fn declared_identities_are_kept_as_a_pair() {
        let checked = run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l", monitored_source = "m", lease_source = "ls")]
            #[partition_key(path = "/k")]
            struct S { k: String }
        })
        .unwrap();
        assert_eq!(
            checked.declared_source_identity,
            Some(("m".into(), "ls".into()))
        );
    }

    #[test]
    fn declared_identities_are_opaque_tokens_not_resource_names() {
        let checked = run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l", monitored_source = "fin/ledger", lease_source = "a\\b?#c")]
            #[partition_key(path = "/k")]
            struct S { k: String }
        })
        .unwrap();
        assert_eq!(
            checked.declared_source_identity,
            Some(("fin/ledger".into(), "a\\b?#c".into()))
        );
    }

    #[test]
    fn blank_declared_identities_are_rejected_each() {
        let errors = run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l", monitored_source = "", lease_source = " \t")]
            #[partition_key(path = "/k")]
            struct S { k: String }
        })
        .unwrap_err();
        assert_eq!(
            errors,
            [
                "`#[cosmos(monitored_source = ...)]` must not be empty or whitespace",
                "`#[cosmos(lease_source = ...)]` must not be empty or whitespace",
            ]
        );
    }

    #[test]
    fn resource_names_still_refuse_a_slash() {
        let errors = run(parse_quote! {
            #[cosmos(database = "d", container = "fin/ledger", lease = "l")]
            #[partition_key(path = "/k")]
            struct S { k: String }
        })
        .unwrap_err();
        assert_eq!(
            errors,
            [
                "`#[cosmos(container = ...)]` contains `/`, which Cosmos DB does not allow in a resource name"
            ]
        );
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let errors = run(parse_quote! {
            #[cosmos(database = " ", container = "orders")]
            #[partition_key(path = "orderId")]
            #[chatter(destination = "")]
            struct S { order_id: String }
        })
        .unwrap_err();
        assert_eq!(errors.len(), 4, "{errors:#?}");
        assert!(errors.iter().any(|e| e.contains("must start with `/`")));
        assert!(errors.iter().any(|e| e.contains("missing `lease")));
    }

    #[test]
    fn reserved_roots_are_rejected_but_case_differs_is_allowed() {
        for root in RESERVED_ROOTS {
            let path = format!("/{root}");
            let input: DeriveInput = parse_quote! {
                #[cosmos(database = "d", container = "c", lease = "l")]
                #[partition_key(path = #path)]
                struct S { x: String }
            };
            let errors = run(input).unwrap_err();
            assert!(
                errors[0].contains("a field chatter owns"),
                "{root}: {errors:?}"
            );
        }
        // `/Ttl` is not `/ttl`: Cosmos paths are case-sensitive (catalog Top 15, item 14).
        assert!(
            run(parse_quote! {
                #[cosmos(database = "d", container = "c", lease = "l")]
                #[partition_key(path = "/Ttl")]
                struct S { #[serde(rename = "Ttl")] ttl: u32 }
            })
            .is_ok()
        );
    }

    #[test]
    fn unknown_root_suggests_the_closest_serialized_name() {
        let errors = run(parse_quote! {
            #[cosmos(database = "d", container = "c", lease = "l")]
            #[partition_key(path = "/orderid")]
            #[serde(rename_all = "camelCase")]
            struct S { order_id: String }
        })
        .unwrap_err();
        assert!(errors[0].contains("did you mean `/orderId`?"), "{errors:?}");
    }

    #[test]
    fn syntax_errors_do_not_cascade_into_missing_key_errors() {
        let errors = run(parse_quote! {
            #[cosmos(databse = "d", container = "c", lease = "l")]
            #[partition_key(path = "/k")]
            struct S { k: String }
        })
        .unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("Did you mean `database`?"), "{errors:?}");
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("orderid", "orderid"), 0);
        assert_eq!(edit_distance("orderld", "orderid"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
