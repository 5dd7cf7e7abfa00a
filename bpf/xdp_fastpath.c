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
 * Where things are: the one L2-L4 parse in parse_udp.h; the KV path's request parsing in
 * kv_request.h, reply building and checksums in kv_reply.h, counters and tenant charging in
 * kv_tenant.h; the stream engine in xdp_stream.h. This file holds the maps, the KV path's plan
 * (ss_kv_packet) and the entry program.
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
#include "parse_udp.h"
#include "word_bytes.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* No preallocation: memory grows with use. A freed element may be reused at once by the
	 * next insert (Linux >= 6.1), so readers count themselves in ss_readers and user space
	 * waits for them before it inserts again (see struct ss_reader). */
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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	/* User space maps it to read every CPU's readers during its grace period. */
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, SS_READER_CPUS_MAX);
	__type(key, __u32);
	__type(value, struct ss_reader);
} ss_readers SEC(".maps");

#include "xdp_stream.h"
#include "kv_tenant.h"
#include "kv_request.h"
#include "kv_reply.h"

/* Resizes the packet to exactly the reply of `pos` bytes after the UDP header's offset (dropping
 * any Ethernet padding): at the tail if the buffer has tailroom there, else at the head (veth
 * hands small skbs over with little tailroom but XDP_PACKET_HEADROOM in front). 0 ok, -1
 * neither (leave it to user space). */
static __always_inline int ss_kv_resize(struct xdp_md *ctx, __u32 l4_off, __u32 pos)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__s32 delta = (__s32)(l4_off + pos) - (__s32)(data_end - data);
	if (!bpf_xdp_adjust_tail(ctx, delta))
		return 0;
	if (delta <= 0 || bpf_xdp_adjust_head(ctx, -delta))
		return -1;
	return 0;
}

/* Headers and reply into the packet in one store (they are adjacent in scratch). Cannot fail
 * after ss_kv_resize: the packet is exactly this long. XDP_TX, or XDP_DROP if it did. */
static __always_inline int ss_kv_store(struct xdp_md *ctx, struct ss_scratch *s, __u32 v6, __u32 pos)
{
	__u64 out_len = pos;
	asm volatile("%0 &= 2047" : "+r"(out_len)); /* no-op (pos <= REPLY_END); for the verifier */
	if (out_len == 0)
		return XDP_DROP;
	OPAQUE(out_len); /* keeps clang from merging the two checks into one range test */
	if (out_len > REPLY_END)
		return XDP_DROP;
	if (v6) {
		if (bpf_xdp_store_bytes(ctx, 0, s->hdr + HDR6_AT, HDR6_BYTES + out_len))
			return XDP_DROP;
	} else {
		if (bpf_xdp_store_bytes(ctx, 0, s->hdr + HDR4_AT, HDR4_BYTES + out_len))
			return XDP_DROP;
	}
	return XDP_TX;
}

/* The KV cache and tenants (every UDP datagram not to a stream's port). The plan: tenant of the
 * port -> request -> reply from the items -> checksum -> payment -> headers -> resize and send.
 * Not inlined: its frame is near the verifier's stack limit, so the entry below stays small and
 * the stream engine gets a call chain of its own. */
static __noinline int ss_kv_packet(struct xdp_md *ctx, __u32 l4_off, __u32 udp_len, __u32 port, __u64 asum)
{
	/* The parse's result comes as scalars (BPF calls take at most 5 arguments): the verifier
	 * keeps the bounds of register arguments, not of values read back from the caller's stack.
	 * IPv6 is the only parse whose UDP header sits past Ethernet + 20 bytes. */
	__u32 v6 = l4_off > ETH_HLEN + sizeof(struct iphdr);
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;

	struct ss_config *cfg = bpf_map_lookup_elem(&ss_config, &zero);
	if (!cfg || cfg->enabled == 0)
		return XDP_PASS;
	/* Which tenant's port (if any): the slot selects its keys, epoch and allowance. */
	__u32 *slot_plus1 = bpf_map_lookup_elem(&ss_ports, &port);
	if (!slot_plus1 || *slot_plus1 == 0)
		return XDP_PASS;
	__u32 slot = *slot_plus1 - 1;
	struct ss_tenant *ten = bpf_map_lookup_elem(&ss_tenants, &slot);
	if (!ten || !ten->active)
		return XDP_PASS;
	__u64 epoch = cfg->epoch + ten->epoch;
	if (udp_len < sizeof(struct udphdr) + SS_FRAME_HEADER_BYTES + 4)
		return XDP_PASS;
	struct udphdr *udp = data + l4_off;
	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	__u16 sport = udp->source, dport = udp->dest;

	struct ss_scratch *s = bpf_map_lookup_elem(&ss_scratch, &zero);
	if (!s)
		return XDP_PASS;
	__u32 pay_off = l4_off + sizeof(struct udphdr) + SS_FRAME_HEADER_BYTES;
	__u32 n = udp_len - sizeof(struct udphdr) - SS_FRAME_HEADER_BYTES;
	__u32 load = n > SS_REQUEST_BYTES_MAX ? SS_REQUEST_BYTES_MAX : n;
	if (load < 4)
		return XDP_PASS;
	/* ((load - 1) & 2047) + 1 is load itself (4..2048), in a form whose bound the verifier sees
	 * on the very register passed: it does not connect the checks above with every copy clang
	 * makes of n. */
	__u32 size = load - 1;
	asm volatile("%0 &= 2047" : "+r"(size));
	size += 1;
	if (bpf_xdp_load_bytes(ctx, pay_off, s->req, size))
		return XDP_PASS;
	if (!ss_kv_getlike(s, load))
		return XDP_PASS;
	if (ss_tenant_broke(ten, n))
		goto throttled;

	/* From here on every exit that does not answer is a counted miss. */
	struct kv_req r = {};
	if (ss_kv_parse(s, (void *)(udp + 1), data_end, n, &r))
		goto miss;
	__u32 cpu = bpf_get_smp_processor_id();
	struct ss_reader *rd = bpf_map_lookup_elem(&ss_readers, &cpu);
	if (!rd)
		goto miss;
	/* The fetching forms are full barriers on every JIT (x86 lock xadd, arm64 ldaddal): the
	 * count is visible before the lookups, and the reads are done before it drops. */
	if (__sync_fetch_and_add(&rd->active, 1) > SS_READER_CPUS_MAX) {
		__sync_fetch_and_sub(&rd->active, 1); /* never expected: runs do not nest this deep */
		goto miss;
	}
	__u64 psum = 0;
	__u32 pos = ss_kv_items(s, &r, slot, epoch, &psum);
	if (__sync_fetch_and_sub(&rd->active, 1) == 0)
		goto miss; /* unreachable: our own add is still counted */
	if (pos == 0)
		goto miss;
	ss_kv_udp_header(s, pos, sport, dport, r.request_id, asum, psum);
	/* Pay before the packet is touched, so a request the tenant cannot pay for still goes up
	 * unchanged. */
	__s64 in_bytes = n, out_bytes = pos - REPLY_PAYLOAD_OFF;
	if (ss_tenant_pay(ten, in_bytes, out_bytes))
		goto throttled;
	if (ss_kv_l2l3(s, data, data_end, v6, pos) || ss_kv_resize(ctx, l4_off, pos)) {
		ss_tenant_refund(ten, in_bytes, out_bytes); /* not answered after all */
		goto miss;
	}
	int verdict = ss_kv_store(ctx, s, v6, pos);
	if (verdict == XDP_TX)
		count_both(slot, SS_COUNTER_HITS);
	return verdict;

miss:
	count_both(slot, SS_COUNTER_MISSES);
	return XDP_PASS;

throttled:
	count_both(slot, SS_COUNTER_THROTTLED);
	return XDP_PASS;
}

/* The one entry program: one parse of the headers, then a datagram to a stream's port (ss_ports
 * value with SS_PORT_STREAM) goes to the stream engine, every other UDP datagram to the KV path,
 * anything else passes. ss_config.enabled switches the KV cache only: stream state lives in the
 * kernel, so streams must not flip to user space. */
SEC("xdp")
int slipstream_xdp(struct xdp_md *ctx)
{
	struct ss_udp u;
	if (!ss_parse_udp(ctx, &u))
		return XDP_PASS;
	__u32 port = u.dport;
	__u32 *pv = bpf_map_lookup_elem(&ss_ports, &port);
	if (!pv || !(*pv & SS_PORT_STREAM))
		return ss_kv_packet(ctx, u.l4_off, u.udp_len, port, u.asum);
	__u32 slot = *pv & SS_PORT_SLOT_MASK;
	return ss_stream_packet(ctx, slot, u.l4_off + sizeof(struct udphdr), u.udp_len - sizeof(struct udphdr));
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
