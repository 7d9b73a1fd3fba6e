/**
 * Target-based movement: only an avatar's target travels over the network; every tab moves
 * the avatar from where it currently draws it toward the target at a fixed speed. Positions
 * are computed from the time, not accumulated per frame, so they are right whenever asked
 * (also when a background tab draws no frames).
 */

/** Plaza units per second. */
export const SPEED = 240;

export interface Point {
  x: number;
  y: number;
}

export class Motion {
  private sx: number;
  private sy: number;
  private t0: number;
  private tx: number;
  private ty: number;

  /** At rest at `(x, y)`. */
  constructor(x: number, y: number, now: number) {
    this.sx = this.tx = x;
    this.sy = this.ty = y;
    this.t0 = now;
  }

  /** The target. */
  get target(): Point {
    return { x: this.tx, y: this.ty };
  }

  /** Where the avatar is at `now`. */
  at(now: number): Point {
    const dx = this.tx - this.sx;
    const dy = this.ty - this.sy;
    const dist = Math.hypot(dx, dy);
    const travelled = (SPEED * Math.max(0, now - this.t0)) / 1000;
    if (dist === 0 || travelled >= dist) return { x: this.tx, y: this.ty };
    const f = travelled / dist;
    return { x: this.sx + dx * f, y: this.sy + dy * f };
  }

  /** Whether it has arrived at `now`. */
  arrived(now: number): boolean {
    const p = this.at(now);
    return p.x === this.tx && p.y === this.ty;
  }

  /** Heads for `(tx, ty)` from where it is at `now` (no-op if that is the target already). */
  retarget(tx: number, ty: number, now: number): void {
    if (tx === this.tx && ty === this.ty) return;
    const p = this.at(now);
    this.sx = p.x;
    this.sy = p.y;
    this.t0 = now;
    this.tx = tx;
    this.ty = ty;
  }

  /** Jumps to `(x, y)`, at rest. */
  place(x: number, y: number, now: number): void {
    this.sx = this.tx = x;
    this.sy = this.ty = y;
    this.t0 = now;
  }
}
