//! The struct-level `#[partition_key(path = ...)]` rules, and [`partition_key`], the list that
//! runs every partition-key rule: one to three paths are declared, none twice, and each path is
//! well formed (not empty, starting with `/`, no empty segment) and not rooted at a field chatter
//! writes on its documents ([`RESERVED_ROOTS`]). They belong together because they judge the
//! declared paths on their own; which field supplies each path is for the field markers'
//! ([`super::markers`]) and the serialized form's ([`super::serialized`]) rules, run from here.

use darling::util::SpannedValue;

use super::super::attr::Command;
use super::super::ctxt::Ctxt;
use super::markers::field_markers;
use super::serialized::{path_source, supplying_field_is_serialized};

/// Root fields chatter writes on its documents: a partition-key path rooted at
/// one of them would overwrite a required field. `status` and `ttl` are patched by the relay.
/// The runtime's lists are the source (this crate cannot import them): the compile-fail case
/// `ui-tests/tests/ui/fail/path-reserved-roots.rs` names each of these, and a test in
/// `tests/tests/relay_contract.rs` holds that case to the runtime's lists.
pub(super) const RESERVED_ROOTS: &[&str] = &[
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

/// The partition-key part of [`Checked`](super::Checked), one entry per path in all three.
#[derive(Debug, Default)]
pub(super) struct PartitionKey {
    pub(super) paths: Vec<String>,
    pub(super) sources: Vec<String>,
    pub(super) fields: Vec<String>,
}

/// The partition-key rules: the paths, where each value is read from, and which field supplies it.
pub(super) fn partition_key(cx: &Ctxt, cmd: &Command) -> PartitionKey {
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
