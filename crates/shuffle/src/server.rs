//! The shuffle service's TCP port: `[shuffle]` config, a blocking accept thread, one thread per
//! connection (a Spark task holds one for its life), the registry behind one mutex (every
//! request is a few table operations), the Prometheus metrics, and with tenants
//! (crate::tenants) the waits and charges on each tenant's token buckets: an ALLOC waits while
//! the tenant's ingress bucket is in debt, a LOOKUP while its egress bucket is; the bytes the
//! registry counted are charged after each request. UNREGISTER, UNREGISTER_APP and a driver's
//! end are passed on to the peers (crate::forward).
//!
//! A driver connection (after `DRIVER <app>`) has no idle timeout: it is silent between jobs.
//! Its peer's host is watched instead by TCP keepalive, so a host lost without a FIN or RST
//! (power off, partition, a frozen VM) ends the connection, and so the application, within
//! `driver_keepalive_s x (1 + driver_keepalive_probes)` (60 s by default): after
//! `driver_keepalive_s` of silence the kernel probes every `driver_keepalive_s`, and after
//! `driver_keepalive_probes` unanswered probes the read fails (ETIMEDOUT). TCP_USER_TIMEOUT is
//! set to the same bound, so an answer the host never acknowledges ends it as soon (keepalive
//! does not probe while data is unacknowledged). Keepalive rather than an application PING: the
//! driver's kernel answers the probes, so the JVM (DriverLink) needs no change and an older
//! manager is covered too, and a driver alive but paused (a long GC, SIGSTOP of the JVM alone)
//! keeps its application, which is right: only its host's silence ends it.
//!
//! Not for: the rules (crate::registry) or the wire format (crate::proto).

use crate::forward::Forwarder;
use crate::peer;
use crate::pool::BlockPool;
use crate::proto::{self, Request, LINE_BYTES_MAX};
use crate::registry::{Found, Limits, Registry, Segment};
use crate::tenants::{self, ShuffleTenant, TenantShare};
use crate::ShuffleError;
use serde::Deserialize;
use slipstream_tenancy::{Direction, TenantShaper};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `[shuffle]` as written in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShuffleConfig {
    pub listen: String,
    pub tcp_port: u16,
    /// The pool's limit: block files never exceed this many MiB.
    pub memory_mb: usize,
    /// Where the block files live; tmpfs, so a block is shared memory.
    pub dir: String,
    /// One block (NetSpark's 2 MiB: a huge page).
    pub block_kb: usize,
    /// Freed block files kept for reuse (their pages stay faulted in).
    pub free_blocks_keep: usize,
    pub connections_max: usize,
    /// A connection silent this long is closed (its uncommitted blocks freed).
    pub idle_timeout_s: u64,
    /// The other hosts' shuffle daemons (`ip:port`), asked for their segments when a reducer
    /// here looks up a partition (crate::peer). Empty: one host.
    pub peers: Vec<String>,
    /// Connect/read/write timeout of one FETCH from a peer (and of one line passed on).
    pub peer_timeout_ms: u64,
    /// A driver connection's TCP keepalive: silence before the first probe, and between probes.
    pub driver_keepalive_s: u64,
    /// Unanswered keepalive probes after which a driver's host counts as gone.
    pub driver_keepalive_probes: u32,
}

impl Default for ShuffleConfig {
    fn default() -> Self {
        ShuffleConfig {
            listen: "127.0.0.1".into(),
            tcp_port: 7300,
            memory_mb: 1024,
            dir: "/dev/shm/slipstream-shuffle".into(),
            block_kb: 2048,
            free_blocks_keep: 64,
            connections_max: 512,
            idle_timeout_s: 600,
            peers: Vec::new(),
            peer_timeout_ms: 10_000,
            driver_keepalive_s: 10,
            driver_keepalive_probes: 5,
        }
    }
}

/// `[shuffle]` checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub block_bytes: usize,
    pub blocks_max: usize,
    pub free_blocks_keep: usize,
    pub connections_max: usize,
    pub idle_timeout: Duration,
    pub limits: Limits,
    pub peers: Vec<SocketAddr>,
    pub peer_timeout: Duration,
    pub driver_keepalive: DriverKeepalive,
}

/// How a driver connection's peer host is watched (TCP keepalive; the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverKeepalive {
    pub interval: Duration,
    pub probes: u32,
}

impl DriverKeepalive {
    /// Longest a silent driver host goes unnoticed: the first probe's wait and each probe's.
    pub fn dead_after(&self) -> Duration {
        self.interval * (1 + self.probes)
    }
}

/// Most `[shuffle] peers` (each LOOKUP asks every one of them).
pub const PEERS_MAX: usize = 64;
/// Longest `driver_keepalive_s` (Linux's TCP_KEEPIDLE and TCP_KEEPINTVL limit).
pub const DRIVER_KEEPALIVE_S_MAX: u64 = 32_767;
/// Most `driver_keepalive_probes` (Linux's TCP_KEEPCNT limit).
pub const DRIVER_KEEPALIVE_PROBES_MAX: u32 = 127;
/// Longest an ALLOC or LOOKUP waits for its tenant's bucket to come out of debt before it is
/// refused (`TenantBusy`); under the JVM client's read timeout (120 s).
pub const TENANT_WAIT_MS_MAX: u64 = 60_000;
/// A waiting request looks at its bucket again at least this often (an admin edit of the
/// tenant's share takes effect within one look).
const TENANT_RECHECK_MS: u64 = 100;

impl Settings {
    /// The tenants' shares checked against this pool (crate::tenants::check_shares): the rule
    /// the config checks at start and the service applies.
    pub fn check_tenants(&self, shares: &[TenantShare]) -> Result<Vec<usize>, String> {
        tenants::check_shares(shares, self.blocks_max.saturating_mul(self.block_bytes), self.block_bytes)
    }
}

impl ShuffleConfig {
    pub fn validate(&self) -> Result<Settings, String> {
        let addr: SocketAddr =
            format!("{}:{}", self.listen, self.tcp_port).parse().map_err(|e| format!("listen/tcp_port: {e}"))?;
        if !self.block_kb.is_power_of_two() || !(64..=65536).contains(&self.block_kb) {
            return Err("block_kb must be a power of two from 64 to 65536".into());
        }
        let block_bytes = self.block_kb * 1024;
        let blocks_max = self.memory_mb.saturating_mul(1 << 20) / block_bytes;
        if blocks_max == 0 {
            return Err(format!("memory_mb {} holds no block of {} KiB", self.memory_mb, self.block_kb));
        }
        if self.dir.is_empty() || self.connections_max == 0 || self.idle_timeout_s == 0 {
            return Err("dir, connections_max and idle_timeout_s must be set".into());
        }
        if self.peers.len() > PEERS_MAX || self.peer_timeout_ms == 0 {
            return Err(format!("at most {PEERS_MAX} peers, and peer_timeout_ms must be set"));
        }
        if !(1..=DRIVER_KEEPALIVE_S_MAX).contains(&self.driver_keepalive_s)
            || !(1..=DRIVER_KEEPALIVE_PROBES_MAX).contains(&self.driver_keepalive_probes)
        {
            return Err(format!(
                "driver_keepalive_s must be 1..={DRIVER_KEEPALIVE_S_MAX} and driver_keepalive_probes 1..={DRIVER_KEEPALIVE_PROBES_MAX}"
            ));
        }
        let peers = self
            .peers
            .iter()
            .map(|p| p.parse::<SocketAddr>().map_err(|e| format!("peers: {p:?}: {e} (ip:port)")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Settings {
            addr,
            dir: PathBuf::from(&self.dir),
            block_bytes,
            blocks_max,
            free_blocks_keep: self.free_blocks_keep,
            connections_max: self.connections_max,
            idle_timeout: Duration::from_secs(self.idle_timeout_s),
            limits: Limits::default(),
            peers,
            peer_timeout: Duration::from_millis(self.peer_timeout_ms),
            driver_keepalive: DriverKeepalive {
                interval: Duration::from_secs(self.driver_keepalive_s),
                probes: self.driver_keepalive_probes,
            },
        })
    }
}

struct Shared {
    registry: Mutex<Registry>,
    connections: AtomicUsize,
    connections_refused: AtomicU64,
    next_conn: AtomicU64,
    dir: String,
    /// The registry's bound, checked here too before a COMMIT's lines are read.
    segments_per_commit_max: usize,
    peers: Vec<SocketAddr>,
    fetch_limits: peer::FetchLimits,
    peer_counts: peer::PeerCounts,
    peer_conns: peer::PeerConns,
    forwarder: Forwarder,
    driver_keepalive: DriverKeepalive,
    /// Per tenant (the registry's order): its buckets, and its waits (count, nanoseconds).
    shapers: Vec<Option<Arc<TenantShaper>>>,
    waits: Vec<(AtomicU64, AtomicU64)>,
}

impl Shared {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic aborts the process (the daemon's abort_on_panic hook), so the lock is never poisoned in use.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct ShuffleService {
    local_addr: SocketAddr,
    settings: Settings,
    shared: Arc<Shared>,
}

impl ShuffleService {
    /// Opens the pool (creates and locks the directory) and starts accepting. `tenants`: on a
    /// daemon with `[[tenant]]` entries, those with a shuffle share (then every application is
    /// charged to one of them); empty otherwise.
    pub fn start(settings: Settings, tenants: Vec<ShuffleTenant>) -> Result<ShuffleService, String> {
        let shares: Vec<TenantShare> = tenants.iter().map(|t| t.share.clone()).collect();
        let blocks = if tenants.is_empty() { Vec::new() } else { settings.check_tenants(&shares)? };
        let pool = BlockPool::open(&settings.dir, settings.block_bytes, settings.blocks_max, settings.free_blocks_keep)
            .map_err(|e| e.to_string())?;
        let registry_tenants: Vec<(String, usize)> = shares.into_iter().map(|s| s.name).zip(blocks).collect();
        let kind = slipstream_bind::Kind::Tcp { backlog: 1024 };
        let socket = slipstream_bind::bind_one(kind, settings.addr, &|_| Ok(())).map_err(|e| e.to_string())?;
        socket.set_nonblocking(false).map_err(|e| e.to_string())?;
        let listener: TcpListener = socket.into();
        let local_addr = listener.local_addr().map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry::new(pool, settings.limits.clone(), registry_tenants)),
            connections: AtomicUsize::new(0),
            connections_refused: AtomicU64::new(0),
            next_conn: AtomicU64::new(1),
            dir: settings.dir.display().to_string(),
            segments_per_commit_max: settings.limits.segments_per_commit_max,
            peers: settings.peers.clone(),
            fetch_limits: peer::FetchLimits {
                timeout: settings.peer_timeout,
                block_bytes: settings.block_bytes,
                records_max: settings.limits.map_outputs_max,
            },
            peer_counts: peer::PeerCounts::default(),
            peer_conns: peer::PeerConns::default(),
            forwarder: Forwarder::start(&settings.peers, settings.peer_timeout)?,
            driver_keepalive: settings.driver_keepalive,
            waits: tenants.iter().map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect(),
            shapers: tenants.into_iter().map(|t| t.shaper).collect(),
        });
        let (sh, max, idle) = (shared.clone(), settings.connections_max, settings.idle_timeout);
        std::thread::Builder::new()
            .name("shuffle-accept".into())
            .spawn(move || accept_loop(listener, sh, max, idle))
            .map_err(|e| e.to_string())?;
        Ok(ShuffleService { local_addr, settings, shared })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// One line for the daemon's start-up banner.
    pub fn describe(&self) -> String {
        format!(
            "; shuffle {} ({} blocks of {} KiB in {})",
            self.local_addr,
            self.settings.blocks_max,
            self.settings.block_bytes >> 10,
            self.settings.dir.display()
        )
    }

    /// Appends this service's Prometheus metrics.
    pub fn render_metrics(&self, out: &mut String) {
        let r = self.shared.registry();
        let pool = r.pool();
        let c = r.counts;
        let bb = pool.block_bytes() as u64;
        let rows: [(&str, &str, &str, u64); 13] = [
            (
                "blocks_in_use",
                "gauge",
                "Pool blocks allocated to map outputs (pending or committed)",
                pool.in_use() as u64,
            ),
            ("blocks_free", "gauge", "Freed block files kept for reuse", pool.free_count() as u64),
            ("blocks_max", "gauge", "Blocks the memory limit allows", pool.blocks_max() as u64),
            ("bytes_in_use", "gauge", "Bytes of blocks in use (blocks_in_use x block size)", pool.in_use() as u64 * bb),
            ("block_bytes", "gauge", "Size of one block", bb),
            ("shuffles", "gauge", "Registered shuffles", r.shuffle_count() as u64),
            (
                "commits_total",
                "counter",
                "Map output commits answered (retries and losing attempts included)",
                c.commits,
            ),
            (
                "commits_lost_race_total",
                "counter",
                "Commits answered with an earlier attempt's output",
                c.commits_lost_race,
            ),
            ("lookups_total", "counter", "Reduce partition lookups", c.lookups),
            ("segments_served_total", "counter", "Segments returned by lookups", c.segments_served),
            ("alloc_refused_total", "counter", "Block allocations refused at the memory limit", c.alloc_refused),
            ("lost_total", "counter", "Map outputs dropped after a reader reported them lost", c.lost_reports),
            (
                "connections",
                "gauge",
                "Open control connections",
                self.shared.connections.load(Ordering::Relaxed) as u64,
            ),
        ];
        let peers = self.shared.peer_counts.rows().into_iter().chain(self.shared.forwarder.counts.rows());
        for (name, kind, help, v) in rows.into_iter().chain(peers) {
            let _ = writeln!(out, "# HELP slipstream_shuffle_{name} {help}\n# TYPE slipstream_shuffle_{name} {kind}");
            let _ = writeln!(out, "slipstream_shuffle_{name} {v}");
        }
        let refused = self.shared.connections_refused.load(Ordering::Relaxed);
        let _ =
            writeln!(out, "# HELP slipstream_shuffle_connections_refused_total Connections closed at connections_max");
        let _ = writeln!(out, "# TYPE slipstream_shuffle_connections_refused_total counter");
        let _ = writeln!(out, "slipstream_shuffle_connections_refused_total {refused}");
        render_tenant_metrics(&r, &self.shared.waits, out);
    }
}

/// One family per figure, a row per tenant (`tenant` label); nothing without tenants.
fn render_tenant_metrics(r: &Registry, waits: &[(AtomicU64, AtomicU64)], out: &mut String) {
    let tenants = r.tenants();
    if tenants.is_empty() {
        return;
    }
    let bb = r.pool().block_bytes() as u64;
    type Row = fn(&crate::registry::TenantUse, u64, &(AtomicU64, AtomicU64)) -> String;
    let families: [(&str, &str, &str, Row); 7] = [
        ("blocks_in_use", "gauge", "Pool blocks held by the tenant's applications", |t, _, _| t.in_use.to_string()),
        ("blocks_max", "gauge", "Blocks the tenant's shuffle_mb share holds", |t, _, _| t.blocks_max.to_string()),
        ("bytes_in_use", "gauge", "Bytes of the blocks the tenant holds", |t, bb, _| (t.in_use as u64 * bb).to_string()),
        (
            "bytes_in_total",
            "counter",
            "Shuffle bytes taken in for the tenant (committed map output, peers' segments), charged to its ingress bucket",
            |t, _, _| t.counts.bytes_in.to_string(),
        ),
        (
            "bytes_out_total",
            "counter",
            "Shuffle bytes handed out for the tenant (segments to readers and peers), charged to its egress bucket",
            |t, _, _| t.counts.bytes_out.to_string(),
        ),
        ("alloc_refused_total", "counter", "Blocks refused at the tenant's share", |t, _, _| {
            t.counts.alloc_refused.to_string()
        }),
        ("throttled_total", "counter", "Requests that waited for the tenant's token bucket", |_, _, w| {
            w.0.load(Ordering::Relaxed).to_string()
        }),
    ];
    for (name, kind, help, row) in families {
        let _ = writeln!(
            out,
            "# HELP slipstream_shuffle_tenant_{name} {help}\n# TYPE slipstream_shuffle_tenant_{name} {kind}"
        );
        for (t, w) in tenants.iter().zip(waits) {
            let _ = writeln!(out, "slipstream_shuffle_tenant_{name}{{tenant=\"{}\"}} {}", t.name, row(t, bb, w));
        }
    }
    let name = "slipstream_shuffle_tenant_throttled_seconds_total";
    let _ = writeln!(out, "# HELP {name} Time requests waited for the tenant's token bucket\n# TYPE {name} counter");
    for (t, w) in tenants.iter().zip(waits) {
        let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {}", t.name, w.1.load(Ordering::Relaxed) as f64 / 1e9);
    }
}

/// Before a transfer for `app` in direction `dir`: waits while its tenant's bucket is in debt
/// (at most TENANT_WAIT_MS_MAX, looking again at least every TENANT_RECHECK_MS). No tenant or
/// no shaping: no wait.
fn wait_for_tenant(shared: &Shared, app: &str, dir: Direction) -> Result<(), ShuffleError> {
    let Some(i) = shared.registry().tenant_of(app) else { return Ok(()) };
    let Some(sh) = shared.shapers.get(i).and_then(|s| s.as_deref()) else { return Ok(()) };
    let started = Instant::now();
    let limit = Duration::from_millis(TENANT_WAIT_MS_MAX);
    let mut waited = false;
    let result = loop {
        let ns = sh.transfer_wait_ns(dir, slipstream_tenancy::since_start_ns());
        if ns == 0 {
            break Ok(());
        }
        waited = true;
        let elapsed = started.elapsed();
        if elapsed >= limit {
            let tenant = shared.registry().tenants().get(i).map(|t| t.name.clone()).unwrap_or_default();
            break Err(ShuffleError::TenantBusy { tenant, waited_ms: elapsed.as_millis() as u64 });
        }
        let nap = Duration::from_nanos(ns).min(Duration::from_millis(TENANT_RECHECK_MS)).min(limit - elapsed);
        std::thread::sleep(nap);
    };
    if waited {
        if let Some((n, total_ns)) = shared.waits.get(i) {
            n.fetch_add(1, Ordering::Relaxed);
            total_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
    result
}

/// Charges the bytes the registry counted since the last settle to the tenants' buckets.
fn settle_tenants(shared: &Shared) {
    if shared.shapers.iter().all(Option::is_none) {
        return;
    }
    shared.registry().settle(|i, bytes_in, bytes_out| {
        if let Some(sh) = shared.shapers.get(i).and_then(|s| s.as_deref()) {
            sh.charge_transfer(Direction::In, bytes_in);
            sh.charge_transfer(Direction::Out, bytes_out);
        }
    });
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, max: usize, idle: Duration) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= max {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            shared.connections_refused.fetch_add(1, Ordering::Relaxed);
            let mut s = stream;
            let _ = s.write_all(b"SERVER_ERROR too many shuffle connections\r\n");
            continue;
        }
        let sh = shared.clone();
        let spawned = std::thread::Builder::new().name("shuffle-conn".into()).spawn(move || {
            let conn = sh.next_conn.fetch_add(1, Ordering::Relaxed);
            let _ = serve(stream, &sh, conn, idle);
            let ended = sh.registry().drop_conn(conn);
            if let Some(app) = ended {
                // The driver is gone: its application's blocks on the other hosts go too.
                sh.forwarder.send(&proto::unregister_app_for_peer(&app));
            }
            sh.connections.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads one line of at most LINE_BYTES_MAX into `line`; false at end of stream.
fn read_line<R: BufRead>(r: &mut R, line: &mut Vec<u8>) -> std::io::Result<bool> {
    line.clear();
    let n = std::io::Read::take(r, LINE_BYTES_MAX as u64).read_until(b'\n', line)?;
    if n == 0 {
        return Ok(false);
    }
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
    }
    Ok(true)
}

fn serve(stream: TcpStream, shared: &Shared, conn: u64, idle: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(idle))?;
    stream.set_nodelay(true)?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    // Answers not yet written: those of requests the client pipelined (a reduce task's
    // RELEASEs come in batches, ShuffleClient.release) go out in one write once no whole
    // request is left in the read buffer, instead of one send each.
    let (mut line, mut out) = (Vec::with_capacity(LINE_BYTES_MAX), String::new());
    loop {
        match read_line(&mut r, &mut line) {
            Ok(true) => {}
            Ok(false) => return w.write_all(out.as_bytes()),
            Err(e) => {
                let _ = write!(out, "CLIENT_ERROR {e}\r\n");
                let _ = w.write_all(out.as_bytes());
                return Err(e);
            }
        }
        let keep = match proto::parse_request(&line) {
            Ok(Request::Fetch { app, shuffle, reduce }) => {
                w.write_all(out.as_bytes())?;
                out.clear();
                let sent = answer_fetch(&mut w, shared, conn, (app, shuffle, reduce));
                settle_tenants(shared);
                sent?;
                continue;
            }
            Ok(req) => {
                let driver = matches!(req, Request::Driver { .. });
                let keep = handle(req, &mut r, shared, conn, &mut out)?;
                if driver && shared.registry().is_driver(conn) {
                    // A driver's connection is idle between its application's jobs: closing it
                    // would end the application (Registry::driver). Keepalive watches its host
                    // instead (module doc). A refused DRIVER keeps the idle limit.
                    r.get_ref().set_read_timeout(None)?;
                    watch_driver_host(r.get_ref(), &shared.driver_keepalive)?;
                }
                keep
            }
            Err(e) => {
                proto::error(&mut out, &e);
                true
            }
        };
        settle_tenants(shared);
        // Held only while a whole next request is already here (never while waiting for input).
        if !keep || !r.buffer().contains(&b'\n') || out.len() >= ANSWERS_HELD_BYTES_MAX {
            w.write_all(out.as_bytes())?;
            out.clear();
        }
        if !keep {
            return Ok(());
        }
    }
}

/// Turns on TCP keepalive (and TCP_USER_TIMEOUT) on a driver connection: its host silent for
/// `k.dead_after()` ends it (module doc).
fn watch_driver_host(stream: &TcpStream, k: &DriverKeepalive) -> std::io::Result<()> {
    let sock = socket2::SockRef::from(stream);
    let keepalive = socket2::TcpKeepalive::new().with_time(k.interval).with_interval(k.interval).with_retries(k.probes);
    sock.set_tcp_keepalive(&keepalive)?;
    sock.set_tcp_user_timeout(Some(k.dead_after()))
}

/// Most bytes of answers held for pipelined requests before they are written anyway.
const ANSWERS_HELD_BYTES_MAX: usize = 64 * 1024;

/// Answers one request into `out`; false when the connection must close.
fn handle(
    req: Request<'_>,
    r: &mut impl BufRead,
    shared: &Shared,
    conn: u64,
    out: &mut String,
) -> std::io::Result<bool> {
    let done = |out: &mut String, res: Result<(), ShuffleError>| match res {
        Ok(()) => proto::ok(out),
        Err(e) => proto::error(out, &e),
    };
    match req {
        Request::Hello { tenant } => {
            let r = shared.registry();
            match r.resolve_tenant(tenant) {
                Ok(_) => proto::hello(out, r.pool().block_bytes(), &shared.dir),
                Err(e) => proto::error(out, &e),
            }
        }
        Request::Quit => return Ok(false),
        Request::Register { app, shuffle, partitions, tenant } => {
            done(out, shared.registry().register(app, shuffle, partitions, tenant))
        }
        Request::Alloc { app, shuffle } => {
            match wait_for_tenant(shared, app, Direction::In).and_then(|()| shared.registry().alloc(conn, app, shuffle))
            {
                Ok(id) => proto::block(out, id),
                Err(e) => proto::error(out, &e),
            }
        }
        Request::Commit { app, shuffle, map, attempt, segments } => {
            let limit = shared.segments_per_commit_max;
            if segments > limit {
                proto::error(out, &ShuffleError::Limit { what: "segments in one commit", max: limit });
                return Ok(false);
            }
            let mut segs: Vec<Segment> = Vec::with_capacity(segments.min(4096));
            let mut line = Vec::with_capacity(64);
            for _ in 0..segments {
                if !read_line(r, &mut line)? {
                    return Ok(false);
                }
                match proto::parse_segment(&line) {
                    Ok(s) => segs.push(s),
                    Err(e) => {
                        proto::error(out, &e);
                        return Ok(false);
                    }
                }
            }
            match shared.registry().commit(conn, app, shuffle, map, attempt, segs) {
                Ok((won, segs)) => proto::committed(out, won, &segs),
                Err(e) => proto::error(out, &e),
            }
        }
        Request::Lookup { app, shuffle, reduce } => {
            match wait_for_tenant(shared, app, Direction::Out)
                .and_then(|()| lookup_everywhere(shared, conn, (app, shuffle, reduce)))
            {
                Ok(found) => proto::segments(out, &found),
                Err(e) => proto::error(out, &e),
            }
        }
        // Answered by `serve` (it streams).
        Request::Fetch { .. } => {}
        Request::Release { blocks } => {
            // One lock for the line's blocks; the first error is the answer, the rest still go.
            let mut r = shared.registry();
            let mut res = Ok(());
            for &b in &blocks {
                let this = r.release(conn, b);
                if res.is_ok() {
                    res = this;
                }
            }
            drop(r);
            done(out, res)
        }
        Request::Lost { app, shuffle, map, attempt } => done(out, shared.registry().lost(app, shuffle, map, attempt)),
        Request::Unregister { app, shuffle, from_peer } => {
            shared.registry().unregister(app, shuffle);
            if !from_peer {
                shared.forwarder.send(&proto::unregister_for_peer(app, shuffle));
            }
            proto::ok(out);
        }
        // From a peer: the blocks go; this daemon's own driver connections are left as they are.
        Request::UnregisterApp { app, from_peer: true } => {
            shared.registry().unregister_app(app);
            proto::ok(out);
        }
        Request::UnregisterApp { app, from_peer: false } => {
            shared.registry().end_app(app);
            shared.forwarder.send(&proto::unregister_app_for_peer(app));
            proto::ok(out);
        }
        Request::Driver { app } => done(out, shared.registry().driver(conn, app)),
    }
    Ok(true)
}

/// A peer's FETCH: this daemon's own segments of the partition, streamed (pinned while sent).
/// A shuffle unknown here is an empty answer: no map task of it ran on this host.
fn answer_fetch(
    w: &mut TcpStream,
    shared: &Shared,
    conn: u64,
    (app, shuffle, reduce): (&str, u32, u32),
) -> std::io::Result<()> {
    let found = match shared.registry().lookup(conn, app, shuffle, reduce) {
        Ok(found) => found,
        Err(ShuffleError::UnknownShuffle) => Vec::new(),
        Err(e) => {
            let mut out = String::new();
            proto::error(&mut out, &e);
            return w.write_all(out.as_bytes());
        }
    };
    let dir = PathBuf::from(&shared.dir);
    let sent = peer::send_answer(w, &found, &|id| crate::pool::block_path(&dir, id));
    // The lookup pinned each block once, however many of its segments it found.
    let blocks: HashSet<u32> = found.iter().map(|f| f.block).collect();
    let mut r = shared.registry();
    for b in blocks {
        let _ = r.release(conn, b);
    }
    drop(r);
    shared.peer_counts.bytes_sent.fetch_add(*sent.as_ref().unwrap_or(&0), Ordering::Relaxed);
    sent.map(|_| ())
}

/// LOOKUP: this daemon's segments, then each peer's (copied into blocks pinned for `conn`),
/// in map order. A map found here is not taken again from a peer; a peer that fails leaves
/// its maps out, and the reader's FetchFailed makes Spark recompute them.
fn lookup_everywhere(
    shared: &Shared,
    conn: u64,
    (app, shuffle, reduce): (&str, u32, u32),
) -> Result<Vec<Found>, ShuffleError> {
    let local = shared.registry().lookup(conn, app, shuffle, reduce);
    if shared.peers.is_empty() {
        return local;
    }
    let mut found = match local {
        Ok(found) => found,
        Err(ShuffleError::UnknownShuffle) => Vec::new(),
        Err(e) => return Err(e),
    };
    for &p in &shared.peers {
        let mut alloc = || {
            let mut r = shared.registry();
            let id = r.alloc_copy(conn, app)?;
            Ok((id, r.pool().path(id)))
        };
        let got = peer::fetch(
            &shared.peer_conns,
            &shared.peer_counts,
            p,
            &shared.fetch_limits,
            (app, shuffle, reduce),
            &mut alloc,
        );
        shared.peer_counts.fetches.fetch_add(1, Ordering::Relaxed);
        let kept: Vec<Found> = match got.result {
            Ok(bytes) => {
                shared.peer_counts.bytes_received.fetch_add(bytes, Ordering::Relaxed);
                shared.registry().count_in(app, bytes);
                let have: HashSet<u32> = found.iter().map(|f| f.map).collect();
                got.found.into_iter().filter(|f| !have.contains(&f.map)).collect()
            }
            Err(_) => {
                shared.peer_counts.fetch_errors.fetch_add(1, Ordering::Relaxed);
                Vec::new()
            }
        };
        let used: HashSet<u32> = kept.iter().map(|f| f.block).collect();
        let mut r = shared.registry();
        let mut kept = kept;
        for f in &mut kept {
            f.file = r.pool().file_id(f.block);
        }
        r.count_out(app, kept.iter().map(|f| u64::from(f.length)).sum());
        for b in got.blocks.iter().filter(|b| !used.contains(b)) {
            let _ = r.release(conn, *b);
        }
        drop(r);
        found.extend(kept);
    }
    // Map order; within a map the peer's order (a stable sort keeps it).
    found.sort_by_key(|f| f.map);
    Ok(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_checks() {
        let c: ShuffleConfig = toml::from_str("tcp_port = 7301\nmemory_mb = 64\n").unwrap();
        let s = c.validate().unwrap();
        assert_eq!((s.addr.port(), s.block_bytes, s.blocks_max), (7301, 2 << 20, 32));
        assert_eq!(s.dir, PathBuf::from("/dev/shm/slipstream-shuffle"));
        assert!(toml::from_str::<ShuffleConfig>("tcp_prot = 1\n").is_err());
        let c: ShuffleConfig = toml::from_str("memory_mb = 1\n").unwrap();
        assert!(c.validate().unwrap_err().contains("holds no block"));
        let c: ShuffleConfig = toml::from_str("block_kb = 100\n").unwrap();
        assert!(c.validate().is_err());
        assert_eq!(s.driver_keepalive.dead_after(), Duration::from_secs(60));
        for bad in ["driver_keepalive_s = 0\n", "driver_keepalive_probes = 0\n", "driver_keepalive_probes = 128\n"] {
            let c: ShuffleConfig = toml::from_str(bad).unwrap();
            assert!(c.validate().unwrap_err().contains("driver_keepalive"), "{bad}");
        }
    }
}
