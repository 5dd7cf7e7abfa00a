// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * xdp_fastpath.c: Slipstream's kernel fast path. An XDP ingress program that answers memcached
 * UDP `get`/`gets` (one to SS_KEYS_MAX keys) and `mg <key> v [f]` straight from the ss_items map
 * when every key hits, rewriting the request packet in place into the reply and bouncing it with
 * XDP_TX. Everything else (misses, expired or flushed items, other commands, multi-datagram
 * requests, replies over one datagram, IP options, fragments, VLANs, ...) is XDP_PASSed untouched
 * to the user-space server.
 *
 * Tenants: each tenant has its own UDP port (ss_ports gives its slot), its own keys (the slot is
 * part of the map key), its own flush epoch, and, if shaped, an allowance from its token
 * buckets that every answer is paid from (see struct ss_tenant); a request the allowance cannot
 * pay for goes to user space, which shapes it. Ports with no tenant pass untouched.
 *
 * Not for: filling or invalidating the cache. User space does both through the map while holding
 * the store's shard lock (see crates/fastpath docs for why that is coherent), so this program only
 * ever reads ss_items.
 *
 * Streams: a UDP port whose ss_ports value carries SS_PORT_STREAM belongs to the stream
 * offload engine (xdp_stream.h): one program per interface serves the KV cache, the tenants
 * and the streams, each configuring its own map entries.
 *
 * The GPL-compatible licence is needed for the helpers used (bpf_loop, dynptr).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "slipstream_kv.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* No preallocation: memory grows with use, and elements are RCU-freed, so a reader sees
	 * an old or a new element whole, never a torn one. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, SS_ENTRIES_DEFAULT);
	__type(key, struct ss_key);
	__type(value, struct ss_item);
} ss_items SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ss_config);
} ss_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SS_COUNTER_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} ss_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SS_PORTS);
	__type(key, __u32);
	__type(value, __u32);
} ss_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	/* User space maps it to take spent counters and set allowances atomically. */
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SS_TENANTS_MAX);
	__type(key, __u32);
	__type(value, struct ss_tenant);
} ss_tenants SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SS_TENANTS_MAX);
	__type(key, __u32);
	__type(value, struct ss_tenant_stats);
} ss_tstats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ss_scratch);
} ss_scratch SEC(".maps");

/* Word-at-a-time byte tests, shared by the KV tokenizer and the stream engine's. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Nonzero iff some byte of x is zero. */
static __always_inline __u64 has_zero_byte(__u64 x)
{
	return (x - ONES) & ~x & HIGHS;
}

#include "xdp_stream.h"

/* Tokens a request may have: command + SS_KEYS_MAX keys (mg: command, key, <= 2 flags). */
#define TOK_MAX (SS_KEYS_MAX + 1)
#define TOK_SLOTS 16 /* power of two >= TOK_MAX, for index masking */
#define REQ_MASK (SS_REQUEST_BYTES_MAX - 1)
/* Reply layout in scratch.reply: UDP header (8), frame header (8), payload. */
#define REPLY_PAYLOAD_OFF 16
#define REPLY_END (REPLY_PAYLOAD_OFF + SS_REPLY_PAYLOAD_BYTES_MAX)

/* Hide a value from the optimiser so that a bound check written after it is really emitted:
 * clang drops checks it can prove redundant, but the verifier needs to see them. */
#define OPAQUE(x) asm volatile("" : "+r"(x))

/* Where the reply's Ethernet + IP headers sit in scratch.hdr: ending where scratch.reply starts. */
#define HDR4_BYTES (ETH_HLEN + 20)
#define HDR6_BYTES (ETH_HLEN + 40)
#define HDR4_AT (SS_SCRATCH_HDR_BYTES - HDR4_BYTES)
#define HDR6_AT (SS_SCRATCH_HDR_BYTES - HDR6_BYTES)

enum mode { MODE_GET = 1, MODE_GETS = 2, MODE_MG_V = 3, MODE_MG_VF = 4 };

struct tok_ctx {
	struct ss_scratch *s;
	__u32 n;      /* bytes to tokenize (the line without its "\r\n") */
	__u32 ntok;
	__u32 start;
	__u32 in_tok;
	__u32 bad;
	__u16 tstart[TOK_SLOTS];
	__u16 tlen[TOK_SLOTS];
};

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&ss_counters, &idx);
	if (v)
		*v += 1;
}

/* Per-tenant counter `idx` (SS_COUNTER_HITS, _MISSES or _THROTTLED) of `slot`. */
static __always_inline void count_tenant(__u32 slot, __u32 idx)
{
	struct ss_tenant_stats *ts = bpf_map_lookup_elem(&ss_tstats, &slot);
	if (!ts)
		return;
	if (idx == SS_COUNTER_HITS)
		ts->hits += 1;
	else if (idx == SS_COUNTER_MISSES)
		ts->misses += 1;
	else
		ts->throttled += 1;
}

static __always_inline void close_token(struct tok_ctx *t, __u32 end)
{
	__u32 idx = t->ntok;
	if (idx >= TOK_MAX) {
		t->bad = 1;
		return;
	}
	idx &= TOK_SLOTS - 1;
	t->tstart[idx] = (__u16)t->start;
	t->tlen[idx] = (__u16)(end - t->start);
	t->ntok += 1;
	t->in_tok = 0;
}

/* Nonzero iff some byte of x is ' ' (memcached's token separator) or '\n' (a second line). */
static __always_inline int has_separator(__u64 x)
{
	return has_zero_byte(x ^ (ONES * ' ')) || has_zero_byte(x ^ (ONES * '\n'));
}

/* Eight bytes of the request line per call (one bpf_loop callback per byte cost more than the
 * byte work), read as one word. memcached's tokenizer splits on ' ' only and skips empty
 * tokens; a '\n' inside the line means several commands in one datagram: not ours. A whole
 * word with no ' ' or '\n' at most starts a token. Returns nonzero to stop. */
static long tok_step(__u32 w, void *c)
{
	struct tok_ctx *t = c;
	__u32 base = w * 8;
	__u32 n = t->n;
	if (base >= n)
		return 1;
	__u64 x = *(__u64 *)(t->s->req + (base & REQ_MASK));
	__u32 lim = n - base;
	__u32 in_tok = t->in_tok;
	if (lim >= 8 && !has_separator(x)) {
		if (!in_tok) {
			t->in_tok = 1;
			t->start = base;
		}
		return 0;
	}
#pragma unroll
	for (__u32 j = 0; j < 8; j++) {
		if (j >= lim)
			continue; /* past the line */
		__u8 ch = (__u8)(x >> (8 * j));
		if (ch == '\n') {
			t->bad = 1;
			return 1;
		}
		if (ch == ' ') {
			if (in_tok) {
				close_token(t, base + j);
				in_tok = 0;
				if (t->bad)
					return 1;
			}
		} else if (!in_tok) {
			in_tok = 1;
			t->start = base + j;
		}
	}
	t->in_tok = in_tok;
	return 0;
}

/* Key word `w` (bytes 8w..8w+7) of the key at req[kstart..kstart+klen], little-endian, with
 * bytes past the key zeroed. Reads past req's end land in reply (same map value) and are masked. */
static __always_inline __u64 key_word(struct ss_scratch *s, __u32 kstart, __u32 klen, __u32 off)
{
	__u32 at = (kstart + off) & REQ_MASK;
	__u64 x = *(__u64 *)(s->req + at);
	__u32 rem = klen - off;
	if (rem < 8)
		x &= (1ULL << (rem * 8)) - 1;
	return x;
}

/* Segments up to this long are copied in 8-byte words by ss_copy: cheaper than a dynptr
 * helper call for the short prefixes and values that are the common case. */
#define SMALL_COPY_BYTES 64

/* Copy piece[off..off+len] to reply[pos..]. A global function (verified once): inlined, its two
 * ways of copying multiplied the verifier's states in the per-key loop past its limit.
 * Short segments go in whole words, so up to 7 bytes past pos + len are overwritten too:
 * harmless, as every later write starts at pos + len and bytes past the reply's end are never
 * sent (the checksum comes from precomputed sums, not from these bytes). Longer ones go
 * through one dynptr read. */
__noinline int ss_copy(struct ss_scratch *s, struct ss_item *it, struct bpf_dynptr *dp, __u32 pos_off,
		       __u32 len)
{
	/* pos (low 16 bits) and off (high 16) share one argument: BPF calls take at most 5. */
	__u32 pos = pos_off & 0xffff, off = pos_off >> 16;
	if (!s || !it || pos > REPLY_END || len > SS_PIECE_BYTES_MAX || off > SS_PIECE_BYTES_MAX)
		return -1;
	if (len <= SMALL_COPY_BYTES && off <= SS_PIECE_BYTES_MAX - SMALL_COPY_BYTES) {
		for (__u32 w = 0; w < SMALL_COPY_BYTES / 8; w++) {
			__u32 o = w * 8;
			if (o >= len)
				break;
			__u32 src = off + o;
			OPAQUE(src); /* keeps the bound check below next to the access */
			if (src > SS_PIECE_BYTES_MAX - 8)
				return -1;
			__u32 dst = pos + o;
			asm volatile("%0 &= 2047" : "+r"(dst));
			*(__u64 *)(s->reply + dst) = *(__u64 *)(it->piece + src);
		}
		return 0;
	}
	/* No-ops (pos <= REPLY_END, len <= SS_PIECE_BYTES_MAX), but ones the compiler cannot drop,
	 * so the verifier sees the bound: pos + len <= 2047 + 2047 < sizeof(reply). */
	asm volatile("%0 &= 2047" : "+r"(pos));
	asm volatile("%0 &= 2047" : "+r"(len));
	return bpf_dynptr_read(s->reply + pos, len, dp, off, 0) ? -1 : 0;
}

static __always_inline int copy_seg(struct ss_scratch *s, __u32 pos, struct ss_item *it,
				    struct bpf_dynptr *dp, __u32 off, __u32 len)
{
	if (len == 0)
		return 0;
	if (pos > REPLY_END || off > SS_PIECE_BYTES_MAX)
		return -1;
	return ss_copy(s, it, dp, pos | (off << 16), len);
}

/* Write one reply byte; the masked index keeps the verifier's bound (callers keep idx small). */
static __always_inline void put_byte(struct ss_scratch *s, __u32 idx, __u8 v)
{
	asm volatile("%0 &= 2047" : "+r"(idx));
	s->reply[idx] = v;
}

static __always_inline __u32 fold(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u32)sum;
}

/* The two key loops below are global (separately verified) functions: inlined into the per-key
 * loop their up-to-32 iterations multiplied the verifier's states past its limit.
 * ss_key_hash over req[kstart..kstart+klen] (see slipstream_kv.h). */
__noinline __u64 ss_key_hash(struct ss_scratch *s, __u32 kstart, __u32 klen)
{
	if (!s || klen > SS_KEY_BYTES_MAX)
		return 0;
	__u64 h = SS_HASH_SEED ^ ((__u64)klen * SS_HASH_MUL);
	for (__u32 w = 0; w < SS_KEY_WORDS_MAX; w++) {
		__u32 off = w * 8;
		if (off >= klen)
			break;
		h = (h ^ key_word(s, kstart, klen, off)) * SS_HASH_MUL;
		h ^= h >> 32;
	}
	return h;
}

/* 1 iff it->piece holds the key req[kstart..kstart+klen] at offset kat, followed by ' '. */
__noinline int ss_key_matches(struct ss_scratch *s, struct ss_item *it, __u32 kstart, __u32 klen,
			      __u32 kat)
{
	if (!s || !it || klen > SS_KEY_BYTES_MAX || kat > SS_PIECE_BYTES_MAX)
		return 0;
	for (__u32 w = 0; w < SS_KEY_WORDS_MAX; w++) {
		__u32 off = w * 8;
		if (off >= klen)
			break;
		__u32 p = kat + off;
		if (p > SS_PIECE_BYTES_MAX - 8)
			return 0;
		OPAQUE(p);
		if (p > SS_PIECE_BYTES_MAX - 8)
			return 0;
		__u64 y = *(__u64 *)(it->piece + p);
		__u32 rem = klen - off;
		if (rem < 8)
			y &= (1ULL << (rem * 8)) - 1;
		if (y != key_word(s, kstart, klen, off))
			return 0;
	}
	__u32 sp = kat + klen;
	if (sp >= SS_PIECE_BYTES_MAX)
		return 0;
	OPAQUE(sp);
	if (sp >= SS_PIECE_BYTES_MAX)
		return 0;
	return it->piece[sp] == ' ';
}

/* 1 iff req[start..end) is one token: 1..SS_KEY_BYTES_MAX bytes with no ' ' and no '\n'. The
 * common request, "get <key>", needs nothing more than this, so it skips the general tokenizer
 * (a bpf_loop with a callback per 8 bytes). Global for the same reason as the key loops above. */
__noinline int ss_one_token(struct ss_scratch *s, __u32 start, __u32 end)
{
	if (!s || end <= start || end - start > SS_KEY_BYTES_MAX)
		return 0;
	__u32 len = end - start;
	for (__u32 w = 0; w < SS_KEY_WORDS_MAX; w++) {
		__u32 off = w * 8;
		if (off >= len)
			break;
		__u64 x = *(__u64 *)(s->req + ((start + off) & REQ_MASK));
		__u32 rem = len - off;
		if (rem < 8) {
			/* Bytes past the token become 'x' (neither ' ' nor '\n'). */
			__u64 keep = (1ULL << (rem * 8)) - 1;
			x = (x & keep) | ((ONES * 'x') & ~keep);
		}
		if (has_separator(x))
			return 0;
	}
	return 1;
}

/* A segment's precomputed sum (see struct ss_item) as it adds to the datagram's checksum when
 * the segment starts at offset `at` of the datagram: byte-swapped at an odd offset. */
static __always_inline __u32 seg_sum(__u16 cs, __u32 at)
{
	return (at & 1) ? (__u32)__builtin_bswap16(cs) : (__u32)cs;
}

/* The sum of "END\r\n" as memory-order 16-bit words from an even offset ("EN", "D\r", "\n\0"). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define END_SUM (0x4e45 + 0x0d44 + 0x000a)
#else
#define END_SUM (0x454e + 0x440d + 0x0a00)
#endif

/* The KV cache and tenants (everything but stream ports). Not inlined: its frame is near the
 * verifier's stack limit, so the entry below stays small and the stream engine gets a call
 * chain of its own. */
static __noinline int ss_kv_packet(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;

	struct ss_config *cfg = bpf_map_lookup_elem(&ss_config, &zero);
	if (!cfg || cfg->enabled == 0)
		return XDP_PASS;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;

	int v6;
	__u32 l4_off, udp_len;
	/* The addresses' part of the UDP checksum (pseudo-header), memory order. */
	__u64 asum = 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return XDP_PASS;
		if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
			return XDP_PASS;
		if (ip->frag_off & bpf_htons(0x3fff)) /* MF or fragment offset */
			return XDP_PASS;
		__u32 tot = bpf_ntohs(ip->tot_len);
		if (tot < sizeof(*ip) + sizeof(struct udphdr))
			return XDP_PASS;
		udp_len = tot - sizeof(*ip);
		l4_off = sizeof(*eth) + sizeof(*ip);
		v6 = 0;
		asum = (__u64)ip->daddr + ip->saddr;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		if (ip6->version != 6 || ip6->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		udp_len = bpf_ntohs(ip6->payload_len);
		l4_off = sizeof(*eth) + sizeof(*ip6);
		v6 = 1;
#pragma unroll
		for (int i = 0; i < 4; i++)
			asum += (__u64)ip6->daddr.in6_u.u6_addr32[i] + ip6->saddr.in6_u.u6_addr32[i];
	} else {
		return XDP_PASS;
	}

	struct udphdr *udp = data + l4_off;
	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	/* Which tenant's port (if any): the slot selects its keys, epoch and allowance. */
	__u32 port = bpf_ntohs(udp->dest);
	__u32 *slot_plus1 = bpf_map_lookup_elem(&ss_ports, &port);
	if (!slot_plus1 || *slot_plus1 == 0)
		return XDP_PASS;
	__u32 slot = *slot_plus1 - 1;
	struct ss_tenant *ten = bpf_map_lookup_elem(&ss_tenants, &slot);
	if (!ten || !ten->active)
		return XDP_PASS;
	__u64 epoch = cfg->epoch + ten->epoch;
	if (bpf_ntohs(udp->len) != udp_len)
		return XDP_PASS;
	if ((__u64)l4_off + udp_len > (__u64)(data_end - data))
		return XDP_PASS;
	if (udp_len < sizeof(struct udphdr) + SS_FRAME_HEADER_BYTES + 4)
		return XDP_PASS;
	__u16 sport = udp->source, dport = udp->dest;

	struct ss_scratch *s = bpf_map_lookup_elem(&ss_scratch, &zero);
	if (!s)
		return XDP_PASS;

	__u32 pay_off = l4_off + sizeof(struct udphdr) + SS_FRAME_HEADER_BYTES;
	__u32 n = udp_len - sizeof(struct udphdr) - SS_FRAME_HEADER_BYTES;
	__u32 load = n;
	if (load > SS_REQUEST_BYTES_MAX)
		load = SS_REQUEST_BYTES_MAX;
	if (load < 4 || bpf_xdp_load_bytes(ctx, pay_off, s->req, load))
		return XDP_PASS;

	/* Get-like? Only those count as hits or misses. */
	int getlike = (s->req[0] == 'g' && s->req[1] == 'e' && s->req[2] == 't' &&
		       (s->req[3] == ' ' || (s->req[3] == 's' && load > 4 && s->req[4] == ' '))) ||
		      (s->req[0] == 'm' && s->req[1] == 'g' && s->req[2] == ' ');
	if (!getlike)
		return XDP_PASS;

	/* A shaped tenant whose allowance cannot pay even for the request (or any reply): pass
	 * it up before spending work on it (user space queues and shapes it). */
	if (ten->shaped && (ten->allow_in_bytes < (__s64)n || ten->allow_out_bytes <= 0))
		goto throttled;

	/* From here on every exit that does not answer is a counted miss. */
	if (n > SS_REQUEST_BYTES_MAX)
		goto miss;

	/* Frame header: one datagram only (memcached rejects the rest anyway). Read in place: the
	 * UDP length check above put it inside the packet. */
	__u8 *fh = (void *)(udp + 1);
	if ((void *)(fh + SS_FRAME_HEADER_BYTES) > data_end)
		goto miss;
	if (fh[2] != 0 || fh[3] != 0 || fh[4] != 0 || fh[5] != 1)
		goto miss;
	__u16 request_id = *(__u16 *)fh; /* memory order, echoed as is */

	/* Exactly one line, ending in "\r\n". */
	__u32 cr = n - 2, lf = n - 1;
	/* The masks in a form clang cannot drop as redundant with n's bound (the verifier may not
	 * connect that bound with a copy of n it reloads). */
	asm volatile("%0 &= 2047" : "+r"(cr));
	asm volatile("%0 &= 2047" : "+r"(lf));
	if (s->req[cr] != '\r' || s->req[lf] != '\n')
		goto miss;

	struct tok_ctx t = {};
	t.s = s;
	t.n = n - 2;
	/* "get <key>" / "gets <key>" (getlike checked the command and its space). */
	__u32 key_at = s->req[3] == ' ' ? 4 : 5;
	if (s->req[0] == 'g' && ss_one_token(s, key_at, n - 2)) {
		t.ntok = 2;
		t.tlen[0] = (__u16)(key_at - 1);
		t.tstart[1] = (__u16)key_at;
		t.tlen[1] = (__u16)(n - 2 - key_at);
	} else {
		bpf_loop(SS_REQUEST_BYTES_MAX / 8, tok_step, &t, 0);
		if (t.bad)
			goto miss;
		if (t.in_tok)
			close_token(&t, t.n);
	}
	if (t.bad || t.ntok < 2 || t.tstart[0] != 0)
		goto miss;

	int mode;
	__u32 nkeys;
	__u32 cmd_len = t.tlen[0];
	if (cmd_len == 3 && s->req[2] == 't') {
		mode = MODE_GET;
		nkeys = t.ntok - 1;
	} else if (cmd_len == 4 && s->req[3] == 's') {
		mode = MODE_GETS;
		nkeys = t.ntok - 1;
	} else if (cmd_len == 2 && s->req[1] == 'g') {
		/* mg <key> v | mg <key> v f | mg <key> f v: nothing else. */
		nkeys = 1;
		if (t.ntok == 3) {
			if (t.tlen[2] != 1 || s->req[t.tstart[2] & REQ_MASK] != 'v')
				goto miss;
			mode = MODE_MG_V;
		} else if (t.ntok == 4) {
			if (t.tlen[2] != 1 || t.tlen[3] != 1)
				goto miss;
			__u8 f1 = s->req[t.tstart[2] & REQ_MASK];
			__u8 f2 = s->req[t.tstart[3] & REQ_MASK];
			if (!((f1 == 'v' && f2 == 'f') || (f1 == 'f' && f2 == 'v')))
				goto miss;
			mode = MODE_MG_VF;
		} else {
			goto miss;
		}
	} else {
		goto miss;
	}
	if (nkeys < 1 || nkeys > SS_KEYS_MAX)
		goto miss;

	__u64 now = 0; /* read on the first item with an expiry: most have none */
	__u32 pos = REPLY_PAYLOAD_OFF;
	/* The payload's part of the UDP checksum, from the items' precomputed segment sums. */
	__u64 psum = 0;
	for (__u32 k = 0; k < SS_KEYS_MAX; k++) {
		if (k >= nkeys)
			break;
		__u32 ti = (k + 1) & (TOK_SLOTS - 1);
		__u32 klen = t.tlen[ti];
		__u32 kstart = t.tstart[ti];
		if (klen < 1 || klen > SS_KEY_BYTES_MAX)
			goto miss;
		/* ss_key_hash (see slipstream_kv.h), over the key bytes in req. */
		__u64 h = ss_key_hash(s, kstart, klen);
		struct ss_key key = { .hash = h, .len = klen, .tenant = slot };
		struct ss_item *it = bpf_map_lookup_elem(&ss_items, &key);
		if (!it)
			goto miss;
		if (it->epoch != epoch)
			goto miss;
		if (it->expiry_ns != 0) {
			if (now == 0)
				now = bpf_ktime_get_ns();
			if (now >= it->expiry_ns)
				goto miss;
		}
		__u32 d = it->d_len, e = it->e_len, a = it->a_len, b = it->b_len, c = it->c_len;
		if (d + e + a + b + c > SS_PIECE_BYTES_MAX)
			goto miss;
		/* The map key is only a hash: the item must be this key's. Segment A is
		 * "VALUE <key> ...", and keys hold no ' ', so the key bytes followed by ' ' at
		 * offset d + e + 6 identify it exactly. */
		if (a < 6 + klen + 1)
			goto miss;
		if (!ss_key_matches(s, it, kstart, klen, d + e + 6))
			goto miss;
		__u32 need;
		switch (mode) {
		case MODE_GET:
			need = a + c;
			break;
		case MODE_GETS:
			need = a + b + c;
			break;
		case MODE_MG_V:
			need = d + c;
			break;
		default:
			need = d + e + c;
			break;
		}
		/* Room for this item and, for get/gets, the closing "END\r\n". */
		if (pos + need + 5 > REPLY_END)
			goto miss;
		struct bpf_dynptr dp;
		if (bpf_dynptr_from_mem(it->piece, sizeof(it->piece), 0, &dp))
			goto miss;
		__u32 c_off = d + e + a + b;
		int err = 0;
		switch (mode) {
		case MODE_GET:
			err |= copy_seg(s, pos, it, &dp, d + e, a);
			psum += seg_sum(it->csum_a, pos);
			pos += a;
			break;
		case MODE_GETS:
			err |= copy_seg(s, pos, it, &dp, d + e, a + b);
			psum += seg_sum(it->csum_a, pos) + seg_sum(it->csum_b, pos + a);
			pos += a + b;
			break;
		case MODE_MG_V:
			err |= copy_seg(s, pos, it, &dp, 0, d);
			psum += seg_sum(it->csum_d, pos);
			pos += d;
			break;
		default:
			err |= copy_seg(s, pos, it, &dp, 0, d + e);
			psum += seg_sum(it->csum_d, pos) + seg_sum(it->csum_e, pos + d);
			pos += d + e;
			break;
		}
		if (pos > REPLY_END)
			goto miss;
		err |= copy_seg(s, pos, it, &dp, c_off, c);
		psum += seg_sum(it->csum_c, pos);
		pos += c;
		if (err || pos > REPLY_END)
			goto miss;
	}
	if (mode == MODE_GET || mode == MODE_GETS) {
		if (pos + 5 > REPLY_END)
			goto miss;
		put_byte(s, pos + 0, 'E');
		put_byte(s, pos + 1, 'N');
		put_byte(s, pos + 2, 'D');
		put_byte(s, pos + 3, '\r');
		put_byte(s, pos + 4, '\n');
		psum += seg_sum(END_SUM, pos);
		pos += 5;
	}
	if (pos > REPLY_END)
		goto miss;

	/* UDP header and frame header of the reply. */
	struct udphdr *ru = (void *)s->reply;
	ru->source = dport;
	ru->dest = sport;
	ru->len = bpf_htons((__u16)pos);
	ru->check = 0;
	*(__u16 *)&s->reply[8] = request_id;
	s->reply[10] = 0; /* sequence 0 */
	s->reply[11] = 0;
	s->reply[12] = 0; /* total 1 */
	s->reply[13] = 1;
	s->reply[14] = 0; /* reserved */
	s->reply[15] = 0;

	/* UDP checksum: pseudo-header + headers + payload, ones' complement, memory order
	 * throughout (16-bit words as loaded from memory; the sum is stored the same way). The
	 * payload's part is psum, summed from the items' precomputed segment sums. */
	__u16 len_be = bpf_htons((__u16)pos);
	__u64 sum = psum + asum; /* 32-bit words: fold() makes them 16-bit ones' sums */
	sum += bpf_htons(IPPROTO_UDP) + len_be;                   /* pseudo-header: protocol, length */
	sum += dport + sport + len_be;                            /* UDP header (checksum 0) */
	sum += request_id + bpf_htons(1);                         /* frame header: id, total 1 */
	__u16 ucheck = (__u16)~fold(sum);
	if (ucheck == 0)
		ucheck = 0xffff;
	ru->check = ucheck;

	/* Pay for the answer from the tenant's allowance before the packet is touched, so that a
	 * request it cannot pay for still goes up unchanged. */
	__s64 in_bytes = n, out_bytes = pos - REPLY_PAYLOAD_OFF;
	if (ten->shaped) {
		if (ten->allow_in_bytes < in_bytes || ten->allow_out_bytes < out_bytes)
			goto throttled;
		__sync_fetch_and_add(&ten->allow_in_bytes, -in_bytes);
		__sync_fetch_and_add(&ten->allow_out_bytes, -out_bytes);
		__sync_fetch_and_add(&ten->spent_requests, 1);
		__sync_fetch_and_add(&ten->spent_in_bytes, in_bytes);
		__sync_fetch_and_add(&ten->spent_out_bytes, out_bytes);
	}

	/* Compose the reply's Ethernet and IP headers in scratch first: the resize below may
	 * move the packet start, after which the request headers are gone. They are placed to end
	 * where s->reply starts (IPv6: Ethernet at hdr + HDR6_AT; IPv4: at hdr + HDR4_AT). */
	if ((void *)(eth + 1) > data_end)
		goto miss;
	__u8 *he = s->hdr + (v6 ? HDR6_AT : HDR4_AT);
	__builtin_memcpy(he, eth->h_source, ETH_ALEN);
	__builtin_memcpy(he + ETH_ALEN, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(he + 2 * ETH_ALEN, &eth->h_proto, 2);
	if (v6) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			goto miss;
		struct ipv6hdr *o6 = (void *)(s->hdr + HDR6_AT + ETH_HLEN);
		__builtin_memcpy(o6, ip6, sizeof(*o6)); /* keeps version, traffic class, flow label */
		__builtin_memcpy(&o6->saddr, &ip6->daddr, 16);
		__builtin_memcpy(&o6->daddr, &ip6->saddr, 16);
		o6->payload_len = bpf_htons((__u16)pos);
		o6->hop_limit = 64;
	} else {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			goto miss;
		struct iphdr *o4 = (void *)(s->hdr + HDR4_AT + ETH_HLEN);
		__builtin_memcpy(o4, ip, sizeof(*o4)); /* keeps version/IHL, TOS, protocol */
		o4->saddr = ip->daddr;
		o4->daddr = ip->saddr;
		o4->tot_len = bpf_htons((__u16)(sizeof(*o4) + pos));
		o4->id = 0;
		o4->frag_off = bpf_htons(0x4000); /* DF, as Linux sends UDP replies */
		o4->ttl = 64;
		o4->check = 0;
		__u32 *w = (void *)o4; /* 4-byte aligned in scratch */
		__u64 isum = (__u64)w[0] + w[1] + w[2] + w[3] + w[4];
		o4->check = (__u16)~fold(isum);
	}

	/* Resize the packet to exactly the reply (dropping any Ethernet padding). Grow at the tail
	 * if the buffer has tailroom there; else at the head (veth hands small skbs over with
	 * little tailroom but XDP_PACKET_HEADROOM in front). Neither: leave it to user space. */
	__s32 delta = (__s32)(l4_off + pos) - (__s32)(data_end - data);
	if (bpf_xdp_adjust_tail(ctx, delta)) {
		if (delta <= 0 || bpf_xdp_adjust_head(ctx, -delta)) {
			if (ten->shaped) {
				/* Not answered after all: give the payment back. */
				__sync_fetch_and_add(&ten->allow_in_bytes, in_bytes);
				__sync_fetch_and_add(&ten->allow_out_bytes, out_bytes);
				__sync_fetch_and_add(&ten->spent_requests, -1);
				__sync_fetch_and_add(&ten->spent_in_bytes, -in_bytes);
				__sync_fetch_and_add(&ten->spent_out_bytes, -out_bytes);
			}
			goto miss;
		}
	}
	__u64 out_len = pos;
	asm volatile("%0 &= 2047" : "+r"(out_len)); /* no-op (pos <= REPLY_END); for the verifier */
	if (out_len == 0)
		return XDP_DROP;
	OPAQUE(out_len); /* keeps clang from merging the two checks into one range test */
	if (out_len > REPLY_END)
		return XDP_DROP;
	/* Headers and reply in one store (they are adjacent in scratch). Cannot fail: the packet
	 * was just resized to exactly this length. */
	if (v6) {
		if (bpf_xdp_store_bytes(ctx, 0, s->hdr + HDR6_AT, HDR6_BYTES + out_len))
			return XDP_DROP;
	} else {
		if (bpf_xdp_store_bytes(ctx, 0, s->hdr + HDR4_AT, HDR4_BYTES + out_len))
			return XDP_DROP;
	}
	count(SS_COUNTER_HITS);
	count_tenant(slot, SS_COUNTER_HITS);
	return XDP_TX;

miss:
	count(SS_COUNTER_MISSES);
	count_tenant(slot, SS_COUNTER_MISSES);
	return XDP_PASS;

throttled:
	count(SS_COUNTER_THROTTLED);
	count_tenant(slot, SS_COUNTER_THROTTLED);
	return XDP_PASS;
}

/* The one entry program: a datagram to a stream's port (ss_ports value with SS_PORT_STREAM)
 * goes to the stream engine, everything else to the KV path. ss_config.enabled switches the KV
 * cache only: stream state lives in the kernel, so streams must not flip to user space. */
SEC("xdp")
int slipstream_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	__u32 l4_off, udp_len;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return XDP_PASS;
		if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
			return ss_kv_packet(ctx);
		if (ip->frag_off & bpf_htons(0x3fff))
			return ss_kv_packet(ctx);
		__u32 tot = bpf_ntohs(ip->tot_len);
		if (tot < sizeof(*ip) + sizeof(struct udphdr))
			return ss_kv_packet(ctx);
		udp_len = tot - sizeof(*ip);
		l4_off = sizeof(*eth) + sizeof(*ip);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		if (ip6->version != 6 || ip6->nexthdr != IPPROTO_UDP)
			return ss_kv_packet(ctx);
		udp_len = bpf_ntohs(ip6->payload_len);
		l4_off = sizeof(*eth) + sizeof(*ip6);
	} else {
		return ss_kv_packet(ctx);
	}
	struct udphdr *udp = data + l4_off;
	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	__u32 port = bpf_ntohs(udp->dest);
	__u32 *pv = bpf_map_lookup_elem(&ss_ports, &port);
	if (!pv || !(*pv & SS_PORT_STREAM))
		return ss_kv_packet(ctx);
	__u32 slot = *pv & SS_PORT_SLOT_MASK;
	if (bpf_ntohs(udp->len) != udp_len || udp_len < sizeof(struct udphdr))
		return XDP_PASS;
	if ((__u64)l4_off + udp_len > (__u64)(data_end - data))
		return XDP_PASS;
	return ss_stream_packet(ctx, slot, l4_off + sizeof(struct udphdr), udp_len - sizeof(struct udphdr));
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
