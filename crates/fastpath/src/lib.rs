//! slipstream-fastpath: Slipstream's kernel fast path. An XDP program (`bpf/xdp_fastpath.c`)
//! answers memcached UDP `get`/`gets` (up to 8 keys) and `mg <key> v [f]` hits from a BPF hash
//! map in the driver's receive hook, before the network stack or user space see the packet. This
//! crate builds that program (build.rs runs clang), loads and attaches it, and gives the server a
//! small API to fill, invalidate and flush the kernel cache and read its counters.
//!
//! Not for: deciding what to cache or when (the server does, under its store's shard locks), or
//! answering misses (the program passes them up unchanged and the user-space server answers).
//!
//! # Why aya (not libbpf-rs)
//! aya is pure Rust: it parses the ELF/BTF, relocates and loads without linking the C libbpf,
//! so the only C build step is clang compiling the BPF program itself. libbpf-rs would pull in a
//! vendored C build of libbpf (plus libelf/zlib) on every build. Map writes are done with raw
//! bpf(2) calls (`sys.rs`) because they must take `&self` from many server threads at once.
//!
//! # Coherence: user space fills, every write invalidates first
//! The guarantee: *a GET answered by the kernel never returns a value older than the newest write
//! the server has acknowledged.* It rests on three rules the server must follow:
//! 1. **Fill** ([`FastPath::fill`]) only from a read that found the item, while still holding that
//!    item's shard lock.
//! 2. **Invalidate** ([`FastPath::invalidate`]) in every command that can change an item (set,
//!    add, replace, append, prepend, cas, delete, incr, decr, touch, gat/gats, ms, md, ma, over
//!    any transport), while holding the shard lock, *before* changing the store and before the
//!    reply is sent.
//! 3. **flush_all** calls [`FastPath::flush_all`] after the store's flush is in force and before
//!    the reply. A delayed `flush_all N` also flushes the kernel at once, and the store then
//!    fills nothing until the flush is in force (so nothing the flush will hide can be in the
//!    kernel when it does). A fill racing with a flush is caught by a flush generation that
//!    the store bumps between its flush state and the kernel flush: a fill that sees the
//!    generation change under it deletes what it just filled.
//!
//! The server implements these rules once, inside the store (`slipstream_store::KernelCache`,
//! installed by `slipstream_server::fastpath`), so every protocol path — text, meta, binary,
//! TCP or UDP — and every internal change (eviction, expiry, unlink) is covered. A per-item
//! bit remembers whether the kernel may hold an item, so writes to items it does not hold cost
//! no syscall; eviction, expiry and unlink of an item with the bit set invalidate too.
//!
//! Rules 1 and 2 serialise fill and write per key on the shard lock, so a fill can never put back
//! a value that a write already replaced: either the fill ran first (and the write deletes it) or
//! the write ran first (and the fill copies the new value). A kernel reader that looked the old
//! entry up before the delete is concurrent with the write (the write was not yet acknowledged),
//! which linearizability allows; one that starts after the acknowledgement cannot find it.
//!
//! The alternative the issue offered, a TC egress program that fills the map from the server's
//! replies, is what BMC does and is why BMC can serve stale data: the reply to a GET is seen on
//! egress *after* the store lock was released, so a write can land between the read and the
//! egress fill, and the fill then reinstalls the old value after the write's invalidation. Fixing
//! that needs version numbers carried through the packet path; filling directly under the lock
//! needs nothing, and also works for TCP reads, multi-gets and large replies that TC would have to
//! reassemble.
//!
//! flush_all uses an epoch instead of deleting every entry atomically (impossible on a hash map):
//! every value records the epoch it was filled in, the program treats any other epoch as a miss,
//! and bumping the epoch is one array-map write. A fill that read the old epoch just before the
//! bump therefore lands dead. Entries are then deleted in the background of the call.
//!
//! TTL: each value carries an absolute CLOCK_MONOTONIC expiry (what `bpf_ktime_get_ns` reads);
//! the program treats `now >= expiry` as a miss. Use [`clock_monotonic_ns`] to convert.
//!
//! Map key: the items map is keyed by a 64-bit hash of the key bytes plus their length
//! (`abi::key_hash`, computed the same way by the program over only the key's bytes), not by
//! the key itself: the kernel then hashes and compares 16 bytes per lookup instead of a 260-byte
//! zero-padded key buffer. The value carries the full key (its `VALUE <key> ...` segment) and the
//! program checks it, so a colliding entry is a miss, never another key's value. A fill of a
//! colliding key replaces the other key's entry and an invalidate deletes whatever sits at the
//! hash; both can only turn hits into misses, so the coherence rules above hold unchanged.
//!
//! Memory: the items map is a `BPF_F_NO_PREALLOC` hash (memory grows with use), at most
//! `entries_max` items of 1464 bytes of value each. Whole elements: since Linux 6.1 a freed
//! element is reused by the next insert without an RCU grace period, so every delete and insert
//! goes through a grace period of our own ([`reuse_gate`]: the program counts itself per CPU
//! while it may hold an item; an insert after a free waits until every CPU's count was seen at
//! 0), and XDP copies one item whole, never a reused or half-rewritten element. Items whose `gets` reply would not fit one
//! datagram are not cached. When the map is full, new fills are skipped. The map is shared by all
//! tenants (no per-tenant entry quota in the kernel; the per-tenant memory limits are the
//! stores').
//!
//! # Tenants
//! The program serves up to `abi::TENANTS_MAX` tenants, each on its own UDP port
//! ([`Kernel::add_tenant`]; a port with no tenant passes untouched). The tenant's slot is part of
//! the map key, so an item filled for one tenant ([`Kernel::fill_slot`]) is never found by a
//! request to another tenant's port. Each slot has its own flush epoch ([`Kernel::flush_slot`]);
//! an item is live only while it carries the global epoch plus its slot's epoch, so both the
//! global [`Kernel::flush_all`] and a per-tenant flush kill it for good. A *shaped* tenant is
//! answered only while its allowance (set by user space from its token buckets,
//! [`Kernel::set_allowance`]) pays for the request and reply bytes; otherwise the request goes
//! to user space, which shapes it. What XDP spent is read and zeroed atomically by
//! [`Kernel::take_spent`] through the mmapped tenant table. [`Kernel::load`] /
//! [`FastPath::attach`] keep the single-tenant behaviour: one unshaped tenant in slot 0.

pub mod abi;
/// The test oracle: packet fixtures and the pure-Rust model of the program. Tests, examples and
/// benchmarks only (feature `test-oracle`); the production loader does not carry it.
#[cfg(feature = "test-oracle")]
pub mod fixtures;
/// The load generator's kernel side (`bpf/xdp_gen.c`); only `slipstream-loadgen` enables it
/// (feature `traffic-gen`).
#[cfg(feature = "traffic-gen")]
pub mod gen;
pub mod item;
mod mapped;
#[cfg(feature = "test-oracle")]
pub mod model;
mod netlink;
pub mod reuse_gate;
pub mod stream;
mod sys;

pub use item::NotCacheable;

/// XDP verdicts the program returns (numeric values are the kernel's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Drop = 1,
    Pass = 2,
    Tx = 3,
}

impl Verdict {
    pub fn from_retval(v: u32) -> Option<Verdict> {
        match v {
            1 => Some(Verdict::Drop),
            2 => Some(Verdict::Pass),
            3 => Some(Verdict::Tx),
            _ => None,
        }
    }
}

use aya::programs::{Xdp, XdpFlags};
use aya::{Ebpf, EbpfLoader};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use mapped::MappedArray;
use reuse_gate::ReuseGate;
pub use reuse_gate::{GateCounters, GRACE_WAIT_NS_MAX};

/// The compiled XDP object, built by build.rs from `bpf/xdp_fastpath.c`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_fastpath.o"));
/// The do-nothing XDP_PASS object (`bpf/xdp_pass.c`), for test topologies.
static PASS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_pass.o"));

/// What to attach with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathConfig {
    /// memcached UDP port the program answers on (destination port of requests).
    pub udp_port: u16,
    /// Most items in the kernel cache (each up to 1464 bytes of value, allocated on use).
    pub entries_max: u32,
}

impl Default for FastPathConfig {
    fn default() -> Self {
        FastPathConfig { udp_port: 11211, entries_max: abi::ENTRIES_DEFAULT }
    }
}

/// Most `entries_max` accepted: about 1.8 GiB of kernel memory in the worst case (~1.7 KiB per
/// element with hash overhead), and only if that many items are actually filled.
pub const ENTRIES_MAX_LIMIT: u32 = 1 << 20;

/// Why the fast path could not be set up or used.
#[derive(Debug)]
pub enum FastPathError {
    /// Not root / lacking CAP_BPF+CAP_NET_ADMIN (or CAP_PERFMON for the helpers used).
    NotPermitted { detail: String },
    /// No such network interface.
    InterfaceMissing { name: String },
    /// The configuration is out of range.
    BadConfig { detail: String },
    /// The kernel refused to load the program or create its maps (verifier log included).
    LoadRefused { detail: String },
    /// The kernel refused to attach the program to the interface.
    AttachRefused { detail: String },
    /// A map operation failed (coherence-relevant for `invalidate`: the caller must not
    /// acknowledge the write).
    Map { op: &'static str, error: io::Error },
}

impl fmt::Display for FastPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FastPathError::NotPermitted { detail } => {
                write!(f, "XDP fast path needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON): {detail}")
            }
            FastPathError::InterfaceMissing { name } => write!(f, "no network interface named {name:?}"),
            FastPathError::BadConfig { detail } => write!(f, "bad fast path configuration: {detail}"),
            FastPathError::LoadRefused { detail } => write!(f, "kernel refused the XDP program: {detail}"),
            FastPathError::AttachRefused { detail } => write!(f, "kernel refused to attach XDP: {detail}"),
            FastPathError::Map { op, error } => write!(f, "BPF map {op} failed: {error}"),
        }
    }
}

impl std::error::Error for FastPathError {}

/// How the program ended up attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (native XDP).
    Native,
    /// Generic (SKB) mode, because native attach failed for the reason given. Works everywhere
    /// but saves much less (the skb is already allocated).
    Generic { native_error: String },
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachMode::Native => write!(f, "native XDP"),
            AttachMode::Generic { native_error } => write!(
                f,
                "generic (SKB) XDP: native mode was refused ({native_error}); the fast path works but gains less"
            ),
        }
    }
}

/// Result of a fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filled {
    Cached,
    NotCacheable(NotCacheable),
    /// The map is at `entries_max`; the item is served by user space.
    MapFull,
    /// Programs still held items freed before it and did not finish within
    /// `GRACE_WAIT_NS_MAX` (see `reuse_gate`); the item is served by user space.
    Deferred,
}

/// Counter totals over all CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastPathCounters {
    /// get-like requests answered by the kernel.
    pub fastpath_hits: u64,
    /// get-like requests the kernel passed to user space.
    pub fastpath_misses: u64,
    /// get-like requests of shaped tenants passed to user space for lack of allowance.
    pub fastpath_throttled: u64,
    /// `invalidate` calls for cacheable keys plus `flush_all` calls.
    pub fastpath_invalidations: u64,
    /// Inserts that first waited for readers of freed elements ([`reuse_gate`]).
    pub fastpath_fill_graces: u64,
    /// Fills skipped because such readers did not finish in time.
    pub fastpath_fills_deferred: u64,
}

/// Current CLOCK_MONOTONIC in ns, absolute (the kernel's epoch: the clock `bpf_ktime_get_ns`
/// reads), for expiry times and any stamp compared across processes. The one home of this clock;
/// not `slipstream_tenancy::since_start_ns`, whose epoch is the process's first call.
pub fn clock_monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Does any error in `e`'s source chain carry errno `code`?
fn has_errno(e: &(dyn std::error::Error + 'static), code: i32) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if io.raw_os_error() == Some(code) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        s.push_str(": ");
        s.push_str(&err.to_string());
        cur = err.source();
    }
    s
}

fn refusal(e: &(dyn std::error::Error + 'static), attach: bool) -> FastPathError {
    let detail = chain(e);
    if has_errno(e, libc::EPERM) || has_errno(e, libc::EACCES) && !is_root() {
        FastPathError::NotPermitted { detail }
    } else if attach {
        FastPathError::AttachRefused { detail }
    } else {
        FastPathError::LoadRefused { detail }
    }
}

/// The loaded (not necessarily attached) program and its maps. [`FastPath`] wraps one attached
/// to an interface; fixtures use one directly with BPF_PROG_TEST_RUN.
pub struct Kernel {
    ebpf: Ebpf,
    items_fd: RawFd,
    config_fd: RawFd,
    counters_fd: RawFd,
    ports_fd: RawFd,
    tstats_fd: RawFd,
    prog_fd: RawFd,
    /// The mmapped `ss_tenants` map (a mapping holds its own reference to the map, so the
    /// drop order of this and `ebpf` does not matter).
    tenants: MappedArray<abi::Tenant>,
    /// Orders frees and inserts of `ss_items` around the readers' grace period.
    gate: ReuseGate,
    /// slot → UDP port of the tenants added (the lock orders add/remove, never a fill).
    ports: Mutex<[Option<u16>; abi::TENANTS_MAX as usize]>,
    /// Global flush epoch (mirrored into `ss_config`).
    epoch: AtomicU64,
    /// Set by [`Kernel::disable`]: later config writes keep the program off.
    disabled: AtomicBool,
    invalidations: AtomicU64,
    cpus: usize,
    /// The stream engine's maps of this program (see [`stream`]).
    streams: std::sync::Arc<stream::StreamKernel>,
}

/// Per-tenant counters over all CPUs (cumulative since load).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCounters {
    pub hits: u64,
    pub misses: u64,
    /// get-like requests passed up because the tenant's allowance could not pay.
    pub throttled: u64,
}

fn slot_error(slot: u32) -> FastPathError {
    FastPathError::BadConfig { detail: format!("tenant slot {slot} not in 0..{}", abi::TENANTS_MAX) }
}

impl Kernel {
    /// Load the program with fresh (unpinned, empty) maps, serving one unshaped tenant in slot
    /// 0 on `cfg.udp_port`: the single-tenant fast path.
    pub fn load(cfg: FastPathConfig) -> Result<Kernel, FastPathError> {
        if cfg.udp_port == 0 {
            return Err(FastPathError::BadConfig { detail: "udp_port 0".into() });
        }
        let k = Kernel::load_multi(cfg.entries_max)?;
        k.add_tenant(0, cfg.udp_port, false)?;
        Ok(k)
    }

    /// Load the program with fresh maps and no tenant yet (every packet passes until
    /// [`Kernel::add_tenant`]).
    pub fn load_multi(entries_max: u32) -> Result<Kernel, FastPathError> {
        if entries_max == 0 || entries_max > ENTRIES_MAX_LIMIT {
            return Err(FastPathError::BadConfig {
                detail: format!("entries_max {entries_max} not in 1..={ENTRIES_MAX_LIMIT}"),
            });
        }
        let cpus = aya::util::nr_cpus().map_err(|(what, error)| FastPathError::LoadRefused {
            detail: format!("cannot count possible CPUs ({what}): {error}"),
        })?;
        let mut ebpf = EbpfLoader::new()
            .set_max_entries(abi::MAP_ITEMS, entries_max)
            .set_max_entries(stream::MAP_WC_CACHE, stream::wc_cache_entries(cpus)?)
            .load(OBJECT)
            .map_err(|e| refusal(&e, false))?;
        let prog: &mut Xdp = ebpf
            .program_mut(abi::PROG_XDP)
            .ok_or_else(|| FastPathError::LoadRefused { detail: "program missing from object".into() })?
            .try_into()
            .map_err(|e| refusal(&e, false))?;
        prog.load().map_err(|e| refusal(&e, false))?;
        let prog_fd = prog.fd().map_err(|e| refusal(&e, false))?.as_fd().as_raw_fd();
        let map_fd = |ebpf: &Ebpf, name: &str| -> Result<RawFd, FastPathError> {
            let map =
                ebpf.map(name).ok_or_else(|| FastPathError::LoadRefused { detail: format!("map {name} missing") })?;
            let data = match map {
                aya::maps::Map::HashMap(d) | aya::maps::Map::Array(d) | aya::maps::Map::PerCpuArray(d) => d,
                _ => return Err(FastPathError::LoadRefused { detail: format!("map {name} has the wrong type") }),
            };
            Ok(data.fd().as_fd().as_raw_fd())
        };
        let items_fd = map_fd(&ebpf, abi::MAP_ITEMS)?;
        let config_fd = map_fd(&ebpf, abi::MAP_CONFIG)?;
        let counters_fd = map_fd(&ebpf, abi::MAP_COUNTERS)?;
        let ports_fd = map_fd(&ebpf, abi::MAP_PORTS)?;
        let tstats_fd = map_fd(&ebpf, abi::MAP_TENANT_STATS)?;
        let tenants = MappedArray::map(map_fd(&ebpf, abi::MAP_TENANTS)?, abi::TENANTS_MAX as usize, "mmap tenants")?;
        let readers =
            MappedArray::map(map_fd(&ebpf, abi::MAP_READERS)?, abi::READER_CPUS_MAX as usize, "mmap readers")?;
        let gate = ReuseGate::new(readers, cpus);
        let streams = std::sync::Arc::new(stream::StreamKernel::new(&mut ebpf, ports_fd, prog_fd, cpus)?);
        let k = Kernel {
            streams,
            ebpf,
            items_fd,
            config_fd,
            counters_fd,
            ports_fd,
            tstats_fd,
            prog_fd,
            tenants,
            gate,
            ports: Mutex::new([None; abi::TENANTS_MAX as usize]),
            epoch: AtomicU64::new(1),
            disabled: AtomicBool::new(false),
            invalidations: AtomicU64::new(0),
            cpus,
        };
        k.write_config(1)?;
        Ok(k)
    }

    /// The stream engine's side of this program (stream slots, word counts, events).
    pub fn streams(&self) -> &std::sync::Arc<stream::StreamKernel> {
        &self.streams
    }

    fn write_config(&self, epoch: u64) -> Result<(), FastPathError> {
        use abi::Plain;
        let enabled = u16::from(!self.disabled.load(Ordering::SeqCst));
        let c = abi::Config { enabled, epoch, ..Default::default() };
        sys::map_update(self.config_fd, 0u32.as_bytes(), c.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "config update", error })
    }

    fn tenant(&self, slot: u32) -> Result<&abi::Tenant, FastPathError> {
        self.tenants.get(slot as usize).ok_or_else(|| slot_error(slot))
    }

    fn write_port(&self, port: u16, slot_plus1: u32) -> Result<(), FastPathError> {
        use abi::Plain;
        sys::map_update(self.ports_fd, u32::from(port).as_bytes(), slot_plus1.as_bytes(), sys::BPF_ANY)
            .map_err(|error| FastPathError::Map { op: "ports update", error })
    }

    /// Serve the tenant in `slot` (0..TENANTS_MAX) on UDP port `udp_port`. A `shaped` tenant
    /// starts with a zero allowance (every request goes up) until [`Kernel::set_allowance`].
    /// Calling it again for the same slot and port only changes `shaped`. Errors: slot out of
    /// range, port 0, the slot serving another port, or the port serving another slot.
    pub fn add_tenant(&self, slot: u32, udp_port: u16, shaped: bool) -> Result<(), FastPathError> {
        let t = self.tenant(slot)?;
        if udp_port == 0 {
            return Err(FastPathError::BadConfig { detail: "udp_port 0".into() });
        }
        let mut ports = self.ports.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(other) = ports.iter().position(|p| *p == Some(udp_port)) {
            if other as u32 != slot {
                return Err(FastPathError::BadConfig {
                    detail: format!("UDP port {udp_port} already serves tenant slot {other}"),
                });
            }
        }
        match ports.get(slot as usize).copied().flatten() {
            Some(p) if p != udp_port => {
                return Err(FastPathError::BadConfig {
                    detail: format!("tenant slot {slot} already serves UDP port {p}"),
                })
            }
            Some(_) => {
                // Same slot and port: only the shaping changes.
                t.shaped.store(u32::from(shaped), Ordering::SeqCst);
                return Ok(());
            }
            None => {}
        }
        t.allow_in_bytes.store(0, Ordering::SeqCst);
        t.allow_out_bytes.store(0, Ordering::SeqCst);
        t.spent_requests.store(0, Ordering::SeqCst);
        t.spent_in_bytes.store(0, Ordering::SeqCst);
        t.spent_out_bytes.store(0, Ordering::SeqCst);
        t.shaped.store(u32::from(shaped), Ordering::SeqCst);
        // The epoch is never reset: entries of an earlier tenant in this slot stay dead.
        t.active.store(1, Ordering::SeqCst);
        self.write_port(udp_port, slot + 1)?;
        if let Some(p) = ports.get_mut(slot as usize) {
            *p = Some(udp_port);
        }
        Ok(())
    }

    /// Stop serving the tenant in `slot`: its port passes from now on, and its entries are
    /// flushed (epoch bump, then deleted). No-op for a slot that serves nothing.
    pub fn remove_tenant(&self, slot: u32) -> Result<(), FastPathError> {
        let t = self.tenant(slot)?;
        let mut ports = self.ports.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(port) = ports.get(slot as usize).copied().flatten() else { return Ok(()) };
        self.write_port(port, 0)?;
        t.active.store(0, Ordering::SeqCst);
        t.shaped.store(0, Ordering::SeqCst);
        if let Some(p) = ports.get_mut(slot as usize) {
            *p = None;
        }
        drop(ports);
        self.flush_slot(slot)
    }

    /// The UDP port the tenant in `slot` is served on, if any.
    pub fn tenant_port(&self, slot: u32) -> Option<u16> {
        self.ports.lock().unwrap_or_else(PoisonError::into_inner).get(slot as usize).copied().flatten()
    }

    /// The flush epoch values filled now for `slot` carry (global + the slot's own, wrapping).
    pub fn epoch_of(&self, slot: u32) -> u64 {
        let own = self.tenants.get(slot as usize).map_or(0, |t| t.epoch.load(Ordering::SeqCst));
        self.epoch.load(Ordering::SeqCst).wrapping_add(own)
    }

    /// Cache an item for slot 0 (the single-tenant API): see [`Kernel::fill_slot`].
    pub fn fill(
        &self,
        key: &[u8],
        flags: u32,
        cas: u64,
        value: &[u8],
        expiry_ns: u64,
    ) -> Result<Filled, FastPathError> {
        self.fill_slot(0, key, flags, cas, value, expiry_ns)
    }

    /// Cache an item of the tenant in `slot`. `expiry_ns` is absolute CLOCK_MONOTONIC ns
    /// ([`clock_monotonic_ns`]), 0 = never. Call only while holding the item's shard lock after
    /// reading it (see crate docs).
    pub fn fill_slot(
        &self,
        slot: u32,
        key: &[u8],
        flags: u32,
        cas: u64,
        value: &[u8],
        expiry_ns: u64,
    ) -> Result<Filled, FastPathError> {
        if slot >= abi::TENANTS_MAX {
            return Err(slot_error(slot));
        }
        // The epoch is read before the value goes in: see flush_all.
        let epoch = self.epoch_of(slot);
        let item = match item::compose(key, flags, cas, value, expiry_ns, epoch) {
            Ok(it) => it,
            Err(why) => return Ok(Filled::NotCacheable(why)),
        };
        let Some(k) = abi::Key::for_tenant(key, slot) else { return Ok(Filled::NotCacheable(NotCacheable::Key)) };
        self.insert_item(&k, &item)
    }

    /// Put `item` under map key `k`, through the reuse gate: inserted as new when the key is
    /// absent (the usual case: the server fills only what the kernel does not hold), else
    /// replacing the element there (which frees the old one).
    fn insert_item(&self, k: &abi::Key, item: &abi::Item) -> Result<Filled, FastPathError> {
        use abi::Plain;
        let update = |flags| sys::map_update(self.items_fd, k.as_bytes(), item.as_bytes(), flags);
        let done = self.gate.insert(|| match update(sys::BPF_NOEXIST) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => (update(sys::BPF_ANY), true),
            r => (r, false),
        });
        match done {
            None => Ok(Filled::Deferred),
            Some(Ok(())) => Ok(Filled::Cached),
            Some(Err(e)) if e.raw_os_error() == Some(libc::E2BIG) || e.raw_os_error() == Some(libc::ENOMEM) => {
                Ok(Filled::MapFull)
            }
            Some(Err(error)) => Err(FastPathError::Map { op: "fill", error }),
        }
    }

    /// Tests only: file the item composed for `key` under the map key of `under` (slot 0), as a
    /// hash collision between the two would (the program must then miss on a get of `under`).
    #[doc(hidden)]
    pub fn fill_colliding(&self, under: &[u8], key: &[u8], value: &[u8]) -> Result<Filled, FastPathError> {
        let epoch = self.epoch_of(0);
        let item = match item::compose(key, 0, 1, value, 0, epoch) {
            Ok(it) => it,
            Err(why) => return Ok(Filled::NotCacheable(why)),
        };
        let Some(k) = abi::Key::new(under) else { return Ok(Filled::NotCacheable(NotCacheable::Key)) };
        self.insert_item(&k, &item)
    }

    /// Tests only: pretend a program on `cpu` holds an item it looked up (`hold`), or let it go,
    /// to check that inserts wait for it (see `reuse_gate`).
    #[doc(hidden)]
    pub fn simulate_reader(&self, cpu: usize, hold: bool) {
        self.gate.simulate_reader(cpu, hold);
    }

    /// How often inserts waited for readers, and gave up.
    pub fn gate_counters(&self) -> GateCounters {
        self.gate.counters()
    }

    /// Drop slot 0's kernel copy of `key`: see [`Kernel::invalidate_slot`].
    pub fn invalidate(&self, key: &[u8]) -> Result<(), FastPathError> {
        self.invalidate_slot(0, key)
    }

    /// Drop the kernel copy of `key` of the tenant in `slot`. Call while holding the key's
    /// shard lock, before changing the store. On `Err` the kernel may still serve the old
    /// value: fail the write.
    pub fn invalidate_slot(&self, slot: u32, key: &[u8]) -> Result<(), FastPathError> {
        use abi::Plain;
        if slot >= abi::TENANTS_MAX {
            return Err(slot_error(slot));
        }
        // Keys that can never be cached need no delete.
        let Some(k) = abi::Key::for_tenant(key, slot) else { return Ok(()) };
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        self.gate
            .free(|| sys::map_delete(self.items_fd, k.as_bytes()))
            .map(|_| ())
            .map_err(|error| FastPathError::Map { op: "invalidate", error })
    }

    /// Invalidate everything of every tenant at once (global epoch bump), then delete the
    /// entries.
    pub fn flush_all(&self) -> Result<(), FastPathError> {
        let new = self.epoch.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        self.write_config(new)?;
        self.delete_dead(None)
    }

    /// Invalidate everything of the tenant in `slot` at once (its epoch bump: one store into
    /// the mapped tenant table, seen by the program at once), then delete its entries. Other
    /// tenants' entries are untouched.
    pub fn flush_slot(&self, slot: u32) -> Result<(), FastPathError> {
        let t = self.tenant(slot)?;
        t.epoch.fetch_add(1, Ordering::SeqCst);
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        self.delete_dead(Some(slot))
    }

    /// Best-effort removal of the entries an epoch bump made dead (of `only` slot, or of all),
    /// to give their memory back. Entries of the current epoch (filled after the bump, while
    /// this runs) are kept: the server remembers which items it filled and would not offer a
    /// deleted one again until it changes. Bounded: at most two passes' worth of
    /// `ENTRIES_MAX_LIMIT` steps.
    fn delete_dead(&self, only: Option<u32>) -> Result<(), FastPathError> {
        let key_bytes = std::mem::size_of::<abi::Key>();
        let mut cur = vec![0u8; key_bytes];
        let mut next = vec![0u8; key_bytes];
        let mut value = vec![0u8; std::mem::size_of::<abi::Item>()];
        match sys::map_next_key(self.items_fd, None, &mut cur) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(error) => return Err(FastPathError::Map { op: "flush iterate", error }),
        }
        let word = |b: &[u8], at: usize| -> u64 {
            let mut w = [0u8; 8];
            if let Some(s) = b.get(at..at + 8) {
                w.copy_from_slice(s);
            }
            u64::from_ne_bytes(w)
        };
        for _ in 0..2 * ENTRIES_MAX_LIMIT {
            // Find the successor before deleting: a hash map restarts from its first key when
            // asked for the successor of a key it no longer has.
            let more = sys::map_next_key(self.items_fd, Some(&cur), &mut next)
                .map_err(|error| FastPathError::Map { op: "flush iterate", error })?;
            // The slot is the key's last u32, the epoch the value's second u64 (abi asserts
            // both offsets).
            let slot = (word(&cur, 8) >> 32) as u32;
            if only.map_or(true, |s| s == slot) {
                let found = sys::map_lookup(self.items_fd, &cur, &mut value)
                    .map_err(|error| FastPathError::Map { op: "flush lookup", error })?;
                if found && word(&value, 8) != self.epoch_of(slot) {
                    self.gate
                        .free(|| sys::map_delete(self.items_fd, &cur))
                        .map_err(|error| FastPathError::Map { op: "flush delete", error })?;
                }
            }
            if !more {
                return Ok(());
            }
            std::mem::swap(&mut cur, &mut next);
        }
        Ok(())
    }

    /// Stop answering anything (the program passes every packet up) without detaching: the
    /// last resort when an invalidation failed and coherence can no longer be promised. Stays
    /// off (later flushes do not turn it back on).
    pub fn disable(&self) -> Result<(), FastPathError> {
        self.disabled.store(true, Ordering::SeqCst);
        self.write_config(self.epoch.load(Ordering::SeqCst))
    }

    /// Requests, request bytes and reply bytes XDP answered for `slot` (shaped tenants only)
    /// since the last call. Each counter is swapped with 0, so an answer the program counts
    /// concurrently lands in this call or the next, never in neither.
    pub fn take_spent(&self, slot: u32) -> (u64, u64, u64) {
        match self.tenants.get(slot as usize) {
            Some(t) => (
                t.spent_requests.swap(0, Ordering::AcqRel),
                t.spent_in_bytes.swap(0, Ordering::AcqRel),
                t.spent_out_bytes.swap(0, Ordering::AcqRel),
            ),
            None => (0, 0, 0),
        }
    }

    /// What XDP may spend for the shaped tenant in `slot` from now on (replaces the previous
    /// allowance, whatever was left of it). Out-of-range slots are ignored.
    pub fn set_allowance(&self, slot: u32, ingress_bytes: u64, egress_bytes: u64) {
        if let Some(t) = self.tenants.get(slot as usize) {
            let clamp = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
            t.allow_in_bytes.store(clamp(ingress_bytes), Ordering::Release);
            t.allow_out_bytes.store(clamp(egress_bytes), Ordering::Release);
        }
    }

    /// The allowance left for `slot` (ingress, egress bytes); may be below zero by the
    /// concurrent overdraw the header describes.
    pub fn allowance(&self, slot: u32) -> (i64, i64) {
        self.tenants
            .get(slot as usize)
            .map_or((0, 0), |t| (t.allow_in_bytes.load(Ordering::Acquire), t.allow_out_bytes.load(Ordering::Acquire)))
    }

    fn percpu_sum(
        &self,
        fd: RawFd,
        idx: u32,
        stride: usize,
        field: usize,
        op: &'static str,
    ) -> Result<Vec<u64>, FastPathError> {
        use abi::Plain;
        // Per-CPU values come back at an 8-byte-rounded stride, one per possible CPU.
        let mut buf = vec![0u8; stride * self.cpus];
        sys::map_lookup(fd, idx.as_bytes(), &mut buf).map_err(|error| FastPathError::Map { op, error })?;
        let mut sums = vec![0u64; field];
        for cpu in buf.chunks_exact(stride) {
            for (i, s) in sums.iter_mut().enumerate() {
                let mut w = [0u8; 8];
                if let Some(b) = cpu.get(i * 8..i * 8 + 8) {
                    w.copy_from_slice(b);
                }
                *s = s.wrapping_add(u64::from_ne_bytes(w));
            }
        }
        Ok(sums)
    }

    /// Counter totals.
    pub fn counters(&self) -> Result<FastPathCounters, FastPathError> {
        let read = |idx: u32| -> Result<u64, FastPathError> {
            Ok(self.percpu_sum(self.counters_fd, idx, 8, 1, "counters")?.first().copied().unwrap_or(0))
        };
        let gate = self.gate.counters();
        Ok(FastPathCounters {
            fastpath_hits: read(abi::COUNTER_HITS)?,
            fastpath_misses: read(abi::COUNTER_MISSES)?,
            fastpath_throttled: read(abi::COUNTER_THROTTLED)?,
            fastpath_invalidations: self.invalidations.load(Ordering::Relaxed),
            fastpath_fill_graces: gate.graces,
            fastpath_fills_deferred: gate.skipped,
        })
    }

    /// Counters of the tenant in `slot` (cumulative since load, across the slot's tenants).
    pub fn tenant_counters(&self, slot: u32) -> Result<TenantCounters, FastPathError> {
        if slot >= abi::TENANTS_MAX {
            return Err(slot_error(slot));
        }
        let s = self.percpu_sum(self.tstats_fd, slot, std::mem::size_of::<abi::TenantStats>(), 3, "tenant counters")?;
        Ok(TenantCounters {
            hits: s.first().copied().unwrap_or(0),
            misses: s.get(1).copied().unwrap_or(0),
            throttled: s.get(2).copied().unwrap_or(0),
        })
    }

    /// The current global flush epoch plus slot 0's (values slot 0 fills now carry it).
    pub fn epoch(&self) -> u64 {
        self.epoch_of(0)
    }

    /// Slot 0's cached value for `key`: see [`Kernel::lookup_slot`].
    pub fn lookup(&self, key: &[u8]) -> Result<Option<abi::Item>, FastPathError> {
        self.lookup_slot(0, key)
    }

    /// The cached value for `key` of the tenant in `slot`, if any (for tests and debugging).
    pub fn lookup_slot(&self, slot: u32, key: &[u8]) -> Result<Option<abi::Item>, FastPathError> {
        use abi::Plain;
        let Some(k) = abi::Key::for_tenant(key, slot) else { return Ok(None) };
        let mut buf = vec![0u8; std::mem::size_of::<abi::Item>()];
        let found = sys::map_lookup(self.items_fd, k.as_bytes(), &mut buf)
            .map_err(|error| FastPathError::Map { op: "lookup", error })?;
        if !found {
            return Ok(None);
        }
        // SAFETY: `buf` holds exactly size_of::<Item>() bytes written by the kernel, Item is
        // repr(C) of integers and byte arrays (any bit pattern valid), read_unaligned copes with
        // the Vec's alignment.
        let it = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<abi::Item>()) };
        // The map key is a hash: the entry may hold a colliding key's item, which is not ours.
        Ok(item::holds_key(&it, key).then_some(it))
    }
    /// Run the program on `packet` with BPF_PROG_TEST_RUN (no interface needed). With a
    /// `repeat` above 1 the kernel reruns the program on the packet *as the previous run left
    /// it* (a hit turns it into a reply, which then passes), so use [`Kernel::mean_ns`] to time
    /// hits.
    pub fn test_run(&self, packet: &[u8], repeat: u32) -> Result<TestRunResult, FastPathError> {
        let r = sys::prog_test_run(self.prog_fd, packet, repeat)
            .map_err(|error| FastPathError::Map { op: "BPF_PROG_TEST_RUN", error })?;
        Ok(TestRunResult {
            retval: r.retval,
            verdict: Verdict::from_retval(r.retval),
            packet: r.data_out,
            mean_ns: r.duration_ns,
        })
    }

    /// Mean ns the program takes on `packet`, over `runs` separate single runs (each on a fresh
    /// copy, so a hit is timed as a hit). Returns the verdict of the last run too.
    pub fn mean_ns(&self, packet: &[u8], runs: u32) -> Result<(u64, Option<Verdict>), FastPathError> {
        let runs = runs.clamp(1, 1_000_000);
        let mut total: u64 = 0;
        let mut verdict = None;
        for _ in 0..runs {
            let r = self.test_run(packet, 1)?;
            total += u64::from(r.mean_ns);
            verdict = r.verdict;
        }
        Ok((total / u64::from(runs), verdict))
    }

    fn xdp(&mut self) -> Result<&mut Xdp, FastPathError> {
        self.ebpf
            .program_mut(abi::PROG_XDP)
            .ok_or_else(|| FastPathError::LoadRefused { detail: "program missing".into() })?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| FastPathError::LoadRefused { detail: chain(&e) })
    }
}

/// What one BPF_PROG_TEST_RUN returned.
#[derive(Clone, Debug)]
pub struct TestRunResult {
    pub retval: u32,
    pub verdict: Option<Verdict>,
    pub packet: Vec<u8>,
    pub mean_ns: u32,
}

/// The fast path attached to one interface. Detaches on drop; the maps die with it.
pub struct FastPath {
    kernel: Kernel,
    link: Option<aya::programs::xdp::XdpLinkId>,
    iface: String,
    mode: AttachMode,
    ifindex: u32,
}

fn if_index(iface: &str) -> Result<u32, FastPathError> {
    let missing = || FastPathError::InterfaceMissing { name: iface.to_string() };
    let c = std::ffi::CString::new(iface).map_err(|_| missing())?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(missing())
    } else {
        Ok(idx)
    }
}

impl FastPath {
    /// Load the program with fresh maps and attach it to `iface`, natively if the driver can,
    /// else in generic mode ([`FastPath::mode`] says which and why). Any XDP program already
    /// attached to the interface through netlink (e.g. left by `ip link` or a crashed older
    /// tool) is replaced.
    /// Serves one unshaped tenant (slot 0) on `cfg.udp_port`.
    pub fn attach(iface: &str, cfg: FastPathConfig) -> Result<FastPath, FastPathError> {
        FastPath::attach_with(iface, || Kernel::load(cfg))
    }

    /// Like [`FastPath::attach`], but serving no tenant until [`Kernel::add_tenant`] (through
    /// [`FastPath::kernel`]).
    pub fn attach_multi(iface: &str, entries_max: u32) -> Result<FastPath, FastPathError> {
        FastPath::attach_with(iface, || Kernel::load_multi(entries_max))
    }

    fn attach_with(
        iface: &str,
        load: impl FnOnce() -> Result<Kernel, FastPathError>,
    ) -> Result<FastPath, FastPathError> {
        let ifindex = if_index(iface)?;
        if !is_root() {
            // Loading would fail with EPERM anyway; say why up front. (CAP_BPF without root
            // also fails here on purpose: the capabilities needed are several.)
            return Err(FastPathError::NotPermitted { detail: "not running as root".into() });
        }
        let mut kernel = load()?;
        // A program attached via netlink would make the link attach fail with EBUSY.
        netlink::detach_xdp(ifindex)
            .map_err(|e| FastPathError::AttachRefused { detail: format!("removing the old XDP program: {e}") })?;
        let prog = kernel.xdp()?;
        let (link, mode) = match prog.attach_to_if_index(ifindex, XdpFlags::DRV_MODE) {
            Ok(l) => (l, AttachMode::Native),
            Err(native) => {
                let native_error = chain(&native);
                match prog.attach_to_if_index(ifindex, XdpFlags::SKB_MODE) {
                    Ok(l) => (l, AttachMode::Generic { native_error }),
                    Err(e) => {
                        let mut err = refusal(&e, true);
                        if let FastPathError::AttachRefused { detail } = &mut err {
                            *detail = format!("native: {native_error}; generic: {detail}");
                        }
                        return Err(err);
                    }
                }
            }
        };
        stream::register(ifindex, kernel.streams());
        Ok(FastPath { kernel, link: Some(link), iface: iface.to_string(), mode, ifindex })
    }

    /// How it is attached.
    pub fn mode(&self) -> &AttachMode {
        &self.mode
    }

    /// The interface it is attached to.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// See [`Kernel::fill`].
    pub fn fill(
        &self,
        key: &[u8],
        flags: u32,
        cas: u64,
        value: &[u8],
        expiry_ns: u64,
    ) -> Result<Filled, FastPathError> {
        self.kernel.fill(key, flags, cas, value, expiry_ns)
    }

    /// See [`Kernel::invalidate`].
    pub fn invalidate(&self, key: &[u8]) -> Result<(), FastPathError> {
        self.kernel.invalidate(key)
    }

    /// See [`Kernel::flush_all`].
    pub fn flush_all(&self) -> Result<(), FastPathError> {
        self.kernel.flush_all()
    }

    /// See [`Kernel::counters`].
    pub fn counters(&self) -> Result<FastPathCounters, FastPathError> {
        self.kernel.counters()
    }

    /// The loaded program and maps (test runs, lookups).
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }
}

impl Drop for FastPath {
    fn drop(&mut self) {
        stream::unregister(self.ifindex);
        if let (Some(link), Ok(prog)) = (self.link.take(), self.kernel.xdp()) {
            // Dropping the Ebpf would detach too; doing it here makes the order explicit.
            let _ = prog.detach(link);
        }
    }
}

/// A do-nothing XDP_PASS program attached to an interface (test topologies: a veth delivers
/// XDP_TX frames from its peer only when it has an XDP program itself). Detaches on drop.
pub struct PassProgram {
    _ebpf: Ebpf,
}

impl PassProgram {
    pub fn attach(iface: &str) -> Result<PassProgram, FastPathError> {
        let ifindex = if_index(iface)?;
        let mut ebpf = EbpfLoader::new().load(PASS_OBJECT).map_err(|e| refusal(&e, false))?;
        netlink::detach_xdp(ifindex)
            .map_err(|e| FastPathError::AttachRefused { detail: format!("removing the old XDP program: {e}") })?;
        let prog: &mut Xdp = ebpf
            .program_mut(abi::PROG_XDP_PASS)
            .ok_or_else(|| FastPathError::LoadRefused { detail: "pass program missing".into() })?
            .try_into()
            .map_err(|e| refusal(&e, false))?;
        prog.load().map_err(|e| refusal(&e, false))?;
        prog.attach_to_if_index(ifindex, XdpFlags::DRV_MODE)
            .or_else(|_| prog.attach_to_if_index(ifindex, XdpFlags::SKB_MODE))
            .map_err(|e| refusal(&e, true))?;
        Ok(PassProgram { _ebpf: ebpf })
    }
}
