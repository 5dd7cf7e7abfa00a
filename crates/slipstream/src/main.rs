//! The `slipstream` daemon: command line and config file → store + serving threads.
//!
//! What it is for: memcached's common flags with memcached's defaults, `--config FILE` (TOML)
//! for the rest, one status line at start, clean shutdown on SIGINT/SIGTERM.
//!
//! What it is not for: request handling (slipstream-server) or item semantics
//! (slipstream-store).

mod cluster;
mod config;
mod daemon;
mod mcopts;
mod privs;
mod restart;
mod security;
mod send;
mod tenant_thrift;

// The global allocator. Item memory is many long-lived blocks of mixed sizes freed in LRU
// order: glibc malloc keeps the holes (its arenas fragment; measured RSS 2.4-2.8x -m with
// values of 1 KB-500 KB). jemalloc's size classes and page-run reuse, with freed pages returned
// at once (below), keep RSS near the charged bytes: 81-90 MB at -m 64 where glibc held 114-140
// and mimalloc (its defaults) 240-251 (docs/benchmarks.md). `--no-default-features --features
// alloc-mimalloc` builds the alternative that was measured against it.
#[cfg(feature = "alloc-jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
/// jemalloc's options (its `malloc_conf`, read at start-up). Freed pages go back to the kernel
/// at once: by default jemalloc keeps them resident for ~10 s, and a cache that replaces items
/// at GB/s then holds 2-3x `-m` of dead pages (measured: peak RSS 212 MB at -m 64 with the
/// default, 88-90 MB with 0; 100 ms gave 155 MB). The price is an madvise per freed page run,
/// paid only by large items (small ones live in slabs and are reused in place).
#[cfg(feature = "alloc-jemalloc")]
#[used]
#[export_name = "_rjem_malloc_conf"]
static JEMALLOC_CONF: &[u8; 34] = b"dirty_decay_ms:0,muzzy_decay_ms:0\0";
#[cfg(all(feature = "alloc-mimalloc", not(feature = "alloc-jemalloc")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use config::{Config, ConfigError, WorkerSchedChoice};
use slipstream_server::admin::{AdminState, MetricsFn};
use slipstream_server::bufbudget::BufBudget;
use slipstream_server::exec::Settings;
use slipstream_server::fastpath::KernelFastPath;
use slipstream_server::net::{NetConfig, Server, StopHandle, WorkerSched};
use slipstream_server::stats::ServerInfo;
use slipstream_server::stats_prefix::PrefixStats;
use slipstream_server::tenants::{KernelAdapter, TenantDefaults, TenantTable};
use slipstream_store::Store;
use slipstream_streamsvc::{ServiceConfig, StreamService};
use slipstream_tenancy::TenantControl;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

const USAGE: &str = "\
slipstream — network-path acceleration for data services (memcached-compatible cache)

usage: slipstream serve [options]      (or: slipstream [options])
       slipstream send [options]       stream generator (`slipstream send --help`)
       slipstream --version | help

options (memcached's, with memcached's defaults):
  -p, --port=N             TCP port (11211; 0 = off)
  -U, --udp-port=N         UDP port (0 = off)
  -l, --listen=ADDR        interface to listen on (default 0.0.0.0; `make run` uses 127.0.0.1)
  -t, --threads=N          worker threads (4)
  -m, --memory-limit=MB    item memory in megabytes (64)
  -c, --conn-limit=N       max simultaneous connections (1024)
  -I, --max-item-size=SIZE largest item, e.g. 1m, 512k (1m)
  -C, --disable-cas        no CAS values
  -F, --disable-flush-all  refuse flush_all
  -A, --enable-shutdown    allow the `shutdown` command
  -v, -vv                  verbose
  -u, --user=NAME          as root: become NAME once every port is bound and the kernel fast
                           path attached (no capabilities kept; kernels before 5.9 only: the
                           main thread keeps cap_net_admin permitted to detach XDP at exit)
  -s, --unix-socket=FILE   unix socket path to listen on (disables network support)
  -a, --unix-mask=MASK     access mask for the unix socket, in octal (0700)
  -S, --enable-sasl        binary protocol SASL PLAIN (password file: $MEMCACHED_SASL_PWDB)
  -Y, --auth-file=FILE     text protocol authentication (`user:password` lines)
  -Z, --enable-ssl         TLS on the TCP ports (-o ssl_chain_cert=FILE,ssl_key=FILE, ...)
  -M, --disable-evictions  answer `SERVER_ERROR out of memory` instead of evicting
  -R, --max-reqs-per-event=N  requests one connection may run per event (20)
  -B, --protocol=NAME      auto, binary or ascii (auto)
  -b, --listen-backlog=N   TCP listen backlog (1024)
  -D CHAR                  key prefix delimiter for `stats detail` (turns detail on)
  -X, --disable-dumping    refuse `stats cachedump` and `lru_crawler metadump`
  -W, --disable-watch      refuse `watch`
  -d, --daemon             run as a daemon;  -P, --pidfile=FILE  its pid file
  -e, --memory-file=FILE   restartable cache: SIGUSR1 saves the items to FILE and stops; the
                           next start with the same -e loads them (once)
  -V, --version            print the version and exit
  -o, --extended=LIST      memcached's extended options, comma separated: idle_timeout,
                           read_buf_mem_limit, lru_crawler / no_lru_crawler, lru_crawler_sleep,
                           lru_crawler_tocrawl, lru_maintainer / no_lru_maintainer,
                           watcher_logbuf_size, maxconns_fast, ssl_chain_cert, ssl_key,
                           ssl_ca_cert, ssl_verify_mode, ssl_keyformat, ssl_ciphers,
                           ssl_min_version, ...; slab, hash table and LRU tuning names (and -f,
                           -n, -L, -k, -r, -N) are accepted with a notice: no slabs here
slipstream's own:
  --config=FILE            TOML file for everything (flags given on the command line win)
  --admin=ADDR:PORT        Prometheus metrics at http://ADDR:PORT/metrics (off by default)
  --xdp=IFACE              kernel fast path: an XDP program on IFACE answers UDP get/gets/mg
                           hits for the -U port (needs -U and root; otherwise says why and
                           serves from user space)
  --xdp-entries=N          most items the kernel fast path caches (16384; allocated on use)
                           With [[stream]]s, --xdp also runs them in the XDP engine (per stream
                           `engine = auto|user|xdp`; one program serves both)
  --worker-sched=MODE      worker threads' scheduling: auto (SCHED_BATCH when the kernel fast
                           path is on, so workers batch what it passes up instead of
                           preempting it; normal otherwise), normal, or batch
";

fn main() {
    abort_on_panic();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("slipstream: {e}");
            64
        }
    };
    std::process::exit(code);
}

/// A panic anywhere ends the process, as `panic = "abort"` would: the message first (the
/// default hook), then abort. Without it a panicked worker or raft thread would leave a daemon
/// that accepts connections it never serves. (The release profile unwinds only so that tests
/// and binaries share one build of the dependencies: Cargo.toml.)
fn abort_on_panic() {
    let print_message = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print_message(info);
        std::process::abort();
    }));
}

#[derive(Debug)]
enum MainError {
    Config(ConfigError),
    Start(String),
}

impl std::fmt::Display for MainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MainError::Config(e) => write!(f, "{e}\n(try `slipstream help`)"),
            MainError::Start(e) => write!(f, "{e}"),
        }
    }
}

impl From<ConfigError> for MainError {
    fn from(e: ConfigError) -> Self {
        MainError::Config(e)
    }
}

fn run(mut args: Vec<String>) -> Result<(), MainError> {
    match args.first().map(String::as_str) {
        Some("help") | Some("-h") | Some("--help") => {
            print!("{USAGE}");
            return Ok(());
        }
        Some("--version") | Some("version") | Some("-V") => {
            println!("slipstream {}", slipstream_server::VERSION_STRING);
            return Ok(());
        }
        Some("serve") => {
            args.remove(0);
        }
        Some("send") => {
            return send::run(&args[1..]).map_err(MainError::Start);
        }
        Some(a) if a.starts_with('-') => {}
        None => {}
        Some(other) => return Err(ConfigError::Usage(format!("unknown command `{other}`")).into()),
    }
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return Ok(());
    }
    if args.iter().any(|a| a == "-V" || a == "--version") {
        println!("slipstream {}", slipstream_server::VERSION_STRING);
        return Ok(());
    }
    let cfg = Config::from_args(&args)?;
    serve(cfg)
}

/// The workers' scheduling policy: `auto` is SCHED_BATCH exactly when the kernel fast path is on.
fn worker_sched(cfg: &Config, fast_path_on: bool) -> WorkerSched {
    match cfg.worker_sched {
        WorkerSchedChoice::Normal => WorkerSched::Normal,
        WorkerSchedChoice::Batch => WorkerSched::Batch,
        WorkerSchedChoice::Auto if fast_path_on => WorkerSched::Batch,
        WorkerSchedChoice::Auto => WorkerSched::Normal,
    }
}

/// The status line's note on the workers' scheduling (nothing for the default).
fn sched_note(s: WorkerSched) -> &'static str {
    match s {
        WorkerSched::Normal => "",
        WorkerSched::Batch => " (SCHED_BATCH)",
    }
}

/// Attach the kernel fast path if asked for; returns it and the status line's last part.
fn attach_fast_path(cfg: &Config, store: &Store) -> (Option<Arc<KernelFastPath>>, String) {
    let Some(iface) = &cfg.xdp_iface else {
        return (None, "kernel fast path off (not requested; --xdp IFACE turns it on)".to_string());
    };
    if cfg.udp_port == 0 {
        return (
            None,
            format!(
                "kernel fast path off: --xdp {iface} needs a UDP port (-U PORT), the fast path answers memcached UDP gets; serving from user space"
            ),
        );
    }
    match KernelFastPath::attach(iface, cfg.udp_port, cfg.xdp_entries) {
        Ok(k) => {
            if !k.install(store) {
                return (None, "kernel fast path off: the store already has one; serving from user space".to_string());
            }
            let line = format!(
                "kernel fast path on {iface} (udp port {}, up to {} items): {}",
                cfg.udp_port,
                cfg.xdp_entries,
                k.mode()
            );
            (Some(k), line)
        }
        Err(e) => (None, format!("kernel fast path off: {e}; serving from user space")),
    }
}

/// Start the stream offload engine when `[[stream]]`s are configured; returns it and the status
/// line's part about it.
fn start_streams(cfg: &Config) -> Result<(Option<Arc<StreamService>>, String), MainError> {
    if cfg.streams.is_empty() {
        return Ok((None, String::new()));
    }
    let svc = StreamService::start(ServiceConfig {
        listen: cfg.listen,
        results: cfg.results.clone(),
        streams: cfg.streams.clone(),
        // Streams share the one XDP program on the interface with the KV fast path (attached
        // before this, so the stream engine finds and reuses it).
        xdp_iface: cfg.xdp_iface.clone(),
        ..ServiceConfig::default()
    })
    .map_err(|e| MainError::Start(format!("stream offload: {e}")))?;
    let names: Vec<String> =
        svc.stream_addrs().iter().zip(svc.engines()).map(|((n, a), e)| format!("{n} udp {a} engine {e}")).collect();
    let xdp_streams = svc.engines().iter().filter(|e| e.starts_with("xdp")).count();
    let engine = match (xdp_streams, svc.engines().len()) {
        (0, _) => "user-space engine",
        (x, n) if x == n => "XDP engine",
        _ => "XDP and user-space engines",
    };
    let line = format!("; stream offload ({engine}) [{}] results tcp {}", names.join("; "), svc.results_addr());
    Ok((Some(Arc::new(svc)), line))
}

fn stream_metrics(streams: &Option<Arc<StreamService>>) -> Vec<MetricsFn> {
    match streams {
        Some(s) => {
            let s = s.clone();
            vec![Arc::new(move |out: &mut String| s.render_metrics(out))]
        }
        None => Vec::new(),
    }
}

/// The services with ports of their own, `[hbase]` (crates/rangecache's Thrift front end) and
/// `[shuffle]` (crates/shuffle), without tenants: started, described on the status line,
/// metrics on the one admin endpoint. They run as long as the process.
fn start_services(cfg: &Config, line: &mut String, metrics: &mut Vec<MetricsFn>) -> Result<(), MainError> {
    if let Some(h) = cfg.hbase.clone() {
        let svc = Arc::new(
            slipstream_rangecache::HbaseService::start(h).map_err(|e| MainError::Start(format!("[hbase]: {e}")))?,
        );
        line.push_str(&svc.describe());
        metrics.push(Arc::new(move |out: &mut String| svc.render_metrics(out)));
    }
    start_shuffle(cfg, line, metrics, Vec::new())
}

/// `[shuffle]`, if configured; `tenants`: in tenant mode, the tenants with a shuffle share and
/// their buckets (empty otherwise).
fn start_shuffle(
    cfg: &Config,
    line: &mut String,
    metrics: &mut Vec<MetricsFn>,
    tenants: Vec<slipstream_shuffle::ShuffleTenant>,
) -> Result<(), MainError> {
    if let Some(sh) = cfg.shuffle.clone() {
        let svc = Arc::new(
            slipstream_shuffle::ShuffleService::start(sh, tenants)
                .map_err(|e| MainError::Start(format!("[shuffle]: {e}")))?,
        );
        line.push_str(&svc.describe());
        metrics.push(Arc::new(move |out: &mut String| svc.render_metrics(out)));
    }
    Ok(())
}

/// Stop the stream engine's threads if nothing else holds it (the admin thread may; then the
/// process exit ends them).
fn stop_streams(streams: Option<Arc<StreamService>>) {
    if let Some(s) = streams {
        if let Ok(s) = Arc::try_unwrap(s) {
            s.stop();
        }
    }
}

/// Stop the server on SIGINT/SIGTERM, or on SIGUSR1 (all blocked everywhere by
/// `block_signals`); SIGUSR1 is memcached's graceful stop: the returned flag is then set, and
/// with `-e` the store is saved once the workers have stopped.
fn spawn_signal_thread(sigset: libc::sigset_t, stop: StopHandle) -> Result<Arc<AtomicBool>, MainError> {
    let graceful = Arc::new(AtomicBool::new(false));
    let flag = graceful.clone();
    std::thread::Builder::new()
        .name("slipstream-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait reads the sigset we built and writes the signal number into a
            // local; both outlive the call.
            let rc = unsafe { libc::sigwait(&sigset, &mut sig) };
            if rc == 0 && sig == libc::SIGUSR1 {
                eprintln!("Gracefully stopping");
                flag.store(true, Ordering::SeqCst);
            } else if rc == 0 {
                eprintln!("slipstream: signal {sig}, shutting down");
            }
            stop.stop();
        })
        .map(|_| graceful)
        .map_err(|e| MainError::Start(format!("cannot start signal thread: {e}")))
}

/// The request path's settings from the command line and config: one home for both the
/// plain daemon and tenant mode (tenant mode has no unix socket: config.rs refuses `-s` there).
fn server_settings(cfg: &Config, sec: &SecurityStart) -> Settings {
    Settings {
        shutdown_enabled: cfg.shutdown_enabled,
        flush_enabled: cfg.flush_enabled,
        prefix_delimiter: cfg.prefix_delimiter,
        detail_enabled: cfg.detail_enabled,
        conn_buf: Arc::new(BufBudget::new(cfg.conn_buf_bytes_max)),
        tunables: cfg.tunables.clone(),
        auth: sec.auth.clone(),
        domain_socket: cfg.security.unix_socket.clone(),
        socket_mode: cfg.security.unix_mode(),
        logger: Arc::new(slipstream_server::watch::Logger::new(cfg.tunables.watcher_logbuf_bytes)),
        tls: sec.tls.clone(),
        ..Settings::default()
    }
}

/// Tenant mode: every `[[tenant]]` on its own ports with its own store, shaped by `[shaping]`;
/// the admin endpoint (if configured) edits tenants at run time.
#[allow(clippy::too_many_lines)] // the start-up order (bind, attach, drop privileges, announce) is the point
fn serve_tenants(
    cfg: Config,
    sigset: libc::sigset_t,
    target: Option<privs::Target>,
    daemon: Option<daemon::Daemon>,
) -> Result<(), MainError> {
    // -S/-Y/-Z apply to every tenant's TCP port (config.rs refused -s and UDP under auth).
    let sec = SecurityStart::load(&cfg)?;
    if cfg.memory_file.is_some() {
        eprintln!("slipstream: note: -e saves and restores the store of a daemon without [[tenant]]s; tenants' stores are not saved");
    }
    let settings = Arc::new(server_settings(&cfg, &sec));
    let defaults = TenantDefaults {
        listen: cfg.listen,
        store: cfg.store_config(),
        conn_limit: cfg.conn_limit,
        item_bytes_max: cfg.item_bytes_max,
        listen_interface: cfg.listen_arg.clone(),
        reserved_ports: cfg.admin_addr.map(|a| a.port()).into_iter().chain(cfg.stream_ports()).collect(),
    };
    let table = TenantTable::multi(cfg.threads, settings, cfg.shaping.clone(), &cfg.tenants, defaults)
        .map_err(|e| MainError::Start(format!("tenants: {e}")))?;
    let table = Arc::new(table);
    // Before the workers serve: a replicated tenant must never take a write outside its group.
    let replication = cluster::start(&cfg, &table).map_err(MainError::Start)?;
    let (kernel, fastpath) = attach_tenant_fast_path(&cfg, &table);
    let mut info = ServerInfo::detached(Vec::new(), cfg.item_bytes_max);
    info.threads = cfg.threads;
    info.conn_limit = cfg.conn_limit;
    let sched = worker_sched(&cfg, kernel.is_some());
    let server = Server::start_tenants(table.clone(), cfg.read_buf_bytes_max(), Arc::new(info), sched, sec.tls.clone())
        .map_err(|e| MainError::Start(e.to_string()))?;
    let (streams, mut stream_line) = start_streams(&cfg)?;
    let mut extra_metrics: Vec<MetricsFn> =
        stream_metrics(&streams).into_iter().chain(cluster::metrics(&table)).collect();
    // With tenants, [hbase] serves the tenants' own thrift_ports (as only their KV ports serve).
    if let Some(h) = cfg.hbase.as_ref() {
        let (m, line) = tenant_thrift::start(h, &table).map_err(MainError::Start)?;
        extra_metrics.push(m);
        stream_line.push_str(&line);
    }
    // [shuffle] charges each Spark application to a tenant (its share of the pool, its buckets).
    let shuffle_tenants: Vec<slipstream_shuffle::ShuffleTenant> = cfg
        .shuffle_shares()
        .into_iter()
        .map(|share| {
            let shaper = table.snapshot().iter().find(|t| t.name == share.name).and_then(|t| t.shaper.clone());
            slipstream_shuffle::ShuffleTenant { share, shaper }
        })
        .collect();
    start_shuffle(&cfg, &mut stream_line, &mut extra_metrics, shuffle_tenants)?;

    // The control tick: settles kernel spending and re-divides capacity; admin edits apply to
    // the buckets directly, so they are in force within one tick.
    let tick_stop = server.stop_handle();
    let tick_table = table.clone();
    std::thread::Builder::new()
        .name("slipstream-shaper".into())
        .spawn(move || {
            while !tick_stop.is_stopped() {
                tick_table.tick(slipstream_tenancy::since_start_ns());
                std::thread::sleep(std::time::Duration::from_nanos(slipstream_tenancy::shaper::TICK_NS));
            }
        })
        .map_err(|e| MainError::Start(format!("cannot start shaper thread: {e}")))?;

    let admin_line = match cfg.admin_addr {
        Some(addr) => {
            let control: Arc<dyn TenantControl> = table.clone();
            match slipstream_server::admin::start(
                addr,
                AdminState { node: None, tenants: Some(control), token: cfg.admin_token.clone(), extra_metrics },
            ) {
                Ok(local) => format!(
                    ", admin http://{local}/ ({})",
                    if cfg.admin_token.is_some() { "token required" } else { "read-only: no admin_token" }
                ),
                Err(e) => return Err(admin_bind_error(addr, e)),
            }
        }
        None => String::new(),
    };
    spawn_signal_thread(sigset, server.stop_handle())?;
    let (dropped, privs_line) = drop_privileges(&target, kernel.is_some() || xdp_streams(&streams))?;
    let tenants: Vec<String> = table
        .snapshot()
        .iter()
        .map(|t| {
            let spec = t.spec();
            format!(
                "{} tcp {}{} share {}",
                t.name,
                t.tcp_local.map(|a| a.to_string()).unwrap_or_else(|| "off".into()),
                t.udp_local.map(|a| format!(" udp {a}")).unwrap_or_default(),
                spec.map(|s| s.share.to_string()).unwrap_or_default()
            )
        })
        .collect();
    for n in &sec.notices {
        eprintln!("slipstream: {n}");
    }
    println!(
        "slipstream {}: {} tenants [{}]{}, shaping ingress {} B/s egress {} B/s{}, {} threads{}{}; {}{}{}",
        slipstream_server::VERSION_STRING,
        tenants.len(),
        tenants.join("; "),
        sec.line,
        cfg.shaping.ingress_bytes_per_s,
        cfg.shaping.egress_bytes_per_s,
        if cfg.shaping.work_conserving { " work-conserving" } else { "" },
        cfg.threads,
        sched_note(sched),
        admin_line,
        fastpath,
        stream_line,
        privs_line,
    );
    if let Some(c) = cfg.cluster.as_ref().filter(|_| replication.is_some()) {
        println!(
            "slipstream: replication node {} of {} (fsync {:?}, reads {}), data in {}",
            c.node_id,
            c.peers.len(),
            c.fsync,
            if cfg.replica_opts.local_reads { "local" } else { "linearizable" },
            c.data_dir.display()
        );
    }
    started(&cfg, &[], &[], daemon);
    server.join();
    // The node stops after the workers: no parked connection is left waiting on it.
    drop(replication);
    if let Some(d) = &dropped {
        d.for_teardown();
    }
    stop_streams(streams);
    if let Some(k) = kernel {
        k.shutdown();
    }
    Ok(())
}

/// Tenant mode's kernel fast path: one XDP program for every tenant with a UDP port, each in its
/// own key space and paying from its own buckets.
fn attach_tenant_fast_path(cfg: &Config, table: &TenantTable) -> (Option<Arc<KernelFastPath>>, String) {
    let Some(iface) = &cfg.xdp_iface else {
        table.connect(None);
        return (None, "kernel fast path off (not requested; --xdp IFACE turns it on)".to_string());
    };
    if !cfg.tenants.iter().any(|t| t.udp_port.is_some()) {
        table.connect(None);
        return (
            None,
            format!("kernel fast path off: --xdp {iface} needs a tenant with a udp_port; serving from user space"),
        );
    }
    match KernelFastPath::attach_multi(iface, cfg.xdp_entries) {
        Ok(k) => {
            let problems = table.connect(Some(Arc::new(KernelAdapter(k.clone()))));
            for p in &problems {
                eprintln!("slipstream: {p}");
            }
            let line = format!(
                "kernel fast path on {iface} for tenants' UDP ports (up to {} items, shaped per tenant): {}",
                cfg.xdp_entries,
                k.mode()
            );
            (Some(k), line)
        }
        Err(e) => {
            table.connect(None);
            (None, format!("kernel fast path off: {e}; serving from user space"))
        }
    }
}

/// The admin endpoint's bind failure, worded like every other port's.
fn admin_bind_error(addr: std::net::SocketAddr, source: std::io::Error) -> MainError {
    let e = slipstream_bind::BindError { kind: slipstream_bind::Kind::Tcp { backlog: 0 }, addr, source };
    MainError::Start(format!("admin: {e}"))
}

/// Whether a stream runs in the XDP engine (an XDP program is attached for it).
fn xdp_streams(streams: &Option<Arc<StreamService>>) -> bool {
    streams.as_ref().is_some_and(|s| s.engines().iter().any(|e| e.starts_with("xdp")))
}

/// `-u`: become the user now (every port bound, every XDP program attached); returns what was
/// dropped and the status line's last part.
fn drop_privileges(
    target: &Option<privs::Target>,
    xdp_attached: bool,
) -> Result<(Option<privs::Dropped>, String), MainError> {
    match target {
        Some(t) => {
            let d = privs::drop_to(t, xdp_attached && privs::xdp_detach_needs_net_admin()).map_err(MainError::Start)?;
            let note = format!("; {}", d.note());
            Ok((Some(d), note))
        }
        None => {
            let note = privs::root_note();
            Ok((None, if note.is_empty() { String::new() } else { format!("; {note}") }))
        }
    }
}

const NOTHING_TO_SERVE: &str = "slipstream: note: both TCP and UDP are off (-p 0 -U 0) and no [[stream]], [[tenant]], [hbase] or [shuffle] is configured: nothing to serve; running with no listener until SIGINT/SIGTERM, as memcached does";

/// No KV port (`-p 0`): the other services only — streams and their results port, `[hbase]`,
/// `[shuffle]` — with the admin endpoint.
fn serve_without_kv(
    cfg: Config,
    sigset: libc::sigset_t,
    target: Option<privs::Target>,
    daemon: Option<daemon::Daemon>,
) -> Result<(), MainError> {
    let (streams, mut stream_line) = start_streams(&cfg)?;
    let mut extra_metrics = stream_metrics(&streams);
    start_services(&cfg, &mut stream_line, &mut extra_metrics)?;
    let admin_line = match cfg.admin_addr {
        Some(addr) => match slipstream_server::admin::start(
            addr,
            AdminState { node: None, tenants: None, token: cfg.admin_token.clone(), extra_metrics },
        ) {
            Ok(local) => format!(", metrics http://{local}/metrics"),
            Err(e) => return Err(admin_bind_error(addr, e)),
        },
        None => String::new(),
    };
    let (dropped, privs_line) = drop_privileges(&target, xdp_streams(&streams))?;
    println!(
        "slipstream {}: tcp off, udp off (no KV port){}{}{}",
        slipstream_server::VERSION_STRING,
        admin_line,
        stream_line,
        privs_line,
    );
    started(&cfg, &[], &[], daemon);
    // No workers to stop: this thread waits for SIGINT/SIGTERM itself.
    let mut sig: libc::c_int = 0;
    // SAFETY: sigwait reads the sigset we built and writes the signal number into a local; both
    // outlive the call.
    if unsafe { libc::sigwait(&sigset, &mut sig) } == 0 {
        eprintln!("slipstream: signal {sig}, shutting down");
    }
    if let Some(d) = &dropped {
        d.for_teardown();
    }
    stop_streams(streams);
    Ok(())
}

/// Block SIGINT/SIGTERM in every thread and wait for them in one dedicated thread, so the
/// workers never run signal handlers and shutdown is an ordinary stop request.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise a stack sigset_t we own; pthread_sigmask only
    // changes this thread's mask (inherited by threads spawned afterwards).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn serve(mut cfg: Config) -> Result<(), MainError> {
    if let Some(note) = daemon::no_effect_notice(&cfg.no_effect) {
        eprintln!("{note}");
    }
    if let Some(p) = cfg.pid_file.as_mut() {
        *p = daemon::absolute(p);
    }
    // Before any thread exists: forking a threaded process is unsafe.
    let daemon = if cfg.daemonize { Some(daemon::daemonize(cfg.verbose > 0).map_err(MainError::Start)?) } else { None };
    let daemonized = daemon.is_some();
    let pid_file = cfg.pid_file.clone();
    let r = serve_inner(cfg, daemon);
    if let (true, Some(p)) = (daemonized, pid_file) {
        // memcached removes its pid file at exit when it daemonized.
        let _ = std::fs::remove_file(p);
    }
    r
}

/// The side files and background start once the ports are bound (memcached's order: port
/// file, then pid file), then the parent of `-d` may exit.
fn started(cfg: &Config, tcp: &[std::net::SocketAddr], udp: &[std::net::SocketAddr], daemon: Option<daemon::Daemon>) {
    daemon::write_port_file(tcp, udp);
    if let Some(p) = &cfg.pid_file {
        daemon::write_pid_file(p);
    }
    if let Some(d) = daemon {
        d.ready();
    }
}

#[allow(clippy::too_many_lines)] // the start-up order (bind, attach, drop privileges, announce) is the point
fn serve_inner(cfg: Config, daemon: Option<daemon::Daemon>) -> Result<(), MainError> {
    let sigset = block_signals();
    // Looked up before anything is bound, so a typo fails at once.
    let target = privs::resolve(cfg.user.as_deref()).map_err(MainError::Start)?;
    if !cfg.tenants.is_empty() {
        return serve_tenants(cfg, sigset, target, daemon);
    }
    if cfg.tcp_addr().is_none() && cfg.udp_addr().is_none() && cfg.security.unix_socket.is_none() {
        if cfg.streams.is_empty() && cfg.hbase.is_none() && cfg.shuffle.is_none() {
            // memcached runs with no listener here (and writes an empty port file); an existing
            // command line behaves the same, with the reason said once.
            eprintln!("{NOTHING_TO_SERVE}");
        }
        return serve_without_kv(cfg, sigset, target, daemon);
    }

    let store = Arc::new(Store::new(cfg.store_config()));
    if let Some(path) = &cfg.memory_file {
        let loaded = restart::load(path, &store).map_err(MainError::Start)?;
        eprintln!("{}", restart::describe(&loaded));
    }
    let sec = SecurityStart::load(&cfg)?;
    let settings = server_settings(&cfg, &sec);
    // Attach before serving, so the kernel cache starts empty and coherent from the first
    // request; a failure leaves the daemon serving from user space with the reason shown.
    let (kernel, fastpath) = attach_fast_path(&cfg, &store);
    let sched = worker_sched(&cfg, kernel.is_some());
    let net = NetConfig {
        tcp_addr: cfg.tcp_addr(),
        udp_addr: cfg.udp_addr(),
        threads: cfg.threads,
        conn_limit: cfg.conn_limit,
        read_buf_bytes_max: cfg.read_buf_bytes_max(),
        worker_sched: sched,
        more_addrs: cfg.more_addrs(),
        unix: sec.unix.clone(),
        tls: sec.tls.clone(),
        tls_exempt: cfg.listen_notls.clone(),
    };
    let info = ServerInfo {
        started: Instant::now(),
        pid: std::process::id(),
        threads: cfg.threads,
        conn_limit: cfg.conn_limit,
        tcp_port: 0,
        udp_port: 0,
        item_bytes_max: cfg.item_bytes_max,
        curr_connections: AtomicU64::new(0),
        per_thread: Vec::new(),
        fastpath_enabled: kernel.is_some(),
        fastpath: kernel.as_ref().map(KernelFastPath::source),
        listen_interface: cfg.listen_arg.clone(),
        verbosity: AtomicU64::new(0),
        conns: Default::default(),
        prefix_stats: PrefixStats::new(cfg.detail_enabled),
        cache_memlimit_allowed: true,
    };
    let server = Server::start(net, store.clone(), settings, info).map_err(|e| MainError::Start(e.to_string()))?;
    let (streams, mut stream_line) = start_streams(&cfg)?;
    let mut extra_metrics = stream_metrics(&streams);
    start_services(&cfg, &mut stream_line, &mut extra_metrics)?;

    let admin_line = match cfg.admin_addr {
        Some(addr) => match slipstream_server::admin::start(
            addr,
            AdminState {
                node: Some((server.info.clone(), store.clone())),
                tenants: None,
                token: cfg.admin_token.clone(),
                extra_metrics,
            },
        ) {
            Ok(local) => format!(", metrics http://{local}/metrics"),
            Err(e) => return Err(admin_bind_error(addr, e)),
        },
        None => String::new(),
    };
    let graceful = spawn_signal_thread(sigset, server.stop_handle())?;
    let (dropped, privs_line) = drop_privileges(&target, kernel.is_some() || xdp_streams(&streams))?;
    // Every -l address's sockets (one slot each).
    let slots = server.table.snapshot();
    let tcp_all: Vec<std::net::SocketAddr> = slots.iter().filter_map(|t| t.tcp_local).collect();
    let udp_all: Vec<std::net::SocketAddr> = slots.iter().filter_map(|t| t.udp_local).collect();
    let list = |v: &[std::net::SocketAddr]| {
        if v.is_empty() {
            "off".to_string()
        } else {
            v.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" ")
        }
    };
    for n in &sec.notices {
        eprintln!("slipstream: {n}");
    }
    println!(
        "slipstream {}: tcp {}{}, udp {}, {} threads{}, {} MB memory, {} connections max, items up to {} bytes{}; {}{}{}",
        slipstream_server::VERSION_STRING,
        list(&tcp_all),
        sec.line,
        list(&udp_all),
        cfg.threads,
        sched_note(sched),
        cfg.memory_mb,
        cfg.conn_limit,
        cfg.item_bytes_max,
        admin_line,
        fastpath,
        stream_line,
        privs_line,
    );
    started(&cfg, &tcp_all, &udp_all, daemon);

    server.join();
    if let (true, Some(path)) = (graceful.load(Ordering::SeqCst), &cfg.memory_file) {
        match restart::save(path, &store) {
            Ok(n) => eprintln!("[restart] {n} items saved to {}", path.display()),
            Err(e) => eprintln!("[restart] cannot save to {}: {e}", path.display()),
        }
    }
    if let Some(d) = &dropped {
        d.for_teardown();
    }
    stop_streams(streams);
    if let Some(k) = kernel {
        // Detach explicitly: the store (still referenced by the admin thread) holds the fast
        // path too, so it would not be dropped before exit otherwise.
        k.shutdown();
    }
    if cfg.verbose > 0 {
        eprintln!("slipstream: stopped");
    }
    Ok(())
}

/// [sec] What `-s`, `-S`, `-Y` and `-Z` need at start-up, loaded (files read, certificates
/// parsed) before anything is served, so a bad file stops the server with the reason.
struct SecurityStart {
    auth: Option<Arc<slipstream_server::auth::Auth>>,
    unix: Option<slipstream_server::transport::unix::UnixSpec>,
    tls: Option<Arc<slipstream_server::transport::tls::TlsConfig>>,
    /// For the status line: ` (tls)`, `, unix PATH`, `, ascii auth`, `, sasl auth`.
    line: String,
    notices: Vec<String>,
}

impl SecurityStart {
    fn load(cfg: &Config) -> Result<SecurityStart, MainError> {
        let s = &cfg.security;
        let auth = s.load_auth().map_err(MainError::Start)?;
        let tls = if s.tls {
            Some(
                slipstream_server::transport::tls::server_config(&s.tls_opts)
                    .map_err(|e| MainError::Start(format!("TLS: {e}")))?,
            )
        } else {
            None
        };
        let unix = s.unix_socket.as_ref().map(|p| slipstream_server::transport::unix::UnixSpec {
            path: p.clone(),
            mode: s.unix_mode(),
            backlog: 1024,
        });
        let mut line = String::new();
        let mut notices = if s.tls { s.tls_opts.notices() } else { Vec::new() };
        if tls.is_some() {
            line.push_str(" (tls)");
        }
        if let Some(u) = &unix {
            line.push_str(&format!(", unix {} (mode {:o})", u.path, u.mode));
            if tls.is_some() {
                notices.push("-Z: TLS applies to TCP listeners, and with -s there are none (as in memcached)".into());
            }
        }
        match auth.as_deref() {
            Some(slipstream_server::auth::Auth::Ascii { creds, .. }) => {
                line.push_str(&format!(", ascii auth ({} users)", creds.len()))
            }
            Some(slipstream_server::auth::Auth::Sasl { creds }) => {
                line.push_str(&format!(", sasl auth ({} users)", creds.len()))
            }
            None => {}
        }
        Ok(SecurityStart { auth, unix, tls, line, notices })
    }
}
