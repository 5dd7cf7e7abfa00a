//! Tests of the tenancy model: bucket accuracy on a synthetic clock (and one real-time
//! concurrent run), the per-tenant shaper, the control tick (fixed and work-conserving, kernel
//! settling) and the spec rules.

use crate::bucket::{TokenBucket, REFILL_GRAIN_NS};
use crate::shaper::{Admit, Direction, KernelLedger, Member, Shaper, TenantShaper};
use crate::spec::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// The project's one RNG (fastrand), seeded so a printed seed replays.
struct Rng(fastrand::Rng);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n.max(1))
    }
}

fn seed(test: &str) -> u64 {
    // TENANCY_TEST_SEED=<n> replays a printed seed.
    let s = std::env::var("TENANCY_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    }) | 1;
    println!("{test} seed={s}");
    s
}

// ---- token bucket ----------------------------------------------------------------------------

#[test]
fn bucket_rate_is_accurate_on_a_synthetic_clock() {
    let seed = seed("bucket_rate_is_accurate_on_a_synthetic_clock");
    let mut rng = Rng(fastrand::Rng::with_seed(seed));
    for &(rate, burst) in &[(1_000_000u64, 65_536u64), (40_000_000, 65_536), (123_457, 1_500), (500_000_000, 1 << 20)] {
        let b = TokenBucket::new(rate, burst, 0);
        let mut now = 0u64;
        let end = 10 * S;
        let mut total = 0u64;
        let chunk_max = (burst / 2).clamp(1, 9_000);
        while now <= end {
            while b.available(now) > 0 {
                let c = 1 + rng.below(chunk_max);
                b.charge(c);
                total += c;
            }
            // Steps from below the refill grain to a few milliseconds, but the consumer looks
            // at least twice per burst's worth of time (else a full bucket drops refill).
            let long = rng.below(10) == 0;
            let step_max = if long { 3 * MS } else { 4 * REFILL_GRAIN_NS };
            now += 1 + rng.below(step_max.min(burst * S / rate / 2));
        }
        let want = rate as f64 * 10.0 + burst as f64;
        let err = (total as f64 - want).abs() / want;
        assert!(err < 0.005, "seed={seed} rate {rate} burst {burst}: charged {total}, expected {want} (error {err})");
        assert_eq!(b.charged_bytes_total(), total);
    }
}

#[test]
fn bucket_debt_is_repaid_before_admission_and_wait_ns_is_exact() {
    let b = TokenBucket::new(1_000, 100, 0);
    assert_eq!(b.wait_ns(0), 0, "a full bucket admits at once");
    b.charge(1_100); // 1000 bytes of debt
    assert_eq!(b.available(0), -1_000);
    // One byte positive needs 1001 bytes of refill: 1.001 s at 1000 B/s (+1 ns rounding).
    let w = b.wait_ns(0);
    assert_eq!(w, 1_001 * MS + 1);
    // Just before: still not positive (a debt is repaid in full before the next batch).
    assert!(b.available(w - 2) <= 0, "available {}", b.available(w - 2));
    assert!(b.wait_ns(w - 2) > 0);
    // At the promised time: open.
    assert!(b.available(w) > 0);
    assert_eq!(b.wait_ns(w), 0);
}

#[test]
fn bucket_wait_ns_is_at_least_one_refill_grain() {
    let b = TokenBucket::new(1_000_000_000, 10, 0);
    b.charge(11); // 1 byte of debt: 2 ns of refill, but refills come at most every grain
    assert_eq!(b.wait_ns(0), REFILL_GRAIN_NS);
}

#[test]
fn bucket_set_lowering_burst_clips_tokens() {
    let b = TokenBucket::new(1_000, 10_000, 0);
    assert_eq!(b.available(0), 10_000);
    b.set(1_000, 500);
    assert_eq!(b.available(0), 500);
    assert_eq!(b.burst_bytes(), 500);
    // Refill never goes above the new burst either.
    assert_eq!(b.available(100 * S), 500);
    // A lowered rate applies to later refills.
    b.charge(500);
    b.set(100, 500);
    assert_eq!(b.available(100 * S + S), 100);
}

#[test]
fn bucket_rate_zero_never_refills() {
    let b = TokenBucket::new(0, 100, 0);
    b.charge(200);
    assert_eq!(b.wait_ns(0), u64::MAX);
    assert_eq!(b.available(1_000 * S), -100);
    assert_eq!(b.wait_ns(1_000 * S), u64::MAX);
    // A rate change reopens it.
    b.set_rate(1_000);
    let from = 1_000 * S;
    let w = b.wait_ns(from);
    assert!(w < u64::MAX);
    assert!(b.available(from + w) > 0);
}

#[test]
fn bucket_huge_charges_are_clipped_not_overflowed() {
    let b = TokenBucket::new(1_000, 100, 0);
    b.charge(u64::MAX);
    b.charge(u64::MAX);
    assert_eq!(b.available(0), -crate::bucket::DEBT_BYTES_MAX);
    assert!(b.wait_ns(0) > 0);
}

#[test]
fn bucket_two_threads_never_exceed_rate_plus_burst() {
    let rate = 2_000_000u64;
    let burst = 20_000u64;
    let chunk = 1_500u64;
    let t0 = crate::since_start_ns();
    let b = Arc::new(TokenBucket::new(rate, burst, t0));
    let deadline = t0 + 300 * MS;
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut mine = 0u64;
                loop {
                    let now = crate::since_start_ns();
                    if now >= deadline {
                        return mine;
                    }
                    if b.available(now) > 0 {
                        b.charge(chunk);
                        mine += chunk;
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let elapsed_ns = crate::since_start_ns() - t0;
    let bound = rate as u128 * elapsed_ns as u128 / S as u128 + burst as u128 + 2 * chunk as u128;
    assert!((total as u128) <= bound, "charged {total} in {elapsed_ns} ns, bound {bound}");
    assert_eq!(b.charged_bytes_total(), total);
    // It really ran (loose: the machine is shared): at least half the allowance.
    assert!(total as u128 * 2 >= rate as u128 * 300 / 1000, "only {total} charged");
}

// ---- tenant shaper ---------------------------------------------------------------------------

#[test]
fn shaper_admits_within_outstanding_bound_and_completes() {
    let s = TenantShaper::new(1_000_000, 1_000_000, 10_000, 3, 0.5, 0);
    assert_eq!(s.admit(0), Admit::Go { requests: 3, reply_bytes: 10_000 });
    s.charge_egress(2, 4_000);
    assert_eq!(s.outstanding(), 2);
    assert_eq!(s.admit(0), Admit::Go { requests: 1, reply_bytes: 6_000 });
    s.charge_egress(1, 1_000);
    // All three slots in flight: wait, counted as held back.
    assert!(matches!(s.admit(0), Admit::Wait { ns } if ns > 0));
    assert_eq!(s.counters.throttled.load(Ordering::Relaxed), 1);
    assert!(s.take_wanted_more());
    assert!(!s.take_wanted_more(), "the flag is cleared by reading it");
    s.complete(2);
    assert_eq!(s.outstanding(), 1);
    assert_eq!(s.admit(0), Admit::Go { requests: 2, reply_bytes: 5_000 });
    // Completing more than outstanding (a closed connection) never wraps.
    s.complete(10);
    assert_eq!(s.outstanding(), 0);
    s.complete(0);
    s.charge_egress(0, 0);
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn shaper_held_back_sets_counters_and_flag() {
    let s = TenantShaper::new(1_000, 1_000, 100, 8, 0.25, 0);
    assert_eq!(s.ingress_open(0), Ok(()));
    s.charge_ingress(600); // 500 bytes of debt
    let w = s.ingress_open(0).expect_err("in debt");
    assert_eq!(w, 501 * MS + 1);
    assert_eq!(s.counters.throttled.load(Ordering::Relaxed), 1);
    assert!(s.take_wanted_more());
    s.charge_egress(1, 300);
    match s.admit(0) {
        Admit::Wait { ns } => assert_eq!(ns, 201 * MS + 1),
        other => panic!("expected Wait, got {other:?}"),
    }
    assert_eq!(s.counters.throttled.load(Ordering::Relaxed), 2);
    assert!(s.take_wanted_more());
    s.dropped();
    assert_eq!(s.counters.dropped.load(Ordering::Relaxed), 1);
    // After the debt is repaid the ingress opens again.
    assert_eq!(s.ingress_open(w), Ok(()));
}

#[test]
fn shaper_reconfigure_applies_rates_burst_and_bound() {
    let s = TenantShaper::new(1_000, 2_000, 10_000, 8, 0.25, 0);
    s.reconfigure(3_000, 4_000, 500, 2, 0.5);
    assert_eq!(s.base_rates(), (3_000, 4_000));
    assert_eq!((s.ingress.rate_bytes_per_s(), s.egress.rate_bytes_per_s()), (3_000, 4_000));
    assert_eq!(s.ingress.available(0), 500);
    assert_eq!(s.max_outstanding(), 2);
    assert!((s.weight() - 0.5).abs() < 1e-9);
}

// ---- control tick ----------------------------------------------------------------------------

const CAP: u64 = 1_000_000;

fn tenant(share: f64) -> Arc<TenantShaper> {
    let rate = (CAP as f64 * share) as u64;
    Arc::new(TenantShaper::new(rate, rate, 10_000, 64, share, 0))
}

fn member(s: &Arc<TenantShaper>) -> Member {
    Member { shaper: s.clone(), kernel_slot: None }
}

fn rates(s: &TenantShaper) -> (u64, u64) {
    (s.ingress.rate_bytes_per_s(), s.egress.rate_bytes_per_s())
}

/// Drive a tenant as a busy one over the tick ending at `now`: it uses `bytes_per_s` in both
/// directions and is held back (its buckets run dry).
fn busy(s: &TenantShaper, bytes_per_s: u64, tick_ns: u64, now: u64) {
    let bytes = bytes_per_s * tick_ns / S;
    s.charge_ingress(bytes);
    s.charge_egress(0, bytes);
    s.egress.charge(s.egress.available(now).max(0) as u64 + 1);
    assert!(matches!(s.admit(now), Admit::Wait { .. }));
}

/// Use `bytes_per_s` without being held back.
fn steady(s: &TenantShaper, bytes_per_s: u64, tick_ns: u64) {
    let bytes = bytes_per_s * tick_ns / S;
    s.charge_ingress(bytes);
    s.charge_egress(0, bytes);
}

#[test]
fn tick_fixed_mode_keeps_base_rates() {
    let shaper = Shaper::new(CAP, CAP, false);
    let (a, b) = (tenant(0.5), tenant(0.25));
    shaper.add(member(&a));
    shaper.add(member(&b));
    a.ingress.set_rate(900_000); // as a previous work-conserving period could have left it
    let tick = 10 * MS;
    shaper.tick(tick, None);
    for k in 2..5 {
        busy(&a, 500_000, tick, k * tick);
        shaper.tick(k * tick, None);
        assert_eq!(rates(&a), (500_000, 500_000));
        assert_eq!(rates(&b), (250_000, 250_000));
    }
    // The held-back flag was consumed even in fixed mode.
    assert!(!a.take_wanted_more());
}

#[test]
fn tick_work_conserving_splits_spare_by_weight() {
    let shaper = Shaper::new(CAP, CAP, true);
    // a: 0.5, b: 0.25, c: 0.25 (idle). a and b are held back: the spare 250k goes 2:1.
    let (a, b, c) = (tenant(0.5), tenant(0.25), tenant(0.25));
    for t in [&a, &b, &c] {
        shaper.add(member(t));
    }
    let tick = 10 * MS;
    shaper.tick(tick, None); // first sight: nothing measured, everyone at base
    assert_eq!(rates(&a), (500_000, 500_000));
    busy(&a, 500_000, tick, 2 * tick);
    busy(&b, 250_000, tick, 2 * tick);
    shaper.tick(2 * tick, None);
    assert_eq!(rates(&a), (500_000 + 166_666, 500_000 + 166_666));
    assert_eq!(rates(&b), (250_000 + 83_333, 250_000 + 83_333));
    assert_eq!(rates(&c), (250_000, 250_000), "an idle tenant keeps its base");
    let (ra, rb, rc) = (rates(&a).0, rates(&b).0, rates(&c).0);
    assert!(ra + rb + rc <= CAP + 250_000, "idle c's base is only lent");
    assert!(ra + rb <= CAP - 250_000 + 250_000);

    // Next tick a uses its raised rate without being held back (demand just met): it keeps
    // competing instead of dropping to base (no flip-flop); b is still held back.
    steady(&a, 660_000, tick);
    busy(&b, 333_000, tick, 3 * tick);
    shaper.tick(3 * tick, None);
    assert_eq!(rates(&a).1, 666_666);
    assert_eq!(rates(&b).1, 333_333);

    // c wakes up and is held back: nobody's capacity is spare any more, all back to base.
    busy(&a, 666_000, tick, 4 * tick);
    busy(&b, 333_000, tick, 4 * tick);
    busy(&c, 250_000, tick, 4 * tick);
    shaper.tick(4 * tick, None);
    assert_eq!(rates(&a), (500_000, 500_000));
    assert_eq!(rates(&b), (250_000, 250_000));
    assert_eq!(rates(&c), (250_000, 250_000));

    // Nobody busy: everyone at base.
    for k in 5..10 {
        shaper.tick(k * tick, None);
    }
    assert_eq!(rates(&a), (500_000, 500_000));
    assert_eq!(rates(&b), (250_000, 250_000));

    // Switched off: base at the next tick even though a is busy.
    busy(&a, 500_000, tick, 10 * tick);
    shaper.set_work_conserving(false);
    shaper.tick(10 * tick, None);
    assert_eq!(rates(&a), (500_000, 500_000));
}

#[test]
fn tick_work_conserving_one_busy_tenant_takes_all_idle_capacity() {
    let shaper = Shaper::new(CAP, 2 * CAP, true);
    let ts: Vec<_> = (0..8).map(|_| tenant(0.125)).collect();
    for t in &ts {
        shaper.add(member(t));
    }
    let tick = 10 * MS;
    shaper.tick(tick, None);
    busy(&ts[0], 125_000, tick, 2 * tick);
    shaper.tick(2 * tick, None);
    // Ingress capacity 1M: the other seven are idle, so t0 may use all of it.
    assert_eq!(rates(&ts[0]).0, CAP);
    // Egress capacity 2M (bases are 125k from the tenant() helper): spare = 2M - 125k (its own
    // base; the idle seven used nothing), so base + spare = the whole capacity.
    assert_eq!(rates(&ts[0]).1, 2 * CAP);
    for t in &ts[1..] {
        assert_eq!(rates(t), (125_000, 125_000));
    }
}

#[test]
fn tick_members_added_and_removed_between_ticks() {
    let shaper = Shaper::new(CAP, CAP, true);
    let a = tenant(0.5);
    shaper.add(member(&a));
    let tick = 10 * MS;
    shaper.tick(tick, None);
    // b joins: not measured yet, so it is assumed to use its whole base (no spare from it).
    let b = tenant(0.5);
    shaper.add(member(&b));
    busy(&a, 500_000, tick, 2 * tick);
    shaper.tick(2 * tick, None);
    assert_eq!(rates(&a), (500_000, 500_000));
    // Measured idle now: its base becomes spare for a.
    busy(&a, 500_000, tick, 3 * tick);
    shaper.tick(3 * tick, None);
    assert_eq!(rates(&a), (CAP, CAP));
    // b leaves; a alone with share 0.5 and the whole node's spare.
    shaper.remove(&b);
    drop(b);
    busy(&a, 1_000_000, tick, 4 * tick);
    shaper.tick(4 * tick, None);
    assert_eq!(rates(&a), (CAP, CAP));
    // A tick at the same instant measures nothing: a's measured use (above its base) keeps
    // it at the raised rate.
    shaper.tick(4 * tick, None);
    assert_eq!(rates(&a), (CAP, CAP));
    // Idle from now on: its measured use decays and it falls back to its base.
    for k in 5..30 {
        shaper.tick(k * tick, None);
    }
    assert_eq!(rates(&a), (500_000, 500_000));
}

#[derive(Default)]
struct MockLedger {
    spent: Mutex<HashMap<u32, (u64, u64, u64)>>,
    allowance: Mutex<HashMap<u32, (u64, u64)>>,
}

impl KernelLedger for MockLedger {
    fn take_spent(&self, slot: u32) -> (u64, u64, u64) {
        self.spent.lock().map(|mut m| m.remove(&slot).unwrap_or((0, 0, 0))).unwrap_or((0, 0, 0))
    }
    fn set_allowance(&self, slot: u32, ingress_bytes: u64, egress_bytes: u64) {
        if let Ok(mut m) = self.allowance.lock() {
            m.insert(slot, (ingress_bytes, egress_bytes));
        }
    }
}

#[test]
fn tick_settles_kernel_spending_and_grants_the_positive_balance() {
    let shaper = Shaper::new(CAP, CAP, false);
    let a = Arc::new(TenantShaper::new(1_000_000, 1_000_000, 10_000, 64, 0.5, 0));
    let b = tenant(0.25); // not served by XDP
    shaper.add(Member { shaper: a.clone(), kernel_slot: Some(3) });
    shaper.add(member(&b));
    let ledger = MockLedger::default();
    ledger.spent.lock().unwrap().insert(3, (5, 3_000, 4_000));
    shaper.tick(0, Some(&ledger));
    assert_eq!(ledger.allowance.lock().unwrap().get(&3), Some(&(7_000, 6_000)));
    assert_eq!(a.counters.kernel_requests.load(Ordering::Relaxed), 5);
    assert_eq!(a.counters.kernel_bytes_in.load(Ordering::Relaxed), 3_000);
    assert_eq!(a.counters.kernel_bytes_out.load(Ordering::Relaxed), 4_000);
    assert_eq!(a.ingress.charged_bytes_total(), 3_000);
    assert_eq!(a.egress.charged_bytes_total(), 4_000);
    // XDP overspent its allowance: the debt is the tenant's, its allowance drops to 0; 1 ms
    // later the egress side has refilled 1000 bytes.
    ledger.spent.lock().unwrap().insert(3, (1, 20_000, 0));
    shaper.tick(MS, Some(&ledger));
    assert_eq!(ledger.allowance.lock().unwrap().get(&3), Some(&(0, 7_000)));
    assert_eq!(a.ingress.available(MS), -12_000);
    assert_eq!(a.counters.kernel_requests.load(Ordering::Relaxed), 6);
    // Nothing spent: counters unchanged, allowance follows the balance.
    shaper.tick(2 * MS, Some(&ledger));
    assert_eq!(ledger.allowance.lock().unwrap().get(&3), Some(&(0, 8_000)));
    assert_eq!(a.counters.kernel_bytes_in.load(Ordering::Relaxed), 23_000);
    assert_eq!(ledger.allowance.lock().unwrap().len(), 1, "only tenants with a slot");
    assert_eq!(b.ingress.charged_bytes_total(), 0);
}

// ---- specs -----------------------------------------------------------------------------------

fn spec(name: &str, tcp: u16, udp: Option<u16>, share: f64) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        tcp_port: tcp,
        udp_port: udp,
        memory_mb: 64,
        share,
        egress_share: None,
        ingress_share: None,
        burst_bytes: 65_536,
        max_outstanding: 64,
        replicas: None,
        preferred_leader: None,
        nodes: None,
        thrift_port: None,
        thrift_cache_mb: None,
        shuffle_mb: None,
    }
}

fn field_of(r: Result<(), SpecError>) -> &'static str {
    match r {
        Err(SpecError::Field(f, _)) => f,
        other => panic!("expected a field error, got {other:?}"),
    }
}

fn conflict_text(r: Result<(), SpecError>) -> String {
    match r {
        Err(SpecError::Conflict(m)) => m,
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[test]
fn spec_json_parses_with_defaults() {
    let s = TenantSpec::from_json(br#"{"name":"t0","tcp_port":12000,"udp_port":12000,"share":0.75}"#).unwrap();
    assert_eq!(s, spec("t0", 12000, Some(12000), 0.75));
    assert_eq!(s.shares(), (0.75, 0.75));
    let sh = ShapingSpec { egress_bytes_per_s: 40_000_000, ingress_bytes_per_s: 20_000_000, work_conserving: false };
    assert_eq!(s.rates(&sh), (15_000_000, 30_000_000));
    assert_eq!(s.memory_bytes(), 64 << 20);
    let s = TenantSpec::from_json(br#"{"name":"a.b-c_9","tcp_port":1,"share":1,"egress_share":0.5,"memory_mb":1,"burst_bytes":1,"max_outstanding":1}"#).unwrap();
    assert_eq!(s.shares(), (1.0, 0.5));
}

#[test]
fn spec_json_refuses_unknown_fields_bad_types_and_oversize() {
    let e = TenantSpec::from_json(br#"{"name":"t0","tcp_port":12000,"share":0.5,"colour":"red"}"#).unwrap_err();
    assert!(matches!(&e, SpecError::Json(m) if m.contains("unknown field `colour`")), "{e}");
    let e = TenantSpec::from_json(br#"{"name":"t0","tcp_port":"12000","share":0.5}"#).unwrap_err();
    assert!(matches!(&e, SpecError::Json(m) if m.contains("invalid type")), "{e}");
    let e = TenantSpec::from_json(br#"{"name":"t0","tcp_port":70000,"share":0.5}"#).unwrap_err();
    assert!(matches!(&e, SpecError::Json(_)), "{e}");
    let e = TenantSpec::from_json(br#"{"tcp_port":1,"share":0.5}"#).unwrap_err();
    assert!(matches!(&e, SpecError::Json(m) if m.contains("missing field `name`")), "{e}");
    let e = TenantSpec::from_json(b"not json").unwrap_err();
    assert!(e.to_string().starts_with("bad JSON"), "{e}");
    // Replication groups come from the config file at start; not created at run time yet.
    let e = TenantSpec::from_json(br#"{"name":"t0","tcp_port":1,"share":0.5,"replicas":3}"#).unwrap_err();
    assert!(matches!(&e, SpecError::Field("replicas", _)), "{e}");
    assert!(TenantSpec::from_json(br#"{"name":"t0","tcp_port":1,"share":0.5,"replicas":1}"#).is_ok());
    let mut big = br#"{"name":"t0","tcp_port":1,"share":0.5}"#.to_vec();
    big.resize(JSON_BYTES_MAX + 1, b' ');
    let e = TenantSpec::from_json(&big).unwrap_err();
    assert!(matches!(&e, SpecError::Json(m) if m.contains("more than the 16384 allowed")), "{e}");
    // Parsed but out of range: a field error naming the field.
    let e = TenantSpec::from_json(br#"{"name":"t0","tcp_port":1,"share":1.5}"#).unwrap_err();
    assert!(matches!(e, SpecError::Field("share", _)), "{e}");
    let e = TenantPatch::from_json(br#"{"share":0.5,"name":"x"}"#).unwrap_err();
    assert!(matches!(&e, SpecError::Json(m) if m.contains("unknown field `name`")), "{e}");
    let e = TenantPatch::from_json(br#"{"burst_bytes":-1}"#).unwrap_err();
    assert!(matches!(e, SpecError::Json(_)), "{e}");
}

#[test]
fn spec_field_rules() {
    let ok = spec("t0", 12000, None, 0.5);
    assert_eq!(ok.validate(), Ok(()));
    let with = |f: &dyn Fn(&mut TenantSpec)| {
        let mut s = ok.clone();
        f(&mut s);
        s.validate()
    };
    assert_eq!(field_of(with(&|s| s.name = String::new())), "name");
    assert_eq!(field_of(with(&|s| s.name = "x".repeat(NAME_BYTES_MAX + 1))), "name");
    assert_eq!(with(&|s| s.name = "x".repeat(NAME_BYTES_MAX)), Ok(()));
    assert_eq!(field_of(with(&|s| s.name = "a/b".into())), "name");
    assert_eq!(field_of(with(&|s| s.name = "é".into())), "name");
    assert_eq!(field_of(with(&|s| s.tcp_port = 0)), "tcp_port");
    assert_eq!(field_of(with(&|s| s.udp_port = Some(0))), "udp_port");
    assert_eq!(field_of(with(&|s| s.memory_mb = 0)), "memory_mb");
    assert_eq!(field_of(with(&|s| s.memory_mb = MEMORY_MB_MAX + 1)), "memory_mb");
    assert_eq!(field_of(with(&|s| s.share = 0.0)), "share");
    assert_eq!(field_of(with(&|s| s.share = f64::NAN)), "share");
    assert_eq!(field_of(with(&|s| s.share = f64::INFINITY)), "share");
    assert_eq!(field_of(with(&|s| s.share = 1.0000001)), "share");
    assert_eq!(with(&|s| s.share = 1.0), Ok(()));
    assert_eq!(field_of(with(&|s| s.egress_share = Some(-0.1))), "egress_share");
    assert_eq!(field_of(with(&|s| s.ingress_share = Some(2.0))), "ingress_share");
    assert_eq!(field_of(with(&|s| s.burst_bytes = 0)), "burst_bytes");
    assert_eq!(field_of(with(&|s| s.burst_bytes = BURST_BYTES_MAX + 1)), "burst_bytes");
    assert_eq!(field_of(with(&|s| s.max_outstanding = 0)), "max_outstanding");
    assert_eq!(field_of(with(&|s| s.max_outstanding = MAX_OUTSTANDING_MAX + 1)), "max_outstanding");
    let e = with(&|s| s.share = 0.0).unwrap_err().to_string();
    assert_eq!(e, "share: must be a number in (0, 1], got 0");

    let sh = ShapingSpec::default();
    assert_eq!(sh.validate(), Ok(()));
    assert_eq!(field_of(ShapingSpec { ingress_bytes_per_s: 0, ..sh.clone() }.validate()), "ingress_bytes_per_s");
    assert_eq!(
        field_of(ShapingSpec { egress_bytes_per_s: CAPACITY_BYTES_PER_S_MAX + 1, ..sh }.validate()),
        "egress_bytes_per_s"
    );
}

#[test]
fn patch_rules_and_application() {
    let e = TenantPatch::from_json(b"{}").unwrap_err();
    assert_eq!(e, SpecError::Field("body", "nothing to change".into()));
    let e = TenantPatch::from_json(br#"{"share":null}"#).unwrap_err();
    assert!(matches!(e, SpecError::Field("body", _)));
    for (body, field) in [
        (&br#"{"share":0}"#[..], "share"),
        (br#"{"egress_share":1.5}"#, "egress_share"),
        (br#"{"ingress_share":-1}"#, "ingress_share"),
        (br#"{"burst_bytes":0}"#, "burst_bytes"),
        (br#"{"memory_mb":0}"#, "memory_mb"),
        (br#"{"max_outstanding":0}"#, "max_outstanding"),
    ] {
        match TenantPatch::from_json(body) {
            Err(SpecError::Field(f, _)) => assert_eq!(f, field),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
        }
    }
    let mut base = spec("t0", 12000, None, 0.5);
    base.egress_share = Some(0.25);
    // share alone keeps the explicit egress share.
    let p = TenantPatch::from_json(br#"{"share":0.1}"#).unwrap();
    let s = base.patched(&p);
    assert_eq!(s.shares(), (0.1, 0.25));
    assert_eq!((s.burst_bytes, s.memory_mb, s.max_outstanding), (65_536, 64, 64));
    let p = TenantPatch::from_json(
        br#"{"share":0.1,"egress_share":0.2,"ingress_share":0.3,"burst_bytes":1000,"memory_mb":8,"max_outstanding":4}"#,
    )
    .unwrap();
    let s = base.patched(&p);
    assert_eq!(s.shares(), (0.3, 0.2));
    assert_eq!((s.share, s.burst_bytes, s.memory_mb, s.max_outstanding), (0.1, 1000, 8, 4));
    assert_eq!((s.name.as_str(), s.tcp_port), ("t0", 12000));
}

#[test]
fn validate_all_conflicts() {
    let sh = ShapingSpec::default();
    let a = spec("a", 12000, Some(12000), 0.5);
    let b = spec("b", 12001, Some(12002), 0.5);
    assert_eq!(validate_all(&sh, &[a.clone(), b.clone()], &[9000]), Ok(()));
    assert_eq!(validate_all(&sh, &[], &[]), Ok(()));

    let dup = spec("a", 13000, None, 0.1);
    let m = conflict_text(validate_all(&sh, &[a.clone(), dup], &[]));
    assert_eq!(m, "tenant name \"a\" is used twice");

    let m = conflict_text(validate_all(&sh, &[a.clone(), spec("c", 12000, None, 0.1)], &[]));
    assert_eq!(m, "tcp_port 12000 of tenant \"c\" is already used by tenant \"a\"");
    let m = conflict_text(validate_all(&sh, &[a.clone(), spec("c", 13000, Some(12000), 0.1)], &[]));
    assert_eq!(m, "udp_port 12000 of tenant \"c\" is already used by tenant \"a\"");
    let m = conflict_text(validate_all(&sh, &[b.clone(), spec("c", 12002, None, 0.1)], &[]));
    assert_eq!(m, "tcp_port 12002 of tenant \"c\" is already used by tenant \"b\"");

    let m = conflict_text(validate_all(&sh, &[a.clone(), spec("c", 13000, None, 0.1)], &[13000]));
    assert!(m.contains("tcp_port 13000 of tenant \"c\" is reserved"), "{m}");
    let m = conflict_text(validate_all(&sh, std::slice::from_ref(&a), &[12000]));
    assert!(m.contains("12000") && m.contains("reserved"), "{m}");

    let m = conflict_text(validate_all(&sh, &[spec("x", 1, None, 0.6), spec("y", 2, None, 0.6)], &[]));
    assert_eq!(m, "ingress shares add up to 1.2, more than 1");
    let three = [spec("x", 1, None, 0.4), spec("y", 2, None, 0.4), spec("z", 3, None, 0.4)];
    assert_eq!(conflict_text(validate_all(&sh, &three, &[])), "ingress shares add up to 1.2, more than 1");
    // Directional shares: ingress fits, egress does not.
    let mut x = spec("x", 1, None, 0.6);
    x.ingress_share = Some(0.4);
    assert_eq!(
        conflict_text(validate_all(&sh, &[x, spec("y", 2, None, 0.6)], &[])),
        "egress shares add up to 1.2, more than 1"
    );
    // Eight tenants at 0.125 add up to exactly 1.
    let eight: Vec<_> = (0..8).map(|i| spec(&format!("t{i}"), 12000 + i, None, 0.125)).collect();
    assert_eq!(validate_all(&sh, &eight, &[]), Ok(()));
    // Thirds written by hand pass thanks to the slack.
    let thirds: Vec<_> = (0..3).map(|i| spec(&format!("t{i}"), 12000 + i, None, 0.333_333_4)).collect();
    assert_eq!(validate_all(&sh, &thirds, &[]), Ok(()));

    let many: Vec<_> = (0..=TENANTS_MAX as u16).map(|i| spec(&format!("t{i}"), 10000 + i, None, 0.01)).collect();
    assert!(conflict_text(validate_all(&sh, &many, &[])).contains("at most 64"));

    // A bad field names the tenant.
    match validate_all(&sh, &[a, spec("bad", 0, None, 0.1)], &[]) {
        Err(SpecError::Field("tcp_port", why)) => assert!(why.contains("tenant \"bad\""), "{why}"),
        other => panic!("{other:?}"),
    }
    let bad_shaping = ShapingSpec { ingress_bytes_per_s: 0, ..ShapingSpec::default() };
    assert!(matches!(validate_all(&bad_shaping, &[], &[]), Err(SpecError::Field("ingress_bytes_per_s", _))));
}

/// A tenant's Thrift port (the HBase range cache) is one more port of the tenant: unique across
/// tenants and reserved ports, not its own TCP port; it takes half the tenant's memory.
#[test]
fn thrift_port_rules_and_memory_split() {
    let sh = ShapingSpec::default();
    let mut a = spec("a", 12000, None, 0.5);
    assert_eq!(a.memory_split(), (64 << 20, 0));
    a.thrift_port = Some(12010);
    assert_eq!(a.memory_split(), (32 << 20, 32 << 20));
    assert_eq!(validate_all(&sh, &[a.clone(), spec("b", 12001, None, 0.5)], &[]), Ok(()));
    let m = conflict_text(validate_all(&sh, &[a.clone(), spec("b", 12010, None, 0.5)], &[]));
    assert_eq!(m, "tcp_port 12010 of tenant \"b\" is already used by tenant \"a\"");
    let m = conflict_text(validate_all(&sh, std::slice::from_ref(&a), &[12010]));
    assert!(m.contains("thrift_port 12010") && m.contains("reserved"), "{m}");
    let mut own = a.clone();
    own.thrift_port = Some(12000);
    assert_eq!(field_of(own.validate()), "thrift_port");
    own.thrift_port = Some(0);
    assert_eq!(field_of(own.validate()), "thrift_port");
    let parsed: TenantSpec =
        serde_json::from_str(r#"{"name":"t","tcp_port":1,"share":0.1,"thrift_port":9091}"#).expect("parses");
    assert_eq!(parsed.thrift_port, Some(9091));
}

/// `thrift_cache_mb` sets the range cache's part of `memory_mb` (the KV store keeps the rest, at
/// least 1 MiB, after `shuffle_mb`); it needs `thrift_port`; a patch may change it or
/// `memory_mb`, and the patched spec is checked against both.
#[test]
fn thrift_cache_mb_sets_the_cache_share() {
    let mut a = spec("a", 12000, None, 0.5);
    a.thrift_port = Some(12010);
    a.thrift_cache_mb = Some(48);
    assert_eq!(a.validate(), Ok(()));
    assert_eq!(a.memory_split(), (16 << 20, 48 << 20));
    a.shuffle_mb = Some(8);
    assert_eq!(a.memory_split(), (8 << 20, 48 << 20));
    a.thrift_cache_mb = Some(56);
    assert_eq!(field_of(a.validate()), "thrift_cache_mb", "nothing left for the store");
    a.shuffle_mb = None;
    a.thrift_cache_mb = Some(63);
    assert_eq!((a.validate(), a.memory_split()), (Ok(()), (1 << 20, 63 << 20)));
    a.thrift_cache_mb = Some(64);
    assert_eq!(field_of(a.validate()), "thrift_cache_mb");
    a.thrift_cache_mb = Some(0);
    assert_eq!(field_of(a.validate()), "thrift_cache_mb");
    let mut no_port = spec("b", 12001, None, 0.5);
    no_port.thrift_cache_mb = Some(8);
    assert_eq!(field_of(no_port.validate()), "thrift_cache_mb", "needs thrift_port");
    // Admin: a patch of the share, or of memory_mb, is checked against it.
    a.thrift_cache_mb = Some(16);
    let p = TenantPatch::from_json(br#"{"thrift_cache_mb": 40}"#).expect("a patch");
    assert_eq!(a.patched(&p).memory_split(), (24 << 20, 40 << 20));
    let smaller = a.patched(&TenantPatch { memory_mb: Some(16), ..TenantPatch::default() });
    assert_eq!(field_of(smaller.validate()), "thrift_cache_mb", "memory_mb below the cache share");
    let bigger = a.patched(&TenantPatch { memory_mb: Some(128), ..TenantPatch::default() });
    assert_eq!(bigger.memory_split(), (112 << 20, 16 << 20), "the share stays what was set");
    assert!(TenantPatch::from_json(br#"{"thrift_cache_mb": 0}"#).is_err());
    let parsed: TenantSpec =
        serde_json::from_str(r#"{"name":"t","tcp_port":1,"share":0.1,"thrift_port":9091,"thrift_cache_mb":12}"#)
            .expect("parses");
    assert_eq!(parsed.thrift_cache_mb, Some(12));
}

// ---- services outside the serving loops (the shuffle service) --------------------------------

#[test]
fn a_transfer_waits_only_while_its_own_bucket_is_in_debt() {
    // 1 MB/s each way, 64 KiB burst, at t = 0.
    let s = TenantShaper::new(1_000_000, 1_000_000, 65_536, 64, 0.5, 0);
    assert_eq!(s.transfer_wait_ns(Direction::In, 0), 0);
    // A 2 MiB block committed: the ingress bucket owes 2 MiB - 64 KiB, repaid at 1 MB/s.
    s.charge_transfer(Direction::In, 2 << 20);
    let wait = s.transfer_wait_ns(Direction::In, 0);
    let owed = (2u64 << 20) - 65_536 + 1;
    assert!(wait >= owed * 1_000 && wait <= owed * 1_000 + REFILL_GRAIN_NS, "{wait}");
    assert_eq!(s.counters.throttled.load(Ordering::Relaxed), 1);
    assert!(s.take_wanted_more(), "a held-back transfer asks for spare capacity");
    // The other direction is not held back by it.
    assert_eq!(s.transfer_wait_ns(Direction::Out, 0), 0);
    assert_eq!(s.ingress.charged_bytes_total(), 2 << 20);
    assert_eq!(s.egress.charged_bytes_total(), 0);
    // Once the debt is repaid, transfers go again.
    assert_eq!(s.transfer_wait_ns(Direction::In, wait), 0);
}

#[test]
fn a_shuffle_share_comes_out_of_the_tenants_memory() {
    let mut t = spec("spark", 7001, None, 0.5);
    assert_eq!((t.memory_bytes(), t.shuffle_bytes()), (64 << 20, 0));
    t.shuffle_mb = Some(48);
    t.validate().unwrap();
    assert_eq!((t.memory_bytes(), t.shuffle_bytes()), (16 << 20, 48 << 20));
    // The store keeps at least 1 MiB, so the share is below memory_mb.
    for bad in [0, 64, 65] {
        t.shuffle_mb = Some(bad);
        assert_eq!(field_of(t.validate()), "shuffle_mb", "{bad}");
    }
    // A patch lowering memory_mb under the share is refused by the same rule.
    t.shuffle_mb = Some(48);
    let lowered = t.patched(&TenantPatch { memory_mb: Some(32), ..TenantPatch::default() });
    assert_eq!(field_of(lowered.validate()), "shuffle_mb");
    // Not at run time: the pool's shares are fixed at start.
    let body = br#"{"name":"x","tcp_port":7009,"share":0.1,"memory_mb":8,"shuffle_mb":4}"#;
    assert!(matches!(TenantSpec::from_json(body), Err(SpecError::Field("shuffle_mb", _))));
}
