//! Serving a replicated tenant's port on a node that holds no replica of it (`[[tenant]]
//! nodes` / `replicas` fewer than the cluster's nodes): each accepted connection is relayed,
//! bytes both ways and unparsed, to the tenant's port on one of its nodes (the group's current
//! leader first, then the preferred leader and the others in placement order), which serves it as it serves its own
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
//! The current leader: this node holds no replica, so it asks a member over the member's raft
//! port (`slipstream_replication::transport::ask_leader`, one short connection) and keeps the
//! answer for `LEADER_HINT_TTL_MS`; a write relayed to the leader is served there in one hop,
//! not forwarded again by a follower. An unknown or unreachable leader falls back to the
//! placement order, so the hint only saves latency, it is never needed for correctness (a
//! member that follows forwards).
//!
//! Not for: connections of tenants this node holds (net), raft traffic (replication's
//! transport). TLS passes through unread: the member terminates it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long connecting to one member may take before the next is tried.
pub const RELAY_CONNECT_TIMEOUT_MS: u64 = 500;
/// How long a member's answer to "who leads?" is used before asking again.
pub const LEADER_HINT_TTL_MS: u64 = 1000;
/// How long asking one member who leads may take (connect, then the answer).
const LEADER_ASK_TIMEOUT_MS: u64 = 200;
/// Bytes copied per read on each direction.
const RELAY_CHUNK_BYTES: usize = 64 * 1024;

/// One node of the tenant's group.
#[derive(Clone, Copy, Debug)]
pub struct Member {
    pub node: u64,
    /// The tenant's port on it.
    pub client: SocketAddr,
    /// Its raft port (asked who leads).
    pub raft: SocketAddr,
}

/// A tenant's members (in the order tried when the leader is not known: the preferred leader
/// first), and counters.
#[derive(Debug)]
pub struct Relay {
    group: u64,
    members: Vec<Member>,
    /// The leader a member last named (0 = none) and when it was asked.
    hint: Mutex<(u64, Option<Instant>)>,
    /// Connections relayed to a member.
    pub relayed: AtomicU64,
    /// Of those, relayed to the node a member named the group's leader.
    pub to_leader: AtomicU64,
    /// Connections closed because no member accepted one.
    pub unreachable: AtomicU64,
    /// Relayed connections open now.
    pub open: AtomicUsize,
}

impl Relay {
    pub fn new(group: u64, members: Vec<Member>) -> Relay {
        Relay {
            group,
            members,
            hint: Mutex::new((0, None)),
            relayed: AtomicU64::new(0),
            to_leader: AtomicU64::new(0),
            unreachable: AtomicU64::new(0),
            open: AtomicUsize::new(0),
        }
    }

    /// The members with `node` first (if it is one), the rest in placement order.
    fn members_from(&self, node: u64) -> Vec<&Member> {
        let mut order: Vec<&Member> = self.members.iter().collect();
        order.sort_by_key(|m| m.node != node); // stable: the rest keep placement order
        order
    }

    /// The group's leader as a member last said (asked again once the answer is older than
    /// `LEADER_HINT_TTL_MS`: the last named leader first, then the members in order); 0 = no
    /// member knows or answers.
    fn leader(&self) -> u64 {
        // Held while asking: connections arriving meanwhile wait for this answer (at most
        // LEADER_ASK_TIMEOUT_MS per member) instead of each asking again.
        let mut hint = self.hint.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if hint.1.is_some_and(|at| at.elapsed() < Duration::from_millis(LEADER_HINT_TTL_MS)) {
            return hint.0;
        }
        let wait = Duration::from_millis(LEADER_ASK_TIMEOUT_MS);
        let asked = self.members_from(hint.0);
        let known = |l: u64| self.members.iter().any(|m| m.node == l);
        let leader = asked
            .iter()
            .find_map(|m| {
                slipstream_replication::transport::ask_leader(m.raft, self.group, wait).ok().filter(|&l| known(l))
            })
            .unwrap_or(0);
        *hint = (leader, Some(Instant::now()));
        leader
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
        let leader = self.leader();
        let (m, s) = self
            .members_from(leader)
            .into_iter()
            .find_map(|m| TcpStream::connect_timeout(&m.client, wait).ok().map(|s| (m, s)))?;
        if m.node == leader {
            self.to_leader.fetch_add(1, Ordering::Relaxed);
        }
        let _ = s.set_nodelay(true);
        Some(s)
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

    /// A member whose raft port nobody answers (its leader is not known).
    fn member(node: u64, client: SocketAddr) -> Member {
        let gone = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        Member { node, client, raft: gone }
    }

    /// Member 3 of three live ones leads (its raft port says so; member 1's does not know):
    /// connections go to member 3 first, though member 1 is first in placement order.
    #[test]
    fn connections_go_to_the_leader_a_member_names() {
        let fronts: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let raft3 = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut members: Vec<Member> =
            fronts.iter().enumerate().map(|(i, l)| member(i as u64 + 1, l.local_addr().unwrap())).collect();
        members[2].raft = raft3.local_addr().unwrap();
        // Member 3's raft port answers a leader query for group 77 with "3".
        let answering = std::thread::spawn(move || {
            let (mut s, _) = raft3.accept().unwrap();
            let mut hello = [0u8; 12];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(u64::from_le_bytes(hello[4..].try_into().unwrap()), 77);
            s.write_all(&3u64.to_le_bytes()).unwrap();
        });
        let relay = Arc::new(Relay::new(77, members));
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(front.local_addr().unwrap()).unwrap();
        let (accepted, _) = front.accept().unwrap();
        relay.start(accepted);
        answering.join().unwrap();
        fronts[2].set_nonblocking(false).unwrap();
        let (_to_leader, _) = fronts[2].accept().unwrap(); // member 3 got the connection
        assert_eq!(relay.to_leader.load(Ordering::Relaxed), 1);
        // Member 1 (first in placement order) got nothing.
        fronts[0].set_nonblocking(true).unwrap();
        assert!(fronts[0].accept().is_err(), "the relay went to member 1 first");
        drop(client);
    }

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
        let relay = Arc::new(Relay::new(1, vec![member(1, dead_addr), member(2, echo_addr)]));
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
        let relay = Arc::new(Relay::new(1, vec![member(1, dead_addr)]));
        relay.start(accepted);
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap();
        assert!(got.starts_with(b"SERVER_ERROR no node"), "{got:?}");
        assert_eq!(relay.unreachable.load(Ordering::Relaxed), 1);
    }
}
