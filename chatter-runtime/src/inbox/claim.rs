//! Whether a pending Claimed Inbox Marker's claim may still be live: its claimant's handler may
//! be running now. Judged by the service's clock where the marker gives it (`_ts`), so a
//! claimant's clock never matters; the reader's own clock is trusted within the options'
//! clock margin.

use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::InboxOptions;
use crate::document::inbox_marker::{CLAIM_SECONDS_FIELD, RECEIVED_AT_UTC_FIELD};

/// What a pending marker's claim is at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    /// Its attempt ended without completing (the handler failed) and released it.
    Released,
    /// It ran out: its attempt crashed, was stopped, or could not release it.
    RanOut,
    /// A marker the .NET module (or a chatter before claims had a length) wrote: its claim's
    /// length is unknown, and it is judged by its `ReceivedAtUtc` and this reader's own claim
    /// timeout; it ran out.
    RanOutUnbounded,
    /// Its handler may still be running, for at most this long.
    Live {
        /// The longest it can stay live.
        for_at_most: Duration,
    },
}

/// The claim of the pending marker `stored`, at `now` (this reader's clock).
pub(super) fn state(stored: &Value, options: &InboxOptions, now: OffsetDateTime) -> State {
    let margin = options.clock_margin;
    let (until, ran_out) = match stored.get(CLAIM_SECONDS_FIELD).and_then(Value::as_u64) {
        Some(0) => return State::Released,
        Some(seconds) => {
            // `_ts` is whole seconds: the write may have landed up to a second later.
            let written = stored
                .get("_ts")
                .and_then(Value::as_i64)
                .and_then(|ts| OffsetDateTime::from_unix_timestamp(ts.saturating_add(1)).ok())
                .or_else(|| received_at(stored));
            let Some(written) = written else {
                return State::RanOut;
            };
            (
                written
                    .checked_add(time::Duration::seconds(
                        i64::try_from(seconds).unwrap_or(i64::MAX),
                    ))
                    .and_then(|at| at.checked_add(to_time(margin))),
                State::RanOut,
            )
        }
        None => {
            let Some(received) = received_at(stored) else {
                return State::RanOutUnbounded;
            };
            (
                received
                    .checked_add(to_time(options.claim_timeout))
                    .and_then(|at| at.checked_add(to_time(margin))),
                State::RanOutUnbounded,
            )
        }
    };
    // An end beyond what time can hold never comes.
    let Some(until) = until else {
        return State::Live {
            for_at_most: Duration::MAX,
        };
    };
    if now > until {
        return ran_out;
    }
    State::Live {
        for_at_most: Duration::try_from(until - now).unwrap_or_default(),
    }
}

fn received_at(stored: &Value) -> Option<OffsetDateTime> {
    let text = stored.get(RECEIVED_AT_UTC_FIELD)?.as_str()?;
    OffsetDateTime::parse(text, &Rfc3339).ok()
}

fn to_time(duration: Duration) -> time::Duration {
    time::Duration::try_from(duration).unwrap_or(time::Duration::MAX)
}

/// The far future a deadline saturates to: a duration too large for an `Instant`.
pub(super) fn far_future() -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// Logs a take-over by what ended the claim it replaced: a retry after a failed attempt is
/// routine; a claim that ran out means an attempt stopped in the middle (its process crashed,
/// its handler was stopped at the timeout), so its handler may have run in part.
pub(super) fn log_take_over(message_id: &str, previous: &State) {
    match previous {
        State::Released => tracing::debug!(
            message_id,
            "chatter inbox runs a message again after its earlier attempt failed"
        ),
        State::RanOut | State::RanOutUnbounded => tracing::warn!(
            message_id,
            "chatter inbox takes over a claim that ran out: an earlier attempt stopped before it completed (a crash or a timeout), and its handler may have run in part"
        ),
        State::Live { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    fn options() -> InboxOptions {
        InboxOptions::new("db", "idempotency")
            .claim_timeout(Duration::from_secs(60))
            .clock_margin(Duration::from_secs(10))
    }

    const WRITTEN: i64 = 1_800_000_000;

    fn at(seconds_after_write: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(WRITTEN + seconds_after_write).unwrap()
    }

    #[test]
    fn a_claim_is_live_for_its_seconds_after_the_store_wrote_it_plus_a_second_and_the_margin() {
        let marker = json!({ "ClaimSeconds": 60, "_ts": WRITTEN, "Completed": false });
        assert_eq!(
            state(&marker, &options(), at(0)),
            State::Live {
                for_at_most: Duration::from_secs(71)
            }
        );
        assert!(matches!(
            state(&marker, &options(), at(71)),
            State::Live { .. }
        ));
        assert_eq!(state(&marker, &options(), at(72)), State::RanOut);
    }

    #[test]
    fn a_released_claim_is_over_at_once() {
        let marker = json!({ "ClaimSeconds": 0, "_ts": WRITTEN });
        assert_eq!(state(&marker, &options(), at(0)), State::Released);
    }

    #[test]
    fn a_marker_without_claim_seconds_is_judged_by_its_received_time_and_this_readers_timeout() {
        let received = datetime!(2027-01-15 08:00:00 UTC);
        let marker = json!({ "ReceivedAtUtc": "2027-01-15T08:00:00.1234567Z", "Completed": false });
        assert!(matches!(
            state(&marker, &options(), received + time::Duration::seconds(70)),
            State::Live { .. }
        ));
        assert_eq!(
            state(&marker, &options(), received + time::Duration::seconds(71)),
            State::RanOutUnbounded
        );
        let unreadable = json!({ "ReceivedAtUtc": "yesterday" });
        assert_eq!(
            state(&unreadable, &options(), received),
            State::RanOutUnbounded
        );
    }

    #[test]
    fn a_claim_too_long_for_time_to_hold_stays_live() {
        let marker = json!({ "ClaimSeconds": u64::MAX, "_ts": WRITTEN });
        assert!(matches!(
            state(&marker, &options(), at(1_000_000)),
            State::Live { .. }
        ));
    }
}
