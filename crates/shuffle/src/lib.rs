//! Slipstream's shuffle service for Spark (issue 17, after NetSpark): the daemon owns a pool of
//! fixed-size blocks (files in a tmpfs directory, 2 MiB by default) that map tasks in the JVM
//! map and serialize into directly, and the registry of which (shuffle, map, partition) lives
//! where. Reducers ask for their partition's segments, map the same files and deserialize in
//! place; nothing is copied through a socket on the local path. The JVM half is
//! `io.slipstream.spark.shuffle.SlipstreamShuffleManager` in `connectors/spark`.
//!
//! Layout: [`pool`] (the block files and the memory limit), [`registry`] (apps, shuffles, map
//! commits with first-successful-attempt-wins, lookups, pins), [`proto`] (the control protocol:
//! parse and compose, no I/O), [`peer`] (the cross-host path: FETCH between daemons by
//! sendfile/splice), [`forward`] (an application's or shuffle's end passed on to the peers),
//! [`tenants`] (a Spark application is a tenant: its share of the pool and
//! the buckets its bytes pay from), [`server`] (the TCP port, connection threads, metrics).
//!
//! Not for (yet): compressing shuffle data.

pub mod forward;
pub mod peer;
pub mod pool;
pub mod proto;
pub mod registry;
pub mod server;
pub mod tenants;

pub use server::{Settings, ShuffleConfig, ShuffleService};
pub use tenants::{ShuffleTenant, TenantShare};

/// Why a request was refused. `Client` errors are the caller's input; `Server` errors are this
/// daemon's limits (the pool is full, a table is at its bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShuffleError {
    /// The pool has no block left under its memory limit.
    PoolFull {
        blocks_max: usize,
        block_bytes: usize,
    },
    /// A table reached its bound (`what` names it).
    Limit {
        what: &'static str,
        max: usize,
    },
    /// Creating or sizing a block file failed.
    Io(String),
    UnknownShuffle,
    /// REGISTER again with a different partition count.
    PartitionsMismatch {
        registered: u32,
        asked: u32,
    },
    /// A committed segment names a block this connection did not allocate for this shuffle.
    NotYourBlock(u32),
    UnknownBlock(u32),
    /// A segment out of its block or its shuffle's partitions.
    BadSegment(String),
    /// The request line itself.
    Syntax(String),
    /// A tenant this daemon has no shuffle share for (`known`: the names it has, comma-separated).
    UnknownTenant {
        name: String,
        known: String,
    },
    /// This daemon charges every application to a tenant and the request named none.
    NoTenant {
        known: String,
    },
    /// The application was registered under another tenant.
    TenantMismatch {
        app: String,
        tenant: String,
    },
    /// The application's tenant holds all the blocks of its share (other tenants unaffected).
    TenantFull {
        tenant: String,
        blocks_max: usize,
        block_bytes: usize,
    },
    /// The tenant's token bucket stayed in debt for the longest a request may wait.
    TenantBusy {
        tenant: String,
        waited_ms: u64,
    },
}

impl ShuffleError {
    /// Whether the client is at fault (memcached's CLIENT_ERROR) rather than this daemon.
    pub fn is_client(&self) -> bool {
        !matches!(
            self,
            ShuffleError::PoolFull { .. }
                | ShuffleError::Limit { .. }
                | ShuffleError::Io(_)
                | ShuffleError::TenantFull { .. }
                | ShuffleError::TenantBusy { .. }
        )
    }
}

impl std::fmt::Display for ShuffleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShuffleError::PoolFull { blocks_max, block_bytes } => write!(
                f,
                "shuffle pool full: all {blocks_max} blocks of {block_bytes} bytes are in use (raise [shuffle] memory_mb)"
            ),
            ShuffleError::Limit { what, max } => write!(f, "too many {what} (at most {max})"),
            ShuffleError::Io(e) => write!(f, "block file: {e}"),
            ShuffleError::UnknownShuffle => write!(f, "unknown shuffle (not registered, or unregistered)"),
            ShuffleError::PartitionsMismatch { registered, asked } => {
                write!(f, "shuffle registered with {registered} partitions, not {asked}")
            }
            ShuffleError::NotYourBlock(b) => write!(f, "block {b} was not allocated on this connection for this shuffle"),
            ShuffleError::UnknownBlock(b) => write!(f, "unknown block {b}"),
            ShuffleError::BadSegment(why) => write!(f, "bad segment: {why}"),
            ShuffleError::Syntax(why) => write!(f, "{why}"),
            ShuffleError::UnknownTenant { name, known } => {
                write!(f, "unknown tenant {name:?} (tenants with a shuffle_mb share here: {known})")
            }
            ShuffleError::NoTenant { known } => write!(
                f,
                "this daemon charges shuffles to tenants: set spark.slipstream.shuffle.tenant to one of {known}"
            ),
            ShuffleError::TenantMismatch { app, tenant } => {
                write!(f, "application {app} is registered under tenant {tenant:?}")
            }
            ShuffleError::TenantFull { tenant, blocks_max, block_bytes } => write!(
                f,
                "shuffle pool full for tenant {tenant:?}: all {blocks_max} blocks of {block_bytes} bytes of its share are in use (raise its shuffle_mb)"
            ),
            ShuffleError::TenantBusy { tenant, waited_ms } => {
                write!(f, "tenant {tenant:?} is over its shuffle rate (waited {waited_ms} ms; raise its share)")
            }
        }
    }
}

impl std::error::Error for ShuffleError {}
