//! Configuration: embedded defaults (memcached's), then `--config FILE` (TOML), then command-line
//! flags, each overriding the one before.
//!
//! Not for: validating protocol input; only start-up settings live here.

use serde::Deserialize;
use slipstream_replication::cluster::{ClusterSpec, Timing};
use slipstream_stream::config::ResultsConfig;
use slipstream_stream::StreamConfig;
use slipstream_tenancy::{ShapingSpec, TenantSpec};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// memcached's flags that take a value, beyond the common ones listed in `from_args`.
const MC_VALUE_FLAGS: &[&str] = &[
    "R",
    "max-reqs-per-event",
    "B",
    "protocol",
    "b",
    "listen-backlog",
    "P",
    "pidfile",
    "D",
    "o",
    "extended",
    "f",
    "slab-growth-factor",
    "n",
    "slab-min-size",
    "e",
    "memory-file",
    "N",
    "napi-ids",
];

/// Upper bounds that keep a typo from asking for absurd resources.
pub const THREADS_MAX: usize = 256;
pub const CONN_LIMIT_MAX: usize = 1_000_000;
pub const ITEM_BYTES_MIN: usize = 1024;
pub const ITEM_BYTES_MAX: usize = 1024 * 1024 * 1024;
/// `-m`'s bound: the one a tenant's `memory_mb` has too (one home, in the tenancy spec).
pub const MEMORY_MB_MAX: usize = slipstream_tenancy::spec::MEMORY_MB_MAX as usize;
/// Default and largest kernel fast path cache size in items (each up to ~1.7 KiB of kernel
/// memory, allocated only when filled): 16384 items is at most ~28 MiB.
pub const XDP_ENTRIES_DEFAULT: u32 = 16384;
pub const XDP_ENTRIES_MAX: u32 = 1 << 20;

#[derive(Debug)]
pub enum ConfigError {
    Usage(String),
    File { path: String, message: String },
    Value { name: &'static str, value: String, why: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Usage(m) => write!(f, "{m}"),
            ConfigError::File { path, message } => write!(f, "config file {path}: {message}"),
            ConfigError::Value { name, value, why } => write!(f, "bad value `{value}` for {name}: {why}"),
        }
    }
}

/// `--worker-sched`: the worker threads' scheduling policy, or `auto`: SCHED_BATCH when the
/// kernel fast path is on (it answers most requests in the receive path on the same cores,
/// and workers should batch what it passes up rather than preempt it), the default otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerSchedChoice {
    Auto,
    Normal,
    Batch,
}

impl WorkerSchedChoice {
    fn parse(name: &'static str, v: &str) -> Result<Self, ConfigError> {
        match v.trim() {
            "auto" => Ok(Self::Auto),
            "normal" => Ok(Self::Normal),
            "batch" => Ok(Self::Batch),
            _ => Err(bad(name, v, "expected auto, normal or batch")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub port: u16,
    pub udp_port: u16,
    pub listen: IpAddr,
    /// `-l` exactly as given (memcached's `stats settings` shows it as `inter`).
    pub listen_arg: Option<String>,
    /// The further `-l` addresses (memcached's comma list or repeated `-l`), each with the
    /// port its entry gave, if any.
    pub listen_more: Vec<(IpAddr, Option<u16>)>,
    /// `-l notls:ADDR` under `-Z`: the listeners exempt from TLS, as indexes into the `-l`
    /// addresses (0 = the first, `k` = `listen_more[k - 1]`).
    pub listen_notls: Vec<usize>,
    pub threads: usize,
    pub memory_mb: usize,
    pub conn_limit: usize,
    pub item_bytes_max: usize,
    pub cas_enabled: bool,
    pub flush_enabled: bool,
    pub shutdown_enabled: bool,
    /// The byte ending a key's prefix for `stats detail` (memcached `-D <char>`; default ':').
    pub prefix_delimiter: u8,
    /// Per-prefix counting on from the start (memcached's `-D` also turns it on).
    pub detail_enabled: bool,
    pub verbose: u8,
    pub admin_addr: Option<SocketAddr>,
    pub xdp_iface: Option<String>,
    /// Most items the kernel fast path caches.
    pub xdp_entries: u32,
    /// Worker threads' scheduling policy (`--worker-sched`).
    pub worker_sched: WorkerSchedChoice,
    /// Budget shared by all connections' buffers beyond their base size (memcached's
    /// `-o read_buf_mem_limit`; see slipstream_server::bufbudget).
    pub conn_buf_bytes_max: usize,
    /// Bearer token the admin endpoint requires (None: read-only admin).
    pub admin_token: Option<String>,
    /// `[shaping]` (defaults when absent); used only with tenants.
    pub shaping: ShapingSpec,
    /// `[[tenant]]` entries; empty = single-tenant mode on -p/-U.
    pub tenants: Vec<TenantSpec>,
    /// `[cluster]` (issue 15): this node's place in a replication cluster; None = standalone.
    pub cluster: Option<ClusterSpec>,
    /// `[cluster]` serving keys for the replicated tenants.
    pub replica_opts: ReplicaOpts,
    /// `[results]` (where stream results go); used only with streams.
    pub results: ResultsConfig,
    /// `[[stream]]` entries; empty = no stream offload.
    pub streams: Vec<StreamConfig>,
    /// `-u`: the user to become once everything is bound and attached (only when root).
    pub user: Option<String>,
    /// `-p -1` / `-U -1`: listen on a port the kernel picks (memcached's ephemeral ports; the
    /// ports chosen go to `$MEMCACHED_PORT_FILENAME`).
    pub tcp_ephemeral: bool,
    pub udp_ephemeral: bool,
    /// `-M`: refuse stores when memory is full instead of evicting.
    pub evictions_enabled: bool,
    /// memcached's serving tunables (`-R`, `-B`, `-b`, `-X`, `-W`, `-o idle_timeout`, ...).
    pub tunables: slipstream_server::tunables::Tunables,
    /// `-d`: run in the background.
    pub daemonize: bool,
    /// `-P`: write the process id here once the ports are bound.
    pub pid_file: Option<String>,
    /// memcached flags and `-o` options accepted with no effect here (one start-up notice).
    pub no_effect: Vec<String>,
    /// memcached's `-e`: where SIGUSR1 saves the store and the next start loads it (restart.rs).
    pub memory_file: Option<PathBuf>,
    /// `[hbase]`: the HBase Thrift front end + range cache (crates/rangecache); None = off.
    pub hbase: Option<slipstream_rangecache::Settings>,
    /// `[shuffle]`: the Spark shuffle service (crates/shuffle); None = off.
    pub shuffle: Option<slipstream_shuffle::Settings>,
    /// `-s`, `-a`, `-S`, `-Y`, `-Z` and `-o ssl_*` (see crate::security).
    pub security: crate::security::SecurityConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 11211,
            udp_port: 0,
            listen: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            listen_arg: None,
            listen_more: Vec::new(),
            listen_notls: Vec::new(),
            threads: 4,
            memory_mb: 64,
            conn_limit: 1024,
            item_bytes_max: 1024 * 1024,
            cas_enabled: true,
            flush_enabled: true,
            shutdown_enabled: false,
            prefix_delimiter: b':',
            detail_enabled: false,
            verbose: 0,
            admin_addr: None,
            xdp_iface: None,
            xdp_entries: XDP_ENTRIES_DEFAULT,
            worker_sched: WorkerSchedChoice::Auto,
            conn_buf_bytes_max: slipstream_server::bufbudget::CONN_BUF_BYTES_MAX_DEFAULT,
            admin_token: None,
            shaping: ShapingSpec::default(),
            tenants: Vec::new(),
            cluster: None,
            replica_opts: ReplicaOpts::default(),
            results: ResultsConfig::default(),
            streams: Vec::new(),
            user: None,
            hbase: None,
            shuffle: None,
            tcp_ephemeral: false,
            udp_ephemeral: false,
            evictions_enabled: true,
            tunables: slipstream_server::tunables::Tunables::default(),
            daemonize: false,
            pid_file: None,
            no_effect: Vec::new(),
            memory_file: None,
            security: crate::security::SecurityConfig::default(),
        }
    }
}

/// The TOML file's shape. Every key is optional; names match the long flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    server: Option<FileServer>,
    shaping: Option<ShapingSpec>,
    #[serde(default)]
    tenant: Vec<TenantSpec>,
    results: Option<FileResults>,
    #[serde(default)]
    stream: Vec<FileStream>,
    hbase: Option<slipstream_rangecache::HbaseConfig>,
    shuffle: Option<slipstream_shuffle::ShuffleConfig>,
    cluster: Option<FileCluster>,
}

/// `[cluster]` as written (checked by slipstream_replication::cluster).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCluster {
    node_id: u64,
    peers: Vec<String>,
    data_dir: String,
    #[serde(default = "default_fsync")]
    fsync: String,
    /// "linearizable" (ReadIndex before a read; the default) or "local" (read this replica's
    /// store as it is: fast, may be stale on a follower).
    #[serde(default = "default_reads")]
    reads: String,
    /// How long a replicated request waits for its group (a leader, the commit, the apply)
    /// before the client gets `SERVER_ERROR`.
    #[serde(default = "default_wait_ms")]
    wait_ms: u64,
    /// This node joins existing groups (it replaces a removed node): its groups start with no
    /// voters and wait for the leader's log or snapshot; the operator adds it with
    /// `PUT /tenants/{name}` `{"add_voter": id, "address": "ip:port"}`.
    #[serde(default)]
    join: bool,
    /// Raft's clock (slipstream_replication::cluster::Timing): tick length, election timeout
    /// and heartbeat interval in ticks. Defaults there.
    tick_ms: Option<u64>,
    election_ticks: Option<usize>,
    heartbeat_ticks: Option<usize>,
}

fn default_fsync() -> String {
    "always".into()
}

fn default_reads() -> String {
    "linearizable".into()
}

fn default_wait_ms() -> u64 {
    3000
}

/// Most a replicated request may be told to wait (`wait_ms`).
const REPLICA_WAIT_MS_MAX: u64 = 60_000;

/// How this node serves its replicated tenants (`[cluster]` `reads`, `wait_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaOpts {
    pub local_reads: bool,
    pub wait_ms: u64,
    /// `[cluster] join`: groups created here start with no voters.
    pub join: bool,
}

impl Default for ReplicaOpts {
    fn default() -> Self {
        ReplicaOpts { local_reads: false, wait_ms: default_wait_ms(), join: false }
    }
}

/// Check `[cluster]` and every tenant's `replicas`/`nodes`/`preferred_leader` against it
/// (`ClusterSpec::placement`). A replicated tenant may live on fewer nodes than the cluster
/// has: the others relay its port to a node that holds it (`slipstream_server::relay`), which
/// needs the tenant's `tcp_port` to be the same on every node (the relay connects to
/// `<member's peers IP>:<tcp_port>`) and no `udp_port` (a relayed datagram could not be
/// answered by the member).
fn check_cluster(
    cluster: Option<FileCluster>,
    tenants: &[TenantSpec],
) -> Result<(Option<ClusterSpec>, ReplicaOpts), String> {
    let (spec, opts) = match cluster {
        Some(c) => {
            let local_reads = match c.reads.as_str() {
                "linearizable" => false,
                "local" => true,
                r => return Err(format!("[cluster]: reads {r:?}: expected linearizable or local")),
            };
            if c.wait_ms == 0 || c.wait_ms > REPLICA_WAIT_MS_MAX {
                return Err(format!("[cluster]: wait_ms {}: must be 1..={REPLICA_WAIT_MS_MAX}", c.wait_ms));
            }
            let mut spec = ClusterSpec::parse(c.node_id, &c.peers, &c.data_dir, &c.fsync)
                .map_err(|e| format!("[cluster]: {e}"))?;
            let d = Timing::default();
            spec.timing = Timing::parse(
                c.tick_ms.unwrap_or(d.tick_ms),
                c.election_ticks.unwrap_or(d.election_ticks),
                c.heartbeat_ticks.unwrap_or(d.heartbeat_ticks),
            )
            .map_err(|e| format!("[cluster]: {e}"))?;
            (Some(spec), ReplicaOpts { local_reads, wait_ms: c.wait_ms, join: c.join })
        }
        None => (None, ReplicaOpts::default()),
    };
    for t in tenants {
        let placed = ClusterSpec::placement(spec.as_ref(), t.replicas, t.nodes.as_deref(), t.preferred_leader)
            .map_err(|e| format!("[[tenant]] {:?}: {e}", t.name))?;
        let everywhere = spec.as_ref().is_none_or(|c| placed.len() == c.peers.len());
        if !placed.is_empty() && !everywhere && t.udp_port.is_some_and(|p| p != 0) {
            return Err(format!(
                "[[tenant]] {:?}: udp_port: a tenant on {placed:?}, not every node, takes TCP only \
                 (a node outside its group relays TCP connections, not datagrams)",
                t.name
            ));
        }
    }
    Ok((spec, opts))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileResults {
    tcp_port: u16,
}

/// One `[[stream]]` as written; keys are `StreamConfig`'s field names, absent ones take its
/// defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileStream {
    name: String,
    udp_port: u16,
    operator: String,
    window_ms: Option<u64>,
    slide_ms: Option<u64>,
    reference_windows: Option<u32>,
    threshold: Option<f64>,
    history: Option<u32>,
    method: Option<String>,
    drift: Option<f64>,
    filter: Option<String>,
    filter_value: Option<f64>,
    filter_upper: Option<f64>,
    filter_word: Option<String>,
    filter_action: Option<String>,
    format: Option<String>,
    word_bytes_max: Option<usize>,
    records_per_datagram_max: Option<usize>,
    values_per_window_max: Option<usize>,
    distinct_words_per_window_max: Option<usize>,
    engine: Option<String>,
}

impl FileStream {
    fn into_config(self) -> StreamConfig {
        let d = StreamConfig::default();
        StreamConfig {
            name: self.name,
            udp_port: self.udp_port,
            operator: self.operator,
            window_ms: self.window_ms.unwrap_or(d.window_ms),
            slide_ms: self.slide_ms.or(d.slide_ms),
            reference_windows: self.reference_windows.unwrap_or(d.reference_windows),
            threshold: self.threshold.unwrap_or(d.threshold),
            history: self.history.unwrap_or(d.history),
            method: self.method.unwrap_or(d.method),
            drift: self.drift.unwrap_or(d.drift),
            filter: self.filter.or(d.filter),
            filter_value: self.filter_value.or(d.filter_value),
            filter_upper: self.filter_upper.or(d.filter_upper),
            filter_word: self.filter_word.or(d.filter_word),
            filter_action: self.filter_action.unwrap_or(d.filter_action),
            format: self.format.unwrap_or(d.format),
            word_bytes_max: self.word_bytes_max.unwrap_or(d.word_bytes_max),
            records_per_datagram_max: self.records_per_datagram_max.unwrap_or(d.records_per_datagram_max),
            values_per_window_max: self.values_per_window_max.unwrap_or(d.values_per_window_max),
            distinct_words_per_window_max: self
                .distinct_words_per_window_max
                .unwrap_or(d.distinct_words_per_window_max),
            engine: self.engine.unwrap_or(d.engine),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileServer {
    port: Option<u16>,
    udp_port: Option<u16>,
    listen: Option<String>,
    threads: Option<usize>,
    memory_limit_mb: Option<usize>,
    conn_limit: Option<usize>,
    max_item_size: Option<String>,
    disable_cas: Option<bool>,
    disable_flush_all: Option<bool>,
    enable_shutdown: Option<bool>,
    admin: Option<String>,
    xdp: Option<String>,
    xdp_entries: Option<u32>,
    worker_sched: Option<String>,
    admin_token: Option<String>,
    user: Option<String>,
}

fn bad(name: &'static str, value: &str, why: &str) -> ConfigError {
    ConfigError::Value { name, value: value.to_string(), why: why.to_string() }
}

fn parse_num<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, ConfigError> {
    v.trim().parse::<T>().map_err(|_| bad(name, v, "not a number in range"))
}

/// memcached's `-I` syntax: bytes, or a number with k/m suffix.
pub fn parse_size(name: &'static str, v: &str) -> Result<usize, ConfigError> {
    let t = v.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k') | Some(b'K') => (&t[..t.len() - 1], 1024usize),
        Some(b'm') | Some(b'M') => (&t[..t.len() - 1], 1024 * 1024),
        Some(b'g') | Some(b'G') => (&t[..t.len() - 1], 1024 * 1024 * 1024),
        _ => (t, 1),
    };
    let n: usize = parse_num(name, digits)?;
    n.checked_mul(mult).ok_or_else(|| bad(name, v, "too large"))
}

fn parse_ip(name: &'static str, v: &str) -> Result<IpAddr, ConfigError> {
    let t = v.trim();
    if t == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let t = t.trim_start_matches('[').trim_end_matches(']');
    t.parse::<IpAddr>().map_err(|_| bad(name, v, "not an IPv4 or IPv6 address"))
}

/// memcached's `-p`/`-U` value: a port, 0 = off, -1 = a port the kernel picks.
fn parse_port(name: &'static str, v: &str) -> Result<(u16, bool), ConfigError> {
    match v.trim() {
        "-1" => Ok((0, true)),
        t => Ok((parse_num(name, t)?, false)),
    }
}

/// One `-l` entry: `HOST`, `HOST:PORT`, `[V6]`, `[V6]:PORT`, or a bare IPv6 address.
fn split_host_port(entry: &str) -> Result<(&str, Option<u16>), &'static str> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or("Invalid IPV6 address")?;
        return match tail.strip_prefix(':') {
            Some(p) => Ok((host, Some(p.parse().map_err(|_| "Invalid port number")?))),
            None if tail.is_empty() => Ok((host, None)),
            None => Err("Invalid IPV6 address"),
        };
    }
    match entry.split_once(':') {
        // More than one colon: a bare IPv6 address without a port.
        Some((_, rest)) if rest.contains(':') => Ok((entry, None)),
        Some((host, p)) => Ok((host, Some(p.parse().map_err(|_| "Invalid port number")?))),
        None => Ok((entry, None)),
    }
}

fn parse_sockaddr(name: &'static str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.trim().parse::<SocketAddr>().map_err(|_| bad(name, v, "expected ADDR:PORT, e.g. 127.0.0.1:9180"))
}

impl Config {
    #[allow(clippy::too_many_lines)] // one arm per command-line flag
    pub fn from_args(args: &[String]) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        // The config file first, wherever --config appears, so flags override it.
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            if let Some(p) = a.strip_prefix("--config=") {
                cfg.apply_file(p)?;
            } else if a == "--config" {
                let p = args.get(i + 1).ok_or_else(|| ConfigError::Usage("--config needs a file".into()))?;
                cfg.apply_file(p)?;
                i += 1;
            }
            i += 1;
        }
        let (mut tcp_given, mut udp_given) = (false, false);
        let mut i = 0;
        while i < args.len() {
            let a = args[i].as_str();
            // Split `--name=value`, `-p11211`, or take the next argument.
            let (flag, inline): (&str, Option<&str>) = if let Some(rest) = a.strip_prefix("--") {
                match rest.split_once('=') {
                    Some((f, v)) => (f, Some(v)),
                    None => (rest, None),
                }
            } else if a.len() > 2 && a.starts_with('-') && !a.starts_with("-v") {
                (&a[1..2], Some(&a[2..]))
            } else if let Some(rest) = a.strip_prefix('-') {
                (rest, None)
            } else {
                return Err(ConfigError::Usage(format!("unexpected argument `{a}`")));
            };
            let takes_value = matches!(
                flag,
                "p" | "port"
                    | "U"
                    | "udp-port"
                    | "l"
                    | "listen"
                    | "t"
                    | "threads"
                    | "m"
                    | "memory-limit"
                    | "c"
                    | "conn-limit"
                    | "I"
                    | "max-item-size"
                    | "u"
                    | "user"
                    | "config"
                    | "admin"
                    | "xdp"
                    | "xdp-entries"
                    | "worker-sched"
            ) || MC_VALUE_FLAGS.contains(&flag)
                || crate::security::SecurityConfig::takes_value(flag);
            let value = if takes_value {
                match inline {
                    Some(v) => v.to_string(),
                    None => {
                        i += 1;
                        args.get(i).cloned().ok_or_else(|| ConfigError::Usage(format!("{a} needs a value")))?
                    }
                }
            } else {
                if inline.is_some() {
                    return Err(ConfigError::Usage(format!("{a} takes no value")));
                }
                String::new()
            };
            match flag {
                "p" | "port" => {
                    (cfg.port, cfg.tcp_ephemeral) = parse_port("--port", &value)?;
                    tcp_given = true;
                }
                "U" | "udp-port" => {
                    (cfg.udp_port, cfg.udp_ephemeral) = parse_port("--udp-port", &value)?;
                    udp_given = true;
                }
                "l" | "listen" => cfg.apply_listen(&value)?,
                "t" | "threads" => cfg.threads = parse_num("--threads", &value)?,
                "m" | "memory-limit" => cfg.memory_mb = parse_num("--memory-limit", &value)?,
                "c" | "conn-limit" => cfg.conn_limit = parse_num("--conn-limit", &value)?,
                "I" | "max-item-size" => cfg.item_bytes_max = parse_size("--max-item-size", &value)?,
                "C" | "disable-cas" => cfg.cas_enabled = false,
                "F" | "disable-flush-all" => cfg.flush_enabled = false,
                "A" | "enable-shutdown" => cfg.shutdown_enabled = true,
                "u" | "user" => cfg.user = Some(value),
                "v" | "verbose" => cfg.verbose = cfg.verbose.saturating_add(1),
                "vv" => cfg.verbose = cfg.verbose.saturating_add(2),
                "vvv" => cfg.verbose = cfg.verbose.saturating_add(3),
                "config" => {}
                "admin" => cfg.admin_addr = Some(parse_sockaddr("--admin", &value)?),
                "xdp" => cfg.xdp_iface = Some(value),
                "xdp-entries" => cfg.xdp_entries = parse_num("--xdp-entries", &value)?,
                "worker-sched" => cfg.worker_sched = WorkerSchedChoice::parse("--worker-sched", &value)?,
                _ => {
                    if !cfg.apply_memcached_flag(flag, &value)? {
                        match cfg.security.apply_flag(flag, &value) {
                            Some(r) => r.map_err(ConfigError::Usage)?,
                            None => return Err(ConfigError::Usage(format!("unknown option `{a}`"))),
                        }
                    }
                }
            }
            i += 1;
        }
        // memcached: `-U N` without `-p` serves TCP on N too.
        if udp_given && !tcp_given && (cfg.udp_port != 0 || cfg.udp_ephemeral) {
            (cfg.port, cfg.tcp_ephemeral) = (cfg.udp_port, cfg.udp_ephemeral);
        }
        cfg.validate()?;
        let tls_rows = cfg.security.settings_rows();
        cfg.tunables.reported.extend(tls_rows);
        Ok(cfg)
    }

    fn apply_file(&mut self, path: &str) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::File { path: path.to_string(), message: e.to_string() })?;
        let file: FileConfig =
            toml::from_str(&text).map_err(|e| ConfigError::File { path: path.to_string(), message: e.to_string() })?;
        if let Some(s) = file.server {
            if let Some(v) = s.port {
                self.port = v;
            }
            if let Some(v) = s.udp_port {
                self.udp_port = v;
            }
            if let Some(v) = s.listen {
                self.listen = parse_ip("server.listen", &v)?;
                self.listen_arg = Some(v);
            }
            if let Some(v) = s.threads {
                self.threads = v;
            }
            if let Some(v) = s.memory_limit_mb {
                self.memory_mb = v;
            }
            if let Some(v) = s.conn_limit {
                self.conn_limit = v;
            }
            if let Some(v) = s.max_item_size {
                self.item_bytes_max = parse_size("server.max_item_size", &v)?;
            }
            if let Some(v) = s.disable_cas {
                self.cas_enabled = !v;
            }
            if let Some(v) = s.disable_flush_all {
                self.flush_enabled = !v;
            }
            if let Some(v) = s.enable_shutdown {
                self.shutdown_enabled = v;
            }
            if let Some(v) = s.admin {
                self.admin_addr = Some(parse_sockaddr("server.admin", &v)?);
            }
            if let Some(v) = s.xdp {
                self.xdp_iface = Some(v);
            }
            if let Some(v) = s.xdp_entries {
                self.xdp_entries = v;
            }
            if let Some(v) = s.worker_sched {
                self.worker_sched = WorkerSchedChoice::parse("server.worker_sched", &v)?;
            }
            if let Some(v) = s.admin_token {
                self.admin_token = Some(v);
            }
            if let Some(v) = s.user {
                self.user = Some(v);
            }
        }
        if let Some(sh) = file.shaping {
            sh.validate()
                .map_err(|e| ConfigError::File { path: path.to_string(), message: format!("[shaping]: {e}") })?;
            self.shaping = sh;
        }
        if let Some(r) = file.results {
            let r = ResultsConfig { tcp_port: r.tcp_port };
            r.validate()
                .map_err(|e| ConfigError::File { path: path.to_string(), message: format!("[results]: {e}") })?;
            self.results = r;
        }
        self.apply_services(path, file.hbase, file.shuffle)?;
        if !file.stream.is_empty() {
            let streams: Vec<StreamConfig> = file.stream.into_iter().map(FileStream::into_config).collect();
            slipstream_stream::config::validate_streams(&streams)
                .map_err(|e| ConfigError::File { path: path.to_string(), message: format!("[[stream]]: {e}") })?;
            self.streams = streams;
        }
        if !file.tenant.is_empty() {
            // Ports and shares are checked against each other here, so a bad file fails at start
            // with the reason rather than half-serving.
            slipstream_tenancy::spec::validate_all(&self.shaping, &file.tenant, &self.stream_ports())
                .map_err(|e| ConfigError::File { path: path.to_string(), message: format!("[[tenant]]: {e}") })?;
            self.tenants = file.tenant;
        }
        (self.cluster, self.replica_opts) = check_cluster(file.cluster, &self.tenants)
            .map_err(|message| ConfigError::File { path: path.to_string(), message })?;
        // With tenants, [hbase] serves only their thrift_ports (as only their KV ports serve).
        if self.hbase.is_none() && self.tenants.iter().any(|t| t.thrift_port.is_some()) {
            return Err(ConfigError::File {
                path: path.to_string(),
                message: "[[tenant]] thrift_port needs [hbase] (its sidecar and cache settings)".into(),
            });
        }
        // [shuffle] with tenants: the tenants' shuffle_mb shares must fit the pool (issue 17).
        if let Some(sh) = self.shuffle.as_ref().filter(|_| !self.tenants.is_empty()) {
            sh.check_tenants(&self.shuffle_shares()).map_err(|e| ConfigError::File {
                path: path.to_string(),
                message: format!("[shuffle] with [[tenant]]: {e}"),
            })?;
        }
        Ok(())
    }

    /// The tenants' shares of the `[shuffle]` pool (those with `shuffle_mb`), in config order.
    pub fn shuffle_shares(&self) -> Vec<slipstream_shuffle::TenantShare> {
        self.tenants
            .iter()
            .filter(|t| t.shuffle_mb.is_some())
            .map(|t| slipstream_shuffle::TenantShare { name: t.name.clone(), bytes_max: t.shuffle_bytes() })
            .collect()
    }

    /// `[hbase]` and `[shuffle]`: the services with their own ports, each checked by its crate.
    fn apply_services(
        &mut self,
        path: &str,
        hbase: Option<slipstream_rangecache::HbaseConfig>,
        shuffle: Option<slipstream_shuffle::ShuffleConfig>,
    ) -> Result<(), ConfigError> {
        let err =
            |name: &str, e: String| ConfigError::File { path: path.to_string(), message: format!("[{name}]: {e}") };
        if let Some(h) = hbase {
            self.hbase = Some(h.validate().map_err(|e| err("hbase", e))?);
        }
        if let Some(sh) = shuffle {
            self.shuffle = Some(sh.validate().map_err(|e| err("shuffle", e))?);
        }
        Ok(())
    }

    /// Ports the stream service owns (each stream's UDP port, and the results port when there
    /// are streams): a tenant may not take one, at start or at run time, because the kernel fast
    /// path dispatches by port and the two services would fight over the entry.
    pub fn stream_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.streams.iter().map(|s| s.udp_port).collect();
        if !self.streams.is_empty() {
            ports.push(self.results.tcp_port);
        }
        ports
    }

    fn validate(&self) -> Result<(), ConfigError> {
        // In tenant mode the ports are the tenants' (each has a TCP port).
        let (tcp, udp) = if self.tenants.is_empty() {
            (self.port, self.udp_port)
        } else {
            (1, u16::from(self.tenants.iter().any(|t| t.udp_port.is_some())))
        };
        self.security.validate(tcp, udp, !self.tenants.is_empty()).map_err(ConfigError::Usage)?;
        if !self.listen_notls.is_empty() {
            if !self.security.tls {
                // memcached's own refusal.
                return Err(ConfigError::Usage("'notls' option is valid only when SSL is enabled".into()));
            }
            if !self.tenants.is_empty() {
                return Err(ConfigError::Usage(
                    "-l notls: exempts a -l listener from TLS; with [[tenant]] the tenants' ports are the listeners \
                     and -Z applies to all of them"
                        .into(),
                ));
            }
        }
        if let Some(s) = self.streams.iter().find(|s| self.udp_port != 0 && s.udp_port == self.udp_port) {
            return Err(bad(
                "--udp-port",
                &self.udp_port.to_string(),
                &format!("is also the udp_port of stream {:?}", s.name),
            ));
        }
        if self.xdp_entries == 0 || self.xdp_entries > XDP_ENTRIES_MAX {
            return Err(bad("--xdp-entries", &self.xdp_entries.to_string(), &format!("must be 1..={XDP_ENTRIES_MAX}")));
        }
        if self.threads == 0 || self.threads > THREADS_MAX {
            return Err(bad("--threads", &self.threads.to_string(), &format!("must be 1..={THREADS_MAX}")));
        }
        if self.conn_limit == 0 || self.conn_limit > CONN_LIMIT_MAX {
            return Err(bad("--conn-limit", &self.conn_limit.to_string(), &format!("must be 1..={CONN_LIMIT_MAX}")));
        }
        if self.memory_mb == 0 || self.memory_mb > MEMORY_MB_MAX {
            return Err(bad("--memory-limit", &self.memory_mb.to_string(), &format!("must be 1..={MEMORY_MB_MAX}")));
        }
        if self.item_bytes_max < ITEM_BYTES_MIN || self.item_bytes_max > ITEM_BYTES_MAX {
            return Err(bad("--max-item-size", &self.item_bytes_max.to_string(), "must be between 1k and 1g"));
        }
        if self.item_bytes_max > self.memory_bytes_max() / 2 {
            return Err(bad(
                "--max-item-size",
                &self.item_bytes_max.to_string(),
                "cannot be larger than half of --memory-limit",
            ));
        }
        Ok(())
    }

    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        // memcached with -s serves only the unix socket.
        ((self.port != 0 || self.tcp_ephemeral) && self.security.unix_socket.is_none())
            .then(|| SocketAddr::new(self.listen, self.port))
    }

    pub fn udp_addr(&self) -> Option<SocketAddr> {
        ((self.udp_port != 0 || self.udp_ephemeral) && self.security.unix_socket.is_none())
            .then(|| SocketAddr::new(self.listen, self.udp_port))
    }

    /// Record a memcached flag accepted with no effect here (for the start-up notice).
    pub fn notice_no_effect(&mut self, what: &str) {
        crate::mcopts::notice_no_effect(&mut self.no_effect, what);
    }

    /// The parts of the configuration `-o` may set (crate::mcopts).
    pub fn opt_targets(&mut self) -> crate::mcopts::Targets<'_> {
        crate::mcopts::Targets {
            tunables: &mut self.tunables,
            security: &mut self.security,
            conn_buf_bytes_max: &mut self.conn_buf_bytes_max,
            no_effect: &mut self.no_effect,
        }
    }

    /// `-l`: memcached's forms, `ADDR`, `ADDR:PORT`, `[V6]:PORT` or `*`, several in a comma
    /// (or semicolon) list or in repeated `-l` flags (joined with a comma, as memcached does;
    /// a repeat already in the list is ignored, as there).
    fn apply_listen(&mut self, value: &str) -> Result<(), ConfigError> {
        if let Some(prev) = self.listen_arg.as_deref() {
            if prev.contains(value) {
                return Ok(());
            }
        }
        let first = self.listen_arg.is_none();
        for (k, entry) in value.split([',', ';']).filter(|e| !e.is_empty()).enumerate() {
            // memcached: an entry starting `notls` is served without TLS; it skips `notls:`.
            let (entry, notls) = match entry.strip_prefix("notls") {
                Some(_) => (entry.get("notls:".len()..).unwrap_or(""), true),
                None => (entry, false),
            };
            let (host, port) = split_host_port(entry).map_err(|why| bad("--listen", value, why))?;
            let ip = if host == "*" { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { parse_ip("--listen", host)? };
            let index = if first && k == 0 {
                self.listen = ip;
                if let Some(p) = port {
                    self.port = p;
                }
                Some(0)
            } else if (ip, port.unwrap_or(self.port)) != (self.listen, self.port)
                && !self.listen_more.contains(&(ip, port))
            {
                // The same address twice would only be the same sockets again.
                self.listen_more.push((ip, port));
                Some(self.listen_more.len())
            } else {
                None
            };
            if let (true, Some(i)) = (notls, index) {
                self.listen_notls.push(i);
            }
        }
        self.listen_arg = Some(match self.listen_arg.take() {
            Some(prev) => format!("{prev},{value}"),
            None => value.to_string(),
        });
        Ok(())
    }

    /// The further `-l` addresses' (TCP, UDP) socket addresses.
    pub fn more_addrs(&self) -> Vec<(Option<SocketAddr>, Option<SocketAddr>)> {
        self.listen_more
            .iter()
            .map(|&(ip, port)| {
                let tcp =
                    (self.port != 0 || self.tcp_ephemeral).then(|| SocketAddr::new(ip, port.unwrap_or(self.port)));
                let udp = (self.udp_port != 0 || self.udp_ephemeral)
                    .then(|| SocketAddr::new(ip, port.unwrap_or(self.udp_port)));
                (tcp, udp)
            })
            .collect()
    }

    /// memcached's flags beyond the common ones. Ok(false): not one of them.
    fn apply_memcached_flag(&mut self, flag: &str, value: &str) -> Result<bool, ConfigError> {
        use slipstream_server::tunables::BindingProtocol;
        match flag {
            "M" | "disable-evictions" => self.evictions_enabled = false,
            "R" | "max-reqs-per-event" => {
                let n: i64 = parse_num("-R", value)?;
                if n <= 0 || n > i64::from(u32::MAX) {
                    return Err(bad("-R", value, "Number of requests per event must be greater than 0"));
                }
                self.tunables.reqs_per_event = n as u32;
                self.tunables.reqs_per_event_set = true;
            }
            "B" | "protocol" => {
                self.tunables.binding_protocol = BindingProtocol::parse(value.trim())
                    .ok_or_else(|| bad("-B", value, "should be one of auto, binary, or ascii"))?;
            }
            "b" | "listen-backlog" => {
                let n: i32 = parse_num("-b", value)?;
                if n <= 0 {
                    return Err(bad("-b", value, "the backlog must be greater than 0"));
                }
                self.tunables.tcp_backlog = n;
            }
            "d" | "daemon" => self.daemonize = true,
            "P" | "pidfile" => self.pid_file = Some(value.to_string()),
            "D" => {
                let Some(&b) = value.as_bytes().first() else {
                    return Err(bad("-D", value, "No delimiter specified"));
                };
                self.prefix_delimiter = b;
                self.detail_enabled = true;
            }
            "X" | "disable-dumping" => self.tunables.dump_enabled = false,
            "W" | "disable-watch" => self.tunables.watch_enabled = false,
            "o" | "extended" => crate::mcopts::apply(&mut self.opt_targets(), value).map_err(|e| match e {
                crate::mcopts::OptError::Value { value, why } => ConfigError::Value { name: "-o", value, why },
                crate::mcopts::OptError::Usage(m) => ConfigError::Usage(m),
            })?,
            "f" | "slab-growth-factor" => {
                let f: f64 = parse_num("-f", value)?;
                if f <= 1.0 {
                    return Err(bad("-f", value, "Factor must be greater than 1"));
                }
                self.tunables.reported.push(("growth_factor", format!("{f:.2}")));
                self.notice_no_effect("-f (slab growth factor)");
            }
            "n" | "slab-min-size" => {
                let n: u32 = parse_num("-n", value)?;
                if n == 0 {
                    return Err(bad("-n", value, "Chunk size must be greater than 0"));
                }
                self.tunables.reported.push(("chunk_size", n.to_string()));
                self.notice_no_effect("-n (slab minimum size)");
            }
            "L" | "enable-largepages" => self.notice_no_effect("-L (large pages)"),
            "k" | "lock-memory" => self.notice_no_effect("-k (lock memory)"),
            "r" | "enable-coredumps" => self.notice_no_effect("-r (core file limit)"),
            "e" | "memory-file" => {
                self.tunables.reported.push(("memory_file", value.to_string()));
                self.memory_file = Some(PathBuf::from(value));
            }
            "N" | "napi-ids" => self.notice_no_effect("-N (NAPI ids)"),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `-m` in bytes: the one conversion of it (validated to 1..=MEMORY_MB_MAX MiB; saturating
    /// before that).
    pub fn memory_bytes_max(&self) -> usize {
        self.memory_mb.saturating_mul(1024 * 1024)
    }

    /// Lock shards for `-m` and `-I` (see `StoreConfig::shards_for`).
    pub fn store_shards(&self) -> usize {
        slipstream_store::StoreConfig::shards_for(self.memory_bytes_max(), self.item_bytes_max)
    }

    /// The store that `-m`, `-I`, `-C` and `-M` describe: the daemon's, and every tenant's
    /// starting point (a tenant's `memory_mb` replaces the size).
    pub fn store_config(&self) -> slipstream_store::StoreConfig {
        slipstream_store::StoreConfig {
            memory_bytes_max: self.memory_bytes_max(),
            item_bytes_max: self.item_bytes_max,
            shards: self.store_shards(),
            cas_enabled: self.cas_enabled,
            evict_to_free: self.evictions_enabled,
        }
    }

    /// Largest request a connection may buffer: a whole storage request (line + item) or a
    /// multi-get line of up to 1 MiB of keys.
    pub fn read_buf_bytes_max(&self) -> usize {
        (self.item_bytes_max + 64 * 1024).max((1 << 20) + 4096)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_are_memcacheds() {
        let c = Config::from_args(&[]).unwrap();
        assert_eq!(
            (c.port, c.udp_port, c.threads, c.memory_mb, c.conn_limit, c.item_bytes_max),
            (11211, 0, 4, 64, 1024, 1 << 20)
        );
    }

    #[test]
    fn short_long_and_inline_flags() {
        let c =
            Config::from_args(&args("-p 1234 -U5678 --threads=2 -m 128 -c 10 -I 2m -l 127.0.0.1 -A -C -vv")).unwrap();
        assert_eq!((c.port, c.udp_port, c.threads, c.memory_mb, c.conn_limit), (1234, 5678, 2, 128, 10));
        assert_eq!(c.item_bytes_max, 2 << 20);
        assert!(c.shutdown_enabled && !c.cas_enabled);
        assert_eq!(c.verbose, 2);
        assert_eq!(c.listen, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(c.user, None);
        assert_eq!(Config::from_args(&args("-u nobody")).unwrap().user.as_deref(), Some("nobody"));
        assert_eq!(Config::from_args(&args("--user=daemon")).unwrap().user.as_deref(), Some("daemon"));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        assert!(matches!(Config::from_args(&args("-p notaport")), Err(ConfigError::Value { .. })));
        assert!(matches!(Config::from_args(&args("-t 0")), Err(ConfigError::Value { .. })));
        assert!(matches!(Config::from_args(&args("-I 10")), Err(ConfigError::Value { .. })));
        assert!(matches!(Config::from_args(&args("--bogus")), Err(ConfigError::Usage(_))));
        assert!(matches!(Config::from_args(&args("-p")), Err(ConfigError::Usage(_))));
        assert!(matches!(Config::from_args(&args("--worker-sched fifo")), Err(ConfigError::Value { .. })));
    }

    #[test]
    fn worker_sched_choices() {
        assert_eq!(Config::from_args(&[]).unwrap().worker_sched, WorkerSchedChoice::Auto);
        assert_eq!(Config::from_args(&args("--worker-sched normal")).unwrap().worker_sched, WorkerSchedChoice::Normal);
        assert_eq!(Config::from_args(&args("--worker-sched=batch")).unwrap().worker_sched, WorkerSchedChoice::Batch);
    }

    #[test]
    fn file_then_flags() {
        let dir = std::env::temp_dir().join(format!("slipstream-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "[server]\nport = 2000\nthreads = 3\nmax_item_size = \"512k\"\n").unwrap();
        let c = Config::from_args(&args(&format!("--config {} -p 3000", f.display()))).unwrap();
        assert_eq!((c.port, c.threads, c.item_bytes_max), (3000, 3, 512 * 1024));
        std::fs::write(&f, "[server]\nuser = \"nobody\"\n").unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        assert_eq!(c.user.as_deref(), Some("nobody"));
        std::fs::write(&f, "[server]\nprot = 2000\n").unwrap();
        assert!(matches!(
            Config::from_args(&args(&format!("--config {}", f.display()))),
            Err(ConfigError::File { .. })
        ));
        // A stream port may be neither the memcached UDP port nor a tenant's port.
        std::fs::write(&f, "[[stream]]\nname = \"a\"\nudp_port = 7001\noperator = \"wordcount\"\n").unwrap();
        let e = Config::from_args(&args(&format!("-U 7001 --config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("stream \"a\""), "{e}");
        std::fs::write(
            &f,
            "[[stream]]\nname = \"a\"\nudp_port = 7001\noperator = \"wordcount\"\n[[tenant]]\nname = \"t\"\ntcp_port = 7000\nudp_port = 7001\nshare = 0.5\n",
        )
        .unwrap();
        assert!(matches!(
            Config::from_args(&args(&format!("--config {}", f.display()))),
            Err(ConfigError::File { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tenants_and_shaping_from_the_file() {
        let dir = std::env::temp_dir().join(format!("slipstream-cfg-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.toml");
        std::fs::write(
            &f,
            "[server]\nadmin_token = \"s3\"\n[shaping]\negress_bytes_per_s = 1000000\ningress_bytes_per_s = 2000000\nwork_conserving = true\n\
             [[tenant]]\nname = \"t0\"\ntcp_port = 12000\nudp_port = 12000\nmemory_mb = 8\nshare = 0.75\nburst_bytes = 65536\nmax_outstanding = 64\n\
             [[tenant]]\nname = \"t1\"\ntcp_port = 12001\nshare = 0.25\n",
        )
        .unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        assert_eq!(c.admin_token.as_deref(), Some("s3"));
        assert!(c.shaping.work_conserving);
        assert_eq!(c.shaping.ingress_bytes_per_s, 2_000_000);
        assert_eq!(c.tenants.len(), 2);
        assert_eq!((c.tenants[0].udp_port, c.tenants[1].udp_port, c.tenants[1].memory_mb), (Some(12000), None, 64));
        // Shares over 1 and clashing ports are refused with the reason.
        std::fs::write(&f, "[[tenant]]\nname = \"a\"\ntcp_port = 1\nshare = 0.75\n[[tenant]]\nname = \"b\"\ntcp_port = 2\nshare = 0.5\n").unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("shares add up to"), "{e}");
        std::fs::write(&f, "[[tenant]]\nname = \"a\"\ntcp_port = 7\nshare = 0.5\n[[tenant]]\nname = \"b\"\ntcp_port = 7\nshare = 0.5\n").unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("7"), "{e}");
        std::fs::write(&f, "[[tenant]]\nname = \"a\"\ntcp_port = 7\nshare = 0.5\nshaer = 1\n").unwrap();
        assert!(matches!(
            Config::from_args(&args(&format!("--config {}", f.display()))),
            Err(ConfigError::File { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shuffle_table_from_the_file() {
        let dir = std::env::temp_dir().join(format!("slipstream-cfg-shuffle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s.toml");
        std::fs::write(&f, "[shuffle]\ntcp_port = 7301\nmemory_mb = 64\ndir = \"/tmp/x\"\n").unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        let s = c.shuffle.unwrap();
        assert_eq!((s.addr.port(), s.blocks_max), (7301, 32));
        std::fs::write(&f, "[shuffle]\nmemory_mb = 1\n").unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("[shuffle]: memory_mb 1 holds no block"), "{e}");
        std::fs::write(&f, "[shuffle]\n[[tenant]]\nname = \"t\"\ntcp_port = 7000\nshare = 0.5\n").unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("no [[tenant]] has shuffle_mb"), "{e}");
        let two = "[shuffle]\nmemory_mb = 64\n[[tenant]]\nname = \"a\"\ntcp_port = 7000\nshare = 0.5\nmemory_mb = 64\nshuffle_mb = 32\n[[tenant]]\nname = \"b\"\ntcp_port = 7001\nshare = 0.5\nmemory_mb = 64\nshuffle_mb = SHARE\n";
        std::fs::write(&f, two.replace("SHARE", "32")).unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        assert_eq!(c.shuffle_shares().iter().map(|s| s.bytes_max).collect::<Vec<_>>(), vec![32 << 20, 32 << 20]);
        // The store keeps the rest of the tenant's memory.
        assert_eq!(c.tenants[0].memory_bytes(), 32 << 20);
        std::fs::write(&f, two.replace("SHARE", "33")).unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("shuffle_mb add up to 65 MiB, more than [shuffle] memory_mb 64"), "{e}");
    }

    /// `[[tenant]] thrift_port` runs with `[hbase]` (which gives the sidecar and cache settings)
    /// and is refused without it.
    #[test]
    fn tenant_thrift_port_needs_hbase() {
        let dir = std::env::temp_dir().join(format!("slipstream-cfg-tthrift-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.toml");
        let tenant = "[[tenant]]\nname = \"t\"\ntcp_port = 7000\nshare = 0.5\nthrift_port = 7090\n";
        std::fs::write(&f, format!("[hbase]\n{tenant}")).unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        assert_eq!(c.tenants[0].thrift_port, Some(7090));
        assert!(c.hbase.is_some());
        std::fs::write(&f, tenant).unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("thrift_port needs [hbase]"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn streams_and_results_from_the_file() {
        let dir = std::env::temp_dir().join(format!("slipstream-cfg-s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s.toml");
        std::fs::write(
            &f,
            "[results]\ntcp_port = 7100\n[[stream]]\nname = \"sensor\"\nudp_port = 7001\noperator = \"changepoint\"\nwindow_ms = 100\n\
             reference_windows = 8\nthreshold = 5.0\nhistory = 1024\n[[stream]]\nname = \"words\"\nudp_port = 7002\noperator = \"wordcount\"\n",
        )
        .unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        assert_eq!(c.results.tcp_port, 7100);
        assert_eq!(c.streams.len(), 2);
        assert_eq!((c.streams[0].reference_windows, c.streams[0].history, c.streams[1].window_ms), (8, 1024, 100));
        std::fs::write(&f, "[[stream]]\nname = \"a\"\nudp_port = 7001\noperator = \"median\"\n").unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("operator"), "{e}");
        std::fs::write(&f, "[[stream]]\nname = \"a\"\nudp_port = 7001\noperator = \"wordcount\"\nwindw_ms = 5\n")
            .unwrap();
        assert!(matches!(
            Config::from_args(&args(&format!("--config {}", f.display()))),
            Err(ConfigError::File { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cluster_section_and_replica_keys_are_checked() {
        let cluster = |fsync: &str| FileCluster {
            node_id: 1,
            peers: vec!["1=127.0.0.1:13001".into(), "2=127.0.0.1:13002".into(), "3=127.0.0.1:13003".into()],
            data_dir: "/var/lib/slipstream".into(),
            fsync: fsync.into(),
            reads: default_reads(),
            wait_ms: default_wait_ms(),
            join: false,
            tick_ms: None,
            election_ticks: None,
            heartbeat_ticks: None,
        };
        let file: FileConfig = toml::from_str(
            "[cluster]\nnode_id = 1\npeers = [\"1=127.0.0.1:13001\", \"2=127.0.0.1:13002\", \"3=127.0.0.1:13003\"]\n\
             data_dir = \"/var/lib/slipstream\"\nfsync = \"batch\"\n\
             [[tenant]]\nname = \"t0\"\ntcp_port = 12000\nshare = 0.5\nreplicas = 3\npreferred_leader = 1\n",
        )
        .unwrap();
        assert_eq!(file.tenant[0].replicas, Some(3));
        assert_eq!(file.tenant[0].preferred_leader, Some(1));
        let (spec, opts) = check_cluster(file.cluster, &file.tenant).unwrap();
        assert_eq!(spec.map(|s| s.fsync), Some(slipstream_replication::FsyncMode::Batch));
        assert_eq!(opts, ReplicaOpts { local_reads: false, wait_ms: 3000, join: false });
        let mut two = file.tenant.clone();
        two[0].replicas = Some(2);
        // Fewer replicas than nodes: placed from the preferred leader on; no UDP then.
        check_cluster(Some(cluster("batch")), &two).unwrap();
        two[0].replicas = None;
        two[0].nodes = Some(vec![2, 4]);
        let e = check_cluster(Some(cluster("batch")), &two).unwrap_err();
        assert!(e.contains("nodes [2, 4]: node 4 is not in [cluster] peers"), "{e}");
        two[0].nodes = Some(vec![1, 3]);
        check_cluster(Some(cluster("batch")), &two).unwrap();
        two[0].udp_port = Some(12001);
        let e = check_cluster(Some(cluster("batch")), &two).unwrap_err();
        assert!(e.contains("udp_port: a tenant on [1, 3], not every node"), "{e}");
        let local = FileCluster { reads: "local".into(), wait_ms: 500, ..cluster("never") };
        assert_eq!(
            check_cluster(Some(local), &file.tenant).unwrap().1,
            ReplicaOpts { local_reads: true, wait_ms: 500, join: false }
        );
        let joining = FileCluster { join: true, ..cluster("never") };
        assert!(check_cluster(Some(joining), &file.tenant).unwrap().1.join);
        let e = check_cluster(Some(FileCluster { reads: "stale".into(), ..cluster("never") }), &file.tenant);
        assert!(e.unwrap_err().contains("reads \"stale\""));
        let e = check_cluster(Some(FileCluster { wait_ms: 0, ..cluster("never") }), &file.tenant);
        assert!(e.unwrap_err().contains("wait_ms 0"));
        let (spec, _) = check_cluster(Some(cluster("never")), &file.tenant).unwrap();
        assert_eq!(spec.unwrap().timing, Timing::default());
        let fast =
            FileCluster { tick_ms: Some(50), election_ticks: Some(8), heartbeat_ticks: Some(2), ..cluster("never") };
        let (spec, _) = check_cluster(Some(fast), &file.tenant).unwrap();
        assert_eq!(spec.unwrap().timing, Timing { tick_ms: 50, election_ticks: 8, heartbeat_ticks: 2 });
        let e = check_cluster(Some(FileCluster { heartbeat_ticks: Some(10), ..cluster("never") }), &file.tenant);
        assert!(e.unwrap_err().contains("election_ticks > heartbeat_ticks"));
        let mut one = file.tenant.clone();
        one[0].replicas = Some(1);
        one[0].preferred_leader = None;
        let spec = check_cluster(Some(cluster("batch")), &one).unwrap().0.unwrap();
        assert_eq!((spec.node_id, spec.peers.len()), (1, 3));
        let e = check_cluster(Some(cluster("sometimes")), &one).unwrap_err();
        assert!(e.starts_with("[cluster]: fsync"), "{e}");
        let mut bad = file.tenant.clone();
        bad[0].replicas = Some(5);
        let e = check_cluster(Some(cluster("always")), &bad).unwrap_err();
        assert!(e.contains("replicas 5: must be 1..=3"), "{e}");
        bad[0].replicas = Some(3);
        bad[0].preferred_leader = Some(4);
        assert!(check_cluster(Some(cluster("always")), &bad).unwrap_err().contains("preferred_leader 4"));
        bad[0].preferred_leader = None;
        assert!(check_cluster(None, &bad).unwrap_err().contains("[cluster]"));
        let dir = std::env::temp_dir().join(format!("slipstream-cfg-cluster-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("node.toml");
        std::fs::write(
            &f,
            "[cluster]\nnode_id = 2\npeers = [\"1=127.0.0.1:1\", \"2=127.0.0.1:2\"]\ndata_dir = \"/d\"\n",
        )
        .unwrap();
        let c = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap();
        assert_eq!(c.cluster.map(|c| (c.node_id, c.fsync)), Some((2, slipstream_replication::FsyncMode::Always)));
        std::fs::write(&f, "[cluster]\nnode_id = 2\npeers = [\"1=127.0.0.1:1\"]\ndata_dir = \"/d\"\n").unwrap();
        let e = Config::from_args(&args(&format!("--config {}", f.display()))).unwrap_err().to_string();
        assert!(e.contains("node_id 2 is not in peers"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shards_power_of_two_and_fit() {
        let c = Config::from_args(&args("-m 64")).unwrap();
        assert_eq!(c.store_shards(), 16);
        let c = Config::from_args(&args("-m 4096")).unwrap();
        assert_eq!(c.store_shards(), 64);
        let c = Config::from_args(&args("-m 2 -I 1m")).unwrap();
        assert_eq!(c.store_shards(), 1);
    }

    #[test]
    fn memcached_ports_and_listen_lists() {
        let c = Config::from_args(&args("-p -1 -U -1")).unwrap();
        assert!(c.tcp_ephemeral && c.udp_ephemeral);
        assert_eq!((c.tcp_addr().unwrap().port(), c.udp_addr().unwrap().port()), (0, 0));
        // memcached: -U N without -p serves TCP on N too.
        let c = Config::from_args(&args("-U 5000")).unwrap();
        assert_eq!((c.port, c.udp_port), (5000, 5000));
        let c = Config::from_args(&args("-U 5000 -p 6000")).unwrap();
        assert_eq!((c.port, c.udp_port), (6000, 5000));
        let c = Config::from_args(&args("-p 7000 -l 127.0.0.1,[::1]:7001 -l 127.0.0.2")).unwrap();
        assert_eq!(c.listen, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(c.listen_arg.as_deref(), Some("127.0.0.1,[::1]:7001,127.0.0.2"));
        let more: Vec<String> = c.more_addrs().iter().filter_map(|(t, _)| t.map(|a| a.to_string())).collect();
        assert_eq!(more, vec!["[::1]:7001", "127.0.0.2:7000"]);
        let c = Config::from_args(&args("-l 127.0.0.1:7100")).unwrap();
        assert_eq!(c.port, 7100);
        assert!(c.listen_notls.is_empty());
        assert!(Config::from_args(&args("-l 127.0.0.1:x")).is_err());
    }

    #[test]
    fn listen_notls_under_tls_only() {
        let e = Config::from_args(&args("-l notls:127.0.0.1")).unwrap_err();
        assert!(e.to_string().contains("'notls' option is valid only when SSL is enabled"), "{e}");
        let tls = "-Z -o ssl_chain_cert=c.pem -p 7000";
        let c = Config::from_args(&args(&format!("{tls} -l 127.0.0.1,notls:127.0.0.2,notls:[::1]:7001"))).unwrap();
        assert_eq!((c.listen_notls.clone(), c.listen), (vec![1, 2], IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let more: Vec<String> = c.more_addrs().iter().filter_map(|(t, _)| t.map(|a| a.to_string())).collect();
        assert_eq!(more, vec!["127.0.0.2:7000", "[::1]:7001"]);
        let c = Config::from_args(&args(&format!("{tls} -l notls:127.0.0.1:7002"))).unwrap();
        assert_eq!((c.listen_notls, c.port), (vec![0], 7002));
    }

    #[test]
    fn memcached_flags_set_the_tunables() {
        let c = Config::from_args(&args("-M -R 7 -B binary -b 99 -D | -X -d -P /tmp/x.pid -o idle_timeout=4")).unwrap();
        assert!(!c.evictions_enabled && c.daemonize);
        assert_eq!(c.pid_file.as_deref(), Some("/tmp/x.pid"));
        let t = &c.tunables;
        assert_eq!((t.reqs_per_event, t.reqs_per_event_set, t.tcp_backlog, t.idle_timeout_s), (7, true, 99, 4));
        assert_eq!(t.binding_protocol, slipstream_server::tunables::BindingProtocol::Binary);
        assert!(!t.dump_enabled);
        assert_eq!((c.prefix_delimiter, c.detail_enabled), (b'|', true));
        assert!(c.no_effect.is_empty());
        let c = Config::from_args(&args("-f 1.5 -L -o modern")).unwrap();
        assert_eq!(c.no_effect.len(), 3);
        assert!(Config::from_args(&args("-R 0")).is_err());
        assert!(Config::from_args(&args("-B tcp")).is_err());
        assert!(Config::from_args(&args("-D")).is_err());
    }
}
