// The HTTP transports against the real server: forced SSE and long polling behave like
// WebSocket (join, publish and ack, receive, resume without loss), and a client whose
// WebSocket cannot open falls back by itself.
import { describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import type { TransportName, WebSocketLike } from '../src/index.js';
import { gate, newClient, next, uniqueRoom } from './helpers.js';

/** A WebSocket that never opens: refused at once, as by a proxy that blocks it. */
class BlockedWebSocket implements WebSocketLike {
  readyState = 0;
  onopen = null;
  onerror: (() => void) | null = null;
  onmessage = null;
  onclose: (() => void) | null = null;
  constructor(_url: string) {
    setTimeout(() => {
      this.readyState = 3;
      this.onerror?.();
      this.onclose?.();
    }, 0);
  }
  send(): void {}
  close(): void {}
}

describe.each<TransportName>(['sse', 'polling'])('forced %s', (transport) => {
  it('joins, publishes with an ack, and receives from a WebSocket member', async () => {
    const room = uniqueRoom();
    const http = newClient({ room, transports: [transport] });
    const ws = newClient({ room });
    const roomH = await http.join(room, { name: 'ann' });
    expect(http.transportName).toBe(transport);
    const roomW = await ws.join(room, { name: 'bob' });

    const got = next(roomW, 'message');
    const ack = await roomH.publish('chat', { text: `over ${transport}` });
    expect((await got).seq).toBe(ack.seq);
    expect((await got).data).toEqual({ text: `over ${transport}` });

    const back = next(roomH, 'message');
    const ack2 = await roomW.publish('chat', { text: 'and back' });
    expect(await back).toMatchObject({ seq: ack2.seq, data: { text: 'and back' } });
    expect(roomH.lastSeq).toBe(ack2.seq);
  });

  it('answers requests by nonce and refuses what it must, as on WebSocket', async () => {
    const room = uniqueRoom();
    const http = newClient({ room, transports: [transport] });
    const ws = newClient({ room });
    const roomH = await http.join(room, { name: 'ann' });
    const roomW = await ws.join(room, { name: 'bob' });
    const created = next(roomW, 'entity');
    const note = await roomH.createEntity('note', { text: 'buy milk' });
    const seen = await created;
    expect(seen.kind === 'entity.created' && seen.entity.id).toBe(note.id);
    await roomH.acquireLock(note.id, { ttlMs: 10_000 });
    await expect(roomW.acquireLock(note.id)).rejects.toMatchObject({ code: 'lock_held' });
    await expect(roomH.request('entity.fly', {})).rejects.toMatchObject({ code: 'unknown_op' });
    await roomH.releaseLock(note.id);
    await roomW.acquireLock(note.id);
  });

  it('resumes after its transport session is lost, with nothing missed', async () => {
    const room = uniqueRoom();
    const http = newClient({ room, transports: [transport] });
    const ws = newClient({ room });
    const roomH = await http.join(room, { name: 'ann' });
    const roomW = await ws.join(room, { name: 'bob' });
    const session = roomH.session;

    const held = gate();
    const left = next(roomW, 'presence', (p) => p.kind === 'presence.leave');
    http._dropConnection(held.promise);
    await left;
    const acks = [await roomW.publish('chat', 1), await roomW.publish('chat', 2)];
    const seen: number[] = [];
    const both = new Promise<void>((resolve) => {
      roomH.on('message', (m) => {
        seen.push(m.seq);
        if (seen.length === 2) resolve();
      });
    });
    held.open();
    await both;
    expect(seen).toEqual(acks.map((a) => a.seq));
    expect(roomH.session).toBe(session);
  });
});

describe('fallback', () => {
  it('uses SSE by itself when WebSocket cannot open, and chats with a WebSocket member', async () => {
    const room = uniqueRoom();
    const blocked = newClient({ room, WebSocket: BlockedWebSocket });
    const ws = newClient({ room });
    const roomB = await blocked.join(room, { name: 'ann' });
    expect(blocked.transportName).toBe('sse');
    const roomW = await ws.join(room, { name: 'bob' });
    const got = next(roomB, 'message');
    const ack = await roomW.publish('chat', 'hello');
    expect((await got).seq).toBe(ack.seq);
  });

  it('goes on to long polling when SSE is not there either', async () => {
    const room = uniqueRoom();
    const client = newClient({ room, WebSocket: BlockedWebSocket, transports: ['websocket', 'polling'] });
    const joined = await client.join(room, { name: 'ann' });
    expect(client.transportName).toBe('polling');
    expect(joined.live).toBe(true);
  });
});

/**
 * A client in `room` whose WebSockets are blocked (sent to a refused port) until `unblock()`, as
 * behind a proxy that starts letting WebSocket through; it falls back to `fallback` and tries
 * WebSocket again every `upgradeProbeMs`.
 */
function blockedForNow(room: string, fallback: TransportName, upgradeProbeMs: number) {
  let open = false;
  class SometimesBlocked extends WebSocket {
    constructor(url: string) {
      super(open ? url : 'ws://127.0.0.1:9/v1/ws');
    }
  }
  const client = newClient({
    room,
    WebSocket: SometimesBlocked as unknown as typeof WebSocket,
    transports: ['websocket', fallback],
    upgradeProbeMs,
  });
  return {
    client,
    unblock: () => {
      open = true;
    },
  };
}

describe('upgrade', () => {
  it.each<TransportName>(['sse', 'polling'])(
    'moves from %s back to WebSocket once it opens, losing and repeating nothing, unseen by the others',
    async (fallback) => {
      const room = uniqueRoom();
      const { client: mover, unblock } = blockedForNow(room, fallback, 100);
      const ws = newClient({ room });
      const roomM = await mover.join(room, { name: 'ann' });
      expect(mover.transportName).toBe(fallback);
      const roomW = await ws.join(room, { name: 'bob' });
      const flaps: string[] = [];
      roomW.on('presence', (p) => flaps.push(p.kind));

      // Bob publishes all along; Ann must see each message once, in order, across the move.
      const seen: number[] = [];
      roomM.on('message', (m) => seen.push(m.seq));
      const sent: number[] = [];
      let publishing = true;
      const publisher = (async () => {
        while (publishing) sent.push((await roomW.publish('chat', sent.length)).seq);
      })();
      // Some of it over the fallback, then the move, then more over WebSocket.
      await expect.poll(() => seen.length).toBeGreaterThanOrEqual(3);
      const moved = new Promise<TransportName>((resolve) => mover.on('transport', resolve));
      unblock();
      expect(await moved).toBe('websocket');
      const atMove = seen.length;
      expect(mover.transportName).toBe('websocket');
      // The mover publishes over the new connection, and it is acknowledged.
      const mine = next(roomW, 'message');
      const ack = await roomM.publish('chat', 'from the new connection');
      expect((await mine).seq).toBe(ack.seq);
      await expect.poll(() => seen.length).toBeGreaterThanOrEqual(atMove + 3);
      publishing = false;
      await publisher;
      await expect.poll(() => seen[seen.length - 1], { timeout: 5000 }).toBe(sent[sent.length - 1]);
      // (Ann's own message is not sent back to her: `seen` is exactly Bob's.)
      expect(seen).toEqual(sent);
      // Bob saw no one leave or arrive: the session moved, it did not drop.
      expect(flaps).toEqual([]);
      expect(mover.state).toBe('open');
    },
  );
});

describe('upgrade and leave', () => {
  it('a leave while the rooms move is sent after the resume and answered', async () => {
    const room = uniqueRoom();
    const { client: mover, unblock } = blockedForNow(room, 'sse', 50);
    const ws = newClient({ room });
    const roomM = await mover.join(room, { name: 'ann' });
    const roomW = await ws.join(room, { name: 'bob' });
    const gone = next(roomW, 'presence', (p) => p.kind === 'presence.leave');
    // The moment the move starts (the resume join is on its way), the app leaves.
    const left = new Promise<void>((resolve) => {
      mover.on('transport', () => void roomM.leave().then(resolve));
    });
    unblock();
    await left;
    const leave = await gone;
    expect(leave.kind === 'presence.leave' && leave.reason).toBe('left');
    expect(roomW.members.map((m) => m.name)).toEqual(['bob']);
  });
});
