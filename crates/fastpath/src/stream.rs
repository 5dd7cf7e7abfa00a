//! stream: the user-space side of the XDP stream engine (`bpf/xdp_stream.h`, in the same entry
//! program as the KV fast path): the Rust mirror of `bpf/slipstream_stream.h` (layouts with
//! compile-time size/offset asserts), and [`StreamKernel`], the handle the stream service uses
//! to configure stream slots and ports, drain word counts, read counters, take a change-point
//! stream's state over, and read the ring buffer of alerts and value batches.
//!
//! Not for: operator semantics (slipstream-stream) or threads (slipstream-streamsvc).
//!
//! Sharing one program per interface: [`crate::FastPath`] registers the [`StreamKernel`] of the
//! program it attached in a process-wide registry keyed by interface index;
//! [`StreamKernel::attach`] returns that one when the KV fast path is already on the interface
//! (one attach, both services configure their own map entries), and otherwise attaches the
//! program itself, serving no tenant.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use aya::maps::{MapData, RingBuf};

use crate::abi::header::{self as h, ss_alert, ss_ev_hdr, ss_values};
use crate::mapped::MappedArray;
use crate::{mirror, sys, AttachMode, FastPath, FastPathError};

/// Map and limit names of `slipstream_stream.h`.
pub const MAP_STREAMS: &str = "ss_streams";
pub const MAP_STREAM_STATS: &str = "ss_sstats";
pub const MAP_WORDCOUNT: &str = "ss_wc";
/// The word-count cache in front of `ss_wc` (mmapped; see [`WccSlot`]).
pub const MAP_WC_CACHE: &str = "ss_wcc";
pub const MAP_CHANGEPOINT: &str = "ss_cp";
pub const MAP_EVENTS: &str = "ss_events";

pub const STREAMS_MAX: u32 = h::SS_STREAMS_MAX as u32;
pub const PORT_STREAM: u32 = h::SS_PORT_STREAM as u32;
pub const PORT_SLOT_MASK: u32 = h::SS_PORT_SLOT_MASK as u32;
pub const WORD_KEY_BYTES: usize = h::SS_WORD_KEY_BYTES as usize;
pub const STREAM_PAYLOAD_MAX: usize = h::SS_STREAM_PAYLOAD_MAX as usize;
pub const WORDS_MAX: usize = h::SS_WORDS_MAX as usize;
pub const VALUES_MAX: usize = h::SS_VALUES_MAX as usize;
pub const WC_ENTRIES: u32 = h::SS_WC_ENTRIES as u32;
/// Word-count cache slots per CPU.
pub const WCC_SLOTS: u32 = h::SS_WCC_SLOTS as u32;
/// Longest word the word-count cache holds; longer words are counted in `ss_wc` only.
pub const WCC_WORD_BYTES: usize = h::SS_WCC_WORD_BYTES as usize;
/// `SS_WCC_TAG_*`: how a cache slot's tag packs (window + 1, stream, len).
const WCC_TAG_WINDOW_SHIFT: u32 = h::SS_WCC_TAG_WINDOW_SHIFT as u32;
const WCC_TAG_STREAM_SHIFT: u32 = h::SS_WCC_TAG_STREAM_SHIFT as u32;
const WCC_TAG_LEN_MASK: u64 = h::SS_WCC_TAG_LEN_MASK;
/// The first window the cache does not hold (counted in `ss_wc` from there on).
pub const WCC_WINDOW_END: u64 = h::SS_WCC_WINDOW_END;

/// The cache slot index (within one CPU's `WCC_SLOTS`) the program's hash picks for a word of
/// at most `WCC_WORD_BYTES` of `stream`; the word may be counted there or in the other slot of
/// the pair (`index ^ 1`). Only for fixtures that need words which collide: the program's
/// `wc_cache_add` is the rule (this follows it, with the header's constants, and the fixture
/// `two_words_sharing_a_slot_both_stay_in_the_cache` fails if the two ever disagree).
pub fn wcc_slot_of(stream: u32, word: &[u8]) -> Option<u32> {
    if word.len() > WCC_WORD_BYTES {
        return None;
    }
    let mut padded = [0u8; WCC_WORD_BYTES];
    padded.get_mut(..word.len())?.copy_from_slice(word);
    let (a, b) = padded.split_at(8);
    let w0 = u64::from_le_bytes(a.try_into().ok()?);
    let w1 = u64::from_le_bytes(b.try_into().ok()?);
    let low = (u64::from(stream) << WCC_TAG_STREAM_SHIFT) | word.len() as u64;
    let hash = ((w0 ^ low).wrapping_mul(h::SS_WCC_MUL1) ^ w1).wrapping_mul(h::SS_WCC_MUL2);
    u32::try_from(hash >> (64 - h::SS_WCC_SLOT_BITS)).ok()
}
pub const CP_REF_MAX: usize = h::SS_CP_REF_MAX as usize;
pub const CP_HISTORY_MAX: usize = h::SS_CP_HISTORY_MAX as usize;
/// Values are micro-units: `value = micro / FIXED_SCALE`.
pub const FIXED_SCALE: i64 = h::SS_FIXED_SCALE as i64;
/// Largest |micro| the kernel takes (10^8 units).
pub const FIXED_ABS_MAX: i64 = h::SS_FIXED_ABS_MAX as i64;

pub const OP_NONE: u32 = h::SS_OP_NONE as u32;
pub const OP_WORDCOUNT: u32 = h::SS_OP_WORDCOUNT as u32;
pub const OP_CHANGEPOINT: u32 = h::SS_OP_CHANGEPOINT as u32;
pub const OP_VALUES: u32 = h::SS_OP_VALUES as u32;
pub const FORMAT_AUTO: u32 = h::SS_FORMAT_AUTO as u32;
pub const FORMAT_TEXT: u32 = h::SS_FORMAT_TEXT as u32;
pub const FORMAT_BINARY: u32 = h::SS_FORMAT_BINARY as u32;
const EV_ALERT: u32 = h::SS_EV_ALERT as u32;
const EV_VALUES: u32 = h::SS_EV_VALUES as u32;
/// `BPF_F_LOCK`: copy a spin-locked map value under its lock.
const BPF_F_LOCK: u64 = 4;

/// `struct ss_stream`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamCfg {
    pub op: u32,
    pub user_only: u32,
    pub window_ns: u64,
    pub word_bytes_max: u32,
    pub records_max: u32,
    pub reference_windows: u32,
    pub history: u32,
    pub threshold_n: u64,
    pub format: u32,
    pub pad0: u32,
}

/// `struct ss_stream_stats` (one CPU's, or the sum).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Datagrams consumed in the kernel (XDP_DROP).
    pub datagrams: u64,
    pub records: u64,
    pub malformed: u64,
    /// Datagrams passed to the user-space socket.
    pub passed: u64,
    pub alerts: u64,
    /// Ring-buffer records that could not be sent (ring full).
    pub events_lost: u64,
    pub pad0: u64,
    pub pad1: u64,
}

/// `struct ss_wc_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WcKey {
    pub window: u64,
    pub stream: u32,
    pub len: u32,
    pub word: [u8; WORD_KEY_BYTES],
}

/// `struct ss_wcc_slot`: one slot of the word-count cache, read and written with atomic
/// operations here because the program on the slot's CPU writes it concurrently (the header
/// says who may write what when).
#[repr(C)]
#[derive(Debug, Default)]
pub struct WccSlot {
    /// `(window + 1) << SS_WCC_TAG_WINDOW_SHIFT | stream << SS_WCC_TAG_STREAM_SHIFT | len`; 0:
    /// empty (see [`WccSlot::key`]).
    pub tag: AtomicU64,
    pub count: AtomicU64,
    pub word: [AtomicU64; WCC_WORD_BYTES / 8],
}

impl WccSlot {
    /// (window, stream, len) of a non-zero tag.
    pub fn key(tag: u64) -> (u64, u32, usize) {
        let window = (tag >> WCC_TAG_WINDOW_SHIFT).wrapping_sub(1);
        let stream = ((tag >> WCC_TAG_STREAM_SHIFT) & 0xff) as u32;
        let len = ((tag & WCC_TAG_LEN_MASK) as usize).min(WCC_WORD_BYTES);
        (window, stream, len)
    }
}

/// `struct ss_cp_state` (the lock word reads as 0 in a BPF_F_LOCK copy).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CpState {
    pub lock: u32,
    pub mode: u32,
    pub high_t_ns: u64,
    pub cur_window: u64,
    pub cur_sum: i64,
    pub cur_count: u64,
    pub ring_len: u32,
    pub ring_head: u32,
    pub ref_sum_n: i64,
    pub hist_len: u32,
    pub hist_head: u32,
    pub ring_sum: [i64; CP_REF_MAX],
    pub ring_count: [u64; CP_REF_MAX],
    pub ring_mean_n: [i64; CP_REF_MAX],
    pub hist: [i64; CP_HISTORY_MAX],
}

mirror!(
    StreamCfg,
    ss_stream,
    [op, user_only, window_ns, word_bytes_max, records_max, reference_windows, history, threshold_n, format, pad0]
);
mirror!(StreamStats, ss_stream_stats, [datagrams, records, malformed, passed, alerts, events_lost, pad0, pad1]);
mirror!(WcKey, ss_wc_key, [window, stream, len, word]);
mirror!(WccSlot, ss_wcc_slot, [tag, count, word]);
const _: () = assert!(std::mem::align_of::<WccSlot>() == 8 && WCC_WORD_BYTES % 8 == 0);
const _: () = assert!(WCC_WORD_BYTES <= WORD_KEY_BYTES && WCC_TAG_LEN_MASK >= WCC_WORD_BYTES as u64);
const _: () = assert!(STREAMS_MAX <= 256 && WCC_TAG_WINDOW_SHIFT >= WCC_TAG_STREAM_SHIFT + 8);
mirror!(
    CpState,
    ss_cp_state,
    [
        lock,
        mode,
        high_t_ns,
        cur_window,
        cur_sum,
        cur_count,
        ring_len,
        ring_head,
        ref_sum_n,
        hist_len,
        hist_head,
        ring_sum,
        ring_count,
        ring_mean_n,
        hist
    ]
);
// Ring-buffer records are read field by field at the header's offsets (parse_event).
const _: () = assert!(ss_ev_hdr::SIZE == 16 && ss_alert::hdr == 0 && ss_values::hdr == 0);

impl crate::abi::Plain for StreamCfg {}
impl crate::abi::Plain for WcKey {}

/// One drained word count: (window number, word bytes, count over all CPUs).
pub type WordCount = (u64, Vec<u8>, u64);

/// The change-point state, ordered: what user space needs to continue the stream.
#[derive(Clone, Debug, PartialEq)]
pub struct CpSnapshot {
    pub high_t_ns: u64,
    /// Current window number, if one is open.
    pub current: Option<u64>,
    pub cur_sum_micro: i64,
    pub cur_count: u64,
    /// (sum in micro-units, count) of the reference windows, oldest first.
    pub windows: Vec<(i64, u64)>,
    /// Raw values (micro-units), oldest first.
    pub history: Vec<i64>,
    /// 1: the kernel already passes everything to user space.
    pub mode: u32,
}

/// One ring-buffer record.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A change point: `value` and the state just before the re-arm.
    Alert { stream: u32, t_ns: u64, value_micro: i64, windows: Vec<(i64, u64)>, history: Vec<i64> },
    /// The values (micro-units) of one consumed datagram, in order.
    Values { stream: u32, t_ns: u64, values: Vec<i64> },
}

fn rd<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    rd::<4>(b, at).map(u32::from_ne_bytes)
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    rd::<8>(b, at).map(u64::from_ne_bytes)
}
fn i64_at(b: &[u8], at: usize) -> Option<i64> {
    rd::<8>(b, at).map(i64::from_ne_bytes)
}

/// Slots `len` entries of a ring of `cap` whose next write is `head`, oldest first.
fn ring_order(head: u32, len: u32, cap: u32) -> impl Iterator<Item = usize> {
    let cap = cap.max(1);
    let len = len.min(cap);
    let oldest = (head % cap + cap - len) % cap;
    (0..len).map(move |j| ((oldest + j) % cap) as usize)
}

/// Parses one ring-buffer record (`None`: unknown or short).
pub fn parse_event(b: &[u8]) -> Option<Event> {
    let ty = u32_at(b, ss_ev_hdr::r#type)?;
    let stream = u32_at(b, ss_ev_hdr::stream)?;
    let t_ns = u64_at(b, ss_ev_hdr::t_ns)?;
    match ty {
        EV_ALERT => {
            if b.len() < ss_alert::SIZE {
                return None;
            }
            let value_micro = i64_at(b, ss_alert::value)?;
            let (ring_len, ring_head) = (u32_at(b, ss_alert::ring_len)?, u32_at(b, ss_alert::ring_head)?);
            let (hist_len, hist_head) = (u32_at(b, ss_alert::hist_len)?, u32_at(b, ss_alert::hist_head)?);
            let (n, h) = (u32_at(b, ss_alert::reference_windows)?, u32_at(b, ss_alert::history)?);
            if n == 0 || n as usize > CP_REF_MAX || h as usize > CP_HISTORY_MAX {
                return None;
            }
            let windows = ring_order(ring_head, ring_len, n)
                .map(|i| Some((i64_at(b, ss_alert::ring_sum + i * 8)?, u64_at(b, ss_alert::ring_count + i * 8)?)))
                .collect::<Option<Vec<_>>>()?;
            let history = if h == 0 {
                Vec::new()
            } else {
                ring_order(hist_head, hist_len, h)
                    .map(|i| i64_at(b, ss_alert::hist + i * 8))
                    .collect::<Option<Vec<_>>>()?
            };
            Some(Event::Alert { stream, t_ns, value_micro, windows, history })
        }
        EV_VALUES => {
            let n = u32_at(b, ss_values::n)? as usize;
            if n > VALUES_MAX {
                return None;
            }
            let values = (0..n).map(|i| i64_at(b, ss_values::v + i * 8)).collect::<Option<Vec<_>>>()?;
            Some(Event::Values { stream, t_ns, values })
        }
        _ => None,
    }
}

/// micro-units → f64: the nearest double to `micro / 10^6`, the same number `str::parse` gives
/// for the decimal text it came from (both operands are exact doubles: |micro| < 2^53).
pub fn micro_to_f64(micro: i64) -> f64 {
    micro as f64 / FIXED_SCALE as f64
}

/// `threshold` in 10^-9 units, if the kernel can test against it exactly enough (finite, > 0,
/// at most 10^8; rounded to the nearest 10^-9).
pub fn threshold_n(threshold: f64) -> Option<u64> {
    if !(threshold.is_finite() && threshold > 0.0 && threshold <= 1e8) {
        return None;
    }
    Some((threshold * 1e9).round() as u64)
}

fn dup(fd: RawFd) -> Result<OwnedFd, FastPathError> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an fd we hold open; it returns a new fd we then own.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if n < 0 {
        return Err(FastPathError::Map { op: "dup map fd", error: io::Error::last_os_error() });
    }
    // SAFETY: `n` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// `max_entries` of the word-count cache for `cpus` possible CPUs: one table of WCC_SLOTS
/// slots per CPU.
pub(crate) fn wc_cache_entries(cpus: usize) -> Result<u32, FastPathError> {
    u32::try_from(cpus).ok().filter(|c| c.checked_mul(WCC_SLOTS).is_some()).ok_or_else(|| FastPathError::LoadRefused {
        detail: format!("{cpus} CPUs: the word-count cache would not fit a map"),
    })
}

/// A drain's counts by (window, word): the cache's and the map's add up here (wrapping).
type WindowCounts = std::collections::HashMap<(u64, Vec<u8>), u64>;

/// The `ss_wcc` array map, mapped into this process (every field accessed atomically: the
/// program writes it on every CPU): one table of `WCC_SLOTS` slots per CPU, seen as one slice.
struct WcCache {
    slots: MappedArray<WccSlot>,
}

impl WcCache {
    fn map(fd: RawFd, cpus: usize) -> Result<WcCache, FastPathError> {
        let slots = wc_cache_entries(cpus)? as usize * WCC_SLOTS as usize;
        Ok(WcCache { slots: MappedArray::map(fd, slots, "mmap word-count cache")? })
    }

    /// Takes every slot of `stream` holding a window below `before_window`, adding its count to
    /// `into` (wrapping: see the header). The order (count, then tag) is the one the program
    /// relies on: it never writes a slot whose tag is an older window, and claims only tag 0.
    fn take(&self, stream: u32, before_window: u64, into: &mut WindowCounts) {
        for c in self.slots.as_slice() {
            let tag = c.tag.load(Ordering::Acquire);
            if tag == 0 {
                continue;
            }
            let (window, s, len) = WccSlot::key(tag);
            if s != stream || window >= before_window {
                continue;
            }
            let mut word = Vec::with_capacity(WCC_WORD_BYTES);
            for w in &c.word {
                word.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
            word.truncate(len);
            let n = c.count.swap(0, Ordering::AcqRel);
            c.tag.store(0, Ordering::Release);
            let e = into.entry((window, word)).or_insert(0);
            *e = e.wrapping_add(n);
        }
    }
}

/// The stream maps of one loaded program (descriptors of their own, so they outlive the
/// loader's handles) and its ring buffer (taken once, by the service's reader thread).
pub struct StreamKernel {
    streams: OwnedFd,
    stats: OwnedFd,
    wc: OwnedFd,
    /// The word-count cache (mmapped ss_wcc).
    wcc: WcCache,
    cp: OwnedFd,
    ports: OwnedFd,
    prog: OwnedFd,
    events: Mutex<Option<RingBuf<MapData>>>,
    cpus: usize,
    /// slot → port of the streams added.
    slots: Mutex<[Option<u16>; STREAMS_MAX as usize]>,
}

/// Process-wide: the stream side of every program attached through [`FastPath`], by ifindex.
static REGISTRY: Mutex<Vec<(u32, Weak<StreamKernel>)>> = Mutex::new(Vec::new());

pub(crate) fn register(ifindex: u32, k: &Arc<StreamKernel>) {
    let mut r = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    r.retain(|(i, w)| *i != ifindex && w.strong_count() > 0);
    r.push((ifindex, Arc::downgrade(k)));
}

pub(crate) fn unregister(ifindex: u32) {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner).retain(|(i, _)| *i != ifindex);
}

/// The stream engine's hold on an interface: the shared program's maps, and the attachment if
/// this handle made it (then dropping the handle detaches).
pub struct StreamAttach {
    pub kernel: Arc<StreamKernel>,
    own: Option<FastPath>,
    /// How the program is attached, or that it is the KV fast path's.
    pub how: String,
}

impl StreamAttach {
    /// Whether this handle attached the program itself (no KV fast path on the interface).
    pub fn owns_program(&self) -> bool {
        self.own.is_some()
    }
}

impl StreamKernel {
    pub(crate) fn new(
        ebpf: &mut aya::Ebpf,
        ports_fd: RawFd,
        prog_fd: RawFd,
        cpus: usize,
    ) -> Result<StreamKernel, FastPathError> {
        let fd_of = |ebpf: &aya::Ebpf, name: &str| -> Result<OwnedFd, FastPathError> {
            use std::os::fd::AsFd;
            let map =
                ebpf.map(name).ok_or_else(|| FastPathError::LoadRefused { detail: format!("map {name} missing") })?;
            let d = match map {
                aya::maps::Map::Array(d) | aya::maps::Map::PerCpuArray(d) | aya::maps::Map::PerCpuHashMap(d) => d,
                _ => return Err(FastPathError::LoadRefused { detail: format!("map {name} has the wrong type") }),
            };
            dup(d.fd().as_fd().as_raw_fd())
        };
        let streams = fd_of(ebpf, MAP_STREAMS)?;
        let stats = fd_of(ebpf, MAP_STREAM_STATS)?;
        let wc = fd_of(ebpf, MAP_WORDCOUNT)?;
        let wcc = WcCache::map(fd_of(ebpf, MAP_WC_CACHE)?.as_raw_fd(), cpus)?;
        let cp = fd_of(ebpf, MAP_CHANGEPOINT)?;
        let events = ebpf
            .take_map(MAP_EVENTS)
            .ok_or_else(|| FastPathError::LoadRefused { detail: format!("map {MAP_EVENTS} missing") })?;
        let events = RingBuf::try_from(events)
            .map_err(|e| FastPathError::LoadRefused { detail: format!("{MAP_EVENTS}: {e}") })?;
        Ok(StreamKernel {
            streams,
            stats,
            wc,
            wcc,
            cp,
            ports: dup(ports_fd)?,
            prog: dup(prog_fd)?,
            events: Mutex::new(Some(events)),
            cpus,
            slots: Mutex::new([None; STREAMS_MAX as usize]),
        })
    }

    /// The program on `iface`: the KV fast path's if this process attached it there, else a
    /// fresh attachment of the same program serving no tenant.
    pub fn attach(iface: &str) -> Result<StreamAttach, FastPathError> {
        let ifindex = crate::if_index(iface)?;
        let found = REGISTRY
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(i, _)| *i == ifindex)
            .and_then(|(_, w)| w.upgrade());
        if let Some(kernel) = found {
            return Ok(StreamAttach { kernel, own: None, how: "shared with the KV fast path".into() });
        }
        // The smallest item map: this attachment serves streams only.
        let fp = FastPath::attach_multi(iface, 1)?;
        let kernel = fp.kernel().streams().clone();
        let how = match fp.mode() {
            AttachMode::Native => "native XDP".to_string(),
            AttachMode::Generic { .. } => "generic (SKB) XDP".to_string(),
        };
        Ok(StreamAttach { kernel, own: Some(fp), how })
    }

    /// Serve stream `slot` on `udp_port` with `cfg` (its kernel state is reset).
    pub fn add_stream(&self, slot: u32, udp_port: u16, cfg: StreamCfg) -> Result<(), FastPathError> {
        use crate::abi::Plain;
        if slot >= STREAMS_MAX || udp_port == 0 {
            return Err(FastPathError::BadConfig { detail: format!("stream slot {slot} / port {udp_port}") });
        }
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let mut cur = [0u8; 4];
        let found = sys::map_lookup(self.ports.as_raw_fd(), u32::from(udp_port).as_bytes(), &mut cur)
            .map_err(|error| FastPathError::Map { op: "ports lookup", error })?;
        if found && u32::from_ne_bytes(cur) != 0 {
            return Err(FastPathError::BadConfig {
                detail: format!("UDP port {udp_port} is already served by the fast path"),
            });
        }
        let zero_state = vec![0u8; size_of::<CpState>()];
        sys::map_update(self.cp.as_raw_fd(), slot.as_bytes(), &zero_state, sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "changepoint reset", error })?;
        sys::map_update(self.streams.as_raw_fd(), slot.as_bytes(), cfg.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "streams update", error })?;
        let v = PORT_STREAM | slot;
        sys::map_update(self.ports.as_raw_fd(), u32::from(udp_port).as_bytes(), v.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "ports update", error })?;
        if let Some(s) = slots.get_mut(slot as usize) {
            *s = Some(udp_port);
        }
        Ok(())
    }

    /// Stop serving stream `slot` (its port passes again).
    pub fn remove_stream(&self, slot: u32) -> Result<(), FastPathError> {
        use crate::abi::Plain;
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(port) = slots.get_mut(slot as usize).and_then(Option::take) else { return Ok(()) };
        sys::map_update(self.ports.as_raw_fd(), u32::from(port).as_bytes(), 0u32.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "ports update", error })?;
        let off = StreamCfg::default();
        sys::map_update(self.streams.as_raw_fd(), slot.as_bytes(), off.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "streams update", error })
    }

    /// Make the kernel pass every datagram of `slot` to user space from now on (keeps the rest
    /// of its configuration).
    pub fn set_user_only(&self, slot: u32) -> Result<(), FastPathError> {
        use crate::abi::Plain;
        let mut buf = [0u8; size_of::<StreamCfg>()];
        sys::map_lookup(self.streams.as_raw_fd(), slot.as_bytes(), &mut buf)
            .map_err(|error| FastPathError::Map { op: "streams lookup", error })?;
        // SAFETY: buf holds size_of::<StreamCfg>() bytes; StreamCfg is plain integers.
        let mut cfg: StreamCfg = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
        cfg.user_only = 1;
        sys::map_update(self.streams.as_raw_fd(), slot.as_bytes(), cfg.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "streams update", error })
    }

    /// Counters of `slot`, summed over CPUs.
    pub fn stats(&self, slot: u32) -> Result<StreamStats, FastPathError> {
        use crate::abi::Plain;
        let stride = size_of::<StreamStats>();
        let mut buf = vec![0u8; stride * self.cpus];
        sys::map_lookup(self.stats.as_raw_fd(), slot.as_bytes(), &mut buf)
            .map_err(|error| FastPathError::Map { op: "stream stats", error })?;
        let mut s = [0u64; 8];
        for cpu in buf.chunks_exact(stride) {
            for (i, v) in s.iter_mut().enumerate() {
                *v = v.wrapping_add(u64_at(cpu, i * 8).unwrap_or(0));
            }
        }
        Ok(StreamStats {
            datagrams: s[0],
            records: s[1],
            malformed: s[2],
            passed: s[3],
            alerts: s[4],
            events_lost: s[5],
            pad0: 0,
            pad1: 0,
        })
    }

    /// Takes (reads and deletes) every word count of `slot` in windows below `before_window`:
    /// (window, word, count summed over CPUs and over the cache and the map), one entry per
    /// (window, word). Bounded by the map's size (two passes' worth). On an error the counts
    /// already taken come back with it (they are no longer in the kernel).
    pub fn drain_wordcount(&self, slot: u32, before_window: u64) -> (Vec<WordCount>, Option<FastPathError>) {
        let mut merged = WindowCounts::new();
        let err = self.drain_into(slot, before_window, &mut merged).err();
        if err.is_none() {
            self.wcc.take(slot, before_window, &mut merged);
        }
        // A datagram's undo can leave one place below zero (wrapped) and the other above: only
        // the sum is a count. It is never negative, so the wrapped sum is the count.
        let out = merged.into_iter().filter(|(_, n)| *n != 0).map(|((w, word), n)| (w, word, n)).collect();
        (out, err)
    }

    fn drain_into(&self, slot: u32, before_window: u64, out: &mut WindowCounts) -> Result<(), FastPathError> {
        let fd = self.wc.as_raw_fd();
        let kb = size_of::<WcKey>();
        let mut cur = vec![0u8; kb];
        let mut next = vec![0u8; kb];
        let mut val = vec![0u8; 8 * self.cpus];
        let mut have =
            sys::map_next_key(fd, None, &mut cur).map_err(|error| FastPathError::Map { op: "wc iterate", error })?;
        let mut steps = 0u64;
        while have && steps < 2 * u64::from(WC_ENTRIES) {
            steps += 1;
            let more = sys::map_next_key(fd, Some(&cur), &mut next)
                .map_err(|error| FastPathError::Map { op: "wc iterate", error })?;
            let window = u64_at(&cur, 0).unwrap_or(u64::MAX);
            let stream = u32_at(&cur, 8).unwrap_or(u32::MAX);
            let len = (u32_at(&cur, 12).unwrap_or(0) as usize).min(WORD_KEY_BYTES);
            if stream == slot && window < before_window {
                let found = sys::map_lookup(fd, &cur, &mut val)
                    .map_err(|error| FastPathError::Map { op: "wc lookup", error })?;
                sys::map_delete(fd, &cur).map_err(|error| FastPathError::Map { op: "wc delete", error })?;
                if found {
                    let n: u64 = val.chunks_exact(8).map(|c| u64_at(c, 0).unwrap_or(0)).fold(0, u64::wrapping_add);
                    let e = out.entry((window, cur.get(16..16 + len).unwrap_or(&[]).to_vec())).or_insert(0);
                    *e = e.wrapping_add(n);
                }
            }
            have = more;
            std::mem::swap(&mut cur, &mut next);
        }
        Ok(())
    }

    /// The change-point state of `slot`, read under its lock, rings ordered.
    pub fn cp_snapshot(&self, slot: u32, reference_windows: u32, history: u32) -> Result<CpSnapshot, FastPathError> {
        use crate::abi::Plain;
        let mut buf = vec![0u8; size_of::<CpState>()];
        sys::map_lookup_flags(self.cp.as_raw_fd(), slot.as_bytes(), &mut buf, BPF_F_LOCK)
            .map_err(|error| FastPathError::Map { op: "changepoint lookup", error })?;
        // SAFETY: buf holds size_of::<CpState>() bytes written by the kernel; CpState is plain
        // integers (any bit pattern valid); read_unaligned copes with the Vec's alignment.
        let st: CpState = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
        let n = reference_windows.clamp(1, CP_REF_MAX as u32);
        let windows = ring_order(st.ring_head, st.ring_len, n)
            .map(|i| (st.ring_sum.get(i).copied().unwrap_or(0), st.ring_count.get(i).copied().unwrap_or(0)))
            .collect();
        let h = history.min(CP_HISTORY_MAX as u32);
        let history = if h == 0 {
            Vec::new()
        } else {
            ring_order(st.hist_head, st.hist_len, h).map(|i| st.hist.get(i).copied().unwrap_or(0)).collect()
        };
        Ok(CpSnapshot {
            high_t_ns: st.high_t_ns,
            current: st.cur_window.checked_sub(1),
            cur_sum_micro: st.cur_sum,
            cur_count: st.cur_count,
            windows,
            history,
            mode: st.mode,
        })
    }

    /// The ring buffer of alerts and value batches (once: the reader thread owns it).
    pub fn take_events(&self) -> Option<RingBuf<MapData>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Run the program on `packet` with BPF_PROG_TEST_RUN (fixtures).
    pub fn test_run(&self, packet: &[u8]) -> Result<u32, FastPathError> {
        Ok(self.test_run_ns(packet, 1)?.0)
    }

    /// Run the program `repeat` times on `packet` (the kernel's own loop); returns the verdict
    /// and the kernel-timed mean ns per run (examples/stream_cost).
    pub fn test_run_ns(&self, packet: &[u8], repeat: u32) -> Result<(u32, u32), FastPathError> {
        let r = sys::prog_test_run(self.prog.as_raw_fd(), packet, repeat.max(1))
            .map_err(|error| FastPathError::Map { op: "BPF_PROG_TEST_RUN", error })?;
        Ok((r.retval, r.duration_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_are_ordered_oldest_first() {
        assert_eq!(ring_order(2, 3, 3).collect::<Vec<_>>(), vec![2, 0, 1]);
        assert_eq!(ring_order(2, 2, 4).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(ring_order(0, 0, 4).count(), 0);
    }

    #[test]
    fn micro_conversion_matches_parse() {
        for (m, s) in
            [(10_123_000i64, "10.123"), (-1, "-0.000001"), (100_000, "0.1"), (99_999_999_999_999, "99999999.999999")]
        {
            assert_eq!(micro_to_f64(m), s.parse::<f64>().unwrap(), "{s}");
        }
        assert_eq!(threshold_n(5.0), Some(5_000_000_000));
        assert_eq!(threshold_n(f64::NAN), None);
    }
}
