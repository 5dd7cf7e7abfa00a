//! The sidecar client: one TCP connection to the sidecar, shared by every front-end thread.
//! Requests are multiplexed by id (a reader thread hands each answer to its waiter), each call
//! has a deadline, and a lost connection fails every pending call with `Unavailable` and is
//! re-dialled by the next call. Typed operations (get, scan, mutate, …) sit on top.
//!
//! Every connection first SUBSCRIBEs to invalidation notices (the RegionObserver's reports of
//! writes made by any HBase client). The reader thread hands each notice to the listener (the
//! cache) and ACKs a BEGIN only after the listener returned, i.e. after the rows are invalidated.
//! The **lease**: the cache may serve only while `lease_valid()`, i.e. within `lease` of a request
//! sent on a subscribed connection that has since been answered (a PING every `lease / 4` keeps it
//! up when idle). The sidecar holds writes for the same lease after dropping a subscriber, so once
//! a write is acknowledged either Slipstream has invalidated or its lease has run out. A sidecar in
//! front of a real cluster answers SUBSCRIBE with `covered` = false while not every region
//! server's observer is subscribed, and sends SUSPEND / RESUME notices when that changes: answers
//! on an uncovered connection never extend the lease (the cache is bypassed), and every change
//! flushes the cache (the generation moves). The reader thread applies both in stream order.

use super::codec::{
    op, parse_notice, parse_response, status, status_error, Decoder, Encoder, Family, MutateOrder, Notice, NoticeKind,
    ReadSpec, Row, RowMutations, SidecarError, FRAME_BYTES_MAX, HEADER_BYTES,
};
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

type Reply = Result<(u8, Vec<u8>), SidecarError>;

/// SUBSCRIBE is the first request of every connection, so it has the first id.
const SUBSCRIBE_ID: u32 = 1;

/// How an error starts when the request never reached the sidecar (safe to send again).
const NOT_SENT: &str = "request not sent";

/// Receives invalidation notices (on the connection's reader thread; must not block).
pub type Listener = Arc<dyn Fn(&Notice) + Send + Sync>;

/// The lease clock: nanoseconds since the client was made (0 = no lease).
#[derive(Debug)]
struct Lease {
    base: Instant,
    length: Duration,
    until_ns: AtomicU64,
}

impl Lease {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
    /// A request sent at `sent_ns` was answered on a subscribed connection.
    fn extend_from(&self, sent_ns: u64) {
        self.until_ns.fetch_max(sent_ns + self.length.as_nanos() as u64, Ordering::SeqCst);
    }
    fn end(&self) {
        self.until_ns.store(0, Ordering::SeqCst);
    }
    fn valid(&self) -> bool {
        self.now_ns() < self.until_ns.load(Ordering::SeqCst)
    }
}

/// One live connection: the writer, the waiters by request id, and whether it has died.
struct Conn {
    writer: Mutex<TcpStream>,
    pending: Mutex<HashMap<u32, SyncSender<Reply>>>,
    next_id: AtomicU32,
    dead: AtomicBool,
    /// The sidecar answered SUBSCRIBE with `covered` (answers may extend the lease).
    covered: AtomicBool,
    /// The client's connect-and-loss counter (see `SidecarClient::generation`).
    generation: Arc<AtomicU64>,
    lease: Arc<Lease>,
    listener: Arc<OnceLock<Listener>>,
}

impl Conn {
    fn fail_all(&self, why: &str) {
        if !self.dead.swap(true, Ordering::SeqCst) {
            // Notices may have been lost: no more serving from the cache, and a flush first.
            self.lease.end();
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        let waiters: Vec<_> = lock(&self.pending).drain().collect();
        for (_, tx) in waiters {
            let _ = tx.try_send(Err(SidecarError::Unavailable(why.to_string())));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere aborts the process (the daemon's abort_on_panic hook), so poisoning cannot be observed;
    // recover the guard anyway rather than unwrap.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads answer frames and hands each to its waiter until the connection fails.
fn reader_loop(conn: Arc<Conn>, stream: TcpStream) {
    let mut r = BufReader::with_capacity(1 << 16, stream);
    let why = loop {
        let mut len = [0u8; 4];
        if let Err(e) = r.read_exact(&mut len) {
            break format!("connection lost: {e}");
        }
        let n = u32::from_be_bytes(len) as usize;
        if !(HEADER_BYTES..=FRAME_BYTES_MAX).contains(&n) {
            break format!("bad frame length {n}");
        }
        let mut body = vec![0u8; n];
        if let Err(e) = r.read_exact(&mut body) {
            break format!("connection lost: {e}");
        }
        let resp = match parse_response(&body) {
            Ok(resp) => resp,
            Err(e) => break e.to_string(),
        };
        if resp.status == status::NOTICE {
            let notice = match parse_notice(resp.id, resp.payload) {
                Ok(n) => n,
                Err(e) => break e.to_string(),
            };
            match notice.kind {
                NoticeKind::Suspend => {
                    // Covered false first: a waiter extending the lease re-checks it after.
                    conn.covered.store(false, Ordering::SeqCst);
                    conn.lease.end();
                    conn.generation.fetch_add(1, Ordering::SeqCst);
                }
                NoticeKind::Resume => {
                    // Fills made meanwhile may predate unseen writes: flush before covering.
                    conn.generation.fetch_add(1, Ordering::SeqCst);
                    conn.covered.store(true, Ordering::SeqCst);
                }
                NoticeKind::Begin | NoticeKind::End => {}
            }
            if let Some(l) = conn.listener.get() {
                l(&notice);
            }
            if notice.kind == NoticeKind::Begin {
                // Only now, with the rows invalidated, may the write go ahead.
                let ack = Encoder::new(notice.id, op::NOTICE_ACK).finish();
                let sent = match ack {
                    Ok(frame) => lock(&conn.writer).write_all(&frame),
                    Err(e) => break e.to_string(),
                };
                if let Err(e) = sent {
                    break format!("write failed: {e}");
                }
            }
            continue;
        }
        if resp.status == status::PROTOCOL && resp.id == 0 {
            break status_error(resp.status, resp.payload).to_string();
        }
        if resp.id == SUBSCRIBE_ID && resp.status == status::OK {
            // SUBSCRIBE's `covered`, applied here in stream order with the SUSPEND / RESUME
            // notices (a notice after the answer must win over it).
            conn.covered.store(resp.payload.get(1) == Some(&1), Ordering::SeqCst);
        }
        let waiter = lock(&conn.pending).remove(&resp.id);
        if let Some(tx) = waiter {
            let _ = tx.try_send(Ok((resp.status, resp.payload.to_vec())));
        }
    };
    conn.fail_all(&why);
}

/// The shared client. Cheap to call from many threads.
pub struct SidecarClient {
    addr: SocketAddr,
    timeout: Duration,
    conn: Mutex<Option<Arc<Conn>>>,
    /// Connections made plus connections lost: a change means the sidecar (and maybe HBase)
    /// was away.
    generation: Arc<AtomicU64>,
    lease: Arc<Lease>,
    listener: Arc<OnceLock<Listener>>,
    /// The sidecar's answer to SUBSCRIBE: a RegionObserver reports writes in its JVM.
    observer: AtomicBool,
}

impl SidecarClient {
    /// `lease`: how long the cache may be used after the last answered request (see the module
    /// doc); it is sent to the sidecar, which holds writes that long after dropping us.
    pub fn new(addr: SocketAddr, timeout: Duration, lease: Duration) -> SidecarClient {
        SidecarClient {
            addr,
            timeout,
            conn: Mutex::new(None),
            generation: Arc::new(AtomicU64::new(0)),
            lease: Arc::new(Lease { base: Instant::now(), length: lease, until_ns: AtomicU64::new(0) }),
            listener: Arc::new(OnceLock::new()),
            observer: AtomicBool::new(false),
        }
    }

    /// Where invalidation notices go (set once, before the first call).
    pub fn set_listener(&self, l: Listener) {
        let _ = self.listener.set(l);
    }

    /// May the cache serve now? (Subscribed, and heard from within the lease.)
    pub fn lease_valid(&self) -> bool {
        self.lease.valid()
    }

    /// Did the sidecar report a RegionObserver (writes bypassing Slipstream are covered)?
    pub fn observer_loaded(&self) -> bool {
        self.observer.load(Ordering::Relaxed)
    }

    /// Keeps the lease alive while idle: a PING every lease / 4 (ends with the client).
    pub fn start_keepalive(self: &Arc<Self>) -> std::io::Result<()> {
        let weak: Weak<SidecarClient> = Arc::downgrade(self);
        let every = (self.lease.length / 4).max(Duration::from_millis(10));
        std::thread::Builder::new()
            .name("hbase-keepalive".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(c) = weak.upgrade() else { break };
                let _ = c.ping();
            })
            .map(|_| ())
    }

    /// Connections made plus lost; the cache flushes when it moves.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn connection(&self) -> Result<Arc<Conn>, SidecarError> {
        let mut slot = lock(&self.conn);
        if let Some(c) = slot.as_ref() {
            if !c.dead.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let unavailable = |e: std::io::Error| SidecarError::Unavailable(format!("{}: {e}", self.addr));
        let stream = TcpStream::connect_timeout(&self.addr, self.timeout).map_err(unavailable)?;
        stream.set_nodelay(true).map_err(unavailable)?;
        let read_half = stream.try_clone().map_err(unavailable)?;
        let conn = Arc::new(Conn {
            writer: Mutex::new(stream),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            dead: AtomicBool::new(false),
            covered: AtomicBool::new(false),
            generation: self.generation.clone(),
            lease: self.lease.clone(),
            listener: self.listener.clone(),
        });
        // The generation moves before the first notice can arrive, so the cache is flushed
        // before it applies any notice of this connection.
        self.generation.fetch_add(1, Ordering::SeqCst);
        let c2 = conn.clone();
        std::thread::Builder::new()
            .name("hbase-sidecar-rx".into())
            .spawn(move || reader_loop(c2, read_half))
            .map_err(unavailable)?;
        let lease_ms = self.lease.length.as_millis().clamp(1, 60_000) as i32;
        let subscribed = self
            .call_on(&conn, op::SUBSCRIBE, |e| {
                e.i32(lease_ms);
            })
            .and_then(|payload| {
                let mut d = Decoder::new(&payload);
                let observer = d.bool()?;
                let covered = d.bool()?;
                d.end()?;
                Ok((observer, covered))
            });
        match subscribed {
            Ok((observer, _covered)) => {
                // `covered` was applied by the reader thread (and SUBSCRIBE's own answer
                // extended the lease if it was set: the subscription is in place by then).
                self.observer.store(observer, Ordering::Relaxed);
            }
            Err(e) => {
                let _ = lock(&conn.writer).shutdown(std::net::Shutdown::Both);
                conn.fail_all("SUBSCRIBE failed");
                return Err(e);
            }
        }
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Sends one request (built by `build` with the id chosen here) and waits for its answer.
    /// Returns the OK payload, or the typed error.
    ///
    /// A connection found dead by this call (the sidecar closed it, e.g. after dropping our
    /// subscription) is re-dialled once: always when the request was never written, and for
    /// reads (which are safe to repeat) also when it was.
    fn call(&self, opcode: u8, build: impl Fn(&mut Encoder)) -> Result<Vec<u8>, SidecarError> {
        let conn = self.connection()?;
        match self.call_on(&conn, opcode, &build) {
            Err(SidecarError::Unavailable(m))
                if conn.dead.load(Ordering::SeqCst) && (m.starts_with(NOT_SENT) || op::is_read(opcode)) =>
            {
                let conn = self.connection()?;
                self.call_on(&conn, opcode, &build)
            }
            r => r,
        }
    }

    fn call_on(&self, conn: &Arc<Conn>, opcode: u8, build: impl Fn(&mut Encoder)) -> Result<Vec<u8>, SidecarError> {
        let sent_ns = self.lease.now_ns();
        let mut id = conn.next_id.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            // 0 is reserved for connection-level protocol errors.
            id = conn.next_id.fetch_add(1, Ordering::Relaxed);
        }
        let mut enc = Encoder::new(id, opcode);
        build(&mut enc);
        let frame = enc.finish()?;
        let (tx, rx) = sync_channel(1);
        lock(&conn.pending).insert(id, tx);
        let sent = lock(&conn.writer).write_all(&frame);
        if let Err(e) = sent {
            lock(&conn.pending).remove(&id);
            conn.fail_all(&format!("connection lost (write failed: {e})"));
            let _ = lock(&conn.writer).shutdown(std::net::Shutdown::Both);
            return Err(SidecarError::Unavailable(format!("{NOT_SENT}: {e}")));
        }
        match rx.recv_timeout(self.timeout) {
            Ok(Ok((status::OK, payload))) => {
                // Any answer proves the subscribed connection was alive after `sent_ns`; on a
                // covered connection only. Checked again after: a SUSPEND (covered false, then
                // the lease ended) between the check and the extension must still end it.
                if conn.covered.load(Ordering::SeqCst) && !conn.dead.load(Ordering::SeqCst) {
                    self.lease.extend_from(sent_ns);
                    if !conn.covered.load(Ordering::SeqCst) || conn.dead.load(Ordering::SeqCst) {
                        self.lease.end();
                    }
                }
                Ok(payload)
            }
            Ok(Ok((st, payload))) => Err(status_error(st, &payload)),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => {
                lock(&conn.pending).remove(&id);
                Err(SidecarError::Unavailable(format!("no answer within {} ms", self.timeout.as_millis())))
            }
            Err(RecvTimeoutError::Disconnected) => Err(SidecarError::Unavailable("connection lost".into())),
        }
    }

    fn call_decode<T>(
        &self,
        opcode: u8,
        build: impl Fn(&mut Encoder),
        decode: impl FnOnce(&mut Decoder) -> Result<T, SidecarError>,
    ) -> Result<T, SidecarError> {
        let payload = self.call(opcode, build)?;
        let mut d = Decoder::new(&payload);
        let v = decode(&mut d)?;
        d.end()?;
        Ok(v)
    }

    pub fn ping(&self) -> Result<(), SidecarError> {
        self.call_decode(op::PING, |_| {}, |_| Ok(()))
    }
    pub fn list_tables(&self) -> Result<Vec<Vec<u8>>, SidecarError> {
        self.call_decode(op::LIST_TABLES, |_| {}, |d| d.bytes_list())
    }
    pub fn describe(&self, table: &[u8]) -> Result<Vec<Family>, SidecarError> {
        self.call_decode(
            op::DESCRIBE,
            |e| {
                e.bytes(table);
            },
            |d| d.families(),
        )
    }
    pub fn create_table(&self, table: &[u8], families: &[Family]) -> Result<(), SidecarError> {
        self.call_decode(
            op::CREATE_TABLE,
            |e| {
                e.bytes(table).i32(families.len() as i32);
                for f in families {
                    e.family(f);
                }
            },
            |_| Ok(()),
        )
    }
    /// DELETE_TABLE, ENABLE_TABLE or DISABLE_TABLE.
    pub fn table_admin(&self, opcode: u8, table: &[u8]) -> Result<(), SidecarError> {
        self.call_decode(
            opcode,
            |e| {
                e.bytes(table);
            },
            |_| Ok(()),
        )
    }
    pub fn is_enabled(&self, table: &[u8]) -> Result<bool, SidecarError> {
        self.call_decode(
            op::IS_ENABLED,
            |e| {
                e.bytes(table);
            },
            |d| d.bool(),
        )
    }
    pub fn get(&self, table: &[u8], rows: &[Vec<u8>], spec: &ReadSpec) -> Result<Vec<Row>, SidecarError> {
        self.call_decode(
            op::GET,
            |e| {
                e.bytes(table).bytes_list(rows).read_spec(spec);
            },
            |d| d.rows(),
        )
    }
    /// One page of a scan: up to `rows_max` rows; `more` = the page was cut by a limit.
    #[allow(clippy::too_many_arguments)]
    pub fn scan(
        &self,
        table: &[u8],
        start: &[u8],
        stop: &[u8],
        spec: &ReadSpec,
        filter: &[u8],
        rows_max: i32,
        bytes_max: i32,
    ) -> Result<(Vec<Row>, bool), SidecarError> {
        self.call_decode(
            op::SCAN,
            |e| {
                e.bytes(table).bytes(start).bytes(stop).read_spec(spec).bytes(filter);
                e.i32(rows_max).i32(bytes_max);
            },
            |d| Ok((d.rows()?, d.bool()?)),
        )
    }
    pub fn mutate(&self, table: &[u8], rows: &[RowMutations], ts: i64, order: MutateOrder) -> Result<(), SidecarError> {
        self.call_decode(
            op::MUTATE,
            |e| {
                e.bytes(table).row_mutations(rows).i64(ts).u8(order as u8);
            },
            |_| Ok(()),
        )
    }
    pub fn delete(&self, table: &[u8], row: &[u8], column: &[u8], ts: i64) -> Result<(), SidecarError> {
        self.call_decode(
            op::DELETE,
            |e| {
                e.bytes(table).bytes(row).bytes(column).i64(ts);
            },
            |_| Ok(()),
        )
    }
    pub fn increment(&self, table: &[u8], row: &[u8], column: &[u8], amount: i64) -> Result<i64, SidecarError> {
        self.call_decode(
            op::INCREMENT,
            |e| {
                e.bytes(table).bytes(row).bytes(column).i64(amount);
            },
            |d| d.i64(),
        )
    }
}

/// A client going away (its tenant removed) ends its connection: the reader thread sees the
/// end and exits, and the sidecar forgets the subscription at once instead of holding writes
/// for an unanswered notice.
impl Drop for SidecarClient {
    fn drop(&mut self) {
        if let Some(c) = lock(&self.conn).take() {
            let _ = lock(&c.writer).shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const LEASE: Duration = Duration::from_secs(2);

    fn read_frame(s: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        body
    }

    /// Accepts one connection and answers its SUBSCRIBE (no observer).
    fn accept_subscribed(l: &TcpListener) -> TcpStream {
        accept_subscribed_covered(l, true)
    }

    /// Accepts one connection and answers its SUBSCRIBE with `covered`.
    fn accept_subscribed_covered(l: &TcpListener, covered: bool) -> TcpStream {
        let (mut s, _) = l.accept().unwrap();
        let body = read_frame(&mut s);
        assert_eq!(body[4], op::SUBSCRIBE);
        let id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        let mut e = Encoder::new(id, status::OK);
        e.bool(false).bool(covered);
        s.write_all(&e.finish().unwrap()).unwrap();
        s
    }

    /// A sidecar not covering every region server (`covered` = false): its answers never make
    /// the lease valid; RESUME makes them count again and SUSPEND ends the lease at once, each
    /// moving the generation (a flush).
    #[test]
    fn an_uncovered_subscription_never_makes_the_lease_valid() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (step_tx, step_rx) = sync_channel::<()>(0);
        std::thread::spawn(move || {
            let mut s = accept_subscribed_covered(&l, false);
            let answer_pings = |s: &mut TcpStream, n: usize| {
                for _ in 0..n {
                    let body = read_frame(s);
                    let id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                    s.write_all(&Encoder::new(id, status::OK).finish().unwrap()).unwrap();
                }
            };
            answer_pings(&mut s, 2);
            for kind in [4u8, 3u8] {
                // RESUME, then SUSPEND, each once the client has seen the previous step.
                step_rx.recv().unwrap();
                let mut e = Encoder::new(0, status::NOTICE);
                e.u8(kind).bytes(b"").bytes_list(&[]);
                s.write_all(&e.finish().unwrap()).unwrap();
                answer_pings(&mut s, 1);
            }
            std::thread::sleep(Duration::from_millis(200));
        });
        let c = SidecarClient::new(addr, Duration::from_secs(5), LEASE);
        c.ping().unwrap();
        c.ping().unwrap();
        assert!(!c.lease_valid(), "answers on an uncovered connection extend nothing");
        let g = c.generation();
        step_tx.send(()).unwrap(); // RESUME precedes the next answer on the stream
        c.ping().unwrap();
        assert!(c.lease_valid(), "covered again");
        assert_eq!(c.generation(), g + 1, "RESUME flushes");
        step_tx.send(()).unwrap(); // SUSPEND
        c.ping().unwrap();
        assert!(!c.lease_valid(), "SUSPEND ends the lease and the answer after it extends nothing");
        assert_eq!(c.generation(), g + 2, "SUSPEND flushes");
    }

    /// A fake sidecar that answers requests out of order proves the id multiplexing.
    #[test]
    fn answers_out_of_order_reach_the_right_caller() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut s = accept_subscribed(&l);
            let mut frames = Vec::new();
            for _ in 0..2 {
                frames.push(read_frame(&mut s));
            }
            // Answer the second request first; each answer is INCREMENT's i64 = request id * 10.
            for body in frames.iter().rev() {
                let id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                let mut e = Encoder::new(id, status::OK);
                e.i64(id as i64 * 10);
                s.write_all(&e.finish().unwrap()).unwrap();
            }
        });
        let c = Arc::new(SidecarClient::new(addr, Duration::from_secs(5), LEASE));
        let c1 = c.clone();
        let t = std::thread::spawn(move || c1.increment(b"t", b"r", b"f:q", 1).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        let b = c.increment(b"t", b"r", b"f:q", 1).unwrap();
        let a = t.join().unwrap();
        // Id 1 was the SUBSCRIBE.
        assert_eq!((a, b), (20, 30));
    }

    /// HBase (the sidecar) going away fails the pending call; the next call dials again.
    #[test]
    fn lost_connection_fails_pending_calls_and_the_next_call_redials() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            // First connection: read one request, then drop it unanswered.
            let mut s = accept_subscribed(&l);
            read_frame(&mut s);
            drop(s);
            // Second connection: answer PING.
            let mut s = accept_subscribed(&l);
            let body = read_frame(&mut s);
            let id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            s.write_all(&Encoder::new(id, status::OK).finish().unwrap()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let c = SidecarClient::new(addr, Duration::from_secs(5), LEASE);
        let t0 = std::time::Instant::now();
        // A write that reached the sidecar is not repeated (it may have been applied).
        assert!(matches!(c.increment(b"t", b"r", b"f:q", 1), Err(SidecarError::Unavailable(_))));
        assert!(t0.elapsed() < Duration::from_secs(2), "failed fast, not at the deadline");
        c.ping().unwrap();
    }

    #[test]
    fn unreachable_sidecar_is_unavailable_not_a_hang() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let c = SidecarClient::new(addr, Duration::from_millis(500), LEASE);
        assert!(matches!(c.ping(), Err(SidecarError::Unavailable(_))));
    }

    #[test]
    fn silent_sidecar_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = SidecarClient::new(addr, Duration::from_millis(200), LEASE);
        let t0 = std::time::Instant::now();
        assert!(matches!(c.ping(), Err(SidecarError::Unavailable(_))));
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(l);
    }

    /// A BEGIN notice reaches the listener before its ACK goes out; the lease starts with the
    /// subscription and ends with the connection.
    #[test]
    fn notices_reach_the_listener_and_begin_is_acked_after_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (done_tx, done_rx) = sync_channel::<(u32, u8)>(1);
        std::thread::spawn(move || {
            let mut s = accept_subscribed(&l);
            let body = read_frame(&mut s); // PING
            let mut e = Encoder::new(77, status::NOTICE);
            e.u8(1).bytes(b"t").bytes_list(&[b"r".to_vec()]);
            s.write_all(&e.finish().unwrap()).unwrap();
            let ack = read_frame(&mut s);
            let id = u32::from_be_bytes([ack[0], ack[1], ack[2], ack[3]]);
            done_tx.send((id, ack[4])).unwrap();
            let pid = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            s.write_all(&Encoder::new(pid, status::OK).finish().unwrap()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        });
        let c = SidecarClient::new(addr, Duration::from_secs(5), LEASE);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        c.set_listener(Arc::new(move |n: &Notice| lock(&s2).push(n.clone())));
        assert!(!c.lease_valid());
        c.ping().unwrap();
        assert!(c.lease_valid());
        assert_eq!(done_rx.recv().unwrap(), (77, op::NOTICE_ACK));
        let got = lock(&seen).clone();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].kind, got[0].rows.clone()), (NoticeKind::Begin, vec![b"r".to_vec()]));
        // The fake sidecar closes: the lease ends at once.
        for _ in 0..100 {
            if !c.lease_valid() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!c.lease_valid());
    }
}
