//! `plaza bench`: load tests of Plaza and its peers.
//!
//! - [`scenario`]: scenario files (YAML): parameters, phases, weighted flows, expectations.
//! - [`schedule`]: phase stepping and arrival times, pure.
//! - [`wsclient`]: a WebSocket client that receives without allocating per message.
//! - [`transport`]: WebSocket or Plaza's HTTP transports behind one reader and writer, bytes counted at the socket.
//! - [`driver`]: one module per protocol (Plaza, plain broadcast, ...).
//! - [`session`]: connecting and the join handshake, shared by the runner and tests.
//! - [`runner`]: runs a scenario against a target and counts.
//! - [`multiproc`]: one run spread over several load processes.
//! - [`counts`]: the counters of a run, defined once (plain and atomic).
//! - [`raw`]: one process's counts, serializable and mergeable (runs over several load processes).
//! - [`report`]: the result, as JSON and Markdown, checked against expectations.
//! - [`procstat`]: CPU and memory of processes from `/proc`.
//! - [`sweep`]: `--find-max`: which values to try, pure.
//! - [`targets`]: targets files; starting, confining and stopping servers.
//! - [`cpucap`]: CPU affinity and cgroup v1 CPU quotas.
//! - [`compare`]: one scenario against several targets, with sweeps, summaries and charts.
//! - [`chart`]: latency and throughput charts (SVG and PNG) of a members sweep.
//! - [`mod@reference`]: the reference fan-out server, this machine's practical ceiling.
//! - [`restart`]: `plaza bench restart`: restart-to-ready time of a data directory with full room histories.
//! - [`cli`]: the `plaza bench` command line and the orchestration of a run.

#![warn(missing_docs)]

pub mod broker_load;
pub mod chart;
pub mod cli;
pub mod compare;
pub mod counts;
pub mod cpucap;
pub mod driver;
pub mod multiproc;
pub mod plaza_metrics;
pub mod procstat;
pub mod raw;
pub mod reference;
pub mod report;
pub mod restart;
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod session;
pub mod sweep;
pub mod targets;
pub mod transport;
pub mod wsclient;

pub use raw::RawRun;
pub use report::{Check, Report};
pub use runner::{run, run_raw, Progress, ProgressFn, RunError, RunOptions, Shard};
pub use scenario::{Scenario, ScenarioError, Step};
pub use schedule::Schedule;
