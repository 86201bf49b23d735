//! Partition keys, in one place: the paths a container is partitioned on, where a command's
//! JSON holds each value, resolving a command's key, stamping it into a document, reading it
//! back out of a stored one, comparing declared paths with a container's, and the SDK key.
//!
//! A path such as `/tenant/id` names a nested property (`{"tenant":{"id":..}}`); a hierarchical
//! key has up to [`MAX_LEVELS`] paths, one value each. Values keep their JSON kind (a number
//! stays a number). There is never a fixed `partitionKey` field.

use azure_data_cosmos::models::{PartitionKey, PartitionKeyValue};
use serde_json::{Map, Value};

/// Why a partition key could not be stamped into a document or built for the SDK.
///
/// The stamping texts are the .NET module's, word for word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PartitionKeyError {
    /// No partition-key path was given to stamp with.
    #[error("A container partition-key path is required to stamp the document.")]
    MissingPartitionKeyPath,

    /// A partition-key path has no property name in it, e.g. `/` or `` (an empty path).
    #[error("A partition-key path segment must contain at least one property name.")]
    EmptyPartitionKeyPath {
        /// The rejected path.
        path: String,
    },

    /// The number of values to stamp differs from the number of partition-key paths.
    #[error(
        "Expected '{expected}' partition-key value(s) to match the path segment count but got '{actual}'."
    )]
    PartitionKeyCountMismatch {
        /// How many paths the container declares.
        expected: usize,
        /// How many values were given.
        actual: usize,
    },

    /// A partition-key path's root segment is a field the document itself needs.
    ///
    /// `reserved` is rendered the way the C# `string.Join(", ", set)` renders its reserved set:
    /// insertion order, e.g. `[id, _chatterType, status, MessageId, ...]`.
    #[error(
        "The container partition-key path '{path}' targets the Chatter-reserved field '{root}'. A co-resident \
         document cannot be stamped on a partition-key path whose root segment is one of [{}] without overwriting \
         a required field. Use a non-reserved partition-key path for the container.",
        reserved.join(", ")
    )]
    ReservedPartitionKeyPath {
        /// The offending path, as given.
        path: String,
        /// Its root segment.
        root: String,
        /// The document's reserved root fields, in declaration order.
        reserved: Vec<String>,
    },

    /// A partition-key value is not a JSON string, number, boolean or null.
    #[error(
        "partition key value {index} is a JSON {kind}; a partition key value must be a string, number, boolean or null"
    )]
    InvalidPartitionKeyValue {
        /// Zero-based position of the value (the hierarchical level).
        index: usize,
        /// The JSON kind found (`array` or `object`).
        kind: &'static str,
    },

    /// A partition key has no value, or more than the three levels Cosmos allows.
    #[error("a partition key needs 1 to 3 values (one per partition-key path), got {count}")]
    PartitionKeyArity {
        /// How many values were given.
        count: usize,
    },

    /// A partition-key number is NaN or infinite.
    #[error("partition key value {index} is not a finite number")]
    NonFinitePartitionKeyNumber {
        /// Zero-based position of the value.
        index: usize,
    },
}

/// The most levels a Cosmos DB partition key has (a hierarchical key of three paths).
pub(crate) const MAX_LEVELS: usize = 3;

/// One level of a command's partition key, as `#[derive(DocumentReliable)]` declares it: the
/// container's partition-key path, and the JSON pointer at which the command's serialized JSON
/// holds that level's value (they differ when serde renames the field or a field is marked
/// `#[partition_key]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartitionKeyPath {
    /// The container's partition-key path, e.g. `/orderId` or `/customer/id`.
    pub path: &'static str,
    /// Where the command's JSON holds the value, e.g. `/orderId`.
    pub pointer: &'static str,
}

impl AsRef<str> for PartitionKeyPath {
    fn as_ref(&self) -> &str {
        self.path
    }
}

/// `[/a, /b]`: paths as messages show them.
pub(crate) fn display(paths: &[impl AsRef<str>]) -> String {
    let joined: Vec<&str> = paths.iter().map(AsRef::as_ref).collect();
    format!("[{}]", joined.join(", "))
}

/// Whether two declarations name the same paths in the same order (pointers may differ: two
/// commands sharing a container can hold the value under different field names).
pub(crate) fn same_paths(first: &[PartitionKeyPath], second: &[PartitionKeyPath]) -> bool {
    first
        .iter()
        .map(|p| p.path)
        .eq(second.iter().map(|p| p.path))
}

/// Resolves a command's partition-key values from its serialized JSON, one per level.
///
/// `None` when a value is absent: the command is then handled without a batch, as a
/// resolver that returns no key.
pub(crate) fn resolve(paths: &[PartitionKeyPath], command: &Value) -> Option<Vec<Value>> {
    paths
        .iter()
        .map(|level| command.pointer(level.pointer).cloned())
        .collect()
}

/// One text per partition-key value, the same for values Cosmos DB holds in one logical
/// partition: the consumer orders deliveries by it.
///
/// Numbers are compared as Cosmos compares them, as 64-bit floats (`1` and `1.0` are one key);
/// every other value by its JSON text. Two keys that are one for Cosmos are always one here;
/// two that differ may rarely be one here too (numbers beyond 2^53), which only orders more.
pub(crate) fn ordering_key(values: &[Value]) -> String {
    let normalized: Vec<Value> = values
        .iter()
        .map(|value| match value {
            Value::Number(number) => number.as_f64().map_or_else(|| value.clone(), Value::from),
            other => other.clone(),
        })
        .collect();
    Value::Array(normalized).to_string()
}

/// The property names of a partition-key path: `/tenant/id` -> `["tenant", "id"]`.
///
/// Like the C# `Split('/', RemoveEmptyEntries)`, the leading `/` is optional and empty segments
/// (`//`) are skipped.
pub(crate) fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|segment| !segment.is_empty())
}

/// The first property name of a partition-key path: `/tenant/id` -> `tenant`.
///
/// # Errors
/// [`PartitionKeyError::EmptyPartitionKeyPath`] when the path names no property (`""`, `/`).
fn root_segment(path: &str) -> Result<&str, PartitionKeyError> {
    segments(path)
        .next()
        .ok_or_else(|| PartitionKeyError::EmptyPartitionKeyPath {
            path: path.to_owned(),
        })
}

/// `/`-split, empty segments dropped, re-joined as `/a/b`; a path with no segment is returned
/// unchanged (so `""` and `"/"` never compare equal to each other).
pub(crate) fn canonical(path: &str) -> String {
    let segments: Vec<&str> = segments(path).collect();
    if segments.is_empty() {
        path.to_owned()
    } else {
        format!("/{}", segments.join("/"))
    }
}

/// Declared and actual paths agree in number and, canonicalized, ordinally in order. A
/// container reporting no path never matches.
pub(crate) fn matches_container(declared: &[impl AsRef<str>], actual: &[String]) -> bool {
    !actual.is_empty()
        && declared.len() == actual.len()
        && declared
            .iter()
            .zip(actual)
            .all(|(d, a)| canonical(d.as_ref()) == canonical(a))
}

/// Writes `values[i]` at `paths[i]` into `doc`, creating the intermediate objects.
///
/// Every path is validated before anything is written, so on error `doc` is untouched. An
/// intermediate that exists but is not an object is replaced by an object (as the C# does).
///
/// # Errors
/// [`PartitionKeyError::MissingPartitionKeyPath`] for no paths, [`PartitionKeyError::PartitionKeyCountMismatch`]
/// when the counts differ, [`PartitionKeyError::EmptyPartitionKeyPath`] for a path without a property
/// name, [`PartitionKeyError::ReservedPartitionKeyPath`] for a path whose root segment is one of
/// `reserved_roots`.
pub(crate) fn stamp(
    doc: &mut Map<String, Value>,
    paths: &[impl AsRef<str>],
    values: &[Value],
    reserved_roots: &[&str],
) -> Result<(), PartitionKeyError> {
    if paths.is_empty() {
        return Err(PartitionKeyError::MissingPartitionKeyPath);
    }
    if values.len() != paths.len() {
        return Err(PartitionKeyError::PartitionKeyCountMismatch {
            expected: paths.len(),
            actual: values.len(),
        });
    }
    for path in paths {
        let path = path.as_ref();
        let root = root_segment(path)?;
        if reserved_roots.contains(&root) {
            return Err(PartitionKeyError::ReservedPartitionKeyPath {
                path: path.to_owned(),
                root: root.to_owned(),
                reserved: reserved_roots.iter().map(|r| (*r).to_owned()).collect(),
            });
        }
    }
    for (path, value) in paths.iter().zip(values) {
        let segments: Vec<&str> = segments(path.as_ref()).collect();
        // A fresh clone per document: stamping two documents from one value list shares nothing.
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

/// Reads the partition values back out of a stored document, one per path, in path order.
///
/// `None` when there are no paths, a path names no property, or a path is missing from the
/// document (including a path running through a non-object).
pub(crate) fn read_back(doc: &Value, paths: &[impl AsRef<str>]) -> Option<Vec<Value>> {
    if paths.is_empty() {
        return None;
    }
    paths
        .iter()
        .map(|path| read_one(doc, path.as_ref()))
        .collect()
}

/// Like [`read_back`], but a level missing from the document is a JSON `null`: how Cosmos DB
/// itself keys a document without that property, so a patch keyed this way finds it.
pub(crate) fn read_back_or_null(doc: &Value, paths: &[impl AsRef<str>]) -> Vec<Value> {
    paths
        .iter()
        .map(|path| read_one(doc, path.as_ref()).unwrap_or(Value::Null))
        .collect()
}

fn read_one(doc: &Value, path: &str) -> Option<Value> {
    let mut segments = segments(path).peekable();
    segments.peek()?;
    segments
        .try_fold(doc, |node, segment| node.as_object()?.get(segment))
        .cloned()
}

/// Whether `count` paths (or values) make a partition key Cosmos DB can have: 1 to
/// [`MAX_LEVELS`].
///
/// # Errors
/// [`PartitionKeyError::PartitionKeyArity`] naming the count.
pub(crate) fn check_levels(count: usize) -> Result<(), PartitionKeyError> {
    if count == 0 || count > MAX_LEVELS {
        return Err(PartitionKeyError::PartitionKeyArity { count });
    }
    Ok(())
}

/// Builds the SDK's partition key from the JSON values found at a container's partition-key
/// paths, in path order: one value for a single path, two or three for a hierarchical key.
///
/// Strings, numbers, booleans and `null` keep their JSON kind; arrays and objects are errors.
///
/// # Errors
/// [`PartitionKeyError::PartitionKeyArity`], [`PartitionKeyError::InvalidPartitionKeyValue`],
/// [`PartitionKeyError::NonFinitePartitionKeyNumber`].
pub fn sdk_key(values: &[Value]) -> Result<PartitionKey, PartitionKeyError> {
    check_levels(values.len())?;
    let components = values
        .iter()
        .enumerate()
        .map(|(index, value)| sdk_value(index, value))
        .collect::<Result<Vec<_>, _>>()?;
    PartitionKey::try_from(components).map_err(|_| PartitionKeyError::PartitionKeyArity {
        count: values.len(),
    })
}

fn sdk_value(index: usize, value: &Value) -> Result<PartitionKeyValue, PartitionKeyError> {
    match value {
        Value::String(text) => Ok(PartitionKeyValue::from(text.clone())),
        Value::Bool(flag) => Ok(PartitionKeyValue::from(*flag)),
        Value::Null => Ok(PartitionKeyValue::NULL),
        Value::Number(number) => number
            .as_f64()
            .and_then(|n| PartitionKeyValue::try_from(n).ok())
            .ok_or(PartitionKeyError::NonFinitePartitionKeyNumber { index }),
        Value::Array(_) => Err(PartitionKeyError::InvalidPartitionKeyValue {
            index,
            kind: "array",
        }),
        Value::Object(_) => Err(PartitionKeyError::InvalidPartitionKeyValue {
            index,
            kind: "object",
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const RESERVED: &[&str] = &["id", "_chatterType", "status"];

    fn stamped(paths: &[&str], values: &[Value]) -> Result<Value, PartitionKeyError> {
        let mut doc = Map::new();
        doc.insert("id".into(), json!("x"));
        stamp(&mut doc, paths, values, RESERVED).map(|()| Value::Object(doc))
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
        assert_eq!(err, PartitionKeyError::MissingPartitionKeyPath);
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
            PartitionKeyError::PartitionKeyCountMismatch {
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
                PartitionKeyError::EmptyPartitionKeyPath {
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
        let err = stamp(
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
        stamp(&mut first, &paths, &values, RESERVED).unwrap();
        stamp(&mut second, &paths, &values, RESERVED).unwrap();
        assert_eq!(first, second);
        assert_eq!(Value::Object(first)["tenant"]["id"], json!("acme"));
    }

    #[test]
    fn paths_may_be_owned_strings() {
        let paths = vec!["/tenantId".to_owned()];
        let mut doc = Map::new();
        stamp(&mut doc, &paths, &[json!("t")], &[]).unwrap();
        assert_eq!(
            read_back(&Value::Object(doc), &paths),
            Some(vec![json!("t")])
        );
    }

    // R3.31 (relay rebuilds the key from the document at the declared paths)
    #[test]
    fn values_are_read_back_at_the_declared_paths_in_order() {
        let doc = json!({"tenant": {"id": "acme"}, "region": "us-east", "n": 0, "z": null});
        assert_eq!(
            read_back(&doc, &["/region", "/tenant/id"]),
            Some(vec![json!("us-east"), json!("acme")])
        );
        assert_eq!(
            read_back(&doc, &["/n", "/z"]),
            Some(vec![json!(0), Value::Null])
        );
    }

    #[test]
    fn missing_or_unreachable_paths_read_back_as_none() {
        let doc = json!({"tenant": "flat", "region": "r"});
        assert_eq!(read_back(&doc, &["/tenant/id"]), None);
        assert_eq!(read_back(&doc, &["/region", "/absent"]), None);
        assert_eq!(read_back(&doc, &["/"]), None);
        assert_eq!(read_back(&doc, &[] as &[&str]), None);
        assert_eq!(read_back(&json!([1]), &["/a"]), None);
    }

    const ORDER: PartitionKeyPath = PartitionKeyPath {
        path: "/orderId",
        pointer: "/order_id",
    };
    const REGION: PartitionKeyPath = PartitionKeyPath {
        path: "/region",
        pointer: "/where/region",
    };

    #[test]
    fn a_key_resolves_from_each_levels_pointer_not_its_path() {
        let command = json!({"order_id": "o-1", "where": {"region": "eu"}, "orderId": "wrong"});
        assert_eq!(
            resolve(&[ORDER, REGION], &command),
            Some(vec![json!("o-1"), json!("eu")])
        );
        assert_eq!(resolve(&[ORDER, REGION], &json!({"order_id": "o-1"})), None);
    }

    #[test]
    fn declarations_are_the_same_when_their_paths_are_whatever_their_pointers() {
        let renamed = PartitionKeyPath {
            path: "/orderId",
            pointer: "/id_of_order",
        };
        assert!(same_paths(&[ORDER], &[renamed]));
        assert!(!same_paths(&[ORDER], &[ORDER, REGION]));
        assert!(!same_paths(&[ORDER, REGION], &[REGION, ORDER]));
        assert_eq!(display(&[ORDER, REGION]), "[/orderId, /region]");
    }

    #[test]
    fn ordering_keys_are_one_exactly_when_cosmos_sees_one_value() {
        let key = |values: &[Value]| ordering_key(values);
        assert_eq!(key(&[json!(1)]), key(&[json!(1.0)]));
        assert_eq!(key(&[json!("a"), json!(2)]), key(&[json!("a"), json!(2.0)]));
        assert_ne!(key(&[json!("1")]), key(&[json!(1)]));
        assert_ne!(
            key(&[json!("a"), json!("b")]),
            key(&[json!("b"), json!("a")])
        );
        assert_ne!(key(&[json!("a,b")]), key(&[json!("a"), json!("b")]));
        assert_ne!(key(&[Value::Null]), key(&[json!("null")]));
        assert_ne!(key(&[json!(true)]), key(&[json!("true")]));
    }

    #[test]
    fn a_missing_level_reads_back_as_null_for_the_patch_key() {
        let doc = json!({"orderId": "o-1"});
        assert_eq!(
            read_back_or_null(&doc, &["/orderId", "/region"]),
            vec![json!("o-1"), Value::Null]
        );
    }

    #[test]
    fn one_to_three_levels_make_a_key() {
        assert!(check_levels(0).is_err());
        assert!((1..=MAX_LEVELS).all(|n| check_levels(n).is_ok()));
        assert!(check_levels(MAX_LEVELS + 1).is_err());
    }

    #[test]
    fn canonicalization_drops_empty_segments_and_keeps_segmentless_paths() {
        assert_eq!(canonical("tenantId"), "/tenantId");
        assert_eq!(canonical("//tenantId/"), "/tenantId");
        assert_eq!(canonical("/a//b"), "/a/b");
        assert_eq!(canonical(""), "");
        assert_eq!(canonical("/"), "/");
        assert_eq!(canonical("//"), "//");
    }

    #[test]
    fn partition_keys_accept_scalars_and_up_to_three_levels() {
        assert_eq!(sdk_key(&[json!("a")]).unwrap().len(), 1);
        assert_eq!(
            sdk_key(&[json!(1), json!(true), json!(null)])
                .unwrap()
                .len(),
            3
        );
        assert!(sdk_key(&[json!(1.5)]).is_ok());
    }

    #[test]
    fn partition_keys_reject_arrays_objects_and_bad_arity() {
        let err = sdk_key(&[json!("a"), json!([1])]).unwrap_err();
        assert!(
            matches!(
                err,
                PartitionKeyError::InvalidPartitionKeyValue {
                    index: 1,
                    kind: "array"
                }
            ),
            "{err}"
        );
        assert!(matches!(
            sdk_key(&[json!({})]).unwrap_err(),
            PartitionKeyError::InvalidPartitionKeyValue {
                index: 0,
                kind: "object"
            }
        ));
        assert!(matches!(
            sdk_key(&[]).unwrap_err(),
            PartitionKeyError::PartitionKeyArity { count: 0 }
        ));
        assert!(matches!(
            sdk_key(&[json!(1), json!(2), json!(3), json!(4)]).unwrap_err(),
            PartitionKeyError::PartitionKeyArity { count: 4 }
        ));
    }
}
