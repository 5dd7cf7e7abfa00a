//! Fault-injection history test of replicated tenants (issue 15), checked with stateright's
//! `LinearizabilityTester`.
//!
//! Three real `slipstream serve --config` daemons on loopback, three tenants replicated on all
//! three (preferred leaders 1, 2, 3). Per tenant, concurrent memcached text clients do
//! `set`/`gets`/`cas`/`incr` on a few keys, each through a random node (a follower forwards),
//! while a nemesis SIGKILLs (then restarts from its data_dir) or SIGSTOPs (then SIGCONTs) the
//! current leader of a random tenant every few seconds. Every operation is recorded with its
//! invoke and return times; an outcome is *ok* (the reply), *failed* (a SERVER_ERROR that says
//! nothing happened: no leader, lost to a leader change, busy — dropped from the history) or
//! *unknown* (replication timeout, connection lost, no reply in time — left in flight: it may or
//! may not have taken effect, and that client continues as a new process). Then:
//! - each key's history must be linearizable (per key: linearizability is local, so the keys
//!   are checked one by one; the keys change every nemesis round so each history stays short);
//! - every acknowledged write of a unique key is on every node after healing;
//! - every node holds the same contents: a hash of value, flags and CAS of every key used, read
//!   from each node (a read there is ReadIndex + that node's own store).
//!
//! Seeded (`SLIPSTREAM_TEST_SEED`, printed): the clients' choices and the nemesis' choices of
//! tenant, fault and timing. Leader faults: `REPL_KILLS` (default 10; `bench/repl_soak.sh`
//! runs 100+). Every daemon is killed when the test ends, pass or fail.

// Test code: unwrap() in test set-up is the clearest failure.
#![allow(clippy::unwrap_used)]

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: [u64; 3] = [1, 2, 3];
const TENANTS: [&str; 3] = ["t0", "t1", "t2"];
const KEYS_PER_TENANT: u64 = 3;
const CLIENTS_PER_TENANT: u64 = 4;
/// `[cluster] wait_ms`: a request gets SERVER_ERROR after this.
const WAIT_MS: u64 = 1000;
/// A client gives up on a reply after this (the outcome is then unknown).
const REPLY_TIMEOUT: Duration = Duration::from_millis(WAIT_MS + 2000);
const START_TIMEOUT: Duration = Duration::from_secs(15);
const HEAL_TIMEOUT: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------------------------------
// The model: one memcached key as a register with a CAS unique.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    Set(u64),
    Gets,
    Cas(u64, u64),
    Incr,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Ret {
    Stored,
    Got(Option<(u64, u64)>),
    Exists,
    NotFound,
    Value(u64),
}

/// The key's value and, when a read has shown it, its CAS unique. Every write gives the item
/// a fresh CAS (the log index) that the writer does not learn; a `cas` with a unique seen
/// before the latest write therefore must fail with EXISTS.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Key {
    item: Option<(u64, Option<u64>)>,
}

impl SequentialSpec for Key {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        match (*op, self.item) {
            (Op::Set(v), _) => {
                self.item = Some((v, None));
                Ret::Stored
            }
            (Op::Gets, None) => Ret::Got(None),
            (Op::Gets, Some((v, c))) => Ret::Got(Some((v, c.unwrap_or(0)))),
            (Op::Cas(..), None) => Ret::NotFound,
            (Op::Cas(want, v), Some((_, Some(c)))) if c == want => {
                self.item = Some((v, None));
                Ret::Stored
            }
            (Op::Cas(..), Some(_)) => Ret::Exists,
            (Op::Incr, None) => Ret::NotFound,
            (Op::Incr, Some((v, _))) => {
                let n = v.wrapping_add(1);
                self.item = Some((n, None));
                Ret::Value(n)
            }
        }
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        match (op, ret, self.item) {
            // A read that shows a CAS unique teaches it to the model.
            (Op::Gets, Ret::Got(Some((v, c))), Some((mv, mc))) => {
                let ok = *v == mv && mc.is_none_or(|mc| mc == *c);
                if ok {
                    self.item = Some((mv, Some(*c)));
                }
                ok
            }
            _ => self.invoke(op) == *ret,
        }
    }
}

// ------------------------------------------------------------------------------------------
// The cluster of daemons.

struct Cluster {
    root: std::path::PathBuf,
    raft: BTreeMap<u64, u16>,
    admin: BTreeMap<u64, u16>,
    ports: BTreeMap<(u64, &'static str), u16>,
    procs: Mutex<BTreeMap<u64, Child>>,
    stopped: Mutex<HashSet<u64>>,
}

fn free_ports(n: usize) -> Vec<u16> {
    // Hold every listener until all are picked, so no port is handed out twice.
    let ls: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    ls.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

impl Cluster {
    fn new(tag: &str) -> Cluster {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let root = std::env::temp_dir().join(format!("slipstream-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&root).expect("temp dir");
        let mut p = free_ports(NODES.len() * (3 + TENANTS.len())).into_iter();
        let mut next = || p.next().expect("enough ports");
        let mut c = Cluster {
            root,
            raft: BTreeMap::new(),
            admin: BTreeMap::new(),
            ports: BTreeMap::new(),
            procs: Mutex::new(BTreeMap::new()),
            stopped: Mutex::new(HashSet::new()),
        };
        let mut server = BTreeMap::new();
        for n in NODES {
            c.raft.insert(n, next());
            c.admin.insert(n, next());
            server.insert(n, next());
            for t in TENANTS {
                c.ports.insert((n, t), next());
            }
        }
        let peers: Vec<String> = NODES.iter().map(|n| format!("\"{n}=127.0.0.1:{}\"", c.raft[n])).collect();
        for n in NODES {
            let mut cfg = format!(
                "[server]\nlisten = \"127.0.0.1\"\nthreads = 2\nport = {}\nadmin = \"127.0.0.1:{}\"\n\n\
                 [cluster]\nnode_id = {n}\npeers = [{}]\ndata_dir = \"{}\"\nfsync = \"batch\"\nwait_ms = {WAIT_MS}\n",
                server[&n],
                c.admin[&n],
                peers.join(", "),
                c.root.join(format!("node{n}")).display()
            );
            for (i, t) in TENANTS.iter().enumerate() {
                cfg += &format!(
                    "\n[[tenant]]\nname = \"{t}\"\ntcp_port = {}\nmemory_mb = 16\nshare = 0.3\nreplicas = 3\npreferred_leader = {}\n",
                    c.ports[&(n, *t)],
                    i + 1
                );
            }
            std::fs::write(c.root.join(format!("node{n}.toml")), cfg).expect("write config");
        }
        c
    }

    fn start(&self, n: u64) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("node{n}.log")))
            .expect("log file");
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_slipstream"));
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of ours;
        // it makes the daemon die with the test (even a killed test leaves none behind).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .args(["serve", "--config"])
            .arg(self.root.join(format!("node{n}.toml")))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn slipstream");
        self.procs.lock().unwrap().insert(n, child);
        let deadline = Instant::now() + START_TIMEOUT;
        let ports: Vec<u16> = TENANTS.iter().map(|t| self.ports[&(n, *t)]).chain([self.admin[&n]]).collect();
        for port in ports {
            while TcpStream::connect_timeout(&addr(port), Duration::from_millis(300)).is_err() {
                assert!(Instant::now() < deadline, "node {n} port {port} not open: {}", self.log_tail(n));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn kill(&self, n: u64) {
        self.cont(n);
        if let Some(mut c) = self.procs.lock().unwrap().remove(&n) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, n: u64, sig: libc::c_int) {
        if let Some(c) = self.procs.lock().unwrap().get(&n) {
            // SAFETY: kill(2) on our own child's pid (still unreaped: we hold its Child).
            unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        }
    }

    fn stop(&self, n: u64) {
        self.signal(n, libc::SIGSTOP);
        self.stopped.lock().unwrap().insert(n);
    }

    fn cont(&self, n: u64) {
        if self.stopped.lock().unwrap().remove(&n) {
            self.signal(n, libc::SIGCONT);
        }
    }

    fn running(&self) -> Vec<u64> {
        let stopped = self.stopped.lock().unwrap().clone();
        self.procs.lock().unwrap().keys().copied().filter(|n| !stopped.contains(n)).collect()
    }

    fn log_tail(&self, n: u64) -> String {
        let s = std::fs::read(self.root.join(format!("node{n}.log"))).unwrap_or_default();
        String::from_utf8_lossy(&s[s.len().saturating_sub(2000)..]).into_owned()
    }

    /// `name{tenant="t"}` on node n's /metrics (None: unreachable).
    fn metric(&self, n: u64, name: &str, tenant: &str) -> Option<u64> {
        let text = http_get(self.admin[&n], "/metrics")?;
        let prefix = format!("{name}{{tenant=\"{tenant}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse::<f64>().ok()).map(|v| v as u64)
    }

    /// The running node that says it leads `tenant`, if one does.
    fn leader(&self, tenant: &str) -> Option<u64> {
        self.running().into_iter().find(|&n| self.metric(n, "slipstream_replica_role", tenant) == Some(2))
    }

    /// Wait until every node is up and, for every tenant, all agree on one leader and have
    /// applied the same index.
    fn wait_converged(&self) {
        let deadline = Instant::now() + HEAL_TIMEOUT;
        loop {
            let ok = TENANTS.iter().all(|t| {
                let leaders: HashSet<_> =
                    NODES.iter().map(|&n| self.metric(n, "slipstream_replica_leader_id", t)).collect();
                let applied: HashSet<_> =
                    NODES.iter().map(|&n| self.metric(n, "slipstream_replica_applied_index", t)).collect();
                leaders.len() == 1
                    && !leaders.contains(&None)
                    && !leaders.contains(&Some(0))
                    && applied.len() == 1
                    && !applied.contains(&None)
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not converge in {HEAL_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in NODES {
            self.kill(n);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        } else {
            eprintln!("daemon logs and data kept in {}", self.root.display());
        }
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// GET `path` from the admin port (None: no answer within a second, e.g. a stopped node).
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr(port), Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut body = Vec::new();
    s.take(4 << 20).read_to_end(&mut body).ok()?;
    let text = String::from_utf8_lossy(&body).into_owned();
    text.starts_with("HTTP/1.1 200").then_some(text)
}

// ------------------------------------------------------------------------------------------
// Clients.

/// A memcached text connection to one node.
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

enum Reply {
    /// A reply: its lines (a VALUE reply: the VALUE line, the data, END).
    Lines(Vec<String>),
    /// Nothing (or half) came back in time, or the connection broke: outcome unknown.
    Lost,
}

impl Conn {
    fn open(port: u16) -> Option<Conn> {
        let s = TcpStream::connect_timeout(&addr(port), Duration::from_millis(300)).ok()?;
        s.set_read_timeout(Some(REPLY_TIMEOUT)).ok()?;
        s.set_write_timeout(Some(REPLY_TIMEOUT)).ok()?;
        let _ = s.set_nodelay(true);
        Some(Conn { r: BufReader::new(s.try_clone().ok()?), w: s })
    }

    fn line(&mut self) -> Option<String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(n) if n > 0 && l.ends_with("\r\n") => Some(l.trim_end().to_string()),
            _ => None,
        }
    }

    fn ask(&mut self, req: &str) -> Reply {
        if self.w.write_all(req.as_bytes()).is_err() {
            return Reply::Lost;
        }
        let Some(first) = self.line() else { return Reply::Lost };
        if !first.starts_with("VALUE ") {
            return Reply::Lines(vec![first]);
        }
        let (Some(data), Some(end)) = (self.line(), self.line()) else { return Reply::Lost };
        Reply::Lines(vec![first, data, end])
    }
}

/// What a reply means for the history.
enum Outcome {
    Ok(Ret),
    /// Definitely not applied (the line says so).
    Failed,
    Unknown,
}

const NOT_APPLIED: [&str; 3] = [
    "SERVER_ERROR no leader for this tenant",
    "SERVER_ERROR replication lost the write to a leader change, not applied",
    "SERVER_ERROR replication busy",
];

fn outcome(op: &Op, reply: Reply) -> Outcome {
    let Reply::Lines(lines) = reply else { return Outcome::Unknown };
    let first = lines[0].as_str();
    if NOT_APPLIED.contains(&first) {
        return Outcome::Failed;
    }
    if first == "SERVER_ERROR replication timeout, outcome unknown" {
        return Outcome::Unknown;
    }
    let ret = match (op, first) {
        (Op::Set(_) | Op::Cas(..), "STORED") => Ret::Stored,
        (Op::Cas(..), "EXISTS") => Ret::Exists,
        (Op::Cas(..) | Op::Incr, "NOT_FOUND") => Ret::NotFound,
        (Op::Gets, "END") => Ret::Got(None),
        (Op::Gets, l) if l.starts_with("VALUE ") => {
            let cas = l.split(' ').nth(4).and_then(|c| c.parse().ok());
            let v = lines[1].parse().ok();
            match (v, cas) {
                (Some(v), Some(c)) => Ret::Got(Some((v, c))),
                _ => panic!("bad gets reply {lines:?}"),
            }
        }
        (Op::Incr, l) if l.parse::<u64>().is_ok() => Ret::Value(l.parse().unwrap_or(0)),
        _ => panic!("unexpected reply to {op:?}: {lines:?}"),
    };
    Outcome::Ok(ret)
}

fn request(key: &str, op: &Op) -> String {
    match op {
        Op::Set(v) => format!("set {key} 0 0 {}\r\n{v}\r\n", v.to_string().len()),
        Op::Gets => format!("gets {key}\r\n"),
        Op::Cas(c, v) => format!("cas {key} 0 0 {} {c}\r\n{v}\r\n", v.to_string().len()),
        Op::Incr => format!("incr {key} 1\r\n"),
    }
}

/// One recorded operation: (process id, tenant/key, op, invoked, returned + result; None =
/// unknown).
struct Record {
    process: u64,
    /// `tenant/key`: the same key name in two tenants is two objects.
    key: String,
    op: Op,
    invoked: Instant,
    returned: Option<(Instant, Ret)>,
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    unknown: AtomicU64,
}

struct Shared {
    cluster: Arc<Cluster>,
    stop: AtomicBool,
    epoch: AtomicU64,
    tally: Tally,
    /// Unique keys written: (tenant, key, value, acknowledged).
    uniques: Mutex<Vec<(&'static str, String, u64, bool)>>,
}

fn client(sh: Arc<Shared>, tenant: &'static str, id: u64, seed: u64) -> Vec<Record> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    let mut process = id << 32;
    let mut conn: Option<Conn> = None;
    let mut seen_cas: HashMap<String, u64> = HashMap::new();
    let mut seq = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        seq += 1;
        if conn.is_none() || rng.u32(..40) == 0 {
            let n = NODES[rng.usize(..NODES.len())];
            conn = Conn::open(sh.cluster.ports[&(n, tenant)]);
            if conn.is_none() {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let value = (id + 1) * 1_000_000_000 + seq * 1000;
        if rng.u32(..10) == 0 {
            // A write to a key of its own: if acknowledged it must survive everything.
            let key = format!("u{id}x{seq}");
            let reply = c.ask(&request(&key, &Op::Set(value)));
            let acked = matches!(&reply, Reply::Lines(l) if l[0] == "STORED");
            if matches!(reply, Reply::Lost) {
                conn = None;
            }
            sh.uniques.lock().unwrap().push((tenant, key, value, acked));
            continue;
        }
        let name = format!("k{}x{}", sh.epoch.load(Ordering::Relaxed), rng.u64(..KEYS_PER_TENANT));
        let key = format!("{tenant}/{name}");
        let op = match (rng.u32(..10), seen_cas.get(&name)) {
            (0..=3, _) => Op::Gets,
            (4..=5, Some(&c)) => Op::Cas(c, value),
            (4..=6, _) => Op::Set(value),
            _ => Op::Incr,
        };
        let invoked = Instant::now();
        let reply = c.ask(&request(&name, &op));
        let lost = matches!(reply, Reply::Lost);
        let returned = Instant::now();
        match outcome(&op, reply) {
            Outcome::Ok(ret) => {
                sh.tally.ok.fetch_add(1, Ordering::Relaxed);
                if let Ret::Got(Some((_, c))) = ret {
                    seen_cas.insert(name.clone(), c);
                }
                out.push(Record { process, key, op, invoked, returned: Some((returned, ret)) });
            }
            Outcome::Failed => {
                sh.tally.failed.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Unknown => {
                sh.tally.unknown.fetch_add(1, Ordering::Relaxed);
                if op != Op::Gets {
                    // It may still take effect at any later time: this process stays in
                    // flight forever and the client carries on as a new one.
                    out.push(Record { process, key, op, invoked, returned: None });
                    process += 1;
                }
                if lost {
                    conn = None;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.u64(2..12)));
    }
    out
}

// ------------------------------------------------------------------------------------------
// Checks.

/// Feed each key's operations to a LinearizabilityTester in real-time order (an invocation
/// at the same instant as a return counts as concurrent with it); the keys that fail.
fn check_linearizable(records: &[Record]) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_key.entry(r.key.as_str()).or_default().push(r);
    }
    let mut bad = Vec::new();
    for (key, ops) in by_key {
        // (time, 0 = invoke / 1 = return, index)
        let mut events: Vec<(Instant, u8, usize)> = Vec::new();
        for (i, r) in ops.iter().enumerate() {
            events.push((r.invoked, 0, i));
            if let Some((t, _)) = &r.returned {
                events.push((*t, 1, i));
            }
        }
        events.sort();
        let mut t = LinearizabilityTester::new(Key::default());
        for (_, kind, i) in events {
            let r = ops[i];
            let res = if kind == 0 {
                t.on_invoke(r.process, r.op).map(|_| ())
            } else {
                let ret = r.returned.as_ref().map(|(_, ret)| ret.clone()).expect("returned");
                t.on_return(r.process, ret).map(|_| ())
            };
            res.unwrap_or_else(|e| panic!("history of {key} malformed: {e}"));
        }
        if !t.is_consistent() {
            let mut lines: Vec<String> = ops
                .iter()
                .map(|r| format!("  p{:x} {:?} -> {:?}", r.process, r.op, r.returned.as_ref().map(|x| &x.1)))
                .collect();
            lines.truncate(200);
            eprintln!("NOT LINEARIZABLE: key {key}, {} ops:\n{}", ops.len(), lines.join("\n"));
            bad.push(key.to_string());
        }
    }
    bad
}

/// `gets` of every key on node n's tenant port: key → (value line, data) or None.
fn read_all(c: &Cluster, n: u64, tenant: &str, keys: &[String]) -> BTreeMap<String, Option<(String, String)>> {
    let mut out = BTreeMap::new();
    let mut conn = Conn::open(c.ports[&(n, tenant)]).unwrap_or_else(|| panic!("node {n} {tenant}: no connection"));
    for k in keys {
        let v = match conn.ask(&format!("gets {k}\r\n")) {
            Reply::Lines(l) if l[0] == "END" => None,
            Reply::Lines(l) if l.len() == 3 => Some((l[0].clone(), l[1].clone())),
            Reply::Lines(l) => panic!("node {n} {tenant} gets {k}: {l:?}"),
            Reply::Lost => panic!("node {n} {tenant} gets {k}: no reply"),
        };
        out.insert(k.clone(), v);
    }
    out
}

fn content_hash(m: &BTreeMap<String, Option<(String, String)>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.hash(&mut h);
    h.finish()
}

/// Every few seconds: the current leader of a random tenant is SIGKILLed (then restarted from
/// its data_dir) or SIGSTOPped (then SIGCONTed); the keys change each round. The faults done.
fn nemesis(cluster: &Cluster, sh: &Shared, rng: &mut fastrand::Rng, kills: u64) -> Vec<String> {
    let mut faults = Vec::new();
    for round in 0..kills {
        sh.epoch.store(round, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(rng.u64(1000..2500)));
        let tenant = TENANTS[rng.usize(..TENANTS.len())];
        let deadline = Instant::now() + HEAL_TIMEOUT;
        let victim = loop {
            if let Some(l) = cluster.leader(tenant) {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader for {tenant} in {HEAL_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let kill = rng.bool();
        let t0 = Instant::now();
        if kill {
            cluster.kill(victim);
        } else {
            cluster.stop(victim);
        }
        std::thread::sleep(Duration::from_millis(rng.u64(1000..3000)));
        if kill {
            cluster.start(victim);
        } else {
            cluster.cont(victim);
        }
        faults.push(format!(
            "{} {tenant} leader node {victim} for {:.1}s",
            if kill { "SIGKILL" } else { "SIGSTOP" },
            t0.elapsed().as_secs_f64()
        ));
    }
    faults
}

type NodeContents = Vec<(u64, u64, BTreeMap<String, Option<(String, String)>>)>;

/// After healing: every acknowledged unique write is on every node, and every node of a tenant
/// has the same contents. The number of acknowledged unique writes.
fn check_healed(
    sh: &Shared,
    hashes: &BTreeMap<&str, NodeContents>,
    keys_by_tenant: &BTreeMap<&str, Vec<String>>,
) -> usize {
    // 1. Every acknowledged unique write is on every node.
    let uniques = sh.uniques.lock().unwrap().clone();
    let acked = uniques.iter().filter(|u| u.3).count();
    for (t, key, value, ok) in &uniques {
        if !ok {
            continue;
        }
        for (n, _, seen) in &hashes[t] {
            let got = seen.get(key).cloned().flatten().map(|(_, d)| d);
            assert_eq!(got, Some(value.to_string()), "acknowledged write {t}/{key} missing on node {n}");
        }
    }
    // 2. Replicas identical.
    for (t, per_node) in hashes {
        let distinct: HashSet<u64> = per_node.iter().map(|(_, h, _)| *h).collect();
        if distinct.len() != 1 {
            for k in &keys_by_tenant[t] {
                let vals: Vec<_> = per_node.iter().map(|(_, _, s)| s.get(k).cloned().flatten()).collect();
                if vals.iter().any(|v| *v != vals[0]) {
                    eprintln!("{t}/{k} differs: {vals:?}");
                }
            }
            panic!("tenant {t}: replica contents differ");
        }
    }
    acked
}

/// `CLIENTS_PER_TENANT` client threads per tenant; each returns its records.
fn start_clients(sh: &Arc<Shared>, seed: u64) -> Vec<std::thread::JoinHandle<Vec<Record>>> {
    let mut threads = Vec::new();
    for (ti, &t) in TENANTS.iter().enumerate() {
        for k in 0..CLIENTS_PER_TENANT {
            let id = ti as u64 * CLIENTS_PER_TENANT + k;
            let (sh, s) = (sh.clone(), seed.wrapping_add(id + 1));
            threads.push(std::thread::spawn(move || client(sh, t, id, s)));
        }
    }
    threads
}

fn run(kills: u64) {
    let seed: u64 = std::env::var("SLIPSTREAM_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("replication_linearizable seed {seed} (SLIPSTREAM_TEST_SEED={seed} to repeat), {kills} leader faults");
    let mut rng = fastrand::Rng::with_seed(seed);
    let cluster = Arc::new(Cluster::new("lin"));
    for n in NODES {
        cluster.start(n);
    }
    cluster.wait_converged();
    let sh = Arc::new(Shared {
        cluster: cluster.clone(),
        stop: AtomicBool::new(false),
        epoch: AtomicU64::new(0),
        tally: Tally::default(),
        uniques: Mutex::new(Vec::new()),
    });
    let threads = start_clients(&sh, seed);
    let started = Instant::now();
    let faults = nemesis(&cluster, &sh, &mut rng, kills);
    std::thread::sleep(Duration::from_millis(1500));
    sh.stop.store(true, Ordering::Relaxed);
    let mut records = Vec::new();
    for t in threads {
        records.extend(t.join().expect("client thread"));
    }
    let load_s = started.elapsed().as_secs_f64();
    cluster.wait_converged();
    for f in &faults {
        println!("  fault: {f}");
    }
    let tally = &sh.tally;
    println!(
        "{} ops in {load_s:.0}s: {} ok, {} failed (not applied), {} unknown; {} faults",
        tally.ok.load(Ordering::Relaxed) + tally.failed.load(Ordering::Relaxed) + tally.unknown.load(Ordering::Relaxed),
        tally.ok.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
        tally.unknown.load(Ordering::Relaxed),
        faults.len()
    );

    // Final reads through every node join each key's history (after everything else).
    let mut keys_by_tenant: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (ti, &t) in TENANTS.iter().enumerate() {
        let first = ti as u64 * CLIENTS_PER_TENANT;
        let mut keys: Vec<String> = records
            .iter()
            .filter(|r| (first..first + CLIENTS_PER_TENANT).contains(&(r.process >> 32)))
            .filter_map(|r| r.key.split_once('/').map(|(_, k)| k.to_string()))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        keys.extend(sh.uniques.lock().unwrap().iter().filter(|u| u.0 == t).map(|u| u.1.clone()));
        keys.sort();
        keys_by_tenant.insert(t, keys);
    }
    let mut final_process = 1u64 << 40;
    let mut hashes = BTreeMap::new();
    for (&t, keys) in &keys_by_tenant {
        for n in NODES {
            let invoked = Instant::now();
            let seen = read_all(&cluster, n, t, keys);
            let returned = Instant::now();
            hashes.entry(t).or_insert_with(Vec::new).push((n, content_hash(&seen), seen.clone()));
            for (k, v) in &seen {
                if !k.starts_with('k') {
                    continue;
                }
                let got = v.as_ref().map(|(line, data)| {
                    let cas = line.split(' ').nth(4).and_then(|c| c.parse().ok()).expect("cas");
                    (data.parse().expect("numeric value"), cas)
                });
                final_process += 1;
                records.push(Record {
                    process: final_process,
                    key: format!("{t}/{k}"),
                    op: Op::Gets,
                    invoked,
                    returned: Some((returned, Ret::Got(got))),
                });
            }
        }
    }

    let acked = check_healed(&sh, &hashes, &keys_by_tenant);
    // 3. Linearizable, key by key (on a thread with a large stack: the search recurses per op).
    let checked = records.len();
    let t0 = Instant::now();
    let bad = std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || check_linearizable(&records))
        .expect("checker thread")
        .join()
        .expect("checker");
    println!(
        "{acked} acknowledged unique writes on every node; replicas identical; {checked} ops checked in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert!(bad.is_empty(), "history not linearizable for keys {bad:?} (seed {seed})");
}

/// Kills every few seconds while clients run; ~1 min. `REPL_KILLS` raises the count.
#[test]
fn histories_stay_linearizable_while_leaders_are_killed_and_stopped() {
    let kills = std::env::var("REPL_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    run(kills);
}

#[test]
fn the_model_accepts_and_refuses_what_it_should() {
    let mut t = LinearizabilityTester::new(Key::default());
    t.on_invoke(1, Op::Set(5)).unwrap().on_return(1, Ret::Stored).unwrap();
    t.on_invoke(1, Op::Gets).unwrap().on_return(1, Ret::Got(Some((5, 77)))).unwrap();
    t.on_invoke(2, Op::Set(6)).unwrap(); // unknown outcome: may or may not have happened
    t.on_invoke(1, Op::Cas(77, 9)).unwrap().on_return(1, Ret::Exists).unwrap();
    assert!(t.is_consistent(), "the unknown set happened before the cas");
    let mut stale = t.clone();
    stale.on_invoke(3, Op::Gets).unwrap().on_return(3, Ret::Got(Some((5, 77)))).unwrap();
    assert!(!stale.is_consistent(), "after a failed cas saw the set, an old read is stale");
    let mut lost = LinearizabilityTester::new(Key::default());
    lost.on_invoke(1, Op::Set(5)).unwrap().on_return(1, Ret::Stored).unwrap();
    lost.on_invoke(1, Op::Gets).unwrap().on_return(1, Ret::Got(None)).unwrap();
    assert!(!lost.is_consistent(), "an acknowledged write cannot vanish");
    let mut incr = LinearizabilityTester::new(Key::default());
    incr.on_invoke(1, Op::Set(5)).unwrap().on_return(1, Ret::Stored).unwrap();
    incr.on_invoke(1, Op::Incr).unwrap().on_return(1, Ret::Value(6)).unwrap();
    incr.on_invoke(2, Op::Incr).unwrap().on_return(2, Ret::Value(6)).unwrap();
    assert!(!incr.is_consistent(), "two increments cannot both return 6");
}
