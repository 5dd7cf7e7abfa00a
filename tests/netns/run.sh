#!/usr/bin/env bash
# End-to-end XDP fast path test in network namespaces (see e2e.py). Builds the crate's `attach`
# example, then runs e2e.py under a 60 s limit. Needs root; skips with a message otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: tests/netns/run.sh needs root (network namespaces, XDP)"
    exit 0
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --quiet --manifest-path crates/fastpath/Cargo.toml --example attach
bin="$CARGO_TARGET_DIR/debug/examples/attach"
# The XDP_PASS object build.rs compiled (newest, in case of several build dirs).
pass_obj="$(ls -t "$CARGO_TARGET_DIR"/debug/build/slipstream-fastpath-*/out/xdp_pass.o | head -n1)"
exec timeout 60 python3 tests/netns/e2e.py "$bin" "$pass_obj"
