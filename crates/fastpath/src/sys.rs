//! The few bpf(2) commands this crate issues itself: map element update/delete/lookup/next-key
//! and BPF_PROG_TEST_RUN. aya loads and attaches; these raw calls exist because they take `&self`
//! (aya's map writes need `&mut`, which would force a lock around every fill on the read path)
//! and because aya has no test-run API.
//!
//! Not for: anything that needs BTF or relocation (aya does that).

use std::io;
use std::os::fd::RawFd;

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// `BPF_ANY`: create or replace.
pub const BPF_ANY: u64 = 0;
/// `BPF_NOEXIST`: create only (EEXIST if the key is there).
pub const BPF_NOEXIST: u64 = 1;

/// The map-element member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value_or_next_key: u64,
    flags: u64,
}

/// The `test` member of `union bpf_attr` (kernel ≥ 5.10 layout).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
    // SAFETY: `attr` is a live, exclusively borrowed repr(C) prefix of `union bpf_attr` and we
    // pass its exact size; the kernel reads/writes at most that many bytes. Pointers inside it
    // are set by the callers below to buffers that outlive this call with the sizes declared.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, cmd, (attr as *mut T).cast::<libc::c_void>(), std::mem::size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn map_update(fd: RawFd, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.as_ptr() as u64,
        value_or_next_key: value.as_ptr() as u64,
        flags,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a)
}

/// Delete; a missing key is not an error (returns `Ok(false)`).
pub fn map_delete(fd: RawFd, key: &[u8]) -> io::Result<bool> {
    let mut a = MapElemAttr { map_fd: fd as u32, key: key.as_ptr() as u64, ..Default::default() };
    match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Lookup into `value` (which must be the map's full value size, per-CPU maps: times CPUs).
/// Returns `Ok(false)` if the key is absent.
pub fn map_lookup(fd: RawFd, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
    map_lookup_flags(fd, key, value, 0)
}

/// Lookup with `flags` (e.g. BPF_F_LOCK); `Ok(false)` if the key is absent.
pub fn map_lookup_flags(fd: RawFd, key: &[u8], value: &mut [u8], flags: u64) -> io::Result<bool> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.as_ptr() as u64,
        value_or_next_key: value.as_mut_ptr() as u64,
        flags,
        ..Default::default()
    };
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The key after `key` (or the first key for `None`) into `next`; `Ok(false)` at the end.
pub fn map_next_key(fd: RawFd, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let mut a = MapElemAttr {
        map_fd: fd as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value_or_next_key: next.as_mut_ptr() as u64,
        ..Default::default()
    };
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Result of one BPF_PROG_TEST_RUN.
pub struct TestRun {
    pub retval: u32,
    pub data_out: Vec<u8>,
    /// Mean ns per run as the kernel measured it.
    pub duration_ns: u32,
}

/// Run an XDP program on `data` `repeat` times (0 counts as 1).
pub fn prog_test_run(prog_fd: RawFd, data: &[u8], repeat: u32) -> io::Result<TestRun> {
    // XDP test runs use at most one page for the packet; leave room for growth.
    let mut out = vec![0u8; 4096];
    let mut a = TestRunAttr {
        prog_fd: prog_fd as u32,
        data_size_in: data.len() as u32,
        data_size_out: out.len() as u32,
        data_in: data.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat,
        ..Default::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut a)?;
    out.truncate((a.data_size_out as usize).min(4096));
    Ok(TestRun { retval: a.retval, data_out: out, duration_ns: a.duration })
}

#[cfg(feature = "traffic-gen")]
/// `BPF_F_TEST_XDP_LIVE_FRAMES`: test_run sends the frames for real (XDP_TX/REDIRECT).
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

#[cfg(feature = "traffic-gen")]
/// `struct xdp_md` as BPF_PROG_TEST_RUN takes it for its context.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

#[cfg(feature = "traffic-gen")]
/// Run an XDP program `repeat` times on real frames built from `data`, as if received on
/// `ifindex` (of the caller's network namespace) queue 0: XDP_TX sends each frame out of that
/// interface. `batch` frames share one flush (the kernel caps it at 256).
pub fn prog_test_run_live(prog_fd: RawFd, data: &[u8], ifindex: u32, repeat: u32, batch: u32) -> io::Result<()> {
    let mut ctx = XdpMd { data_end: data.len() as u32, ingress_ifindex: ifindex, ..Default::default() };
    let mut a = TestRunAttr {
        prog_fd: prog_fd as u32,
        data_size_in: data.len() as u32,
        data_in: data.as_ptr() as u64,
        repeat,
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: (&mut ctx as *mut XdpMd) as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch,
        ..Default::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut a)
}
