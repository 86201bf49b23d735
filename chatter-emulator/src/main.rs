//! `chatter-emulator [--port N]`: serves the Azure Cosmos DB SDK's in-memory emulator over plain
//! HTTP on 127.0.0.1 (default port 8081) until killed. Data is kept in memory only.
//!
//! Once ready it prints one line, `chatter-emulator listening on http://127.0.0.1:<port>/`, to
//! stdout. Point chatter at it with `CHATTER_COSMOS_ENDPOINT=http://127.0.0.1:<port>/` (no key
//! needed: loopback endpoints default to the Cosmos emulator's well-known key).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use chatter_emulator::{DEFAULT_PORT, EmulatorServer};

const USAGE: &str = "usage: chatter-emulator [--port N]   (N = 0 picks a free port)";

fn parse_port(args: impl IntoIterator<Item = String>) -> Result<Option<u16>, String> {
    let mut args = args.into_iter();
    let mut port = None;
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "--port" | "-p" => args
                .next()
                .ok_or_else(|| format!("`{arg}` needs a value"))?,
            "--help" | "-h" => return Ok(None),
            other => match other.strip_prefix("--port=") {
                Some(value) => value.to_owned(),
                None => return Err(format!("unexpected argument `{other}`")),
            },
        };
        port = Some(
            value
                .parse::<u16>()
                .map_err(|_| format!("`{value}` is not a port number"))?,
        );
    }
    Ok(Some(port.unwrap_or(DEFAULT_PORT)))
}

#[tokio::main]
async fn main() -> ExitCode {
    let port = match parse_port(std::env::args().skip(1)) {
        Ok(Some(port)) => port,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("chatter-emulator: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let server = match EmulatorServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("chatter-emulator: cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
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

    #[test]
    fn port_defaults_to_8081_and_accepts_both_spellings() {
        assert_eq!(parse_port(args(&[])), Ok(Some(8081)));
        assert_eq!(parse_port(args(&["--port", "9000"])), Ok(Some(9000)));
        assert_eq!(parse_port(args(&["--port=0"])), Ok(Some(0)));
        assert!(parse_port(args(&["--port"])).is_err());
        assert!(parse_port(args(&["--port", "x"])).is_err());
        assert!(parse_port(args(&["--bogus"])).is_err());
    }
}
