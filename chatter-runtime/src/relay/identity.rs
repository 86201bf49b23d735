//! Change-feed source identity, processor name and instance name (catalog §1.6, R1.70–R1.84).
//!
//! The relay runs one change-feed processor per distinct **Change-Feed Source Identity**: the
//! caller-declared `(monitored, lease)` pair when a registration declares one, otherwise the
//! ground truth of the containers (account endpoint, database id and container id, for the
//! monitored and the lease container). The identity is compared component by component, never
//! as a joined string, so no choice of names can make two sources collapse into one
//!.
//!
//! The **processor name** is derived from the identity alone, so every host draining the same
//! source cooperates on the same logical processor; the **instance name** is
//! unique per host start.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use crate::partition_key::PartitionKeyPath;
use crate::registry::{CommandRegistration, Registry};

/// The prefix of every processor name and instance name the relay uses.
pub(crate) const PROCESSOR_NAME_PREFIX: &str = "chatter-cosmos-outbox-relay:";

/// The identity of one change-feed source: what decides whether two registrations share a
/// change-feed processor.
///
/// Equality and hashing are component-wise.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SourceIdentity {
    /// The `(monitored, lease)` pair a registration declared
    /// (`#[cosmos(monitored_source = "..", lease_source = "..")]`); the container handles
    /// are not read.
    Declared {
        /// The declared identity of the monitored container.
        monitored: String,
        /// The declared identity of the lease container.
        lease: String,
    },
    /// The resolved containers' ground truth: account endpoint, database id and container id
    /// of the monitored and of the lease container. The endpoint is part of the key, so
    /// identically named containers in different accounts stay distinct.
    GroundTruth {
        /// Account endpoint of the monitored container (`""` when unknown).
        monitored_endpoint: String,
        /// Database id of the monitored container.
        monitored_database: String,
        /// Id of the monitored container.
        monitored_container: String,
        /// Account endpoint of the lease container (`""` when unknown).
        lease_endpoint: String,
        /// Database id of the lease container.
        lease_database: String,
        /// Id of the lease container.
        lease_container: String,
    },
}

impl SourceIdentity {
    /// The identity of a registration's change-feed source: its declared pair if it declares
    /// one, otherwise the ground truth of its containers in the account at `account_endpoint`
    /// (the lease container lives in the monitored container's database).
    pub fn of_registration(registration: &CommandRegistration, account_endpoint: &str) -> Self {
        match registration.declared_source_identity {
            Some(declared) => Self::Declared {
                monitored: declared.monitored.to_owned(),
                lease: declared.lease.to_owned(),
            },
            None => Self::GroundTruth {
                monitored_endpoint: account_endpoint.to_owned(),
                monitored_database: registration.database.to_owned(),
                monitored_container: registration.container.to_owned(),
                lease_endpoint: account_endpoint.to_owned(),
                lease_database: registration.database.to_owned(),
                lease_container: registration.lease.to_owned(),
            },
        }
    }

    /// The change-feed processor name of this source:
    /// `"chatter-cosmos-outbox-relay:" + base64url_nopad(SHA-256(canonical))`.
    ///
    /// `canonical` is one kind byte (`Declared` = 0, `GroundTruth` = 1) followed by eight
    /// components in this order: Monitored, Lease, MonitoredEndpoint, MonitoredDb,
    /// MonitoredContainer, LeaseEndpoint, LeaseDb, LeaseContainer. Each component is its UTF-8
    /// byte length as a little-endian `i32`, then its UTF-8 bytes; components the kind does not
    /// use are `""`. Deterministic across processes and hosts.
    pub fn processor_name(&self) -> String {
        let digest = Sha256::digest(self.canonical_bytes());
        format!("{PROCESSOR_NAME_PREFIX}{}", URL_SAFE_NO_PAD.encode(digest))
    }

    /// The kind byte and the eight components, in canonical order.
    fn components(&self) -> (u8, [&str; 8]) {
        match self {
            Self::Declared { monitored, lease } => (0, [monitored, lease, "", "", "", "", "", ""]),
            Self::GroundTruth {
                monitored_endpoint,
                monitored_database,
                monitored_container,
                lease_endpoint,
                lease_database,
                lease_container,
            } => (
                1,
                [
                    "",
                    "",
                    monitored_endpoint,
                    monitored_database,
                    monitored_container,
                    lease_endpoint,
                    lease_database,
                    lease_container,
                ],
            ),
        }
    }

    /// The canonical byte form the processor name hashes (see [`processor_name`](Self::processor_name)).
    fn canonical_bytes(&self) -> Vec<u8> {
        let (kind, components) = self.components();
        let mut bytes =
            Vec::with_capacity(1 + components.iter().map(|c| 4 + c.len()).sum::<usize>());
        bytes.push(kind);
        for component in components {
            // A component longer than i32::MAX bytes cannot exist in practice; saturate rather
            // than panic.
            let length = i32::try_from(component.len()).unwrap_or(i32::MAX);
            bytes.extend_from_slice(&length.to_le_bytes());
            bytes.extend_from_slice(component.as_bytes());
        }
        bytes
    }
}

/// A fresh instance name for one host start:
/// `"chatter-cosmos-outbox-relay:{machine name}:{new uuid v4}"`, unique per call.
///
/// The machine name is the kernel host name (`/proc/sys/kernel/hostname`), else
/// `/etc/hostname`, else the `HOSTNAME` environment variable, else `"localhost"`; like .NET's
/// `Environment.MachineName` it is cut at the first `.`.
pub(crate) fn instance_name() -> String {
    format!(
        "{PROCESSOR_NAME_PREFIX}{}:{}",
        machine_name(),
        uuid::Uuid::new_v4()
    )
}

/// A relay instance's owner name (`chatter-cosmos-outbox-relay:{machine}:{uuid}`, one per host
/// start) split into its machine name and its uuid; `None` for any other name (an owner
/// another kind of processor wrote).
pub fn relay_instance(name: &str) -> Option<(&str, &str)> {
    let (machine, id) = name.strip_prefix(PROCESSOR_NAME_PREFIX)?.rsplit_once(':')?;
    // Hyphenated, as `Uuid`'s `Display` writes it: 36 ASCII characters.
    (id.len() == 36 && uuid::Uuid::parse_str(id).is_ok()).then_some((machine, id))
}

fn machine_name() -> String {
    let from_file = |path: &str| std::fs::read_to_string(path).ok();
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .into_iter()
        .filter_map(from_file)
        .chain(std::env::var("HOSTNAME").ok())
        .find_map(|raw| {
            let name = raw.trim();
            let name = name.split('.').next().unwrap_or(name).trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// One distinct change-feed source of a registry: what one change-feed processor drains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySource {
    /// The source's identity.
    pub identity: SourceIdentity,
    /// Its processor name ([`SourceIdentity::processor_name`]).
    pub processor_name: String,
    /// Database of the monitored (and lease) container, from the first registration of this
    /// source.
    pub database: &'static str,
    /// The monitored container, from the first registration of this source.
    pub container: &'static str,
    /// The lease container, from the first registration of this source.
    pub lease: &'static str,
    /// The declared partition-key paths of the monitored container, from the first
    /// registration of this source (what the Monitored Container Contract checks).
    pub partition_key_paths: &'static [PartitionKeyPath],
    /// The names of the commands registered over this source, in registry order.
    pub commands: Vec<&'static str>,
}

/// The distinct change-feed sources of `registry`, one per distinct [`SourceIdentity`], in
/// registry order; ground-truth identities use `account_endpoint`. An empty
/// registry has no sources.
///
/// A source's containers and partition-key paths are those of its first registration; later
/// registrations over the same identity only add their command names.
pub fn distinct_sources(registry: &Registry, account_endpoint: &str) -> Vec<RelaySource> {
    sources_of(
        registry
            .commands()
            .iter()
            .map(|command| command.registration)
            // A standalone-inbox command without a lease sends nothing: nothing to relay.
            .filter(|registration| {
                registration.standalone_inbox.is_none() || !registration.lease.is_empty()
            }),
        account_endpoint,
    )
}

fn sources_of(
    registrations: impl IntoIterator<Item = &'static CommandRegistration>,
    account_endpoint: &str,
) -> Vec<RelaySource> {
    let mut sources: Vec<RelaySource> = Vec::new();
    for registration in registrations {
        let identity = SourceIdentity::of_registration(registration, account_endpoint);
        match sources
            .iter_mut()
            .find(|source| source.identity == identity)
        {
            Some(source) => source.commands.push(registration.command_name),
            None => sources.push(RelaySource {
                processor_name: identity.processor_name(),
                identity,
                database: registration.database,
                container: registration.container,
                lease: registration.lease,
                partition_key_paths: registration
                    .standalone_inbox
                    .map_or(registration.partition_key, |inbox| {
                        inbox.outbox_partition_key
                    }),
                commands: vec![registration.command_name],
            }),
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use std::any::TypeId;

    use super::*;
    use crate::registry::SourceIdentityDeclaration;

    fn declared(monitored: &str, lease: &str) -> SourceIdentity {
        SourceIdentity::Declared {
            monitored: monitored.to_owned(),
            lease: lease.to_owned(),
        }
    }

    fn ground_truth(
        endpoint: &str,
        database: &str,
        container: &str,
        lease: &str,
    ) -> SourceIdentity {
        SourceIdentity::GroundTruth {
            monitored_endpoint: endpoint.to_owned(),
            monitored_database: database.to_owned(),
            monitored_container: container.to_owned(),
            lease_endpoint: endpoint.to_owned(),
            lease_database: database.to_owned(),
            lease_container: lease.to_owned(),
        }
    }

    /// The processor name computed from a hand-built canonical byte vector, independently of
    /// `canonical_bytes`.
    fn expected_name(canonical: &[u8]) -> String {
        let digest = sha2::Sha256::digest(canonical);
        format!(
            "chatter-cosmos-outbox-relay:{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
        )
    }

    #[test]
    fn declared_processor_name_matches_the_golden_canonical_layout() {
        let mut canonical = vec![0u8];
        canonical.extend_from_slice(&[6, 0, 0, 0]);
        canonical.extend_from_slice(b"orders");
        canonical.extend_from_slice(&[6, 0, 0, 0]);
        canonical.extend_from_slice(b"leases");
        for _ in 0..6 {
            canonical.extend_from_slice(&[0, 0, 0, 0]);
        }
        assert_eq!(
            declared("orders", "leases").processor_name(),
            expected_name(&canonical)
        );
    }

    #[test]
    fn ground_truth_processor_name_matches_the_golden_canonical_layout() {
        let endpoint = "https://acct.documents.azure.com/";
        let mut canonical = vec![1u8];
        canonical.extend_from_slice(&[0, 0, 0, 0]);
        canonical.extend_from_slice(&[0, 0, 0, 0]);
        for component in [endpoint, "shop", "orders", endpoint, "shop", "leases"] {
            canonical.extend_from_slice(&u32::try_from(component.len()).unwrap().to_le_bytes());
            canonical.extend_from_slice(component.as_bytes());
        }
        assert_eq!(canonical[3..7], [0, 0, 0, 0], "lease length");
        assert_eq!(canonical[9], 33, "endpoint length byte");
        assert_eq!(
            ground_truth(endpoint, "shop", "orders", "leases").processor_name(),
            expected_name(&canonical)
        );
    }

    #[test]
    fn processor_names_match_literals_computed_outside_rust() {
        // Computed with Python's hashlib + base64.urlsafe_b64encode over the R1.78 layout.
        assert_eq!(
            declared("orders", "leases").processor_name(),
            "chatter-cosmos-outbox-relay:ik7F7aKj9BX46nPjeJ2wypQfFSlwFcybrvj5MehYmL8"
        );
        assert_eq!(
            ground_truth(
                "https://acct.documents.azure.com/",
                "shop",
                "orders",
                "leases"
            )
            .processor_name(),
            "chatter-cosmos-outbox-relay:O2IDEdyR6-INSDBRMlHehztiY4UG54ih9rScobyNGns"
        );
    }

    #[test]
    fn lengths_are_utf8_byte_counts() {
        // "é" is two UTF-8 bytes.
        let mut canonical = vec![0u8, 2, 0, 0, 0];
        canonical.extend_from_slice("é".as_bytes());
        canonical.extend_from_slice(&[1, 0, 0, 0]);
        canonical.extend_from_slice(b"l");
        for _ in 0..6 {
            canonical.extend_from_slice(&[0, 0, 0, 0]);
        }
        assert_eq!(
            declared("é", "l").processor_name(),
            expected_name(&canonical)
        );
    }

    #[test]
    fn embedded_nul_bytes_do_not_collapse_distinct_pairs() {
        // R1.74
        let one = declared("a\0b", "c");
        let two = declared("a", "b\0c");
        assert_ne!(one, two);
        assert_ne!(one.processor_name(), two.processor_name());
        let three = declared("ab", "c");
        let four = declared("a", "bc");
        assert_ne!(three.processor_name(), four.processor_name());
    }

    #[test]
    fn processor_names_have_the_prefix_and_are_deterministic() {
        // R1.75, R1.76, R1.77
        for identity in [
            declared("orders", "leases"),
            ground_truth("https://acct/", "shop", "orders", "leases"),
        ] {
            let name = identity.processor_name();
            assert!(name.starts_with(PROCESSOR_NAME_PREFIX), "{name}");
            assert_eq!(name, identity.clone().processor_name());
            // 32 bytes -> 43 unpadded base64url characters.
            assert_eq!(name.len(), PROCESSOR_NAME_PREFIX.len() + 43);
            assert!(!name.contains('=') && !name.contains('+') && !name.contains('/'));
        }
        assert_ne!(
            declared("orders", "leases").processor_name(),
            declared("orders", "leases-2").processor_name()
        );
    }

    #[test]
    fn declared_and_ground_truth_names_differ() {
        // Same strings in the same slots would still differ by the kind byte.
        assert_ne!(
            declared("", "").processor_name(),
            ground_truth("", "", "", "").processor_name()
        );
        assert_ne!(
            declared("orders", "leases").processor_name(),
            ground_truth("", "shop", "orders", "leases").processor_name()
        );
    }

    #[test]
    fn the_account_endpoint_is_part_of_the_ground_truth_name() {
        // R1.73
        assert_ne!(
            ground_truth("https://a/", "shop", "orders", "leases").processor_name(),
            ground_truth("https://b/", "shop", "orders", "leases").processor_name()
        );
    }

    #[test]
    fn instance_names_are_prefixed_and_unique() {
        // R1.79
        let one = instance_name();
        let two = instance_name();
        assert_ne!(one, two);
        let rest = one.strip_prefix(PROCESSOR_NAME_PREFIX).unwrap();
        let (machine, id) = rest.rsplit_once(':').unwrap();
        assert!(!machine.is_empty());
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    }

    #[test]
    fn an_instance_name_splits_into_its_machine_and_uuid_and_no_other_name_does() {
        let name = instance_name();
        let (machine, id) = relay_instance(&name).expect("an instance name");
        assert_eq!(machine, machine_name());
        assert_eq!(name, format!("{PROCESSOR_NAME_PREFIX}{machine}:{id}"));
        for other in [
            "host-1",
            "chatter-cosmos-outbox-relay:host-1",
            "chatter-cosmos-outbox-relay:host-1:not-a-uuid",
            "chatter-cosmos-outbox-relay:host-1:0123456789abcdef0123456789abcdef",
            "other-prefix:host-1:67e55044-10b1-426f-9247-bb680e5fe0c8",
        ] {
            assert_eq!(relay_instance(other), None, "{other}");
        }
    }

    struct A;
    struct B;
    struct C;

    const fn reg(
        name: &'static str,
        container: &'static str,
        type_id: fn() -> TypeId,
        declared: Option<SourceIdentityDeclaration>,
    ) -> CommandRegistration {
        const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
            path: "/tenantId",
            pointer: "/tenant_id",
        }];
        CommandRegistration::for_tests(name, name, type_id, container, KEY, declared, 1)
    }

    const fn declaring(
        monitored: &'static str,
        lease: &'static str,
    ) -> Option<SourceIdentityDeclaration> {
        Some(SourceIdentityDeclaration { monitored, lease })
    }

    static PLAIN_ORDERS_1: CommandRegistration = reg("create", "orders", TypeId::of::<A>, None);
    static PLAIN_ORDERS_2: CommandRegistration = reg("ship", "orders", TypeId::of::<B>, None);
    static PLAIN_INVOICES: CommandRegistration = reg("bill", "invoices", TypeId::of::<C>, None);
    static DECLARED_X_1: CommandRegistration =
        reg("create", "orders", TypeId::of::<A>, declaring("x", "y"));
    static DECLARED_X_2: CommandRegistration =
        reg("ship", "orders", TypeId::of::<B>, declaring("x", "y"));
    static DECLARED_NUL_1: CommandRegistration =
        reg("create", "orders", TypeId::of::<A>, declaring("a\0b", "c"));
    static DECLARED_NUL_2: CommandRegistration =
        reg("ship", "orders", TypeId::of::<B>, declaring("a", "b\0c"));

    #[test]
    fn registrations_sharing_a_declared_pair_share_one_source() {
        // R1.70
        let sources = sources_of([&DECLARED_X_1, &DECLARED_X_2], "https://acct/");
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0].identity, declared("x", "y"));
        assert_eq!(sources[0].commands, ["create", "ship"]);
        assert_eq!(sources[0].container, "orders");
        assert_eq!(
            sources[0].processor_name,
            declared("x", "y").processor_name()
        );
    }

    #[test]
    fn distinct_declared_pairs_are_distinct_sources_even_over_one_container() {
        // R1.71, R1.74
        let sources = sources_of([&DECLARED_NUL_1, &DECLARED_NUL_2], "https://acct/");
        assert_eq!(sources.len(), 2);
        assert_ne!(sources[0].processor_name, sources[1].processor_name);
    }

    #[test]
    fn plain_registrations_over_one_container_share_one_source() {
        // R1.72
        let sources = sources_of(
            [&PLAIN_ORDERS_1, &PLAIN_INVOICES, &PLAIN_ORDERS_2],
            "https://acct/",
        );
        assert_eq!(sources.len(), 2);
        assert_eq!(sources[0].container, "orders");
        assert_eq!(sources[0].commands, ["create", "ship"]);
        assert_eq!(sources[1].container, "invoices");
        assert_eq!(
            sources[0].identity,
            ground_truth("https://acct/", "shop", "orders", "leases")
        );
        assert_eq!(sources[0].partition_key_paths[0].path, "/tenantId");
    }

    #[test]
    fn ground_truth_sources_differ_by_account_endpoint() {
        // R1.73
        let a = sources_of([&PLAIN_ORDERS_1], "https://a/");
        let b = sources_of([&PLAIN_ORDERS_1], "https://b/");
        assert_ne!(a[0].processor_name, b[0].processor_name);
    }

    #[test]
    fn an_empty_registry_has_no_sources() {
        // R1.83
        assert!(distinct_sources(&Registry::default(), "https://acct/").is_empty());
    }
}
