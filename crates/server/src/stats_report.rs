//! The `stats` family's contents: one (name, value) list per sub-command — general `stats`,
//! `stats settings`, `stats items`, `stats slabs`, `stats sizes`, `stats conns` — with
//! memcached 1.6.18's names in its order. The text protocol frames each row as `STAT name
//! value`, the binary protocol as one STAT packet; neither has a list of its own, so the two can
//! never disagree.
//!
//! Values Slipstream has print its values; memcached internals it has no counterpart for (slab
//! mover, LRU crawler, logger, extstore, TLS) print memcached's defaults or 0. Slipstream's own
//! `fastpath_*` counters follow the general list only while the kernel fast path is attached,
//! so a client comparing `stats` against memcached sees memcached's set otherwise.
//!
//! Not for: counting (`stats.rs`, `slipstream-store`), per-prefix detail (`stats_prefix.rs`),
//! framing or the sub-command syntax (the protocol executors).

use crate::credentials::Auth;
use crate::exec::Settings;
use crate::stats::ServerInfo;
use slipstream_store::Store;
use std::borrow::Cow;
use std::sync::atomic::Ordering;

/// One row: name, value bytes (text, except a `-D` delimiter byte that is not ASCII).
pub type Stat = (Cow<'static, str>, Vec<u8>);

/// Which list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsList {
    General,
    Settings,
    Items,
    Slabs,
    Sizes,
    /// `stats conns`; the connection asking (`ConnState::conn_id`) reads `conn_parse_cmd`.
    Conns {
        asking_conn_id: i32,
        asking_udp_peer: Option<std::net::SocketAddr>,
    },
}

/// What the lists are made from (no executor context: a stats list needs none of a
/// connection's state).
#[derive(Clone, Copy)]
pub struct StatsView<'a> {
    pub server: &'a ServerInfo,
    pub store: &'a Store,
    pub settings: &'a Settings,
}

/// The rows of `list`.
pub fn rows(v: StatsView<'_>, list: StatsList) -> Vec<Stat> {
    match list {
        StatsList::General => general(v),
        StatsList::Settings => settings(v),
        StatsList::Items => items(v),
        StatsList::Slabs => slabs(v),
        StatsList::Sizes => vec![(Cow::Borrowed("sizes_status"), b"disabled".to_vec())],
        StatsList::Conns { asking_conn_id, asking_udp_peer } => conns(v.server, asking_conn_id, asking_udp_peer),
    }
}

/// Rows whose value is 0 in Slipstream (no such mechanism here).
fn zeros(v: &mut Vec<Stat>, names: &[&'static str]) {
    v.extend(names.iter().map(|&n| (Cow::Borrowed(n), b"0".to_vec())));
}

fn put(v: &mut Vec<Stat>, name: &'static str, value: impl ToString) {
    v.push((Cow::Borrowed(name), value.to_string().into_bytes()));
}

/// memcached 1.6.18's general `stats`, names and order exactly as it prints them.
fn general(sv: StatsView<'_>) -> Vec<Stat> {
    let server = sv.server;
    let curr_conns = server.curr_connections.load(Ordering::Relaxed);
    let (user, system) = rusage();
    let mut v: Vec<Stat> = Vec::with_capacity(96);
    put(&mut v, "pid", server.pid);
    put(&mut v, "uptime", server.uptime_s());
    put(&mut v, "time", sv.store.clock().now_unix_s());
    put(&mut v, "version", sv.settings.version);
    put(&mut v, "libevent", "slipstream");
    put(&mut v, "pointer_size", usize::BITS);
    put(&mut v, "rusage_user", user);
    put(&mut v, "rusage_system", system);
    put(&mut v, "max_connections", server.conn_limit);
    put(&mut v, "curr_connections", curr_conns);
    let t = server.totals();
    put(&mut v, "total_connections", t.total_connections);
    // memcached lists it only with its fast connection-limit path (`-o maxconns_fast`).
    if sv.settings.tunables.maxconns_fast {
        put(&mut v, "rejected_connections", t.rejected_connections);
    }
    put(&mut v, "connection_structures", curr_conns);
    zeros(&mut v, &["response_obj_oom", "response_obj_count", "response_obj_bytes", "read_buf_count"]);
    zeros(&mut v, &["read_buf_bytes", "read_buf_bytes_free", "read_buf_oom"]);
    put(&mut v, "reserved_fds", 20);
    general_counters(sv, &mut v);
    general_tail(sv, &mut v);
    v
}

/// The command and traffic counters of the general list (from `cmd_get` to `limit_maxbytes`).
fn general_counters(sv: StatsView<'_>, v: &mut Vec<Stat>) {
    let t = sv.server.totals();
    let st = sv.store.stats();
    let counters = [
        ("cmd_get", t.cmd_get),
        ("cmd_set", t.cmd_set),
        ("cmd_flush", t.cmd_flush),
        ("cmd_touch", t.cmd_touch),
        ("cmd_meta", t.cmd_meta),
        ("get_hits", t.get_hits),
        ("get_misses", t.get_misses),
        ("get_expired", t.get_expired + st.get_expired),
        ("get_flushed", t.get_flushed + st.get_flushed),
        ("delete_misses", t.delete_misses),
        ("delete_hits", t.delete_hits),
        ("incr_misses", t.incr_misses),
        ("incr_hits", t.incr_hits),
        ("decr_misses", t.decr_misses),
        ("decr_hits", t.decr_hits),
        ("cas_misses", t.cas_misses),
        ("cas_hits", t.cas_hits),
        ("cas_badval", t.cas_badval),
        ("touch_hits", t.touch_hits),
        ("touch_misses", t.touch_misses),
        ("store_too_large", t.store_too_large),
        ("store_no_memory", t.store_no_memory),
        ("auth_cmds", t.auth_cmds),
        ("auth_errors", t.auth_errors),
        ("bytes_read", t.bytes_read),
        ("bytes_written", t.bytes_written),
        ("limit_maxbytes", st.limit_maxbytes),
    ];
    for (name, value) in counters {
        put(v, name, value);
        // memcached lists idle_kicks only when -o idle_timeout is set.
        if name == "auth_errors" && sv.settings.tunables.idle_timeout_s > 0 {
            put(v, "idle_kicks", t.idle_kicks);
        }
    }
}

/// The general list from `accepting_conns` on: threads, hash table, slab mover and LRU
/// internals, item gauges, then the fast path's counters while it is attached.
fn general_tail(sv: StatsView<'_>, v: &mut Vec<Stat>) {
    let server = sv.server;
    put(v, "accepting_conns", 1);
    put(v, "listen_disabled_num", 0);
    put(v, "time_in_listen_disabled_us", 0);
    put(v, "threads", server.threads);
    put(v, "conn_yields", server.totals().conn_yields);
    // `general_counters` called `store.stats()`, which sampled the item count into the peak.
    let power = sv.settings.tunables.hash_power_level(sv.store.items_peak());
    put(v, "hash_power_level", power);
    put(v, "hash_bytes", 8u64 << power);
    put(v, "hash_is_expanding", 0);
    // memcached lists the slab mover's rows only while it is on.
    let mover: &[&str] = if sv.settings.tunables.slab_reassign() { SLAB_MOVER_ROWS } else { &[] };
    zeros(v, mover);
    crawler_and_log_stats(sv, v);
    general_items(sv, v);
}

/// `stats` rows of memcached's slab mover (zero here: no slabs to move).
const SLAB_MOVER_ROWS: &[&str] = &[
    "slab_reassign_rescues",
    "slab_reassign_chunk_rescues",
    "slab_reassign_evictions_nomem",
    "slab_reassign_inline_reclaim",
    "slab_reassign_busy_items",
    "slab_reassign_busy_deletes",
    "slab_reassign_running",
    "slabs_moved",
];

/// The general list's tail after the crawler's rows: TLS, items, evictions, LRU rows, the
/// fast path's counters.
fn general_items(sv: StatsView<'_>, v: &mut Vec<Stat>) {
    let server = sv.server;
    let st = sv.store.stats();
    if let Some(tls) = sv.settings.tls.as_deref() {
        // memcached's TLS rows, only under -Z (no `ssl_new_sessions`: its session cache option
        // has no effect here).
        put(v, "ssl_handshake_errors", tls.handshake_errors.load(Ordering::Relaxed));
        put(v, "time_since_server_cert_refresh", tls.since_refresh_s(server.uptime_s()));
    }
    zeros(v, &["unexpected_napi_ids", "round_robin_fallback"]);
    put(v, "bytes", st.bytes);
    put(v, "curr_items", st.curr_items);
    put(v, "total_items", st.total_items);
    put(v, "slab_global_page_pool", 0);
    put(v, "expired_unfetched", st.expired_unfetched);
    put(v, "evicted_unfetched", st.evicted_unfetched);
    let maintainer = sv.settings.tunables.lru_maintainer;
    if maintainer {
        put(v, "evicted_active", 0);
    }
    put(v, "evictions", st.evictions);
    put(v, "reclaimed", st.reclaimed);
    put(v, "crawler_reclaimed", st.crawler_reclaimed);
    put(v, "crawler_items_checked", st.crawler_items_checked);
    put(v, "lrutail_reflocked", 0);
    if maintainer {
        zeros(v, &["moves_to_cold", "moves_to_warm", "moves_within_lru", "direct_reclaims", "lru_bumps_dropped"]);
    }
    // Slipstream's own, only while the kernel fast path is attached (memcached has no such keys).
    if let Some(fp) = server.fastpath_attached() {
        put(v, "fastpath_hits", fp.hits);
        put(v, "fastpath_misses", fp.misses);
        put(v, "fastpath_invalidations", fp.invalidations);
    }
}

/// The LRU crawler's and the log stream's rows (see `crawler`, `watch`); Slipstream's
/// loggers never drop a line before the watchers' buffers (`log_worker_dropped` 0).
fn crawler_and_log_stats(sv: StatsView<'_>, v: &mut Vec<Stat>) {
    // memcached lists the crawler's rows only while it is enabled, the maintainer's only with
    // the maintainer on.
    let c = &crate::crawler::CRAWLER;
    if sv.settings.tunables.lru_crawler_on() {
        put(v, "lru_crawler_running", u8::from(c.running()));
        put(v, "lru_crawler_starts", c.starts());
    }
    if sv.settings.tunables.lru_maintainer {
        put(v, "lru_maintainer_juggles", crate::maintainer::MAINTAINER.juggles());
    }
    zeros(v, &["malloc_fails", "log_worker_dropped"]);
    let l = &sv.settings.logger.stats;
    put(v, "log_worker_written", l.worker_written.load(Ordering::Relaxed));
    put(v, "log_watcher_skipped", l.watcher_skipped.load(Ordering::Relaxed));
    put(v, "log_watcher_sent", l.watcher_sent.load(Ordering::Relaxed));
    put(v, "log_watchers", l.watchers.load(Ordering::Relaxed));
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// memcached's `-S` binds the binary protocol, `-Y` ascii; otherwise it negotiates.
fn binding_protocol(auth: Option<&Auth>) -> &'static str {
    match auth {
        Some(Auth::Sasl { .. }) => "binary",
        Some(Auth::Ascii { .. }) => "ascii",
        None => "auto-negotiate",
    }
}

/// memcached reports the `-Y` file's path here, "no" without one.
fn auth_enabled_ascii(auth: Option<&Auth>) -> &str {
    match auth {
        Some(Auth::Ascii { path, .. }) => path,
        _ => "no",
    }
}

/// `stats settings`: memcached 1.6.18's names in its order. Tunables Slipstream has print their
/// values; memcached tunables it has no counterpart for print memcached's defaults.
fn settings(sv: StatsView<'_>) -> Vec<Stat> {
    let cfg = sv.store.config();
    let info = sv.server;
    let st = sv.settings;
    let tu = &st.tunables;
    let s = |v: &str| v.as_bytes().to_vec();
    let n = |v: u64| v.to_string().into_bytes();
    let rows: [(&'static str, Vec<u8>); 76] = [
        ("maxbytes", n(sv.store.memory_bytes_max() as u64)),
        ("maxconns", n(info.conn_limit as u64)),
        ("tcpport", n(u64::from(info.tcp_port))),
        ("udpport", n(u64::from(info.udp_port))),
        ("inter", s(info.listen_interface.as_deref().unwrap_or("NULL"))),
        ("verbosity", n(info.verbosity.load(Ordering::Relaxed))),
        ("oldest", s("0")),
        ("evictions", s(if sv.store.evict_to_free() { "on" } else { "off" })),
        ("domain_socket", s(st.domain_socket.as_deref().unwrap_or("NULL"))),
        ("umask", format!("{:o}", st.socket_mode).into_bytes()),
        ("shutdown_command", s(yes_no(st.shutdown_enabled))),
        ("growth_factor", s("1.25")),
        ("chunk_size", s("48")),
        ("num_threads", n(info.threads as u64)),
        // memcached gives each thread a UDP socket, but one per address for a `-l` list.
        (
            "num_threads_per_udp",
            n(if info.listen_interface.as_deref().is_some_and(|i| i.contains(',')) { 1 } else { info.threads as u64 }),
        ),
        ("stat_key_prefix", vec![st.prefix_delimiter]),
        ("detail_enabled", s(yes_no(info.prefix_stats.enabled()))),
        ("reqs_per_event", n(u64::from(tu.reqs_per_event))),
        ("cas_enabled", s(yes_no(cfg.cas_enabled))),
        ("tcp_backlog", s(&tu.tcp_backlog.to_string())),
        (
            "binding_protocol",
            s(if st.auth.is_some() { binding_protocol(st.auth.as_deref()) } else { tu.binding_protocol.stats_name() }),
        ),
        ("auth_enabled_sasl", s(yes_no(matches!(st.auth.as_deref(), Some(Auth::Sasl { .. }))))),
        ("auth_enabled_ascii", s(auth_enabled_ascii(st.auth.as_deref()))),
        ("item_size_max", n(cfg.item_bytes_max as u64)),
        ("maxconns_fast", s(yes_no(tu.maxconns_fast))),
        ("hashpower_init", s("0")),
        ("slab_reassign", s("yes")),
        ("slab_automove", s("1")),
        ("slab_automove_ratio", s("0.80")),
        ("slab_automove_window", s("30")),
        ("slab_chunk_max", s("524288")),
        ("lru_crawler", s(yes_no(tu.lru_crawler_on()))),
        ("lru_crawler_sleep", n(u64::from(tu.lru_crawler_sleep_us))),
        ("lru_crawler_tocrawl", n(u64::from(tu.lru_crawler_tocrawl))),
        ("tail_repair_time", s("0")),
        ("flush_enabled", s(yes_no(st.flush_enabled))),
        ("dump_enabled", s(yes_no(tu.dump_enabled))),
        ("hash_algorithm", s("slipstream")),
        ("lru_maintainer_thread", s(yes_no(tu.lru_maintainer))),
        // memcached's maintainer switches turn its segmented LRU on and off with it.
        ("lru_segmented", s(yes_no(tu.lru_maintainer))),
        ("hot_lru_pct", s("20")),
        ("warm_lru_pct", s("40")),
        ("hot_max_factor", s("0.20")),
        ("warm_max_factor", s("2.00")),
        ("temp_lru", s("no")),
        ("temporary_ttl", s("61")),
        ("idle_timeout", n(u64::from(tu.idle_timeout_s))),
        ("watcher_logbuf_size", n(st.logger.watcher_buf_bytes() as u64)),
        ("worker_logbuf_size", s("65536")),
        ("read_buf_mem_limit", n(tu.read_buf_mem_limit_bytes)),
        ("track_sizes", s("no")),
        ("inline_ascii_response", s("no")),
        ("ext_item_size", s("512")),
        ("ext_item_age", s("4294967295")),
        ("ext_low_ttl", s("0")),
        ("ext_recache_rate", s("2000")),
        ("ext_wbuf_size", s("4194304")),
        ("ext_compact_under", s("0")),
        ("ext_drop_under", s("0")),
        ("ext_max_sleep", s("1000000")),
        ("ext_max_frag", s("0.80")),
        ("slab_automove_freeratio", s("0.010")),
        ("ext_drop_unread", s("no")),
        ("ssl_enabled", s("no")),
        ("ssl_chain_cert", s("(null)")),
        ("ssl_key", s("(null)")),
        ("ssl_verify_mode", s("0")),
        ("ssl_keyformat", s("1")),
        ("ssl_ciphers", s("NULL")),
        ("ssl_ca_cert", s("NULL")),
        ("ssl_wbuf_size", s("16384")),
        ("ssl_session_cache", s("no")),
        ("ssl_kernel_tls", s("no")),
        ("ssl_min_version", s("tlsv1.2")),
        ("num_napi_ids", s("(null)")),
        ("memory_file", s("(null)")),
    ];
    let mut rows: Vec<Stat> = rows.into_iter().map(|(n, v)| (Cow::Borrowed(n), v)).collect();
    // memcached options accepted without effect print as memcached would show them.
    for (name, value) in &tu.reported {
        if let Some(e) = rows.iter_mut().find(|e| e.0 == *name) {
            e.1 = value.as_bytes().to_vec();
        }
    }
    rows
}

/// `stats items`: Slipstream has one item class, reported as memcached's class 1 when it holds
/// items (memcached lists only non-empty classes).
fn items(sv: StatsView<'_>) -> Vec<Stat> {
    let s = sv.store.stats();
    if s.curr_items == 0 {
        return Vec::new();
    }
    let rows: [(&str, u64); 28] = [
        ("number", s.curr_items),
        ("number_hot", 0),
        ("number_warm", 0),
        ("number_cold", s.curr_items),
        ("age_hot", 0),
        ("age_warm", 0),
        ("age", s.oldest_item_age_s),
        ("mem_requested", s.bytes),
        ("evicted", s.evictions),
        ("evicted_nonzero", 0),
        ("evicted_time", 0),
        ("outofmemory", sv.store.outofmemory()),
        ("tailrepairs", 0),
        ("reclaimed", s.reclaimed),
        ("expired_unfetched", s.expired_unfetched),
        ("evicted_unfetched", s.evicted_unfetched),
        ("evicted_active", 0),
        ("crawler_reclaimed", s.crawler_reclaimed),
        ("crawler_items_checked", s.crawler_items_checked),
        ("lrutail_reflocked", 0),
        ("moves_to_cold", 0),
        ("moves_to_warm", 0),
        ("moves_within_lru", 0),
        ("direct_reclaims", 0),
        ("hits_to_hot", 0),
        ("hits_to_warm", 0),
        ("hits_to_cold", 0),
        ("hits_to_temp", 0),
    ];
    // memcached lists the segmented LRU's rows only with its LRU maintainer on.
    let maintainer = sv.settings.tunables.lru_maintainer;
    rows.iter()
        .filter(|(name, _)| maintainer || !SEGMENTED_LRU_ITEM_ROWS.contains(name))
        .map(|(name, v)| (Cow::Owned(format!("items:1:{name}")), v.to_string().into_bytes()))
        .collect()
}

/// The `stats items` rows memcached prints only while its LRU maintainer runs.
const SEGMENTED_LRU_ITEM_ROWS: &[&str] = &[
    "number_hot",
    "number_warm",
    "number_cold",
    "age_hot",
    "age_warm",
    "evicted_active",
    "moves_to_cold",
    "moves_to_warm",
    "moves_within_lru",
    "direct_reclaims",
    "hits_to_hot",
    "hits_to_warm",
    "hits_to_cold",
    "hits_to_temp",
];

/// `stats slabs`: one class (see `items`), then the totals memcached prints.
fn slabs(sv: StatsView<'_>) -> Vec<Stat> {
    let s = sv.store.stats();
    let t = sv.server.totals();
    // memcached lists a class once it has a page, and keeps it after its items are gone
    // (deleted, expired, reclaimed): here, once any item was stored.
    let active = u64::from(s.curr_items > 0 || s.total_items > 0);
    let mut v = Vec::new();
    if active == 1 {
        let rows: [(&str, u64); 15] = [
            ("chunk_size", 0),
            ("chunks_per_page", 0),
            ("total_pages", 0),
            ("total_chunks", s.curr_items),
            ("used_chunks", s.curr_items),
            ("free_chunks", 0),
            ("free_chunks_end", 0),
            ("get_hits", t.get_hits),
            ("cmd_set", t.cmd_set),
            ("delete_hits", t.delete_hits),
            ("incr_hits", t.incr_hits),
            ("decr_hits", t.decr_hits),
            ("cas_hits", t.cas_hits),
            ("cas_badval", t.cas_badval),
            ("touch_hits", t.touch_hits),
        ];
        v.extend(rows.iter().map(|(name, n)| (Cow::Owned(format!("1:{name}")), n.to_string().into_bytes())));
    }
    put(&mut v, "active_slabs", active);
    put(&mut v, "total_malloced", s.malloced_bytes);
    v
}

/// `stats conns`: one group per listener, UDP socket and connection, keyed by fd, as memcached
/// prints it, in memcached's order (its listeners are opened before its UDP sockets, and both
/// before any client: it lists by fd; Slipstream binds UDP first, so it sorts by kind first).
/// An idle UDP socket prints `UDP UDP`, its own address and `conn_read`, as memcached's does;
/// the UDP socket serving the asking datagram prints the sender, its own address as
/// `listen_addr` and `conn_parse_cmd`. The asking connection is `conn_parse_cmd`; the others
/// are idle between requests as far as this thread can tell: `conn_new_cmd` before their first
/// request, `conn_read` after (memcached parks an idle connection in conn_read), `conn_nread`
/// while a request's data block or body is still coming, `conn_watch` once `watch` handed them
/// to the log writer.
fn conns(server: &ServerInfo, asking_conn_id: i32, asking_udp_peer: Option<std::net::SocketAddr>) -> Vec<Stat> {
    let now = server.uptime_s();
    let mut entries: Vec<(i32, crate::stats::ConnEntry)> = match server.conns.lock() {
        Ok(reg) => reg.iter().map(|(k, v)| (*k, v.clone())).collect(),
        Err(_) => Vec::new(),
    };
    let is_udp = |e: &crate::stats::ConnEntry| e.listen_addr.is_none() && e.addr.starts_with("udp:");
    entries.sort_by_key(|(fd, e)| (u8::from(e.listen_addr.is_some()) * 2 + u8::from(is_udp(e)), *fd));
    let mut v = Vec::with_capacity(entries.len() * 4);
    for (fd, e) in entries {
        let name = |field: &str| Cow::Owned(format!("{fd}:{field}"));
        let udp = is_udp(&e);
        if udp {
            v.push((name("UDP"), b"UDP".to_vec()));
        }
        let state = match (&e.listen_addr, fd == asking_conn_id) {
            (None, true) if udp && asking_udp_peer.is_some() => {
                let peer = asking_udp_peer.map(|p| format!("udp:{p}")).unwrap_or_default();
                v.push((name("addr"), peer.into_bytes()));
                v.push((name("listen_addr"), e.addr.clone().into_bytes()));
                "conn_parse_cmd"
            }
            (None, _) => {
                v.push((name("addr"), e.addr.clone().into_bytes()));
                if udp {
                    "conn_read"
                } else {
                    "conn_listening"
                }
            }
            (Some(l), asking) => {
                v.push((name("addr"), e.addr.clone().into_bytes()));
                v.push((name("listen_addr"), l.clone().into_bytes()));
                match (asking, e.watching, e.last_cmd.seen()) {
                    (true, _, _) => "conn_parse_cmd",
                    (false, true, _) => "conn_watch",
                    (false, false, true) if e.last_cmd.awaiting_data() => "conn_nread",
                    (false, false, true) => "conn_read",
                    (false, false, false) => "conn_new_cmd",
                }
            }
        };
        v.push((name("state"), state.as_bytes().to_vec()));
        let since = now.saturating_sub(e.last_cmd.secs());
        v.push((name("secs_since_last_cmd"), since.to_string().into_bytes()));
    }
    v
}

/// User and system CPU time as memcached prints them (`seconds.microseconds`).
fn rusage() -> (String, String) {
    // SAFETY: getrusage only writes into the zero-initialised struct we own; RUSAGE_SELF is
    // always a valid `who`.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return ("0.000000".to_string(), "0.000000".to_string());
        }
        ru
    };
    let fmt = |tv: libc::timeval| format!("{}.{:06}", tv.tv_sec, tv.tv_usec);
    (fmt(ru.ru_utime), fmt(ru.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::ThreadStats;
    use slipstream_store::{Clock, StoreConfig};
    use std::sync::Arc;

    fn rig() -> (Store, ServerInfo, Settings) {
        let cfg = StoreConfig { memory_bytes_max: 8 << 20, shards: 4, ..StoreConfig::default() };
        let store = Store::with_clock(cfg, Clock::manual(1_700_000_000));
        (store, ServerInfo::detached(vec![Arc::new(ThreadStats::default())], 1 << 20), Settings::default())
    }

    #[test]
    fn general_is_memcacheds_92_names_and_fastpath_only_when_attached() {
        let (store, mut server, settings) = rig();
        let names = |server: &ServerInfo| -> Vec<String> {
            rows(StatsView { server, store: &store, settings: &settings }, StatsList::General)
                .into_iter()
                .map(|(n, _)| n.into_owned())
                .collect()
        };
        let n = names(&server);
        assert_eq!(n.len(), 92);
        assert_eq!((n[0].as_str(), n[91].as_str()), ("pid", "lru_bumps_dropped"));
        assert!(!n.iter().any(|x| x.starts_with("fastpath_")));
        server.fastpath = Some(crate::stats::FastPathSource(Arc::new(|| {
            Some(crate::stats::FastPathTotals { hits: 3, misses: 1, ..Default::default() })
        })));
        let n = names(&server);
        assert_eq!(&n[92..], &["fastpath_hits", "fastpath_misses", "fastpath_invalidations"]);
        // A source that reports nothing attached (a tenant before the fast path is on).
        server.fastpath = Some(crate::stats::FastPathSource(Arc::new(|| None)));
        assert_eq!(names(&server).len(), 92);
    }

    #[test]
    fn settings_has_memcacheds_76_rows_and_live_verbosity() {
        let (store, server, settings) = rig();
        server.verbosity.store(2, Ordering::Relaxed);
        let v = rows(StatsView { server: &server, store: &store, settings: &settings }, StatsList::Settings);
        assert_eq!(v.len(), 76);
        assert_eq!(v[0], (Cow::Borrowed("maxbytes"), (8u64 << 20).to_string().into_bytes()));
        assert!(v.contains(&(Cow::Borrowed("verbosity"), b"2".to_vec())));
        assert_eq!(v[75].0, "memory_file");
    }
}
