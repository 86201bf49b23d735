//! What `#[derive(DocumentReliable)]` registers for a command type.

use std::any::TypeId;
use std::fmt;

use crate::partition_key::{self, PartitionKeyPath};

/// Where a registration was written, for messages that must name both sides of a conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLocation {
    /// `module_path!()` at the registration.
    pub module_path: &'static str,
    /// `file!()` at the registration.
    pub file: &'static str,
    /// `line!()` at the registration.
    pub line: u32,
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A caller-declared change-feed source identity pair (`monitored_source`, `lease_source`).
///
/// Declared identities name the monitored and lease containers independently of the account endpoint
/// they are reached through, so processors on different hosts agree on the processor name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceIdentityDeclaration {
    /// Identity of the monitored (document) container.
    pub monitored: &'static str,
    /// Identity of the lease container.
    pub lease: &'static str,
}

/// One command type's document-reliability registration (the .NET `DocumentReliabilityRegistration`).
///
/// Built by `#[derive(DocumentReliable)]` as const data; never constructed by hand in applications.
#[derive(Debug, Clone, Copy)]
pub struct CommandRegistration {
    /// The stable name the command is known by on the broker, in logs and in errors.
    pub command_name: &'static str,
    /// The broker destination the command is received from.
    pub destination: &'static str,
    /// The Rust type name (`core::any::type_name`).
    pub type_name: fn() -> &'static str,
    /// The Rust type's identity.
    pub type_id: fn() -> TypeId,
    /// Cosmos database holding the document and lease containers.
    pub database: &'static str,
    /// The document container: the handler's writes, inbox markers and outbox documents.
    pub container: &'static str,
    /// The lease container of the change-feed relay.
    pub lease: &'static str,
    /// The container's partition-key levels, in order (several for a hierarchical key): each
    /// path with the JSON pointer at which the command's serialized JSON holds its value.
    pub partition_key: &'static [PartitionKeyPath],
    /// The declared change-feed source identity, when the derive named one.
    pub declared_source_identity: Option<SourceIdentityDeclaration>,
    /// `#[chatter(max_delivery_attempts = N)]`: deliveries of one message (the first included)
    /// before it is dead-lettered; `None` is the runtime's default.
    pub max_delivery_attempts: Option<u32>,
    /// `#[inbox(...)]`: handled through the Standalone Inbox Gate instead of a batch
    /// (`database`/`container` then name the idempotency container, `lease` its relay's lease
    /// container or `""` when its handler sends nothing; there is no command partition key).
    pub standalone_inbox: Option<InboxDeclaration>,
    /// Where the derive was written.
    pub location: SourceLocation,
}

/// A standalone-inbox command's idempotency-container settings, from `#[inbox(...)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxDeclaration {
    /// Where a marker carries its partition value (the message id).
    pub partition_key_path: &'static str,
    /// The markers' ttl in seconds, when positive.
    pub marker_ttl_seconds: Option<i64>,
    /// The container's partition key as the relay of its Outbox Documents reads it: the one
    /// path, at which a sent message's Outbox Document carries the message id it was sent
    /// for. Relayed only when the command names a lease container (`#[inbox(lease = ..)]`).
    pub outbox_partition_key: &'static [PartitionKeyPath],
}

impl CommandRegistration {
    /// Resolves the partition-key values from the command's serialized JSON.
    ///
    /// `None` when a value is absent: the command is then handled without a batch, at least
    /// once, exactly like a resolver that returns no key.
    pub fn resolve_partition_key(
        &self,
        command: &serde_json::Value,
    ) -> Option<Vec<serde_json::Value>> {
        partition_key::resolve(self.partition_key, command)
    }

    /// The container's partition-key paths, in order.
    pub fn partition_key_paths(&self) -> impl Iterator<Item = &'static str> {
        self.partition_key.iter().map(|level| level.path)
    }
}

#[cfg(test)]
impl CommandRegistration {
    /// A registration for unit tests: `name` consuming `destination`, in container
    /// `shop/<container>` with lease container `leases`, keyed by `partition_key`, written at
    /// `line` of a `commands.rs`.
    pub(crate) const fn for_tests(
        name: &'static str,
        destination: &'static str,
        type_id: fn() -> TypeId,
        container: &'static str,
        partition_key: &'static [PartitionKeyPath],
        declared_source_identity: Option<SourceIdentityDeclaration>,
        line: u32,
    ) -> Self {
        Self {
            command_name: name,
            destination,
            type_name: || "T",
            type_id,
            database: "shop",
            container,
            lease: "leases",
            partition_key,
            declared_source_identity,
            max_delivery_attempts: None,
            standalone_inbox: None,
            location: SourceLocation {
                module_path: "tests",
                file: "commands.rs",
                line,
            },
        }
    }
}

/// A command type that takes part in the document tier.
///
/// Implemented by `#[derive(DocumentReliable)]`; the derive also registers the command so that
/// `chatter_runtime::start()` finds it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a document-reliable command",
    label = "this type has no `#[derive(DocumentReliable)]`",
    note = "add `#[derive(Serialize, Deserialize, DocumentReliable)]` with `#[cosmos(database = \"..\", container = \"..\", lease = \"..\")]` and `#[partition_key(path = \"/..\")]` to `{Self}`"
)]
pub trait DocumentReliable:
    serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static
{
    /// The command's registration.
    fn registration() -> &'static CommandRegistration;
}
