//! A uniform grid of points: who is near a point, without a pass over everyone.

use std::hash::Hash;

use rustc_hash::FxHashMap;

use super::geometry::Vec2;

type Cell = (i64, i64);

/// The cells a pair pass looks at besides a cell itself: each unordered pair
/// of neighbouring cells once (right, and the three below).
const FORWARD: [(i64, i64); 4] = [(1, 0), (-1, 1), (0, 1), (1, 1)];

/// Keys placed at points, bucketed in square cells of one size. A query
/// visits the cells its circle touches, or every occupied cell when those
/// are fewer: its cost grows with the local density and is never more than
/// a pass over every key, however large the radius.
#[derive(Debug, Clone)]
pub struct SpatialGrid<K> {
    cell: f64,
    // Fx hashing: a tick looks every member up; SipHash's resistance to
    // chosen keys buys nothing against server-made keys and cells.
    // Positions live beside the keys in their cell, so that a pass over a
    // cell reads one block of memory.
    cells: FxHashMap<Cell, Vec<(K, Vec2)>>,
    at: FxHashMap<K, Cell>,
}

impl<K: Clone + Eq + Hash> SpatialGrid<K> {
    /// An empty grid of cells `cell` wide (best: the usual query radius).
    pub fn new(cell: f64) -> SpatialGrid<K> {
        assert!(cell.is_finite() && cell > 0.0, "cell size {cell}");
        SpatialGrid {
            cell,
            cells: FxHashMap::default(),
            at: FxHashMap::default(),
        }
    }

    fn cell_of(&self, p: Vec2) -> Cell {
        // `as` saturates: a point far outside any plane still has a cell.
        (
            (p.x / self.cell).floor() as i64,
            (p.y / self.cell).floor() as i64,
        )
    }

    /// Places `key` at `p` (moving it if it is placed already).
    pub fn place(&mut self, key: K, p: Vec2) {
        self.place_ref(&key, p);
    }

    /// Places `key` at `p`, cloning the key only when it is new here or
    /// changes cell (a tick re-places everyone).
    pub fn place_ref(&mut self, key: &K, p: Vec2) {
        let cell = self.cell_of(p);
        if let Some(old) = self.at.get(key).copied() {
            if old == cell {
                if let Some(slot) = self
                    .cells
                    .get_mut(&cell)
                    .and_then(|keys| keys.iter_mut().find(|(k, _)| k == key))
                {
                    slot.1 = p;
                }
                return;
            }
            self.remove(key);
        }
        self.cells.entry(cell).or_default().push((key.clone(), p));
        self.at.insert(key.clone(), cell);
    }

    /// Removes `key`; false if it was not placed.
    pub fn remove(&mut self, key: &K) -> bool {
        let Some(cell) = self.at.remove(key) else {
            return false;
        };
        if let Some(keys) = self.cells.get_mut(&cell) {
            if let Some(i) = keys.iter().position(|(k, _)| k == key) {
                keys.swap_remove(i);
            }
            if keys.is_empty() {
                self.cells.remove(&cell);
            }
        }
        true
    }

    /// Where `key` is.
    pub fn position(&self, key: &K) -> Option<Vec2> {
        let cell = self.at.get(key)?;
        self.cells[cell]
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, p)| *p)
    }

    /// How many keys are placed.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether no key is placed.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Every key within `radius` of `p` (distance ≤ radius), in no
    /// particular order (callers that emit something sort it).
    pub fn within(&self, p: Vec2, radius: f64) -> Vec<&K> {
        let mut out = Vec::new();
        self.for_each_within(p, radius, |k, _| out.push(k));
        out
    }

    /// Calls `f` with every key within `radius` of `p` and its position, and
    /// returns the steps it took (cells looked up and keys looked at).
    /// Never costs more than a pass over the occupied cells and every key: a
    /// radius that spans the plane costs that, not a look-up per cell.
    pub fn for_each_within<'a>(
        &'a self,
        p: Vec2,
        radius: f64,
        mut f: impl FnMut(&'a K, Vec2),
    ) -> usize {
        if radius.is_nan() || radius < 0.0 {
            return 0;
        }
        let r2 = radius * radius;
        let mut steps = 0;
        let mut visit = |keys: &'a Vec<(K, Vec2)>| {
            steps += 1 + keys.len();
            for (k, q) in keys {
                if q.distance_sq(p) <= r2 {
                    f(k, *q);
                }
            }
        };
        let (x0, y0) = self.cell_of(Vec2::new(p.x - radius, p.y - radius));
        let (x1, y1) = self.cell_of(Vec2::new(p.x + radius, p.y + radius));
        // In floats: the span of a huge radius overflows an i64.
        let spanned = (x1 as f64 - x0 as f64 + 1.0) * (y1 as f64 - y0 as f64 + 1.0);
        // The cells spanned cost a look-up each, a pass over everything one
        // per occupied cell and key: the cheaper of the two.
        if spanned > (self.cells.len() + self.at.len()) as f64 {
            self.cells.values().for_each(&mut visit);
            return steps;
        }
        let mut empty = 0;
        for cx in x0..=x1 {
            for cy in y0..=y1 {
                match self.cells.get(&(cx, cy)) {
                    Some(keys) => visit(keys),
                    None => empty += 1,
                }
            }
        }
        steps + empty
    }

    /// Calls `f` once with every unordered pair of keys at most `radius`
    /// apart (at most one cell: a larger radius is cut to it), their
    /// positions and their squared distance. A pass over the occupied cells
    /// and their neighbours: its cost is the pairs near each other, not the
    /// pairs of the grid. Returns the steps it took: cells looked up and
    /// pairs looked at (every pair looked at is at most 2√2 cells apart).
    pub fn for_each_pair_within(
        &self,
        radius: f64,
        mut f: impl FnMut(&K, Vec2, &K, Vec2, f64),
    ) -> usize {
        let r2 = radius.min(self.cell).powi(2);
        let mut steps = 0;
        for (&(cx, cy), keys) in &self.cells {
            steps += 1 + FORWARD.len() + keys.len() * keys.len().saturating_sub(1) / 2;
            for (i, (a, p)) in keys.iter().enumerate() {
                for (b, q) in &keys[i + 1..] {
                    let d2 = p.distance_sq(*q);
                    if d2 <= r2 {
                        f(a, *p, b, *q, d2);
                    }
                }
            }
            for (dx, dy) in FORWARD {
                // Saturated cells (points far outside any plane) have no
                // neighbour beyond the edge of the i64 range.
                let (Some(nx), Some(ny)) = (cx.checked_add(dx), cy.checked_add(dy)) else {
                    continue;
                };
                let Some(others) = self.cells.get(&(nx, ny)) else {
                    continue;
                };
                steps += keys.len() * others.len();
                for (a, p) in keys {
                    for (b, q) in others {
                        let d2 = p.distance_sq(*q);
                        if d2 <= r2 {
                            f(a, *p, b, *q, d2);
                        }
                    }
                }
            }
        }
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
        v.sort_unstable();
        v
    }

    #[test]
    fn finds_what_is_within_the_radius_across_cells() {
        let mut g = SpatialGrid::new(100.0);
        g.place("a", Vec2::new(10.0, 10.0));
        g.place("b", Vec2::new(150.0, 10.0));
        g.place("c", Vec2::new(400.0, 400.0));
        assert_eq!(
            sorted(g.within(Vec2::new(0.0, 0.0), 200.0)),
            vec![&"a", &"b"]
        );
        assert_eq!(g.within(Vec2::new(0.0, 0.0), 100.0), vec![&"a"]);
        g.place("b", Vec2::new(390.0, 400.0));
        assert_eq!(
            sorted(g.within(Vec2::new(400.0, 400.0), 20.0)),
            vec![&"b", &"c"]
        );
        assert!(g.remove(&"c"));
        assert!(!g.remove(&"c"));
        assert_eq!(g.within(Vec2::new(400.0, 400.0), 20.0), vec![&"b"]);
        assert_eq!(g.len(), 2);
        assert_eq!(g.position(&"b"), Some(Vec2::new(390.0, 400.0)));
    }

    #[test]
    fn a_radius_beyond_any_plane_visits_the_occupied_cells_only() {
        let mut g = SpatialGrid::new(1.0);
        g.place("a", Vec2::new(0.0, 0.0));
        g.place("b", Vec2::new(1e300, -1e300));
        // 1e308 spans more cells than an i64 counts: answered at once.
        assert_eq!(
            sorted(g.within(Vec2::new(0.0, 0.0), 1e308)),
            vec![&"a", &"b"]
        );
        assert_eq!(g.within(Vec2::new(0.0, 0.0), f64::INFINITY).len(), 2);
        assert!(g.within(Vec2::new(0.0, 0.0), f64::NAN).is_empty());
    }

    #[test]
    fn the_pair_pass_yields_each_near_pair_once() {
        let mut g = SpatialGrid::new(10.0);
        for (k, x, y) in [
            (1, 0.0, 0.0),
            (2, 9.0, 0.0),
            (3, 11.0, 9.0),
            (4, 50.0, 50.0),
        ] {
            g.place(k, Vec2::new(x, y));
        }
        let mut pairs = Vec::new();
        g.for_each_pair_within(10.0, |a, _, b, _, _| pairs.push((*a.min(b), *a.max(b))));
        assert_eq!(sorted(pairs), vec![(1, 2), (2, 3)]);
    }
}
