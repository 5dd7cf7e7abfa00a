#!/usr/bin/env python3
"""Differential test of memcached's binary protocol: send the same binary sessions to two
servers (normally real memcached 1.6.18 and Slipstream) and compare the replies byte for byte.

What it is for: catching any difference in reply bytes (status, lengths, extras, key, body text,
opaque echo, which quiet replies are suppressed, when the connection is closed). CAS values
legitimately differ between servers, so each distinct CAS in a session is renamed to its order of
first appearance before comparing; `version` bodies and `stat` values are masked (stat NAMES are
compared, in order, with nothing forgiven: Slipstream's `fastpath_*` stats appear only while its
kernel fast path is attached, which these sessions never do).

What it is not for: timing or load. Only ever talks to 127.0.0.1.

Usage:  binary_diff.py PORT_A PORT_B [-v] [-k SUBSTRING] [--strict]   (exit 0 = identical, 1 = differ)
        binary_diff.py --dump PORT                        (print one server's replies)
"""

import argparse
import socket
import struct
import sys
import time

HOST = "127.0.0.1"
FENCE_OPAQUE = 0xFEEDFACE
STEP_TIMEOUT_S = 1.0

# Opcodes
GET, SET, ADD, REPLACE, DELETE, INCR, DECR, QUIT, FLUSH, GETQ, NOOP, VERSION = range(0x0C)
GETK, GETKQ, APPEND, PREPEND, STAT = 0x0C, 0x0D, 0x0E, 0x0F, 0x10
SETQ, ADDQ, REPLACEQ, DELETEQ, INCRQ, DECRQ, QUITQ, FLUSHQ, APPENDQ, PREPENDQ = range(0x11, 0x1B)
VERBOSITY, TOUCH, GAT, GATQ = 0x1B, 0x1C, 0x1D, 0x1E
SASL_LIST, SASL_AUTH, SASL_STEP = 0x20, 0x21, 0x22
GATK, GATKQ = 0x23, 0x24


def req(opcode, key=b"", extras=b"", value=b"", cas=0, opaque=0, magic=0x80,
        keylen=None, extlen=None, bodylen=None, datatype=0, vbucket=0):
    """One request packet; the length fields may be overridden to build malformed packets."""
    kl = len(key) if keylen is None else keylen
    el = len(extras) if extlen is None else extlen
    bl = len(extras) + len(key) + len(value) if bodylen is None else bodylen
    hdr = struct.pack(">BBHBBHIIQ", magic, opcode, kl, el, datatype, vbucket, bl, opaque, cas)
    return hdr + extras + key + value


def store_extras(flags=0, exptime=0):
    return struct.pack(">II", flags, exptime)


def arith_extras(delta, initial=0, exptime=0):
    return struct.pack(">QQI", delta, initial, exptime)


def noop_fence():
    return req(NOOP, opaque=FENCE_OPAQUE)


class CasFrom:
    """Placeholder for 'the CAS of the Nth reply packet seen so far in this session' (plus an
    offset, to build a wrong CAS)."""

    def __init__(self, index, offset=0):
        self.index = index
        self.offset = offset


def set_(key, value, flags=0, exptime=0, cas=0, opaque=0, op=SET, **kw):
    return req(op, key, store_extras(flags, exptime), value, cas=cas, opaque=opaque, **kw)


# ---------------------------------------------------------------------------------------------
# Sessions: name -> list of steps. A step is bytes, or a callable taking the list of reply
# packets so far and returning bytes (for CAS round trips). Each step is followed by a NOOP
# fence unless the session says otherwise; the step's replies are read up to the fence, EOF or
# a timeout.

def cas_step(build):
    return build


SESSIONS = {}


DRIBBLE = set()


def session(name, fence=True, dribble=False):
    """Register a session; `dribble` sends it one byte per write (split-packet handling)."""
    def deco(fn):
        SESSIONS[name] = (fn, fence)
        if dribble:
            DRIBBLE.add(name)
        return fn
    return deco


@session("get_set_basic")
def _():
    return [
        req(GET, b"bd:missing", opaque=1),
        req(GETK, b"bd:missing", opaque=2),
        set_(b"bd:a", b"hello", flags=0xDEADBEEF, opaque=3),
        req(GET, b"bd:a", opaque=4),
        req(GETK, b"bd:a", opaque=5),
        req(GETQ, b"bd:a", opaque=6),
        req(GETKQ, b"bd:a", opaque=7),
        req(GETQ, b"bd:missing", opaque=8),
        req(GETKQ, b"bd:missing", opaque=9),
        set_(b"bd:empty", b"", opaque=10),
        req(GET, b"bd:empty", opaque=11),
    ]


@session("add_replace_append")
def _():
    return [
        set_(b"bd:r", b"x", op=REPLACE, opaque=1),
        set_(b"bd:r", b"x", op=REPLACEQ, opaque=2),
        set_(b"bd:r", b"one", op=ADD, opaque=3),
        set_(b"bd:r", b"two", op=ADD, opaque=4),
        set_(b"bd:r", b"two", op=ADDQ, opaque=5),
        set_(b"bd:r", b"three", op=REPLACE, flags=7, opaque=6),
        req(APPEND, b"bd:r", value=b"-tail", opaque=7),
        req(PREPEND, b"bd:r", value=b"head-", opaque=8),
        req(APPENDQ, b"bd:r", value=b"!", opaque=9),
        req(PREPENDQ, b"bd:r", value=b"^", opaque=10),
        req(GET, b"bd:r", opaque=11),
        req(APPEND, b"bd:nope", value=b"x", opaque=12),
        req(PREPENDQ, b"bd:nope", value=b"x", opaque=13),
        set_(b"bd:r", b"q", op=SETQ, opaque=14),
        req(GETK, b"bd:r", opaque=15),
    ]


@session("cas")
def _():
    return [
        set_(b"bd:c", b"v1", opaque=1),                      # reply 0 carries the CAS
        lambda r: set_(b"bd:c", b"v2", cas=r[0].cas, opaque=2),
        lambda r: set_(b"bd:c", b"v3", cas=r[0].cas, opaque=3),   # stale -> exists
        set_(b"bd:nocas", b"v", cas=12345, opaque=4),        # missing + cas -> not found
        lambda r: set_(b"bd:c", b"v4", cas=r[1].cas, op=REPLACE, opaque=5),
        lambda r: set_(b"bd:c", b"v5", cas=r[3].cas, op=ADD, opaque=6),
        req(GET, b"bd:c", opaque=7),
        lambda r: req(DELETE, b"bd:c", cas=r[4].cas + 1, opaque=8),
        lambda r: req(APPEND, b"bd:c", value=b"x", cas=r[4].cas + 1, opaque=9),
        lambda r: req(APPEND, b"bd:c", value=b"x", cas=r[4].cas, opaque=10),
        req(GET, b"bd:c", opaque=11),
        lambda r: req(DELETE, b"bd:c", cas=r[-1].cas, opaque=12),
        req(GET, b"bd:c", opaque=13),
        lambda r: set_(b"bd:c", b"v", cas=5, op=SETQ, opaque=14),
        set_(b"bd:c", b"v", opaque=15),
        req(DELETE, b"bd:c", cas=77, opaque=16),
        req(INCR, b"bd:c", arith_extras(1), cas=77, opaque=17),
        req(APPENDQ, b"bd:c", value=b"x", cas=77, opaque=18),
    ]


@session("delete")
def _():
    return [
        set_(b"bd:d", b"x", opaque=1),
        req(DELETE, b"bd:d", opaque=2),
        req(DELETE, b"bd:d", opaque=3),
        set_(b"bd:d", b"x", opaque=4),
        req(DELETEQ, b"bd:d", opaque=5),
        req(DELETEQ, b"bd:d", opaque=6),
        req(GET, b"bd:d", opaque=7),
    ]


@session("incr_decr")
def _():
    return [
        req(INCR, b"bd:n", arith_extras(1, 10, 0xFFFFFFFF), opaque=1),
        req(INCR, b"bd:n", arith_extras(1, 10, 0), opaque=2),
        req(INCR, b"bd:n", arith_extras(5, 10, 0), opaque=3),
        req(DECR, b"bd:n", arith_extras(100, 10, 0), opaque=4),
        req(DECR, b"bd:m", arith_extras(100, 7, 0), opaque=5),
        req(INCRQ, b"bd:n", arith_extras(3, 0, 0), opaque=6),
        req(DECRQ, b"bd:n", arith_extras(1, 0, 0), opaque=7),
        req(GET, b"bd:n", opaque=8),
        req(INCR, b"bd:n", arith_extras(0xFFFFFFFFFFFFFFFF, 0, 0), opaque=9),
        set_(b"bd:txt", b"abc", opaque=10),
        req(INCR, b"bd:txt", arith_extras(1), opaque=11),
        req(DECRQ, b"bd:txt", arith_extras(1), opaque=12),
        req(INCRQ, b"bd:miss2", arith_extras(1, 0, 0xFFFFFFFF), opaque=13),
        set_(b"bd:big", b"18446744073709551615", opaque=14),
        req(INCR, b"bd:big", arith_extras(2), opaque=15),
        set_(b"bd:sp", b"12  ", opaque=16),
        req(INCR, b"bd:sp", arith_extras(1), opaque=17),
        req(GET, b"bd:sp", opaque=18),
        lambda r: req(INCR, b"bd:sp", arith_extras(1), cas=r[-1].cas + 1, opaque=19),
        lambda r: req(INCR, b"bd:sp", arith_extras(1), cas=r[-2].cas, opaque=20),
    ]


@session("touch_gat")
def _():
    ex = struct.pack(">I", 100)
    return [
        req(TOUCH, b"bd:t", ex, opaque=1),
        req(GAT, b"bd:t", ex, opaque=2),
        req(GATK, b"bd:t", ex, opaque=3),
        req(GATQ, b"bd:t", ex, opaque=4),
        req(GATKQ, b"bd:t", ex, opaque=5),
        set_(b"bd:t", b"tv", flags=9, opaque=6),
        req(TOUCH, b"bd:t", ex, opaque=7),
        req(GAT, b"bd:t", ex, opaque=8),
        req(GATK, b"bd:t", ex, opaque=9),
        req(GATQ, b"bd:t", ex, opaque=10),
        req(GATKQ, b"bd:t", ex, opaque=11),
    ]


@session("expiry_and_flush")
def _():
    return [
        set_(b"bd:e1", b"x", exptime=0xFFFFFFFF, opaque=1),
        req(GET, b"bd:e1", opaque=2),
        set_(b"bd:e2", b"x", exptime=0x80000000, opaque=3),
        req(GET, b"bd:e2", opaque=4),
        set_(b"bd:e3", b"x", exptime=1000, opaque=5),
        req(GET, b"bd:e3", opaque=6),
        req(FLUSH, opaque=7),
        req(GET, b"bd:e3", opaque=8),
        set_(b"bd:e4", b"x", opaque=9),
        req(FLUSHQ, opaque=10),
        req(GET, b"bd:e4", opaque=11),
        req(FLUSH, extras=struct.pack(">I", 0), opaque=12),
        req(FLUSH, extras=struct.pack(">I", 1000), opaque=13),
        req(FLUSH, extras=struct.pack(">I", 0), opaque=14),
    ]


@session("misc")
def _():
    return [
        req(NOOP, opaque=1),
        req(VERSION, opaque=2),
        req(VERBOSITY, opaque=4),
        req(0x30, opaque=5),
        req(0xFF, opaque=10),
        req(SASL_LIST, opaque=7),
        req(GET, b"bd:x", opaque=11, datatype=5, vbucket=7),
        set_(b"bd:x", b"v", opaque=12, datatype=1, vbucket=3),
        req(GETK, b"bd:x", opaque=13, datatype=5, vbucket=7),
    ]


@session("stats_general")
def _():
    return [req(STAT, opaque=1)]


@session("stats_subcommands")
def _():
    return [
        req(STAT, b"bogus", opaque=5),
        req(STAT, b"reset", opaque=6),
        req(STAT, b"detail on", opaque=7),
        req(STAT, b"detail off", opaque=8),
        req(STAT, b"detail xx", opaque=9),
        req(STAT, b"sizes", opaque=10),
        req(STAT, b"conns", opaque=11),
        req(STAT, b"detail dump", opaque=12),
        req(STAT, b"res", opaque=13),
        req(STAT, b"resetxyz", opaque=14),
    ]


# Slab detail is memcached-internal; differences here are reported, not failed.
INFORMATIONAL = {"stats_slabs_items"}


@session("stats_slabs_items")
def _():
    return [req(STAT, b"items", opaque=3), req(STAT, b"slabs", opaque=4)]


@session("stats_settings")
def _():
    # memcached's 76 names in its order; the values Slipstream has are compared too
    # (SETTINGS_UNMASKED), the rest (memcached internals, the port) by name only.
    return [req(STAT, b"settings", opaque=2), req(STAT, b"settingsxyz", opaque=3)]


@session("stats_general_after_traffic")
def _():
    # The general list after some traffic: the same names in the same order (pid, uptime, time
    # and every other value masked; counters are compared in counters_visible_in_stats).
    return [set_(b"bd:g", b"1", opaque=1), req(GET, b"bd:g", opaque=2), req(STAT, opaque=3)]


@session("binary_safe_keys_values")
def _():
    keys = [b"bd: sp ace", b"bd:\r\n", b"bd:\x00nul", b"bd:\xff\xfe", b"bd:" + b"k" * 247]
    steps = []
    for i, k in enumerate(keys):
        steps.append(set_(k, b"v\r\nEND\r\n" + bytes([i]), flags=0xFFFFFFFF, opaque=i))
        steps.append(req(GETK, k, opaque=100 + i))
    return steps


@session("multiget_pipeline", fence=False)
def _():
    # libmemcached's multi-get: GETKQ per key, then one NOOP.
    blob = b"".join(set_(b"bd:m%d" % i, b"val%d" % i, op=SETQ) for i in range(0, 200, 3))
    blob += b"".join(req(GETKQ, b"bd:m%d" % i, opaque=i) for i in range(200))
    blob += req(NOOP, opaque=999)
    return [blob]


@session("large_pipeline")
def _():
    # ~1.4 MB of replies from one write: exercises reply coalescing and write back-pressure.
    n = 20000
    blob = b"".join(set_(b"bd:L%d" % i, b"x" * 100 + b"%d" % i, op=SETQ) for i in range(0, n, 2))
    blob += b"".join(req(GETKQ, b"bd:L%d" % i, opaque=i) for i in range(n))
    return [blob]


@session("dribbled", dribble=True)
def _():
    return [
        set_(b"bd:dr", b"dribble", flags=5, opaque=1),
        req(GETK, b"bd:dr", opaque=2),
        req(INCR, b"bd:drn", arith_extras(2, 40, 0), opaque=3),
        req(STAT, b"sizes", opaque=4),
    ]


# Sessions whose listed stat values are compared too (they start with `stats reset`).
COUNTER_SESSIONS = {"counters_visible_in_stats", "stats_detail_counts"}
# `stats settings` values that must match (both servers run with the same flags); the rest are
# memcached internals Slipstream reports memcached's defaults for, or the port.
SETTINGS_UNMASKED = {
    b"maxbytes", b"maxconns", b"udpport", b"verbosity", b"evictions", b"num_threads",
    b"cas_enabled", b"item_size_max", b"flush_enabled", b"inter", b"detail_enabled",
    b"shutdown_command", b"stat_key_prefix", b"binding_protocol",
}
UNMASKED_STATS = {
    b"cmd_get", b"cmd_set", b"cmd_flush", b"cmd_touch", b"get_hits", b"get_misses",
    b"delete_misses", b"delete_hits", b"incr_misses", b"incr_hits", b"decr_misses", b"decr_hits",
    b"cas_misses", b"cas_hits", b"cas_badval", b"touch_hits", b"touch_misses",
    b"store_too_large", b"total_items", b"detailed",
}


@session("counters_visible_in_stats")
def _():
    return [
        req(STAT, b"reset", opaque=0),
        set_(b"bd:s", b"1", opaque=1),
        req(GET, b"bd:s", opaque=2),
        req(GET, b"bd:nope", opaque=3),
        req(TOUCH, b"bd:s", struct.pack(">I", 10), opaque=4),
        req(DELETE, b"bd:nope", opaque=5),
        req(INCR, b"bd:s", arith_extras(1), opaque=6),
        req(DECR, b"bd:nope", arith_extras(1, 0, 0xFFFFFFFF), opaque=7),
        set_(b"bd:s", b"2", cas=1, opaque=8),
        set_(b"bd:s2", b"2", cas=1, opaque=9),
        set_(b"bd:s", b"v" * (2 << 20), opaque=10),
        req(GAT, b"bd:nope", struct.pack(">I", 10), opaque=11),
        req(GETQ, b"bd:nope", opaque=12),
        req(STAT, opaque=13),
    ]


@session("stats_detail_counts")
def _():
    # Which binary commands count per prefix (get/touch/gat hits and misses, every storage
    # command, oversize ones too, delete; not incr), and the dump (one "detailed" stat).
    return [
        req(STAT, b"reset", opaque=0),
        req(STAT, b"detail on", opaque=1),
        set_(b"bd:s", b"1", opaque=2),
        req(GET, b"bd:s", opaque=3),
        req(GETK, b"bd:nope", opaque=4),
        req(TOUCH, b"bd:s", struct.pack(">I", 10), opaque=5),
        req(GAT, b"bd:nope", struct.pack(">I", 10), opaque=6),
        req(APPEND, b"bd:s", value=b"x", opaque=7),
        set_(b"bd:s", b"v" * (2 << 20), opaque=8),
        req(DELETE, b"bd:nope", opaque=9),
        req(INCR, b"bd:s", arith_extras(1), opaque=10),
        set_(b"other:1", b"1", op=ADD, opaque=11),
        set_(b"noprefix", b"1", opaque=12),
        req(GETQ, b"zz:1", opaque=13),
        req(STAT, b"detail dump", opaque=14),
        req(STAT, b"detail off", opaque=15),
        req(GET, b"bd:s", opaque=16),
        req(STAT, b"detail dump", opaque=17),
        req(STAT, b"reset", opaque=18),
        req(STAT, b"detail dump", opaque=19),
    ]


@session("quit")
def _():
    return [req(NOOP, opaque=1), req(QUIT, opaque=2), req(NOOP, opaque=3)]


@session("quitq")
def _():
    return [req(QUITQ, opaque=2), req(NOOP, opaque=3)]


@session("pipelined_unfenced", fence=False)
def _():
    # Everything in one write: quiet replies interleave with the final non-quiet reply.
    return [
        set_(b"bd:p1", b"1", op=SETQ) + set_(b"bd:p2", b"2", op=SETQ)
        + req(GETKQ, b"bd:p1", opaque=1) + req(GETKQ, b"bd:pX", opaque=2)
        + req(GETKQ, b"bd:p2", opaque=3) + req(NOOP, opaque=4)
    ]


def bad(name, steps):
    SESSIONS[name] = ((lambda: steps), True)


# Malformed packets: each in its own connection because memcached usually closes.
bad("bad_magic", [req(NOOP), b"\x81" + bytes(23), req(NOOP)])
bad("bad_magic_zero", [req(NOOP) + bytes(24)])
bad("verbosity_with_extras", [req(VERBOSITY, extras=struct.pack(">I", 0), opaque=3), req(NOOP)])
bad("unknown_with_body", [req(0x30, value=b"abcdefgh", opaque=6), req(NOOP)])
bad("sasl_auth", [req(SASL_AUTH, b"PLAIN", value=b"\0u\0p", opaque=8), req(NOOP)])
bad("sasl_step", [req(SASL_STEP, b"PLAIN", value=b"\0u\0p", opaque=9), req(NOOP)])
bad("sasl_list_with_body", [req(SASL_LIST, value=b"xy", opaque=9), req(NOOP)])
bad("bad_magic_text", [b"get foo\r\n"])
bad("short_header_then_close", [req(NOOP)[:10]])
bad("get_no_key", [req(GET, opaque=1)])
bad("get_with_extras", [req(GET, b"k", extras=b"abcd", opaque=1)])
bad("get_bodylen_gt_key", [req(GET, b"k", value=b"zz", opaque=1)])
bad("keylen_gt_bodylen", [req(GET, b"abc", bodylen=2, opaque=1) + b"\0"])
bad("ext_key_gt_body", [req(SET, b"abc", store_extras(), b"", bodylen=5, opaque=1) + b"\0" * 6])
bad("key_251", [req(GET, b"k" * 251, opaque=1)])
bad("key_250", [req(GET, b"k" * 250, opaque=1)])
bad("set_no_extras", [req(SET, b"k", value=b"v", opaque=1)])
bad("set_no_key", [req(SET, extras=store_extras(), value=b"v", opaque=1)])
bad("set_short_extras", [req(SET, b"k", extras=b"abcd", value=b"v", opaque=1)])
bad("incr_short_extras", [req(INCR, b"k", extras=struct.pack(">Q", 1), opaque=1)])
bad("incr_with_value", [req(INCR, b"k", arith_extras(1), value=b"x", opaque=1)])
bad("delete_with_extras", [req(DELETE, b"k", extras=b"\0\0\0\0", opaque=1)])
bad("append_with_extras", [req(APPEND, b"k", extras=b"\0\0\0\0", value=b"x", opaque=1)])
bad("noop_with_body", [req(NOOP, value=b"x", opaque=1)])
bad("version_with_key", [req(VERSION, b"x", opaque=1)])
bad("quit_with_body", [req(QUIT, value=b"x", opaque=1)])
bad("flush_bad_extras", [req(FLUSH, extras=b"\0\0", opaque=1)])
bad("flush_with_key", [req(FLUSH, b"k", opaque=1)])
bad("touch_no_extras", [req(TOUCH, b"k", opaque=1)])
bad("touch_extra_body", [req(TOUCH, b"k", extras=b"\0\0\0\5", value=b"", opaque=1)])
bad("stat_with_extras", [req(STAT, extras=b"\0\0\0\0", opaque=1)])
bad("unknown_with_key", [req(0x40, b"abc", value=b"", opaque=1)])
bad("too_large_value", [
    set_(b"bd:big", b"x", opaque=1),
    set_(b"bd:big", b"v" * (2 * 1024 * 1024), opaque=2),
    req(GET, b"bd:big", opaque=3),
])
# memcached's limit: 48 (item header) + 8 (CAS) + key + 1 + value + 2 <= item_size_max (1 MiB).
bad("item_size_boundary", [
    set_(b"bd:lim", b"v" * (1048576 - 65), opaque=1),
    set_(b"bd:lim", b"v" * (1048576 - 64), opaque=2),
    req(GET, b"bd:lim", opaque=3),
    set_(b"bd:lim", b"v" * (1048576 - 65), opaque=4),
    req(APPEND, b"bd:lim", value=b"x", opaque=5),
    req(GETK, b"bd:lim", opaque=6),
])
# An appended piece is allocated as an item of its own (flags 0): a piece too large on its own is
# E2BIG before its value is read, one that fits alone but not combined is NOT_STORED. The -C run
# moves every edge by 8 bytes (crates/proto/src/rules: one item-size rule for every protocol).
bad("item_size_append_piece", [
    set_(b"bd:w", b"x", opaque=1),
    req(APPEND, b"bd:w", value=b"v" * (1048576 - 62), opaque=2),
    req(APPEND, b"bd:w", value=b"v" * (1048576 - 63), opaque=3),
    req(PREPEND, b"bd:w", value=b"v" * (1048576 - 54), opaque=4),
    req(PREPEND, b"bd:w", value=b"v" * (1048576 - 55), opaque=5),
    req(GET, b"bd:w", opaque=6),
    set_(b"bd:w", b"v" * (1048576 - 67), flags=1, opaque=7),
    set_(b"bd:w", b"v" * (1048576 - 66), flags=1, opaque=8),
    req(GET, b"bd:w", opaque=9),
])
bad("too_large_value_q", [
    set_(b"bd:bigq", b"x", opaque=1),
    set_(b"bd:bigq", b"v" * (1024 * 1024 + 1), op=SETQ, opaque=2),
    req(GET, b"bd:bigq", opaque=3),
    set_(b"bd:bigq", b"x", opaque=4),
    set_(b"bd:bigq", b"v" * (1024 * 1024 + 1), op=ADD, opaque=5),
    req(GET, b"bd:bigq", opaque=6),
])


# ---------------------------------------------------------------------------------------------

class Packet:
    def __init__(self, raw):
        self.raw = raw
        (self.magic, self.opcode, self.keylen, self.extlen, self.datatype, self.status,
         self.bodylen, self.opaque, self.cas) = struct.unpack(">BBHBBHIIQ", raw[:24])
        body = raw[24:]
        self.extras = body[: self.extlen]
        self.key = body[self.extlen: self.extlen + self.keylen]
        self.value = body[self.extlen + self.keylen:]

    def __repr__(self):
        return ("<op=%#04x st=%#x opaque=%#x cas=%d ext=%s key=%r val=%r>" %
                (self.opcode, self.status, self.opaque, self.cas, self.extras.hex(), self.key,
                 self.value[:80] + (b"..." if len(self.value) > 80 else b"")))


def split_packets(buf):
    """Split a reply stream into packets; trailing bytes that are not a packet come back raw."""
    pkts = []
    pos = 0
    while len(buf) - pos >= 24 and buf[pos] == 0x81:
        bodylen = struct.unpack(">I", buf[pos + 8: pos + 12])[0]
        end = pos + 24 + bodylen
        if end > len(buf):
            break
        pkts.append(Packet(buf[pos:end]))
        pos = end
    return pkts, buf[pos:]


def recv_step(sock, fenced):
    """Read one step's replies: up to the fence reply, EOF, or a quiet timeout."""
    data = b""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    closed = False
    while True:
        if fenced:
            pkts, rest = split_packets(data)
            if pkts and pkts[-1].opcode == NOOP and pkts[-1].opaque == FENCE_OPAQUE and not rest:
                break
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left if fenced else min(left, 0.3))
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    return data, closed


def flush_server(port):
    """Start every session from an empty cache, so runs do not depend on earlier ones."""
    with socket.create_connection((HOST, port), timeout=2) as s:
        s.sendall(req(FLUSH) )
        s.recv(24)


def run_session(port, steps, fenced, dribble=False):
    """Run one session; returns a list of (step_index, reply_bytes, closed)."""
    flush_server(port)
    sock = socket.create_connection((HOST, port), timeout=2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    seen = []
    results = []
    try:
        for i, step in enumerate(steps):
            data = step(seen) if callable(step) else step
            try:
                payload = data + (noop_fence() if fenced else b"")
                if dribble:
                    for b in range(len(payload)):
                        sock.send(payload[b:b + 1])
                        time.sleep(0.0005)
                else:
                    sock.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                results.append((i, b"", True))
                break
            reply, closed = recv_step(sock, fenced)
            pkts, _ = split_packets(reply)
            seen.extend(p for p in pkts if p.opaque != FENCE_OPAQUE)
            results.append((i, reply, closed))
            if closed:
                break
    finally:
        sock.close()
    return results


def canonical(results, unmasked=frozenset()):
    """Rename CAS values by first appearance; mask version bodies and stat values (except the
    names in `unmasked`)."""
    cas_names = {}
    out = []
    for i, reply, closed in results:
        pkts, rest = split_packets(reply)
        canon = []
        for p in pkts:
            raw = bytearray(p.raw)
            if p.cas:
                name = cas_names.setdefault(p.cas, len(cas_names) + 1)
                raw[16:24] = struct.pack(">Q", name)
            if p.opcode == VERSION and p.status == 0:
                raw = raw[:24] + b"<version>"
                raw[8:12] = b"\0\0\0\0"
            if p.opcode == STAT and p.status == 0 and p.keylen and p.key not in unmasked:
                raw = raw[: 24 + p.extlen + p.keylen] + b"<value>"
                raw[8:12] = struct.pack(">I", p.keylen)
            canon.append(bytes(raw))
        out.append((i, canon, rest, closed))
    return out


def describe(raw):
    try:
        return repr(Packet(raw))
    except struct.error:
        return repr(raw)


def compare(port_a, port_b, name_filter, verbose, strict=False):
    failures = 0
    for name, (build, fenced) in SESSIONS.items():
        if name_filter and name_filter not in name:
            continue
        unmasked = UNMASKED_STATS if name in COUNTER_SESSIONS else frozenset()
        if name == "stats_settings":
            unmasked = SETTINGS_UNMASKED
        a = canonical(run_session(port_a, build(), fenced, name in DRIBBLE), unmasked)
        b = canonical(run_session(port_b, build(), fenced, name in DRIBBLE), unmasked)
        if a == b:
            if verbose:
                print("ok   %s" % name)
            continue
        if name in INFORMATIONAL and not strict:
            print("info %s differs (informational only)" % name)
        else:
            failures += 1
            print("DIFF %s" % name)
        for x, y in zip(a, b):
            if x == y:
                continue
            # Show the packets around the first one that differs.
            first = next((k for k, (p, q) in enumerate(zip(x[1], y[1])) if p != q),
                         min(len(x[1]), len(y[1])))
            lo = max(0, first - 1)
            print("  step %d, reply packet %d:" % (x[0], first))
            for side, (port, r) in (("A", (port_a, x)), ("B", (port_b, y))):
                print("    %s(%d) closed=%s packets=%d trailing=%r" %
                      (side, port, r[3], len(r[1]), r[2][:60]))
                for raw in r[1][lo:first + 3]:
                    print("        " + describe(raw))
            break
        if len(a) != len(b):
            print("  step counts differ: %d vs %d" % (len(a), len(b)))
    return failures


def dump(port, name_filter):
    for name, (build, fenced) in SESSIONS.items():
        if name_filter and name_filter not in name:
            continue
        print("== %s" % name)
        for i, reply, closed in run_session(port, build(), fenced, name in DRIBBLE):
            pkts, rest = split_packets(reply)
            shown = [p for p in pkts if p.opaque != FENCE_OPAQUE or p.opcode != NOOP]
            print("  step %d closed=%s%s" % (i, closed, (" trailing=%r" % rest[:60]) if rest else ""))
            for p in shown[:8]:
                print("     ", p, p.raw[:24].hex() if p.opcode != STAT else "")
            if len(shown) > 8:
                print("      ... %d more" % (len(shown) - 8))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ports", type=int, nargs="+")
    ap.add_argument("--dump", action="store_true", help="print replies of one server")
    ap.add_argument("-k", dest="filter", default="", help="only sessions whose name contains this")
    ap.add_argument("-v", dest="verbose", action="store_true")
    ap.add_argument("--strict", action="store_true", help="informational sessions fail too")
    args = ap.parse_args()
    if args.dump:
        dump(args.ports[0], args.filter)
        return 0
    if len(args.ports) != 2:
        ap.error("need two ports")
    failures = compare(args.ports[0], args.ports[1], args.filter, args.verbose, args.strict)
    print("%d session(s) differ" % failures if failures else "all sessions identical")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
