//! Cosmos item ids Chatter mints for its own documents.
//!
//! A raw message id may carry characters Cosmos forbids in an item id (`/`, `\`, `?`, `#`), so the
//! id segment is the unpadded base64url of the message id's UTF-8 bytes; the raw id is stored
//! verbatim in a separate `MessageId` field.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::DocumentError;

/// The discriminator value and id prefix of Outbox Documents.
pub(crate) const OUTBOX_KIND: &str = "outbox";

/// The discriminator value and id prefix of Inbox Markers.
pub(crate) const INBOX_KIND: &str = "inbox";

/// The Chatter-reserved id prefixes, derived from the kinds.
pub(crate) const RESERVED_ID_PREFIXES: [&str; 2] = ["outbox:", "inbox:"];

/// Cosmos DB's maximum item-id length, in characters.
pub(crate) const MAX_ITEM_ID_LENGTH: usize = 1023;

/// The Cosmos-forbidden item-id characters.
const FORBIDDEN_ID_CHARS: [char; 4] = ['/', '\\', '?', '#'];

/// The unpadded base64url (RFC 4648 §5) of `message_id`'s UTF-8 bytes: deterministic and id-safe.
pub(crate) fn encode(message_id: &str) -> String {
    URL_SAFE_NO_PAD.encode(message_id.as_bytes())
}

/// Composes `{kind}:{encode(message_id)}`, checking the kind and the composed length.
///
/// # Errors
/// [`DocumentError::MissingKind`] for an empty or whitespace kind, [`DocumentError::InvalidKind`]
/// for a kind holding `/`, `\`, `?` or `#`, [`DocumentError::IdTooLong`] when the composed id is
/// over [`MAX_ITEM_ID_LENGTH`] characters.
pub(crate) fn build(kind: &str, message_id: &str) -> Result<String, DocumentError> {
    if kind.trim().is_empty() {
        return Err(DocumentError::MissingKind);
    }
    if kind.contains(FORBIDDEN_ID_CHARS) {
        return Err(DocumentError::InvalidKind {
            kind: kind.to_owned(),
        });
    }
    let id = format!("{kind}:{}", encode(message_id));
    // The C# limit counts UTF-16 code units; the encoded part is ASCII, only the kind may differ.
    let length = id.encode_utf16().count();
    if length > MAX_ITEM_ID_LENGTH {
        return Err(DocumentError::IdTooLong { length });
    }
    Ok(id)
}

/// The Outbox Document id: `outbox:` and the unpadded base64url of the message id.
///
/// ```
/// assert_eq!(chatter_runtime::cosmos::outbox_id("msg-1").unwrap(), "outbox:bXNnLTE");
/// assert_eq!(chatter_runtime::cosmos::inbox_id("msg-1").unwrap(), "inbox:bXNnLTE");
/// ```
///
/// # Errors
/// [`DocumentError::IdTooLong`] when the message id is too long for a Cosmos item id.
pub fn outbox_id(message_id: &str) -> Result<String, DocumentError> {
    build(OUTBOX_KIND, message_id)
}

/// The Inbox Marker id: `inbox:` and the unpadded base64url of the message id.
///
/// # Errors
/// [`DocumentError::IdTooLong`] when the message id is too long for a Cosmos item id.
pub fn inbox_id(message_id: &str) -> Result<String, DocumentError> {
    build(INBOX_KIND, message_id)
}

/// Whether `id` starts (ordinal, case-sensitive) with a reserved prefix, `outbox:` or `inbox:`.
pub(crate) fn is_reserved_id(id: &str) -> bool {
    RESERVED_ID_PREFIXES
        .iter()
        .any(|prefix| id.starts_with(prefix))
}

/// Rejects an id in the reserved namespace: the guard of the public staging surface for explicit
/// ids (replace, patch).
///
/// # Errors
/// [`DocumentError::ReservedId`] naming the id.
pub(crate) fn guard_not_reserved(id: &str) -> Result<(), DocumentError> {
    if is_reserved_id(id) {
        return Err(DocumentError::ReservedId { id: id.to_owned() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // 0.1 example
    #[test]
    fn msg_1_encodes_to_the_catalog_example_ids() {
        assert_eq!(encode("msg-1"), "bXNnLTE");
        assert_eq!(outbox_id("msg-1").unwrap(), "outbox:bXNnLTE");
        assert_eq!(inbox_id("msg-1").unwrap(), "inbox:bXNnLTE");
    }

    #[test]
    fn encoding_is_url_safe_and_unpadded() {
        // Standard base64 would give "4L6/", "76+v", "Pz4=" and "w7vDvw==".
        assert_eq!(encode("\u{FBF}"), "4L6_");
        assert_eq!(encode("\u{FBEF}"), "76-v");
        assert_eq!(encode("?>"), "Pz4");
        assert_eq!(encode("ûÿ"), "w7vDvw");
        assert_eq!(encode(""), "");
        let e = encode("~~~\u{3fff}");
        assert!(!e.contains(['+', '/', '=']), "{e}");
    }

    // R2.61, R2.83
    #[test]
    fn message_id_with_forbidden_chars_yields_an_id_free_of_them() {
        let id = outbox_id("msg/with?reserved#and\\chars").unwrap();
        assert!(id.starts_with("outbox:"));
        assert!(!id.contains(['/', '\\', '?', '#']), "{id}");
    }

    // R2.84
    #[test]
    fn ids_are_deterministic_and_distinct_per_message() {
        assert_eq!(outbox_id("a").unwrap(), outbox_id("a").unwrap());
        assert_ne!(outbox_id("a").unwrap(), outbox_id("b").unwrap());
        assert_ne!(outbox_id("a").unwrap(), inbox_id("a").unwrap());
    }

    // R2.80
    #[test]
    fn kind_with_a_forbidden_char_is_rejected_with_the_catalog_text() {
        for kind in ["a/b", "a\\b", "a?b", "a#b"] {
            let err = build(kind, "message-id").unwrap_err();
            assert_eq!(
                err,
                DocumentError::InvalidKind {
                    kind: kind.to_owned()
                }
            );
            assert_eq!(
                err.to_string(),
                r"A document-id kind must not contain the Cosmos-forbidden id characters '/', '\\', '?', or '#'."
            );
        }
    }

    // R2.81
    #[test]
    fn blank_kind_is_rejected_with_the_catalog_text() {
        for kind in ["", "   ", "\t\n"] {
            let err = build(kind, "message-id").unwrap_err();
            assert_eq!(err, DocumentError::MissingKind);
            assert_eq!(err.to_string(), "A document-id kind is required.");
        }
    }

    // 0.1 length limit; R7.35 (1000 'x' encodes past the limit)
    #[test]
    fn composed_id_over_1023_chars_is_rejected_with_the_catalog_text() {
        let err = inbox_id(&"x".repeat(1000)).unwrap_err();
        // 1000 bytes -> 1334 base64 chars (unpadded) + "inbox:".
        assert_eq!(err, DocumentError::IdTooLong { length: 1340 });
        assert_eq!(
            err.to_string(),
            "The composed Cosmos item id is 1340 characters, which exceeds Cosmos DB's 1023-character id limit. \
             Supply a shorter message id."
        );
    }

    #[test]
    fn composed_id_of_exactly_1023_chars_is_accepted() {
        // "outbox:" is 7 chars; 1016 base64 chars = 762 bytes.
        let id = outbox_id(&"y".repeat(762)).unwrap();
        assert_eq!(id.len(), 1023);
        // "inbox:" is 6 chars: 763 bytes -> 1018 chars -> 1024 total is over, 762 bytes -> 1022.
        assert_eq!(inbox_id(&"y".repeat(762)).unwrap().len(), 1022);
        assert!(matches!(
            outbox_id(&"y".repeat(763)),
            Err(DocumentError::IdTooLong { length: 1025 })
        ));
    }

    // R2.85
    #[test]
    fn reserved_ids_are_exactly_the_ordinal_prefixes() {
        assert!(is_reserved_id("outbox:abc"));
        assert!(is_reserved_id("inbox:abc"));
        assert!(is_reserved_id("inbox:"));
        assert!(is_reserved_id(&outbox_id("msg-1").unwrap()));
        assert!(is_reserved_id(&inbox_id("msg-1").unwrap()));
        for id in [
            "order:abc",
            "app-id",
            "",
            "Inbox:abc",
            "OUTBOX:x",
            "x-inbox:abc",
            " inbox:abc",
            "inbox",
        ] {
            assert!(!is_reserved_id(id), "{id}");
        }
    }

    // R2.50
    #[test]
    fn guard_rejects_reserved_explicit_ids_and_names_them() {
        let err = guard_not_reserved("inbox:abc").unwrap_err();
        assert_eq!(
            err,
            DocumentError::ReservedId {
                id: "inbox:abc".to_owned()
            }
        );
        assert!(err.to_string().contains("'inbox:abc'"));
        assert!(guard_not_reserved("outbox:abc").is_err());
        assert!(guard_not_reserved("order:abc").is_ok());
    }
}
