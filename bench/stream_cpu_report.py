#!/usr/bin/env python3
"""stream_cpu_report.py RESULTS_DIR [RX_CPU] — bench/stream_cpu.sh's report.

For: turning the begin/end snapshots (samples/*.jsonl, from bench/cpu_sample.py) and the
driver's lines (driver.jsonl) into per-window CPU figures, exactness verdicts, host CPU-seconds
per million input records and ratios against plain Spark; writes cpu.json and summary.md.
Not for: measuring (the script and the sampler do that). The accounting rules are in
bench/stream_cpu.sh's header.
"""
import json
import os
import sys

HZ = 100.0  # USER_HZ: /proc jiffies
BUSY = (0, 1, 2, 5, 6)  # user nice system irq softirq (not steal: the hypervisor's)
SOFTIRQ = 6
SETUP_ORDER = ["plain-spark", "slipstream-user-spark", "slipstream-xdp-spark"]
SETUP_NAMES = {"plain-spark": "plain Spark (raw UDP receiver)",
               "slipstream-user-spark": "Slipstream user space → Spark",
               "slipstream-xdp-spark": "Slipstream XDP → Spark"}


def load_samples(path):
    out = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            out[d["label"]] = d
    return out


def cpu_delta(a, b, fields):
    return {c: sum(b["cpus"][c][i] - a["cpus"][c][i] for i in fields) / HZ for c in a["cpus"]}


def proc_delta(a, b, name, idx=(0, 1)):
    pa, pb = a["procs"].get(name), b["procs"].get(name)
    if not pa or not pb:
        return 0.0
    return sum(pb[i] - pa[i] for i in idx) / HZ


def thread_delta(a, b, prefix_start):
    return sum(b["threads"][k] - a["threads"][k] for k in a["threads"]
               if k.startswith(prefix_start) and not k.endswith("#wakeups")) / HZ


def wakeups_delta(a, b, prefix_start):
    return sum(b["threads"][k] - a["threads"].get(k, 0) for k in b["threads"]
               if k.startswith(prefix_start) and k.endswith("#wakeups"))


def bpf_delta(a, b):
    progs = {}
    for pid, pb in b["bpf"].items():
        pa = a["bpf"].get(pid, {"run_time_ns": 0, "run_cnt": 0})
        dt = pb["run_time_ns"] - pa["run_time_ns"]
        dn = pb["run_cnt"] - pa["run_cnt"]
        if dn:
            progs["%s#%s" % (pb["name"], pid)] = {"run_time_s": dt / 1e9, "run_cnt": dn,
                                        "ns_per_run": dt / dn}
    return progs


def metric_delta(a, b, name, stream):
    key = 'slipstream_stream_%s_total{stream="%s"}' % (name, stream)
    if key not in b["metrics"]:
        return None
    return b["metrics"][key] - a["metrics"].get(key, 0)


def window(a, b, idle, rx_cpu, gen_s):
    """CPU figures of one window [a, b]; idle: (busy/s, softirq/s) per CPU of the baseline."""
    win = (b["t_mono_ns"] - a["t_mono_ns"]) / 1e9
    busy = cpu_delta(a, b, BUSY)
    soft = cpu_delta(a, b, (SOFTIRQ,))
    soft_all = sum(soft.values())
    soft_idle = sum(idle["softirq_per_s"].values()) * win
    busy_idle = sum(idle["busy_per_s"].values()) * win
    r = {
        "window_s": win,
        "daemon_s": proc_delta(a, b, "daemon"),
        "jvm_s": proc_delta(a, b, "jvm"),
        "napi_s": thread_delta(a, b, "napi/"),
        "napi_wakeups": wakeups_delta(a, b, "napi/"),
        "ksoftirqd_s": thread_delta(a, b, "ksoftirqd/"),
        "softirq_all_s": soft_all,
        "softirq_rx_cpu_s": soft.get("cpu%s" % rx_cpu, 0.0),
        "softirq_net_s": max(0.0, soft_all - soft_idle),
        "xdp": bpf_delta(a, b),
        "busy_per_cpu_s": busy,
        "gen_s": gen_s,
    }
    r["xdp_s"] = sum(p["run_time_s"] for p in r["xdp"].values())
    ja, jb = a.get("jvm_threads", {}), b.get("jvm_threads", {})
    r["jvm_threads_s"] = dict(sorted(((k, (jb[k] - ja.get(k, 0)) / HZ) for k in jb), key=lambda kv: -kv[1]))
    da, db = a.get("daemon_threads", {}), b.get("daemon_threads", {})
    r["daemon_threads_s"] = dict(sorted(((k, (db[k] - da.get(k, 0)) / HZ) for k in db), key=lambda kv: -kv[1]))
    # The JVM's reaped children minus the generator (its own CPU, from bash's `times`) and the
    # begin-sampler (reaped inside the window; the end-sampler is not reaped yet): processes the
    # JVM started for its own work (Hadoop's shell commands and the like) are host work.
    r["jvm_children_s"] = proc_delta(a, b, "jvm", (2, 3)) - max(0.0, gen_s) - a.get("self_cpu_s", 0.0)
    # ksoftirqd's time is softirq work, already in the softirq column (tick accounting): shown only.
    r["host_s"] = r["daemon_s"] + r["jvm_s"] + r["jvm_children_s"] + r["napi_s"] + r["softirq_net_s"]
    # The same with the receive CPU's softirq left out (session 20). With tick accounting a tick
    # that lands in softirq context is charged to the softirq column AND to the task it
    # interrupted, whose utime+stime (scaled to its exact run time) is already counted: on the
    # receive CPU that task is the NAPI thread (or a JVM thread), so there the column counts the
    # receive path twice. Seen with APP_CPUS=1, where the receive CPU runs nothing but the NAPI
    # thread: its ticks (busy_per_cpu_s) were 0.33-0.54 CPU-s per run, nearly all softirq, while
    # the NAPI thread ran 0.57-0.62 s — the column is that thread again. Softirq taken in the
    # idle task's context on that CPU (counted nowhere else) is lost by this figure: it is a
    # second view, not a replacement.
    rx = "cpu%s" % rx_cpu
    soft_off_rx = soft_all - soft.get(rx, 0.0)
    soft_idle_off_rx = soft_idle - idle["softirq_per_s"].get(rx, 0.0) * win
    r["softirq_off_rx_s"] = max(0.0, soft_off_rx - soft_idle_off_rx)
    r["host_rx_once_s"] = r["host_s"] - r["softirq_net_s"] + r["softirq_off_rx_s"]
    r["machine_s"] = sum(busy.values()) - gen_s - busy_idle
    return r


def idle_rates(path):
    s = load_samples(path)
    a, b = s["idle-begin"], s["idle-end"]
    win = (b["t_mono_ns"] - a["t_mono_ns"]) / 1e9
    return {"window_s": win,
            "busy_per_s": {c: v / win for c, v in cpu_delta(a, b, BUSY).items()},
            "softirq_per_s": {c: v / win for c, v in cpu_delta(a, b, (SOFTIRQ,)).items()}}


def main():
    d = sys.argv[1]
    rx_cpu = sys.argv[2] if len(sys.argv) > 2 else "0"
    idle = idle_rates(os.path.join(d, "samples", "idle.jsonl"))
    rows = []
    with open(os.path.join(d, "driver.jsonl")) as f:
        driver = [json.loads(x) for x in f if x.strip()]
    for r in driver:
        part, setup, run = r["part"], r["setup"], r.get("run", 0)
        s = load_samples(os.path.join(d, "samples", "%s-%s.jsonl" % (part, setup)))
        a, b = s.get("run%d-begin" % run), s.get("run%d-end" % run)
        if not a or not b:
            continue
        w = window(a, b, idle, rx_cpu, r.get("gen_cpu_s", 0.0))
        stream = "wc" if part == "wc" else "cp"
        drops = metric_delta(a, b, "socket_drops", stream)
        records_daemon = metric_delta(a, b, "records", stream)
        w["daemon_records"] = records_daemon
        w["socket_drops"] = drops
        w["xdp_datagrams"] = metric_delta(a, b, "xdp_datagrams", stream)
        w["xdp_passed"] = metric_delta(a, b, "xdp_passed", stream)
        w["link_drops"] = sum(b["links"][l].get(k, 0) - a["links"][l].get(k, 0)
                              for l in a.get("links", {}) for k in ("rx_dropped", "tx_dropped"))
        if part == "wc":
            exact = bool(r["exact"]) and (drops in (None, 0)) and w["link_drops"] == 0
            records = r["records"]
        else:
            records = r["records"]
            counted = r["counted"] if r["counted"] >= 0 else records_daemon
            exact = (counted == records and drops in (None, 0) and w["link_drops"] == 0
                     and r["alerts_after_step"] >= 1 and r["alerts_before_step"] == 0)
            w["counted"] = counted
        w.update({"part": part, "setup": setup, "run": run, "records": records, "exact": exact,
                  "achieved_rate_per_s": r["achieved_rate_per_s"], "rate_per_s": r["rate_per_s"],
                  "host_s_per_m": w["host_s"] / (records / 1e6) if records else None,
                  "host_rx_once_s_per_m": w["host_rx_once_s"] / (records / 1e6) if records else None,
                  "machine_s_per_m": w["machine_s"] / (records / 1e6) if records else None,
                  "gen_s_per_m": w["gen_s"] / (records / 1e6) if records else None,
                  "driver": r})
        ia, ib = s.get("idle-begin"), s.get("idle-end")
        if ia and ib:
            iw = window(ia, ib, idle, rx_cpu, 0.0)
            w["idle_host_per_s"] = iw["host_s"] / iw["window_s"]
            w["idle_jvm_per_s"] = iw["jvm_s"] / iw["window_s"]
            w["idle_daemon_per_s"] = iw["daemon_s"] / iw["window_s"]
            marginal = w["host_s"] - w["idle_host_per_s"] * w["window_s"]
            w["marginal_host_s_per_m"] = marginal / (records / 1e6) if records else None
        rows.append(w)
    # The reported run per (part, setup): the last one (earlier runs warm the JVM up).
    last = {}
    for w in rows:
        last[(w["part"], w["setup"])] = w
    with open(os.path.join(d, "cpu.json"), "w") as f:
        json.dump({"idle": idle, "rows": rows}, f, indent=1)
    md = ["# Host CPU per million input records (bench/stream_cpu.sh)", ""]
    env = os.path.join(d, "env.txt")
    if os.path.exists(env):
        md += ["```", open(env).read().strip(), "```", ""]
    md += ["Idle baseline (%.1f s, nothing of ours running): busy %s cores, softirq %s cores." % (
        idle["window_s"], " + ".join("%.3f" % v for v in idle["busy_per_s"].values()),
        " + ".join("%.4f" % v for v in idle["softirq_per_s"].values())), ""]
    for part, unit in (("wc", "words"), ("cp", "values")):
        sel = [last[(part, s)] for s in SETUP_ORDER if (part, s) in last]
        if not sel:
            continue
        base = last.get((part, "plain-spark"))
        md += ["## %s: CPU-seconds per million input %s" % ("Word count" if part == "wc" else "Change point", unit), "",
               "| setup | offered/s | achieved/s | %s | exact | window s | daemon | JVM | JVM's child processes | NAPI rx (XDP part) | softirq | host CPU-s | **host per 1M** | vs plain | machine per 1M | generator per 1M |" % unit,
               "|---|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for w in sel:
            ratio = (base["host_s_per_m"] / w["host_s_per_m"]) if base and w["host_s_per_m"] else None
            md.append("| %s | %d | %.0f | %d | %s | %.1f | %.2f | %.2f | %.2f | %.2f (%.3f) | %.2f | %.2f | **%.3f** | %s | %.3f | %.3f |" % (
                SETUP_NAMES.get(w["setup"], w["setup"]), w["rate_per_s"], w["achieved_rate_per_s"],
                w["records"], "yes" if w["exact"] else "**no**", w["window_s"], w["daemon_s"],
                w["jvm_s"], w["jvm_children_s"], w["napi_s"], w["xdp_s"], w["softirq_net_s"],
                w["host_s"], w["host_s_per_m"],
                ("%.1fx less" % ratio) if ratio else "", w["machine_s_per_m"], w["gen_s_per_m"]))
        md.append("")
        md += ["| setup | softirq off the receive CPU | host per 1M, receive CPU counted once (see stream_cpu_report.window) | vs plain |",
               "|---|---:|---:|---:|"]
        for w in sel:
            r = (base["host_rx_once_s_per_m"] / w["host_rx_once_s_per_m"]
                 if base and w["host_rx_once_s_per_m"] else None)
            md.append("| %s | %.2f | %.3f | %s |" % (SETUP_NAMES.get(w["setup"], w["setup"]), w["softirq_off_rx_s"],
                                                    w["host_rx_once_s_per_m"], ("%.1fx less" % r) if r else ""))
        md.append("")
        md += ["| setup | idle host CPU (cores) | of it JVM / daemon | marginal host CPU-s per 1M (above idle) | vs plain |",
               "|---|---:|---:|---:|---:|"]
        for w in sel:
            if "idle_host_per_s" not in w:
                continue
            r = (base.get("marginal_host_s_per_m") / w["marginal_host_s_per_m"]
                 if base and base.get("marginal_host_s_per_m") and w["marginal_host_s_per_m"] else None)
            md.append("| %s | %.3f | %.3f / %.3f | %.3f | %s |" % (
                SETUP_NAMES.get(w["setup"], w["setup"]), w["idle_host_per_s"], w["idle_jvm_per_s"],
                w["idle_daemon_per_s"], w["marginal_host_s_per_m"], ("%.1fx less" % r) if r else ""))
        md.append("")
        for w in sel:
            progs = ", ".join("%s %.0f ns × %d" % (k, v["ns_per_run"], v["run_cnt"]) for k, v in w["xdp"].items())
            top = ", ".join("%s %.2f" % (k, v) for k, v in list(w["jvm_threads_s"].items())[:6] if v > 0)
            dtop = ", ".join("%s %.2f" % (k, v) for k, v in list(w.get("daemon_threads_s", {}).items())[:4] if v > 0)
            if dtop:
                top += "; daemon threads (CPU-s): " + dtop
            md.append("- %s: NAPI thread slept %d times (%.1f datagrams per wake-up); XDP %s; veth drops %d; socket drops %s; daemon records %s; xdp datagrams / passed %s / %s; "
                      "generator %.2f CPU-s; JVM threads (CPU-s): %s" % (
                w["setup"], w["napi_wakeups"], w["driver"].get("datagrams", 0) / max(1, w["napi_wakeups"]),
                progs or "none", w["link_drops"], w["socket_drops"], w["daemon_records"],
                w["xdp_datagrams"], w["xdp_passed"], w["gen_s"], top))
        md.append("")
    with open(os.path.join(d, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
