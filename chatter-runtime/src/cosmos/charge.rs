//! Request charges: the Request Units (RU) Cosmos DB bills for each response, summed per
//! runtime for the document tier's commands and for the relay's messages.
//!
//! The figures come from each response's `x-ms-request-charge`. The emulator's are nominal;
//! against an account they are what the partition's RU budget pays, so RU per relayed message
//! against the 10,000 RU/s a physical partition serves says how far the relay can go.

use std::sync::{Mutex, PoisonError};

/// What a runtime's store requests were billed so far: read it with
/// [`Runtime::request_charges`](crate::Runtime::request_charges).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct RequestCharges {
    /// Commands whose batch the service answered (committed, duplicate or rolled back).
    pub commands: u64,
    /// RU billed for those batches, and for the point reads that confirmed duplicates.
    pub command_request_units: f64,
    /// Outbox Documents the relay stamped (delivered after publishing, or undeliverable).
    pub relayed_messages: u64,
    /// RU billed for the relay's change-feed reads that returned documents and for its stamps.
    /// Lease writes (renewals, checkpoints) and empty reads are the change-feed processor's own
    /// cost and are not in it.
    pub relay_request_units: f64,
}

impl RequestCharges {
    /// RU per command, when any command was handled.
    pub fn per_command(&self) -> Option<f64> {
        average(self.command_request_units, self.commands)
    }

    /// RU per relayed message, when any message was relayed.
    pub fn per_relayed_message(&self) -> Option<f64> {
        average(self.relay_request_units, self.relayed_messages)
    }
}

#[allow(clippy::cast_precision_loss)] // a count beyond 2^52 loses precision an average can spare
fn average(total: f64, count: u64) -> Option<f64> {
    (count > 0).then(|| total / count as f64)
}

/// Sums [`RequestCharges`] for one runtime; its pipeline and its relay share it.
#[derive(Debug, Default)]
pub(crate) struct RequestMeter(Mutex<RequestCharges>);

impl RequestMeter {
    fn update(&self, change: impl FnOnce(&mut RequestCharges)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// One command's batch was answered, billed `request_units`.
    pub(crate) fn command(&self, request_units: f64) {
        self.update(|c| {
            c.commands += 1;
            c.command_request_units += request_units;
        });
    }

    /// A command's further request (a duplicate's confirming read), billed `request_units`.
    pub(crate) fn command_extra(&self, request_units: f64) {
        self.update(|c| c.command_request_units += request_units);
    }

    /// The relay made a request billed `request_units` (a page read, a stamp).
    pub(crate) fn relay(&self, request_units: f64) {
        self.update(|c| c.relay_request_units += request_units);
    }

    /// The relay stamped `messages` more Outbox Documents.
    pub(crate) fn relayed(&self, messages: u64) {
        self.update(|c| c.relayed_messages += messages);
    }

    /// The sums so far.
    pub(crate) fn snapshot(&self) -> RequestCharges {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_are_per_command_and_per_relayed_message_and_absent_before_any() {
        let meter = RequestMeter::default();
        assert_eq!(meter.snapshot().per_command(), None);
        assert_eq!(meter.snapshot().per_relayed_message(), None);
        meter.command(10.0);
        meter.command(12.0);
        meter.command_extra(1.0);
        meter.relay(3.0);
        meter.relay(10.0);
        meter.relay(10.0);
        meter.relayed(2);
        let charges = meter.snapshot();
        assert_eq!(charges.commands, 2);
        assert_eq!(charges.per_command(), Some(11.5));
        assert_eq!(charges.relayed_messages, 2);
        assert_eq!(charges.per_relayed_message(), Some(11.5));
    }
}
