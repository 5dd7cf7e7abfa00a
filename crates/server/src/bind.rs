//! Binding the serving sockets: each worker thread's TCP listener and UDP socket for one
//! address, by the project's one port rule (`slipstream-bind`: a SO_REUSEPORT group that no
//! other process shares). Used for the `-p`/`-U` ports (net.rs) and every tenant's (tenants.rs).
//!
//! Not for: serving them (net.rs) or choosing which ports a tenant may have (slipstream-tenancy).

use slipstream_bind::{bind_group, BindError, Kind};
use std::io;
use std::net::SocketAddr;

/// SO_SNDBUF / SO_RCVBUF asked for each UDP socket: bigger buffers absorb bursts from many
/// clients; the kernel caps these at wmem_max / rmem_max.
pub const UDP_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// One socket per worker on each address given: TCP listeners, UDP sockets, and the addresses
/// they are bound to (port 0 resolved).
pub(crate) type Bound =
    (Vec<Option<std::net::TcpListener>>, Vec<Option<std::net::UdpSocket>>, Option<SocketAddr>, Option<SocketAddr>);

fn udp_buffers(s: &socket2::Socket) -> io::Result<()> {
    // Best effort: a smaller buffer still works.
    let _ = s.set_recv_buffer_size(UDP_BUFFER_BYTES);
    let _ = s.set_send_buffer_size(UDP_BUFFER_BYTES);
    Ok(())
}

/// Bind `threads` sockets on each address given; nothing stays bound on failure.
/// `backlog` is each TCP listener's accept backlog (memcached `-b`).
pub(crate) fn bind_all(
    tcp_addr: Option<SocketAddr>,
    udp_addr: Option<SocketAddr>,
    threads: usize,
    backlog: i32,
) -> Result<Bound, BindError> {
    let threads = threads.max(1);
    // UDP first: clients (and tests) take an accepting TCP listener as "ready", and the
    // kernel completes TCP handshakes as soon as a listener exists, so once TCP answers the
    // UDP port must already be bound.
    let (mut udps, mut udp_local) = (Vec::new(), None);
    if let Some(addr) = udp_addr {
        let socks = bind_group(Kind::Udp, addr, threads, &udp_buffers)?;
        udp_local = socks.first().and_then(|s| s.local_addr().ok()).and_then(|a| a.as_socket());
        udps = socks.into_iter().map(|s| Some(s.into())).collect();
    } else {
        udps.resize_with(threads, || None);
    }
    let (mut tcps, mut tcp_local) = (Vec::new(), None);
    if let Some(addr) = tcp_addr {
        let socks = bind_group(Kind::Tcp { backlog }, addr, threads, &|_| Ok(()))?;
        tcp_local = socks.first().and_then(|s| s.local_addr().ok()).and_then(|a| a.as_socket());
        tcps = socks.into_iter().map(|s| Some(s.into())).collect();
    } else {
        tcps.resize_with(threads, || None);
    }
    Ok((tcps, udps, tcp_local, udp_local))
}
