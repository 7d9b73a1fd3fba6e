//! Maps keyed by unordered pairs of session ids, looked up by `&str`: the
//! space checks thousands of pairs on every tick, and a lookup must not
//! allocate two strings.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};

/// `(a, b)` with `a < b` → `V`, nested by `a` so that `&str` keys look up.
#[derive(Debug, Clone)]
pub(crate) struct PairMap<V> {
    by_first: BTreeMap<String, BTreeMap<String, V>>,
}

impl<V> Default for PairMap<V> {
    fn default() -> Self {
        PairMap {
            by_first: BTreeMap::new(),
        }
    }
}

/// The pair `(x, y)` in order.
pub(crate) fn order<'a>(x: &'a str, y: &'a str) -> (&'a str, &'a str) {
    if x < y {
        (x, y)
    } else {
        (y, x)
    }
}

impl<V> PairMap<V> {
    /// The value of the pair `x`, `y` (in either order).
    pub(crate) fn get(&self, x: &str, y: &str) -> Option<&V> {
        let (a, b) = order(x, y);
        self.by_first.get(a)?.get(b)
    }

    /// Sets the value of the pair (cloning the ids only when it is new).
    pub(crate) fn insert(&mut self, x: &str, y: &str, v: V) {
        let (a, b) = order(x, y);
        let inner = match self.by_first.get_mut(a) {
            Some(inner) => inner,
            None => self.by_first.entry(a.to_owned()).or_default(),
        };
        match inner.get_mut(b) {
            Some(slot) => *slot = v,
            None => {
                inner.insert(b.to_owned(), v);
            }
        }
    }

    /// Removes the pair's value.
    pub(crate) fn remove(&mut self, x: &str, y: &str) -> Option<V> {
        let (a, b) = order(x, y);
        let inner = self.by_first.get_mut(a)?;
        let v = inner.remove(b);
        if inner.is_empty() {
            self.by_first.remove(a);
        }
        v
    }

    /// Every pair `(a, b)`, `a < b`, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &String, &V)> {
        self.by_first
            .iter()
            .flat_map(|(a, inner)| inner.iter().map(move |(b, v)| (a, b, v)))
    }

    /// The pairs `session` is in, in order.
    pub(crate) fn pairs_of(&self, session: &str) -> Vec<(String, String)> {
        self.iter()
            .filter(|(a, b, _)| *a == session || *b == session)
            .map(|(a, b, _)| (a.clone(), b.clone()))
            .collect()
    }
}

/// A symmetric relation between sessions (who sees whom), with each
/// session's neighbours at hand: a move is told to its mover's neighbours,
/// not checked against every member.
///
/// Hashed (Fx): a tick tests tens of thousands of pairs, and ordered maps of
/// strings cost a string comparison per step. Nothing iterates it to decide
/// or emit something without sorting.
#[derive(Debug, Clone, Default)]
pub(crate) struct Adjacency {
    of: FxHashMap<String, FxHashSet<String>>,
}

impl Adjacency {
    /// Whether `x` and `y` are related.
    pub(crate) fn contains(&self, x: &str, y: &str) -> bool {
        self.of.get(x).is_some_and(|n| n.contains(y))
    }

    /// Relates `x` and `y`.
    pub(crate) fn insert(&mut self, x: &str, y: &str) {
        for (p, q) in [(x, y), (y, x)] {
            match self.of.get_mut(p) {
                Some(n) => {
                    n.insert(q.to_owned());
                }
                None => {
                    let mut n = FxHashSet::default();
                    n.insert(q.to_owned());
                    self.of.insert(p.to_owned(), n);
                }
            }
        }
    }

    /// Unrelates `x` and `y`.
    pub(crate) fn remove(&mut self, x: &str, y: &str) {
        for (p, q) in [(x, y), (y, x)] {
            if let Some(n) = self.of.get_mut(p) {
                n.remove(q);
                if n.is_empty() {
                    self.of.remove(p);
                }
            }
        }
    }

    /// The sessions related to `x`, in order.
    pub(crate) fn neighbours<'a>(&'a self, x: &str) -> impl Iterator<Item = &'a String> + 'a {
        self.of.get(x).into_iter().flatten()
    }

    /// Every related pair `(a, b)`, `a < b`, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.of
            .iter()
            .flat_map(|(a, n)| n.iter().filter(move |b| a < *b).map(move |b| (a, b)))
    }

    /// The pairs `(a, b)`, `a < b`, that `x` is in, in order.
    pub(crate) fn pairs_of(&self, x: &str) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .neighbours(x)
            .map(|y| {
                let (a, b) = order(x, y);
                (a.to_owned(), b.to_owned())
            })
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_unordered_and_iterate_in_order() {
        let mut m = PairMap::default();
        m.insert("b", "a", 1);
        m.insert("a", "c", 2);
        m.insert("a", "b", 3);
        assert_eq!(m.get("b", "a"), Some(&3));
        assert!(m.get("c", "a").is_some());
        let all: Vec<_> = m
            .iter()
            .map(|(a, b, v)| (a.as_str(), b.as_str(), *v))
            .collect();
        assert_eq!(all, vec![("a", "b", 3), ("a", "c", 2)]);
        assert_eq!(m.pairs_of("c"), vec![("a".to_owned(), "c".to_owned())]);
        assert_eq!(m.remove("c", "a"), Some(2));
        assert_eq!(m.remove("c", "a"), None);
    }

    #[test]
    fn adjacency_is_symmetric() {
        let mut a = Adjacency::default();
        a.insert("b", "a");
        a.insert("a", "c");
        assert!(a.contains("a", "b") && a.contains("b", "a"));
        let mut n: Vec<_> = a.neighbours("a").collect();
        n.sort_unstable();
        assert_eq!(n, vec!["b", "c"]);
        let mut all: Vec<_> = a.iter().map(|(x, y)| (x.as_str(), y.as_str())).collect();
        all.sort_unstable();
        assert_eq!(all, vec![("a", "b"), ("a", "c")]);
        assert_eq!(a.pairs_of("c"), vec![("a".to_owned(), "c".to_owned())]);
        a.remove("b", "a");
        assert!(!a.contains("a", "b"));
        assert_eq!(a.neighbours("b").count(), 0);
    }
}
