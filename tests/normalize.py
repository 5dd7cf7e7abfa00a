"""Normalisation of memcached replies for byte-for-byte differential comparison.

For: turning a raw reply stream into a list of comparable records where only
fields that legitimately differ between two correct servers are abstracted:
  * CAS numbers (VALUE ... <cas>, meta `c` flag, `me` cas=) become per-session
    ordinals, so equality/uniqueness patterns must still match;
  * remaining-TTL / last-access seconds (meta `t`, `l`; `me` exp=, la=) compare
    with a tolerance of one second because the server clock may tick mid-session;
  * `stats` blocks: names compared as a set; values only for deterministic stats;
  * `VERSION x` -> version text dropped.
Not for: hiding anything else. Value payloads are kept raw and verbatim.
"""

import re

# General `stats`: values that must match exactly (deterministic from the session).
STATS_EXACT = {
    "cmd_get", "cmd_set", "cmd_flush", "cmd_touch", "get_hits", "get_misses",
    "get_expired", "get_flushed", "delete_misses", "delete_hits", "incr_misses",
    "incr_hits", "decr_misses", "decr_hits", "cas_misses", "cas_hits", "cas_badval",
    "touch_hits", "touch_misses", "store_too_large", "curr_items", "total_items",
    "limit_maxbytes", "threads", "max_connections", "evictions", "auth_cmds",
    "auth_errors", "accepting_conns",
}
STATS_EXACT = {n.encode() for n in STATS_EXACT}
# No stat name is forgiven: Slipstream's own `fastpath_*` stats appear only while its kernel
# fast path is attached, which the differential servers never have.
# `stats settings`: values that must match exactly.
SETTINGS_EXACT = {
    "maxbytes", "maxconns", "udpport", "verbosity", "evictions", "num_threads",
    "cas_enabled", "item_size_max", "flush_enabled", "inter",
}
SETTINGS_EXACT = {n.encode() for n in SETTINGS_EXACT}

CAS_VALUE_RE = re.compile(rb"^(VALUE \S+ \S+ \S+) (\d+)$")
VALUE_RE = re.compile(rb"^VALUE \S+ \S+ (\d+)(?: \d+)?$")
META_VA_RE = re.compile(rb"^VA (\d+)((?: \S+)*)$")
META_STATUS = (b"HD", b"EN", b"NF", b"NS", b"EX", b"MN")
ME_RE = re.compile(rb"^ME \S+")


class Approx:
    """An integer that equals another within +-1, when both are positive."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        if not isinstance(other, Approx):
            return NotImplemented
        if self.v == other.v:
            return True
        if self.v > 0 and other.v > 0:
            return abs(self.v - other.v) <= 1
        if self.v >= 0 and other.v >= 0:  # last-access 0 vs 1
            return abs(self.v - other.v) <= 1
        return False

    def __hash__(self):
        return 0

    def __repr__(self):
        return "~%d" % self.v


class CasMap:
    def __init__(self):
        self.ids = {}

    def __call__(self, raw):
        if raw not in self.ids:
            self.ids[raw] = len(self.ids) + 1
        return "cas#%d" % self.ids[raw]


def _int_or_none(b):
    try:
        return int(b)
    except ValueError:
        return None


def _norm_meta_flags(tokens, casmap):
    out = []
    for t in tokens:
        if not t:
            continue
        f, rest = t[:1], t[1:]
        if f == b"c" and rest.isdigit():
            out.append(("c", casmap(rest)))
        elif f in (b"t", b"l") and _int_or_none(rest) is not None:
            out.append((f.decode(), Approx(int(rest))))
        else:
            out.append(t)
    return tuple(out)


def _norm_me(line, casmap):
    parts = line.split(b" ")
    out = [parts[0], parts[1] if len(parts) > 1 else b""]
    for p in parts[2:]:
        k, _, v = p.partition(b"=")
        if k == b"cas" and v.isdigit():
            out.append(("cas", casmap(v)))
        elif k in (b"exp", b"la") and _int_or_none(v) is not None:
            out.append((k.decode(), Approx(int(v))))
        elif k in (b"cls", b"size"):
            # slab class and internal item size are allocator layout, not protocol
            out.append((k.decode(), "*"))
        else:
            out.append(p)
    return ("ME", tuple(out))


def _norm_stat_block(lines, server_port):
    """lines: list of (name, value) bytes. Returns a sorted tuple of records."""
    names = {n for n, _ in lines}
    recs = set()
    if b"pid" in names or b"uptime" in names:
        kind = "general"
    elif b"maxbytes" in names or b"item_size_max" in names:
        kind = "settings"
    elif any(n.startswith(b"items:") for n in names):
        kind = "items"
    elif any(n.endswith(b":addr") or n.endswith(b":state") for n in names):
        kind = "conns"
    elif any(re.match(rb"^\d+:", n) for n in names) or b"active_slabs" in names:
        kind = "slabs"
    else:
        kind = "other"
    for n, v in lines:
        if kind == "general":
            recs.add((n, v if n in STATS_EXACT else b"*"))
        elif kind == "settings":
            if n == b"tcpport":
                recs.add((n, b"<port>" if v == str(server_port).encode() else v))
            else:
                recs.add((n, v if n in SETTINGS_EXACT else b"*"))
        elif kind == "items":
            nn = re.sub(rb"^items:\d+:", b"items:N:", n)
            recs.add((nn, b"*"))
        elif kind == "slabs":
            nn = re.sub(rb"^\d+:", b"N:", n)
            recs.add((nn, b"*"))
        elif kind == "conns":
            nn = re.sub(rb"^\d+:", b"N:", n)
            recs.add((nn, b"*"))
        else:
            recs.add((n, v))
    return ("STATS-" + kind, tuple(sorted(recs)))


def normalize(data, server_port=None):
    """Raw reply bytes -> list of records (comparable with ==)."""
    data = bytes(data)
    casmap = CasMap()
    out = []
    pos = 0
    n = len(data)
    stat_lines = []

    def flush_stats():
        if stat_lines:
            out.append(_norm_stat_block(list(stat_lines), server_port))
            stat_lines.clear()

    guard = 0
    while pos < n:
        guard += 1
        if guard > 10_000_000:
            raise RuntimeError("normalize loop bound")
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            flush_stats()
            out.append(("PARTIAL", data[pos:]))
            break
        line = data[pos:eol]
        pos = eol + 2
        if line.startswith(b"STAT "):
            _, name, value = (line.split(b" ", 2) + [b""])[:3]
            stat_lines.append((name, value))
            continue
        flush_stats()
        m = VALUE_RE.match(line)
        if m:
            length = int(m.group(1))
            cm = CAS_VALUE_RE.match(line)
            if cm:
                out.append(("VALUE", cm.group(1), casmap(cm.group(2))))
            else:
                out.append(("VALUE", line))
            out.append(("DATA", data[pos:pos + length + 2]))
            pos += length + 2
            continue
        m = META_VA_RE.match(line)
        if m:
            length = int(m.group(1))
            flags = m.group(2).split(b" ")
            out.append(("VA", m.group(1), _norm_meta_flags(flags, casmap)))
            out.append(("DATA", data[pos:pos + length + 2]))
            pos += length + 2
            continue
        head = line.split(b" ", 1)
        if head[0] in META_STATUS:
            flags = head[1].split(b" ") if len(head) > 1 else []
            out.append((head[0].decode(), _norm_meta_flags(flags, casmap)))
            continue
        if ME_RE.match(line):
            out.append(_norm_me(line, casmap))
            continue
        if line.startswith(b"VERSION "):
            out.append(("VERSION", "<v>"))
            continue
        out.append(("LINE", line))
    flush_stats()
    return out


def first_diff(a, b):
    """Index of first differing byte, or None."""
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def describe_diff(ref, cand, ref_closed, cand_closed, ref_norm, cand_norm):
    lines = []
    i = first_diff(bytes(ref), bytes(cand))
    if i is not None:
        lo = max(0, i - 60)
        lines.append("first raw byte difference at offset %d" % i)
        lines.append("  memcached : %r" % bytes(ref[lo:i + 80]))
        lines.append("  candidate : %r" % bytes(cand[lo:i + 80]))
    if ref_closed != cand_closed:
        lines.append("connection closed: memcached=%s candidate=%s" % (ref_closed, cand_closed))
    for k in range(max(len(ref_norm), len(cand_norm))):
        r = ref_norm[k] if k < len(ref_norm) else "<missing>"
        c = cand_norm[k] if k < len(cand_norm) else "<missing>"
        if r != c:
            if isinstance(r, tuple) and isinstance(c, tuple) and r[:1] == c[:1] and str(r[0]).startswith("STATS"):
                rs, cs = set(map(repr, r[1])), set(map(repr, c[1]))
                lines.append("record %d %s differs:" % (k, r[0]))
                lines.append("  only memcached: %s" % sorted(rs - cs)[:40])
                lines.append("  only candidate: %s" % sorted(cs - rs)[:40])
            else:
                lines.append("record %d: memcached=%r candidate=%r" % (k, r, c))
            break
    lines.append("full memcached reply: %r" % bytes(ref[:3000]))
    lines.append("full candidate reply: %r" % bytes(cand[:3000]))
    return "\n".join(lines)
