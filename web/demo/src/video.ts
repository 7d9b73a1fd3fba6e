/**
 * Proximity video: a WebRTC call with every member the server says is in proximity
 * (`proximity.enter`), mesh, started by the initiator it names and closed at `proximity.leave`
 * ({@link ProximityCalls} of @plaza/client). The camera and microphone are asked for once, when
 * the room is joined; without them the calls still connect, receiving only.
 */
import { ProximityCalls, type RoomHandle } from '@plaza/client';
import { h } from './util';

/** Members closer than this (plaza units) are in proximity: the room's `space.proximity_radius`. */
export const PROXIMITY_RADIUS = 160;

/** A call as the test hook shows it. */
export interface DebugCall {
  pair: number;
  peer: string;
  /** `RTCPeerConnection.connectionState`. */
  state: string;
}

export class ProximityVideo {
  readonly element: HTMLElement;
  private readonly status: HTMLElement;
  private readonly callsBox: HTMLElement;
  private readonly preview: HTMLVideoElement;
  private calls: ProximityCalls | undefined;
  private stream: MediaStream | undefined;
  private readonly videos = new Map<number, HTMLVideoElement>();
  private nameOf: (session: string) => string = (s) => s;
  private readonly offs: Array<() => void> = [];
  /** `stop()` ran: a camera granted afterwards is released at once. */
  private stopped = false;

  constructor() {
    this.status = h('p', { class: 'muted', 'data-testid': 'nearby' }, 'Nobody nearby.');
    this.preview = h('video', { class: 'preview', 'data-testid': 'local-video', muted: '', playsinline: '' }) as HTMLVideoElement;
    this.preview.muted = true;
    this.callsBox = h('div', { class: 'calls', 'data-testid': 'calls' });
    this.element = h(
      'section',
      { id: 'video', class: 'card video', 'data-testid': 'video', 'aria-label': 'Proximity video' },
      h('h2', {}, 'Proximity video'),
      h('p', { class: 'muted' }, 'Walk up to someone on the plaza: a video call opens while you stand together.'),
      this.status,
      h('div', { class: 'media' }, this.preview, this.callsBox),
    );
  }

  /** Asks for the camera and microphone (before joining). */
  async prepare(): Promise<void> {
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ video: true, audio: true });
      if (this.stopped) {
        // The room was left while the permission prompt was open.
        for (const track of stream.getTracks()) track.stop();
        return;
      }
      this.stream = stream;
      this.preview.srcObject = this.stream;
      void this.preview.play().catch(() => undefined);
    } catch (err) {
      this.status.textContent = `No camera or microphone (${String(err)}): calls receive only.`;
    }
  }

  /**
   * Starts the calls of `room` (a spatial room; others have no calls), at once after the join:
   * an offer may follow the `joined` frame right away.
   */
  start(room: RoomHandle, nameOf: (session: string) => string): void {
    this.nameOf = nameOf;
    const options = {
      onRemoteStream: (peer: string, stream: MediaStream, pair: number) => this.show(pair, peer, stream),
      onCallEnded: (_peer: string, pair: number) => this.hide(pair),
      onError: (error: unknown, peer: string) => console.warn(`call with ${this.nameOf(peer)}:`, error),
    };
    this.calls = new ProximityCalls(room, this.stream ? { ...options, localStream: this.stream } : options);
    const update = () => this.updateStatus(room);
    // A resume in place lists the pairs anew in its joined or resync.
    this.offs.push(room.on('space', update), room.on('joined', update), room.on('resync', update));
    update();
  }

  /** Ends every call and releases the camera. */
  stop(): void {
    this.stopped = true;
    for (const off of this.offs.splice(0)) off();
    this.calls?.close();
    this.calls = undefined;
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.stream = undefined;
  }

  /** The live calls, for tests. */
  debugCalls(): DebugCall[] {
    const calls = this.calls;
    if (!calls) return [];
    return [...calls.peers].map(([pair, peer]) => {
      const pc = calls.connection(pair) as unknown as RTCPeerConnection | undefined;
      return { pair, peer, state: pc?.connectionState ?? 'closed' };
    });
  }

  private show(pair: number, peer: string, stream: MediaStream): void {
    let video = this.videos.get(pair);
    if (!video) {
      video = h('video', { class: 'remote', 'data-testid': 'remote-video', 'data-peer': peer, playsinline: '' }) as HTMLVideoElement;
      video.muted = true; // autoplay without a gesture; the demo shows the video
      this.videos.set(pair, video);
      this.callsBox.append(h('figure', { 'data-pair': String(pair) }, video, h('figcaption', {}, this.nameOf(peer))));
    }
    video.srcObject = stream;
    void video.play().catch(() => undefined);
  }

  private hide(pair: number): void {
    const video = this.videos.get(pair);
    this.videos.delete(pair);
    video?.closest('figure')?.remove();
  }

  private updateStatus(room: RoomHandle): void {
    const self = room.session;
    const near = [...room.proximityPairs.values()]
      .map((p) => this.nameOf(p.a === self ? p.b : p.a))
      .sort();
    this.status.textContent = near.length === 0 ? 'Nobody nearby.' : `In a call with ${near.join(', ')}`;
  }
}
