//! `--find-max`: which values of a scenario parameter to try, and the largest
//! that passed.
//!
//! The sweep steps the parameter linearly (`from`, `from + step`, ... up to
//! `to`) until a run fails, then bisects between the largest passing and the
//! smallest failing value until they are at most `resolution` apart. Pure: the
//! caller runs each value and reports the outcome.

use serde::Serialize;

/// What to sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepSpec {
    /// The scenario parameter stepped (e.g. `members`).
    pub param: String,
    /// First value tried.
    pub from: u64,
    /// Linear step.
    pub step: u64,
    /// Largest value tried.
    pub to: u64,
    /// Bisection stops when the passing and failing values are this close
    /// (a value ≥ `step` means no bisection).
    pub resolution: u64,
}

/// The state of a sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    spec: SweepSpec,
    /// Largest value that passed.
    best: Option<u64>,
    /// Smallest value that failed.
    failed: Option<u64>,
    /// The value whose outcome is awaited.
    pending: Option<u64>,
}

impl Sweep {
    /// A sweep not started yet. A zero `step` is treated as 1.
    pub fn new(mut spec: SweepSpec) -> Self {
        spec.step = spec.step.max(1);
        spec.resolution = spec.resolution.max(1);
        let first = (spec.from <= spec.to).then_some(spec.from);
        Self {
            spec,
            best: None,
            failed: None,
            pending: first,
        }
    }

    /// The value to run next, or `None` when the sweep is over.
    pub fn next_value(&self) -> Option<u64> {
        self.pending
    }

    /// Records the outcome of the value [`Sweep::next_value`] returned.
    pub fn record(&mut self, value: u64, passed: bool) {
        if self.pending != Some(value) {
            return;
        }
        if passed {
            self.best = Some(self.best.map_or(value, |b| b.max(value)));
        } else {
            self.failed = Some(self.failed.map_or(value, |f| f.min(value)));
        }
        self.pending = match (self.best, self.failed) {
            // Still stepping: nothing failed yet.
            (_, None) => value
                .checked_add(self.spec.step)
                .filter(|&v| v <= self.spec.to),
            // The first value failed: nothing below it is tried.
            (None, Some(_)) => None,
            (Some(ok), Some(bad)) => {
                let mid = ok + (bad - ok) / 2;
                (bad - ok > self.spec.resolution && mid > ok).then_some(mid)
            }
        };
    }

    /// The largest value that passed.
    pub fn max_passing(&self) -> Option<u64> {
        self.best
    }

    /// The smallest value that failed.
    pub fn min_failing(&self) -> Option<u64> {
        self.failed
    }

    /// What is swept.
    pub fn spec(&self) -> &SweepSpec {
        &self.spec
    }
}

/// Parses `from..to` with an optional `/step` (e.g. `100..3000/100`).
pub fn parse_range(s: &str) -> Result<(u64, u64, Option<u64>), String> {
    let (range, step) = match s.split_once('/') {
        Some((r, st)) => (r, Some(st)),
        None => (s, None),
    };
    let (from, to) = range
        .split_once("..")
        .ok_or_else(|| format!("expected FROM..TO[/STEP], got {s:?}"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|e| format!("{v:?} in {s:?}: {e}"))
    };
    let (from, to) = (num(from)?, num(to)?);
    if from > to {
        return Err(format!("{s:?}: FROM is larger than TO"));
    }
    let step = step.map(num).transpose()?;
    if step == Some(0) {
        return Err(format!("{s:?}: STEP must be at least 1"));
    }
    Ok((from, to, step))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(from: u64, step: u64, to: u64, resolution: u64) -> SweepSpec {
        SweepSpec {
            param: "members".into(),
            from,
            step,
            to,
            resolution,
        }
    }

    /// Runs a sweep against a system whose capacity is `cap`; returns the
    /// values tried and the result.
    fn run(spec: SweepSpec, cap: u64) -> (Vec<u64>, Option<u64>) {
        let mut s = Sweep::new(spec);
        let mut tried = Vec::new();
        while let Some(v) = s.next_value() {
            tried.push(v);
            s.record(v, v <= cap);
            assert!(tried.len() < 100, "sweep does not end");
        }
        (tried, s.max_passing())
    }

    #[test]
    fn steps_until_the_first_failure_without_bisection() {
        let (tried, best) = run(spec(100, 100, 1000, 100), 350);
        assert_eq!(tried, [100, 200, 300, 400]);
        assert_eq!(best, Some(300));
    }

    #[test]
    fn bisects_down_to_the_resolution() {
        let (tried, best) = run(spec(100, 100, 1000, 10), 350);
        assert_eq!(tried, [100, 200, 300, 400, 350, 375, 362, 356]);
        assert_eq!(best, Some(350));
        let (_, best) = run(spec(100, 100, 1000, 1), 357);
        assert_eq!(best, Some(357), "resolution 1 finds the exact capacity");
    }

    #[test]
    fn everything_passing_ends_at_to_and_nothing_passing_at_from() {
        let (tried, best) = run(spec(100, 300, 1000, 10), u64::MAX);
        assert_eq!(tried, [100, 400, 700, 1000]);
        assert_eq!(best, Some(1000));
        let (tried, best) = run(spec(100, 100, 1000, 10), 50);
        assert_eq!(tried, [100]);
        assert_eq!(best, None);
    }

    #[test]
    fn degenerate_specs_end() {
        assert_eq!(run(spec(5, 0, 7, 0), u64::MAX).0, [5, 6, 7]);
        assert_eq!(run(spec(9, 1, 3, 1), u64::MAX).0, Vec::<u64>::new());
        let mut s = Sweep::new(spec(1, 1, 3, 1));
        s.record(2, true); // not the pending value: ignored
        assert_eq!(s.next_value(), Some(1));
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("100..3000/100"), Ok((100, 3000, Some(100))));
        assert_eq!(parse_range(" 1 .. 5 "), Ok((1, 5, None)));
        assert!(parse_range("5..1").is_err());
        assert!(parse_range("1..5/0").is_err());
        assert!(parse_range("100").is_err());
        assert!(parse_range("a..5").is_err());
    }
}
