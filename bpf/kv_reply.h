/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * kv_reply.h: building a KV reply in the per-CPU scratch: each key's item found and verified
 * (the map key is only a hash), its pre-composed segments copied in the request's form, "END"
 * for get/gets, the UDP and frame headers, the UDP checksum from the items' precomputed segment
 * sums (no pass over the reply bytes), and the reply's Ethernet and IP headers.
 *
 * Not for: parsing the request (kv_request.h) or paying for the answer (kv_tenant.h).
 * Included by xdp_fastpath.c after its maps and kv_request.h.
 */
#ifndef SLIPSTREAM_KV_REPLY_H
#define SLIPSTREAM_KV_REPLY_H

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

/* The item of key req[kstart..kstart+klen] in tenant `slot`, if it is there, of this flush
 * epoch, not expired (*now: read once, on the first item with an expiry) and really this key's
 * (the map key is only a hash). NULL otherwise. */
static __always_inline struct ss_item *ss_kv_find(struct ss_scratch *s, __u32 kstart, __u32 klen,
						   __u32 slot, __u64 epoch, __u64 *now)
{
	if (klen < 1 || klen > SS_KEY_BYTES_MAX)
		return NULL;
	/* ss_key_hash (see slipstream_kv.h), over the key bytes in req. */
	struct ss_key key = { .hash = ss_key_hash(s, kstart, klen), .len = klen, .tenant = slot };
	struct ss_item *it = bpf_map_lookup_elem(&ss_items, &key);
	if (!it || it->epoch != epoch)
		return NULL;
	if (it->expiry_ns != 0) {
		if (*now == 0)
			*now = bpf_ktime_get_ns();
		if (*now >= it->expiry_ns)
			return NULL;
	}
	__u32 d = it->d_len, e = it->e_len, a = it->a_len, b = it->b_len, c = it->c_len;
	if (d + e + a + b + c > SS_PIECE_BYTES_MAX)
		return NULL;
	/* Segment A is "VALUE <key> ...", and keys hold no ' ', so the key bytes followed by ' '
	 * at offset d + e + 6 identify the item exactly. */
	if (a < 6 + klen + 1 || !ss_key_matches(s, it, kstart, klen, d + e + 6))
		return NULL;
	return it;
}

/* Appends item it's reply in `mode` at s->reply[pos..], adding the copied segments' sums to
 * *psum. Returns the new end, or 0 if it (and, for get/gets, the closing "END\r\n") would not
 * fit the datagram or a copy failed. */
static __always_inline __u32 ss_kv_copy_item(struct ss_scratch *s, struct ss_item *it, __u32 mode,
					      __u32 pos, __u64 *psum)
{
	__u32 d = it->d_len, e = it->e_len, a = it->a_len, b = it->b_len, c = it->c_len;
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
	if (pos + need + 5 > REPLY_END)
		return 0;
	struct bpf_dynptr dp;
	if (bpf_dynptr_from_mem(it->piece, sizeof(it->piece), 0, &dp))
		return 0;
	__u32 c_off = d + e + a + b;
	int err = 0;
	switch (mode) {
	case MODE_GET:
		err |= copy_seg(s, pos, it, &dp, d + e, a);
		*psum += seg_sum(it->csum_a, pos);
		pos += a;
		break;
	case MODE_GETS:
		err |= copy_seg(s, pos, it, &dp, d + e, a + b);
		*psum += seg_sum(it->csum_a, pos) + seg_sum(it->csum_b, pos + a);
		pos += a + b;
		break;
	case MODE_MG_V:
		err |= copy_seg(s, pos, it, &dp, 0, d);
		*psum += seg_sum(it->csum_d, pos);
		pos += d;
		break;
	default:
		err |= copy_seg(s, pos, it, &dp, 0, d + e);
		*psum += seg_sum(it->csum_d, pos) + seg_sum(it->csum_e, pos + d);
		pos += d + e;
		break;
	}
	if (pos > REPLY_END)
		return 0;
	err |= copy_seg(s, pos, it, &dp, c_off, c);
	*psum += seg_sum(it->csum_c, pos);
	pos += c;
	if (err || pos > REPLY_END)
		return 0;
	return pos;
}

/* Copies the reply text of every key of r into s->reply from REPLY_PAYLOAD_OFF, adding each
 * copied segment's sum to *psum. Returns the end offset, or 0 when a key misses (absent, another
 * epoch, expired, a hash collision) or the reply would not fit one datagram. */
static __always_inline __u32 ss_kv_items(struct ss_scratch *s, struct kv_req *r, __u32 slot,
					  __u64 epoch, __u64 *psum)
{
	__u64 now = 0;
	__u32 pos = REPLY_PAYLOAD_OFF;
	for (__u32 k = 0; k < SS_KEYS_MAX; k++) {
		if (k >= r->nkeys)
			break;
		__u32 ti = (k + 1) & (TOK_SLOTS - 1);
		struct ss_item *it = ss_kv_find(s, r->t.tstart[ti], r->t.tlen[ti], slot, epoch, &now);
		if (!it)
			return 0;
		pos = ss_kv_copy_item(s, it, r->mode, pos, psum);
		if (pos == 0)
			return 0;
	}
	if (r->mode == MODE_GET || r->mode == MODE_GETS) {
		if (pos + 5 > REPLY_END)
			return 0;
		put_byte(s, pos + 0, 'E');
		put_byte(s, pos + 1, 'N');
		put_byte(s, pos + 2, 'D');
		put_byte(s, pos + 3, '\r');
		put_byte(s, pos + 4, '\n');
		*psum += seg_sum(END_SUM, pos);
		pos += 5;
	}
	if (pos > REPLY_END)
		return 0;
	return pos;
}

/* The reply's UDP header (ports swapped, length pos) and frame header (the request's id,
 * sequence 0 of 1), and the UDP checksum: pseudo-header + headers + payload, ones' complement,
 * memory order throughout (16-bit words as loaded from memory; the sum is stored the same way).
 * The payload's part is psum, summed from the items' precomputed segment sums. */
static __always_inline void ss_kv_udp_header(struct ss_scratch *s, __u32 pos, __u16 sport, __u16 dport,
					      __u16 request_id, __u64 asum, __u64 psum)
{
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
	__u16 len_be = bpf_htons((__u16)pos);
	__u64 sum = psum + asum; /* 32-bit words: fold() makes them 16-bit ones' sums */
	sum += bpf_htons(IPPROTO_UDP) + len_be;                   /* pseudo-header: protocol, length */
	sum += dport + sport + len_be;                            /* UDP header (checksum 0) */
	sum += request_id + bpf_htons(1);                         /* frame header: id, total 1 */
	__u16 ucheck = (__u16)~fold(sum);
	if (ucheck == 0)
		ucheck = 0xffff;
	ru->check = ucheck;
}

/* Composes the reply's Ethernet and IP headers in scratch from the request's (addresses
 * swapped), placed to end where s->reply starts (IPv6: Ethernet at hdr + HDR6_AT; IPv4: at
 * hdr + HDR4_AT). Done before the packet is resized: the resize may move the packet start,
 * after which the request headers are gone. 0 ok, -1 the headers are not in the packet. */
static __always_inline int ss_kv_l2l3(struct ss_scratch *s, struct ethhdr *eth, void *data_end,
				      __u32 v6, __u32 pos)
{
	if ((void *)(eth + 1) > data_end)
		return -1;
	__u8 *he = s->hdr + (v6 ? HDR6_AT : HDR4_AT);
	__builtin_memcpy(he, eth->h_source, ETH_ALEN);
	__builtin_memcpy(he + ETH_ALEN, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(he + 2 * ETH_ALEN, &eth->h_proto, 2);
	if (v6) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return -1;
		struct ipv6hdr *o6 = (void *)(s->hdr + HDR6_AT + ETH_HLEN);
		__builtin_memcpy(o6, ip6, sizeof(*o6)); /* keeps version, traffic class, flow label */
		__builtin_memcpy(&o6->saddr, &ip6->daddr, 16);
		__builtin_memcpy(&o6->daddr, &ip6->saddr, 16);
		o6->payload_len = bpf_htons((__u16)pos);
		o6->hop_limit = 64;
	} else {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return -1;
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
	return 0;
}

#endif /* SLIPSTREAM_KV_REPLY_H */
