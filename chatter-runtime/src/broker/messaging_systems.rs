//! A broker per message: several brokers, each under the name of its messaging system, and the
//! one a message goes to chosen by the messaging system its context names
//! (`Chatter.Infrastructure.Type`), as the .NET module chooses its dispatcher. A message that
//! names none goes to the default broker.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::{Broker, BrokerContract, BrokerError, Refusal, Subscription};
use crate::document::outbox::INFRASTRUCTURE_TYPE_CONTEXT_KEY;
use crate::message::BrokeredMessage;

/// The brokers of a runtime by messaging system ([`RuntimeBuilder::broker_for`]): `publish`
/// sends each message through the broker its context's `Chatter.Infrastructure.Type` names
/// (compared ignoring ASCII case), and through the default broker when the context names none
/// (absent, null or blank) or names the default broker's own
/// [`messaging_system`](Broker::messaging_system). Subscriptions are the default broker's.
///
/// A message naming a messaging system no broker is registered for is
/// [refused](BrokerError::Refused) with [`Refusal::UnknownMessagingSystem`]: not a verdict on the
/// message (the relay keeps its document pending, the lease shows it as blocked), since
/// registering the broker is the fix.
///
/// [`RuntimeBuilder::broker_for`]: crate::RuntimeBuilder::broker_for
pub struct MessagingSystems {
    default: Arc<dyn Broker>,
    /// By name, ASCII-lowercased: names are compared ignoring ASCII case.
    named: BTreeMap<String, Arc<dyn Broker>>,
}

impl std::fmt::Debug for MessagingSystems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessagingSystems")
            .field("default", &self.default.messaging_system())
            .field("named", &self.named.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MessagingSystems {
    /// `default` for every message, until others are added [`with`](Self::with) a name.
    pub fn new(default: Arc<dyn Broker>) -> Self {
        Self {
            default,
            named: BTreeMap::new(),
        }
    }

    /// Adds `broker` for the messages whose context names `messaging_system` (trimmed, ignoring
    /// ASCII case); it wins over the default broker's own system name. A name given twice
    /// (ignoring case) keeps the later broker;
    /// [`RuntimeBuilder::start`](crate::RuntimeBuilder::start) refuses that, and a blank name,
    /// before it gets here.
    pub fn with(mut self, messaging_system: &str, broker: Arc<dyn Broker>) -> Self {
        self.named
            .insert(messaging_system.trim().to_ascii_lowercase(), broker);
        self
    }

    /// The broker `message` goes to.
    fn route(&self, message: &BrokeredMessage) -> Result<&dyn Broker, BrokerError> {
        let name = match message.context.get(INFRASTRUCTURE_TYPE_CONTEXT_KEY) {
            None | Some(Value::Null) => return Ok(self.default.as_ref()),
            Some(Value::String(name)) if name.trim().is_empty() => {
                return Ok(self.default.as_ref());
            }
            Some(Value::String(name)) => name.trim(),
            // The Outbox Document Contract stamps such a document undeliverable before it is
            // published; a message built otherwise is refused the same way, for good.
            Some(other) => {
                return Err(BrokerError::InvalidMessage {
                    message_id: message.message_id.clone(),
                    destination: message.destination.clone(),
                    reason: format!(
                        "its context's `{INFRASTRUCTURE_TYPE_CONTEXT_KEY}` is not a string \
                         ({other}), so the messaging system it names cannot be read"
                    ),
                });
            }
        };
        if let Some(broker) = self.named.get(&name.to_ascii_lowercase()) {
            return Ok(broker.as_ref());
        }
        if self.default.messaging_system().eq_ignore_ascii_case(name) {
            return Ok(self.default.as_ref());
        }
        let mut known: Vec<&str> = self.named.keys().map(String::as_str).collect();
        known.push(self.default.messaging_system());
        Err(BrokerError::Refused {
            destination: message.destination.clone(),
            refusal: Refusal::UnknownMessagingSystem,
            reply: format!(
                "message `{}` names messaging system `{name}` in its context's \
                 `{INFRASTRUCTURE_TYPE_CONTEXT_KEY}`, and this runtime has no broker for it \
                 (it has: {})",
                message.message_id,
                known.join(", ")
            ),
        })
    }
}

impl Broker for MessagingSystems {
    fn publish(&self, message: BrokeredMessage) -> BoxFuture<'_, Result<(), BrokerError>> {
        match self.route(&message) {
            Ok(broker) => broker.publish(message),
            Err(refused) => Box::pin(std::future::ready(Err(refused))),
        }
    }

    fn subscribe<'a>(
        &'a self,
        destination: &'a str,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.default.subscribe(destination)
    }

    fn subscribe_with_prefetch<'a>(
        &'a self,
        destination: &'a str,
        prefetch: u16,
    ) -> BoxFuture<'a, Result<Subscription, BrokerError>> {
        self.default.subscribe_with_prefetch(destination, prefetch)
    }

    /// The check of the broker `message` goes to. A message naming a messaging system without
    /// a broker passes: registering one is the fix, so its publish is refused (not for good).
    fn check(&self, message: &BrokeredMessage) -> Result<(), BrokerError> {
        match self.route(message) {
            Ok(broker) => broker.check(message),
            Err(error) if error.is_permanent() => Err(error),
            Err(_) => Ok(()),
        }
    }

    fn messaging_system(&self) -> &'static str {
        self.default.messaging_system()
    }

    /// The default broker against the whole `contract` (it serves the consumers); each named
    /// broker without destinations, as those it will carry are not known before messages name
    /// them (a broker that checks what it publishes to later, as NATS does, is given the
    /// republish bound to check against).
    fn verify<'a>(
        &'a self,
        contract: &'a BrokerContract,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        Box::pin(async move {
            self.default.verify(contract).await?;
            let relay_only = BrokerContract {
                destinations: Vec::new(),
                republish_within: contract.republish_within,
                max_delivery_attempts: Default::default(),
            };
            for broker in self.named.values() {
                broker.verify(&relay_only).await?;
            }
            Ok(())
        })
    }
}
