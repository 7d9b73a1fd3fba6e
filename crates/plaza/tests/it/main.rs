//! The plaza crate's integration tests, in one binary: one link instead of one per file.

mod cluster_support;
mod netlab;
mod support;

#[cfg(feature = "bench")]
mod bench_cli;
mod binary;
mod chaos;
mod cluster;
mod cluster_quota;
mod data_dir;
mod launch;
mod log_regression;
mod redis_cluster;
mod sentinel;
mod starvation;
mod trajectory_lb;
mod webhook_faults;
mod webhooks_cluster;
