/** A spatial room as one member sees it: everyone's movements, interpolated locally. */
import type { Movement, Point, ProximityPair, SpaceEvent, SpaceSnapshot } from './frames.js';

/** Where a movement is at `t` (Unix ms): the server's rule, so both sides agree. */
export function positionAt(m: Movement, t: number): Point {
  const [fx, fy] = m.from;
  const [tx, ty] = m.to;
  const length = Math.hypot(tx - fx, ty - fy);
  if (m.speed <= 0 || length === 0) return [tx, ty];
  if (t <= m.t0) return [fx, fy];
  const travelled = ((t - m.t0) / 1000) * m.speed;
  if (travelled >= length) return [tx, ty];
  const f = travelled / length;
  return [fx + (tx - fx) * f, fy + (ty - fy) * f];
}

/** @internal The movements and pairs a room handle knows, kept up to date from events. */
export class SpaceView {
  /** Movements by session id: of this member and of those it sees. */
  readonly movements = new Map<string, Movement>();
  /** Pairs in proximity this member is in, by pair id. */
  readonly pairs = new Map<number, ProximityPair>();

  /** A `joined`/`resync` carried the space as it is now. */
  reset(snapshot: SpaceSnapshot): void {
    const { movements, pairs } = snapshot;
    this.movements.clear();
    for (const [session, m] of Object.entries(movements)) this.movements.set(session, m);
    this.pairs.clear();
    for (const p of pairs) this.pairs.set(p.pair, p);
  }

  /** Applies a spatial event; `self` is this member's session. */
  apply(event: SpaceEvent, self: string | undefined): void {
    switch (event.kind) {
      case 'space.moved':
        this.movements.set(event.session, event.movement);
        break;
      case 'interest.enter':
        for (const [session, m] of Object.entries(event.movements)) this.movements.set(session, m);
        break;
      case 'interest.leave': {
        const other = event.a === self ? event.b : event.a;
        this.movements.delete(other);
        break;
      }
      case 'proximity.enter':
        this.pairs.set(event.pair, { pair: event.pair, a: event.a, b: event.b, initiator: event.initiator });
        break;
      case 'proximity.leave':
        this.pairs.delete(event.pair);
        break;
    }
  }
}
