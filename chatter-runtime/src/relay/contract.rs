//! The Monitored Container Contract (catalog §4, R4.01–R4.18): before the relay starts any
//! change-feed processor, every monitored container's ground truth is reconciled with its
//! registration.
//!
//! The container's properties are read once, then three checks run in order, every one of
//! them, and every violation is named in one error:
//!
//! 1. **Partition-key path.** The declared paths must equal the container's actual paths, in
//!    order, segment for segment, case-sensitively. Both sides are canonicalized first: split on
//!    `/` dropping empty segments and re-joined as `/a/b`, so `tenantId` and `//tenantId/` are
//!    `/tenantId`; a path with no segment (`""`, `"/"`) is left as it is. A mistyped path makes
//!    the relay recover a wrong partition key, so every delivered stamp would fail and every
//!    message would publish again on every pass.
//! 2. **Default time-to-live.** Only `-1` (TTL on, no default expiry) and unset are accepted:
//!    any other value (positive, `0`, below `-1`) would let Cosmos delete a pending Outbox
//!    Document, which carries no `ttl` field, before the relay published it.
//! 3. **Stamped paths.** A container partitioned on `/status` or `/ttl` (exactly, after
//!    canonicalization; `/Ttl` and `/status/x` are fine) can never be stamped, because Cosmos
//!    does not patch partition-key paths. Only the first such actual path is reported.
//!
//! The relay never starts degraded: [`verify_all`] checks every monitored container and
//! reports every violating one in one [`MonitoredContainersError`].

use std::fmt;
use std::time::Duration;

use crate::cosmos::store::{self, ContainerSettings};
use crate::cosmos::{ContainerClient, CosmosConnection, CosmosStoreError};
use crate::document::outbox::RELAY_STAMPED_PATHS;
use crate::partition_key::{self, PartitionKeyPath};

#[cfg(feature = "test-support")]
use super::identity::RelaySource;

/// One way a monitored container breaks the contract. Its `Display` is the .NET module's verbatim
/// violation text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MonitoredContainerViolation {
    /// The declared partition-key paths are not the container's actual ones.
    PartitionKeyPathMismatch {
        /// The declared paths, as registered.
        declared: Vec<String>,
        /// The container's actual paths (empty when it reports none).
        actual: Vec<String>,
    },
    /// The container's default time-to-live is neither `-1` nor unset.
    DefaultTimeToLive {
        /// The container's `defaultTtl`, in seconds.
        seconds: i64,
    },
    /// The container is partitioned on a path the relay patches on every drain.
    StampedPartitionKeyPath {
        /// The stamped path (`/status` or `/ttl`).
        path: &'static str,
    },
}

impl fmt::Display for MonitoredContainerViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PartitionKeyPathMismatch { declared, actual } => {
                let actual = if actual.is_empty() {
                    "<none>".to_owned()
                } else {
                    actual.join(", ")
                };
                write!(
                    f,
                    "its declared partition-key path [{}] does not match the container's actual \
                     partition-key path [{actual}] (compared in order, segment for segment, \
                     case-sensitively)",
                    declared.join(", ")
                )
            }
            Self::DefaultTimeToLive { seconds } => write!(
                f,
                "its default time-to-live is {seconds}, and a pending outbox document carries no \
                 ttl field, so Cosmos would delete it before the relay ever published it — the \
                 only accepted values are -1 (on, items without a ttl field never expire) and \
                 unset"
            ),
            Self::StampedPartitionKeyPath { path } => write!(
                f,
                "its actual partition-key path includes '{path}', which the relay patches on \
                 every drain — the stamp could never land on a document's partition-key path, so \
                 every published document would stay pending and publish again on the next pass, \
                 forever (this container's relay is already failing that way today; the check \
                 surfaces that defect rather than introducing it)"
            ),
        }
    }
}

/// A monitored container the relay cannot monitor (the .NET `InvalidOperationException`s of
/// `MonitoredContainerContract`). Messages are the .NET module's verbatim texts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MonitoredContainerError {
    /// The container's properties could not be read (or, at start, its handle could
    /// not be derived, e.g. it does not exist).
    #[error(
        "The Cosmos outbox relay could not read the properties of monitored container \
         '{container}' in database '{database}'. The relay verifies that container's \
         partition-key path and default time-to-live at start, so it requires metadata read \
         access on the monitored container."
    )]
    Unreadable {
        /// Database id.
        database: String,
        /// Container id.
        container: String,
        /// The store error (boxed to keep the error small).
        #[source]
        source: Box<CosmosStoreError>,
    },
    /// The container breaks the contract; every violation found, in check order.
    #[error(
        "The Cosmos outbox relay cannot monitor container '{container}' in database \
         '{database}': {}. Correct the container or the relay registration and restart.",
        join_violations(.violations)
    )]
    Violated {
        /// Database id.
        database: String,
        /// Container id.
        container: String,
        /// The violations, in check order (partition-key path, default TTL, stamped path).
        violations: Vec<MonitoredContainerViolation>,
    },
}

fn join_violations(violations: &[MonitoredContainerViolation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; and ")
}

/// Every monitored container that failed the start-time check, in source order.
///
/// Its message is each container's [`MonitoredContainerError`] message, one per line (joined with
/// `"\n"`), so a single failing container reads exactly as the .NET module's text. When that
/// one container could not be read, its store error (missing, forbidden, timed out) is the
/// [`source`](std::error::Error::source); with several, each one's cause is in
/// [`errors`](Self::errors), so no cause is printed under another container's line.
#[derive(Debug)]
pub struct MonitoredContainersError {
    /// One error per failing container (never empty).
    pub errors: Vec<MonitoredContainerError>,
}

impl fmt::Display for MonitoredContainersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for MonitoredContainersError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.errors.as_slice() {
            [MonitoredContainerError::Unreadable { source, .. }] => {
                Some(source.as_ref() as &(dyn std::error::Error + 'static))
            }
            _ => None,
        }
    }
}

/// Checks one monitored container: reads its properties exactly once, then runs the
/// three checks of the contract against `declared_paths`, reporting every violation in one
/// [`MonitoredContainerError::Violated`]. A failed read is [`MonitoredContainerError::Unreadable`].
///
/// `database` and `container_id` name the container in messages.
pub async fn verify(
    container: &ContainerClient,
    database: &str,
    container_id: &str,
    declared_paths: &[impl AsRef<str>],
) -> Result<(), MonitoredContainerError> {
    let settings = store::read_container_properties(container)
        .await
        .map_err(|source| MonitoredContainerError::Unreadable {
            database: database.to_owned(),
            container: container_id.to_owned(),
            source: Box::new(source),
        })?;
    check(database, container_id, declared_paths, &settings)
}

/// The three checks of the contract on already-read container settings (what [`verify`] runs
/// after its one read).
pub(crate) fn check(
    database: &str,
    container_id: &str,
    declared_paths: &[impl AsRef<str>],
    settings: &ContainerSettings,
) -> Result<(), MonitoredContainerError> {
    let violations = violations(declared_paths, settings);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(MonitoredContainerError::Violated {
            database: database.to_owned(),
            container: container_id.to_owned(),
            violations,
        })
    }
}

/// The contract's violations, in check order.
fn violations(
    declared_paths: &[impl AsRef<str>],
    settings: &ContainerSettings,
) -> Vec<MonitoredContainerViolation> {
    let actual = &settings.partition_key_paths;
    let mut violations = Vec::new();
    if !partition_key::matches_container(declared_paths, actual) {
        violations.push(MonitoredContainerViolation::PartitionKeyPathMismatch {
            declared: declared_paths
                .iter()
                .map(|p| p.as_ref().to_owned())
                .collect(),
            actual: actual.clone(),
        });
    }
    if let Some(seconds) = settings.default_ttl.filter(|&ttl| ttl != -1) {
        violations.push(MonitoredContainerViolation::DefaultTimeToLive { seconds });
    }
    if let Some(path) = actual.iter().find_map(|path| stamped_path(path)) {
        violations.push(MonitoredContainerViolation::StampedPartitionKeyPath { path });
    }
    violations
}

/// The stamped path `actual` names, if any (exact canonical equality, case-sensitive).
fn stamped_path(actual: &str) -> Option<&'static str> {
    let canonical = partition_key::canonical(actual);
    RELAY_STAMPED_PATHS
        .into_iter()
        .find(|stamped| *stamped == canonical)
}

/// Verifies the monitored container of every source (each once, with its first
/// registration's partition-key paths) before any processor is built, and
/// reports every failing container in one error, in source order.
///
/// A container whose handle cannot be derived (missing database or container, no access) is
/// reported as [`MonitoredContainerError::Unreadable`], and so is one whose handle or
/// properties do not arrive within `timeout` (a [`CosmosStoreError::Timeout`]). The containers
/// are checked concurrently.
#[cfg(feature = "test-support")]
pub async fn verify_all(
    connection: &CosmosConnection,
    sources: &[RelaySource],
    timeout: Duration,
) -> Result<(), MonitoredContainersError> {
    verify_targets(
        sources.iter().map(|source| Target {
            connection,
            database: source.database,
            container: source.container,
            partition_key_paths: source.partition_key_paths,
        }),
        timeout,
    )
    .await
}

/// One monitored container to verify: where it is and the partition-key paths declared for it.
pub(crate) struct Target<'a> {
    pub(crate) connection: &'a CosmosConnection,
    pub(crate) database: &'a str,
    pub(crate) container: &'a str,
    pub(crate) partition_key_paths: &'a [PartitionKeyPath],
}

/// [`verify_all`] over any monitored containers (the pipeline relay's sources, the standalone
/// relays' containers): concurrently, every failure reported in one error, in order.
pub(crate) async fn verify_targets(
    targets: impl Iterator<Item = Target<'_>>,
    timeout: Duration,
) -> Result<(), MonitoredContainersError> {
    let checks = targets.map(|target| async move {
        let unreadable = |source_error| MonitoredContainerError::Unreadable {
            database: target.database.to_owned(),
            container: target.container.to_owned(),
            source: Box::new(source_error),
        };
        let handle = target
            .connection
            .container_within(target.database, target.container, timeout)
            .await
            .map_err(unreadable)?;
        let verified = verify(
            &handle,
            target.database,
            target.container,
            target.partition_key_paths,
        );
        tokio::time::timeout(timeout, verified)
            .await
            .unwrap_or_else(|_| {
                Err(unreadable(CosmosStoreError::timeout(
                    "read_container",
                    timeout,
                )))
            })
    });
    let errors: Vec<MonitoredContainerError> = futures::future::join_all(checks)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(MonitoredContainersError { errors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(paths: &[&str], default_ttl: Option<i64>) -> ContainerSettings {
        ContainerSettings {
            default_ttl,
            partition_key_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn violations_of(
        declared: &[&str],
        paths: &[&str],
        ttl: Option<i64>,
    ) -> Vec<MonitoredContainerViolation> {
        violations(declared, &settings(paths, ttl))
    }

    #[test]
    fn segmentless_paths_do_not_match_each_other() {
        assert_eq!(violations_of(&["/"], &["//"], None).len(), 1);
        assert!(violations_of(&["/"], &["/"], None).is_empty());
    }

    #[test]
    fn a_container_reporting_no_path_is_a_mismatch_rendered_none() {
        let found = violations_of(&[], &[], None);
        assert_eq!(found.len(), 1);
        assert!(found[0].to_string().contains("[<none>]"), "{}", found[0]);
    }

    #[test]
    fn every_default_ttl_but_minus_one_and_unset_is_rejected() {
        // R4.07, R4.09
        for ttl in [0, 1, 86400, -5, -2] {
            assert_eq!(
                violations_of(&["/tenantId"], &["/tenantId"], Some(ttl)),
                [MonitoredContainerViolation::DefaultTimeToLive { seconds: ttl }]
            );
        }
        assert!(violations_of(&["/tenantId"], &["/tenantId"], Some(-1)).is_empty());
        assert!(violations_of(&["/tenantId"], &["/tenantId"], None).is_empty());
    }

    #[test]
    fn a_nested_stamped_path_is_not_a_collision() {
        // R4.18
        assert!(violations_of(&["/status/x"], &["/status/x"], None).is_empty());
        assert!(violations_of(&["/ttl/x"], &["/ttl/x"], None).is_empty());
    }

    #[test]
    fn only_the_first_stamped_path_is_reported() {
        assert_eq!(
            violations_of(&["/ttl", "/status"], &["/ttl", "/status"], None),
            [MonitoredContainerViolation::StampedPartitionKeyPath { path: "/ttl" }]
        );
        // A non-canonical actual spelling still collides, reported in canonical form.
        assert_eq!(
            violations_of(&["status/"], &["status/"], None),
            [MonitoredContainerViolation::StampedPartitionKeyPath { path: "/status" }]
        );
    }

    #[test]
    fn the_stamped_paths_are_status_and_ttl() {
        // R4.17
        assert_eq!(RELAY_STAMPED_PATHS, ["/status", "/ttl"]);
    }

    #[test]
    fn violations_are_reported_in_check_order_in_one_message() {
        let error = check(
            "shop",
            "orders",
            &["/tenantId"],
            &settings(&["/ttl"], Some(0)),
        )
        .unwrap_err();
        let message = error.to_string();
        let pk = message.find("does not match").unwrap();
        let ttl = message.find("default time-to-live is 0").unwrap();
        let stamped = message.find("includes '/ttl'").unwrap();
        assert!(pk < ttl && ttl < stamped, "{message}");
        assert_eq!(message.matches("; and ").count(), 2, "{message}");
        assert!(message.starts_with(
            "The Cosmos outbox relay cannot monitor container 'orders' in database 'shop': its declared"
        ));
        assert!(message.ends_with(
            "rather than introducing it). Correct the container or the relay registration and restart."
        ));
    }
}
