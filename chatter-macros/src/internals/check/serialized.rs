//! The rules that hold a partition-key path against the command's serialized form, the names
//! serde gives its fields: an unmarked path's root is the serialized name of a field (if not, the
//! closest name is suggested), the field supplying a path is in the JSON (not skipped or
//! flattened by serde), and the value is read through a JSON pointer escaped per RFC 6901. They
//! belong together because each asks what serde writes, not what the Rust struct declares.

use darling::util::SpannedValue;

use super::super::attr::{Command, Field};
use super::super::ctxt::Ctxt;
use super::markers::Markers;

/// Where a path's value is read from (a JSON pointer into the serialized command) and the field
/// that supplies it: a marked field, else the field whose serialized name is the path's root.
pub(super) fn path_source<'a>(
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
pub(super) fn supplying_field_is_serialized(
    cx: &Ctxt,
    field: &Field,
    path: &SpannedValue<String>,
) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("orderid", "orderid"), 0);
        assert_eq!(edit_distance("orderld", "orderid"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
