//! `-u USER`: giving up root once every port is bound and the kernel paths are attached, as
//! memcached does.
//!
//! What is kept, and why (kernel 6.x):
//! - Nothing effective, in any thread. The network path needs no privilege once set up: its
//!   sockets are open, and the XDP maps and ring buffers are used through descriptors opened as
//!   root (map lookups and updates on an open map fd check the fd, not a capability).
//! - XDP programs are attached through a bpf_link (kernel 5.9 and later, as aya does): closing
//!   the link detaches, with no capability. Only on older kernels, where aya attaches through
//!   netlink and the detach needs CAP_NET_ADMIN, does the main thread keep CAP_NET_ADMIN in its
//!   permitted set (never effective until it raises it for the detach at shutdown). Every other
//!   thread (workers, admin, streams, signals) has no capability at all: glibc changes the ids
//!   of all threads, and only the main thread keeps its permitted set across the change.
//! - Not CAP_NET_BIND_SERVICE: a tenant added later through the admin API on a port below
//!   `net.ipv4.ip_unprivileged_port_start` (1024 by default) is refused with "Permission
//!   denied". Ports chosen at start may be anything.
//!
//! memcached refuses to run as root without `-u`; Slipstream does not (its tests and XDP users
//! run it as root) but says so in the status line.
//!
//! Not for: parsing `-u` (config.rs).

use caps::{CapSet, Capability, CapsHashSet};
use nix::unistd::{Gid, Uid, User};

/// The user to become, looked up before anything is bound.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
}

/// Whether this process runs as root (real or effective uid 0).
pub fn is_root() -> bool {
    Uid::current().is_root() || Uid::effective().is_root()
}

/// The user `-u` names, if there is anything to drop: `None` without `-u` or when not root
/// (memcached ignores `-u` then too). An unknown user is memcached's error.
pub fn resolve(user: Option<&str>) -> Result<Option<Target>, String> {
    let Some(name) = user else { return Ok(None) };
    if !is_root() {
        return Ok(None);
    }
    match User::from_name(name) {
        // `-u root`: nothing to drop.
        Ok(Some(u)) if u.uid.is_root() => Ok(None),
        Ok(Some(u)) => Ok(Some(Target { name: name.to_string(), uid: u.uid, gid: u.gid })),
        Ok(None) => Err(format!("can't find the user {name} to switch to")),
        Err(e) => Err(format!("can't find the user {name} to switch to: {e}")),
    }
}

/// What was given up; keeps what the teardown needs.
#[derive(Debug)]
pub struct Dropped {
    pub target: Target,
    /// CAP_NET_ADMIN is in the main thread's permitted set for the XDP detach.
    pub net_admin_kept: bool,
}

impl Dropped {
    /// The status line's part about it.
    pub fn note(&self) -> String {
        let kept = if self.net_admin_kept {
            "no effective capabilities (cap_net_admin permitted to the main thread, raised only to detach XDP at exit)"
        } else {
            "no capabilities"
        };
        format!("running as user {} (uid {} gid {}), {kept}", self.target.name, self.target.uid, self.target.gid)
    }

    /// On the main thread, before detaching XDP programs: make the kept capability effective.
    pub fn for_teardown(&self) {
        if self.net_admin_kept {
            if let Err(e) = caps::raise(None, CapSet::Effective, Capability::CAP_NET_ADMIN) {
                eprintln!("slipstream: cannot raise cap_net_admin to detach XDP: {e}");
            }
        }
    }
}

/// Whether detaching an XDP program will need CAP_NET_ADMIN: aya attaches through a bpf_link
/// (detached by closing it) from kernel 5.9 on, through netlink before.
pub fn xdp_detach_needs_net_admin() -> bool {
    // SAFETY: `utsname` is plain byte arrays, for which all-zero bytes are a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname writes into our local `u`.
    if unsafe { libc::uname(&mut u) } != 0 {
        return true;
    }
    let release: String = u.release.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
    !kernel_at_least(&release, (5, 9))
}

/// `release` (e.g. "6.18.44-fc") is at least `want` (major, minor); unparsable: no.
fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next().and_then(|s| s.parse::<u32>().ok());
    let minor = it.next().and_then(|s| s.parse::<u32>().ok());
    match (major, minor) {
        (Some(a), Some(b)) => (a, b) >= want,
        _ => false,
    }
}

/// The status line's note when nothing is dropped.
pub fn root_note() -> &'static str {
    if is_root() {
        "running as root (-u USER drops privileges after start-up)"
    } else {
        ""
    }
}

/// Become `t` for good: no supplementary groups, its gid, its uid. Call on the main thread
/// once every socket is bound and every XDP program attached; `keep_net_admin` when one is and
/// its detach needs the capability ([`xdp_detach_needs_net_admin`]).
pub fn drop_to(t: &Target, keep_net_admin: bool) -> Result<Dropped, String> {
    let fail =
        |what: &str, e: &dyn std::fmt::Display| format!("failed to assume identity of user {}: {what}: {e}", t.name);
    // Keep the permitted set of this thread across the uid change (the others lose theirs).
    caps::securebits::set_keepcaps(true).map_err(|e| fail("keepcaps", &e))?;
    nix::unistd::setgroups(&[]).map_err(|e| fail("setgroups", &e))?;
    nix::unistd::setgid(t.gid).map_err(|e| fail("setgid", &e))?;
    nix::unistd::setuid(t.uid).map_err(|e| fail("setuid", &e))?;
    let mut keep = CapsHashSet::new();
    if keep_net_admin {
        keep.insert(Capability::CAP_NET_ADMIN);
    }
    caps::clear(None, CapSet::Effective).map_err(|e| fail("capabilities", &e))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| fail("capabilities", &e))?;
    caps::set(None, CapSet::Permitted, &keep).map_err(|e| fail("capabilities", &e))?;
    caps::securebits::set_keepcaps(false).map_err(|e| fail("keepcaps", &e))?;
    // The change must be final: a process that can become root again has dropped nothing.
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() && !t.uid.is_root() {
        return Err(format!("failed to assume identity of user {}: could become root again", t.name));
    }
    Ok(Dropped { target: t.clone(), net_admin_kept: keep_net_admin })
}

#[cfg(test)]
mod tests {
    use super::kernel_at_least;

    #[test]
    fn kernel_versions() {
        assert!(kernel_at_least("6.18.44-fc-v595", (5, 9)));
        assert!(kernel_at_least("5.9.0", (5, 9)));
        assert!(!kernel_at_least("5.8.18-1", (5, 9)));
        assert!(!kernel_at_least("4.19.0", (5, 9)));
        assert!(!kernel_at_least("weird", (5, 9)));
    }
}
