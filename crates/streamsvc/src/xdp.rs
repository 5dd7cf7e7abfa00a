//! xdp: the stream service's XDP engine (issue 5): which streams run in the kernel
//! (`bpf/xdp_stream.h` via slipstream-fastpath's [`StreamKernel`]), their kernel configuration,
//! the ring-buffer reader thread (change-point alerts and value batches), and the user-space
//! halves the ingest thread runs for XDP streams (word-count merge, change-point takeover).
//!
//! Semantics, per operator (the kernel decides per datagram: consumed and counted, or passed
//! to the stream's UDP socket unchanged):
//! - wordcount: the kernel counts per (window, word); the ingest thread parses what was passed
//!   (long or non-ASCII words, full map, ...) into its own per-window counts, and once a
//!   window has ended (plus [`WC_GRACE_NS`]) drains the kernel's counts for it, merges, and
//!   writes the same `wordcount` line the user-space operator writes. A passed datagram's
//!   words are counted in the window of its user-space receive time. Past
//!   `distinct_words_per_window_max` the itemised words are the smallest by bytes (the kernel
//!   cannot know arrival order across CPUs); the rest is `overflow`, as in user space.
//! - changepoint (reference rule): the kernel detects; alerts come through the ring buffer and
//!   are formatted here (reference recomputed from the window sums, as user space would). The
//!   first datagram that reaches the socket (one the kernel could not take exactly, or one
//!   that bypassed XDP) makes user space take the stream over for good: the kernel is told to
//!   pass everything, its state is read under its lock after [`TAKEOVER_GRACE`], and the
//!   user-space operator continues from it.
//! - aggregate and numeric filters: the kernel parses, the values come through the ring buffer
//!   to the same operator the socket path feeds.
//!
//! What it is not for: operator semantics (slipstream-stream) or the program (bpf/).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use slipstream_fastpath::stream::{self as ks, Event, StreamAttach, StreamKernel};
use slipstream_stream::changepoint::{ChangePoint, ChangePointOp, Detector};
use slipstream_stream::result::{self, Alert, Method};
use slipstream_stream::{Operator, Record, StreamConfig};

use crate::Shared;

/// A window's kernel counts are drained this long after its end: a datagram's window is
/// fixed when XDP starts on it, microseconds before it is counted.
pub(crate) const WC_GRACE_NS: u64 = 5_000_000;
/// Wait between telling the kernel to pass a change-point stream and reading its state: every
/// datagram the program had already started on has been applied by then.
pub(crate) const TAKEOVER_GRACE: Duration = Duration::from_millis(2);

pub(crate) type SharedOp = Arc<Mutex<Box<dyn Operator + Send>>>;

/// What the kernel does for one stream.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    WordCount { window_ns: u64, distinct_max: usize },
    ChangePoint { window_ns: u64, reference_windows: u32, threshold: f64, history: u32 },
    Values,
}

/// One stream run by XDP.
pub(crate) struct XdpStream {
    pub slot: u32,
    pub kind: Kind,
    pub kernel: Arc<StreamKernel>,
    /// Lines the ring-buffer reader wrote for this stream.
    pub lines: Arc<AtomicU64>,
}

/// The kernel configuration for `s`, or why it stays in user space.
pub(crate) fn kernel_cfg(s: &StreamConfig) -> Result<(ks::StreamCfg, Kind), String> {
    let window_ns = s.window_ms.saturating_mul(1_000_000);
    let format = match s.format.as_str() {
        "text" => ks::FORMAT_TEXT,
        "binary" => ks::FORMAT_BINARY,
        _ => ks::FORMAT_AUTO,
    };
    let mut c = ks::StreamCfg {
        window_ns,
        word_bytes_max: s.word_bytes_max.min(ks::WORD_KEY_BYTES) as u32,
        records_max: s.records_per_datagram_max.min(u32::MAX as usize) as u32,
        format,
        ..Default::default()
    };
    let kind = match s.operator.as_str() {
        "wordcount" => {
            c.op = ks::OP_WORDCOUNT;
            Kind::WordCount { window_ns, distinct_max: s.distinct_words_per_window_max }
        }
        "changepoint" => {
            if s.method != "reference" {
                return Err(format!("method {} runs in user space (the kernel has the reference rule)", s.method));
            }
            if s.reference_windows as usize > ks::CP_REF_MAX {
                return Err(format!("reference_windows {} > {} (kernel limit)", s.reference_windows, ks::CP_REF_MAX));
            }
            if s.history as usize > ks::CP_HISTORY_MAX {
                return Err(format!("history {} > {} (kernel limit)", s.history, ks::CP_HISTORY_MAX));
            }
            let Some(t) = ks::threshold_n(s.threshold) else {
                return Err(format!("threshold {} outside the kernel's fixed-point range", s.threshold));
            };
            c.op = ks::OP_CHANGEPOINT;
            c.reference_windows = s.reference_windows;
            c.history = s.history;
            c.threshold_n = t;
            Kind::ChangePoint {
                window_ns,
                reference_windows: s.reference_windows,
                threshold: s.threshold,
                history: s.history,
            }
        }
        "aggregate" => {
            c.op = ks::OP_VALUES;
            Kind::Values
        }
        "filter" if s.filter_word.is_none() => {
            c.op = ks::OP_VALUES;
            Kind::Values
        }
        "filter" => return Err("word filters run in user space".into()),
        other => return Err(format!("operator {other} has no kernel engine")),
    };
    Ok((c, kind))
}

/// One stream's entry for the ring-buffer reader.
pub(crate) struct ReaderSlot {
    pub idx: usize,
    pub name: String,
    pub kind: Kind,
    pub op: SharedOp,
    pub lines: Arc<AtomicU64>,
}

fn ring_reference(windows: &[(i64, u64)]) -> f64 {
    // As ChangePoint does: the plain mean of the window means (each sum / count in f64).
    let means: Vec<f64> =
        windows.iter().filter(|(_, n)| *n > 0).map(|(s, n)| ks::micro_to_f64(*s) / *n as f64).collect();
    if means.is_empty() {
        return 0.0;
    }
    means.iter().sum::<f64>() / means.len() as f64
}

/// Token of the ring buffer in the reader's poll set (the stop waker is [`READER_STOP`]).
pub(crate) const READER_RING: mio::Token = mio::Token(0);
/// Token of the waker `StreamService`'s drop uses to stop the reader.
pub(crate) const READER_STOP: mio::Token = mio::Token(1);

/// Runs until `shared.stop`: takes every ring-buffer record and writes its lines. Sleeps until
/// the ring has a record or `poll`'s waker ([`READER_STOP`]) fires: no timer, so an idle
/// stream costs nothing here (a 10 ms poll timeout was ~100 wake-ups per second).
pub(crate) fn run_reader(
    mut ring: aya::maps::RingBuf<aya::maps::MapData>,
    slots: Vec<Option<ReaderSlot>>,
    shared: Arc<Shared>,
    mut poll: mio::Poll,
) {
    use std::os::fd::AsRawFd;
    let fd = ring.as_raw_fd();
    let mut out = Vec::with_capacity(64 * 1024);
    let mut events = mio::Events::with_capacity(4);
    // Without the ring in the poll set the reader could not sleep: fall back to a bounded wait.
    let timeout = match poll.registry().register(&mut mio::unix::SourceFd(&fd), READER_RING, mio::Interest::READABLE) {
        Ok(()) => None,
        Err(_) => Some(Duration::from_millis(10)),
    };
    // Records left after a turn's bound: the next turn does not sleep (the ring only wakes a
    // reader that had caught up, and the poll set is edge-triggered).
    let mut more = false;
    while !shared.stop.load(Ordering::Acquire) {
        // An error (EINTR) just goes round: the stop flag and the ring are checked again.
        let _ = poll.poll(&mut events, if more { Some(Duration::ZERO) } else { timeout });
        more = true;
        // Bounded per wake-up; the rest is taken on the next turn.
        for _ in 0..65_536 {
            let Some(item) = ring.next() else {
                more = false;
                break;
            };
            let Some(ev) = ks::parse_event(&item) else { continue };
            drop(item);
            match ev {
                Event::Alert { stream, t_ns, value_micro, windows, history } => {
                    let Some(Some(s)) = slots.get(stream as usize) else { continue };
                    let Kind::ChangePoint { threshold, .. } = s.kind else { continue };
                    let value = ks::micro_to_f64(value_micro);
                    let reference = ring_reference(&windows);
                    let a = Alert {
                        t_ns,
                        value,
                        reference,
                        method: Method::Reference,
                        deviation: value - reference,
                        threshold,
                        cusum: None,
                        history: history.iter().map(|m| ks::micro_to_f64(*m)).collect(),
                    };
                    result::changepoint(&mut out, &s.name, &a);
                    s.lines.fetch_add(1, Ordering::Relaxed);
                    shared.publish(s.idx, &mut out);
                }
                Event::Values { stream, t_ns, values } => {
                    let Some(Some(s)) = slots.get(stream as usize) else { continue };
                    {
                        let mut op = s.op.lock().unwrap_or_else(PoisonError::into_inner);
                        for v in &values {
                            op.on_record(Record::Value(ks::micro_to_f64(*v)), t_ns, &mut out);
                        }
                    }
                    if !out.is_empty() {
                        shared.publish(s.idx, &mut out);
                    }
                }
            }
        }
    }
}

/// Word-count state of the ingest thread for an XDP stream: what user space parsed itself,
/// per window.
#[derive(Default)]
pub(crate) struct WcMerge {
    pub user: BTreeMap<u64, HashMap<String, u64>>,
    /// Per window: occurrences of words user space could not itemise (distinct bound).
    pub untracked: BTreeMap<u64, u64>,
    pub lines: u64,
    /// Every window before this one has been drained from the kernel: a tick with no newly
    /// ended window walks no map (a walk is three system calls per entry in the map).
    pub drained_before: u64,
}

/// Bound on distinct words user space keeps per window while waiting for the drain.
const USER_WORDS_PER_WINDOW_MAX: usize = 1_000_000;

impl WcMerge {
    pub(crate) fn push(&mut self, window: u64, word: &str) {
        let m = self.user.entry(window).or_default();
        if let Some(n) = m.get_mut(word) {
            *n += 1;
        } else if m.len() < USER_WORDS_PER_WINDOW_MAX {
            m.insert(word.to_string(), 1);
        } else {
            *self.untracked.entry(window).or_default() += 1;
        }
    }

    /// Drains every window that ended before `now_ns - grace` from the kernel, merges, and
    /// appends one `wordcount` line per non-empty window, oldest first.
    pub(crate) fn flush(
        &mut self,
        x: &XdpStream,
        name: &str,
        window_ns: u64,
        distinct_max: usize,
        now_ns: u64,
        out: &mut Vec<u8>,
    ) {
        let window_ns = window_ns.max(1);
        let before = now_ns.saturating_sub(WC_GRACE_NS) / window_ns;
        if before <= self.drained_before {
            return;
        }
        let (drained, err) = x.kernel.drain_wordcount(x.slot, before);
        if err.is_some() {
            // What was taken is kept with user space's own counts, and the windows are
            // written on a later tick, once a drain completes: nothing lost, one line each.
            for (w, word, n) in drained {
                *self.user.entry(w).or_default().entry(String::from_utf8_lossy(&word).into_owned()).or_default() += n;
            }
            return;
        }
        self.drained_before = before;
        let mut merged: BTreeMap<u64, HashMap<String, u64>> = BTreeMap::new();
        for (w, word, n) in drained {
            // The kernel counts ASCII words only, so this is lossless.
            let word = String::from_utf8_lossy(&word).into_owned();
            *merged.entry(w).or_default().entry(word).or_default() += n;
        }
        let later_untracked = self.untracked.split_off(&before);
        let untracked = std::mem::replace(&mut self.untracked, later_untracked);
        let later = self.user.split_off(&before);
        for (w, m) in std::mem::replace(&mut self.user, later) {
            let e = merged.entry(w).or_default();
            for (word, n) in m {
                *e.entry(word).or_default() += n;
            }
        }
        for w in untracked.keys() {
            merged.entry(*w).or_default();
        }
        for (w, m) in merged {
            let extra = untracked.get(&w).copied().unwrap_or(0);
            let total: u64 = m.values().sum::<u64>() + extra;
            if total == 0 {
                continue;
            }
            let mut sorted: Vec<(&str, u64)> =
                m.iter().map(|(w, n)| (w.as_str(), *n)).filter(|(_, n)| *n > 0).collect();
            sorted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            let mut overflow = extra;
            if sorted.len() > distinct_max {
                overflow += sorted.iter().skip(distinct_max).map(|(_, n)| n).sum::<u64>();
                sorted.truncate(distinct_max);
            }
            let start = w.saturating_mul(window_ns);
            result::wordcount(out, name, start, start.saturating_add(window_ns), total, overflow, &sorted);
            self.lines += 1;
        }
    }
}

/// Takes a change-point stream over from the kernel: from now on every datagram passes to the
/// socket, and the operator continues from the kernel's state. Returns the new operator.
pub(crate) fn take_over(x: &XdpStream, name: &str) -> Option<Box<dyn Operator + Send>> {
    let Kind::ChangePoint { window_ns, reference_windows, threshold, history } = x.kind else { return None };
    x.kernel.set_user_only(x.slot).ok()?;
    std::thread::sleep(TAKEOVER_GRACE);
    let snap = x.kernel.cp_snapshot(x.slot, reference_windows, history).ok()?;
    let means: Vec<f64> = snap.windows.iter().map(|(s, n)| ks::micro_to_f64(*s) / (*n).max(1) as f64).collect();
    let raw: Vec<f64> = snap.history.iter().map(|m| ks::micro_to_f64(*m)).collect();
    let cp = ChangePoint::restore(
        window_ns,
        reference_windows as usize,
        Detector::Reference { threshold },
        history as usize,
        snap.current,
        ks::micro_to_f64(snap.cur_sum_micro),
        snap.cur_count,
        &means,
        &raw,
    );
    Some(Box::new(ChangePointOp::restored(name, cp, snap.high_t_ns)))
}

/// The engine's hold on the interface (detaches on drop if it attached the program itself).
pub(crate) struct XdpEngine {
    pub attach: StreamAttach,
}

impl Drop for XdpEngine {
    fn drop(&mut self) {
        // A program shared with the KV fast path stays attached: give the ports back to it.
        for slot in 0..ks::STREAMS_MAX {
            let _ = self.attach.kernel.remove_stream(slot);
        }
    }
}

/// Each stream's engine after setup: `Ok(kernel config)` for XDP, `Err(reason)` for user space.
pub(crate) fn plan(streams: &[StreamConfig], xdp_on: bool) -> Vec<Result<(ks::StreamCfg, Kind), String>> {
    streams
        .iter()
        .map(|s| {
            if s.engine == "user" {
                return Err("engine = \"user\"".into());
            }
            if !xdp_on {
                return Err("no --xdp".into());
            }
            kernel_cfg(s)
        })
        .collect()
}

type Reader = (aya::maps::RingBuf<aya::maps::MapData>, Vec<Option<ReaderSlot>>);

/// Decides each stream's engine, attaches (or shares) the program, configures the XDP
/// streams' slots and ports. Never fails: a stream that cannot run in XDP runs in user space,
/// and its entry in the returned descriptions says why.
#[allow(clippy::type_complexity)]
pub(crate) fn setup<T>(
    cfg: &crate::ServiceConfig,
    addrs: &[(String, std::net::SocketAddr)],
    ops: &[(SharedOp, T, slipstream_stream::Limits, u64)],
) -> (Option<XdpEngine>, Vec<Option<XdpStream>>, Vec<String>, Option<Reader>) {
    let n = cfg.streams.len();
    let mut plans = plan(&cfg.streams, cfg.xdp_iface.is_some());
    let none = || (0..n).map(|_| None).collect::<Vec<_>>();
    let describe = |plans: &[Result<(ks::StreamCfg, Kind), String>]| -> Vec<String> {
        plans
            .iter()
            .map(|p| match p {
                Ok(_) => "xdp".to_string(),
                Err(why) => format!("user ({why})"),
            })
            .collect()
    };
    let (Some(iface), true) = (&cfg.xdp_iface, plans.iter().any(|p| p.is_ok())) else {
        return (None, none(), describe(&plans), None);
    };
    let attach = match StreamKernel::attach(iface) {
        Ok(a) => a,
        Err(e) => {
            let why = format!("XDP off: {e}");
            for p in plans.iter_mut() {
                if p.is_ok() {
                    *p = Err(why.clone());
                }
            }
            return (None, none(), describe(&plans), None);
        }
    };
    let kernel = attach.kernel.clone();
    let mut streams = none();
    let mut slots: Vec<Option<ReaderSlot>> = (0..ks::STREAMS_MAX).map(|_| None).collect();
    for (idx, p) in plans.iter_mut().enumerate() {
        let Ok((kc, kind)) = p.clone() else { continue };
        let port = addrs.get(idx).map(|(_, a)| a.port()).unwrap_or(0);
        let slot = idx as u32;
        if slot >= ks::STREAMS_MAX {
            *p = Err(format!("more than {} XDP streams", ks::STREAMS_MAX));
            continue;
        }
        if let Err(e) = kernel.add_stream(slot, port, kc) {
            *p = Err(format!("XDP off: {e}"));
            continue;
        }
        let lines = Arc::new(AtomicU64::new(0));
        if let (Some(s), Some((op, ..))) = (slots.get_mut(slot as usize), ops.get(idx)) {
            *s = Some(ReaderSlot {
                idx,
                name: cfg.streams.get(idx).map(|s| s.name.clone()).unwrap_or_default(),
                kind: kind.clone(),
                op: op.clone(),
                lines: lines.clone(),
            });
        }
        if let Some(s) = streams.get_mut(idx) {
            *s = Some(XdpStream { slot, kind, kernel: kernel.clone(), lines });
        }
    }
    let mut engines = describe(&plans);
    for e in engines.iter_mut() {
        if e == "xdp" {
            *e = format!("xdp on {iface}, {}", attach.how);
        }
    }
    let reader = kernel.take_events().map(|r| (r, slots));
    (Some(XdpEngine { attach }), streams, engines, reader)
}
