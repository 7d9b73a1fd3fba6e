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

impl SpaceConfig {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("space.{name} must be a positive number, not {v}"))
            }
        };
        positive("width", self.width)?;
        positive("height", self.height)?;
        positive("proximity_radius", self.proximity_radius)?;
        positive("aoi_radius", self.aoi_radius)?;
        if !(self.hysteresis.is_finite() && (1.0..=4.0).contains(&self.hysteresis)) {
            return Err(format!(
                "space.hysteresis must be from 1 to 4, not {}",
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
        if !(10..=10_000).contains(&self.tick_ms) {
            return Err(format!(
                "space.tick_ms must be from 10 to 10000, not {}",
                self.tick_ms
            ));
        }
        if self.min_dwell_ms > 600_000 {
            return Err(format!(
                "space.min_dwell_ms must be at most 600000, not {}",
                self.min_dwell_ms
            ));
        }
        Ok(())
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
