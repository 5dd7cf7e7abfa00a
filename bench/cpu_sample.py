#!/usr/bin/env python3
"""cpu_sample.py — one snapshot of the host CPU counters bench/stream_cpu.sh compares.

For: the begin/end samples of a measurement window. The Spark bench driver (SparkBench's
`sample_cmd` option) runs it right before the generator starts and again once the results
have settled; the script subtracts the two. Appends one JSON line to out=FILE:

  t_mono_ns   CLOCK_MONOTONIC
  label       begin/end label given by the caller
  cpus        per-CPU /proc/stat jiffies (USER_HZ): user nice system idle iowait irq softirq steal
  procs       name -> [utime, stime, cutime, cstime] jiffies of each pid given as NAME=PID
              (/proc/PID/stat covers all threads of the process; cutime/cstime are reaped
              children: the JVM's generator processes)
  threads     comm prefix -> summed utime+stime jiffies of every task whose comm starts with it
              (napi/DEV- = the threaded-NAPI receive kthread(s), ksoftirqd/); PREFIX#wakeups:
              their voluntary context switches (how often the receive thread went to sleep)
  bpf         XDP programs: id -> {name, run_time_ns, run_cnt} (bpftool prog show; needs
              kernel.bpf_stats_enabled=1 for non-zero run times); with xdp_dev=NS:DEV only the
              program attached there (other XDP programs on the machine are not ours)
  metrics     slipstream_stream_* counters from the daemon's admin /metrics (metrics=HOST:PORT)
  daemon_threads the same for the daemon (pid named daemon): where its CPU goes per thread
  jvm_threads the JVM's threads (pid named jvm): thread name with digits dropped -> summed
              utime+stime jiffies (where a JVM's CPU goes: JIT, GC, Spark's own threads)
  links       NS:DEV -> {rx_dropped, tx_dropped, rx_packets} of a (namespaced) link (link=NS:DEV):
              a veth whose peer's receive ring is full drops the frame and counts it here
  self_cpu_s  this sampler's own CPU (itself and its bpftool/ip children), seconds: the JVM
              that runs it reaps it, so it is in the JVM's cutime/cstime and must be taken off
              before the JVM's other children count as host work

Not for: computing the differences (bench/stream_cpu.sh's report does that). Takes key=value
arguments: out=FILE label=L [NAME=PID ...] [thread=PREFIX ...] [metrics=HOST:PORT] [bpf=0].
"""
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request

OWN_KEYS = {"out", "label", "metrics", "bpf", "thread", "link", "xdp_dev"}


def cpu_lines():
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3:4].isdigit():
                parts = line.split()
                out[parts[0]] = [int(x) for x in parts[1:9]]
    return out


def proc_times(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    f = s[s.rindex(")") + 2:].split()
    return [int(f[11]), int(f[12]), int(f[13]), int(f[14])]


def thread_times(prefixes):
    sums = {p: 0 for p in prefixes}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        for p in prefixes:
            if comm.startswith(p):
                f = s[s.rindex(")") + 2:].split()
                sums[p] += int(f[11]) + int(f[12])
                sums[p + "#wakeups"] = sums.get(p + "#wakeups", 0) + voluntary_switches(d)
    return sums


def voluntary_switches(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def attached_prog(spec):
    """The id of the XDP program attached to NS:DEV (0 if none)."""
    ns, _, dev = spec.partition(":")
    try:
        out = subprocess.run(["ip", "-n", ns, "-d", "-j", "link", "show", "dev", dev],
                             capture_output=True, text=True, timeout=10).stdout
        return str(json.loads(out)[0].get("xdp", {}).get("prog", {}).get("id", 0))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return "0"


def bpf_progs(only=None):
    try:
        out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True,
                             timeout=10).stdout
        progs = json.loads(out or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    return {str(p["id"]): {"name": p.get("name", ""), "run_time_ns": p.get("run_time_ns", 0),
                           "run_cnt": p.get("run_cnt", 0)}
            for p in progs if p.get("type") == "xdp" and (only is None or str(p["id"]) == only)}


def metrics(addr):
    try:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("slipstream_stream_"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def task_groups(pid):
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = "".join(c for c in s[s.index("(") + 1:s.rindex(")")] if not c.isdigit()).strip(" -_#")
        f = s[s.rindex(")") + 2:].split()
        out[comm] = out.get(comm, 0) + int(f[11]) + int(f[12])
    return out


def link_stats(spec):
    ns, _, dev = spec.partition(":")
    try:
        out = subprocess.run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev],
                             capture_output=True, text=True, timeout=10).stdout
        st = json.loads(out)[0]["stats64"]
    except (OSError, ValueError, IndexError, KeyError, subprocess.TimeoutExpired):
        return {}
    return {"rx_dropped": st["rx"]["dropped"], "tx_dropped": st["tx"]["dropped"],
            "rx_packets": st["rx"]["packets"], "tx_packets": st["tx"]["packets"]}


def main(argv):
    a, pids, prefixes, links = {}, {}, [], []
    for kv in argv:
        k, _, v = kv.partition("=")
        if k == "thread":
            prefixes.append(v)
        elif k == "link":
            links.append(v)
        elif k in OWN_KEYS:
            a[k] = v
        elif v:
            pids[k] = v
    snap = {"t_mono_ns": time.monotonic_ns(), "label": a.get("label", ""), "cpus": cpu_lines(),
            "procs": {k: proc_times(p) for k, p in pids.items()},
            "threads": thread_times(prefixes),
            "bpf": (bpf_progs(attached_prog(a["xdp_dev"]) if a.get("xdp_dev") else None)
                    if a.get("bpf", "1") != "0" else {}),
            "metrics": metrics(a["metrics"]) if a.get("metrics") else {},
            "links": {l: link_stats(l) for l in links},
            "jvm_threads": task_groups(pids["jvm"]) if "jvm" in pids else {},
            "daemon_threads": task_groups(pids["daemon"]) if "daemon" in pids else {}}
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    snap["self_cpu_s"] = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    with open(a["out"], "a") as f:
        f.write(json.dumps(snap) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
