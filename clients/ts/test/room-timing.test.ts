// Timing cases of one room handle that a real server cannot produce on demand (an answer
// arriving after its timeout, a ticket fetch outliving its connection). The handle talks to a
// recording transport here; everything else is tested against a real `plaza serve`.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { RoomHandle, type ClientFrame, type JoinedFrame } from '../src/index.js';
import type { RoomTransport } from '../src/room-options.js';

class RecordingTransport implements RoomTransport {
  readonly sent: ClientFrame[] = [];
  open = true;
  constructor(readonly backoff?: { initialMs: number; maxMs: number }) {}
  private nonce = 0;
  send(frame: ClientFrame): boolean {
    if (!this.open) return false;
    this.sent.push(frame);
    return true;
  }
  nextNonce(): number {
    return ++this.nonce;
  }
  forget(): void {}
  dispatch(): void {}
}

function joined(seq: number): JoinedFrame {
  return {
    type: 'joined',
    room: 'r',
    session: 's1',
    resume_token: 't1',
    epoch: 1,
    seq,
    members: [{ session: 's1', name: 'ann', platform: 'browser' }],
    snapshot: { entities: [{ id: 'e1', data: { x: 1 }, version: 1 }], locks: [] },
    channels: ['main'],
    resumed: false,
  };
}

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe('an answer after the timeout', () => {
  it('still reaches the replica: the server made the change', async () => {
    const transport = new RecordingTransport();
    const room = new RoomHandle('r', { name: 'ann' }, transport);
    room._handle(joined(5));
    const patched = room.patchEntity('e1', { x: 2 }, { timeoutMs: 100 });
    const outcome = patched.catch((e: unknown) => e);
    await vi.advanceTimersByTimeAsync(100);
    expect(await outcome).toMatchObject({ code: 'timeout' });
    // Withdrawn while the outcome is unknown.
    expect(room.state.entity('e1')?.data).toEqual({ x: 1 });

    const request = transport.sent.find((f) => f.type === 'request');
    expect(request).toMatchObject({ op: 'entity.patch' });
    room._handle({
      type: 'response',
      room: 'r',
      nonce: (request as { nonce: number }).nonce,
      ok: true,
      result: { entity: { id: 'e1', data: { x: 2 }, version: 2 }, seq: 6 },
    });
    expect(room.state.entity('e1')).toEqual({ id: 'e1', data: { x: 2 }, version: 2 });
    expect(room.lastSeq).toBe(6);
  });
});

describe('ticket functions', () => {
  it('send one join per connection, however late the fetches resolve', async () => {
    const transport = new RecordingTransport();
    const fetches: Array<(ticket: string) => void> = [];
    const ticket = () => new Promise<string>((resolve) => fetches.push(resolve));
    const room = new RoomHandle('r', { ticket }, transport);
    room._sendJoin();
    await vi.advanceTimersByTimeAsync(0);
    // The connection drops and comes back while the first fetch is still out.
    transport.open = false;
    room._onDisconnect();
    transport.open = true;
    room._sendJoin();
    await vi.advanceTimersByTimeAsync(0);
    expect(fetches).toHaveLength(2);
    fetches[1]!('second');
    fetches[0]!('first');
    await vi.advanceTimersByTimeAsync(0);
    const joins = transport.sent.filter((f) => f.type === 'join');
    expect(joins).toEqual([{ type: 'join', room: 'r', ticket: 'second' }]);
  });
});

describe('transient join errors', () => {
  function refuse(room: RoomHandle): void {
    room._handle({
      type: 'error',
      code: 'broker_unavailable',
      message: 'broker unavailable: redis is down',
      ref: { frame: 'join', room: 'r' },
    });
  }

  it('retry a first join with backoff, then reject it', async () => {
    const transport = new RecordingTransport();
    const room = new RoomHandle('r', { name: 'ann' }, transport);
    const outcome = room._waitJoined().catch((e: unknown) => e);
    room._sendJoin();
    for (let attempt = 1; attempt < 6; attempt++) {
      refuse(room);
      await vi.advanceTimersByTimeAsync(60_000);
      expect(transport.sent.filter((f) => f.type === 'join')).toHaveLength(attempt + 1);
    }
    refuse(room);
    expect(await outcome).toMatchObject({ code: 'broker_unavailable' });
    await vi.advanceTimersByTimeAsync(60_000);
    expect(transport.sent.filter((f) => f.type === 'join')).toHaveLength(6);
  });

  it("follow the client's backoff settings", async () => {
    const transport = new RecordingTransport({ initialMs: 8, maxMs: 8 });
    const room = new RoomHandle('r', { name: 'ann' }, transport);
    room._waitJoined().catch(() => undefined);
    room._sendJoin();
    refuse(room);
    await vi.advanceTimersByTimeAsync(3);
    expect(transport.sent.filter((f) => f.type === 'join')).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(5); // 8 ms at most
    expect(transport.sent.filter((f) => f.type === 'join')).toHaveLength(2);
  });

  it('retry a resume for as long as it takes', async () => {
    const transport = new RecordingTransport();
    const room = new RoomHandle('r', { name: 'ann' }, transport);
    room._waitJoined().catch(() => undefined);
    room._handle(joined(5));
    room._onDisconnect();
    room._sendJoin();
    for (let attempt = 0; attempt < 10; attempt++) {
      refuse(room);
      await vi.advanceTimersByTimeAsync(60_000);
    }
    const joins = transport.sent.filter((f) => f.type === 'join');
    expect(joins).toHaveLength(11);
    expect(joins[10]).toMatchObject({ resume: { token: 't1', last_seq: 5 } });
    room._handle({ ...joined(9), resumed: true });
    expect(room.live).toBe(true);
  });
});
