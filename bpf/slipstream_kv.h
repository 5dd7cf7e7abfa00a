/* SPDX-License-Identifier: Apache-2.0 */
/*
 * slipstream_kv.h: the single source of truth for what the XDP fast path (bpf/xdp_fastpath.c)
 * and user space (crates/fastpath, Rust mirror with compile-time size/offset asserts) share:
 * map names, limits, and the layout of map keys and values.
 *
 * Not for: program logic. Any change here must be mirrored in crates/fastpath/src/abi.rs; the
 * Rust side asserts sizes and offsets at compile time, so a mismatch fails the build.
 *
 * Only fixed-width types, explicit padding, all fields naturally aligned: the layout is the same
 * for the BPF target and x86_64/aarch64 user space.
 */
#ifndef SLIPSTREAM_KV_H
#define SLIPSTREAM_KV_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* ---- map names (the ELF symbol names user space looks up) ---- */
/* ss_items     BPF_MAP_TYPE_HASH, BPF_F_NO_PREALLOC, key ss_key, value ss_item              */
/* ss_config    BPF_MAP_TYPE_ARRAY, 1 entry, value ss_config                                   */
/* ss_counters  BPF_MAP_TYPE_PERCPU_ARRAY, SS_COUNTER_COUNT entries, value __u64               */
/* ss_ports     BPF_MAP_TYPE_ARRAY, SS_PORTS entries (index = UDP port, host order),
 *              value __u32: tenant slot + 1, 0 = not a memcached port (pass)                  */
/* ss_tenants   BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE, SS_TENANTS_MAX entries, value ss_tenant   */
/* ss_tstats    BPF_MAP_TYPE_PERCPU_ARRAY, SS_TENANTS_MAX entries, value ss_tenant_stats      */
/* ss_scratch   BPF_MAP_TYPE_PERCPU_ARRAY, 1 entry, value ss_scratch (program-private)        */
/* ss_readers   BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE, SS_READER_CPUS_MAX entries (index = CPU),
 *              value ss_reader                                                                */

/* ---- limits ---- */
/* memcached's KEY_MAX_LENGTH. */
#define SS_KEY_BYTES_MAX 250
/* memcached's UDP_MAX_PAYLOAD_SIZE (1400) minus the 8-byte frame header: the most reply bytes one
 * datagram carries. A reply that would need more is passed to user space. */
#define SS_FRAME_HEADER_BYTES 8
#define SS_REPLY_PAYLOAD_BYTES_MAX 1392
/* Bytes of pre-composed reply text per item (see struct ss_item). An item whose `gets` form plus
 * "END\r\n" exceeds SS_REPLY_PAYLOAD_BYTES_MAX is not cached, so 1424 always suffices:
 * gets-form <= 1387 and the meta prefix "VA <n> f<flags>" <= 22 bytes. */
#define SS_PIECE_BYTES_MAX 1424
/* Most keys in one get/gets request the kernel answers; more go to user space. */
#define SS_KEYS_MAX 8
/* Longest request payload (after the frame header) the kernel parses; power of two (masking). */
#define SS_REQUEST_BYTES_MAX 2048
/* Default number of cached items (user space may configure another). */
#define SS_ENTRIES_DEFAULT 16384
/* Most tenants (slots 0..SS_TENANTS_MAX-1) the fast path serves, each on its own UDP port. */
#define SS_TENANTS_MAX 64
/* CPUs whose item readers ss_readers tracks (index = CPU id); a program running on a CPU at or
 * past it answers nothing from ss_items (passes). */
#define SS_READER_CPUS_MAX 1024
/* Entries of ss_ports: one per UDP port number. An array indexed by port (256 KiB) rather than
 * a hash keyed by it: every UDP packet on the interface pays this lookup, and an array lookup is
 * a bounds check and an add (the JIT inlines it), a hash lookup hashes and walks a bucket. */
#define SS_PORTS 65536

/* ---- counters: indexes into ss_counters ---- */
#define SS_COUNTER_HITS 0   /* get-like requests answered by XDP_TX */
#define SS_COUNTER_MISSES 1 /* get-like requests passed to user space */
#define SS_COUNTER_THROTTLED 2 /* get-like requests of a shaped tenant passed to user space
				* because its allowance could not pay for them */
#define SS_COUNTER_COUNT 4  /* slot 3 reserved */

/*
 * Map key: a 64-bit hash of the key bytes plus their length, so the kernel's own hash over the
 * map key covers 16 bytes instead of a 260-byte zero-padded buffer. Two keys may share a map key
 * (a hash collision): the value holds the full key (in segment A, "VALUE <key> ..."), and the
 * program compares it with the requested key, so a mismatch is a miss, never a wrong answer. A
 * fill of a colliding key just replaces the other (a miss later, never a stale read), and
 * deleting the entry at a hash removes whatever key is there (again only a miss).
 *
 * ss_key_hash (computed in XDP over the key bytes in the request, and in user space, see
 * crates/fastpath/src/abi.rs; both must agree bit for bit):
 *   h = SS_HASH_SEED ^ (len * SS_HASH_MUL)
 *   for each 8-byte word w of the key (little-endian; the last one zero-padded):
 *     h = (h ^ w) * SS_HASH_MUL;  h ^= h >> 32
 * Test vectors (asserted by the Rust side; the kernel fixtures check XDP agrees):
 *   "key:00000001" -> SS_HASH_TEST_1, "a" -> SS_HASH_TEST_2.
 */
#define SS_HASH_SEED 0x736c697073747265ULL /* "slipstre" */
#define SS_HASH_MUL 0x9e3779b97f4a7c15ULL
#define SS_KEY_WORDS_MAX 32 /* ceil(SS_KEY_BYTES_MAX / 8) */
#define SS_HASH_TEST_1 0x5fc65e179e0ccb65ULL
#define SS_HASH_TEST_2 0xdcef489f533e2bfaULL
/*
 * The tenant's slot is part of the map key: the program fills it from the port the request came
 * to (ss_ports), user space from the tenant whose store filled the item, so an item filled for
 * one tenant can never be found by a request to another tenant's port.
 */
struct ss_key {
	__u64 hash;
	__u32 len;    /* 1..=SS_KEY_BYTES_MAX */
	__u32 tenant; /* slot, 0..SS_TENANTS_MAX-1 */
};                /* 16 bytes */

/*
 * Map value: one item's reply text, pre-composed by user space, in five segments laid out back to
 * back in `piece` in this order:
 *   D "VA <bytes>"                      (meta get prefix)
 *   E " f<flags>"                       (meta get `f` flag)
 *   A "VALUE <key> <flags> <bytes>"     (get/gets prefix)
 *   B " <cas>"                          (gets only)
 *   C "\r\n<data>\r\n"                  (the data block, shared by all forms)
 * so each reply form is at most two copies: get = A,C; gets = A+B+C; mg v = D,C; mg v f = D+E,C.
 *
 * csum_*: each segment's 16-bit ones'-complement sum, precomputed by user space so the program
 * never sums reply bytes per packet. Memory order: the segment read as native-endian 16-bit
 * words from its first byte, an odd last byte as if followed by a zero byte, folded to 16 bits
 * (0 for an empty segment). A segment that lands at an odd offset of the UDP datagram adds the
 * byte-swapped sum (ones'-complement sums commute with byte swapping, RFC 1071).
 */
struct ss_item {
	__u64 expiry_ns;   /* absolute CLOCK_MONOTONIC (bpf_ktime_get_ns) ns; 0 = never expires */
	__u64 epoch;       /* ss_config.epoch + ss_tenant.epoch of its slot when filled (wrapping
			    * sum); any other value = flushed = miss. Both epochs only grow, so a
			    * bump of either (flush of everything, flush of one tenant) changes the
			    * sum for good. */
	__u16 d_len;
	__u16 e_len;
	__u16 a_len;
	__u16 b_len;
	__u16 c_len;
	__u16 csum_d;
	__u16 csum_e;
	__u16 csum_a;
	__u16 csum_b;
	__u16 csum_c;
	__u16 pad0;
	__u16 pad1;
	__u8 piece[SS_PIECE_BYTES_MAX];
};                 /* 40 + 1424 = 1464 bytes */

struct ss_config {
	__u16 enabled;     /* 0 = fast path off: every packet passes (the last resort) */
	__u16 pad0;
	__u32 pad1;
	__u64 epoch;       /* flush epoch: bumping it invalidates every cached item at once */
};                 /* 16 bytes */

/*
 * One tenant slot. The map is BPF_F_MMAPABLE: user space maps it and reads and writes the
 * fields with atomic operations, so it can take the spent counters (atomic exchange with 0) and
 * set allowances while the program updates them on other CPUs, without losing an update.
 *
 * Shaping (only when `shaped`): a get-like request is answered only if allow_in_bytes >= its
 * request bytes and allow_out_bytes >= its reply bytes; then both are reduced by those bytes and
 * the spent_* counters grow. Otherwise it is passed to user space (which shapes it), counted in
 * SS_COUNTER_THROTTLED. The check and the subtraction are not one atomic step, so concurrent
 * CPUs may overdraw an allowance by at most one reply each; user space charges what was spent
 * to the tenant's token buckets (which allow debt) and hands out the next allowance.
 * Request bytes: the memcached request after the 8-byte frame header; reply bytes: the reply
 * after the frame header (what the user-space executor reads and writes for the same request).
 * An unshaped tenant (single-tenant mode) is answered with no allowance checks and no spent_*
 * counting (so no shared cache line is written per packet).
 */
struct ss_tenant {
	__u32 active;           /* 0 = slot unused: pass */
	__u32 shaped;
	__u64 epoch;            /* per-tenant flush epoch (see ss_item.epoch) */
	__s64 allow_in_bytes;   /* may go below 0 by concurrent overdraw */
	__s64 allow_out_bytes;
	__u64 spent_requests;   /* answered since user space last took them */
	__u64 spent_in_bytes;
	__u64 spent_out_bytes;
	__u64 pad0;
};                          /* 64 bytes: one cache line per tenant */

/*
 * Readers of ss_items on one CPU, for user space's grace period. Since Linux 6.1 an element
 * freed from a BPF_F_NO_PREALLOC hash (a delete, or the old element of an update) can be reused
 * at once by the next insert, while a program that looked it up earlier is still copying it: it
 * would send another key's item, or a mix of two. So the program counts itself in `active`
 * (an atomic add, a full barrier, before its first lookup; an atomic subtract after its last
 * read of an item), and user space, after freeing elements and before its next insert, waits
 * until it has seen `active` at 0 on every CPU (crates/fastpath, `ReuseGate`): every program
 * that could still hold a freed element has finished, later ones cannot find it. A counter, not
 * a flag: a program interrupted on its CPU by another one (nested runs) keeps it above 0.
 */
struct ss_reader {
	__u64 active;           /* programs on this CPU between their first lookup and last read */
	__u64 pad[7];
};                          /* 64 bytes: one cache line per CPU */

/* Per-tenant per-CPU counters (cumulative; user space sums the CPUs). */
struct ss_tenant_stats {
	__u64 hits;             /* answered by XDP_TX */
	__u64 misses;           /* get-like, passed up (not in cache, not answerable) */
	__u64 throttled;        /* get-like, passed up for lack of allowance */
	__u64 pad0;
};                          /* 32 bytes */

/* Program-private per-CPU scratch (not read by user space; layout here only for its size). */
#define SS_SCRATCH_REPLY_BYTES 4096
#define SS_SCRATCH_HDR_BYTES 64
struct ss_scratch {
	/* the request payload, copied out of the packet. The program reads the request in 8-byte
	 * words, and a word starting near the end of req may run into hdr (those bytes are masked
	 * off), which keeps the read inside the map value. */
	__u8 req[SS_REQUEST_BYTES_MAX];
	/* The reply's Ethernet and IP headers, composed before the packet is resized, right-aligned
	 * so that they end where reply starts: headers and reply then go into the packet with one
	 * store. (Here, not on the stack: the program's stack is near the verifier's limit.) */
	__u8 hdr[SS_SCRATCH_HDR_BYTES];
	__u8 reply[SS_SCRATCH_REPLY_BYTES]; /* UDP header + frame header + reply payload */
};

/* ---- layout checks: what the comments above promise, checked by every compiler that reads
 * this header (the BPF build and the host probe that generates the Rust mirror, see
 * crates/fastpath/build.rs), so the two targets cannot disagree silently. ---- */
_Static_assert(sizeof(struct ss_key) == 16, "ss_key: 16 bytes, no padding");
_Static_assert(sizeof(struct ss_item) == 40 + SS_PIECE_BYTES_MAX, "ss_item: 40-byte header + piece");
_Static_assert(__builtin_offsetof(struct ss_item, piece) == 40, "ss_item: piece after the 40-byte header");
_Static_assert(sizeof(struct ss_config) == 16, "ss_config: 16 bytes");
_Static_assert(sizeof(struct ss_tenant) == 64, "ss_tenant: one cache line");
_Static_assert(__builtin_offsetof(struct ss_tenant, allow_in_bytes) % 8 == 0, "ss_tenant: atomics aligned");
_Static_assert(sizeof(struct ss_tenant_stats) == 32, "ss_tenant_stats: 32 bytes");
_Static_assert(sizeof(struct ss_reader) == 64, "ss_reader: one cache line per CPU");
_Static_assert(SS_KEY_WORDS_MAX * 8 >= SS_KEY_BYTES_MAX, "the hash reads every key byte");
_Static_assert((SS_REQUEST_BYTES_MAX & (SS_REQUEST_BYTES_MAX - 1)) == 0, "request bound is a power of two (masking)");
_Static_assert(SS_PIECE_BYTES_MAX >= SS_REPLY_PAYLOAD_BYTES_MAX + 32, "a cacheable gets form plus the meta prefix fit");
_Static_assert(SS_SCRATCH_REPLY_BYTES >= 16 + SS_REPLY_PAYLOAD_BYTES_MAX, "UDP + frame header + payload fit the scratch reply");
_Static_assert(SS_COUNTER_THROTTLED < SS_COUNTER_COUNT, "counter slots");

#endif /* SLIPSTREAM_KV_H */
