/**
 * The room view: header, the plaza (avatars and shared objects), chat, members and the place
 * for proximity video. Everything shown comes from the client's local replica of the room
 * (`room.state`), its member list and the messages of the room.
 */
import {
  PlazaClient,
  PlazaError,
  type ConnectionState,
  type Entity,
  type Json,
  type Member,
  type PresenceEvent,
  type ReplicaChange,
  type RoomMessage as PlazaMessage,
  type RoomHandle,
} from '@plaza/client';
import { Motion } from './motion';
import { AVATAR_RADIUS, HEIGHT, OBJECT_HALF, Scene, WIDTH, type AvatarView, type ObjectView } from './scene';
import { h, pick, PALETTE, store, toast } from './util';
import { ProximityVideo, type Peer } from './video';

/** What `room.saveSession()` returns and `join({restore})` takes. */
type SavedSession = ReturnType<RoomHandle['saveSession']>;

/** The channel chat messages go on (joined at `join`, besides `main`). */
const CHAT_CHANNEL = 'chat';
/** Lease of an object's lock while it is dragged; renewed every {@link RENEW_MS}. */
const LOCK_TTL_MS = 15_000;
const RENEW_MS = 5_000;
/** At most one position patch per this many ms while dragging (≤ 20/s). */
const PATCH_INTERVAL_MS = 50;
/**
 * How long an avatar stays after its member disconnected (not left) before it is removed:
 * a reload or a network drop resumes the same session well within it.
 */
const ABSENT_GRACE_MS = 10_000;

/** `data` of an entity of kind `avatar`. */
export interface AvatarData {
  session: string;
  name: string;
  x: number;
  y: number;
  tx: number;
  ty: number;
  color: string;
}

/** `data` of an entity of kind `object`. */
export interface ObjectData {
  x: number;
  y: number;
  color: string;
  label: string;
}

/** Read-only state for tests (`window.__plaza`). */
export interface DebugObject {
  id: string;
  x: number;
  y: number;
  /** Session id of the lock's holder, or null. */
  holder: string | null;
}

export interface DebugHighlight {
  object: string;
  /** Session id of the member highlighting it. */
  by: string;
  name: string;
}

interface Drag {
  id: string;
  pointerId: number;
  /** Pointer minus object centre at pointer-down. */
  offX: number;
  offY: number;
  /** Where the object is being dragged to. */
  x: number;
  y: number;
  /** `acquiring`: lock requested; `held`: dragging; `ending`: released before the lock came. */
  phase: 'acquiring' | 'held' | 'ending';
  /** Moved since the last patch sent. */
  dirty: boolean;
  lastSent: number;
  timer?: ReturnType<typeof setTimeout>;
  renew?: ReturnType<typeof setInterval>;
}

const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isObj = (v: Json | undefined): v is { [k: string]: Json } => typeof v === 'object' && v !== null && !Array.isArray(v);
const clamp = (v: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, v));
const now = () => performance.now();

export function avatarData(e: Entity | undefined): AvatarData | undefined {
  if (!e || e.kind !== 'avatar' || !isObj(e.data)) return undefined;
  const d = e.data;
  if (typeof d['session'] !== 'string' || !isNum(d['x']) || !isNum(d['y'])) return undefined;
  return {
    session: d['session'],
    name: typeof d['name'] === 'string' ? d['name'] : d['session'],
    x: d['x'],
    y: d['y'],
    tx: isNum(d['tx']) ? d['tx'] : d['x'],
    ty: isNum(d['ty']) ? d['ty'] : d['y'],
    color: typeof d['color'] === 'string' ? d['color'] : '#888',
  };
}

export function objectData(e: Entity | undefined): ObjectData | undefined {
  if (!e || e.kind !== 'object' || !isObj(e.data)) return undefined;
  const d = e.data;
  if (!isNum(d['x']) || !isNum(d['y'])) return undefined;
  return {
    x: d['x'],
    y: d['y'],
    color: typeof d['color'] === 'string' ? d['color'] : '#999',
    label: typeof d['label'] === 'string' ? d['label'] : e.id,
  };
}

function errorCode(err: unknown): string | undefined {
  return err instanceof PlazaError ? err.code : undefined;
}

/** Resolves with `promise`, or with undefined after `ms`. */
function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  return Promise.race([promise, new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), ms))]);
}

export interface RoomViewCallbacks {
  /** The view ended (leave, room deleted, join refused): show the lobby. */
  exit(): void;
}

export class RoomView {
  readonly roomId: string;
  private readonly name: string;
  private readonly callbacks: RoomViewCallbacks;
  private readonly client: PlazaClient;
  private room: RoomHandle | undefined;
  private readonly scene = new Scene();
  private readonly video = new ProximityVideo();

  // DOM
  private readonly root: HTMLElement;
  private readonly stateEl: HTMLElement;
  private readonly countEl: HTMLElement;
  private readonly memberList: HTMLElement;
  private readonly chatLog: HTMLElement;
  private readonly chatInput: HTMLInputElement;

  // Local view state
  /** Avatar entity id → its movement. */
  private readonly motions = new Map<string, Motion>();
  /** Session → the object it highlights (transient, from `highlight` messages). */
  private readonly highlights = new Map<string, string>();
  /** The object this member highlights. */
  private myHighlight: string | undefined;
  private hovered: string | undefined;
  private drag: Drag | undefined;
  /** This member's avatar entity id. */
  private avatarId: string | undefined;
  private creatingAvatar = false;
  /** Session → when this tab first saw it absent while it still had an avatar. */
  private readonly absentSince = new Map<string, number>();
  /** Sessions that left for good (their avatars go at once). */
  private readonly leftSessions = new Set<string>();
  private readonly deleting = new Set<string>();
  /** Every name seen, by session (for chat lines of members who have gone). */
  private readonly names = new Map<string, string>();

  private frame = 0;
  private gcTimer: ReturnType<typeof setInterval> | undefined;
  private ended = false;
  private readonly cleanups: Array<() => void> = [];

  constructor(root: HTMLElement, roomId: string, name: string, callbacks: RoomViewCallbacks) {
    this.roomId = roomId;
    this.name = name;
    this.callbacks = callbacks;
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    this.client = new PlazaClient(`${scheme}://${location.host}/v1/ws`, { room: roomId });

    this.stateEl = h('span', { class: 'state', 'data-testid': 'connection-state' }, this.client.state);
    this.countEl = h('span', { 'data-testid': 'member-count' }, '0');
    const leave = h('button', { type: 'button', 'data-testid': 'leave' }, 'Leave');
    leave.addEventListener('click', () => void this.leave());

    this.memberList = h('ul', { class: 'members', 'data-testid': 'member-list' });
    this.chatLog = h('ol', { class: 'chat-log', 'data-testid': 'chat-log', 'aria-live': 'polite' });
    this.chatInput = h('input', {
      'data-testid': 'chat-input',
      placeholder: 'Say something…',
      maxlength: 500,
      autocomplete: 'off',
      'aria-label': 'Chat message',
    });
    const send = h('button', { type: 'submit', 'data-testid': 'chat-send' }, 'Send');
    const chatForm = h('form', { class: 'chat-form' }, this.chatInput, send);
    chatForm.addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.sendChat();
    });

    this.root = h(
      'div',
      { class: 'room', 'data-testid': 'room', 'data-room': roomId },
      h(
        'header',
        { class: 'room-header' },
        h('h1', {}, h('span', { class: 'muted' }, 'Room '), h('span', { 'data-testid': 'room-id' }, roomId)),
        h('span', { class: 'pill' }, this.stateEl),
        h('span', { class: 'pill' }, this.countEl, ' members'),
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
          this.video.element,
        ),
        h(
          'aside',
          { class: 'side' },
          h('section', { class: 'card' }, h('h2', {}, 'Members'), this.memberList),
          h('section', { class: 'card chat' }, h('h2', {}, 'Chat'), this.chatLog, chatForm),
        ),
      ),
    );
    root.replaceChildren(this.root);

    this.cleanups.push(
      this.client.on('state', (state) => this.showState(state)),
      listen(window, 'pagehide', () => this.saveSession()),
      listen(window, 'beforeunload', () => this.saveSession()),
    );
    this.showState(this.client.state);
    this.bindPointer();
  }

  /** Joins the room (resuming the session saved before a reload, if any). */
  async start(): Promise<void> {
    const saved = store.takeSession(this.roomId) as SavedSession | undefined;
    const options = { name: this.name, channels: [CHAT_CHANNEL] };
    let room: RoomHandle;
    try {
      try {
        room = await this.client.join(this.roomId, saved === undefined ? options : { ...options, restore: saved });
      } catch (err) {
        // A saved session that cannot be restored (malformed, another server): join afresh.
        if (saved === undefined || this.ended || errorCode(err) === 'room_not_found') throw err;
        console.warn('plaza demo: restoring the saved session failed, joining afresh', err);
        room = await this.client.join(this.roomId, options);
      }
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
    this.cleanups.push(
      room.state.on('change', (change) => this.onChange(change)),
      room.on('members', (members) => this.showMembers(members)),
      room.on('presence', (e) => this.onPresence(e)),
      room.on('message', (m) => this.onMessage(m)),
      room.on('closed', (c) => {
        if (this.ended) return;
        toast(c.reason === 'room_deleted' ? `Room ${this.roomId} was deleted` : `Out of the room: ${c.reason}`, 'error');
        this.destroy();
        this.callbacks.exit();
      }),
    );
    this.onChange({ type: 'reset' });
    this.gcTimer = setInterval(() => this.collectAvatars(), 1000);
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
    this.stopDrag();
    for (const cleanup of this.cleanups.splice(0)) cleanup();
    this.client.close();
  }

  /** Leaves for good: removes this member's avatar, leaves the room, shows the lobby. */
  async leave(): Promise<void> {
    if (this.ended) return;
    store.forgetSession(this.roomId);
    const room = this.room;
    if (room) {
      this.stopDrag();
      if (this.avatarId !== undefined) await within(room.deleteEntity(this.avatarId).catch(() => undefined), 2000);
      await within(room.leave().catch(() => undefined), 2000);
    }
    this.destroy();
    this.callbacks.exit();
  }

  // ---- test hooks (window.__plaza) ----

  session(): string | undefined {
    return this.room?.session;
  }

  /** The drawn position and target of `session`'s avatar. */
  avatar(session: string): { x: number; y: number; tx: number; ty: number } | undefined {
    const entity = this.avatarEntityOf(session);
    if (!entity) return undefined;
    const motion = this.motions.get(entity.id);
    if (!motion) return undefined;
    const p = motion.at(now());
    return { x: p.x, y: p.y, tx: motion.target.x, ty: motion.target.y };
  }

  objects(): DebugObject[] {
    return this.objectViews().map((o) => ({
      id: o.id,
      x: o.x,
      y: o.y,
      holder: this.room?.state.lock(o.id)?.owner ?? null,
    }));
  }

  highlightList(): DebugHighlight[] {
    return [...this.highlights].map(([by, object]) => ({ object, by, name: this.nameOf(by) }));
  }

  /** Client coordinates of a plaza point (for tests that click the plaza). */
  toClient(x: number, y: number): { x: number; y: number } {
    return this.scene.toClient(x, y);
  }

  // ---- connection, members, presence ----

  private showState(state: ConnectionState): void {
    this.stateEl.textContent = state;
    this.stateEl.dataset['state'] = state;
  }

  private membersKey = '';

  /** Renders the member list (with each member's avatar colour) if anything in it changed. */
  private showMembers(members: readonly Member[]): void {
    const me = this.room?.session;
    for (const m of members) this.names.set(m.session, m.name);
    const rows = members.map((m) => ({ ...m, color: avatarData(this.avatarEntityOf(m.session))?.color ?? '#888' }));
    const key = JSON.stringify([me, rows]);
    if (key === this.membersKey) return;
    this.membersKey = key;
    this.countEl.textContent = String(members.length);
    this.memberList.replaceChildren(
      ...rows.map((m) =>
        h(
          'li',
          { 'data-session': m.session, class: m.session === me ? 'self' : '' },
          h('span', { class: 'dot', style: `background:${m.color}` }),
          m.name,
          m.session === me ? h('span', { class: 'muted' }, ' (you)') : '',
          m.platform !== 'browser' ? h('span', { class: 'muted' }, ` · ${m.platform}`) : '',
        ),
      ),
    );
    this.markDirty();
  }

  private onPresence(e: PresenceEvent): void {
    if (e.kind === 'presence.join') {
      this.names.set(e.member.session, e.member.name);
      this.absentSince.delete(e.member.session);
      this.leftSessions.delete(e.member.session);
      return;
    }
    if (this.highlights.delete(e.session)) this.markDirty();
    if (!this.absentSince.has(e.session)) this.absentSince.set(e.session, now());
    if (e.reason === 'left') this.leftSessions.add(e.session);
    this.collectAvatars();
  }

  /**
   * Removes the avatars of members who left (at once) or stayed disconnected longer than
   * {@link ABSENT_GRACE_MS}. Only the present member with the smallest session id does it, so
   * that one request per avatar reaches the server.
   */
  private collectAvatars(): void {
    const room = this.room;
    const me = room?.session;
    if (!room || me === undefined || !room.live || this.ended) return;
    const present = new Set(room.members.map((m) => m.session));
    if (!present.has(me)) return;
    const smallest = [...present].sort()[0];
    const t = now();
    for (const entity of room.state.entities()) {
      const data = avatarData(entity);
      if (!data) continue;
      if (present.has(data.session)) {
        this.absentSince.delete(data.session);
        continue;
      }
      const since = this.absentSince.get(data.session) ?? t;
      this.absentSince.set(data.session, since);
      const due = this.leftSessions.has(data.session) || t - since >= ABSENT_GRACE_MS;
      if (!due || smallest !== me || this.deleting.has(entity.id)) continue;
      this.deleting.add(entity.id);
      room
        .deleteEntity(entity.id)
        .catch((err: unknown) => {
          if (errorCode(err) !== 'entity_not_found') console.warn('plaza demo: removing an avatar failed', err);
        })
        .finally(() => this.deleting.delete(entity.id));
    }
  }

  // ---- the replica ----

  private onChange(change: ReplicaChange): void {
    const room = this.room;
    if (!room || this.ended) return;
    const t = now();
    if (change.type === 'reset') {
      const entities = room.state.entities();
      const ids = new Set(entities.map((e) => e.id));
      for (const id of this.motions.keys()) if (!ids.has(id)) this.motions.delete(id);
      for (const entity of entities) this.syncAvatar(entity, t, true);
      for (const [session, object] of this.highlights) if (!ids.has(object)) this.highlights.delete(session);
      if (this.drag?.phase === 'held' && room.state.lock(this.drag.id)?.owner !== room.session) {
        this.cancelDrag('the lock was lost');
      }
      this.showMembers(room.members);
      this.ensureAvatar();
    } else if (change.type === 'entity') {
      const entity = room.state.entity(change.id);
      if (!entity) {
        this.motions.delete(change.id);
        for (const [session, object] of this.highlights) if (object === change.id) this.highlights.delete(session);
        if (this.drag?.id === change.id) this.cancelDrag('the object was removed');
        if (change.id === this.avatarId) {
          this.avatarId = undefined;
          this.ensureAvatar();
        }
      } else {
        this.syncAvatar(entity, t, false);
      }
    } else if (change.type === 'renamed') {
      // Our entity got its server id: `entity` changes already moved its drawing.
      return;
    } else {
      const lock = room.state.lock(change.object);
      const drag = this.drag;
      if (drag?.id === change.object && drag.phase === 'held' && lock?.owner !== room.session) {
        // Expired, or released by a disconnect: stop before moving it unlocked.
        this.cancelDrag(lock ? `taken by ${this.nameOf(lock.owner)}` : 'the lock was lost');
      }
    }
    this.markDirty();
  }

  /** Follows an avatar entity: a new target starts a movement from where it is drawn now. */
  private syncAvatar(entity: Entity, t: number, fromSnapshot: boolean): void {
    const data = avatarData(entity);
    if (!data) return;
    this.names.set(data.session, data.name);
    if (data.session === this.room?.session) this.avatarId = entity.id;
    const motion = this.motions.get(entity.id);
    if (motion) {
      motion.retarget(data.tx, data.ty, t);
    } else if (fromSnapshot) {
      // Seen for the first time in a snapshot: it most likely arrived long ago.
      this.motions.set(entity.id, new Motion(data.tx, data.ty, t));
    } else {
      const m = new Motion(data.x, data.y, t);
      m.retarget(data.tx, data.ty, t);
      this.motions.set(entity.id, m);
    }
  }

  /** Creates this member's avatar unless it has one (after a resume it reuses it). */
  private ensureAvatar(): void {
    const room = this.room;
    const me = room?.session;
    if (!room || me === undefined || this.ended || this.creatingAvatar) return;
    const existing = this.avatarEntityOf(me);
    if (existing) {
      this.avatarId = existing.id;
      return;
    }
    this.creatingAvatar = true;
    const x = Math.round(80 + Math.random() * (WIDTH - 160));
    const y = Math.round(80 + Math.random() * (HEIGHT - 160));
    // A colour nobody in the room wears yet, while there is one.
    const worn = new Set(room.state.entities().map((e) => avatarData(e)?.color));
    const free = PALETTE.filter((c) => !worn.has(c));
    const color = pick(free.length > 0 ? free : PALETTE);
    const data: AvatarData = { session: me, name: this.name, x, y, tx: x, ty: y, color };
    room
      .createEntity('avatar', { ...data })
      .then((entity) => {
        this.avatarId = entity.id;
        this.syncAvatar(entity, now(), false);
        this.markDirty();
      })
      .catch((err: unknown) => {
        if (!this.ended) console.warn('plaza demo: creating the avatar failed', err);
      })
      .finally(() => {
        this.creatingAvatar = false;
        // The session may have changed meanwhile (a resync with a new session).
        if (!this.ended && this.room?.session !== me) this.ensureAvatar();
      });
  }

  private avatarEntityOf(session: string): Entity | undefined {
    return this.room?.state.entities().find((e) => avatarData(e)?.session === session);
  }

  private nameOf(session: string | undefined): string {
    if (session === undefined) return 'someone';
    return this.room?.members.find((m) => m.session === session)?.name ?? this.names.get(session) ?? session.slice(0, 6);
  }

  // ---- chat and highlights ----

  private sendChat(): void {
    const text = this.chatInput.value.trim();
    const room = this.room;
    if (!text || !room) return;
    this.chatInput.value = '';
    // Echoed back: the own message is shown once, when its event arrives.
    room.publish('chat', { text }, { channel: CHAT_CHANNEL, echo: true }).catch((err: unknown) => {
      toast(`Message not sent: ${String(err)}`, 'error');
    });
  }

  private onMessage(m: PlazaMessage): void {
    if (m.channel === CHAT_CHANNEL && m.event === 'chat' && isObj(m.data) && typeof m.data['text'] === 'string') {
      const mine = m.from !== undefined && m.from === this.room?.session;
      const line = h(
        'li',
        { 'data-seq': m.seq, 'data-from': m.from ?? '', class: mine ? 'self' : '' },
        h('b', {}, `${this.nameOf(m.from)}: `),
        m.data['text'],
      );
      const atBottom = this.chatLog.scrollTop + this.chatLog.clientHeight >= this.chatLog.scrollHeight - 8;
      this.chatLog.append(line);
      if (atBottom) this.chatLog.scrollTop = this.chatLog.scrollHeight;
    } else if (m.channel === 'main' && m.event === 'highlight' && m.from !== undefined && isObj(m.data)) {
      const object = m.data['object'];
      if (typeof object !== 'string') return;
      if (m.data['on'] === true) this.highlights.set(m.from, object);
      else if (this.highlights.get(m.from) === object) this.highlights.delete(m.from);
      this.markDirty();
    }
  }

  /** Highlights `object` (or nothing) for everyone: a transient message, not room state. */
  private setHighlight(object: string | undefined): void {
    const room = this.room;
    const me = room?.session;
    if (!room || me === undefined || object === this.myHighlight) return;
    const previous = this.myHighlight;
    this.myHighlight = object;
    const fail = (err: unknown) => console.warn('plaza demo: highlight not sent', err);
    if (previous !== undefined) {
      this.highlights.delete(me);
      room.publish('highlight', { object: previous, on: false }, { channel: 'main' }).catch(fail);
    }
    if (object !== undefined) {
      this.highlights.set(me, object);
      room.publish('highlight', { object, on: true }, { channel: 'main' }).catch(fail);
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
      if (object !== undefined) this.startDrag(object, ev.pointerId, p);
      else this.walkTo(p);
    });
    svg.addEventListener('pointermove', (ev) => {
      if (this.drag) return;
      this.hovered = this.scene.objectAt(ev.target);
      this.setHighlight(this.hovered);
    });
    svg.addEventListener('pointerleave', () => {
      this.hovered = undefined;
      if (!this.drag) this.setHighlight(undefined);
    });
    this.cleanups.push(
      listen(window, 'pointermove', (ev) => this.onDragMove(ev)),
      listen(window, 'pointerup', (ev) => this.onDragEnd(ev)),
      listen(window, 'pointercancel', (ev) => this.onDragEnd(ev)),
    );
  }

  /** Sends only the new target: every tab animates the walk itself. */
  private walkTo(p: { x: number; y: number }): void {
    const room = this.room;
    const id = this.avatarId;
    if (!room || id === undefined) return;
    const tx = Math.round(clamp(p.x, AVATAR_RADIUS, WIDTH - AVATAR_RADIUS));
    const ty = Math.round(clamp(p.y, AVATAR_RADIUS, HEIGHT - AVATAR_RADIUS));
    const from = this.motions.get(id)?.at(now());
    const patch: { [k: string]: Json } = { tx, ty };
    if (from) {
      patch['x'] = Math.round(from.x);
      patch['y'] = Math.round(from.y);
    }
    room.patchEntity(id, patch).catch((err: unknown) => console.warn('plaza demo: move refused', err));
  }

  private startDrag(id: string, pointerId: number, p: { x: number; y: number }): void {
    const room = this.room;
    const data = objectData(room?.state.entity(id));
    if (!room || !data || this.drag) return;
    const drag: Drag = {
      id,
      pointerId,
      offX: p.x - data.x,
      offY: p.y - data.y,
      x: data.x,
      y: data.y,
      phase: 'acquiring',
      dirty: false,
      lastSent: 0,
    };
    this.drag = drag;
    this.setHighlight(id);
    room.acquireLock(id, { ttlMs: LOCK_TTL_MS }).then(
      () => {
        if (this.drag !== drag) {
          // Cancelled while the lock was on its way.
          room.releaseLock(id).catch(() => undefined);
          return;
        }
        if (drag.phase === 'ending') {
          this.finishDrag(drag);
          return;
        }
        drag.phase = 'held';
        drag.renew = setInterval(() => {
          room.renewLock(id, { ttlMs: LOCK_TTL_MS }).catch((err: unknown) => {
            if (this.drag === drag) this.cancelDrag(`the lock was lost (${errorCode(err) ?? String(err)})`);
          });
        }, RENEW_MS);
        if (drag.dirty) this.schedulePatch(drag);
        this.markDirty();
      },
      (err: unknown) => {
        if (this.drag === drag) this.drag = undefined;
        this.setHighlight(this.hovered);
        if (errorCode(err) === 'lock_held') {
          toast(`${this.labelOf(id)} is held by ${this.nameOf(room.state.lock(id)?.owner)}`);
        } else {
          toast(`Cannot grab ${this.labelOf(id)}: ${String(err)}`, 'error');
        }
      },
    );
  }

  private onDragMove(ev: PointerEvent): void {
    const drag = this.drag;
    if (!drag || ev.pointerId !== drag.pointerId || drag.phase === 'ending') return;
    const p = this.scene.toPlaza(ev.clientX, ev.clientY);
    drag.x = Math.round(clamp(p.x - drag.offX, OBJECT_HALF, WIDTH - OBJECT_HALF));
    drag.y = Math.round(clamp(p.y - drag.offY, OBJECT_HALF, HEIGHT - OBJECT_HALF));
    drag.dirty = true;
    if (drag.phase === 'held') this.schedulePatch(drag);
    this.markDirty();
  }

  private onDragEnd(ev: PointerEvent): void {
    const drag = this.drag;
    if (!drag || ev.pointerId !== drag.pointerId) return;
    if (drag.phase === 'acquiring') drag.phase = 'ending';
    else if (drag.phase === 'held') this.finishDrag(drag);
  }

  /** Throttles position patches to one per {@link PATCH_INTERVAL_MS}. */
  private schedulePatch(drag: Drag): void {
    if (drag.timer !== undefined) return;
    const wait = Math.max(0, drag.lastSent + PATCH_INTERVAL_MS - now());
    drag.timer = setTimeout(() => {
      drag.timer = undefined;
      if (this.drag === drag && drag.phase === 'held') this.sendPatch(drag);
    }, wait);
  }

  private sendPatch(drag: Drag): void {
    const room = this.room;
    if (!room || !drag.dirty) return;
    drag.dirty = false;
    drag.lastSent = now();
    room.patchEntity(drag.id, { x: drag.x, y: drag.y }).catch((err: unknown) => {
      // The replica has rolled the optimistic change back.
      const code = errorCode(err);
      if (code === 'lock_held') toast(`${this.labelOf(drag.id)} is held by ${this.nameOf(room.state.lock(drag.id)?.owner)}`);
      else if (code !== 'entity_not_found') console.warn('plaza demo: object move refused', err);
      if (this.drag === drag) this.cancelDrag();
    });
  }

  /** Drop: the last position, then the lock goes. */
  private finishDrag(drag: Drag): void {
    const room = this.room;
    clearTimeout(drag.timer);
    clearInterval(drag.renew);
    drag.timer = undefined;
    if (room) {
      this.sendPatch(drag);
      room.releaseLock(drag.id).catch((err: unknown) => {
        if (errorCode(err) !== 'lock_not_held') console.warn('plaza demo: releasing the lock failed', err);
      });
    }
    if (this.drag === drag) this.drag = undefined;
    this.setHighlight(this.hovered);
    this.markDirty();
  }

  /** Stops dragging without a final patch (the lock is lost, or the object gone). */
  private cancelDrag(reason?: string): void {
    const drag = this.drag;
    if (!drag) return;
    this.stopDrag();
    if (reason !== undefined) toast(`Dropped ${this.labelOf(drag.id)}: ${reason}`);
    this.setHighlight(this.hovered);
  }

  private stopDrag(): void {
    const drag = this.drag;
    if (!drag) return;
    clearTimeout(drag.timer);
    clearInterval(drag.renew);
    this.drag = undefined;
    this.markDirty();
  }

  private labelOf(id: string): string {
    return objectData(this.room?.state.entity(id))?.label ?? id;
  }

  // ---- drawing ----

  private dirty = true;

  private markDirty(): void {
    this.dirty = true;
  }

  private objectViews(): ObjectView[] {
    const room = this.room;
    if (!room) return [];
    const me = room.session;
    const byObject = new Map<string, string[]>();
    for (const [session, object] of this.highlights) {
      const names = byObject.get(object) ?? [];
      names.push(session === me ? 'you' : this.nameOf(session));
      byObject.set(object, names);
    }
    const views: ObjectView[] = [];
    for (const entity of room.state.entities()) {
      const data = objectData(entity);
      if (!data) continue;
      const lock = room.state.lock(entity.id);
      const dragging = this.drag?.id === entity.id && this.drag.phase === 'held';
      const view: ObjectView = {
        id: entity.id,
        label: data.label,
        color: data.color,
        x: dragging && this.drag ? this.drag.x : data.x,
        y: dragging && this.drag ? this.drag.y : data.y,
        highlightedBy: byObject.get(entity.id) ?? [],
      };
      if (lock) view.holder = { name: this.nameOf(lock.owner), self: lock.owner === me };
      views.push(view);
    }
    return views;
  }

  private draw(): void {
    const room = this.room;
    if (!room || this.ended) return;
    const t = now();
    const me = room.session;
    const present = new Set(room.members.map((m) => m.session));
    const avatars: AvatarView[] = [];
    const peers: Peer[] = [];
    let self: { x: number; y: number } | undefined;
    let moving = false;
    for (const entity of room.state.entities()) {
      const data = avatarData(entity);
      const motion = this.motions.get(entity.id);
      if (!data || !motion) continue;
      const p = motion.at(t);
      const arrived = motion.arrived(t);
      moving ||= !arrived;
      const view: AvatarView = {
        id: entity.id,
        session: data.session,
        name: data.name,
        color: data.color,
        x: p.x,
        y: p.y,
        self: data.session === me,
        absent: !present.has(data.session),
      };
      if (!arrived) view.target = motion.target;
      avatars.push(view);
      if (view.self) self = p;
      else if (!view.absent) peers.push({ session: data.session, name: data.name, x: p.x, y: p.y });
    }
    // Skip the DOM work while nothing changes and nothing moves.
    if (!this.dirty && !moving && !this.drag) return;
    this.dirty = false;
    this.showMembers(room.members);
    this.scene.draw(avatars, this.objectViews());
    this.video.update(self, peers);
  }

  // ---- reloads ----

  /** Before the page goes away: keep the session so that the reloaded page resumes it. */
  private saveSession(): void {
    const room = this.room;
    if (!room || this.ended) return;
    try {
      store.saveSession(this.roomId, room.saveSession());
    } catch (err) {
      console.warn('plaza demo: cannot save the session', err);
    }
  }
}

function listen<K extends keyof WindowEventMap>(target: Window, type: K, handler: (ev: WindowEventMap[K]) => void): () => void {
  target.addEventListener(type, handler);
  return () => target.removeEventListener(type, handler);
}
