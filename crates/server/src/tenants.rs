//! Tenants as the serving loops see them: each tenant has its own ports, its own store (its own
//! memory limit and eviction), its own counters for `stats`, and (when shaping is configured)
//! its own [`TenantShaper`]. The table of tenants can change at run time: the admin endpoint adds,
//! edits and removes tenants through [`TenantTable`]'s [`TenantControl`] implementation, and each
//! worker thread picks up the change (new listeners, closed ones) at the top of its next loop.
//!
//! Isolation is by port, as in the multi-tenant KV paper: a connection belongs to the tenant whose
//! port it arrived on, and every request on it runs against that tenant's store only, so a
//! tenant can never name another tenant's keys, flush them or count them.
//!
//! Without `[[tenant]]` the daemon runs one implicit tenant with no shaper, on `-p`/`-U`: the
//! serving loops take the same path with the shaping steps skipped.
//!
//! Not for: the shaping arithmetic (slipstream-tenancy) or HTTP (admin.rs).

use crate::bind::{bind_all, Bound};
use crate::exec::Settings;
use crate::stats::{FastPathSource, FastPathTotals, ServerInfo, ThreadStats};
use mio::Waker;
use slipstream_replication::{AdminError, AdminOp};
use slipstream_store::{KernelCache, Store, StoreConfig};
use slipstream_tenancy::shaper::Member;
use slipstream_tenancy::spec::{validate_all, SpecError, TENANTS_MAX};
use slipstream_tenancy::{
    ControlError, ReplicaChange, Shaper, ShapingSpec, TenantControl, TenantPatch, TenantShaper, TenantSpec, TenantView,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Instant;

/// What the kernel fast path offers the tenant table (implemented by the fastpath glue). Kept as
/// a trait so the table does not depend on how XDP keeps its per-tenant state.
pub trait KernelTenants: Send + Sync {
    /// Serve `udp_port` for kernel slot `slot`, paying from the tenant's allowance if `shaped`.
    fn add_tenant(&self, slot: u32, udp_port: u16, shaped: bool) -> Result<(), String>;
    /// Stop serving `slot` and drop its cached entries.
    fn remove_tenant(&self, slot: u32);
    /// The store observer that keeps the kernel's copy of `slot`'s items coherent.
    fn observer(&self, slot: u32) -> Arc<dyn KernelCache>;
    /// The ledger the control tick settles with.
    fn ledger(&self) -> &dyn slipstream_tenancy::KernelLedger;
    /// `slot`'s kernel counters, for `stats` on the tenant's ports.
    fn totals(&self, slot: u32) -> FastPathTotals;
}

/// A service owning more ports of a tenant than its KV ones (the HBase Thrift front end,
/// crates/rangecache, wired by the binary): told when a tenant with such a port comes, changes
/// or goes, so those ports follow the tenant table as its KV ports do. Kept as a trait so this
/// crate knows nothing of the service.
pub trait TenantPorts: Send + Sync {
    /// Open the tenant's ports (shaped by `t.shaper`); an error keeps the tenant out.
    fn added(&self, t: &Tenant, spec: &TenantSpec) -> Result<(), ControlError>;
    /// The spec in force changed (memory, shares: the buckets are the tenant's own already).
    fn changed(&self, t: &Tenant, spec: &TenantSpec);
    /// Close the tenant's ports and connections and drop what it cached.
    fn removed(&self, t: &Tenant);
}

/// One tenant.
pub struct Tenant {
    pub name: String,
    /// Stable index while the tenant exists: worker listener tokens and the kernel's tenant table.
    pub slot: u32,
    pub store: Arc<Store>,
    /// This tenant's counters and connection gauges (`stats` on its ports shows only these).
    pub info: Arc<ServerInfo>,
    /// None in single-tenant mode (no shaping at all).
    pub shaper: Option<Arc<TenantShaper>>,
    /// The spec in force (None for the implicit single tenant).
    spec: Mutex<Option<TenantSpec>>,
    removed: AtomicBool,
    /// One listener per worker thread (SO_REUSEPORT); each worker takes its own.
    tcp: Mutex<Vec<Option<std::net::TcpListener>>>,
    udp: Mutex<Vec<Option<std::net::UdpSocket>>>,
    pub tcp_local: Option<SocketAddr>,
    pub udp_local: Option<SocketAddr>,
    /// `-l notls:ADDR` under `-Z`: connections on this listener are not TLS.
    pub tls_exempt: bool,
    /// Set once at start-up for a tenant with `replicas > 1`: its mutations go through its
    /// Raft group (see `replicated`).
    pub replica: OnceLock<Arc<crate::replicated::Replica>>,
    /// Set once at start-up for a replicated tenant this node holds no replica of: its
    /// connections are relayed to a node that does (see `relay`).
    pub relay: OnceLock<Arc<crate::relay::Relay>>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.name).field("slot", &self.slot).finish_non_exhaustive()
    }
}

impl Tenant {
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Worker `index` takes its listeners (once).
    pub(crate) fn take_sockets(&self, index: usize) -> (Option<std::net::TcpListener>, Option<std::net::UdpSocket>) {
        let tcp = self.tcp.lock().unwrap_or_else(PoisonError::into_inner).get_mut(index).and_then(Option::take);
        let udp = self.udp.lock().unwrap_or_else(PoisonError::into_inner).get_mut(index).and_then(Option::take);
        (tcp, udp)
    }

    pub fn spec(&self) -> Option<TenantSpec> {
        self.spec.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// What a new tenant's store and counters are built from.
#[derive(Clone, Debug)]
pub struct TenantDefaults {
    pub listen: IpAddr,
    pub store: StoreConfig,
    pub conn_limit: usize,
    pub item_bytes_max: usize,
    pub listen_interface: Option<String>,
    /// Ports tenants may not take (e.g. the admin port).
    pub reserved_ports: Vec<u16>,
}

/// All tenants, shared by the workers, the admin endpoint and the control tick.
pub struct TenantTable {
    list: RwLock<Vec<Arc<Tenant>>>,
    /// Bumped on every add/remove; workers compare it with what they last saw (one atomic
    /// load per loop turn).
    generation: AtomicU64,
    pub threads: usize,
    started: Instant,
    /// Connections over all tenants, checked against `conn_limit`.
    pub conns_total: AtomicU64,
    pub conn_limit: usize,
    /// Node-wide shaping (None in single-tenant mode).
    pub shaper: Option<Arc<Shaper>>,
    shaping: Mutex<ShapingSpec>,
    defaults: Option<TenantDefaults>,
    /// Shared with each tenant's `stats` counter source, hence the Arc.
    kernel: Arc<OnceLock<Arc<dyn KernelTenants>>>,
    wakers: OnceLock<Vec<Arc<Waker>>>,
    /// Admin changes one at a time (validation sees a consistent table).
    control: Mutex<()>,
    pub settings: Arc<Settings>,
    /// Other ports of tenants (`thrift_port`), if such a service runs.
    ports: OnceLock<Arc<dyn TenantPorts>>,
}

impl std::fmt::Debug for TenantTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantTable").field("threads", &self.threads).finish_non_exhaustive()
    }
}

fn tenant_info(
    started: Instant,
    threads: usize,
    conn_limit: usize,
    item_bytes_max: usize,
    listen_interface: Option<String>,
    tcp: Option<SocketAddr>,
    udp: Option<SocketAddr>,
) -> ServerInfo {
    ServerInfo {
        started,
        pid: std::process::id(),
        threads,
        conn_limit,
        tcp_port: tcp.map(|a| a.port()).unwrap_or(0),
        udp_port: udp.map(|a| a.port()).unwrap_or(0),
        item_bytes_max,
        curr_connections: AtomicU64::new(0),
        // One per worker, then the replication thread's (it applies a replicated tenant's
        // writes; `replicated::ApplyExec`).
        per_thread: (0..=threads).map(|_| Arc::new(ThreadStats::default())).collect(),
        fastpath_enabled: false,
        fastpath: None,
        listen_interface,
        verbosity: AtomicU64::new(0),
        conns: Default::default(),
        prefix_stats: Default::default(),
        cache_memlimit_allowed: false,
    }
}

impl TenantTable {
    /// Single-tenant mode: one implicit tenant serving `store` on the given sockets. Each
    /// further address (memcached `-l a,b`) is one more slot sharing the same store, counters
    /// and settings, so it serves exactly like the first.
    pub(crate) fn single(
        threads: usize,
        conn_limit: usize,
        settings: Arc<Settings>,
        store: Arc<Store>,
        info: Arc<ServerInfo>,
        bound: Vec<Bound>,
        tls_exempt: &[usize],
    ) -> TenantTable {
        let list = bound
            .into_iter()
            .enumerate()
            .map(|(slot, (tcps, udps, tcp_local, udp_local))| {
                Arc::new(Tenant {
                    name: "default".into(),
                    slot: slot as u32,
                    store: store.clone(),
                    info: info.clone(),
                    shaper: None,
                    spec: Mutex::new(None),
                    removed: AtomicBool::new(false),
                    tcp: Mutex::new(tcps),
                    udp: Mutex::new(udps),
                    tcp_local,
                    udp_local,
                    tls_exempt: tls_exempt.contains(&slot),
                    replica: OnceLock::new(),
                    relay: OnceLock::new(),
                })
            })
            .collect();
        TenantTable {
            list: RwLock::new(list),
            generation: AtomicU64::new(1),
            threads,
            started: info.started,
            conns_total: AtomicU64::new(info.curr_connections.load(Ordering::Relaxed)),
            conn_limit,
            shaper: None,
            shaping: Mutex::new(ShapingSpec::default()),
            defaults: None,
            kernel: Arc::new(OnceLock::new()),
            wakers: OnceLock::new(),
            control: Mutex::new(()),
            settings,
            ports: OnceLock::new(),
        }
    }

    /// Tenant mode: validate all specs, bind every tenant's ports and build their stores. Nothing
    /// is served until the workers start.
    pub fn multi(
        threads: usize,
        settings: Arc<Settings>,
        shaping: ShapingSpec,
        specs: &[TenantSpec],
        defaults: TenantDefaults,
    ) -> Result<TenantTable, ControlError> {
        shaping.validate().map_err(ControlError::Invalid)?;
        validate_all(&shaping, specs, &defaults.reserved_ports).map_err(ControlError::Invalid)?;
        let shaper =
            Arc::new(Shaper::new(shaping.ingress_bytes_per_s, shaping.egress_bytes_per_s, shaping.work_conserving));
        let table = TenantTable {
            list: RwLock::new(Vec::new()),
            generation: AtomicU64::new(1),
            threads: threads.max(1),
            started: Instant::now(),
            conns_total: AtomicU64::new(0),
            conn_limit: defaults.conn_limit,
            shaper: Some(shaper),
            shaping: Mutex::new(shaping),
            defaults: Some(defaults),
            kernel: Arc::new(OnceLock::new()),
            wakers: OnceLock::new(),
            control: Mutex::new(()),
            settings,
            ports: OnceLock::new(),
        };
        for spec in specs {
            let t = table.build(spec.clone())?;
            table.list.write().unwrap_or_else(PoisonError::into_inner).push(t);
        }
        Ok(table)
    }

    /// Bind a tenant's ports and build its store, counters and shaper (not yet in the list).
    fn build(&self, spec: TenantSpec) -> Result<Arc<Tenant>, ControlError> {
        let Some(d) = self.defaults.as_ref() else {
            return Err(ControlError::Failed("tenants cannot be added in single-tenant mode".into()));
        };
        if spec.udp_port.is_some() && self.settings.auth.is_some() {
            // As memcached refuses UDP under -S/-Y: a UDP port would serve without authenticating.
            return Err(ControlError::Conflict(format!(
                "tenant {:?}: no udp_port while -S/-Y authenticate the tenants' ports (UDP cannot authenticate)",
                spec.name
            )));
        }
        let slot = self.free_slot().ok_or_else(|| ControlError::Conflict(format!("at most {TENANTS_MAX} tenants")))?;
        let tcp = Some(SocketAddr::new(d.listen, spec.tcp_port));
        let udp = spec.udp_port.map(|p| SocketAddr::new(d.listen, p));
        let bound = bind_all(tcp, udp, self.threads, self.settings.tunables.tcp_backlog).map_err(|e| {
            // Taken by another process (or a port this one may not share): 409.
            if e.in_use() {
                ControlError::Conflict(format!("tenant {:?}: {e}", spec.name))
            } else {
                ControlError::Failed(format!("tenant {:?}: {e}", spec.name))
            }
        })?;
        // Lock shards as the single-tenant daemon picks them, for the tenant's own memory.
        let memory = spec.memory_split().0;
        let shards = StoreConfig::shards_for(memory, d.store.item_bytes_max);
        let store = Arc::new(Store::new(StoreConfig { memory_bytes_max: memory, shards, ..d.store.clone() }));
        crate::watch::log_evictions(&self.settings.logger, &store);
        crate::maintainer::look_after(&self.settings.tunables, &store);
        let mut info = tenant_info(
            self.started,
            self.threads,
            d.conn_limit,
            d.item_bytes_max,
            d.listen_interface.clone(),
            bound.2,
            bound.3,
        );
        // `stats conns` on the tenant's ports lists its listener and UDP sockets, as
        // memcached's lists its own.
        info.register_listeners(&bound, self.threads);
        let (tcps, udps, tcp_local, udp_local) = bound;
        info.prefix_stats.set_enabled(self.settings.detail_enabled);
        // `stats` on the tenant's ports shows its own kernel hits once the fast path is attached.
        let kernel = self.kernel.clone();
        info.fastpath = Some(FastPathSource(Arc::new(move || kernel.get().map(|k| k.totals(slot)))));
        let info = Arc::new(info);
        let shaping = self.shaping.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let (rin, rout) = spec.rates(&shaping);
        let shaper = Arc::new(TenantShaper::new(
            rin,
            rout,
            spec.burst_bytes,
            spec.max_outstanding,
            spec.share,
            slipstream_tenancy::since_start_ns(),
        ));
        let t = Arc::new(Tenant {
            name: spec.name.clone(),
            slot,
            store,
            info,
            shaper: Some(shaper),
            spec: Mutex::new(Some(spec)),
            removed: AtomicBool::new(false),
            tcp: Mutex::new(tcps),
            udp: Mutex::new(udps),
            tcp_local,
            udp_local,
            tls_exempt: false,
            replica: OnceLock::new(),
            relay: OnceLock::new(),
        });
        Ok(t)
    }

    fn free_slot(&self) -> Option<u32> {
        let list = self.list.read().unwrap_or_else(PoisonError::into_inner);
        (0..TENANTS_MAX as u32).find(|s| !list.iter().any(|t| t.slot == *s))
    }

    /// Hook tenants into the shaper's control tick and (if given) the kernel fast path; call once
    /// before the workers start.
    pub fn connect(&self, kernel: Option<Arc<dyn KernelTenants>>) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(k) = kernel {
            let _ = self.kernel.set(k);
        }
        let list = self.snapshot();
        for t in &list {
            if let Err(e) = self.attach_tenant(t) {
                problems.push(format!("tenant {}: kernel fast path off for it: {e}", t.name));
            }
        }
        problems
    }

    fn attach_tenant(&self, t: &Arc<Tenant>) -> Result<(), String> {
        let mut kernel_slot = None;
        let mut result = Ok(());
        if let (Some(k), Some(udp)) = (self.kernel.get(), t.udp_local) {
            match k.add_tenant(t.slot, udp.port(), t.shaper.is_some()) {
                Ok(()) => {
                    t.store.set_kernel_cache(k.observer(t.slot));
                    kernel_slot = Some(t.slot);
                }
                Err(e) => result = Err(e),
            }
        }
        if let (Some(shaper), Some(ts)) = (self.shaper.as_ref(), t.shaper.as_ref()) {
            shaper.add(Member { shaper: ts.clone(), kernel_slot });
        }
        result
    }

    pub(crate) fn set_wakers(&self, wakers: Vec<Arc<Waker>>) {
        let _ = self.wakers.set(wakers);
    }

    fn wake_all(&self) {
        if let Some(w) = self.wakers.get() {
            for w in w {
                let _ = w.wake();
            }
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> Vec<Arc<Tenant>> {
        self.list.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The first tenant's sockets' addresses (single-tenant mode: the -p/-U sockets).
    pub fn first_locals(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        self.list
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .first()
            .map(|t| (t.tcp_local, t.udp_local))
            .unwrap_or((None, None))
    }

    /// The control tick: settle the kernel's spending and re-divide capacity.
    pub fn tick(&self, now_ns: u64) {
        if let Some(s) = self.shaper.as_ref() {
            s.tick(now_ns, self.kernel.get().map(|k| k.ledger()));
        }
    }

    fn specs(&self) -> Vec<TenantSpec> {
        self.snapshot().iter().filter_map(|t| t.spec()).collect()
    }

    fn reserved(&self) -> Vec<u16> {
        self.defaults.as_ref().map(|d| d.reserved_ports.clone()).unwrap_or_default()
    }

    fn view(&self, t: &Tenant) -> Option<TenantView> {
        let spec = t.spec()?;
        let st = t.store.stats();
        let (rin, rout, outstanding, throttled, dropped) = match t.shaper.as_ref() {
            Some(s) => (
                s.ingress.rate_bytes_per_s(),
                s.egress.rate_bytes_per_s(),
                s.outstanding(),
                s.counters.throttled.load(Ordering::Relaxed),
                s.counters.dropped.load(Ordering::Relaxed),
            ),
            None => (0, 0, 0, 0, 0),
        };
        Some(TenantView {
            spec,
            ingress_bytes_per_s: rin,
            egress_bytes_per_s: rout,
            memory_used_bytes: st.bytes,
            items: st.curr_items,
            evictions: st.evictions,
            outstanding,
            throttled,
            dropped,
        })
    }

    fn find(&self, name: &str) -> Option<Arc<Tenant>> {
        self.snapshot().into_iter().find(|t| t.name == name)
    }

    fn apply(&self, t: &Tenant, spec: &TenantSpec) {
        let shaping = self.shaping.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(s) = t.shaper.as_ref() {
            let (rin, rout) = spec.rates(&shaping);
            s.reconfigure(rin, rout, spec.burst_bytes, spec.max_outstanding, spec.share);
        }
        t.store.set_memory_limit(spec.memory_split().0);
        if let Some(p) = self.ports.get() {
            p.changed(t, spec);
        }
    }

    /// Registers the service owning tenants' other ports (`thrift_port`) and opens them for the
    /// tenants already in the table; later admin changes reach it too. Once, at start-up.
    pub fn set_ports(&self, ports: Arc<dyn TenantPorts>) -> Result<(), ControlError> {
        for t in self.snapshot() {
            if let Some(spec) = t.spec().filter(|s| s.thrift_port.is_some()) {
                ports.added(&t, &spec)?;
            }
        }
        self.ports.set(ports).map_err(|_| ControlError::Failed("tenant ports registered twice".into()))
    }

    /// A tenant's `thrift_port` needs the service that serves it.
    fn other_ports(&self, t: &Tenant, spec: &TenantSpec) -> Result<(), ControlError> {
        if spec.thrift_port.is_none() {
            return Ok(());
        }
        match self.ports.get() {
            Some(p) => p.added(t, spec),
            None => Err(ControlError::Invalid(SpecError::Field(
                "thrift_port",
                "needs the HBase front end ([hbase] in the config)".into(),
            ))),
        }
    }
}

/// How long `PUT /tenants/{name}` with a replication change (`leader`, `add_voter`,
/// `remove_voter`) waits to see it take effect (the admin endpoint's thread waits with it).
pub const REPLICA_CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl TenantControl for TenantTable {
    fn list(&self) -> Vec<TenantView> {
        self.snapshot().iter().filter_map(|t| self.view(t)).collect()
    }

    fn get(&self, name: &str) -> Option<TenantView> {
        self.find(name).and_then(|t| self.view(&t))
    }

    fn add(&self, spec: TenantSpec) -> Result<TenantView, ControlError> {
        let _g = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        spec.validate().map_err(ControlError::Invalid)?;
        let mut specs = self.specs();
        if specs.iter().any(|s| s.name == spec.name) {
            return Err(ControlError::Conflict(format!("tenant {:?} exists", spec.name)));
        }
        specs.push(spec.clone());
        let shaping = self.shaping.lock().unwrap_or_else(PoisonError::into_inner).clone();
        validate_all(&shaping, &specs, &self.reserved()).map_err(|e| match e {
            SpecError::Conflict(m) => ControlError::Conflict(m),
            other => ControlError::Invalid(other),
        })?;
        let t = self.build(spec.clone())?;
        self.other_ports(&t, &spec)?;
        if let Err(e) = self.attach_tenant(&t) {
            eprintln!("slipstream: tenant {}: kernel fast path off for it: {e}", t.name);
        }
        self.list.write().unwrap_or_else(PoisonError::into_inner).push(t.clone());
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake_all();
        self.view(&t).ok_or_else(|| ControlError::Failed("tenant vanished".into()))
    }

    fn update(&self, name: &str, patch: TenantPatch) -> Result<TenantView, ControlError> {
        let _g = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let t = self.find(name).ok_or_else(|| ControlError::NotFound(name.to_string()))?;
        let old = t.spec().ok_or_else(|| ControlError::NotFound(name.to_string()))?;
        let new = old.patched(&patch);
        new.validate().map_err(ControlError::Invalid)?;
        let specs: Vec<TenantSpec> =
            self.specs().into_iter().map(|s| if s.name == name { new.clone() } else { s }).collect();
        let shaping = self.shaping.lock().unwrap_or_else(PoisonError::into_inner).clone();
        validate_all(&shaping, &specs, &self.reserved()).map_err(|e| match e {
            SpecError::Conflict(m) => ControlError::Conflict(m),
            other => ControlError::Invalid(other),
        })?;
        self.apply(&t, &new);
        *t.spec.lock().unwrap_or_else(PoisonError::into_inner) = Some(new);
        self.view(&t).ok_or_else(|| ControlError::NotFound(name.to_string()))
    }

    fn remove(&self, name: &str) -> Result<(), ControlError> {
        let _g = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let t = self.find(name).ok_or_else(|| ControlError::NotFound(name.to_string()))?;
        if t.spec().is_none() {
            return Err(ControlError::NotFound(name.to_string()));
        }
        t.removed.store(true, Ordering::Release);
        self.list.write().unwrap_or_else(PoisonError::into_inner).retain(|x| !Arc::ptr_eq(x, &t));
        if let (Some(s), Some(ts)) = (self.shaper.as_ref(), t.shaper.as_ref()) {
            s.remove(ts);
        }
        if let Some(k) = self.kernel.get() {
            if t.udp_local.is_some() {
                k.remove_tenant(t.slot);
            }
        }
        if let (Some(p), true) = (self.ports.get(), t.spec().is_some_and(|s| s.thrift_port.is_some())) {
            p.removed(&t);
        }
        // Sockets workers have not taken yet close now; the workers close theirs and the
        // tenant's connections when they see the new generation.
        t.tcp.lock().unwrap_or_else(PoisonError::into_inner).clear();
        t.udp.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake_all();
        Ok(())
    }

    fn change_replica(&self, name: &str, change: ReplicaChange) -> Result<(), ControlError> {
        let t = self.find(name).ok_or_else(|| ControlError::NotFound(name.to_string()))?;
        let Some(r) = t.replica.get() else {
            return Err(ControlError::Invalid(SpecError::Field(
                "replicas",
                format!("tenant {name:?} is not replicated"),
            )));
        };
        let op = match change {
            ReplicaChange::Leader(id) => AdminOp::PreferLeader(id),
            ReplicaChange::AddVoter(id, addr) => AdminOp::AddVoter(id, addr),
            ReplicaChange::RemoveVoter(id) => AdminOp::RemoveVoter(id),
        };
        r.node().admin(r.group, op, REPLICA_CHANGE_WAIT).map_err(|e| match e {
            AdminError::Group(g) => ControlError::Failed(format!("replication: {g:?} (the change may still happen)")),
            other => ControlError::Conflict(other.to_string()),
        })
    }

    fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        const FAMILIES: [(&str, &str, &str); 12] = [
            (
                "slipstream_tenant_requests_total",
                "counter",
                "Requests executed in user space for the tenant (its memcached and Thrift ports).",
            ),
            (
                "slipstream_tenant_bytes_in_total",
                "counter",
                "Request bytes received for the tenant (user space, memcached and Thrift ports).",
            ),
            (
                "slipstream_tenant_bytes_out_total",
                "counter",
                "Reply bytes sent for the tenant (user space, memcached and Thrift ports).",
            ),
            (
                "slipstream_tenant_throttled_total",
                "counter",
                "Times the tenant's reads or batches were held back by its buckets or max_outstanding.",
            ),
            ("slipstream_tenant_dropped_total", "counter", "UDP requests dropped because the tenant's queue was full."),
            ("slipstream_tenant_memory_bytes", "gauge", "Bytes charged for the tenant's items."),
            ("slipstream_tenant_memory_limit_bytes", "gauge", "The tenant's memory limit."),
            ("slipstream_tenant_items", "gauge", "Items in the tenant's store."),
            ("slipstream_tenant_evictions_total", "counter", "Items evicted from the tenant's store to make room."),
            (
                "slipstream_tenant_kernel_requests_total",
                "counter",
                "Requests the kernel fast path answered for the tenant.",
            ),
            ("slipstream_tenant_ingress_rate_bytes_per_s", "gauge", "Ingress bucket refill rate in force."),
            ("slipstream_tenant_egress_rate_bytes_per_s", "gauge", "Egress bucket refill rate in force."),
        ];
        // One snapshot per tenant (counters summed once, store stats read once), values in
        // FAMILIES order.
        let rows: Vec<(String, [u64; 12])> = self
            .snapshot()
            .iter()
            .filter(|t| t.spec().is_some())
            .map(|t| {
                let c = t.info.totals();
                let st = t.store.stats();
                let sh = |f: fn(&TenantShaper) -> u64| t.shaper.as_deref().map(f).unwrap_or(0);
                let values = [
                    c.requests + sh(|s| s.counters.port_requests.load(Ordering::Relaxed)),
                    c.bytes_read + sh(|s| s.counters.port_bytes_in.load(Ordering::Relaxed)),
                    c.bytes_written + sh(|s| s.counters.port_bytes_out.load(Ordering::Relaxed)),
                    sh(|s| s.counters.throttled.load(Ordering::Relaxed)),
                    sh(|s| s.counters.dropped.load(Ordering::Relaxed)),
                    st.bytes,
                    st.limit_maxbytes,
                    st.curr_items,
                    st.evictions,
                    sh(|s| s.counters.kernel_requests.load(Ordering::Relaxed)),
                    sh(|s| s.ingress.rate_bytes_per_s()),
                    sh(|s| s.egress.rate_bytes_per_s()),
                ];
                (t.name.clone(), values)
            })
            .collect();
        for (i, (name, kind, help)) in FAMILIES.iter().enumerate() {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (tenant, values) in &rows {
                let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {}", values[i]);
            }
        }
    }
}

/// The kernel fast path as the tenant table uses it.
pub struct KernelAdapter(pub Arc<crate::fastpath::KernelFastPath>);

impl KernelTenants for KernelAdapter {
    fn add_tenant(&self, slot: u32, udp_port: u16, shaped: bool) -> Result<(), String> {
        self.0.add_tenant(slot, udp_port, shaped).map_err(|e| e.to_string())
    }

    fn remove_tenant(&self, slot: u32) {
        if let Err(e) = self.0.remove_tenant(slot) {
            eprintln!("slipstream: kernel fast path: removing tenant slot {slot}: {e}");
        }
    }

    fn observer(&self, slot: u32) -> Arc<dyn KernelCache> {
        self.0.observer(slot)
    }

    fn ledger(&self) -> &dyn slipstream_tenancy::KernelLedger {
        &*self.0
    }

    fn totals(&self, slot: u32) -> FastPathTotals {
        let c = self.0.tenant_totals(slot);
        FastPathTotals { hits: c.hits, misses: c.misses, ..FastPathTotals::default() }
    }
}
