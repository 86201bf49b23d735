//! The start-time checks: the server and the streams can carry what chatter publishes, and
//! deduplicate what the relay publishes again.

use std::collections::BTreeSet;
use std::sync::PoisonError;
use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};

use super::{Inner, MIN_MAX_PAYLOAD};
use crate::broker::{BrokerContract, BrokerError, Refusal};
use crate::error_chain::ErrorChain;

impl Inner {
    pub(super) async fn verify(&self, contract: &BrokerContract) -> Result<(), BrokerError> {
        *self
            .republish_within
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = contract.republish_within;
        let max_payload = self.client.server_info().max_payload;
        if max_payload < MIN_MAX_PAYLOAD {
            return Err(BrokerError::Misconfigured {
                setting: format!("`max_payload` of the NATS server at `{}`", self.url),
                problem: format!(
                    "is {max_payload} bytes, and a message carries a Cosmos document of up to \
                     {MIN_MAX_PAYLOAD} bytes"
                ),
                fix:
                    "set `max_payload: 2MB` (or more) in the server's configuration and restart it"
                        .to_owned(),
            });
        }
        let mut checked = BTreeSet::new();
        for destination in &contract.destinations {
            let name = self.stream_of(destination).await.map_err(|error| {
                if error.refusal() != Some(Refusal::NoStream) {
                    return error;
                }
                BrokerError::Misconfigured {
                    setting: format!("`subjects` of the JetStream streams at `{}`", self.url),
                    problem: format!("cover no stream for `{destination}`, which chatter consumes or dead-letters to"),
                    fix: format!(
                        "add `{destination}` to a stream's subjects (`nats stream edit <stream> --subjects ...`, or `nats stream add`)"
                    ),
                }
            })?;
            if checked.insert(name.clone()) {
                let config = self.stream_config(&name).await?;
                verify_stream(&name, &config, contract.republish_within)?;
                self.streams_checked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name);
            }
        }
        Ok(())
    }

    /// Stream `name`'s configuration, as `get_stream` brings it (one request).
    async fn stream_config(&self, name: &str) -> Result<Config, BrokerError> {
        let stream = self
            .jetstream
            .get_stream(name)
            .await
            .map_err(|e| BrokerError::transport(format!("get stream `{name}`"), e))?;
        Ok(stream.cached_info().config.clone())
    }

    /// After a publish stored in `stream`: the first time this broker publishes to a stream
    /// [`verify`](Self::verify) did not check (one only the relay publishes to), checks its
    /// duplicate window in the background and logs at Error when a republish could outlast it.
    pub(super) fn check_window_once(&self, stream: &str) {
        let republish_within = *self
            .republish_within
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if republish_within.is_zero()
            || !self
                .streams_checked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(stream.to_owned())
        {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.clone();
        let stream = stream.to_owned();
        handle.spawn(async move {
            let checked = match inner.stream_config(&stream).await {
                Ok(config) => verify_stream(&stream, &config, republish_within),
                Err(error) => Err(error),
            };
            if let Err(error) = checked {
                tracing::error!(stream, error = %ErrorChain(&error), "chatter publishes to a NATS stream that can store a republished message twice or lose one; change the stream");
            }
        });
    }
}

/// Whether stream `name` keeps every message until it is read, takes a Cosmos document, and
/// deduplicates for longer than `republish_within`.
fn verify_stream(
    name: &str,
    config: &Config,
    republish_within: Duration,
) -> Result<(), BrokerError> {
    let misconfigured = |setting: &str, problem: String, fix: String| BrokerError::Misconfigured {
        setting: format!("`{setting}` of stream `{name}`"),
        problem,
        fix,
    };
    if config.retention == RetentionPolicy::Interest {
        return Err(misconfigured(
            "retention",
            "is interest: a message published before chatter's consumer binds is dropped".into(),
            format!("use limits or work-queue retention (recreate the stream `{name}`)"),
        ));
    }
    if config.storage == StorageType::Memory {
        return Err(misconfigured(
            "storage",
            "is memory: every message the relay stamped delivered is lost when the server restarts"
                .into(),
            format!("use file storage (recreate the stream `{name}`)"),
        ));
    }
    if !republish_within.is_zero() && config.duplicate_window <= republish_within {
        return Err(misconfigured(
            "duplicate_window",
            format!(
                "is {:?}, and a running relay may publish a message again up to \
                 {republish_within:?} after the first time (its lease expiry plus the drain \
                 suspension window), which the stream would then store twice",
                config.duplicate_window
            ),
            format!(
                "raise it above {republish_within:?} (`nats stream edit {name} --dupe-window {}s`)",
                republish_within.as_secs().saturating_add(60)
            ),
        ));
    }
    // -1 (the default) is no limit of the stream's own.
    let max_msg_size = i64::from(config.max_message_size);
    if max_msg_size >= 0 && max_msg_size < MIN_MAX_PAYLOAD as i64 {
        return Err(misconfigured(
            "max_msg_size",
            format!(
                "is {max_msg_size} bytes, and a message carries a Cosmos document of up to \
                 {MIN_MAX_PAYLOAD} bytes"
            ),
            format!("raise it (`nats stream edit {name} --max-msg-size 2MB`) or remove it (-1)"),
        ));
    }
    let limited = config.max_age > Duration::ZERO
        || config.max_messages > 0
        || config.max_bytes > 0
        || config.max_messages_per_subject > 0;
    if limited && config.discard == DiscardPolicy::Old {
        tracing::warn!(
            stream = name,
            max_age = ?config.max_age,
            max_messages = config.max_messages,
            max_bytes = config.max_bytes,
            "a NATS stream chatter uses discards its oldest messages at its limits, read or not: a message that waits past them is lost"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_republish_bound_of_duration_max_refuses_every_window_without_overflowing() {
        let config = Config {
            duplicate_window: Duration::from_secs(300),
            ..Config::default()
        };
        let error = verify_stream("ORDERS", &config, Duration::MAX).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`duplicate_window` of stream `ORDERS`"),
            "{error}"
        );
    }
}
