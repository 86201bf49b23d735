//! Running a benchmark binary under valgrind's callgrind, for the benches that compare
//! instruction counts (repeatable where wall time on a shared machine is not).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use chatter_runtime::BoxError;

/// `program` as a child process with `Backtrace::capture` off (`RUST_LIB_BACKTRACE=0`; panic
/// backtraces unchanged): the SDK creates and drops errors on its success paths, and capturing
/// their backtraces would dominate what is counted.
pub fn child(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    command.env("RUST_LIB_BACKTRACE", "0");
    command
}

/// Runs `exe` with `args` under callgrind, writing `out`, and returns the run's total
/// instructions and the output file's text. `Ok(Err(why))` when valgrind cannot be run at all.
pub fn profile(
    exe: &Path,
    args: &[&str],
    out: &Path,
) -> Result<Result<(u64, String), String>, BoxError> {
    let _ = std::fs::remove_file(out);
    let run = child("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(args)
        .output();
    let run = match run {
        Ok(run) => run,
        Err(e) => return Ok(Err(format!("valgrind could not be run: {e}"))),
    };
    if !run.status.success() {
        return Err(format!(
            "{} under callgrind failed ({}): {}",
            args.join(" "),
            run.status,
            String::from_utf8_lossy(&run.stderr)
        )
        .into());
    }
    let text = std::fs::read_to_string(out)?;
    // `totals:` is the sum over the whole run; older valgrinds write `summary:` instead.
    let line = text
        .lines()
        .find(|line| line.starts_with("totals:"))
        .or_else(|| text.lines().find(|line| line.starts_with("summary:")))
        .ok_or_else(|| format!("{} has no totals: line", out.display()))?;
    let total = line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| format!("an empty {line:?} in {}", out.display()))?
        .parse()?;
    Ok(Ok((total, text)))
}
