//! Delivery policies: what a member wants at once and what may wait.
//!
//! A member's [`DeliveryPolicy`] (its wire form is in `plaza-protocol`) says
//! which events it wants at once ([`filter`]) and how long, or how many,
//! the others may be held ([`held`]). Held events are references into the
//! room's history, flushed together in seq order. This module is pure: the
//! clock comes in as a parameter.

pub mod filter;
pub mod held;

pub use filter::EventView;
pub use held::{Flushed, HeldMessages};
pub use plaza_protocol::policy::{DeliveryPolicy, Field, Filter, MatchOp, PolicyUpdate};
