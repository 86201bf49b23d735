//! Reaching a broker, for `dead-letters` and `relay`: which kind, and its URL, which may hold a
//! password, so it is read from a file or the environment (never a flag) and kept out of every
//! message.

use std::path::Path;

use chatter_runtime::broker::{BrokerError, NatsBroker, RabbitMqBroker, redact_uri};
use clap::ValueEnum;
use serde::Deserialize;

use crate::failure::{Failure, chain};

/// The kinds of broker the command reaches (`--broker` of `dead-letters`, `kind` in a relay's
/// file).
#[derive(Debug, Clone, Copy, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BrokerKind {
    Rabbitmq,
    Nats,
}

/// A broker of either kind, connected.
pub(crate) enum Connected {
    Rabbitmq(RabbitMqBroker),
    Nats(NatsBroker),
}

/// Connects to the broker of `kind` at the URL from `file` or the environment ([`read`]); an
/// error names the URL without its password.
pub(crate) async fn connect(
    kind: BrokerKind,
    file: Option<&Path>,
    file_hint: &str,
) -> Result<Connected, Failure> {
    let url = read(file, file_hint)?;
    let unreachable = |e: BrokerError| {
        Failure::Store(scrub(
            &format!("cannot reach the broker: {}", chain(&e)),
            &url,
        ))
    };
    Ok(match kind {
        BrokerKind::Rabbitmq => {
            Connected::Rabbitmq(RabbitMqBroker::connect(&url).await.map_err(unreachable)?)
        }
        BrokerKind::Nats => Connected::Nats(NatsBroker::connect(&url).await.map_err(unreachable)?),
    })
}

/// The environment variable holding the broker's URL (it may carry a password).
const BROKER_URL_ENV: &str = "CHATTER_BROKER_URL";

/// The broker's URL from `file`, else from `CHATTER_BROKER_URL` (never a flag: it may hold a
/// password, and is never printed). `file_hint` names where the subcommand takes the file
/// (`--broker-url-file`, or `url_file` in a relay's file).
fn read(file: Option<&Path>, file_hint: &str) -> Result<String, Failure> {
    match file {
        Some(path) => Ok(std::fs::read_to_string(path)
            .map_err(|e| {
                Failure::Input(format!(
                    "cannot read the broker URL file {}: {e}",
                    path.display()
                ))
            })?
            .trim()
            .to_owned()),
        None => std::env::var(BROKER_URL_ENV)
            .ok()
            .filter(|url| !url.trim().is_empty())
            .ok_or_else(|| {
                Failure::Input(format!(
                    "no broker URL: set {BROKER_URL_ENV} or {file_hint}"
                ))
            }),
    }
}

/// `message` with `url` redacted as the runtime redacts it ([`redact_uri`]) wherever a client
/// library quoted the URL as given: what precedes its host (scheme, user, password) is
/// replaced, the rest kept.
fn scrub(message: &str, url: &str) -> String {
    let Some(at) = url.rfind('@').filter(|at| *at > 0) else {
        return message.to_owned();
    };
    let (secret, host) = url.split_at(at);
    let redacted = redact_uri(url);
    match redacted.strip_suffix(host) {
        Some(shown) if shown != secret => message.replace(secret, shown),
        // A URL the runtime leaves as it is (an `@` before its `://`): all of it goes.
        _ => message.replace(secret, "***"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URLS: [&str; 4] = [
        "amqp://guest:s3cret@127.0.0.1:5672/%2f",
        "nats://T0KEN@127.0.0.1:4222",
        "guest:s3cret@127.0.0.1:5672",
        "amqp://127.0.0.1:5672",
    ];

    #[test]
    fn a_message_quoting_the_url_shows_it_as_the_runtime_redacts_it() {
        for url in URLS {
            let said = format!("connection to {url} refused (os error 111)");
            assert_eq!(
                scrub(&said, url),
                format!("connection to {} refused (os error 111)", redact_uri(url))
            );
        }
        let said = scrub(
            "auth failed for amqp://guest:s3cret@host/",
            "amqp://guest:s3cret@host/",
        );
        assert!(!said.contains("s3cret"), "{said}");
    }

    #[test]
    fn a_url_the_runtime_leaves_as_it_is_loses_what_precedes_its_last_at() {
        let url = "user:pw@host://x";
        assert_eq!(scrub(&format!("at {url}"), url), "at ***@host://x");
        assert_eq!(scrub("nothing quoted", url), "nothing quoted");
    }
}
