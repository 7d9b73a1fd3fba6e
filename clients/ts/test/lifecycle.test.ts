import { describe, expect, it } from 'vitest';
import { PlazaError, type Member, type RoomClosed } from '../src/index.js';
import { api, createRoom, gate, newClient, next, replicaUntil } from './helpers.js';

describe('resync', () => {
  it('starts again from a snapshot when the history no longer reaches the last seq', async () => {
    const room = await createRoom({ entities: [{ kind: 'object', data: { x: 0 } }], options: { history_size: 2 } });
    const a = newClient({ room });
    const b = newClient({ room });
    const roomA = await a.join(room, { name: 'ann' });
    const roomB = await b.join(room, { name: 'bob' });

    const held = gate();
    const left = next(roomB, 'presence', (p) => p.kind === 'presence.leave');
    a._dropConnection(held.promise);
    await left;
    for (const x of [1, 2, 3]) await roomB.patchEntity('e1', { x });
    await roomB.createEntity('note', 'hello');

    const back = next(roomB, 'presence', (p) => p.kind === 'presence.join');
    const resync = next(roomA, 'resync');
    const reset = new Promise<void>((resolve) => {
      const off = roomA.state.on('change', (c) => {
        if (c.type === 'reset') {
          off();
          resolve();
        }
      });
    });
    held.open();
    expect(await resync).toMatchObject({ reason: 'history_truncated', session: roomA.session, resumed: false });
    await reset;
    expect(roomA.state.entities()).toEqual(roomB.state.entities());
    expect(roomA.state.entity('e1')?.data).toEqual({ x: 3 });
    // Both are at the same point: the snapshot's seq includes A's return, which B heard.
    await back;
    expect(roomA.lastSeq).toBe(roomB.lastSeq);
  });
});

describe('the end of a membership', () => {
  it('closes the handle with room_deleted when the room is deleted', async () => {
    const room = await createRoom();
    const client = newClient({ room });
    const handle = await client.join(room, { name: 'ann' });
    const closed = next(handle, 'closed');
    expect((await api('DELETE', `/v1/rooms/${room}`)).status).toBe(204);
    expect(await closed).toEqual({ reason: 'room_deleted' });
    expect(handle.live).toBe(false);
    const error = await handle.publish('chat').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PlazaError);
    expect(error).toMatchObject({ code: 'closed' });
    expect(client.room(room)).toBeUndefined();
  });
});

describe('leave', () => {
  it('ends the session for good: the others see it leave, and it cannot be resumed', async () => {
    const room = await createRoom();
    const first = newClient({ room });
    const other = newClient({ room });
    const roomA = await first.join(room, { name: 'ann' });
    const roomB = await other.join(room, { name: 'bob' });
    const saved = roomA.saveSession()!;
    const heard = next(roomB, 'presence', (p) => p.kind === 'presence.leave');
    await roomA.leave();
    expect(await heard).toMatchObject({ session: roomA.session, reason: 'left' });
    expect(roomA.live).toBe(false);
    expect(roomA.saveSession()).toBeUndefined();
    expect(await roomA.publish('chat').catch((e: unknown) => e)).toMatchObject({ code: 'closed' });

    // A restore of the old session gets a new one (session_expired).
    const again = newClient({ room });
    const handle = await again.join(room, { name: 'ann', restore: saved });
    expect(handle.session).not.toBe(saved.session);
    expect(handle.members.map((m) => m.name).sort()).toEqual(['ann', 'bob']);
  });
});

describe('saved sessions', () => {
  it('continue in a new client, which takes the session over (resumed_elsewhere)', async () => {
    const room = await createRoom({ entities: [{ kind: 'object', data: { x: 0 } }] });
    const first = newClient({ room });
    const other = newClient({ room });
    const roomA = await first.join(room, { name: 'ann' });
    const roomB = await other.join(room, { name: 'bob' });
    await roomB.patchEntity('e1', { x: 1 });
    await replicaUntil(roomA, () => roomA.state.entity('e1')?.version === 2);
    const saved = roomA.saveSession();
    expect(saved).toBeDefined();
    // A saved session is plain JSON (e.g. for sessionStorage).
    const restored = JSON.parse(JSON.stringify(saved));

    const presence: string[] = [];
    roomB.on('presence', (p) => presence.push(p.kind));
    const closed = next(roomA, 'closed');
    const second = newClient({ room });
    const roomA2 = await second.join(room, { name: 'ann', restore: restored });
    expect(roomA2.session).toBe(roomA.session);
    expect(await closed).toEqual<RoomClosed>({ reason: 'resumed_elsewhere' });
    // Its state came from the saved snapshot; nothing was missed since.
    expect(roomA2.state.entities()).toEqual(roomB.state.entities());
    expect(roomA2.members.map((m: Member) => m.name)).toEqual(roomB.members.map((m) => m.name));

    // The session carries on: the other member hears it, without presence events.
    const heard = next(roomB, 'message');
    const ack = await roomA2.publish('chat', { text: 'still me' });
    expect(await heard).toMatchObject({ seq: ack.seq, from: roomA.session });
    expect(presence).toEqual([]);
  });

  it('resume after the old client is gone, with the events missed meanwhile', async () => {
    const room = await createRoom();
    const first = newClient({ room });
    const other = newClient({ room });
    const roomA = await first.join(room, { name: 'ann' });
    const roomB = await other.join(room, { name: 'bob' });
    const saved = roomA.saveSession()!;
    const left = next(roomB, 'presence', (p) => p.kind === 'presence.leave');
    first.close(); // like a page being unloaded
    await left;
    const missed = await roomB.publish('chat', { text: 'while you were away' });

    const back = next(roomB, 'presence', (p) => p.kind === 'presence.join');
    const second = newClient({ room });
    const roomA2 = await second.join(room, { name: 'ann', restore: saved });
    // The missed events may arrive in the same read as `joined`: a handler attached right
    // after the join gets them all the same.
    expect(await next(roomA2, 'message')).toMatchObject({ seq: missed.seq, data: { text: 'while you were away' } });
    expect(roomA2.members.map((m) => m.name).sort()).toEqual(['ann', 'bob']);
    expect(await back).toMatchObject({ member: { session: saved.session, name: 'ann' } });
    expect(roomA2.session).toBe(saved.session);
  });
});

describe('saved publishes', () => {
  it('a message published just before the page went away is delivered once, by the next page', async () => {
    const room = await createRoom();
    const first = newClient({ room });
    const other = newClient({ room });
    const roomA = await first.join(room, { name: 'ann' });
    const roomB = await other.join(room, { name: 'bob' });
    const seen: unknown[] = [];
    roomB.on('message', (m) => seen.push(m.data));

    // Offline: the publish waits, unacknowledged, when the page saves its session.
    const held = gate();
    first._dropConnection(held.promise);
    void roomA.publish('chat', { text: 'last words' }).catch(() => undefined);
    const saved = JSON.parse(JSON.stringify(roomA.saveSession()));
    expect(saved.publishes).toHaveLength(1);
    first.close();

    const heard = next(roomB, 'message');
    const second = newClient({ room });
    const roomA2 = await second.join(room, { name: 'ann', restore: saved });
    expect(await heard).toMatchObject({ from: roomA2.session, data: { text: 'last words' } });
    // Once: a marker published after it arrives next.
    const marker = next(roomB, 'message', (m) => m.event === 'marker');
    await roomA2.publish('marker');
    await marker;
    expect(seen).toEqual([{ text: 'last words' }, undefined]);
  });
});

describe('tickets', () => {
  it('a ticket string serves the first join; the resume goes by the resume token alone', async () => {
    const room = await createRoom();
    const res = await api('POST', `/v1/rooms/${room}/tickets`, { name: 'guest', platform: 'xr' });
    const client = newClient({ room });
    const handle = await client.join(room, { ticket: res.body.ticket as string });
    client._dropConnection();
    // The spent ticket again would be ticket_used: the session's name goes instead.
    const resumed = await next(handle, 'joined', (j) => j.resumed);
    expect(resumed.session).toBe(handle.session);
    expect(handle.members.find((m) => m.session === handle.session)).toMatchObject({ name: 'guest', platform: 'xr' });
  });
});

describe('ticket-only rooms', () => {
  it('fetch a fresh ticket for every join, so a resume works', async () => {
    const room = await createRoom({ options: { access: 'ticket' } });
    let fetched = 0;
    const ticket = async () => {
      fetched += 1;
      const res = await api('POST', `/v1/rooms/${room}/tickets`, { name: 'ann' });
      return res.body.ticket as string;
    };
    const client = newClient({ room });
    const handle = await client.join(room, { ticket });
    expect(fetched).toBe(1);
    const refused = await newClient({ room })
      .join(room, { name: 'eve' })
      .catch((e: unknown) => e);
    expect(refused).toMatchObject({ code: 'ticket_required' });

    client._dropConnection();
    const resumed = await next(handle, 'joined', (j) => j.resumed);
    expect(resumed.session).toBe(handle.session);
    expect(fetched).toBe(2);
  });

  it('a fresh ticket string passed with restore goes with that first join', async () => {
    const room = await createRoom({ options: { access: 'ticket' } });
    const ticket = async () => (await api('POST', `/v1/rooms/${room}/tickets`, { name: 'ann' })).body.ticket as string;
    const first = newClient({ room });
    const roomA = await first.join(room, { ticket: await ticket() });
    const saved = roomA.saveSession()!;
    first.close(); // like a page being unloaded
    // The next page: a saved session and a fresh ticket, which the ticket-only room wants.
    const second = newClient({ room });
    const roomA2 = await second.join(room, { ticket: await ticket(), restore: saved });
    expect(roomA2.session).toBe(saved.session);
  });

  it('a failed ticket fetch rejects the join', async () => {
    const room = await createRoom({ options: { access: 'ticket' } });
    const error = await newClient({ room })
      .join(room, {
        ticket: () => {
          throw new PlazaError('room_not_found', 'no ticket for you');
        },
      })
      .catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'room_not_found' });
  });
});

describe('saved policies', () => {
  it('a restored session knows and keeps its delivery policy, changed after the join', async () => {
    const room = await createRoom();
    const first = newClient({ room });
    const other = newClient({ room });
    const roomA = await first.join(room, { name: 'ann' });
    const roomB = await other.join(room, { name: 'bob' });
    // The policy is set after the join: only what the server confirmed is known.
    const policy = await roomA.updatePolicy({
      filters: [{ id: 'mine', field: 'topic', op: { equals: 'mine' } }],
      max_held: 100,
      max_delay_ms: 60_000,
    });
    const saved = JSON.parse(JSON.stringify(roomA.saveSession()));
    expect(saved.policy).toEqual(policy);

    const second = newClient({ room });
    const roomA2 = await second.join(room, { name: 'ann', restore: saved });
    expect(roomA2.session).toBe(roomA.session);
    expect(roomA2.deliveryPolicy).toEqual(policy);
    // And it is in force: a message of another topic is held until one of ann's topic comes,
    // and then arrives with it, flushed as one batch (without a policy: two plain events).
    const batch = next(roomA2, 'batch');
    await roomB.publish('held', null, { topic: 'other' });
    await roomB.publish('wanted', null, { topic: 'mine' });
    const events = (await batch).map((e) => (e.kind === 'message' ? e.event : e.kind));
    expect(events).toContain('held');
  });
});
