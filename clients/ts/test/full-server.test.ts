// A server at its connection limit refuses the upgrade (HTTP 503, `server_full`): the client
// takes that as a failed attempt, backs off and tries again, and gets in once a place frees.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { PlazaClient } from '../src/index.js';
import { uniqueRoom } from './helpers.js';
import { startPlaza, type PlazaProcess } from './plaza-process.js';

let server: PlazaProcess;

beforeAll(async () => {
  server = await startPlaza(['--auto-create-rooms', '--max-connections', '1']);
});

afterAll(async () => {
  await server?.stop();
});

function client(): PlazaClient {
  return new PlazaClient(`ws://${server.addr}/v1/ws`, {
    WebSocket,
    transports: ['websocket'],
    reconnect: { initialMs: 20, maxMs: 100 },
  });
}

describe('a full server', () => {
  it('refuses a client over its connection limit, which retries and joins once a place frees', async () => {
    const room = uniqueRoom();
    const first = client();
    const second = client();
    try {
      await first.join(room, { name: 'ann' });
      // The second is refused, and tries again after a backoff.
      const refused = new Promise<number>((resolve) => {
        second.on('reconnecting', ({ attempt }) => {
          if (attempt >= 2) resolve(attempt);
        });
      });
      const joining = second.join(room, { name: 'bob' });
      expect(await refused).toBeGreaterThanOrEqual(2);
      expect(second.state).toBe('reconnecting');
      // A place frees: the next attempt gets in and the join goes through.
      first.close();
      const bob = await joining;
      expect(second.state).toBe('open');
      expect(bob.members.map((m) => m.name)).toEqual(['bob']);
      // Each refusal was the server's (503 server_full), counted by it.
      const metrics = await (await fetch(`http://${server.addr}/metrics`)).text();
      const refusals = Number(/^plaza_connections_refused_total (\d+)/m.exec(metrics)?.[1]);
      expect(refusals).toBeGreaterThanOrEqual(2);
    } finally {
      first.close();
      second.close();
    }
  });
});
