// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * xdp_gen.c: the benchmark traffic generator's two kernel halves (used by
 * `slipstream-loadgen --xdp-gen`, never by the server).
 *
 * ss_gen  runs in BPF_PROG_TEST_RUN "live frames" mode (BPF_F_TEST_XDP_LIVE_FRAMES): the kernel
 *         builds real frames from one template and this program returns XDP_TX, which test_run
 *         turns into a redirect out of the client veth, so frames reach the server veth's XDP
 *         hook (and, on XDP_PASS, its network stack) like frames from a NIC, at millions per
 *         second from one core. A socket sender cannot do that on a 2-core machine: its
 *         per-datagram syscall and skb work cost more than the server's XDP answer. When the
 *         template carries a key, the program rewrites its fixed-width decimal digits per
 *         frame (uniform over `keys`), so the server sees a spread of keys, not one.
 * ss_sink runs on the client veth: it counts the server's UDP replies (frames from
 *         sink_sport), tells hits ("VALUE"/"VA") from misses, and drops them, so counting a
 *         reply costs no socket work on the client core. Everything else passes (ARP, ...).
 *
 * Not for: correctness checking of replies (tests do that with real sockets), or any traffic
 * outside the benchmark's own network namespaces.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "xdp_gen.h"

#define GEN_DIGITS_MAX SS_GEN_DIGITS_MAX
#define GEN_FRAME_BYTES_MAX SS_GEN_FRAME_BYTES_MAX

/* The frames every run starts from. Pages of the test run's pool are recycled with whatever the
 * last user left in them (a server that answers in place writes its reply over the request),
 * so the program writes the whole template back before each send. The test run's frame is as
 * long as the longest template (user space passes that many bytes); shorter ones trim the tail
 * (the kernel restores the frame's length before every run of the program). */
struct gen_template {
	__u32 len; /* bytes of frame used, 14..GEN_FRAME_BYTES_MAX - 1 */
	__u32 pad;
	__u8 frame[GEN_FRAME_BYTES_MAX];
};

struct sink_config {
	__u32 sport; /* UDP source port of the replies to count and drop (host order) */
	__u32 pad;
};

/* Sink counters (per CPU): frames, hit replies, miss replies, bytes. */
#define SINK_FRAMES 0
#define SINK_HITS 1
#define SINK_MISSES 2
#define SINK_BYTES 3
#define SINK_COUNTERS 4

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ss_gen_config);
} gen_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SS_GEN_TEMPLATES_MAX);
	__type(key, __u32);
	__type(value, struct gen_template);
} gen_tpl SEC(".maps");

/* Frames the program has built since it was loaded: frame n is template n mod templates. One
 * sender at a time (the loadgen process), but the add is atomic all the same. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} gen_seq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sink_config);
} sink_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SINK_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} sink_cnt SEC(".maps");

SEC("xdp")
int ss_gen(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct ss_gen_config *c = bpf_map_lookup_elem(&gen_cfg, &zero);
	__u64 *seq = bpf_map_lookup_elem(&gen_seq, &zero);
	if (!c || !seq)
		return XDP_DROP;
	__u32 templates = c->templates;
	__u32 after = c->templates_after;
	if (templates == 0)
		templates = 1;
	if (templates > SS_GEN_TEMPLATES_MAX || after > SS_GEN_TEMPLATES_MAX - templates)
		return XDP_DROP;
	__u64 n = __sync_fetch_and_add(seq, 1);
	__u32 idx;
	if (after > 0 && n >= c->step_frame)
		idx = templates + (__u32)((n - c->step_frame) % after);
	else
		idx = (__u32)(n % templates);
	struct gen_template *t = bpf_map_lookup_elem(&gen_tpl, &idx);
	if (!t)
		return XDP_DROP;
	__u32 len = t->len;
	if (len < 14 || len >= GEN_FRAME_BYTES_MAX)
		return XDP_DROP;
	int have = ctx->data_end - ctx->data;
	if (have != (int)len && bpf_xdp_adjust_tail(ctx, (int)len - have))
		return XDP_DROP; /* a template longer than the test run's frame: user space's error */
	if (bpf_xdp_store_bytes(ctx, 0, t->frame, len))
		return XDP_DROP; /* the frame is the template's length: cannot happen */
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	if (c->key_off == 0 || c->keys == 0)
		return XDP_TX;
	__u32 off = c->key_off, nd = c->key_digits;
	if (off > 1500 || nd == 0 || nd > GEN_DIGITS_MAX)
		return XDP_TX;
	__u32 k = bpf_get_prandom_u32() % c->keys;
	/* The page keeps what the last run wrote, so every digit is written every time. */
#pragma unroll
	for (int i = GEN_DIGITS_MAX - 1; i >= 0; i--) {
		if ((__u32)i >= nd)
			continue;
		__u8 *p = data + off + i;
		if ((void *)(p + 1) > data_end)
			return XDP_TX;
		*p = '0' + k % 10;
		k /= 10;
	}
	return XDP_TX;
}

static __always_inline void bump(__u32 idx, __u64 by)
{
	__u64 *v = bpf_map_lookup_elem(&sink_cnt, &idx);
	if (v)
		*v += by;
}

SEC("xdp")
int ss_sink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct sink_config *c = bpf_map_lookup_elem(&sink_cfg, &zero);
	if (!c)
		return XDP_PASS;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	struct udphdr *udp;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
			return XDP_PASS;
		udp = (void *)(ip + 1);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end || ip6->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		udp = (void *)(ip6 + 1);
	} else {
		return XDP_PASS;
	}
	if ((void *)(udp + 1) > data_end || bpf_ntohs(udp->source) != c->sport)
		return XDP_PASS;
	bump(SINK_FRAMES, 1);
	bump(SINK_BYTES, data_end - data);
	/* memcached frame header (8 bytes), then the reply text. */
	__u8 *t = (void *)(udp + 1) + 8;
	if ((void *)(t + 2) <= data_end && t[0] == 'V' && (t[1] == 'A'))
		bump(SINK_HITS, 1);
	else
		bump(SINK_MISSES, 1);
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
