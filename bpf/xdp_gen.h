/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * xdp_gen.h: the limits the load generator's kernel half (xdp_gen.c) shares with its Rust side
 * (slipstream-fastpath `gen`, through build.rs's header mirror: `abi::header::SS_GEN_*`).
 * Not for: the server's programs.
 */
#ifndef SLIPSTREAM_XDP_GEN_H
#define SLIPSTREAM_XDP_GEN_H

/* Longest run of key digits the generator rewrites. */
#define SS_GEN_DIGITS_MAX 10
/* Longest template frame plus one. */
#define SS_GEN_FRAME_BYTES_MAX 2048
/* Most frame templates, sent round-robin (256 x 2 KiB = 512 KiB of map). */
#define SS_GEN_TEMPLATES_MAX 256

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* The generator's configuration (one entry of gen_cfg). Frame n (the program's own count since
 * load, gen_seq) is template n % templates, or, with a step (templates_after > 0) and
 * n >= step_frame, template templates + (n - step_frame) % templates_after: two template sets
 * switched at a known frame, so user space can stamp the time that frame left (change point). */
struct ss_gen_config {
	__u32 key_off;         /* byte offset of the first key digit in the frame; 0 = no rewrite */
	__u32 key_digits;      /* 1..SS_GEN_DIGITS_MAX */
	__u32 keys;            /* keys 0..keys-1, uniform */
	__u32 templates;       /* templates before the step (all of them without one); 0 counts as 1 */
	__u64 step_frame;      /* first frame of the second set */
	__u32 templates_after; /* templates of the second set; 0: no step */
	__u32 pad0;
};                         /* 32 bytes */

_Static_assert(sizeof(struct ss_gen_config) == 32, "ss_gen_config: no padding");

#endif
