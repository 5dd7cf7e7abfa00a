//! The path to HBase: the sidecar protocol codec (no I/O) and the multiplexed client.
pub mod client;
pub mod codec;
