// A path cut between the client and its node delivers nothing, not even a close: the client
// notices the silence (silenceMs), reconnects and resumes.
import net from 'node:net';
import { describe, expect, inject, it, onTestFinished } from 'vitest';
import { WebSocket } from 'ws';
import { PlazaClient } from '../src/index.js';
import { createRoom, newClient, next } from './helpers.js';

/**
 * A TCP relay to the test server. `cut()` freezes the connections open so far: nothing passes
 * either way and nothing is closed, as on a cut path. New connections pass. `onPong` is called
 * for every `pong` the server sends through it.
 */
async function relay(onPong: () => void = () => undefined): Promise<{ url: string; cut: () => void }> {
  const target = new URL(inject('plazaWsUrl'));
  let open: net.Socket[][] = [];
  const all: net.Socket[] = [];
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    const pair = [client, upstream];
    open.push(pair);
    all.push(client, upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    // Server frames are not masked: a small `pong` shows as its JSON.
    upstream.on('data', (chunk: Buffer) => {
      if (chunk.includes('"type":"pong"')) onPong();
    });
    const end = () => pair.forEach((s) => s.destroy());
    for (const s of pair) {
      s.on('error', end);
      s.on('close', end);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  onTestFinished(() => {
    server.close();
    all.forEach((s) => s.destroy());
  });
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `ws://127.0.0.1:${port}${target.pathname}`,
    cut: () => {
      for (const [client, upstream] of open) {
        client!.unpipe(upstream!);
        upstream!.unpipe(client!);
        client!.removeAllListeners('data');
        upstream!.removeAllListeners('data');
        client!.pause();
        upstream!.pause();
      }
      open = [];
    },
  };
}

describe('silence', () => {
  it('a live quiet connection answers the pings and stays; a cut one is left, and the room resumes with what it missed', async () => {
    const room = await createRoom();
    let pongs = 0;
    let pongWaiter: (() => void) | undefined;
    const path = await relay(() => {
      pongs += 1;
      pongWaiter?.();
    });
    const client = new PlazaClient(path.url, {
      WebSocket,
      reconnect: { initialMs: 20, maxMs: 200 },
      silenceMs: 200,
    });
    onTestFinished(() => client.close());
    const reconnects: number[] = [];
    client.on('reconnecting', ({ attempt }) => reconnects.push(attempt));
    const other = newClient({ room });
    const ann = await client.join(room, { name: 'ann' });
    const bob = await other.join(room, { name: 'bob' });

    // Quiet but alive: three probes answered, no reconnect.
    await new Promise<void>((resolve) => {
      pongWaiter = () => {
        if (pongs >= 3) resolve();
      };
    });
    expect(reconnects).toEqual([]);

    const resumed = next(ann, 'joined', (j) => j.resumed);
    const heard = next(ann, 'message');
    path.cut();
    const missed = await bob.publish('chat', { text: 'while the path was cut' });
    expect(await resumed).toMatchObject({ session: ann.session, resumed: true });
    expect(await heard).toMatchObject({ seq: missed.seq, data: { text: 'while the path was cut' } });
    expect(reconnects.length).toBeGreaterThanOrEqual(1);
  });
});
