//! Passing an application's or a shuffle's end on to the other hosts' daemons (issue 17,
//! multi-host cleanup). Map outputs sit in the daemon of the host where their map task ran, but
//! only the daemon the driver talks to hears its UNREGISTER_APP (and the driver's UNREGISTER),
//! or sees its DRIVER connection end. That daemon passes each on to every `[shuffle] peers`
//! daemon as a line marked PEER (crate::proto): a peer applies a PEER line and does not pass it
//! on, so daemons that list each other do not bounce lines between them.
//!
//! Off the request path: a request only queues the line ([`Forwarder::send`]); one thread per
//! peer delivers that peer's queue in order on one kept connection (connect, read and write
//! timeouts `peer_timeout_ms`), each line tried at most FORWARD_TRIES times with a growing pause
//! between tries. A dead or partitioned peer so delays only its own queue, never a request nor
//! the other peers. While a peer is down (its last line failed every try) each further line is
//! tried once, so a backlog drains at one timeout a line. The queue is bounded
//! (FORWARD_QUEUE_MAX lines); a line dropped because the queue is full or the peer never took it
//! is counted (`slipstream_shuffle_peer_forward_errors_total`). Applying a line twice is
//! harmless (unregistering what is gone does nothing), so a try whose answer was lost may be
//! repeated. Every daemon that hears an UNREGISTER passes it on, executors' daemons too (the
//! driver's may not know the shuffle: no map task of it ran there), so a shuffle's end reaches
//! a peer once per such request; the lines are short and the peer answers each at once.
//!
//! Not for: a peer unreachable for all the tries keeps the application's blocks (until it is
//! unregistered there, or restarted: a daemon clears its pool at start).

use crate::peer;
use crate::proto::LINE_BYTES_MAX;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// Most lines waiting for one peer.
pub const FORWARD_QUEUE_MAX: usize = 1024;
/// Most tries of one line while the peer is up.
pub const FORWARD_TRIES: u32 = 4;
/// The pause after a line's first failed try; doubled after each further one (0.25 + 0.5 + 1 s).
const FORWARD_RETRY_PAUSE_MS: u64 = 250;

/// Lines delivered and lines given up, exported with the peer counters.
#[derive(Debug, Default)]
pub struct ForwardCounts {
    pub forwarded: AtomicU64,
    pub errors: AtomicU64,
}

impl ForwardCounts {
    /// (name, kind, help, value) rows for the Prometheus exposition.
    pub fn rows(&self) -> [(&'static str, &'static str, &'static str, u64); 2] {
        [
            (
                "peer_forwards_total",
                "counter",
                "UNREGISTER/UNREGISTER_APP lines passed on to peers and answered OK",
                self.forwarded.load(Ordering::Relaxed),
            ),
            (
                "peer_forward_errors_total",
                "counter",
                "Lines for peers given up (queue full, peer unreachable for every try, or refused)",
                self.errors.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// The queues to the peers' delivery threads.
pub struct Forwarder {
    queues: Vec<SyncSender<String>>,
    pub counts: Arc<ForwardCounts>,
}

impl Forwarder {
    /// A delivery thread per peer (none without peers). `timeout`: of each connect, read and write.
    pub fn start(peers: &[SocketAddr], timeout: Duration) -> Result<Forwarder, String> {
        let counts = Arc::new(ForwardCounts::default());
        let mut queues = Vec::with_capacity(peers.len());
        for &p in peers {
            let (tx, rx) = sync_channel(FORWARD_QUEUE_MAX);
            let c = counts.clone();
            std::thread::Builder::new()
                .name("shuffle-forward".into())
                .spawn(move || deliver(p, timeout, &rx, &c))
                .map_err(|e| format!("shuffle forward thread: {e}"))?;
            queues.push(tx);
        }
        Ok(Forwarder { queues, counts })
    }

    /// Queues `line` (a PEER-marked request, crate::proto) for every peer; never waits.
    pub fn send(&self, line: &str) {
        for q in &self.queues {
            match q.try_send(line.to_string()) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.counts.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// One peer's thread: its lines in order, until the service (the sender) is gone.
fn deliver(peer: SocketAddr, timeout: Duration, rx: &Receiver<String>, counts: &ForwardCounts) {
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut peer_down = false;
    while let Ok(line) = rx.recv() {
        let tries = if peer_down { 1 } else { FORWARD_TRIES };
        let mut outcome = Err(());
        for i in 0..tries {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(FORWARD_RETRY_PAUSE_MS << (i - 1)));
            }
            match try_once(peer, timeout, &mut conn, &line) {
                Ok(answer) => {
                    outcome = Ok(answer);
                    break;
                }
                Err(_) => conn = None,
            }
        }
        peer_down = outcome.is_err();
        match outcome {
            Ok(true) => counts.forwarded.fetch_add(1, Ordering::Relaxed),
            // Refused (a peer too old for PEER lines) or never delivered.
            Ok(false) | Err(()) => counts.errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Sends `line` on the kept connection (opened if there is none) and reads its answer: Ok(true)
/// for OK, Ok(false) for any other answer (a try again would get the same).
fn try_once(
    peer: SocketAddr,
    timeout: Duration,
    conn: &mut Option<BufReader<TcpStream>>,
    line: &str,
) -> std::io::Result<bool> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(peer::connect(peer, timeout)?),
    };
    c.get_mut().write_all(line.as_bytes())?;
    let mut answer = Vec::with_capacity(LINE_BYTES_MAX);
    peer::read_line(c, &mut answer)?;
    Ok(answer == crate::proto::OK.as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;
    use std::time::Instant;

    /// A peer that answers OK to each line, and one that is not there: the live one gets every
    /// line in order on one connection; the dead one costs the caller nothing and is counted.
    #[test]
    fn lines_reach_a_live_peer_in_order_and_a_dead_one_is_counted_not_waited_for() {
        let live = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = TcpListener::bind("127.0.0.1:0").unwrap();
        let (live_addr, dead_addr) = (live.local_addr().unwrap(), dead.local_addr().unwrap());
        drop(dead); // connection refused from now on
        let f = Forwarder::start(&[dead_addr, live_addr], Duration::from_secs(2)).unwrap();
        let started = Instant::now();
        for i in 0..3 {
            f.send(&crate::proto::unregister_for_peer("app-1", i));
        }
        assert!(started.elapsed() < Duration::from_millis(100), "send waited for a peer");
        let sock = accept_within(&live, Duration::from_secs(20));
        let mut r = BufReader::new(sock.try_clone().unwrap());
        let mut w = sock;
        for i in 0..3 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert_eq!(line, crate::proto::unregister_for_peer("app-1", i));
            w.write_all(crate::proto::OK.as_bytes()).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while (f.counts.forwarded.load(Ordering::Relaxed), f.counts.errors.load(Ordering::Relaxed)) != (3, 3) {
            assert!(Instant::now() < deadline, "counts {:?}", f.counts);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The first connection to `l`, waiting at most `wait` (a forwarder that never connects
    /// fails the test instead of hanging it).
    fn accept_within(l: &TcpListener, wait: Duration) -> std::net::TcpStream {
        l.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + wait;
        loop {
            match l.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(false).unwrap();
                    sock.set_read_timeout(Some(wait)).unwrap();
                    return sock;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("no connection from the forwarder: {e}"),
            }
        }
    }
}
