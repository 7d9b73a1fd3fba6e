//! What a spatial room's steps cost: a tick and a move at the movement
//! scenario's density (`bench/scenarios/movement.yaml`: 4000 × 4000 units,
//! areas of interest of 400, 1,000 and 2,000 walkers), and a tick of the
//! worst crowd, every member on one spot (every pair in proximity), with one
//! of them walking and with all.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use plaza_core::spatial::{Space, SpaceConfig, Vec2};

fn movement_config() -> SpaceConfig {
    SpaceConfig {
        width: 4000.0,
        height: 4000.0,
        proximity_radius: 150.0,
        hysteresis: 1.2,
        min_dwell_ms: 1000,
        aoi_radius: 400.0,
        tick_ms: 100,
        direct_in_proximity_only: false,
    }
}

/// A small deterministic generator: the same walkers in every run.
struct Lcg(u64);

impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` members scattered over the plane, each walking to a random target.
fn walkers(n: usize) -> (Space, Vec<String>, Lcg) {
    let c = movement_config();
    let mut space = Space::new(c.clone());
    let mut rng = Lcg(7);
    let ids: Vec<String> = (0..n).map(|i| format!("s{i:05}")).collect();
    for id in &ids {
        let at = Vec2::new(rng.unit() * c.width, rng.unit() * c.height);
        space.join(id, at, 0);
    }
    for id in &ids {
        let to = Vec2::new(rng.unit() * c.width, rng.unit() * c.height);
        space.move_to(id, to, 120.0, 0).unwrap();
    }
    space.tick(100);
    (space, ids, rng)
}

fn ticks(c: &mut Criterion) {
    let mut g = c.benchmark_group("space_tick");
    for n in [1000usize, 2000] {
        g.bench_with_input(BenchmarkId::new("walkers", n), &n, |b, &n| {
            let (mut space, _, _) = walkers(n);
            let mut now = 100;
            b.iter(|| {
                now += 100;
                black_box(space.tick(now))
            });
        });
    }
    for (name, walking) in [
        ("one_spot_one_walks", 1usize),
        ("one_spot_all_walk", usize::MAX),
    ] {
        for n in [500usize, 1000, 2000] {
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                let mut space = Space::new(movement_config());
                for i in 0..n {
                    space.join(&format!("s{i:05}"), Vec2::new(2000.0, 2000.0), 0);
                }
                // Walkers creeping on the spot keep the ticks coming: with
                // one, a tick decides its pairs; with all, every pair.
                for i in 0..n.min(walking) {
                    let to = Vec2::new(2000.0 + (i % 7) as f64, 2001.0);
                    space.move_to(&format!("s{i:05}"), to, 0.001, 0).unwrap();
                }
                let mut now = 0;
                b.iter(|| {
                    now += 100;
                    black_box(space.tick(now))
                });
            });
        }
    }
    g.finish();
}

fn moves(c: &mut Criterion) {
    let mut g = c.benchmark_group("space_move");
    for n in [1000usize, 2000] {
        g.bench_with_input(BenchmarkId::new("walkers", n), &n, |b, &n| {
            let (mut space, ids, mut rng) = walkers(n);
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % ids.len();
                let to = Vec2::new(rng.unit() * 4000.0, rng.unit() * 4000.0);
                black_box(space.move_to(&ids[i], to, 120.0, 150).unwrap())
            });
        });
    }
    g.finish();
}

criterion_group!(benches, ticks, moves);
criterion_main!(benches);
