//! slipstream-loadgen: a load generator for memcached text-protocol servers (TCP,
//! pipelined set/get) and memcached UDP gets, closed-loop by default or open-loop at a fixed
//! rate (`--rate-per-s`, latency from each request's scheduled time). Measures throughput,
//! bytes moved, per-request latency percentiles, hits/misses and every unexpected reply, plus
//! the CPU used by the client, the server (given its pid) and the machine over the measured
//! window, and prints one JSON line. Not a correctness test suite.

mod dist;
mod hist;
mod pace;
mod send;
mod sysstat;
mod tcp;
mod tcp_rate;
mod udp;
mod wire;
mod xdpgen;

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hist::Histogram;
use wire::{Op, Outcome};

const USAGE: &str = "\
slipstream-loadgen: memcached load generator (prints one JSON line)

  --server HOST:PORT     server to load (TCP, or UDP with --udp)        [127.0.0.1:11211]
  --conns N              connections (UDP: sockets), split over threads  [50]
  --threads N            client threads                                  [1]
  --pipeline N           TCP: requests per batch per connection;
                         UDP: requests in flight per socket              [16]
  --ratio S:G            set:get mix (TCP only; UDP sends gets);
                         0:1 = read-only                                 [1:1]
  --value-bytes N        value size                                      [100]
  --keys N               key space, keys are key:%08d                    [10000]
  --duration-s SECS      measured window                                 [10]
  --warmup-s SECS        load before the window, not measured            [2]
  --prefill              set every key once first (over TCP) so gets hit
  --prefill-server H:P   where --prefill sends its sets     [same as --server]
  --seed N               PRNG seed                                       [1]
  --udp                  memcached UDP get load (8-byte frame header)
  --udp-timeout-ms MS    a UDP request unanswered this long is lost      [200]
  --server-pid PID       also report that process's CPU time over the window
  --rate-per-s R         open loop: R requests/s in all (warmup included), request n
                         due at start + n/R on connection n mod --conns; at most
                         --pipeline in flight per connection; latency is measured
                         from each request's scheduled time (no coordinated
                         omission)                          [off: closed loop]
  --backlog-max N        open loop: due-but-unsent requests kept per connection
                         when it falls behind; older ones are dropped (counted,
                         never sent)                                     [1000]
  --start-at-unix-ms T   connect, then wait until wall-clock T (ms since the
                         epoch, at most 300 s ahead) before the load starts, so
                         several loadgen processes share one window
  --help

`slipstream-loadgen xdp-gen --help`: the live-frame XDP generator (root, veth).

Open-loop JSON adds: rate_per_s, achieved_rate_per_s (replies in the window per s),
sent (requests scheduled in the window and sent), behind (of those, how many waited
client-side for a free in-flight slot), dropped (requests shed in the window because
more than --backlog-max were due on a connection), unsent (requests scheduled in the
window that were still waiting when it closed: the generator itself did not get the CPU
in time; sent + dropped + unsent is exactly the schedule's count), backlog_peak.

Exit status: 0 clean run; 2 bad arguments or setup failure; 3 the run saw errors
(unexpected replies, broken or stalled connections, prefill failures; UDP losses do
not count, they are reported as lost).
";

const CONNS_MAX: usize = 10_000;
const THREADS_MAX: usize = 64;
const PIPELINE_MAX: usize = 1024;
const VALUE_BYTES_MAX: usize = 1024 * 1024;
const DURATION_S_MAX: f64 = 3600.0;
/// How far ahead `--start-at-unix-ms` may point.
const START_AHEAD_MS_MAX: u64 = 300_000;

pub struct Config {
    server: SocketAddr,
    server_text: String,
    conns: usize,
    threads: usize,
    pipeline: usize,
    ratio_set: u32,
    ratio_get: u32,
    value_bytes: usize,
    keys: u32,
    duration: Duration,
    warmup: Duration,
    prefill: bool,
    prefill_server: Option<SocketAddr>,
    seed: u64,
    udp: bool,
    udp_timeout: Duration,
    server_pid: Option<u32>,
    /// Open loop: requests per second over all connections; None = closed loop.
    rate_per_s: Option<f64>,
    /// Open loop: most due-but-unsent requests per connection before the oldest are shed.
    backlog_max: u64,
    start_at_unix_ms: Option<u64>,
}

fn parse_num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{name}: not a valid number: {v:?}"))
}

fn resolve(name: &str, v: &str) -> Result<SocketAddr, String> {
    v.to_socket_addrs()
        .map_err(|e| format!("{name}: cannot resolve {v:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{name}: no address for {v:?}"))
}

fn secs(name: &str, v: &str) -> Result<Duration, String> {
    let s: f64 = parse_num(name, v)?;
    if !(0.0..=DURATION_S_MAX).contains(&s) {
        return Err(format!("{name}: must be within 0..={DURATION_S_MAX}"));
    }
    Ok(Duration::from_secs_f64(s))
}

fn in_range<T: PartialOrd + std::fmt::Display>(name: &str, v: T, lo: T, hi: T) -> Result<T, String> {
    if v < lo || v > hi {
        return Err(format!("{name}: must be within {lo}..={hi}"));
    }
    Ok(v)
}

fn parse_args(args: &[String]) -> Result<Option<Config>, String> {
    let mut cfg = Config {
        server: resolve("--server", "127.0.0.1:11211")?,
        server_text: "127.0.0.1:11211".into(),
        conns: 50,
        threads: 1,
        pipeline: 16,
        ratio_set: 1,
        ratio_get: 1,
        value_bytes: 100,
        keys: 10_000,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        prefill: false,
        prefill_server: None,
        seed: 1,
        udp: false,
        udp_timeout: Duration::from_millis(200),
        server_pid: None,
        rate_per_s: None,
        backlog_max: 1000,
        start_at_unix_ms: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let flag = flag.as_str();
        match flag {
            "--help" | "-h" => return Ok(None),
            "--prefill" => {
                cfg.prefill = true;
                continue;
            }
            "--udp" => {
                cfg.udp = true;
                continue;
            }
            _ => {}
        }
        let v = it.next().ok_or_else(|| format!("{flag}: needs a value"))?.as_str();
        match flag {
            "--server" => {
                cfg.server = resolve(flag, v)?;
                cfg.server_text = v.to_string();
            }
            "--prefill-server" => cfg.prefill_server = Some(resolve(flag, v)?),
            "--conns" => cfg.conns = in_range(flag, parse_num(flag, v)?, 1, CONNS_MAX)?,
            "--threads" => cfg.threads = in_range(flag, parse_num(flag, v)?, 1, THREADS_MAX)?,
            "--pipeline" => cfg.pipeline = in_range(flag, parse_num(flag, v)?, 1, PIPELINE_MAX)?,
            "--value-bytes" => cfg.value_bytes = in_range(flag, parse_num(flag, v)?, 1, VALUE_BYTES_MAX)?,
            "--keys" => cfg.keys = in_range(flag, parse_num(flag, v)?, 1, wire::KEYS_MAX)?,
            "--duration-s" => cfg.duration = secs(flag, v)?,
            "--warmup-s" => cfg.warmup = secs(flag, v)?,
            "--seed" => cfg.seed = parse_num(flag, v)?,
            "--udp-timeout-ms" => {
                cfg.udp_timeout = Duration::from_millis(in_range(flag, parse_num(flag, v)?, 1, 60_000)?)
            }
            "--server-pid" => cfg.server_pid = Some(parse_num(flag, v)?),
            "--rate-per-s" => {
                let r: f64 = parse_num(flag, v)?;
                if !(r.is_finite() && r > 0.0 && r <= pace::RATE_PER_S_MAX) {
                    return Err(format!("{flag}: must be > 0 and <= {}", pace::RATE_PER_S_MAX));
                }
                cfg.rate_per_s = Some(r);
            }
            "--backlog-max" => cfg.backlog_max = in_range(flag, parse_num(flag, v)?, 1, pace::BACKLOG_MAX_MAX)?,
            "--start-at-unix-ms" => cfg.start_at_unix_ms = Some(parse_num(flag, v)?),
            "--ratio" => {
                let (s, g) = v.split_once(':').ok_or_else(|| format!("{flag}: expected S:G, got {v:?}"))?;
                cfg.ratio_set = in_range(flag, parse_num(flag, s)?, 0, 1_000_000)?;
                cfg.ratio_get = in_range(flag, parse_num(flag, g)?, 0, 1_000_000)?;
                if cfg.ratio_set + cfg.ratio_get == 0 {
                    return Err(format!("{flag}: both sides are 0"));
                }
            }
            _ => return Err(format!("unknown option {flag:?}")),
        }
    }
    if cfg.threads > cfg.conns {
        cfg.threads = cfg.conns;
    }
    Ok(Some(cfg))
}

/// The crate's one RNG: `fastrand` (wyrand), seeded per connection so a seed gives the same
/// request stream every run. It is one multiply per draw, cheap next to a request's syscalls.
pub use fastrand::Rng;

/// The measured window: replies completing inside it are counted.
#[derive(Clone, Copy)]
pub struct Window {
    /// When the load (warmup included) started: the open-loop schedule's origin.
    pub load_start: Instant,
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    #[inline]
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
}

#[derive(Default, Clone)]
pub struct Counts {
    pub sets: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    /// Unexpected replies, broken-connection leftovers.
    pub errors: u64,
    /// Unexpected replies during warmup (reported, and they fail the run too).
    pub errors_outside_window: u64,
    pub conn_failures: u64,
    /// TCP connections still owed replies a second after sending their batch, at the end.
    pub stalled_conns: u64,
    pub lost: u64,
    pub late: u64,
    pub udp_sent: u64,
    /// TCP syscalls and batches in the window: how many reads a batch of replies takes.
    pub batches: u64,
    pub reads: u64,
    pub writes: u64,
    /// Bytes read from / written to the server's sockets inside the window.
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Open loop: requests scheduled inside the window and sent; of those, how many waited
    /// for a free in-flight slot; requests shed inside the window; requests scheduled inside
    /// the window still waiting when it closed; largest backlog seen.
    pub sent: u64,
    pub behind: u64,
    pub dropped: u64,
    pub unsent: u64,
    pub backlog_peak: u64,
}

impl Counts {
    #[inline]
    pub fn record(&mut self, op: Op, outcome: Outcome) {
        match op {
            Op::Set => self.sets += 1,
            Op::Get => self.gets += 1,
        }
        match outcome {
            Outcome::Stored => {}
            Outcome::Hit => self.hits += 1,
            Outcome::Miss => self.misses += 1,
            Outcome::Error => self.errors += 1,
        }
    }

    fn merge(&mut self, o: &Counts) {
        self.sets += o.sets;
        self.gets += o.gets;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        self.errors_outside_window += o.errors_outside_window;
        self.conn_failures += o.conn_failures;
        self.stalled_conns += o.stalled_conns;
        self.lost += o.lost;
        self.late += o.late;
        self.udp_sent += o.udp_sent;
        self.batches += o.batches;
        self.reads += o.reads;
        self.writes += o.writes;
        self.rx_bytes += o.rx_bytes;
        self.tx_bytes += o.tx_bytes;
        self.sent += o.sent;
        self.behind += o.behind;
        self.dropped += o.dropped;
        self.unsent += o.unsent;
        self.backlog_peak = self.backlog_peak.max(o.backlog_peak);
    }
}

pub struct ThreadResult {
    pub hist: Histogram,
    pub counts: Counts,
}

struct Snapshot {
    client_ticks: Option<(u64, u64)>,
    server_ticks: Option<(u64, u64)>,
    cpus: Vec<sysstat::CpuTicks>,
}

fn snapshot(cfg: &Config) -> Snapshot {
    Snapshot {
        client_ticks: sysstat::process_cpu_ticks("self"),
        server_ticks: cfg.server_pid.and_then(|p| sysstat::process_cpu_ticks(&p.to_string())),
        cpus: sysstat::machine_cpu_ticks(),
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn opt_f(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.3}"),
        _ => "null".into(),
    }
}

/// Runs the load; returns the JSON line and whether the run saw errors.
#[allow(clippy::too_many_lines)] // prefill, run and report, in order
fn run(cfg: &Config) -> Result<(String, bool), String> {
    let mut prefill_errors = 0u64;
    let mut prefill_s = 0.0;
    if cfg.prefill {
        let t0 = Instant::now();
        let addr = cfg.prefill_server.unwrap_or(cfg.server);
        prefill_errors = tcp::prefill(cfg, addr).map_err(|e| format!("prefill to {addr}: {e}"))?;
        prefill_s = t0.elapsed().as_secs_f64();
    }

    // Connect everything before the clock starts, then split over threads.
    let mut per_thread: Vec<Vec<TcpStream>> = (0..cfg.threads).map(|_| Vec::new()).collect();
    if !cfg.udp {
        for i in 0..cfg.conns {
            let s = TcpStream::connect_timeout(&cfg.server, Duration::from_secs(5))
                .map_err(|e| format!("connect {}: {e}", cfg.server))?;
            if let Some(v) = per_thread.get_mut(i % cfg.threads) {
                v.push(s);
            }
        }
    }
    if let Some(at_ms) = cfg.start_at_unix_ms {
        wait_until_unix_ms(at_ms)?;
    }
    let t0 = Instant::now();
    let window = Window { load_start: t0, start: t0 + cfg.warmup, end: t0 + cfg.warmup + cfg.duration };
    let results = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (t, streams) in per_thread.into_iter().enumerate() {
            let seed = cfg.seed.wrapping_mul(1_000_003).wrapping_add(t as u64);
            let sockets = cfg.conns / cfg.threads + usize::from(t < cfg.conns % cfg.threads);
            handles.push(scope.spawn(move || match (cfg.udp, cfg.rate_per_s) {
                (true, _) => udp::run_thread(cfg, cfg.server, sockets, seed, window, t),
                (false, Some(rate)) => tcp_rate::run_thread(cfg, rate, streams, seed, window, t),
                (false, None) => tcp::run_thread(cfg, streams, seed, window),
            }));
        }
        sleep_until(window.start);
        let before = snapshot(cfg);
        let measured_from = Instant::now();
        sleep_until(window.end);
        let after = snapshot(cfg);
        let measured_s = measured_from.elapsed().as_secs_f64();
        let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (before, after, measured_s, joined)
    });
    let (before, after, measured_s, joined) = results;
    let mut hist = Histogram::new();
    let mut counts = Counts::default();
    for r in joined {
        match r {
            Ok(Ok(tr)) => {
                hist.merge(&tr.hist);
                counts.merge(&tr.counts);
            }
            Ok(Err(e)) => return Err(format!("worker failed: {e}")),
            Err(_) => return Err("worker thread panicked".into()),
        }
    }

    let ticks = sysstat::clock_ticks_per_s();
    // (user+system, system) seconds between two samples.
    let cpu_s = |b: Option<(u64, u64)>, a: Option<(u64, u64)>| match (b, a) {
        (Some(b), Some(a)) => {
            let user = a.0.saturating_sub(b.0) as f64 / ticks;
            let sys = a.1.saturating_sub(b.1) as f64 / ticks;
            (Some(user + sys), Some(sys))
        }
        _ => (None, None),
    };
    let (client_cpu_s, client_sys_s) = cpu_s(before.client_ticks, after.client_ticks);
    let (server_cpu_s, server_sys_s) = cpu_s(before.server_ticks, after.server_ticks);
    let busy = sysstat::busy_pct(&before.cpus, &after.cpus);
    let ops = counts.sets + counts.gets;
    // Workers count replies inside exactly [window.start, window.end); the CPU samples are
    // taken at those edges too (measured_s says how closely).
    let window_s = cfg.duration.as_secs_f64();
    let ops_per_s = if window_s > 0.0 { ops as f64 / window_s } else { 0.0 };
    let per_s = |n: u64| if window_s > 0.0 { n as f64 / window_s } else { 0.0 };
    let per_server_cpu = server_cpu_s.filter(|c| *c > 0.0).map(|c| ops as f64 / c);
    let per_cpu: Vec<String> = busy.iter().skip(1).map(|b| format!("{b:.1}")).collect();

    let mut j = String::with_capacity(1024);
    j.push('{');
    j.push_str(&format!("\"mode\":{},", json_str(if cfg.udp { "udp" } else { "tcp" })));
    j.push_str(&format!("\"server\":{},", json_str(&cfg.server_text)));
    j.push_str(&format!(
        "\"conns\":{},\"threads\":{},\"pipeline\":{},\"ratio\":{},\"value_bytes\":{},\"keys\":{},\"seed\":{},",
        cfg.conns,
        cfg.threads,
        cfg.pipeline,
        json_str(&if cfg.udp { "0:1".to_string() } else { format!("{}:{}", cfg.ratio_set, cfg.ratio_get) }),
        cfg.value_bytes,
        cfg.keys,
        cfg.seed
    ));
    j.push_str(&format!(
        "\"warmup_s\":{:.3},\"duration_s\":{:.3},\"cpu_sampled_s\":{:.3},\"prefill\":{},\"prefill_s\":{:.3},\"prefill_errors\":{},",
        cfg.warmup.as_secs_f64(),
        window_s,
        measured_s,
        cfg.prefill,
        prefill_s,
        prefill_errors
    ));
    j.push_str(&format!(
        "\"ops\":{},\"ops_per_s\":{:.1},\"sets\":{},\"gets\":{},\"hits\":{},\"misses\":{},\"errors\":{},\"errors_outside_window\":{},\"conn_failures\":{},\"stalled_conns\":{},",
        ops, ops_per_s, counts.sets, counts.gets, counts.hits, counts.misses, counts.errors, counts.errors_outside_window, counts.conn_failures, counts.stalled_conns
    ));
    if !cfg.udp {
        j.push_str(&format!("\"batches\":{},\"reads\":{},\"writes\":{},", counts.batches, counts.reads, counts.writes));
    }
    j.push_str(&format!(
        "\"rx_bytes\":{},\"tx_bytes\":{},\"rx_bytes_per_s\":{:.1},\"tx_bytes_per_s\":{:.1},",
        counts.rx_bytes,
        counts.tx_bytes,
        per_s(counts.rx_bytes),
        per_s(counts.tx_bytes)
    ));
    match cfg.rate_per_s {
        Some(rate) => j.push_str(&format!(
            "\"rate_per_s\":{:.3},\"achieved_rate_per_s\":{:.1},\"sent\":{},\"behind\":{},\"dropped\":{},\"unsent\":{},\"backlog_max\":{},\"backlog_peak\":{},",
            rate, ops_per_s, counts.sent, counts.behind, counts.dropped, counts.unsent, cfg.backlog_max, counts.backlog_peak
        )),
        None => j.push_str("\"rate_per_s\":null,"),
    }
    if cfg.udp {
        j.push_str(&format!(
            "\"udp_timeout_ms\":{},\"udp_sent\":{},\"lost\":{},\"late\":{},",
            cfg.udp_timeout.as_millis(),
            counts.udp_sent,
            counts.lost,
            counts.late
        ));
    }
    j.push_str(&format!(
        "\"lat_ns\":{{\"p50\":{},\"p99\":{},\"p999\":{},\"max\":{},\"min\":{},\"mean\":{:.0}}},",
        hist.quantile(0.50),
        hist.quantile(0.99),
        hist.quantile(0.999),
        hist.max(),
        hist.min(),
        hist.mean()
    ));
    j.push_str(&format!(
        "\"client_cpu_s\":{},\"client_sys_s\":{},\"server_pid\":{},\"server_cpu_s\":{},\"server_sys_s\":{},\"ops_per_server_cpu_s\":{},",
        opt_f(client_cpu_s),
        opt_f(client_sys_s),
        cfg.server_pid.map_or("null".to_string(), |p| p.to_string()),
        opt_f(server_cpu_s),
        opt_f(server_sys_s),
        opt_f(per_server_cpu)
    ));
    j.push_str(&format!(
        "\"ncpu\":{},\"machine_busy_pct\":{},\"per_cpu_busy_pct\":[{}]",
        per_cpu.len(),
        opt_f(busy.first().copied()),
        per_cpu.join(",")
    ));
    j.push('}');
    let failed =
        counts.errors + counts.errors_outside_window + counts.conn_failures + counts.stalled_conns + prefill_errors > 0;
    Ok((j, failed))
}

/// Sleep until the wall clock reads `at_ms` (ms since the Unix epoch); a time in the past
/// returns at once, one too far ahead is refused.
fn wait_until_unix_ms(at_ms: u64) -> Result<(), String> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| format!("system clock before 1970: {e}"))?
        .as_millis() as u64;
    if at_ms > now_ms.saturating_add(START_AHEAD_MS_MAX) {
        return Err(format!("--start-at-unix-ms: {at_ms} is more than {START_AHEAD_MS_MAX} ms ahead (now {now_ms})"));
    }
    if at_ms > now_ms {
        std::thread::sleep(Duration::from_millis(at_ms - now_ms));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("xdp-gen") {
        return ExitCode::from(xdpgen::main(&args[1..]));
    }
    if args.first().map(String::as_str) == Some("send") {
        return match send::run(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("slipstream-loadgen send: {e}");
                ExitCode::from(2)
            }
        };
    }
    let cfg = match parse_args(&args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("slipstream-loadgen: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&cfg) {
        Ok((json, failed)) => {
            // A run with errors still prints its figures, but must not pass as clean.
            println!("{json}");
            if failed {
                eprintln!("slipstream-loadgen: the run saw errors (see errors/conn_failures/prefill_errors)");
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("slipstream-loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_options() {
        let c = parse_args(&args("--server 127.0.0.1:5 --conns 8 --threads 2 --pipeline 4 --ratio 1:9 --value-bytes 10 --keys 77 --duration-s 0.5 --warmup-s 0 --prefill --seed 9"))
            .unwrap()
            .unwrap();
        assert_eq!(c.server.port(), 5);
        assert_eq!((c.conns, c.threads, c.pipeline), (8, 2, 4));
        assert_eq!((c.ratio_set, c.ratio_get), (1, 9));
        assert_eq!((c.value_bytes, c.keys, c.seed), (10, 77, 9));
        assert_eq!(c.duration, Duration::from_millis(500));
        assert!(c.prefill && !c.udp);
        assert!(c.rate_per_s.is_none() && c.start_at_unix_ms.is_none());
        assert_eq!(c.backlog_max, 1000);
        let r = parse_args(&args("--rate-per-s 1450.5 --backlog-max 7 --start-at-unix-ms 123 --ratio 0:1"))
            .unwrap()
            .unwrap();
        assert_eq!(r.rate_per_s, Some(1450.5));
        assert_eq!((r.backlog_max, r.start_at_unix_ms), (7, Some(123)));
        assert_eq!((r.ratio_set, r.ratio_get), (0, 1));
    }

    #[test]
    fn rejects_bad_options() {
        for bad in [
            "--rate-per-s 0",
            "--rate-per-s -5",
            "--rate-per-s nan",
            "--rate-per-s inf",
            "--rate-per-s 1e9",
            "--backlog-max 0",
            "--start-at-unix-ms -1",
            "--conns 0",
            "--pipeline 5000",
            "--ratio 0:0",
            "--ratio 3",
            "--keys 100000001",
            "--bogus 1",
            "--conns",
            "--duration-s -1",
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad}");
        }
        assert!(parse_args(&args("--help")).unwrap().is_none());
    }

    #[test]
    fn rng_is_deterministic_and_spread() {
        let mut a = Rng::with_seed(5);
        let mut b = Rng::with_seed(5);
        let mut buckets = [0u32; 10];
        for _ in 0..10_000 {
            let x = a.u32(..10);
            assert_eq!(x, b.u32(..10));
            buckets[x as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| (800..1200).contains(&n)), "{buckets:?}");
    }
}
