//! The memory allocator's own figures, when the binary's allocator reports them: RSS alone
//! cannot tell live data from pages the allocator keeps (see `/metrics`).

use std::sync::OnceLock;

/// What the process's allocator holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorFigures {
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes of physical memory the allocator maps: live data, its metadata and the free pages
    /// it keeps.
    pub resident: u64,
}

/// Reads the allocator's figures; `None` when it cannot.
pub type AllocatorProbe = fn() -> Option<AllocatorFigures>;

static PROBE: OnceLock<AllocatorProbe> = OnceLock::new();

/// Sets the process's allocator probe; the first call wins (the allocator is the process's).
/// `plaza serve` sets jemalloc's.
pub fn set_allocator_probe(probe: AllocatorProbe) {
    let _ = PROBE.set(probe);
}

/// The allocator's figures now, if a probe is set and answers.
pub fn allocator_figures() -> Option<AllocatorFigures> {
    PROBE.get().and_then(|probe| probe())
}
