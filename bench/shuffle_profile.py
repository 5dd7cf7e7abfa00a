#!/usr/bin/env python3
"""What the reduce stage spends its time on, from the executors' JFR recordings that
`PROFILE=1 bench/shuffle_bench.sh` makes (RESULTS_DIR/jfr/<manager>/*.jfr).

Spark names a task thread "Executor task launch worker for task T in stage S.A (TID N)"; the
samples (jdk.ExecutionSample) of the threads of the given reduce stages are kept, and for each
manager the script prints the share of samples per top frame (self time) and per frame anywhere
on the stack (inclusive), top N. It also counts jdk.GarbageCollection pause time in the files.

Usage: shuffle_profile.py RESULTS_DIR [stages: comma-separated, default: every even stage >= 2,
the reduce stages of ShuffleBench's rounds] [N=25]
"""

import collections
import glob
import json
import os
import re
import subprocess
import sys

THREAD = re.compile(r"in stage (\d+)\.\d+")


def samples(path):
    """(thread name, [frames top first]) per execution sample, from `jfr print --json`."""
    out = subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample", path],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    for e in json.loads(out)["recording"]["events"]:
        v = e["values"]
        thread = (v.get("sampledThread") or {}).get("javaName") or ""
        frames = []
        for f in ((v.get("stackTrace") or {}).get("frames") or []):
            m = f.get("method") or {}
            t = (m.get("type") or {}).get("name", "?")
            frames.append("%s.%s" % (t.replace("/", "."), m.get("name", "?")))
        yield thread, frames


def gc_pause_ms(path):
    out = subprocess.run(["jfr", "print", "--json", "--events", "jdk.GarbageCollection", path],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    total = 0.0
    for e in json.loads(out)["recording"]["events"]:
        d = e["values"].get("sumOfPauses", "0")
        # JFR's JSON durations look like "PT0.012345S".
        m = re.match(r"PT([\d.]+)S", str(d))
        total += float(m.group(1)) * 1000 if m else 0.0
    return total


def main(out, stages=None, top=25):
    for mdir in sorted(glob.glob(os.path.join(out, "jfr", "*"))):
        manager = os.path.basename(mdir)
        self_c, incl_c = collections.Counter(), collections.Counter()
        n, gc = 0, 0.0
        for f in sorted(glob.glob(os.path.join(mdir, "*.jfr"))):
            gc += gc_pause_ms(f)
            for thread, frames in samples(f):
                m = THREAD.search(thread)
                if not m or not frames:
                    continue
                s = int(m.group(1))
                if (stages is not None and s not in stages) or (stages is None and (s < 2 or s % 2)):
                    continue
                n += 1
                self_c[frames[0]] += 1
                for fr in set(frames):
                    incl_c[fr] += 1
        print("## %s: %d reduce-task samples; GC pauses in the recordings %.0f ms\n" % (manager, n, gc))
        if not n:
            continue
        print("| self %% | frame |\n|---:|---|")
        for fr, c in self_c.most_common(top):
            print("| %.1f | `%s` |" % (100.0 * c / n, fr))
        print("\n| inclusive %% | frame |\n|---:|---|")
        for fr, c in incl_c.most_common(top):
            print("| %.1f | `%s` |" % (100.0 * c / n, fr))
        print()


if __name__ == "__main__":
    st = {int(x) for x in sys.argv[2].split(",")} if len(sys.argv) > 2 and sys.argv[2] else None
    main(sys.argv[1], st, int(sys.argv[3]) if len(sys.argv) > 3 else 25)
