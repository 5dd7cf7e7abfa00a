//! Serving a replicated tenant's port on a node that holds no replica of it (`[[tenant]]
//! nodes` / `replicas` fewer than the cluster's nodes): each accepted connection is relayed,
//! bytes both ways and unparsed, to the tenant's port on one of its nodes (the preferred
//! leader first, then the others in placement order), which serves it as it serves its own
//! clients: a member that follows forwards writes to the group's leader, reads get its
//! ReadIndex barrier. So an unmodified memcached client works against any node, in every
//! protocol, and this node's store of the tenant stays empty.
//!
//! A connection is relayed for its whole life to the member it was first connected to; if
//! that member dies, the relayed connection closes (as the client's own connection to it
//! would: requests in flight have an unknown outcome) and the client's reconnect is relayed to
//! a live member. Nothing reaches the tenant's store or buckets here (the member charges
//! them); connections count against the node's connection limit.
//!
//! Not for: connections of tenants this node holds (net), raft traffic (replication's
//! transport). TLS passes through unread: the member terminates it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long connecting to one member may take before the next is tried.
pub const RELAY_CONNECT_TIMEOUT_MS: u64 = 500;
/// Bytes copied per read on each direction.
const RELAY_CHUNK_BYTES: usize = 64 * 1024;

/// A tenant's members' client addresses, in the order they are tried, and counters.
#[derive(Debug)]
pub struct Relay {
    pub targets: Vec<SocketAddr>,
    /// Connections relayed to a member.
    pub relayed: AtomicU64,
    /// Connections closed because no member accepted one.
    pub unreachable: AtomicU64,
    /// Relayed connections open now.
    pub open: AtomicUsize,
}

impl Relay {
    pub fn new(targets: Vec<SocketAddr>) -> Relay {
        Relay { targets, relayed: AtomicU64::new(0), unreachable: AtomicU64::new(0), open: AtomicUsize::new(0) }
    }

    /// Relay `client` (a connection accepted on the tenant's port) to the first member that
    /// accepts. Two threads per relayed connection (one each way), blocking I/O: relayed
    /// connections are the exception (clients not told the tenant's nodes), not the serving
    /// path; the caller bounds how many are `open`.
    pub fn start(self: &Arc<Self>, client: TcpStream) {
        let relay = self.clone();
        self.open.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new().name("relay".into()).spawn(move || {
            relay.run(client);
            relay.open.fetch_sub(1, Ordering::Relaxed);
        });
        if let Err(e) = spawned {
            self.open.fetch_sub(1, Ordering::Relaxed);
            eprintln!("slipstream: cannot start a relay thread: {e}");
        }
    }

    fn run(&self, client: TcpStream) {
        let _ = client.set_nonblocking(false);
        let _ = client.set_nodelay(true);
        let Some(member) = self.connect() else {
            self.unreachable.fetch_add(1, Ordering::Relaxed);
            // Any protocol's client reads this as an error line (binary ones just drop it).
            let _ = (&client).write_all(b"SERVER_ERROR no node of this tenant's group is reachable\r\n");
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        self.relayed.fetch_add(1, Ordering::Relaxed);
        let (Ok(c2), Ok(m2)) = (client.try_clone(), member.try_clone()) else { return };
        let back = std::thread::Builder::new().name("relay-back".into()).spawn(move || pump(m2, c2, true));
        pump(client, member, false);
        if let Ok(h) = back {
            let _ = h.join();
        }
    }

    fn connect(&self) -> Option<TcpStream> {
        let wait = Duration::from_millis(RELAY_CONNECT_TIMEOUT_MS);
        self.targets.iter().find_map(|a| TcpStream::connect_timeout(a, wait).ok()).inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    }
}

/// Copy `from` to `to` until `from` ends or either fails, then end what depends on it: `to`
/// gets the end of stream (all of `to` when `end_to` — the member ended, so the client's
/// connection is over and the other pump, blocked reading the client, wakes up; a client's
/// end is only a half-close: it may still wait for replies), and a failed write closes
/// `from` too.
fn pump(mut from: TcpStream, mut to: TcpStream, end_to: bool) {
    let mut buf = vec![0u8; RELAY_CHUNK_BYTES];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    let _ = from.shutdown(Shutdown::Both);
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // The other side's reader sees the end; a dead member (reset) ends the client too.
    let _ = to.shutdown(if end_to { Shutdown::Both } else { Shutdown::Write });
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn bytes_go_both_ways_to_the_first_member_that_accepts_and_its_end_ends_the_relay() {
        // A dead target first (a port nobody listens on), then an echo server.
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap();
            s.write_all(&buf[..n]).unwrap();
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        let relay = Arc::new(Relay::new(vec![dead_addr, echo_addr]));
        let mut client = TcpStream::connect(front_addr).unwrap();
        let (accepted, _) = front.accept().unwrap();
        relay.start(accepted);
        client.write_all(b"get k\r\n").unwrap();
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"get k\r\n");
        server.join().unwrap();
        // The member ended: the relay ends too, though the client still holds its socket.
        for _ in 0..500 {
            if relay.open.load(Ordering::Relaxed) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(relay.relayed.load(Ordering::Relaxed), 1);
        assert_eq!(relay.open.load(Ordering::Relaxed), 0, "the relay ended");
        drop(client);
    }

    #[test]
    fn no_member_reachable_is_a_stated_error() {
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        let (accepted, _) = front.accept().unwrap();
        let relay = Arc::new(Relay::new(vec![dead_addr]));
        relay.start(accepted);
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert!(got.starts_with(b"SERVER_ERROR no node"), "{got:?}");
        assert_eq!(relay.unreachable.load(Ordering::Relaxed), 1);
    }
}
