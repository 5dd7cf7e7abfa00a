#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: installs only what is missing.
# Called by `make run`, `make test` and `make bench`. Needs root (or sudo) only when something
# is missing.
set -euo pipefail

# Debian packages: the peer we compare against (memcached), its test tool (memccapable), the
# eBPF toolchain for the kernel fast path, the network tools the netns tests use, and Java 17 +
# Maven for the Spark connector (connectors/spark; Maven fetches Spark into ~/.m2 on first use),
# bpftool for bench/stream_cpu.sh (XDP programs' run time).
# sasl2-bin (saslpasswd2: a sasldb so memcached -S can authenticate in tests/test_security.py),
# openssl (test certificates, s_client).
DEB_PKGS=(memcached libmemcached-tools clang llvm libbpf-dev iproute2 netcat-openbsd python3-pip
          openjdk-17-jdk-headless maven bpftool sasl2-bin openssl)

missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Rust toolchain: must already be there (rustup is not fetched by this script).
if ! command -v cargo >/dev/null 2>&1; then
  for d in "$HOME/.cargo/bin" /usr/local/cargo/bin; do
    [ -x "$d/cargo" ] && export PATH="$d:$PATH"
  done
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found; install Rust (rustup) first" >&2; exit 1; }
# `make lint` (part of `make test`) needs rustfmt and clippy: rustup's components.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  command -v rustup >/dev/null 2>&1 && rustup component add rustfmt clippy || true
fi

# Python test dependencies (pyspark among them: the SPARK_HOME of the local-cluster Spark tests):
# whatever tests/requirements.txt names that is not installed (so a package added to the file
# later reaches machines that already have the older set).
PY=${PYTHON:-python3}
# Every distribution the file names is installed? (names only; pip decides versions below.)
missing_py=$($PY - <<'PYEOF'
import importlib.metadata as md, re
for line in open("tests/requirements.txt"):
    name = re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0]
    if name and not name.startswith("#"):
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            print(name)
PYEOF
)
if [ -n "$missing_py" ]; then
  echo "setup: installing Python test packages: $(echo $missing_py)"
  PIP=($PY -m pip install -q --disable-pip-version-check -r tests/requirements.txt)
  "${PIP[@]}" >/dev/null 2>&1 || "${PIP[@]}" --break-system-packages
fi
exit 0
