//! Check: cross-attribute rules on the parsed command, each violation spanned on its token.

use darling::error::Accumulator;
use darling::util::SpannedValue;
use proc_macro2::Span;

use super::attr::{Command, Field};

/// Root fields chatter writes on its documents (catalog section 0): a partition-key path rooted at
/// one of them would overwrite a required field. `status` and `ttl` are patched by the relay.
pub const RESERVED_ROOTS: &[&str] = &[
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

/// A command whose attributes passed every check.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
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
}

fn err(acc: &mut Accumulator, span: Span, message: impl std::fmt::Display) {
    acc.push(syn::Error::new(span, message).into());
}

/// A required, non-blank Cosmos resource name.
fn name(
    acc: &mut Accumulator,
    value: &Option<SpannedValue<String>>,
    key: &str,
    what: &str,
    attr_span: Span,
    parsed: bool,
) -> Option<String> {
    let Some(value) = value else {
        if !parsed {
            return None;
        }
        err(
            acc,
            attr_span,
            format!("`#[cosmos]` is missing `{key} = \"...\"`: {what}"),
        );
        return None;
    };
    non_blank(acc, value, key, "cosmos")
}

/// `max_delivery_attempts = N`: a whole number from 1 to `u32::MAX`.
fn delivery_attempts(acc: &mut Accumulator, lit: &syn::Lit) -> Option<u32> {
    let parsed = match lit {
        syn::Lit::Int(int) => int.base10_parse::<u32>().ok(),
        _ => None,
    };
    match parsed {
        Some(0) => err(
            acc,
            lit.span(),
            "`#[chatter(max_delivery_attempts = ...)]` must be at least 1: the first delivery is an attempt",
        ),
        Some(n) => return Some(n),
        None => err(
            acc,
            lit.span(),
            "`#[chatter(max_delivery_attempts = ...)]` expects a whole number of deliveries, e.g. `max_delivery_attempts = 5`",
        ),
    }
    None
}

fn non_blank(
    acc: &mut Accumulator,
    value: &SpannedValue<String>,
    key: &str,
    attr: &str,
) -> Option<String> {
    if value.trim().is_empty() {
        err(
            acc,
            value.span(),
            format!("`#[{attr}({key} = ...)]` must not be empty or whitespace"),
        );
        return None;
    }
    if let Some(c) = value.chars().find(|c| matches!(c, '/' | '\\' | '?' | '#')) {
        err(
            acc,
            value.span(),
            format!(
                "`#[{attr}({key} = ...)]` contains `{c}`, which Cosmos DB does not allow in a resource name"
            ),
        );
        return None;
    }
    Some(value.as_str().to_owned())
}

/// Checks one partition-key path's syntax; returns its segments.
fn path_segments(acc: &mut Accumulator, path: &SpannedValue<String>) -> Option<Vec<String>> {
    let p = path.as_str();
    if p.trim().is_empty() {
        err(
            acc,
            path.span(),
            "`#[partition_key(path = ...)]` must not be empty: name the container's partition-key path, e.g. `\"/orderId\"`",
        );
        return None;
    }
    if !p.starts_with('/') {
        err(
            acc,
            path.span(),
            format!("`#[partition_key(path = ...)]` must start with `/`: write `\"/{p}\"`"),
        );
        return None;
    }
    let segments: Vec<&str> = p[1..].split('/').collect();
    if segments.iter().any(|s| s.trim().is_empty()) {
        err(
            acc,
            path.span(),
            format!(
                "`#[partition_key(path = \"{p}\")]` has an empty segment: remove the doubled or trailing `/`"
            ),
        );
        return None;
    }
    let root = segments[0];
    if RESERVED_ROOTS.contains(&root) {
        let why = if root == "status" || root == "ttl" {
            "the relay patches `/status` and `/ttl` on every outbox document it delivers"
        } else {
            "chatter writes that field on its outbox documents and inbox markers"
        };
        err(
            acc,
            path.span(),
            format!(
                "`#[partition_key(path = \"{p}\")]` is rooted at `{root}`, a field chatter owns: {why}; partition the container by a field of your own"
            ),
        );
        return None;
    }
    Some(segments.into_iter().map(str::to_owned).collect())
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

/// Checks the whole command; `None` when anything was reported.
pub fn check(cmd: &Command, outer: &mut Accumulator) -> Option<Checked> {
    let mut local = darling::Error::accumulator();
    let checked = check_all(cmd, &mut local);
    let errors = local.into_inner();
    let failed = !errors.is_empty();
    errors.into_iter().for_each(|e| outer.push(e));
    if failed { None } else { checked }
}

fn check_all(cmd: &Command, acc: &mut Accumulator) -> Option<Checked> {
    let ident = &cmd.ident;

    let cosmos = match &cmd.cosmos {
        Some(c) => Some(c),
        None => {
            err(
                acc,
                ident.span(),
                format!(
                    "`{ident}` is missing `#[cosmos(database = \"...\", container = \"...\", lease = \"...\")]`: it names where the command's documents live"
                ),
            );
            None
        }
    };
    let (mut database, mut container, mut lease, mut declared) = (None, None, None, None);
    if let Some(c) = cosmos {
        database = name(
            acc,
            &c.args.database,
            "database",
            "the Cosmos database of the command's container",
            c.span,
            c.parsed,
        );
        container = name(
            acc,
            &c.args.container,
            "container",
            "the container holding the handler's writes and the outbox",
            c.span,
            c.parsed,
        );
        lease = name(
            acc,
            &c.args.lease,
            "lease",
            "the lease container of the change-feed relay",
            c.span,
            c.parsed,
        );
        match (&c.args.monitored_source, &c.args.lease_source) {
            (Some(m), Some(l)) => {
                let m = non_blank(acc, m, "monitored_source", "cosmos");
                let l = non_blank(acc, l, "lease_source", "cosmos");
                declared = m.zip(l);
            }
            (Some(only), None) => err(
                acc,
                only.span(),
                "`monitored_source` needs `lease_source` too: declare both change-feed source identities or neither",
            ),
            (None, Some(only)) => err(
                acc,
                only.span(),
                "`lease_source` needs `monitored_source` too: declare both change-feed source identities or neither",
            ),
            (None, None) => {}
        }
    }

    let mut command_name = Some(ident.to_string());
    let mut destination = None;
    let mut max_delivery_attempts = None;
    if let Some(c) = &cmd.chatter {
        if let Some(n) = &c.args.name {
            command_name = non_blank(acc, n, "name", "chatter");
        }
        if let Some(d) = &c.args.destination {
            destination = non_blank(acc, d, "destination", "chatter");
        }
        if let Some(lit) = &c.args.max_delivery_attempts {
            max_delivery_attempts = delivery_attempts(acc, lit);
        }
    }

    let (paths, sources, source_fields) = check_partition_key(cmd, acc);

    let command_name = command_name?;
    Some(Checked {
        destination: destination.unwrap_or_else(|| command_name.clone()),
        max_delivery_attempts,
        command_name,
        database: database?,
        container: container?,
        lease: lease?,
        declared_source_identity: declared,
        partition_key_paths: paths,
        partition_key_sources: sources,
        partition_key_fields: source_fields,
    })
}

/// The partition-key paths, where each value is read from, and which field supplies it.
fn check_partition_key(
    cmd: &Command,
    acc: &mut Accumulator,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let ident = &cmd.ident;
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    let Some(pk) = &cmd.partition_key else {
        err(
            acc,
            ident.span(),
            format!(
                "`{ident}` is missing `#[partition_key(path = \"/...\")]`: name the container's partition-key path, e.g. `#[partition_key(path = \"/orderId\")]`"
            ),
        );
        return out;
    };
    let paths = &pk.args.path;
    if paths.is_empty() {
        err(
            acc,
            pk.span,
            "`#[partition_key]` needs `path = \"/...\"`, e.g. `#[partition_key(path = \"/orderId\")]`",
        );
        return out;
    }
    if paths.len() > MAX_PARTITION_KEY_PATHS {
        err(
            acc,
            paths[MAX_PARTITION_KEY_PATHS].span(),
            format!(
                "a hierarchical partition key has at most {MAX_PARTITION_KEY_PATHS} paths in Cosmos DB"
            ),
        );
    }
    for (i, path) in paths.iter().enumerate() {
        if paths[..i]
            .iter()
            .any(|earlier| earlier.as_str() == path.as_str())
        {
            err(
                acc,
                path.span(),
                format!("partition-key path `{}` is listed twice", path.as_str()),
            );
        }
    }

    // Which field supplies which path through a field-level `#[partition_key]`.
    let mut marked: Vec<(&str, &Field)> = Vec::new();
    // A field marker that was itself in error may have been meant for any path: then a path that
    // names no field is not worth a second error.
    let mut marker_failed = false;
    for field in &cmd.fields {
        let Some(attr) = &field.partition_key else {
            continue;
        };
        if !attr.parsed {
            marker_failed = true;
            continue;
        }
        let target = match &attr.args.path {
            Some(p) => match paths.iter().find(|q| q.as_str() == p.as_str()) {
                Some(q) => q.as_str(),
                None => {
                    let listed: Vec<&str> = paths.iter().map(|q| q.as_str()).collect();
                    marker_failed = true;
                    err(
                        acc,
                        p.span(),
                        format!(
                            "`{}` is not one of this command's partition-key paths [{}]",
                            p.as_str(),
                            listed.join(", ")
                        ),
                    );
                    continue;
                }
            },
            None if paths.len() == 1 => paths[0].as_str(),
            None => {
                marker_failed = true;
                err(
                    acc,
                    attr.span,
                    "with several partition-key paths, say which one this field supplies: `#[partition_key(path = \"/...\")]`",
                );
                continue;
            }
        };
        if let Some((_, first)) = marked.iter().find(|(t, _)| *t == target) {
            err(
                acc,
                attr.span,
                format!(
                    "partition-key path `{target}` is already supplied by field `{}`",
                    first.ident
                ),
            );
            continue;
        }
        marked.push((target, field));
    }

    for path in paths {
        let Some(segments) = path_segments(acc, path) else {
            continue;
        };
        let (source, field) = match marked.iter().find(|(t, _)| *t == path.as_str()) {
            Some((_, field)) => (
                format!("/{}", pointer_segment(&field.serialized_name)),
                *field,
            ),
            None => {
                let root = &segments[0];
                let Some(field) = cmd.fields.iter().find(|f| &f.serialized_name == root) else {
                    if !cmd.fields.is_empty() && !marker_failed {
                        report_unknown_root(acc, cmd, path, root);
                    }
                    continue;
                };
                let pointer: Vec<String> = segments.iter().map(|s| pointer_segment(s)).collect();
                (format!("/{}", pointer.join("/")), field)
            }
        };
        if field.serde.skipped || field.serde.flatten {
            let why = if field.serde.skipped {
                "skipped by serde"
            } else {
                "flattened by serde"
            };
            err(
                acc,
                field.ident.span(),
                format!(
                    "field `{}` supplies partition-key path `{}` but is {why}, so the value would not be in the command's JSON",
                    field.ident,
                    path.as_str()
                ),
            );
            continue;
        }
        out.0.push(path.as_str().to_owned());
        out.1.push(source);
        out.2.push(field.ident.to_string());
    }
    out
}

fn report_unknown_root(
    acc: &mut Accumulator,
    cmd: &Command,
    path: &SpannedValue<String>,
    root: &str,
) {
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
    err(
        acc,
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

#[cfg(test)]
mod tests {
    use super::*;
    use syn::{DeriveInput, parse_quote};

    fn run(input: DeriveInput) -> Result<Checked, Vec<String>> {
        let mut acc = darling::Error::accumulator();
        let command = super::super::attr::parse(&input, &mut acc);
        let checked = check(&command, &mut acc);
        match acc.finish() {
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
