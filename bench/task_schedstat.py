#!/usr/bin/env python3
"""Where Spark task threads' wall time goes off the CPU: samples every executor JVM
(CoarseGrainedExecutorBackend) on this host each 0.3 s until STOP_FILE exists, keeps each task
thread's (comm "Executor task l...") last cumulative /proc schedstat (CPU ns, run-queue wait ns)
and context-switch counts, and prints their totals. Run-queue wait is time runnable but not
running (CPU contention); voluntary switches are the thread blocking (I/O, locks, sleeps).

Usage: task_schedstat.py STOP_FILE > out.txt &  ... run the job ...; touch STOP_FILE; wait
(bench/results/shuffle-s13-schedstat-slipstream/run.sh shows it around bench/shuffle_bench.sh).
Not for: per-stage figures (the totals cover the whole driver run, data generation included).
"""
import glob
import os
import sys
import time


def main():
    stop = sys.argv[1]
    last = {}
    while not os.path.exists(stop):
        for p in glob.glob('/proc/[0-9]*'):
            try:
                if b'CoarseGrainedExecutorBackend' not in open(p + '/cmdline', 'rb').read():
                    continue
            except OSError:
                continue
            for t in glob.glob(p + '/task/*'):
                try:
                    if not open(t + '/comm').read().startswith('Executor task'):
                        continue
                    cpu, wait, _ = map(int, open(t + '/schedstat').read().split())
                    sw = {}
                    for line in open(t + '/status'):
                        if 'ctxt_switches' in line:
                            k, v = line.split(':')
                            sw[k] = int(v)
                    last[t] = (cpu, wait, sw.get('voluntary_ctxt_switches', 0), sw.get('nonvoluntary_ctxt_switches', 0))
                except OSError:
                    pass  # the thread ended between listing and reading
        time.sleep(0.3)
    tot = [sum(v[i] for v in last.values()) for i in range(4)]
    print('threads %d cpu_ms %.0f runqueue_wait_ms %.0f voluntary_switches %d involuntary_switches %d'
          % (len(last), tot[0] / 1e6, tot[1] / 1e6, tot[2], tot[3]))


if __name__ == '__main__':
    main()
