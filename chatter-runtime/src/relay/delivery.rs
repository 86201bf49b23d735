//! Delivery settings: what the relay stamps on a delivered Outbox Document.
//!
//! The status path is `/status` and the ttl path `/ttl`, both fixed: the pending gate reads
//! `status`, so a stamp on any other path would leave the document pending forever (the .NET
//! `StatusPatchPath` option exists only to be rejected unless it is `/status`; R3.65/R3.66).

use crate::document::outbox::{STATUS_DELIVERED, STATUS_PENDING, STATUS_UNDELIVERABLE};

/// What the relay stamps on a delivered document, in one patch after the broker confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliverySettings {
    /// The `status` value of a delivered document (default `"delivered"`).
    pub delivered_status: String,
    /// The `ttl` (seconds) stamped with it, so Cosmos purges delivered documents (default 86 400,
    /// one day). Must be positive.
    pub delivered_ttl_seconds: i64,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            delivered_status: STATUS_DELIVERED.to_owned(),
            delivered_ttl_seconds: 86_400,
        }
    }
}

/// Why the delivered status or ttl of the [`RelayOptions`](crate::relay::RelayOptions) are refused (with the .NET module's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliverySettingsError {
    /// The delivered status is empty or blank.
    #[error("A delivered status value is required and cannot be empty.")]
    EmptyStatus,
    /// The delivered status is `pending`.
    #[error(
        "The delivered status value cannot equal the pending status 'pending'; a delivered \
         document must be advanced OUT of pending or it would re-surface on the change feed forever."
    )]
    StatusIsPending,
    /// The delivered status is `undeliverable`.
    #[error(
        "The delivered status value cannot equal the undeliverable status 'undeliverable'; it is \
         the terminal state of an Undeliverable Outbox Document, so a delivered document stamped \
         with it would be indistinguishable from one the relay gave up on."
    )]
    StatusIsUndeliverable,
    /// The ttl is zero or negative.
    #[error(
        "The delivered TTL must be a positive number of seconds (got {0}); 'delivered but \
         retained' (0, -1, or any negative) is out of scope."
    )]
    NonPositiveTtl(i64),
}

impl DeliverySettings {
    /// Checks the settings in a fixed order: status empty, `pending`, `undeliverable`,
    /// then the ttl. Comparisons are ordinal (`"Pending"` is a valid, if odd, status).
    ///
    /// A blank status (only white space) counts as empty: it would be an invisible terminal
    /// state, which no one means.
    pub fn validate(&self) -> Result<(), DeliverySettingsError> {
        let status = self.delivered_status.as_str();
        if status.trim().is_empty() {
            return Err(DeliverySettingsError::EmptyStatus);
        }
        if status == STATUS_PENDING {
            return Err(DeliverySettingsError::StatusIsPending);
        }
        if status == STATUS_UNDELIVERABLE {
            return Err(DeliverySettingsError::StatusIsUndeliverable);
        }
        if self.delivered_ttl_seconds <= 0 {
            return Err(DeliverySettingsError::NonPositiveTtl(
                self.delivered_ttl_seconds,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(status: &str, ttl: i64) -> DeliverySettings {
        DeliverySettings {
            delivered_status: status.to_owned(),
            delivered_ttl_seconds: ttl,
        }
    }

    // R3.60
    #[test]
    fn an_empty_delivered_status_is_rejected() {
        for status in ["", "   "] {
            let err = settings(status, 86_400).validate().unwrap_err();
            assert_eq!(
                err.to_string(),
                "A delivered status value is required and cannot be empty."
            );
        }
    }

    // R3.61
    #[test]
    fn pending_as_the_delivered_status_is_rejected() {
        let err = settings("pending", 86_400).validate().unwrap_err();
        assert_eq!(err, DeliverySettingsError::StatusIsPending);
        assert_eq!(
            err.to_string(),
            "The delivered status value cannot equal the pending status 'pending'; a delivered \
             document must be advanced OUT of pending or it would re-surface on the change feed \
             forever."
        );
    }

    // R3.62
    #[test]
    fn undeliverable_as_the_delivered_status_is_rejected() {
        let err = settings("undeliverable", 86_400).validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "The delivered status value cannot equal the undeliverable status 'undeliverable'; it \
             is the terminal state of an Undeliverable Outbox Document, so a delivered document \
             stamped with it would be indistinguishable from one the relay gave up on."
        );
    }

    // R3.63, R3.68
    #[test]
    fn delivered_done_and_the_defaults_are_accepted() {
        settings("delivered", 1).validate().unwrap();
        settings("done", 999).validate().unwrap();
        settings("Pending", 1).validate().unwrap();
        let defaults = DeliverySettings::default();
        assert_eq!(defaults, settings("delivered", 86_400));
        defaults.validate().unwrap();
    }

    // R3.64
    #[test]
    fn a_ttl_that_is_not_positive_is_rejected() {
        for ttl in [0, -1, -86_400] {
            let err = settings("delivered", ttl).validate().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "The delivered TTL must be a positive number of seconds (got {ttl}); \
                     'delivered but retained' (0, -1, or any negative) is out of scope."
                )
            );
        }
    }

    // Check order: the status is judged before the ttl.
    #[test]
    fn the_status_is_checked_before_the_ttl() {
        assert_eq!(
            settings("pending", 0).validate(),
            Err(DeliverySettingsError::StatusIsPending)
        );
    }
}
