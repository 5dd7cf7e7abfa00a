/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * word_bytes.h: byte tests on 8 bytes at once (SWAR), shared by the KV tokenizer
 * (kv_request.h) and the stream engine's (xdp_stream.h).
 *
 * Not for: anything that needs to know which byte matched.
 */
#ifndef SLIPSTREAM_WORD_BYTES_H
#define SLIPSTREAM_WORD_BYTES_H

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Nonzero iff some byte of x is zero. */
static __always_inline __u64 has_zero_byte(__u64 x)
{
	return (x - ONES) & ~x & HIGHS;
}

/* Nonzero iff some byte of x equals c. */
static __always_inline __u64 has_byte(__u64 x, __u8 c)
{
	return has_zero_byte(x ^ (ONES * c));
}

#endif /* SLIPSTREAM_WORD_BYTES_H */
