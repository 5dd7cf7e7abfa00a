//! What every serving step needs from its worker, kept below the loops so that tcp.rs, udp.rs
//! and listen.rs never import the worker (imports run one way: worker → tcp/udp/listen → env,
//! conn, gate).

use super::conn::Conn;
use super::StopHandle;
use crate::exec::Settings;
use crate::stats::ThreadStats;
use crate::tenants::Tenant;
use std::sync::Arc;

/// A connection and the tenant it belongs to (kept apart so both can be borrowed at once).
pub(super) struct Slot {
    pub tenant: Arc<Tenant>,
    pub conn: Conn,
}

/// What the serving functions need besides the connection and its tenant.
pub(super) struct Env<'a> {
    pub settings: &'a Settings,
    pub stop: &'a StopHandle,
    pub index: usize,
    pub read_buf_bytes_max: usize,
    /// Where replicated tenants' outcomes for this worker's connections arrive.
    pub inbox: &'a Arc<crate::replicated::ReplInbox>,
}

/// This worker's counters in `tenant`'s stats.
pub(super) fn thread_stats(tenant: &Tenant, index: usize) -> &ThreadStats {
    // per_thread has one entry per worker; fall back to the first rather than panic.
    match tenant.info.per_thread.get(index).or_else(|| tenant.info.per_thread.first()) {
        Some(s) => s,
        None => &FALLBACK_STATS,
    }
}

static FALLBACK_STATS: ThreadStats = ThreadStats::new_const();
