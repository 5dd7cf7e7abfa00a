#!/usr/bin/env python3
"""What the reduce stage spends its time on, from the executors' JFR recordings that
`PROFILE=1 bench/shuffle_bench.sh` makes (RESULTS_DIR/jfr/<manager>/*.jfr).

JFR keeps a thread's name from its start ("Executor task launch worker-0"), not Spark's per-task
renaming, so the reduce side is picked by its stack: the samples (jdk.ExecutionSample) of task
threads with a frame matching MARK (default "ShuffleReader.read": Slipstream's and Spark's own
reader, which the reduce task's whole aggregation runs under) are kept, and for each manager
the script prints the share of samples per top frame (self) and per frame anywhere on the stack
(inclusive; stacks read 64 frames deep — `jfr print` keeps 5 by default, which hid every
caller below the fifth frame before session 15), top N. It also sums jdk.GarbageCollection
pause time over the recordings.

With LAST (a fraction, e.g. LAST=0.3 in the environment) only the latest LAST of each
recording's matching samples by time are kept: the last measured rounds, after WARMUPS warm-up
rounds, without the interpreted and half-compiled code of the first rounds.

Usage: shuffle_profile.py RESULTS_DIR [MARK] [N=25]
"""

import collections
import glob
import json
import os
import re
import subprocess
import sys



def samples(path):
    """(thread name, [frames top first], start time) per execution sample, from `jfr print --json`."""
    out = subprocess.run(["jfr", "print", "--json", "--stack-depth", "64", "--events", "jdk.ExecutionSample", path],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    for e in json.loads(out)["recording"]["events"]:
        v = e["values"]
        thread = (v.get("sampledThread") or {}).get("javaName") or ""
        frames = []
        for f in ((v.get("stackTrace") or {}).get("frames") or []):
            m = f.get("method") or {}
            t = (m.get("type") or {}).get("name", "?")
            frames.append("%s.%s" % (t.replace("/", "."), m.get("name", "?")))
        yield thread, frames, str(v.get("startTime", ""))


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


def main(out, mark, top=25):
    for mdir in sorted(glob.glob(os.path.join(out, "jfr", "*"))):
        manager = os.path.basename(mdir).removesuffix(".jfr")
        self_c, incl_c = collections.Counter(), collections.Counter()
        n, gc = 0, 0.0
        # A directory of recordings, or one file (JFR writes one when the directory did not exist).
        files = sorted(glob.glob(os.path.join(mdir, "*.jfr"))) if os.path.isdir(mdir) else [mdir]
        if files and not files[0].endswith(".jfr"):
            # `jfr print` wants the .jfr suffix.
            os.rename(files[0], files[0] + ".jfr")
            files = [files[0] + ".jfr"]
        last = float(os.environ.get("LAST", "1"))
        for f in files:
            gc += gc_pause_ms(f)
            kept = sorted(((t, frames) for thread, frames, t in samples(f)
                           if thread.startswith("Executor task launch") and any(mark in fr for fr in frames)),
                          key=lambda x: x[0])
            for _, frames in kept[len(kept) - int(round(len(kept) * last)):]:
                n += 1
                self_c[frames[0]] += 1
                for fr in set(frames):
                    incl_c[fr] += 1
        print("## %s: %d task-thread samples under %s; GC pauses in the recordings %.0f ms\n" % (manager, n, mark, gc))
        if not n:
            continue
        print("| self % | frame |\n|---:|---|")
        for fr, c in self_c.most_common(top):
            print("| %.1f | `%s` |" % (100.0 * c / n, fr))
        print("\n| inclusive % | frame |\n|---:|---|")
        for fr, c in incl_c.most_common(top):
            print("| %.1f | `%s` |" % (100.0 * c / n, fr))
        print()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else "ShuffleReader.read",
         int(sys.argv[3]) if len(sys.argv) > 3 else 25)
