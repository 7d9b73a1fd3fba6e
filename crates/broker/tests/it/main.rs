//! The broker crate's integration tests, in one binary: one link instead of one per file.

mod support;

mod cluster_conformance;
mod disk_broker;
mod memory_cluster;
mod redis_ack;
mod redis_broker;
mod redis_cluster;
mod redis_shard_isolation;
