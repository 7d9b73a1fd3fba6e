import { describe, expect, it } from 'vitest';
import { PlazaError, type ReplicaChange } from '../src/index.js';
import { createRoom, gate, newClient, next, replicaUntil } from './helpers.js';

const BOARD = [
  { kind: 'object', data: { x: 1, label: 'cube' } },
  { kind: 'object', data: { x: 2, label: 'ball' } },
];

async function twoMembersIn(room: string) {
  const a = newClient({ room });
  const b = newClient({ room });
  const roomA = await a.join(room, { name: 'ann' });
  const roomB = await b.join(room, { name: 'bob' });
  return { a, b, roomA, roomB };
}

describe('local replica', () => {
  it('starts from the snapshot and follows the changes of others', async () => {
    const room = await createRoom({ entities: BOARD });
    const { roomA, roomB } = await twoMembersIn(room);
    expect(roomA.state.entities()).toEqual([
      { id: 'e1', kind: 'object', data: { x: 1, label: 'cube' }, version: 1 },
      { id: 'e2', kind: 'object', data: { x: 2, label: 'ball' }, version: 1 },
    ]);

    const changes: ReplicaChange[] = [];
    roomA.state.on('change', (c) => changes.push(c));
    const patched = roomB.patchEntity('e1', { x: 5, label: null });
    // Shown at once on the changing side, before any answer.
    expect(roomB.state.entity('e1')).toMatchObject({ data: { x: 5 }, version: 2 });
    expect(roomB.state.isPending('e1')).toBe(true);

    const entity = await patched;
    expect(entity).toEqual({ id: 'e1', kind: 'object', data: { x: 5 }, version: 2 });
    expect(roomB.state.isPending('e1')).toBe(false);
    await replicaUntil(roomA, () => roomA.state.entity('e1')?.version === 2);
    expect(roomA.state.entity('e1')).toEqual(entity);
    expect(changes).toContainEqual({ type: 'entity', id: 'e1' });

    await roomB.deleteEntity('e2');
    expect(roomB.state.entity('e2')).toBeUndefined();
    await replicaUntil(roomA, () => roomA.state.entity('e2') === undefined);
    expect(roomA.state.entities()).toEqual(roomB.state.entities());
  });

  it('rolls back an own change the server refuses', async () => {
    const room = await createRoom({ entities: BOARD });
    const { roomA, roomB } = await twoMembersIn(room);
    const lock = await roomA.acquireLock('e1', { ttlMs: 10_000 });
    expect(lock).toMatchObject({ object: 'e1', owner: roomA.session });
    expect(roomA.state.lock('e1')).toEqual(lock);
    await replicaUntil(roomB, () => roomB.state.lock('e1') !== undefined);
    expect(roomB.state.lock('e1')).toEqual(lock);

    const seen: unknown[] = [];
    roomB.state.on('change', () => seen.push(roomB.state.entity('e1')?.data));
    const refused = roomB.patchEntity('e1', { x: 9 });
    expect(roomB.state.entity('e1')?.data).toEqual({ x: 9, label: 'cube' });
    const error = await refused.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PlazaError);
    expect(error).toMatchObject({ code: 'lock_held' });
    expect(roomB.state.entity('e1')).toEqual({ id: 'e1', kind: 'object', data: { x: 1, label: 'cube' }, version: 1 });
    expect(roomB.state.isPending('e1')).toBe(false);
    expect(seen).toEqual([
      { x: 9, label: 'cube' },
      { x: 1, label: 'cube' },
    ]);

    // A stale version is refused too, and rolled back.
    const stale = await roomA.setEntity('e2', { y: 1 }, { version: 7 }).catch((e: unknown) => e);
    expect(stale).toMatchObject({ code: 'version_conflict' });
    expect(roomA.state.entity('e2')?.data).toEqual({ x: 2, label: 'ball' });

    // The holder may change it; after the release so may others.
    await roomA.patchEntity('e1', { x: 3 });
    await roomA.releaseLock('e1');
    expect(roomA.state.lock('e1')).toBeUndefined();
    await replicaUntil(roomB, () => roomB.state.lock('e1') === undefined && roomB.state.entity('e1')?.version === 2);
    await roomB.patchEntity('e1', { x: 4 });
    await replicaUntil(roomA, () => roomA.state.entity('e1')?.version === 3);
    expect(roomA.state.entity('e1')?.data).toEqual({ x: 4, label: 'cube' });
  });

  it('gives an optimistic entity its server id, and operations on it wait for that id', async () => {
    const room = await createRoom();
    const { roomA, roomB } = await twoMembersIn(room);
    const renames: ReplicaChange[] = [];
    roomB.state.on('change', (c) => {
      if (c.type === 'renamed') renames.push(c);
    });
    const created = roomB.createEntity('note', { text: 'draft' });
    expect(roomB.state.entity('~1')).toEqual({ id: '~1', kind: 'note', data: { text: 'draft' }, version: 0 });
    const patched = roomB.patchEntity('~1', { text: 'final' });
    expect(roomB.state.entity('~1')?.data).toEqual({ text: 'final' });

    const entity = await created;
    expect(entity).toEqual({ id: 'e1', kind: 'note', data: { text: 'draft' }, version: 1 });
    expect(await patched).toEqual({ id: 'e1', kind: 'note', data: { text: 'final' }, version: 2 });
    expect(roomB.state.entity('~1')).toBeUndefined();
    expect(roomB.state.entities()).toEqual([{ id: 'e1', kind: 'note', data: { text: 'final' }, version: 2 }]);
    expect(renames).toEqual([{ type: 'renamed', from: '~1', to: 'e1' }]);
    await replicaUntil(roomA, () => roomA.state.entity('e1')?.version === 2);
    expect(roomA.state.entities()).toEqual(roomB.state.entities());
  });

  it('learns from the resume whether a change whose answer was lost happened', async () => {
    const room = await createRoom({ entities: BOARD });
    const { a, roomA, roomB } = await twoMembersIn(room);
    const held = gate();
    // Sent, then the socket drops: the server applies it, the response is lost.
    const patched = roomA.patchEntity('e1', { x: 42 });
    a._dropConnection(held.promise);
    const error = await patched.catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'disconnected' });
    // Outcome unknown: the replica shows only what is confirmed.
    expect(roomA.state.entity('e1')?.data).toEqual({ x: 1, label: 'cube' });
    await replicaUntil(roomB, () => roomB.state.entity('e1')?.version === 2);

    held.open();
    await next(roomA, 'joined', (j) => j.resumed);
    await replicaUntil(roomA, () => roomA.state.entity('e1')?.version === 2);
    expect(roomA.state.entity('e1')).toEqual({ id: 'e1', kind: 'object', data: { x: 42, label: 'cube' }, version: 2 });
    expect(roomA.state.entities()).toEqual(roomB.state.entities());
  });
});

describe('channels', () => {
  it('subscribes and unsubscribes, and delivers only subscribed channels', async () => {
    const room = await createRoom();
    const { roomA, roomB } = await twoMembersIn(room);
    expect(await roomA.subscribe('cursors')).toEqual(['main', 'cursors']);
    expect(roomA.channels).toEqual(['main', 'cursors']);

    const cursor = next(roomA, 'message', (m) => m.channel === 'cursors');
    await roomB.publish('move', { x: 1 }, { channel: 'cursors' });
    expect(await cursor).toMatchObject({ event: 'move', data: { x: 1 } });

    expect(await roomA.unsubscribe('cursors')).toEqual(['main']);
    const seen: string[] = [];
    roomA.on('message', (m) => seen.push(m.channel));
    await roomB.publish('move', { x: 2 }, { channel: 'cursors' });
    const marker = next(roomA, 'message', (m) => m.event === 'marker');
    await roomB.publish('marker');
    await marker;
    expect(seen).toEqual(['main']);
  });
});
