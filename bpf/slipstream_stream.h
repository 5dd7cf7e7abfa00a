/* SPDX-License-Identifier: Apache-2.0 */
/*
 * slipstream_stream.h: what the XDP stream engine (bpf/xdp_stream.h, run from the one entry
 * program in bpf/xdp_fastpath.c) and user space (crates/fastpath/src/stream.rs, Rust mirror
 * with compile-time size/offset asserts) share: map names, limits, layouts.
 *
 * Not for: program logic, or the KV cache's maps (slipstream_kv.h).
 *
 * Fixed point: the kernel has no floats. A decimal text value is parsed into an integer count
 * of micro-units (SS_FIXED_SCALE = 10^6 per unit): exactly representable are values with at
 * most 6 significant fractional digits (further digits must be 0) and |value| <= 10^8
 * (SS_FIXED_ABS_MAX micro-units), no exponent, not "-0". Anything else that is a well-formed
 * number is NOT rounded: the datagram goes to user space (see xdp_stream.h for what that means
 * per operator). Binary (little-endian f64) datagrams always go to user space.
 */
#ifndef SLIPSTREAM_STREAM_H
#define SLIPSTREAM_STREAM_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* ---- map names ---- */
/* ss_ports      (slipstream_kv.h) value SS_PORT_STREAM | stream slot = a stream's UDP port     */
/* ss_streams    BPF_MAP_TYPE_ARRAY, SS_STREAMS_MAX entries, value ss_stream (config)          */
/* ss_sstats     BPF_MAP_TYPE_PERCPU_ARRAY, SS_STREAMS_MAX entries, value ss_stream_stats       */
/* ss_wc         BPF_MAP_TYPE_PERCPU_HASH, SS_WC_ENTRIES, key ss_wc_key, value __u64 count      */
/* ss_wcc        BPF_MAP_TYPE_ARRAY (BPF_F_MMAPABLE), one entry per possible CPU (user space    */
/*               sets max_entries at load), value ss_wcc_table (SS_WCC_SLOTS ss_wcc_slot): the */
/*               word-count cache in front of ss_wc (see ss_wcc_slot)                          */
/* ss_cp         BPF_MAP_TYPE_ARRAY, SS_STREAMS_MAX entries, value ss_cp_state (spin lock)     */
/* ss_events     BPF_MAP_TYPE_RINGBUF, SS_RINGBUF_BYTES: ss_alert and ss_values records        */
/* ss_sscratch   BPF_MAP_TYPE_PERCPU_ARRAY, 1 entry, value ss_sscratch (program-private)       */

/* ---- limits ---- */
#define SS_STREAMS_MAX 64
/* ss_ports value flag: the port belongs to stream slot (value & SS_PORT_SLOT_MASK). Tenant
 * values are 1..=SS_TENANTS_MAX, so the two never collide. */
#define SS_PORT_STREAM 0x80000000u
#define SS_PORT_SLOT_MASK 0xffffu
/* Longest word the kernel counts (bytes of the map key); longer: datagram to user space. */
#define SS_WORD_KEY_BYTES 32
/* Longest datagram payload the kernel parses (power of two, for masking); longer: user space. */
#define SS_STREAM_PAYLOAD_MAX 2048
/* Most words / numbers per datagram the kernel handles; more: user space. */
#define SS_WORDS_MAX 1024
#define SS_VALUES_MAX 256
/* Distinct (stream, window, word) entries in ss_wc; full: the datagram goes to user space. */
#define SS_WC_ENTRIES 65536
/* Word-count cache slots per CPU (power of two): two-way, a word's hash picks a pair. */
#define SS_WCC_SLOTS 4096
#define SS_WCC_SLOT_BITS 12
/* Slots a word may use (two-way): the pair (i, i ^ 1) shares a cache line. */
#define SS_WCC_WAYS 2
/* Longest word the cache holds (a 32-byte slot, two to a cache line); longer words, up to
 * SS_WORD_KEY_BYTES, are counted in ss_wc. Every word of the benchmarks is shorter. */
#define SS_WCC_WORD_BYTES 16
/* A slot's tag packs (window + 1) << SS_WCC_TAG_WINDOW_SHIFT | stream << SS_WCC_TAG_STREAM_SHIFT
 * | len, so one compare checks all three. Windows from SS_WCC_WINDOW_END on (window + 1 would
 * not fit the tag's top 40 bits; with window_ms >= 1 that is after 34 years of uptime) are
 * counted in ss_wc. */
#define SS_WCC_TAG_WINDOW_SHIFT 24
#define SS_WCC_TAG_STREAM_SHIFT 8
#define SS_WCC_TAG_LEN_MASK 0xffu
#define SS_WCC_WINDOW_END ((1ULL << (64 - SS_WCC_TAG_WINDOW_SHIFT)) - 1)
/* Multipliers of ss_wcc_hash (odd 64-bit constants: golden ratio and a murmur3 finalizer's). */
#define SS_WCC_MUL1 0x9e3779b97f4a7c15ULL
#define SS_WCC_MUL2 0xc4ceb9fe1a85ec53ULL
/* Change point in kernel: most reference windows and history values (more: user engine). */
#define SS_CP_REF_MAX 64
#define SS_CP_HISTORY_MAX 1024
/* Fixed point: micro-units, |v| <= 10^8 units. */
#define SS_FIXED_SCALE 1000000
#define SS_FIXED_ABS_MAX 100000000000000LL
/* Window sums of a change-point stream stay below this (else the stream moves to user space). */
#define SS_CP_SUM_ABS_MAX (1LL << 61)
#define SS_RINGBUF_BYTES (4 << 20)
/* Values per ss_values ring-buffer record. */
#define SS_VALUES_BATCH SS_VALUES_MAX

/* ss_stream.op */
#define SS_OP_NONE 0       /* slot unused: pass */
#define SS_OP_WORDCOUNT 1  /* counted in ss_wc */
#define SS_OP_CHANGEPOINT 2 /* reference rule in ss_cp, alerts in ss_events */
#define SS_OP_VALUES 3     /* parsed values shipped in ss_events (aggregate, filter) */

/* ss_stream.format */
#define SS_FORMAT_AUTO 0
#define SS_FORMAT_TEXT 1
#define SS_FORMAT_BINARY 2

struct ss_stream {
	__u32 op;
	__u32 user_only;        /* 1: pass every datagram (user space took the stream over) */
	__u64 window_ns;
	__u32 word_bytes_max;   /* <= SS_WORD_KEY_BYTES */
	__u32 records_max;      /* records per datagram (more: user space) */
	__u32 reference_windows; /* 1..=SS_CP_REF_MAX */
	__u32 history;          /* 0..=SS_CP_HISTORY_MAX */
	__u64 threshold_n;      /* threshold in 10^-9 units */
	__u32 format;
	__u32 pad0;
};                          /* 48 bytes */

/* Per-CPU, cumulative; user space sums the CPUs. */
struct ss_stream_stats {
	__u64 datagrams;    /* consumed in the kernel (XDP_DROP) */
	__u64 records;      /* records counted / tested / shipped by the kernel */
	__u64 malformed;    /* malformed records the kernel skipped (numeric streams) */
	__u64 passed;       /* datagrams passed to user space (XDP_PASS) */
	__u64 alerts;       /* change-point alerts sent */
	__u64 events_lost;  /* ring-buffer records that could not be sent (ring full) */
	__u64 pad0;
	__u64 pad1;
};                      /* 64 bytes */

struct ss_wc_key {
	__u64 window;       /* t_ns / window_ns */
	__u32 stream;
	__u32 len;
	__u8 word[SS_WORD_KEY_BYTES]; /* zero padded */
};                      /* 48 bytes */

/* One word-count cache slot (words of at most SS_WCC_WORD_BYTES). CPU c's program owns the
 * table ss_wcc[c], slots [c * SS_WCC_SLOTS, (c + 1) * SS_WCC_SLOTS) of the mapping: it counts a word of the current window in
 * whichever of the two slots its hash picks (SS_WCC_WAYS) has that tag and word (window,
 * stream, len, word), else claims the first empty one of the two (tag 0: word and count
 * first, then the tag with an atomic add, so a reader that sees the tag sees the word), and
 * otherwise counts in ss_wc. Only user space
 * empties a slot: when it drains a window that has ended, it takes the count (atomic swap to
 * 0) and then sets the tag to 0. The program never writes a slot whose tag is another window,
 * so a slot's word is stable while user space reads it; a window's count is the sum of its
 * cache slots (all CPUs) and its ss_wc entry (wrapping: the undo of a datagram may decrement
 * the other place). */
struct ss_wcc_slot {
	__u64 tag;          /* see SS_WCC_TAG_WINDOW_SHIFT; 0: empty */
	__u64 count;
	__u8 word[SS_WCC_WORD_BYTES]; /* zero padded */
};                      /* 32 bytes: two slots per 64-byte cache line */

/* One CPU's slots: the value of ss_wcc (the mapping is the tables of CPU 0, 1, ... in turn). */
struct ss_wcc_table {
	struct ss_wcc_slot slot[SS_WCC_SLOTS];
};

struct ss_cp_state {
	struct bpf_spin_lock lock;
	__u32 mode;         /* 0: kernel, 1: user space took over (everything passes) */
	__u64 high_t_ns;    /* event clock: never goes back */
	__u64 cur_window;   /* current window number + 1; 0: none open */
	__s64 cur_sum;      /* micro-units */
	__u64 cur_count;
	__u32 ring_len;     /* window means in the reference ring */
	__u32 ring_head;    /* next slot written; oldest = (head + N - len) % N */
	__s64 ref_sum_n;    /* sum of ring_mean_n */
	__u32 hist_len;
	__u32 hist_head;    /* next slot written */
	__s64 ring_sum[SS_CP_REF_MAX];    /* window sums, micro-units */
	__u64 ring_count[SS_CP_REF_MAX];
	__s64 ring_mean_n[SS_CP_REF_MAX]; /* sum / count in 10^-9 units, truncated */
	__s64 hist[SS_CP_HISTORY_MAX];    /* raw values, micro-units */
};

/* Ring-buffer record header. */
#define SS_EV_ALERT 1
#define SS_EV_VALUES 2
struct ss_ev_hdr {
	__u32 type;
	__u32 stream;
	__u64 t_ns;
};                      /* 16 bytes */

/* A change-point alert: the state as the alerting value left it (before the re-arm), rings
 * raw (user space orders them oldest first with the heads and lengths). */
struct ss_alert {
	struct ss_ev_hdr hdr;
	__s64 value;        /* micro-units */
	__u32 ring_len;
	__u32 ring_head;
	__u32 hist_len;
	__u32 hist_head;
	__u32 reference_windows;
	__u32 history;
	__s64 ring_sum[SS_CP_REF_MAX];
	__u64 ring_count[SS_CP_REF_MAX];
	__s64 hist[SS_CP_HISTORY_MAX];
};

/* Parsed values of one datagram, in order. */
struct ss_values {
	struct ss_ev_hdr hdr;
	__u32 n;
	__u32 pad0;
	__s64 v[SS_VALUES_BATCH]; /* micro-units */
};

/* Program-private per-CPU scratch. */
struct ss_sscratch {
	__u8 payload[SS_STREAM_PAYLOAD_MAX + 64]; /* + room for 8-byte reads near the end */
	__u16 tstart[SS_WORDS_MAX];
	__u16 tlen[SS_WORDS_MAX];
	struct ss_alert alert;
	struct ss_values vals;
	/* Loop state of the parser / counter in use (xdp_stream.h): here rather than on the
	 * stack, which the KV path already nearly fills. */
	__u64 work[16];
};

/* ---- layout checks (see the same block in slipstream_kv.h) ---- */
_Static_assert(sizeof(struct ss_stream) == 48, "ss_stream: 48 bytes");
_Static_assert(sizeof(struct ss_stream_stats) == 64, "ss_stream_stats: 64 bytes");
_Static_assert(sizeof(struct ss_wc_key) == 16 + SS_WORD_KEY_BYTES, "ss_wc_key: no padding");
_Static_assert(sizeof(struct ss_wcc_slot) == 32, "ss_wcc_slot: two per cache line");
_Static_assert(__builtin_offsetof(struct ss_wcc_slot, word) % 8 == 0, "ss_wcc_slot: word read as u64s");
_Static_assert(SS_WCC_SLOTS == (1 << SS_WCC_SLOT_BITS), "cache slots: a power of two");
_Static_assert(sizeof(struct ss_wcc_table) == SS_WCC_SLOTS * 32, "ss_wcc_table: the slots, no padding");
_Static_assert(SS_WCC_WAYS == 2 && SS_WCC_SLOTS % SS_WCC_WAYS == 0, "a slot pair (i, i ^ 1) stays in one CPU's slots");
_Static_assert(64 % (SS_WCC_WAYS * sizeof(struct ss_wcc_slot)) == 0, "a slot pair fits one cache line");
_Static_assert(SS_WORD_KEY_BYTES == 32, "wc_key builds the key from four 8-byte words");
_Static_assert(SS_WCC_WORD_BYTES == 16, "ss_wcc_hash mixes two 8-byte words");
_Static_assert(SS_WCC_WORD_BYTES <= SS_WCC_TAG_LEN_MASK && SS_STREAMS_MAX <= 256, "len and stream fit the tag");
_Static_assert(SS_WCC_TAG_WINDOW_SHIFT >= SS_WCC_TAG_STREAM_SHIFT + 8, "tag fields do not overlap");
_Static_assert(sizeof(struct ss_cp_state) == 64 + SS_CP_REF_MAX * 24 + SS_CP_HISTORY_MAX * 8, "ss_cp_state layout");
_Static_assert(sizeof(struct ss_ev_hdr) == 16, "ss_ev_hdr: 16 bytes");
_Static_assert(__builtin_offsetof(struct ss_alert, ring_sum) == 48, "ss_alert: rings after the 48-byte head");
_Static_assert(__builtin_offsetof(struct ss_values, v) == 24, "ss_values: values after the 24-byte head");
_Static_assert((SS_STREAM_PAYLOAD_MAX & (SS_STREAM_PAYLOAD_MAX - 1)) == 0, "payload bound is a power of two (masking)");
_Static_assert(SS_STREAMS_MAX <= SS_PORT_SLOT_MASK + 1, "stream slots fit the port value");
_Static_assert(SS_VALUES_BATCH >= SS_VALUES_MAX, "one datagram's values fit one record");

#endif /* SLIPSTREAM_STREAM_H */
