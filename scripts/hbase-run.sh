#!/usr/bin/env bash
# `make hbase-run`: starts an in-process HBase mini cluster (connectors/hbase, sidecar on
# 127.0.0.1:9091) and Slipstream with HBase's Thrift1 API on 127.0.0.1:9090 in front of it
# (memcached on 11211, metrics on http://127.0.0.1:9180/metrics). Ctrl-C stops both.
# Usage: hbase-run.sh DATA_DIR   (HBASE_STRATEGY=all-row|each-row, HBASE_CACHE_MB=256)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/.work/hbase-run}"
mkdir -p "$dir"
cfg="$dir/slipstream-hbase.toml"
cat > "$cfg" <<TOML
[server]
port = 11211
udp_port = 0
listen = "127.0.0.1"
admin = "127.0.0.1:9180"

[hbase]
thrift_port = 9090
sidecar = "127.0.0.1:9091"
strategy = "${HBASE_STRATEGY:-all-row}"
memory_mb = ${HBASE_CACHE_MB:-256}
TOML
jvm_pid=""; ss_pid=""
cleanup() {
  [ -n "$ss_pid" ] && kill "$ss_pid" 2>/dev/null || true
  [ -n "$jvm_pid" ] && kill "$jvm_pid" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM
echo "hbase-run: starting the HBase mini cluster (about 20-40 s; log in $dir/hbase.log)"
coproc JVM { exec "$root/connectors/hbase/bin/run.sh" mini --sidecar-port 9091 --dir "$dir/data" 2>"$dir/hbase.log"; }
jvm_pid=$JVM_PID
ready=""
while IFS= read -r -t 300 line <&"${JVM[0]}"; do
  case "$line" in READY*) ready="$line"; break ;; esac
done
[ -n "$ready" ] || { echo "hbase-run: HBase did not start; see $dir/hbase.log" >&2; exit 1; }
echo "hbase-run: $ready"
"$root/target/release/slipstream" serve --config "$cfg" &
ss_pid=$!
wait "$ss_pid"
