#!/usr/bin/env bash
# The sweep behind docs/benchmarks.md "Session 22": 208 touches per round (the distinct slot lines
# of one 32-datagram burst, session 17), 1,000 rounds, pinned to the receive CPU 0, three times.
set -euo pipefail
cd "$(dirname "$0")"
gcc -O2 -o /tmp/ss-cold cold.c
for rep in 1 2 3; do
  for spin in 1 0; do for gap in 0 50 200 800 1600; do taskset -c 0 /tmp/ss-cold 131072 208 $gap $spin 0 1000; done; done
  for t in 8192 32768 131072 524288; do taskset -c 0 /tmp/ss-cold $t 208 1600 1 0 1000; done
  taskset -c 0 /tmp/ss-cold 131072 208 1600 1 1 1000
done
