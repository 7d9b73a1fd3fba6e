//! Phase stepping: when each phase starts and ends, and when each virtual
//! user arrives. Pure arithmetic on offsets from the start of the run.

use std::time::Duration;

use crate::scenario::Phase;

/// A phase placed on the run's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseWindow {
    /// The phase's name.
    pub name: String,
    /// Offset of its start.
    pub start: Duration,
    /// Offset of its end; for an `until_done` phase, the latest end (it
    /// ends earlier if every flow finishes first).
    pub end: Duration,
    /// Whether measurements in it count.
    pub record: bool,
    /// Whether it ends once every user's flow has finished.
    pub until_done: bool,
}

/// The run's timeline: phase windows and every arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The phases, back to back.
    pub phases: Vec<PhaseWindow>,
    /// Arrival offsets, ascending; user `i` arrives at `arrivals[i]`.
    pub arrivals: Vec<Duration>,
}

impl Schedule {
    /// Lays out `phases`.
    ///
    /// In a phase of length `d` whose rate goes linearly from `a` to `b` users
    /// per second, `N(t) = a·t + (b − a)·t² / (2d)` users have arrived by `t`;
    /// user `k` (from 0) arrives when `N(t) = k`, so the first arrives at the
    /// phase's start. `users` caps a phase's arrivals.
    pub fn new(phases: &[Phase]) -> Schedule {
        let mut out = Schedule {
            phases: Vec::with_capacity(phases.len()),
            arrivals: Vec::new(),
        };
        let mut start = 0.0f64;
        for p in phases {
            let a = p.arrival_rate.unwrap_or(0.0);
            let b = p.ramp_to.unwrap_or(a);
            let len = match p.duration_s {
                Some(d) => d,
                // Checked by the scenario: constant rate and a user count.
                None => p.users.unwrap_or(0) as f64 / a,
            };
            if a > 0.0 || b > 0.0 {
                let cap = p.users.unwrap_or(u64::MAX);
                let mut k = 0u64;
                while k < cap {
                    let Some(t) = arrival_time(k as f64, a, b, len) else {
                        break;
                    };
                    if p.duration_s.is_some() && t >= len {
                        break;
                    }
                    out.arrivals.push(Duration::from_secs_f64(start + t));
                    k += 1;
                }
            }
            out.phases.push(PhaseWindow {
                name: p.name.clone(),
                start: Duration::from_secs_f64(start),
                end: Duration::from_secs_f64(start + len),
                record: p.record,
                until_done: p.until_done,
            });
            start += len;
        }
        out
    }

    /// The end of the last phase.
    pub fn end(&self) -> Duration {
        self.phases.last().map_or(Duration::ZERO, |p| p.end)
    }

    /// The index of the phase running at `t` (the last one at and after its end).
    pub fn phase_at(&self, t: Duration) -> usize {
        self.phases
            .iter()
            .position(|p| t < p.end)
            .unwrap_or(self.phases.len().saturating_sub(1))
    }

    /// The recorded stretch: from the start of the first recorded phase to
    /// the end of the last one, if any phase records.
    pub fn recorded(&self) -> Option<(Duration, Duration)> {
        let first = self.phases.iter().find(|p| p.record)?;
        let last = self.phases.iter().rev().find(|p| p.record)?;
        Some((first.start, last.end))
    }
}

/// When `N(t) = k` for a rate ramping from `a` to `b` over `len` seconds.
fn arrival_time(k: f64, a: f64, b: f64, len: f64) -> Option<f64> {
    if k == 0.0 {
        return Some(0.0);
    }
    let slope = if len > 0.0 { (b - a) / len } else { 0.0 };
    if slope.abs() < 1e-12 {
        return (a > 0.0).then(|| k / a);
    }
    // slope/2 · t² + a·t − k = 0, the root ≥ 0.
    let disc = a * a + 2.0 * slope * k;
    if disc < 0.0 {
        return None;
    }
    let t = (-a + disc.sqrt()) / slope;
    (t >= 0.0 && t.is_finite()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, d: Option<f64>, a: Option<f64>, b: Option<f64>, u: Option<u64>) -> Phase {
        Phase {
            name: name.into(),
            duration_s: d,
            arrival_rate: a,
            ramp_to: b,
            users: u,
            users_per_room: None,
            record: name == "measure",
            until_done: false,
        }
    }

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn constant_rate_with_a_user_count_lasts_until_the_last_arrives() {
        let s = Schedule::new(&[
            phase("join", None, Some(10.0), None, Some(5)),
            phase("measure", Some(2.0), None, None, None),
        ]);
        let got: Vec<f64> = s.arrivals.iter().map(|d| secs(*d)).collect();
        assert_eq!(got, [0.0, 0.1, 0.2, 0.3, 0.4]);
        assert_eq!(secs(s.phases[0].end), 0.5);
        assert_eq!(secs(s.phases[1].start), 0.5);
        assert_eq!(secs(s.end()), 2.5);
        assert_eq!(
            s.recorded().map(|(a, b)| (secs(a), secs(b))),
            Some((0.5, 2.5))
        );
    }

    #[test]
    fn a_timed_phase_admits_rate_times_duration_unless_capped() {
        let s = Schedule::new(&[phase("a", Some(2.0), Some(5.0), None, None)]);
        assert_eq!(s.arrivals.len(), 10);
        assert!(s.arrivals.iter().all(|t| secs(*t) < 2.0));
        let s = Schedule::new(&[phase("a", Some(2.0), Some(5.0), None, Some(3))]);
        assert_eq!(s.arrivals.len(), 3);
        assert_eq!(s.recorded(), None);
    }

    #[test]
    fn a_ramp_admits_its_integral_and_speeds_up() {
        // 0 → 20 users/s over 10 s: 100 users, arrivals closer and closer.
        let s = Schedule::new(&[phase("ramp", Some(10.0), Some(0.0), Some(20.0), None)]);
        assert!(
            (99..=100).contains(&s.arrivals.len()),
            "{}",
            s.arrivals.len()
        );
        let gaps: Vec<f64> = s
            .arrivals
            .windows(2)
            .map(|w| secs(w[1]) - secs(w[0]))
            .collect();
        assert!(gaps.windows(2).all(|g| g[1] <= g[0] + 1e-9));
        // N(5) = 20·25/20 = 25 users by the middle.
        let by_half = s.arrivals.iter().filter(|t| secs(**t) < 5.0).count();
        assert!((25..=26).contains(&by_half), "{by_half}");
    }

    #[test]
    fn an_until_done_phase_is_laid_out_at_its_upper_bound() {
        let mut last = phase("measure", Some(60.0), None, None, None);
        last.until_done = true;
        let s = Schedule::new(&[phase("join", None, Some(10.0), None, Some(5)), last]);
        assert!(s.phases[1].until_done && !s.phases[0].until_done);
        assert_eq!(secs(s.end()), 60.5, "the runner may end it earlier");
    }

    #[test]
    fn phases_are_back_to_back_and_phase_at_finds_them() {
        let s = Schedule::new(&[
            phase("warm", Some(1.0), None, None, None),
            phase("join", Some(1.0), Some(4.0), None, None),
            phase("measure", Some(3.0), None, None, None),
        ]);
        let got: Vec<f64> = s.arrivals.iter().map(|d| secs(*d)).collect();
        assert_eq!(got, [1.0, 1.25, 1.5, 1.75]);
        assert_eq!(s.phase_at(Duration::from_millis(500)), 0);
        assert_eq!(s.phase_at(Duration::from_millis(1000)), 1);
        assert_eq!(s.phase_at(Duration::from_millis(4999)), 2);
        assert_eq!(s.phase_at(Duration::from_secs(60)), 2);
    }
}
