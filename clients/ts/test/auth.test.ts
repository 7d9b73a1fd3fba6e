// Identity tokens against a real server that verifies them: on connect, refreshed before they
// lapse, and fetched anew after the server closed an expired connection (4004).
import { createHmac } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { WebSocket } from 'ws';
import { PlazaClient, type Identity, type PlazaClientOptions } from '../src/index.js';
import { newClient, next, uniqueRoom } from './helpers.js';
import { startPlaza, type PlazaProcess } from './plaza-process.js';

const SECRET = 'sdk-test-secret-of-at-least-32-bytes-long';

/** An HS256 token, signed as an application's backend would (docs/protocol.md). */
function sign(claims: Record<string, unknown>): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url');
  const head = b64({ alg: 'HS256', typ: 'JWT' });
  const body = b64(claims);
  const sig = createHmac('sha256', SECRET).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

/** A token for `user`, every member right in every room, expiring in `ms`. */
function token(user: string, ms: number, name?: string): string {
  return sign({ sub: user, name, exp: (Date.now() + ms) / 1000, rooms: { '*': ['join', 'publish', 'entities', 'locks', 'direct', 'move'] } });
}

let server: PlazaProcess;
beforeAll(async () => {
  server = await startPlaza(['--auto-create-rooms'], { PLAZA_JWT_SECRET: SECRET });
});
afterAll(async () => {
  await server.stop();
});

function client(options: PlazaClientOptions): PlazaClient {
  const c = new PlazaClient(`ws://${server.addr}/v1/ws`, {
    WebSocket,
    reconnect: { initialMs: 20, maxMs: 200 },
    ...options,
  });
  onTestFinished(() => c.close());
  return c;
}

function nextAuthed(c: PlazaClient): Promise<Identity> {
  return new Promise((resolve) => {
    const off = c.on('authed', (identity) => {
      off();
      resolve(identity);
    });
  });
}

describe('identity tokens', () => {
  it('connects with the token and shows the user in presence', async () => {
    const room = uniqueRoom();
    const ann = client({ token: () => token('u-ann', 600_000, 'Ann') });
    const authed = nextAuthed(ann);
    const a = await ann.join(room, { name: 'ignored' });
    expect((await authed).user).toBe('u-ann');
    expect(ann.identity?.name).toBe('Ann');
    expect(a.members.find((m) => m.session === a.session)).toMatchObject({ name: 'Ann', user: 'u-ann' });

    const bob = client({ token: token('u-bob', 600_000) });
    const seen = next(a, 'presence', (p) => p.kind === 'presence.join');
    await bob.join(room, { name: 'bob' });
    expect(((await seen) as { member: { user?: string } }).member.user).toBe('u-bob');
  });

  it('refuses a join without a token on a server that verifies them', async () => {
    const anonymous = client({});
    await expect(anonymous.join(uniqueRoom(), { name: 'x' })).rejects.toMatchObject({ code: 'token_required' });
  });

  it('resumes a session joined with a ticket and no token by its resume token alone', async () => {
    const room = uniqueRoom();
    const post = async (path: string, body: unknown) => {
      const res = await fetch(`http://${server.addr}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return (await res.json()) as Record<string, unknown>;
    };
    await post('/v1/rooms', { id: room });
    const { ticket } = await post(`/v1/rooms/${room}/tickets`, { name: 'guest' });
    const c = client({});
    const handle = await c.join(room, { ticket: ticket as string });
    c._dropConnection();
    // No token, and the ticket is spent: the resume token alone resumes the session.
    const resumed = await next(handle, 'joined', (j) => j.resumed);
    expect(resumed.session).toBe(handle.session);
    await handle.publish('chat', { text: 'back' });
  });

  // The refresh comes at 80 % of the token's life: 15 s leaves the fetch and its answer 3 s,
  // which a busy machine does not use up (2 s left 400 ms, issue 44).
  it('refreshes the token on the open connection before it lapses', { timeout: 40_000 }, async () => {
    let fetched = 0;
    const firstExpiry = Date.now() + 15_000;
    const c = client({
      token: () => {
        fetched += 1;
        return fetched === 1 ? sign({ sub: 'u-r', exp: firstExpiry / 1000, rooms: { '*': ['*'] } }) : token('u-r', 600_000);
      },
    });
    let reconnects = 0;
    c.on('reconnecting', () => (reconnects += 1));
    const first = nextAuthed(c);
    const room = await c.join(uniqueRoom(), { name: 'r' });
    expect((await first).expiresAt).toBe(Math.floor(firstExpiry));
    const refreshed = await nextAuthed(c);
    expect(refreshed.expiresAt).toBeGreaterThan(firstExpiry + 60_000);
    expect(fetched).toBe(2);
    // Past the first token's expiry the same connection still works (the time is what is tested).
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, firstExpiry + 500 - Date.now())));
    await room.publish('still-here', { ok: true });
    expect(reconnects).toBe(0);
    expect(c.state).toBe('open');
  });

  it('after the server closes an expired connection, fetches a fresh token and resumes', async () => {
    let fetched = 0;
    const c = client({
      token: () => {
        fetched += 1;
        // The refresh fails: the connection lapses and is closed with 4004.
        if (fetched === 2) throw new Error('backend down');
        // Long enough for the first join on a busy machine, short enough to wait for.
        return fetched === 1 ? token('u-x', 5000) : token('u-x', 600_000);
      },
    });
    const errors: string[] = [];
    c.on('error', (e) => errors.push(e.code));
    const room = await c.join(uniqueRoom(), { name: 'x' });
    const session = room.session;
    const resumed = next(room, 'joined', (j) => j.resumed === true);
    const j = await resumed;
    expect(j.session).toBe(session);
    expect(fetched).toBe(3);
    expect(errors).toContain('token_unavailable');
    expect(c.identity?.expiresAt).toBeGreaterThan(Date.now() + 60_000);
  });
});

describe('identity tokens on a development server', () => {
  it('a token function may give none, and the client connects without one', async () => {
    let asked = 0;
    const c = newClient({
      token: () => {
        asked += 1;
        return undefined;
      },
    });
    const room = await c.join(uniqueRoom(), { name: 'dev' });
    expect(room.members.find((m) => m.session === room.session)?.user).toBeUndefined();
    expect(c.identity).toBeUndefined();
    expect(asked).toBe(1);
  });
});
