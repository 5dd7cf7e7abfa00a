/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * parse_udp.h: the one L2-L4 parse of the entry program (xdp_fastpath.c). Ethernet, then IPv4
 * without options and not fragmented, or IPv6 with UDP as the next header, then a UDP header
 * whose length agrees with the IP length and lies inside the packet. Both services (the KV
 * cache and the stream engine) start from its result, so headers are read once per packet.
 *
 * Not for: ports, tenants or payloads (the services decide what a port means).
 */
#ifndef SLIPSTREAM_PARSE_UDP_H
#define SLIPSTREAM_PARSE_UDP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

/* A UDP datagram the parse accepted. */
struct ss_udp {
	__u32 l4_off;   /* offset of the UDP header from the packet start */
	__u32 udp_len;  /* UDP header + payload bytes (== udp->len, inside the packet) */
	__u32 v6;       /* 1: IPv6 (l4_off 54), 0: IPv4 (l4_off 34) */
	__u32 dport;    /* destination port, host order */
	__u64 asum;     /* the addresses' part of the UDP checksum (pseudo-header), memory order */
};

/* 1 iff the packet is a UDP datagram as described above (filling *u); 0: not one (pass). */
static __always_inline int ss_parse_udp(struct xdp_md *ctx, struct ss_udp *u)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return 0;
		if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
			return 0;
		if (ip->frag_off & bpf_htons(0x3fff)) /* MF or fragment offset */
			return 0;
		__u32 tot = bpf_ntohs(ip->tot_len);
		if (tot < sizeof(*ip) + sizeof(struct udphdr))
			return 0;
		u->udp_len = tot - sizeof(*ip);
		u->l4_off = sizeof(*eth) + sizeof(*ip);
		u->v6 = 0;
		u->asum = (__u64)ip->daddr + ip->saddr;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > data_end)
			return 0;
		if (ip6->version != 6 || ip6->nexthdr != IPPROTO_UDP)
			return 0;
		u->udp_len = bpf_ntohs(ip6->payload_len);
		u->l4_off = sizeof(*eth) + sizeof(*ip6);
		u->v6 = 1;
		__u64 asum = 0;
#pragma unroll
		for (int i = 0; i < 4; i++)
			asum += (__u64)ip6->daddr.in6_u.u6_addr32[i] + ip6->saddr.in6_u.u6_addr32[i];
		u->asum = asum;
	} else {
		return 0;
	}
	struct udphdr *udp = data + u->l4_off;
	if ((void *)(udp + 1) > data_end)
		return 0;
	if (bpf_ntohs(udp->len) != u->udp_len || u->udp_len < sizeof(struct udphdr))
		return 0;
	if ((__u64)u->l4_off + u->udp_len > (__u64)(data_end - data))
		return 0;
	u->dport = bpf_ntohs(udp->dest);
	return 1;
}

#endif /* SLIPSTREAM_PARSE_UDP_H */
