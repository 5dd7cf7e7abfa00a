//! Batched UDP socket I/O for the worker loops: `recvmmsg` fills up to [`RECV_BATCH`] datagrams
//! per system call and `sendmmsg` sends up to [`SEND_BATCH`] replies per call. A busy UDP
//! socket then pays one syscall entry (and, across a veth or a NIC queue, one wake-up of the
//! receiver) per batch instead of per datagram; under load the kernel has queued many requests
//! by the time a worker gets to run.
//!
//! Not for: protocol framing (slipstream_proto::udp) or deciding what to send (net.rs). Sizes:
//! receive buffers hold the largest UDP datagram, so nothing memcached accepts is truncated.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// Datagrams per `recvmmsg` call.
pub(crate) const RECV_BATCH: usize = 16;
/// Replies queued before a `sendmmsg` is forced.
pub(crate) const SEND_BATCH: usize = 64;
/// Bytes of reply frames queued before a send is forced (64 full-size memcached datagrams).
const SEND_BYTES_MAX: usize = SEND_BATCH * 1500;

fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large
            // enough and aligned for.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// (storage, length) of `addr` as the kernel takes it.
fn from_socket_addr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is a valid (unspecified) address.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and aligned for a sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            (ss, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            (ss, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

/// Receive side: RECV_BATCH buffers of `datagram_bytes_max` each.
pub(crate) struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    truncated: Vec<bool>,
}

impl RecvBatch {
    pub(crate) fn new(datagram_bytes_max: usize) -> RecvBatch {
        RecvBatch {
            bufs: (0..RECV_BATCH).map(|_| vec![0u8; datagram_bytes_max]).collect(),
            // SAFETY: all-zero sockaddr_storage values are valid.
            addrs: (0..RECV_BATCH).map(|_| unsafe { zeroed() }).collect(),
            lens: vec![0; RECV_BATCH],
            truncated: vec![false; RECV_BATCH],
        }
    }

    /// Receive up to RECV_BATCH datagrams without blocking; returns how many (0 = none queued).
    pub(crate) fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let mut iovs: Vec<libc::iovec> =
            self.bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
        // SAFETY: zeroed mmsghdr values are valid; every pointer set below points into
        // self.bufs / self.addrs / iovs, which outlive the call and are not moved during it.
        let mut msgs: Vec<libc::mmsghdr> = (0..RECV_BATCH).map(|_| unsafe { zeroed() }).collect();
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_iov = &mut iovs[i];
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: msgs holds RECV_BATCH initialised headers whose buffers are valid for writes
        // of the lengths given; a null timeout is allowed.
        let n = unsafe {
            libc::recvmmsg(fd, msgs.as_mut_ptr(), RECV_BATCH as libc::c_uint, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
        }
        let n = n as usize;
        for (i, m) in msgs.iter().take(n).enumerate() {
            self.lens[i] = (m.msg_len as usize).min(self.bufs[i].len());
            self.truncated[i] = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        }
        Ok(n)
    }

    /// Datagram `i` of the last `recv`: (bytes, sender). `None` for a truncated datagram or an
    /// unknown address family (callers count and drop those).
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
        if i >= RECV_BATCH || self.truncated[i] {
            return None;
        }
        let peer = to_socket_addr(&self.addrs[i])?;
        Some((&self.bufs[i][..self.lens[i]], peer))
    }
}

/// Send side: reply frames queued back to back in one arena.
pub(crate) struct SendBatch {
    arena: Vec<u8>,
    entries: Vec<(usize, usize, SocketAddr)>,
}

/// What one flush did.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sent {
    pub datagrams: u64,
    pub bytes: u64,
}

impl SendBatch {
    pub(crate) fn new() -> SendBatch {
        SendBatch { arena: Vec::with_capacity(SEND_BYTES_MAX), entries: Vec::with_capacity(SEND_BATCH) }
    }

    /// Queue one datagram; true when the batch is full and should be flushed now.
    pub(crate) fn push(&mut self, frame: &[u8], peer: SocketAddr) -> bool {
        let start = self.arena.len();
        self.arena.extend_from_slice(frame);
        self.entries.push((start, self.arena.len(), peer));
        self.entries.len() >= SEND_BATCH || self.arena.len() >= SEND_BYTES_MAX
    }

    /// Drop everything queued (the socket went away).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.arena.clear();
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Send everything queued, in order. A datagram the socket refuses (buffer full, peer
    /// unreachable) is dropped as UDP may, and the rest are still tried; the queue is empty
    /// afterwards either way.
    pub(crate) fn flush(&mut self, fd: RawFd) -> Sent {
        let mut sent = Sent::default();
        let mut at = 0;
        // A bounded number of rounds: each one either sends at least one datagram or skips the
        // one the kernel refused.
        while at < self.entries.len() {
            let rest = &self.entries[at..];
            let mut names: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
                rest.iter().map(|(_, _, p)| from_socket_addr(p)).collect();
            let mut iovs: Vec<libc::iovec> = rest
                .iter()
                .map(|&(s, e, _)| libc::iovec {
                    // The kernel only reads through this pointer (sendmmsg).
                    iov_base: self.arena[s..e].as_ptr() as *mut libc::c_void,
                    iov_len: e - s,
                })
                .collect();
            // SAFETY: zeroed mmsghdr values are valid; the pointers set below point into names
            // and iovs (and through them into self.arena), all alive and unmoved for the call.
            let mut msgs: Vec<libc::mmsghdr> = (0..rest.len()).map(|_| unsafe { zeroed() }).collect();
            for (i, m) in msgs.iter_mut().enumerate() {
                m.msg_hdr.msg_name = (&mut names[i].0 as *mut libc::sockaddr_storage).cast();
                m.msg_hdr.msg_namelen = names[i].1;
                m.msg_hdr.msg_iov = &mut iovs[i];
                m.msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: msgs holds rest.len() initialised headers pointing at readable buffers.
            let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as libc::c_uint, libc::MSG_DONTWAIT) };
            if n <= 0 {
                if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                at += 1; // the first one was refused: drop it and go on
                continue;
            }
            let n = n as usize;
            for &(s, e, _) in &rest[..n] {
                sent.datagrams += 1;
                sent.bytes += (e - s) as u64;
            }
            at += n;
        }
        self.entries.clear();
        self.arena.clear();
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn batches_round_trip_in_order() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = b.local_addr().unwrap();
        let mut out = SendBatch::new();
        for i in 0..40u32 {
            out.push(format!("datagram {i}").as_bytes(), to);
        }
        let sent = out.flush(a.as_raw_fd());
        assert_eq!(sent.datagrams, 40);
        assert!(out.is_empty());
        let mut rb = RecvBatch::new(65536);
        let mut got = Vec::new();
        for _ in 0..1000 {
            let n = rb.recv(b.as_raw_fd()).unwrap();
            for i in 0..n {
                let (d, from) = rb.get(i).unwrap();
                assert_eq!(from, a.local_addr().unwrap());
                got.push(String::from_utf8(d.to_vec()).unwrap());
            }
            if got.len() == 40 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let want: Vec<String> = (0..40).map(|i| format!("datagram {i}")).collect();
        assert_eq!(got, want);
        assert_eq!(rb.recv(b.as_raw_fd()).unwrap(), 0, "nothing left, and no blocking");
    }

    #[test]
    fn addresses_convert_both_ways() {
        for s in ["10.1.2.3:4567", "[2001:db8::1]:11211"] {
            let a: SocketAddr = s.parse().unwrap();
            let (ss, _) = from_socket_addr(&a);
            assert_eq!(to_socket_addr(&ss), Some(a));
        }
    }
}
