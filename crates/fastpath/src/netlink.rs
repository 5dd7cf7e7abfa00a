//! Removing a netlink-attached XDP program from an interface (RTM_SETLINK, IFLA_XDP fd -1), so
//! that attach replaces what an earlier tool or crashed process left behind. aya attaches with
//! bpf links, which die with the process, but a program attached through netlink (e.g. by
//! `ip link set dev X xdp ...`) stays and would make the link attach fail with EBUSY.
//!
//! Not for: detaching programs owned by a live bpf link (the kernel refuses, rightly).

use std::io;

const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const NLA_F_NESTED: u16 = 1 << 15;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

fn push_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
}

fn set_xdp_none(sock: libc::c_int, ifindex: u32, mode_flags: u32, seq: u32) -> io::Result<()> {
    // struct ifinfomsg: family(1) pad(1) type(2) index(4) flags(4) change(4)
    let mut body = Vec::with_capacity(64);
    body.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    body.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    let mut nested = Vec::with_capacity(16);
    push_attr(&mut nested, IFLA_XDP_FD, &(-1i32).to_ne_bytes());
    push_attr(&mut nested, IFLA_XDP_FLAGS, &mode_flags.to_ne_bytes());
    push_attr(&mut body, IFLA_XDP | NLA_F_NESTED, &nested);
    // struct nlmsghdr: len(4) type(2) flags(2) seq(4) pid(4)
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_SETLINK.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    // SAFETY: `msg` is a valid buffer of msg.len() bytes for the duration of the call.
    let sent = unsafe { libc::send(sock, msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut reply = [0u8; 4096];
    // SAFETY: `reply` is a valid writable buffer of reply.len() bytes for the call.
    let n = unsafe { libc::recv(sock, reply.as_mut_ptr().cast(), reply.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // Expect NLMSG_ERROR (type 2) carrying errno (0 = ack).
    if n >= 20 && u16::from_ne_bytes([reply[4], reply[5]]) == libc::NLMSG_ERROR as u16 {
        let errno = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(-errno));
        }
        return Ok(());
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "unexpected netlink reply"))
}

/// Detach any netlink-attached XDP program (driver and generic mode) from `ifindex`.
pub fn detach_xdp(ifindex: u32) -> io::Result<()> {
    // SAFETY: plain socket(2) call; the fd is closed below on every path.
    let sock = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // Bound how long a misbehaving kernel reply could block us.
    let tv = libc::timeval { tv_sec: 2, tv_usec: 0 };
    // SAFETY: `tv` is a valid timeval for the duration of the call; size matches.
    unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let r = set_xdp_none(sock, ifindex, XDP_FLAGS_DRV_MODE, 1)
        .and_then(|_| set_xdp_none(sock, ifindex, XDP_FLAGS_SKB_MODE, 2));
    // SAFETY: `sock` is our open fd, closed exactly once.
    unsafe { libc::close(sock) };
    r
}
