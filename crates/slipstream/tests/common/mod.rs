//! Helpers shared by the namespace (netns + veth + XDP) integration tests: root check, the `ip`
//! command, the XDP_PASS object for the client side, and running code inside a namespace.
//!
//! Not for: topologies (each test builds its own, with its own addresses and cleanup).

// Each test binary includes this module and uses a different subset of it.
#![allow(dead_code)]

use std::process::Command;

pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The XDP_PASS object the fastpath crate's build script compiled (newest if several).
pub fn pass_object() -> std::path::PathBuf {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_slipstream"));
    let build = bin.parent().expect("binary has a directory").join("build");
    let mut best: Option<(std::time::SystemTime, std::path::PathBuf)> = None;
    for e in std::fs::read_dir(&build).expect("target build directory").flatten() {
        if !e.file_name().to_string_lossy().starts_with("slipstream-fastpath-") {
            continue;
        }
        let p = e.path().join("out/xdp_pass.o");
        if let Ok(m) = std::fs::metadata(&p).and_then(|m| m.modified()) {
            if best.as_ref().map(|(t, _)| m > *t).unwrap_or(true) {
                best = Some((m, p));
            }
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| panic!("no xdp_pass.o under {}", build.display()))
}

/// Run `f` on a thread inside network namespace `ns` (threads it spawns stay there too).
pub fn in_ns<R: Send + 'static>(ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        use std::os::fd::AsRawFd;
        // SAFETY: setns moves only this thread into the namespace the fd refers to; the fd is
        // open for the duration of the call.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns into {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}
