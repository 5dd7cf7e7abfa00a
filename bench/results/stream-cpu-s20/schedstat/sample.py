#!/usr/bin/env python3
"""Session 20: is the receive CPU's /proc/stat softirq the NAPI thread counted again?
Every 0.5 s (bounded: at most DURATION_S, default 240) prints one JSON line: per CPU the
precise run time of all tasks on it (the root cgroup's cpuacct.usage_percpu, ns; this kernel
has no /proc/schedstat), /proc/stat ticks (user,
system, softirq; USER_HZ), and each NAPI kthread's precise run time (/proc/PID/schedstat, ns)
and the CPU it last ran on. Compare over the same interval: if the receive CPU's task run time
is about the NAPI thread's and the softirq ticks fit inside it, the softirq column is that
thread again."""
import json, os, sys, time

def cpus():
    usage = open('/sys/fs/cgroup/cpuacct/cpuacct.usage_percpu').read().split()
    out = {f'cpu{i}': {'run_ns': int(v)} for i, v in enumerate(usage)}
    for line in open('/proc/stat'):
        w = line.split()
        if w[0].startswith('cpu') and w[0] != 'cpu' and w[0] in out:
            out[w[0]].update(user=int(w[1]), system=int(w[3]), softirq=int(w[7]), idle=int(w[4]))
    return out

def napis():
    out = {}
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            comm = open(f'/proc/{pid}/comm').read().strip()
            if comm.startswith('napi/'):
                run_ns = int(open(f'/proc/{pid}/schedstat').read().split()[0])
                cpu = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[36])
                out[f'{comm}:{pid}'] = {'run_ns': run_ns, 'cpu': cpu}
        except OSError:
            pass
    return out

end = time.monotonic() + float(os.environ.get('DURATION_S', '240'))
while time.monotonic() < end:
    print(json.dumps({'t': time.monotonic(), 'cpus': cpus(), 'napi': napis()}), flush=True)
    time.sleep(0.5)
