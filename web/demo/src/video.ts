/**
 * The place for proximity video (a later issue). Today it only shows which members are near
 * this member's avatar: those are the ones a call would connect. The later issue fills in
 * {@link ProximityVideo.update}: open a WebRTC peer connection to each nearby member, signal
 * through `room.direct(session, 'rtc.offer' | 'rtc.answer' | 'rtc.ice', …)` (and the room's
 * `direct` event), and put one <video> per call into `#video .calls`.
 */
import { h } from './util';

/** Members closer than this (plaza units) are "nearby". */
export const PROXIMITY_RADIUS = 160;

export interface Peer {
  session: string;
  name: string;
  x: number;
  y: number;
}

export class ProximityVideo {
  readonly element: HTMLElement;
  private readonly nearbyList: HTMLElement;
  private key = '';

  constructor() {
    this.nearbyList = h('p', { class: 'muted', 'data-testid': 'nearby' }, 'Nobody nearby.');
    this.element = h(
      'section',
      { id: 'video', class: 'card video', 'data-testid': 'video', 'aria-label': 'Proximity video' },
      h('h2', {}, 'Proximity video — coming in a later issue'),
      h(
        'p',
        { class: 'muted' },
        'Walk up to someone on the plaza: when proximity video arrives, a call with everyone nearby opens here.',
      ),
      this.nearbyList,
      h('div', { class: 'calls' }),
    );
  }

  /** Called every frame with this member's avatar position and everyone else's. */
  update(self: { x: number; y: number } | undefined, others: readonly Peer[]): void {
    const near = self
      ? others.filter((p) => Math.hypot(p.x - self.x, p.y - self.y) < PROXIMITY_RADIUS).map((p) => p.name)
      : [];
    near.sort();
    const key = near.join('\n');
    if (key === this.key) return;
    this.key = key;
    this.nearbyList.textContent = near.length === 0 ? 'Nobody nearby.' : `Nearby: ${near.join(', ')}`;
  }
}
