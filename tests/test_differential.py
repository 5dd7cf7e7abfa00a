"""Differential tests: raw byte sessions to memcached and to the candidate, replies compared.

For: byte-for-byte compatibility of the text and meta protocols with memcached 1.6,
including errors, noreply, pipelining, split delivery, expiry and connection closing.
Not for: load or timing behaviour (see test_limits.py), UDP (test_udp.py).

Each session runs on a fresh pair of servers started with identical flags, so
stats counters and CAS sequences start from the same state. Every session runs
twice: sent whole (one send per step), and trickled (one send per byte with a
1 ms pause; long steps are cut at a seeded sample of offsets instead).
Volatile fields are normalised in normalize.py; nothing else is.
"""

import os
import random
import re
import threading
import time
import zlib

import pytest

import mcwire
from mcwire import Sleep
from normalize import describe_diff, normalize

SPLIT_BYTES_MAX = 160  # steps longer than this are cut at sampled offsets
SPLIT_SAMPLE = 48
SPLIT_SEED = int(os.environ.get("MC_SPLIT_SEED", "20240601"))


def L(*lines):
    """Join lines with \\r\\n, ending with \\r\\n."""
    return b"".join(x + b"\r\n" for x in lines)


def last_cas(out):
    """The CAS from the last `VALUE k f n cas` line or meta `c<cas>` flag so far."""
    m = re.findall(rb"VALUE \S+ \d+ \d+ (\d+)\r\n", bytes(out))
    mm = re.findall(rb"(?:^|\n)(?:VA \d+|HD|EN|NF|NS|EX)(?: \S+)*? c(\d+)", bytes(out))
    cands = []
    if m:
        cands.append((bytes(out).rfind(b"VALUE"), m[-1]))
    if mm:
        cands.append((bytes(out).rfind(b" c" + mm[-1]), mm[-1]))
    if not cands:
        return b"0"
    return max(cands)[1]


class Case:
    """`extra`: flags for both servers (e.g. -C); `memcached_extra`: flags only memcached needs."""

    def __init__(self, name, steps, settings=None, split=True, memcached_extra=(), extra=()):
        self.name = name
        self.steps = steps
        self.settings = settings or {}
        self.split = split
        self.memcached_extra = tuple(memcached_extra)
        self.extra = tuple(extra)


CASES = []


def case(name, *steps, **kw):
    CASES.append(Case(name, list(steps), **kw))


K250 = b"k" * 250
K251 = b"k" * 251
BIN = b"\x00\r\n\x00ab\r\nEND\r\n\xff"

# ---------------------------------------------------------------- storage
case("set_get", L(b"set a 0 0 5", b"hello", b"get a"))
case("set_flags_exptime", L(b"set a 123 0 2", b"hi", b"get a", b"gets a"))
case("set_zero_len", L(b"set a 0 0 0", b"", b"get a"))
case("set_overwrite", L(b"set a 1 0 1", b"x", b"set a 2 0 3", b"yyy", b"get a"))
case("set_noreply", L(b"set a 0 0 1 noreply", b"x", b"get a"))
case("set_flags_max", L(b"set a 4294967295 0 1", b"x", b"get a"))
case("set_flags_2p32", L(b"set a 4294967296 0 1", b"x", b"get a"))
case("set_flags_negative", L(b"set a -1 0 1", b"x", b"get a"))
case("set_flags_nonnumeric", L(b"set a abc 0 1", b"x", b"get a"))
case("set_exptime_negative", L(b"set a 0 -1 1", b"x", b"get a"))
case("set_exptime_nonnumeric", L(b"set a 0 x 1", b"x", b"get a"))
case("set_len_negative", L(b"set a 0 0 -1", b"get a"))
case("set_len_nonnumeric", L(b"set a 0 0 abc", b"get a"))
case("set_len_too_short", L(b"set a 0 0 2", b"hello", b"get a"))
case("set_len_too_long", L(b"set a 0 0 8", b"hi", b"get a") + L(b"get a"))
case("set_bad_chunk_lf_only", b"set a 0 0 1\r\na\nget a\r\n")
case("set_bad_chunk_no_crlf", b"set a 0 0 1\r\naXYget a\r\nget a\r\n")
case("set_binary_value", b"set b 7 0 %d\r\n" % len(BIN) + BIN + b"\r\n" + L(b"get b", b"gets b"))
case("set_missing_args", L(b"set a 0 0", b"set a 0", b"set a", b"set"))
case("set_too_many_args", L(b"set a 0 0 1 noreply extra", b"x", b"get a"))
case("set_noreply_misspelled", L(b"set a 0 0 1 norepl", b"x", b"get a"))
case("set_key_250", L(b"set " + K250 + b" 0 0 1", b"x", b"get " + K250))
case("set_key_251", L(b"set " + K251 + b" 0 0 1"), L(b"x"), L(b"get a"))
# memcached 1.6.18 quirk: an error reply queued in the same read batch before a
# key-too-long error is dropped (here ERROR for "x" and the second CLIENT_ERROR).
case("set_key_251_pipelined", L(b"set " + K251 + b" 0 0 1", b"x", b"get " + K251, b"version"))
case("set_key_control_chars", L(b"set a\x01b 0 0 1", b"x", b"get a\x01b"))
case("set_then_data_looks_like_cmd", b"set a 0 0 7\r\nget a\r\n\r\nget a\r\n")
case("add", L(b"add a 0 0 1", b"x", b"add a 0 0 1", b"y", b"get a", b"add b 0 0 1 noreply", b"z", b"add b 0 0 1 noreply", b"w", b"get b"))
case("replace", L(b"replace a 0 0 1", b"x", b"set a 0 0 1", b"y", b"replace a 5 0 2", b"zz", b"get a", b"replace q 0 0 1 noreply", b"q", b"get q"))
case("append_prepend", L(b"append a 0 0 1", b"x", b"prepend a 0 0 1", b"x", b"set a 3 0 2", b"mm",
                         b"append a 9 0 2", b"zz", b"prepend a 9 0 2", b"aa", b"get a",
                         b"append a 0 0 1 noreply", b"!", b"prepend a 0 0 1 noreply", b"^", b"gets a"))
case("append_binary", b"set a 0 0 2\r\n\r\n\r\nappend a 0 0 3\r\n\x00\r\n\r\nget a\r\n")
case("storage_data_not_numeric_len_big", L(b"set a 0 0 99999999999999999999", b"x", b"get a"))

# ---------------------------------------------------------------- cas
case("cas_missing", L(b"cas a 0 0 1 1", b"x", b"cas a 0 0 1 1 noreply", b"x", b"get a"))
case("cas_flow",
     L(b"set a 0 0 1", b"x", b"gets a"),
     lambda out: b"cas a 7 0 1 " + last_cas(out) + b"\r\ny\r\n",
     lambda out: b"cas a 7 0 1 " + last_cas(out) + b"\r\nz\r\ngets a\r\n",
     L(b"cas a 0 0 1 0", b"q", b"cas a 0 0 1 abc", b"q", b"cas a 0 0 1", b"q", b"gets a"))
case("cas_noreply_flow",
     L(b"set a 0 0 1", b"x", b"gets a"),
     lambda out: b"cas a 0 0 2 " + last_cas(out) + b" noreply\r\nok\r\ngets a\r\n",
     lambda out: b"cas a 0 0 2 1 noreply\r\nno\r\ngets a\r\n")
case("cas_unique_increasing", L(b"set a 0 0 1", b"x", b"set b 0 0 1", b"y", b"gets a b",
                                b"set a 0 0 1", b"z", b"gets a b a", b"append a 0 0 1", b"w", b"gets a",
                                b"incr a 1", b"touch a 100", b"gets a"))

# ---------------------------------------------------------------- retrieval
case("get_miss", L(b"get nothere"))
case("get_multi", L(b"set a 1 0 1", b"A", b"set c 3 0 3", b"CCC", b"get a b c a", b"gets a b c"))
case("get_no_key", L(b"get", b"gets", b"get "))
case("get_spaces", L(b"set a 0 0 1", b"x", b"get  a   a ", b"get a\t"))
case("get_key_251", L(b"get " + K251), L(b"get a " + K251), L(b"gets " + K251), L(b"get a"))
case("get_key_251_pipelined", L(b"get " + K251, b"get a " + K251, b"gets " + K251, b"get a", b"mn"))
case("get_many_keys", L(b"get " + b" ".join(b"key%d" % i for i in range(200))))
case("get_lf_only", b"set a 0 0 1\nx\r\nget a\nget a\r\n")
case("get_cr_in_line", b"get a\rb\r\n")
case("gat_gats", L(b"gat 0 a", b"set a 5 0 1", b"x", b"gat 100 a", b"gats 100 a b", b"gat", b"gat 10",
                   b"gat abc a", b"gats -1 a", b"get a"))
case("touch", L(b"touch a 10", b"set a 0 0 1", b"x", b"touch a 10", b"touch a 10 noreply", b"touch a",
                b"touch a abc", b"touch", b"get a", b"touch a -1", b"get a"))
case("touch_key_251", L(b"touch " + K251 + b" 10"))

# ---------------------------------------------------------------- delete
case("delete", L(b"delete a", b"set a 0 0 1", b"x", b"delete a", b"get a", b"delete a noreply",
                 b"set a 0 0 1", b"x", b"delete a noreply", b"get a"))
case("delete_time_arg", L(b"set a 0 0 1", b"x", b"delete a 0", b"delete a 5", b"delete a 0 noreply",
                          b"delete a x", b"delete", b"delete a b c"))
case("delete_key_251", L(b"delete " + K251))

# ---------------------------------------------------------------- incr / decr
case("incr_decr", L(b"incr a 1", b"decr a 1", b"set a 0 0 2", b"10", b"incr a 5", b"decr a 3", b"decr a 100",
                    b"incr a 0", b"get a"))
case("incr_wrap", L(b"set a 0 0 20", b"18446744073709551615", b"incr a 1", b"get a",
                    b"set b 0 0 20", b"18446744073709551614", b"incr b 3", b"get b"))
case("incr_grow_shrink", L(b"set a 0 0 2", b"99", b"incr a 1", b"get a", b"decr a 91", b"get a",
                           b"set b 0 0 3", b"100", b"decr b 1", b"gets b"))
case("incr_nonnumeric", L(b"set a 0 0 3", b"abc", b"incr a 1", b"decr a 1", b"set b 0 0 2", b"-1",
                          b"incr b 1", b"set c 0 0 3", b" 12", b"incr c 1", b"set d 0 0 3", b"12 ", b"incr d 1",
                          b"set e 0 0 0", b"", b"incr e 1"))
case("incr_bad_delta", L(b"set a 0 0 1", b"1", b"incr a -1", b"incr a abc", b"incr a 18446744073709551616",
                         b"incr a 18446744073709551615", b"decr a", b"incr", b"get a"))
case("incr_noreply", L(b"set a 0 0 1", b"1", b"incr a 5 noreply", b"decr a 2 noreply", b"get a",
                       b"incr zz 1 noreply", b"get zz"))
case("incr_keeps_flags", L(b"set a 77 0 1", b"1", b"incr a 1", b"gets a"))
case("incr_key_251", L(b"incr " + K251 + b" 1"))
case("incr_leading_zeros", L(b"set a 0 0 4", b"0007", b"incr a 1", b"get a", b"incr a 00002", b"get a"))

# ---------------------------------------------------------------- flush / misc
case("flush_all", L(b"set a 0 0 1", b"x", b"flush_all", b"get a", b"set a 0 0 1", b"y", b"get a",
                    b"flush_all 0", b"get a", b"flush_all noreply", b"flush_all 0 noreply", b"get a"))
case("flush_all_bad", L(b"flush_all abc", b"flush_all -1", b"flush_all 1 2", b"flush_all 0 0 0"))
case("flush_all_delayed",
     L(b"set a 0 0 1", b"x", b"flush_all 2", b"get a"), Sleep(2.5), L(b"get a", b"set a 0 0 1", b"z", b"get a"),
     split=False)
case("version", L(b"version", b"version x"))
case("verbosity", L(b"verbosity", b"verbosity 1", b"verbosity 1 noreply", b"verbosity 0", b"verbosity abc",
                    b"verbosity 1 2 3"))
case("unknown_commands", L(b"bogus", b"GET a", b"Set a 0 0 1", b"getx a", b"s", b"foo bar baz"))
case("empty_lines", b"\r\n\n\r\n \r\n\n")
case("lone_cr", b"\r")
case("quit", L(b"set a 0 0 1", b"x", b"quit", b"get a"))
case("quit_args", L(b"quit now"))
case("quit_then_more", L(b"quit"), L(b"get a"))
case("noreply_everywhere", L(
    b"set a 0 0 1 noreply", b"1", b"add a 0 0 1 noreply", b"2", b"add b 0 0 1 noreply", b"2",
    b"replace a 0 0 1 noreply", b"3", b"append a 0 0 1 noreply", b"4", b"prepend a 0 0 1 noreply", b"5",
    b"cas a 0 0 1 1 noreply", b"6", b"incr a 1 noreply", b"decr a 1 noreply", b"touch a 0 noreply",
    b"delete b noreply", b"flush_all noreply", b"verbosity 0 noreply", b"get a b"))
case("noreply_errors_still_reported", L(b"set a 0 0 x noreply", b"incr a x noreply", b"get a"))

# ---------------------------------------------------------------- stats
# flush_all first: after a flush memcached's curr_items drops lazily (nondeterministic)
case("stats_general", L(b"flush_all", b"set a 0 0 1", b"x", b"get a", b"get b", b"delete b", b"incr a 1",
                        b"decr q 1", b"touch a 0", b"touch z 0", b"cas a 0 0 1 1", b"x", b"stats"))
case("stats_settings", L(b"stats settings"))
case("stats_items_slabs", L(b"set a 0 0 1", b"x", b"set b 0 0 300", b"y" * 300, b"stats items", b"stats slabs"))
case("stats_items_empty", L(b"stats items", b"stats slabs"))
case("stats_reset", L(b"set a 0 0 1", b"x", b"get a", b"stats reset", b"stats"))
case("stats_misc", L(b"stats sizes", b"stats bogus", b"stats detail", b"stats detail on", b"stats detail off",
                     b"stats reset extra"))
case("stats_counters_hits", L(b"set a 0 0 1", b"x", b"get a a b", b"gets a", b"gat 0 a c", b"incr a 1", b"decr a 1",
                              b"incr n 1", b"decr n 1", b"delete a", b"delete a", b"stats"))

# ---------------------------------------------------------------- meta
case("mn", L(b"mn", b"mn extra"))
case("ms_mg_basic", L(b"ms a 2", b"hi", b"mg a v", b"mg a", b"mg a s v f", b"mg miss v", b"mg miss"))
case("ms_flags", L(b"ms a 3 F77 T0", b"abc", b"mg a v f s t k O123", b"ms b 1 I", b"z", b"mg b v",
                   b"ms c 1 k O9 b", b"q", b"ms Yw== 1 b k", b"y", b"mg Yw== b v k"))
# memcached marks items stored under a base64 (b) key and re-encodes the key in
# replies even when the item is then fetched with the plain key.
case("binary_key_plain_lookup", L(b"ms Yw== 1 b", b"y", b"mg c v k", b"mg c k b", b"get c", b"me c",
                                  b"set c 0 0 1", b"z", b"mg c k", b"mg Yw== b k"))
case("ms_modes", L(b"ms a 1 ME", b"1", b"ms a 1 ME", b"2", b"mg a v", b"ms a 1 MA", b"3", b"ms a 1 MP", b"0",
                   b"mg a v", b"ms b 1 MA", b"x", b"ms b 1 MR", b"x", b"ms a 1 MR", b"r", b"ms a 1 MS", b"s",
                   b"mg a v", b"ms a 1 MX", b"x", b"ms a 1 Ms", b"s", b"ms a 1 ma", b"t", b"mg a v"))
case("ms_append_vivify", L(b"ms n 1 MA N30", b"x", b"mg n v t", b"ms m 1 MP N0", b"y", b"mg m v"))
case("ms_cas", L(b"ms a 1 c", b"x"), lambda out: b"ms a 1 C" + last_cas(out) + b" c\r\ny\r\n",
     lambda out: b"ms a 1 C1 c\r\nz\r\nmg a v c\r\nms q 1 C5\r\nq\r\n")
case("ms_explicit_cas", L(b"ms a 1 E12345 c", b"x", b"mg a c v", b"ms a 1 C12345 E999", b"y", b"mg a c v",
                          b"gets a", b"ma a"))
case("ms_quiet", L(b"ms a 1 q", b"x", b"ms a 1 q MR", b"y", b"ms b 1 q ME", b"x", b"ms b 1 q ME", b"x", b"mn"))
case("ms_errors", L(b"ms", b"ms a", b"ms a x", b"ms a -1", b"ms a 1 Z", b"x", b"ms " + K251 + b" 1", b"x",
                    b"ms a 1 T", b"x", b"ms a 1 Fabc", b"x", b"ms a 2", b"abcd", b"mg a v"))
case("ms_invalidate", L(b"ms a 1 T0", b"x", b"md a I T30", b"mg a v c", b"mg a v", b"ms a 1 I", b"y",
                        b"mg a v"))
case("mg_flags", L(b"set a 9 0 3", b"abc", b"mg a k v s f t h l O777 q", b"mg a h l", b"mg a c", b"mg a N30 v",
                   b"mg z N30 v t s", b"mg z v", b"mg a T30 t v", b"mg a E5", b"mg a u"))
case("mg_quiet", L(b"mg a q v", b"mg b q", b"set a 0 0 1", b"x", b"mg a q v", b"mg a q k", b"mn"))
case("mg_base64", L(b"ms Zm9v 3 b", b"bar", b"mg Zm9v b v k", b"get foo", b"mg foo v", b"mg !!!! b v",
                    b"mg Zm9v b k O5 q"))
case("mg_errors", L(b"mg", b"mg " + K251, b"mg " + K251 + b" v", b"mg a v v", b"mg a O" + b"x" * 40,
                    b"mg a zz", b"mg a v  k"))
case("mg_opaque_key", L(b"ms a 1", b"x", b"mg a O1 k", b"mg a Oabc k v", b"mg miss O1 k", b"mg miss O2 k q", b"mn"))
case("mg_recache_stale", L(b"ms a 1 T100", b"x", b"mg a R30 v c t", b"md a I", b"mg a v c", b"mg a v c",
                           b"ms a 1 I", b"z", b"mg a v"))
case("md", L(b"md a", b"ms a 1", b"x", b"md a", b"mg a v", b"ms a 1", b"x", b"md a q", b"md a q", b"mn",
             b"ms a 1", b"x", b"md a k O5", b"md a C1"))
case("md_cas", L(b"ms a 1 c", b"x"), lambda out: b"md a C1\r\nmd a C" + last_cas(out) + b"\r\nmg a v\r\n")
case("md_errors", L(b"md", b"md " + K251, b"md a Z", b"md a x"))
case("ma", L(b"ma a", b"ma a q", b"mn", b"ms a 1", b"5", b"ma a", b"mg a v", b"ma a v", b"ma a D10 v",
             b"ma a MD D3 v", b"ma a MD D100 v", b"ma a MI v t c", b"ma a M+ v", b"ma a M- v", b"ma a MX v"))
case("ma_vivify", L(b"ma n N0 v", b"ma n N0 J10 v", b"ma m N30 J10 v t", b"ma m v", b"ma o N0 J18446744073709551615 v",
                    b"ma o v"))
case("ma_errors", L(b"ma", b"ma a Dabc", b"ms a 1", b"x", b"ma a v", b"ma a D-1", b"ma a Jx N0",
                    b"ma " + K251))
case("ma_wrap", L(b"ms a 20", b"18446744073709551615", b"ma a v", b"ma a MD D5 v"))
case("ma_cas", L(b"ms a 1 c", b"1"), lambda out: b"ma a C" + last_cas(out) + b" v c\r\nma a C1 v\r\n")
case("me", L(b"me a", b"ms a 1 T0", b"x", b"me a", b"me", b"me " + K251))
case("meta_noreply_mix", L(b"ms a 1 q", b"x", b"mg a v q", b"md b q", b"ma c q", b"get a", b"mn"))
case("meta_and_text_mix", L(b"set a 5 0 2", b"hi", b"mg a v f", b"ms a 2 F6", b"yo", b"gets a", b"mg a c",
                            b"incr b 1", b"ma b N0 J7", b"get b"))

case("exptime_relative_vs_absolute", L(b"set a 0 2592001 1", b"x", b"get a", b"set b 0 2592000 1", b"y",
                                       b"get b", b"mg b t", b"touch b 2592001", b"get b"))
case("exptime_absolute_future", lambda out: b"set a 0 %d 1\r\nx\r\nget a\r\nmg a t v\r\n" % (int(time.time()) + 100))
case("get_noreply_is_a_key", L(b"set noreply 0 0 1", b"n", b"get a noreply", b"delete noreply"))
case("ma_ttl", L(b"ma a N0 J3 T30 t v", b"ma a T60 t v", b"mg a t"))
case("meta_flags_range", L(b"ms a 1 F4294967296", b"x", b"mg a f v", b"ms a 1 F4294967295", b"x", b"mg a f v",
                           b"ms a 1 F-1", b"x", b"ms a 1 T-1", b"x", b"mg a v"))
case("admin_commands", L(b"shutdown", b"cache_memlimit 100", b"cache_memlimit abc", b"slabs automove 1",
                         b"lru_crawler bogus", b"misbehave", b"version"))
case("stats_conns", L(b"stats conns"))
# memcached 1.6.18 built with TLS, started without -Z (noreply does not silence the error).
case("refresh_certs_without_tls", L(b"refresh_certs", b"refresh_certs noreply", b"refresh_certs a b"))
# cache_memlimit: every reply memcached gives (its limits: 8 MB minimum, a number above 10^9 is
# taken to be bytes, a 32-bit parse so 4294967296 reads as 0), and the new limit in `stats
# settings` maxbytes and `stats` limit_maxbytes.
case("cache_memlimit", L(b"cache_memlimit 7", b"cache_memlimit 1000000001", b"cache_memlimit -5",
                         b"cache_memlimit 4294967296", b"cache_memlimit 0x20", b"cache_memlimit 32abc",
                         b"cache_memlimit", b"cache_memlimit 1 2 3", b"cache_memlimit 32 x",
                         b"cache_memlimit 7 noreply", b"cache_memlimit 08", b"stats settings",
                         b"cache_memlimit  48 noreply", b"stats", b"cache_memlimit 1000000000", b"stats settings"))
# stats detail: which commands count under which prefix (text get/gets/gat/gats, every storage
# command, delete; hits; not meta, incr/decr, touch), keys without the delimiter, an empty
# prefix, too-large and bad-chunk sets, off/on, the dump order across memcached's prefix hash
# buckets, stats settings' detail_enabled, and stats reset clearing the table.
case("stats_detail", L(b"stats detail dump", b"stats detail on", b"stats settings",
                       b"set a:1 0 0 1", b"x", b"get a:1 a:2 b:1", b"gets a:1", b"gat 0 a:1 zz:9",
                       b"add a:1 0 0 1", b"y", b"replace b:1 0 0 1", b"y", b"append a:1 0 0 1", b"z",
                       b"prepend a:1 0 0 1", b"z", b"cas a:1 0 0 1 1", b"q", b"delete a:1", b"delete b:1",
                       b"incr n:1 1", b"touch a:1 0", b"mg m:1 v", b"ms m:1 1", b"x", b"md m:1",
                       b"set plain 0 0 1", b"x", b"get plain", b"set :e 0 0 1", b"x", b"get :e",
                       b"set k:" + b"k" * 246 + b" 0 0 1", b"x",
                       b"set big:1 0 0 1100000", b"x" * 1100000, b"set bad:1 0 0 1", b"xyz",
                       b"set c:1 0 0 1 noreply", b"x", b"get c:1",
                       b"set ab:1 0 0 1", b"x", b"set abc:1 0 0 1", b"x", b"get ab:2 abc:2",
                       b"stats detail dump", b"stats detail off", b"set a:1 0 0 1", b"x", b"get a:1",
                       b"stats detail dump", b"stats settings", b"stats detail on", b"get a:1",
                       b"stats detail dump", b"stats reset", b"stats detail dump"))
# Many prefixes: the dump lists them in memcached's bucket order.
case("stats_detail_order", L(b"stats detail on") + b"".join(
    L(b"set p%d:x 0 0 1" % i, b"x", b"get p%d:x q%d:y" % (i, i)) for i in range(40)) + L(b"stats detail dump"),
     split=False)
case("stats_settings_1k", L(b"stats settings"), settings={"item_size": "1k"},
     memcached_extra=("-o", "slab_chunk_max=1024"))
case("stats_settings_small", L(b"stats settings"), settings={"mem_mb": 8, "conns": 100, "threads": 1})
case("stats_after_limits", L(b"stats"), settings={"mem_mb": 8, "conns": 100, "threads": 1})

# ---------------------------------------------------------------- sizes / limits
case("too_large_default", b"set big 0 0 1048577\r\n" + b"x" * 1048577 + b"\r\nget big\r\nset s 0 0 1\r\nx\r\nget s\r\n")
case("large_ok_default", b"set big 0 0 1000000\r\n" + b"x" * 1000000 + b"\r\nmg big s\r\n")
case("too_large_1k", b"set big 0 0 2000\r\n" + b"x" * 2000 + b"\r\nget big\r\nset s 0 0 1\r\nx\r\nget s\r\n",
     settings={"item_size": "1k"}, memcached_extra=("-o", "slab_chunk_max=1024"))
case("ms_too_large_1k", b"ms big 2000 T0\r\n" + b"y" * 2000 + b"\r\nmg big v\r\nmn\r\n",
     settings={"item_size": "1k"}, memcached_extra=("-o", "slab_chunk_max=1024"))
case("small_ok_1k", b"set s 0 0 500\r\n" + b"z" * 500 + b"\r\nmg s s\r\n",
     settings={"item_size": "1k"}, memcached_extra=("-o", "slab_chunk_max=1024"))
case("append_too_large_1k", b"set s 0 0 600\r\n" + b"z" * 600 + b"\r\nappend s 0 0 600\r\n" + b"z" * 600
     + b"\r\nmg s s\r\n", settings={"item_size": "1k"}, memcached_extra=("-o", "slab_chunk_max=1024"))
case("line_too_long_no_newline", b"x" * 3000)
case("line_too_long_get", b"get " + b"a" * 3000)
case("line_too_long_get_then_end", b"get " + b"a" * 3000, b"\r\nversion\r\n")
case("line_too_long_gets_keys", b"gets " + b"a" * 200 + b" " + b"b" * 3000, b" c\r\nversion\r\n")
case("line_long_with_newline", b"set " + b"a" * 3000 + b" 0 0 1\r\nx\r\nget a\r\n")
case("get_long_line_many_keys", b"get " + b" ".join(b"k%04d" % i for i in range(800)) + b"\r\n")
case("line_2048_boundary", b"y" * 2047 + b"\r\n" + b"version\r\n")

# ---------------------------------------------------------------- meta: the flag walk
# mg and ma apply T and N in request order after the fetch / the arithmetic (for a created item
# the later wins; t prints the TTL as of its place), and a too-long opaque token stops the walk
# with the error: what came before it acted, what came after did not.
LONG_O = b"O" + b"a" * 40
case("meta_ttl_request_order", L(b"mg m5 T60 t N30", b"mg m5 t", b"mg m6 t T60 N30", b"mg m6 t",
                                 b"mg u1 T60 N30 t", b"mg u1 t", b"ms m1 1 T100", b"5", b"ma m1 t T30",
                                 b"mg m1 t", b"ma m3 T60 N30 t", b"mg m3 t", b"ma m4 T60 t N30", b"mg m4 t"))
case("meta_long_opaque_walk", L(b"ms wa 1", b"5", b"mg wa T99 " + LONG_O, b"mg wa t v",
                                b"mg wb N30 " + LONG_O + b" v", b"mg wb t v", b"mg vz " + LONG_O + b" N30",
                                b"mg vz N30 v t", b"ms vx 1", b"5", b"mg vx " + LONG_O + b" h", b"mg vx h",
                                b"ma we " + LONG_O + b" N30 J4", b"mg we t v", b"ms wf 1 T100", b"5",
                                b"ma wf " + LONG_O + b" T30", b"mg wf t v"))


def meta_random_steps(seed, n):
    """n random meta commands (each followed by mn) on a few keys: flag letters, values and
    orders drawn from what memcached accepts and refuses, sizes right and wrong."""
    rng = random.Random(seed)
    keys = [b"k0", b"k1", b"k2", b"a" * 250, b"bG9uZw=="]
    pool = {b"mg": b"b c f h k l O q s t v E N R T u".split(), b"ms": b"b c C E F I k O q s S T M".split(),
            b"md": b"b C E I k O q T x".split(), b"ma": b"b C E N J D T M O q t c v k".split()}
    values = [b"0", b"1", b"30", b"-1", b"18446744073709551615", b"x", b"", b"99999999999999999999"]

    def flag(letter):
        if letter == b"O":
            return letter + rng.choice([b"x", b"123", b"", b"a" * 40])
        if letter in (b"N", b"T", b"R", b"J", b"D", b"C", b"E", b"F", b"S"):
            return letter + rng.choice(values)
        if letter == b"M":
            return letter + rng.choice([b"S", b"E", b"A", b"P", b"R", b"I", b"D", b"+", b"-", b"s", b"x", b""])
        return letter

    steps = []
    for _ in range(n):
        cmd = rng.choice([b"mg", b"ms", b"md", b"ma", b"mn", b"me"])
        key = rng.choice(keys)
        flags = b" ".join(flag(rng.choice(pool[cmd])) for _ in range(rng.randrange(0, 5))) if cmd in pool else b""
        if cmd == b"mn":
            line = b"mn\r\n"
        elif cmd == b"me":
            line = b"me " + key + b"\r\n"
        elif cmd == b"ms":
            data = bytes(rng.choice(b"0123456789ab") for _ in range(rng.choice([0, 1, 3, 5])))
            size = str(len(data)).encode() if rng.random() < 0.9 else rng.choice([b"x", b"-1", b"%d" % (len(data) + 1)])
            line = b"ms " + key + b" " + size + b" " + flags + b"\r\n" + data + b"\r\n"
        else:
            line = cmd + b" " + key + b" " + flags + b"\r\n"
        steps.append(line + b"mn\r\n")
    return steps


# A seeded random meta session (MC_META_SEED to replay another one; the seed is in the name).
META_SEED = int(os.environ.get("MC_META_SEED", "2211"))
case("meta_random_seed%d" % META_SEED, *meta_random_steps(META_SEED, 150))

# ---------------------------------------------------------------- byte rules at their edges
# One home for these rules: crates/proto/src/rules (limits, item size, numbers, tokens).
SMALL = dict(settings={"item_size": "1k"}, memcached_extra=("-o", "slab_chunk_max=1024"))


def sized(cmd, n, then=b"mg k s"):
    """`set k 0 0 n` or `ms k n` (cmd is the line without the length), n data bytes, then `then`."""
    return cmd % n + b"\r\n" + b"v" * n + b"\r\n" + then + b"\r\n"


# memcached's item_size_ok: 48 + key + 1 + (flags ? 4 : 0) + value + 2 (+ 8 with CAS) <= -I,
# the same for set, ms and the store; -C makes items 8 bytes smaller for every command.
case("item_size_edges", *[sized(c, n) for c in (b"set k 0 0 %d", b"ms k %d", b"ms k %d T0")
                          for n in (1048516, 1048517)],
     sized(b"set k 1 0 %d", 1048512), sized(b"set k 1 0 %d", 1048513),
     sized(b"ms k %d F1", 1048512), sized(b"ms k %d F1", 1048513))
case("item_size_edges_no_cas", *[sized(c, n) for c in (b"set k 0 0 %d", b"ms k %d") for n in (1048524, 1048525)],
     sized(b"ms k %d F1", 1048520), sized(b"ms k %d F1", 1048521), extra=("-C",))
case("item_size_edges_1k", *[sized(c, n) for c in (b"set k 0 0 %d", b"ms k %d", b"add j 0 0 %d")
                             for n in (964, 965)],
     # a base64 key counts decoded: "a2s=" is "ks", 2 bytes
     sized(b"ms a2s= %d b", 963, b"mg a2s= b s"), sized(b"ms a2s= %d b", 964, b"mg a2s= b s"),
     sized(b"set k 0 0 %d", 900), sized(b"append k 0 0 %d", 64), sized(b"append k 0 0 %d", 65), **SMALL)
case("item_size_edges_1k_no_cas", *[sized(c, n) for c in (b"set k 0 0 %d", b"ms k %d") for n in (972, 973)],
     extra=("-C",), **SMALL)
case("keys_250_251_every_command", L(
    b"set " + K250 + b" 0 0 1", b"x", b"gets " + K250, b"mg " + K250 + b" v k", b"ma " + K250,
    b"ms " + K251 + b" 1", b"y", b"mg " + K251 + b" v", b"ma " + K251, b"md " + K251, b"me " + K251,
    b"touch " + K250 + b" 10", b"gat 10 " + K250, b"delete " + K250 + b" 0", b"md " + K250,
    b"ms " + K250 + b" 1 T0", b"z", b"mg " + K250 + b" v", b"mn"))
# numbers: signs, white space inside a token (a tab is part of it), truncation, overflow
case("set_numbers_signs_spaces", L(
    b"set a +5 0 1", b"x", b"gets a", b"set a 5 +0 +1", b"y", b"get a", b"set a -0 -0 1", b"z", b"get a",
    b"set a \t7\t 0 1", b"w", b"get a", b"set a 18446744073709551615 0 1", b"x", b"get a",
    b"set a -18446744073709551615 0 1", b"x", b"get a", b"set a 18446744073709551616 0 1", b"x",
    b"set a 18446744073709551615\t- 0 1", b"x", b"set a 4294967295\t- 0 1", b"x", b"get a",
    b"set a 0 9223372036854775808 1", b"x", b"set a 0 -9223372036854775808 1", b"x", b"get a",
    b"set a 0 0 4294967297", b"q", b"get a", b"set a 0 0 1x", b"x", b"set a 0 0 0x1", b"x", b"get a",
    b"cas a 0 0 1 -0", b"x", b"cas a 0 0 1 18446744073709551615\t-", b"x", b"touch a +0", b"touch a \t9",
    b"touch a 9223372036854775808", b"verbosity +1", b"verbosity 4294967297", b"get a"))
case("incr_numbers_signs_spaces", L(
    b"set a 0 0 1", b"5", b"incr a +1", b"incr a \t2", b"incr a -0", b"incr a -18446744073709551615",
    b"decr a 00000000000000000000001", b"incr a 18446744073709551615\t-", b"incr a 5\t-", b"incr a 1x",
    b"incr a 18446744073709551616", b"decr a -1", b"get a"))
case("incr_stored_value_c_string", L(
    b"set a 0 0 4", b"12\x00x", b"incr a 1", b"get a", b"set b 0 0 22", b"18446744073709551615 -", b"incr b 0",
    b"set c 0 0 3", b" +5", b"incr c 1", b"set d 0 0 4", b"-0\t-", b"incr d 1", b"get b c d"))
case("meta_numeric_tokens", L(
    b"ms a 1 F+7 T+0", b"x", b"mg a f v", b"ms a 1 F-1", b"x", b"ms a 1 F4294967296", b"x", b"mg a f",
    b"ms a 1 F18446744073709551615\t-", b"x", b"mg a f", b"ms a 1 C18446744073709551615\t-", b"x",
    b"ms a +1", b"y", b"ms a 4294967297", b"z", b"ms a \t1", b"w", b"mg a v",
    b"ma n N0 J+5 D-0 v", b"ma n D-18446744073709551615 v", b"ma n D18446744073709551615\t- v", b"ma n D5\t- v",
    b"ma m N0 J18446744073709551615\t- v", b"ma m N0 J-0 v", b"mg n N+30 T\t30 v t", b"mg x N9223372036854775808 v",
    b"mg x R5x v", b"mn"))
FLAGS17 = b" c f h k l O1 q s t u v N30 R30 T30 P L"
case("meta_tokens_max", L(
    b"ms a 1", b"x", b"mg a" + FLAGS17, b"mg a" + FLAGS17 + b" E5", b"mg a" + b" v" * 30, b"md a" + FLAGS17[:-6],
    b"ms a 1" + FLAGS17[:-9], b"y", b"ms a 1" + FLAGS17[:-6] + b" I", b"y", b"mn"))
case("text_tokens_max", L(
    b"set a 0 0 1 noreply" + b" x" * 17, b"y", b"incr a 1" + b" z" * 20 + b" noreply", b"delete a" + b" 0" * 22,
    b"touch a 1" + b" noreply" * 21, b"get a" + b" a" * 40, b"mn"))

# ---------------------------------------------------------------- expiry
case("expiry", L(b"set a 0 1 1", b"x", b"set b 0 100 1", b"y", b"ms c 1 T1", b"z", b"get a b c"), Sleep(2.2),
     L(b"get a b c", b"mg c v", b"touch a 10", b"incr a 1", b"add a 0 0 1", b"n", b"get a"), split=False)
case("expiry_touch_gat", L(b"set a 0 100 1", b"x", b"touch a 1", b"set b 0 100 1", b"y", b"gat 1 b",
                           b"set c 0 1 1", b"z", b"gat 100 c"), Sleep(2.2), L(b"get a b c"), split=False)

# ---------------------------------------------------------------- pipelining
case("pipeline_mix", b"".join([
    L(b"set k%d %d 0 %d" % (i, i, len(b"v%d" % i)), b"v%d" % i) for i in range(30)]) +
    L(b"get " + b" ".join(b"k%d" % i for i in range(0, 30, 3)), b"incr k1 1", b"delete k2", b"mg k3 v",
      b"ms k4 1", b"Q", b"gets k4", b"mn", b"bogus", b"version", b"get k2 k4"))
case("pipeline_across_steps", b"set a 0 0 5\r\nhe", b"llo\r\nget", b" a\r\n")
case("pipeline_get_after_error", L(b"set a 0 0 1", b"xx", b"get a", b"set a 0 0 1", b"x", b"get a"))


IDS = [c.name for c in CASES]
# sessions where memcached legitimately says nothing and keeps the connection open
QUIET_OK = {"lone_cr", "line_too_long_get"}
# The quiet window of a second try after a reply came up short (mcwire's default is 150 ms;
# a machine at load 10+ can leave a server silent that long).
RETRY_QUIET_S = 0.75


def _run_pair(ref_srv, cand_srv, steps, split, quiet_s=None):
    results = {}

    def go(key, srv):
        try:
            results[key] = mcwire.run_session(srv, steps, split=split, quiet_s=quiet_s)
        except Exception as e:  # reported below; the other thread must finish
            results[key] = e

    threads = [threading.Thread(target=go, args=("ref", ref_srv), daemon=True),
               threading.Thread(target=go, args=("cand", cand_srv), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for k in ("ref", "cand"):
        if k not in results:
            raise AssertionError("%s session did not finish in 60s" % k)
        if isinstance(results[k], Exception):
            raise results[k]
    return results["ref"], results["cand"]


def _split_plan(c):
    """None for whole sends, 'bytes' to trickle, or a cut-offset function per step."""
    if all(callable(s) or isinstance(s, Sleep) or len(s) <= SPLIT_BYTES_MAX for s in c.steps):
        return "bytes"
    seed = SPLIT_SEED ^ zlib.crc32(c.name.encode())

    def cuts(step):
        # every byte of the first and last 40 bytes, around each line end, plus samples
        rng = random.Random(seed ^ len(step))
        n = len(step)
        if n <= SPLIT_BYTES_MAX:
            return list(range(1, n))
        out = set(range(1, min(n, 40)))
        out.update(range(max(1, n - 40), n))
        pos = 0
        for _ in range(200):
            i = step.find(b"\r\n", pos)
            if i < 0:
                break
            out.update((i, i + 1, i + 2))
            pos = i + 2
        out.update(rng.randrange(1, n) for _ in range(SPLIT_SAMPLE))
        return sorted(x for x in out if 0 < x < n)

    return cuts


def _cut_short(c, ref, cand):
    """True when one reply is the other's beginning, or memcached said nothing where it must:
    what a quiet window that closed too early (a loaded machine) looks like, as opposed to
    different bytes."""
    a, b = bytes(ref.data), bytes(cand.data)
    if not a and not ref.closed and c.name not in QUIET_OK:
        return True
    return ref.closed == cand.closed and a != b and (a.startswith(b) or b.startswith(a))


def _compare(c, ref_srv, cand_srv, split, quiet_s=None, retry=None):
    """Run the session on both servers and fail on any difference after normalisation. A
    difference that is only a missing tail (or a silent memcached) is run once more on fresh
    servers (`retry()`) with RETRY_QUIET_S: a real difference stays, a reply read too early
    does not."""
    ref, cand = _run_pair(ref_srv, cand_srv, c.steps, split, quiet_s)
    rn = normalize(ref.data, ref_srv.port)
    cn = normalize(cand.data, cand_srv.port)
    if retry is not None and _cut_short(c, ref, cand):
        print("session %s: one reply is the other's beginning; again with a %.2f s quiet window"
              % (c.name, RETRY_QUIET_S))
        return _compare(c, *retry(), split, quiet_s=RETRY_QUIET_S)
    if rn != cn or ref.closed != cand.closed:
        pytest.fail("session %s (split=%s, MC_SPLIT_SEED=%d) differs:\n%s" % (
            c.name, "no" if split is None else ("bytes" if split == "bytes" else "sampled"), SPLIT_SEED,
            describe_diff(ref.data, cand.data, ref.closed, cand.closed, rn, cn)), pytrace=False)
    return ref


@pytest.mark.parametrize("c", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["whole", "split"])
def test_session(c, mode, server_factory, candidate_kind):
    if mode == "split" and not c.split:
        pytest.skip("session uses sleeps; whole-send only")
    settings = dict(threads=2, mem_mb=64, conns=1024)
    settings.update(c.settings)
    cand_extra = c.extra + (c.memcached_extra if candidate_kind == "memcached" else ())

    def fresh_pair():
        return (server_factory("memcached", extra=c.extra + c.memcached_extra, **settings),
                server_factory(candidate_kind, extra=cand_extra, **settings))

    split = None if mode == "whole" else _split_plan(c)
    ref = _compare(c, *fresh_pair(), split, retry=fresh_pair)
    # the reference itself must have produced something meaningful
    assert ref.data or ref.closed or c.name in QUIET_OK, "memcached said nothing for %s" % c.name
