//! `chatter-emulator [--port N] [--refuse METHOD:STATUS:SECONDS]... [--latency-ms N]`: serves the
//! Azure Cosmos DB SDK's in-memory emulator over plain HTTP on 127.0.0.1 (default port 8081)
//! until killed. Data is kept in memory only.
//!
//! Fault injection, off by default: `--refuse PATCH:403:90` answers every `PATCH` (the relay's
//! stamps) with 403 for the first 90 seconds after start; `--latency-ms 5` delays every answer
//! by 5 ms (a store round trip of a real in-region account).
//!
//! Once ready it prints one line, `chatter-emulator listening on http://127.0.0.1:<port>/`, to
//! stdout. Point chatter at it with `CHATTER_COSMOS_ENDPOINT=http://127.0.0.1:<port>/` (no key
//! needed: loopback endpoints default to the Cosmos emulator's well-known key).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use chatter_emulator::{DEFAULT_PORT, EmulatorServer};

const USAGE: &str = "usage: chatter-emulator [--port N] [--refuse METHOD:STATUS:SECONDS]... [--latency-ms N]
  --port N                        listen on 127.0.0.1:N (default 8081; 0 picks a free port)
  --refuse METHOD:STATUS:SECONDS  answer every METHOD request (e.g. PATCH) with STATUS for SECONDS after start
  --latency-ms N                  delay every answer by N milliseconds";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
struct Settings {
    port: u16,
    refusals: Vec<(String, u16, Duration)>,
    latency: Duration,
}

/// Why the command line was refused: each carries the argument, flag or value it refuses.
#[derive(Debug, PartialEq, Eq)]
enum ArgsError {
    /// Not a flag this command knows.
    Unexpected(String),
    /// A flag given without its value.
    MissingValue(String),
    /// `--port`'s value is no port number.
    NotPort(String),
    /// `--latency-ms`'s value is no whole number of milliseconds.
    NotMilliseconds(String),
    /// `--refuse`'s value is not `METHOD:STATUS:SECONDS`.
    NotRefusal(String),
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unexpected(arg) => write!(f, "unexpected argument `{arg}`"),
            Self::MissingValue(flag) => write!(f, "`{flag}` needs a value"),
            Self::NotPort(value) => write!(f, "`{value}` is not a port number"),
            Self::NotMilliseconds(value) => {
                write!(f, "`{value}` is not a number of milliseconds")
            }
            Self::NotRefusal(value) => write!(
                f,
                "`{value}` is not METHOD:STATUS:SECONDS (e.g. PATCH:403:90)"
            ),
        }
    }
}

impl std::error::Error for ArgsError {}

/// The settings, or `None` for `--help`.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<Settings>, ArgsError> {
    let mut args = args.into_iter();
    let mut settings = Settings {
        port: DEFAULT_PORT,
        refusals: Vec::new(),
        latency: Duration::ZERO,
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        if matches!(flag.as_str(), "--help" | "-h") {
            return Ok(None);
        }
        if !matches!(flag.as_str(), "--port" | "-p" | "--refuse" | "--latency-ms") {
            return Err(ArgsError::Unexpected(arg));
        }
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .ok_or_else(|| ArgsError::MissingValue(flag.clone()))?,
        };
        match flag.as_str() {
            "--refuse" => settings.refusals.push(parse_refusal(&value)?),
            "--latency-ms" => {
                let ms = value
                    .parse::<u64>()
                    .map_err(|_| ArgsError::NotMilliseconds(value.clone()))?;
                settings.latency = Duration::from_millis(ms);
            }
            _ => {
                settings.port = value
                    .parse::<u16>()
                    .map_err(|_| ArgsError::NotPort(value.clone()))?;
            }
        }
    }
    Ok(Some(settings))
}

/// `METHOD:STATUS:SECONDS`, e.g. `PATCH:403:90`.
fn parse_refusal(value: &str) -> Result<(String, u16, Duration), ArgsError> {
    let bad = || ArgsError::NotRefusal(value.to_owned());
    let mut parts = value.split(':');
    let (Some(method), Some(status), Some(seconds), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let status = status
        .parse::<u16>()
        .ok()
        .filter(|s| (100..=599).contains(s));
    let seconds = seconds.parse::<u64>().ok();
    match (method.is_empty(), status, seconds) {
        (false, Some(status), Some(seconds)) => Ok((
            method.to_ascii_uppercase(),
            status,
            Duration::from_secs(seconds),
        )),
        _ => Err(bad()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let settings = match parse_args(std::env::args().skip(1)) {
        Ok(Some(settings)) => settings,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(refused) => {
            eprintln!("chatter-emulator: {refused}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let port = settings.port;
    let server = match EmulatorServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("chatter-emulator: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let faults = server.faults();
    faults.set_latency(settings.latency);
    for (method, status, period) in &settings.refusals {
        faults.refuse(method, *status, *period);
        eprintln!("chatter-emulator: refusing {method} with {status} for {period:?}");
    }
    println!("chatter-emulator listening on {}", server.endpoint());
    let _ = std::io::stdout().flush();
    match server.run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chatter-emulator: stopped: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn port(list: &[&str]) -> Result<u16, ArgsError> {
        parse_args(args(list)).map(|s| s.expect("not --help").port)
    }

    #[test]
    fn port_defaults_to_8081_and_accepts_both_spellings() {
        assert_eq!(port(&[]), Ok(8081));
        assert_eq!(port(&["--port", "9000"]), Ok(9000));
        assert_eq!(port(&["--port=0"]), Ok(0));
        assert_eq!(
            port(&["--port"]),
            Err(ArgsError::MissingValue("--port".into()))
        );
        assert_eq!(port(&["--port", "x"]), Err(ArgsError::NotPort("x".into())));
        assert_eq!(
            port(&["--bogus"]),
            Err(ArgsError::Unexpected("--bogus".into()))
        );
        assert_eq!(
            port(&["--bogus"]).unwrap_err().to_string(),
            "unexpected argument `--bogus`"
        );
        assert_eq!(parse_args(args(&["--help"])), Ok(None));
    }

    #[test]
    fn faults_are_off_by_default_and_parsed_when_given() {
        let none = parse_args(args(&[])).unwrap().unwrap();
        assert!(none.refusals.is_empty());
        assert_eq!(none.latency, Duration::ZERO);
        let some = parse_args(args(&[
            "--refuse",
            "patch:403:90",
            "--refuse=PUT:503:5",
            "--latency-ms",
            "5",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            some.refusals,
            [
                ("PATCH".to_owned(), 403, Duration::from_secs(90)),
                ("PUT".to_owned(), 503, Duration::from_secs(5))
            ]
        );
        assert_eq!(some.latency, Duration::from_millis(5));
        assert_eq!(
            parse_args(args(&["--latency-ms", "soon"])),
            Err(ArgsError::NotMilliseconds("soon".into()))
        );
        for bad in [
            "PATCH:403",
            "PATCH:42:1",
            ":403:1",
            "PATCH:403:x",
            "PATCH:403:1:2",
        ] {
            assert_eq!(
                parse_args(args(&["--refuse", bad])),
                Err(ArgsError::NotRefusal(bad.into())),
                "{bad}"
            );
        }
    }
}
