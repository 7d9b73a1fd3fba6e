// ProximityCalls against a real `plaza serve`, with recording peer connections (Node has no
// WebRTC; the browser test in web/e2e runs real ones): the initiator the server names offers,
// the other answers, ICE trickles through the server, parting closes both ends.
import { describe, expect, it } from 'vitest';
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

function until(pred: () => boolean, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const check = () => {
      if (pred()) return resolve();
      if (Date.now() - started > 10_000) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(check, 10);
    };
    check();
  });
}

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
    await until(() => annCalls.peers.size === 1 && bobCalls.peers.size === 1, 'both calls');
    const [pair] = [...annCalls.peers.keys()];
    const initiatorIsAnn = ann.session! < bob.session!;
    const [offerer, answerer] = initiatorIsAnn ? [annCalls, bobCalls] : [bobCalls, annCalls];
    const o = offerer.connection(pair!) as FakePeer;
    const r = answerer.connection(pair!) as FakePeer;
    await until(() => o.log.some((l) => l.startsWith('remote:answer')) && r.candidates.length > 0 && o.candidates.length > 0, 'the exchange');
    expect(o.log.slice(0, 2)).toEqual(['createOffer', 'local:offer']);
    expect(o.log).not.toContain('createAnswer');
    expect(r.log).toEqual([`remote:offer:offer-from-${o.owner}`, 'createAnswer', 'local:answer']);
    expect(o.log).toContain(`remote:answer:answer-from-${r.owner}`);
    expect(r.candidates).toEqual([{ candidate: `cand-${o.owner}` }]);
    expect(o.candidates).toEqual([{ candidate: `cand-${r.owner}` }]);
    expect(FakePeer.all).toHaveLength(2);

    // Parting ends the call at both ends.
    await ann.moveTo([100, 100], 5000);
    await until(() => o.closed && r.closed, 'both ends closed');
    expect(annCalls.peers.size + bobCalls.peers.size).toBe(0);
    expect(ended.sort()).toEqual([ann.session!, bob.session!].sort());
    annCalls.close();
    bobCalls.close();
    a.close();
    b.close();
  });
});

describe('proximity calls, frames injected', () => {
  it('ignore a second enter for a live pair and end calls the room no longer lists', () => {
    FakePeer.all = [];
    const sent: unknown[] = [];
    let nonce = 0;
    const transport = {
      send: (f: unknown) => (sent.push(f), true),
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
    const calls = new ProximityCalls(room, { createPeerConnection: () => new FakePeer('a1') });
    const enter = { type: 'event' as const, room: 'r', seq: 2, ts: 0, kind: 'proximity.enter' as const, pair: 4, a: 'a1', b: 'b1', initiator: 'a1' };
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
});
