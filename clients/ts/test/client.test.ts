import { describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { CompactKeys, expandCompact, PlazaError, type JoinedFrame, type Json, type MessageEvent, type PublishAck } from '../src/index.js';
import { gate, newClient, next, uniqueRoom } from './helpers.js';

async function twoMembers(room = uniqueRoom()) {
  const a = newClient({ room });
  const b = newClient({ room });
  const roomA = await a.join(room, { name: 'ann' });
  const roomB = await b.join(room, { name: 'bob', platform: 'xr' });
  return { a, b, roomA, roomB, room };
}

describe('join and publish', () => {
  it('delivers a publish to the other member with the acknowledged seq', async () => {
    const { roomA, roomB } = await twoMembers();
    expect(roomA.session).toMatch(/^[A-Za-z0-9_-]{11}$/);
    expect(roomB.members.map((m) => m.name).sort()).toEqual(['ann', 'bob']);

    const received = next(roomB, 'message');
    const ack = await roomA.publish('chat', { text: 'hi all' }, { topic: 'thread-1' });
    const message = await received;

    expect(ack.duplicate).toBe(false);
    expect(message).toMatchObject({
      kind: 'message',
      seq: ack.seq,
      from: roomA.session,
      channel: 'main',
      event: 'chat',
      data: { text: 'hi all' },
      topic: 'thread-1',
    });
    expect(roomA.lastSeq).toBe(ack.seq);
    expect(roomB.lastSeq).toBe(ack.seq);
  });

  it('rejects a join the server refuses with a PlazaError', async () => {
    const client = newClient();
    const error = await client.join('not a valid id!', { name: 'ann' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PlazaError);
    expect(error).toMatchObject({ code: 'invalid_request' });
  });
});

describe('encodings', () => {
  /** A `ws` socket that keeps the raw text of what it receives and the subprotocol chosen. */
  function recording(into: { frames: string[]; protocol?: string }) {
    return class extends WebSocket {
      constructor(url: string, protocols?: string[]) {
        super(url, protocols);
        this.on('open', () => (into.protocol = this.protocol));
        this.on('message', (data: Buffer) => into.frames.push(data.toString()));
      }
    };
  }

  it('gets messages as compact arrays by default and as v1 objects with json, the same events either way', async () => {
    const room = uniqueRoom();
    const compactWire: { frames: string[]; protocol?: string } = { frames: [] };
    const jsonWire: { frames: string[]; protocol?: string } = { frames: [] };
    const sender = newClient({ room });
    const compact = newClient({ room, WebSocket: recording(compactWire) });
    const json = newClient({ room, WebSocket: recording(jsonWire), encoding: 'json' });
    const roomS = await sender.join(room, { name: 'ann' });
    const roomC = await compact.join(room, { name: 'bob' });
    const roomJ = await json.join(room, { name: 'cid' });
    expect(compactWire.protocol).toBe('plaza.v1.compact');
    expect(jsonWire.protocol).toBe('');
    const gotC = next(roomC, 'message');
    const gotJ = next(roomJ, 'message');
    const ack = await roomS.publish('chat', { text: 'hi' }, { topic: 't' });
    const [c, j] = await Promise.all([gotC, gotJ]);
    expect(c).toEqual(j);
    expect(c).toMatchObject({ seq: ack.seq, channel: 'main', event: 'chat', data: { text: 'hi' }, topic: 't' });
    const rawC = compactWire.frames.find((f) => f.startsWith('['));
    const array = JSON.parse(rawC!) as Json[];
    const joined = JSON.parse(compactWire.frames.find((f) => f.startsWith('{"type":"joined"'))!) as JoinedFrame;
    const key = joined.compact!;
    expect(typeof key.alias).toBe('number');
    expect(array.slice(0, 6)).toEqual([key.alias, ack.seq, c.ts - key.ts_base, roomS.session, 'chat', { text: 'hi' }]);
    expect(array[6]).toMatchObject({ topic: 't' });
    const keys = new CompactKeys();
    keys.learn(room, key);
    expect(expandCompact(array, keys)).toEqual(c);
    // A v1 client's joined has no key.
    const joinedJ = JSON.parse(jsonWire.frames.find((f) => f.startsWith('{"type":"joined"'))!) as JoinedFrame;
    expect(joinedJ.compact).toBeUndefined();
    expect(jsonWire.frames.some((f) => f.startsWith('['))).toBe(false);
    // Everything but messages is v1 on both.
    expect(compactWire.frames.filter((f) => !f.startsWith('[')).every((f) => f.startsWith('{'))).toBe(true);
  });
});

describe('requests', () => {
  it('grants a lock to one member and refuses it to another with lock_held', async () => {
    const { roomA, roomB } = await twoMembers();
    const lockEvent = next(roomB, 'lock');
    const granted = await roomA.request<{ lock: { owner: string; object: string }; seq: number }>(
      'lock.acquire',
      { object: 'e1', ttl_ms: 10_000 },
    );
    expect(granted.lock).toMatchObject({ object: 'e1', owner: roomA.session });
    expect(await lockEvent).toMatchObject({ kind: 'lock.acquired', seq: granted.seq });

    const refused = await roomB.request('lock.acquire', { object: 'e1' }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(PlazaError);
    expect(refused).toMatchObject({ code: 'lock_held' });
  });

  it('rejects a request that gets no response with a timeout error', async () => {
    const room = uniqueRoom();
    const client = newClient({ room });
    const handle = await client.join(room, { name: 'ann' });
    // Keep the connection down so the request cannot be answered.
    const held = gate();
    client._dropConnection(held.promise);
    const error = await handle.request('lock.acquire', { object: 'x' }, { timeoutMs: 50 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(PlazaError);
    expect(error).toMatchObject({ code: 'timeout' });

    // The timed-out request is not sent after the resume; the room works again.
    held.open();
    await next(handle, 'joined', (j) => j.resumed);
    const ok = await handle.request('lock.acquire', { object: 'x' });
    expect(ok).toHaveProperty('lock');
  });
});

describe('direct', () => {
  it('delivers a direct message to the addressed session', async () => {
    const { roomA, roomB } = await twoMembers();
    const received = next(roomB, 'direct');
    roomA.direct(roomB.session!, 'rtc.offer', { sdp: 'v=0' });
    expect(await received).toMatchObject({ from: roomA.session, event: 'rtc.offer', data: { sdp: 'v=0' } });
  });
});

describe('reconnect and resume', () => {
  /**
   * A `ws` socket whose end the test can make look like a close by the server with `code`
   * (4005 needs a cluster whose broker fails over): the connection is cut, as the server does
   * after its Close, and the close event carries `code`.
   */
  function closable(into: { sockets: Array<{ closeAs(code: number): void }> }) {
    return class extends WebSocket {
      private forced: number | undefined;
      constructor(url: string, protocols?: string[]) {
        super(url, protocols);
        into.sockets.push(this);
      }
      closeAs(code: number): void {
        this.forced = code;
        this.terminate();
      }
      override emit(event: string | symbol, ...args: any[]): boolean {
        if (event === 'close' && this.forced !== undefined) args[0] = this.forced;
        return super.emit(event, ...args);
      }
    };
  }

  it('joins afresh, without resuming, after close code 4005 and tells the app with a resync', async () => {
    const room = uniqueRoom();
    const into: { sockets: Array<{ closeAs(code: number): void }> } = { sockets: [] };
    const a = newClient({ room, WebSocket: closable(into) });
    const b = newClient({ room });
    const roomA = await a.join(room, { name: 'ann' });
    const roomB = await b.join(room, { name: 'bob' });
    const before = roomA.session!;
    await roomA.publish('chat', { n: 1 });
    const joined: boolean[] = [];
    roomA.on('joined', (j) => joined.push(j.resumed));

    const resync = next(roomA, 'resync');
    const fresh = next(roomB, 'presence', (p) => p.kind === 'presence.join' && p.member.session !== before);
    into.sockets[0]!.closeAs(4005);
    const frame = await resync;
    // A new session: the old one was not resumed (a resume keeps the session id).
    expect(frame).toMatchObject({ type: 'resync', reason: 'history_rewritten', resumed: false });
    expect(frame.session).not.toBe(before);
    expect(roomA.session).toBe(frame.session);
    expect(roomA.lastSeq).toBe(frame.seq);
    await fresh;
    expect(joined).toEqual([]);

    // The room goes on as usual; a later drop resumes the new session.
    const seen = next(roomB, 'message', (m) => m.event === 'after');
    const ack = await roomA.publish('after');
    expect((await seen).seq).toBe(ack.seq);
    const resumed = next(roomA, 'joined', (j) => j.resumed);
    a._dropConnection();
    expect(await resumed).toMatchObject({ resumed: true, session: frame.session });
  });

  it('replays exactly the events missed while disconnected, in order, once', async () => {
    const { a, roomA, roomB } = await twoMembers();
    const seen: MessageEvent[] = [];
    roomA.on('message', (m) => seen.push(m));
    const states: string[] = [];
    a.on('state', (s) => states.push(s));

    const held = gate();
    const left = next(roomB, 'presence', (p) => p.kind === 'presence.leave' && p.session === roomA.session);
    a._dropConnection(held.promise);
    expect(await left).toMatchObject({ reason: 'disconnected' });

    const acks: PublishAck[] = [];
    for (const n of [1, 2, 3]) acks.push(await roomB.publish('chat', { n }));

    const resumed = next(roomA, 'joined', (j) => j.resumed);
    const third = next(roomA, 'message', (m) => m.seq === acks[2]!.seq);
    held.open();
    expect(await resumed).toMatchObject({ resumed: true, session: roomA.session });
    await third;
    expect(seen.map((m) => [m.seq, m.data])).toEqual(acks.map((ack, i) => [ack.seq, { n: i + 1 }]));

    // Nothing is delivered twice: the next live message follows directly.
    const marker = next(roomA, 'message', (m) => m.event === 'marker');
    const markerAck = await roomB.publish('marker');
    await marker;
    expect(seen.map((m) => m.seq)).toEqual([...acks.map((ack) => ack.seq), markerAck.seq]);
    expect(states).toEqual(['reconnecting', 'open']);
  });

  it('delivers publishes made around a drop exactly once after the resume', async () => {
    const { a, roomA, roomB } = await twoMembers();
    const seen: MessageEvent[] = [];
    roomB.on('message', (m) => seen.push(m));

    const held = gate();
    // In flight when the socket drops: the server orders it, the ack is lost.
    const inFlight = roomA.publish('chat', { n: 'in-flight' });
    a._dropConnection(held.promise);
    // Made while disconnected: queued until the resume.
    const offline = roomA.publish('chat', { n: 'offline' });
    expect(a.state).toBe('reconnecting');

    held.open();
    const [ackInFlight, ackOffline] = await Promise.all([inFlight, offline]);
    expect(ackInFlight.duplicate).toBe(true);
    expect(ackOffline.duplicate).toBe(false);
    expect(ackOffline.seq).toBeGreaterThan(ackInFlight.seq);

    const marker = next(roomB, 'message', (m) => m.event === 'marker');
    await roomA.publish('marker');
    await marker;
    expect(seen.map((m) => [m.seq, m.data])).toEqual([
      [ackInFlight.seq, { n: 'in-flight' }],
      [ackOffline.seq, { n: 'offline' }],
      [expect.any(Number), undefined],
    ]);
  });
});
