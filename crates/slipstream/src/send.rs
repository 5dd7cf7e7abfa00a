//! `slipstream send`: forwards to `slipstream-loadgen send`, where the stream traffic generator
//! lives (the daemon binary carries no generator). Kept so documented commands, scripts and the
//! Spark benchmark driver (`bin=.../slipstream`) go on working.
//!
//! Which binary: `$SLIPSTREAM_LOADGEN` if set, else `slipstream-loadgen` next to this
//! executable (cargo builds both into the same target directory), else the one on `PATH`.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

const LOADGEN_BIN: &str = "slipstream-loadgen";

fn loadgen_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SLIPSTREAM_LOADGEN") {
        return PathBuf::from(p);
    }
    let sibling = std::env::current_exe().ok().map(|exe| exe.with_file_name(LOADGEN_BIN));
    match sibling {
        Some(p) if p.is_file() => p,
        _ => PathBuf::from(LOADGEN_BIN),
    }
}

/// Replaces this process with `slipstream-loadgen send ARGS` (same stdout, stderr and exit
/// status); returns only if that cannot be started.
pub fn run(args: &[String]) -> Result<(), String> {
    let bin = loadgen_path();
    let err = Command::new(&bin).arg("send").args(args).exec();
    Err(format!(
        "send: cannot run {} ({err}); the generator is `slipstream-loadgen send` (cargo build --release -p slipstream-loadgen, or set SLIPSTREAM_LOADGEN)",
        bin.display()
    ))
}
