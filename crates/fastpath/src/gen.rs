//! The benchmark traffic generator's kernel side (`bpf/xdp_gen.c`): sends frames built from a
//! template out of a veth with BPF_PROG_TEST_RUN live frames (millions per second from one
//! core, each one a real frame the peer's XDP hook and stack receive), and counts the server's
//! replies on that veth in XDP, dropping them. `slipstream-loadgen --xdp-gen` drives it.
//!
//! Not for: the server, or tests of reply bytes (the sink only tells hits from misses).

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::maps::{Array, PerCpuArray};
use aya::programs::{Xdp, XdpFlags};
use aya::{Ebpf, EbpfLoader};

use crate::abi::header;
use crate::{netlink, refusal, sys, FastPathError};

static GEN_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp_gen.o"));

/// Most key digits the generator program rewrites (`SS_GEN_DIGITS_MAX` in bpf/xdp_gen.h).
pub const KEY_DIGITS_MAX: u32 = header::SS_GEN_DIGITS_MAX as u32;
/// Longest template frame plus one (`SS_GEN_FRAME_BYTES_MAX` in bpf/xdp_gen.h).
pub const FRAME_BYTES_MAX: usize = header::SS_GEN_FRAME_BYTES_MAX as usize;
/// Most frame templates, sent round-robin (`SS_GEN_TEMPLATES_MAX` in bpf/xdp_gen.h).
pub const TEMPLATES_MAX: usize = header::SS_GEN_TEMPLATES_MAX as usize;
/// Most frames per test-run call (a bound of ours; the kernel takes up to 2^32 - 1).
pub const FRAMES_PER_CALL_MAX: u32 = 1 << 20;

/// Counted replies (sums over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SinkCounts {
    pub frames: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes: u64,
}

/// `struct ss_gen_config` (bpf/xdp_gen.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct GenConfig {
    key_off: u32,
    key_digits: u32,
    keys: u32,
    templates: u32,
    step_frame: u64,
    templates_after: u32,
    pad0: u32,
}
crate::mirror!(GenConfig, ss_gen_config, [key_off, key_digits, keys, templates, step_frame, templates_after, pad0]);
impl crate::abi::Plain for GenConfig {}

/// The loaded generator and sink programs. The sink detaches when this is dropped.
pub struct Generator {
    ebpf: Ebpf,
    gen_fd: RawFd,
    sink_ifindex: Option<u32>,
    cfg: GenConfig,
}

impl Generator {
    pub fn load() -> Result<Generator, FastPathError> {
        let mut ebpf = EbpfLoader::new().load(GEN_OBJECT).map_err(|e| refusal(&e, false))?;
        for name in ["ss_gen", "ss_sink"] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .ok_or_else(|| FastPathError::LoadRefused { detail: format!("{name} missing from object") })?
                .try_into()
                .map_err(|e| refusal(&e, false))?;
            prog.load().map_err(|e| refusal(&e, false))?;
        }
        let gen: &Xdp = ebpf
            .program("ss_gen")
            .ok_or_else(|| FastPathError::LoadRefused { detail: "ss_gen missing".into() })?
            .try_into()
            .map_err(|e| refusal(&e, false))?;
        let gen_fd = gen.fd().map_err(|e| refusal(&e, false))?.as_fd().as_raw_fd();
        Ok(Generator { ebpf, gen_fd, sink_ifindex: None, cfg: GenConfig { templates: 1, ..GenConfig::default() } })
    }

    /// Rewrite `digits` decimal digits at frame byte `key_off` with a key uniform over
    /// 0..`keys` on every frame (`keys` 0: send the template unchanged).
    pub fn set_keys(&mut self, key_off: u32, digits: u32, keys: u32) -> Result<(), FastPathError> {
        if keys > 0 && (key_off == 0 || digits == 0 || digits > KEY_DIGITS_MAX) {
            return Err(FastPathError::BadConfig { detail: format!("key rewrite at {key_off}, {digits} digits") });
        }
        self.cfg.key_off = key_off;
        self.cfg.key_digits = digits;
        self.cfg.keys = keys;
        self.write_cfg()
    }

    fn write_cfg(&mut self) -> Result<(), FastPathError> {
        use crate::abi::Plain;
        let fd = self.map_fd("gen_cfg")?;
        sys::map_update(fd, &0u32.to_ne_bytes(), self.cfg.as_bytes(), sys::BPF_ANY)
            .map_err(|e| FastPathError::LoadRefused { detail: format!("gen_cfg: {e}") })
    }

    /// The frame every send starts from (the generator rewrites it into each frame, see
    /// xdp_gen.c); `send` must be given the same bytes.
    pub fn set_template(&mut self, frame: &[u8]) -> Result<(), FastPathError> {
        self.set_templates(&[frame.to_vec()]).map(|_| ())
    }

    /// Frames sent round-robin: frame n (counting every frame this generator has sent) is
    /// `frames[n % frames.len()]`. Returns the frame to pass to [`Generator::send`]: the
    /// longest template (shorter ones trim it, see xdp_gen.c).
    pub fn set_templates(&mut self, frames: &[Vec<u8>]) -> Result<Vec<u8>, FastPathError> {
        self.set_templates_stepped(frames, &[], 0)
    }

    /// Two template sets switched at a frame: frame n (counted as in [`Generator::set_templates`])
    /// is `before[n % before.len()]` while n < `step_frame`, then
    /// `after[(n - step_frame) % after.len()]` (`after` empty: no step). Returns the frame to
    /// pass to [`Generator::send`].
    pub fn set_templates_stepped(
        &mut self,
        before: &[Vec<u8>],
        after: &[Vec<u8>],
        step_frame: u64,
    ) -> Result<Vec<u8>, FastPathError> {
        let frames: Vec<&Vec<u8>> = before.iter().chain(after).collect();
        if before.is_empty() || frames.len() > TEMPLATES_MAX {
            return Err(FastPathError::BadConfig {
                detail: format!("{} + {} templates (1..={TEMPLATES_MAX} in all)", before.len(), after.len()),
            });
        }
        let fd = self.map_fd("gen_tpl")?;
        let mut value = vec![0u8; 8 + FRAME_BYTES_MAX];
        for (i, frame) in frames.iter().enumerate() {
            if frame.len() < 14 || frame.len() >= FRAME_BYTES_MAX {
                return Err(FastPathError::BadConfig { detail: format!("template of {} bytes", frame.len()) });
            }
            value.fill(0);
            value[..4].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
            value[8..8 + frame.len()].copy_from_slice(frame);
            sys::map_update(fd, &(i as u32).to_ne_bytes(), &value, sys::BPF_ANY)
                .map_err(|e| FastPathError::LoadRefused { detail: format!("gen_tpl: {e}") })?;
        }
        self.cfg.templates = before.len() as u32;
        self.cfg.templates_after = after.len() as u32;
        self.cfg.step_frame = step_frame;
        self.write_cfg()?;
        let longest = frames.iter().max_by_key(|f| f.len()).map(|f| f.to_vec()).unwrap_or_default();
        Ok(longest)
    }

    /// Frames the program has built since it was loaded (every run of it, sent or not).
    pub fn frames_built(&self) -> Result<u64, FastPathError> {
        let m =
            self.ebpf.map("gen_seq").ok_or_else(|| FastPathError::LoadRefused { detail: "gen_seq missing".into() })?;
        let a: Array<_, u64> =
            Array::try_from(m).map_err(|e| FastPathError::LoadRefused { detail: format!("gen_seq: {e}") })?;
        a.get(&0, 0).map_err(|e| FastPathError::LoadRefused { detail: format!("gen_seq: {e}") })
    }

    fn map_fd(&self, name: &str) -> Result<RawFd, FastPathError> {
        match self.ebpf.map(name) {
            Some(aya::maps::Map::Array(d)) => Ok(d.fd().as_fd().as_raw_fd()),
            _ => Err(FastPathError::LoadRefused { detail: format!("map {name} missing") }),
        }
    }

    /// Attach the reply counter to `iface` (native mode, else generic), counting UDP frames from
    /// source port `sport`.
    pub fn attach_sink(&mut self, iface: &str, sport: u16) -> Result<AttachedMode, FastPathError> {
        let ifindex = crate::if_index(iface)?;
        let mut cfg: Array<_, [u32; 2]> = self.map("sink_cfg")?;
        cfg.set(0, [u32::from(sport), 0], 0)
            .map_err(|e| FastPathError::LoadRefused { detail: format!("sink_cfg: {e}") })?;
        netlink::detach_xdp(ifindex)
            .map_err(|e| FastPathError::AttachRefused { detail: format!("removing the old XDP program: {e}") })?;
        let prog: &mut Xdp = self
            .ebpf
            .program_mut("ss_sink")
            .ok_or_else(|| FastPathError::LoadRefused { detail: "ss_sink missing".into() })?
            .try_into()
            .map_err(|e| refusal(&e, false))?;
        let mode = match prog.attach_to_if_index(ifindex, XdpFlags::DRV_MODE) {
            Ok(_) => AttachedMode::Native,
            Err(_) => {
                prog.attach_to_if_index(ifindex, XdpFlags::SKB_MODE).map_err(|e| refusal(&e, true))?;
                AttachedMode::Generic
            }
        };
        self.sink_ifindex = Some(ifindex);
        Ok(mode)
    }

    /// Replies counted so far.
    pub fn sink_counts(&self) -> Result<SinkCounts, FastPathError> {
        let cnt: PerCpuArray<_, u64> = PerCpuArray::try_from(
            self.ebpf
                .map("sink_cnt")
                .ok_or_else(|| FastPathError::LoadRefused { detail: "sink_cnt missing".into() })?,
        )
        .map_err(|e| FastPathError::LoadRefused { detail: format!("sink_cnt: {e}") })?;
        let sum = |i: u32| -> Result<u64, FastPathError> {
            let v = cnt.get(&i, 0).map_err(|e| FastPathError::LoadRefused { detail: format!("sink_cnt: {e}") })?;
            Ok(v.iter().copied().fold(0u64, u64::wrapping_add))
        };
        Ok(SinkCounts { frames: sum(0)?, hits: sum(1)?, misses: sum(2)?, bytes: sum(3)? })
    }

    /// Send `frames` frames built from `template` out of interface `ifindex` (this network
    /// namespace's), `batch` per flush. Frames the receiver has no room for are dropped by the
    /// kernel, as a NIC would; the caller learns what arrived from the receiver's counters.
    pub fn send(&self, template: &[u8], ifindex: u32, frames: u32, batch: u32) -> Result<(), FastPathError> {
        if frames == 0 || frames > FRAMES_PER_CALL_MAX || !(1..=256).contains(&batch) {
            return Err(FastPathError::BadConfig { detail: format!("{frames} frames in batches of {batch}") });
        }
        sys::prog_test_run_live(self.gen_fd, template, ifindex, frames, batch)
            .map_err(|e| FastPathError::LoadRefused { detail: format!("live test run: {e}") })
    }

    fn map<V: aya::Pod>(&mut self, name: &str) -> Result<Array<&mut aya::maps::MapData, V>, FastPathError> {
        let m = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| FastPathError::LoadRefused { detail: format!("map {name} missing") })?;
        Array::try_from(m).map_err(|e| FastPathError::LoadRefused { detail: format!("map {name}: {e}") })
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        // aya detaches links it owns when the Ebpf drops; clearing the interface as well makes
        // sure no sink outlives a generator that was killed between attach and exit.
        if let Some(ifindex) = self.sink_ifindex {
            let _ = netlink::detach_xdp(ifindex);
        }
    }
}

/// How the sink got attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    Native,
    Generic,
}
