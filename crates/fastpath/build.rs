//! Builds the XDP programs in ../../bpf with clang as part of the normal cargo build (no
//! prebuilt objects): `CLANG` overrides the compiler, `BPF_CFLAGS` adds flags.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let bpf_dir = manifest.join("../../bpf");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=BPF_CFLAGS");
    for h in ["slipstream_kv.h", "slipstream_stream.h", "xdp_stream.h"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(h).display());
    }
    // Debian keeps asm/ headers under the multiarch directory.
    let multiarch = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    for name in ["xdp_fastpath", "xdp_pass", "xdp_gen"] {
        let src = bpf_dir.join(format!("{name}.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        let mut cmd = Command::new(&clang);
        cmd.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
            .arg(format!("-I{multiarch}"))
            .arg(format!("-I{}", bpf_dir.display()));
        if let Ok(extra) = std::env::var("BPF_CFLAGS") {
            cmd.args(extra.split_whitespace());
        }
        cmd.arg("-c").arg(&src).arg("-o").arg(out.join(format!("{name}.o")));
        let status = match cmd.status() {
            Ok(s) => s,
            Err(e) => panic!(
                "slipstream-fastpath: cannot run `{clang}` ({e}). Building the XDP program needs clang \
                 with the BPF target and libbpf headers: `apt-get install clang llvm libbpf-dev` \
                 (or set CLANG=/path/to/clang)."
            ),
        };
        if !status.success() {
            panic!(
                "slipstream-fastpath: `{clang}` failed to compile {} ({status}); is libbpf-dev \
                 (bpf/bpf_helpers.h) installed?",
                src.display()
            );
        }
    }
}
