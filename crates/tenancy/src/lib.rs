//! Slipstream's tenancy model, with no I/O: what a tenant is (its spec and the edits an operator
//! may make at run time), the token buckets that enforce a tenant's share of the node's ingress
//! and egress capacity, the per-tenant shaper the serving loops consult once per batch, and the
//! control tick that re-divides spare capacity (work-conserving mode) and settles what the
//! kernel fast path spent.
//!
//! What it is not for: sockets, the store, or HTTP. The server crate owns the listeners and the
//! per-tenant stores and implements [`control::TenantControl`] for the admin endpoint; the
//! fast path implements [`shaper::KernelLedger`] so XDP answers come out of the same buckets.
//!
//! The model follows the multi-tenant KV paper (per-tenant buckets at ingress and egress of one
//! shared pipeline, shares changeable at run time) and goes past it with Pisces-style
//! work-conserving weighted sharing of idle tenants' capacity.

pub mod bucket;
pub mod control;
pub mod shaper;
pub mod spec;

pub use bucket::TokenBucket;
pub use control::{ControlError, ReplicaChange, TenantControl, TenantView};
pub use shaper::{Admit, Direction, KernelLedger, Shaper, TenantShaper};
pub use spec::{ShapingSpec, SpecError, TenantPatch, TenantSpec};

#[cfg(test)]
mod tests;

/// Nanoseconds since this process first asked (a monotonic clock whose epoch is the first call,
/// not the kernel's CLOCK_MONOTONIC epoch): the time base of every bucket and shaper. Not
/// comparable with `slipstream_fastpath::clock_monotonic_ns` (absolute CLOCK_MONOTONIC).
pub fn since_start_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    let start = START.get_or_init(Instant::now);
    // u64 nanoseconds last 584 years of uptime.
    start.elapsed().as_nanos() as u64
}
