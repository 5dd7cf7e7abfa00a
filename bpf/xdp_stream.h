/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * xdp_stream.h: the stream offload engine of issue 5 in XDP, included by xdp_fastpath.c (one
 * entry program per interface; it dispatches a UDP port marked SS_PORT_STREAM in ss_ports to
 * ss_stream_packet). Layouts and limits: slipstream_stream.h.
 *
 * Every datagram to a stream port ends in exactly one of two ways, both counted per stream in
 * ss_sstats: consumed by the kernel (XDP_DROP, `datagrams`) or passed unchanged to the daemon's
 * UDP socket (XDP_PASS, `passed`), where the user-space engine parses it. Nothing is lost
 * silently; malformed records the kernel skips are counted in `malformed`.
 *
 * - wordcount: words (split on space, \t, \n, \r, \v, \f, as crates/stream record.rs) are
 *   counted keyed by (window = t_ns / window_ns, stream, word): a word of at most
 *   SS_WCC_WORD_BYTES in one of its two slots (one cache line) of this CPU's two-way cache
 *   ss_wcc when a slot holds that key or is empty, any other in ss_wc. A datagram is counted
 *   whole or not at all: a byte >= 0x80 (user space must check UTF-8), a word longer than
 *   word_bytes_max, too many words, or a full map (counts already made are undone) pass it up.
 *   User space drains finished windows and merges what it parsed itself.
 * - changepoint (reference rule): one value at a time under the stream's spin lock, exactly
 *   the rules of crates/stream changepoint.rs in fixed point (see the header); an alert copies
 *   the state into a ring-buffer record. A datagram the kernel cannot take exactly (binary,
 *   non-representable number, too long, too many values) switches the stream to user space
 *   for good (`mode` = 1, then every datagram passes): user space takes over the state, so
 *   there is never a split state.
 * - values (aggregate, filter): the datagram's values go to user space in one ring-buffer
 *   record; anything not representable passes the datagram up instead.
 *
 * The clock is bpf_ktime_get_ns (CLOCK_MONOTONIC), the user-space engine's clock.
 */
#ifndef XDP_STREAM_H
#define XDP_STREAM_H

#include "slipstream_stream.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SS_STREAMS_MAX);
	__type(key, __u32);
	__type(value, struct ss_stream);
} ss_streams SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SS_STREAMS_MAX);
	__type(key, __u32);
	__type(value, struct ss_stream_stats);
} ss_sstats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, SS_WC_ENTRIES);
	__type(key, struct ss_wc_key);
	__type(value, __u64);
} ss_wc SEC(".maps");

/* The word-count cache in front of ss_wc (struct ss_wcc_slot says who writes what): one
 * element per CPU, that CPU's table, looked up once per datagram (a slot is then an offset from
 * it: no lookup per word, and nothing for clang to keep across a call). User space maps it to
 * drain without a system call per slot. max_entries is set at load to the possible CPUs; the
 * value here only makes the object loadable as it is. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ss_wcc_table);
} ss_wcc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SS_STREAMS_MAX);
	__type(key, __u32);
	__type(value, struct ss_cp_state);
} ss_cp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SS_RINGBUF_BYTES);
} ss_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ss_sscratch);
} ss_sscratch SEC(".maps");

#define SPAY_MASK (SS_STREAM_PAYLOAD_MAX - 1)
#define SWORD_MASK (SS_WORDS_MAX - 1)
#define SVAL_MASK (SS_VALUES_MAX - 1)

/* bpf_loop's context must be on the stack; it only carries pointers (the scratch, and for word
 * count this CPU's cache table), and the loop state lives in s->work (a map value may not hold
 * pointers). */
struct loop_arg {
	struct ss_sscratch *s;
	struct ss_wcc_table *wcc;
};
#define WORK(s, T) ((T *)(void *)(s)->work)

/* ---------------- word count ---------------- */

struct wc_tok_ctx {
	__u32 n;
	__u32 in_word;
	__u32 wstart;
	__u32 nwords;
	__u32 bad;
	__u32 maxlen;
	__u32 maxwords;
};

static __always_inline void wc_close(struct ss_sscratch *s, struct wc_tok_ctx *x, __u32 end)
{
	__u32 len = end - x->wstart;
	x->in_word = 0;
	if (len > x->maxlen || x->nwords >= x->maxwords) {
		x->bad = 1;
		return;
	}
	__u32 i = x->nwords & SWORD_MASK;
	s->tstart[i] = (__u16)x->wstart;
	s->tlen[i] = (__u16)len;
	x->nwords += 1;
}

/* The high bit of each byte of v that is a word separator (' ', \t, \n, \v, \f, \r), exact
 * per byte (no carry crosses a byte). Only for v with no byte >= 0x80: then b ^ ' ' + 0x7f
 * has its high bit clear iff b is a space, and the 9..13 test is "hasbetween" (141 - b has
 * its high bit set iff b <= 13, b + 119 iff b >= 9). */
static __always_inline __u64 wc_sep_mask(__u64 v)
{
	__u64 space = ~((v ^ (ONES * ' ')) + ONES * 0x7f) & HIGHS;
	__u64 ctl = ((ONES * (127 + 14)) - v) & ~v & (v + ONES * (127 - 8)) & HIGHS;
	return space | ctl;
}

/* Eight payload bytes per call, read as one word (one bpf_loop callback per byte cost more
 * than the byte work), and no branch per byte: the separator mask gives the bytes where a word
 * starts (a non-separator after a separator) and ends (the reverse), and the loop visits only
 * those, in order (at most 8; the live profile found the byte-by-byte version ~13% of the
 * receive thread, most of it per-byte branches). Bytes past the payload count as separators,
 * so a word running to the end is closed there. Returns nonzero to stop. */
static long wc_tok_step(__u32 w, void *c)
{
	struct ss_sscratch *s = ((struct loop_arg *)c)->s;
	struct wc_tok_ctx *x = WORK(s, struct wc_tok_ctx);
	__u32 base = w * 8;
	__u32 n = x->n;
	if (base >= n) {
		if (x->in_word)
			wc_close(s, x, n);
		return 1;
	}
	__u64 v = *(__u64 *)(s->payload + (base & SPAY_MASK));
	__u32 lim = n - base;
	__u64 valid = lim >= 8 ? ~0ULL : (1ULL << (lim * 8)) - 1;
	v &= valid;
	if (v & HIGHS) {
		x->bad = 1; /* user space checks UTF-8 */
		return 1;
	}
	__u64 sep = wc_sep_mask(v) | (~valid & HIGHS);
	__u64 word = ~sep & HIGHS;
	/* "the byte before is a separator / in a word", for byte 0 from the previous step */
	__u64 before_sep = (sep << 8) | (x->in_word ? 0 : 0x80);
	__u64 before_word = (word << 8) | (x->in_word ? 0x80 : 0);
	__u64 starts = word & before_sep;
	__u64 edges = starts | (sep & before_word);
	for (__u32 j = 0; j < 8; j++) {
		if (!edges)
			break;
		__u64 low = edges & -edges;
		/* byte index of the lowest edge: (1 << 8k) times bytes 07 06 .. 00 puts k in the top byte */
		__u32 at = base + (__u32)(((low >> 7) * 0x0001020304050607ULL) >> 56);
		if (low & starts) {
			x->in_word = 1;
			x->wstart = at;
		} else {
			wc_close(s, x, at);
			if (x->bad)
				return 1;
		}
		edges &= edges - 1;
	}
	return lim < 8; /* bytes past the payload were separators: any word was closed above */
}

struct wc_count_ctx {
	__u64 window;
	__u32 stream;
	__u32 nwords;
	__u32 done;   /* words counted so far */
	__u32 failed; /* 1: the map could not take a word */
	__s64 delta;  /* +1 count, -1 undo */
};

static __always_inline void wc_key(struct ss_sscratch *s, struct wc_count_ctx *x, __u32 i, struct ss_wc_key *k)
{
	__u32 idx = i & SWORD_MASK;
	__u32 start = s->tstart[idx];
	__u32 len = s->tlen[idx];
	k->window = x->window;
	k->stream = x->stream;
	k->len = len;
#pragma unroll
	for (__u32 j = 0; j < SS_WORD_KEY_BYTES / 8; j++) {
		__u64 w = 0;
		if (len > j * 8) {
			__u32 off = (start + j * 8) & SPAY_MASK;
			w = *(__u64 *)(s->payload + off);
			__u32 rem = len - j * 8;
			if (rem < 8)
				w &= (1ULL << (rem * 8)) - 1;
		}
		*(__u64 *)(k->word + j * 8) = w;
	}
}

/* Word i's bytes as the cache holds them: two zero-padded 8-byte words (only for len <=
 * SS_WCC_WORD_BYTES; bytes past the word are masked off, never compared). */
static __always_inline void wc_short_word(struct ss_sscratch *s, __u32 start, __u32 len, __u64 *w0, __u64 *w1)
{
	__u64 a = *(__u64 *)(s->payload + (start & SPAY_MASK));
	__u64 b = 0;
	if (len < 8) {
		a &= (1ULL << (len * 8)) - 1;
	} else if (len > 8) {
		b = *(__u64 *)(s->payload + ((start + 8) & SPAY_MASK));
		if (len < 16)
			b &= (1ULL << ((len - 8) * 8)) - 1;
	}
	*w0 = a;
	*w1 = b;
}

/* 1 iff slot c holds (tag, w0, w1): that window, stream, length and word. */
static __always_inline int wc_slot_holds(struct ss_wcc_slot *c, __u64 tag, __u64 w0, __u64 w1)
{
	__u64 *cw = (__u64 *)c->word;
	return c->tag == tag && cw[0] == w0 && cw[1] == w1;
}

/* Claims the empty slot c for (tag, w0, w1) with a count of 1; 0 if it is not empty. */
static __always_inline int wc_slot_claim(struct ss_wcc_slot *c, __u64 tag, __u64 w0, __u64 w1)
{
	if (c->tag != 0)
		return 0;
	__u64 *cw = (__u64 *)c->word;
	cw[0] = w0;
	cw[1] = w1;
	c->count = 1;
	/* Publish last, as a locked add (a full barrier where the JIT emits one): whoever sees
	 * the tag sees the word. Nobody else writes a slot whose tag is 0. */
	__sync_fetch_and_add(&c->tag, tag);
	return 1;
}

/* Counts (delta +1) or undoes (-1) a word of at most SS_WCC_WORD_BYTES in this CPU's cache:
 * 1 if done there, 0 if the word goes to ss_wc. The cache is two-way: the word's hash picks a
 * pair of slots that share one 64-byte cache line (SS_WCC_WAYS), so a second word hashed to
 * the same place costs no further cache miss and does not fall back to the hash map (the live
 * profile of the one-way cache found ~7% of the receive thread in ss_wc's lookup). Both slots
 * are checked for the word before either is claimed; a count is never split by this, and where
 * it could be (a drain between two datagrams), the drain sums every place anyway. The second way
 * also serves a window change: until the daemon drains an ended window (5 ms after its end,
 * later on a busy host) its words hold their slots, and with one way every word of the new
 * window went to ss_wc meanwhile (a live run of the one-way cache had 370-590 map entries per
 * 1 s window of ~700 distinct words); now it claims the other slot of its pair. An undo finds
 * its word in the pair if the count went there, since only user space empties a slot and only
 * once the window has ended. The pair index mixes the word, stream and length but not the
 * window, so a word keeps its pair from window to window: multiply-xor, top bits of the last
 * product (no loop, no helper). */
static __always_inline int wc_cache_add(struct ss_wcc_table *t, struct wc_count_ctx *x, __u32 len, __u64 w0,
					__u64 w1)
{
	__u64 low = ((__u64)x->stream << SS_WCC_TAG_STREAM_SHIFT) | len;
	__u64 tag = ((x->window + 1) << SS_WCC_TAG_WINDOW_SHIFT) | low;
	__u64 h = ((w0 ^ low) * SS_WCC_MUL1 ^ w1) * SS_WCC_MUL2;
	__u32 idx = (__u32)(h >> (64 - SS_WCC_SLOT_BITS));
	struct ss_wcc_slot *c = &t->slot[idx & (SS_WCC_SLOTS - 1)];
	struct ss_wcc_slot *d = &t->slot[(idx ^ (SS_WCC_WAYS - 1)) & (SS_WCC_SLOTS - 1)];
	struct ss_wcc_slot *hit = 0;
	if (wc_slot_holds(c, tag, w0, w1))
		hit = c;
	else if (wc_slot_holds(d, tag, w0, w1))
		hit = d;
	if (hit) {
		hit->count += x->delta;
		return 1;
	}
	if (x->delta < 0)
		return 0;
	return wc_slot_claim(c, tag, w0, w1) || wc_slot_claim(d, tag, w0, w1);
}

static long wc_count_step(__u32 i, void *c)
{
	struct ss_sscratch *s = ((struct loop_arg *)c)->s;
	struct ss_wcc_table *t = ((struct loop_arg *)c)->wcc;
	struct wc_count_ctx *x = WORK(s, struct wc_count_ctx);
	if (i >= x->nwords)
		return 1;
	__u32 len = s->tlen[i & SWORD_MASK];
	if (len <= SS_WCC_WORD_BYTES && x->window < SS_WCC_WINDOW_END) {
		__u64 w0, w1;
		wc_short_word(s, s->tstart[i & SWORD_MASK], len, &w0, &w1);
		if (wc_cache_add(t, x, len, w0, w1)) {
			x->done = i + 1;
			return 0;
		}
	}
	/* Longer words, later windows, and words whose slot is taken: the hash map. */
	struct ss_wc_key k = {};
	wc_key(s, x, i, &k);
	__u64 *v = bpf_map_lookup_elem(&ss_wc, &k);
	if (v) {
		*v += x->delta;
	} else if (x->delta > 0) {
		__u64 one = 1;
		if (bpf_map_update_elem(&ss_wc, &k, &one, BPF_NOEXIST)) {
			/* Another CPU may have created it meanwhile; else the map is full. */
			v = bpf_map_lookup_elem(&ss_wc, &k);
			if (!v) {
				x->failed = 1;
				return 1;
			}
			*v += 1;
		}
	}
	x->done = i + 1;
	return 0;
}

static __always_inline int ss_wordcount(struct ss_sscratch *s, struct ss_stream *cfg, __u32 slot, __u32 n,
					struct ss_stream_stats *st)
{
	struct loop_arg arg = { .s = s, .wcc = 0 };
	struct wc_tok_ctx *t = WORK(s, struct wc_tok_ctx);
	__builtin_memset(t, 0, sizeof(*t));
	t->n = n;
	t->maxlen = cfg->word_bytes_max;
	if (t->maxlen > SS_WORD_KEY_BYTES)
		t->maxlen = SS_WORD_KEY_BYTES;
	t->maxwords = cfg->records_max;
	if (t->maxwords > SS_WORDS_MAX)
		t->maxwords = SS_WORDS_MAX;
	bpf_loop(SS_STREAM_PAYLOAD_MAX / 8 + 1, wc_tok_step, &arg, 0);
	if (t->bad)
		return XDP_PASS;
	__u32 nwords = t->nwords;
	__u64 window_ns = cfg->window_ns;
	if (window_ns == 0)
		return XDP_PASS;
	__u32 cpu = bpf_get_smp_processor_id();
	arg.wcc = bpf_map_lookup_elem(&ss_wcc, &cpu);
	if (!arg.wcc)
		return XDP_PASS; /* a CPU beyond those user space sized the cache for */
	struct wc_count_ctx *c = WORK(s, struct wc_count_ctx);
	__builtin_memset(c, 0, sizeof(*c));
	c->window = bpf_ktime_get_ns() / window_ns;
	c->stream = slot;
	c->nwords = nwords;
	c->delta = 1;
	bpf_loop(SS_WORDS_MAX, wc_count_step, &arg, 0);
	if (c->failed) {
		/* Undo what this datagram counted: it is counted whole by user space instead. */
		c->nwords = c->done;
		c->delta = -1;
		c->failed = 0;
		bpf_loop(SS_WORDS_MAX, wc_count_step, &arg, 0);
		return XDP_PASS;
	}
	st->records += nwords;
	return XDP_DROP;
}

/* ---------------- numbers ---------------- */

enum { NS_START = 0, NS_INT, NS_FRAC, NS_EXP0, NS_EXPS, NS_EXP, NS_TRAIL, NS_BAD };

struct num_ctx {
	__u32 n;
	__u32 state;
	__u32 neg;
	__u32 digits;    /* mantissa digits seen (int + frac) */
	__u32 frac;      /* fractional digits taken into m */
	__u32 nonrep;    /* well-formed maybe, but not exactly representable */
	__u32 exp_digits;
	__u32 first;     /* first non-blank byte of the line, + 1 (0: none yet) */
	__u32 last;      /* last non-blank byte + 1 */
	__u32 nvals;
	__u32 malformed;
	__u32 overflow;  /* more values than fit */
	__u32 maxvals;
	__u64 m;
};

static __always_inline void num_line_end(struct ss_sscratch *s, struct num_ctx *x)
{
	if (x->first != 0) {
		__u32 len = x->last - (x->first - 1);
		int ok = x->state != NS_BAD && x->digits > 0 && x->state != NS_EXP0 &&
			 x->state != NS_EXPS && len <= 64;
		if (!ok) {
			x->malformed += 1;
		} else if (x->nonrep || x->exp_digits > 0 || (x->neg && x->m == 0)) {
			x->nonrep = 1; /* sticky for the datagram */
		} else if (x->nvals >= x->maxvals) {
			x->overflow = 1;
		} else {
			__u64 m = x->m;
			/* scale up to exactly 6 fractional digits */
			for (__u32 k = 0; k < 6; k++)
				if (k >= x->frac)
					m *= 10;
			if (m > SS_FIXED_ABS_MAX) {
				x->nonrep = 1;
			} else {
				__s64 v = x->neg ? -(__s64)m : (__s64)m;
				s->vals.v[x->nvals & SVAL_MASK] = v;
				x->nvals += 1;
			}
		}
	}
	__u32 keep_nonrep = x->nonrep;
	x->state = NS_START;
	x->neg = 0;
	x->digits = 0;
	x->frac = 0;
	x->exp_digits = 0;
	x->first = 0;
	x->last = 0;
	x->m = 0;
	x->nonrep = keep_nonrep;
}

/* One byte of the number grammar (byte i of the payload). Returns nonzero to stop. */
static __always_inline int num_byte(struct ss_sscratch *s, struct num_ctx *x, __u32 i)
{
	if (i >= x->n) {
		num_line_end(s, x);
		return 1;
	}
	__u8 ch = s->payload[i & SPAY_MASK];
	if (ch == '\n') {
		num_line_end(s, x);
		return (x->nonrep || x->overflow) ? 1 : 0;
	}
	int blank = ch == ' ' || ch == '\t' || ch == '\r';
	if (!blank) {
		if (x->first == 0)
			x->first = i + 1;
		x->last = i + 1;
	}
	__u32 st = x->state;
	int digit = ch >= '0' && ch <= '9';
	if (blank) {
		/* A blank ends the number; it must neither clear a BAD seen before it ("42 -x\r"
		 * is malformed, not 42) nor end an exponent without digits ("1e \n"): both
		 * found by the randomized fixture test. */
		if (st == NS_EXP0 || st == NS_EXPS)
			x->state = NS_BAD; /* "1e " / "1e+ ": the exponent has no digits */
		else if (st != NS_START && st != NS_BAD)
			x->state = NS_TRAIL;
		return 0;
	}
	switch (st) {
	case NS_START:
		if (ch == '+' || ch == '-') {
			x->neg = ch == '-';
			x->state = NS_INT;
			return 0;
		}
		x->state = NS_INT;
		/* fall through */
	case NS_INT:
		if (digit) {
			x->digits += 1;
			if (x->m > SS_FIXED_ABS_MAX)
				x->nonrep = 1; /* keep checking the grammar; the value is out of range */
			else
				x->m = x->m * 10 + (ch - '0');
		} else if (ch == '.') {
			x->state = NS_FRAC;
		} else if (ch == 'e' || ch == 'E') {
			x->state = NS_EXP0;
		} else {
			x->state = NS_BAD;
		}
		return 0;
	case NS_FRAC:
		if (digit) {
			x->digits += 1;
			if (x->frac < 6) {
				if (x->m > SS_FIXED_ABS_MAX)
					x->nonrep = 1;
				else
					x->m = x->m * 10 + (ch - '0');
				x->frac += 1;
			} else if (ch != '0') {
				x->nonrep = 1;
			}
		} else if (ch == 'e' || ch == 'E') {
			x->state = NS_EXP0;
		} else {
			x->state = NS_BAD;
		}
		return 0;
	case NS_EXP0:
		if (ch == '+' || ch == '-') {
			x->state = NS_EXPS;
			return 0;
		}
		/* fall through */
	case NS_EXPS:
	case NS_EXP:
		if (digit) {
			x->exp_digits += 1;
			x->state = NS_EXP;
		} else {
			x->state = NS_BAD;
		}
		return 0;
	default: /* NS_TRAIL, NS_BAD: anything non-blank after the number */
		x->state = NS_BAD;
		return 0;
	}
}

/* Eight payload bytes per bpf_loop step, each exactly as num_byte says: a step per byte
 * cost more in the loop's call than in the byte's work. */
static long num_step(__u32 w, void *c)
{
	struct ss_sscratch *s = ((struct loop_arg *)c)->s;
	struct num_ctx *x = WORK(s, struct num_ctx);
#pragma unroll
	for (__u32 j = 0; j < 8; j++) {
		if (num_byte(s, x, w * 8 + j))
			return 1;
	}
	return 0;
}

/* Parses a text payload into s->vals (micro-units). Returns 0 if every record was either a
 * representable value or malformed (counted in *malformed), nonzero if the datagram must go to
 * user space. */
static __always_inline int ss_parse_numbers(struct ss_sscratch *s, struct ss_stream *cfg, __u32 n, __u32 *nvals,
					    __u32 *malformed)
{
	if (cfg->format == SS_FORMAT_BINARY)
		return 1;
	if (cfg->format == SS_FORMAT_AUTO && n % 8 == 4 && s->payload[0] == 'S' && s->payload[1] == 'S' &&
	    s->payload[2] == 'F' && s->payload[3] == '1')
		return 1;
	struct loop_arg arg = { .s = s, .wcc = 0 };
	struct num_ctx *x = WORK(s, struct num_ctx);
	__builtin_memset(x, 0, sizeof(*x));
	x->n = n;
	x->maxvals = cfg->records_max;
	if (x->maxvals > SS_VALUES_MAX)
		x->maxvals = SS_VALUES_MAX;
	bpf_loop(SS_STREAM_PAYLOAD_MAX / 8 + 1, num_step, &arg, 0);
	if (x->nonrep || x->overflow)
		return 1;
	*nvals = x->nvals;
	*malformed = x->malformed;
	return 0;
}

/* ---------------- change point ---------------- */

struct cp_ctx {
	struct ss_sscratch *s;
	struct ss_cp_state *cp;
	struct ss_stream *cfg;
	__u64 t;
	__u32 nvals;
	__u32 slot;
	__u32 pass;     /* the stream is (now) user space's: pass the datagram */
	__u32 alerts;
	__u32 lost;
	__s64 dgram_abs;
};

static __always_inline __s64 mean_n(__s64 sum, __u64 count)
{
	if (count == 0)
		return 0;
	__u64 a = sum < 0 ? (__u64)(-sum) : (__u64)sum;
	__u64 q = a / count, r = a % count;
	__u64 m = q * 1000 + (r * 1000) / count;
	return sum < 0 ? -(__s64)m : (__s64)m;
}

static long cp_step(__u32 i, void *c)
{
	struct cp_ctx *x = c;
	if (i >= x->nvals)
		return 1;
	struct ss_cp_state *cp = x->cp;
	__u32 N = x->cfg->reference_windows;
	__u32 H = x->cfg->history;
	__u64 window_ns = x->cfg->window_ns;
	if (N < 1 || N > SS_CP_REF_MAX || H > SS_CP_HISTORY_MAX || window_ns == 0) {
		x->pass = 1;
		return 1;
	}
	__s64 v = x->s->vals.v[i & SVAL_MASK];
	int alert = 0;
	bpf_spin_lock(&cp->lock);
	if (i == 0) {
		/* The whole datagram is decided here: user space's already, or would the sums grow
		 * out of range (then it becomes user space's now, before anything is applied). */
		__s64 cs = cp->cur_sum < 0 ? -cp->cur_sum : cp->cur_sum;
		if (cp->mode == 0 && cs + x->dgram_abs > SS_CP_SUM_ABS_MAX)
			cp->mode = 1;
		if (cp->mode) {
			bpf_spin_unlock(&cp->lock);
			x->pass = 1;
			return 1;
		}
		if (x->t < cp->high_t_ns)
			x->t = cp->high_t_ns;
		else
			cp->high_t_ns = x->t;
	}
	__u64 t = x->t;
	/* advance: close the current window if t reached its end */
	if (cp->cur_window != 0 && t >= cp->cur_window * window_ns) {
		if (cp->cur_count > 0) {
			__s64 mn = mean_n(cp->cur_sum, cp->cur_count);
			__u32 h = cp->ring_head & (SS_CP_REF_MAX - 1);
			if (cp->ring_len >= N)
				cp->ref_sum_n -= cp->ring_mean_n[h];
			else
				cp->ring_len += 1;
			cp->ring_sum[h] = cp->cur_sum;
			cp->ring_count[h] = cp->cur_count;
			cp->ring_mean_n[h] = mn;
			cp->ref_sum_n += mn;
			cp->ring_head = (h + 1) % N;
		}
		cp->cur_window = 0;
		cp->cur_sum = 0;
		cp->cur_count = 0;
	}
	/* history */
	if (H > 0) {
		__u32 hh = cp->hist_head & (SS_CP_HISTORY_MAX - 1);
		cp->hist[hh] = v;
		cp->hist_head = (hh + 1) % H;
		if (cp->hist_len < H)
			cp->hist_len += 1;
	}
	if (cp->cur_window == 0)
		cp->cur_window = t / window_ns + 1;
	/* test: |v - ref| > threshold  <=>  |v_n * N - ref_sum_n| > threshold_n * N */
	if (cp->ring_len >= N) {
		__s64 vn = v * 1000 * (__s64)N;
		__s64 rs = cp->ref_sum_n;
		__u64 d = vn >= rs ? (__u64)vn - (__u64)rs : (__u64)rs - (__u64)vn;
		if (d > x->cfg->threshold_n * N) {
			alert = 1;
			struct ss_alert *a = &x->s->alert;
			a->hdr.type = SS_EV_ALERT;
			a->hdr.stream = x->slot;
			a->hdr.t_ns = t;
			a->value = v;
			a->ring_len = cp->ring_len;
			a->ring_head = cp->ring_head;
			a->hist_len = cp->hist_len;
			a->hist_head = cp->hist_head;
			a->reference_windows = N;
			a->history = H;
			__builtin_memcpy(a->ring_sum, cp->ring_sum, sizeof(a->ring_sum));
			__builtin_memcpy(a->ring_count, cp->ring_count, sizeof(a->ring_count));
			/* 8 KiB: too big for clang's inline memcpy, and no helper may run under
			 * the lock; 8 values per iteration keep the verifier's walk short. */
			for (__u32 j = 0; j < SS_CP_HISTORY_MAX / 8; j++) {
				__u32 k = j;
				asm volatile("" : "+r"(k));
				k = (k * 8) & (SS_CP_HISTORY_MAX - 8);
				__builtin_memcpy(&a->hist[k], &cp->hist[k], 64);
			}
			/* Re-arm: forget the reference and the partial window. */
			cp->ring_len = 0;
			cp->ring_head = 0;
			cp->ref_sum_n = 0;
			cp->cur_sum = 0;
			cp->cur_count = 0;
		}
	}
	cp->cur_sum += v;
	cp->cur_count += 1;
	bpf_spin_unlock(&cp->lock);
	if (alert) {
		x->alerts += 1;
		if (bpf_ringbuf_output(&ss_events, &x->s->alert, sizeof(struct ss_alert), 0))
			x->lost += 1;
	}
	return 0;
}

static __always_inline int ss_changepoint(struct ss_sscratch *s, struct ss_stream *cfg, __u32 slot, __u32 n,
					  struct ss_stream_stats *st)
{
	struct ss_cp_state *cp = bpf_map_lookup_elem(&ss_cp, &slot);
	if (!cp)
		return XDP_PASS;
	__u32 nvals = 0, malformed = 0;
	if (ss_parse_numbers(s, cfg, n, &nvals, &malformed)) {
		/* Not for the kernel: the stream becomes user space's before this datagram. */
		bpf_spin_lock(&cp->lock);
		cp->mode = 1;
		bpf_spin_unlock(&cp->lock);
		return XDP_PASS;
	}
	struct cp_ctx x = {};
	x.s = s;
	x.cp = cp;
	x.cfg = cfg;
	x.t = bpf_ktime_get_ns();
	x.nvals = nvals;
	x.slot = slot;
	for (__u32 i = 0; i < SS_VALUES_MAX; i++) {
		if (i >= nvals)
			break;
		__s64 v = s->vals.v[i & SVAL_MASK];
		x.dgram_abs += v < 0 ? -v : v;
	}
	if (nvals == 0) {
		/* Only malformed or empty lines: counted, nothing to test. Still user space's if
		 * it took the stream over (its counters must see every datagram). */
		bpf_spin_lock(&cp->lock);
		__u32 mode = cp->mode;
		bpf_spin_unlock(&cp->lock);
		if (mode)
			return XDP_PASS;
	} else {
		bpf_loop(SS_VALUES_MAX, cp_step, &x, 0);
		if (x.pass)
			return XDP_PASS;
	}
	st->records += nvals;
	st->malformed += malformed;
	st->alerts += x.alerts;
	st->events_lost += x.lost;
	return XDP_DROP;
}

static __always_inline int ss_values(struct ss_sscratch *s, struct ss_stream *cfg, __u32 slot, __u32 n,
				     struct ss_stream_stats *st)
{
	__u32 nvals = 0, malformed = 0;
	if (ss_parse_numbers(s, cfg, n, &nvals, &malformed))
		return XDP_PASS;
	if (nvals > 0) {
		s->vals.hdr.type = SS_EV_VALUES;
		s->vals.hdr.stream = slot;
		s->vals.hdr.t_ns = bpf_ktime_get_ns();
		s->vals.n = nvals;
		/* Only the values used are sent: header + n * 8 bytes. */
		__u64 size = sizeof(struct ss_ev_hdr) + 8 + (__u64)(nvals & (SS_VALUES_BATCH * 2 - 1)) * 8;
		if (size > sizeof(struct ss_values))
			return XDP_PASS;
		if (bpf_ringbuf_output(&ss_events, &s->vals, size, 0))
			return XDP_PASS; /* ring full: user space parses it instead */
	}
	st->records += nvals;
	st->malformed += malformed;
	return XDP_DROP;
}

/* Entry from the dispatcher: a UDP datagram to the port of stream `slot`; `pay_off`/`n` locate
 * its payload in the packet. Not inlined: its locals get their own frame (the KV path's
 * frame is near the stack limit). */
static __noinline int ss_stream_packet(struct xdp_md *ctx, __u32 slot, __u32 pay_off, __u32 n)
{
	if (slot >= SS_STREAMS_MAX)
		return XDP_PASS;
	struct ss_stream *cfg = bpf_map_lookup_elem(&ss_streams, &slot);
	struct ss_stream_stats *st = bpf_map_lookup_elem(&ss_sstats, &slot);
	if (!cfg || !st)
		return XDP_PASS;
	int verdict = XDP_PASS;
	__u32 zero = 0;
	struct ss_sscratch *s = bpf_map_lookup_elem(&ss_sscratch, &zero);
	if (!s || cfg->op == SS_OP_NONE || cfg->user_only || n > SS_STREAM_PAYLOAD_MAX)
		goto out;
	if (n > 0) {
		/* n is 1..=2048 here; the asm states that range in a form the verifier tracks
		 * on the very register passed (clang would test a copy). */
		__u64 load = n;
		asm volatile("%0 -= 1; %0 &= 2047; %0 += 1" : "+r"(load));
		if (bpf_xdp_load_bytes(ctx, pay_off, s->payload, load))
			goto out;
	}
	switch (cfg->op) {
	case SS_OP_WORDCOUNT:
		verdict = ss_wordcount(s, cfg, slot, n, st);
		break;
	case SS_OP_CHANGEPOINT:
		verdict = ss_changepoint(s, cfg, slot, n, st);
		break;
	case SS_OP_VALUES:
		verdict = ss_values(s, cfg, slot, n, st);
		break;
	default:
		break;
	}
out:
	if (verdict == XDP_DROP)
		st->datagrams += 1;
	else
		st->passed += 1;
	return verdict;
}

#endif /* XDP_STREAM_H */
