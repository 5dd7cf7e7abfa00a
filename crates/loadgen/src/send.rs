//! `slipstream-loadgen send` (also reachable as `slipstream send`, which forwards here): the
//! traffic generator for the stream offload service.
//!
//! What it is for: sending UDP datagrams of words (Zipf-distributed over a fixed vocabulary) or
//! numbers (Gaussian noise around a mean, with one step change at a chosen time) to a stream
//! port at a chosen datagram rate, deterministically per seed, and saying afterwards exactly
//! what was sent: one JSON summary line on stdout (counts, rate, and for a step the
//! CLOCK_MONOTONIC / wall-clock time the first stepped datagram left), and with
//! `--expect-counts FILE` the exact multiset of words sent, as a JSON map, so tests and the
//! benchmark can check the daemon's counts for exactness.
//!
//! Wire formats (the daemon's parsers in slipstream-stream `record`): text, one record per line
//! (`\n`-separated words or decimal numbers); `--binary`: the 4-byte magic `SSF1` followed by
//! little-endian f64s.
//!
//! Pacing: datagram `i` is due at `start + i / rate` on the monotonic clock (the crate's one
//! schedule, [`crate::pace::Pacer`], with a single connection). The sender sends
//! everything that is due in one burst, then sleeps until the next one is due (spinning only
//! for gaps under [`SPIN_GAP_NS`]); sleep overshoot is made up by the next burst, so the long-run
//! rate is exact and high rates never cost one sleep per datagram. `--batch B` hands up to B
//! due datagrams to the kernel per `sendmmsg` call (the generator's maximum rate is mostly
//! system calls).
//!
//! Randomness: the crate's one RNG (`fastrand`, seeded) under the distributions of
//! [`crate::dist`]. Clocks: pacing on `Instant`; the stamps in the summary are absolute
//! CLOCK_MONOTONIC (`slipstream_fastpath::clock_monotonic_ns`, the clock of the daemon's `t_ns`).
//!
//! What it is not for: receiving results, or any traffic to hosts the user did not name.

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fastrand::Rng;
use slipstream_fastpath::clock_monotonic_ns;

use crate::dist::{Gaussian, Zipf};
use crate::pace::Pacer;

const USAGE: &str = "\
usage: slipstream-loadgen send --to HOST:PORT --kind words|numbers (--count N | --duration-s S) [options]

  --to HOST:PORT             where to send the UDP datagrams
  --kind words|numbers       word stream (Zipf) or numeric series (Gaussian + optional step)
  --count N                  datagrams to send (at most 10^10)
  --duration-s S             run S seconds (at most 3600); with --count, whichever ends first.
                             With a rate: the datagrams due before S (sending up to 10% late
                             if behind), without one: until S seconds have passed
  --rate-per-s N             datagrams per second (0 = as fast as possible; default 0)
  --records-per-datagram K   records per datagram (default 16 for words, 1 for numbers)
  --seed N                   PRNG seed (default 1); same seed, same records
  --batch B                  datagrams per system call, at most 1024 (default 1 = send(2);
                             more = sendmmsg(2) with up to B of the datagrams that are due)
words:
  --vocabulary V             distinct words w0..w{V-1}, w0 the most frequent (default 1000)
  --zipf-s S                 Zipf exponent: P(rank k) ~ 1/k^S (default 1.0)
  --expect-counts FILE       write the exact multiset of words sent as a JSON map
numbers:
  --mean M --stddev D        Gaussian noise (defaults 0 and 1)
  --step-at-ms T --step-by X after T ms every value is shifted by X (both needed for a step)
  --binary                   SSF1 magic + little-endian f64s instead of text lines
  --decimals N               text numbers with exactly N fractional digits (default: shortest
                             round trip; the XDP engine takes up to 6 exactly)

At the end one JSON line: kind, datagrams, records, bytes, elapsed_s, rate_per_s,
records_per_s, send_errors, and with a step step_sent_mono_ns / step_sent_unix_ns
(CLOCK_MONOTONIC and wall clock read right before the first stepped datagram was sent).
";

/// Bounds on every option, so nothing the user types makes the generator unbounded.
const COUNT_MAX: u64 = 10_000_000_000;
const DURATION_S_MAX: f64 = 3_600.0;
const RATE_PER_S_MAX: u64 = 100_000_000;
const RECORDS_PER_DATAGRAM_MAX: usize = 8_192;
const VOCABULARY_MAX: usize = 1_000_000;
const ZIPF_S_MAX: f64 = 10.0;
const STEP_AT_MS_MAX: u64 = 3_600_000;
/// Most datagrams per `sendmmsg` call (the kernel's UIO_MAXIOV).
const BATCH_MAX: usize = 1_024;
/// Largest UDP payload over IPv4.
const DATAGRAM_BYTES_MAX: usize = 65_507;
/// Gaps shorter than this are spun rather than slept (a sleep overshoots by ~50 µs anyway).
const SPIN_GAP_NS: u64 = 5_000;
/// Longest single sleep, so a stop by duration is noticed promptly.
const SLEEP_NS_MAX: u64 = 50_000_000;
/// Binary payload magic (slipstream-stream `record::BINARY_MAGIC`).
const BINARY_MAGIC: &[u8; 4] = b"SSF1";
/// Longest text number the daemon accepts (slipstream-stream `record::NUMBER_BYTES_MAX`).
const NUMBER_BYTES_MAX: usize = 64;
const NS_PER_S: u64 = 1_000_000_000;
/// Most fractional digits `--decimals` takes.
const DECIMALS_MAX: usize = 17;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Words,
    Numbers,
}

#[derive(Debug, Clone, PartialEq)]
struct Options {
    to: SocketAddr,
    kind: Kind,
    count: Option<u64>,
    duration_ns: Option<u64>,
    rate_per_s: u64,
    records_per_datagram: usize,
    seed: u64,
    vocabulary: usize,
    zipf_s: f64,
    expect_counts: Option<String>,
    mean: f64,
    stddev: f64,
    step_at_ms: Option<u64>,
    step_by: Option<f64>,
    binary: bool,
    batch: usize,
    /// Text numbers with exactly this many fractional digits (None: shortest round trip).
    decimals: Option<usize>,
}

/// Entry point: `args` are the words after `send`. Prints the summary line on success.
pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help" || a == "help") {
        print!("{USAGE}");
        return Ok(());
    }
    let opts = parse_args(args)?;
    let summary = send(&opts)?;
    println!("{}", summary.to_json());
    Ok(())
}

// ------------------------------------------------------------------ arguments

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse::<T>().map_err(|_| format!("{flag}: cannot parse {v:?}"))
}

fn parse_finite(flag: &str, v: &str) -> Result<f64, String> {
    let x: f64 = parse_num(flag, v)?;
    if !x.is_finite() {
        return Err(format!("{flag}: {v:?} is not a finite number"));
    }
    Ok(x)
}

#[allow(clippy::too_many_lines)] // one arm per flag
fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut to: Option<String> = None;
    let mut kind: Option<Kind> = None;
    let mut count = None;
    let mut duration_s: Option<f64> = None;
    let mut rate_per_s = 0u64;
    let mut records_per_datagram: Option<usize> = None;
    let mut seed = 1u64;
    let mut vocabulary = 1_000usize;
    let mut zipf_s = 1.0f64;
    let mut expect_counts = None;
    let mut mean = 0.0f64;
    let mut stddev = 1.0f64;
    let mut step_at_ms = None;
    let mut step_by = None;
    let mut binary = false;
    let mut batch = 1usize;
    let mut decimals = None;

    let mut i = 0;
    while i < args.len() {
        let arg = args.get(i).map(String::as_str).unwrap_or_default();
        i += 1;
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg, None),
        };
        if flag == "--binary" {
            if inline.is_some() {
                return Err("--binary takes no value".into());
            }
            binary = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args.get(i).ok_or_else(|| format!("{flag} needs a value"))?;
                i += 1;
                v.clone()
            }
        };
        let v = value.as_str();
        match flag {
            "--to" => to = Some(value.clone()),
            "--kind" => {
                kind = Some(match v {
                    "words" => Kind::Words,
                    "numbers" => Kind::Numbers,
                    _ => return Err(format!("--kind {v:?}: expected words or numbers")),
                })
            }
            "--count" => {
                let n: u64 = parse_num(flag, v)?;
                if n == 0 || n > COUNT_MAX {
                    return Err(format!("--count {n}: expected 1..={COUNT_MAX}"));
                }
                count = Some(n);
            }
            "--duration-s" => {
                let s = parse_finite(flag, v)?;
                if s <= 0.0 || s > DURATION_S_MAX {
                    return Err(format!("--duration-s {s}: expected > 0 and <= {DURATION_S_MAX}"));
                }
                duration_s = Some(s);
            }
            "--rate-per-s" => {
                let r: u64 = parse_num(flag, v)?;
                if r > RATE_PER_S_MAX {
                    return Err(format!("--rate-per-s {r}: at most {RATE_PER_S_MAX} (0 = as fast as possible)"));
                }
                rate_per_s = r;
            }
            "--records-per-datagram" => {
                let k: usize = parse_num(flag, v)?;
                if k == 0 || k > RECORDS_PER_DATAGRAM_MAX {
                    return Err(format!("--records-per-datagram {k}: expected 1..={RECORDS_PER_DATAGRAM_MAX}"));
                }
                records_per_datagram = Some(k);
            }
            "--seed" => seed = parse_num(flag, v)?,
            "--vocabulary" => {
                let n: usize = parse_num(flag, v)?;
                if n == 0 || n > VOCABULARY_MAX {
                    return Err(format!("--vocabulary {n}: expected 1..={VOCABULARY_MAX}"));
                }
                vocabulary = n;
            }
            "--zipf-s" => {
                let s = parse_finite(flag, v)?;
                if !(0.0..=ZIPF_S_MAX).contains(&s) {
                    return Err(format!("--zipf-s {s}: expected 0..={ZIPF_S_MAX}"));
                }
                zipf_s = s;
            }
            "--expect-counts" => expect_counts = Some(value.clone()),
            "--mean" => mean = parse_finite(flag, v)?,
            "--stddev" => {
                let d = parse_finite(flag, v)?;
                if d < 0.0 {
                    return Err(format!("--stddev {d}: expected >= 0"));
                }
                stddev = d;
            }
            "--step-at-ms" => {
                let t: u64 = parse_num(flag, v)?;
                if t > STEP_AT_MS_MAX {
                    return Err(format!("--step-at-ms {t}: at most {STEP_AT_MS_MAX}"));
                }
                step_at_ms = Some(t);
            }
            "--step-by" => step_by = Some(parse_finite(flag, v)?),
            "--decimals" => {
                let d: usize = parse_num(flag, v)?;
                if d > DECIMALS_MAX {
                    return Err(format!("--decimals {d}: at most {DECIMALS_MAX}"));
                }
                decimals = Some(d);
            }
            "--batch" => {
                let b: usize = parse_num(flag, v)?;
                if b == 0 || b > BATCH_MAX {
                    return Err(format!("--batch {b}: expected 1..={BATCH_MAX}"));
                }
                batch = b;
            }
            _ => return Err(format!("unknown option {flag:?} (try `slipstream-loadgen send --help`)")),
        }
    }

    let to = to.ok_or("--to HOST:PORT is required")?;
    let to = to
        .to_socket_addrs()
        .map_err(|e| format!("--to {to}: {e}"))?
        .next()
        .ok_or_else(|| format!("--to {to}: no address"))?;
    let kind = kind.ok_or("--kind words|numbers is required")?;
    if count.is_none() && duration_s.is_none() {
        return Err("one of --count N or --duration-s S is required".into());
    }
    if step_at_ms.is_some() != step_by.is_some() {
        return Err("a step needs both --step-at-ms and --step-by".into());
    }
    if kind == Kind::Words && (binary || step_at_ms.is_some()) {
        return Err("--binary and the step options are for --kind numbers".into());
    }
    if kind == Kind::Numbers && expect_counts.is_some() {
        return Err("--expect-counts is for --kind words".into());
    }
    let records_per_datagram = records_per_datagram.unwrap_or(match kind {
        Kind::Words => 16,
        Kind::Numbers => 1,
    });
    let opts = Options {
        to,
        kind,
        count,
        duration_ns: duration_s.map(|s| (s * NS_PER_S as f64) as u64),
        rate_per_s,
        records_per_datagram,
        seed,
        vocabulary,
        zipf_s,
        expect_counts,
        mean,
        stddev,
        step_at_ms,
        step_by,
        binary,
        batch,
        decimals,
    };
    let worst = datagram_bytes_max(&opts);
    if worst > DATAGRAM_BYTES_MAX {
        return Err(format!(
            "--records-per-datagram {}: a datagram could be {worst} bytes, over the UDP limit of {DATAGRAM_BYTES_MAX}",
            opts.records_per_datagram
        ));
    }
    Ok(opts)
}

/// Upper bound on one datagram's payload for these options.
fn datagram_bytes_max(o: &Options) -> usize {
    let per_record = match (o.kind, o.binary) {
        // "w" + digits of the largest rank + separator
        (Kind::Words, _) => 1 + decimal_digits(o.vocabulary.saturating_sub(1) as u64) + 1,
        (Kind::Numbers, true) => 8,
        (Kind::Numbers, false) => NUMBER_BYTES_MAX + 1,
    };
    let magic = if o.binary { BINARY_MAGIC.len() } else { 0 };
    magic + per_record.saturating_mul(o.records_per_datagram)
}

fn decimal_digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

// ------------------------------------------------------------------ pacing

/// Total datagrams to send: `--count`, or those due strictly before the duration ends at a
/// fixed rate (`pacer`, not yet taken from); `None` = until the duration ends (rate 0 with only
/// a duration).
fn planned_datagrams(
    count: Option<u64>,
    duration_ns: Option<u64>,
    pacer: Option<&Pacer>,
    start: Instant,
) -> Option<u64> {
    let by_duration = match (duration_ns, pacer) {
        (Some(d), Some(p)) => Some(p.due_count(start + Duration::from_nanos(d.saturating_sub(1)))),
        _ => None,
    };
    match (count, by_duration) {
        (Some(c), Some(d)) => Some(c.min(d)),
        (Some(c), None) => Some(c),
        (None, d) => d,
    }
}

fn ns_since(start: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(start).as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0)
}

// ------------------------------------------------------------------ payloads

/// Builds datagrams for one kind; deterministic per seed.
struct Generator {
    kind: Kind,
    rng: Rng,
    gauss: Gaussian,
    zipf: Option<Zipf>,
    records_per_datagram: usize,
    mean: f64,
    stddev: f64,
    binary: bool,
    decimals: Option<usize>,
    /// Ranks of the words in the datagram last built (counted once it is sent).
    ranks: Vec<u32>,
}

impl Generator {
    fn new(o: &Options) -> Generator {
        Generator {
            kind: o.kind,
            rng: Rng::with_seed(o.seed),
            gauss: Gaussian::default(),
            zipf: (o.kind == Kind::Words).then(|| Zipf::new(o.vocabulary, o.zipf_s)),
            records_per_datagram: o.records_per_datagram,
            mean: o.mean,
            stddev: o.stddev,
            binary: o.binary,
            decimals: o.decimals,
            ranks: Vec::with_capacity(o.records_per_datagram),
        }
    }

    /// Replaces `buf` with the next datagram; `shift` is added to every number.
    fn build(&mut self, buf: &mut Vec<u8>, shift: f64) {
        buf.clear();
        self.ranks.clear();
        match self.kind {
            Kind::Words => {
                let Some(zipf) = &self.zipf else { return };
                for j in 0..self.records_per_datagram {
                    let k = zipf.sample(&mut self.rng);
                    if j > 0 {
                        buf.push(b' ');
                    }
                    push_word(buf, k);
                    self.ranks.push(k as u32);
                }
            }
            Kind::Numbers => {
                if self.binary {
                    buf.extend_from_slice(BINARY_MAGIC);
                }
                for j in 0..self.records_per_datagram {
                    let v = self.mean + self.stddev * self.gauss.sample(&mut self.rng) + shift;
                    if self.binary {
                        buf.extend_from_slice(&v.to_le_bytes());
                    } else {
                        if j > 0 {
                            buf.push(b'\n');
                        }
                        match self.decimals {
                            Some(d) => push_fixed(buf, v, d),
                            None => push_number(buf, v),
                        }
                    }
                }
            }
        }
    }
}

fn push_word(buf: &mut Vec<u8>, rank: usize) {
    buf.push(b'w');
    let mut digits = [0u8; 20];
    let mut n = rank;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// Shortest round-trip decimal; exponent form when that is longer than the daemon accepts
/// (Rust's `Display` never uses an exponent, so 1e300 would be 301 digits).
fn push_number(buf: &mut Vec<u8>, v: f64) {
    push_bounded(buf, v, format_args!("{v}"));
}

/// `v` with exactly `decimals` fractional digits (what the XDP engine parses exactly for
/// `decimals <= 6`); exponent form if that would be longer than the daemon accepts.
fn push_fixed(buf: &mut Vec<u8>, v: f64, decimals: usize) {
    push_bounded(buf, v, format_args!("{v:.decimals$}"));
}

/// `text` (a rendering of `v`), or `v` in exponent form when `text` is longer than the daemon
/// accepts.
fn push_bounded(buf: &mut Vec<u8>, v: f64, text: std::fmt::Arguments<'_>) {
    let mut s = String::with_capacity(24);
    let _ = s.write_fmt(text);
    if s.len() > NUMBER_BYTES_MAX {
        s.clear();
        let _ = write!(s, "{v:e}");
    }
    buf.extend_from_slice(s.as_bytes());
}

fn word_name(rank: usize) -> String {
    let mut b = Vec::with_capacity(8);
    push_word(&mut b, rank);
    String::from_utf8(b).unwrap_or_default()
}

// ------------------------------------------------------------------ sending

#[derive(Debug, Default, Clone, PartialEq)]
struct Summary {
    kind: &'static str,
    datagrams: u64,
    records: u64,
    bytes: u64,
    elapsed_ns: u64,
    send_errors: u64,
    start_mono_ns: u64,
    step: Option<StepSent>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct StepSent {
    datagram: u64,
    mono_ns: u64,
    unix_ns: u64,
}

impl Summary {
    fn to_json(&self) -> String {
        let secs = self.elapsed_ns as f64 / NS_PER_S as f64;
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let mut s = String::with_capacity(256);
        let _ = write!(
            s,
            "{{\"kind\":\"{}\",\"datagrams\":{},\"records\":{},\"bytes\":{},\"elapsed_s\":{:.6},\"rate_per_s\":{:.1},\"records_per_s\":{:.1},\"send_errors\":{},\"start_mono_ns\":{}",
            self.kind,
            self.datagrams,
            self.records,
            self.bytes,
            secs,
            per_s(self.datagrams),
            per_s(self.records),
            self.send_errors,
            self.start_mono_ns
        );
        if let Some(st) = self.step {
            let _ = write!(
                s,
                ",\"step_datagram\":{},\"step_sent_mono_ns\":{},\"step_sent_unix_ns\":{}",
                st.datagram, st.mono_ns, st.unix_ns
            );
        }
        s.push('}');
        s
    }
}

/// The first `n` word datagrams `send --kind words` builds with these parameters (same seed,
/// same words), each with its words' ranks: the templates `xdp-gen --word-templates` repeats,
/// so both generators draw words from this one code. `None` when a parameter is out of the
/// bounds `send` enforces.
pub(crate) fn word_datagrams(
    seed: u64,
    vocabulary: usize,
    zipf_s: f64,
    records_per_datagram: usize,
    n: usize,
) -> Option<Vec<(Vec<u8>, Vec<u32>)>> {
    let in_bounds = (1..=VOCABULARY_MAX).contains(&vocabulary)
        && zipf_s.is_finite()
        && (0.0..=ZIPF_S_MAX).contains(&zipf_s)
        && (1..=RECORDS_PER_DATAGRAM_MAX).contains(&records_per_datagram);
    if !in_bounds {
        return None;
    }
    let o = Options {
        to: SocketAddr::from(([0, 0, 0, 0], 0)),
        kind: Kind::Words,
        count: Some(n as u64),
        duration_ns: None,
        rate_per_s: 0,
        records_per_datagram,
        seed,
        vocabulary,
        zipf_s,
        expect_counts: None,
        mean: 0.0,
        stddev: 0.0,
        step_at_ms: None,
        step_by: None,
        binary: false,
        batch: 1,
        decimals: None,
    };
    let mut g = Generator::new(&o);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut buf = Vec::new();
        g.build(&mut buf, 0.0);
        out.push((buf, g.ranks.clone()));
    }
    Some(out)
}

/// Payloads, in sending order.
pub(crate) type Datagrams = Vec<Vec<u8>>;

/// What a text number series is drawn from (`send --kind numbers` options).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NumberSeries {
    pub seed: u64,
    pub mean: f64,
    pub stddev: f64,
    pub decimals: Option<usize>,
    pub records_per_datagram: usize,
}

/// Text number datagrams as `send --kind numbers` builds them for this series: the first
/// `before` unshifted, then `after` more (the generator's next draws) with every value shifted
/// by `step_by` — the two template sets `xdp-gen --number-templates` switches between at its
/// step frame. `None` when a parameter is out of `send`'s bounds.
pub(crate) fn number_datagrams(
    p: &NumberSeries,
    step_by: f64,
    before: usize,
    after: usize,
) -> Option<(Datagrams, Datagrams)> {
    let in_bounds = p.mean.is_finite()
        && p.stddev.is_finite()
        && p.stddev >= 0.0
        && step_by.is_finite()
        && p.decimals.unwrap_or(0) <= DECIMALS_MAX
        && (1..=RECORDS_PER_DATAGRAM_MAX).contains(&p.records_per_datagram);
    if !in_bounds {
        return None;
    }
    let o = Options {
        to: SocketAddr::from(([0, 0, 0, 0], 0)),
        kind: Kind::Numbers,
        count: Some((before + after) as u64),
        duration_ns: None,
        rate_per_s: 0,
        records_per_datagram: p.records_per_datagram,
        seed: p.seed,
        vocabulary: 1,
        zipf_s: 1.0,
        expect_counts: None,
        mean: p.mean,
        stddev: p.stddev,
        step_at_ms: None,
        step_by: None,
        binary: false,
        batch: 1,
        decimals: p.decimals,
    };
    let mut g = Generator::new(&o);
    let mut make = |n: usize, shift: f64| -> Vec<Vec<u8>> {
        (0..n)
            .map(|_| {
                let mut buf = Vec::new();
                g.build(&mut buf, shift);
                buf
            })
            .collect()
    };
    let b = make(before, 0.0);
    let a = make(after, step_by);
    Some((b, a))
}

/// `--expect-counts` file text: `{"w<rank>":count,...}` for every rank counted at least once.
pub(crate) fn counts_json(counts: &[u64]) -> String {
    let mut s = String::with_capacity(counts.len() * 12 + 2);
    s.push('{');
    let mut first = true;
    for (rank, &n) in counts.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if !first {
            s.push(',');
        }
        first = false;
        let _ = write!(s, "\"{}\":{}", word_name(rank), n);
    }
    s.push_str("}\n");
    s
}

/// Datagrams built for one send call, back to back in one buffer.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    /// End offset of each datagram in `bytes`.
    ends: Vec<usize>,
    /// Word ranks of all datagrams, and the end offset of each datagram's ranks.
    ranks: Vec<u32>,
    rank_ends: Vec<usize>,
    /// Index of the first stepped datagram of the run, if it is in this batch.
    first_step: Option<usize>,
}

impl Batch {
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.ranks.clear();
        self.rank_ends.clear();
        self.first_step = None;
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn push(&mut self, payload: &[u8], ranks: &[u32]) {
        self.bytes.extend_from_slice(payload);
        self.ends.push(self.bytes.len());
        self.ranks.extend_from_slice(ranks);
        self.rank_ends.push(self.ranks.len());
    }

    fn datagram(&self, j: usize) -> &[u8] {
        let start = if j == 0 { 0 } else { self.ends.get(j - 1).copied().unwrap_or(0) };
        let end = self.ends.get(j).copied().unwrap_or(start);
        self.bytes.get(start..end).unwrap_or_default()
    }

    fn datagram_ranks(&self, j: usize) -> &[u32] {
        let start = if j == 0 { 0 } else { self.rank_ends.get(j - 1).copied().unwrap_or(0) };
        let end = self.rank_ends.get(j).copied().unwrap_or(start);
        self.ranks.get(start..end).unwrap_or_default()
    }
}

/// Sends every datagram of `batch` on the connected socket, in order; `outcome[j]` is the
/// bytes sent or `None` when that datagram failed (it is skipped, the rest still go). One
/// datagram: plain `send`; more: `sendmmsg`, as many per system call as the kernel takes.
fn send_batch(sock: &UdpSocket, batch: &Batch, outcome: &mut Vec<Option<usize>>) {
    outcome.clear();
    let n = batch.len();
    if n == 1 {
        outcome.push(sock.send(batch.datagram(0)).ok());
        return;
    }
    let mut iov: Vec<libc::iovec> = (0..n)
        .map(|j| {
            let d = batch.datagram(j);
            libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() }
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: msghdr is plain old data (pointers, lengths, flags, and on some libcs
            // private padding); all zeroes is a valid empty header: no name, no control data.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = v;
            h.msg_iovlen = 1;
            libc::mmsghdr { msg_hdr: h, msg_len: 0 }
        })
        .collect();
    let fd = std::os::fd::AsRawFd::as_raw_fd(sock);
    let mut k = 0;
    // Each round settles at least one datagram, so this ends after at most n rounds.
    while k < n {
        let rest = msgs.get_mut(k..).unwrap_or_default();
        // SAFETY: `rest` points at `rest.len()` initialised mmsghdrs whose iovecs point into
        // `batch.bytes` (and `iov`), all alive and unmoved for the duration of the call; the
        // kernel only reads the buffers and writes `msg_len`.
        let r = unsafe { libc::sendmmsg(fd, rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
        if r > 0 {
            let r = r as usize;
            for m in rest.iter().take(r) {
                outcome.push(Some(m.msg_len as usize));
            }
            k += r;
        } else {
            // The datagram at `k` failed (ECONNREFUSED from an earlier ICMP, ENOBUFS, ...).
            outcome.push(None);
            k += 1;
        }
    }
}

#[allow(clippy::too_many_lines)] // the generator loop; not a serving path
fn send(o: &Options) -> Result<Summary, String> {
    let bind: SocketAddr =
        if o.to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().map_err(|e| format!("bind address: {e}"))?;
    let sock = UdpSocket::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    sock.connect(o.to).map_err(|e| format!("connect {}: {e}", o.to))?;

    let mut gen = Generator::new(o);
    let mut counts = vec![0u64; if o.expect_counts.is_some() { o.vocabulary } else { 0 }];
    let start = Instant::now();
    let start_mono_ns = clock_monotonic_ns();
    // One connection's schedule: datagram i due at start + i / rate; never shed (a sender that
    // falls behind makes up in the next burst).
    let mut pacer = (o.rate_per_s > 0).then(|| Pacer::new(start, o.rate_per_s as f64, 1, 0, u64::MAX));
    let planned = planned_datagrams(o.count, o.duration_ns, pacer.as_ref(), start);
    let step_at_ns = o.step_at_ms.map(|ms| ms.saturating_mul(1_000_000));
    let step_by = o.step_by.unwrap_or(0.0);
    let mut buf = Vec::with_capacity(datagram_bytes_max(o));
    let mut batch = Batch::default();
    let mut outcome = Vec::with_capacity(o.batch);
    let mut sum = Summary {
        kind: match o.kind {
            Kind::Words => "words",
            Kind::Numbers => "numbers",
        },
        start_mono_ns,
        ..Summary::default()
    };

    // With a rate the planned count ends the run; the duration is then only a backstop (10%
    // late) for a sender that cannot keep up, so a sleep overshoot never loses the last datagram.
    let stop_ns = o.duration_ns.map(|d| if o.rate_per_s > 0 { d.saturating_add(d / 10) } else { d });
    let mut i: u64 = 0;
    let mut stopping = false;
    while !stopping {
        if planned.is_some_and(|p| i >= p) {
            break;
        }
        let now = Instant::now();
        if stop_ns.is_some_and(|d| ns_since(start, now) >= d) {
            break;
        }
        // Everything due now goes out in one burst (all of it, at rate 0), `--batch` per call.
        let due = pacer.as_ref().map_or(u64::MAX, |p| i.saturating_add(p.due_count(now)));
        let due = planned.map_or(due, |p| due.min(p));
        if i >= due {
            let gap = pacer.as_ref().map_or(0, |p| ns_since(now, p.due_at()));
            if gap >= SPIN_GAP_NS {
                std::thread::sleep(Duration::from_nanos(gap.min(SLEEP_NS_MAX)));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        while i < due && !stopping {
            batch.clear();
            let n = (due - i).min(o.batch as u64);
            for _ in 0..n {
                // With a rate the step follows the schedule (so a seed and a rate give the
                // same series every run); at rate 0 it follows the clock, read once per
                // datagram (which also ends a rate-0 run on time).
                let t = match pacer.as_mut() {
                    Some(p) => ns_since(start, p.take()),
                    None => {
                        let t = ns_since(start, Instant::now());
                        if stop_ns.is_some_and(|d| t >= d) {
                            stopping = true;
                            break;
                        }
                        t
                    }
                };
                let stepped = step_at_ns.is_some_and(|s| t >= s);
                gen.build(&mut buf, if stepped { step_by } else { 0.0 });
                if stepped && sum.step.is_none() && batch.first_step.is_none() {
                    batch.first_step = Some(batch.len());
                }
                batch.push(&buf, &gen.ranks);
            }
            if batch.len() == 0 {
                break;
            }
            let stamp = batch.first_step.map(|_| (clock_monotonic_ns(), unix_ns()));
            send_batch(&sock, &batch, &mut outcome);
            for (j, sent) in outcome.iter().enumerate() {
                match sent {
                    Some(bytes) => {
                        sum.datagrams += 1;
                        sum.records += gen.records_per_datagram as u64;
                        sum.bytes += *bytes as u64;
                        for &k in batch.datagram_ranks(j) {
                            if let Some(c) = counts.get_mut(k as usize) {
                                *c += 1;
                            }
                        }
                        if let (Some(f), Some((mono, unix))) = (batch.first_step, stamp) {
                            if f == j {
                                sum.step = Some(StepSent { datagram: i + j as u64, mono_ns: mono, unix_ns: unix });
                            }
                        }
                    }
                    // Loopback answers a closed port with ECONNREFUSED, a full queue with
                    // ENOBUFS: counted; the datagram and its words were not "sent". (A failed
                    // first stepped datagram leaves the step to the next one that goes out.)
                    None => sum.send_errors += 1,
                }
            }
            i += batch.len() as u64;
        }
    }
    sum.elapsed_ns = ns_since(start, Instant::now());
    if let Some(path) = &o.expect_counts {
        std::fs::write(path, counts_json(&counts)).map_err(|e| format!("--expect-counts {path}: {e}"))?;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn word_datagrams_are_what_send_builds() {
        let o = parse_args(&args("--to 127.0.0.1:9 --kind words --count 5 --vocabulary 50 --seed 9")).unwrap();
        let mut g = Generator::new(&o);
        let made = word_datagrams(9, 50, 1.0, 16, 5).unwrap();
        for (payload, ranks) in &made {
            let mut buf = Vec::new();
            g.build(&mut buf, 0.0);
            assert_eq!((&buf, &g.ranks), (payload, ranks));
            assert_eq!(ranks.len(), 16);
        }
        assert!(word_datagrams(9, 0, 1.0, 16, 5).is_none());
        assert!(word_datagrams(9, 50, f64::NAN, 16, 5).is_none());
    }

    #[test]
    fn number_datagrams_are_what_send_builds_with_a_step() {
        let o = parse_args(&args(
            "--to 127.0.0.1:9 --kind numbers --count 5 --seed 4 --mean 10 --records-per-datagram 3 --decimals 6",
        ))
        .unwrap();
        let mut g = Generator::new(&o);
        let p = NumberSeries { seed: 4, mean: 10.0, stddev: 1.0, decimals: Some(6), records_per_datagram: 3 };
        let (before, after) = number_datagrams(&p, 20.0, 2, 3).unwrap();
        assert_eq!((before.len(), after.len()), (2, 3));
        for (i, want) in before.iter().chain(&after).enumerate() {
            let mut buf = Vec::new();
            g.build(&mut buf, if i < 2 { 0.0 } else { 20.0 });
            assert_eq!(&buf, want, "datagram {i}");
        }
        assert!(number_datagrams(&NumberSeries { stddev: -1.0, ..p.clone() }, 0.0, 1, 0).is_none());
        assert!(number_datagrams(&p, f64::INFINITY, 1, 1).is_none());
    }

    #[test]
    fn planned_totals() {
        let t0 = Instant::now();
        let at = |rate: u64| Pacer::new(t0, rate as f64, 1, 0, u64::MAX);
        assert_eq!(planned_datagrams(Some(10), None, None, t0), Some(10));
        assert_eq!(planned_datagrams(None, Some(NS_PER_S), Some(&at(1000)), t0), Some(1000));
        assert_eq!(planned_datagrams(Some(10), Some(NS_PER_S), Some(&at(1000)), t0), Some(10));
        assert_eq!(planned_datagrams(None, Some(NS_PER_S), None, t0), None);
        assert_eq!(planned_datagrams(None, Some(2_500_000_000), Some(&at(2)), t0), Some(5));
        // The generator's top rate is scheduled, not clamped to the request load's.
        assert_eq!(planned_datagrams(None, Some(NS_PER_S / 1000), Some(&at(RATE_PER_S_MAX)), t0), Some(100_000));
    }

    #[test]
    fn argument_checks() {
        let ok = parse_args(&args("--to 127.0.0.1:9 --kind words --count 5 --vocabulary 50")).unwrap();
        assert_eq!(ok.kind, Kind::Words);
        assert_eq!(ok.records_per_datagram, 16);
        assert_eq!(ok.count, Some(5));
        let ok =
            parse_args(&args("--to=127.0.0.1:9 --kind=numbers --duration-s=1.5 --binary --step-at-ms 10 --step-by -3"))
                .unwrap();
        assert_eq!(ok.duration_ns, Some(1_500_000_000));
        assert_eq!(ok.step_by, Some(-3.0));
        assert!(ok.binary);
        for bad in [
            "--kind words --count 1",
            "--to 127.0.0.1:9 --count 1",
            "--to 127.0.0.1:9 --kind words",
            "--to 127.0.0.1:9 --kind words --count 0",
            "--to 127.0.0.1:9 --kind words --duration-s 3601",
            "--to 127.0.0.1:9 --kind words --duration-s nan",
            "--to 127.0.0.1:9 --kind numbers --count 1 --step-at-ms 5",
            "--to 127.0.0.1:9 --kind words --count 1 --binary",
            "--to 127.0.0.1:9 --kind numbers --count 1 --expect-counts x",
            "--to 127.0.0.1:9 --kind words --count 1 --records-per-datagram 8193",
            "--to 127.0.0.1:9 --kind numbers --count 1 --records-per-datagram 2000",
            "--to 127.0.0.1:9 --kind words --count 1 --bogus 1",
            "--to 127.0.0.1:9 --kind words --count",
            "--to 127.0.0.1:9 --kind numbers --count 1 --stddev -1",
            "--to 127.0.0.1:9 --kind words --count 1 --vocabulary 1000001",
        ] {
            assert!(parse_args(&args(bad)).is_err(), "accepted: {bad}");
        }
        // Binary numbers fit many more per datagram than text.
        assert!(
            parse_args(&args("--to 127.0.0.1:9 --kind numbers --count 1 --binary --records-per-datagram 8000")).is_ok()
        );
    }

    #[test]
    fn payload_formats() {
        let mut o =
            parse_args(&args("--to 127.0.0.1:9 --kind numbers --count 1 --records-per-datagram 3 --mean 5 --stddev 0"))
                .unwrap();
        let mut g = Generator::new(&o);
        let mut buf = Vec::new();
        g.build(&mut buf, 0.0);
        assert_eq!(buf, b"5\n5\n5");
        g.build(&mut buf, 2.5);
        assert_eq!(buf, b"7.5\n7.5\n7.5");
        o.binary = true;
        let mut g = Generator::new(&o);
        g.build(&mut buf, 0.0);
        assert_eq!(&buf[..4], b"SSF1");
        assert_eq!(buf.len(), 4 + 3 * 8);
        assert_eq!(f64::from_le_bytes(buf[4..12].try_into().unwrap()), 5.0);
        let mut b = Vec::new();
        push_number(&mut b, 1e300);
        assert_eq!(b, b"1e300");
        b.clear();
        push_number(&mut b, -0.000123);
        assert_eq!(b, b"-0.000123");

        let o = parse_args(&args(
            "--to 127.0.0.1:9 --kind words --count 1 --records-per-datagram 4 --vocabulary 1000000 --zipf-s 0",
        ))
        .unwrap();
        assert!(datagram_bytes_max(&o) >= 4 * 8);
        let mut g = Generator::new(&o);
        g.build(&mut buf, 0.0);
        let text = String::from_utf8(buf.clone()).unwrap();
        let words: Vec<&str> = text.split(' ').collect();
        assert_eq!(words.len(), 4);
        for (w, &k) in words.iter().zip(&g.ranks) {
            assert_eq!(*w, word_name(k as usize));
        }
        assert!(buf.len() <= datagram_bytes_max(&o));
        assert_eq!(word_name(0), "w0");
        assert_eq!(word_name(907), "w907");
        assert_eq!(counts_json(&[2, 0, 5]), "{\"w0\":2,\"w2\":5}\n");
    }

    #[test]
    fn loopback_send_counts_and_step() {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let to = sink.local_addr().unwrap();
        let dir = std::env::temp_dir().join(format!("slipstream-send-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("counts.json");
        let o = parse_args(&args(&format!(
            "--to {to} --kind words --count 20 --rate-per-s 2000 --records-per-datagram 5 --vocabulary 7 --seed 3 --expect-counts {}",
            file.display()
        )))
        .unwrap();
        let sum = send(&o).unwrap();
        assert_eq!((sum.datagrams, sum.records, sum.send_errors), (20, 100, 0));
        // 20 datagrams at 2000/s: the last is due at 9.5 ms.
        assert!(sum.elapsed_ns >= 9_500_000, "elapsed {}", sum.elapsed_ns);
        let mut got: HashMap<String, u64> = HashMap::new();
        let mut b = [0u8; 2048];
        for _ in 0..20 {
            let n = sink.recv(&mut b).unwrap();
            for w in std::str::from_utf8(&b[..n]).unwrap().split(' ') {
                *got.entry(w.to_string()).or_default() += 1;
            }
        }
        let mut want: Vec<(String, u64)> = got.into_iter().collect();
        want.sort_by_key(|(w, _)| w[1..].parse::<u32>().unwrap());
        let want = format!("{{{}}}\n", want.iter().map(|(w, n)| format!("\"{w}\":{n}")).collect::<Vec<_>>().join(","));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), want);
        let _ = std::fs::remove_dir_all(&dir);

        // A step at 5 ms at 1000/s: datagrams 0..=4 unstepped, 5.. stepped (stddev 0).
        let o = parse_args(&args(&format!(
            "--to {to} --kind numbers --count 10 --rate-per-s 1000 --mean 1 --stddev 0 --step-at-ms 5 --step-by 100"
        )))
        .unwrap();
        let before = clock_monotonic_ns();
        let sum = send(&o).unwrap();
        let st = sum.step.expect("step recorded");
        assert!(st.mono_ns >= before + 5_000_000 && st.mono_ns <= clock_monotonic_ns());
        let mut vals = Vec::new();
        for _ in 0..10 {
            let n = sink.recv(&mut b).unwrap();
            vals.push(std::str::from_utf8(&b[..n]).unwrap().to_string());
        }
        let first = vals.iter().position(|v| v == "101").unwrap();
        assert_eq!(first as u64, st.datagram);
        assert!(vals[..first].iter().all(|v| v == "1") && vals[first..].iter().all(|v| v == "101"));
        assert!(sum.to_json().contains("\"step_sent_mono_ns\":"));

        // sendmmsg batches: every datagram arrives, in order, and the step is still exact.
        let o = parse_args(&args(&format!(
            "--to {to} --kind numbers --count 50 --rate-per-s 0 --batch 8 --mean 1 --stddev 0 --step-at-ms 0 --step-by 1"
        )))
        .unwrap();
        let sum = send(&o).unwrap();
        assert_eq!((sum.datagrams, sum.send_errors), (50, 0));
        assert_eq!(sum.step.map(|s| s.datagram), Some(0));
        for _ in 0..50 {
            let n = sink.recv(&mut b).unwrap();
            assert_eq!(&b[..n], b"2");
        }
        let words = parse_args(&args(&format!(
            "--to {to} --kind words --count 30 --batch 7 --records-per-datagram 3 --vocabulary 5"
        )))
        .unwrap();
        let sum = send(&words).unwrap();
        assert_eq!((sum.datagrams, sum.records), (30, 90));
        let mut total = 0;
        for _ in 0..30 {
            let n = sink.recv(&mut b).unwrap();
            total += std::str::from_utf8(&b[..n]).unwrap().split(' ').count();
        }
        assert_eq!(total, 90);
    }

    #[test]
    fn batch_slices_and_failed_sends() {
        let mut batch = Batch::default();
        batch.push(b"ab", &[1, 2]);
        batch.push(b"", &[]);
        batch.push(b"cde", &[3]);
        assert_eq!((batch.datagram(0), batch.datagram(1), batch.datagram(2)), (&b"ab"[..], &b""[..], &b"cde"[..]));
        assert_eq!(batch.datagram_ranks(0), &[1, 2]);
        assert_eq!(batch.datagram_ranks(2), &[3]);
        assert_eq!(batch.datagram(9), b"");
        // A connected socket to a closed port: loopback refuses (ICMP), later sends fail and
        // are counted, never an endless retry.
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = closed.local_addr().unwrap();
        drop(closed);
        let o = parse_args(&args(&format!("--to {to} --kind words --count 40 --batch 4"))).unwrap();
        let sum = send(&o).unwrap();
        assert_eq!(sum.datagrams + sum.send_errors, 40);
        assert!(sum.send_errors > 0, "{sum:?}");
    }
}
