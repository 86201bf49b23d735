//! The field-level `#[partition_key]` rules: each marker names one of the command's listed paths
//! (or leaves it out when there is only one), and no path is supplied by two fields. They belong
//! together because they build one table, [`Markers`], of which field supplies which path, that
//! the serialized form's rules then read.

use darling::util::SpannedValue;

use super::super::attr::{Attr, Command, Field, FieldPartitionKeyArgs};
use super::super::ctxt::Ctxt;

/// Which field supplies which path through a field-level `#[partition_key]`.
pub(super) struct Markers<'a> {
    pub(super) supplied: Vec<(&'a str, &'a Field)>,
    /// A marker that was itself in error may have been meant for any path: then a path that names
    /// no field is not worth a second error.
    pub(super) failed: bool,
}

/// The field-level `#[partition_key]` markers: each names one of the listed paths (it may leave
/// the path out when there is only one), and no path is supplied by two fields.
pub(super) fn field_markers<'a>(
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
