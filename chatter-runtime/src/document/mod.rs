//! The documents Chatter writes next to application data, and their wire shapes (catalog 0, 2.2–2.4).
//!
//! - [`id`]: the item ids Chatter mints, `outbox:`/`inbox:` + unpadded base64url of the message id.
//! - [`outbox`]: the Outbox Document, its pending gate, and reading it back into a message.
//! - [`outbox_contract`]: the Outbox Document Contract, whether a pending document can ever be published.
//! - [`inbox_marker`](mod@inbox_marker): the Batched and Claimed Inbox Markers, and the genuine-marker check.
//! - [`reserved_id`]: the reserved-id peek guard of the public staging surface.
//! - [`json`]: serialization with `ChatterJson.Options` escaping, and the `ReceivedAtUtc` format.
//!
//! Key order is insertion order (serde_json's `preserve_order` feature, enabled by this crate),
//! so a document serializes with its fields in the order the catalog shows. Serialize documents
//! with [`to_json_vec`] / [`to_json_string`] for byte parity with the C#.

mod error;
pub(crate) mod id;
pub(crate) mod inbox_marker;
pub(crate) mod json;
pub(crate) mod outbox;
pub(crate) mod outbox_contract;
pub(crate) mod reserved_id;

pub use error::DocumentError;
pub use id::{
    INBOX_KIND, MAX_ITEM_ID_LENGTH, OUTBOX_KIND, build, encode, guard_not_reserved, inbox_id,
    is_reserved_id, outbox_id,
};
pub use inbox_marker::{claimed_inbox_marker, inbox_marker, is_genuine_inbox_marker};
pub use json::{format_utc_timestamp, to_json_string, to_json_vec};
pub use outbox::{OutboxDocument, is_pending_outbox};
pub use outbox_contract::{ContractViolation, ContractViolations, VerifiedOutboxDocument};
pub use reserved_id::{check_not_reserved, top_level_string_id};
