// The documented join pattern, `const room = await client.join(…); room.on('message', …)`,
// against the worst case: an event already in the client's socket buffer behind `joined`.
import { Worker } from 'node:worker_threads';
import { describe, expect, inject, it, onTestFinished } from 'vitest';
import { WebSocket } from 'ws';
import { type PlazaClient, type RoomHandle, type RoomMessage } from '../src/index.js';
import { api, newClient, uniqueRoom } from './helpers.js';

/**
 * A backend on its own thread that publishes into a room through the server API the moment
 * a member with the given name is in it, then wakes the test's thread. While it works, the
 * test's thread sleeps in `Atomics.wait`, so it reads nothing from its socket: `joined` and the
 * publish reach the client together, as when a busy client reads a backend's instant welcome
 * in the same chunk as its `joined`.
 */
const PUBLISHER = `
const { parentPort } = require('node:worker_threads');
parentPort.on('message', async ({ base, room, name, flag }) => {
  const done = new Int32Array(flag);
  try {
    for (;;) {
      const res = await fetch(base + '/v1/rooms/' + room + '/members');
      const body = res.ok ? await res.json() : { members: [] };
      if (body.members.some((m) => m.name === name)) break;
    }
    const res = await fetch(base + '/v1/rooms/' + room + '/publish', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ event: 'welcome', data: { to: name } }),
    });
    Atomics.store(done, 0, res.ok ? 1 : 2);
  } catch {
    Atomics.store(done, 0, 2);
  }
  Atomics.notify(done, 0);
});
`;

/**
 * `ws` without permessage-deflate: its compressing sender writes a frame on a later turn of the
 * event loop, so the join would wait, unsent, while the thread sleeps.
 */
class UncompressedWebSocket extends WebSocket {
  constructor(url: string, protocols?: string[]) {
    super(url, protocols, { perMessageDeflate: false });
  }
}

/**
 * Creates a room and joins it as `name` while `publisher` publishes the welcome into it the
 * instant the member is in; resolves with what `join()` resolves with.
 */
async function joinWelcomed(client: PlazaClient, publisher: Worker, name: string): Promise<{ room: string; lobby: RoomHandle }> {
  const base = inject('plazaWsUrl').replace(/^ws/, 'http').replace(/\/v1\/ws$/, '');
  const room = uniqueRoom();
  expect((await api('POST', '/v1/rooms', { id: room })).status).toBe(201);
  const flag = new SharedArrayBuffer(4);
  publisher.postMessage({ base, room, name, flag });
  const joining = client.join(room, { name });
  // The worker publishes once the join is in; until then this thread reads nothing.
  expect(Atomics.wait(new Int32Array(flag), 0, 0, 10_000)).toBe('ok');
  expect(Atomics.load(new Int32Array(flag), 0)).toBe(1);
  return { room, lobby: await joining };
}

/** Collects `lobby`'s messages; `last` resolves on the one named `last`. */
function collect(lobby: RoomHandle): { messages: RoomMessage[]; last: Promise<void> } {
  const messages: RoomMessage[] = [];
  const last = new Promise<void>((resolve) =>
    lobby.on('message', (m) => {
      messages.push(m);
      if (m.event === 'last') resolve();
    }),
  );
  return { messages, last };
}

function startPublisher(): Worker {
  const publisher = new Worker(PUBLISHER, { eval: true });
  onTestFinished(async () => {
    await publisher.terminate();
  });
  return publisher;
}

describe('the documented join pattern', () => {
  it('a handler attached right after `await client.join()` gets an event published the instant the member joined (100 joins)', async () => {
    const publisher = startPublisher();
    const client = newClient({ WebSocket: UncompressedWebSocket });
    await client.connect();
    for (let i = 0; i < 100; i++) {
      const { room, lobby } = await joinWelcomed(client, publisher, `m${i}`);
      const { messages, last } = collect(lobby);
      // A later publish ends the wait: whatever came before it has been delivered by then.
      expect((await api('POST', `/v1/rooms/${room}/publish`, { event: 'last' })).status).toBe(200);
      await last;
      expect(messages.map((m) => m.event), `join ${i}`).toEqual(['welcome', 'last']);
      expect(messages[0]).toMatchObject({ from: '@server', data: { to: `m${i}` } });
      await lobby.leave();
    }
  });

  it('a connection lost before the held events are handed on: each is delivered once, and the room resumes after them', async () => {
    const publisher = startPublisher();
    const client = newClient({ WebSocket: UncompressedWebSocket });
    await client.connect();
    const { room, lobby } = await joinWelcomed(client, publisher, 'dropped');
    const { messages, last } = collect(lobby);
    const resumed = new Promise<boolean | undefined>((resolve) => lobby.on('joined', (j) => resolve(j.resumed)));
    client._dropConnection();
    // The drop handed the welcome on at once, and the resume asked for what followed it.
    expect(messages.map((m) => m.event)).toEqual(['welcome']);
    expect(await resumed).toBe(true);
    expect((await api('POST', `/v1/rooms/${room}/publish`, { event: 'last' })).status).toBe(200);
    await last;
    expect(messages.map((m) => m.event)).toEqual(['welcome', 'last']);
  });
});
