/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * kv_tenant.h: what the KV path counts and charges per tenant: the global and per-tenant
 * hit/miss/throttled counters, and paying for an answer from a shaped tenant's allowance (see
 * struct ss_tenant in slipstream_kv.h for the rules user space and the program share).
 *
 * Not for: deciding whether a request is answerable (kv_request.h, kv_reply.h).
 * Included by xdp_fastpath.c after its maps are defined.
 */
#ifndef SLIPSTREAM_KV_TENANT_H
#define SLIPSTREAM_KV_TENANT_H

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

/* Both counters of an outcome: the interface's and the tenant's. */
static __always_inline void count_both(__u32 slot, __u32 idx)
{
	count(idx);
	count_tenant(slot, idx);
}

/* A shaped tenant whose allowance cannot pay even for the request (or any reply): pass it up
 * before spending work on it (user space queues and shapes it). */
static __always_inline int ss_tenant_broke(struct ss_tenant *ten, __u32 in_bytes)
{
	return ten->shaped && (ten->allow_in_bytes < (__s64)in_bytes || ten->allow_out_bytes <= 0);
}

/* Pays for an answer of `out` reply bytes to a request of `in` bytes: 0 paid (or unshaped),
 * -1 the allowance cannot pay (nothing changed). */
static __always_inline int ss_tenant_pay(struct ss_tenant *ten, __s64 in, __s64 out)
{
	if (!ten->shaped)
		return 0;
	if (ten->allow_in_bytes < in || ten->allow_out_bytes < out)
		return -1;
	__sync_fetch_and_add(&ten->allow_in_bytes, -in);
	__sync_fetch_and_add(&ten->allow_out_bytes, -out);
	__sync_fetch_and_add(&ten->spent_requests, 1);
	__sync_fetch_and_add(&ten->spent_in_bytes, in);
	__sync_fetch_and_add(&ten->spent_out_bytes, out);
	return 0;
}

/* Gives back what ss_tenant_pay took, for an answer that could not be sent after all. */
static __always_inline void ss_tenant_refund(struct ss_tenant *ten, __s64 in, __s64 out)
{
	if (!ten->shaped)
		return;
	__sync_fetch_and_add(&ten->allow_in_bytes, in);
	__sync_fetch_and_add(&ten->allow_out_bytes, out);
	__sync_fetch_and_add(&ten->spent_requests, -1);
	__sync_fetch_and_add(&ten->spent_in_bytes, -in);
	__sync_fetch_and_add(&ten->spent_out_bytes, -out);
}

#endif /* SLIPSTREAM_KV_TENANT_H */
