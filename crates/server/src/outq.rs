//! A connection's outgoing bytes: its owned reply buffer plus large item values sent by
//! reference, written in order with one `writev` per round.
//!
//! What it is for: a get of a large value queues a clone of the item's `Arc` at the byte
//! position of the reply buffer where the value belongs, instead of copying it (memcached sends
//! item memory by reference too). Such a value is already charged to `-m` through the store, so
//! it is not charged to the connection-buffer budget; it is pinned only while queued (a value
//! replaced or evicted meanwhile stays alive until its reply is written), and each connection
//! may pin at most `PINNED_BYTES_MAX`.
//!
//! What it is not for: UDP (each datagram's reply is copied and sent at once) or small values
//! (below `SHARE_VALUE_BYTES_MIN` a copy is cheaper than the bookkeeping).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::ops::Range;
use std::sync::Arc;

/// Values at least this long are sent by reference; shorter ones are copied: a small copy into
/// the coalesced reply costs less than a refcount, a queue entry and two more iovecs. (Chosen,
/// not yet measured: copying 16 KiB is a few microseconds; the point is that the values that
/// strain the connection-buffer budget are far larger.)
pub const SHARE_VALUE_BYTES_MIN: usize = 16 * 1024;
/// Most bytes of values one connection may hold by reference while its client does not read:
/// a 32 × 1 MB multi-get. Past it values are copied (and charged to the budget) instead.
pub const PINNED_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Most pieces handed to one `writev` (well under IOV_MAX).
const IOVECS_MAX: usize = 64;

/// A value sent by reference: `data[range]` goes out just before byte `at` of the owned buffer.
struct SharedSlice {
    at: usize,
    data: Arc<[u8]>,
    range: Range<usize>,
}

/// The values a connection's pending replies send by reference, in reply order.
#[derive(Default)]
pub struct SharedQueue {
    q: VecDeque<SharedSlice>,
    /// Sum of the queued slices' lengths.
    pinned_bytes: usize,
    /// Bytes of the front slice already written.
    front_done: usize,
}

impl std::fmt::Debug for SharedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedQueue({} slices, {} bytes)", self.q.len(), self.pinned_bytes)
    }
}

impl SharedQueue {
    /// Queue `data[range]` to go out at byte `at` of the owned buffer (its current length).
    pub fn push(&mut self, at: usize, data: &Arc<[u8]>, range: Range<usize>) {
        self.pinned_bytes += range.len();
        self.q.push_back(SharedSlice { at, data: Arc::clone(data), range });
    }

    /// Whether `bytes` more may be pinned.
    pub fn has_room(&self, bytes: usize) -> bool {
        self.pinned_bytes.saturating_add(bytes) <= PINNED_BYTES_MAX
    }

    pub fn pinned_bytes(&self) -> usize {
        self.pinned_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// The owned buffer was truncated to `len` (replies discarded): drop the values that
    /// belonged to them. A value always follows its own reply's header, so those are exactly
    /// the ones placed after `len`.
    pub fn discard_after(&mut self, len: usize) {
        while self.q.back().is_some_and(|s| s.at > len) {
            if let Some(s) = self.q.pop_back() {
                self.pinned_bytes -= s.range.len();
            }
        }
        if self.q.is_empty() {
            self.front_done = 0;
        }
    }

    /// Drop everything (connection closing).
    pub fn clear(&mut self) {
        self.q.clear();
        self.pinned_bytes = 0;
        self.front_done = 0;
    }
}

/// Write `buf[*start..]` with the queued values spliced in, until all is written (Ok(true)) or
/// the writer would block (Ok(false)). `on_write` sees each write's byte count. On return
/// `*start` and the queue say what is left; the caller clears `buf` after Ok(true).
pub fn write_pending(
    w: &mut impl Write,
    buf: &[u8],
    start: &mut usize,
    q: &mut SharedQueue,
    mut on_write: impl FnMut(usize),
) -> io::Result<bool> {
    loop {
        let mut iov: [IoSlice<'_>; IOVECS_MAX] = [IoSlice::new(&[]); IOVECS_MAX];
        let mut n_iov = 0;
        let mut pos = *start;
        let mut all_values = true;
        for (i, s) in q.q.iter().enumerate() {
            if n_iov + 2 > IOVECS_MAX {
                all_values = false;
                break;
            }
            if s.at > pos {
                iov[n_iov] = IoSlice::new(&buf[pos..s.at]);
                n_iov += 1;
                pos = s.at;
            }
            let skip = if i == 0 { q.front_done } else { 0 };
            iov[n_iov] = IoSlice::new(&s.data[s.range.start + skip..s.range.end]);
            n_iov += 1;
        }
        if all_values && pos < buf.len() && n_iov < IOVECS_MAX {
            iov[n_iov] = IoSlice::new(&buf[pos..]);
            n_iov += 1;
        }
        if n_iov == 0 {
            return Ok(true);
        }
        match w.write_vectored(&iov[..n_iov]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                on_write(n);
                advance(buf.len(), start, q, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Account `n` written bytes: owned bytes up to the next value, then that value, and so on.
fn advance(buf_len: usize, start: &mut usize, q: &mut SharedQueue, mut n: usize) {
    while n > 0 {
        match q.q.front() {
            Some(s) if s.at == *start => {
                let left = s.range.len() - q.front_done;
                if n < left {
                    q.front_done += n;
                    return;
                }
                n -= left;
                q.pinned_bytes -= s.range.len();
                q.front_done = 0;
                q.q.pop_front();
            }
            front => {
                let limit = front.map_or(buf_len, |s| s.at);
                let take = n.min(limit - *start);
                *start += take;
                n -= take;
                if take == 0 {
                    // More written than was offered: a writer bug; stop rather than spin.
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `chunk` bytes per call (then, every other call, pretends to block).
    struct Trickle {
        got: Vec<u8>,
        chunk: usize,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.chunk - n);
                self.got.extend_from_slice(&b[..take]);
                n += take;
                if n == self.chunk {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Owned bytes with values spliced in at several places (start, middle, twice in a row,
    /// end) come out in order whatever size each partial write has: every boundary is split.
    #[test]
    fn partial_writevs_at_every_boundary_keep_the_byte_order() {
        let owned: Vec<u8> = (0..40u8).collect();
        let v1: Arc<[u8]> = (100..120u8).collect();
        let v2: Arc<[u8]> = (150..157u8).collect();
        let placements = [(0usize, &v1, 2..20), (10, &v2, 0..7), (10, &v1, 0..3), (25, &v2, 1..2), (40, &v1, 5..15)];
        let mut expect = Vec::new();
        let mut pos = 0;
        for (at, v, r) in &placements {
            expect.extend_from_slice(&owned[pos..*at]);
            expect.extend_from_slice(&v[r.clone()]);
            pos = *at;
        }
        expect.extend_from_slice(&owned[pos..]);
        for chunk in 1..=expect.len() {
            let mut q = SharedQueue::default();
            for (at, v, r) in &placements {
                q.push(*at, v, r.clone());
            }
            let mut w = Trickle { got: Vec::new(), chunk, calls: 0 };
            let mut start = 0;
            let mut written = 0;
            let mut rounds = 0;
            while !write_pending(&mut w, &owned, &mut start, &mut q, |n| written += n).unwrap() {
                rounds += 1;
                assert!(rounds < 10_000, "chunk {chunk}: no progress");
            }
            assert_eq!(w.got, expect, "chunk {chunk}");
            assert_eq!(written, expect.len());
            assert!(q.is_empty() && q.pinned_bytes() == 0 && start == owned.len());
        }
    }

    /// Any number of values around one writev's iovec limit, with owned bytes between them
    /// and after the last.
    #[test]
    fn more_values_than_one_writev_takes_still_go_out_in_order() {
        for values in 1..150usize {
            values_in_order(values);
        }
    }

    fn values_in_order(values: usize) {
        let v: Arc<[u8]> = (0..200u8).collect();
        let owned: Vec<u8> = (0..values * 2 + 1).map(|i| i as u8).collect();
        let mut q = SharedQueue::default();
        let mut expect = Vec::new();
        for i in 0..values {
            q.push(i * 2, &v, i..i + 30);
            expect.extend_from_slice(&v[i..i + 30]);
            expect.extend_from_slice(&owned[i * 2..i * 2 + 2]);
        }
        expect.push(owned[values * 2]);
        let mut w = Trickle { got: Vec::new(), chunk: 100_000, calls: 0 };
        let mut start = 0;
        for _ in 0..1000 {
            if write_pending(&mut w, &owned, &mut start, &mut q, |_| ()).unwrap() {
                break;
            }
        }
        assert_eq!(w.got, expect, "{values} values");
    }

    #[test]
    fn discarded_replies_take_their_values_with_them() {
        let v: Arc<[u8]> = Arc::from(&b"0123456789"[..]);
        let mut q = SharedQueue::default();
        q.push(5, &v, 0..10);
        q.push(9, &v, 0..4);
        q.discard_after(5);
        assert_eq!(q.pinned_bytes(), 10);
        q.discard_after(0);
        assert!(q.is_empty() && q.pinned_bytes() == 0);
        assert!(q.has_room(PINNED_BYTES_MAX) && !q.has_room(PINNED_BYTES_MAX + 1));
    }
}
