//! Points and target-based movement in a room's plane.

use serde::{Deserialize, Serialize};

use crate::Millis;

/// A point of the plane (room units, e.g. pixels of a 2D plaza); `[x, y]`
/// on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(from = "[f64; 2]", into = "[f64; 2]")]
pub struct Vec2 {
    /// Horizontal coordinate.
    pub x: f64,
    /// Vertical coordinate.
    pub y: f64,
}

impl From<[f64; 2]> for Vec2 {
    fn from([x, y]: [f64; 2]) -> Vec2 {
        Vec2 { x, y }
    }
}

impl From<Vec2> for [f64; 2] {
    fn from(p: Vec2) -> [f64; 2] {
        [p.x, p.y]
    }
}

impl Vec2 {
    /// The point `(x, y)`.
    pub const fn new(x: f64, y: f64) -> Vec2 {
        Vec2 { x, y }
    }

    /// The distance to `other`.
    pub fn distance(self, other: Vec2) -> f64 {
        (self.x - other.x).hypot(self.y - other.y)
    }

    /// The squared distance to `other` (comparisons without a square root).
    pub fn distance_sq(self, other: Vec2) -> f64 {
        let (dx, dy) = (self.x - other.x, self.y - other.y);
        dx * dx + dy * dy
    }

    /// Whether both coordinates are finite.
    pub fn is_finite(self) -> bool {
        self.x.is_finite() && self.y.is_finite()
    }
}

/// A member's movement: from `from`, starting at `t0`, towards `to` at `speed`
/// units per second, then standing at `to`. The server stores this, not
/// positions: a client that knows it computes the position at any time, so
/// nobody sends positions per frame. A jump (teleport) is a movement that
/// starts and ends at one point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Movement {
    /// Where it started.
    pub from: Vec2,
    /// Where it goes.
    pub to: Vec2,
    /// When it started (Unix ms).
    pub t0: Millis,
    /// Units per second (0 for a jump).
    pub speed: f64,
}

impl Movement {
    /// Standing at `at` since `t`.
    pub fn standing(at: Vec2, t: Millis) -> Movement {
        Movement {
            from: at,
            to: at,
            t0: t,
            speed: 0.0,
        }
    }

    /// The position at time `t` (before `t0`: the start).
    pub fn position_at(&self, t: Millis) -> Vec2 {
        let length = self.from.distance(self.to);
        if self.speed <= 0.0 || length == 0.0 || t <= self.t0 {
            return if self.speed <= 0.0 || length == 0.0 {
                self.to
            } else {
                self.from
            };
        }
        let elapsed_ms = (t - self.t0) as f64;
        // From its arrival on, exactly at the target: the travelled distance
        // computed at the arrival can fall a rounding error short of it.
        if elapsed_ms >= (length / self.speed * 1000.0).ceil() {
            return self.to;
        }
        let travelled = elapsed_ms / 1000.0 * self.speed;
        if travelled >= length {
            return self.to;
        }
        let f = travelled / length;
        Vec2::new(
            self.from.x + (self.to.x - self.from.x) * f,
            self.from.y + (self.to.y - self.from.y) * f,
        )
    }

    /// When it reaches `to` (Unix ms, rounded up); `t0` for a jump.
    pub fn arrives_at(&self) -> Millis {
        let length = self.from.distance(self.to);
        if self.speed <= 0.0 || length == 0.0 {
            return self.t0;
        }
        let ms = (length / self.speed * 1000.0).ceil();
        self.t0.saturating_add(ms as Millis)
    }

    /// Whether it is still under way at `t`.
    pub fn is_moving(&self, t: Millis) -> bool {
        t < self.arrives_at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_movement_goes_at_its_speed_and_stops_at_its_target() {
        let m = Movement {
            from: Vec2::new(0.0, 0.0),
            to: Vec2::new(300.0, 400.0),
            t0: 1_000,
            speed: 100.0,
        };
        assert_eq!(m.position_at(0), Vec2::new(0.0, 0.0));
        assert_eq!(m.position_at(1_000), Vec2::new(0.0, 0.0));
        assert_eq!(m.position_at(3_500), Vec2::new(150.0, 200.0));
        assert_eq!(m.arrives_at(), 6_000);
        assert!(m.is_moving(5_999) && !m.is_moving(6_000));
        assert_eq!(m.position_at(6_000), Vec2::new(300.0, 400.0));
        assert_eq!(m.position_at(60_000), Vec2::new(300.0, 400.0));
    }

    #[test]
    fn standing_is_where_it_is() {
        let s = Movement::standing(Vec2::new(5.0, 6.0), 10);
        assert_eq!(s.position_at(0), Vec2::new(5.0, 6.0));
        assert_eq!(s.arrives_at(), 10);
        assert!(!s.is_moving(10));
    }
}
