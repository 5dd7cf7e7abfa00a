//! The global budget for connection buffers: one atomic byte count shared by every worker (and
//! every tenant), so that misbehaving clients cannot make the daemon's memory grow without
//! bound. memcached bounds the same thing with `-o read_buf_mem_limit`.
//!
//! What it is for: every TCP connection may hold a small base for free — its
//! `READ_BUF_BYTES_INITIAL` read buffer and `REPLY_BYTES_FREE` bytes of replies not yet taken by
//! the socket. Anything beyond — a read buffer grown for a large request or a long multi-get
//! line, reply bytes beyond the free part (small values copied for a client that does not read;
//! values of `outq::SHARE_VALUE_BYTES_MIN` or more go out by reference, uncharged) — is
//! charged here *before* the memory is used, and given back when the buffer shrinks, the socket
//! takes the replies, or the connection closes. When a charge is refused, the caller answers as
//! memcached does when its allocation fails:
//! - a get whose reply cannot be charged: `SERVER_ERROR out of memory writing get response`
//!   (binary: status `ENOMEM`);
//! - a storage command whose data block cannot be buffered: `SERVER_ERROR out of memory storing
//!   object`, and the data block is swallowed (memcached's `conn_swallow`);
//! - any other request that cannot be buffered (a long multi-get line, a binary or meta request
//!   with a large body): `SERVER_ERROR out of memory reading request`, then close.
//!
//! So peak connection-buffer memory is the budget plus the per-connection base times the
//! number of connections (README, "How it serves").
//!
//! What it is not for: item memory (the store's `-m` limit) or UDP (each datagram's reply is
//! sent or dropped before the next is read, so its buffer never accumulates).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Default budget (the daemon's `Config::conn_buf_bytes_max`): a 16 MB multi-get reply waiting
/// for the socket, or 16 requests with 1 MB items being received at the same moment (a request
/// holds its share only while it arrives). It is a term of the documented RSS bound, so it is
/// kept small next to `-m`'s default of 64 MB.
pub const CONN_BUF_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;
/// Reply bytes a connection may hold waiting for the socket without charging the budget: a
/// pipelined batch of small replies never touches the shared counter.
pub const REPLY_BYTES_FREE: usize = 64 * 1024;

/// The shared counter. Cheap to share: wrap in `Arc`.
#[derive(Debug)]
pub struct BufBudget {
    used_bytes: AtomicUsize,
    max_bytes: usize,
    /// Charges refused since start.
    refused: AtomicU64,
}

impl BufBudget {
    pub fn new(max_bytes: usize) -> BufBudget {
        BufBudget { used_bytes: AtomicUsize::new(0), max_bytes, refused: AtomicU64::new(0) }
    }

    /// Take `bytes` from the budget; false (and nothing taken) if that would exceed it.
    pub fn try_charge(&self, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut cur = self.used_bytes.load(Ordering::Relaxed);
        loop {
            let next = match cur.checked_add(bytes) {
                Some(n) if n <= self.max_bytes => n,
                _ => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            };
            match self.used_bytes.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Give back `bytes` taken earlier.
    pub fn release(&self, bytes: usize) {
        if bytes != 0 {
            self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes charged now.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::Relaxed)
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Charges refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Make sure a connection that will hold `pending_bytes` of replies has charged what goes
    /// beyond `REPLY_BYTES_FREE`; `charged` is what it holds already and is updated.
    pub fn charge_reply(&self, charged: &mut usize, pending_bytes: usize) -> bool {
        let need = pending_bytes.saturating_sub(REPLY_BYTES_FREE);
        if need <= *charged {
            return true;
        }
        if self.try_charge(need - *charged) {
            *charged = need;
            true
        } else {
            false
        }
    }
}

impl Default for BufBudget {
    fn default() -> Self {
        BufBudget::new(CONN_BUF_BYTES_MAX_DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stay_within_the_budget_and_come_back() {
        let b = BufBudget::new(1000);
        assert!(b.try_charge(600));
        assert!(!b.try_charge(401));
        assert_eq!(b.refused(), 1);
        assert!(b.try_charge(400));
        b.release(1000);
        assert_eq!(b.used_bytes(), 0);
        let mut charged = 0;
        assert!(b.charge_reply(&mut charged, REPLY_BYTES_FREE));
        assert_eq!(charged, 0);
        assert!(b.charge_reply(&mut charged, REPLY_BYTES_FREE + 700));
        assert_eq!((charged, b.used_bytes()), (700, 700));
        assert!(!b.charge_reply(&mut charged, REPLY_BYTES_FREE + 1001));
        assert_eq!((charged, b.used_bytes()), (700, 700));
    }
}
