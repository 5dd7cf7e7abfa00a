#!/usr/bin/env python3
"""stream_rx_profile.py — where the receive thread's time goes in a live stream_cpu.sh run
(issue 12): a cpu-clock `perf record -g` of the receive CPU, split by function, with the XDP
program's own functions (JIT images, named from a /proc/kallsyms snapshot taken while the
program was attached: perf on this kernel cannot name BPF images itself) and its hottest
instruction offsets (to compare with `bpftool prog dump xlated`).

Usage: stream_rx_profile.py PERF_DATA KALLSYMS_SNAPSHOT [TOP]
  The thread analysed is the one whose samples run veth_poll/napi_threaded_poll (the server
  veth's threaded-NAPI kthread, bench/stream_cpu.sh). bench/stream_rx_profile.sh takes both
  inputs during a run.

Not for: CPU accounting (cpu-clock samples from a timer, no PMU on this VM: a sample taken with
interrupts off lands where they are turned on; stream_cpu.sh measures the CPU-seconds).
"""
import bisect
import collections
import subprocess
import sys


def bpf_symbols(path):
    out = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[2].startswith("bpf_prog_") and "[bpf]" in line:
                # bpf_prog_<tag>_<name>
                out.append((int(p[0], 16), p[2].split("_", 3)[-1]))
    out.sort()
    return out


def samples(perf_data):
    text = subprocess.run(["perf", "script", "-i", perf_data, "-F", "tid,ip,sym"], capture_output=True,
                          text=True, check=True).stdout
    cur = None
    for line in text.splitlines():
        if not line.strip():
            if cur:
                yield cur
            cur = None
            continue
        p = line.split()
        if cur is None:
            cur = (p[0], [])
            p = p[1:]
            if not p:
                continue
        try:
            cur[1].append((int(p[0], 16), " ".join(p[1:]).split("+")[0]))
        except ValueError:
            pass
    if cur:
        yield cur


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    syms = bpf_symbols(sys.argv[2])
    addrs = [a for a, _ in syms]

    def name(ip, sym):
        if sym and sym != "[unknown]" and not sym.startswith("bpf_prog_"):
            return sym, None  # kernel text, the XDP dispatcher
        i = bisect.bisect_right(addrs, ip) - 1
        if i >= 0 and ip - addrs[i] < 0x4000 and ip >= 0xffffffffc0000000:
            return "bpf:" + syms[i][1], ip - addrs[i]
        return sym or hex(ip), None

    all_samples = list(samples(sys.argv[1]))
    rx = collections.Counter(t for t, st in all_samples
                             if any(s in ("veth_poll", "napi_threaded_poll") for _, s in st))
    if not rx:
        print("no receive-thread samples (veth_poll / napi_threaded_poll)")
        sys.exit(1)
    tid = rx.most_common(1)[0][0]
    th = [st for t, st in all_samples if t == tid]
    n = len(th)
    leaf, incl, off = collections.Counter(), collections.Counter(), collections.Counter()
    for st in th:
        k, o = name(*st[0])
        leaf[k] += 1
        if o is not None:
            off[(k, o)] += 1
        for kk in {name(ip, s)[0] for ip, s in st}:
            incl[kk] += 1
    print(f"receive thread tid {tid}: {n} samples of {len(all_samples)} on the CPU")
    for title, c in (("self", leaf), ("inclusive", incl)):
        print(f"\n{title}:")
        for k, v in c.most_common(top):
            print(f"{v:7d} {100 * v / n:5.1f}%  {k}")
    print("\nhottest offsets in the XDP program's functions:")
    for (k, o), v in off.most_common(12):
        print(f"{v:7d} {100 * v / n:5.1f}%  {k}+0x{o:x}")


if __name__ == "__main__":
    main()
