//! The runtime control surface the admin endpoint drives: list, add, edit and remove tenants.
//! The server crate implements [`TenantControl`] (it owns listeners and stores); the admin HTTP
//! code only speaks to this trait, so it is testable with a stand-in.
//!
//! Not for: HTTP (admin.rs) or validation rules (spec.rs).

use crate::spec::{SpecError, TenantPatch, TenantSpec};
use serde::Serialize;

/// One tenant as `GET /tenants` shows it: its spec plus live figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TenantView {
    #[serde(flatten)]
    pub spec: TenantSpec,
    /// Rates in force now (work-conserving mode may raise them above the share's).
    pub ingress_bytes_per_s: u64,
    pub egress_bytes_per_s: u64,
    pub memory_used_bytes: u64,
    pub items: u64,
    pub evictions: u64,
    pub outstanding: u32,
    pub throttled: u64,
    pub dropped: u64,
}

#[derive(Debug, PartialEq)]
pub enum ControlError {
    /// No tenant by that name (HTTP 404).
    NotFound(String),
    /// Name or port already taken, or the change would break a node-wide rule (HTTP 409).
    Conflict(String),
    /// The request itself is wrong (HTTP 400).
    Invalid(SpecError),
    /// The node could not do it (binding a port failed, ...) (HTTP 500 or 409 as fits).
    Failed(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::NotFound(n) => write!(f, "no tenant named {n:?}"),
            ControlError::Conflict(m) => write!(f, "conflict: {m}"),
            ControlError::Invalid(e) => write!(f, "invalid: {e}"),
            ControlError::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}

impl std::error::Error for ControlError {}

/// A change to a replicated tenant's Raft group (issue 15), asked with `PUT /tenants/{name}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaChange {
    /// `"leader": id` — move leadership to that node and keep it there (it becomes the
    /// group's preferred leader on every replica).
    Leader(u64),
    /// `"add_voter": id, "address": "ip:port"` — a new node (its raft address) joins.
    AddVoter(u64, std::net::SocketAddr),
    /// `"remove_voter": id` — a (dead) node leaves the group.
    RemoveVoter(u64),
}

pub trait TenantControl: Send + Sync {
    fn list(&self) -> Vec<TenantView>;
    fn get(&self, name: &str) -> Option<TenantView>;
    /// Add a tenant (its ports open before this returns).
    fn add(&self, spec: TenantSpec) -> Result<TenantView, ControlError>;
    /// Edit share / burst / memory / max_outstanding (ports and name cannot change).
    fn update(&self, name: &str, patch: TenantPatch) -> Result<TenantView, ControlError>;
    /// Remove a tenant: its ports close, its connections end, its data is dropped.
    fn remove(&self, name: &str) -> Result<(), ControlError>;
    /// Append per-tenant Prometheus text (HELP/TYPE once per family, a `tenant` label).
    fn render_metrics(&self, out: &mut String);
    /// Change a replicated tenant's group; returns once the change took effect (bounded).
    fn change_replica(&self, name: &str, change: ReplicaChange) -> Result<(), ControlError> {
        let _ = change;
        Err(ControlError::Invalid(SpecError::Field("replicas", format!("tenant {name:?} is not replicated"))))
    }
}
