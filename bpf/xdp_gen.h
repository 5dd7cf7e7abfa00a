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

#endif
