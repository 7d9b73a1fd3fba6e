//! The core crate's integration tests, in one binary: one link instead of one per file.

mod common;

mod building_blocks;
mod limits;
mod locks;
mod policy;
mod props;
mod publish;
mod replica;
mod requests;
mod resume;
mod room_ordering;
mod spatial;
mod spatial_room;
