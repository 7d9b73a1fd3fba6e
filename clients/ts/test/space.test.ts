// Spatial rooms against a real `plaza serve`: moves, positions interpolated the server's way,
// and proximity decided by the server for both members at once.
import { describe, expect, it } from 'vitest';
import { positionAt, type SpaceEvent } from '../src/index.js';
import { createRoom, newClient, next } from './helpers.js';

describe('spatial rooms', () => {
  it('tell both members of a pair, with one initiator, and track who moves where', async () => {
    // A plane so large that members, who appear at scattered points, start far apart.
    const room = await createRoom({ options: { space: { min_dwell_ms: 0, tick_ms: 10, width: 100000, height: 100000 } } });
    const a = newClient({ room });
    const b = newClient({ room });
    const ann = await a.join(room, { name: 'ann' });
    expect(ann.movements.get(ann.session!)).toBeDefined();
    await ann.jumpTo([100, 100]);
    const bob = await b.join(room, { name: 'bob' });
    // Every movement comes with the joined (ann's jump before bob joined included).
    expect(bob.positionOf(ann.session!)).toEqual([100, 100]);
    await bob.jumpTo([1000, 1000]);

    const entered = (e: SpaceEvent) => e.kind === 'proximity.enter';
    const enterAtAnn = next(ann, 'space', entered);
    const enterAtBob = next(bob, 'space', entered);
    const movement = await ann.moveTo([990, 1000], 5000);
    expect(movement.from).toEqual([100, 100]);
    expect(positionAt(movement, movement.t0 + 10_000)).toEqual([990, 1000]);
    const [x, y] = [await enterAtAnn, await enterAtBob];
    expect(x).toEqual(y);
    const initiator = [ann.session!, bob.session!].sort()[0];
    expect(x).toMatchObject({ kind: 'proximity.enter', initiator });
    expect([...ann.proximityPairs.values()]).toEqual([...bob.proximityPairs.values()]);
    // bob sees ann's move (it was in his area of interest once she came near).
    const moved = next(bob, 'space', (e) => e.kind === 'space.moved');
    await ann.moveTo([995, 1000], 50);
    const seen = await moved;
    expect(seen).toMatchObject({ kind: 'space.moved', session: ann.session });
    a.close();
    b.close();
  });

  it('forget the movement of a member that leaves, seen or not', async () => {
    const room = await createRoom({ options: { space: { width: 100000, height: 100000 } } });
    const a = newClient({ room });
    const b = newClient({ room });
    const c = newClient({ room });
    const ann = await a.join(room, { name: 'ann' });
    await ann.jumpTo([100, 100]);
    const bob = await b.join(room, { name: 'bob' });
    await bob.jumpTo([90000, 90000]); // far outside ann's area of interest: no interest.leave
    const carol = await c.join(room, { name: 'carol' });
    const sees = next(carol, 'space', (e) => e.kind === 'interest.enter');
    await carol.jumpTo([120, 100]); // within ann's area of interest: she sees ann
    await sees;
    expect(bob.positionOf(ann.session!)).toEqual([100, 100]);
    expect(carol.positionOf(ann.session!)).toEqual([100, 100]);
    const unseenLeft = next(bob, 'presence', (e) => e.kind === 'presence.leave');
    const seenLeft = next(carol, 'presence', (e) => e.kind === 'presence.leave');
    const unseen = next(carol, 'space', (e) => e.kind === 'interest.leave');
    await ann.leave();
    await Promise.all([unseenLeft, seenLeft, unseen]);
    for (const observer of [bob, carol]) {
      expect(observer.positionOf(ann.session!)).toBeUndefined();
      expect(observer.movements.has(ann.session!)).toBe(false);
    }
    a.close();
    b.close();
    c.close();
  });
});
