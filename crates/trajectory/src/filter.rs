//! The sliding-window mean and median filters.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Range;

use crate::{check_interval, Filter, Point, TrajectoryError};

/// The window of point `i` in a trajectory of `n` points for window size `w`:
/// the indices `i - (w-1)/2 ..= i + w/2`, clipped to `0..n`.
///
/// The window is centered on `i`; for an even `w` it reaches one point further
/// forward than backward (`w = 4`: `i-1 ..= i+2`). Near the ends it is clipped,
/// so it holds fewer than `w` points there, and every point when `w ≥ 2n`.
/// `w = 1` is the identity. Requires `w ≥ 1`.
pub fn window(i: usize, n: usize, w: usize) -> Range<usize> {
    let back = w.saturating_sub(1) / 2;
    let forward = w / 2;
    i.saturating_sub(back)..i.saturating_add(forward).saturating_add(1).min(n)
}

/// Applies `filter` with window size `w` (see [`mean`] and [`median`]).
pub fn apply(filter: Filter, points: &[Point], w: usize) -> Result<Vec<Point>, TrajectoryError> {
    match filter {
        Filter::Mean => mean(points, w),
        Filter::Median => median(points, w),
    }
}

fn check(points: &[Point], w: usize) -> Result<(), TrajectoryError> {
    check_interval(w as u64)?;
    if points.is_empty() {
        return Err(TrajectoryError::EmptyTrajectory);
    }
    Ok(())
}

/// The sliding-window mean: each point's latitude and longitude become the
/// means of the latitudes and longitudes in its [`window`]; timestamps are kept.
///
/// O(n): a running sum, recomputed from scratch every `w` points so rounding
/// errors cannot accumulate along long trajectories. Errors:
/// [`TrajectoryError::InvalidInterval`] unless 1 ≤ `w` ≤ [`MAX_INTERVAL`](crate::MAX_INTERVAL),
/// [`TrajectoryError::EmptyTrajectory`] for no points.
pub fn mean(points: &[Point], w: usize) -> Result<Vec<Point>, TrajectoryError> {
    check(points, w)?;
    let n = points.len();
    let mut out = Vec::with_capacity(n);
    let (mut lo, mut hi) = (0, 0);
    let (mut sum_lat, mut sum_lon) = (0.0, 0.0);
    let mut since_resync = 0;
    for (i, p) in points.iter().enumerate() {
        let win = window(i, n, w);
        if since_resync == w {
            since_resync = 0;
            (lo, hi) = (win.start, win.end);
            sum_lat = points[win.clone()].iter().map(|q| q.lat).sum();
            sum_lon = points[win.clone()].iter().map(|q| q.lon).sum();
        }
        since_resync += 1;
        while hi < win.end {
            sum_lat += points[hi].lat;
            sum_lon += points[hi].lon;
            hi += 1;
        }
        while lo < win.start {
            sum_lat -= points[lo].lat;
            sum_lon -= points[lo].lon;
            lo += 1;
        }
        let k = (hi - lo) as f64;
        out.push(Point {
            t: p.t,
            lat: (sum_lat / k).clamp(-90.0, 90.0),
            lon: (sum_lon / k).clamp(-180.0, 180.0),
        });
    }
    Ok(out)
}

/// The sliding-window median: each point's latitude and longitude become the
/// medians of the latitudes and longitudes in its [`window`] (for an even
/// count, the mean of the two middle values); timestamps are kept.
///
/// O(n log w): each coordinate's window is kept as two ordered multisets (the
/// lower and the upper half), updated by one insertion and at most one removal
/// per point. Errors as for [`mean`].
pub fn median(points: &[Point], w: usize) -> Result<Vec<Point>, TrajectoryError> {
    check(points, w)?;
    let n = points.len();
    let mut out = Vec::with_capacity(n);
    let (mut lat, mut lon) = (MedianWindow::default(), MedianWindow::default());
    let (mut lo, mut hi) = (0, 0);
    for (i, p) in points.iter().enumerate() {
        let win = window(i, n, w);
        while hi < win.end {
            lat.insert(points[hi].lat);
            lon.insert(points[hi].lon);
            hi += 1;
        }
        while lo < win.start {
            lat.remove(points[lo].lat);
            lon.remove(points[lo].lon);
            lo += 1;
        }
        out.push(Point {
            t: p.t,
            lat: lat.median(),
            lon: lon.median(),
        });
    }
    Ok(out)
}

/// An `f64` ordered by [`f64::total_cmp`], usable as a map key.
#[derive(Debug, Clone, Copy)]
struct Key(f64);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A multiset of `f64` (value → count) that knows its size.
#[derive(Default)]
struct Bag {
    counts: BTreeMap<Key, usize>,
    len: usize,
}

impl Bag {
    fn add(&mut self, x: f64) {
        *self.counts.entry(Key(x)).or_insert(0) += 1;
        self.len += 1;
    }

    /// Removes one `x`; `x` must be present.
    fn take(&mut self, x: f64) {
        if let Some(c) = self.counts.get_mut(&Key(x)) {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&Key(x));
            }
            self.len -= 1;
        } else {
            debug_assert!(false, "removing {x}, which is not in the bag");
        }
    }

    fn max(&self) -> Option<f64> {
        self.counts.last_key_value().map(|(k, _)| k.0)
    }

    fn min(&self) -> Option<f64> {
        self.counts.first_key_value().map(|(k, _)| k.0)
    }
}

/// A sliding window's values split into a lower and an upper half: every value
/// of `low` ≤ every value of `high`, and `low` has as many values as `high` or
/// one more. The median is then `low`'s maximum, or the mean of `low`'s maximum
/// and `high`'s minimum.
#[derive(Default)]
struct MedianWindow {
    low: Bag,
    high: Bag,
}

impl MedianWindow {
    fn insert(&mut self, x: f64) {
        match self.low.max() {
            Some(m) if x.total_cmp(&m) == Ordering::Greater => self.high.add(x),
            _ => self.low.add(x),
        }
        self.rebalance();
    }

    /// Removes one `x`, which must be in the window.
    fn remove(&mut self, x: f64) {
        // Values equal to low's maximum may sit in both halves; taking it from
        // `low` is then as good as from `high`.
        match self.low.max() {
            Some(m) if x.total_cmp(&m) != Ordering::Greater => self.low.take(x),
            _ => self.high.take(x),
        }
        self.rebalance();
    }

    fn rebalance(&mut self) {
        while self.low.len > self.high.len + 1 {
            let m = self.low.max().expect("low is not empty");
            self.low.take(m);
            self.high.add(m);
        }
        while self.high.len > self.low.len {
            let m = self.high.min().expect("high is not empty");
            self.high.take(m);
            self.low.add(m);
        }
    }

    /// The median; the window must not be empty.
    fn median(&self) -> f64 {
        let a = self.low.max().unwrap_or(f64::NAN);
        if self.low.len > self.high.len {
            a
        } else {
            let b = self.high.min().unwrap_or(f64::NAN);
            (a + b) / 2.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_INTERVAL;

    /// Points with timestamps 10, 20, ... and the given latitudes; longitude = -2 × latitude.
    fn pts(lats: &[f64]) -> Vec<Point> {
        lats.iter()
            .enumerate()
            .map(|(i, &lat)| Point {
                t: 10.0 * (i + 1) as f64,
                lat,
                lon: -2.0 * lat,
            })
            .collect()
    }

    fn lats(points: &[Point]) -> Vec<f64> {
        points.iter().map(|p| p.lat).collect()
    }

    /// Checks the kept timestamps and the longitude (filtered independently,
    /// so it must be exactly -2 × the filtered latitude here).
    fn check_shape(input: &[Point], out: &[Point]) {
        assert_eq!(out.len(), input.len());
        for (a, b) in input.iter().zip(out) {
            assert_eq!(a.t, b.t);
            assert_eq!(b.lon, -2.0 * b.lat);
        }
    }

    #[test]
    fn window_definition() {
        // odd w = 3: i-1 ..= i+1
        assert_eq!(window(0, 5, 3), 0..2);
        assert_eq!(window(2, 5, 3), 1..4);
        assert_eq!(window(4, 5, 3), 3..5);
        // even w = 4: i-1 ..= i+2
        assert_eq!(window(0, 5, 4), 0..3);
        assert_eq!(window(1, 5, 4), 0..4);
        assert_eq!(window(3, 5, 4), 2..5);
        assert_eq!(window(4, 5, 4), 3..5);
        // w = 2: i ..= i+1
        assert_eq!(window(2, 5, 2), 2..4);
        assert_eq!(window(4, 5, 2), 4..5);
        // w = 1: just i
        assert_eq!(window(3, 5, 1), 3..4);
        // huge w covers everything
        assert_eq!(window(2, 5, MAX_INTERVAL), 0..5);
    }

    #[test]
    fn mean_odd_window_by_hand() {
        let input = pts(&[1.0, 2.0, 6.0, 3.0, 8.0]);
        let out = mean(&input, 3).unwrap();
        // windows: [1,2] [1,2,6] [2,6,3] [6,3,8] [3,8]
        assert_eq!(lats(&out), vec![1.5, 3.0, 11.0 / 3.0, 17.0 / 3.0, 5.5]);
        check_shape(&input, &out);
    }

    #[test]
    fn mean_even_window_by_hand() {
        let input = pts(&[1.0, 2.0, 6.0, 3.0, 8.0]);
        let out = mean(&input, 4).unwrap();
        // windows: [1,2,6] [1,2,6,3] [2,6,3,8] [6,3,8] [3,8]
        assert_eq!(lats(&out), vec![3.0, 3.0, 4.75, 17.0 / 3.0, 5.5]);
        check_shape(&input, &out);
    }

    #[test]
    fn median_odd_window_by_hand() {
        let input = pts(&[1.0, 9.0, 2.0, 7.0, 3.0, 3.0]);
        let out = median(&input, 3).unwrap();
        // windows: [1,9] [1,9,2] [9,2,7] [2,7,3] [7,3,3] [3,3]
        assert_eq!(lats(&out), vec![5.0, 2.0, 7.0, 3.0, 3.0, 3.0]);
        check_shape(&input, &out);
    }

    #[test]
    fn median_even_window_by_hand() {
        let input = pts(&[1.0, 9.0, 2.0, 7.0, 3.0, 3.0]);
        let out = median(&input, 4).unwrap();
        // windows: [1,9,2] [1,9,2,7] [9,2,7,3] [2,7,3,3] [7,3,3] [3,3]
        assert_eq!(lats(&out), vec![2.0, 4.5, 5.0, 3.0, 3.0, 3.0]);
        check_shape(&input, &out);
    }

    #[test]
    fn window_one_is_the_identity() {
        let input = pts(&[4.0, -1.25, 7.5, 0.1, 0.2]);
        assert_eq!(mean(&input, 1).unwrap(), input);
        assert_eq!(median(&input, 1).unwrap(), input);
    }

    #[test]
    fn a_window_covering_everything_gives_the_global_value() {
        let input = pts(&[4.0, -2.0, 7.0, 1.0]);
        // w ≥ 2n: every window is the whole trajectory
        assert_eq!(lats(&mean(&input, 8).unwrap()), vec![2.5; 4]);
        assert_eq!(lats(&median(&input, 8).unwrap()), vec![2.5; 4]);
        // w = n = 4 is still clipped at the start: i=0 sees 0..=2
        assert_eq!(lats(&mean(&input, 4).unwrap())[0], 3.0);
        assert_eq!(lats(&median(&input, 4).unwrap())[0], 4.0);
    }

    #[test]
    fn single_point() {
        let input = pts(&[42.0]);
        assert_eq!(mean(&input, 5).unwrap(), input);
        assert_eq!(median(&input, 5).unwrap(), input);
    }

    #[test]
    fn lat_and_lon_are_filtered_independently() {
        let input = vec![
            Point {
                t: 1.0,
                lat: 1.0,
                lon: 30.0,
            },
            Point {
                t: 2.0,
                lat: 2.0,
                lon: 10.0,
            },
            Point {
                t: 3.0,
                lat: 3.0,
                lon: 20.0,
            },
        ];
        let out = median(&input, 3).unwrap();
        // the middle window's medians: lat 2 (from point 2), lon 20 (from point 3)
        assert_eq!((out[1].lat, out[1].lon), (2.0, 20.0));
    }

    #[test]
    fn bad_interval_and_empty_input() {
        let input = pts(&[1.0]);
        for f in [Filter::Mean, Filter::Median] {
            assert_eq!(apply(f, &input, 0).unwrap_err().code(), "invalid_interval");
            assert_eq!(
                apply(f, &input, MAX_INTERVAL + 1).unwrap_err().code(),
                "invalid_interval"
            );
            assert!(apply(f, &input, MAX_INTERVAL).is_ok());
            assert_eq!(apply(f, &[], 3), Err(TrajectoryError::EmptyTrajectory));
        }
    }

    /// The reference: sort each window.
    fn naive_median(points: &[Point], w: usize) -> Vec<Point> {
        let n = points.len();
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let k = v.len();
            if k % 2 == 1 {
                v[k / 2]
            } else {
                (v[k / 2 - 1] + v[k / 2]) / 2.0
            }
        };
        (0..n)
            .map(|i| {
                let win = &points[window(i, n, w)];
                Point {
                    t: points[i].t,
                    lat: med(win.iter().map(|p| p.lat).collect()),
                    lon: med(win.iter().map(|p| p.lon).collect()),
                }
            })
            .collect()
    }

    fn naive_mean(points: &[Point], w: usize) -> Vec<Point> {
        let n = points.len();
        (0..n)
            .map(|i| {
                let win = &points[window(i, n, w)];
                let k = win.len() as f64;
                Point {
                    t: points[i].t,
                    lat: win.iter().map(|p| p.lat).sum::<f64>() / k,
                    lon: win.iter().map(|p| p.lon).sum::<f64>() / k,
                }
            })
            .collect()
    }

    /// splitmix64, for deterministic pseudo-random data.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// A value in [-bound, bound]; with `ties`, one of only 7 values.
        fn coord(&mut self, bound: f64, ties: bool) -> f64 {
            let u = if ties {
                (self.next() % 7) as f64 / 6.0
            } else {
                (self.next() >> 11) as f64 / (1u64 << 53) as f64
            };
            (2.0 * u - 1.0) * bound
        }
    }

    fn random_points(rng: &mut Rng, n: usize, ties: bool) -> Vec<Point> {
        (0..n)
            .map(|i| Point {
                t: i as f64,
                lat: rng.coord(90.0, ties),
                lon: rng.coord(180.0, ties),
            })
            .collect()
    }

    #[test]
    fn median_matches_sorting_each_window_on_seeded_data() {
        let mut rng = Rng(0x5eed_0001);
        for n in [1, 2, 3, 5, 8, 13, 50, 257] {
            for w in [1, 2, 3, 4, 5, 6, 7, 10, 16, 31, 64, 300, 600] {
                for ties in [false, true] {
                    let input = random_points(&mut rng, n, ties);
                    assert_eq!(
                        median(&input, w).unwrap(),
                        naive_median(&input, w),
                        "n={n} w={w} ties={ties}"
                    );
                }
            }
        }
    }

    #[test]
    fn mean_matches_summing_each_window_on_seeded_data() {
        let mut rng = Rng(0x5eed_0002);
        for n in [1, 2, 7, 100, 2_000] {
            for w in [1, 2, 3, 8, 25, 101, 4_001] {
                let input = random_points(&mut rng, n, false);
                for (a, b) in mean(&input, w).unwrap().iter().zip(naive_mean(&input, w)) {
                    assert_eq!(a.t, b.t);
                    assert!((a.lat - b.lat).abs() < 1e-9, "n={n} w={w}: {a:?} vs {b:?}");
                    assert!((a.lon - b.lon).abs() < 1e-9, "n={n} w={w}: {a:?} vs {b:?}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn median_matches_naive(
            coords in proptest::collection::vec((-90i32..=90, -180i32..=180), 1..80),
            w in 1usize..40,
            scale in proptest::sample::select(vec![1.0, 0.5, 0.001]),
        ) {
            let input: Vec<Point> = coords
                .iter()
                .enumerate()
                .map(|(i, &(la, lo))| Point { t: i as f64, lat: la as f64 * scale, lon: lo as f64 * scale })
                .collect();
            proptest::prop_assert_eq!(median(&input, w).unwrap(), naive_median(&input, w));
        }
    }
}
