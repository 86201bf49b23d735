//! Partition-key stamping: partition values written at the container's real path(s) (catalog 0,
//! R2.62–R2.68, R2.89–R2.92).
//!
//! A path such as `/tenant/id` becomes nested objects (`{"tenant":{"id":..}}`); a hierarchical key
//! stamps one leaf per path. Values keep their JSON kind (a number stays a number). There is never
//! a fixed `partitionKey` field.

use serde_json::{Map, Value};

use super::DocumentError;

/// The property names of a partition-key path: `/tenant/id` -> `["tenant", "id"]`.
///
/// Like the C# `Split('/', RemoveEmptyEntries)`, the leading `/` is optional and empty segments
/// (`//`) are skipped.
pub fn path_segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|segment| !segment.is_empty())
}

/// The first property name of a partition-key path: `/tenant/id` -> `tenant`.
///
/// # Errors
/// [`DocumentError::EmptyPartitionKeyPath`] when the path names no property (`""`, `/`).
pub fn root_segment(path: &str) -> Result<&str, DocumentError> {
    path_segments(path)
        .next()
        .ok_or_else(|| DocumentError::EmptyPartitionKeyPath {
            path: path.to_owned(),
        })
}

/// Checks that a resolved partition key has one value per declared path (R2.92).
///
/// # Errors
/// [`DocumentError::PartitionKeyArityMismatch`] naming both counts.
pub fn ensure_partition_key_arity(
    value_count: usize,
    path_count: usize,
) -> Result<(), DocumentError> {
    if value_count != path_count {
        return Err(DocumentError::PartitionKeyArityMismatch {
            values: value_count,
            segments: path_count,
        });
    }
    Ok(())
}

/// Writes `values[i]` at `paths[i]` into `doc`, creating the intermediate objects.
///
/// Every path is validated before anything is written, so on error `doc` is untouched. An
/// intermediate that exists but is not an object is replaced by an object (as the C# does).
///
/// # Errors
/// [`DocumentError::MissingPartitionKeyPath`] for no paths, [`DocumentError::PartitionKeyCountMismatch`]
/// when the counts differ, [`DocumentError::EmptyPartitionKeyPath`] for a path without a property
/// name, [`DocumentError::ReservedPartitionKeyPath`] for a path whose root segment is one of
/// `reserved_roots`.
pub fn stamp_partition_key(
    doc: &mut Map<String, Value>,
    paths: &[impl AsRef<str>],
    values: &[Value],
    reserved_roots: &[&str],
) -> Result<(), DocumentError> {
    if paths.is_empty() {
        return Err(DocumentError::MissingPartitionKeyPath);
    }
    if values.len() != paths.len() {
        return Err(DocumentError::PartitionKeyCountMismatch {
            expected: paths.len(),
            actual: values.len(),
        });
    }
    for path in paths {
        let path = path.as_ref();
        let root = root_segment(path)?;
        if reserved_roots.contains(&root) {
            return Err(DocumentError::ReservedPartitionKeyPath {
                path: path.to_owned(),
                root: root.to_owned(),
                reserved: reserved_roots.iter().map(|r| (*r).to_owned()).collect(),
            });
        }
    }
    for (path, value) in paths.iter().zip(values) {
        let segments: Vec<&str> = path_segments(path.as_ref()).collect();
        // A fresh clone per document: stamping two documents from one value list shares nothing (R2.89).
        insert_at(doc, &segments, value.clone());
    }
    Ok(())
}

/// Inserts `value` under `segments`, creating (or replacing non-object) intermediates.
fn insert_at(map: &mut Map<String, Value>, segments: &[&str], value: Value) {
    match segments {
        [] => {}
        [leaf] => {
            map.insert((*leaf).to_owned(), value);
        }
        [parent, rest @ ..] => {
            let slot = map
                .entry(*parent)
                .or_insert_with(|| Value::Object(Map::new()));
            if !slot.is_object() {
                *slot = Value::Object(Map::new());
            }
            if let Value::Object(child) = slot {
                insert_at(child, rest, value);
            }
        }
    }
}

/// Reads the partition values back out of a stored document, one per path, in path order: what
/// the relay keys its patch with (R3.31).
///
/// `None` when there are no paths, a path names no property, or a path is missing from the
/// document (including a path running through a non-object).
pub fn values_at_paths(doc: &Value, paths: &[impl AsRef<str>]) -> Option<Vec<Value>> {
    if paths.is_empty() {
        return None;
    }
    paths
        .iter()
        .map(|path| {
            let mut segments = path_segments(path.as_ref()).peekable();
            segments.peek()?;
            segments
                .try_fold(doc, |node, segment| node.as_object()?.get(segment))
                .cloned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const RESERVED: &[&str] = &["id", "_chatterType", "status"];

    fn stamped(paths: &[&str], values: &[Value]) -> Result<Value, DocumentError> {
        let mut doc = Map::new();
        doc.insert("id".into(), json!("x"));
        stamp_partition_key(&mut doc, paths, values, RESERVED).map(|()| Value::Object(doc))
    }

    // R2.62
    #[test]
    fn single_path_stamps_a_top_level_leaf_and_no_partition_key_field() {
        let doc = stamped(&["/tenantId"], &[json!("tenant-1")]).unwrap();
        assert_eq!(doc, json!({"id": "x", "tenantId": "tenant-1"}));
        assert!(doc.get("partitionKey").is_none());
    }

    // R2.63, R2.04
    #[test]
    fn hierarchical_paths_stamp_nested_objects_one_leaf_each() {
        let doc = stamped(
            &["/tenant/id", "/region"],
            &[json!("acme"), json!("us-east")],
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"id": "x", "tenant": {"id": "acme"}, "region": "us-east"})
        );
        assert_eq!(
            crate::document::to_json_string(&doc),
            r#"{"id":"x","tenant":{"id":"acme"},"region":"us-east"}"#
        );
    }

    #[test]
    fn paths_sharing_a_parent_share_one_nested_object() {
        let doc = stamped(&["/a/b", "/a/c"], &[json!(1), json!(2)]).unwrap();
        assert_eq!(doc, json!({"id": "x", "a": {"b": 1, "c": 2}}));
    }

    // R2.67
    #[test]
    fn values_keep_their_json_kind() {
        assert_eq!(stamped(&["/pk"], &[json!(42)]).unwrap()["pk"], json!(42));
        assert_eq!(
            stamped(&["/pk"], &[json!(true)]).unwrap()["pk"],
            json!(true)
        );
        assert_eq!(
            stamped(&["/pk"], &[Value::Null]).unwrap()["pk"],
            Value::Null
        );
        assert!(
            stamped(&["/pk"], &[Value::Null])
                .unwrap()
                .as_object()
                .unwrap()
                .contains_key("pk")
        );
        let doc = stamped(&["/tenant/id", "/n"], &[json!("acme"), json!(7)]).unwrap();
        assert_eq!(doc["tenant"]["id"], json!("acme"));
        assert_eq!(doc["n"], json!(7));
        assert!(doc["n"].is_number());
    }

    #[test]
    fn leading_slash_is_optional_and_empty_segments_are_skipped() {
        assert_eq!(
            stamped(&["tenant/id"], &[json!("a")]).unwrap()["tenant"]["id"],
            json!("a")
        );
        assert_eq!(
            stamped(&["//tenant//id/"], &[json!("a")]).unwrap()["tenant"]["id"],
            json!("a")
        );
    }

    // R2.91
    #[test]
    fn empty_path_list_is_rejected_with_the_catalog_text() {
        let err = stamped(&[], &[]).unwrap_err();
        assert_eq!(err, DocumentError::MissingPartitionKeyPath);
        assert_eq!(
            err.to_string(),
            "A container partition-key path is required to stamp the document."
        );
    }

    // R2.91
    #[test]
    fn value_count_mismatch_is_rejected_with_the_catalog_text() {
        let err = stamped(&["/a", "/b"], &[json!(1)]).unwrap_err();
        assert_eq!(
            err,
            DocumentError::PartitionKeyCountMismatch {
                expected: 2,
                actual: 1
            }
        );
        assert_eq!(
            err.to_string(),
            "Expected '2' partition-key value(s) to match the path segment count but got '1'."
        );
    }

    #[test]
    fn path_without_a_property_name_is_rejected() {
        for path in ["", "/", "//"] {
            assert_eq!(
                stamped(&[path], &[json!(1)]).unwrap_err(),
                DocumentError::EmptyPartitionKeyPath {
                    path: path.to_owned()
                }
            );
        }
    }

    // R2.68 (the reserved set itself is the caller's; see outbox/inbox_marker tests)
    #[test]
    fn reserved_root_is_rejected_naming_path_root_and_reserved_list() {
        let err = stamped(&["/region", "/status/nested"], &[json!(1), json!(2)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "The container partition-key path '/status/nested' targets the Chatter-reserved field 'status'. \
             A co-resident document cannot be stamped on a partition-key path whose root segment is one of \
             [id, _chatterType, status] without overwriting a required field. \
             Use a non-reserved partition-key path for the container."
        );
    }

    #[test]
    fn a_rejected_stamp_leaves_the_document_untouched() {
        let mut doc = Map::new();
        let err = stamp_partition_key(
            &mut doc,
            &["/region", "/id"],
            &[json!("r"), json!("i")],
            RESERVED,
        );
        assert!(err.is_err());
        assert!(doc.is_empty());
    }

    #[test]
    fn reserved_match_is_ordinal_on_the_root_segment_only() {
        assert!(stamped(&["/Status"], &[json!(1)]).is_ok());
        assert!(stamped(&["/tenant/status"], &[json!(1)]).is_ok());
        assert!(stamped(&["/ids"], &[json!(1)]).is_ok());
    }

    #[test]
    fn non_object_intermediate_is_replaced_by_an_object() {
        let doc = stamped(&["/a", "/a/b"], &[json!("scalar"), json!(1)]).unwrap();
        assert_eq!(doc["a"], json!({"b": 1}));
    }

    // R2.89, R2.69
    #[test]
    fn one_value_list_stamps_many_documents_independently() {
        let values = vec![json!("acme"), json!(7)];
        let paths = ["/tenant/id", "/n"];
        let mut first = Map::new();
        let mut second = Map::new();
        stamp_partition_key(&mut first, &paths, &values, RESERVED).unwrap();
        stamp_partition_key(&mut second, &paths, &values, RESERVED).unwrap();
        assert_eq!(first, second);
        assert_eq!(Value::Object(first)["tenant"]["id"], json!("acme"));
    }

    #[test]
    fn paths_may_be_owned_strings() {
        let paths = vec!["/tenantId".to_owned()];
        let mut doc = Map::new();
        stamp_partition_key(&mut doc, &paths, &[json!("t")], &[]).unwrap();
        assert_eq!(
            values_at_paths(&Value::Object(doc), &paths),
            Some(vec![json!("t")])
        );
    }

    // R3.31 (relay rebuilds the key from the document at the declared paths)
    #[test]
    fn values_are_read_back_at_the_declared_paths_in_order() {
        let doc = json!({"tenant": {"id": "acme"}, "region": "us-east", "n": 0, "z": null});
        assert_eq!(
            values_at_paths(&doc, &["/region", "/tenant/id"]),
            Some(vec![json!("us-east"), json!("acme")])
        );
        assert_eq!(
            values_at_paths(&doc, &["/n", "/z"]),
            Some(vec![json!(0), Value::Null])
        );
    }

    #[test]
    fn missing_or_unreachable_paths_read_back_as_none() {
        let doc = json!({"tenant": "flat", "region": "r"});
        assert_eq!(values_at_paths(&doc, &["/tenant/id"]), None);
        assert_eq!(values_at_paths(&doc, &["/region", "/absent"]), None);
        assert_eq!(values_at_paths(&doc, &["/"]), None);
        assert_eq!(values_at_paths(&doc, &[] as &[&str]), None);
        assert_eq!(values_at_paths(&json!([1]), &["/a"]), None);
    }

    // R2.92
    #[test]
    fn resolved_key_arity_mismatch_names_both_counts() {
        assert!(ensure_partition_key_arity(2, 2).is_ok());
        assert_eq!(
            ensure_partition_key_arity(1, 2).unwrap_err().to_string(),
            "The resolved partition key has '1' value(s) but the container partition-key path declares '2' segment(s)."
        );
    }
}
