//! Delivery policies: what a member wants at once and what may wait.
//!
//! Only the filter half exists so far (issue 16): the held queue, its time
//! and volume limits and the aggregated flush are still to come.

pub mod filter;

pub use filter::{Field, Filter, MatchOp, MessageView};
