//! Reaching a broker, for `dead-letters` and `relay`: which kind, and its URL, which may hold a
//! password, so it is read from a file or the environment (never a flag) and kept out of every
//! message.

use std::path::Path;

use chatter_runtime::broker::{BrokerError, NatsBroker, RabbitMqBroker};
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

/// `message` without the secret part of `url` (what precedes its host: scheme, user and
/// password), wherever a client library quoted the URL as given.
fn scrub(message: &str, url: &str) -> String {
    match url.rfind('@') {
        Some(at) if at > 0 => {
            // The user stays when `//` shows where it starts and a `:` where it ends.
            let secret = match url.find("://") {
                Some(scheme) if scheme + 3 < at => {
                    let userinfo = &url[scheme + 3..at];
                    match userinfo.split_once(':') {
                        Some((user, _)) => {
                            (&url[..at], format!("{}{user}:***", &url[..scheme + 3]))
                        }
                        None => (&url[..at], format!("{}***", &url[..scheme + 3])),
                    }
                }
                _ => (&url[..at], "***".to_owned()),
            };
            message.replace(secret.0, &secret.1)
        }
        _ => message.to_owned(),
    }
}
