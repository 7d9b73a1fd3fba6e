//! A uniform grid of points: who is near a point, without a pass over everyone.

use std::hash::Hash;

use rustc_hash::FxHashMap;

use super::geometry::Vec2;

type Cell = (i64, i64);

/// Keys placed at points, bucketed in square cells of one size. A query
/// visits the cells its circle touches, so its cost grows with the local
/// density, not with the number of keys.
#[derive(Debug, Clone)]
pub struct SpatialGrid<K> {
    cell: f64,
    // Fx hashing: a tick looks every member up; SipHash's resistance to
    // chosen keys buys nothing against server-made session ids and cells.
    cells: FxHashMap<Cell, Vec<K>>,
    at: FxHashMap<K, (Cell, Vec2)>,
}

impl<K: Clone + Eq + Hash + Ord> SpatialGrid<K> {
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
        (
            (p.x / self.cell).floor() as i64,
            (p.y / self.cell).floor() as i64,
        )
    }

    /// Places `key` at `p` (moving it if it is placed already).
    pub fn place(&mut self, key: K, p: Vec2) {
        let cell = self.cell_of(p);
        match self.at.get_mut(&key) {
            Some((old, pos)) if *old == cell => {
                *pos = p;
                return;
            }
            Some(_) => {
                self.remove(&key);
            }
            None => {}
        }
        self.cells.entry(cell).or_default().push(key.clone());
        self.at.insert(key, (cell, p));
    }

    /// Places `key` at `p`, cloning the key only when it is new here or
    /// changes cell (a tick re-places everyone).
    pub fn place_ref(&mut self, key: &K, p: Vec2) {
        let cell = self.cell_of(p);
        if let Some((old, pos)) = self.at.get_mut(key) {
            if *old == cell {
                *pos = p;
                return;
            }
        }
        self.place(key.clone(), p);
    }

    /// Removes `key`; false if it was not placed.
    pub fn remove(&mut self, key: &K) -> bool {
        let Some((cell, _)) = self.at.remove(key) else {
            return false;
        };
        if let Some(keys) = self.cells.get_mut(&cell) {
            if let Some(i) = keys.iter().position(|k| k == key) {
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
        self.at.get(key).map(|(_, p)| *p)
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
        let (x0, y0) = self.cell_of(Vec2::new(p.x - radius, p.y - radius));
        let (x1, y1) = self.cell_of(Vec2::new(p.x + radius, p.y + radius));
        let r2 = radius * radius;
        let mut out = Vec::new();
        for cx in x0..=x1 {
            for cy in y0..=y1 {
                let Some(keys) = self.cells.get(&(cx, cy)) else {
                    continue;
                };
                for k in keys {
                    let (_, q) = self.at[k];
                    if q.distance_sq(p) <= r2 {
                        out.push(k);
                    }
                }
            }
        }
        out
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
}
