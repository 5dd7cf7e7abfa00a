/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * kv_request.h: reading a memcached UDP request in the KV path: is it get-like, its frame header
 * (one datagram only), exactly one line, memcached's ' ' tokenizer (word at a time), which form
 * it is (get, gets, mg v, mg v f) and the key hash (ss_key_hash, shared with user space through
 * slipstream_kv.h).
 *
 * Not for: the cache lookup or the reply (kv_reply.h). Included by xdp_fastpath.c after its maps.
 */
#ifndef SLIPSTREAM_KV_REQUEST_H
#define SLIPSTREAM_KV_REQUEST_H

#include "word_bytes.h"

/* Tokens a request may have: command + SS_KEYS_MAX keys (mg: command, key, <= 2 flags). */
#define TOK_MAX (SS_KEYS_MAX + 1)
#define TOK_SLOTS 16 /* power of two >= TOK_MAX, for index masking */
#define REQ_MASK (SS_REQUEST_BYTES_MAX - 1)
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
	return has_byte(x, ' ') || has_byte(x, '\n');
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

/* The key loops (here and in kv_reply.h) are global (separately verified) functions: inlined
 * into the per-key loop their up-to-32 iterations multiplied the verifier's states past its
 * limit. ss_key_hash over req[kstart..kstart+klen] (see slipstream_kv.h). */
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

/* A request as the reply builder needs it. */
struct kv_req {
	struct tok_ctx t;  /* t.tstart/t.tlen[1..=nkeys]: the keys */
	__u32 mode;        /* enum mode */
	__u32 nkeys;
	__u16 request_id;  /* frame header id, memory order (echoed as is) */
};

/* 1 iff the payload starts with "get ", "gets " or "mg ": only those count as hits or misses. */
static __always_inline int ss_kv_getlike(struct ss_scratch *s, __u32 load)
{
	return (s->req[0] == 'g' && s->req[1] == 'e' && s->req[2] == 't' &&
		(s->req[3] == ' ' || (s->req[3] == 's' && load > 4 && s->req[4] == ' '))) ||
	       (s->req[0] == 'm' && s->req[1] == 'g' && s->req[2] == ' ');
}

/* Splits req[0..n) (the line without its "\r\n") into tokens: "get <key>" by one scan, anything
 * else with the general tokenizer. 0 ok, -1 not a request the kernel answers. */
static __always_inline int ss_kv_tokenize(struct ss_scratch *s, __u32 n, struct tok_ctx *t)
{
	t->s = s;
	t->n = n;
	/* "get <key>" / "gets <key>" (getlike checked the command and its space). */
	__u32 key_at = s->req[3] == ' ' ? 4 : 5;
	if (s->req[0] == 'g' && ss_one_token(s, key_at, n)) {
		t->ntok = 2;
		t->tlen[0] = (__u16)(key_at - 1);
		t->tstart[1] = (__u16)key_at;
		t->tlen[1] = (__u16)(n - key_at);
	} else {
		bpf_loop(SS_REQUEST_BYTES_MAX / 8, tok_step, t, 0);
		if (t->bad)
			return -1;
		if (t->in_tok)
			close_token(t, t->n);
	}
	if (t->bad || t->ntok < 2 || t->tstart[0] != 0)
		return -1;
	return 0;
}

/* The form of a tokenized request: get/gets with 1..SS_KEYS_MAX keys, or mg <key> with exactly
 * v, v f or f v. 0 ok (r->mode, r->nkeys set), -1 otherwise. */
static __always_inline int ss_kv_form(struct ss_scratch *s, struct kv_req *r)
{
	struct tok_ctx *t = &r->t;
	__u32 cmd_len = t->tlen[0];
	if (cmd_len == 3 && s->req[2] == 't') {
		r->mode = MODE_GET;
		r->nkeys = t->ntok - 1;
	} else if (cmd_len == 4 && s->req[3] == 's') {
		r->mode = MODE_GETS;
		r->nkeys = t->ntok - 1;
	} else if (cmd_len == 2 && s->req[1] == 'g') {
		r->nkeys = 1;
		if (t->ntok == 3) {
			if (t->tlen[2] != 1 || s->req[t->tstart[2] & REQ_MASK] != 'v')
				return -1;
			r->mode = MODE_MG_V;
		} else if (t->ntok == 4) {
			if (t->tlen[2] != 1 || t->tlen[3] != 1)
				return -1;
			__u8 f1 = s->req[t->tstart[2] & REQ_MASK];
			__u8 f2 = s->req[t->tstart[3] & REQ_MASK];
			if (!((f1 == 'v' && f2 == 'f') || (f1 == 'f' && f2 == 'v')))
				return -1;
			r->mode = MODE_MG_VF;
		} else {
			return -1;
		}
	} else {
		return -1;
	}
	if (r->nkeys < 1 || r->nkeys > SS_KEYS_MAX)
		return -1;
	return 0;
}

/* The request in s->req[0..n), frame header at fh (inside the packet below data_end): one
 * datagram, exactly one line ending in "\r\n", a get-like form. 0 ok (*r filled), -1 a miss. */
static __always_inline int ss_kv_parse(struct ss_scratch *s, __u8 *fh, void *data_end, __u32 n,
				       struct kv_req *r)
{
	if (n > SS_REQUEST_BYTES_MAX)
		return -1;
	if ((void *)(fh + SS_FRAME_HEADER_BYTES) > data_end)
		return -1;
	if (fh[2] != 0 || fh[3] != 0 || fh[4] != 0 || fh[5] != 1)
		return -1;
	r->request_id = *(__u16 *)fh;
	__u32 cr = n - 2, lf = n - 1;
	/* The masks in a form clang cannot drop as redundant with n's bound (the verifier may not
	 * connect that bound with a copy of n it reloads). */
	asm volatile("%0 &= 2047" : "+r"(cr));
	asm volatile("%0 &= 2047" : "+r"(lf));
	if (s->req[cr] != '\r' || s->req[lf] != '\n')
		return -1;
	if (ss_kv_tokenize(s, n - 2, &r->t))
		return -1;
	return ss_kv_form(s, r);
}

#endif /* SLIPSTREAM_KV_REQUEST_H */
