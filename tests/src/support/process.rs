//! Child processes a test spawns: run to their end ([`stdout_of_success`]), or read line by line
//! and killed on drop so a failing test leaves none behind ([`ChildProcess`]).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::timeout;

/// Runs `command` to its end and returns its standard output; panics, printing both outputs,
/// when it cannot start or does not succeed.
pub fn stdout_of_success(command: &mut Command) -> String {
    let output = command.output().expect("the process starts");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{:?} failed ({}):\n{stdout}\n{}",
        command.get_program(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The environment variable `name` of a worker process, trimmed; `None` when unset or blank.
pub fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A running child process and its stdout lines; the process is killed (and reaped) when this
/// drops, also when the test panics.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildProcess {
    /// Spawns `command` with its stdout piped (its other settings as given); `name` is what
    /// panics call it. Panics if it cannot be started.
    pub fn spawn(name: &str, command: &mut Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} starts: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name: name.to_owned(),
            child,
            lines,
        }
    }

    /// Waits up to `within` for a stdout line starting with `prefix` and returns it; panics if
    /// the process exits first or the time runs out.
    pub async fn line_starting_with(&mut self, prefix: &str, within: Duration) -> String {
        let name = self.name.clone();
        let wait = async {
            while let Some(line) = self.lines.recv().await {
                if line.starts_with(prefix) {
                    return line;
                }
            }
            panic!(
                "{name} exited before printing `{prefix}`: {:?}",
                self.child.try_wait()
            );
        };
        timeout(within, wait)
            .await
            .unwrap_or_else(|_| panic!("{name} printed `{prefix}` within {within:?}"))
    }

    /// The next stdout line, if one comes within `within` (`None` also once the process
    /// closed its stdout).
    pub async fn try_line(&mut self, within: Duration) -> Option<String> {
        timeout(within, self.lines.recv()).await.ok().flatten()
    }

    /// Writes `line` to the process's stdin (piped by the caller's command); panics if it
    /// cannot.
    pub fn tell(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.child.stdin.as_mut().expect("stdin is piped");
        writeln!(stdin, "{line}").unwrap_or_else(|e| panic!("{} reads its stdin: {e}", self.name));
        let _ = stdin.flush();
    }

    /// Closes the process's stdin (a worker that serves until then shuts down), then waits up
    /// to `within` for it to exit; whether it exited successfully.
    pub async fn close_and_wait(&mut self, within: Duration) -> bool {
        drop(self.child.stdin.take());
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The process id, e.g. to read `/proc/<pid>/status`.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reap the process; panics if either fails.
    pub fn kill(mut self) {
        self.child.kill().expect("the child process is killed");
        self.child
            .wait()
            .expect("the killed child process is reaped");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
