//! A room's memory under churn: members join and drop all the time, each
//! kept for its resume window, so the room holds a steady number of them; its
//! memory must stay where that number puts it, however many have come and
//! gone. (A hash table of members doubled ~9,000 joins in, its tombstones
//! having used up its free slots: a step in the soak's RSS, docs/benchmarks-history.md.)
//!
//! Its own test binary: the allocator that counts live bytes is global.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use plaza_core::{Room, RoomConfig};

#[path = "it/common/mod.rs"]
mod common;
use common::{params, sid};

/// Counts the bytes allocated and not freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_churning_room_holds_its_memory_steady() {
    let config = RoomConfig::default();
    // A member every 120 ms drops at once and stays for the 120 s resume
    // window: ~1,000 members held, as in the soak's churn rooms.
    let every_ms = 120;
    assert_eq!(config.resume_window_ms, 120_000);
    let mut room: Room<u32> = Room::new("churn".into(), "churn".into(), config, 7, 0);
    let peak = |from: u32, to: u32, room: &mut Room<u32>| {
        let mut most = 0;
        for n in from..to {
            let now = u64::from(n) * every_ms;
            room.join(params(n), None, now).expect("join");
            room.disconnect(&sid(n), now);
            room.tick(now);
            most = most.max(LIVE.load(Ordering::Relaxed));
        }
        assert!(
            (990..=1001).contains(&room.sessions()),
            "{}",
            room.sessions()
        );
        most
    };
    // Filled (and its history too) by 2,000 joins; then the steady state.
    peak(0, 2_000, &mut room);
    let early = peak(2_000, 6_000, &mut room);
    peak(6_000, 36_000, &mut room);
    let late = peak(36_000, 40_000, &mut room);
    assert!(
        late <= early + early / 20,
        "{early} bytes at most over joins 2,000-6,000, {late} over 36,000-40,000"
    );
}
