//! slipstream-server: the user-space serving path of the Slipstream daemon.
//!
//! What it is for: per-core event loops (TCP with SO_REUSEPORT listeners, UDP), connection
//! buffers with pipelining and reply coalescing, and the executors that tie each memcached
//! protocol to the store (`memcache_text` for text + meta, `memcache_binary` for binary), and
//! `fastpath`, which attaches the kernel XDP fast path and makes the store keep it coherent.
//!
//! What it is not for: command-line parsing (the `slipstream` binary) or protocol byte rules
//! (`slipstream-proto`).

pub mod admin;
pub mod auth;
mod bind;
pub mod bufbudget;
pub mod crawler;
pub mod credentials;
pub mod dispatch;
pub mod exec;
pub mod fastpath;
pub mod harness;
pub mod maintainer;
pub mod memcache_admin;
pub mod memcache_binary;
pub mod memcache_meta;
pub mod memcache_text;
pub mod net;
pub mod outq;
pub mod relay;
pub mod replicated;
pub mod stats;
pub mod stats_prefix;
pub mod stats_report;
pub mod tenants;
pub mod transport;
pub mod tunables;
mod udp_batch;
pub mod watch;

/// What `version` reports: the memcached protocol level we match, then our own name.
pub const VERSION_STRING: &str = "1.6.18-slipstream-0.1.0";
