// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * xdp_pass.c: a do-nothing XDP program (XDP_PASS). Tests attach it to the client-side veth,
 * because a veth only delivers frames its peer bounced with XDP_TX when it has an XDP program
 * itself. Not for production use.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int slipstream_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
