#!/usr/bin/env python3
"""tenant_plot.py — summary tables and PNG plots for bench/tenant_bench.sh results.

    python3 bench/tenant_plot.py summary DIR   # prints Markdown; writes DIR/summary.md, DIR/summary.json
    python3 bench/tenant_plot.py plot DIR      # writes DIR/fig-*.png (needs matplotlib)

DIR holds one JSON file per run, as tenant_bench.sh writes them (<experiment>-<label>-r<N>.json,
experiments scaleup, shares, isolation, overhead, wc). With several repeats of a step the
summary uses the median run (by aggregate egress, or by ops/s for overhead). Egress figures
come from the daemon's /metrics deltas (primary) and from the loadgens (cross-check).

Not for: running anything, or judging runs from other machines against each other.
"""

import glob
import json
import os
import statistics
import sys

MB = 1e6


def load_runs(d):
    runs = []
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        if os.path.basename(path).startswith("summary"):
            continue
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and "experiment" in doc:
            doc["_file"] = os.path.basename(path)
            runs.append(doc)
    return runs


def lg_json(run, name):
    entry = (run.get("loadgen") or {}).get(name) or {}
    return entry.get("json") or None


def lg_exit(run, name):
    return ((run.get("loadgen") or {}).get(name) or {}).get("exit")


def busy_names(run):
    return [n for n, t in run.get("tenants", {}).items() if t.get("mode") != "idle"]


def metric_rates(run):
    """Per-tenant bytes_out/s from /metrics deltas, or None when the scrape failed."""
    m = run.get("metrics") or {}
    if not m.get("ok"):
        return None
    el = m.get("elapsed_s") or 0.0
    if el <= 0:
        return None
    out = {}
    for name, row in (m.get("tenants") or {}).items():
        b = row.get("bytes_out")
        out[name] = (b / el) if b is not None else None
    return out


def loadgen_rates(run):
    out = {}
    for name in busy_names(run):
        j = lg_json(run, name)
        out[name] = j.get("rx_bytes_per_s") if j else None
    return out


def total(rates, names):
    vals = [rates.get(n) for n in names] if rates is not None else [None]
    if any(v is None for v in vals):
        return None
    return sum(vals)


def run_problems(run):
    probs = []
    for name in busy_names(run):
        rc = lg_exit(run, name)
        if rc not in (0,):
            probs.append(f"{name}: loadgen exit {rc}")
        j = lg_json(run, name)
        if j:
            for k in ("errors", "conn_failures", "stalled_conns", "prefill_errors", "misses"):
                if j.get(k):
                    probs.append(f"{name}: {k}={j[k]}")
    m = run.get("metrics")
    if run.get("experiment") != "overhead" and not (m and m.get("ok")):
        probs.append("no /metrics deltas" + (f" ({m.get('error')})" if m else ""))
    bg = run.get("machine_busy_pct_before") or 0
    if bg > 10:
        probs.append(f"machine {bg:.0f}% busy before")
    return probs


def median_run(runs, key):
    good = [r for r in runs if key(r) is not None]
    if not good:
        return runs[0] if runs else None
    good.sort(key=key)
    return good[len(good) // 2]


def group(runs, exp):
    by = {}
    for r in runs:
        if r.get("experiment") == exp:
            by.setdefault(r.get("label"), []).append(r)
    return by


def fmt(v, spec=".1f", none="n/a"):
    return none if v is None else format(v, spec)


def k_of(label):
    try:
        return int(str(label).lstrip("k"))
    except ValueError:
        return 0


# ---- analyses (shared by summary and plot) ---------------------------------------------

def analyse_scaleup(runs, exp="scaleup"):
    rows = []
    for label, rs in sorted(group(runs, exp).items(), key=lambda kv: k_of(kv[0])):
        r = median_run(rs, lambda x: total(metric_rates(x), busy_names(x)))
        p = r["params"]
        cap = p["capacity_bytes_per_s"]
        shares = p.get("shares") or {}
        names = busy_names(r)
        ideal = min(cap, cap * sum(shares.get(n, 0.0) for n in names))
        mr, lr = metric_rates(r), loadgen_rates(r)
        agg_m, agg_l = total(mr, names), total(lr, names)
        per = {n: (mr or {}).get(n) for n in names}
        rows.append({
            "k": k_of(label), "busy": names, "capacity": cap, "ideal": ideal,
            "agg_metrics": agg_m, "agg_loadgen": agg_l,
            "pct_of_ideal": (100 * agg_m / ideal) if (agg_m is not None and ideal) else None,
            "per_tenant_metrics": per, "per_tenant_loadgen": lr, "shares": shares,
            "repeats": len(rs), "problems": run_problems(r), "file": r["_file"],
        })
    return rows


def analyse_shares(runs):
    rows = analyse_scaleup(runs, "shares")
    for row in rows:
        cap = row["capacity"]
        agg = row["agg_metrics"]
        dev = {}
        for n in row["busy"]:
            v = row["per_tenant_metrics"].get(n)
            if v is None:
                dev[n] = None
                continue
            alloc_pct = 100 * row["shares"].get(n, 0.0)
            dev[n] = {
                "alloc_pct": alloc_pct,
                "pct_of_capacity": 100 * v / cap,
                "pct_of_total": (100 * v / agg) if agg else None,
                "dev_pp": 100 * v / cap - alloc_pct,
            }
        row["per_tenant_share"] = dev
        devs = [abs(x["dev_pp"]) for x in dev.values() if x]
        row["max_abs_dev_pp"] = max(devs) if devs else None
        row["total_pct_of_capacity"] = (100 * agg / cap) if agg is not None else None
    return rows


def analyse_isolation(runs):
    out = {}
    for label, rs in group(runs, "isolation").items():
        r = median_run(rs, lambda x: (lg_json(x, "t0") or {}).get("lat_ns", {}).get("p99"))
        j = lg_json(r, "t0") or {}
        lat = j.get("lat_ns") or {}
        mr = metric_rates(r)
        others = [n for n in busy_names(r) if n != "t0"]
        out[label] = {
            "p50_us": lat.get("p50", 0) / 1e3 if lat else None,
            "p99_us": lat.get("p99", 0) / 1e3 if lat else None,
            "p999_us": lat.get("p999", 0) / 1e3 if lat else None,
            "max_us": lat.get("max", 0) / 1e3 if lat else None,
            "rate_per_s": j.get("rate_per_s"), "achieved_per_s": j.get("achieved_rate_per_s"),
            "behind": j.get("behind"), "dropped": j.get("dropped"),
            "machine_busy_pct": j.get("machine_busy_pct"),
            "t0_throttled": ((r.get("metrics") or {}).get("tenants") or {}).get("t0", {}).get("throttled"),
            "t0_egress": (mr or {}).get("t0"),
            "others_egress": total(mr, others) if others else 0.0,
            "others_busy": len(others), "repeats": len(rs), "problems": run_problems(r), "file": r["_file"],
            "params": r.get("params", {}),
        }
    idle, busy = out.get("others-idle"), out.get("others-busy")
    rise = None
    if idle and busy and idle.get("p99_us") and busy.get("p99_us") is not None:
        rise = 100 * (busy["p99_us"] / idle["p99_us"] - 1)
    return {"runs": out, "p99_rise_pct": rise}


def analyse_overhead(runs):
    out = {}
    for label, rs in group(runs, "overhead").items():
        ops = [lg_json(r, "main").get("ops_per_s") for r in rs if lg_json(r, "main")]
        cpu = [lg_json(r, "main").get("ops_per_server_cpu_s") for r in rs if lg_json(r, "main")]
        cpu = [c for c in cpu if c]
        r = median_run(rs, lambda x: (lg_json(x, "main") or {}).get("ops_per_s"))
        j = lg_json(r, "main") or {}
        out[label] = {
            "ops_per_s_runs": ops, "ops_per_s_median": statistics.median(ops) if ops else None,
            "ops_per_server_cpu_s_median": statistics.median(cpu) if cpu else None,
            "p50_us": (j.get("lat_ns") or {}).get("p50", 0) / 1e3, "p99_us": (j.get("lat_ns") or {}).get("p99", 0) / 1e3,
            "repeats": len(rs), "problems": sorted({p for x in rs for p in run_problems(x)}),
            "params": r.get("params", {}),
        }

    def ratio(a, b, key):
        x, y = (out.get(a) or {}).get(key), (out.get(b) or {}).get(key)
        return (x / y) if (x is not None and y) else None

    diff = {}
    for key in ("ops_per_s_median", "ops_per_server_cpu_s_median"):
        q = ratio("tenant", "plain", key)
        diff[key] = None if q is None else 100 * (1 - q)
    return {
        "runs": out,
        "tenant_overhead_pct": diff,  # positive: the tenant path is slower than plain
        "plain_over_memcached": {k: ratio("plain", "memcached", k) for k in ("ops_per_s_median", "ops_per_server_cpu_s_median")},
        "tenant_over_memcached": {k: ratio("tenant", "memcached", k) for k in ("ops_per_s_median", "ops_per_server_cpu_s_median")},
    }


def analyse_wc(runs):
    out = {}
    for label, rs in group(runs, "wc").items():
        r = median_run(rs, lambda x: total(metric_rates(x), busy_names(x)))
        p = r["params"]
        cap = p["capacity_bytes_per_s"]
        shares = p.get("shares") or {}
        names = busy_names(r)
        wsum = sum(shares.get(n, 0.0) for n in names)
        mr, lr = metric_rates(r), loadgen_rates(r)
        per = {}
        for n in names:
            expected = shares.get(n, 0.0) if not p.get("work_conserving") else (shares.get(n, 0.0) / wsum if wsum else 0.0)
            v = (mr or {}).get(n)
            per[n] = {"share": shares.get(n), "bytes_per_s": v, "loadgen_bytes_per_s": lr.get(n),
                      "pct_of_capacity": (100 * v / cap) if v is not None else None,
                      "expected_pct": 100 * expected}
        vals = [per[n]["bytes_per_s"] for n in names]
        split = None
        if len(names) == 2 and all(v for v in vals):
            split = vals[0] / vals[1]
        agg = total(mr, names)
        out[label] = {"work_conserving": p.get("work_conserving"), "capacity": cap, "per_tenant": per,
                      "split": split, "expected_split": (shares.get(names[0], 0) / shares.get(names[1], 1)) if len(names) == 2 else None,
                      "total_pct_of_capacity": (100 * agg / cap) if agg is not None else None,
                      "repeats": len(rs), "problems": run_problems(r), "file": r["_file"]}
    return out


# ---- summary ------------------------------------------------------------------------

def summary(d):
    runs = load_runs(d)
    if not runs:
        sys.exit(f"no run files in {d}")
    res = {"scaleup": analyse_scaleup(runs), "shares": analyse_shares(runs),
           "isolation": analyse_isolation(runs), "overhead": analyse_overhead(runs), "wc": analyse_wc(runs)}
    md = [f"# Multi-tenant benchmarks ({os.path.basename(os.path.abspath(d))})", "",
          "Generated by `bench/tenant_bench.sh`; egress from the daemon's /metrics "
          "(slipstream_tenant_bytes_out_total deltas over the window), cross-checked by the loadgens. MB = 10^6 bytes.", ""]

    def notes(rows_problems):
        return "; ".join(rows_problems) if rows_problems else "ok"

    if res["scaleup"]:
        cap = res["scaleup"][0]["capacity"]
        md += [f"## a) Scale-up: 8 tenants x 12.5% of {cap / MB:.0f} MB/s, k busy (read-only, closed loop)", "",
               "| k | ideal MB/s | measured MB/s (/metrics) | loadgen MB/s | % of ideal | per-tenant MB/s min–max | notes |",
               "|---|---|---|---|---|---|---|"]
        for row in res["scaleup"]:
            per = [v for v in row["per_tenant_metrics"].values() if v is not None]
            mm = f"{min(per) / MB:.2f}–{max(per) / MB:.2f}" if per else "n/a"
            md.append(f"| {row['k']} | {row['ideal'] / MB:.2f} | {fmt(row['agg_metrics'] and row['agg_metrics'] / MB, '.2f')} | "
                      f"{fmt(row['agg_loadgen'] and row['agg_loadgen'] / MB, '.2f')} | {fmt(row['pct_of_ideal'])} | {mm} | {notes(row['problems'])} |")
        md.append("")
    if res["shares"]:
        cap = res["shares"][0]["capacity"]
        shares = res["shares"][0]["shares"]
        alloc = ", ".join(f"{n} {100 * s:g}%" for n, s in shares.items())
        md += [f"## b) Shares ({alloc}; capacity {cap / MB:.0f} MB/s; work_conserving=false)", "",
               "| busy | total MB/s | total % of capacity | per tenant: measured % of capacity (allocation, deviation pp) | max abs deviation pp | notes |",
               "|---|---|---|---|---|---|"]
        for row in res["shares"]:
            cells = []
            for n in row["busy"]:
                x = row["per_tenant_share"].get(n)
                cells.append(f"{n} {x['pct_of_capacity']:.2f}% ({x['alloc_pct']:g}%, {x['dev_pp']:+.2f})" if x else f"{n} n/a")
            md.append(f"| {row['k']} | {fmt(row['agg_metrics'] and row['agg_metrics'] / MB, '.2f')} | {fmt(row['total_pct_of_capacity'])} | "
                      f"{'; '.join(cells)} | {fmt(row['max_abs_dev_pp'], '.2f')} | {notes(row['problems'])} |")
        md.append("")
    iso = res["isolation"]
    if iso["runs"]:
        any_run = next(iter(iso["runs"].values()))
        p = any_run["params"]
        md += [f"## c) Latency isolation: t0 open loop at {p.get('iso_load_pct')}% of its share "
               f"({fmt(p.get('t0_rate_per_s'))} req/s), latency from the scheduled send time", "",
               "| others | t0 achieved req/s | p50 µs | p99 µs | p99.9 µs | max µs | behind / dropped | t0 throttled | others' egress MB/s | machine busy % (window) | notes |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for label in ("others-idle", "others-busy"):
            x = iso["runs"].get(label)
            if not x:
                continue
            md.append(f"| {label[7:]} ({x['others_busy']} busy) | {fmt(x['achieved_per_s'])} | {fmt(x['p50_us'], '.0f')} | "
                      f"{fmt(x['p99_us'], '.0f')} | {fmt(x['p999_us'], '.0f')} | {fmt(x['max_us'], '.0f')} | {x['behind']} / {x['dropped']} | "
                      f"{fmt(x['t0_throttled'], '.0f')} | {fmt(x['others_egress'] and x['others_egress'] / MB, '.2f')} | "
                      f"{fmt(x['machine_busy_pct'], '.0f')} | {notes(x['problems'])} |")
        md += ["", f"p99 rise with the others saturating: **{fmt(iso['p99_rise_pct'], '+.1f')}%** (target: <= +20%).", ""]
    ov = res["overhead"]
    if ov["runs"]:
        p = next(iter(ov["runs"].values()))["params"]
        md += [f"## d) Overhead: {p.get('server_threads')} server thread(s) (pinned: {p.get('pinned')}), "
               f"{p.get('conns')} conns x pipeline {p.get('pipeline')}, set:get {p.get('ratio')}, {p.get('value_bytes')}-byte values", "",
               "| server | ops/s (runs) | median ops/s | ops per server CPU-s | p50 / p99 µs | notes |", "|---|---|---|---|---|---|"]
        for label in ("plain", "tenant", "memcached"):
            x = ov["runs"].get(label)
            if not x:
                continue
            md.append(f"| {label} | {' · '.join(f'{v:,.0f}' for v in x['ops_per_s_runs'])} | {fmt(x['ops_per_s_median'], ',.0f')} | "
                      f"{fmt(x['ops_per_server_cpu_s_median'], ',.0f')} | {x['p50_us']:.0f} / {x['p99_us']:.0f} | {notes(x['problems'])} |")
        t = ov["tenant_overhead_pct"]
        md += ["", f"Tenant path vs plain: throughput **{fmt(t['ops_per_s_median'], '+.1f')}%** slower, ops per server CPU-s "
               f"{fmt(t['ops_per_server_cpu_s_median'], '+.1f')}% (target: <= 3%). "
               f"Plain / memcached: {fmt(ov['plain_over_memcached']['ops_per_s_median'], '.2f')}x ops/s, "
               f"{fmt(ov['plain_over_memcached']['ops_per_server_cpu_s_median'], '.2f')}x per CPU-s; "
               f"tenant / memcached: {fmt(ov['tenant_over_memcached']['ops_per_s_median'], '.2f')}x ops/s.", ""]
    if res["wc"]:
        md += ["## e) Work-conserving: shares 0.4 / 0.3 / 0.2 / 0.1, only t1 (0.3) and t3 (0.1) busy", "",
               "| work_conserving | t1 MB/s (% cap; expected) | t3 MB/s (% cap; expected) | t1:t3 (expected) | total % of capacity | notes |",
               "|---|---|---|---|---|---|"]
        for label in ("off", "on"):
            x = res["wc"].get(label)
            if not x:
                continue
            cells = []
            for n in ("t1", "t3"):
                y = x["per_tenant"].get(n) or {}
                cells.append(f"{fmt(y.get('bytes_per_s') and y['bytes_per_s'] / MB, '.2f')} "
                             f"({fmt(y.get('pct_of_capacity'))}%; {fmt(y.get('expected_pct'), '.0f')}%)")
            md.append(f"| {str(x['work_conserving']).lower()} | {cells[0]} | {cells[1]} | {fmt(x['split'], '.2f')} ({fmt(x['expected_split'], '.1f')}) | "
                      f"{fmt(x['total_pct_of_capacity'])} | {notes(x['problems'])} |")
        md.append("")
    text = "\n".join(md)
    with open(os.path.join(d, "summary.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(d, "summary.json"), "w") as fh:
        json.dump(res, fh, indent=1, default=str)
        fh.write("\n")
    print(text)
    return res


# ---- plots --------------------------------------------------------------------------

def plot(d):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(d)
    written = []

    def save(fig, name):
        path = os.path.join(d, name)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    up = analyse_scaleup(runs)
    if up:
        fig, ax = plt.subplots(figsize=(6, 4))
        ks = [r["k"] for r in up]
        ax.plot(ks, [r["ideal"] / MB for r in up], "k--", label="ideal: min(capacity, k x 12.5%)")
        ax.plot(ks, [(r["agg_metrics"] or 0) / MB for r in up], "o-", label="measured (/metrics)")
        ax.plot(ks, [(r["agg_loadgen"] or 0) / MB for r in up], "x:", label="measured (loadgens)")
        ax.axhline(up[0]["capacity"] / MB, color="grey", lw=0.8)
        ax.set_xlabel("busy tenants (12.5% each)")
        ax.set_ylabel("aggregate egress, MB/s")
        ax.set_title("Scale-up (read-only saturation)")
        ax.set_xticks(ks)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        save(fig, "fig-scaleup.png")

    sh = analyse_shares(runs)
    if sh:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        names = list(sh[0]["shares"].keys())
        ks = [r["k"] for r in sh]
        bottom = [0.0] * len(sh)
        for n in names:
            vals = [((r["per_tenant_metrics"].get(n) or 0) / MB) for r in sh]
            a1.bar(ks, vals, bottom=bottom, label=f"{n} ({100 * sh[0]['shares'][n]:g}%)")
            bottom = [b + v for b, v in zip(bottom, vals)]
        a1.plot(ks, [r["ideal"] / MB for r in sh], "k--", label="ideal")
        a1.set_xlabel("busy tenants (t0 first)")
        a1.set_ylabel("egress, MB/s")
        a1.set_title("Egress by tenant as tenants join")
        a1.set_xticks(ks)
        a1.legend(fontsize=7)
        last = sh[-1]
        x = range(len(last["busy"]))
        meas = [(last["per_tenant_share"].get(n) or {}).get("pct_of_capacity") or 0 for n in last["busy"]]
        alloc = [100 * last["shares"].get(n, 0) for n in last["busy"]]
        a2.bar([i - 0.2 for i in x], alloc, width=0.4, label="allocation", color="lightgrey", edgecolor="k")
        a2.bar([i + 0.2 for i in x], meas, width=0.4, label="measured")
        a2.set_xticks(list(x))
        a2.set_xticklabels(last["busy"])
        a2.set_ylabel("% of capacity")
        a2.set_title(f"All {last['k']} busy: max deviation {fmt(last['max_abs_dev_pp'], '.2f')} pp")
        a2.legend(fontsize=8)
        save(fig, "fig-shares.png")

    iso = analyse_isolation(runs)
    if iso["runs"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [l for l in ("others-idle", "others-busy") if l in iso["runs"]]
        qs = [("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")]
        width = 0.8 / len(labels)
        for i, l in enumerate(labels):
            vals = [iso["runs"][l][q] or 0 for q, _ in qs]
            ax.bar([j + (i - (len(labels) - 1) / 2) * width for j in range(len(qs))], vals, width=width, label=l)
        ax.set_xticks(range(len(qs)))
        ax.set_xticklabels([n for _, n in qs])
        ax.set_ylabel("t0 latency, µs (from scheduled send)")
        ax.set_title(f"Latency isolation: p99 {fmt(iso['p99_rise_pct'], '+.1f')}% with the others saturating")
        ax.legend(fontsize=8)
        save(fig, "fig-isolation.png")

    wc = analyse_wc(runs)
    if wc:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [l for l in ("off", "on") if l in wc]
        tenants = sorted({n for l in labels for n in wc[l]["per_tenant"]})
        width = 0.8 / max(1, len(tenants))
        for i, n in enumerate(tenants):
            meas = [wc[l]["per_tenant"].get(n, {}).get("pct_of_capacity") or 0 for l in labels]
            exp = [wc[l]["per_tenant"].get(n, {}).get("expected_pct") or 0 for l in labels]
            xs = [j + (i - (len(tenants) - 1) / 2) * width for j in range(len(labels))]
            share = wc[labels[0]]["per_tenant"].get(n, {}).get("share")
            ax.bar(xs, meas, width=width, label=f"{n} (share {share})")
            ax.scatter(xs, exp, marker="_", s=400, color="k", zorder=3, label="expected" if i == 0 else None)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([f"work_conserving={str(wc[l]['work_conserving']).lower()}" for l in labels])
        ax.set_ylabel("% of capacity")
        ax.set_title("Two of four tenants busy")
        ax.legend(fontsize=8)
        save(fig, "fig-wc.png")

    ov = analyse_overhead(runs)
    if ov["runs"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [l for l in ("plain", "tenant", "memcached") if l in ov["runs"]]
        vals = [(ov["runs"][l]["ops_per_s_median"] or 0) / 1e3 for l in labels]
        ax.bar(labels, vals, color=["C0", "C1", "C2"][: len(labels)])
        for l, v in zip(labels, vals):
            for r in ov["runs"][l]["ops_per_s_runs"]:
                ax.plot(labels.index(l), r / 1e3, "k.", ms=4)
        ax.set_ylabel("kops/s (median; dots: runs)")
        ax.set_title(f"Shaping overhead: {fmt(ov['tenant_overhead_pct']['ops_per_s_median'], '+.1f')}% (tenant vs plain)")
        save(fig, "fig-overhead.png")

    for p in written:
        print(f"wrote {p}")
    return written


def main(argv):
    if len(argv) != 3 or argv[1] not in ("summary", "plot"):
        print(__doc__, file=sys.stderr)
        return 2
    if not os.path.isdir(argv[2]):
        print(f"no such directory: {argv[2]}", file=sys.stderr)
        return 2
    if argv[1] == "summary":
        summary(argv[2])
    else:
        plot(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
