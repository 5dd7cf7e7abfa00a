//! A pure-Rust model of the XDP program's decision: the same packet and map state in, the same
//! verdict and output packet bytes out. Fixtures run both and demand agreement, so the model is
//! an executable specification of `bpf/xdp_fastpath.c` (and lets tests that cannot load BPF still
//! check what the kernel would answer).
//!
//! Not for: production traffic. It mirrors the C program check for check, including its limits
//! (at most `KEYS_MAX` keys, room for "END\r\n" reserved even for `mg`).

use crate::abi::{Item, FRAME_HEADER_BYTES, KEYS_MAX, KEY_BYTES_MAX, REPLY_PAYLOAD_BYTES_MAX, REQUEST_BYTES_MAX};
use crate::item::segments;
use std::collections::HashMap;

pub use crate::Verdict;

/// What the program did with one packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// The packet after the program (unchanged on PASS).
    pub packet: Vec<u8>,
    /// Counter deltas (global, and the same for the tenant the port belongs to).
    pub hits: u64,
    pub misses: u64,
    pub throttled: u64,
    /// The tenant slot the destination port belongs to, if any.
    pub slot: Option<u32>,
    /// What a shaped tenant paid for this answer: (requests, request bytes, reply bytes),
    /// taken from its allowances and added to its spent counters. Zeros otherwise.
    pub spent: (u64, u64, u64),
}

/// One tenant slot as the model sees it.
#[derive(Clone, Debug, Default)]
pub struct ModelTenant {
    pub shaped: bool,
    /// The epoch this tenant's items must carry (the global epoch plus the slot's own).
    pub epoch: u64,
    pub allow_in_bytes: i64,
    pub allow_out_bytes: i64,
    /// Its items, keyed exactly (the kernel keys by hash and checks the key in the value).
    pub items: HashMap<Vec<u8>, Item>,
}

/// The map state the model reads.
#[derive(Clone, Debug, Default)]
pub struct ModelState {
    /// `ss_config.enabled`.
    pub enabled: bool,
    /// CLOCK_MONOTONIC ns "now" for expiry checks.
    pub now_ns: u64,
    /// UDP port → tenant slot (`ss_ports`).
    pub ports: HashMap<u16, u32>,
    /// Active tenant slots (`ss_tenants`; a slot absent here is inactive).
    pub tenants: HashMap<u32, ModelTenant>,
}

impl ModelState {
    /// The single-tenant state: one unshaped tenant in slot 0 on `udp_port`, no items yet.
    pub fn single(udp_port: u16, epoch: u64, now_ns: u64) -> ModelState {
        let mut st = ModelState { enabled: true, now_ns, ..Default::default() };
        st.ports.insert(udp_port, 0);
        st.tenants.insert(0, ModelTenant { epoch, ..Default::default() });
        st
    }

    /// Slot `slot`'s items (the slot is made active, unshaped, if it was not).
    pub fn items_mut(&mut self, slot: u32) -> &mut HashMap<Vec<u8>, Item> {
        &mut self.tenants.entry(slot).or_default().items
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Get,
    Gets,
    MgV,
    MgVf,
}

const ETH: usize = 14;
const REPLY_END: usize = 16 + REPLY_PAYLOAD_BYTES_MAX;
const TOK_MAX: usize = KEYS_MAX + 1;

fn be16(p: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(at)?, *p.get(at + 1)?]))
}

/// Run the model on one packet.
pub fn model(packet: &[u8], st: &ModelState) -> Outcome {
    let mut slot = None;
    let d = decide(packet, st, &mut slot);
    let pass = |misses, throttled| Outcome {
        verdict: Verdict::Pass,
        packet: packet.to_vec(),
        hits: 0,
        misses,
        throttled,
        slot,
        spent: (0, 0, 0),
    };
    match d {
        Decision::Pass => pass(0, 0),
        Decision::Miss => pass(1, 0),
        Decision::Throttled => pass(0, 1),
        Decision::Tx { packet, spent } => {
            Outcome { verdict: Verdict::Tx, packet, hits: 1, misses: 0, throttled: 0, slot, spent }
        }
    }
}

/// [`model`], then apply what the answer cost to the tenant's allowance in `st` (as the kernel
/// does), so a sequence of packets can be modelled.
pub fn model_apply(packet: &[u8], st: &mut ModelState) -> Outcome {
    let out = model(packet, st);
    if let Some(t) = out.slot.and_then(|s| st.tenants.get_mut(&s)) {
        t.allow_in_bytes -= out.spent.1 as i64;
        t.allow_out_bytes -= out.spent.2 as i64;
    }
    out
}

enum Decision {
    Pass,
    Miss,
    Throttled,
    Tx { packet: Vec<u8>, spent: (u64, u64, u64) },
}

#[allow(clippy::too_many_lines)] // the oracle mirrors the XDP program step by step, in one place, to be compared with it
fn decide(p: &[u8], st: &ModelState, slot_out: &mut Option<u32>) -> Decision {
    use Decision::{Miss, Pass, Throttled};
    if !st.enabled || p.len() < ETH {
        return Pass;
    }
    let ethertype = be16(p, 12).unwrap_or(0);
    let (v6, l4, udp_len) = match ethertype {
        0x0800 => {
            if p.len() < ETH + 20 {
                return Pass;
            }
            let ip = &p[ETH..ETH + 20];
            if ip[0] != 0x45 || ip[9] != 17 {
                return Pass;
            }
            if be16(ip, 6).unwrap_or(0) & 0x3fff != 0 {
                return Pass;
            }
            let tot = usize::from(be16(ip, 2).unwrap_or(0));
            if tot < 28 {
                return Pass;
            }
            (false, ETH + 20, tot - 20)
        }
        0x86dd => {
            if p.len() < ETH + 40 {
                return Pass;
            }
            let ip = &p[ETH..ETH + 40];
            if ip[0] >> 4 != 6 || ip[6] != 17 {
                return Pass;
            }
            (true, ETH + 40, usize::from(be16(ip, 4).unwrap_or(0)))
        }
        _ => return Pass,
    };
    if p.len() < l4 + 8 {
        return Pass;
    }
    let Some(&slot) = be16(p, l4 + 2).and_then(|port| st.ports.get(&port)) else { return Pass };
    let Some(ten) = st.tenants.get(&slot) else { return Pass };
    *slot_out = Some(slot);
    if be16(p, l4 + 4).map(usize::from) != Some(udp_len) {
        return Pass;
    }
    if l4 + udp_len > p.len() || udp_len < 8 + FRAME_HEADER_BYTES + 4 {
        return Pass;
    }
    let pay = l4 + 8 + FRAME_HEADER_BYTES;
    let n = udp_len - 8 - FRAME_HEADER_BYTES;
    let req = &p[pay..pay + n.min(REQUEST_BYTES_MAX)];
    let getlike = req.starts_with(b"get ") || req.starts_with(b"gets ") || req.starts_with(b"mg ");
    if !getlike {
        return Pass;
    }
    if ten.shaped && (ten.allow_in_bytes < n as i64 || ten.allow_out_bytes <= 0) {
        return Throttled;
    }
    if n > REQUEST_BYTES_MAX {
        return Miss;
    }
    let fh = &p[l4 + 8..l4 + 16];
    if fh[2..6] != [0, 0, 0, 1] {
        return Miss;
    }
    if !req.ends_with(b"\r\n") {
        return Miss;
    }
    let line = &req[..n - 2];
    if line.contains(&b'\n') {
        return Miss;
    }
    // memcached's tokenizer: split on ' ', skip empty tokens.
    let mut toks: Vec<(usize, &[u8])> = Vec::new();
    let mut start = None;
    for (i, &c) in line.iter().enumerate().chain(std::iter::once((line.len(), &b' '))) {
        if c == b' ' {
            if let Some(s) = start.take() {
                toks.push((s, &line[s..i]));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if toks.len() > TOK_MAX || toks.len() < 2 || toks[0].0 != 0 {
        return Miss;
    }
    let (mode, keys): (Mode, &[(usize, &[u8])]) = match toks[0].1 {
        b"get" => (Mode::Get, &toks[1..]),
        b"gets" => (Mode::Gets, &toks[1..]),
        b"mg" => {
            let flags: Vec<&[u8]> = toks[2..].iter().map(|t| t.1).collect();
            let mode = match flags.as_slice() {
                [b"v"] => Mode::MgV,
                [b"v", b"f"] | [b"f", b"v"] => Mode::MgVf,
                _ => return Miss,
            };
            (mode, &toks[1..2])
        }
        _ => return Miss,
    };
    if keys.is_empty() || keys.len() > KEYS_MAX {
        return Miss;
    }
    let mut reply = vec![0u8; 16];
    for &(_, key) in keys {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Miss;
        }
        let Some(item) = ten.items.get(key) else { return Miss };
        if item.epoch != ten.epoch || (item.expiry_ns != 0 && st.now_ns >= item.expiry_ns) {
            return Miss;
        }
        let Some(s) = segments(item) else { return Miss };
        // The kernel map is keyed by a hash, so the program checks that the item is this key's:
        // segment A is "VALUE <key> ...", the key at offset 6 followed by ' ' (it does not
        // re-check "VALUE ", which user space always writes). The model's map is keyed exactly,
        // but a caller may file an item under another key; the kernel would then miss too.
        if s.a.len() < 6 + key.len() + 1
            || s.a.get(6..6 + key.len()) != Some(key)
            || s.a.get(6 + key.len()) != Some(&b' ')
        {
            return Miss;
        }
        let head: Vec<&[u8]> = match mode {
            Mode::Get => vec![s.a],
            Mode::Gets => vec![s.a, s.b],
            Mode::MgV => vec![s.d],
            Mode::MgVf => vec![s.d, s.e],
        };
        let need: usize = head.iter().map(|h| h.len()).sum::<usize>() + s.c.len();
        if reply.len() + need + 5 > REPLY_END {
            return Miss;
        }
        for h in head {
            reply.extend_from_slice(h);
        }
        reply.extend_from_slice(s.c);
    }
    if matches!(mode, Mode::Get | Mode::Gets) {
        reply.extend_from_slice(b"END\r\n");
    }
    let udp_total = reply.len();
    // Paid before the packet is touched; a shaped tenant that cannot pay is passed up.
    let (in_bytes, out_bytes) = (n as i64, (udp_total - 16) as i64);
    let spent = if ten.shaped {
        if ten.allow_in_bytes < in_bytes || ten.allow_out_bytes < out_bytes {
            return Throttled;
        }
        (1, in_bytes as u64, out_bytes as u64)
    } else {
        (0, 0, 0)
    };
    // UDP header: ports swapped; frame header: same request id, seq 0, total 1.
    reply[0..2].copy_from_slice(&p[l4 + 2..l4 + 4]);
    reply[2..4].copy_from_slice(&p[l4..l4 + 2]);
    reply[4..6].copy_from_slice(&(udp_total as u16).to_be_bytes());
    reply[8..10].copy_from_slice(&fh[0..2]);
    reply[10..16].copy_from_slice(&[0, 0, 0, 1, 0, 0]);

    let mut out = Vec::with_capacity(l4 + udp_total);
    out.extend_from_slice(&p[6..12]);
    out.extend_from_slice(&p[0..6]);
    out.extend_from_slice(&p[12..14]);
    let (src, dst): (Vec<u8>, Vec<u8>);
    if v6 {
        let ip = &p[ETH..ETH + 40];
        src = ip[24..40].to_vec();
        dst = ip[8..24].to_vec();
        out.extend_from_slice(&ip[0..4]);
        out.extend_from_slice(&(udp_total as u16).to_be_bytes());
        out.push(17);
        out.push(64);
        out.extend_from_slice(&src);
        out.extend_from_slice(&dst);
    } else {
        let ip = &p[ETH..ETH + 20];
        src = ip[16..20].to_vec();
        dst = ip[12..16].to_vec();
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = ip[1];
        h[2..4].copy_from_slice(&((20 + udp_total) as u16).to_be_bytes());
        h[6] = 0x40;
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let c = !ones_sum(&[&h]);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&h);
    }
    let len_bytes = (udp_total as u32).to_be_bytes();
    let pseudo_tail: Vec<u8> =
        if v6 { [&len_bytes[..], &[0, 0, 0, 17]].concat() } else { vec![0, 17, len_bytes[2], len_bytes[3]] };
    let mut c = !ones_sum(&[&src, &dst, &pseudo_tail, &reply]);
    if c == 0 {
        c = 0xffff;
    }
    reply[6..8].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(&reply);
    Decision::Tx { packet: out, spent }
}

/// Ones'-complement 16-bit sum (folded, not inverted) of the concatenation of `parts`, each
/// part's length a multiple of 2 except possibly the last.
pub fn ones_sum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &b in part.iter() {
            match odd.take() {
                None => odd = Some(b),
                Some(hi) => sum += u64::from(u16::from_be_bytes([hi, b])),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u64::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}
