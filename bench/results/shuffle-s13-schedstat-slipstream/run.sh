#!/bin/bash
cd /work/wt/shuffle
echo $$ > /sys/fs/cgroup/cpu/shuffle-bench/cgroup.procs
for m in slipstream sort; do
  date -u; uptime
  rm -f /tmp/shuf/stop-$m; python3 bench/task_schedstat.py /tmp/shuf/stop-$m > /tmp/shuf/sched-$m.txt &
  S=$!
  SKIP_BUILD=1 RECORDS=4000000 SHAPES=200x200 RUNS=2 MANAGERS=$m RESULTS_DIR=bench/results/shuffle-s13-schedstat-$m bash bench/shuffle_bench.sh
  touch /tmp/shuf/stop-$m; wait $S
done
date -u; uptime
