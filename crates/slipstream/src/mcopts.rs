//! memcached's `-o` extended options (a comma list of `name` or `name=value`): the ones with a
//! meaning here set the config, the ones without (slab, LRU and hash table tuning) are accepted
//! with one start-up notice naming them, and report in `stats settings` as memcached would.
//!
//! Not for: the single-letter flags (config.rs) or the TLS options (`ssl_*`: security.rs, which
//! this hands them to).

use crate::security::SecurityConfig;
use slipstream_server::tunables::Tunables;

/// What `-o` may set: the parts of the configuration it touches (config.rs lends them), so this
/// module needs nothing of config.rs.
pub struct Targets<'a> {
    pub tunables: &'a mut Tunables,
    pub security: &'a mut SecurityConfig,
    pub conn_buf_bytes_max: &'a mut usize,
    /// Flags and options accepted with no effect, for the one start-up notice.
    pub no_effect: &'a mut Vec<String>,
}

/// A refused `-o` argument.
#[derive(Debug)]
pub enum OptError {
    /// `value` (the option as given) and why it is refused.
    Value {
        value: String,
        why: String,
    },
    Usage(String),
}

/// Record a flag or option accepted with no effect (once each; the one home of this rule).
pub fn notice_no_effect(list: &mut Vec<String>, what: &str) {
    if !list.iter().any(|w| w == what) {
        list.push(what.to_string());
    }
}

impl Targets<'_> {
    fn notice_no_effect(&mut self, what: &str) {
        notice_no_effect(self.no_effect, what);
    }
}

/// memcached 1.6.18's `-o` names that tune its slab allocator, LRU maintainer, hash table,
/// logger buffers, extstore or proxy: Slipstream has none of these, so they do nothing here.
const NO_EFFECT: &[&str] = &[
    "maxconns_fast",
    "no_maxconns_fast",
    "hashpower",
    "no_hashexpand",
    "slab_reassign",
    "no_slab_reassign",
    "slab_automove",
    "no_slab_automove",
    "slab_automove_ratio",
    "slab_automove_window",
    "tail_repair_time",
    "hash_algorithm",
    "lru_crawler_sleep",
    "lru_crawler_tocrawl",
    "hot_lru_pct",
    "warm_lru_pct",
    "hot_max_factor",
    "warm_max_factor",
    "temporary_ttl",
    "worker_logbuf_size",
    "slab_sizes",
    "slab_chunk_max",
    "track_sizes",
    "no_inline_ascii_resp",
    "inline_ascii_resp",
    "modern",
    "no_chunked_items",
    "drop_privileges",
    "no_drop_privileges",
    "resp_obj_mem_limit",
    "sock_cookie_id",
    "ext_path",
    "ext_page_size",
    "ext_wbuf_size",
    "ext_threads",
    "ext_io_depth",
    "ext_item_size",
    "ext_item_age",
    "ext_low_ttl",
    "ext_recache_rate",
    "ext_compact_under",
    "ext_drop_under",
    "ext_max_sleep",
    "ext_max_frag",
    "ext_drop_unread",
    "slab_automove_freeratio",
];

fn bad(value: &str, why: &str) -> OptError {
    OptError::Value { value: value.to_string(), why: why.to_string() }
}

fn num<T: std::str::FromStr>(name: &str, v: Option<&str>) -> Result<T, OptError> {
    let v = v.ok_or_else(|| bad(name, "needs a value (name=value)"))?;
    v.trim().parse::<T>().map_err(|_| bad(&format!("{name}={v}"), "not a number in range"))
}

/// Apply one `-o` argument.
pub fn apply(cfg: &mut Targets<'_>, arg: &str) -> Result<(), OptError> {
    for item in arg.split(',').filter(|s| !s.is_empty()) {
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (item, None),
        };
        apply_one(cfg, name, value)?;
    }
    Ok(())
}

fn apply_one(cfg: &mut Targets<'_>, name: &str, value: Option<&str>) -> Result<(), OptError> {
    if let Some(r) = cfg.security.apply_suboption(name, value) {
        return r.map_err(OptError::Usage);
    }
    let t = &mut *cfg.tunables;
    match name {
        "idle_timeout" => t.idle_timeout_s = num(name, value)?,
        "read_buf_mem_limit" => {
            // memcached's unit is megabytes; 0 = unlimited.
            let mb: u64 = num(name, value)?;
            let bytes = mb
                .checked_mul(1024 * 1024)
                .filter(|b| *b <= u64::from(u32::MAX))
                .ok_or_else(|| bad(name, "too large (memcached keeps it in 32 bits)"))?;
            t.read_buf_mem_limit_bytes = bytes;
            *cfg.conn_buf_bytes_max = if bytes == 0 { usize::MAX } else { bytes as usize };
        }
        "no_lru_crawler" => t.lru_crawler.store(false, std::sync::atomic::Ordering::Relaxed),
        "lru_crawler" => t.lru_crawler.store(true, std::sync::atomic::Ordering::Relaxed),
        "lru_crawler_sleep" => {
            t.lru_crawler_sleep_us = num(name, value)?;
            if t.lru_crawler_sleep_us > 1_000_000 {
                return Err(bad(name, "LRU crawler sleep must be between 0 and 1 second"));
            }
        }
        "lru_crawler_tocrawl" => t.lru_crawler_tocrawl = num(name, value)?,
        "lru_maintainer" | "no_lru_maintainer" => t.lru_maintainer = name == "lru_maintainer",
        // memcached's switch back to 1.4-era defaults: no LRU crawler or maintainer, no fast
        // connection-limit path, no slab mover, one LRU per class.
        "no_modern" => {
            t.lru_crawler.store(false, std::sync::atomic::Ordering::Relaxed);
            t.lru_maintainer = false;
            t.maxconns_fast = false;
            for (row, v) in [("slab_reassign", "no"), ("slab_automove", "0"), ("slab_chunk_max", "1048576")] {
                t.reported.push((row, v.into()));
            }
            cfg.notice_no_effect("-o no_modern (slab and hash settings)");
        }
        "watcher_logbuf_size" => {
            // memcached's unit is kilobytes (an unsigned int of bytes after the multiply).
            let kb: u64 = num(name, value)?;
            let bytes = kb
                .checked_mul(1024)
                .filter(|b| *b <= u64::from(u32::MAX))
                .ok_or_else(|| bad(name, "too large (memcached keeps it in 32 bits)"))?;
            t.watcher_logbuf_bytes = bytes as usize;
        }
        // memcached-debug's test-suite option (running as root); here it also turns on the
        // debug build's test hooks (`debugtime`) that the suite uses.
        "relaxed_privileges" => t.debug_commands = true,
        "maxconns_fast" => t.maxconns_fast = true,
        "no_maxconns_fast" => {
            t.maxconns_fast = false;
            cfg.notice_no_effect("-o no_maxconns_fast");
        }
        n if n.starts_with("proxy_") => {
            return Err(bad(n, "not supported by Slipstream"));
        }
        n if NO_EFFECT.contains(&n) => {
            if let Some(r) = reported(n, value) {
                cfg.tunables.reported.push(r);
            }
            cfg.notice_no_effect(&format!("-o {n}"));
        }
        n => return Err(bad(n, "not one of memcached 1.6's -o options")),
    }
    Ok(())
}

/// The `stats settings` line memcached would show for an accepted no-effect option.
fn reported(name: &str, value: Option<&str>) -> Option<(&'static str, String)> {
    let v = value.unwrap_or("").trim().to_string();
    Some(match name {
        "slab_reassign" => ("slab_reassign", "yes".into()),
        "no_slab_reassign" => ("slab_reassign", "no".into()),
        "no_slab_automove" => ("slab_automove", "0".into()),
        "slab_automove" => ("slab_automove", if v.is_empty() { "1".into() } else { v }),
        "hashpower" => ("hashpower_init", v),
        "tail_repair_time" => ("tail_repair_time", v),
        "hot_lru_pct" => ("hot_lru_pct", v),
        "warm_lru_pct" => ("warm_lru_pct", v),
        "temporary_ttl" => ("temporary_ttl", v),
        // memcached's unit is kilobytes.
        "worker_logbuf_size" => {
            ("worker_logbuf_size", v.parse::<u64>().map(|kb| kb.saturating_mul(1024).to_string()).unwrap_or(v))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meaningful_options_set_the_config_and_the_rest_are_noticed() {
        let (mut tunables, mut security, mut conn_buf, mut notes) =
            (Tunables::default(), SecurityConfig::default(), 0usize, Vec::new());
        let mut t = Targets {
            tunables: &mut tunables,
            security: &mut security,
            conn_buf_bytes_max: &mut conn_buf,
            no_effect: &mut notes,
        };
        apply(&mut t, "modern,idle_timeout=5,read_buf_mem_limit=32,slab_reassign,hashpower=20").unwrap();
        assert!(apply(&mut t, "idle_timeout").is_err());
        assert!(apply(&mut t, "bogus").is_err());
        assert!(apply(&mut t, "proxy_config=x").is_err());
        assert_eq!(tunables.idle_timeout_s, 5);
        assert_eq!(conn_buf, 32 << 20);
        assert_eq!(tunables.read_buf_mem_limit_bytes, 32 << 20);
        assert!(tunables.reported.contains(&("hashpower_init", "20".to_string())));
        assert_eq!(notes, vec!["-o modern", "-o slab_reassign", "-o hashpower"]);
        let mut t = Targets {
            tunables: &mut tunables,
            security: &mut security,
            conn_buf_bytes_max: &mut conn_buf,
            no_effect: &mut notes,
        };
        apply(&mut t, "read_buf_mem_limit=0").unwrap();
        assert_eq!(conn_buf, usize::MAX);
    }
}
