#!/usr/bin/env python3
"""Table of run.sh's A/B: per run the best replies/s (xdp.json) and the server program's mean
ns per run (bpf_stats: the largest run_cnt sample of slipstream_xdp, run_time_ns / run_cnt)."""
import glob, json, os, statistics, sys

os.chdir(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
rows = []
for d in sorted(glob.glob('*-*/'), key=lambda p: int(p.split('-')[0])):
    name = d.rstrip('/')
    gen = json.load(open(d + 'xdp.json'))['runs'][0]['gen']
    best = None
    for line in open(name + '.bpf'):
        try:
            progs = json.loads(line.partition(' ')[2])
        except ValueError:
            continue
        for p in progs:
            if p.get('name') == 'slipstream_xdp' and p.get('run_cnt', 0) > (best or {}).get('run_cnt', 0):
                best = p
    ns = best['run_time_ns'] / best['run_cnt']
    rows.append((name, gen['replies_per_s'], ns))
    print(f"{name:7} replies/s {gen['replies_per_s']:>9,}  program runs {best['run_cnt']:>9,}  ns/run {ns:.1f}")
for v in ('old', 'new'):
    ns = [r[2] for r in rows if r[0].endswith(v)]
    rp = [r[1] for r in rows if r[0].endswith(v)]
    print(f"{v}: ns/run median {statistics.median(ns):.1f} ({min(ns):.1f}-{max(ns):.1f}); "
          f"replies/s median {statistics.median(rp):,.0f} ({min(rp):,}-{max(rp):,})")
