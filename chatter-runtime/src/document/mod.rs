//! The documents Chatter writes next to application data, and their wire shapes.
//!
//! - [`id`]: the item ids Chatter mints, `outbox:`/`inbox:` + unpadded base64url of the message id.
//! - [`outbox`]: the Outbox Document, its pending gate, and reading it back into a message.
//! - [`outbox_contract`]: the Outbox Document Contract, whether a pending document can ever be published.
//! - [`inbox_marker`](mod@inbox_marker): the Batched Inbox Marker and the genuine-marker check.
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

pub use error::DocumentError;
pub(crate) use id::{guard_not_reserved, inbox_id};
pub(crate) use inbox_marker::{inbox_marker, is_genuine_inbox_marker};
pub(crate) use json::{format_utc_timestamp, to_json_string};
pub(crate) use outbox::{OutboxDocument, is_pending_outbox};
pub(crate) use outbox_contract::ContractViolations;
