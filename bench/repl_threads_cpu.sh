#!/usr/bin/env bash
# repl_threads_cpu.sh — CPU seconds of every thread of the three daemons over the load window of
# one bench/repl_spread_perf.sh run (PERF=0; issue 15): which thread bounds a layout. Samples
# /proc/<pid>/task/*/schedstat at 3 s and at DUR s after the load generators start, and prints
# per node the total and each thread name's share (threads of one name summed).
# Env: LEADERS ("1 2 3" spread, "1 1 1" one leader), DUR (8), BASE (23000), SLIPSTREAM_BIN, as
# repl_spread_perf.sh. Not for: throughput figures on their own (repl_emulation_ab.sh).
set -u
cd "$(dirname "$0")/.."
DUR=${DUR:-8}
S0=$(mktemp); S1=$(mktemp)
trap 'rm -f $S0 $S1' EXIT
snap() {
  for p in $(pgrep -f "slipstream serve --config /tmp/slipstream-replperf"); do
    n=$(tr '\0' ' ' < /proc/$p/cmdline | grep -o 'node[0-9]' | head -1)
    for t in /proc/$p/task/*; do echo "$n $(cat $t/comm 2>/dev/null | tr ' ' _) $(cut -d' ' -f1 $t/schedstat 2>/dev/null)"; done
  done
}
( sleep 3; snap > $S0; sleep $((DUR - 3)); snap > $S1 ) &
PERF=0 DUR=$DUR BASE=${BASE:-23000} bash bench/repl_spread_perf.sh 2>&1 | grep -E "total|load"
wait
python3 - $S0 $S1 <<'PY'
import collections, sys
def rd(f):
    d = collections.Counter()
    for l in open(f):
        p = l.split()
        if len(p) == 3 and p[2].isdigit():
            d[(p[0], p[1])] += int(p[2])
    return d
a, b = rd(sys.argv[1]), rd(sys.argv[2])
tot = collections.Counter()
rows = []
for k in b:
    v = (b[k] - a.get(k, 0)) / 1e9
    tot[k[0]] += v
    rows.append((k, v))
for n in sorted(tot):
    print(n, "total %.2f CPU-s:" % tot[n],
          ", ".join("%s %.2f" % (k[1], v) for k, v in sorted(rows, key=lambda r: -r[1]) if k[0] == n and v > 0.02))
PY
