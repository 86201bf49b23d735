//! What the `chatter` binary's tests share: a served store, and running the binary.
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use chatter_emulator::{EmulatorServer, RunningEmulator};
use chatter_runtime::cosmos::CosmosConnection;
use chatter_runtime::provision;

pub(crate) const DB: &str = "shop";
pub(crate) const KEY_ENV: &str = "CHATTER_COSMOS_KEY";
const ENDPOINT_ENV: &str = "CHATTER_COSMOS_ENDPOINT";

/// `chatter-emulator` served over HTTP on a free port, with `DB`/`container` (partitioned by
/// `/orderId`) in it.
pub(crate) async fn served_store(container: &str) -> (RunningEmulator, CosmosConnection) {
    let emulator = EmulatorServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .spawn();
    let cosmos = CosmosConnection::connect(emulator.endpoint(), None)
        .await
        .unwrap();
    provision::ensure_container(&cosmos, DB, container, &["/orderId"])
        .await
        .unwrap();
    (emulator, cosmos)
}

/// [`served_store`] with the lease container `DB`/`leases` too.
pub(crate) async fn served_store_with_leases(
    container: &str,
    leases: &str,
) -> (RunningEmulator, CosmosConnection) {
    let (emulator, cosmos) = served_store(container).await;
    provision::ensure_lease_container(&cosmos, DB, leases)
        .await
        .unwrap();
    (emulator, cosmos)
}

/// The `chatter` binary with `args`, neither the account key nor the endpoint in its
/// environment.
fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chatter"));
    command
        .args(args)
        .env_remove(KEY_ENV)
        .env_remove(ENDPOINT_ENV);
    command
}

/// Runs `chatter` with `args` against `endpoint` (none: the variable unset), without a key in
/// its environment unless `key` is given.
pub(crate) async fn chatter(endpoint: Option<&str>, key: Option<&str>, args: &[&str]) -> Output {
    chatter_answering(endpoint, key, args, None).await
}

/// Runs `chatter` with `args` and `CHATTER_BROKER_URL` set to `broker_url`, `input` (if any) on
/// its standard input.
pub(crate) async fn chatter_on_broker(
    broker_url: &str,
    args: &[&str],
    input: Option<&str>,
) -> Output {
    let mut command = command(args);
    command.env("CHATTER_BROKER_URL", broker_url);
    run(command, input).await
}

/// [`chatter`], with `input` written to its standard input (e.g. the answer to a confirmation);
/// none: standard input is closed.
pub(crate) async fn chatter_answering(
    endpoint: Option<&str>,
    key: Option<&str>,
    args: &[&str],
    input: Option<&str>,
) -> Output {
    let mut command = command(args);
    if let Some(endpoint) = endpoint {
        command.env(ENDPOINT_ENV, endpoint);
    }
    if let Some(key) = key {
        command.env(KEY_ENV, key);
    }
    run(command, input).await
}

async fn run(mut command: Command, input: Option<&str>) -> Output {
    let input = input.map(str::to_owned);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The emulator serves on the test's runtime: the blocking wait goes elsewhere.
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if let Some(input) = input {
            stdin.write_all(input.as_bytes()).unwrap();
        }
        drop(stdin);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
