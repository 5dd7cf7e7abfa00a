#!/usr/bin/env python3
"""Summary of run-emu-ab.sh's runs (emu-<n>-<base|new>/64.jsonl; with PREFIX quota:
run-quota.sh's quota-<n>-<node_cpu>/64.jsonl): per binary (or quota) and kind (emulated /
plain), medians of spread and one-leader sets/s and of their ratio; from the one-leader runs
each node's CPU per replicated entry (cpu_groups cpu_s / sets in the window: L = node1, the
leader; F = mean of node2 and node3) and 3L/(L+2F); and `use`: a spread node's CPU-s (mean of
the three) over the one-leader node 1's (how much of what the leader gets alone each spread
node gets)."""
import glob, json, statistics as st, sys, collections
d = sys.argv[1] if len(sys.argv) > 1 else 'bench/results/repl-s20'
prefix = sys.argv[2] if len(sys.argv) > 2 else 'emu'
runs = collections.defaultdict(list)
for f in sorted(glob.glob(f'{d}/{prefix}-*-*/64.jsonl'), key=lambda p: int(p.split(prefix + '-')[1].split('-')[0])):
    b = f.split('/')[-2].split('-')[2]
    by = collections.defaultdict(list)
    for line in open(f):
        x = json.loads(line)
        by[(x['node_cpu'], x['run'])].append(x)
    for kind in sorted({k[0] for k in by}):
        sp = sum(x['result']['ops_per_s'] for x in by[(kind, 'spread')])
        one = by[(kind, 'oneleader')]
        on = sum(x['result']['ops_per_s'] for x in one)
        ops = sum(x['result']['ops'] for x in one)
        cg = one[0]['cpu_groups']
        L = cg['node1']['cpu_s'] * 1e6 / ops
        F = (cg['node2']['cpu_s'] + cg['node3']['cpu_s']) / 2 * 1e6 / ops
        errs = sum(x['result']['errors'] for x in by[(kind, 'spread')] + one)
        sg = by[(kind, 'spread')][0]['cpu_groups']
        use = st.mean(sg[n]['cpu_s'] for n in ('node1', 'node2', 'node3')) / cg['node1']['cpu_s']
        runs[(b, kind)].append((sp, on, sp / on, L, F, errs, use))
for (b, kind), rs in sorted(runs.items()):
    med = lambda i: st.median(r[i] for r in rs)
    name = 'plain       ' if kind == 'max' else f'emulated {kind}'
    print(f"{b:4} {name} n={len(rs)} spread median {med(0):.0f} one median {med(1):.0f} ratio median {med(2):.2f} "
          f"ratios {[round(r[2], 2) for r in rs]} | one-leader us/entry L {med(3):.2f} F {med(4):.2f} L/F {st.median(r[3]/r[4] for r in rs):.2f} "
          f"3L/(L+2F) {st.median(3*r[3]/(r[3]+2*r[4]) for r in rs):.2f} use {med(6):.2f} errors {sum(r[5] for r in rs)}")
