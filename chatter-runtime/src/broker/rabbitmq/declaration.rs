//! How a destination's queue is declared: a durable classic queue when chatter makes it, or the
//! queue type and delivery limit an existing queue was made with, learned from the server.
//!
//! AMQP cannot read a queue's arguments. A `queue.declare` whose arguments differ from the
//! queue's is refused with a reply naming the first argument that differs and its current value
//! (`inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current
//! is 'quorum'`). Chatter declares with `x-queue-type: classic` first and adopts what such a
//! reply says of the two arguments it accepts either way, `x-queue-type` (classic or quorum) and
//! `x-delivery-limit`, until a declaration is taken; a reply about any other argument refuses
//! the queue.

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// The delivery limit RabbitMQ 4 gives a quorum queue declared without `x-delivery-limit`
/// (RabbitMQ 3 gives none; the two cannot be told apart over AMQP, so chatter assumes it).
pub(super) const DEFAULT_QUORUM_DELIVERY_LIMIT: i64 = 20;

const QUEUE_TYPE: &str = "x-queue-type";
const DELIVERY_LIMIT: &str = "x-delivery-limit";

/// The arguments chatter declares one queue with.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Declaration {
    /// `x-queue-type`; `None` when the server reported the queue has none.
    queue_type: Option<String>,
    /// `x-delivery-limit` as the server holds it, declared again with the AMQP type the server
    /// reported.
    delivery_limit: Option<AMQPValue>,
}

impl Default for Declaration {
    /// A classic queue, as chatter makes one.
    fn default() -> Self {
        Self {
            queue_type: Some("classic".to_owned()),
            delivery_limit: None,
        }
    }
}

impl std::fmt::Display for Declaration {
    /// `x-queue-type: quorum, x-delivery-limit: 10`, as it is declared.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.queue_type {
            Some(queue_type) => write!(f, "{QUEUE_TYPE}: {queue_type}")?,
            None => write!(f, "no {QUEUE_TYPE}")?,
        }
        match self.delivery_limit.as_ref().and_then(integer) {
            Some(limit) => write!(f, ", {DELIVERY_LIMIT}: {limit}"),
            None => Ok(()),
        }
    }
}

/// What a declaration says of the queue's delivery limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeliveryLimit {
    /// The queue drops (or dead-letters) a message after it was delivered this many times more
    /// than once: a quorum queue's `x-delivery-limit`, or RabbitMQ 4's default.
    Limited {
        limit: i64,
        /// Whether the limit is the queue's own argument rather than the assumed default.
        declared: bool,
    },
    /// A classic queue, or a quorum queue declared without limit (a negative one).
    Unlimited,
}

impl Declaration {
    /// The `queue.declare` arguments.
    pub(super) fn arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        if let Some(queue_type) = &self.queue_type {
            arguments.insert(
                ShortString::from(QUEUE_TYPE),
                AMQPValue::LongString(LongString::from(queue_type.as_str())),
            );
        }
        if let Some(limit) = &self.delivery_limit {
            arguments.insert(ShortString::from(DELIVERY_LIMIT), limit.clone());
        }
        arguments
    }

    pub(super) fn is_quorum(&self) -> bool {
        self.queue_type.as_deref() == Some("quorum")
    }

    pub(super) fn delivery_limit(&self) -> DeliveryLimit {
        if !self.is_quorum() {
            return DeliveryLimit::Unlimited;
        }
        match self.delivery_limit.as_ref().and_then(integer) {
            Some(limit) if limit < 0 => DeliveryLimit::Unlimited,
            Some(limit) => DeliveryLimit::Limited {
                limit,
                declared: true,
            },
            None => DeliveryLimit::Limited {
                limit: DEFAULT_QUORUM_DELIVERY_LIMIT,
                declared: false,
            },
        }
    }

    /// Takes the server's current value of the argument a refused declaration named; `false`
    /// when chatter does not declare queues that way (another argument, or a queue type other
    /// than classic and quorum), so the refusal stands.
    pub(super) fn adopt(&mut self, inequivalent: &Inequivalent) -> bool {
        match (inequivalent.argument.as_str(), &inequivalent.current) {
            (QUEUE_TYPE, None) => self.queue_type = None,
            (QUEUE_TYPE, Some(current))
                if matches!(current.value.as_str(), "classic" | "quorum") =>
            {
                self.queue_type = Some(current.value.clone());
            }
            (DELIVERY_LIMIT, None) => self.delivery_limit = None,
            (DELIVERY_LIMIT, Some(current)) => match typed(current, self.delivery_limit.as_ref()) {
                Some(value) => self.delivery_limit = Some(value),
                None => return false,
            },
            _ => return false,
        }
        true
    }
}

/// An argument's value as a refusal reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reported {
    value: String,
    /// The AMQP type's name (`signedint`, `long`, ...) when the reply gives it (it does when the
    /// type differs from the one declared).
    kind: Option<String>,
}

/// A `PRECONDITION_FAILED` reply to `queue.declare`: the first argument whose value differs,
/// and the queue's current value of it (`None`: the queue does not have it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Inequivalent {
    pub(super) argument: String,
    current: Option<Reported>,
}

impl Inequivalent {
    /// Reads a server reply such as `inequivalent arg 'x-delivery-limit' for queue 'q' in vhost
    /// '/': received none but current is the value '5' of type 'signedint'`; `None` for any
    /// other reply (a durability or exclusivity mismatch, say).
    pub(super) fn parse(reply: &str) -> Option<Self> {
        let (_, rest) = reply.split_once("inequivalent arg '")?;
        let (argument, rest) = rest.split_once('\'')?;
        let (_, current) = rest.rsplit_once(" but current is ")?;
        let current = current.trim();
        let current = if current == "none" {
            None
        } else if let Some(typed) = current.strip_prefix("the value '") {
            let (value, rest) = typed.split_once('\'')?;
            let kind = rest.strip_prefix(" of type '")?.strip_suffix('\'')?;
            Some(Reported {
                value: value.to_owned(),
                kind: Some(kind.to_owned()),
            })
        } else {
            let value = current.strip_prefix('\'')?.strip_suffix('\'')?;
            Some(Reported {
                value: value.to_owned(),
                kind: None,
            })
        };
        Some(Self {
            argument: argument.to_owned(),
            current,
        })
    }
}

/// `reported` as the AMQP value to declare: of the type the reply names, or (when it names none,
/// as the type did not differ) of the type `sent` had.
fn typed(reported: &Reported, sent: Option<&AMQPValue>) -> Option<AMQPValue> {
    let value = &reported.value;
    let kind = match (&reported.kind, sent) {
        (Some(kind), _) => kind.as_str(),
        (None, Some(sent)) => type_name(sent)?,
        (None, None) => return None,
    };
    Some(match kind {
        "byte" => AMQPValue::ShortShortInt(value.parse().ok()?),
        "unsignedbyte" => AMQPValue::ShortShortUInt(value.parse().ok()?),
        "short" => AMQPValue::ShortInt(value.parse().ok()?),
        "unsignedshort" => AMQPValue::ShortUInt(value.parse().ok()?),
        "signedint" => AMQPValue::LongInt(value.parse().ok()?),
        "unsignedint" => AMQPValue::LongUInt(value.parse().ok()?),
        "long" => AMQPValue::LongLongInt(value.parse().ok()?),
        _ => return None,
    })
}

/// RabbitMQ's name of an integer value's AMQP type.
fn type_name(value: &AMQPValue) -> Option<&'static str> {
    Some(match value {
        AMQPValue::ShortShortInt(_) => "byte",
        AMQPValue::ShortShortUInt(_) => "unsignedbyte",
        AMQPValue::ShortInt(_) => "short",
        AMQPValue::ShortUInt(_) => "unsignedshort",
        AMQPValue::LongInt(_) => "signedint",
        AMQPValue::LongUInt(_) => "unsignedint",
        AMQPValue::LongLongInt(_) => "long",
        _ => return None,
    })
}

/// An integer argument or header of any AMQP integer type.
pub(super) fn integer(value: &AMQPValue) -> Option<i64> {
    Some(match value {
        AMQPValue::ShortShortInt(n) => i64::from(*n),
        AMQPValue::ShortShortUInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::ShortUInt(n) => i64::from(*n),
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The declaration after the server refused the previous ones with `replies`; `None` once
    /// one of them stands.
    fn declared_after(replies: &[&str]) -> Option<Declaration> {
        let mut declaration = Declaration::default();
        for reply in replies {
            let inequivalent = Inequivalent::parse(reply)?;
            declaration.adopt(&inequivalent).then_some(())?;
        }
        Some(declaration)
    }

    #[test]
    fn a_quorum_queue_with_a_typed_delivery_limit_is_declared_with_that_value_and_type() {
        let declaration = declared_after(&[
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current is 'quorum'",
            "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received none but current is the value '5' of type 'signedint'",
        ])
        .unwrap();
        assert!(declaration.is_quorum());
        assert_eq!(
            declaration.delivery_limit(),
            DeliveryLimit::Limited {
                limit: 5,
                declared: true
            }
        );
        let arguments = declaration.arguments();
        assert_eq!(
            arguments.inner().get(DELIVERY_LIMIT),
            Some(&AMQPValue::LongInt(5))
        );
        assert_eq!(
            declaration.to_string(),
            "x-queue-type: quorum, x-delivery-limit: 5"
        );
    }

    #[test]
    fn a_limit_reported_without_type_keeps_the_type_declared() {
        let declaration = declared_after(&[
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current is 'quorum'",
            "inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received none but current is the value '7' of type 'long'",
            "inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received '7' but current is '9'",
        ])
        .unwrap();
        assert_eq!(
            declaration.arguments().inner().get(DELIVERY_LIMIT),
            Some(&AMQPValue::LongLongInt(9))
        );
    }

    #[test]
    fn a_quorum_queue_without_limit_is_taken_to_have_rabbitmq_4s_default() {
        let declaration = declared_after(&[
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current is 'quorum'",
        ])
        .unwrap();
        assert_eq!(
            declaration.delivery_limit(),
            DeliveryLimit::Limited {
                limit: DEFAULT_QUORUM_DELIVERY_LIMIT,
                declared: false
            }
        );
    }

    #[test]
    fn a_negative_limit_and_a_classic_queue_are_unlimited() {
        let unlimited = declared_after(&[
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current is 'quorum'",
            "inequivalent arg 'x-delivery-limit' for queue 'q' in vhost '/': received none but current is the value '-1' of type 'signedint'",
        ])
        .unwrap();
        assert_eq!(unlimited.delivery_limit(), DeliveryLimit::Unlimited);
        assert_eq!(
            Declaration::default().delivery_limit(),
            DeliveryLimit::Unlimited
        );
    }

    #[test]
    fn a_queue_without_type_argument_is_declared_without_one() {
        let declaration = declared_after(&[
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received the value 'classic' of type 'longstr' but current is none",
        ])
        .unwrap();
        assert!(declaration.arguments().inner().is_empty());
    }

    #[test]
    fn other_arguments_and_queue_types_are_not_adopted() {
        for refused in [
            "inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but current is the value '10' of type 'signedint'",
            "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': received 'classic' but current is 'stream'",
            "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'",
        ] {
            assert_eq!(declared_after(&[refused]), None, "{refused}");
        }
    }

    #[test]
    fn replies_that_are_no_argument_mismatch_are_not_read_as_one() {
        assert_eq!(
            Inequivalent::parse(
                "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
            )
            .map(|i| i.argument),
            Some("durable".to_owned())
        );
        assert_eq!(
            Inequivalent::parse("ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"),
            None
        );
        assert_eq!(
            Inequivalent::parse("inequivalent arg 'x-delivery-limit' cut short"),
            None
        );
    }
}
