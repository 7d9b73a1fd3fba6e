// The client against the protocol's own examples (protocol/vectors, docs/protocol.md), which the
// server's tests check too: the frames this client sends carry the vectors' fields and no field
// the protocol does not show, every server vector goes through the client's real decoding path
// (a socket message, JSON, routing by room) and has the effect the client promises, and the
// client knows every documented error code. A vector added or changed on the server side fails
// here until the client follows.
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeEach, describe, expect, it, vi } from 'vitest';
import {
  CompactKeys,
  expandCompact,
  PlazaClient,
  PlazaError,
  SERVER_ERROR_CODES,
  type ClientFrame,
  type DeliveryPolicy,
  type HistoryRequest,
  type JoinOptions,
  type Json,
  type Movement,
  type Point,
  type PolicyUpdate,
  type RoomHandle,
  type WebSocketLike,
} from '../src/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');

interface Vector {
  name: string;
  frame: { [key: string]: Json };
  error?: string;
}

function vectors(side: 'client' | 'server'): Vector[] {
  const dir = join(root, 'protocol/vectors', side);
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => {
      const v = JSON.parse(readFileSync(join(dir, f), 'utf8')) as Omit<Vector, 'name'>;
      return { name: f.replace(/\.json$/, ''), ...v };
    });
}

function vector(side: 'client' | 'server', name: string): { [key: string]: Json } {
  const v = vectors(side).find((x) => x.name === name);
  if (!v) throw new Error(`no vector ${side}/${name}.json`);
  return structuredClone(v.frame);
}

/** The first column of a `## heading` table of docs/protocol.md, as the server's test reads it. */
function tableKeys(heading: string): string[] {
  const lines = readFileSync(join(root, 'docs/protocol.md'), 'utf8').split('\n');
  const start = lines.findIndex((l) => l.trim() === `## ${heading}`);
  if (start < 0) throw new Error(`docs/protocol.md has no "## ${heading}"`);
  const rows: string[] = [];
  for (const l of lines.slice(start + 1)) {
    if (l.startsWith('## ')) break;
    if (l.startsWith('|')) rows.push(l.split('|')[1]!.trim().replace(/`/g, ''));
  }
  return rows.slice(2);
}

/** A socket that records what the client sends and hands it frames as the server would. */
class FakeSocket implements WebSocketLike {
  static last: FakeSocket | undefined;
  /** Resolves with the next socket the client opens. */
  static nextOpened(): Promise<FakeSocket> {
    return new Promise((resolve) => (FakeSocket.onCreated = resolve));
  }
  private static onCreated: ((socket: FakeSocket) => void) | undefined;
  readyState = 0;
  readonly sent: ClientFrame[] = [];
  onopen: ((ev: never) => void) | null = null;
  onclose: ((ev: never) => void) | null = null;
  onerror: ((ev: never) => void) | null = null;
  onmessage: ((ev: { data: unknown }) => void) | null = null;
  constructor(
    readonly url: string,
    readonly protocols?: string[],
  ) {
    FakeSocket.last = this;
    FakeSocket.onCreated?.(this);
    FakeSocket.onCreated = undefined;
  }
  send(data: string): void {
    this.sent.push(JSON.parse(data) as ClientFrame);
  }
  close(): void {
    this.readyState = 3;
  }
  open(): void {
    this.readyState = 1;
    this.onopen?.(undefined as never);
  }
  /** A frame from the server, as text on the wire. */
  deliver(frame: { [key: string]: Json } | Json[]): void {
    this.onmessage?.({ data: JSON.stringify(frame) });
  }
  lastSent(): { [key: string]: Json } {
    return this.sent[this.sent.length - 1] as unknown as { [key: string]: Json };
  }
}

const ROOM = 'lobby';

/**
 * A client joined to the vectors' room with `joined.json`, at seq 1 so that the other
 * vectors' events and acks come after it (`null`: at the vector's own seq).
 */
async function joinedClient(
  options: JoinOptions = { name: 'ann' },
  seq: number | null = 1,
  joinedVector = 'joined',
) {
  const client = new PlazaClient('ws://plaza.test/v1/ws', { WebSocket: FakeSocket, reconnect: false });
  const joining = client.join(ROOM, options);
  const socket = FakeSocket.last!;
  socket.open();
  await Promise.resolve();
  const join = socket.lastSent();
  const joined = vector('server', joinedVector);
  socket.deliver(seq === null ? joined : { ...joined, seq });
  const room = await joining;
  // The handle holds what follows `joined` until the next macrotask (for handlers attached
  // after `await join()`); the frames below are delivered synchronously, so that task passes first.
  await new Promise((resolve) => setImmediate(resolve));
  return { client, socket, room, join };
}

/** Keys of every client vector of a frame type: the fields the protocol shows for it. */
function documentedKeys(type: string): Set<string> {
  const keys = new Set<string>();
  for (const v of vectors('client')) {
    if (v.error === undefined && v.frame['type'] === type) for (const k of Object.keys(v.frame)) keys.add(k);
  }
  return keys;
}

/** The client's frame carries the vector's fields (values as given) and only documented ones. */
function expectLike(sent: { [key: string]: Json }, expected: { [key: string]: Json }): void {
  expect(sent).toMatchObject(expected);
  const allowed = documentedKeys(String(expected['type']));
  for (const key of Object.keys(sent)) expect(allowed, `field ${key} of a ${String(expected['type'])}`).toContain(key);
}

/** Sends a request through `call`, answers it with server vector `response` (its nonce echoed). */
async function answered<T>(socket: FakeSocket, call: () => Promise<T>, response: string): Promise<T> {
  const outcome = call();
  await settled();
  const sent = socket.lastSent();
  expect(sent['type']).toBe('request');
  socket.deliver({ ...vector('server', response), nonce: sent['nonce']! });
  return outcome;
}

/** Lets the client finish what it does before sending (some calls resolve ids first). */
function settled(): Promise<void> {
  return new Promise((r) => setTimeout(r, 0));
}

beforeEach(() => {
  FakeSocket.last = undefined;
});

describe('error codes', () => {
  it('the client knows every code of the error table, in its order', () => {
    expect([...SERVER_ERROR_CODES]).toEqual(tableKeys('Error codes'));
  });

  it('every error a vector shows is one of them', () => {
    const known = new Set<string>(SERVER_ERROR_CODES);
    const shown = [
      ...vectors('client').flatMap((v) => (v.error === undefined ? [] : [v.error])),
      ...vectors('server').flatMap((v) => {
        const error = v.frame['error'] as { code?: string } | undefined;
        const code = v.frame['type'] === 'error' ? v.frame['code'] : error?.code;
        return typeof code === 'string' ? [code] : [];
      }),
    ];
    expect(shown.length).toBeGreaterThan(5);
    for (const code of shown) expect(known, code).toContain(code);
  });
});

/** How the client produces the frame of each valid client vector. */
const clientFrames: { [name: string]: (expected: { [key: string]: Json }) => Promise<{ [key: string]: Json }> } = {
  async join(f) {
    const { join } = await joinedClient({ name: f['name'] as string, platform: f['platform'] as string, channels: f['channels'] as string[] });
    return join;
  },
  async 'join-policy'(f) {
    const { join, room } = await joinedClient({ name: f['name'] as string, policy: f['policy'] as DeliveryPolicy });
    expect(room.deliveryPolicy).toEqual(f['policy']);
    return join;
  },
  async 'join-history'(f) {
    const { join, room } = await joinedClient({ name: f['name'] as string, history: f['history'] as HistoryRequest });
    // joined.json carries no history: none is claimed.
    expect(room.history).toBeUndefined();
    return join;
  },
  async 'join-ticket'(f) {
    const { join } = await joinedClient({ ticket: f['ticket'] as string });
    return join;
  },
  async 'join-resume'(f) {
    const resume = f['resume'] as { token: string; last_seq: number };
    const client = new PlazaClient('ws://plaza.test/v1/ws', { WebSocket: FakeSocket, reconnect: { initialMs: 1, maxMs: 1 } });
    const joining = client.join(ROOM, { name: f['name'] as string, platform: f['platform'] as string, channels: f['channels'] as string[] });
    const first = FakeSocket.last!;
    first.open();
    first.deliver({ ...vector('server', 'joined'), resume_token: resume.token, seq: resume.last_seq });
    await joining;
    // The connection drops; the client reconnects and resumes.
    const reopened = FakeSocket.nextOpened();
    first.readyState = 3;
    first.onclose?.(undefined as never);
    const second = await reopened;
    expect(second).not.toBe(first);
    second.open();
    await Promise.resolve();
    const frame = second.lastSent();
    client.close();
    return frame;
  },
  async publish(f) {
    const { socket, room } = await joinedClient();
    void room.publish(f['event'] as string, f['data'], {
      channel: f['channel'] as string,
      topic: f['topic'] as string,
      replyTo: f['reply_to'] as number,
      echo: f['echo'] as boolean,
    });
    const sent = socket.lastSent();
    expect(typeof sent['id']).toBe('string');
    return { ...sent, id: f['id']! };
  },
  async 'publish-minimal'(f) {
    const { socket, room } = await joinedClient();
    void room.publish(f['event'] as string, f['data']);
    return socket.lastSent();
  },
  async direct(f) {
    const { socket, room } = await joinedClient();
    room.direct(f['to'] as string, f['event'] as string, f['data']);
    return socket.lastSent();
  },
  async leave() {
    const { socket, room } = await joinedClient();
    void room.leave();
    return socket.lastSent();
  },
  async ping(f) {
    const { socket, client } = await joinedClient();
    client.ping(f['ts'] as number);
    return socket.lastSent();
  },
  async auth(f) {
    // A refresh: before the token from `authed` expires, the fresh one goes in `auth`.
    vi.useFakeTimers();
    try {
      const client = new PlazaClient('ws://plaza.test/v1/ws', {
        WebSocket: FakeSocket,
        reconnect: false,
        token: () => f['token'] as string,
      });
      const opened = FakeSocket.nextOpened();
      void client.connect();
      const socket = await opened;
      expect(new URL(socket.url).searchParams.get('token')).toBe(f['token']);
      socket.open();
      socket.deliver({ ...vector('server', 'authed'), expires_at: Date.now() + 10_000 });
      await vi.advanceTimersByTimeAsync(8_000);
      client.close();
      return socket.lastSent();
    } finally {
      vi.useRealTimers();
    }
  },
};

/** Request vectors: the typed call that sends each operation. */
const requestCalls: { [op: string]: (room: RoomHandle, args: { [key: string]: Json }) => Promise<unknown> } = {
  'entity.create': (room, a) => room.createEntity(a['kind'] as string, a['data']),
  'entity.set': (room, a) => room.setEntity(a['id'] as string, a['data']!, { version: a['version'] as number }),
  'entity.patch': (room, a) =>
    room.patchEntity(a['id'] as string, a['data'] as { [key: string]: Json }, { version: a['version'] as number }),
  'entity.delete': (room, a) => room.deleteEntity(a['id'] as string, { version: a['version'] as number }),
  'lock.acquire': (room, a) => room.acquireLock(a['object'] as string, { ttlMs: a['ttl_ms'] as number }),
  'lock.renew': (room, a) => room.renewLock(a['object'] as string, { ttlMs: a['ttl_ms'] as number }),
  'lock.release': (room, a) => room.releaseLock(a['object'] as string),
  'channel.subscribe': (room, a) => room.subscribe(a['channel'] as string),
  'channel.unsubscribe': (room, a) => room.unsubscribe(a['channel'] as string),
  'space.move': (room, a) => room.moveTo(a['to'] as Point, a['speed'] as number),
  'space.jump': (room, a) => room.jumpTo(a['to'] as Point),
  'policy.update': (room, a) => room.updatePolicy(a as PolicyUpdate),
  'policy.clear': (room) => room.clearPolicy(),
};

describe('client frames', () => {
  for (const v of vectors('client').filter((x) => x.error === undefined)) {
    it(`${v.name}: the client sends it so`, async () => {
      if (v.frame['type'] === 'request') {
        const op = v.frame['op'] as string;
        const call = requestCalls[op];
        expect(call, `no typed call for ${op}`).toBeDefined();
        const { socket, room } = await joinedClient();
        void call!(room, v.frame['args'] as { [key: string]: Json }).catch(() => undefined);
        await settled();
        const sent = socket.lastSent();
        expect(typeof sent['nonce']).toBe('number');
        expectLike({ ...sent, nonce: v.frame['nonce']! }, v.frame);
        return;
      }
      const build = clientFrames[v.name];
      expect(build, `no builder for client/${v.name}.json`).toBeDefined();
      expectLike(await build!(v.frame), v.frame);
    });
  }
});

/** How each server vector is fed to a joined client, and what it must do there. */
const serverFrames: { [name: string]: (frame: { [key: string]: Json }) => Promise<void> } = {
  async joined(f) {
    const { room } = await joinedClient({ name: 'ann' }, null);
    expect(room.session).toBe(f['session']);
    expect(room.lastSeq).toBe(f['seq']);
    expect(room.members).toEqual(f['members']);
    expect(room.channels).toEqual(f['channels']);
    expect(room.state.entities()).toEqual((f['snapshot'] as { entities: Json[] }).entities);
  },
  async 'joined-compact'(f) {
    // A joined with a key: the room is joined as with any other, and its messages read by it.
    const { socket, room } = await joinedClient({ name: 'ann' }, null, 'joined-compact');
    expect(room.session).toBe(f['session']);
    expect(room.lastSeq).toBe(f['seq']);
    const key = f['compact'] as { alias: number; ts_base: number };
    const events: unknown[] = [];
    room.on('event', (e) => events.push(e));
    socket.deliver([key.alias, 43, 5, 'x', 'e', null]);
    expect(events).toMatchObject([{ room: ROOM, seq: 43, ts: key.ts_base + 5 }]);
  },
  async 'joined-history'(f) {
    const client = new PlazaClient('ws://plaza.test/v1/ws', { WebSocket: FakeSocket, reconnect: false });
    const joining = client.join(ROOM, { name: 'ann', history: { last: 100 } });
    const socket = FakeSocket.last!;
    socket.open();
    await Promise.resolve();
    expect(socket.lastSent()['history']).toEqual({ last: 100 });
    socket.deliver(f);
    const room = await joining;
    const history = f['history'] as { events: { [key: string]: Json }[]; complete: boolean };
    expect(room.history).toEqual({ ...history, events: history.events.map((e) => ({ channel: 'main', ...e })) });
    expect(room.history!.events.every((e) => e.channel === 'main')).toBe(true);
    // Past messages are not live events: last_seq is the joined seq.
    expect(room.lastSeq).toBe(f['seq']);
  },
  async 'joined-resumed'(f) {
    const { socket, room } = await joinedClient();
    const before = room.lastSeq;
    socket.deliver(f);
    expect(room.session).toBe(f['session']);
    // The missed events follow a resumed `joined`: last_seq stays until they come.
    expect(room.lastSeq).toBe(before);
    expect(room.live).toBe(true);
  },
  async resync(f) {
    const { socket, room } = await joinedClient();
    const resynced = new Promise((r) => room.on('resync', r));
    socket.deliver(f);
    expect(await resynced).toEqual(f);
    expect(room.lastSeq).toBe(f['seq']);
  },
  async left() {
    const { socket, room } = await joinedClient();
    const leaving = room.leave();
    socket.deliver(vector('server', 'left'));
    await leaving;
  },
  async closed(f) {
    const { socket, room } = await joinedClient();
    const closed = new Promise((r) => room.on('closed', r));
    socket.deliver(f);
    expect(await closed).toEqual({ reason: f['reason'] });
    expect(room.live).toBe(false);
  },
  async 'closed-kicked'(f) {
    // The admin's words reach the app; the room is over.
    const { socket, room, client } = await joinedClient();
    const closed = new Promise((r) => room.on('closed', r));
    socket.deliver(f);
    expect(await closed).toEqual({ reason: 'kicked', message: f['message'] });
    expect(room.live).toBe(false);
    expect(client.room(ROOM)).toBeUndefined();
  },
  async ack(f) {
    const { socket, room } = await joinedClient();
    const ack = room.publish('chat', { text: 'hi' });
    socket.deliver({ ...f, id: socket.lastSent()['id']! });
    expect(await ack).toEqual({ seq: f['seq'], duplicate: f['duplicate'] === true });
    expect(room.lastSeq).toBe(f['seq']);
  },
  async direct(f) {
    const { socket, room } = await joinedClient();
    const got = new Promise((r) => room.on('direct', r));
    socket.deliver(f);
    expect(await got).toEqual(f);
  },
  async error(f) {
    // A refused publish: the publish with that id rejects with the code.
    const { socket, room } = await joinedClient();
    const publishing = room.publish('chat', null).catch((e: unknown) => e);
    const ref = f['ref'] as { [key: string]: Json };
    socket.deliver({ ...f, ref: { ...ref, id: socket.lastSent()['id']! } });
    const error = await publishing;
    expect(error).toBeInstanceOf(PlazaError);
    expect(error).toMatchObject({ code: f['code'], message: f['message'] });
  },
  async 'error-forbidden'(f) {
    // Like any refused publish.
    await serverFrames['error']!(f);
  },
  async authed(f) {
    const { socket, client } = await joinedClient();
    const got = new Promise((r) => client.on('authed', r));
    socket.deliver(f);
    const identity = { user: f['user'], name: f['name'], expiresAt: f['expires_at'] };
    expect(await got).toEqual(identity);
    expect(client.identity).toEqual(identity);
  },
  async 'error-rate-limited'(f) {
    // About no room: the client itself reports it.
    const { socket, client } = await joinedClient();
    const got = new Promise((r) => client.on('error', r));
    socket.deliver(f);
    expect(await got).toMatchObject({ code: f['code'], message: f['message'] });
  },
  async batch(f) {
    // Each event as if it had come alone, in order, then the boundary with all of them.
    const { socket, room } = await joinedClient();
    const seen: string[] = [];
    room.on('event', (e) => seen.push(`event ${e.seq}`));
    room.on('message', (m) => seen.push(`message ${m.seq} on ${m.channel}`));
    room.on('batch', (events) => seen.push(`batch ${events.map((e) => e.seq).join(',')}`));
    socket.deliver(f);
    const events = f['events'] as { seq: number }[];
    expect(seen).toEqual([
      // Messages on `main` do not name it; the client fills it in.
      ...events.flatMap((e) => [`event ${e.seq}`, `message ${e.seq} on main`]),
      `batch ${events.map((e) => e.seq).join(',')}`,
    ]);
    expect(room.lastSeq).toBe(events[events.length - 1]!.seq);
  },

  async pong(f) {
    // Answers the client's ping; nothing else happens (no error, no room event).
    const { socket, client, room } = await joinedClient();
    const seen: unknown[] = [];
    client.on('error', (e) => seen.push(e));
    room.on('event', (e) => seen.push(e));
    socket.deliver(f);
    expect(seen).toEqual([]);
  },
};

/** Events: applied in seq order, with the effect each kind has on the handle. */
async function checkEvent(f: { [key: string]: Json }): Promise<void> {
  const { socket, room } = await joinedClient();
  const events: unknown[] = [];
  room.on('event', (e) => events.push(e));
  // A removal must find its subject first.
  const kind = f['kind'] as string;
  if (kind === 'entity.updated' || kind === 'entity.deleted') {
    const id = kind === 'entity.deleted' ? (f['id'] as string) : (f['entity'] as { id: string }).id;
    socket.deliver({ ...vector('server', 'event-entity-created'), seq: (f['seq'] as number) - 1, entity: { id, data: null, version: 1 } });
  }
  if (kind === 'presence.leave') {
    socket.deliver({ ...vector('server', 'event-presence-join'), seq: (f['seq'] as number) - 1, member: { session: f['session']!, name: 'x', platform: 'browser' } });
  }
  if (kind === 'interest.leave') {
    const movement = { from: [1, 1], to: [1, 1], t0: 0, speed: 0 };
    socket.deliver({
      ...vector('server', 'event-interest-enter'),
      seq: (f['seq'] as number) - 1,
      movements: { [f['a'] as string]: movement, [f['b'] as string]: movement },
    });
  }
  if (kind === 'proximity.leave') {
    socket.deliver({ ...vector('server', 'event-proximity-enter'), seq: (f['seq'] as number) - 1, pair: f['pair']! });
  }
  if (kind === 'lock.released') {
    socket.deliver({
      ...vector('server', 'event-lock-acquired'),
      seq: (f['seq'] as number) - 1,
      lock: { object: f['object']!, owner: f['owner']!, token: f['token']!, expires_at: 1 },
    });
  }
  events.length = 0;
  socket.deliver(f);
  // A message on `main` does not name its channel; the client fills it in.
  expect(events).toEqual([kind === 'message' ? { channel: 'main', ...f } : f]);
  expect(room.lastSeq).toBe(f['seq']);
  switch (kind) {
    case 'message':
      break;
    case 'presence.join':
      expect(room.members).toContainEqual(f['member']);
      break;
    case 'presence.leave':
      expect(room.members.map((m) => m.session)).not.toContain(f['session']);
      break;
    case 'entity.created':
    case 'entity.updated': {
      const entity = f['entity'] as { id: string };
      expect(room.state.entity(entity.id)).toEqual(entity);
      break;
    }
    case 'entity.deleted':
      expect(room.state.entity(f['id'] as string)).toBeUndefined();
      break;
    case 'lock.acquired': {
      const lock = f['lock'] as { object: string };
      expect(room.state.lock(lock.object)).toEqual(lock);
      break;
    }
    case 'lock.released':
      expect(room.state.lock(f['object'] as string)).toBeUndefined();
      break;
    case 'space.moved': {
      const m = f['movement'] as unknown as Movement;
      expect(room.movements.get(f['session'] as string)).toEqual(m);
      expect(room.positionOf(f['session'] as string, m.t0)).toEqual(m.from);
      expect(room.positionOf(f['session'] as string, m.t0 + 3_600_000)).toEqual(m.to);
      break;
    }
    case 'interest.enter':
      for (const [session, m] of Object.entries(f['movements'] as { [s: string]: Json })) {
        expect(room.movements.get(session)).toEqual(m);
      }
      break;
    case 'interest.leave': {
      // The joined member is one of the pair: it stops tracking the other.
      const other = f['a'] === room.session ? (f['b'] as string) : (f['a'] as string);
      expect(room.movements.has(other)).toBe(false);
      break;
    }
    case 'proximity.enter':
      expect(room.proximityPairs.get(f['pair'] as number)).toEqual({
        pair: f['pair'],
        a: f['a'],
        b: f['b'],
        initiator: f['initiator'],
      });
      break;
    case 'proximity.leave':
      expect(room.proximityPairs.has(f['pair'] as number)).toBe(false);
      break;
    default:
      throw new Error(`the client has no handling for event kind ${kind}`);
  }
}

/** Responses: answered to the typed call of their operation, which resolves with its result. */
async function checkResponse(name: string, f: { [key: string]: Json }): Promise<void> {
  const { socket, room } = await joinedClient();
  if (f['ok'] === false) {
    const error = await answered(socket, () => room.setEntity('e7', { x: 1 }, { version: 1 }).catch((e: unknown) => e), name);
    const body = f['error'] as { code: string; message: string };
    expect(error).toBeInstanceOf(PlazaError);
    expect(error).toMatchObject(body);
    return;
  }
  const result = f['result'] as { [key: string]: Json };
  const op = name.replace(/^response-/, '').replace('-', '.');
  const call = requestCalls[op];
  expect(call, `no typed call for ${op}`).toBeDefined();
  const args: { [key: string]: Json } = { id: 'e7', object: 'e7', channel: 'cursors', data: { x: 1 } };
  const value = await answered(socket, () => call!(room, args), name);
  if ('entity' in result && op !== 'entity.delete') expect(value).toEqual(result['entity']);
  if ('lock' in result) expect(value).toEqual(result['lock']);
  if ('channels' in result) expect(value).toEqual(result['channels']);
  if ('policy' in result) {
    expect(room.deliveryPolicy ?? null).toEqual(result['policy']);
    if (result['policy'] !== null) expect(value).toEqual(result['policy']);
  }
  if ('movement' in result) {
    expect(value).toEqual(result['movement']);
    expect(room.movements.get(room.session!)).toEqual(result['movement']);
  }
  if (typeof result['seq'] === 'number') expect(room.lastSeq).toBe(result['seq']);
}

describe('server frames', () => {
  for (const v of vectors('server')) {
    it(`${v.name}: the client reads it`, async () => {
      if (v.frame['type'] === 'event') return checkEvent(v.frame);
      if (v.frame['type'] === 'response') return checkResponse(v.name, v.frame);
      const check = serverFrames[v.name] ?? (v.name.startsWith('ack') ? serverFrames['ack'] : undefined);
      expect(check, `no check for server/${v.name}.json`).toBeDefined();
      await check!(v.frame);
    });
  }
});

interface CompactVector {
  name: string;
  v1: string;
  frame: Json[];
}

describe('compact messages (protocol/vectors/compact)', () => {
  const dir = join(root, 'protocol/vectors/compact');
  const compact: CompactVector[] = readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({ name: f.replace(/\.json$/, ''), ...(JSON.parse(readFileSync(join(dir, f), 'utf8')) as Omit<CompactVector, 'name'>) }));

  it('offers plaza.v1.compact over WebSocket unless told json', async () => {
    const { socket } = await joinedClient();
    expect(socket.protocols).toEqual(['plaza.v1.compact']);
    const json = new PlazaClient('ws://plaza.test/v1/ws', { WebSocket: FakeSocket, reconnect: false, encoding: 'json' });
    void json.join(ROOM, { name: 'ann' }).catch(() => undefined);
    expect(FakeSocket.last!.protocols).toBeUndefined();
    json.close();
  });

  it('has vectors', () => expect(compact.length).toBeGreaterThan(0));

  for (const v of compact) {
    it(`${v.name}: the client reads it as ${v.v1}`, async () => {
      const v1 = vector('server', v.v1.replace(/^server\//, '').replace(/\.json$/, ''));
      // Every compact vector is a message of the room joined-compact.json gives the key of.
      const { socket, room } = await joinedClient({ name: 'ann' }, 1, 'joined-compact');
      const events: unknown[] = [];
      room.on('event', (e) => events.push(e));
      socket.deliver(v.frame);
      expect(events).toEqual([{ channel: 'main', ...v1 }]);
      expect(room.lastSeq).toBe(v1['seq']);
    });
  }

  it('ignores arrays of another shape, and of an alias no joined gave', async () => {
    const { socket, room } = await joinedClient({ name: 'ann' }, 1, 'joined-compact');
    const events: unknown[] = [];
    room.on('event', (e) => events.push(e));
    const bad: Json[][] = [[], [3, 2, 3], [3, '2', 3, 'x', 'e', null], [3, 2, 3, 'x', 'e', null, 5], [4, 2, 3, 'x', 'e', null], [ROOM, 2, 3, 'x', 'e', null]];
    for (const b of bad) socket.deliver(b);
    expect(events).toEqual([]);
    // The same frame under the joined's alias is read.
    socket.deliver([3, 2, 3, 'x', 'e', null]);
    expect(events).toEqual([{ type: 'event', room: ROOM, seq: 2, ts: 1732312400003, from: 'x', kind: 'message', channel: 'main', event: 'e' }]);
  });

  it('reads a message by the key of the last joined of its room', async () => {
    const keys = new CompactKeys();
    keys.learn('a', { alias: 1, ts_base: 1000 });
    keys.learn('b', { alias: 2, ts_base: 2000 });
    expect(expandCompact([1, 5, 7, null, 'e', null], keys)).toMatchObject({ room: 'a', seq: 5, ts: 1007 });
    expect(expandCompact([2, 5, -7, null, 'e', null], keys)).toMatchObject({ room: 'b', ts: 1993 });
    // Room a resumed elsewhere: its new key replaces the old, which now names nothing.
    keys.learn('a', { alias: 9, ts_base: 5000 });
    expect(expandCompact([1, 6, 7, null, 'e', null], keys)).toBeUndefined();
    expect(expandCompact([9, 6, 7, null, 'e', null], keys)).toMatchObject({ room: 'a', ts: 5007 });
    // An alias given to another room now names that room.
    keys.learn('c', { alias: 2, ts_base: 0 });
    expect(expandCompact([2, 1, 7, null, 'e', null], keys)).toMatchObject({ room: 'c', ts: 7 });
    // A room left or closed: its alias names nothing until a joined gives it again.
    keys.forget('c');
    expect(expandCompact([2, 1, 7, null, 'e', null], keys)).toBeUndefined();
    expect(expandCompact([9, 6, 7, null, 'e', null], keys)).toMatchObject({ room: 'a' });
  });
});
