#!/usr/bin/env python3
"""Per-entry CPU (us) from threads-cpu.txt (bench/repl_threads_cpu.sh runs, one leader, CPU over
the 5 s window DUR-3 of 8): node totals and raft threads, per run and the median per binary."""
import re, statistics as st, sys, collections
f = sys.argv[1] if len(sys.argv) > 1 else 'bench/results/repl-s20/threads-cpu.txt'
runs, cur = [], None
for line in open(f):
    if line.startswith('== '):
        cur = {'bin': line.split()[1], 'nodes': {}}
        runs.append(cur)
    elif line.startswith('total sets/s'):
        cur['sets'] = float(line.split()[-1]) * 5
    elif re.match(r'node\d total', line):
        n = line.split()[0]
        cur['nodes'][n] = (float(line.split()[2]), float(re.search(r'raft-node-\d ([\d.]+)', line).group(1)))
med = collections.defaultdict(lambda: collections.defaultdict(list))
for r in runs:
    if len(r['nodes']) != 3:
        print(r['bin'], 'no thread sample (skipped)')
        continue
    us = lambda x: x * 1e6 / r['sets']
    L, Lr = (us(v) for v in r['nodes']['node1'])
    F = st.mean(us(r['nodes'][n][0]) for n in ('node2', 'node3'))
    Fr = st.mean(us(r['nodes'][n][1]) for n in ('node2', 'node3'))
    for k, v in (('L node', L), ('L raft', Lr), ('F node', F), ('F raft', Fr), ('3L/(L+2F)', 3 * L / (L + 2 * F))):
        med[r['bin']][k].append(v)
    print(f"{r['bin']:4} sets/s {r['sets']/5:.0f} L node {L:.2f} raft {Lr:.2f} | F node {F:.2f} raft {Fr:.2f} | 3L/(L+2F) {3*L/(L+2*F):.2f}")
for b, d in med.items():
    print(b, 'median of', len(d['L node']), ', '.join(f"{k} {st.median(v):.2f}" for k, v in d.items()))
