#!/usr/bin/env python3
"""End-to-end test of the XDP fast path across two network namespaces.

Topology (created here, removed in `finally` and on signals): namespace srv <-> veth pair <->
namespace cli. The fast path (crates/fastpath example `attach`) is attached to the srv veth; the
cli veth gets the XDP_PASS program, because a veth delivers frames its peer bounced with XDP_TX
only when it has an XDP program itself. A stand-in responder in srv answers what the kernel
passes up with "END\\r\\n". Clients in cli send memcached UDP requests over IPv4 and IPv6.

Usage: e2e.py ATTACH_BINARY XDP_PASS_OBJECT. Needs root. Bounded: every wait has a timeout.
Not for: the full server (the lead's integration test covers slipstream itself).
"""
import json
import os
import signal
import subprocess
import sys
import time

BIN, PASS_OBJ = sys.argv[1], sys.argv[2]
TAG = str(os.getpid() % 100000)
SRV, CLI = "fpsrv" + TAG, "fpcli" + TAG
VS, VC = "fps" + TAG, "fpc" + TAG
V4S, V4C = "10.201.77.1", "10.201.77.2"
V6S, V6C = "fd00:201:77::1", "fd00:201:77::2"
PORT = 22122
HERE = os.path.dirname(os.path.abspath(__file__))

procs = []
passed = failed = 0


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {r.stderr.strip()}")
    return r


def cleanup():
    for p in procs:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    for ns in (SRV, CLI):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


def on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


def setup():
    sh("ip", "netns", "add", SRV)
    sh("ip", "netns", "add", CLI)
    sh("ip", "link", "add", VS, "type", "veth", "peer", "name", VC)
    sh("ip", "link", "set", VS, "netns", SRV)
    sh("ip", "link", "set", VC, "netns", CLI)
    for ns, dev, v4, v6 in ((SRV, VS, V4S, V6S), (CLI, VC, V4C, V6C)):
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", v4 + "/24", "dev", dev)
        sh("ip", "netns", "exec", ns, "ip", "-6", "addr", "add", v6 + "/64", "dev", dev, "nodad")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")


class Ctl:
    """The attach example, driven line by line."""

    def __init__(self, *args, ns=SRV):
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, BIN, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        procs.append(self.p)
        self.ready = self.read()

    def read(self):
        # Bounded by the select timeout: a hung driver fails the test instead of hanging it.
        import select
        r, _, _ = select.select([self.p.stdout], [], [], 10)
        if not r:
            raise RuntimeError("driver did not answer within 10 s")
        return self.p.stdout.readline().strip()

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.read()

    def counters(self):
        parts = self.cmd("counters").split()[1:]
        return {k: int(v) for k, v in (p.split("=") for p in parts)}

    def stop(self):
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=10)


def query(reqs):
    """reqs: list of (family, text). Returns list of reply payloads (None on timeout)."""
    spec = [[fam, V6S if fam == 6 else V4S, PORT, 0x100 + i, text] for i, (fam, text) in enumerate(reqs)]
    r = subprocess.run(["ip", "netns", "exec", CLI, sys.executable, os.path.join(HERE, "client.py"),
                        json.dumps(spec)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError("client failed: " + r.stderr)
    return json.loads(r.stdout)


def check(name, got, want):
    global passed, failed
    if got == want:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}: got {got!r}, want {want!r}")


def xdp_attached(ns, dev):
    return "xdp" in sh("ip", "netns", "exec", ns, "ip", "link", "show", dev).stdout


def main():
    setup()
    resp = subprocess.Popen(["ip", "netns", "exec", SRV, sys.executable, os.path.join(HERE, "responder.py"),
                             str(PORT), "50"], stdout=subprocess.PIPE, text=True)
    procs.append(resp)
    resp.stdout.readline()
    cli = Ctl("--pass", VC, ns=CLI)
    check("client veth has the XDP_PASS program", cli.ready, "ready pass")

    # A program some other tool attached through netlink must be replaced, not block us.
    sh("ip", "netns", "exec", SRV, "ip", "link", "set", "dev", VS, "xdp", "obj", PASS_OBJ, "sec", "xdp")
    fp = Ctl(VS, str(PORT), "64")
    check("attach (native on veth, replacing the old program)", fp.ready, "ready native XDP")

    END = "END\r\n"
    check("fill foo", fp.cmd("fill foo bar 5 77"), "ok Cached")
    check("fill k2", fp.cmd("fill k2 xyz 0 78"), "ok Cached")
    r = query([(4, "get foo\r\n"), (6, "get foo\r\n"), (4, "get foo k2\r\n"), (6, "gets foo\r\n"),
               (4, "mg foo v f\r\n"), (6, "mg foo v\r\n")])
    check("get hit ipv4", r[0], "VALUE foo 5 3\r\nbar\r\nEND\r\n")
    check("get hit ipv6", r[1], "VALUE foo 5 3\r\nbar\r\nEND\r\n")
    check("multi-get", r[2], "VALUE foo 5 3\r\nbar\r\nVALUE k2 0 3\r\nxyz\r\nEND\r\n")
    check("gets ipv6", r[3], "VALUE foo 5 3 77\r\nbar\r\nEND\r\n")
    check("mg v f", r[4], "VA 3 f5\r\nbar\r\n")
    check("mg v ipv6", r[5], "VA 3\r\nbar\r\n")
    c = fp.counters()
    check("hits counted", (c["hits"], c["misses"]), (6, 0))

    r = query([(4, "get nope\r\n"), (4, "get foo nope\r\n"), (6, "set x 0 0 1\r\nx\r\n")])
    check("miss reaches user space", r[0], END)
    check("partial multi-get miss reaches user space", r[1], END)
    check("non-get reaches user space", r[2], END)
    c = fp.counters()
    check("misses counted (set is not get-like)", (c["hits"], c["misses"]), (6, 2))

    check("invalidate foo", fp.cmd("invalidate foo"), "ok")
    r = query([(4, "get foo\r\n"), (4, "get k2\r\n")])
    check("invalidated key goes to user space", r[0], END)
    check("other key still hits", r[1], "VALUE k2 0 3\r\nxyz\r\n" + END)

    check("fill with 300 ms TTL", fp.cmd("fill t v 0 1 300"), "ok Cached")
    r = query([(4, "get t\r\n")])
    check("before expiry: kernel hit", r[0], "VALUE t 0 1\r\nv\r\nEND\r\n")
    time.sleep(0.4)
    r = query([(4, "get t\r\n")])
    check("after expiry: user space", r[0], END)

    check("flush_all", fp.cmd("flush"), "ok")
    r = query([(4, "get k2\r\n")])
    check("after flush_all: user space", r[0], END)

    check("oversized value not cached", fp.cmd("fillsize big 2000"), "ok NotCacheable(TooLarge)")
    r = query([(4, "get big\r\n")])
    check("oversized value: user space", r[0], END)
    check("largest cacheable value", fp.cmd("fillsize big2 1364"), "ok Cached")
    big_reply = "VALUE big2 0 1364\r\n" + "x" * 1364 + "\r\nEND\r\n"
    # veth hands XDP small requests in buffers with ~200 bytes of room to grow, so a reply much
    # larger than its request is passed to user space (NICs with page-sized buffers answer it).
    # memcached's tokenizer skips runs of spaces, so a space-padded request leaves room: the
    # kernel's largest reply then crosses veth and the client's kernel checks its UDP checksum.
    check("medium value", fp.cmd("fillsize mid 150"), "ok Cached")
    pad = " " * 1380
    r = query([(4, "get big2\r\n"), (6, "get big2" + pad + "\r\n"), (4, "get big2" + pad + "\r\n"),
               (4, "get mid\r\n"), (6, "get mid\r\n")])
    check("large reply without room: user space", r[0], END)
    check("largest reply ipv6 (checksum accepted by client)", r[1], big_reply)
    check("largest reply ipv4 (checksum accepted by client)", r[2], big_reply)
    mid = "VALUE mid 0 150\r\n" + "x" * 150 + "\r\nEND\r\n"
    check("medium value ipv4", r[3], mid)
    check("medium value ipv6", r[4], mid)
    c = fp.counters()
    check("invalidations counted", c["invalidations"], 2)

    # Restart: detach on exit, and a new attach starts with an empty cache.
    fp.stop()
    check("program detached on exit", xdp_attached(SRV, VS), False)
    r = query([(4, "get big2\r\n")])
    check("no fast path after exit", r[0], END)
    fp = Ctl(VS, str(PORT))
    r = query([(4, "get big2\r\n")])
    check("restart starts empty (no stale data)", r[0], END)
    check("refill", fp.cmd("fill foo new 1 2"), "ok Cached")
    r = query([(4, "get foo\r\n")])
    check("hit after restart", r[0], "VALUE foo 1 3\r\nnew\r\nEND\r\n")
    fp.stop()
    cli.stop()


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("SKIP: tests/netns/e2e.py needs root (network namespaces, XDP)")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        main()
    except Exception as e:  # report, then clean up
        failed += 1
        print(f"FAIL exception: {e}")
    finally:
        cleanup()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
