//! Composing one item's kernel-cache value: the reply text segments the XDP program copies into
//! its answer (see `struct ss_item` in `bpf/slipstream_kv.h`).
//!
//! Not for: deciding *when* to fill (the server does, under its shard lock) or map I/O.

use crate::abi::{ones_sum, Item, Key, PIECE_BYTES_MAX, REPLY_PAYLOAD_BYTES_MAX};
use std::io::Write;

/// Why an item is not put into the kernel cache. Not an error for the caller: such items are
/// simply served by user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotCacheable {
    /// Empty, longer than 250 bytes, or containing a byte the ASCII protocol cannot carry in a
    /// key (space, CR, LF, NUL): no request could ever name it.
    Key,
    /// The `gets` reply for this item alone would not fit one datagram.
    TooLarge,
}

/// Bytes `"END\r\n"` adds to get/gets replies.
const END_BYTES: usize = 5;

/// Build the map value for an item. `expiry_ns` is absolute CLOCK_MONOTONIC ns (0 = never);
/// `epoch` is the flush epoch the value belongs to.
pub fn compose(
    key: &[u8],
    flags: u32,
    cas: u64,
    value: &[u8],
    expiry_ns: u64,
    epoch: u64,
) -> Result<Item, NotCacheable> {
    if Key::new(key).is_none() || key.iter().any(|&b| matches!(b, b' ' | b'\r' | b'\n' | 0)) {
        return Err(NotCacheable::Key);
    }
    // Cheap early bound so a huge value costs nothing.
    if value.len() > REPLY_PAYLOAD_BYTES_MAX {
        return Err(NotCacheable::TooLarge);
    }
    let mut d = Vec::with_capacity(16);
    let mut e = Vec::with_capacity(16);
    let mut a = Vec::with_capacity(key.len() + 32);
    let mut b = Vec::with_capacity(24);
    // Writes into a Vec cannot fail.
    let _ = write!(d, "VA {}", value.len());
    let _ = write!(e, " f{flags}");
    a.extend_from_slice(b"VALUE ");
    a.extend_from_slice(key);
    let _ = write!(a, " {flags} {}", value.len());
    let _ = write!(b, " {cas}");
    let c_len = value.len() + 4;
    if a.len() + b.len() + c_len + END_BYTES > REPLY_PAYLOAD_BYTES_MAX {
        return Err(NotCacheable::TooLarge);
    }
    let total = d.len() + e.len() + a.len() + b.len() + c_len;
    if total > PIECE_BYTES_MAX {
        return Err(NotCacheable::TooLarge);
    }
    let mut item = Item {
        expiry_ns,
        epoch,
        d_len: d.len() as u16,
        e_len: e.len() as u16,
        a_len: a.len() as u16,
        b_len: b.len() as u16,
        c_len: c_len as u16,
        csum_d: ones_sum(&d),
        csum_e: ones_sum(&e),
        csum_a: ones_sum(&a),
        csum_b: ones_sum(&b),
        csum_c: 0,
        pad0: 0,
        pad1: 0,
        piece: [0; PIECE_BYTES_MAX],
    };
    let mut at = 0;
    for seg in [&d[..], &e[..], &a[..], &b[..], b"\r\n", value, b"\r\n"] {
        item.piece[at..at + seg.len()].copy_from_slice(seg);
        at += seg.len();
    }
    let c_start = at - c_len;
    item.csum_c = ones_sum(&item.piece[c_start..at]);
    Ok(item)
}

/// The five segments of an item, bounds-checked (a corrupt value yields `None`). The production
/// path reads only segment A (`is_for_key`); the test oracle's model reads them all.
#[cfg_attr(not(feature = "test-oracle"), allow(dead_code))]
pub(crate) struct Segments<'a> {
    pub d: &'a [u8],
    pub e: &'a [u8],
    pub a: &'a [u8],
    pub b: &'a [u8],
    pub c: &'a [u8],
}

pub(crate) fn segments(item: &Item) -> Option<Segments<'_>> {
    let lens = [item.d_len, item.e_len, item.a_len, item.b_len, item.c_len].map(usize::from);
    if lens.iter().sum::<usize>() > PIECE_BYTES_MAX {
        return None;
    }
    let mut at = 0;
    let mut take = |n: usize| {
        let s = item.piece.get(at..at + n);
        at += n;
        s
    };
    Some(Segments { d: take(lens[0])?, e: take(lens[1])?, a: take(lens[2])?, b: take(lens[3])?, c: take(lens[4])? })
}

/// Whether `item` was composed for `key`: its segment A is "VALUE <key> ...". The map is keyed
/// by a hash of the key, so this is what tells two colliding keys apart (the XDP program makes
/// the same check; keys never hold ' ', so the key followed by ' ' is exact).
pub(crate) fn holds_key(item: &Item, key: &[u8]) -> bool {
    let Some(s) = segments(item) else { return false };
    s.a.get(..6) == Some(b"VALUE ".as_slice())
        && s.a.get(6..6 + key.len()) == Some(key)
        && s.a.get(6 + key.len()) == Some(&b' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_hold_each_reply_form() {
        let it = compose(b"foo", 5, 77, b"bar", 0, 3).unwrap();
        let s = segments(&it).unwrap();
        assert_eq!(s.d, b"VA 3");
        assert_eq!(s.e, b" f5");
        assert_eq!(s.a, b"VALUE foo 5 3");
        assert_eq!(s.b, b" 77");
        assert_eq!(s.c, b"\r\nbar\r\n");
        assert_eq!(it.epoch, 3);
    }

    /// The program adds the segment sums, byte-swapped at odd offsets, instead of summing the
    /// reply: for every reply form and both parities the result must equal the plain sum.
    #[test]
    fn segment_sums_add_up_to_the_reply_sum() {
        let fold = |mut x: u64| {
            while x > 0xffff {
                x = (x & 0xffff) + (x >> 16);
            }
            x
        };
        for key in [&b"k"[..], b"ke", b"key:00000001", b"odd-key"] {
            for value in [&b""[..], b"v", b"value", b"0123456789abcdef0123456789abcdef"] {
                let it = compose(key, 7, 12345, value, 0, 0).unwrap();
                let s = segments(&it).unwrap();
                let forms: [(&[&[u8]], [u16; 3]); 4] = [
                    (&[s.a, s.c], [it.csum_a, it.csum_c, 0]),
                    (&[s.a, s.b, s.c], [it.csum_a, it.csum_b, it.csum_c]),
                    (&[s.d, s.c], [it.csum_d, it.csum_c, 0]),
                    (&[s.d, s.e, s.c], [it.csum_d, it.csum_e, it.csum_c]),
                ];
                for (parts, sums) in forms {
                    for lead in 0..2usize {
                        let mut reply = vec![0u8; lead];
                        let mut at = lead;
                        let mut from_parts: u64 = 0;
                        for (p, cs) in parts.iter().zip(sums) {
                            from_parts += u64::from(if at % 2 == 1 { cs.swap_bytes() } else { cs });
                            reply.extend_from_slice(p);
                            at += p.len();
                        }
                        assert_eq!(
                            fold(from_parts),
                            fold(u64::from(ones_sum(&reply))),
                            "key {key:?} value {value:?} lead {lead}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_what_cannot_be_served() {
        assert_eq!(compose(b"", 0, 0, b"x", 0, 0), Err(NotCacheable::Key));
        assert_eq!(compose(&[b'k'; 251], 0, 0, b"x", 0, 0), Err(NotCacheable::Key));
        assert_eq!(compose(b"a b", 0, 0, b"x", 0, 0), Err(NotCacheable::Key));
        assert_eq!(compose(b"k", 0, 0, &[0; 2000], 0, 0), Err(NotCacheable::TooLarge));
        // Largest that fits: "VALUE k 0 N cas\r\n" + N + "\r\nEND\r\n" <= REPLY_PAYLOAD_BYTES_MAX.
        let fixed = "VALUE k 0 1360".len() + " 1".len() + 4 + 5;
        let n = REPLY_PAYLOAD_BYTES_MAX - fixed;
        assert!(compose(b"k", 0, 1, &vec![b'v'; n], 0, 0).is_ok());
        assert_eq!(compose(b"k", 0, 1, &vec![b'v'; n + 1], 0, 0), Err(NotCacheable::TooLarge));
    }
}
