//! Tenants' HBase Thrift ports (`[[tenant]] thrift_port`, issue 16 item 6): the glue between
//! the tenant table (crates/server, which knows nothing of HBase) and the range cache's front
//! ends (crates/rangecache `Fronts`). A tenant's Thrift port listens on the tenant's address,
//! is shaped by the tenant's own buckets, and its cache takes the Thrift part of the tenant's
//! `memory_mb` (`TenantSpec::memory_split`: `thrift_cache_mb`, or half); admin adds, edits and
//! removals follow.
//!
//! Not for: the Thrift protocol or the cache (crates/rangecache), or the tenant rules
//! (crates/tenancy).

use slipstream_rangecache::{Fronts, TenantLink};
use slipstream_server::admin::MetricsFn;
use slipstream_server::tenants::{Tenant, TenantPorts, TenantTable};
use slipstream_tenancy::{ControlError, TenantSpec};
use std::net::SocketAddr;
use std::sync::Arc;

struct Ports(Arc<Fronts>);

impl TenantPorts for Ports {
    fn added(&self, t: &Tenant, spec: &TenantSpec) -> Result<(), ControlError> {
        let (Some(port), Some(shaper), Some(kv)) = (spec.thrift_port, t.shaper.clone(), t.tcp_local) else {
            return Ok(());
        };
        let link = TenantLink { name: t.name.clone(), shaper };
        self.0.start_tenant(link, SocketAddr::new(kv.ip(), port), spec.memory_split().1).map(|_| ()).map_err(|e| {
            let m = format!("tenant {:?}: thrift_port {port}: {e}", t.name);
            if e.kind() == std::io::ErrorKind::AddrInUse {
                ControlError::Conflict(m)
            } else {
                ControlError::Failed(m)
            }
        })
    }

    fn changed(&self, t: &Tenant, spec: &TenantSpec) {
        self.0.set_memory_limit(&t.name, spec.memory_split().1);
    }

    fn removed(&self, t: &Tenant) {
        self.0.stop_tenant(&t.name);
    }
}

/// Serves the tenants' Thrift ports from now on (those in the table at once); returns their
/// metrics for the admin endpoint and a status-line part.
pub fn start(hbase: &slipstream_rangecache::Settings, table: &TenantTable) -> Result<(MetricsFn, String), String> {
    let fronts = Arc::new(Fronts::new(hbase.clone()));
    table.set_ports(Arc::new(Ports(fronts.clone()))).map_err(|e| format!("tenants' thrift ports: {e}"))?;
    let ports: Vec<String> =
        table.snapshot().iter().filter_map(|t| fronts.local_addr(&t.name).map(|a| format!("{} {a}", t.name))).collect();
    let line = format!(
        "; hbase thrift per tenant [{}] -> sidecar {} ({})",
        ports.join(", "),
        hbase.sidecar_addr,
        hbase.strategy.name()
    );
    Ok((Arc::new(move |out: &mut String| fronts.render_metrics(out)), line))
}
