/**
 * The room view: header, the plaza (avatars and shared objects), chat, members and the place
 * for proximity video. Everything shown comes from the client's local replica of the room
 * (`room.state`), its member list and the messages of the room. The view joins and leaves,
 * and hands the room's events and the pointer to the parts that own them.
 */
import {
  PlazaClient,
  type ConnectionState,
  type DeliveryPolicy,
  type JoinOptions,
  type TransportName,
  type PresenceEvent,
  type ReplicaChange,
  type RoomMessage as PlazaMessage,
  type RoomHandle,
} from '@plaza/client';
import { Avatars } from './avatars';
import { Chat, CHAT_CHANNEL } from './chat';
import type { DebugHighlight, DebugObject } from './debug';
import { ObjectDrag } from './drag';
import { Highlights } from './highlights';
import { Members } from './members';
import { objectViews } from './objects';
import { Scene, type ObjectView } from './scene';
import { joinResuming, saveOnUnload } from './session';
import { errorCode, h, listen, now, store, toast } from './util';
import { demoTokens } from './api';
import { ProximityVideo } from './video';

/** Resolves with `promise`, or with undefined after `ms`. */
function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  return Promise.race([promise, new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), ms))]);
}

export interface RoomViewCallbacks {
  /** The view ended (leave, room deleted, join refused): show the lobby. */
  exit(): void;
}

/** The transports a page may force with `?transport=`. */
const TRANSPORTS: readonly TransportName[] = ['websocket', 'sse', 'polling'];

export class RoomView {
  readonly roomId: string;
  private readonly name: string;
  private readonly callbacks: RoomViewCallbacks;
  private readonly client: PlazaClient;
  private room: RoomHandle | undefined;
  private readonly scene = new Scene();
  private readonly video = new ProximityVideo();
  private readonly members: Members;
  private readonly chat: Chat;
  private readonly avatars: Avatars;
  private readonly highlights: Highlights;
  private readonly drag: ObjectDrag;

  // DOM
  private readonly root: HTMLElement;
  private readonly stateEl: HTMLElement;

  private frame = 0;
  private gcTimer: ReturnType<typeof setInterval> | undefined;
  private ended = false;
  private readonly cleanups: Array<() => void> = [];

  constructor(root: HTMLElement, roomId: string, name: string, callbacks: RoomViewCallbacks) {
    this.roomId = roomId;
    this.name = name;
    this.callbacks = callbacks;
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    // `?transport=sse` (or `polling`, `websocket`) forces one transport; by default the client
    // tries WebSocket, then SSE, then long polling.
    const params = new URL(location.href).searchParams;
    const forced = params.get('transport');
    const transports = TRANSPORTS.find((t) => t === forced);
    // `?upgrade_ms=N`: on a fallback, try WebSocket again every N ms (the client's default is 30 s).
    const upgradeMs = Number(params.get('upgrade_ms') ?? Number.NaN);
    this.client = new PlazaClient(`${scheme}://${location.host}/v1/ws`, {
      room: roomId,
      token: demoTokens(name),
      ...(transports === undefined ? {} : { transports: [transports] }),
      ...(Number.isFinite(upgradeMs) && upgradeMs > 0 ? { upgradeProbeMs: upgradeMs } : {}),
    });

    const room = () => this.room;
    const changed = () => this.markDirty();
    const nameOf = (session: string | undefined) => this.members.nameOf(session);
    this.members = new Members(room, (session) => this.avatars.colorOf(session), changed);
    this.chat = new Chat(roomId, room, nameOf);
    this.avatars = new Avatars({
      room,
      ended: () => this.ended,
      name,
      seen: (session, seenName) => this.members.remember(session, seenName),
      changed,
    });
    this.highlights = new Highlights(room, nameOf, changed);
    this.drag = new ObjectDrag(room, this.scene, this.highlights, nameOf, changed);

    this.stateEl = h('span', { class: 'state', 'data-testid': 'connection-state' }, this.client.state);
    const leave = h('button', { type: 'button', 'data-testid': 'leave' }, 'Leave');
    leave.addEventListener('click', () => void this.leave());

    this.root = h(
      'div',
      { class: 'room', 'data-testid': 'room', 'data-room': roomId },
      h(
        'header',
        { class: 'room-header' },
        h('h1', {}, h('span', { class: 'muted' }, 'Room '), h('span', { 'data-testid': 'room-id' }, roomId)),
        h('span', { class: 'pill' }, this.stateEl),
        h('span', { class: 'pill' }, this.members.count),
        leave,
      ),
      h(
        'div',
        { class: 'room-body' },
        h(
          'div',
          { class: 'stage' },
          h('div', { class: 'plaza-frame' }, this.scene.svg),
          h(
            'p',
            { class: 'muted hint' },
            'Click the plaza to walk there. Hover an object to highlight it; drag it to move it (others see who holds it).',
          ),
        ),
        // Beside the plaza on a wide screen, the video above the chat so that a call shows
        // without scrolling; under it on a narrow one, the video first (style.css, .room-body).
        this.members.element,
        this.video.element,
        this.chat.element,
      ),
    );
    root.replaceChildren(this.root);

    this.cleanups.push(
      this.client.on('state', (state) => this.showState(state)),
      saveOnUnload(roomId, () => (this.ended ? undefined : this.room)),
    );
    this.showState(this.client.state);
    this.bindPointer();
  }

  /** Joins the room (resuming the session saved before a reload, if any). */
  async start(): Promise<void> {
    // The camera first: a call's offer may come right after the join, and the calls must be
    // listening by then (with the media they send).
    await this.video.prepare();
    let room: RoomHandle;
    let restored: boolean;
    try {
      // Quiet mode's delivery policy, if it is on, goes with the join (and every rejoin).
      const options: JoinOptions = { name: this.name, channels: [CHAT_CHANNEL] };
      const policy = this.chat.joinPolicy();
      if (policy !== undefined) options.policy = policy;
      ({ room, restored } = await joinResuming(this.client, this.roomId, options, () => this.ended));
    } catch (err) {
      if (this.ended) return;
      toast(errorCode(err) === 'room_not_found' ? `No room ${this.roomId}` : `Cannot join ${this.roomId}: ${String(err)}`, 'error');
      this.destroy();
      this.callbacks.exit();
      return;
    }
    if (this.ended) {
      void room.leave();
      return;
    }
    this.room = room;
    this.video.start(room, (session) => this.members.nameOf(session));
    this.cleanups.push(
      room.state.on('change', (change) => this.onChange(change)),
      room.on('members', (members) => this.members.show(members)),
      room.on('presence', (e) => this.onPresence(e)),
      room.on('message', (m) => this.onMessage(m)),
      room.on('batch', (events) => this.chat.onBatch(events)),
      room.on('closed', (c) => {
        if (this.ended) return;
        toast(c.reason === 'room_deleted' ? `Room ${this.roomId} was deleted` : `Out of the room: ${c.reason}`, 'error');
        this.destroy();
        this.callbacks.exit();
      }),
    );
    this.onChange({ type: 'reset' });
    this.chat.joined(restored);
    this.gcTimer = setInterval(() => this.avatars.collect(), 1000);
    const loop = () => {
      this.draw();
      this.frame = requestAnimationFrame(loop);
    };
    this.frame = requestAnimationFrame(loop);
  }

  /** Ends the view without leaving (the page goes away or another view replaces it). */
  destroy(): void {
    if (this.ended) return;
    this.ended = true;
    cancelAnimationFrame(this.frame);
    clearInterval(this.gcTimer);
    this.drag.stop();
    this.video.stop();
    for (const cleanup of this.cleanups.splice(0)) cleanup();
    this.client.close();
  }

  /** Leaves for good: removes this member's avatar, leaves the room, shows the lobby. */
  async leave(): Promise<void> {
    if (this.ended) return;
    store.forgetSession(this.roomId);
    const room = this.room;
    if (room) {
      this.drag.stop();
      const avatarId = this.avatars.mine;
      if (avatarId !== undefined) await within(room.deleteEntity(avatarId).catch(() => undefined), 2000);
      await within(room.leave().catch(() => undefined), 2000);
    }
    this.destroy();
    this.callbacks.exit();
  }

  // ---- test hooks (window.__plaza) ----

  calls(): Array<{ pair: number; peer: string; state: string }> {
    return this.video.debugCalls();
  }

  session(): string | undefined {
    return this.room?.session;
  }

  /** The user id the server verified, when the page got a token. */
  user(): string | undefined {
    return this.client.identity?.user;
  }

  /** The transport the connection uses (or is trying). */
  transport(): TransportName {
    return this.client.transportName;
  }

  /** The delivery policy in force (as joined with or last confirmed), a copy. */
  policy(): DeliveryPolicy | undefined {
    const policy = this.room?.deliveryPolicy;
    return policy === undefined ? undefined : (JSON.parse(JSON.stringify(policy)) as DeliveryPolicy);
  }

  /** The drawn position and target of `session`'s avatar, and its colour. */
  avatar(session: string): { x: number; y: number; tx: number; ty: number; color: string } | undefined {
    const position = this.avatars.position(session);
    const color = this.avatars.colorOf(session);
    return position && color !== undefined ? { ...position, color } : undefined;
  }

  objects(): DebugObject[] {
    return this.objectViews().map((o) => ({
      id: o.id,
      x: o.x,
      y: o.y,
      color: o.color,
      holder: this.room?.state.lock(o.id)?.owner ?? null,
    }));
  }

  highlightList(): DebugHighlight[] {
    return this.highlights.list();
  }

  /** Client coordinates of a plaza point (for tests that click the plaza). */
  toClient(x: number, y: number): { x: number; y: number } {
    return this.scene.toClient(x, y);
  }

  // ---- connection, presence, messages ----

  private showState(state: ConnectionState): void {
    this.stateEl.textContent = state;
    this.stateEl.dataset['state'] = state;
  }

  private onPresence(e: PresenceEvent): void {
    if (e.kind === 'presence.join') {
      this.members.remember(e.member.session, e.member.name);
      this.avatars.joined(e.member);
      return;
    }
    this.highlights.dropSession(e.session);
    this.avatars.went(e.session, e.reason === 'left');
  }

  private onMessage(m: PlazaMessage): void {
    // Each takes only its own: chat on its channel, highlights on `main`.
    this.chat.onMessage(m);
    this.highlights.onMessage(m);
  }

  // ---- the replica ----

  private onChange(change: ReplicaChange): void {
    const room = this.room;
    if (!room || this.ended) return;
    const t = now();
    if (change.type === 'reset') {
      const entities = room.state.entities();
      const ids = new Set(entities.map((e) => e.id));
      this.avatars.reset(entities, t);
      this.highlights.dropObjects((object) => ids.has(object));
      this.drag.resynced();
      this.members.show(room.members);
      this.avatars.ensure();
    } else if (change.type === 'entity') {
      const entity = room.state.entity(change.id);
      if (!entity) {
        this.highlights.dropObjects((object) => object !== change.id);
        this.drag.removed(change.id);
        this.avatars.removed(change.id);
      } else {
        this.avatars.sync(entity, t, false);
      }
    } else if (change.type === 'renamed') {
      // Our entity got its server id: `entity` changes already moved its drawing.
      return;
    } else {
      this.drag.lockChanged(change.object);
    }
    this.markDirty();
  }

  // ---- pointer: walking, hovering, dragging ----

  private bindPointer(): void {
    const svg = this.scene.svg;
    svg.addEventListener('pointerdown', (ev) => {
      if (ev.button !== 0 || !this.room) return;
      ev.preventDefault();
      const object = this.scene.objectAt(ev.target);
      const p = this.scene.toPlaza(ev.clientX, ev.clientY);
      if (object !== undefined) this.drag.start(object, ev.pointerId, p);
      else this.avatars.walkTo(p);
    });
    svg.addEventListener('pointermove', (ev) => {
      if (this.drag.active) return;
      this.highlights.hovered = this.scene.objectAt(ev.target);
      this.highlights.setHovered();
    });
    svg.addEventListener('pointerleave', () => {
      this.highlights.hovered = undefined;
      if (!this.drag.active) this.highlights.setHovered();
    });
    this.cleanups.push(
      listen(window, 'pointermove', (ev) => this.drag.move(ev)),
      listen(window, 'pointerup', (ev) => this.drag.end(ev)),
      listen(window, 'pointercancel', (ev) => this.drag.end(ev)),
    );
  }

  // ---- drawing ----

  private dirty = true;

  private markDirty(): void {
    this.dirty = true;
  }

  private objectViews(): ObjectView[] {
    const room = this.room;
    if (!room) return [];
    return objectViews(room, this.highlights.byObject(), (id) => this.drag.position(id), (session) => this.members.nameOf(session));
  }

  private draw(): void {
    const room = this.room;
    if (!room || this.ended) return;
    const frame = this.avatars.frame(now());
    // Skip the DOM work while nothing changes and nothing moves.
    if (!this.dirty && !frame.moving && !this.drag.active) return;
    this.dirty = false;
    this.members.show(room.members);
    this.scene.draw(frame.views, this.objectViews());
  }
}
