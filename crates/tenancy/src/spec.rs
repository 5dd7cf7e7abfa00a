//! Tenant specifications: the `[shaping]` table and `[[tenant]]` entries of the config file, the
//! body of the admin endpoint's `PUT /tenants/{name}`, and the rules they must satisfy.
//!
//! Not for: applying them (the server) or parsing TOML (the binary deserializes these types).

use serde::{Deserialize, Serialize};

/// Limits on what a spec may ask for.
pub const TENANTS_MAX: usize = 64;
pub const NAME_BYTES_MAX: usize = 64;
pub const MEMORY_MB_MAX: u64 = 1024 * 1024;
pub const BURST_BYTES_MIN: u64 = 1;
pub const BURST_BYTES_MAX: u64 = 1 << 30;
pub const MAX_OUTSTANDING_MAX: u32 = 1 << 20;
pub const CAPACITY_BYTES_PER_S_MAX: u64 = 1 << 40;
/// Shares may add up to 1 plus this slack (rounding in hand-written configs).
pub const SHARE_SUM_SLACK: f64 = 1e-6;
/// Largest admin request body.
pub const JSON_BYTES_MAX: usize = 16 * 1024;

/// `[shaping]`: the node's capacities that the shares divide, and the mode.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShapingSpec {
    pub egress_bytes_per_s: u64,
    pub ingress_bytes_per_s: u64,
    #[serde(default)]
    pub work_conserving: bool,
}

impl Default for ShapingSpec {
    fn default() -> Self {
        // 40 MB/s each way, the example in the issue; real deployments set their own.
        ShapingSpec { egress_bytes_per_s: 40_000_000, ingress_bytes_per_s: 40_000_000, work_conserving: false }
    }
}

fn default_memory_mb() -> u64 {
    64
}
fn default_burst_bytes() -> u64 {
    65_536
}
fn default_max_outstanding() -> u32 {
    64
}

/// One `[[tenant]]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    pub name: String,
    pub tcp_port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_port: Option<u16>,
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// Fraction of both capacities (0 < share <= 1) unless the directional shares are given.
    pub share: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_share: Option<f64>,
    #[serde(default = "default_burst_bytes")]
    pub burst_bytes: u64,
    #[serde(default = "default_max_outstanding")]
    pub max_outstanding: u32,
    /// Nodes holding the tenant's data (issue 15; absent = 1, today's unreplicated tenant).
    /// Checked against `[cluster]` by the daemon's config (slipstream_replication::cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u64>,
    /// Node id that should lead the tenant's replication group while it is up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_leader: Option<u64>,
    /// The node ids holding the tenant's replicas (absent: `replicas` from the preferred
    /// leader on; slipstream_replication::cluster::ClusterSpec::placement has the rule). A
    /// node not among them serves the tenant's port by relaying to one that is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<u64>>,
    /// The tenant's own HBase Thrift1 port (the range cache, crates/rangecache; needs
    /// `[hbase]`): its requests are shaped by this tenant's buckets and its cache takes
    /// [`TenantSpec::memory_split`]'s part of `memory_mb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thrift_port: Option<u16>,
    /// The part of `memory_mb` (less `shuffle_mb`) the range cache behind `thrift_port` may hold
    /// (absent = half); its KV store gets the rest, at least 1 MiB. Needs `thrift_port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thrift_cache_mb: Option<u64>,
    /// The part of `memory_mb` the tenant's Spark applications may hold in `[shuffle]` pool
    /// blocks (issue 17; absent = the tenant runs no shuffles). Its KV store gets the rest.
    /// Set in the config file only (the pool's shares are fixed at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_mb: Option<u64>,
}

/// `PUT /tenants/{name}` on an existing tenant: the fields to change.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantPatch {
    pub share: Option<f64>,
    pub egress_share: Option<f64>,
    pub ingress_share: Option<f64>,
    pub burst_bytes: Option<u64>,
    pub memory_mb: Option<u64>,
    pub max_outstanding: Option<u32>,
    pub thrift_cache_mb: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum SpecError {
    /// A field's value is out of range or malformed: (field, why).
    Field(&'static str, String),
    /// Two tenants clash (name or port), or shares add up to more than 1.
    Conflict(String),
    /// The JSON body does not parse or has unknown fields.
    Json(String),
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecError::Field(name, why) => write!(f, "{name}: {why}"),
            SpecError::Conflict(m) => write!(f, "{m}"),
            SpecError::Json(m) => write!(f, "bad JSON: {m}"),
        }
    }
}

impl std::error::Error for SpecError {}

impl ShapingSpec {
    /// Both capacities in 1..=[`CAPACITY_BYTES_PER_S_MAX`] (0 would make every share 0).
    pub fn validate(&self) -> Result<(), SpecError> {
        check_range_u64("ingress_bytes_per_s", self.ingress_bytes_per_s, 1, CAPACITY_BYTES_PER_S_MAX)?;
        check_range_u64("egress_bytes_per_s", self.egress_bytes_per_s, 1, CAPACITY_BYTES_PER_S_MAX)
    }
}

impl TenantSpec {
    /// Parse a JSON object (admin `PUT` of a new tenant; the name comes from the path and must
    /// match if the body has one). The body must carry `name` (the caller compares it with the
    /// path); the result is validated on its own (node-wide rules: [`validate_all`]).
    pub fn from_json(body: &[u8]) -> Result<TenantSpec, SpecError> {
        let spec: TenantSpec = parse_json(body)?;
        spec.validate()?;
        if spec.replicas.unwrap_or(1) != 1 || spec.preferred_leader.is_some() || spec.nodes.is_some() {
            // Replication groups are set up from the config file at start (issue 15); a
            // tenant created here would silently be unreplicated.
            return Err(SpecError::Field("replicas", "replicated tenants cannot be created at run time yet".into()));
        }
        if spec.shuffle_mb.is_some() {
            // The shuffle pool divides its memory between tenants at start (slipstream_shuffle).
            return Err(SpecError::Field(
                "shuffle_mb",
                "a tenant's shuffle share is set in the config file only".into(),
            ));
        }
        Ok(spec)
    }

    /// Field rules for one tenant on its own.
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_name(&self.name)?;
        if self.tcp_port == 0 {
            return Err(SpecError::Field("tcp_port", "must be 1..=65535".into()));
        }
        if self.udp_port == Some(0) {
            return Err(SpecError::Field("udp_port", "must be 1..=65535 (leave it out for no UDP)".into()));
        }
        if self.thrift_port == Some(0) || self.thrift_port == Some(self.tcp_port) {
            return Err(SpecError::Field("thrift_port", "must be 1..=65535 and differ from tcp_port".into()));
        }
        check_range_u64("memory_mb", self.memory_mb, 1, MEMORY_MB_MAX)?;
        if let Some(mb) = self.shuffle_mb {
            // At least 1 MiB stays with the store.
            check_range_u64("shuffle_mb", mb, 1, self.memory_mb.saturating_sub(1)).map_err(|_| {
                SpecError::Field("shuffle_mb", format!("must be 1..memory_mb ({}), got {mb}", self.memory_mb))
            })?;
        }
        if let Some(mb) = self.thrift_cache_mb {
            if self.thrift_port.is_none() {
                return Err(SpecError::Field("thrift_cache_mb", "needs thrift_port".into()));
            }
            // At least 1 MiB stays with the store, as with shuffle_mb.
            let left = self.memory_mb.saturating_sub(self.shuffle_mb.unwrap_or(0));
            check_range_u64("thrift_cache_mb", mb, 1, left.saturating_sub(1)).map_err(|_| {
                SpecError::Field(
                    "thrift_cache_mb",
                    format!("must be 1..memory_mb - shuffle_mb ({left}) for the KV store to keep some, got {mb}"),
                )
            })?;
        }
        check_share("share", self.share)?;
        if let Some(v) = self.egress_share {
            check_share("egress_share", v)?;
        }
        if let Some(v) = self.ingress_share {
            check_share("ingress_share", v)?;
        }
        check_range_u64("burst_bytes", self.burst_bytes, BURST_BYTES_MIN, BURST_BYTES_MAX)?;
        check_range_u64("max_outstanding", self.max_outstanding as u64, 1, MAX_OUTSTANDING_MAX as u64)
    }

    /// (ingress, egress) share of the capacities.
    pub fn shares(&self) -> (f64, f64) {
        (self.ingress_share.unwrap_or(self.share), self.egress_share.unwrap_or(self.share))
    }

    /// (ingress, egress) rates in bytes/s under `shaping`.
    pub fn rates(&self, shaping: &ShapingSpec) -> (u64, u64) {
        let (i, e) = self.shares();
        (
            (shaping.ingress_bytes_per_s as f64 * i).round() as u64,
            (shaping.egress_bytes_per_s as f64 * e).round() as u64,
        )
    }

    /// This spec with `patch` applied (not yet validated). Each field the patch sets replaces
    /// the spec's; a new `share` leaves explicit `egress_share`/`ingress_share` in force (they
    /// override `share`, as in the config) unless the patch sets them too.
    pub fn patched(&self, patch: &TenantPatch) -> TenantSpec {
        let mut s = self.clone();
        if let Some(v) = patch.share {
            s.share = v;
        }
        if let Some(v) = patch.egress_share {
            s.egress_share = Some(v);
        }
        if let Some(v) = patch.ingress_share {
            s.ingress_share = Some(v);
        }
        if let Some(v) = patch.burst_bytes {
            s.burst_bytes = v;
        }
        if let Some(v) = patch.memory_mb {
            s.memory_mb = v;
        }
        if let Some(v) = patch.max_outstanding {
            s.max_outstanding = v;
        }
        if let Some(v) = patch.thrift_cache_mb {
            s.thrift_cache_mb = Some(v);
        }
        s
    }

    /// Bytes the tenant's KV store may hold: `memory_mb` less its shuffle share.
    pub fn memory_bytes(&self) -> usize {
        let mb = self.memory_mb.min(MEMORY_MB_MAX).saturating_sub(self.shuffle_mb.unwrap_or(0)).max(1);
        (mb as usize) * 1024 * 1024
    }

    /// Bytes of `[shuffle]` pool blocks the tenant's Spark applications may hold (0: none).
    pub fn shuffle_bytes(&self) -> usize {
        (self.shuffle_mb.unwrap_or(0).min(MEMORY_MB_MAX) as usize) * 1024 * 1024
    }

    /// `memory_mb` as (the KV store's limit, the Thrift range cache's limit): a tenant with a
    /// `thrift_port` gives `thrift_cache_mb` of it (absent: half) to its range cache, so both
    /// count against the one budget.
    pub fn memory_split(&self) -> (usize, usize) {
        let all = self.memory_bytes();
        match (self.thrift_port, self.thrift_cache_mb) {
            (Some(_), Some(mb)) => {
                let cache = ((mb.min(MEMORY_MB_MAX) as usize) * 1024 * 1024).min(all.saturating_sub(1 << 20));
                (all - cache, cache)
            }
            (Some(_), None) => (all - all / 2, all / 2),
            (None, _) => (all, 0),
        }
    }
}

impl TenantPatch {
    /// Parse and check a `PUT` body: at least one field, each in the range a spec allows.
    pub fn from_json(body: &[u8]) -> Result<TenantPatch, SpecError> {
        let p: TenantPatch = parse_json(body)?;
        p.validate()?;
        Ok(p)
    }

    /// The same ranges as [`TenantSpec::validate`] for the fields that are set.
    pub fn validate(&self) -> Result<(), SpecError> {
        if *self == TenantPatch::default() {
            return Err(SpecError::Field("body", "nothing to change".into()));
        }
        if let Some(v) = self.share {
            check_share("share", v)?;
        }
        if let Some(v) = self.egress_share {
            check_share("egress_share", v)?;
        }
        if let Some(v) = self.ingress_share {
            check_share("ingress_share", v)?;
        }
        if let Some(v) = self.burst_bytes {
            check_range_u64("burst_bytes", v, BURST_BYTES_MIN, BURST_BYTES_MAX)?;
        }
        if let Some(v) = self.memory_mb {
            check_range_u64("memory_mb", v, 1, MEMORY_MB_MAX)?;
        }
        if let Some(v) = self.max_outstanding {
            check_range_u64("max_outstanding", v as u64, 1, MAX_OUTSTANDING_MAX as u64)?;
        }
        if let Some(v) = self.thrift_cache_mb {
            check_range_u64("thrift_cache_mb", v, 1, MEMORY_MB_MAX)?;
        }
        Ok(())
    }
}

/// Bounded JSON parse: the size check comes first so a huge body costs nothing; serde's
/// message (unknown field, wrong type, line and column) goes back to the operator as is.
fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, SpecError> {
    if body.len() > JSON_BYTES_MAX {
        return Err(SpecError::Json(format!("body is {} bytes, more than the {JSON_BYTES_MAX} allowed", body.len())));
    }
    serde_json::from_slice(body).map_err(|e| SpecError::Json(e.to_string()))
}

fn check_range_u64(field: &'static str, v: u64, min: u64, max: u64) -> Result<(), SpecError> {
    if v < min || v > max {
        return Err(SpecError::Field(field, format!("must be {min}..={max}, got {v}")));
    }
    Ok(())
}

fn check_share(field: &'static str, v: f64) -> Result<(), SpecError> {
    // `!(v > 0.0)` also catches NaN, which TOML can spell.
    if !v.is_finite() || v <= 0.0 || v > 1.0 {
        return Err(SpecError::Field(field, format!("must be a number in (0, 1], got {v}")));
    }
    Ok(())
}

/// Names appear in URLs, metric labels and logs, so they are plain: 1..=NAME_BYTES_MAX bytes
/// of letters, digits, `_`, `.` and `-`.
fn validate_name(name: &str) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(SpecError::Field("name", format!("must be 1..={NAME_BYTES_MAX} bytes, got {}", name.len())));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
        return Err(SpecError::Field("name", format!("{c:?} not allowed (only A-Z a-z 0-9 _ . -)")));
    }
    Ok(())
}

/// A share sum as an operator wrote it: 0.4 + 0.4 + 0.4 shows as 1.2, not 1.2000000000000002.
fn show_sum(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// Rules across all tenants: each valid, names and ports unique (TCP and UDP ports may not
/// clash with each other's or with `reserved_ports`, e.g. the admin port), at most
/// [`TENANTS_MAX`], shares in each direction summing to at most 1.
///
/// One tenant may use the same number for its TCP and UDP port (different protocols); no other
/// tenant may use that number for either.
pub fn validate_all(shaping: &ShapingSpec, tenants: &[TenantSpec], reserved_ports: &[u16]) -> Result<(), SpecError> {
    shaping.validate()?;
    if tenants.len() > TENANTS_MAX {
        return Err(SpecError::Conflict(format!("{} tenants, at most {TENANTS_MAX} allowed", tenants.len())));
    }
    let mut names: std::collections::HashSet<&str> = std::collections::HashSet::with_capacity(tenants.len());
    // port -> index of the tenant that holds it
    let mut ports: std::collections::HashMap<u16, usize> = std::collections::HashMap::with_capacity(tenants.len() * 2);
    let (mut ingress_sum, mut egress_sum) = (0.0f64, 0.0f64);
    for (i, t) in tenants.iter().enumerate() {
        t.validate().map_err(|e| match e {
            SpecError::Field(f, why) => SpecError::Field(f, format!("tenant {:?}: {why}", t.name)),
            other => other,
        })?;
        if !names.insert(t.name.as_str()) {
            return Err(SpecError::Conflict(format!("tenant name {:?} is used twice", t.name)));
        }
        let own: &[(&str, Option<u16>)] =
            &[("tcp_port", Some(t.tcp_port)), ("udp_port", t.udp_port), ("thrift_port", t.thrift_port)];
        for &(what, port) in own {
            let Some(port) = port else { continue };
            if reserved_ports.contains(&port) {
                return Err(SpecError::Conflict(format!(
                    "{what} {port} of tenant {:?} is reserved (e.g. the admin port)",
                    t.name
                )));
            }
            match ports.get(&port) {
                Some(&j) if j != i => {
                    let other = tenants.get(j).map(|o| o.name.as_str()).unwrap_or("?");
                    return Err(SpecError::Conflict(format!(
                        "{what} {port} of tenant {:?} is already used by tenant {other:?}",
                        t.name
                    )));
                }
                _ => {
                    ports.insert(port, i);
                }
            }
        }
        let (si, se) = t.shares();
        ingress_sum += si;
        egress_sum += se;
    }
    for (dir, sum) in [("ingress", ingress_sum), ("egress", egress_sum)] {
        if sum > 1.0 + SHARE_SUM_SLACK {
            return Err(SpecError::Conflict(format!("{dir} shares add up to {}, more than 1", show_sum(sum))));
        }
    }
    Ok(())
}
