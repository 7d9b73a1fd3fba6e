/**
 * Proximity calls: one WebRTC connection per pair in proximity, started and ended by the
 * server's `proximity.enter` / `proximity.leave` (docs/protocol.md, "A proximity call, step by
 * step"). The initiator the server names sends the offer, the other answers, ICE trickles as
 * `direct` messages; a leave closes both ends.
 */
import type { DirectFrame, Json, ProximityPair, SpaceEvent } from './frames.js';
import type { RoomHandle } from './room.js';

/** The part of `RTCPeerConnection` the calls use (so tests can pass a fake). */
export interface PeerConnection {
  createOffer(): Promise<RTCSessionDescriptionInit>;
  createAnswer(): Promise<RTCSessionDescriptionInit>;
  setLocalDescription(d: RTCSessionDescriptionInit): Promise<void>;
  setRemoteDescription(d: RTCSessionDescriptionInit): Promise<void>;
  addIceCandidate(c: RTCIceCandidateInit): Promise<void>;
  addTrack(track: MediaStreamTrack, ...streams: MediaStream[]): unknown;
  close(): void;
  onicecandidate: ((ev: { candidate: { toJSON(): RTCIceCandidateInit } | null }) => void) | null;
  ontrack: ((ev: { streams: readonly MediaStream[] }) => void) | null;
}

/** Options of {@link ProximityCalls}. */
export interface ProximityCallsOptions {
  /** Media sent to every peer (e.g. from `getUserMedia`). */
  localStream?: MediaStream;
  /** Creates each connection; default `new RTCPeerConnection(rtcConfig)`. */
  createPeerConnection?: () => PeerConnection;
  /** `RTCConfiguration` of the default connections (e.g. STUN/TURN servers). */
  rtcConfig?: RTCConfiguration;
  /** A peer's media arrived. */
  onRemoteStream?: (peer: string, stream: MediaStream, pair: number) => void;
  /** A call ended (the pair left proximity, the room ended, or the calls were closed). */
  onCallEnded?: (peer: string, pair: number) => void;
  /**
   * Signalling of a live call failed (e.g. the peer's SDP was refused); the call stays listed
   * until its pair leaves proximity. Failures of calls already ended are not reported.
   */
  onError?: (error: unknown, peer: string, pair: number) => void;
}

/** One live call. */
interface Call {
  pair: number;
  peer: string;
  pc: PeerConnection;
  /** Candidates that arrived before the remote description. */
  early: RTCIceCandidateInit[];
  remoteSet: boolean;
}

/** Signalling events, sent as `direct` messages. */
const OFFER = 'rtc.offer';
const ANSWER = 'rtc.answer';
const ICE = 'rtc.ice';

/** The WebRTC calls of one member of a spatial room. */
export class ProximityCalls {
  private readonly calls = new Map<number, Call>();
  private readonly offs: Array<() => void> = [];

  constructor(
    private readonly room: RoomHandle,
    private readonly options: ProximityCallsOptions = {},
  ) {
    this.offs.push(
      room.on('space', (e) => this.onSpace(e)),
      room.on('direct', (d) => {
        const call = this.callOf(d);
        if (call) this.guard(call, this.onDirect(call, d));
      }),
      // Leave, deletion, a failed rejoin, the client closed: the calls end with the room.
      room._whenEnded(() => this.close()),
      // A resume (or a first join inside a pair) lists the pairs this member is in.
      room.on('joined', () => this.startListedPairs()),
      room.on('resync', () => this.startListedPairs()),
    );
    this.startListedPairs();
  }

  /** The pairs with a call, by pair id → the peer's session. */
  get peers(): ReadonlyMap<number, string> {
    return new Map([...this.calls].map(([pair, c]) => [pair, c.peer]));
  }

  /** The connection of `pair`, if it has a call. */
  connection(pair: number): PeerConnection | undefined {
    return this.calls.get(pair)?.pc;
  }

  /** Ends every call and stops listening. */
  close(): void {
    for (const off of this.offs.splice(0)) off();
    for (const pair of [...this.calls.keys()]) this.end(pair);
  }

  private startListedPairs(): void {
    // Calls the room no longer lists ended while this member was away.
    for (const pair of [...this.calls.keys()]) {
      if (!this.room.proximityPairs.has(pair)) this.end(pair);
    }
    for (const p of this.room.proximityPairs.values()) this.begin(p);
  }

  private onSpace(e: SpaceEvent): void {
    if (e.kind === 'proximity.enter') this.begin(e);
    else if (e.kind === 'proximity.leave') this.end(e.pair);
  }

  /** A pair entered proximity: the initiator offers; the other waits for the offer. */
  private begin(p: ProximityPair): void {
    const self = this.room.session;
    if (self === undefined || this.calls.has(p.pair)) return; // a live pair: ignored
    const peer = p.a === self ? p.b : p.a;
    const call = this.open(p.pair, peer);
    if (p.initiator === self) this.guard(call, this.offer(call));
  }

  private open(pair: number, peer: string): Call {
    // A browser's RTCPeerConnection has this shape (its event types are richer).
    const pc: PeerConnection =
      this.options.createPeerConnection?.() ??
      (new RTCPeerConnection(this.options.rtcConfig) as unknown as PeerConnection);
    const call: Call = { pair, peer, pc, early: [], remoteSet: false };
    this.calls.set(pair, call);
    const stream = this.options.localStream;
    if (stream) for (const track of stream.getTracks()) pc.addTrack(track, stream);
    pc.onicecandidate = (ev: { candidate: { toJSON(): RTCIceCandidateInit } | null }) => {
      if (ev.candidate && this.calls.get(pair) === call) {
        this.send(peer, ICE, { pair, candidate: ev.candidate.toJSON() as unknown as Json });
      }
    };
    pc.ontrack = (ev: { streams: readonly MediaStream[] }) => {
      const remote = ev.streams[0];
      if (remote && this.calls.get(pair) === call) this.options.onRemoteStream?.(peer, remote, pair);
    };
    return call;
  }

  /** Reports a failed step of `call`'s signalling, unless the call ended meanwhile. */
  private guard(call: Call, step: Promise<void>): void {
    step.catch((error: unknown) => {
      if (this.calls.get(call.pair) === call) this.options.onError?.(error, call.peer, call.pair);
    });
  }

  private async offer(call: Call): Promise<void> {
    const offer = await call.pc.createOffer();
    await call.pc.setLocalDescription(offer);
    if (this.calls.get(call.pair) === call) this.send(call.peer, OFFER, { pair: call.pair, sdp: offer.sdp ?? '' });
  }

  /** The live call a `direct` signals for; signalling for a pair that ended, or from someone else, has none. */
  private callOf(d: DirectFrame): Call | undefined {
    const pair = (d.data as { pair?: unknown } | undefined)?.pair;
    if (typeof pair !== 'number') return undefined;
    const call = this.calls.get(pair);
    return call?.peer === d.from ? call : undefined;
  }

  private async onDirect(call: Call, d: DirectFrame): Promise<void> {
    const data = d.data as { sdp?: string; candidate?: RTCIceCandidateInit };
    if (d.event === OFFER && typeof data.sdp === 'string') {
      await call.pc.setRemoteDescription({ type: 'offer', sdp: data.sdp });
      await this.remoteSet(call);
      const answer = await call.pc.createAnswer();
      await call.pc.setLocalDescription(answer);
      if (this.calls.get(call.pair) === call) this.send(call.peer, ANSWER, { pair: call.pair, sdp: answer.sdp ?? '' });
    } else if (d.event === ANSWER && typeof data.sdp === 'string') {
      await call.pc.setRemoteDescription({ type: 'answer', sdp: data.sdp });
      await this.remoteSet(call);
    } else if (d.event === ICE && data.candidate) {
      if (call.remoteSet) await call.pc.addIceCandidate(data.candidate);
      else call.early.push(data.candidate);
    }
  }

  private async remoteSet(call: Call): Promise<void> {
    call.remoteSet = true;
    for (const c of call.early.splice(0)) await call.pc.addIceCandidate(c);
  }

  private end(pair: number): void {
    const call = this.calls.get(pair);
    if (!call) return;
    this.calls.delete(pair);
    call.pc.onicecandidate = null;
    call.pc.ontrack = null;
    call.pc.close();
    this.options.onCallEnded?.(call.peer, pair);
  }

  private send(peer: string, event: string, data: Json): void {
    try {
      this.room.direct(peer, event, data);
    } catch {
      // The room ended: its calls end with it.
    }
  }
}
