// ProximityCalls against a real `plaza serve`, with recording peer connections (Node has no
// WebRTC; the browser test in web/e2e runs real ones): the initiator the server names offers,
// the other answers, ICE trickles through the server, parting closes both ends.
import { describe, expect, it, vi } from 'vitest';
import { ProximityCalls, RoomHandle, type PeerConnection } from '../src/index.js';
import { createRoom, newClient } from './helpers.js';

class FakePeer implements PeerConnection {
  static all: FakePeer[] = [];
  readonly log: string[] = [];
  closed = false;
  onicecandidate: PeerConnection['onicecandidate'] = null;
  ontrack: PeerConnection['ontrack'] = null;
  readonly candidates: RTCIceCandidateInit[] = [];
  constructor(readonly owner: string) {
    FakePeer.all.push(this);
  }
  async createOffer(): Promise<RTCSessionDescriptionInit> {
    this.log.push('createOffer');
    return { type: 'offer', sdp: `offer-from-${this.owner}` };
  }
  async createAnswer(): Promise<RTCSessionDescriptionInit> {
    this.log.push('createAnswer');
    return { type: 'answer', sdp: `answer-from-${this.owner}` };
  }
  async setLocalDescription(d: RTCSessionDescriptionInit): Promise<void> {
    this.log.push(`local:${d.type}`);
    // A candidate once the local description is set, as a browser gathers them.
    queueMicrotask(() => this.onicecandidate?.({ candidate: { toJSON: () => ({ candidate: `cand-${this.owner}` }) } }));
  }
  async setRemoteDescription(d: RTCSessionDescriptionInit): Promise<void> {
    this.log.push(`remote:${d.type}:${d.sdp}`);
  }
  async addIceCandidate(c: RTCIceCandidateInit): Promise<void> {
    this.candidates.push(c);
  }
  addTrack(): void {}
  close(): void {
    this.closed = true;
  }
}

/** Polls `check` (an `expect`) until it passes: the calls react to frames from a real server. */
const eventually = (check: () => void) => vi.waitFor(check, { timeout: 10_000, interval: 10 });

function callsOf(room: RoomHandle, owner: string, ended: string[]): ProximityCalls {
  return new ProximityCalls(room, {
    createPeerConnection: () => new FakePeer(owner),
    onCallEnded: (peer) => ended.push(peer),
  });
}

describe('proximity calls', () => {
  it('the initiator offers, the other answers, ICE crosses, parting closes both', async () => {
    FakePeer.all = [];
    const room = await createRoom({ options: { space: { min_dwell_ms: 0, tick_ms: 10, width: 100000, height: 100000 } } });
    const a = newClient({ room });
    const b = newClient({ room });
    const ann = await a.join(room, { name: 'ann' });
    await ann.jumpTo([100, 100]);
    const bob = await b.join(room, { name: 'bob' });
    await bob.jumpTo([1000, 1000]);
    const ended: string[] = [];
    const annCalls = callsOf(ann, 'ann', ended);
    const bobCalls = callsOf(bob, 'bob', ended);
    await ann.moveTo([1000, 1000], 5000);
    await eventually(() => expect([annCalls.peers.size, bobCalls.peers.size]).toEqual([1, 1]));
    const [pair] = [...annCalls.peers.keys()];
    const initiatorIsAnn = ann.session! < bob.session!;
    const [offerer, answerer] = initiatorIsAnn ? [annCalls, bobCalls] : [bobCalls, annCalls];
    const o = offerer.connection(pair!) as FakePeer;
    const r = answerer.connection(pair!) as FakePeer;
    await eventually(() => {
      expect(o.log.some((l) => l.startsWith('remote:answer'))).toBe(true);
      expect([r.candidates.length, o.candidates.length]).toEqual([1, 1]);
    });
    expect(o.log.slice(0, 2)).toEqual(['createOffer', 'local:offer']);
    expect(o.log).not.toContain('createAnswer');
    expect(r.log).toEqual([`remote:offer:offer-from-${o.owner}`, 'createAnswer', 'local:answer']);
    expect(o.log).toContain(`remote:answer:answer-from-${r.owner}`);
    expect(r.candidates).toEqual([{ candidate: `cand-${o.owner}` }]);
    expect(o.candidates).toEqual([{ candidate: `cand-${r.owner}` }]);
    expect(FakePeer.all).toHaveLength(2);

    // Parting ends the call at both ends.
    await ann.moveTo([100, 100], 5000);
    await eventually(() => expect([o.closed, r.closed]).toEqual([true, true]));
    expect(annCalls.peers.size + bobCalls.peers.size).toBe(0);
    expect(ended.sort()).toEqual([ann.session!, bob.session!].sort());
    annCalls.close();
    bobCalls.close();
    a.close();
    b.close();
  });
});

/** A room handle fed frames by hand, joined as `a1`, and a `proximity.enter` for pair 4 with `b1`. */
function injected(initiator = 'a1') {
  let nonce = 0;
  const transport = {
    send: () => true,
    nextNonce: () => ++nonce,
    forget: () => undefined,
    dispatch: () => undefined,
  };
  const room = new RoomHandle('r', { name: 'ann' }, transport);
  const space = {
    width: 2000, height: 2000, proximity_radius: 150, hysteresis: 1.2, min_dwell_ms: 1000,
    aoi_radius: 600, tick_ms: 100, direct_in_proximity_only: false, movements: {}, pairs: [],
  };
  const joined = {
    type: 'joined' as const, room: 'r', session: 'a1', resume_token: 't', epoch: 1, seq: 1,
    members: [], channels: ['main'], resumed: false, space,
  };
  room._handle(joined);
  const enter = { type: 'event' as const, room: 'r', seq: 2, ts: 0, kind: 'proximity.enter' as const, pair: 4, a: 'a1', b: 'b1', initiator };
  const offer = (from: string, pair: number) => ({ type: 'direct' as const, room: 'r', from, event: 'rtc.offer', data: { pair, sdp: 'v=0' } });
  return { room, joined, enter, offer };
}

class RefusingPeer extends FakePeer {
  override async setRemoteDescription(d: RTCSessionDescriptionInit): Promise<void> {
    this.log.push(`remote:${d.type}:${d.sdp}`);
    throw new Error('bad sdp');
  }
}

describe('proximity calls, frames injected', () => {
  it('ignore a second enter for a live pair and end calls the room no longer lists', () => {
    FakePeer.all = [];
    const { room, joined, enter } = injected();
    const calls = new ProximityCalls(room, { createPeerConnection: () => new FakePeer('a1') });
    room._handle(enter);
    room._handle({ ...enter, seq: 3 });
    expect(FakePeer.all).toHaveLength(1);
    expect([...calls.peers]).toEqual([[4, 'b1']]);
    // A resume whose joined lists no pair: the call ended while away.
    room._handle({ ...joined, seq: 9, resumed: true });
    expect(calls.peers.size).toBe(0);
    expect(FakePeer.all[0]!.closed).toBe(true);
    calls.close();
  });

  it.each([
    ['left', (room: RoomHandle) => void room.leave()],
    ['deleted', (room: RoomHandle) => room._handle({ type: 'closed', room: 'r', reason: 'room_deleted' })],
    ['the client closed', (room: RoomHandle) => room._onClientClosed()],
  ])('end with the room (%s)', (_, end) => {
    FakePeer.all = [];
    const { room, enter } = injected();
    const ended: number[] = [];
    const calls = new ProximityCalls(room, {
      createPeerConnection: () => new FakePeer('a1'),
      onCallEnded: (_peer, pair) => ended.push(pair),
    });
    room._handle(enter);
    end(room);
    expect(FakePeer.all[0]!.closed).toBe(true);
    expect(ended).toEqual([4]);
    expect(calls.peers.size).toBe(0);
  });

  it('drop signalling from another member or for another pair, and report a refused offer', async () => {
    FakePeer.all = [];
    const { room, enter, offer } = injected('b1');
    const errors: Array<[string, number, string]> = [];
    const calls = new ProximityCalls(room, {
      createPeerConnection: () => new RefusingPeer('a1'),
      onError: (e, peer, pair) => errors.push([peer, pair, (e as Error).message]),
    });
    room._handle(enter);
    const peer = FakePeer.all[0]!;
    expect(peer.log, 'b1 offers, not a1').toEqual([]);
    room._handle(offer('c1', 4));
    room._handle(offer('b1', 5));
    expect(peer.log).toEqual([]);
    room._handle(offer('b1', 4));
    await vi.waitFor(() => expect(errors).toEqual([['b1', 4, 'bad sdp']]));
    expect(peer.log).toEqual(['remote:offer:v=0']);
    expect(calls.peers.size).toBe(1);
    calls.close();
  });

  it('a failure of a call that ended meanwhile is not reported', async () => {
    FakePeer.all = [];
    const { room, enter, offer } = injected('b1');
    const errors: unknown[] = [];
    const calls = new ProximityCalls(room, {
      createPeerConnection: () => new RefusingPeer('a1'),
      onError: (e) => errors.push(e),
    });
    room._handle(enter);
    room._handle(offer('b1', 4));
    calls.close(); // before the refusal settles
    // Every promise job runs before the next macrotask: the refusal has settled by then.
    await new Promise((resolve) => setImmediate(resolve));
    expect(FakePeer.all[0]!.log).toEqual(['remote:offer:v=0']);
    expect(errors).toEqual([]);
  });
});
