//! slipstream-bind: the one rule by which Slipstream opens a port (KV TCP and UDP, tenants,
//! stream UDP, stream results, the admin endpoint).
//!
//! The rule: a port Slipstream listens on is exclusive to this process, as memcached's are.
//! A single socket gets that from the kernel (no SO_REUSEPORT, so any overlapping bind fails
//! with EADDRINUSE). A group of sockets (one per worker thread, SO_REUSEPORT so the kernel
//! spreads the load without an accept lock) does not: the kernel lets every process of the same
//! user join a SO_REUSEPORT group, and would then split connections or datagrams between two
//! separate caches without a word. So for a group [`bind_group`]:
//! 1. looks for sockets of other processes already on the port with an overlapping address
//!    (equal, or either one a wildcard; IPv4, IPv6 and v4-mapped IPv6 compared as the kernel
//!    delivers) and fails with EADDRINUSE if there is one, so a second daemon never even
//!    briefly joins a running one's group;
//! 2. binds (and, for TCP, listens on) every socket;
//! 3. looks again: if any overlapping socket on the port is not this process's, it closes all of
//!    its sockets and fails with EADDRINUSE.
//!
//! Two daemons starting at once may both see the other in step 3 and both refuse; they can never
//! both succeed: whichever looks last sees the other's sockets, since each looks only after its
//! own are bound and (TCP) listening.
//!
//! Sockets are found with the kernel's sock_diag netlink dump (this network namespace; TCP:
//! listening sockets only, the others on the port are connections; the kernel filters, so only
//! the listeners are walked), or in `/proc/net/{tcp,tcp6,udp,udp6}` where sock_diag is not
//! available (a read of those walks every connection of the host: tens of milliseconds of
//! kernel time per port on a busy host, paid at every daemon start), and matched to this
//! process by inode against `/proc/self/fd`. Sockets of this process are never a conflict here: which of its own
//! ports may be shared (none) is the configuration's check, and a tenant removed and added again
//! on its port may meet its old listeners still closing.
//!
//! Errors read as memcached's start-up line: "failed to listen on TCP port 11211: Address
//! already in use".
//!
//! Not for: socket options of the serving paths (buffer sizes, SO_RXQ_OVFL): callers set them
//! in the `prepare` hook.

use socket2::{Domain, Protocol, Socket, Type};
use std::fmt;
use std::io::{self, BufRead};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// Most sockets one group may have (one per worker thread; the daemon caps threads lower).
pub const GROUP_SOCKETS_MAX: usize = 1024;
/// Lines read from one `/proc/net` table: far beyond any real host's sockets, but bounded.
const PROC_LINES_MAX: usize = 4_000_000;
/// TCP state LISTEN as `/proc/net/tcp` writes it.
const TCP_LISTEN: u8 = 0x0A;

/// Which kind of port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A TCP listener with this accept backlog.
    Tcp {
        backlog: i32,
    },
    Udp,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tcp { .. } => "TCP",
            Kind::Udp => "UDP",
        }
    }

    /// (address family, its `/proc/net` table) of each family.
    fn tables(self) -> [(u8, &'static str); 2] {
        let (v4, v6) = (libc::AF_INET as u8, libc::AF_INET6 as u8);
        match self {
            Kind::Tcp { .. } => [(v4, "/proc/net/tcp"), (v6, "/proc/net/tcp6")],
            Kind::Udp => [(v4, "/proc/net/udp"), (v6, "/proc/net/udp6")],
        }
    }
}

/// Why a port could not be opened.
#[derive(Debug)]
pub struct BindError {
    pub kind: Kind,
    pub addr: SocketAddr,
    pub source: io::Error,
}

impl BindError {
    /// Whether another socket holds the port (the admin API's 409).
    pub fn in_use(&self) -> bool {
        self.source.kind() == io::ErrorKind::AddrInUse
    }
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // memcached: "failed to listen on TCP port %d: %s" with strerror's text.
        let text = self.source.to_string();
        let text = match self.source.raw_os_error() {
            Some(code) => text.strip_suffix(&format!(" (os error {code})")).map(str::to_string).unwrap_or(text),
            None => text,
        };
        write!(f, "failed to listen on {} port {}: {text}", self.kind.name(), self.addr.port())
    }
}

impl std::error::Error for BindError {}

fn in_use() -> io::Error {
    io::Error::from_raw_os_error(libc::EADDRINUSE)
}

/// One socket on `addr`, exclusive by the kernel's own rule (no SO_REUSEPORT). `prepare` sets
/// options before the bind. Nonblocking.
pub fn bind_one(
    kind: Kind,
    addr: SocketAddr,
    prepare: &dyn Fn(&Socket) -> io::Result<()>,
) -> Result<Socket, BindError> {
    let err = |source| BindError { kind, addr, source };
    let s = new_socket(kind, addr, false, prepare).map_err(err)?;
    s.bind(&addr.into()).map_err(err)?;
    if let Kind::Tcp { backlog } = kind {
        s.listen(backlog).map_err(err)?;
    }
    Ok(s)
}

/// `count` sockets on `addr` sharing the port through SO_REUSEPORT and shared with no other
/// process (see the module doc). With port 0 the first bind picks the port and the others take
/// the same. `count` 1 is [`bind_one`].
pub fn bind_group(
    kind: Kind,
    addr: SocketAddr,
    count: usize,
    prepare: &dyn Fn(&Socket) -> io::Result<()>,
) -> Result<Vec<Socket>, BindError> {
    let err = |addr, source| BindError { kind, addr, source };
    if count == 0 || count > GROUP_SOCKETS_MAX {
        let e = io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{count} sockets asked for; 1..={GROUP_SOCKETS_MAX} allowed"),
        );
        return Err(err(addr, e));
    }
    if count == 1 {
        return bind_one(kind, addr, prepare).map(|s| vec![s]);
    }
    if addr.port() != 0 && !foreign(kind, addr, &[]).map_err(|e| err(addr, e))?.is_empty() {
        return Err(err(addr, in_use()));
    }
    let mut socks: Vec<Socket> = Vec::with_capacity(count);
    let mut at = addr;
    for _ in 0..count {
        let s = new_socket(kind, at, true, prepare).map_err(|e| err(at, e))?;
        s.bind(&at.into()).map_err(|e| err(at, e))?;
        if let Kind::Tcp { backlog } = kind {
            s.listen(backlog).map_err(|e| err(at, e))?;
        }
        if at.port() == 0 {
            at = s
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .ok_or_else(|| err(at, io::Error::other("no local address")))?;
        }
        socks.push(s);
    }
    let ours: Vec<u64> = socks.iter().filter_map(|s| inode_of(s).ok()).collect();
    let others = foreign(kind, at, &ours).map_err(|e| err(at, e))?;
    if !others.is_empty() {
        // Dropping `socks` closes them: the port is left to whoever else holds it.
        return Err(err(at, in_use()));
    }
    Ok(socks)
}

fn new_socket(
    kind: Kind,
    addr: SocketAddr,
    reuse_port: bool,
    prepare: &dyn Fn(&Socket) -> io::Result<()>,
) -> io::Result<Socket> {
    let domain = Domain::for_address(addr);
    let s = match kind {
        Kind::Tcp { .. } => {
            let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
            // TCP's SO_REUSEADDR only lets a restarted daemon bind past its old connections in
            // TIME_WAIT; it never lets two listeners share a port. UDP's would (for any user),
            // so UDP sockets never set it.
            s.set_reuse_address(true)?;
            s
        }
        Kind::Udp => Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?,
    };
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_nonblocking(true)?;
    prepare(&s)?;
    Ok(s)
}

/// The socket inode of `s` (what `/proc/net/*` and `/proc/self/fd` name it by).
fn inode_of(s: &Socket) -> io::Result<u64> {
    // SAFETY: `struct stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into our local `st`; the fd is open (borrowed from `s`).
    let rc = unsafe { libc::fstat(s.as_raw_fd(), &mut st) };
    if rc == 0 {
        Ok(st.st_ino as u64)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Inodes of sockets on `addr`'s port that overlap `addr`, are not in `skip` and are not this
/// process's.
fn foreign(kind: Kind, addr: SocketAddr, skip: &[u64]) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for (family, table) in kind.tables() {
        // The kernel's socket-diagnostics dump of the port's listeners; the /proc table (the
        // same sockets, every connection listed too) where sock_diag is not available.
        let entries = match diag_table(kind, family, addr.port()) {
            Ok(e) => e,
            Err(_) => read_table(table)?,
        };
        for e in entries {
            let listening = match kind {
                Kind::Tcp { .. } => e.state == TCP_LISTEN,
                Kind::Udp => true,
            };
            if listening
                && e.port == addr.port()
                && e.inode != 0
                && !skip.contains(&e.inode)
                && overlap(addr.ip(), e.ip)
            {
                found.push(e.inode);
            }
        }
    }
    if found.is_empty() {
        return Ok(found);
    }
    let own = own_socket_inodes()?;
    found.retain(|i| !own.contains(i));
    Ok(found)
}

/// One socket as `/proc/net/{tcp,udp}[6]` lists it.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    ip: IpAddr,
    port: u16,
    state: u8,
    inode: u64,
}

/// Netlink message type of a sock_diag request (`SOCK_DIAG_BY_FAMILY`).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// Bytes of `struct inet_diag_msg` (family, state, timer, retrans, the 48-byte socket id,
/// expires, rqueue, wqueue, uid, inode).
const DIAG_MSG_BYTES: usize = 72;
/// Netlink messages read from one dump: far beyond any real host's listeners, but bounded.
const DIAG_MSGS_MAX: usize = 4_000_000;

/// The sockets of `family` on `port` that can receive new traffic (TCP: listening; UDP: all),
/// from the kernel's sock_diag netlink dump. The kernel filters by state and port: a LISTEN
/// dump walks only the listening sockets, where a read of `/proc/net/tcp` walks the whole
/// established hash (every connection of the host, a page at a time): that read cost a
/// restarting daemon most of its start-up CPU (docs/benchmarks.md, replication session 15).
fn diag_table(kind: Kind, family: u8, port: u16) -> io::Result<Vec<Entry>> {
    let (protocol, states) = match kind {
        Kind::Tcp { .. } => (libc::IPPROTO_TCP as u8, 1u32 << TCP_LISTEN),
        Kind::Udp => (libc::IPPROTO_UDP as u8, u32::MAX),
    };
    // SAFETY: plain socket(2); the fd is owned by `fd` below and closed on every path.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new open fd nobody else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    // nlmsghdr (len, type, flags = REQUEST | DUMP, seq, pid) + inet_diag_req_v2 (family,
    // protocol, ext, pad, states, socket id with the source port in network order).
    let mut req = Vec::with_capacity(72);
    req.extend_from_slice(&72u32.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[family, protocol, 0, 0]);
    req.extend_from_slice(&states.to_ne_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    req.resize(72, 0);
    // SAFETY: all-zero is a valid sockaddr_nl (pid 0 = the kernel); the family is set below.
    let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `to` are valid for the lengths given; the fd is open.
    let sent = unsafe {
        libc::sendto(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            req.as_ptr().cast(),
            req.len(),
            0,
            std::ptr::addr_of!(to).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut seen = 0usize;
    loop {
        // SAFETY: `buf` is valid for its length; the fd is open.
        let n = unsafe { libc::recv(std::os::fd::AsRawFd::as_raw_fd(&fd), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut at = 0usize;
        let n = n as usize;
        while at + 16 <= n {
            let word = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
            let len = word(at) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < 16 || at + len > n {
                return Err(io::Error::other("sock_diag: bad netlink message"));
            }
            match kind as i32 {
                libc::NLMSG_DONE => return Ok(out),
                libc::NLMSG_ERROR => {
                    let code = if len >= 20 { word(at + 16) as i32 } else { 0 };
                    return Err(io::Error::from_raw_os_error(-code));
                }
                _ if len >= 16 + DIAG_MSG_BYTES => {
                    if let Some(e) = parse_diag(&buf[at + 16..at + 16 + DIAG_MSG_BYTES]) {
                        out.push(e);
                    }
                }
                _ => {}
            }
            seen += 1;
            if seen > DIAG_MSGS_MAX {
                return Err(io::Error::other("sock_diag: too many sockets"));
            }
            at += (len + 3) & !3; // NLMSG_ALIGN
        }
        if n == 0 {
            return Err(io::Error::other("sock_diag: dump ended without NLMSG_DONE"));
        }
    }
}

/// One `struct inet_diag_msg`: family, state, ..., id.sport (network order) at 4, id.src at 8
/// (the address bytes), inode at 68.
fn parse_diag(m: &[u8]) -> Option<Entry> {
    let ip = match i32::from(m[0]) {
        libc::AF_INET => IpAddr::V4(Ipv4Addr::new(m[8], m[9], m[10], m[11])),
        libc::AF_INET6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&m[8..24]).ok()?)),
        _ => return None,
    };
    Some(Entry {
        ip,
        port: u16::from_be_bytes([m[4], m[5]]),
        state: m[1],
        inode: u64::from(u32::from_ne_bytes([m[68], m[69], m[70], m[71]])),
    })
}

fn read_table(path: &str) -> io::Result<Vec<Entry>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // No IPv6 in this kernel: nothing can be bound there.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in io::BufReader::new(file).lines().skip(1).take(PROC_LINES_MAX) {
        if let Some(e) = parse_line(&line?) {
            out.push(e);
        }
    }
    Ok(out)
}

/// `  0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 12345 ...`
/// (the address words are the kernel's in-memory bytes, printed as native-endian u32s).
fn parse_line(line: &str) -> Option<Entry> {
    let f: Vec<&str> = line.split_whitespace().take(10).collect();
    let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
    let (ip_hex, port_hex) = local.split_once(':')?;
    let ip = match ip_hex.len() {
        8 => IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(ip_hex, 16).ok()?.to_ne_bytes())),
        32 => {
            let mut b = [0u8; 16];
            for (i, chunk) in b.chunks_exact_mut(4).enumerate() {
                let w = u32::from_str_radix(ip_hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
                chunk.copy_from_slice(&w.to_ne_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(Entry {
        ip,
        port: u16::from_str_radix(port_hex, 16).ok()?,
        state: u8::from_str_radix(state, 16).ok()?,
        inode: inode.parse().ok()?,
    })
}

/// What a bound address receives: everything, all of IPv4, or one address.
#[derive(Debug, PartialEq, Eq)]
enum Scope {
    /// `::` (dual-stack unless IPV6_V6ONLY, which the tables do not show: taken as dual).
    All,
    V4All,
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

fn scope(ip: IpAddr) -> Scope {
    match ip {
        IpAddr::V4(a) if a.is_unspecified() => Scope::V4All,
        IpAddr::V4(a) => Scope::V4(a),
        IpAddr::V6(a) if a.is_unspecified() => Scope::All,
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) if v4.is_unspecified() => Scope::V4All,
            Some(v4) => Scope::V4(v4),
            None => Scope::V6(a),
        },
    }
}

/// Whether sockets bound to `a` and `b` (same port) could both receive the same traffic.
fn overlap(a: IpAddr, b: IpAddr) -> bool {
    match (scope(a), scope(b)) {
        (Scope::All, _) | (_, Scope::All) => true,
        (Scope::V4All, Scope::V4All | Scope::V4(_)) | (Scope::V4(_), Scope::V4All) => true,
        (Scope::V4(x), Scope::V4(y)) => x == y,
        (Scope::V6(x), Scope::V6(y)) => x == y,
        _ => false,
    }
}

/// Inodes of every socket this process has open.
fn own_socket_inodes() -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        // An fd closed while we list is simply not ours any more.
        let Ok(target) = std::fs::read_link(e?.path()) else { continue };
        let t = target.to_string_lossy();
        if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')).and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The sock_diag dump names the same listeners of a port as the /proc table (address,
    /// state, inode), for TCP and UDP, IPv4 and IPv6; a connection on the port is not listed.
    #[test]
    fn sock_diag_finds_what_the_proc_table_lists() {
        let v6 = std::net::TcpListener::bind("[::1]:0").is_ok();
        let mut cases = vec![("127.0.0.1:0", libc::AF_INET as u8)];
        if v6 {
            cases.push(("[::1]:0", libc::AF_INET6 as u8));
        }
        for (addr, family) in cases {
            let l = std::net::TcpListener::bind(addr).unwrap();
            let at = l.local_addr().unwrap();
            let _conn = std::net::TcpStream::connect(at).unwrap(); // an established socket too
            let u = std::net::UdpSocket::bind(addr).unwrap();
            let uat = u.local_addr().unwrap();
            let (tcp, udp) = (Kind::Tcp { backlog: 1 }, Kind::Udp);
            for (kind, port, table) in [(tcp, at.port(), tcp.tables()), (udp, uat.port(), udp.tables())] {
                let path = table.iter().find(|t| t.0 == family).unwrap().1;
                let listening = |e: &Entry| e.port == port && (kind == Kind::Udp || e.state == TCP_LISTEN);
                let mut want: Vec<Entry> = read_table(path).unwrap().into_iter().filter(listening).collect();
                let mut got: Vec<Entry> =
                    diag_table(kind, family, port).unwrap().into_iter().filter(|e| e.port == port).collect();
                want.sort_by_key(|e| e.inode);
                got.sort_by_key(|e| e.inode);
                assert_eq!(got.len(), 1, "{addr} {kind:?}: {got:?}");
                assert_eq!(got, want, "{addr} {kind:?}");
            }
        }
    }

    #[test]
    fn proc_lines_parse() {
        let v4 = "   0: 0100007F:52AF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0";
        let e = parse_line(v4).unwrap();
        assert_eq!(e, Entry { ip: ip("127.0.0.1"), port: 21167, state: 0x0A, inode: 123456 });
        let v6 = "   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 42 2 0000000000000000 0";
        assert_eq!(parse_line(v6).unwrap().ip, ip("::1"));
        let mapped = "   0: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 7 1";
        assert_eq!(parse_line(mapped).unwrap().ip, ip("::ffff:127.0.0.1"));
        assert_eq!(parse_line("  sl  local_address rem_address   st tx_queue"), None);
    }

    #[test]
    fn overlapping_addresses() {
        for (a, b, want) in [
            ("127.0.0.1", "127.0.0.1", true),
            ("127.0.0.1", "127.0.0.2", false),
            ("0.0.0.0", "127.0.0.1", true),
            ("127.0.0.1", "0.0.0.0", true),
            ("::", "127.0.0.1", true),
            ("::1", "::", true),
            ("::1", "127.0.0.1", false),
            ("::1", "0.0.0.0", false),
            ("::ffff:127.0.0.1", "127.0.0.1", true),
            ("::ffff:0.0.0.0", "10.0.0.1", true),
            ("::ffff:10.0.0.2", "10.0.0.1", false),
            ("fe80::1", "fe80::1", true),
        ] {
            assert_eq!(overlap(ip(a), ip(b)), want, "{a} vs {b}");
        }
    }

    fn nothing(_: &Socket) -> io::Result<()> {
        Ok(())
    }

    #[test]
    fn a_group_binds_and_shares_its_port() {
        for kind in [Kind::Tcp { backlog: 16 }, Kind::Udp] {
            let g = bind_group(kind, "127.0.0.1:0".parse().unwrap(), 3, &nothing).unwrap();
            let ports: Vec<u16> = g.iter().map(|s| s.local_addr().unwrap().as_socket().unwrap().port()).collect();
            assert!(ports.iter().all(|p| *p == ports[0] && *p != 0), "{ports:?}");
        }
    }

    #[test]
    fn our_own_sockets_are_no_conflict_but_the_kernel_rule_holds() {
        // A second group of this process on the port is the configuration's concern, not ours.
        let g = bind_group(Kind::Udp, "127.0.0.1:0".parse().unwrap(), 2, &nothing).unwrap();
        let at = g[0].local_addr().unwrap().as_socket().unwrap();
        assert!(bind_group(Kind::Udp, at, 2, &nothing).is_ok());
        // A single socket (no SO_REUSEPORT) is refused by the kernel itself, in memcached's words.
        let e = bind_one(Kind::Udp, at, &nothing).unwrap_err();
        assert!(e.in_use(), "{e}");
        assert_eq!(e.to_string(), format!("failed to listen on UDP port {}: Address already in use", at.port()));
    }

    #[test]
    fn bad_counts_are_refused() {
        assert!(bind_group(Kind::Udp, "127.0.0.1:0".parse().unwrap(), 0, &nothing).is_err());
        assert!(bind_group(Kind::Udp, "127.0.0.1:0".parse().unwrap(), GROUP_SOCKETS_MAX + 1, &nothing).is_err());
    }
}
