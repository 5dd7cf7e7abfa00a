//! `slipstream-loadgen xdp-gen`: an IPv4 UDP generator that sends real frames out of a veth with
//! BPF_PROG_TEST_RUN live frames (see bpf/xdp_gen.c), open loop, as fast as possible or at a
//! fixed rate, and optionally counts the server's replies in XDP on the same veth. It exists
//! because a socket generator on this 2-core machine runs out of CPU before an XDP server does
//! (the earlier XDP benchmark was generator-bound at 68% server core); this one costs a few
//! hundred ns per frame and no socket work per reply.
//!
//! Not for: latency (frames carry no timestamps), or anything but the benchmark's own namespaces
//! (it needs root and sends on the interface it is given). Prints one JSON line.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use slipstream_fastpath::gen::{Generator, SinkCounts, FRAMES_PER_CALL_MAX, TEMPLATES_MAX};

use crate::pace::Pacer;
use crate::send::{counts_json, number_datagrams, unix_ns, word_datagrams, NumberSeries};
use crate::sysstat;
use slipstream_fastpath::clock_monotonic_ns;

const USAGE: &str = "\
slipstream-loadgen xdp-gen: live-frame UDP generator (root; prints one JSON line)

  --iface IF             send out of this interface (current namespace)  [required]
  --dst-mac MAC          destination MAC (the peer's)                    [required]
  --src IP  --dst IP     IPv4 source and destination                     [required]
  --sport P --dport P    UDP ports                                       [40000, 11211]
  --get-keys N           memcached UDP `get key:%0Dd` with keys 0..N-1
  --key-digits D         digits of the key number (1..10)                [8]
  --payload TEXT         fixed UDP payload instead (\\r \\n \\t \\\\ escapes)
  --word-templates N     instead: N datagrams of Zipf words (1..=256), built by the same code
                         as `send --kind words` (same seed, same first N datagrams), sent
                         round-robin, so the words sent are a known multiset:
    --records-per-datagram K  words per datagram                         [16]
    --vocabulary V            distinct words w0..w{V-1}                  [1000]
    --zipf-s S                Zipf exponent                              [1.0]
    --seed N                  PRNG seed                                  [1]
    --expect-counts FILE      write the exact multiset of words sent (every frame
                              the program built, warm-up included) as a JSON map
  --number-templates N   instead: N datagrams of text numbers (Gaussian), built by the same
                         code as `send --kind numbers` (same seed), sent round-robin:
    --records-per-datagram K  values per datagram                        [1]
    --mean M --stddev D       the noise                                  [0, 1]
    --decimals N              fractional digits (default: shortest round trip)
    --seed N                  PRNG seed                                  [1]
    --step-at-frame F --step-by X  from frame F on (counting from 0, warm-up
                              included) send N further datagrams of the same series
                              with every value shifted by X, round-robin (2N <= 256);
                              the JSON line then has step_frame and step_sent_mono_ns /
                              step_sent_unix_ns (CLOCK_MONOTONIC and wall clock read right
                              before the call that sent frame F), as `send` reports a step
  --rate-per-s R         frames per second (0 = as fast as possible)     [0]
  --count N              stop after N frames (0 = run for the duration)  [0]
  --duration-s SECS      measured window                                 [10]
  --warmup-s SECS        sending before the window, not measured         [1]
  --batch B              frames per transmit flush (1..256)              [64]
  --burst N              paced: wait until N frames are due, then send them in
                         one call (fewer calls, each with its fixed kernel cost;
                         keep N under the receiver's ring, 256 on a veth; with
                         N > 1 no call sends more than N, late frames too)   [1]
  --sink-port P          count and drop replies from UDP source port P on --iface
  --sink-cpu N           run --iface's receive work (threaded NAPI) on CPU N at
                         SCHED_FIFO, so counting replies is never starved by sending
  --server-pid PID       also report that process's CPU time over the window
";

const DURATION_S_MAX: f64 = 3600.0;
const RATE_PER_S_MAX: f64 = 100_000_000.0;
/// Frames per test-run call when unpaced: large enough to amortise the syscall, small enough
/// that the duration check runs every few tens of milliseconds. Each call also ends with an RCU
/// grace period (the kernel tears the call's page pool down): ~24 ms on this VM unless
/// /sys/kernel/rcu_expedited is 1, which the benchmark scripts set while they run.
const CHUNK_MAX: u32 = 1 << 16;

/// Paced: longest sleep between calls.
const PACE_SLEEP_MAX: Duration = Duration::from_millis(1);

struct Cfg {
    iface: String,
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    get_keys: u32,
    key_digits: u32,
    payload: Option<Vec<u8>>,
    words: Option<Words>,
    numbers: Option<Numbers>,
    rate_per_s: f64,
    count: u64,
    duration: Duration,
    warmup: Duration,
    batch: u32,
    burst: u64,
    sink_port: Option<u16>,
    sink_cpu: Option<usize>,
    server_pid: Option<u32>,
}

/// `--word-templates`: what the templates hold.
struct Words {
    templates: usize,
    records_per_datagram: usize,
    vocabulary: usize,
    zipf_s: f64,
    seed: u64,
    expect_counts: Option<String>,
}

/// `--number-templates`: what the templates hold, and the step.
struct Numbers {
    templates: usize,
    series: NumberSeries,
    /// (first frame of the shifted set, shift)
    step: Option<(u64, f64)>,
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: not a valid number: {v:?}"))
}

fn secs(flag: &str, v: &str) -> Result<Duration, String> {
    let s: f64 = num(flag, v)?;
    if !(0.0..=DURATION_S_MAX).contains(&s) {
        return Err(format!("{flag}: must be within 0..={DURATION_S_MAX}"));
    }
    Ok(Duration::from_secs_f64(s))
}

fn mac(v: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = v.trim().split(':').collect();
    if parts.len() != 6 {
        return Err(format!("not a MAC address: {v:?}"));
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        m[i] = u8::from_str_radix(p, 16).map_err(|_| format!("not a MAC address: {v:?}"))?;
    }
    Ok(m)
}

fn unescape(v: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(v.len());
    let mut it = v.bytes();
    while let Some(b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match it.next() {
            Some(b'r') => out.push(b'\r'),
            Some(b'n') => out.push(b'\n'),
            Some(b't') => out.push(b'\t'),
            Some(b'\\') => out.push(b'\\'),
            other => return Err(format!("--payload: unknown escape \\{}", other.map_or('?', char::from))),
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_lines)] // one arm per flag, then the checks that span flags
fn parse(args: &[String]) -> Result<Option<Cfg>, String> {
    let mut c = Cfg {
        iface: String::new(),
        dst_mac: [0; 6],
        src: Ipv4Addr::UNSPECIFIED,
        dst: Ipv4Addr::UNSPECIFIED,
        sport: 40000,
        dport: 11211,
        get_keys: 0,
        key_digits: 8,
        payload: None,
        words: None,
        numbers: None,
        rate_per_s: 0.0,
        count: 0,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(1),
        batch: 64,
        burst: 1,
        sink_port: None,
        sink_cpu: None,
        server_pid: None,
    };
    let mut have_mac = false;
    let mut w =
        Words { templates: 0, records_per_datagram: 16, vocabulary: 1000, zipf_s: 1.0, seed: 1, expect_counts: None };
    let mut records: Option<usize> = None;
    let mut nt = Numbers {
        templates: 0,
        series: NumberSeries { seed: 1, mean: 0.0, stddev: 1.0, decimals: None, records_per_datagram: 1 },
        step: None,
    };
    let (mut step_frame, mut step_by): (Option<u64>, Option<f64>) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let v = it.next().ok_or_else(|| format!("{flag}: needs a value"))?;
        match flag.as_str() {
            "--iface" => c.iface = v.clone(),
            "--dst-mac" => {
                c.dst_mac = mac(v)?;
                have_mac = true;
            }
            "--src" => c.src = num(flag, v)?,
            "--dst" => c.dst = num(flag, v)?,
            "--sport" => c.sport = num(flag, v)?,
            "--dport" => c.dport = num(flag, v)?,
            "--get-keys" => c.get_keys = num(flag, v)?,
            "--key-digits" => c.key_digits = num(flag, v)?,
            "--payload" => c.payload = Some(unescape(v)?),
            "--word-templates" => w.templates = num(flag, v)?,
            "--records-per-datagram" => records = Some(num(flag, v)?),
            "--number-templates" => nt.templates = num(flag, v)?,
            "--mean" => nt.series.mean = num(flag, v)?,
            "--stddev" => nt.series.stddev = num(flag, v)?,
            "--decimals" => nt.series.decimals = Some(num(flag, v)?),
            "--step-at-frame" => step_frame = Some(num(flag, v)?),
            "--step-by" => step_by = Some(num(flag, v)?),
            "--vocabulary" => w.vocabulary = num(flag, v)?,
            "--zipf-s" => w.zipf_s = num(flag, v)?,
            "--seed" => {
                w.seed = num(flag, v)?;
                nt.series.seed = w.seed;
            }
            "--expect-counts" => w.expect_counts = Some(v.clone()),
            "--rate-per-s" => c.rate_per_s = num(flag, v)?,
            "--count" => c.count = num(flag, v)?,
            "--duration-s" => c.duration = secs(flag, v)?,
            "--warmup-s" => c.warmup = secs(flag, v)?,
            "--batch" => c.batch = num(flag, v)?,
            "--burst" => c.burst = num(flag, v)?,
            "--sink-port" => c.sink_port = Some(num(flag, v)?),
            "--sink-cpu" => c.sink_cpu = Some(num(flag, v)?),
            "--server-pid" => c.server_pid = Some(num(flag, v)?),
            _ => return Err(format!("unknown option {flag:?}")),
        }
    }
    if c.iface.is_empty() || !have_mac || c.src.is_unspecified() || c.dst.is_unspecified() {
        return Err("--iface, --dst-mac, --src and --dst are required".into());
    }
    if [c.get_keys > 0, c.payload.is_some(), w.templates > 0, nt.templates > 0].iter().filter(|&&b| b).count() != 1 {
        return Err("give exactly one of --get-keys, --payload, --word-templates and --number-templates".into());
    }
    if let Some(k) = records {
        w.records_per_datagram = k;
        nt.series.records_per_datagram = k;
    }
    c.numbers = numbers(nt, step_frame, step_by)?;
    if w.templates > TEMPLATES_MAX {
        return Err(format!("--word-templates: must be within 1..={TEMPLATES_MAX}"));
    }
    if w.templates == 0 && w.expect_counts.is_some() {
        return Err("--expect-counts is for --word-templates".into());
    }
    if w.templates > 0 {
        // The same bounds as `send`: checked by building one datagram.
        if word_datagrams(w.seed, w.vocabulary, w.zipf_s, w.records_per_datagram, 1).is_none() {
            return Err("--records-per-datagram, --vocabulary or --zipf-s out of bounds (see `send --help`)".into());
        }
        c.words = Some(w);
    }
    if !(1..=10).contains(&c.key_digits) || (c.get_keys > 0 && u64::from(c.get_keys) > 10u64.pow(c.key_digits)) {
        return Err("--key-digits: 1..=10 and enough digits for --get-keys".into());
    }
    if !(c.rate_per_s.is_finite() && (0.0..=RATE_PER_S_MAX).contains(&c.rate_per_s)) {
        return Err(format!("--rate-per-s: must be within 0..={RATE_PER_S_MAX}"));
    }
    if !(1..=u64::from(FRAMES_PER_CALL_MAX)).contains(&c.burst) {
        return Err(format!("--burst: must be within 1..={FRAMES_PER_CALL_MAX}"));
    }
    if !(1..=256).contains(&c.batch) {
        return Err("--batch: must be within 1..=256".into());
    }
    Ok(Some(c))
}

/// `--number-templates` and its step, checked (`None`: not asked for).
fn numbers(mut nt: Numbers, step_frame: Option<u64>, step_by: Option<f64>) -> Result<Option<Numbers>, String> {
    if step_frame.is_some() != step_by.is_some() || (step_frame.is_some() && nt.templates == 0) {
        return Err("a step needs --number-templates, --step-at-frame and --step-by".into());
    }
    if nt.templates == 0 {
        return Ok(None);
    }
    let sets = if step_frame.is_some() { 2 } else { 1 };
    if nt.templates * sets > TEMPLATES_MAX {
        return Err(format!("--number-templates: {sets} sets of it must fit {TEMPLATES_MAX} templates"));
    }
    nt.step = step_frame.zip(step_by);
    if number_datagrams(&nt.series, step_by.unwrap_or(0.0), 1, 0).is_none() {
        return Err(
            "--mean, --stddev, --decimals, --step-by or --records-per-datagram out of bounds (see `send --help`)"
                .into(),
        );
    }
    Ok(Some(nt))
}

fn ones_sum(bytes: &[u8]) -> u32 {
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let w = u32::from(pair[0]) << 8 | u32::from(pair.get(1).copied().unwrap_or(0));
        sum += w;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// Ethernet + IPv4 + UDP (checksum 0: "none", valid for IPv4) + `payload`.
fn frame(c: &Cfg, src_mac: [u8; 6], payload: &[u8]) -> Result<Vec<u8>, String> {
    let udp_len = 8 + payload.len();
    let ip_len = 20 + udp_len;
    if ip_len > 1500 {
        return Err(format!("payload of {} bytes does not fit one 1500-byte frame", payload.len()));
    }
    let mut f = Vec::with_capacity(14 + ip_len);
    f.extend_from_slice(&c.dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let ip_start = f.len();
    f.extend_from_slice(&[0x45, 0, (ip_len >> 8) as u8, ip_len as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&c.src.octets());
    f.extend_from_slice(&c.dst.octets());
    let check = !(ones_sum(&f[ip_start..ip_start + 20]) as u16);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&check.to_be_bytes());
    f.extend_from_slice(&c.sport.to_be_bytes());
    f.extend_from_slice(&c.dport.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    Ok(f)
}

fn iface_mac(iface: &str) -> Result<[u8; 6], String> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .map_err(|e| format!("--iface {iface}: {e}"))?;
    mac(&text)
}

fn iface_index(iface: &str) -> Result<u32, String> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/ifindex"))
        .map_err(|e| format!("--iface {iface}: {e}"))?;
    num("ifindex", text.trim())
}

/// Attaching an XDP program gives a veth a fresh NAPI instance, so its receive work is placed
/// here, after the attach: threaded mode, the kthread(s) `napi/<iface>-<id>` pinned to `cpu`
/// and raised to SCHED_FIFO (the generator's sending loop on the same core yields to it at
/// every batch).
fn pin_napi(iface: &str, cpu: usize) -> Result<(), String> {
    std::fs::write(format!("/sys/class/net/{iface}/threaded"), "1")
        .map_err(|e| format!("--sink-cpu: threaded NAPI on {iface}: {e}"))?;
    std::thread::sleep(Duration::from_millis(50));
    let prefix = format!("napi/{iface}-");
    let mut pinned = 0;
    for entry in std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else { continue };
        if !comm.trim_end().starts_with(&prefix) {
            continue;
        }
        // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write only inside it, and
        // sched_setaffinity/sched_setscheduler read the structures passed for their sizes.
        let ok = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(cpu, &mut set);
            let param = libc::sched_param { sched_priority: 50 };
            libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
                && libc::sched_setscheduler(pid, libc::SCHED_FIFO, &param) == 0
        };
        if !ok {
            return Err(format!("--sink-cpu: pinning {}: {}", comm.trim_end(), std::io::Error::last_os_error()));
        }
        pinned += 1;
    }
    if pinned == 0 {
        return Err(format!("--sink-cpu: no NAPI thread for {iface}"));
    }
    Ok(())
}

/// Run as `slipstream-loadgen xdp-gen ...`; returns the process exit status.
pub fn main(args: &[String]) -> u8 {
    let c = match parse(args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("slipstream-loadgen xdp-gen: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match run(&c) {
        Ok(json) => {
            println!("{json}");
            0
        }
        Err(e) => {
            eprintln!("slipstream-loadgen xdp-gen: {e}");
            2
        }
    }
}

struct Snap {
    at: Instant,
    sent: u64,
    sink: SinkCounts,
    cpus: Vec<sysstat::CpuTicks>,
    server: Option<(u64, u64)>,
}

#[allow(clippy::too_many_lines)] // set-up, run and report of one generator run, in order
fn run(c: &Cfg) -> Result<String, String> {
    let src_mac = iface_mac(&c.iface)?;
    let ifindex = iface_index(&c.iface)?;
    let mut g = Generator::load().map_err(|e| format!("loading the generator: {e}"))?;
    let built_before = g.frames_built().map_err(|e| e.to_string())?;
    // Word templates: each one's ranks, to count what was sent.
    let mut word_ranks: Vec<Vec<u32>> = Vec::new();
    let (payload, key_off) = if let Some(nt) = &c.numbers {
        let (before, after) = number_datagrams(
            &nt.series,
            nt.step.map_or(0.0, |s| s.1),
            nt.templates,
            if nt.step.is_some() { nt.templates } else { 0 },
        )
        .ok_or("number parameters out of bounds")?;
        let to_frames =
            |ps: Vec<Vec<u8>>| -> Result<Vec<Vec<u8>>, String> { ps.iter().map(|p| frame(c, src_mac, p)).collect() };
        let step_frame = built_before.saturating_add(nt.step.map_or(0, |s| s.0));
        (g.set_templates_stepped(&to_frames(before)?, &to_frames(after)?, step_frame).map_err(|e| e.to_string())?, 0)
    } else if let Some(w) = &c.words {
        let made = word_datagrams(w.seed, w.vocabulary, w.zipf_s, w.records_per_datagram, w.templates)
            .ok_or("word parameters out of bounds")?;
        let mut frames = Vec::with_capacity(made.len());
        for (p, ranks) in made {
            frames.push(frame(c, src_mac, &p)?);
            word_ranks.push(ranks);
        }
        (g.set_templates(&frames).map_err(|e| e.to_string())?, 0)
    } else if let Some(p) = &c.payload {
        (p.clone(), 0)
    } else {
        // Frame header: request id 0, sequence 0, 1 datagram, reserved.
        let mut p = vec![0u8, 0, 0, 0, 0, 1, 0, 0];
        p.extend_from_slice(b"get key:");
        let at = p.len();
        p.resize(p.len() + c.key_digits as usize, b'0');
        p.extend_from_slice(b"\r\n");
        (p, (14 + 20 + 8 + at) as u32)
    };
    let template = if c.words.is_some() || c.numbers.is_some() {
        payload // already the longest whole frame
    } else {
        let t = frame(c, src_mac, &payload)?;
        g.set_template(&t).map_err(|e| e.to_string())?;
        t
    };
    g.set_keys(key_off, c.key_digits, c.get_keys).map_err(|e| e.to_string())?;
    let sink_mode = match c.sink_port {
        Some(p) => Some(g.attach_sink(&c.iface, p).map_err(|e| format!("attaching the reply counter: {e}"))?),
        None => None,
    };
    if let (Some(cpu), Some(_)) = (c.sink_cpu, sink_mode) {
        pin_napi(&c.iface, cpu)?;
    }
    let server_ticks = |pid: Option<u32>| pid.and_then(|p| sysstat::process_cpu_ticks(&p.to_string()));
    let snap = |g: &Generator, sent: u64| -> Result<Snap, String> {
        Ok(Snap {
            at: Instant::now(),
            sent,
            sink: g.sink_counts().map_err(|e| e.to_string())?,
            cpus: sysstat::machine_cpu_ticks(),
            server: server_ticks(c.server_pid),
        })
    };

    let load_start = Instant::now();
    // Frame i due at load_start + i / rate: the crate's one schedule (one sender, never shed).
    let mut pacer = (c.rate_per_s > 0.0).then(|| Pacer::new(load_start, c.rate_per_s, 1, 0, u64::MAX));
    let window_start = load_start + c.warmup;
    let window_end = window_start + c.duration;
    let mut sent: u64 = 0;
    let mut calls: u64 = 0;
    let mut start: Option<Snap> = None;
    let step_at = c.numbers.as_ref().and_then(|nt| nt.step).map(|s| s.0);
    // (CLOCK_MONOTONIC, wall clock) read right before the call that sends the step frame.
    let mut step_sent: Option<(u64, u64)> = None;
    loop {
        let now = Instant::now();
        if start.is_none() && now >= window_start {
            start = Some(snap(&g, sent)?);
        }
        if now >= window_end || (c.count > 0 && sent >= c.count) {
            break;
        }
        let mut n = if let Some(p) = &pacer {
            // Frames due and not yet sent.
            let due = p.due_count(now);
            // The last frames of a --count run go out even if fewer than a burst.
            let burst = if c.count > 0 { c.burst.min(c.count - sent) } else { c.burst }.max(1);
            if due < burst {
                let wait = p.due_at_ahead(burst - 1).saturating_duration_since(now).min(PACE_SLEEP_MAX);
                std::thread::sleep(wait);
                continue;
            }
            // A burst is also the most one call sends: frames that fell behind (a sleep that
            // overshot on a loaded machine) go out in several calls, not one that overflows
            // the receiver's ring. Burst 1 (the default) keeps catching up in one call.
            if c.burst > 1 {
                due.min(c.burst)
            } else {
                due.min(u64::from(CHUNK_MAX))
            }
        } else {
            u64::from(CHUNK_MAX)
        };
        if c.count > 0 {
            n = n.min(c.count - sent);
        }
        let n = n.min(u64::from(FRAMES_PER_CALL_MAX)) as u32;
        if step_sent.is_none() && step_at.is_some_and(|f| f >= sent && f < sent + u64::from(n)) {
            step_sent = Some((clock_monotonic_ns(), unix_ns()));
        }
        g.send(&template, ifindex, n, c.batch).map_err(|e| e.to_string())?;
        if let Some(p) = &mut pacer {
            p.take_many(u64::from(n));
        }
        sent += u64::from(n);
        calls += 1;
    }
    // Replies still in flight when sending stopped: give them a moment to be counted.
    std::thread::sleep(Duration::from_millis(50));
    let end = snap(&g, sent)?;
    let built = g.frames_built().map_err(|e| e.to_string())? - built_before;
    let records = match (&c.words, &c.numbers) {
        (Some(w), _) => write_expected(w, &word_ranks, built_before, built)?,
        (None, Some(nt)) => built * nt.series.records_per_datagram as u64,
        (None, None) => 0,
    };
    let step_json = match (step_at, step_sent) {
        (Some(f), Some((mono, unix))) => {
            format!(",\"step_frame\":{f},\"step_sent_mono_ns\":{mono},\"step_sent_unix_ns\":{unix}")
        }
        _ => String::new(),
    };
    let start =
        start.unwrap_or(Snap { at: load_start, sent: 0, sink: SinkCounts::default(), cpus: Vec::new(), server: None });
    let secs = end.at.duration_since(start.at).as_secs_f64().max(1e-9);
    let sent_w = end.sent - start.sent;
    let replies = end.sink.frames - start.sink.frames;
    let busy = sysstat::busy_pct(&start.cpus, &end.cpus);
    let tck = sysstat::clock_ticks_per_s();
    let server_cpu_s = match (start.server, end.server) {
        (Some(a), Some(b)) => format!("{:.3}", ((b.0 + b.1).saturating_sub(a.0 + a.1)) as f64 / tck),
        _ => "null".into(),
    };
    let per_cpu: Vec<String> = busy.iter().skip(1).map(|b| format!("{b:.1}")).collect();
    Ok(format!(
        "{{\"mode\":\"xdp-gen\",\"frame_bytes\":{},\"rate_per_s\":{},\"window_s\":{secs:.3},\"sent_total\":{sent},\
\"calls\":{calls},\"sent\":{sent_w},\"sent_per_s\":{:.0},\"sink\":{},\"replies\":{replies},\"replies_per_s\":{:.0},\
\"hits\":{},\"misses\":{},\"reply_bytes\":{},\"machine_busy_pct\":{:.1},\"per_cpu_busy_pct\":[{}],\"server_cpu_s\":{server_cpu_s},\
\"templates\":{},\"frames_built\":{built},\"records\":{records},\"elapsed_s\":{:.6}{step_json}}}",
        template.len(),
        c.rate_per_s,
        sent_w as f64 / secs,
        match sink_mode {
            Some(m) => format!("\"{m:?}\""),
            None => "null".into(),
        },
        replies as f64 / secs,
        end.sink.hits - start.sink.hits,
        end.sink.misses - start.sink.misses,
        end.sink.bytes - start.sink.bytes,
        busy.first().copied().unwrap_or(0.0),
        per_cpu.join(","),
        c.numbers.as_ref().map_or(word_ranks.len().max(1), |nt| nt.templates * if nt.step.is_some() { 2 } else { 1 }),
        end.at.duration_since(load_start).as_secs_f64(),
    ))
}

/// Frames `first..first + n` (of the program's round-robin count) used template
/// `frame % templates`: adds up their words, writes `--expect-counts` if asked, and returns
/// the number of words sent.
fn write_expected(w: &Words, ranks: &[Vec<u32>], first: u64, n: u64) -> Result<u64, String> {
    let per_template = frames_per_template(ranks.len(), first, n);
    let mut counts = vec![0u64; w.vocabulary];
    let mut total = 0u64;
    for (t, &frames) in per_template.iter().enumerate() {
        for &r in &ranks[t] {
            counts[r as usize] += frames;
            total += frames;
        }
    }
    if let Some(path) = &w.expect_counts {
        std::fs::write(path, counts_json(&counts)).map_err(|e| format!("--expect-counts {path}: {e}"))?;
    }
    Ok(total)
}

/// How many of frames `first..first + n` used each of `templates` templates (round-robin).
fn frames_per_template(templates: usize, first: u64, n: u64) -> Vec<u64> {
    let t = templates.max(1) as u64;
    let mut out = vec![n / t; templates.max(1)];
    for j in 0..n % t {
        out[((first + j) % t) as usize] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_a_valid_ipv4_udp_frame() {
        let args: Vec<String> = [
            "--iface",
            "x",
            "--dst-mac",
            "02:00:00:00:00:01",
            "--src",
            "10.0.0.2",
            "--dst",
            "10.0.0.1",
            "--get-keys",
            "100",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let c = parse(&args).unwrap().unwrap();
        let f = frame(&c, [2, 0, 0, 0, 0, 2], b"get k\r\n").unwrap();
        assert_eq!(f.len(), 14 + 20 + 8 + 7);
        assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 1]);
        // A correct IPv4 header checksum sums to 0xffff.
        assert_eq!(ones_sum(&f[14..34]), 0xffff);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 15);
    }

    #[test]
    fn round_robin_shares() {
        assert_eq!(frames_per_template(4, 0, 10), vec![3, 3, 2, 2]);
        assert_eq!(frames_per_template(4, 6, 3), vec![1, 0, 1, 1]);
        assert_eq!(frames_per_template(1, 5, 7), vec![7]);
        assert_eq!(frames_per_template(3, 0, 0), vec![0, 0, 0]);
    }

    #[test]
    fn rejects_bad_arguments() {
        let base = ["--iface", "x", "--dst-mac", "02:00:00:00:00:01", "--src", "10.0.0.2", "--dst", "10.0.0.1"];
        let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra.iter()).map(|s| s.to_string()).collect() };
        assert!(parse(&with(&[])).is_err(), "needs a payload or keys");
        assert!(parse(&with(&["--word-templates", "4", "--payload", "x"])).is_err());
        assert!(parse(&with(&["--word-templates", "257"])).is_err());
        assert!(parse(&with(&["--word-templates", "4", "--vocabulary", "0"])).is_err());
        assert!(parse(&with(&["--payload", "x", "--expect-counts", "f"])).is_err());
        assert!(parse(&with(&["--word-templates", "4", "--expect-counts", "f"])).unwrap().is_some());
        assert!(parse(&with(&["--get-keys", "1000", "--key-digits", "2"])).is_err());
        assert!(parse(&with(&["--payload", "x\\q"])).is_err());
        assert!(parse(&with(&["--payload", "a b\\r\\n", "--batch", "0"])).is_err());
        assert!(parse(&with(&["--number-templates", "128", "--step-at-frame", "5", "--step-by", "1"]))
            .unwrap()
            .is_some());
        assert!(parse(&with(&["--number-templates", "129", "--step-at-frame", "5", "--step-by", "1"])).is_err());
        assert!(parse(&with(&["--number-templates", "4", "--step-at-frame", "5"])).is_err(), "step needs both");
        assert!(parse(&with(&["--word-templates", "4", "--step-at-frame", "5", "--step-by", "1"])).is_err());
        assert!(parse(&with(&["--number-templates", "4", "--word-templates", "4"])).is_err());
        assert!(parse(&with(&["--number-templates", "4", "--stddev", "-1"])).is_err());
        assert_eq!(unescape("a\\r\\n").unwrap(), b"a\r\n");
        assert!(mac("02:00:00").is_err());
    }
}
