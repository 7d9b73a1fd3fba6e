//! A spatial room's settings.

use serde::{Deserialize, Serialize};

use super::geometry::Vec2;
use crate::Millis;

/// The `space` option of a room: its plane and the distances that matter.
///
/// Serializable as part of a room's state (every field required there, since
/// replicas with different settings would disagree).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpaceConfig {
    /// Width of the plane: x in [0, width].
    pub width: f64,
    /// Height of the plane: y in [0, height].
    pub height: f64,
    /// Two members closer than this are in proximity (a call starts).
    pub proximity_radius: f64,
    /// A pair in proximity leaves it only beyond `proximity_radius × hysteresis`
    /// (and a pair in each other's area of interest beyond `aoi_radius ×
    /// hysteresis`): no flapping at the boundary.
    pub hysteresis: f64,
    /// No pair enters and leaves (or leaves and enters) faster than this.
    pub min_dwell_ms: Millis,
    /// A member is told of the moves of members within this distance.
    pub aoi_radius: f64,
    /// How often positions are checked while a member moves (positions change
    /// between messages).
    pub tick_ms: Millis,
    /// Whether `direct` messages (WebRTC signalling) pass only between members
    /// in proximity, so that a stranger cannot ring anyone.
    #[serde(default)]
    pub direct_in_proximity_only: bool,
}

impl Default for SpaceConfig {
    fn default() -> Self {
        SpaceConfig {
            width: 2000.0,
            height: 2000.0,
            proximity_radius: 150.0,
            hysteresis: 1.2,
            min_dwell_ms: 1000,
            aoi_radius: 600.0,
            tick_ms: 100,
            direct_in_proximity_only: false,
        }
    }
}

/// The bounds of a space's settings, checked by [`SpaceConfig::validate`].
pub mod bounds {
    /// Largest width or height of a plane (units).
    pub const MAX_SIDE: f64 = 1e9;
    /// Largest radius (units).
    pub const MAX_RADIUS: f64 = 1e9;
    /// Most grid cells a plane may span, a cell being `aoi_radius ×
    /// hysteresis` wide: a plane at most 10,000 areas of interest wide
    /// and high.
    pub const MAX_CELLS: f64 = 1e8;
    /// Hysteresis range.
    pub const HYSTERESIS: (f64, f64) = (1.0, 4.0);
    /// Tick range (ms).
    pub const TICK_MS: (u64, u64) = (10, 10_000);
    /// Longest dwell (ms).
    pub const MAX_DWELL_MS: u64 = 600_000;
    /// Most members a spatial room may hold (its `max_members`): all of
    /// them on one spot make every pair a pair in proximity.
    pub const MAX_MEMBERS: usize = 2_000;
}

impl SpaceConfig {
    /// Checks the settings; the error names the field and its bounds.
    pub fn validate(&self) -> Result<(), String> {
        use bounds::*;
        let within = |name: &str, v: f64, max: f64| {
            if v.is_finite() && v > 0.0 && v <= max {
                Ok(())
            } else {
                Err(format!(
                    "space.{name} must be a number greater than 0 and at most {max:e}, not {v}"
                ))
            }
        };
        within("width", self.width, MAX_SIDE)?;
        within("height", self.height, MAX_SIDE)?;
        within("proximity_radius", self.proximity_radius, MAX_RADIUS)?;
        within("aoi_radius", self.aoi_radius, MAX_RADIUS)?;
        let (lo, hi) = HYSTERESIS;
        if !(self.hysteresis.is_finite() && (lo..=hi).contains(&self.hysteresis)) {
            return Err(format!(
                "space.hysteresis must be from {lo} to {hi}, not {}",
                self.hysteresis
            ));
        }
        if self.aoi_radius < self.proximity_radius * self.hysteresis {
            return Err(format!(
                "space.aoi_radius ({}) must be at least proximity_radius × hysteresis ({}): a member must see whom it is in a call with",
                self.aoi_radius,
                self.proximity_radius * self.hysteresis
            ));
        }
        let cell = self.aoi_radius * self.hysteresis;
        let cells = (self.width / cell).ceil() * (self.height / cell).ceil();
        if cells > MAX_CELLS {
            return Err(format!(
                "space.width × space.height must span at most {MAX_CELLS:e} cells of aoi_radius × hysteresis ({cell}) squared, not {cells:e}: make the plane smaller or aoi_radius larger"
            ));
        }
        let (lo, hi) = TICK_MS;
        if !(lo..=hi).contains(&self.tick_ms) {
            return Err(format!(
                "space.tick_ms must be an integer from {lo} to {hi}, not {}",
                self.tick_ms
            ));
        }
        if self.min_dwell_ms > MAX_DWELL_MS {
            return Err(format!(
                "space.min_dwell_ms must be an integer from 0 to {MAX_DWELL_MS}, not {}",
                self.min_dwell_ms
            ));
        }
        Ok(())
    }

    /// The fastest a member may move (units per second): across the plane's
    /// diagonal in one tick. Faster, a walk would leave the plane's every
    /// area of interest between two evaluations.
    pub fn max_speed(&self) -> f64 {
        self.width.hypot(self.height) * 1000.0 / self.tick_ms as f64
    }

    /// `p` moved into the plane, and whether it had to be.
    pub fn clamp(&self, p: Vec2) -> (Vec2, bool) {
        let c = Vec2::new(p.x.clamp(0.0, self.width), p.y.clamp(0.0, self.height));
        (c, c != p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        assert_eq!(SpaceConfig::default().validate(), Ok(()));
        let bad = |f: fn(&mut SpaceConfig)| {
            let mut c = SpaceConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.width = f64::NAN).contains("space.width"));
        assert!(bad(|c| c.height = 0.0).contains("space.height"));
        assert!(bad(|c| c.hysteresis = 0.9).contains("space.hysteresis"));
        assert!(bad(|c| c.aoi_radius = 100.0).contains("space.aoi_radius"));
        assert!(bad(|c| c.tick_ms = 1).contains("space.tick_ms"));
        assert!(bad(|c| c.tick_ms = 10_001).contains("from 10 to 10000"));
        assert!(bad(|c| c.min_dwell_ms = 600_001).contains("space.min_dwell_ms"));
        assert!(bad(|c| c.width = 1e308).contains("at most 1e9"));
        assert!(bad(|c| c.proximity_radius = 0.0).contains("space.proximity_radius"));
        assert!(bad(|c| c.aoi_radius = f64::INFINITY).contains("space.aoi_radius"));
        assert!(bad(|c| c.hysteresis = 4.5).contains("from 1 to 4"));
        // 1e9 × 1e9 with an area of interest of 600 × 1.2: ~1.7e12 cells.
        let wide = bad(|c| {
            c.width = 1e9;
            c.height = 1e9;
        });
        assert!(wide.contains("cells"), "{wide}");
    }

    #[test]
    fn the_edges_of_each_bound_are_valid() {
        let ok = |f: fn(&mut SpaceConfig)| {
            let mut c = SpaceConfig::default();
            f(&mut c);
            c.validate()
        };
        assert_eq!(ok(|c| c.tick_ms = 10), Ok(()));
        assert_eq!(ok(|c| c.tick_ms = 10_000), Ok(()));
        assert_eq!(ok(|c| c.min_dwell_ms = 0), Ok(()));
        assert_eq!(ok(|c| c.min_dwell_ms = 600_000), Ok(()));
        assert_eq!(ok(|c| c.hysteresis = 1.0), Ok(()));
        assert_eq!(
            ok(|c| {
                c.hysteresis = 4.0;
                c.aoi_radius = 600.0;
            }),
            Ok(())
        );
        // Exactly 1e8 cells: 10,000 cells of 1,000 each way.
        assert_eq!(
            ok(|c| {
                c.width = 1e7;
                c.height = 1e7;
                c.hysteresis = 1.0;
                c.aoi_radius = 1000.0;
            }),
            Ok(())
        );
        assert_eq!(
            ok(|c| {
                c.width = 1e9;
                c.height = 1e9;
                c.proximity_radius = 1e5;
                c.aoi_radius = 1e5;
                c.hysteresis = 1.0;
            }),
            Ok(())
        );
        assert!(ok(|c| {
            c.width = 1e7 + 1.0;
            c.height = 1e7;
            c.hysteresis = 1.0;
            c.aoi_radius = 1000.0;
        })
        .is_err());
    }

    #[test]
    fn the_fastest_speed_crosses_the_diagonal_in_one_tick() {
        let c = SpaceConfig {
            width: 300.0,
            height: 400.0,
            tick_ms: 100,
            ..SpaceConfig::default()
        };
        assert_eq!(c.max_speed(), 5000.0);
    }

    #[test]
    fn clamping_says_whether_it_moved_the_point() {
        let c = SpaceConfig::default();
        assert_eq!(c.clamp(Vec2::new(5.0, 6.0)), (Vec2::new(5.0, 6.0), false));
        assert_eq!(
            c.clamp(Vec2::new(-5.0, 2500.0)),
            (Vec2::new(0.0, 2000.0), true)
        );
    }
}
