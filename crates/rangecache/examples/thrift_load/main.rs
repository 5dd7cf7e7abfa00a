//! A closed-loop load generator for the HBase front end (the benchmark's fast client; Python
//! happybase tops out near 1-2k ops/s). N connections, each one thread sending one request and
//! waiting for its answer; latency per operation into an HDR histogram; one result line.
//!
//! Targets: `--target thrift` speaks HBase's Thrift1 API (to Slipstream); `--target sidecar`
//! speaks the sidecar protocol to the JVM sidecar, i.e. HBase through its native client with no
//! Slipstream and no cache ("HBase direct").
//!
//! ```text
//! cargo run --release -p slipstream-rangecache --example thrift_load -- \
//!   --addr 127.0.0.1:9090 --target thrift --op scan --rows 100 --conns 4 --secs 5 \
//!   --keys 20000 --starts 64 [--load]
//! ```
//! `--op scan`: scannerOpenWithStop(start, start + rows) + scannerGetList(rows) + scannerClose;
//! `--op get`: getRow. Starts/rows are drawn from `--starts` fixed keys (repeated: cache hits once
//! warm) or, with `--starts 0`, uniformly from all keys (mostly misses for all-row).
//! `--load` first creates table `--table` and writes `--keys` rows of 4 x 32-byte columns.
//!
//! `--client raw` (the default) is the cheap client of `raw.rs`: framed, `--depth` operations in
//! flight per connection (pipelined), replies skimmed (row counts, not rows); `--client crate` is
//! the `thrift` crate's generated client (buffered, one request at a time, every row decoded).
//! `--op zipf`: 100-row (`--rows`) scans over `--overlap` k-fold overlapping ranges (starts
//! every rows/k keys, so each row lies in k ranges), range popularity Zipf(`--zipf-s`) over a
//! seeded shuffle, and `--write-pct` of operations a `mutateRow` of one row of a range drawn the
//! same way (writes follow the reads' popularity: the hardest case for the cache).
//! `--ops N` ends the run after N operations (the same seeded sequence of queries and writes
//! whatever the daemon's speed, so strategies are compared on identical work).

mod raw;
// The Zipf sampler's one home is the load generator crate (a binary crate: included, not copied).
#[allow(dead_code)] // reason: only Zipf is used here
#[path = "../../../loadgen/src/dist.rs"]
mod dist;

use hdrhistogram::Histogram;
use slipstream_rangecache::gen::hbase1::{
    BatchMutation, ColumnDescriptor, HbaseSyncClient, Mutation, THbaseSyncClient,
};
use slipstream_rangecache::sidecar::client::SidecarClient;
use slipstream_rangecache::sidecar::codec::ReadSpec;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thrift::protocol::{TBinaryInputProtocol, TBinaryOutputProtocol};
use thrift::transport::{
    ReadHalf, TBufferedReadTransport, TBufferedWriteTransport, TIoChannel, TTcpChannel, WriteHalf,
};

type Client = HbaseSyncClient<
    TBinaryInputProtocol<TBufferedReadTransport<ReadHalf<TTcpChannel>>>,
    TBinaryOutputProtocol<TBufferedWriteTransport<WriteHalf<TTcpChannel>>>,
>;

#[derive(Clone)]
struct Opts {
    addr: SocketAddr,
    target: String,
    op: String,
    table: String,
    rows: usize,
    conns: usize,
    secs: f64,
    keys: usize,
    starts: usize,
    load: bool,
    seed: u64,
    client: String,
    depth: usize,
    overlap: usize,
    write_pct: f64,
    zipf_s: f64,
    /// Stop after this many operations (reads + writes) over all connections; 0: `--secs` only.
    ops_max: u64,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        addr: "127.0.0.1:9090".parse().map_err(|e| format!("{e}"))?,
        target: "thrift".into(),
        op: "scan".into(),
        table: "bench".into(),
        rows: 100,
        conns: 4,
        secs: 5.0,
        keys: 20_000,
        starts: 64,
        load: false,
        seed: 1,
        client: "raw".into(),
        depth: 1,
        overlap: 1,
        write_pct: 0.0,
        zipf_s: 0.99,
        ops_max: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--load" {
            o.load = true;
            i += 1;
            continue;
        }
        let v = args.get(i + 1).ok_or(format!("{a} needs a value"))?.clone();
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{a}: {e}"));
        match a {
            "--addr" => o.addr = v.parse().map_err(|e| format!("--addr: {e}"))?,
            "--target" => o.target = v,
            "--op" => o.op = v,
            "--table" => o.table = v,
            "--rows" => o.rows = num(&v)?.max(1),
            "--conns" => o.conns = num(&v)?.clamp(1, 256),
            "--secs" => o.secs = v.parse().map_err(|e| format!("--secs: {e}"))?,
            "--keys" => o.keys = num(&v)?.max(2),
            "--starts" => o.starts = num(&v)?,
            "--seed" => o.seed = num(&v)? as u64,
            "--client" => o.client = v,
            "--depth" => o.depth = num(&v)?.clamp(1, 1024),
            "--overlap" => o.overlap = num(&v)?.clamp(1, 1024),
            "--write-pct" => o.write_pct = v.parse().map_err(|e| format!("--write-pct: {e}"))?,
            "--ops" => o.ops_max = num(&v)? as u64,
            "--zipf-s" => o.zipf_s = v.parse().map_err(|e| format!("--zipf-s: {e}"))?,
            _ => return Err(format!("unknown option {a}")),
        }
        i += 2;
    }
    if !matches!(o.target.as_str(), "thrift" | "sidecar")
        || !matches!(o.op.as_str(), "scan" | "get" | "zipf")
        || !matches!(o.client.as_str(), "raw" | "crate")
    {
        return Err("--target thrift|sidecar, --op scan|get|zipf, --client raw|crate".into());
    }
    if o.op == "zipf" && (o.target != "thrift" || o.client != "raw") {
        return Err("--op zipf needs --target thrift --client raw".into());
    }
    Ok(o)
}

fn key(i: usize) -> Vec<u8> {
    format!("row{i:07}").into_bytes()
}

/// xorshift64*: a fast deterministic generator (no dependency for the hot loop).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn thrift_client(addr: SocketAddr) -> Result<Client, String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let (r, w) = TTcpChannel::with_stream(s).split().map_err(|e| e.to_string())?;
    Ok(HbaseSyncClient::new(
        TBinaryInputProtocol::new(TBufferedReadTransport::new(r), true),
        TBinaryOutputProtocol::new(TBufferedWriteTransport::new(w), true),
    ))
}

fn load(o: &Opts) -> Result<(), String> {
    let mut c = thrift_client(o.addr)?;
    let t = o.table.clone().into_bytes();
    let fam =
        ColumnDescriptor::new(b"cf:".to_vec(), 1, "NONE".to_string(), false, "NONE".to_string(), 0, 0, true, i32::MAX);
    if let Err(e) = c.create_table(t.clone(), vec![fam]) {
        eprintln!("create_table: {e:?} (continuing)");
    }
    let t0 = Instant::now();
    for chunk in (0..o.keys).collect::<Vec<_>>().chunks(500) {
        let batch: Vec<BatchMutation> = chunk
            .iter()
            .map(|&i| BatchMutation {
                row: Some(key(i)),
                mutations: Some(
                    (0..4)
                        .map(|j| Mutation {
                            is_delete: Some(false),
                            column: Some(format!("cf:c{j}").into_bytes()),
                            value: Some(format!("{:032}", i * 4 + j).into_bytes()),
                            write_to_w_a_l: Some(true),
                        })
                        .collect(),
                ),
            })
            .collect();
        c.mutate_rows(t.clone(), batch, BTreeMap::new()).map_err(|e| format!("mutateRows: {e:?}"))?;
    }
    eprintln!("loaded {} rows in {:.1} s", o.keys, t0.elapsed().as_secs_f64());
    Ok(())
}

/// One operation against the chosen target; returns rows received.
enum Target {
    Thrift(Client),
    Sidecar(Arc<SidecarClient>),
}

fn one(t: &mut Target, o: &Opts, table: &[u8], start: usize) -> Result<usize, String> {
    let stop = key(start + o.rows);
    match (t, o.op.as_str()) {
        (Target::Thrift(c), "scan") => {
            let id = c
                .scanner_open_with_stop(table.to_vec(), key(start), stop, Vec::new(), BTreeMap::new())
                .map_err(|e| e.to_string())?;
            let got = c.scanner_get_list(id, o.rows as i32).map_err(|e| e.to_string())?;
            c.scanner_close(id).map_err(|e| e.to_string())?;
            Ok(got.len())
        }
        (Target::Thrift(c), _) => {
            let got = c.get_row(table.to_vec(), key(start), BTreeMap::new()).map_err(|e| e.to_string())?;
            Ok(got.len())
        }
        (Target::Sidecar(s), "scan") => {
            let (rows, _) = s
                .scan(table, &key(start), &stop, &ReadSpec::latest(), b"", o.rows as i32, 4 << 20)
                .map_err(|e| e.to_string())?;
            Ok(rows.len())
        }
        (Target::Sidecar(s), _) => {
            let rows = s.get(table, &[key(start)], &ReadSpec::latest()).map_err(|e| e.to_string())?;
            Ok(rows.iter().filter(|r| !r.cells.is_empty()).count())
        }
    }
}

/// Where the operations go: fixed starts, uniform starts, or Zipf-popular overlapping ranges.
struct Picker {
    fixed: Vec<usize>,
    span: usize,
    zipf: Option<(dist::Zipf, Vec<usize>)>,
}

impl Picker {
    fn new(o: &Opts) -> Picker {
        let span = o.keys.saturating_sub(o.rows).max(1);
        let mut seed_rng = Rng(o.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let fixed = if o.op == "zipf" { Vec::new() } else { (0..o.starts).map(|_| seed_rng.below(span)).collect() };
        let zipf = (o.op == "zipf").then(|| {
            let stride = (o.rows / o.overlap).max(1);
            let mut starts: Vec<usize> = (0..=span / stride).map(|i| i * stride).collect();
            fastrand::Rng::with_seed(o.seed).shuffle(&mut starts);
            (dist::Zipf::new(starts.len(), o.zipf_s), starts)
        });
        Picker { fixed, span, zipf }
    }

    fn start(&self, rng: &mut Rng, frng: &mut fastrand::Rng) -> usize {
        match &self.zipf {
            Some((z, starts)) => starts[z.sample(frng)],
            None if self.fixed.is_empty() => rng.below(self.span),
            None => self.fixed[rng.below(self.fixed.len())],
        }
    }
}

/// Counts of one connection's run.
struct Done {
    h: Histogram<u64>,
    ops: u64,
    rows: u64,
    writes: u64,
}

/// `--client raw`: `--depth` operations per batch, each batch one write per round trip.
fn raw_worker(o: &Opts, pick: &Picker, n: usize, deadline: Instant) -> Result<Done, String> {
    use raw::{Answer, Arg};
    let mut d = Done {
        h: Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
        ops: 0,
        rows: 0,
        writes: 0,
    };
    let mut c = raw::RawConn::connect(o.addr)?;
    let mut writer = if o.write_pct > 0.0 { Some(thrift_client(o.addr)?) } else { None };
    let mut rng = Rng((o.seed + n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut frng = fastrand::Rng::with_seed(o.seed + n as u64 + 1);
    let table = o.table.clone().into_bytes();
    let scan = o.op != "get";
    let mut starts = Vec::with_capacity(o.depth);
    let ops_max = if o.ops_max == 0 { u64::MAX } else { o.ops_max.div_ceil(o.conns as u64) };
    while Instant::now() < deadline && d.ops + d.writes < ops_max {
        starts.clear();
        for _ in 0..o.depth {
            let s = pick.start(&mut rng, &mut frng);
            match writer.as_mut() {
                Some(w) if frng.f64() * 100.0 < o.write_pct => {
                    let row = key(s + frng.usize(0..o.rows));
                    let m =
                        vec![Mutation::new(false, b"cf:c0".to_vec(), format!("w{}", frng.u64(..)).into_bytes(), true)];
                    w.mutate_row(table.clone(), row, m, BTreeMap::new()).map_err(|e| format!("mutateRow: {e:?}"))?;
                    d.writes += 1;
                }
                _ => starts.push(s),
            }
        }
        let t = Instant::now();
        for &s in &starts {
            let (k, stop) = (key(s), key(s + o.rows));
            if scan {
                c.call(
                    "scannerOpenWithStop",
                    &[Arg::Bin(&table), Arg::Bin(&k), Arg::Bin(&stop), Arg::NoColumns, Arg::NoAttributes],
                )?;
            } else {
                c.call("getRow", &[Arg::Bin(&table), Arg::Bin(&k), Arg::NoAttributes])?;
            }
        }
        c.flush()?;
        let mut ids = Vec::with_capacity(starts.len());
        for _ in &starts {
            match c.reply()? {
                Answer::I32(id) if scan => ids.push(id),
                Answer::List(r) if !scan => d.rows += r as u64,
                a => return Err(format!("unexpected answer {a:?}")),
            }
        }
        if scan {
            for &id in &ids {
                c.call("scannerGetList", &[Arg::I32(id), Arg::I32(o.rows as i32)])?;
                c.call("scannerClose", &[Arg::I32(id)])?;
            }
            c.flush()?;
            for _ in &ids {
                match (c.reply()?, c.reply()?) {
                    (Answer::List(r), Answer::Void) => d.rows += r as u64,
                    a => return Err(format!("unexpected answers {a:?}")),
                }
            }
        }
        let us = (t.elapsed().as_nanos() as u64 / 1000).max(1);
        for _ in &starts {
            let _ = d.h.record(us);
        }
        d.ops += starts.len() as u64;
    }
    Ok(d)
}

/// `--client crate` and the sidecar target: one request at a time.
fn crate_worker(
    o: &Opts,
    pick: &Picker,
    sidecar: Option<Arc<SidecarClient>>,
    n: usize,
    deadline: Instant,
) -> Result<Done, String> {
    let mut d = Done {
        h: Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
        ops: 0,
        rows: 0,
        writes: 0,
    };
    let mut t = match sidecar {
        Some(s) => Target::Sidecar(s),
        None => Target::Thrift(thrift_client(o.addr)?),
    };
    let mut rng = Rng((o.seed + n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut frng = fastrand::Rng::with_seed(o.seed + n as u64 + 1);
    let table = o.table.clone().into_bytes();
    while Instant::now() < deadline {
        let start = pick.start(&mut rng, &mut frng);
        let s = Instant::now();
        d.rows += one(&mut t, o, &table, start)? as u64;
        let _ = d.h.record((s.elapsed().as_nanos() as u64 / 1000).max(1));
        d.ops += 1;
    }
    Ok(d)
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("thrift_load: {e}");
            std::process::exit(2);
        }
    };
    if o.load {
        if let Err(e) = load(&o) {
            eprintln!("thrift_load: {e}");
            std::process::exit(1);
        }
        if o.secs <= 0.0 {
            return;
        }
    }
    let pick = Arc::new(Picker::new(&o));
    let sidecar = (o.target == "sidecar")
        .then(|| Arc::new(SidecarClient::new(o.addr, Duration::from_secs(30), Duration::from_secs(10))));
    let deadline = Instant::now() + Duration::from_secs_f64(o.secs);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..o.conns)
        .map(|n| {
            let (o, pick, sidecar) = (o.clone(), pick.clone(), sidecar.clone());
            std::thread::spawn(move || {
                if o.target == "thrift" && o.client == "raw" {
                    raw_worker(&o, &pick, n, deadline)
                } else {
                    crate_worker(&o, &pick, sidecar, n, deadline)
                }
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let (mut ops, mut rows, mut writes) = (0u64, 0u64, 0u64);
    for h in handles {
        match h.join() {
            Ok(Ok(d)) => {
                let _ = all.add(&d.h);
                ops += d.ops;
                rows += d.rows;
                writes += d.writes;
            }
            Ok(Err(e)) => {
                eprintln!("thrift_load: {e}");
                std::process::exit(1);
            }
            Err(_) => std::process::exit(1),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "target={} client={} depth={} op={} rows={} conns={} starts={} ops={} writes={} secs={:.2} ops_per_s={:.0} rows_per_op={:.1} p50_us={} p99_us={} max_us={}",
        o.target,
        o.client,
        o.depth,
        o.op,
        o.rows,
        o.conns,
        o.starts,
        ops,
        writes,
        secs,
        ops as f64 / secs,
        rows as f64 / ops.max(1) as f64,
        all.value_at_quantile(0.5),
        all.value_at_quantile(0.99),
        all.max()
    );
}
