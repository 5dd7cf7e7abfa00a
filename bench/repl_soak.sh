#!/usr/bin/env bash
# repl_soak.sh — the long run of the replicated-tenant fault-injection history test (issue 15):
# crates/slipstream/tests/replication_linearizable.rs with KILLS (default 100) leader faults
# (SIGKILL + restart or SIGSTOP + SIGCONT of a random tenant's current leader, one every few
# seconds) while 12 clients run set/gets/cas/incr on three real daemons. The history is checked
# with stateright's LinearizabilityTester; acknowledged writes and replica contents are checked
# after healing. Prints the seed, every fault, op counts and the check's time; exits non-zero on
# any violation. About 4-5 s per fault plus the check (~8 min for 100 on this machine).
# Env: KILLS (100), SLIPSTREAM_TEST_SEED (repeat a run).
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${KILLS:-100}
REPL_KILLS=$KILLS cargo test --release -p slipstream --test replication_linearizable \
    histories_stay_linearizable -- --nocapture
