//! Builds the XDP programs in ../../bpf with clang as part of the normal cargo build (no
//! prebuilt objects): `CLANG` overrides the compiler, `BPF_CFLAGS` adds flags.
//!
//! It also makes the C headers the single source of truth for the Rust mirror: a small host C
//! program, generated here from the headers' text and compiled with the same clang, prints every
//! object-like `#define SS_*` (the C compiler evaluates each expression) and the size, field count
//! and field offsets of every `struct ss_*` the headers define, as Rust constants in
//! `$OUT_DIR/bpf_header.rs` (included by `abi.rs`). The headers' `_Static_assert`s pin the same
//! sizes for the BPF target and the host, so the offsets the host sees are the program's.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let bpf_dir = manifest.join("../../bpf");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=BPF_CFLAGS");
    for h in [
        "slipstream_kv.h",
        "slipstream_stream.h",
        "xdp_stream.h",
        "parse_udp.h",
        "kv_request.h",
        "kv_reply.h",
        "kv_tenant.h",
        "word_bytes.h",
        "xdp_gen.h",
    ] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(h).display());
    }
    // Debian keeps asm/ headers under the multiarch directory.
    let multiarch = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    header_mirror(&clang, &bpf_dir, &multiarch, &out);
    // The load generator's program is built only for the crate that asks for it (slipstream-loadgen,
    // feature `traffic-gen`).
    let mut programs = vec!["xdp_fastpath", "xdp_pass"];
    if std::env::var_os("CARGO_FEATURE_TRAFFIC_GEN").is_some() {
        programs.push("xdp_gen");
    }
    for name in programs {
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

/// The shared headers, in include order.
const SHARED_HEADERS: [&str; 3] = ["slipstream_kv.h", "slipstream_stream.h", "xdp_gen.h"];

/// Writes `$OUT_DIR/bpf_header.rs` from the headers (see the crate comment above).
fn header_mirror(clang: &str, bpf_dir: &std::path::Path, multiarch: &str, out: &std::path::Path) {
    let mut probe = String::from("#include <stdio.h>\n#include <stddef.h>\n#include <linux/bpf.h>\n");
    let mut body = String::new();
    for h in SHARED_HEADERS {
        let text = std::fs::read_to_string(bpf_dir.join(h)).unwrap_or_else(|e| panic!("read {h}: {e}"));
        probe.push_str(&format!("#include \"{h}\"\n"));
        for name in defines(&text) {
            body.push_str(&format!("printf(\"pub const {name}: u64 = %llu;\\n\", (unsigned long long)({name}));\n"));
        }
        for (st, fields) in structs(&text) {
            body.push_str(&format!("printf(\"pub mod {st} {{\\n\");\n"));
            body.push_str(&format!("printf(\"pub const SIZE: usize = %zu;\\n\", sizeof(struct {st}));\n"));
            body.push_str(&format!("printf(\"pub const FIELDS: usize = {};\\n\");\n", fields.len()));
            for f in &fields {
                body.push_str(&format!("printf(\"pub const r#{f}: usize = %zu;\\n\", offsetof(struct {st}, {f}));\n"));
            }
            body.push_str("printf(\"}\\n\");\n");
        }
    }
    probe.push_str("int main(void) {\n");
    probe.push_str(&body);
    probe.push_str("return 0;\n}\n");
    let src = out.join("header_probe.c");
    let exe = out.join("header_probe");
    std::fs::write(&src, probe).unwrap_or_else(|e| panic!("write {}: {e}", src.display()));
    let status = Command::new(clang)
        .args(["-O0", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .arg(format!("-I{}", bpf_dir.display()))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("slipstream-fastpath: cannot run `{clang}` for the header probe: {e}"));
    assert!(status.success(), "slipstream-fastpath: the header probe ({}) did not compile", src.display());
    let printed = Command::new(&exe).output().unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    assert!(printed.status.success(), "the header probe failed");
    let mut rs = String::from("// Generated by build.rs from bpf/slipstream_kv.h and bpf/slipstream_stream.h.\n");
    rs.push_str(&String::from_utf8_lossy(&printed.stdout));
    std::fs::write(out.join("bpf_header.rs"), rs).unwrap_or_else(|e| panic!("write bpf_header.rs: {e}"));
}

/// Names of the object-like `#define SS_… value` lines (not function-like, not empty).
fn defines(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("#define "))
        .filter_map(|rest| {
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let after = rest.get(name.len()..).unwrap_or("");
            let has_value = after.starts_with([' ', '\t']) && !after.trim().is_empty();
            (name.starts_with("SS_") && has_value).then_some(name)
        })
        .collect()
}

/// `struct ss_… { fields };` definitions: the struct's name and its fields' names, in order.
/// Field lines are `type name;` or `type name[N];` (comments after them are ignored).
fn structs(text: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut cur: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("struct ss_").filter(|r| r.trim_end().ends_with('{')) {
            let name = format!("ss_{}", rest.trim_end_matches('{').trim());
            cur = Some((name, Vec::new()));
            continue;
        }
        let Some((_, fields)) = cur.as_mut() else { continue };
        if t.starts_with('}') {
            found.extend(cur.take());
            continue;
        }
        let Some(decl) = t.split(';').next().filter(|_| t.contains(';')) else { continue };
        if decl.starts_with("/*") || decl.starts_with('*') {
            continue;
        }
        let before_dims = decl.split('[').next().unwrap_or("");
        let field = before_dims.split_whitespace().last().unwrap_or("");
        if !field.is_empty() {
            fields.push(field.to_string());
        }
    }
    found
}
