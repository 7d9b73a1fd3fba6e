// @plaza/client/server against a real plaza with an api_key (and token keys, so that members
// have users): every call once, checked against what a WebSocket member receives; the errors;
// and verifyWebhook against the standardwebhooks package, both ways.
import { createHmac, randomBytes } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { WebSocket } from 'ws';
import { PlazaClient, type RoomHandle } from '../src/index.js';
import {
  PlazaApiError,
  PlazaServer,
  WebhookVerificationError,
  signWebhook,
  verifyWebhook,
  type WebhookEvent,
} from '../src/server.js';
import { next, uniqueRoom } from './helpers.js';
import { startPlaza, type PlazaProcess } from './plaza-process.js';

const API_KEY = 'server-api-test-key-0123456789';
const JWT_SECRET = 'server-api-test-secret-of-at-least-32-bytes';

function token(user: string, name: string): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
  const head = b64({ alg: 'HS256', typ: 'JWT' });
  const body = b64({ sub: user, name, exp: Math.floor(Date.now() / 1000) + 600, rooms: { '*': ['join', 'publish', 'entities', 'direct'] } });
  const sig = createHmac('sha256', JWT_SECRET).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

let server: PlazaProcess;
let plaza: PlazaServer;
beforeAll(async () => {
  server = await startPlaza([], { PLAZA_API_KEY: API_KEY, PLAZA_JWT_SECRET: JWT_SECRET });
  plaza = new PlazaServer({ url: `http://${server.addr}`, apiKey: API_KEY });
});
afterAll(async () => {
  await server?.stop();
});

function client(user?: string): PlazaClient {
  const options = user === undefined ? {} : { token: token(user, user.replace(/^u-/, '')) };
  const c = new PlazaClient(`ws://${server.addr}/v1/ws`, { WebSocket, reconnect: { initialMs: 20, maxMs: 200 }, ...options });
  onTestFinished(() => c.close());
  return c;
}

/** A new room with one member, `user`, joined over WebSocket. */
async function roomWithMember(user = `u-${randomBytes(4).toString('hex')}`): Promise<{ id: string; member: RoomHandle; user: string }> {
  const id = uniqueRoom();
  await plaza.createRoom({ id });
  const member = await client(user).join(id, {});
  return { id, member, user };
}

/** Resolves with the error a promise rejects with (fails the test if it resolves). */
async function refusal(p: Promise<unknown>): Promise<PlazaApiError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(PlazaApiError);
  return e as PlazaApiError;
}

describe('PlazaServer: management calls', () => {
  it('creates, reads, lists and deletes rooms; tickets admit members; members and kick', async () => {
    const id = uniqueRoom();
    const created = await plaza.createRoom({ id, name: 'Test room', options: { max_members: 5 } });
    expect(created).toMatchObject({ id, name: 'Test room', members: 0, access: 'open', max_members: 5 });
    expect(await plaza.room(id)).toMatchObject({ id, name: 'Test room' });
    expect((await plaza.rooms()).map((r) => r.id)).toContain(id);
    expect((await refusal(plaza.createRoom({ id }))).status).toBe(409);

    const ticket = await plaza.ticket(id, { name: 'Tia', platform: 'xr' });
    expect(ticket.ticket).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(ticket.expires_at).toBeGreaterThan(Date.now());
    const tia = await client().join(id, { ticket: ticket.ticket });
    const ann = await client('u-ann').join(id, {});

    const members = await plaza.members(id);
    expect(members).toHaveLength(2);
    expect(members).toEqual(expect.arrayContaining([
      { session: tia.session, name: 'Tia', platform: 'xr' },
      expect.objectContaining({ session: ann.session, name: 'ann', user: 'u-ann' }),
    ]));
    expect((await plaza.room(id)).members).toBe(2);

    const kicked = next(tia, 'closed');
    const left = next(ann, 'presence', (p) => p.kind === 'presence.leave');
    await plaza.kick(id, tia.session!, 'be nice');
    expect(await kicked).toMatchObject({ reason: 'kicked', message: 'be nice' });
    expect(await left).toMatchObject({ kind: 'presence.leave', session: tia.session, reason: 'kicked' });
    expect((await refusal(plaza.kick(id, tia.session!))).code).toBe('session_not_found');

    const deleted = next(ann, 'closed');
    await plaza.deleteRoom(id);
    expect((await deleted).reason).toBe('room_deleted');
    const gone = await refusal(plaza.room(id));
    expect([gone.status, gone.code]).toEqual([404, 'room_not_found']);
  });
});

describe('PlazaServer: server API', () => {
  it('publishes as @server, once per idempotency key; history shows it', async () => {
    const { id, member } = await roomWithMember();
    const got = next(member, 'message');
    const first = await plaza.publish(id, { event: 'welcome', data: { text: 'Hello' }, topic: 't1', idempotencyKey: 'k-1' });
    expect(first).toEqual({ room: id, seq: expect.any(Number), duplicate: false });
    const msg = await got;
    expect(msg).toMatchObject({ seq: first.seq, from: '@server', channel: 'main', event: 'welcome', data: { text: 'Hello' }, topic: 't1', id: 'k-1' });

    // The retry: same seq, delivered to nobody (the member's next message is the later one).
    const again = await plaza.publish(id, { event: 'welcome', topic: 't1', data: { text: 'Hello' }, idempotencyKey: 'k-1' });
    expect(again).toEqual({ ...first, duplicate: true });
    const conflict = await refusal(plaza.publish(id, { event: 'welcome', data: { text: 'Other' }, idempotencyKey: 'k-1' }));
    expect([conflict.status, conflict.code]).toEqual([409, 'idempotency_conflict']);

    const reply = next(member, 'message');
    const second = await plaza.publish(id, { event: 'answer', replyTo: first.seq, channel: 'main' });
    expect(second.seq).toBeGreaterThan(first.seq);
    expect(await reply).toMatchObject({ seq: second.seq, event: 'answer', reply_to: first.seq, from: '@server' });

    const history = await plaza.history(id, { channel: 'main', last: 2 });
    expect(history.complete).toBe(true);
    expect(history.events.map((e) => [e.seq, e.from, e.event, e.id])).toEqual([
      [first.seq, '@server', 'welcome', 'k-1'],
      [second.seq, '@server', 'answer', undefined],
    ]);
    expect((await plaza.history(id, { since: first.seq })).events.map((e) => e.seq)).toEqual([second.seq]);
  });

  it('broadcasts into several rooms, answering per room', async () => {
    const a = await roomWithMember();
    const b = await roomWithMember();
    const gotA = next(a.member, 'message');
    const gotB = next(b.member, 'message');
    const results = await plaza.broadcast([a.id, 'no-such-room', b.id], { event: 'notice', data: 'maintenance at 22:00' });
    expect(results).toEqual([
      { room: a.id, seq: expect.any(Number), duplicate: false },
      { room: 'no-such-room', error: { code: 'room_not_found', message: expect.any(String) } },
      { room: b.id, seq: expect.any(Number), duplicate: false },
    ]);
    expect(await gotA).toMatchObject({ seq: results[0]!.seq, from: '@server', event: 'notice', data: 'maintenance at 22:00' });
    expect(await gotB).toMatchObject({ seq: results[2]!.seq, from: '@server', event: 'notice' });
  });

  it('sends direct messages to a session and to every session of a user', async () => {
    const { id, member, user } = await roomWithMember();
    const other = await plaza.createRoom({ id: uniqueRoom() });
    const elsewhere = await client(user).join(other.id, {});

    const direct = next(member, 'direct');
    expect(await plaza.direct(id, member.session!, { event: 'psst', data: { n: 1 } })).toEqual({ room: id, session: member.session });
    expect(await direct).toMatchObject({ type: 'direct', room: id, from: '@server', event: 'psst', data: { n: 1 } });
    expect((await refusal(plaza.direct(id, 'AAAAAAAAAAA', { event: 'psst' }))).code).toBe('session_not_found');

    const both = [next(member, 'direct'), next(elsewhere, 'direct')];
    expect(await plaza.directUser(user, { event: 'hello', data: [1, 2] })).toEqual({ user });
    const frames = await Promise.all(both);
    expect(frames.map((f) => [f.room, f.from, f.event, f.data])).toEqual([
      [id, '@server', 'hello', [1, 2]],
      [other.id, '@server', 'hello', [1, 2]],
    ]);
  });

  it('disconnects a user everywhere', async () => {
    const { member, user } = await roomWithMember();
    const closed = next(member, 'closed');
    expect(await plaza.disconnectUser(user, 'account closed')).toEqual({ user });
    expect(await closed).toMatchObject({ reason: 'kicked', message: 'account closed' });
  });

  it('reads state and changes entities, with If-Match', async () => {
    const { id, member, user } = await roomWithMember();
    const createdEvent = next(member, 'entity');
    const created = await plaza.createEntity(id, { kind: 'note', data: { text: 'hi' } });
    expect(created).toEqual({ room: id, seq: expect.any(Number), entity: { id: expect.any(String), kind: 'note', data: { text: 'hi' }, version: 1 } });
    expect(await createdEvent).toMatchObject({ kind: 'entity.created', seq: created.seq, from: '@server', entity: created.entity });
    const eid = created.entity.id;

    const state = await plaza.state(id);
    expect(state).toMatchObject({ room: id, seq: created.seq, entities: [created.entity], locks: [] });
    expect(state.members).toEqual([expect.objectContaining({ session: member.session, user })]);
    expect(typeof state.epoch).toBe('number');

    const updatedEvent = next(member, 'entity');
    const updated = await plaza.setEntity(id, eid, { text: 'bye' }, { ifVersion: 1 });
    expect(updated.entity).toEqual({ id: eid, kind: 'note', data: { text: 'bye' }, version: 2 });
    expect(await updatedEvent).toMatchObject({ kind: 'entity.updated', seq: updated.seq, from: '@server', entity: updated.entity });

    const stale = await refusal(plaza.setEntity(id, eid, { text: 'stale' }, { ifVersion: 1 }));
    expect([stale.status, stale.code]).toEqual([412, 'version_conflict']);
    expect((await refusal(plaza.deleteEntity(id, eid, { ifVersion: 7 }))).status).toBe(412);
    expect((await plaza.state(id)).entities).toEqual([updated.entity]);

    const deletedEvent = next(member, 'entity');
    const deleted = await plaza.deleteEntity(id, eid, { ifVersion: 2 });
    expect(deleted).toEqual({ room: id, id: eid, version: 2, seq: expect.any(Number) });
    expect(await deletedEvent).toMatchObject({ kind: 'entity.deleted', seq: deleted.seq, from: '@server', id: eid });
    const missing = await refusal(plaza.setEntity(id, eid, null));
    expect([missing.status, missing.code]).toEqual([404, 'entity_not_found']);
    expect(member.state.entities()).toEqual([]);
  });

  it('throws PlazaApiError with the status, code and message of the error body', async () => {
    const missing = await refusal(plaza.publish('no-such-room', { event: 'x' }));
    expect(missing).toMatchObject({ status: 404, code: 'room_not_found', name: 'PlazaApiError' });
    expect(missing.message).toContain('no-such-room');
    expect((await refusal(plaza.state('no-such-room'))).status).toBe(404);
    expect((await refusal(plaza.history('no-such-room'))).code).toBe('room_not_found');

    const bad = await refusal(plaza.publish(uniqueRoom(), { event: '' }));
    expect(bad.status === 400 || bad.status === 404).toBe(true);

    // A wrong key: management calls say unauthorized; room calls (which also take tokens, and
    // this node verifies them) say the key is no valid token.
    const wrong = new PlazaServer({ url: `http://${server.addr}/`, apiKey: 'not-the-key-at-all-0000' });
    const mgmt = await refusal(wrong.broadcast(['x'], { event: 'x' }));
    expect([mgmt.status, mgmt.code]).toEqual([401, 'unauthorized']);
    expect((await refusal(wrong.createRoom({}))).status).toBe(401);
    expect((await refusal(wrong.publish('x', { event: 'x' }))).status).toBe(401);
    const none = new PlazaServer({ url: `http://${server.addr}` });
    expect((await refusal(none.directUser('u', { event: 'x' }))).code).toBe('unauthorized');
  });

  it('uses the fetch it is given', async () => {
    const urls: string[] = [];
    const traced = new PlazaServer({
      url: `http://${server.addr}`,
      apiKey: API_KEY,
      fetch: (input, init) => {
        urls.push(String(input));
        return fetch(input, init);
      },
    });
    const id = uniqueRoom();
    await traced.createRoom({ id });
    await traced.history(id, { last: 5 });
    expect(urls).toEqual([`http://${server.addr}/v1/rooms`, `http://${server.addr}/v1/rooms/${id}/history?last=5`]);
  });
});

describe('verifyWebhook', () => {
  const secret = `whsec_${randomBytes(32).toString('base64')}`;
  const body = JSON.stringify({
    type: 'member.joined',
    timestamp: '2025-05-01T12:00:00.123Z',
    data: { room: 'lobby', seq: 7, session: 'Hk3vQ9xLm2A', name: 'Ann', platform: 'browser', user: 'u-ann' },
  });
  const id = 'lobby:1:7';

  function signed(at = new Date(), payload = body): Record<string, string> {
    const wh = new Webhook(secret);
    return {
      'webhook-id': id,
      'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
      'webhook-signature': wh.sign(id, at, payload),
    };
  }

  function reason(f: () => unknown): string | undefined {
    try {
      f();
    } catch (e) {
      expect(e).toBeInstanceOf(WebhookVerificationError);
      return (e as WebhookVerificationError).reason;
    }
    return undefined;
  }

  it('accepts what standardwebhooks signed, and types the event', () => {
    const event: WebhookEvent = verifyWebhook(secret, body, signed());
    expect(event.type).toBe('member.joined');
    if (event.type !== 'member.joined') throw new Error('narrowing');
    expect(event.data.name).toBe('Ann');
    expect(event.data.user).toBe('u-ann');
    // A Buffer body, a fetch Headers object, and mixed-case header names.
    const h = signed();
    expect(verifyWebhook(secret, Buffer.from(body), new Headers(h)).type).toBe('member.joined');
    const upper = Object.fromEntries(Object.entries(h).map(([k, v]) => [k.toUpperCase(), v]));
    expect(verifyWebhook(secret, body, upper).type).toBe('member.joined');
  });

  it('accepts any one of several space-separated signatures', () => {
    const h = signed();
    const other = `v1,${randomBytes(32).toString('base64')}`;
    expect(verifyWebhook(secret, body, { ...h, 'webhook-signature': `${other} v1a,xyz ${h['webhook-signature']}` }).type).toBe('member.joined');
    expect(reason(() => verifyWebhook(secret, body, { ...h, 'webhook-signature': `${other} v2,${h['webhook-signature']!.slice(3)}` }))).toBe('bad_signature');
  });

  it('refuses a tampered body, timestamp or signature, another secret, and missing headers', () => {
    const h = signed();
    expect(reason(() => verifyWebhook(secret, body.replace('Ann', 'Eve'), h))).toBe('bad_signature');
    expect(reason(() => verifyWebhook(secret, body, { ...h, 'webhook-timestamp': String(Number(h['webhook-timestamp']) - 1) }))).toBe('bad_signature');
    expect(reason(() => verifyWebhook(secret, body, { ...h, 'webhook-id': 'lobby:1:8' }))).toBe('bad_signature');
    const sig = Buffer.from(h['webhook-signature']!.slice(3), 'base64');
    sig[0] = sig[0]! ^ 1;
    expect(reason(() => verifyWebhook(secret, body, { ...h, 'webhook-signature': `v1,${sig.toString('base64')}` }))).toBe('bad_signature');
    expect(reason(() => verifyWebhook(`whsec_${randomBytes(32).toString('base64')}`, body, h))).toBe('bad_signature');
    for (const name of ['webhook-id', 'webhook-timestamp', 'webhook-signature']) {
      const { [name]: _, ...rest } = h;
      expect(reason(() => verifyWebhook(secret, body, rest))).toBe('missing_header');
    }
    expect(reason(() => verifyWebhook(secret, body, { ...h, 'webhook-timestamp': 'soon' }))).toBe('bad_timestamp');
  });

  it('refuses a timestamp more than 5 minutes off, either way', () => {
    const sixMinutes = 6 * 60_000;
    expect(reason(() => verifyWebhook(secret, body, signed(new Date(Date.now() - sixMinutes))))).toBe('stale_timestamp');
    expect(reason(() => verifyWebhook(secret, body, signed(new Date(Date.now() + sixMinutes))))).toBe('stale_timestamp');
    // Within the window on both sides: accepted.
    expect(verifyWebhook(secret, body, signed(new Date(Date.now() - 4 * 60_000))).type).toBe('member.joined');
    expect(verifyWebhook(secret, body, signed(new Date(Date.now() + 4 * 60_000))).type).toBe('member.joined');
  });

  it('refuses bodies that are no event (after checking the signature)', () => {
    const notJson = 'not json';
    expect(reason(() => verifyWebhook(secret, notJson, signed(new Date(), notJson)))).toBe('bad_body');
    const unknown = JSON.stringify({ type: 'room.exploded', timestamp: 'x', data: { room: 'r' } });
    expect(reason(() => verifyWebhook(secret, unknown, signed(new Date(), unknown)))).toBe('unknown_type');
  });

  it('signs what standardwebhooks verifies', () => {
    const now = new Date();
    const headers = signWebhook(secret, id, now, body);
    expect(headers['webhook-timestamp']).toBe(String(Math.floor(now.getTime() / 1000)));
    expect(new Webhook(secret).verify(body, { ...headers })).toEqual(JSON.parse(body));
    expect(headers['webhook-signature']).toBe(new Webhook(secret).sign(id, now, body));
    expect(() => new Webhook(secret).verify(body.replace('Ann', 'Eve'), { ...headers })).toThrow();
    expect(verifyWebhook(secret, body, headers).type).toBe('member.joined');
  });
});
