//! Running a benchmark binary under valgrind's callgrind, for the benches that compare
//! instruction counts (repeatable where wall time on a shared machine is not).
//!
//! Such a bench is one binary with several roles, chosen by its arguments ([`invocation`]): the
//! driver (what `cargo bench` runs), which runs the binary again once per measuring [`Mode`]
//! under callgrind ([`profile_modes`]) and then once for the wall-clock rounds
//! ([`wall_clock_child`]).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

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

/// The argument of the child that runs a bench's wall-clock rounds.
pub const WALL_CLOCK: &str = "wall-clock";

/// The measuring modes of a callgrind bench, each the argument of one child.
pub trait Mode: Copy + 'static {
    /// Every mode, in the order they are profiled (the setup-only mode first).
    const ALL: [Self; 3];

    /// The mode's argument, and the name of its output file.
    fn name(self) -> &'static str;
}

/// What one run of a callgrind bench binary does, from its arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Invocation<M> {
    /// Anything but a mode or [`WALL_CLOCK`] (`cargo bench` passes `--bench`): the driver.
    Driver,
    /// [`WALL_CLOCK`]: the wall-clock rounds.
    WallClock,
    /// `<mode> [<n>]`: one measured child, of `n` operations (the bench's default without).
    Measure(M, usize),
}

/// This process's [`Invocation`]; `default` is the count of a mode given without one.
pub fn invocation<M: Mode>(default: usize) -> Result<Invocation<M>, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(first) = args.first().map(String::as_str) else {
        return Ok(Invocation::Driver);
    };
    if first == WALL_CLOCK {
        return Ok(Invocation::WallClock);
    }
    match M::ALL.into_iter().find(|mode| mode.name() == first) {
        Some(mode) => {
            let count = match args.get(1) {
                Some(n) => n.parse()?,
                None => default,
            };
            Ok(Invocation::Measure(mode, count))
        }
        None => Ok(Invocation::Driver),
    }
}

/// The driver's last step: runs `exe` in a child with [`WALL_CLOCK`] (see [`child`]) and fails
/// if it does.
pub fn wall_clock_child(exe: &Path) -> Result<(), BoxError> {
    let status = child(exe).arg(WALL_CLOCK).status()?;
    if !status.success() {
        return Err(format!("the wall-clock rounds failed ({status})").into());
    }
    Ok(())
}

/// The output file of `mode` in `dir`.
pub fn output_file<M: Mode>(dir: &Path, mode: M) -> PathBuf {
    dir.join(format!("{}.callgrind", mode.name()))
}

/// Runs `exe` once per mode of `M::ALL` under callgrind with the arguments `<mode> <count>`,
/// writing `dir/<mode>.callgrind` (see [`profile`]), and prints each run's total to stderr;
/// returns the totals and output files' texts in the order of `M::ALL`, or why valgrind could
/// not be run.
pub fn profile_modes<M: Mode>(
    exe: &Path,
    dir: &Path,
    count: usize,
) -> Result<Result<Vec<(u64, String)>, String>, BoxError> {
    std::fs::create_dir_all(dir)?;
    let count = count.to_string();
    let width = M::ALL
        .iter()
        .map(|mode| mode.name().len())
        .max()
        .unwrap_or(0);
    let mut profiles = Vec::new();
    for mode in M::ALL {
        let started = Instant::now();
        let out = output_file(dir, mode);
        match profile(exe, &[mode.name(), &count], &out)? {
            Ok((total, text)) => {
                eprintln!(
                    "callgrind {:>width$}: {total} instructions ({:.0} s, {})",
                    mode.name(),
                    started.elapsed().as_secs_f64(),
                    out.display()
                );
                profiles.push((total, text));
            }
            Err(why) => return Ok(Err(why)),
        }
    }
    Ok(Ok(profiles))
}
