//! The gate: what one round of a connection may do, decided from its tenant's shaper before the
//! round starts, and what the round owes the shaper after it ran.
//!
//! What it is for: the SHAPE stage of a TCP round (plan → read → execute → charge → flush) and
//! of a UDP datagram. `plan` turns the shaper's answers (may requests run now, how many bytes
//! may be read) into a `RoundPlan`: whether to read, how much, whether to execute, the batch's
//! limits, and how long to hold the connection back afterwards. `ConnGate` is a connection's
//! shaping state (requests outstanding, held back until when, on the throttled list, taking
//! small turns) in one place.
//!
//! What it is not for: I/O (it never touches a socket; the loops do), or the token-bucket
//! arithmetic (slipstream-tenancy). Without a shaper the plan is always `RoundPlan::open`.

use slipstream_tenancy::{Admit, TenantShaper};

/// Longest a held-back connection (or a UDP queue) sleeps before looking again, even when its
/// bucket's rate is 0 (an admin change may reopen it).
pub(super) const THROTTLE_RECHECK_NS_MAX: u64 = 100_000_000;
/// Smallest read a shaped connection makes when its ingress bucket is open.
pub(super) const READ_BYTES_MIN_SHAPED: usize = 1024;
/// Rounds of read → execute → write one event may take before the connection goes to the back
/// of the line (memcached's `reqs_per_event` idea): a streaming client cannot starve the others.
const ROUNDS_PER_EVENT: usize = 8;
/// Turns of a connection its tenant's buckets held back lately: a connection resumed after its
/// bucket refilled would otherwise spend a whole burst in one go while other tenants' requests
/// wait behind it.
const ROUNDS_PER_EVENT_HELD: usize = 1;
const BATCH_REQUESTS_MAX_HELD: u32 = 4;
const BATCH_REPLY_BYTES_MAX_HELD: u64 = 4 * 1024;

/// The shaper's answers the gate needs (a tenant's `TenantShaper`; a table in the tests).
pub(super) trait Buckets {
    /// May requests run now, and how many / how many reply bytes.
    fn admit(&self, now_ns: u64) -> Admit;
    /// Ingress bytes that may be read now, or how long until some may.
    fn ingress_budget(&self, now_ns: u64) -> Result<u64, u64>;
}

impl Buckets for TenantShaper {
    fn admit(&self, now_ns: u64) -> Admit {
        TenantShaper::admit(self, now_ns)
    }

    fn ingress_budget(&self, now_ns: u64) -> Result<u64, u64> {
        TenantShaper::ingress_budget(self, now_ns)
    }
}

/// What one round of a connection may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RoundPlan {
    /// Read from the socket this round.
    pub read: bool,
    /// Most bytes this round's reads may take (`usize::MAX`: as much as the buffer holds).
    pub read_budget: usize,
    /// Execute requests from the buffer.
    pub execute: bool,
    /// (requests, reply bytes) the batch may produce; None: no limit.
    pub limits: Option<(u32, u64)>,
    /// After the round, hold the connection back this long (0: not held back).
    pub wait_ns: u64,
}

impl RoundPlan {
    /// No shaper: read if there may be input, execute everything, never wait.
    #[inline]
    pub fn open(read: bool) -> RoundPlan {
        RoundPlan { read, read_budget: usize::MAX, execute: true, limits: None, wait_ns: 0 }
    }
}

/// Cap a round's request limit at `cap` (memcached's `-R`), keeping the reply-bytes limit.
#[inline]
pub(super) fn cap_requests(limits: Option<(u32, u64)>, cap: Option<u32>) -> Option<(u32, u64)> {
    match (limits, cap) {
        (_, None) => limits,
        (None, Some(c)) => Some((c, u64::MAX)),
        (Some((r, b)), Some(c)) => Some((r.min(c), b)),
    }
}

/// Plan a round of a shaped connection at `now_ns`. `held`: its tenant's buckets held it back
/// lately (it takes small batches until it catches up); `want_read`: the socket may hold input.
pub(super) fn plan(sh: &impl Buckets, now_ns: u64, held: bool, want_read: bool) -> RoundPlan {
    let mut p = RoundPlan::open(want_read);
    match sh.admit(now_ns) {
        Admit::Go { requests, reply_bytes } => {
            p.limits = Some(if held {
                (requests.min(BATCH_REQUESTS_MAX_HELD), reply_bytes.min(BATCH_REPLY_BYTES_MAX_HELD))
            } else {
                (requests, reply_bytes)
            });
        }
        Admit::Wait { ns } => {
            // No replies may be produced now, so reading more would only pile up input.
            p.execute = false;
            p.read = false;
            p.wait_ns = ns;
        }
    }
    if p.read {
        match sh.ingress_budget(now_ns) {
            // A shaped tenant reads no more than its ingress balance (at least a small chunk, so
            // a tiny balance does not mean one-byte reads); the rest stays in the socket.
            Ok(tokens) => p.read_budget = tokens.max(READ_BYTES_MIN_SHAPED as u64).min(usize::MAX as u64) as usize,
            Err(ns) => {
                // Over its ingress rate: leave the bytes in the socket (back-pressure); what is
                // already buffered still runs.
                p.read = false;
                p.wait_ns = ns;
            }
        }
    }
    p
}

/// How long the shaper holds a UDP datagram back before it may run (0: now).
pub(super) fn udp_wait_ns(sh: &impl Buckets, now_ns: u64) -> u64 {
    if let Err(ns) = sh.ingress_budget(now_ns) {
        return ns;
    }
    match sh.admit(now_ns) {
        Admit::Go { .. } => 0,
        Admit::Wait { ns } => ns,
    }
}

/// A connection's shaping state.
#[derive(Debug, Default)]
pub(super) struct ConnGate {
    /// Requests executed whose replies are not yet handed to the socket (the tenant's
    /// `max_outstanding` counts these).
    pub outstanding: u32,
    /// Held back by its tenant's shaper until this monotonic time (0: not held back).
    pub throttle_until_ns: u64,
    /// Already on the worker's throttled list.
    pub in_throttled: bool,
    /// Held back by its tenant's shaper and not yet caught up: takes small turns.
    pub held: bool,
}

impl ConnGate {
    /// Rounds this connection may take for one event: a connection its tenant's buckets held
    /// back lately (the tenant is at its share) takes small turns until it catches up, so
    /// requests of tenants within their share never wait long behind it. Throughput is set by
    /// the buckets, not by turn size.
    #[inline]
    pub fn rounds(&self) -> usize {
        if self.held {
            ROUNDS_PER_EVENT_HELD
        } else {
            ROUNDS_PER_EVENT
        }
    }

    /// The charge step: the round read `read_bytes` and its batch produced `requests` replies of
    /// `reply_bytes`, all outstanding until flushed.
    #[inline]
    pub fn charge(&mut self, sh: Option<&TenantShaper>, read_bytes: u64, requests: u32, reply_bytes: u64) {
        if let Some(sh) = sh {
            sh.charge_ingress(read_bytes);
            if requests > 0 || reply_bytes > 0 {
                sh.charge_egress(requests, reply_bytes);
            }
        }
        self.outstanding = self.outstanding.saturating_add(requests);
    }

    /// Every reply is handed to the socket: none is outstanding any more.
    #[inline]
    pub fn flushed(&mut self, sh: Option<&TenantShaper>) {
        let n = std::mem::take(&mut self.outstanding);
        if let Some(sh) = sh {
            sh.complete(n);
        }
    }

    /// Hold the connection back for `wait_ns` from `now_ns` (at most the recheck interval).
    pub fn hold(&mut self, now_ns: u64, wait_ns: u64) {
        self.throttle_until_ns = now_ns.saturating_add(wait_ns.min(THROTTLE_RECHECK_NS_MAX)).max(1);
        self.held = true;
    }

    /// Caught up without being held back: full turns again.
    pub fn caught_up(&mut self) {
        self.held = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shaper that answers from a table.
    struct Fixed {
        admit: Admit,
        ingress: Result<u64, u64>,
    }

    impl Buckets for Fixed {
        fn admit(&self, _now_ns: u64) -> Admit {
            self.admit
        }
        fn ingress_budget(&self, _now_ns: u64) -> Result<u64, u64> {
            self.ingress
        }
    }

    const GO: Admit = Admit::Go { requests: 100, reply_bytes: 1 << 20 };

    #[test]
    fn open_buckets_read_their_balance_and_run_their_limits() {
        let p = plan(&Fixed { admit: GO, ingress: Ok(50_000) }, 1, false, true);
        assert_eq!(
            p,
            RoundPlan { read: true, read_budget: 50_000, execute: true, limits: Some((100, 1 << 20)), wait_ns: 0 }
        );
    }

    #[test]
    fn a_tiny_balance_still_reads_a_chunk() {
        let p = plan(&Fixed { admit: GO, ingress: Ok(3) }, 1, false, true);
        assert_eq!(p.read_budget, READ_BYTES_MIN_SHAPED);
    }

    #[test]
    fn a_held_connection_takes_small_batches() {
        let p = plan(&Fixed { admit: GO, ingress: Ok(50_000) }, 1, true, true);
        assert_eq!(p.limits, Some((BATCH_REQUESTS_MAX_HELD, BATCH_REPLY_BYTES_MAX_HELD)));
        assert_eq!(ConnGate { held: true, ..ConnGate::default() }.rounds(), ROUNDS_PER_EVENT_HELD);
        assert_eq!(ConnGate::default().rounds(), ROUNDS_PER_EVENT);
    }

    #[test]
    fn no_admission_means_no_read_no_execute_and_a_wait() {
        let p = plan(&Fixed { admit: Admit::Wait { ns: 7_000 }, ingress: Ok(50_000) }, 1, false, true);
        assert_eq!((p.read, p.execute, p.wait_ns), (false, false, 7_000));
    }

    #[test]
    fn over_ingress_runs_what_is_buffered_and_waits() {
        let p = plan(&Fixed { admit: GO, ingress: Err(9_000) }, 1, false, true);
        assert_eq!((p.read, p.execute, p.wait_ns, p.limits), (false, true, 9_000, Some((100, 1 << 20))));
    }

    #[test]
    fn nothing_to_read_does_not_ask_for_ingress() {
        let p = plan(&Fixed { admit: GO, ingress: Err(9_000) }, 1, false, false);
        assert_eq!((p.read, p.wait_ns), (false, 0));
    }

    #[test]
    fn udp_waits_for_ingress_first_then_admission() {
        assert_eq!(udp_wait_ns(&Fixed { admit: GO, ingress: Ok(1) }, 1), 0);
        assert_eq!(udp_wait_ns(&Fixed { admit: Admit::Wait { ns: 5 }, ingress: Err(8) }, 1), 8);
        assert_eq!(udp_wait_ns(&Fixed { admit: Admit::Wait { ns: 5 }, ingress: Ok(1) }, 1), 5);
    }

    #[test]
    fn hold_is_capped_and_never_zero() {
        let mut g = ConnGate::default();
        g.hold(10, u64::MAX);
        assert_eq!((g.throttle_until_ns, g.held), (10 + THROTTLE_RECHECK_NS_MAX, true));
        g.hold(0, 0);
        assert_eq!(g.throttle_until_ns, 1);
        g.caught_up();
        assert!(!g.held);
    }

    #[test]
    fn outstanding_counts_until_flushed_and_the_shaper_is_paid() {
        let sh = TenantShaper::new(1 << 20, 1 << 20, 1 << 20, 8, 1.0, 0);
        let mut g = ConnGate::default();
        g.charge(Some(&sh), 100, 3, 300);
        assert_eq!(g.outstanding, 3);
        g.flushed(Some(&sh));
        assert_eq!((g.outstanding, sh.outstanding()), (0, 0));
        g.charge(None, 100, 2, 10);
        g.flushed(None);
        assert_eq!(g.outstanding, 0);
    }
}
