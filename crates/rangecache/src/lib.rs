//! Slipstream's range-query result cache in front of real HBase (issue 16, after IKNC):
//! clients speak HBase's Thrift1 `Hbase` service (binary protocol, buffered or framed transport)
//! to Slipstream; Gets and Scans are answered from the cache (all-row or each-row strategy) and
//! misses and writes go to HBase through the JVM sidecar in `connectors/hbase`
//! (docs/hbase-sidecar-protocol.md). Writes through Slipstream invalidate before they are
//! forwarded, writes by other HBase clients are reported by the RegionObserver in
//! `connectors/hbase` before HBase applies them (the sidecar relays its notices; the cache is
//! used only within a lease of the sidecar's last answer), and racing fills are discarded, so
//! reads are never older than an acknowledged write.

pub mod adaptive;
pub mod cache;
#[allow(clippy::all, dead_code, non_camel_case_types, unused_variables)]
#[rustfmt::skip]
pub mod gen;
pub mod hot;
pub mod reply;
pub mod server;
pub mod service;
pub mod sidecar;
pub mod transport;

pub use server::{Fronts, HbaseConfig, HbaseService, Settings, TenantLink};
