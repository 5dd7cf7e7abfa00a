//! A Spark application is a tenant (issue 17): on a daemon with `[[tenant]]` entries each
//! tenant that has a `shuffle_mb` share may run shuffles; an application names its tenant
//! (Spark conf `spark.slipstream.shuffle.tenant`, sent with HELLO and REGISTER), its pool blocks
//! count against that share (a full share is refused like a full pool, other tenants keep
//! theirs), and its shuffle bytes pay from the tenant's token buckets like its KV traffic:
//! committed map output is ingress, segments handed to readers (and sent to peers) egress.
//!
//! Here: the shares as the config gives them and the one rule they must satisfy together
//! ([`check_shares`]). Not for: counting blocks (crate::registry) or waiting on buckets
//! (crate::server; the bucket arithmetic is slipstream_tenancy's).

use slipstream_tenancy::TenantShaper;
use std::sync::Arc;

/// One tenant's share of the pool, from its `[[tenant]] shuffle_mb`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantShare {
    pub name: String,
    pub bytes_max: usize,
}

/// A tenant as the shuffle service serves it: its share and (when `[shaping]` applies) the
/// buckets its transfers pay from. A tenant removed at run time through the admin endpoint
/// keeps its share here until the daemon restarts (the pool is divided at start).
#[derive(Debug, Clone)]
pub struct ShuffleTenant {
    pub share: TenantShare,
    pub shaper: Option<Arc<TenantShaper>>,
}

/// The shares checked against the pool: each holds at least one block, and together they fit
/// in the pool (`pool_bytes`, `[shuffle] memory_mb`), so one tenant filling its share never
/// leaves another without blocks. Returns each share's block count, in order. No shares is
/// refused too: on a daemon with tenants every application is charged to one.
pub fn check_shares(shares: &[TenantShare], pool_bytes: usize, block_bytes: usize) -> Result<Vec<usize>, String> {
    if shares.is_empty() {
        return Err("no [[tenant]] has shuffle_mb: on a daemon with tenants every Spark application is \
                    charged to one (give the tenants that run Spark a shuffle_mb share)"
            .into());
    }
    let mut total: usize = 0;
    let mut blocks = Vec::with_capacity(shares.len());
    for s in shares {
        let n = s.bytes_max / block_bytes.max(1);
        if n == 0 {
            return Err(format!("tenant {:?}: its shuffle_mb holds no block of {} KiB", s.name, block_bytes >> 10));
        }
        total = total.saturating_add(s.bytes_max);
        blocks.push(n);
    }
    if total > pool_bytes {
        return Err(format!(
            "the tenants' shuffle_mb add up to {} MiB, more than [shuffle] memory_mb {} MiB",
            total >> 20,
            pool_bytes >> 20
        ));
    }
    Ok(blocks)
}

/// The tenants' names for error messages, comma-separated.
pub fn names(shares: &[TenantShare]) -> String {
    shares.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn share(name: &str, mb: usize) -> TenantShare {
        TenantShare { name: name.into(), bytes_max: mb << 20 }
    }

    #[test]
    fn shares_fit_in_the_pool_and_hold_a_block_each() {
        let two_mb = 2 << 20;
        assert_eq!(check_shares(&[share("a", 64), share("b", 33)], 128 << 20, two_mb).unwrap(), vec![32, 16]);
        let e = check_shares(&[share("a", 64), share("b", 65)], 128 << 20, two_mb).unwrap_err();
        assert!(e.contains("add up to 129 MiB, more than [shuffle] memory_mb 128"), "{e}");
        let e = check_shares(&[share("a", 1)], 128 << 20, two_mb).unwrap_err();
        assert!(e.contains("tenant \"a\": its shuffle_mb holds no block of 2048 KiB"), "{e}");
        assert!(check_shares(&[], 128 << 20, two_mb).unwrap_err().contains("no [[tenant]] has shuffle_mb"));
        assert_eq!(names(&[share("a", 1), share("b", 1)]), "a, b");
    }
}
