//! The reserved-id peek guard of the public staging surface (catalog 2.2, R2.30–R2.49).
//!
//! An application stages a create payload as bytes; the guard reads the top-level `id` the store
//! will persist and rejects it when it is in the reserved namespace (`outbox:`/`inbox:`).
//!
//! Exactly as the C# scanner (`Utf8JsonReader`, default options) judges a payload:
//! - a leading UTF-8 BOM is skipped;
//! - the payload must be ONE well-formed JSON object, optionally followed by whitespace; anything
//!   else (empty, non-object, malformed, trailing content) is idless and passes;
//! - only properties of the root object count; the LAST `id` wins, and a non-string last `id`
//!   makes the payload idless;
//! - escapes in names and values are decoded before the prefix test;
//! - nesting deeper than 64 containers is malformed (the reader's default `MaxDepth`), hence
//!   idless; there is no size limit.
//!
//! The stream-specific rows (R2.33, R2.42–R2.44, R2.47–R2.49: seekability, position restore,
//! lying `Length`, short reads) do not apply to a byte slice; the caller owns the bytes it hands on.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{DocumentError, is_reserved_id};

/// The deepest container nesting the C# reader accepts (`JsonReaderOptions.MaxDepth` default).
const MAX_DEPTH: usize = 64;

const UTF8_BOM: &[u8] = &[0xEF, 0xBB, 0xBF];

/// The string value of the payload's top-level `id`, judged as the store would persist it (see
/// the module docs); `None` for an idless payload.
pub fn top_level_string_id(payload: &[u8]) -> Option<String> {
    let bytes = payload.strip_prefix(UTF8_BOM).unwrap_or(payload);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let id = RootObject.deserialize(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    id
}

/// Rejects a payload whose top-level `id` is in the reserved namespace.
///
/// # Errors
/// [`DocumentError::ReservedId`] naming the id.
pub fn check_not_reserved(payload: &[u8]) -> Result<(), DocumentError> {
    match top_level_string_id(payload) {
        Some(id) if is_reserved_id(&id) => Err(DocumentError::ReservedId { id }),
        _ => Ok(()),
    }
}

/// The root: must be an object; yields its last `id` when that is a string.
struct RootObject;

impl<'de> DeserializeSeed<'de> for RootObject {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RootObject {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut id = None;
        while let Some(is_id) = map.next_key_seed(IsIdKey)? {
            if is_id {
                id = map.next_value_seed(IdValue)?;
            } else {
                map.next_value_seed(Skip { depth: 2 })?;
            }
        }
        Ok(id)
    }
}

/// A property name: whether it is (after unescaping) exactly `id`.
struct IsIdKey;

impl<'de> DeserializeSeed<'de> for IsIdKey {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for IsIdKey {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a property name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<bool, E> {
        Ok(name == "id")
    }
}

/// The value of a top-level `id`: the string, or `None` for any other kind (still validated).
struct IdValue;

impl<'de> DeserializeSeed<'de> for IdValue {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IdValue {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, id: &str) -> Result<Self::Value, E> {
        Ok(Some(id.to_owned()))
    }

    fn visit_string<E: de::Error>(self, id: String) -> Result<Self::Value, E> {
        Ok(Some(id))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Skip { depth: 2 }.visit_map(map).map(|_| None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Skip { depth: 2 }.visit_seq(seq).map(|_| None)
    }
}

/// Validates and discards a value; `depth` is the nesting level a container here would open.
#[derive(Clone, Copy)]
struct Skip {
    depth: usize,
}

impl Skip {
    fn enter<E: de::Error>(self) -> Result<Skip, E> {
        if self.depth > MAX_DEPTH {
            return Err(E::custom("the payload nests deeper than 64 levels"));
        }
        Ok(Skip {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.enter()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.enter()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::inbox_id;

    fn rejected(payload: &[u8]) -> bool {
        matches!(
            check_not_reserved(payload),
            Err(DocumentError::ReservedId { .. })
        )
    }

    // R2.30
    #[test]
    fn reserved_top_level_id_is_rejected_with_the_catalog_text() {
        let id = inbox_id("msg-1").unwrap();
        let err = check_not_reserved(format!(r#"{{"id":"{id}"}}"#).as_bytes()).unwrap_err();
        assert_eq!(err, DocumentError::ReservedId { id: id.clone() });
        assert_eq!(
            err.to_string(),
            format!(
                "The item id '{id}' is in the Chatter-reserved id namespace ('outbox:'/'inbox:'). Application \
                 documents must not author reserved-prefix ids through the public staging surface; the framework \
                 owns this namespace (defense-in-depth — the marker-409 duplicate decision is confirmed against the \
                 conflicting doc, not inferred from the reserved namespace)."
            )
        );
        assert!(rejected(br#"{"id":"outbox:abc"}"#));
    }

    // R2.31
    #[test]
    fn application_id_is_accepted() {
        assert_eq!(
            top_level_string_id(br#"{"id":"order:abc","value":1}"#).as_deref(),
            Some("order:abc")
        );
        assert!(check_not_reserved(br#"{"id":"order:abc","value":1}"#).is_ok());
    }

    // R2.32
    #[test]
    fn idless_payloads_are_accepted() {
        for payload in [
            &br#""""#[..],
            b"{}",
            b"[1,2,3]",
            br#""just-a-string""#,
            b"not-json-at-all",
            b"",
            b"   ",
        ] {
            assert_eq!(top_level_string_id(payload), None);
            assert!(check_not_reserved(payload).is_ok());
        }
        assert!(check_not_reserved(br#"["inbox:x"]"#).is_ok());
        assert!(check_not_reserved(br#""inbox:x""#).is_ok());
    }

    // R2.34
    #[test]
    fn a_leading_bom_is_skipped_before_the_peek() {
        assert!(rejected(b"\xEF\xBB\xBF{\"id\":\"inbox:x\"}"));
        assert!(check_not_reserved(b"\xEF\xBB\xBF").is_ok());
        // Only one leading BOM is skipped: a second one is not JSON.
        assert!(check_not_reserved(b"\xEF\xBB\xBF\xEF\xBB\xBF{\"id\":\"inbox:x\"}").is_ok());
    }

    // R2.35, R2.36
    #[test]
    fn the_last_top_level_duplicate_id_wins() {
        assert!(rejected(br#"{"id":123,"id":"inbox:x"}"#));
        assert!(check_not_reserved(br#"{"id":"inbox:x","id":"safe"}"#).is_ok());
        assert!(check_not_reserved(br#"{"id":"inbox:x","id":123}"#).is_ok());
        assert!(rejected(br#"{"id":"safe","a":1,"id":"outbox:y"}"#));
    }

    // R2.37
    #[test]
    fn only_string_ids_can_be_reserved() {
        for payload in [
            &br#"{"id":1}"#[..],
            br#"{"id":null}"#,
            br#"{"id":true}"#,
            br#"{"id":{"id":"inbox:x"}}"#,
            br#"{"id":["inbox:x"]}"#,
        ] {
            assert_eq!(top_level_string_id(payload), None);
            assert!(check_not_reserved(payload).is_ok());
        }
    }

    // R2.38
    #[test]
    fn malformed_payload_is_idless() {
        for payload in [
            &br#"{"id":"inbox:x","a":"#[..],
            br#"{"id":"inbox:x""#,
            br#"{"id":"inbox:x",}"#,
        ] {
            assert!(check_not_reserved(payload).is_ok());
        }
    }

    // R2.39
    #[test]
    fn trailing_content_makes_the_whole_payload_idless() {
        for payload in [
            &br#"{"id":"inbox:x"} junk"#[..],
            br#"{"id":"inbox:x"} 123"#,
            br#"{"id":"inbox:x"}{"id":"safe"}"#,
            br#"{"id":"inbox:x"}}"#,
        ] {
            assert!(check_not_reserved(payload).is_ok());
        }
    }

    // R2.40
    #[test]
    fn trailing_whitespace_still_parses() {
        assert!(rejected(b"{\"id\":\"inbox:x\"}  \r\n\t "));
        assert!(rejected(b" \n{ \"id\" : \"inbox:x\" }"));
    }

    // R2.41
    #[test]
    fn escapes_are_decoded_before_the_prefix_test() {
        assert!(rejected(br#"{"\u0069d":"inbox:x"}"#));
        assert!(rejected(br#"{"id":"\u0069nbox:x"}"#));
        assert_eq!(
            top_level_string_id(br#"{"id":"a\"b\\c\u00e9"}"#).as_deref(),
            Some("a\"b\\c\u{e9}")
        );
    }

    // R2.45
    #[test]
    fn a_large_payload_has_no_size_cut_off() {
        let filler: Vec<String> = (0..20_000)
            .map(|i| format!(r#"{{"k":{i},"v":["x",{{"y":"zzzz"}}]}}"#))
            .collect();
        let payload = format!(
            r#"{{"aggregate":{{"items":[{}]}},"id":"inbox:trailing"}}"#,
            filler.join(",")
        );
        assert!(payload.len() > 256 * 1024);
        assert!(rejected(payload.as_bytes()));
    }

    // R2.46
    #[test]
    fn only_the_top_level_id_counts() {
        for payload in [
            &br#"{"user":{"id":"inbox:x"}}"#[..],
            br#"{"items":[{"id":"inbox:x"}]}"#,
            br#"{"user":{"id":"inbox:x"},"id":"safe"}"#,
            br#"{"id":"safe","user":{"id":"outbox:x"}}"#,
        ] {
            assert!(check_not_reserved(payload).is_ok());
        }
    }

    #[test]
    fn id_names_match_exactly() {
        for payload in [
            &br#"{"Id":"inbox:x"}"#[..],
            br#"{"ID":"inbox:x"}"#,
            br#"{"id ":"inbox:x"}"#,
        ] {
            assert!(check_not_reserved(payload).is_ok());
        }
        assert!(check_not_reserved(br#"{"id":"Inbox:x"}"#).is_ok());
        assert!(check_not_reserved(br#"{"id":" inbox:x"}"#).is_ok());
    }

    #[test]
    fn nesting_follows_the_csharp_reader_depth_limit() {
        let nested = |levels: usize| {
            // `levels` containers in all, the root object included.
            format!(
                r#"{{"id":"inbox:x","a":{}0{}}}"#,
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            )
        };
        assert!(rejected(nested(64).as_bytes()));
        assert!(check_not_reserved(nested(65).as_bytes()).is_ok());
        // Depth counted inside an `id` value too.
        let deep_id = format!(r#"{{"id":{}0{},"x":1}}"#, "[".repeat(64), "]".repeat(64));
        assert_eq!(top_level_string_id(deep_id.as_bytes()), None);
    }

    #[test]
    fn invalid_utf8_is_idless() {
        assert!(check_not_reserved(b"{\"id\":\"inbox:\xFF\"}").is_ok());
    }
}
