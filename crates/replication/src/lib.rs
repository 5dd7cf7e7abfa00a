//! slipstream-replication: one Raft group per replicated tenant, so a tenant's data lives on
//! several nodes and an acknowledged write survives the loss of a minority of them.
//!
//! What it is for: replicating a tenant's *mutations* — the durable Raft log of each group
//! ([`storage`]), the encoding of a memcached mutation as a log entry and its deterministic
//! application to the tenant's [`slipstream_store::Store`] ([`mutation`], [`machine`]), the
//! raft messages between nodes ([`transport`]) and the node that drives all groups
//! ([`node`]). What it is not for: carrying client requests (the server crate parses them
//! and hands this crate a [`mutation::Mutation`]), forwarding, or traffic shaping.
//!
//! Why raft-rs (`raft` 0.7, TiKV's implementation) rather than openraft: raft-rs is a plain
//! tick/step/ready state machine with no runtime and no threads of its own. One loop can
//! tick and step thousands of groups and persist/send their Ready output in one batch, which
//! is exactly "one group per tenant" (the paper's per-tenant replication state switched per
//! event) and fits the project's mio event loops; openraft 0.9 drives each group with its
//! own tokio tasks and a storage/network trait per group, so it would bring an async runtime
//! into a workspace that has none. raft-rs is used in production by TiKV at scale, with
//! pre-vote, check-quorum, leader transfer, ReadIndex and joint consensus, all of which the
//! next steps need. It is built with `default-features = false` and the protobuf codec
//! (no default logger; this crate passes a discarding slog logger).

#![forbid(unsafe_code)]

pub mod cluster;
pub mod machine;
pub mod mutation;
pub mod node;
pub mod storage;
pub mod transport;

pub use machine::{Applied, Recalled, TenantMachine};
pub use mutation::{absolute_exptime, Mutation};
pub use node::{
    AdminError, AdminOp, Completion, GroupSpec, GroupStatus, NodeConfig, NodeError, ProposeError, ReplicationNode,
};
pub use raft::StateRole;
pub use storage::{FsyncMode, GroupStorage, StorageFault};
