//! `plaza bench`: load tests of Plaza and its peers.
//!
//! - [`scenario`]: scenario files (YAML): parameters, phases, weighted flows, expectations.
//! - [`schedule`]: phase stepping and arrival times, pure.

pub mod scenario;
pub mod schedule;

pub use scenario::{Scenario, ScenarioError, Step};
pub use schedule::Schedule;
pub mod driver;
pub mod wsclient;
