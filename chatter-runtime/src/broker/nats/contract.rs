//! The start-time checks: the server and the streams can carry what chatter publishes, and
//! deduplicate what the relay publishes again.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Inner, MIN_MAX_PAYLOAD};
use crate::broker::{BrokerContract, BrokerError};

impl Inner {
    pub(super) async fn verify(&self, contract: &BrokerContract) -> Result<(), BrokerError> {
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
            let name = self.stream_of(destination).await.map_err(|_| {
                BrokerError::Misconfigured {
                    setting: format!("`subjects` of the JetStream streams at `{}`", self.url),
                    problem: format!("cover no stream for `{destination}`, which chatter consumes or dead-letters to"),
                    fix: format!(
                        "add `{destination}` to a stream's subjects (`nats stream edit <stream> --subjects ...`, or `nats stream add`)"
                    ),
                }
            })?;
            if checked.insert(name.clone()) {
                self.verify_stream(&name, contract.republish_within).await?;
            }
        }
        Ok(())
    }

    async fn verify_stream(
        &self,
        name: &str,
        republish_within: Duration,
    ) -> Result<(), BrokerError> {
        let mut stream = self
            .jetstream
            .get_stream(name)
            .await
            .map_err(|e| BrokerError::transport(format!("get stream `{name}`"), e))?;
        let config = &stream
            .info()
            .await
            .map_err(|e| BrokerError::transport(format!("stream `{name}` info"), e))?
            .config;
        if config.duplicate_window <= republish_within {
            return Err(BrokerError::Misconfigured {
                setting: format!("`duplicate_window` of stream `{name}`"),
                problem: format!(
                    "is {:?}, and the relay may publish a message again up to {republish_within:?} \
                     after the first time (its lease expiry plus the drain suspension window), \
                     which the stream would then store twice",
                    config.duplicate_window
                ),
                fix: format!(
                    "raise it above {republish_within:?} (`nats stream edit {name} --dupe-window {}s`)",
                    republish_within.as_secs() + 60
                ),
            });
        }
        // -1 (the default) is no limit of the stream's own.
        let max_msg_size = config.max_message_size;
        if max_msg_size >= 0 && (max_msg_size as i64) < MIN_MAX_PAYLOAD as i64 {
            return Err(BrokerError::Misconfigured {
                setting: format!("`max_msg_size` of stream `{name}`"),
                problem: format!(
                    "is {max_msg_size} bytes, and a message carries a Cosmos document of up to \
                     {MIN_MAX_PAYLOAD} bytes"
                ),
                fix: format!(
                    "raise it (`nats stream edit {name} --max-msg-size 2MB`) or remove it (-1)"
                ),
            });
        }
        Ok(())
    }
}
